"""Human-eval campaigns on a real SQLite file: the assignment rules, judgments, results, export/import, and
resumable generation (a real `campaign generate` process killed mid-way, then resumed)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from personalize.humaneval import agreement
from personalize.humaneval.campaign_schema import REFERENCE, CampaignConfig, CampaignError, CampaignItem, canonical_label, degenerate
from personalize.humaneval.campaign import Campaigns
from personalize.humaneval.campaign_files import export_judgments, import_judgments
from personalize.store import Store

ROOT = Path(__file__).resolve().parents[2]
RANK = {"reference": 3, "card": 2, "cluster": 1, "base": 0}


def _items(n=4):
    return [CampaignItem(f"u{i}", f"prompt {i}", tuple(f"history {i}.{j}" for j in range(6)), f"gold text {i} here")
            for i in range(n)]


def _campaign(tmp_path, n_items=4, methods=("base", "cluster", "card"), **cfg):
    store = Store(tmp_path / "studio.db")
    camps = Campaigns(store, seed=0)
    camps.create("t", _items(n_items), CampaignConfig(methods, **cfg))
    for item, m in camps.missing("t"):
        camps.add_output(item["id"], m, f"{m} output {item['position']}", 0.1)
    return store, camps


def _prefer(a) -> str:
    """A simulated rater who ranks the arms reference > card > cluster > base."""
    return "a" if RANK[a.arms[0]] > RANK[a.arms[1]] else "b"


def test_units_and_outputs_are_created_with_the_campaign(tmp_path):
    store, camps = _campaign(tmp_path, reference=True)
    assert camps.outputs("t") == {"done": 16, "total": 16}  # 4 items × (3 methods + the reference)
    assert len(camps.units("t")) == 4 * 6  # every pair of 4 arms
    assert camps.missing("t") == []
    assert not camps.add_output(camps.items("t")[0]["id"], "card", "again", 0.1)  # stored once
    with pytest.raises(CampaignError, match="exists already"):
        camps.create("t", _items(), CampaignConfig(("base", "card")))
    with pytest.raises(ValueError, match="unknown method"):
        CampaignConfig(("base", "gpt9"))
    with pytest.raises(ValueError, match="at least two arms"):
        CampaignConfig(("card",))
    with pytest.raises(ValueError, match="attention checks need the reference"):
        CampaignConfig(("base", "card"), attention_every=3)
    with pytest.raises(CampaignError, match="no reference"):
        camps.create("u", [CampaignItem("u", "p", ("h",) * 5)], CampaignConfig(("base", "card"), reference=True))
    # the overlap agreement needs: 2 raters on a started unit by default (1 when a unit takes a single rating)
    assert camps.get("t")["config"].min_raters_per_unit == 2
    assert CampaignConfig(("base", "card"), raters_per_item=1).min_raters_per_unit == 1
    assert CampaignConfig(("base", "card"), min_raters_per_unit=3).min_raters_per_unit == 3
    for bad in (0, 4):
        with pytest.raises(ValueError, match="min raters per unit"):
            CampaignConfig(("base", "card"), raters_per_item=3, min_raters_per_unit=bad)
    old = json.loads(store.query("SELECT config FROM campaigns WHERE name = 't'")[0]["config"])
    old.pop("min_raters_per_unit")  # a campaign stored before the setting existed gets the default
    assert CampaignConfig.from_json(json.dumps(old)).min_raters_per_unit == 2


def test_no_rater_sees_a_unit_twice_and_everyone_gets_everything(tmp_path):
    store, camps = _campaign(tmp_path, raters_per_item=3)
    seen = {}
    for rater in ("r1", "r2", "r3"):
        seen[rater] = []
        while (a := camps.next("t", rater)) is not None:
            seen[rater].append((a.prompt, frozenset(a.arms)))
            camps.submit(a.id, rater, _prefer(a))
        assert len(seen[rater]) == len(set(seen[rater])) == 12  # 4 items × 3 pairs, no repeats
        assert camps.rater_progress("t", rater) == (12, 12)
    assert camps.next("t", "r4") is None  # every unit has its 3 ratings
    with store.transaction() as db:  # SQLite holds the rule too
        with pytest.raises(sqlite3.IntegrityError):
            row = db.execute("SELECT campaign, unit FROM campaign_assignments LIMIT 1").fetchone()
            db.execute("INSERT INTO campaign_assignments (campaign, unit, rater, swapped, status, served, served_at) "
                       "VALUES (?, ?, 'r1', 0, 'pending', '', 0)", list(row))


def test_two_raters_share_units_so_agreement_exists_from_the_start(tmp_path):
    """Two raters × 4 units, two judgments each: the second rater is given the first one's units (in the other
    A/B order), so Krippendorff's α is a number. Under least-rated first (min_raters_per_unit=1, the rule before)
    they judge disjoint units and α is undefined ("—")."""
    from personalize.humaneval.campaign_report import format_status

    for overlap, shared in ((None, 2), (1, 0)):
        folder = tmp_path / f"overlap-{overlap}"
        folder.mkdir()
        store, camps = _campaign(folder, methods=("base", "card"), min_raters_per_unit=overlap)
        assert len(camps.units("t")) == 4
        for rater in ("r1", "r2"):
            for n in range(2):
                a = camps.next("t", rater)
                v = _prefer(a)
                if rater == "r2" and n == 0:  # r2 disagrees once, so the verdicts vary
                    v = {"a": "b", "b": "a"}[v]
                camps.submit(a.id, rater, v)
        rows = camps.judgments("t")
        units = {}
        for r in rows:
            units.setdefault((r["first"], r["second"], r["item"]), {})[r["rater"]] = r
        res = camps.results("t")
        alpha = res["agreement"]["krippendorff_alpha"]
        assert res["agreement"]["shared_units"] == shared
        assert f"agreement needs 2 raters on a unit: {shared} units have them" in format_status(res)
        if overlap is None:
            assert len(units) == 2 and all(set(u) == {"r1", "r2"} for u in units.values())
            # counterbalanced: the second rater saw each shared unit in the other order
            assert all(u["r1"]["method_a"] != u["r2"]["method_a"] for u in units.values())
            # one agreeing and one disagreeing unit over card ×3, base ×1: α = 1 - 3·2/(2·3·1) = 0
            assert alpha is not None and alpha == pytest.approx(0.0)
            assert "Krippendorff's α (nominal): 0.000" in format_status(res)
            assert res["agreement"]["raters"] == {"r1": {"n": 2, "agreement": 0.5}, "r2": {"n": 2, "agreement": 0.5}}
        else:
            assert len(units) == 4 and alpha is None
            assert "Krippendorff's α (nominal): —" in format_status(res)
        store.close()


def test_a_started_unit_goes_to_the_next_rater_even_while_pending(tmp_path):
    """Raters arriving together get the same unit (its pending assignment counts), until it has
    min_raters_per_unit; then an unrated unit opens, and the next rater joins that one."""
    store, camps = _campaign(tmp_path, n_items=2, raters_per_item=3, min_raters_per_unit=3)
    first = camps.next("t", "r1")
    key = lambda a: (a.prompt, frozenset(a.arms))  # noqa: E731
    assert key(camps.next("t", "r2")) == key(first) == key(camps.next("t", "r3"))  # all pending at once
    for rater in ("r1", "r2", "r3"):
        camps.submit(camps.next("t", rater).id, rater, "a")
    fresh = camps.next("t", "r1")  # the first unit is full: an unrated one opens
    assert key(fresh) != key(first)
    camps.submit(fresh.id, "r1", "a")
    assert key(camps.next("t", "r4")) == key(fresh)  # r4 joins the started unit, not one of the 4 unrated


def test_least_rated_first_and_counterbalanced(tmp_path):
    """The rule without an overlap (min_raters_per_unit=1): an unrated unit before one another rater started."""
    store, camps = _campaign(tmp_path, raters_per_item=4, min_raters_per_unit=1)
    for _ in range(5):  # r1 rates five units
        a = camps.next("t", "r1")
        camps.submit(a.id, "r1", "a")
    rated = {r["first"] + r["second"] + str(r["item"]) for r in camps.judgments("t")}
    a = camps.next("t", "r2")  # r2 is served a unit nobody rated, though r1's units are open to r2
    assert "".join(sorted(a.arms)) + str(int(a.prompt.split()[-1])) not in rated
    camps.submit(a.id, "r2", "a")
    for rater in ("r2", "r3", "r4"):
        while (a := camps.next("t", rater)) is not None:
            camps.submit(a.id, rater, "a")
    while (a := camps.next("t", "r1")) is not None:
        camps.submit(a.id, "r1", "a")
    rows = camps.judgments("t")
    assert len(rows) == 12 * 4
    # each unit shown twice in each order, so every arm is shown as A exactly as often as B
    per_unit = Counter((r["first"], r["second"], r["item"], r["method_a"]) for r in rows)
    assert set(per_unit.values()) == {2}
    as_a = Counter(r["method_a"] for r in rows)
    as_b = Counter(r["method_b"] for r in rows)
    assert as_a == as_b
    res = camps.results("t")  # a rater who always presses A: the strengths are flat, the position bias is total
    assert res["agreement"]["position_bias"]["a_share"] == 1.0
    assert max(m["strength"] for m in res["leaderboard"]) - min(m["strength"] for m in res["leaderboard"]) < 1


def test_pending_assignment_survives_a_restart_and_skip_passes_it_on(tmp_path):
    store, camps = _campaign(tmp_path, raters_per_item=1)
    a = camps.next("t", "r1")
    assert camps.next("t", "r1").id == a.id  # a reload shows the same unit
    store.close()
    store = Store(tmp_path / "studio.db")
    again = Campaigns(store).next("t", "r1")  # so does a restarted studio
    assert (again.id, again.outputs) == (a.id, a.outputs)
    camps = Campaigns(store, seed=0)
    camps.skip(a.id, "r1")
    with pytest.raises(CampaignError):
        camps.submit(a.id, "r1", "a")  # skipped is not judged
    b = camps.next("t", "r1")
    assert b.id != a.id and set(b.arms) | {b.prompt} != set(a.arms) | {a.prompt}
    jid = camps.submit(b.id, "r1", "tie")
    with pytest.raises(CampaignError, match="already judged"):
        camps.submit(b.id, "r1", "a")  # a double click counts once
    with pytest.raises(CampaignError, match="not yours"):
        camps.submit(camps.next("t", "r2").id, "r1", "a")
    with pytest.raises(CampaignError, match="one of"):
        camps.submit(camps.next("t", "r1").id, "r1", "A")
    assert jid and len(camps.judgments("t")) == 1
    camps.set_status("t", "closed")
    with pytest.raises(CampaignError, match="closed"):
        camps.next("t", "r3")


def test_attention_checks_are_flagged_and_kept_out_of_the_results(tmp_path):
    store, camps = _campaign(tmp_path, reference=True, raters_per_item=1, attention_every=4)
    assert degenerate("gold text 0 here") == "gold text 0 " * 5 + "gold text 0"
    n = 0
    while (a := camps.next("t", "careless")) is not None:
        n += 1
        assert a.attention == (n % 4 == 0 and n <= 16)  # every 4th, while checks are left
        camps.submit(a.id, "careless", "a")  # always A: fails the checks where the degenerate output is A
    res = camps.results("t")
    checks = [r for r in camps.judgments("t") if r["attention"]]
    passed = sum(canonical_label(r) == REFERENCE for r in checks)
    assert res["attention"]["checks"] == len(checks) == 4
    assert res["attention"]["raters"]["careless"] == round(passed / 4, 3)
    assert res["judgments"] == 24 and sum(m["votes"] for m in res["leaderboard"]) == 2 * 24
    assert all(m["method"] != "degenerate" for m in res["leaderboard"])


def test_results_agreement_figures_match_a_hand_count(tmp_path):
    """Two raters on 3 items × 3 pairs: r1 ranks card > cluster > base, r2 agrees except on item 0's pairs."""
    store, camps = _campaign(tmp_path, n_items=3, raters_per_item=2)
    for rater in ("r1", "r2"):
        while (a := camps.next("t", rater)) is not None:
            v = _prefer(a)
            if rater == "r2" and a.prompt == "prompt 0":
                v = {"a": "b", "b": "a"}[v]
            camps.submit(a.id, rater, v)
    res = camps.results("t")
    # 9 units, r1 and r2 agree on 6: the per-rater agreement is 6/9 each
    assert res["agreement"]["raters"] == {"r1": {"n": 9, "agreement": pytest.approx(6 / 9)},
                                          "r2": {"n": 9, "agreement": pytest.approx(6 / 9)}}
    # Krippendorff's nominal α by hand: 9 units with 2 values each, 6 agreeing, 3 disagreeing pairs.
    # Values: card wins 6 + 6 - ... counted from the coincidence matrix of the labels.
    units = {}
    for r in camps.judgments("t"):
        units.setdefault((r["first"], r["second"], r["item"]), {})[r["rater"]] = canonical_label(r)
    labels = Counter(v for u in units.values() for v in u.values())  # n_c per label, 18 values in all
    n = sum(labels.values())
    d_o = 2 * 3 / n  # each disagreeing unit adds 2 off-diagonal coincidences (of weight 1/(2-1))
    d_e = (n * n - sum(c * c for c in labels.values())) / (n * (n - 1))
    assert res["agreement"]["krippendorff_alpha"] == pytest.approx(1 - d_o / d_e)
    assert [m["method"] for m in res["leaderboard"]] == ["card", "cluster", "base"]
    assert res["reference"] is None


