"""Fuzzing the three ways user text enters the library: a paste, an uploaded history file, a LaMP folder.

Whatever the input (binary, odd encodings, huge lines, broken JSON or CSV), each parser either returns
usable items or raises HistoryError with a short message that names the input; any other exception
would crash the app. Derandomized, so that CI sees the same inputs every run: 2,500 inputs per parser in
`make test` (45 s), the full 10,000 with `FUZZ_EXAMPLES=10000 pytest tests/test_fuzz.py` (3 minutes here; run it
when a parser changes). `--hypothesis-show-statistics` shows how many each parser took and refused.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from personalize.data import TASKS, HistoryError, Item, Query, parse_history, read_history_file, read_lamp

FUZZ = settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", 2_500)), deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.large_base_example, HealthCheck.filter_too_much])
MAX_MESSAGE = 500  # an error is shown to the user as is: it must not echo a megabyte of their input
# Built once: hypothesis builds and checks a strategy on each call to st.integers(...) and the like.
TENTHS, COIN, INDENT, UP_TO_3 = st.integers(0, 9), st.booleans(), st.sampled_from([None, None, 1]), st.integers(0, 3)


def chance(draw: st.DrawFn, tenths: int) -> bool:
    """True about tenths times in ten: most inputs should be nearly right, so that parsing goes deep."""
    return draw(TENTHS) < tenths


def weighted(*choices: tuple[int, st.SearchStrategy]) -> st.SearchStrategy:
    """one_of with weights (one_of merges a strategy given twice, so repeating it does not weigh it)."""
    return st.sampled_from([s for n, s in choices for _ in range(n)]).flatmap(lambda s: s)


def rarely(strategy: st.SearchStrategy, otherwise: st.SearchStrategy) -> st.SearchStrategy:
    """strategy for about one draw in 100: huge inputs are worth testing, but each costs tens of ms."""
    return st.integers(0, 99).flatmap(lambda i: strategy if i == 0 else otherwise)


# --- text -------------------------------------------------------------------------------------------------

# Characters that steer the parsers: separators, quotes, JSON punctuation, controls, BOM, Unicode line breaks.
TRICKY = "\n\r\t ,;\"'\\{}[]:-.1aZé🎉\x00\x1b\x85\u2028\ufeff\ufffd"
any_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=24)  # controls included, no lone surrogates
words = st.sampled_from(["", " ", "a", "hello world", "Wet week ahead", "text", "output", "null", '""', "\r\n", "\n\n"])
small_text = st.one_of(any_text, st.text(TRICKY, max_size=24), words)


@st.composite
def huge(draw: st.DrawFn, pieces: st.SearchStrategy[str] = small_text) -> str:
    """1-3 MB of UTF-8 made by repeating a small drawn piece (drawing megabytes would be slow)."""
    piece = draw(pieces) or "x"
    return piece * (draw(st.integers(1, 3)) * 1_000_000 // len(piece.encode("utf-8", "replace")) + 1)


@st.composite
def lines(draw: st.DrawFn) -> str:
    sep = draw(st.sampled_from(["\n", "\r\n", "\r", "\n\n", "\n \t\n", "\u2028", "\x85"]))
    return sep.join(draw(st.lists(small_text, max_size=8)))


binary_as_text = st.tuples(st.binary(max_size=200), st.sampled_from(["latin-1", "utf-8", "utf-16", "cp1252"])).map(
    lambda t: t[0].decode(t[1], "replace"))
with_surrogate = st.tuples(small_text, st.sampled_from(["\ud800", "\udfff", "\udc80"]), small_text).map(
    "".join)  # what a browser sends for half an emoji

history_texts = rarely(huge(), st.one_of(small_text, lines(), binary_as_text, with_surrogate))

# --- JSON -------------------------------------------------------------------------------------------------

KEYS = st.one_of(st.sampled_from(["id", "input", "profile", "text", "title", "abstract", "output", "x", "y", "task",
                                  "golds", "user", "source", "repo", "venue", "query_paper"]), any_text)
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), small_text)
# Two levels are enough for wrong types (st.recursive costs twice as much); _break_json's "deep" goes deeper.
JUNK = [None, [], {}, [1, 2, 3], [None, [None]], {"text": None}, {"profile": "x"}, {"id": []}, [[]], {"": {}}]
json_values = st.one_of(scalars, st.sampled_from(JUNK), st.lists(scalars, max_size=3),
                        st.dictionaries(KEYS, scalars, max_size=3))
text_or_junk = weighted((6, small_text), (1, json_values))  # mostly the right type, sometimes not
ids = st.one_of(st.sampled_from(["1", "2", "q1"]), st.integers(0, 3), json_values)

profile_item = st.one_of(
    st.fixed_dictionaries({"id": ids, "title": text_or_junk, "abstract": text_or_junk}),  # LaMP-5
    st.fixed_dictionaries({"id": ids, "title": text_or_junk, "text": text_or_junk}),  # LaMP-4
    st.fixed_dictionaries({"id": ids, "input": text_or_junk, "output": text_or_junk}),
    st.fixed_dictionaries({"id": ids, "text": text_or_junk}),  # LaMP-7
    st.fixed_dictionaries({}, optional={"y": text_or_junk, "x": text_or_junk, "id": ids}),
    small_text,  # a bare string (history files accept those)
    json_values,  # anything
)
prompt = st.one_of(small_text, st.tuples(st.sampled_from(list(TASKS.values())), small_text).map(
    lambda t: t[0].prompt(t[1])))


def _break_json(draw: st.DrawFn, s: str) -> str:
    """JSON text broken in one of the ways real files break."""
    how = draw(st.sampled_from(["truncate", "insert", "delete", "deep", "bignum", "surrogate", "type"]))
    if how == "truncate":  # a partial upload
        return s[: draw(st.integers(0, max(0, len(s) - 1)))]
    if how in ("insert", "delete"):
        i = draw(st.integers(0, len(s)))
        return s[:i] + draw(st.sampled_from(TRICKY)) + s[i:] if how == "insert" else s[:i] + s[i + 1:]
    if how == "deep":  # nesting beyond the recursion limit
        n = draw(st.sampled_from([50, 1_100, 3_000]))
        opener = draw(st.sampled_from(["[", '{"profile": ', '[{"id": "1", "input": "x", "profile": ']))
        return opener * n + s + draw(st.sampled_from(["", "]" * n, "}" * n]))
    if how == "bignum":  # past Python's int-to-string limit
        return f"[{'9' * draw(st.sampled_from([4_301, 20_000]))}, {s}]"
    if how == "surrogate":  # a lone surrogate escape decodes to a str that no file, database or tokenizer takes
        return s.replace('"', '"' + draw(st.sampled_from(["\\ud800", "\\udfff", "\\uDBFF"])), draw(st.integers(1, 4)))
    return draw(st.sampled_from(["[1, 2, 3]", "null", '"a string"', "[null, [null]]", "{}", "[]", "[[]]", "3.5",
                                 '{"profile": null}', '[{"profile": "x"}]', '[{"id": "1"}]', "NaN", "[Infinity]"]))


def _dumps(draw: st.DrawFn, value: Any) -> str:
    return json.dumps(value, ensure_ascii=draw(COIN), indent=draw(INDENT))


@st.composite
def json_text(draw: st.DrawFn, values: st.SearchStrategy[Any], intact: int = 7) -> str:
    """A drawn value as JSON, intact `intact` times in 10, else broken."""
    s = _dumps(draw, draw(values))
    return s if chance(draw, intact) else _break_json(draw, s)


json_huge = huge(st.sampled_from(["a", "é", "🎉", " ", "\\n"])).map(lambda s: json.dumps([{"text": s}, s]))

# --- CSV --------------------------------------------------------------------------------------------------

cell = weighted((2, small_text), (1, st.integers().map(str)), (1, st.floats().map(str)))


@st.composite
def csv_text(draw: st.DrawFn) -> str:
    """A CSV file as a writer makes it (varying column counts), broken 4 times in 10."""
    header = draw(st.lists(st.one_of(st.sampled_from(["id", "text", "Text ", "output", "y", "input", "x", "post"]),
                                     small_text), max_size=4))
    rows = draw(st.lists(st.lists(cell, max_size=4), max_size=5))
    buf = io.StringIO()
    w = csv.writer(buf, quoting=draw(st.sampled_from([csv.QUOTE_MINIMAL, csv.QUOTE_ALL])),
                   lineterminator=draw(st.sampled_from(["\r\n", "\n"])))
    w.writerows([header, *rows])
    s = buf.getvalue()
    if chance(draw, 6):
        return s
    how = draw(st.sampled_from(["quote", "nul", "truncate", "bigfield"]))
    if how in ("quote", "nul"):  # an unbalanced quote; a NUL byte
        i = draw(st.integers(0, len(s)))
        return s[:i] + ('"' if how == "quote" else "\x00") + s[i:]
    if how == "truncate":
        return s[: draw(st.integers(0, len(s)))]
    big = draw(st.sampled_from(["y", "é", "a b"])) * draw(st.sampled_from([131_073, 300_000]))
    return s + draw(st.sampled_from([big, f'"{big}"', f'1,"{big}']))  # a field past csv.field_size_limit()


csv_huge = huge(st.sampled_from(["a,", "x", '"q",', "é"])).map(lambda s: "text\n" + s)

# --- bytes on disk ----------------------------------------------------------------------------------------

ODD_ENCODINGS = ["latin-1", "cp1252", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "broken-utf-8"]


def _odd(draw: st.DrawFn, text: str) -> bytes:
    """Text in an odd encoding, or as UTF-8 with an invalid sequence spliced in."""
    enc = draw(st.sampled_from(ODD_ENCODINGS))
    if enc != "broken-utf-8":
        return text.encode(enc, "replace")
    data = text.encode("utf-8")
    i = draw(st.integers(0, len(data)))
    return data[:i] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\xc0\xaf", b"\x80"])) \
        + data[i:]


def _encode(draw: st.DrawFn, text: str) -> bytes:
    """A file's bytes: UTF-8 (with or without BOM) 8 times in 10, else odd."""
    return text.encode(draw(st.sampled_from(["utf-8", "utf-8", "utf-8-sig"]))) if chance(draw, 8) else _odd(draw, text)


