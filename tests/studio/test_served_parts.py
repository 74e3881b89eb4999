"""The studio serves a build as it is built (issue 58): the build writes its cluster part once the cluster model can
decode, adds the head (card's part), then card's check (the harm guard) and P2P, in place; the studio serves each
part meanwhile (a column not served yet says when it comes, what needs the head says it waits for it, Fit and Compare
say that card's check runs), and takes the next in place. What a person saved and fitted before stands after; app.py
says `studio serves: cluster`, `card`, `all`."""

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
    """The tiny build run in a thread with on_part; it stops after each part until the test lets it go on."""
    from conftest import tiny_build_config
    from personalize.methods.card.build import build

    parts, reached, done = [], threading.Semaphore(0), threading.Event()
    go = {"cluster": threading.Event(), "card": threading.Event()}
    out = tmp_path / "demo"
    progress = {"stage": "", "share": 0.0}

    def on_part(part, folder):
        parts.append((part, json.loads((folder / "config.json").read_text()),
                      sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))))
        reached.release()
        if part in go:
            assert go[part].wait(300)

    def run():
        try:
            cfg = tiny_build_config(tiny_artifacts["root"] / "lm")
            build(tiny_artifacts["demo"], "dev", out, replace(cfg, n_val_users=4), p2p=P2PConfig(steps=1),
                  on_part=on_part, progress=lambda s, f: progress.update(stage=s, share=f))
        finally:
            done.set()
            reached.release()

    threading.Thread(target=run, daemon=True).start()
    yield SimpleNamespace(out=out, parts=parts, reached=reached, go=go, done=done, progress=progress)
    for e in go.values():
        e.set()
    done.wait(300)