def test_export_and_import_merge_without_duplicates(tmp_path):
    store, camps = _campaign(tmp_path, reference=True, raters_per_item=2)
    for rater in ("r1", "r2"):
        for _ in range(10):
            a = camps.next("t", rater)
            camps.submit(a.id, rater, _prefer(a))
    path, summary, n = export_judgments(camps, "t", tmp_path / "out" / "t.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert n == len(rows) == 20
    need = {"item", "user", "prompt", "method_a", "output_a", "method_b", "output_b", "verdict", "rater", "seconds",
            "served", "created"}
    assert need <= set(rows[0]) and all(r["output_a"] and r["output_b"] for r in rows)
    assert json.loads(summary.read_text())["judgments"] == 20
    csv_path, _, _ = export_judgments(camps, "t", tmp_path / "out" / "t.csv")
    with pytest.raises(CampaignError, match=".jsonl or .csv"):
        export_judgments(camps, "t", tmp_path / "t.txt")

    other = Campaigns(Store(tmp_path / "other.db"), seed=1)  # another studio, same campaign definition
    other.create("t", _items(), camps.get("t")["config"])
    for item, m in other.missing("t"):
        other.add_output(item["id"], m, f"{m} output {item['position']}", 0.1)
    a = other.next("t", "r3")
    other.submit(a.id, "r3", "tie")
    assert import_judgments(other, "t", path) == {"added": 20, "duplicates": 0, "unmatched": 0}
    assert import_judgments(other, "t", csv_path) == {"added": 0, "duplicates": 20, "unmatched": 0}
    merged = other.judgments("t")
    assert len(merged) == 21 and {r["verdict"] for r in merged if r["rater"] != "r3"} <= {"a", "b"}
    assert [r["winner"] for r in merged if r["source"] == "import"] == [r["winner"] for r in rows]
    assert other.results("t")["judgments"] == 21
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(CampaignError, match="cannot read"):
        import_judgments(other, "t", tmp_path / "bad.jsonl")


def test_rubric_mode(tmp_path):
    store, camps = _campaign(tmp_path, mode="rubric", raters_per_item=2, reference=True)
    first = camps.next("t", "r0")
    for bad in ({"style": 3, "content": 3}, {"style": 9, "content": 3, "fluency": 3}):
        with pytest.raises(CampaignError, match="rubric"):
            camps.submit(first.id, "r0", scores=bad)
    with pytest.raises(CampaignError, match="rubric"):
        camps.submit(first.id, "r0", "a")
    camps.skip(first.id, "r0")
    for rater in ("r1", "r2"):
        while (a := camps.next("t", rater)) is not None:
            assert len(a.outputs) == 1 and a.instruction.startswith("Score")
            s = float(RANK[a.arms[0]] + 1)
            camps.submit(a.id, rater, scores={"style": s, "content": s, "fluency": 5})
    res = camps.results("t")
    assert [m["method"] for m in res["leaderboard"]] == ["reference", "card", "cluster", "base"]
    assert res["leaderboard"][0]["style"] == 4.0 and res["reference"] == {"rank": 1, "of": 4}
    assert res["agreement"]["krippendorff_alpha"]["style"] == pytest.approx(1.0)
    assert res["agreement"]["krippendorff_alpha"]["fluency"] is None  # no variation at all


class FakeJudge:
    """A judge with a fixed taste (card > cluster > base), to check the judge–human correlation plumbing."""
    label = "fake judge"

    def pairwise(self, history, prompt, a, b):
        first = RANK[a.split()[0]] > RANK[b.split()[0]]
        return {"verdict": "a" if first else "b", "p_a": 0.8 if first else 0.2}


def test_judge_rank_correlation_with_the_raters(tmp_path):
    from personalize.humaneval.campaign_pool import run_judge

    store, camps = _campaign(tmp_path, raters_per_item=1)
    while (a := camps.next("t", "r1")) is not None:
        camps.submit(a.id, "r1", _prefer(a))
    assert run_judge(camps, "t", FakeJudge()) == {"judged": 12}
    assert run_judge(camps, "t", FakeJudge()) == {"judged": 0}  # resumable: judged units are kept
    res = camps.results("t")
    assert res["judgments"] == 12  # the judge's are apart
    rc = res["judge"]["rank_correlation"]
    assert rc["n"] == 3 and rc["spearman"] == pytest.approx(1.0) and rc["kendall"] == pytest.approx(1.0)
    human = {m["method"]: m["strength"] for m in res["leaderboard"]}
    assert rc == agreement.rank_correlation(human, res["judge"]["scores"])
    # the judge's score of an arm is its mean probability of winning: card won both its pairs at 0.8
    assert res["judge"]["scores"] == {"card": 0.8, "cluster": 0.5, "base": 0.2}
    assert res["judge"]["verdicts"] == {"a": 4, "b": 8}  # per item: card > cluster (a); base loses twice (b)


def test_votes_for_a_persons_past_text_are_counted_and_can_be_left_out(tmp_path):
    """Issue 57, item 5: card hands back one of the person's past texts on two of three items and a rater prefers it
    every time: the report says how many judged pairs held a copy and how many votes it won, and ranks the arms
    again without those pairs."""
    from personalize.humaneval.campaign_report import format_status

    store = Store(tmp_path / "studio.db")
    camps = Campaigns(store, seed=0)
    camps.create("t", _items(3), CampaignConfig(("base", "card")))
    for item, m in camps.missing("t"):
        pos = item["position"]
        copied = m == "card" and pos < 2
        camps.add_output(item["id"], m, f"History {pos}.2!" if copied else f"{m} writes anew for item {pos}", 0.1)
    while (a := camps.next("t", "r1")) is not None:
        camps.submit(a.id, "r1", "a" if a.arms[0] == "card" else "b")
    res = camps.results("t")
    assert res["copies"] == {"pairs": 3, "with_a_copy": 2, "won_by_a_copy": 2}
    assert res["leaderboard"][0]["method"] == "card" and res["leaderboard"][0]["votes"] == 3
    assert [m["votes"] for m in res["leaderboard_without_copies"]] == [1, 1]  # the one pair without a copy
    assert "2 of 3 judged pairs hold an output that repeats the person's past text; 2 votes" in format_status(res)


def test_campaign_people_are_kept_apart_from_the_studios_users(tiny_artifacts, tmp_path):
    """A campaign from the demo folder stores its people for generation, but not as the studio's users: the
    user list (studio.histories.user_names, the page's dropdown) names none of them, a studio user who has the name of one
    of them keeps their own history and style, and the campaign still generates and reports results."""
    from conftest import tiny_studio
    from personalize.humaneval.campaign_pool import lamp_items, person_name
    from personalize.data import Item
    from personalize.store import CAMPAIGN_PREFIX, StoreError

    studio = tiny_studio(tiny_artifacts, tmp_path)
    try:
        _, lamp, _ = lamp_items(tiny_artifacts["demo"], "dev", 3)
        namesake = lamp[0].user  # the studio's own user, named like one of the campaign's people
        mine = [Item(x="", y=f"my own text number {i}, written my way") for i in range(6)]
        studio.histories.save_history(namesake, mine, studio.runtime.task.name)
        before = studio.histories.user_names()
        c = studio.campaign_desk.create_campaign("apart", tiny_artifacts["demo"], "dev", 3, ["base", "card"], reference=True,
                                   raters_per_item=2)
        people = {it["user"] for it in studio.runtime.campaigns.items("apart")}
        assert namesake in people and studio.histories.user_names() == before == [namesake]
        assert not any(u["name"].startswith(CAMPAIGN_PREFIX) for u in studio.runtime.store.users())
        stored = {u["name"] for u in studio.runtime.store.users(campaign=True)} - set(before)
        task = c["config"].task
        assert stored == {person_name(task, it["user"], it["history"]) for it in studio.runtime.campaigns.items("apart")}
        res = studio.generate_campaign("apart")
        assert res["failed"] == [] and res["outputs"]["done"] == res["outputs"]["total"] == 3 * 3
        assert studio.histories.user_names() == before  # generating (fits, generations) stored no user of theirs either
        assert [it.y for it in studio.runtime.store.items(namesake)] == [it.y for it in mine]
        assert studio.runtime.store.vector(namesake, studio.runtime.engine.artifacts_id) is None  # the card fit was the copy's
        for rater in ("r1", "r2"):
            for _ in range(2):
                a = studio.campaigns.next("apart", rater)
                studio.campaigns.submit(a.id, rater, "a")
        out = studio.campaigns.results("apart")
        assert out["judgments"] == 4 and out["agreement"]["shared_units"] == 2
        assert out["agreement"]["krippendorff_alpha"] is not None  # "a" both times, shown in opposite orders
        with pytest.raises(StoreError, match="reserved|only"):  # nobody saves a history into the namespace
            studio.runtime.store.add_user(f"{CAMPAIGN_PREFIX}me", mine, studio.runtime.task.name)
        # a second campaign over the same people reuses the stored copies
        studio.campaign_desk.create_campaign("apart-2", tiny_artifacts["demo"], "dev", 3, ["base", "card"])
        assert {u["name"] for u in studio.runtime.store.users(campaign=True)} - set(before) == stored
    finally:
        studio.runtime.store.close()


def _count_outputs(db: Path) -> int:
    con = sqlite3.connect(db, timeout=30)
    try:
        return con.execute("SELECT COUNT(*) FROM campaign_outputs").fetchone()[0]
    finally:
        con.close()


def test_generate_is_resumable_after_a_kill(tiny_artifacts, tmp_path):
    """`campaign create` then `campaign generate`, SIGKILLed once outputs are being stored, then resumed:
    every output exists once, and the ones stored before the kill were not generated again."""
    db = tmp_path / "studio.db"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    cli = [sys.executable, "-m", "personalize", "campaign"]
    subprocess.run([*cli, "create", "--name", "k", "--artifacts", str(tiny_artifacts["artifacts"]),
                    "--data", str(tiny_artifacts["demo"]), "--split", "dev", "--limit", "6",
                    "--methods", "base,cluster,card", "--reference", "--max-tokens", "16", "--db", str(db)],
                   check=True, env=env, capture_output=True, cwd=tmp_path)
    assert _count_outputs(db) == 6  # the references
    proc = subprocess.Popen([*cli, "generate", "--name", "k", "--db", str(db)], env=env, cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.time()
    while _count_outputs(db) < 6 + 3 and time.time() - t0 < 300:
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    stored = _count_outputs(db)
    assert 6 < stored < 6 + 18, f"the kill did not land mid-way ({stored} outputs)"
    con = sqlite3.connect(db)
    before = dict(((i, m), c) for i, m, c in con.execute("SELECT item, method, created FROM campaign_outputs"))
    con.close()
    done = subprocess.run([*cli, "generate", "--name", "k", "--db", str(db)], env=env, cwd=tmp_path,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert f"generated {6 + 18 - stored} output(s)" in done.stdout
    con = sqlite3.connect(db)
    after = dict(((i, m), c) for i, m, c in con.execute("SELECT item, method, created FROM campaign_outputs"))
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    con.close()
    assert len(after) == 24 and all(after[k] == v for k, v in before.items())
    status = subprocess.run([*cli, "status", "--name", "k", "--json", "--db", str(db)], env=env, cwd=tmp_path,
                            capture_output=True, text=True, check=True)
    res = json.loads(status.stdout)
    assert {"items", "outputs", "judgments", "agreement", "leaderboard"} <= set(res)
    assert res["items"] == 6 and res["outputs"] == {"done": 24, "total": 24} and res["judgments"] == 0
