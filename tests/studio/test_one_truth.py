"""One truth on the page (issue 59): after Forget me every tab says the same of the name, and a neutral rewrite
shown to a person says no more than their text. Library level on the tiny model; the handlers without a server."""

from __future__ import annotations

import json

import pytest

from personalize.data import Item
from personalize.methods.card.neutral import accept, keeps_content, neutral, plain

from conftest import tiny_studio

LINES = [f"ok so the {w} was fine i guess" for w in ("bus", "tea", "rain", "film", "shop", "walk", "game", "cake")]


@pytest.fixture(scope="module")
def studio(tiny_artifacts, tmp_path_factory):
    s = tiny_studio(tiny_artifacts, tmp_path_factory.mktemp("one-truth"))
    yield s
    s.runtime.store.close()


# ---------------------------------------------------------------- rewrites keep their content

@pytest.mark.parametrize("text, rewrite", [
    ("new update on the game just dropped lol", "The latest version of the game is 0.7.4."),  # a number it lacks
    ("exam went way better this time", "The new exam is better than the old one, says the teacher."),  # new words
])
def test_a_rewrite_that_adds_content_is_refused(text, rewrite):
    assert not keeps_content(text, rewrite) and not accept(text, rewrite)
    assert neutral(text, rewrite) == plain(text)


@pytest.mark.parametrize("text, rewrite", [
    ("omg the coffee was SO good today!!! 🔥🔥", "The coffee was very good today."),
    ("cant wait for the weekend omg", "I cannot wait for the weekend."),  # a plain word or two is not content
    ("bus 42 late again", "Bus 42 is late again."),  # its own number kept
])
def test_a_rewrite_that_only_rephrases_is_kept(text, rewrite):
    assert keeps_content(text, rewrite) and neutral(text, rewrite) == rewrite


def test_a_stored_rewrite_that_adds_content_is_not_shown_and_is_made_again(studio):
    from personalize.methods.card.person import stored_with_rewrites

    studio.histories.save_history("rex", [Item(t) for t in LINES[:4]], "tweets")
    studio.histories.rewrites.result()  # the background rewrites of Save, done
    store, first = studio.runtime.store, studio.runtime.store.items("rex")[0]
    store.set_neutral([(first.id, "The bus was fine, says version 2.1 of the timetable.")])  # from before the check
    assert studio.histories.item_rows("rex")[0][2] == ""
    p, _ = studio.histories.resolve_prompt(None, True, 1, "rex")
    assert "2.1" not in p and LINES[0] in p
    stored_with_rewrites(studio.runtime.engine, store, "rex")  # the next fit's pass
    assert keeps_content(LINES[0], store.items("rex")[0].neutral) and studio.histories.item_rows("rex")[0][2]


# ---------------------------------------------------------------- after Forget me

def test_after_forget_me_every_tab_says_the_same_of_the_name(studio):
    from personalize.ui import my_cluster, writing

    studio.histories.save_history("bayer", [Item(t) for t in LINES], "tweets")
    assert "stored items" in studio.histories.switch_user("bayer", None).message
    out = writing.forget(studio, "bayer", True)
    assert out[0].startswith("Forgot") and out[2] == [] and out[4] == "" and out[-1] == ""  # the count line gone
    typed = studio.histories.switch_user("bayer", None)  # the name typed again
    view = studio.clusters.cluster_view("bayer", None)
    assert typed.message.startswith("New user **bayer**") and view.state is None and view.map.user is None
    assert view.message == typed.message
    assert my_cluster.show_cluster(studio, "bayer", None)[0] == typed.message


# ---------------------------------------------------------------- which items are held out

def dated(tmp_path, name: str, newest_first: bool):
    rows = [{"text": t, "date": f"2026-0{1 + i // 5}-{10 + i:02d}"} for i, t in enumerate(LINES + ["last one, newest"])]
    path = tmp_path / name
    path.write_text("\n".join(json.dumps(r) for r in (rows[::-1] if newest_first else rows)))
    return path


def test_a_dated_history_is_held_out_by_its_dates_whichever_way_it_is_sorted(studio, tmp_path):
    from personalize.data import read_history_file
    from personalize.methods.card.person import held_out_numbers, prepared_items

    engine, held = studio.runtime.engine, {}
    for order in ("oldest", "newest"):
        items = read_history_file(dated(tmp_path, f"{order}.jsonl", order == "newest"))
        assert [it.y for it in items] == (LINES + ["last one, newest"])[::-1]  # newest first, as LaMP lists them
        studio.histories.save_history(f"dated-{order}", items, "tweets")
        got = prepared_items(engine, studio.runtime.store, f"dated-{order}")
        held[order] = [it.y for it in got[:3]]
        assert held_out_numbers(got, 3) == [1, 2, 3]
    assert held["oldest"] == held["newest"] and held["oldest"][0] == "last one, newest"


