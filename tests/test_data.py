"""LaMP reading/writing, task templates, and every way a user's history can be rejected."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from personalize.data import (
    TASKS,
    HistoryError,
    Item,
    Query,
    parse_history,
    read_history_file,
    read_lamp,
    task_named,
    write_lamp,
)

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


def _queries() -> list[Query]:
    t = TASKS["headlines"]
    return [
        Query("q1", t.prompt("Rain is expected all week."), (Item("Wet week ahead", t.prompt("Rain all week."), "p1"),
                                                             Item("Sun returns", t.prompt("The sun is back."), "p2")),
              gold="A soggy week", user="alice"),
        Query("q2", t.prompt("Prices rose."), (Item("Prices up again", t.prompt("Inflation."), "p3"),), gold="Costs climb"),
    ]


def test_task_templates_follow_method() -> None:
    assert TASKS["headlines"].prompt("A") == "Generate a headline for the following article: A"
    assert TASKS["scholarly_titles"].prompt("A") == "Generate a title for the following abstract of a paper: A"
    assert TASKS["tweets"].prompt("A") == "Paraphrase the following tweet without any explanation before or after it: A"
    assert TASKS["commit_subjects"].prompt("Write the subject.\ndiff") == "Write the subject.\ndiff"
    assert TASKS["tweets"].prompt("{braces} {text}") .endswith(": {braces} {text}")
    assert task_named("LaMP_7") is TASKS["tweets"] and task_named("ScholarlyTitleGeneration") is TASKS["scholarly_titles"]


def test_lamp_round_trip_with_inputs(tmp_path: Path) -> None:
    qs = _queries()
    write_lamp(tmp_path, "dev", TASKS["headlines"], qs)
    task, back = read_lamp(tmp_path, "dev")
    assert task is TASKS["headlines"] and back == qs
    assert back[1].user is None
    assert not list(tmp_path.glob(".*.tmp"))


def test_lamp_round_trip_text_only_items(tmp_path: Path) -> None:
    t = TASKS["tweets"]
    qs = [Query("7", t.prompt("hello"), (Item("first tweet!", id="a"), Item("second 🎉", id="b")), user="bob")]
    write_lamp(tmp_path, "test", t, qs)  # no golds: no outputs file, the task comes from the prompt
    assert not (tmp_path / "test_outputs.json").exists()
    profile = json.loads((tmp_path / "test_questions.json").read_text())[0]["profile"]
    assert profile[0] == {"id": "a", "text": "first tweet!"}
    assert read_lamp(tmp_path, "test") == (t, qs)
    write_lamp(tmp_path, "test", t, qs, meta=False)
    assert read_lamp(tmp_path, "test")[1][0].user is None


def test_lamp_raw_layouts(tmp_path: Path) -> None:
    """LaMP-4 (title+text) and LaMP-7 (text) profiles, with the LaMP task names in outputs."""
    for name, profile, expect in (
        ("LaMP_4", [{"id": "1", "title": "T", "text": "Article."}], Item("T", TASKS["headlines"].prompt("Article."), "1")),
        ("LaMP_7", [{"id": "1", "text": "a tweet"}], Item("a tweet", "", "1")),
    ):
        (tmp_path / "dev_questions.json").write_text(json.dumps([{"id": "9", "input": "x", "profile": profile}]))
        (tmp_path / "dev_outputs.json").write_text(json.dumps({"task": name, "golds": [{"id": "9", "output": "g"}]}))
        task, qs = read_lamp(tmp_path, "dev")
        assert task is task_named(name) and qs[0].profile == (expect,) and qs[0].gold == "g"


@pytest.mark.parametrize(
    "questions, outputs, msg",
    [
        (None, None, "file not found"),
        ("[{", None, "line 1: not valid JSON"),
        ('{"id": 1}', None, "expected a list"),
        ('[{"id": "1", "input": "x", "profile": [{"id": "p"}]}]', '{"task": "LaMP_7", "golds": []}',
         "query 1 profile item 0 is unusable"),
        ('[{"id": "1", "input": "x", "profile": [{"id": "p"}]}]', None, "cannot tell the task"),
        ('[{"id": "1", "input": "x", "profile": []}]', '{"task": "LaMP_7", "golds": [{"id": "2", "output": "o"}]}',
         "output ids do not match"),
        ('[{"id": "1", "input": "x", "profile": []}]', '{"task": "LaMP_2", "golds": []}', "unknown task"),
    ],
)
def test_read_lamp_errors(tmp_path: Path, questions: str | None, outputs: str | None, msg: str) -> None:
    if questions is not None:
        (tmp_path / "dev_questions.json").write_text(questions)
    if outputs is not None:
        (tmp_path / "dev_outputs.json").write_text(outputs)
    with pytest.raises(HistoryError, match=msg) as e:
        read_lamp(tmp_path, "dev")
    assert "dev_" in str(e.value)  # names the file


@pytest.mark.parametrize("name, task, n", [("scholarly_titles", "scholarly_titles", 200), ("commit_subjects", "commit_subjects", 178)])
def test_read_real_dev_files(name: str, task: str, n: int) -> None:
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} not present")
    t, qs = read_lamp(SHARED / name, "dev")
    assert t is TASKS[task] and len(qs) == n
    assert all(q.gold and q.user and q.profile for q in qs)
    assert all(it.x.startswith(t.prefix) and it.x and it.y for q in qs for it in q.profile)
    assert all(q.input.startswith(t.prefix) for q in qs)


def test_parse_history_lines_and_blocks() -> None:
    # read as written (the last the newest), stored newest first
    assert parse_history("  first  \n\nsecond\n") == [Item("second"), Item("first")]  # blank line: blocks
    assert parse_history("one\ntwo\n one\nthree\r\n") == [Item("three"), Item("two"), Item("one")]
    blocks = parse_history("a long post\nover two lines\n\n \nanother\n\n\na long post\nover two lines")
    assert blocks == [Item("another"), Item("a long post\nover two lines")] and blocks.duplicates == 1


@pytest.mark.parametrize(
    "text, kwargs, msg",
    [
        ("", {}, "empty"),
        ("  \n\t\n \n", {}, "empty"),
        ("ok\x00\x01", {}, "binary"),
        ("".join(chr(i % 32) for i in range(1, 400)), {}, "binary"),
        ("x" * 3_000_000, {}, r"history is 3,000,000 characters \(3\.0 MB\); the limit is 2,000,000"),
        ("a\nb\nc\nd", {"max_items": 3}, "has 4 items; the limit is 3"),
    ],
)
def test_parse_history_errors(text: str, kwargs: dict, msg: str) -> None:
    with pytest.raises(HistoryError, match=msg):
        parse_history(text, **kwargs)


def test_read_history_file_formats(tmp_path: Path) -> None:
    (tmp_path / "h.txt").write_text("one\ntwo\n")
    assert read_history_file(tmp_path / "h.txt") == [Item("two"), Item("one")]  # undated: as written

    rows = ['"just a string"', '{"text": "a text"}', "", '{"output": "an out", "input": "raw in"}', '{"y": "why", "x": "ex"}']
    (tmp_path / "h.jsonl").write_text("\n".join(rows))
    assert read_history_file(tmp_path / "h.jsonl") == [Item("why", "ex"), Item("an out", "raw in"), Item("a text"),
                                                        Item("just a string")]
    t = TASKS["tweets"]
    assert read_history_file(tmp_path / "h.jsonl", task=t)[1] == Item("an out", t.prompt("raw in"))

    (tmp_path / "h.csv").write_text('id,Text,input\n1,"hello, world",\n2,bye,in\n')
    assert read_history_file(tmp_path / "h.csv") == [Item("bye", "in"), Item("hello, world")]
    (tmp_path / "first.csv").write_text("id,post\n1,hi there\n2,again\n")
    assert read_history_file(tmp_path / "first.csv") == [Item("again"), Item("hi there")]  # first column with text

    s = TASKS["scholarly_titles"]
    lamp = [{"id": "q", "input": "i", "profile": [{"id": "p", "title": "T", "abstract": "Abs."}]}]
    (tmp_path / "q.json").write_text(json.dumps(lamp))
    assert read_history_file(tmp_path / "q.json") == [Item("T", s.prompt("Abs."), "p")]
    (tmp_path / "p.json").write_text(json.dumps([{"text": "t1"}, "t2"]))
    assert read_history_file(tmp_path / "p.json") == [Item("t2"), Item("t1")]  # a plain list: as written


@pytest.mark.parametrize(
    "name, content, msg",
    [
        ("missing.txt", None, "missing.txt: file not found"),
        ("e.txt", b"", "e.txt is empty"),
        ("w.txt", b" \n\n ", "is empty"),
        ("b.txt", b"\x89PNG\r\n\x1a\n\x00\x00", "binary"),
        ("l.txt", "caf\xe9".encode("latin-1"), "not UTF-8"),
        ("m.jsonl", b'{"text": "ok"}\n{"text": "ok2"}\n{"text": broken}\n', "m.jsonl line 3: not valid JSON"),
        ("n.jsonl", b'{"text": "ok"}\n[1, 2]\n', "n.jsonl line 2: expected"),
        ("m.json", b'[\n{"text": "a"},\n{"text": }\n]', "m.json line 3: not valid JSON"),
        ("c.csv", b"id,score\n1,2\n2,3.5\n", "no usable column"),
        ("h.csv", b"text\n", "is empty"),
        ("big.txt", b"x" * 200, r"big.txt is 200 bytes \(0\.2 KB\); the limit is 100"),
        ("many.jsonl", b'"a"\n"b"\n"c"\n', "has 3 items; the limit is 2"),
    ],
)
def test_read_history_file_errors(tmp_path: Path, name: str, content: bytes | None, msg: str) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(HistoryError, match=msg):
        read_history_file(path, max_bytes=100 if name == "big.txt" else 5_000_000, max_items=2 if name == "many.jsonl" else 500)


def test_neutral_rewrite_is_checked_and_falls_back_to_a_plain_version() -> None:
    from personalize.methods.card.neutral import accept, neutral, plain

    text = "omg the coffee was SO good today!!! 🔥🔥"
    echo = "Rewrite the following text in plain, neutral English: ☺🔥🔥"  # what SmolLM2-135M answered
    assert not accept(text, echo) and not accept(text, "") and not accept(text, "I like trains.")
    assert accept(text, "The coffee was very good today.")
    assert neutral(text, echo) == plain(text) == "Omg the coffee was SO good today!"
    assert plain("JUST WON THE MATCH!!! LETS GOOO 🚀") == "Just won the match! lets gooo."
    assert plain("Loving the sun #summer #blessed") == "Loving the sun summer blessed."
