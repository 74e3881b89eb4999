"""The Populations tab's library part: a population made from a CSV written here and built by a background job on
the tiny model (progress, the studio answering meanwhile, the build listed and served), a cancelled job leaving
nothing behind, build's cancel hook right before the rename, and which build a person's writing is nearest."""

from __future__ import annotations

import csv
import fcntl
import os
import shutil
import threading
import time
from pathlib import Path

import gradio as gr
import pytest

from personalize.data import Item
from personalize.display import md
from personalize.studio.builds import find_builds
from personalize.studio.facade import Studio, StudioConfig
from personalize.ui import populations
from personalize.ui import text as page_text

TERSE = [f"ok so the {w} was fine i guess" for w in ("bus", "tea", "rain", "film", "shop", "walk", "game", "cake")]
CHANGES = ["Fix FTBFS with GCC 14", "New upstream release", "Bump Standards-Version to 4.7.0, no changes needed",
           "Add an autopkgtest for the command line tool", "Update debian/copyright for the new years",
           "Drop the obsolete Breaks and Replaces", "Switch to debhelper-compat 13", "Refresh the patches",
           "Build-depend on python3-setuptools", "Fix the lintian warning about the manual page"]


def changelog_lines(who: int) -> list[str]:
    """A maintainer's entries. The head's tokens objective learns only from tokens inside the model's top 50; the
    tiny random model ranks a few tokens there almost anywhere (' contact', ' trousers', 'curs'), so every entry
    starts with them: without any, its people would give the head nothing to train on."""
    return [f"* contact trousers curs: {c} (Closes: #{10_000 + 97 * who + j})." for j, c in enumerate(CHANGES)]


def write_table(path: Path, people: int = 8) -> Path:
    """Debian-maintainer-like people, 10 entries each, as rows of (user, text, input, time)."""
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["user", "text", "input", "time"])
        for p in range(people):
            for j, line in enumerate(changelog_lines(p)):
                w.writerow([f"maint{p}", line, f"upload {j} of package{p}", 1_700_000_000 + 3600 * j])
    return path


def tiny_settings(root: Path):
    from personalize.methods.card.config import LoraSettings
    from personalize.methods.card.config import CardConfig
    from personalize.serving.settings import DecodingSettings
    from personalize.methods.card.config import HeadSettings
    from personalize.lm.model_config import ModelConfig
    from personalize.lm.tokens import TokenBudget

    return CardConfig(model=ModelConfig(str(root / "lm"), device="cpu"), ks=(1, 2), default_k=2,
                      budget=TokenBudget(32, 12), items_per_user=8, n_val_users=2,
                      lora=LoraSettings(r=4, alpha=8, targets=("q_proj", "v_proj"), batch_size=4, base_steps=2,
                                        cluster_steps=1),
                      head=HeadSettings(d=16, epochs=2), decoding=DecodingSettings(max_new_tokens=6), alphas=(0.0, 1.0))


@pytest.fixture()
def studio(tiny_artifacts, tmp_path):
    """A studio serving a copy of the tiny tweets build under its own artifacts root."""
    root = tmp_path / "artifacts"
    shutil.copytree(tiny_artifacts["artifacts"], root / "tweets")
    s = Studio.load(StudioConfig(own_adapters=False, artifacts=str(root / "tweets"), db=str(tmp_path / "studio.db"),
                                 demo_data=str(tiny_artifacts["demo"]), export_dir=str(tmp_path / "exports")))
    s.tiny = tiny_settings(tiny_artifacts["root"])
    yield s
    job = s.population_jobs.population_job
    if job is not None and job.running:
        job.cancel()
        job.wait(60)
    s.runtime.store.close()