@st.composite
def encoded(draw: st.DrawFn, texts: st.SearchStrategy[str]) -> bytes:
    return _encode(draw, draw(texts))


lamp_query = st.fixed_dictionaries({"id": ids, "input": prompt, "profile": st.lists(profile_item, max_size=3)})
history_values = st.one_of(st.lists(profile_item, max_size=4),  # what .json takes: a list of profile items,
                           st.fixed_dictionaries({"profile": st.lists(profile_item, max_size=4)}),  # one query,
                           st.lists(lamp_query, max_size=2), json_values)  # a LaMP questions file; or not
jsonl_lines = st.lists(json_text(st.one_of(profile_item, small_text), intact=9), max_size=5)
jsonl_text = st.tuples(st.sampled_from(["\n", "\r\n", "\r", "\n\n"]), jsonl_lines).map(lambda t: t[0].join(t[1]))
FORMATS: dict[str, st.SearchStrategy[str]] = {
    ".txt": st.one_of(small_text, lines(), binary_as_text),
    ".jsonl": jsonl_text,
    ".json": json_text(history_values),
    ".csv": csv_text(),
}
HUGE = {".txt": huge(), ".jsonl": json_huge.map(lambda s: s[1:-1].replace("}, ", "}\n", 1)), ".json": json_huge,
        ".csv": csv_huge}