def test_a_paste_holds_out_its_last_lines_and_fit_names_them(studio):
    from personalize.ui import fit

    studio.save_from("paster", "\n".join(LINES), None, "tweets")  # written oldest first: the last line is the newest
    rows = studio.histories.item_rows("paster")
    assert [r[1] for r in rows] == LINES[::-1] and studio.histories.as_paste("paster") == "\n".join(LINES)
    line = studio.histories.held_out_line("paster", 3)
    assert line.startswith("Held out to judge it: your newest 3 items (a paste's last lines") and ": 1-3 in My" in line
    msg = fit.fit(studio, "paster", None, progress=lambda *a, **k: None)[0]
    assert "Held out to judge it: your newest" in msg


def test_a_rewrite_that_gives_the_answer_away_is_not_held_out(studio):
    """"changelog" → "Changelog.": a fit judged on it would be judged on an answer its prompt holds (issue 59)."""
    from personalize.methods.card.person import held_out_order, prepared_items

    store = studio.runtime.store
    studio.save_from("giver", "\n".join(LINES), None, "tweets")
    studio.histories.rewrites.result()  # Save's rewrites in the background: done before they are replaced below
    stored = store.items("giver")
    store.set_neutral([(stored[1].id, stored[1].y.upper() + ".")])  # item 2's rewrite: its own text
    stored = store.items("giver")
    for s in stored:  # every other rewrite a sentence of its own (the tiny model's fall back to the text)
        if s.position != 1:
            store.set_neutral([(s.id, f"It was fine, I guess, the {s.y.split()[3]}.")])  # keeps its content
    stored = store.items("giver")
    order, holdable = held_out_order(stored, {i: s.neutral for i, s in enumerate(stored) if s.neutral})
    assert order[:3] == [0, 2, 3] and order[-1] == 1 and holdable == len(LINES) - 1
    got = prepared_items(studio.runtime.engine, store, "giver")
    assert [it.id for it in got[:3]] == ["1", "3", "4"] and got[-1].id == "2"
    line = studio.histories.held_out_line("giver", 3)
    assert ": 1, 3-4 in My writing" in line and "not 2, whose neutral rewrite nearly repeats the text" in line


def test_an_opened_history_pastes_back_as_it_was_written(studio):
    """Restore's text box and the demo text read back by Save keep the order: a round trip never reverses it."""
    from personalize.data import parse_history

    studio.save_from("roundtrip", "\n".join(LINES), None, "tweets")
    again = parse_history(studio.histories.as_paste("roundtrip"))
    assert [it.y for it in again] == [r[1] for r in studio.histories.item_rows("roundtrip")]


def test_number_ranges():
    from personalize.studio.histories import number_ranges

    assert number_ranges([20, 3, 18, 19]) == "3, 18-20" and number_ranges([7]) == "7"


def test_a_csv_is_ordered_by_its_dates_and_an_undated_file_as_written(tmp_path):
    from personalize.data import read_history_file

    (tmp_path / "d.csv").write_text("text,date\nthird,2026-03-01T10:00:00Z\nfirst,2026-01-01\nsecond,1770000000\n")
    assert [it.y for it in read_history_file(tmp_path / "d.csv")] == ["third", "second", "first"]
    (tmp_path / "u.csv").write_text("text,date\nthird,2026-03-01\nfirst,\nsecond,2026-02-01\n")  # one undated
    assert [it.y for it in read_history_file(tmp_path / "u.csv")] == ["second", "first", "third"]  # as written


def test_without_a_decoded_check_the_verdict_says_what_compare_decodes(studio, monkeypatch):
    """Issue 57's walk: "No check by decoding ... card decodes your style" beside a Compare that showed the
    cluster model (the teacher-forced figure lost). Without a check the verdict says what the one rule decides."""
    import dataclasses

    from personalize.methods.card.card_decode import FALLBACK_NOTE

    eng = studio.runtime.engine
    monkeypatch.setattr(eng, "cfg", dataclasses.replace(eng.cfg, style=dataclasses.replace(eng.cfg.style, fallback=True),
                                                        decoding=dataclasses.replace(eng.cfg.decoding, alpha=1.0)))
    studio.save_from("subjects", "\n".join(LINES + [f"and the {w} too" for w in ("bus", "tea", "rain")]), None,
                     "tweets")  # the tiny model's rewrites are the texts tidied: nothing can be held out
    studio.fits.fit("subjects")
    store, art = studio.runtime.store, eng.artifacts_id
    for helps in (False, True):
        vec, meta = store.vector("subjects", art)
        stats = meta["stats"] | {"diagnostics": meta["stats"].get("diagnostics", {}) | {"helps": helps}}
        store.save_vector("subjects", art, vec, meta["model_id"], stats, store.style("subjects", art).extras)
        words = studio.explorer.verdict("subjects")
        (row,) = studio.comparisons.rows("card", studio.histories.user_state("subjects"),
                                         studio.runtime.task.prompt("the bus"), studio.runtime.settings(alpha=1.0))
        assert words.startswith("No check by decoding: only 0 of your 11 items can be held out"), words
        assert (row.note == FALLBACK_NOTE) != helps
        assert ("So Compare shows your cluster's model's output for card" in words) != helps, words
        assert ("So Compare decodes card with your style at this build's α = 1" in words) == helps, words