def test_each_part_serves_as_it_is_built_and_nothing_saved_is_lost_when_the_next_arrives(building, tiny_artifacts,
                                                                                           tmp_path):
    from personalize.catalog import STEERED
    from personalize.fitting.plan import UsageError, demo_ready, load_engine
    from personalize.studio.facade import Studio, StudioConfig
    from personalize.ui import text as page_text

    assert building.reached.acquire(timeout=300)
    (part, meta, files), = building.parts
    assert part == "cluster" and meta["part"] == "cluster" and meta["head_users"] == {}
    assert "adapters" in files and "clusters.npz" in files and not [f for f in files if f.startswith("head_")]
    assert not demo_ready(tiny_artifacts["demo"], building.out)  # a start that finds only a part builds again
    with pytest.raises(UsageError, match="unfinished"):  # and a command (eval, tune) is told, not handed half a build
        load_engine(SimpleNamespace(artifacts=str(building.out)))
    studio = Studio.load(StudioConfig(artifacts=str(building.out), db=str(tmp_path / "studio.db"), own_adapters=False,
                                      demo_data=str(tiny_artifacts["demo"]), export_dir=str(tmp_path / "exports")))
    progress = building.progress
    pace = lambda: (progress["stage"], max(progress["share"], 0.5), 60.0)  # noqa: E731
    studio.follow_build(Coming.waiting(True, pace, head_share=0.85))
    assert studio.coming.methods == frozenset(STEERED) | {"p2p"} and studio.coming.head
    first = studio.served.artifacts_id
    assert studio.served.part == "cluster" and studio.served.heads == {}
    studio_app.build_app(studio)  # every tab lays itself out over a build without its head

    # the cluster part: Save and every Compare column but card's and P2P's serve; card says when it comes; Fit waits
    texts = "\n".join(f"my note number {i} on the river walk, short and plain" for i in range(8))
    studio.save_from("ana", texts, None, studio.served.task.name)
    s = studio.settings(max_new_tokens=4)
    out = {o.method: o for o in studio.comparisons.compare("ana", "Write about the river",
                                                          ["base", "cluster", "rag", "cope", "card"], s)}
    assert all(out[m].error is None for m in ("base", "cluster", "rag", "cope")), out
    assert "card is coming in about" in out["card"].error and "head" in out["card"].error
    for refused in (lambda: studio.fits.fit("ana"), lambda: studio.explorer.explore("ana", [0.0, 1.0]),
                    lambda: studio.comparisons.why("ana", "Write about the river", s),
                    lambda: studio.own_data.style_key("ana")):
        with pytest.raises(ValueError, match="waits for the head"):
            refused()
    assert "card comes with its head" in page_text.header(studio)

    building.go["cluster"].set()  # the head trains; the card part is written in place
    assert building.reached.acquire(timeout=300)
    (part, meta, files) = building.parts[-1]
    assert part == "card" and meta["part"] == "card" and meta["id"] == first and "head_tokens.safetensors" in files
    assert meta["report"]["tune"]["guard"]["running"] and "p2p" not in files
    studio.take_built_parts(Coming.waiting(False, pace))
    assert studio.served.part == "card" and set(studio.served.heads) == {"tokens"}
    fit = studio.fits.fit("ana")
    out = {o.method: o for o in studio.comparisons.compare("ana", "Write about the river", ["card", "p2p"], s)}
    assert out["card"].error is None and out["card"].text is not None
    assert "p2p is coming in about" in out["p2p"].error, out["p2p"].error
    note = page_text.guard_note(studio)  # (Markdown-escaped: the line is the build's own words)
    assert "validation people\\: running" in note and "planned settings" in note, note
    assert "still finishing" in page_text.header(studio)

    building.go["card"].set()  # the build decides card's check, trains P2P, finishes in place
    assert building.done.wait(300) and building.reached.acquire(timeout=30)
    (last, final, files) = building.parts[-1]
    assert last == "all" and "part" not in final and "p2p" in files and final["id"] == first
    assert "running" not in final["report"]["tune"]["guard"]
    studio.take_built_parts()
    assert studio.coming == Coming() and studio.served.artifacts_id == first and studio.served.part is None
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
    """serve_parts: `studio serves: cluster`, `card`, `all`, one line each as the first start's build reaches each
    part (the later ones taken in place); a later start (no build) says `all` at once; a build that fails says so."""
    from conftest import tiny_studio

    studio = tiny_studio(tiny_artifacts, tmp_path)

    def job(error=None):
        return SimpleNamespace(cluster=threading.Event(), card=threading.Event(), done=threading.Event(), error=error,
                               coming=lambda: Coming())

    def lines_until(n, timeout=30):
        got, deadline = [], time.monotonic() + timeout
        while len(got) < n and time.monotonic() < deadline:
            time.sleep(0.05)
            got += capsys.readouterr().out.splitlines()
        return got

    j = job()
    studio.follow_build(Coming(frozenset({"card", "p2p"}), head=True, checking=True))
    studio_app.serve_parts(studio, j)
    j.cluster.set()
    assert lines_until(1) == ["studio serves: cluster"]
    j.card.set()
    assert lines_until(1) == ["studio serves: card"]
    j.done.set()
    assert lines_until(1) == ["studio serves: all"] and studio.coming == Coming()
    studio_app.serve_parts(studio, None)
    assert capsys.readouterr().out.splitlines() == ["studio serves: all"]
    failed = job("RuntimeError: out of disk")
    studio.follow_build(Coming(frozenset({"p2p"}), checking=True))
    studio_app.serve_parts(studio, failed)
    failed.cluster.set(), failed.card.set(), failed.done.set()
    deadline = time.monotonic() + 30
    while not studio.coming.failed and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.2)
    got = capsys.readouterr()
    assert got.out.splitlines() == [] and "last parts failed (RuntimeError: out of disk)" in got.err
    # the page says what will not come, and the head is there: card and Fit serve, P2P says the build failed
    assert not studio.coming.pending and studio.coming.head_line("Fit") is None
    assert "the first start's build failed (RuntimeError: out of disk)" in studio.coming.column("p2p")
    studio.store.close()
