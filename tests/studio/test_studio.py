"""The studio's operations (what every app tab calls), on real artifacts from a tiny model and a real SQLite
file; the leaderboard's statistics, blind-pair hygiene and exports on planted votes."""

from __future__ import annotations

import dataclasses
import math
import csv
import io
import json
import random
import threading
import time

import numpy as np
import pytest

from personalize.methods.card import onboard
from personalize.humaneval.arena import Arena, StalePair, draw_methods
from personalize.data import TASKS, HistoryError, Item
from personalize.humaneval.table_export import export_predictions, export_table, to_csv
from personalize.humaneval.bradley_terry import LeaderboardConfig, bradley_terry, leaderboard, win_rates
from personalize.store import Store
from personalize.studio.facade import Studio, StudioConfig
from personalize.ui import text as page_text

from conftest import tiny_studio

TERSE = [f"ok so the {w} was fine i guess" for w in ("bus", "tea", "rain", "film", "shop", "walk", "game", "cake")]


# ---------------------------------------------------------------- leaderboard

def _votes(outcomes: list[tuple[str, str, str]]) -> list[dict]:
    return [{"method_a": a, "method_b": b, "winner": w} for a, b, w in outcomes]


def test_bradley_terry_orders_methods_by_planted_strength():
    """Votes drawn from planted strengths card > cluster > base come back in that order, with intervals."""
    rng = random.Random(0)
    true = {"base": 0.0, "cluster": 1.0, "card": 2.0}
    outcomes = []
    for _ in range(300):
        a, b = rng.sample(list(true), 2)
        p = 1 / (1 + np.exp(true[b] - true[a]))
        outcomes.append((a, b, "a" if rng.random() < p else "b"))
    lb = leaderboard(_votes(outcomes), LeaderboardConfig(rounds=50))
    assert [r["method"] for r in lb["methods"]] == ["card", "cluster", "base"]
    for r in lb["methods"]:
        assert r["lower"] <= r["strength"] <= r["upper"]
    assert lb["n_votes"] == 300 and sum(r["votes"] for r in lb["methods"]) == 600
    # the fitted log-strength gaps are near the planted ones (1.0 each)
    beta = bradley_terry([(a, b, 1.0 if w == "a" else 0.0) for a, b, w in outcomes], ["base", "cluster", "card"], c=1e6)
    assert abs((beta[1] - beta[0]) - 1.0) < 0.4 and abs((beta[2] - beta[1]) - 1.0) < 0.4


def test_ties_and_both_bad_are_half_points_and_one_sided_votes_stay_finite():
    wr = win_rates([("a", "b", 0.5), ("a", "b", 1.0)], ["a", "b", "c"])
    assert wr["a"]["b"] == 0.75 and wr["b"]["a"] == 0.25 and wr["a"]["c"] is None
    lb = leaderboard(_votes([("card", "base", "a")] * 3 + [("card", "base", "both_bad")]), LeaderboardConfig(rounds=20))
    top = lb["methods"][0]
    assert top["method"] == "card" and np.isfinite(top["strength"]) and top["ties"] == 1 and top["wins"] == 3
    assert leaderboard([]) == {"methods": [], "win_rate": {}, "n_votes": 0}


# ---------------------------------------------------------------- arena

@pytest.fixture()
def store(tmp_path):
    s = Store(tmp_path / "studio.db")
    yield s
    s.close()


def test_blind_pairs_are_random_distinct_and_voted_once(store):
    rng = random.Random(1)
    draws = [draw_methods(["base", "card", "rag"], rng) for _ in range(200)]
    assert all(a != b for a, b in draws)
    assert {d[0] for d in draws} == {"base", "card", "rag"}  # every method appears on the left (random order)
    with pytest.raises(ValueError, match="two different methods"):
        draw_methods(["card", "card"], rng)

    arena = Arena(store, seed=0)
    pair = arena.open(None, "p", ("card", "base"), ("x", "y"), settings={"alpha": 1.0})
    with pytest.raises(ValueError, match="rater id"):
        arena.vote(pair.id, "a", " ")
    _, rid = arena.vote(pair.id, "a", "r1")
    with pytest.raises(StalePair):
        arena.vote(pair.id, "b", "r1")  # the same pair twice: refused, not counted
    with pytest.raises(StalePair):
        arena.vote("no-such-pair", "a", "r1")
    (row,) = store.ratings()
    assert row["id"] == rid and row["method_a"] == "card" and row["output_b"] == "y" and row["settings"] == {"alpha": 1.0}