@pytest.fixture()
def paused(studio, monkeypatch):
    """The job's build holds at a stage (after reporting it) until the test lets it go on: what the test does
    meanwhile happens during the build, whatever the machine's speed."""
    from personalize.studio import population_jobs

    real = population_jobs.build
    gate = {"stage": "K=1 adapter", "reached": threading.Event(), "go": threading.Event()}

    def build(*args, progress, **kwargs):
        def hold(stage, fraction):
            progress(stage, fraction)
            if stage == gate["stage"] and not gate["go"].is_set():
                gate["reached"].set()
                gate["go"].wait(60)
        return real(*args, progress=hold, **kwargs)

    monkeypatch.setattr(population_jobs, "build", build)
    yield gate
    gate["go"].set()


def lock_is_free(path: Path) -> bool:
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def test_the_app_builds_with_the_first_starts_settings_sized_to_the_population(tmp_path):
    from personalize.fitting.population import from_table
    from personalize.studio.population_jobs import app_build

    rep = from_table(write_table(tmp_path / "people.csv", people=8), tmp_path / "lamp")
    cfg, kwargs = app_build(tmp_path / "lamp", tmp_path / "out", rep.people)
    assert cfg.ks == (1, 2) and cfg.default_k == 2 and kwargs["limit_users"] == 8  # K <= a third of the people
    assert kwargs["p2p"].steps == 1 and cfg.lora.cluster_steps == 1 and cfg.lora.base_steps == 20
    assert cfg.budget.max_target_tokens == 32
    cfg, _ = app_build(tmp_path / "lamp", tmp_path / "out", 148)  # the machine's Debian maintainers
    assert cfg.ks == (1, 2, 4) and cfg.default_k == 4  # the first start's cap


