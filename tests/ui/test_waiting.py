"""The first start's page (ui/waiting.py): it answers while the demo build runs, says where the build stands and what
each tab waits for, and hands over to the studio, whose different title makes it reload."""

from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path

import pytest

import personalize.fitting.plan as plan
from personalize.ui import waiting
from tools.browser import free_port


def test_the_line_says_the_stage_the_share_and_the_time_left():
    job = waiting.FirstStart(Path("d"), Path("a"), started=100.0)
    assert "writing the demo's people" in job.line(now=130.0) and "left" not in job.line(now=130.0)
    job._progress("K=1 adapter", 0.25)
    assert "**K=1 adapter**, 25% after 1.0 min, about 3 min left" in job.line(now=160.0)
    job.error = "ValueError: no people"
    assert "failed after" in job.line(now=160.0) and "no people" in job.line(now=160.0)


def test_the_page_answers_during_the_build_and_follows_it(monkeypatch, tmp_path):
    release, seen = threading.Event(), []

    def slow_build(demo, art, progress=None, on_part=None):  # the real build's hooks, called as build calls them
        progress("clusters", 0.15)
        seen.append("started")
        release.wait(30)
        on_part("cluster", art)  # the studio may serve from here (app.load_studio waits for it)
        progress("head (tokens)", 0.7)
        on_part("card", art)
        progress("decoding choice", 0.9)

    monkeypatch.setattr(plan, "ensure_demo", slow_build)
    job = waiting.FirstStart(tmp_path / "demo", tmp_path / "art").start()
    page = waiting.waiting_page(job)
    port = free_port()
    page.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, js=waiting.RELOAD_JS)
    try:
        config = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/config", timeout=10).read())
        assert config["title"] == waiting.TITLE  # the reload script's mark: the studio's title differs
        text = json.dumps(config)
        assert all(tab in text for tab, _ in waiting.WAITS) and "waits for the clusters" in text
        assert seen == ["started"] and job.stage == "clusters" and not job.done.is_set()
        assert not job.cluster.is_set() and job.coming().head  # before its cluster part: nothing serves
        release.set()
        assert job.cluster.wait(10) and "The cluster model can decode" in job.line()
        assert job.done.wait(10) and job.error is None and not job.coming().pending
    finally:
        release.set()
        page.close()


def test_the_page_estimates_cards_part_from_the_builds_own_shares():
    from personalize.methods.card.build import STAGE_SHARES

    names = list(STAGE_SHARES)
    assert waiting.HEAD_SHARE == pytest.approx(sum(STAGE_SHARES[n] for n in names[: names.index("head") + 1]))