def test_concurrent_votes_all_land(store):
    arena = Arena(store)
    pairs = [arena.open(None, f"p{i}", ("card", "base"), (f"a{i}", f"b{i}")) for i in range(40)]
    errors = []

    def rate(chunk):
        for p in chunk:
            try:
                arena.vote(p.id, "tie", "r")
                arena.vote(p.id, "a", "r")  # double submit from the same rater
            except StalePair:
                pass
            except Exception as e:  # pragma: no cover - the assertion below reports it
                errors.append(e)

    threads = [threading.Thread(target=rate, args=(pairs[i::8],)) for i in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors and len(store.ratings()) == 40 and {r["winner"] for r in store.ratings()} == {"tie"}


# ---------------------------------------------------------------- export

def test_exports_round_trip(store, tmp_path):
    store.add_user("ann", [Item("hi")], "tweets")
    g = store.add_generation("ann", "art", "card", "prompt, with comma", 'out "quoted"', {"alpha": 1}, 0.1, 3,
                             {"question_id": "q7"})
    store.add_generation("ann", "art", "base", "p2", "o2", {}, 0.1, 2)
    store.add_rating("r", "p", "ann", "card", "x", "base", "y", "a", {"alpha": 1}, g, None)
    path, n = export_table(store, "votes", "jsonl", tmp_path / "ex")
    assert n == 1
    (vote,) = [json.loads(line) for line in path.read_text().splitlines()]
    assert vote["winner"] == "a" and vote["gen_a"] == g
    rows = list(csv.DictReader(io.StringIO(export_table(store, "generations", "csv", tmp_path / "ex")[0].read_text())))
    assert [r["method"] for r in rows] == ["card", "base"] and rows[0]["output"] == 'out "quoted"'
    assert json.loads(rows[0]["settings"]) == {"alpha": 1}
    preds = json.loads(export_predictions(store, "TweetParaphrasing", "card", tmp_path / "ex").read_text())
    assert preds == {"task": "TweetParaphrasing", "golds": [{"id": "q7", "output": 'out "quoted"'}]}
    assert to_csv([]) == "\r\n" or to_csv([]) == ""
    with pytest.raises(ValueError, match="unknown format"):
        export_table(store, "votes", "xml", tmp_path / "ex")


# ---------------------------------------------------------------- the studio on tiny artifacts

@pytest.fixture(scope="module")
def studio(tiny_artifacts, tmp_path_factory):
    s = tiny_studio(tiny_artifacts, tmp_path_factory.mktemp("studio"))
    yield s
    s.runtime.store.close()


def test_neutral_rewrites_never_echo_the_instruction(studio):
    from personalize.methods.card.neutral import plain

    texts = ["omg the coffee was SO good today!!! 🔥🔥", "k bus late again"]
    # a random tiny model writes no usable rewrite, so every item gets its rule-based plain version
    assert studio.runtime.engine.neutral_rewrites(texts) == [plain(t) for t in texts]


def test_history_is_saved_and_assigned_for_every_k(studio):
    res = studio.histories.save_history("ann", studio.histories.parse(text="\n".join(TERSE)), "tweets")
    assert res.n_items == 8 and set(res.clusters) == {1, 2, 4}
    st = studio.histories.user_state("ann", 3)  # a slider value between built Ks snaps to one
    assert st.k in (2, 4) and len(st.distances) == st.k and st.cluster == int(np.argmin(st.distances))
    assert not st.fitted
    ex = studio.clusters.cluster_examples(st.k, st.cluster)
    assert ex and all(u in studio.runtime.engine.clusters.users for u, _ in ex)
    m = studio.clusters.population_map("ann", 4)
    assert len(m.xy) == len(m.labels) == len(studio.runtime.engine.clusters.users) and m.user[0] == "ann"


@pytest.mark.parametrize("text, msg", [("", "empty"), ("   \n  ", "empty"), ("x" * 2_000_001, "limit"),
                                       ("ok\x00\x01bin", "binary")])
def test_bad_histories_are_refused(studio, text, msg):
    with pytest.raises(HistoryError, match=msg):
        studio.histories.parse(text=text)


def test_the_pass_read_ahead_after_save_is_the_one_fit_makes(studio):
    """Save's background work ends with the teacher-forced pass Fit my style makes (most of a fit's time), under
    the cluster the person was placed in; Fit then reuses it, and fits the style a fit without it fits."""
    studio.histories.save_history("ahead", [Item(y=it.y) for it in studio.histories.demo_items("formal_01")], "tweets")  # no prompts
    studio.histories.rewrites.result()
    kept = studio.fits.fit("ahead")
    assert "features (made already)" in kept.stages_s and "features" not in kept.stages_s
    studio.fits.forget_user("ahead")  # what this process kept of them: the next fit makes its own pass
    made = studio.fits.fit("ahead")
    assert "features" in made.stages_s and made.cluster == kept.cluster
    np.testing.assert_allclose(made.lam, kept.lam, rtol=1e-5, atol=1e-6)
    assert np.array_equal(made.style.bias_ids, kept.style.bias_ids)


def test_save_starts_no_first_use_and_the_fit_does(studio):
    """EXACT's and OPPU's first uses start after the person's Fit, not at Save: started at Save, EXACT's decode of
    the history held the model while the Fit waited for it (docs/results/2026-11-25-issues-24-23.md, the
    browser walk)."""
    text = "\n".join(it.y for it in studio.histories.demo_items("hype_01"))
    studio.save_from("later", text, None, "tweets")
    assert not [key for key in studio.runtime.jobs if key[0] == "later"]
    studio.histories.rewrites.result()
    studio.fits.fit("later")
    studio.first_use_jobs.after_fit("later")  # what the Fit tab calls
    assert {m for u, m in studio.runtime.jobs if u == "later"} == {"exact", "oppu"}
    assert all(studio.first_use_jobs.wait_first_use("later", m)["state"] == "done" for m in ("exact", "oppu"))


def test_fit_compare_why_and_refit_keeps_vector_on_failure(studio, monkeypatch):
    studio.histories.save_history("bo", studio.histories.demo_items("terse_01"), "tweets")
    studio.histories.rewrites.result()  # Save's background work: the rewrites, then the pass Fit makes
    stages = []
    fit = studio.fits.fit("bo", progress=stages.append)
    assert "fit" in stages and "features" not in stages and not fit.cold_start  # the pass was made already
    lam, info = studio.runtime.store.vector("bo", studio.runtime.engine.artifacts_id)
    assert lam.shape == (16,) and info["stats"]["n_items"] == 10

    # a refit that fails leaves the stored vector as it was
    monkeypatch.setattr(onboard, "fit_style", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError):
        studio.fits.fit("bo")
    monkeypatch.undo()
    assert np.array_equal(studio.runtime.store.vector("bo", studio.runtime.engine.artifacts_id)[0], lam)

    s = studio.runtime.settings(alpha=0.0, max_new_tokens=5)
    prompt = studio.runtime.task.prompt("the bus was late")
    outs = {o.method: o for o in studio.comparisons.compare("bo", prompt, ["base", "cluster", "card", "rag", "p2p"], s)}
    assert outs["card"].text == outs["cluster"].text  # α = 0 is the cluster model
    assert outs["rag"].info["trace"][0]["retrieved"] and outs["rag"].error is None
    assert outs["p2p"].error and "p2p" in outs["p2p"].error.lower() or "hypernetwork" in outs["p2p"].error
    gens = studio.runtime.store.generations(user="bo")
    assert {g["method"] for g in gens} == {"base", "cluster", "card", "rag"}
    assert all(g["settings"]["alpha"] == 0.0 and g["latency_s"] > 0 for g in gens)
    with pytest.raises(ValueError, match="empty"):
        list(studio.comparisons.compare("bo", "   ", ["base"], s))
    with pytest.raises(ValueError, match="unknown"):
        list(studio.comparisons.compare("bo", prompt, ["nope"], s))

    why = studio.comparisons.why("bo", prompt, studio.runtime.settings(alpha=3.0, max_new_tokens=5))
    assert why.steps and all(10 <= len(st["candidates"]) <= 12 for st in why.steps)
    for st in why.steps:  # one scale: log-probabilities among the candidates, before + correction = after
        chosen = [c for c in st["candidates"] if c["chosen"]]
        assert len(chosen) == 1 and chosen[0]["token"] == st["token"] and math.isfinite(chosen[0]["before"])
        assert any(c["token"] == st["cluster_token"] for c in st["candidates"])
        for c in st["candidates"]:
            assert c["before"] <= 1e-6 and c["after"] <= 1e-6
            assert c["before"] + c["correction"] == pytest.approx(c["after"], abs=1e-5)
    st0 = why.steps[0]
    assert st0["candidates"][0]["after"] == max(c["after"] for c in st0["candidates"])
    assert st0["changed"] == (st0["token"] != st0["cluster_token"])
    assert "".join(t for t, _ in why.pieces).strip() == why.text
    assert any(c for _, c in why.pieces) == any(st["changed"] for st in why.steps)


def test_oppu_trains_on_first_use_and_again_after_an_edit(studio):
    """OPPU in Compare: the first request trains the user's adapter (beside the database), the next reuses it,
    and a changed history retrains it."""
    studio.histories.save_history("opal", [Item(t) for t in TERSE[:4]], "tweets")
    s, prompt = studio.runtime.settings(max_new_tokens=4), studio.runtime.task.prompt("the tea was cold")
    assert studio.first_use_jobs.needs_indexing("opal", "oppu")
    first = next(studio.comparisons.compare("opal", prompt, ["oppu"], s))
    assert first.error is None and first.info["trace"][0]["adapter"].startswith("u_opal_")
    meta = next((studio.runtime.store.path.parent / "oppu").glob("*/u_opal_*/oppu.json"))
    trained = meta.stat().st_mtime_ns
    assert not studio.first_use_jobs.needs_indexing("opal", "oppu")
    again = next(studio.comparisons.compare("opal", prompt, ["oppu"], s))
    assert again.text == first.text and meta.stat().st_mtime_ns == trained  # reused, not retrained
    studio.histories.save_history("opal", [Item(t) for t in TERSE[2:7]], "tweets")
    assert studio.first_use_jobs.needs_indexing("opal", "oppu")
    assert next(studio.comparisons.compare("opal", prompt, ["oppu"], s)).error is None
    assert meta.stat().st_mtime_ns != trained and not studio.first_use_jobs.needs_indexing("opal", "oppu")


def test_why_pieces_merge_the_bytes_of_one_character(tokenizer):
    from personalize.studio.comparisons import text_pieces

    ids = tokenizer("ok 🔥🔥", add_special_tokens=False)["input_ids"]
    assert len(ids) > 3  # the emoji are byte-level tokens
    steps = [{"token_id": i, "changed": n == len(ids) - 1} for n, i in enumerate(ids)]
    pieces = text_pieces(tokenizer, steps)
    assert "".join(t for t, _ in pieces) == "ok 🔥🔥" and "\ufffd" not in "".join(t for t, _ in pieces)
    assert pieces[-1] == ("🔥", True) and not any(c for _, c in pieces[:-1])


def test_cold_start_for_a_one_item_history(studio):
    studio.histories.save_history("solo", [Item("just one thing i wrote")], "tweets")
    fit = studio.fits.fit("solo")
    assert fit.cold_start and np.allclose(fit.lam, 1.0)


def test_blind_pair_vote_feeds_exact_and_leaderboard(studio):
    studio.histories.save_history("cy", studio.histories.demo_items("emoji_01"), "tweets")
    s = studio.runtime.settings(alpha=2.0, max_new_tokens=5)
    pair = studio.votes.new_pair("cy", studio.runtime.task.prompt("we won the match"), ["base", "card"], s).pair
    assert set(pair.methods) == {"base", "card"} and pair.settings["alpha"] == 2.0
    gen = studio.runtime.store.generation(pair.gen_ids[0])
    assert gen["method"] == pair.methods[0] and gen["output"] == pair.outputs[0]
    # the same prompt and settings reuse the stored generations instead of decoding again
    n = len(studio.runtime.store.generations(user="cy"))
    studio.votes.new_pair("cy", pair.prompt, ["base", "card"], s).pair
    assert len(studio.runtime.store.generations(user="cy")) == n

    assert studio.first_use_jobs.needs_indexing("cy", "exact") and not studio.first_use_jobs.needs_indexing("cy", "card")
    before = len(studio.runtime.store.ratings())
    winner = "a" if pair.outputs[0].strip() != pair.outputs[1].strip() else "tie"
    studio.votes.vote(pair.id, winner, "rater-1")
    with pytest.raises(StalePair):
        studio.votes.vote(pair.id, "b", "rater-1")
    assert len(studio.runtime.store.ratings()) == before + 1
    lb = studio.votes.leaderboard(LeaderboardConfig(rounds=10))
    assert {r["method"] for r in lb["methods"]} >= {"base", "card"}
    if winner == "a":
        studio.votes.wait_feedback()
        entry = studio.runtime.store.blob("cy", "exact_memory", pair.prompt)
        assert entry is not None and len(entry["attributes"]) == 3 and entry["source"] == "feedback"
        assert not studio.first_use_jobs.needs_indexing("cy", "exact")


def test_explore_sweeps_alpha_and_k_on_held_out_items(studio):
    studio.histories.save_history("di", studio.histories.demo_items("formal_01"), "tweets")
    ticks = []
    res = studio.explorer.explore("di", [0.0, 2.0], n_holdout=3, s=studio.runtime.settings(max_new_tokens=5),
                         progress=lambda f, d: ticks.append(f))
    assert [r.alpha for r in res.alpha] == [0.0, 2.0] and res.n_fit == 7 and len(res.golds) == 3
    assert {(r.k, r.method) for r in res.k} == {(k, m) for k in (1, 2, 4) for m in ("cluster", "card")}
    assert all(0 <= r.rougeL <= 1 and r.length >= 0 for r in res.alpha + res.k)
    assert ticks[-1] == pytest.approx(1.0) and ticks == sorted(ticks)
    # α = 0 is the cluster model at the fit's K
    k_fit = studio.runtime.engine.cfg.default_k
    cl = next(r for r in res.k if r.k == k_fit and r.method == "cluster")
    assert res.alpha[0].outputs == cl.outputs
    studio.histories.save_history("explore-one", [Item("just one thing i wrote")], "tweets")
    with pytest.raises(ValueError, match="at least"):
        studio.explorer.explore("explore-one", [1.0], n_holdout=3)


def test_eval_runs_the_stateful_methods_on_users_it_never_stored(studio, tiny_artifacts):
    """eval onboards LaMP query users that no store knows: EXACT's memory, PAG's summary and OPPU's adapter
    live in a scratch store and folder, and every method yields a scored column."""
    from personalize.eval.evaluate import run_eval

    users_before = {a for a in studio.runtime.engine.model.peft_config if a.startswith("u_")}  # the studio's own OPPU users
    res = run_eval(studio.runtime.engine, tiny_artifacts["demo"], "dev", ["exact", "pag", "oppu", "card"], limit=2,
                   method_configs={"exact": {"max_pairs": 1}, "oppu": {"max_steps": 1}})
    assert set(res["methods"]) == {"exact", "pag", "oppu", "card"}
    assert all(v["n"] == 2 and 0 <= v["rougeL"] <= 1 for v in res["methods"].values())
    users_after = {a for a in studio.runtime.engine.model.peft_config if a.startswith("u_")}
    assert users_after == users_before  # eval's OPPU adapters released, the studio's left alone


# ---------------------------------------------------------------- the walkthrough of a new user (issue 13, item 5)

def test_dropped_duplicates_are_reported_on_save(studio):
    lines = TERSE[:5] + [TERSE[0], TERSE[1], "  " + TERSE[0] + "  "]  # 3 exact repeats (after stripping)
    items = studio.histories.parse(text="\n".join(lines))
    assert len(items) == 5 and items.duplicates == 3
    res = studio.histories.save_history("dupe", items, "tweets")
    assert res.n_items == 5 and res.duplicates == 3
    assert "3 duplicate items dropped" in page_text.save_message(studio, res)
    res = studio.histories.save_history("dupe", studio.histories.parse(text="\n".join(TERSE[:5])), "tweets")
    assert "duplicate" not in page_text.save_message(studio, res)
    assert "duplicate" not in page_text.save_message(studio, studio.histories.save_history("dupe", [Item(t) for t in TERSE[:5]], "tweets"))


def test_items_table_has_one_id_and_a_new_name_starts_an_empty_history(studio):
    studio.histories.save_history("eve", [Item(t) for t in TERSE[:3]], "tweets")
    rows = studio.histories.item_rows("eve")
    assert [len(r) for r in rows] == [3, 3, 3]  # number (the item's place in eve's own history), text, rewrite
    assert [r[0] for r in rows] == [1, 2, 3] and rows[0][1] == TERSE[0]
    assert studio.histories.item_rows("nobody-yet") == [] and studio.histories.item_rows("") == []

    # the box holds eve's saved text: typing another name empties it, and the table shows the new name's items
    new = studio.histories.switch_user("fay", shown_for="eve")
    assert new.clear and new.shown_for is None and new.rows == [] and "New user" in new.message
    back = studio.histories.switch_user("eve", shown_for="eve")
    assert not back.clear and back.shown_for == "eve" and len(back.rows) == 3
    # a fresh paste (not anyone's saved text) is kept while the person types their name
    fresh = studio.histories.switch_user("gus", shown_for=None)
    assert not fresh.clear and fresh.rows == []
    assert studio.histories.switch_user("eve", shown_for="fay").clear


def test_k_snaps_towards_the_direction_the_slider_moved(studio):
    assert studio.runtime.ks == [1, 2, 4]
    assert studio.runtime.snap_k(3) == 2  # no direction: the nearest (ties: the smaller)
    assert studio.runtime.snap_k(3, previous=2) == 4  # arrow right from 2 reaches 4 instead of snapping back
    assert studio.runtime.snap_k(3, previous=4) == 2  # arrow left from 4
    assert studio.runtime.snap_k(5, previous=4) == 4 and studio.runtime.snap_k(0, previous=1) == 1  # past either end
    assert studio.runtime.snap_k(2, previous=1) == 2 and studio.runtime.snap_k(4, previous=4) == 4
    assert studio.runtime.snap_k(None) == studio.runtime.engine.cfg.default_k


def test_distance_table_marks_the_users_own_cluster(studio):
    studio.histories.save_history("hal", [Item(t) for t in TERSE], "tweets")
    st = studio.histories.user_state("hal", 4)
    table = page_text.distance_table(st).splitlines()
    assert table[0] == "| cluster | distance | yours |" and len(table) == 2 + 4
    marked = [line for line in table[2:] if "◀ you" in line]
    assert marked == [table[2 + st.cluster]] and all(line.count("|") == 4 for line in table)
    assert page_text.cluster_summary(studio, st).startswith(f"**hal** is in cluster **{st.cluster}** of K = 4,")


def test_fit_verdict_says_in_plain_words_whether_the_vector_helps():
    from personalize.studio.fits import fit_verdict

    yes = fit_verdict({"acc_own": 0.41, "acc_no_head": 0.36, "helps": True, "n": 40})
    assert yes == "Your vector helps: it predicts 41% of your held-out words vs 36% for your cluster's model."
    no = fit_verdict({"acc_own": 0.35, "acc_no_head": 0.36, "helps": False, "n": 40})
    assert no.startswith("Your vector does not beat your cluster's model on your held-out items (35% vs 36%)")
    assert "cluster's model's output" in no
    kept = fit_verdict({"acc_own": 0.35, "acc_no_head": 0.36, "helps": False, "n": 40}, fallback=False)
    assert "still decodes CARD" in kept and "output for you" not in kept
    # values that round alike get the decimals that tell them apart
    assert "predicts 36.1% of your held-out words vs 36.0%" in fit_verdict(
        {"acc_own": 0.361, "acc_no_head": 0.3599, "helps": True})
    for short in ({}, {"acc_own": 0.5, "acc_no_head": 0.4}, {"acc_own": 0.5, "acc_no_head": 0.4, "helps": None}, None):
        assert "Too few items to tell" in fit_verdict(short)
    assert "too short" in fit_verdict({}, cold_start=True)


def test_one_compare_and_one_fit_read_the_person_once(studio, monkeypatch):
    """A Compare of several methods reads the person's history from the store once and hands it to every column;
    a fit reads it once for the fit, the memory of its features and the refit on the votes already cast."""
    studio.histories.save_history("una", studio.histories.demo_items("terse_02"), "tweets")
    studio.histories.rewrites.result()  # the save's background rewrites are done: the Compare only reads
    reads, items = [], studio.runtime.store.items
    monkeypatch.setattr(studio.runtime.store, "items", lambda name: reads.append(name) or items(name))
    s = studio.runtime.settings(alpha=0.0, max_new_tokens=3)
    outs = list(studio.comparisons.compare("una", studio.runtime.task.prompt("the bus"), ["base", "card", "rag", "cope", "p2p"], s))
    assert len(outs) == 5 and reads == ["una"]
    studio.runtime.store.add_feedback("una", "up", "p", outs[0].text or "a text of hers")
    reads.clear()
    stages = []
    studio.fits.fit("una", progress=stages.append)
    assert "your votes" in stages and reads == ["una"]


def test_a_methods_note_reaches_the_compare_column(studio, monkeypatch):
    from types import SimpleNamespace

    studio.histories.save_history("ivy", [Item(t) for t in TERSE], "tweets")
    state, s = studio.histories.user_state("ivy"), studio.runtime.settings(max_new_tokens=4)
    out = SimpleNamespace(text="ok", n_tokens=1, latency_s=0.01, trace=None,
                          note="your vector does not beat the cluster model: showing its output")
    monkeypatch.setattr(studio.comparisons, "decode", lambda *a, **k: out)
    o = studio.comparisons.run_method("card", state, "p", s)
    assert o.info["note"] == out.note and studio.runtime.store.generation(o.gen_id)["extra"]["note"] == out.note
    out.note = None
    assert "note" not in studio.comparisons.run_method("card", state, "p", s).info
    del out.note  # a Generation from before `note` existed
    assert "note" not in studio.comparisons.run_method("card", state, "p", s).info


# ---------------------------------------------------------------- every build under data/artifacts (item 4)

def test_builds_are_listed_per_task_and_choosing_a_task_switches_to_its_build(tiny_artifacts, tmp_path):
    import shutil

    from personalize.studio.builds import find_builds

    root = tmp_path / "artifacts"
    shutil.copytree(tiny_artifacts["artifacts"], root / "tweets")
    shutil.copytree(tiny_artifacts["artifacts"], root / "commits")
    meta = json.loads((root / "commits" / "config.json").read_text())
    meta |= {"task": "commit_subjects", "id": "commits-test", "created": "2000-01-01T00:00:00+00:00"}
    (root / "commits" / "config.json").write_text(json.dumps(meta))
    (root / "model").mkdir()  # a model folder's config.json is not a build
    (root / "model" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    shutil.copytree(root / "commits", root / "half.partial")  # an unfinished build is not offered
    assert {b.task for b in find_builds(root)} == {"tweets", "commit_subjects"} and len(find_builds(root)) == 2

    s = Studio.load(StudioConfig(own_adapters=False, artifacts=str(root / "tweets"), db=str(tmp_path / "studio.db"),
                                 demo_data=str(tiny_artifacts["demo"])))
    try:
        tweets_id = s.runtime.engine.artifacts_id
        builds = s.served_builds.builds()
        assert set(builds) == set(TASKS) and {"tweets", "commit_subjects", "headlines"} <= set(builds)
        assert [b.id for b in builds["tweets"]] == [tweets_id] and [b.id for b in builds["commit_subjects"]] == [
            "commits-test"] and builds["headlines"] == []
        s.histories.save_history("ann", [Item(t) for t in TERSE], "tweets")

        same = s.served_builds.switch_task("tweets")
        assert not same.switched and s.runtime.engine.artifacts_id == tweets_id
        missing = s.served_builds.switch_task("headlines")  # no build: says how to make one, and keeps serving the current one
        assert not missing.switched and missing.build is None and s.runtime.engine.artifacts_id == tweets_id
        assert "python -m personalize build --data" in missing.message
        assert f"--out {root / 'headlines'}" in missing.message
        with pytest.raises(ValueError, match="unknown task"):
            s.served_builds.switch_task("poems")

        s.runtime.method("rag")  # a method made for the old engine must not survive the switch
        res = s.served_builds.switch_task("commit_subjects")
        assert res.switched and res.build.id == "commits-test" and "commits-test" in res.message
        assert s.runtime.task.name == "commit_subjects" and s.runtime.engine.artifacts_id == "commits-test"
        assert s.runtime.method("rag").engine is s.runtime.engine and "commit_subjects" in page_text.header(s)
        st = s.histories.user_state("ann")  # placed in the new build on first use
        assert s.runtime.store.assignment("ann", "commits-test", st.k) is not None
        assert "Saved" in page_text.save_message(s, s.histories.save_history("ann", [Item(t) for t in TERSE], "commit_subjects"))

        back = s.served_builds.switch_task("tweets")
        assert back.switched and s.runtime.engine.artifacts_id == tweets_id and s.runtime.task.name == "tweets"
        assert s.served_builds.builds()["commit_subjects"][0].id == "commits-test"
    finally:
        s.runtime.store.close()


def test_how_near_a_cluster_is_said_in_plain_words(studio):
    """The nearest centroid's distance against the build's own people: a member of the population is within
    its cluster; a person further out than all of them is told the build is far from them."""
    from personalize.methods.card.cluster import closeness, member_distances

    c = studio.runtime.engine.clusters
    k = studio.runtime.snap_k(None)
    own = member_distances(c.embeddings, c.centroids[k], c.labels[k])  # each as if left out of the build
    words, further = closeness(c.embeddings, c.centroids[k], c.labels[k], float(np.median(own)) * 0.5)
    assert further >= 0.5 and "close to its centre" in words
    words, further = closeness(c.embeddings, c.centroids[k], c.labels[k], float(own.max()) + 0.1)
    assert further == 0 and "far from every cluster of this build" in words
    res = studio.histories.save_history("nearme", [Item(t) for t in TERSE], "tweets")
    assert res.closeness and res.closeness in page_text.save_message(studio, res)
    assert res.closeness in page_text.cluster_summary(studio, studio.histories.user_state("nearme"))


def test_fit_says_in_plain_words_when_the_build_keeps_card_at_the_cluster_model(studio, monkeypatch):
    """Issue 23 item 5: where the build's harm guard found no setting that moves the text above noise, the Fit
    page says CARD writes as the cluster model there (nothing that only looks personal); where card was kept,
    it says nothing of the kind."""
    studio.histories.save_history("topic", studio.histories.demo_items("formal_01"), "tweets")
    fit = studio.fits.fit("topic")
    report = studio.runtime.engine.meta.setdefault("report", {}).setdefault("tune", {})
    monkeypatch.setitem(report, "guard", {"kept": False, "alpha": 0.0, "people": 30, "why": "…"})
    cfg = studio.runtime.engine.cfg
    monkeypatch.setattr(studio.runtime.engine, "cfg", dataclasses.replace(cfg, decoding=dataclasses.replace(cfg.decoding, alpha=0.0)))
    msg = page_text.fit_message(studio, "topic", fit, 1.0)
    assert "CARD writes as your cluster's model" in msg and "30 validation people" in msg, msg
    monkeypatch.setitem(report, "guard", {"kept": True, "alpha": 2.0, "people": 30, "why": "…"})
    cfg = studio.runtime.engine.cfg
    monkeypatch.setattr(studio.runtime.engine, "cfg", dataclasses.replace(cfg, decoding=dataclasses.replace(cfg.decoding, alpha=2.0)))
    assert "CARD writes as your cluster's model" not in page_text.fit_message(studio, "topic", fit, 1.0)


def test_the_demo_picker_offers_people_the_build_never_saw_before_those_who_chose_its_settings(studio, monkeypatch):
    """Newcomers to try are people the build never saw at all: those outside its training who chose its decoding
    settings (build's report["validation_people"]) come after them, marked, then the population."""
    built = set(studio.runtime.engine.meta.get("users", []))
    outside = sorted(u for u in studio.runtime.demo_users if u not in built)
    if len(outside) < 2:  # the tiny build trains on all but a few: make two of its people outside, one who chose
        outside = sorted(studio.runtime.demo_users)[:2]
        monkeypatch.setitem(studio.runtime.engine.meta, "users", sorted(set(studio.runtime.demo_users) - set(outside)))
    report = studio.runtime.engine.meta.setdefault("report", {})
    monkeypatch.setitem(report, "validation_people", [outside[0]])
    labels = {u: label for label, u in studio.histories.demo_choices()}
    order = [u for _, u in studio.histories.demo_choices()]
    assert "chose the build's settings" in labels[outside[0]] and "new, not in the build" in labels[outside[1]]
    assert order.index(outside[1]) < order.index(outside[0]) < min(order.index(u) for u in studio.runtime.engine.meta["users"])


def test_rewrites_decode_in_one_batch_each_as_it_decodes_alone(studio):
    """The rewrites share one mixed batch, each row stopped at its own budget: every raw rewrite is what its text
    gives decoded alone with that budget (a short line is not padded to a long one's steps)."""
    from personalize.serving.generation import generate
    from personalize.serving.settings import DecodingSettings
    from personalize.methods.card.neutral import NEUTRAL_TEMPLATE, raw_rewrites

    eng = studio.runtime.engine
    texts = ["k bus late again", "the release notes for version two are finally written and merged upstream",
             "coffee", "Fix the crash on start-up when the config file is missing"]
    together = raw_rewrites(eng, texts)
    cap = eng.cfg.budget.max_target_tokens + 8
    for t, got in zip(texts, together):
        n = len(eng.tok(t, add_special_tokens=False)["input_ids"])
        eng.use_adapter(None)
        alone = generate(eng.model, eng.tok, [NEUTRAL_TEMPLATE.format(text=t)], eng.cfg.budget,
                         DecodingSettings(max_new_tokens=min(cap, int(1.5 * n) + 6)))[0]
        assert got == alone.text, t


def test_an_own_adapter_asked_for_runs_before_the_methods_first_uses_queued_ahead_of_it(studio):
    """Fit queues EXACT's and OPPU's first uses; *Train my own adapter* pressed after it must not wait minutes behind
    them: the running job finishes, then the own adapter, then the rest, in the order they came."""
    import threading

    from personalize.studio.first_use_jobs import OWN

    jobs, order, gate = studio.first_use_jobs, [], threading.Event()
    first = jobs._submit("queue", "exact", lambda job, progress: (gate.wait(30), order.append("exact")))
    deadline = time.time() + 60  # earlier tests' background work ahead of it
    while first["state"] != "running" and time.time() < deadline:
        time.sleep(0.05)
    later = [jobs._submit("queue", m, lambda job, progress, m=m: order.append(m)) for m in ("oppu", "cope")]
    own = jobs._submit("queue", OWN, lambda job, progress: order.append(OWN))
    assert later[0]["state"] == own["state"] == "queued"
    gate.set()
    deadline = time.time() + 30
    while any(j["state"] != "done" for j in (first, *later, own)) and time.time() < deadline:
        time.sleep(0.05)
    assert order == ["exact", OWN, "oppu", "cope"], [order, first, own]


def test_a_cluster_of_one_trains_in_the_background_refits_the_style_over_it_and_is_forgotten(studio, monkeypatch):
    """A person beyond the build's clusters (the far test) gets their own adapter after Save, in the background;
    until it is ready Compare's card says it decodes over the nearest cluster, then their style is fitted again
    over it, card decodes over it (cluster stays the cluster's) and Fit says so; Forget me deletes it."""
    from personalize.methods.card.own import owner_key

    jobs, eng = studio.first_use_jobs, studio.runtime.engine
    monkeypatch.setattr(onboard, "is_far", lambda engine, k, d: True)  # everyone is far: the switch Save reads
    monkeypatch.setattr(studio.runtime, "cfg", dataclasses.replace(studio.runtime.cfg, own_adapters=True))
    monkeypatch.setattr(eng, "cfg", dataclasses.replace(eng.cfg, own=dataclasses.replace(eng.cfg.own, far=True)))
    # the demo person's items come with their prompts: held out, none gives its answer away (a paste's rewrites by
    # the tiny model, its texts tidied, would: person.held_out_order)
    studio.save_from("solo", studio.histories.demo_history("formal_01"), None, "tweets", demo="formal_01")
    studio.histories.rewrites.result()
    studio.fits.fit("solo")  # fitted before the adapter is ready: over the cluster's
    job = jobs.own_job("solo")
    assert job is not None and job["method"] == "own adapter"
    s, prompt = studio.runtime.settings(max_new_tokens=4), studio.runtime.task.prompt("the tea was cold")
    while job["state"] in ("queued", "running"):
        time.sleep(0.2)
    assert job["state"] == "done", job
    assert jobs.has_own("solo") and not jobs.wants_own("solo")
    path = eng.own.path(owner_key("solo"))
    assert path.exists() and path.parent.parent == studio.runtime.store.path.parent / "oppu"
    state = studio.histories.user_state("solo")
    assert state.lam.own == owner_key("solo") and state.fit_stats["own_adapter"]  # refitted over it
    outs = {o.method: o for o in studio.comparisons.compare("solo", prompt, ["cluster", "card"], s)}
    assert "own adapter" in outs["card"].info["note"] and "note" not in outs["cluster"].info
    card_row = studio.comparisons.rows("card", state, prompt, s)[0]
    assert card_row.adapter == eng.own.peft_name(owner_key("solo"))
    assert studio.comparisons.rows("cluster", state, prompt, s)[0].adapter != card_row.adapter
    assert "your own adapter" in jobs.base_words("solo", True)
    # a vote refits the style over what it was fitted over: the person stays a cluster of one
    studio.votes.thumb("solo", True, s, method="card")
    voted = studio.histories.user_state("solo")
    assert voted.lam.own == owner_key("solo") and voted.fit_stats["n_votes"] == 1
    assert studio.comparisons.rows("card", voted, prompt, s)[0].adapter == card_row.adapter
    # Explore decodes as Compare does, over an adapter of their own, but one that never saw the held-out items
    trained, real_train = [], eng.own.train
    monkeypatch.setattr(eng.own, "train", lambda n, items, *a, **kw: (trained.append((n, [i.y for i in items])),
                                                                     real_train(n, items, *a, **kw))[1])
    sweep = studio.explorer.explore("solo", [0.0, 1.0], n_holdout=2, s=s)
    (sweep_name, seen), = trained
    assert not set(sweep.golds) & set(seen) and sweep_name != "solo"
    assert not eng.own.path(owner_key(sweep_name)).exists() and path.exists()  # the sweep's adapter is gone
    studio.own_data.forget("solo", True)
    assert not path.exists() and eng.own.peft_name(owner_key("solo")) not in eng.model.peft_config