def history_bytes(ext: str) -> st.SearchStrategy[bytes]:
    """Mostly the extension's own format, sometimes another one's, raw binary, or a huge file."""
    own, others = FORMATS[ext], [f for e, f in FORMATS.items() if e != ext]
    texts = encoded(weighted((6, own), *((1, f) for f in others)))
    return rarely(HUGE[ext].map(str.encode), weighted((19, texts), (1, st.binary(max_size=300))))


HISTORY_BYTES = {ext: history_bytes(ext) for ext in FORMATS}  # built once: a strategy built per draw costs ms

# --- LaMP folders -----------------------------------------------------------------------------------------


def _maybe(draw: st.DrawFn, good: Any) -> Any:
    """good (a value, or a strategy to draw from) 9 times in 10, else any JSON value: a wrong type, a missing id."""
    if not chance(draw, 9):
        return draw(json_values)
    return draw(good) if isinstance(good, st.SearchStrategy) else good


# The profile layouts of LaMP-5 (titles), LaMP-4 (headlines), commit subjects and LaMP-7 (tweets).
LAYOUT = st.sampled_from([("title", "abstract"), ("title", "text"), ("input", "output"), ("text",)])
QIDS = st.lists(st.one_of(st.text(max_size=6), st.integers(0, 99)), min_size=1, max_size=3, unique_by=str)
QUERY_KEYS = st.sampled_from(["id", "input", "profile"])
TASK_NAMES = st.sampled_from(["LaMP_4", "LaMP_7", "lamp-5", "CommitSubjectGeneration", "LaMP_2"])
META_KEYS = st.lists(st.sampled_from(["user", "source", "repo", "venue", "query_paper"]), max_size=3, unique=True)
meta_text = st.one_of(small_text, st.just("2025.emnlp-main.12"))


