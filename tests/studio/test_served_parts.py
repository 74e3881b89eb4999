"""The studio serves a build as it is built (issue 58): the build writes its card part once card can decode and goes
on with card's check (the harm guard) and P2P; the studio serves the part meanwhile (P2P's column says when it
comes, Fit and Compare say that card's check runs), then takes the last parts in place. What a person saved and
fitted before stands after; app.py says `studio serves: card`, then `studio serves: all`."""

from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from personalize.methods.p2p import P2PConfig
from personalize.studio.coming import Coming

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
import app as studio_app  # noqa: E402


@pytest.fixture()
def building(tiny_artifacts, tmp_path):
    """The tiny build run in a thread with on_part; it stops after its card part until `go` is set."""
    from conftest import tiny_build_config
    from personalize.methods.card.build import build

    parts, card, go, done = [], threading.Event(), threading.Event(), threading.Event()
    out = tmp_path / "demo"
    progress = {"stage": "", "share": 0.0}

    def on_part(part, folder):
        parts.append((part, json.loads((folder / "config.json").read_text()), (folder / "p2p").exists()))
        if part == "card":
            card.set()
            assert go.wait(300)

    def run():
        try:
            cfg = tiny_build_config(tiny_artifacts["root"] / "lm")
            build(tiny_artifacts["demo"], "dev", out, replace(cfg, n_val_users=4), p2p=P2PConfig(steps=1),
                  on_part=on_part, progress=lambda s, f: progress.update(stage=s, share=f))
        finally:
            done.set()
            card.set()

    threading.Thread(target=run, daemon=True).start()
    assert card.wait(300)
    yield SimpleNamespace(out=out, parts=parts, go=go, done=done, progress=progress)
    go.set()
    done.wait(300)


def test_the_card_part_serves_before_the_build_ends_and_nothing_saved_is_lost_when_the_rest_arrives(
        building, tiny_artifacts, tmp_path):
    from personalize.fitting.plan import demo_ready
    from personalize.studio.facade import Studio, StudioConfig
    from personalize.ui import text as page_text

    (part, meta, has_p2p), = building.parts
    assert part == "card" and meta["part"] == "card" and not has_p2p
    assert meta["report"]["tune"]["guard"]["running"]
    assert not demo_ready(tiny_artifacts["demo"], building.out)  # a start that finds only the part builds again
    studio = Studio.load(StudioConfig(artifacts=str(building.out), db=str(tmp_path / "studio.db"), own_adapters=False,
                                      demo_data=str(tiny_artifacts["demo"]), export_dir=str(tmp_path / "exports")))
    progress = building.progress
    studio.follow_build(Coming(frozenset({"p2p"}), lambda: (progress["stage"], max(progress["share"], 0.5), 60.0),
                               checking=True))
    first = studio.served.artifacts_id
    texts = "\n".join(f"my note number {i} on the river walk, short and plain" for i in range(8))
    studio.save_from("ana", texts, None, studio.served.task.name)
    fit = studio.fits.fit("ana")
    s = studio.settings(max_new_tokens=4)
    out = {o.method: o for o in studio.comparisons.compare("ana", "Write about the river", ["card", "p2p"], s)}
    assert out["card"].error is None and out["card"].text is not None
    assert "p2p is coming in about" in out["p2p"].error, out["p2p"].error
    note = page_text.guard_note(studio)  # (Markdown-escaped: the line is the build's own words)
    assert "validation people\\: running" in note and "planned settings" in note, note
    assert "still finishing" in page_text.header(studio)

    building.go.set()  # the build decides card's check, trains P2P, finishes in place
    assert building.done.wait(300)
    (last, final, has_p2p) = building.parts[-1]
    assert last == "all" and "part" not in final and has_p2p and final["id"] == first
    assert "running" not in final["report"]["tune"]["guard"]
    studio.take_finished_build()
    assert studio.coming == Coming() and studio.served.artifacts_id == first
    assert studio.served.meta["report"]["tune"]["guard"] == final["report"]["tune"]["guard"]
    assert studio.served.cfg.decoding.alpha == final["settings"]["decoding"]["alpha"]
    assert page_text.guard_note(studio) is None or "running" not in page_text.guard_note(studio)
    assert "still finishing" not in page_text.header(studio)
    # what ana saved and fitted stands: her history, her vector on this build
    assert len(studio.store.items("ana")) == 8
    state = studio.histories.user_state("ana")
    assert state.fitted and state.cluster == fit.cluster
    out = {o.method: o for o in studio.comparisons.compare("ana", "Write about the river", ["card", "p2p"], s)}
    assert out["p2p"].error is None, out["p2p"].error
    assert demo_ready(tiny_artifacts["demo"], building.out)
    studio.store.close()


def test_app_says_when_each_part_serves(tiny_artifacts, tmp_path, capsys):
    """serve_parts: `studio serves: card` while the build runs, `studio serves: all` when it is done (the last
    parts taken); a later start (no build) says `all` at once."""
    from conftest import tiny_studio

    studio = tiny_studio(tiny_artifacts, tmp_path)
    job = SimpleNamespace(done=threading.Event(), error=None)
    studio.follow_build(Coming(frozenset({"p2p"}), checking=True))
    studio_app.serve_parts(studio, job)
    assert capsys.readouterr().out.splitlines() == ["studio serves: card"]
    job.done.set()
    deadline = time.monotonic() + 30
    while studio.coming != Coming() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.2)
    assert studio.coming == Coming() and capsys.readouterr().out.splitlines() == ["studio serves: all"]
    studio_app.serve_parts(studio, None)
    assert capsys.readouterr().out.splitlines() == ["studio serves: all"]
    failed = SimpleNamespace(done=threading.Event(), error="RuntimeError: out of disk")
    studio.follow_build(Coming(frozenset({"p2p"}), checking=True))
    studio_app.serve_parts(studio, failed)
    failed.done.set()
    deadline = time.monotonic() + 30
    while studio.coming != Coming() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.2)
    got = capsys.readouterr()
    assert got.out.splitlines() == ["studio serves: card"] and "last parts failed (RuntimeError: out of disk)" in got.err
    studio.store.close()