def test_a_table_population_is_built_in_the_background_served_and_nearest_for_its_people(studio, paused, tmp_path,
                                                                                          monkeypatch):
    """Through the tab's handlers: Make and build → the job reads the CSV (its counts shown), builds beside the
    studio (which answers, its model lock free, a decode meanwhile), reports progress by stage, and ends with the
    build listed and served; then each person is told which build's people are nearest their writing. (The
    build's settings are the tiny model's: the app's own are checked above.)"""
    from personalize.studio import population_jobs

    monkeypatch.setattr(population_jobs, "app_build", lambda data, out, people: (studio.tiny, {"p2p": None}))
    root = studio.served_builds.artifacts_root
    tweets_id = studio.runtime.engine.artifacts_id
    csv_file = write_table(tmp_path / "people.csv")
    seen_stages: list[tuple[str, float]] = []

    status, counts, timer = populations.start(studio, "table", "team", None, str(csv_file), True)
    assert "team" in status and counts == "" and timer.active
    job = studio.population_jobs.population_job

    def sample():  # what a page polling the job sees
        while job.running:
            if job.state == "building" and (not seen_stages or seen_stages[-1] != (job.stage, job.fraction)):
                seen_stages.append((job.stage, job.fraction))
            time.sleep(0.002)
        seen_stages.append((job.stage, job.fraction))

    sampler = threading.Thread(target=sample)
    sampler.start()

    assert paused["reached"].wait(60), job.line()  # mid-build: its model loaded, its first adapter training
    assert job.report is not None and job.report.people == 8 and job.report.items == 80
    assert "kept 8 people, 80 items" in job.counts() and "dropped" in job.counts()
    assert job.stage == "K=1 adapter" and "building, K=1 adapter" in job.line()
    with pytest.raises(ValueError, match="still running"):  # one build at a time
        studio.population_jobs.start_population_build("table", "other", str(csv_file), cfg=studio.tiny, build_kwargs={"p2p": None})
    # the studio keeps serving: the store, the model lock, a decode of the served build, the tab's poll
    assert studio.histories.user_names() == [] and studio.runtime.model_lock.acquire(blocking=False)
    studio.runtime.model_lock.release()
    studio.histories.save_history("ann", [Item(t) for t in TERSE], "tweets")
    out = studio.comparisons.run_method("base", studio.histories.user_state("ann"), "the bus", studio.runtime.settings(max_new_tokens=3))
    assert out.error is None and job.running
    counts_md, line, percent, *_, timer, seen = populations.poll(studio, None)
    assert "kept 8 people" in counts_md and "K=1 adapter" in line and 0 < percent < 100 and timer.active
    paused["go"].set()

    assert job.wait(120) and job.state == "done", job.line()
    sampler.join()
    assert job.served and "the studio serves it now" in job.line()
    fractions = [f for _, f in seen_stages]
    assert fractions == sorted(fractions) and fractions[-1] == pytest.approx(1.0) and len(set(fractions)) >= 3
    assert str(job.out) in [b.folder for b in find_builds(root)] and studio.runtime.task.name == "writing"
    assert studio.runtime.engine.folder == job.out and studio.runtime.engine.artifacts_id != tweets_id

    counts_md, line, percent, builds, *page, timer, seen = populations.poll(studio, None)
    assert "kept 8 people" in counts_md and percent == 100 and not timer.active and seen
    assert builds["value"] == str(job.out) and len(builds["choices"]) == 2
    assert page[-1] == "writing" and "writing" in page[0]  # the task list and the header show what is served
    again = populations.poll(studio, seen)  # shown once per page
    assert isinstance(again[3], type(gr.skip())) and not again[-2].active

    # which build's population a person's writing is nearest (the tweets build is not served any more)
    studio.histories.save_history("deb", [Item(t) for t in changelog_lines(99)], "writing")
    deb = studio.population_jobs.nearest_build("deb")
    assert deb["nearest"]["served"] and deb["message"] == "" and len(deb["builds"]) == 2
    studio.histories.save_history("ann", [Item(t) for t in TERSE], "writing")
    ann = studio.population_jobs.nearest_build("ann")
    assert ann["nearest"]["id"] == tweets_id and not ann["nearest"]["served"]
    assert md(tweets_id) in ann["message"] and "Populations" in ann["message"]
    assert ann["nearest"]["words"] in ann["message"]
    assert ann["builds"][0]["distance"] < ann["builds"][1]["distance"]
    res = studio.save_from("ann", "\n".join(TERSE), None, "writing")
    assert ann["message"] in page_text.save_message(studio, res)
    assert ann["message"] not in page_text.save_message(studio, studio.save_from("deb", "\n".join(changelog_lines(99)), None,
                                                                      "writing"))

    msg, *_ = populations.serve(studio, str(root / "tweets"))  # serve a build back from the tab
    assert tweets_id in msg and studio.runtime.engine.artifacts_id == tweets_id
    assert "already" in studio.served_builds.serve_build(str(root / "tweets"))
    assert populations.serve(studio, str(tmp_path))[0].startswith("⚠️")  # not a build here


def test_a_cancelled_build_leaves_nothing_and_the_studio_answers(studio, paused, tmp_path):
    root = studio.served_builds.artifacts_root
    csv_file = write_table(tmp_path / "people.csv")
    for bad, why in (("../up", "name the build"), ("tweets", "exists already"), ("", "name the build")):
        with pytest.raises(ValueError, match=why):
            studio.population_jobs.start_population_build("table", bad, str(csv_file))
    with pytest.raises(ValueError, match="unknown source"):
        studio.population_jobs.start_population_build("mail", "x", "a")
    with pytest.raises(ValueError, match="no population build is running"):
        studio.population_jobs.cancel_population_build()
    assert populations.cancel(studio).startswith("⚠️")

    job = studio.population_jobs.start_population_build("table", "gone", str(csv_file), serve=True, cfg=studio.tiny,
                                        build_kwargs={"p2p": None})
    assert paused["reached"].wait(60), job.line()
    assert (job.data / "dev_questions.json").exists()  # the population step has written its folder
    assert "cancelling" in populations.cancel(studio)
    assert studio.histories.user_names() == [] and job.running  # answers while the build winds down
    paused["go"].set()
    assert job.wait(60) and job.state == "cancelled", job.line()
    assert job.stage == "K=1 adapter"  # stopped at the next step of the stage it was in
    assert "nothing was written" in job.line() and not job.served
    assert not (root / "gone").exists() and not (root / "gone.partial").exists() and not job.data.exists()
    assert [Path(b.folder).name for b in find_builds(root)] == ["tweets"]
    assert lock_is_free(root / "gone.lock") and studio.runtime.model_lock.acquire(blocking=False)
    studio.runtime.model_lock.release()
    assert studio.runtime.engine.folder == root / "tweets"

    bad = studio.population_jobs.start_population_build("table", "broken", str(tmp_path / "missing.csv"))  # fails in its thread
    assert bad.wait(30) and bad.state == "error" and "file not found" in bad.line()
    assert not (root / "broken").exists() and not bad.data.exists()