@st.composite
def lamp_folder(draw: st.DrawFn) -> tuple[bytes | None, bytes | None, bytes | None]:
    """The questions, outputs and meta files (None: absent) of a valid-looking LaMP split with mutated fields,
    each file then maybe broken, oddly encoded or binary."""
    qids = draw(QIDS)
    layout = draw(LAYOUT)
    some_qid = st.sampled_from(qids)

    def item() -> Any:
        if not chance(draw, 9):
            return draw(profile_item)
        keys = layout if chance(draw, 8) else draw(LAYOUT)  # one split, one layout, mostly
        return {"id": _maybe(draw, ids), **{k: _maybe(draw, small_text) for k in keys}}

    questions = []
    for qid in qids:
        q = {"id": qid, "input": draw(prompt), "profile": [item() for _ in range(draw(UP_TO_3))]}
        if not chance(draw, 9):  # a field of the wrong type, or missing
            key = draw(QUERY_KEYS)
            if draw(COIN):
                q[key] = draw(json_values)
            else:
                del q[key]
        questions.append(q)
    outputs = meta = None
    if chance(draw, 7):
        golds = [{"id": _maybe(draw, some_qid), "output": _maybe(draw, small_text)}
                 for _ in range(min(draw(UP_TO_3), len(qids)))]
        outputs = _maybe(draw, {"task": _maybe(draw, TASK_NAMES), "golds": golds} if chance(draw, 9) else
                         {"golds": golds})
    if chance(draw, 5):
        meta = _maybe(draw, [{"id": _maybe(draw, some_qid),
                              **{k: _maybe(draw, meta_text) for k in draw(META_KEYS)}}
                             for _ in range(min(draw(UP_TO_3), len(qids)))])

    def file(value: Any) -> bytes | None:
        if value is None:
            return None
        s, how = _dumps(draw, value), draw(TENTHS)
        if how < 8:
            return s.encode()
        if how == 8:
            return _break_json(draw, s).encode()
        return _odd(draw, s) if draw(COIN) else draw(st.binary(max_size=100))

    return file(_maybe(draw, questions)), file(outputs), file(meta)


# --- checks -----------------------------------------------------------------------------------------------


def _utf8(*texts: str | None) -> bool:
    """Text the rest of the app can store, print and tokenize (no lone surrogates)."""
    try:
        all(t is None or t.encode("utf-8") for t in texts)
    except UnicodeEncodeError:
        return False
    return True


def _outcome(call: Callable[[], Any], where: str) -> Any:
    """The call's result, or None after a HistoryError fit to show (short, printable, naming the input)."""
    try:
        out = call()
    except HistoryError as e:
        msg = str(e)
        assert msg and len(msg) <= MAX_MESSAGE and _utf8(msg), msg[:2000]
        assert where in msg, msg
        event("rejected")
        return None
    event("parsed")
    return out


def _check_items(items: Any) -> None:
    assert isinstance(items, list) and items
    for it in items:
        assert isinstance(it, Item) and isinstance(it.y, str) and it.y.strip()
        assert isinstance(it.x, str) and isinstance(it.id, str) and _utf8(it.y, it.x, it.id)


# --- the tests --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def folder() -> Iterator[Path]:
    """One folder whose files each example rewrites, in memory where there is a tmpfs: a disk write costs ms."""
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None) as d:
        yield Path(d)


@FUZZ
@given(text=history_texts, max_items=st.sampled_from([500, 500, 3]))
def test_fuzz_parse_history(text: str, max_items: int) -> None:
    out = _outcome(lambda: parse_history(text, max_items=max_items), "history")
    if out is not None:
        _check_items(out)
        assert len(out) <= max_items


@FUZZ
@given(data=st.data(), ext=st.sampled_from([".txt", ".jsonl", ".csv", ".json"]),
       task=st.sampled_from([None, *TASKS.values()]), limits=st.sampled_from([(5_000_000, 500)] * 3 + [(1_000, 2)]))
def test_fuzz_read_history_file(folder: Path, data: st.DataObject, ext: str, task: Any,
                                limits: tuple[int, int]) -> None:
    content = data.draw(HISTORY_BYTES[ext], label="content")
    path = folder / f"history{ext}"
    path.write_bytes(content)
    out = _outcome(lambda: read_history_file(path, task=task, max_bytes=limits[0], max_items=limits[1]), path.name)
    if out is not None:
        _check_items(out)
        assert len(out) <= limits[1]


@FUZZ
@given(files=lamp_folder())
def test_fuzz_read_lamp(folder: Path, files: tuple[bytes | None, bytes | None, bytes | None]) -> None:
    for kind, content in zip(("questions", "outputs", "meta"), files):
        path = folder / f"dev_{kind}.json"
        path.unlink(missing_ok=True) if content is None else path.write_bytes(content)
    out = _outcome(lambda: read_lamp(folder, "dev"), "dev_")
    if out is not None:
        task, queries = out
        assert task in TASKS.values() and isinstance(queries, list) and queries
        for q in queries:
            assert isinstance(q, Query) and isinstance(q.id, str) and isinstance(q.input, str)
            assert all(v is None or isinstance(v, str) for v in (q.gold, q.user, q.source))
            assert isinstance(q.profile, tuple) and _utf8(q.id, q.input, q.gold, q.user, q.source)
            for it in q.profile:
                assert isinstance(it, Item) and all(isinstance(v, str) for v in (it.y, it.x, it.id))
                assert _utf8(it.y, it.x, it.id)
