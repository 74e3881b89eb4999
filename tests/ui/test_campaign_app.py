"""Campaigns through the real app: 20 raters × 50 judgments at once over HTTP (none lost or doubled), and a whole
small campaign in headless Chromium — created from a LaMP folder in the Campaigns tab, generated, rated by two
raters in two browser sessions with the keyboard, its results read and exported."""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from campaign_serving import load_campaign, run_raters  # noqa: E402
from tools.browser import Page, chromium  # noqa: E402
from test_app import auth_server, server  # noqa: E402,F401  (real servers over the tiny artifacts)


def test_twenty_raters_fifty_judgments_each_over_http(server):  # noqa: F811
    studio = server["studio"]
    load_campaign(studio, "load", n_items=20, raters_per_item=20)  # 60 units, 20 ratings each: 1,200 possible
    res = run_raters(server["url"], "load", n_raters=20, n_each=50)
    assert not res["errors"], res["errors"][:5]
    assert res["counts"] == {f"rater-{i:02d}": 50 for i in range(20)}
    rows = studio.runtime.campaigns.judgments("load")
    assert len(rows) == 1000  # none lost...
    assert len({(r["rater"], r["first"], r["second"], r["item"]) for r in rows}) == 1000  # ...none doubled
    assert len({r["uid"] for r in rows}) == 1000
    per_unit = Counter((r["first"], r["second"], r["item"]) for r in rows)
    # least-rated first keeps the 60 units within a few ratings of each other
    assert max(per_unit.values()) <= 20 and max(per_unit.values()) - min(per_unit.values()) <= 4
    con = sqlite3.connect(Path(server["folder"]) / "studio.db")
    try:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        pending = con.execute("SELECT COUNT(*) FROM campaign_assignments a JOIN campaigns c ON c.id = a.campaign "
                              "WHERE c.name = 'load' AND a.status = 'pending'").fetchone()[0]
    finally:
        con.close()
    assert pending == 20  # each rater's next unit, served and kept for them
    print(f"20 raters × 50: median {1000 * sorted(res['latencies'])[500]:.0f} ms per judgment + next unit")


def test_with_auth_a_judgment_counts_under_the_logged_in_rater(auth_server):  # noqa: F811
    from gradio_client import Client

    studio = auth_server["studio"]
    load_campaign(studio, "auth", n_items=2, raters_per_item=2)
    c = Client(auth_server["url"], verbose=False, auth=("u1", "p1"))
    first = c.predict("auth", "mallory", api_name="/campaign_next")  # the typed id is ignored
    after = c.predict("auth", "mallory", first[0], api_name="/campaign_a")
    assert str(after[7]).startswith("Judgment #"), after
    assert [r["rater"] for r in studio.runtime.campaigns.judgments("auth")] == ["u1"]
    c2 = Client(auth_server["url"], verbose=False, auth=("u2", "p2"))
    stolen = c2.predict("auth", "u1", after[0], api_name="/campaign_b")  # u1's pending unit, sent by u2
    assert "not yours" in str(stolen[7]) and len(studio.runtime.campaigns.judgments("auth")) == 1


def _rate_all(pages: dict, total: int) -> dict:
    """Each rater presses keys until nothing is left, taking turns; returns how many each judged."""
    from selenium.webdriver.common.by import By

    done = {who: 0 for who in pages}
    keys = "1234"
    while any(n < total for n in done.values()):
        for who, p in pages.items():
            if done[who] >= total:
                continue
            p.d.execute_script("document.activeElement && document.activeElement.blur()")
            p.d.find_element(By.TAG_NAME, "body").send_keys(keys[done[who] % 4])  # the keyboard shortcuts
            done[who] += 1
            want = f"{done[who]} of {total} done" if done[who] < total else "Nothing left for you"
            p.until_text("rate-progress" if done[who] < total else "rate-status", want)
    return done


def test_browser_a_whole_small_campaign(server, tmp_path):  # noqa: F811
    studio = server["studio"]
    shots = Path(os.environ.get("SCREENSHOTS") or tmp_path / "shots")
    admin = Page(chromium(tmp_path / "admin"), shots)
    raters = {}
    try:
        admin.d.get(server["url"])
        admin.tab("Campaigns")
        admin.type("campaign-name", "pilot")
        admin.type("campaign-limit", "4")
        admin.type("campaign-per-item", "2")
        admin.click("campaign-create")  # from the LaMP folder (the tiny demo's), base/cluster/card + the reference
        admin.until_text("campaign-status", "Created")
        admin.until_text("campaign-summary", "Outputs 4 / 16")  # the references need no model
        admin.click("campaign-generate")
        admin.until_text("campaign-status", "outputs 16 / 16")
        for who in ("ana", "ben"):  # two browser sessions
            p = Page(chromium(tmp_path / who), shots)
            p.d.get(server["url"])
            p.tab("Rate")
            p.type("rate-rater", who)
            p.click("rate-start")
            p.until_text("rate-progress", "0 of 24 done")
            assert "more like something this person would write" in p.text("rate-instruction")
            assert p.text("rate-history").count("\n") >= 4  # the person's history, at least 5 items
            assert "Output A" in p.text("rate-out-a") and "Output B" in p.text("rate-out-b")
            raters[who] = p
        raters["ana"].shot("12-rate-campaign")
        assert _rate_all(raters, 24) == {"ana": 24, "ben": 24}

        admin.click("campaign-refresh")
        summary = admin.until_text("campaign-summary", "48")
        assert "Krippendorff" in summary and "position bias" in summary and "ranks" in summary
        admin.el("#campaign-plot .js-plotly-plot")
        assert "ana" in admin.text("campaign-raters") and "ben" in admin.text("campaign-raters")
        admin.d.execute_script("document.getElementById('campaign-status').scrollIntoView({block: 'start'})")
        admin.shot("13-campaign-results")
        res = studio.campaigns.results("pilot")
        assert res["judgments"] == 48 and res["raters"] == 2 and len(res["leaderboard"]) == 4
        # keys 1, 2, 3, 4 in turn: A, B, tie and both bad 12 times each, so A won half the decided ones
        assert Counter(r["verdict"] for r in studio.runtime.campaigns.judgments("pilot")) == {
            "a": 12, "b": 12, "tie": 12, "both_bad": 12}
        assert res["agreement"]["position_bias"]["a_share"] == 0.5 and res["agreement"]["position_bias"]["n"] == 24

        admin.d.execute_script("document.querySelectorAll('button').forEach(b => {"
                               "if (b.textContent.includes('Export / import')) b.click(); })")
        admin.click("campaign-export")
        admin.until_text("campaign-status", "Exported 48 judgment(s)")
        lines = (Path(studio.runtime.cfg.export_dir) / "campaign-pilot.jsonl").read_text().splitlines()
        rows = [json.loads(line) for line in lines]
        assert len(rows) == 48 and {r["rater"] for r in rows} == {"ana", "ben"}
        assert all(r["output_a"] and r["output_b"] and r["verdict"] for r in rows)
        summary_json = json.loads((Path(studio.runtime.cfg.export_dir) / "campaign-pilot.summary.json").read_text())
        assert summary_json["judgments"] == 48
    finally:
        admin.d.quit()
        for p in raters.values():
            p.d.quit()