def test_build_cancelled_just_before_the_rename_removes_its_partial_folder(tiny_artifacts, tmp_path):
    """build's hooks: progress by stage; a cancel that arrives once the folder is written (at "save") still
    leaves no artifacts and no `.partial`; a cancel before the start writes nothing either."""
    from personalize.methods.card.build import BuildCancelled, build
    from personalize.fitting.population import from_table

    from_table(write_table(tmp_path / "people.csv", people=6), tmp_path / "lamp")
    cancel, stages = threading.Event(), []

    def progress(stage, f):
        stages.append(stage)
        if stage == "save":
            cancel.set()

    cfg = tiny_settings(tiny_artifacts["root"])
    with pytest.raises(BuildCancelled):
        build(tmp_path / "lamp", "dev", tmp_path / "art", cfg, p2p=None, progress=progress, cancel=cancel)
    assert stages[-1] == "save" and not (tmp_path / "art").exists() and not (tmp_path / "art.partial").exists()
    with pytest.raises(BuildCancelled, match="load models"):
        build(tmp_path / "lamp", "dev", tmp_path / "art", cfg, p2p=None, cancel=cancel)
    assert not (tmp_path / "art").exists()


def test_the_tab_over_http_starts_follows_and_cancels_a_build(studio, paused, tmp_path, monkeypatch):
    """The page's own events through Gradio's client: Make and build with an uploaded table, the timer's poll (the
    counts, the stage, the percentage), Cancel; a page that polls once it has ended sees it cancelled."""
    import socket

    from gradio_client import Client, handle_file

    import app as studio_app
    from personalize.studio import population_jobs

    monkeypatch.setattr(population_jobs, "app_build", lambda data, out, people: (studio.tiny, {"p2p": None}))
    page = studio_app.build_app(studio)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    page.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        c = Client(f"http://127.0.0.1:{port}/", verbose=False)
        assert c.predict(api_name="/cancel_population").startswith("⚠️")
        status, counts, _ = c.predict("table", "../x", "", None, True, api_name="/build_population")
        assert status.startswith("⚠️") and "name the build" in status
        csv_file = write_table(tmp_path / "people.csv")
        status, counts, timer = c.predict("table", "web", "", handle_file(str(csv_file)), True,
                                          api_name="/build_population")
        assert "`web`" in status and timer["active"]
        assert paused["reached"].wait(60)
        counts, line, percent, *_ = c.predict(api_name="/population_status")
        assert "kept 8 people" in counts and "K=1 adapter" in line and 0 < percent < 100
        assert "cancelling" in c.predict(api_name="/cancel_population")
        paused["go"].set()
        assert studio.population_jobs.population_job.wait(60)
        counts, line, percent, *_, timer = c.predict(api_name="/population_status")  # (no State over HTTP)
        assert "cancelled" in line and "nothing was written" in line and not timer["active"]
        assert not (studio.served_builds.artifacts_root / "web").exists()
    finally:
        page.close()
