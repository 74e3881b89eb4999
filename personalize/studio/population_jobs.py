"""A population made and built from the app (the Populations tab), and which build a person's writing is nearest.

A `PopulationJob` runs in its own thread beside the serving studio: population.py turns a source (a git repository,
Debian changelogs, a table) into a LaMP folder and counts what it kept and dropped, then build.build trains the
artifacts with the settings of the first start (plan.DEMO_BUILD_ARGS: minutes on a CPU), K capped by the population's
size. The build loads its own copy of the model, as the command line does, so the studio's model lock is never taken
and every tab keeps answering; the thread runs at a lower CPU priority. Progress and cancellation go through
build's hooks: a cancel stops the build at its next step, and nothing of the job stays behind (no artifacts folder,
no `.partial`, no population folder; the build's `<name>.lock` file stays, unlocked, as after every build).
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from personalize.fitting import changelogs, population
from personalize.methods.card.build import BuildCancelled, build
from personalize.methods.card.cluster import closeness
from personalize.data import HistoryError
from personalize.display import md
from personalize.schema import as_starter
from personalize.lm.cpu_threads import lower_priority, release_team
from personalize.studio.builds import Builds
from personalize.studio.histories import Histories
from personalize.studio.service import Service

SOURCES = {"git": "a git repository", "changelogs": "Debian maintainers' changelogs", "table": "a table"}
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


@dataclass
class PopulationJob:
    """One population made and built in a thread; the tab polls it. state: queued → population → building →
    done | cancelled | error."""

    name: str
    source: str
    out: Path  # the artifacts folder, <artifacts root>/<name>
    data: Path  # the population's LaMP folder
    serve: bool = True  # the studio serves the build once it is written
    state: str = "queued"
    stage: str = ""
    fraction: float = 0.0  # of the build (build's progress hook)
    report: population.PopulationReport | None = None
    error: str | None = None
    served: bool = False  # the studio switched to the build
    started: float = field(default_factory=time.time)
    seconds: float | None = None
    cancel_event: threading.Event = field(default_factory=threading.Event, repr=False)
    thread: threading.Thread | None = field(default=None, repr=False)

    @property
    def running(self) -> bool:
        return self.state in ("queued", "population", "building")

    def cancel(self) -> None:
        """Stops the build at its next step (a training step, a person's features, a decoding setting)."""
        self.cancel_event.set()

    def wait(self, timeout: float | None = None) -> bool:
        """True once the job has ended."""
        if self.thread is not None:
            self.thread.join(timeout)
        return not self.running

    def counts(self) -> str:
        """What the population step kept and dropped, in the words of the population command."""
        if self.report is None:
            return ""
        note = f" Note: {self.report.note}." if self.report.note else ""
        return f"Population **{self.name}** from {SOURCES[self.source]}: {self.report.summary()}.{note}"

    def line(self) -> str:
        """Where the job stands, in one line (the tab's status)."""
        spent = f"{(self.seconds if self.seconds is not None else time.time() - self.started):.0f} s"
        if self.state == "queued":
            return f"`{self.name}`: starting…"
        if self.state == "population":
            return f"`{self.name}`: reading {SOURCES[self.source]}, {spent} so far…"
        if self.state == "building":
            cancelling = " (cancelling at the next step)" if self.cancel_event.is_set() else ""
            return (f"`{self.name}`: building, {self.stage or 'starting'}: {self.fraction:.0%}, {spent} so far; the "
                    f"studio keeps serving meanwhile{cancelling}…")
        if self.state == "done":
            return (f"`{self.name}` built in {spent}" + (": the studio serves it now." if self.served else
                                                          ": choose it under *Serve a build* to serve it."))
        if self.state == "cancelled":
            where = f" at {self.stage}" if self.stage else ""
            return f"`{self.name}` cancelled after {spent}{where}: nothing was written."
        return f"`{self.name}` failed after {spent}: {md(self.error)}"  # errors quote paths and file contents

    # ------------------------------------------------------------ the work, in the job's thread
    def run(self, make: Callable[[Path], population.PopulationReport],
            settings: Callable[[Path, population.PopulationReport], tuple], on_built: Callable[[Path], None]) -> None:
        """make(data) writes the population; settings(data, report) gives build()'s (cfg, keyword arguments);
        on_built(out) serves the build (when `serve`)."""
        lower_priority()  # the requests of the studio's sessions come first
        try:
            self.state = "population"
            self.report = make(self.data)
            if self.cancel_event.is_set():
                raise BuildCancelled("cancelled before the build started")
            self.state = "building"
            cfg, kwargs = settings(self.data, self.report)
            build(self.data, "dev", self.out, cfg, **kwargs, progress=self._progress, cancel=self.cancel_event)
            if self.serve:
                on_built(self.out)
                self.served = True
            self.state = "done"
        except BuildCancelled:
            self._clean()
            self.state = "cancelled"
        except Exception as e:  # bad input or a failed build: the tab says so, and nothing is left half-way
            self._clean()
            self.error, self.state = str(e) or e.__class__.__name__, "error"
        finally:
            self.seconds = time.time() - self.started
            release_team()

    def _progress(self, stage: str, fraction: float) -> None:
        self.stage, self.fraction = stage, fraction

    def _clean(self) -> None:
        """The population folder goes too (it was made for this build); build removed its own `.partial`."""
        if not (self.out / "config.json").exists():
            shutil.rmtree(self.data, ignore_errors=True)


def check_name(name: str | None, root: Path) -> str:
    """A build's name: a folder name under the artifacts root that no build has yet."""
    name = (name or "").strip()
    if not NAME.fullmatch(name):
        raise ValueError("name the build with letters, digits, - or _ (up to 64, starting with a letter or digit), "
                         "e.g. my-team")
    if (root / name).exists():
        raise ValueError(f"{root / name} exists already: choose another name (a build is never replaced from the app)")
    return name


def population_maker(source: str, paths: Sequence[str]) -> Callable[[Path], population.PopulationReport]:
    """The population step for a source, checked before the job starts: from_git (one or more repositories),
    from_changelogs (a docs folder, /usr/share/doc when none is given) or from_table (a .csv / .jsonl file)."""
    paths = [p.strip() for p in paths if p and p.strip()]
    if source == "git":
        if not paths:
            raise ValueError("give the path of a git repository on this machine (one per line for several)")
        return lambda out: population.from_git(paths, out)
    if source == "changelogs":
        if len(paths) > 1:
            raise ValueError("give one docs folder (e.g. /usr/share/doc)")
        docs = paths[0] if paths else changelogs.DEBIAN_DOCS
        return lambda out: changelogs.from_changelogs(docs, out)
    if source == "table":
        if len(paths) != 1:
            raise ValueError("upload a .csv or .jsonl file with a user and a text column")
        if Path(paths[0]).suffix.lower() not in (".csv", ".jsonl"):
            raise HistoryError(f"{Path(paths[0]).name}: expected a .csv or .jsonl file")
        return lambda out: population.from_table(paths[0], out)
    raise ValueError(f"unknown source {source!r}; choose from {', '.join(SOURCES)}")


def app_build(data: Path, out: Path, people: int):
    """build()'s (settings, keyword arguments) for the app: the first start's (plan.DEMO_BUILD_ARGS, with the people
    it trains on as demo_people_args chooses them), K at most a third of the people trained on."""
    from personalize.fitting.plan import DEMO_BUILD_ARGS, DEMO_POPULATION, build_args, build_plan, demo_people_args

    trained = min(DEMO_POPULATION, people)
    args = list(DEMO_BUILD_ARGS)
    first_start_ks = [int(k) for k in args[args.index("--ks") + 1].split(",")]
    ks = [k for k in first_start_ks if k == 1 or k <= trained // 3]
    args[args.index("--ks") + 1] = ",".join(map(str, ks))
    args[args.index("--default-k") + 1] = str(max(ks))
    _, _, cfg, kwargs = build_plan(build_args(["--data", str(data), "--out", str(out), *args, *demo_people_args(data)]))
    return cfg, kwargs


def start(name: str, source: str, paths: Sequence[str], root: Path, data_root: Path, model, encoder,
          on_built: Callable[[Path], None], serve: bool = True, cfg=None, build_kwargs: dict | None = None,
          ) -> PopulationJob:
    """Checks the request and starts the job's thread. model / encoder: the served build's (ModelConfig,
    EncoderConfig): the new build shares its model and its embedding space. cfg / build_kwargs: settings that
    replace the app's (tests: a tiny model)."""
    name = check_name(name, root)
    make = population_maker(source, paths)
    job = PopulationJob(name, source, root / name, data_root / name, serve)

    def settings(data: Path, report: population.PopulationReport):
        if cfg is not None:
            return cfg, dict(build_kwargs or {})
        c, kwargs = app_build(data, job.out, report.people)
        return replace(c, model=model, encoder=encoder), kwargs | (build_kwargs or {})

    # as the (admin) login that started it, as every job a page event starts (schema.as_starter)
    job.thread = threading.Thread(target=as_starter(job.run), args=(make, settings, on_built), daemon=True,
                                  name=f"population-build-{name}")
    job.thread.start()
    return job


# ---------------------------------------------------------------- which build's population a person is nearest

@functools.lru_cache(maxsize=32)
def _centres(folder: str, stamp: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(population embeddings, centroids at K, labels at K) from a build's clusters.npz alone (no model)."""
    with np.load(Path(folder) / "clusters.npz") as z:
        return z["embeddings"], z[f"centroids_k{k}"], z[f"labels_k{k}"]


def build_centres(folder: str | Path) -> dict | None:
    """A build's id, task, encoder, default K and its population's centres at that K; None when unreadable."""
    folder = Path(folder)
    try:
        meta = json.loads((folder / "config.json").read_text())
        k = int(meta["settings"]["default_k"])
        emb, cents, labels = _centres(str(folder), (folder / "clusters.npz").stat().st_mtime_ns, k)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return {"folder": str(folder), "id": meta.get("id", folder.name), "task": meta.get("task", ""),
            "encoder_id": meta.get("encoder_id"), "k": k, "embeddings": emb, "centroids": cents, "labels": labels}


def nearest(embedding: np.ndarray, builds: Sequence[dict]) -> dict:
    """Each build (build_centres, same encoder as the embedding) by the distance of the person's mean embedding to
    its nearest cluster centre at the build's default K, nearest first, with cluster.closeness's words."""
    rows = []
    for b in builds:
        d = float(np.linalg.norm(b["centroids"] - embedding[None], axis=1).min())
        words, _ = closeness(b["embeddings"], b["centroids"], b["labels"], d)
        rows.append({"id": b["id"], "task": b["task"], "folder": b["folder"], "k": b["k"], "distance": round(d, 4),
                     "words": words, "served": bool(b.get("served"))})
    rows.sort(key=lambda r: r["distance"])
    return {"builds": rows, "nearest": rows[0] if rows else None}


class PopulationJobs(Service):
    """The Populations tab from the studio: one population build at a time (it takes the CPU for minutes), and which
    build's population a person's writing is nearest."""

    def __init__(self, rt, served_builds: Builds, histories: Histories):
        super().__init__(rt)
        self.served_builds, self.histories = served_builds, histories
        self._population_job = None  # the newest PopulationJob started from the app, running or ended
        self._population_start = threading.Lock()

    @property
    def population_job(self):
        return self._population_job

    def start_population_build(self, source: str, name: str | None, paths: Sequence[str] | str | None = None,
                               serve: bool = True, cfg=None, build_kwargs: dict | None = None):
        """A population from `source` (population_jobs.SOURCES: git repositories, one per line; a Debian docs
        folder; a .csv / .jsonl table) built into <artifacts root>/<name> by a background PopulationJob (progress,
        cancel) with its own copy of the served build's model, so every tab keeps answering; served once written
        when `serve`. cfg / build_kwargs replace the app's build settings (tests)."""
        self.rt.need_admin("a population build (it reads folders of this machine)")
        with self._population_start:
            job = self._population_job
            if job is not None and job.running:
                raise ValueError(f"the build of {job.name!r} is still running: wait for it, or cancel it")
            self._population_job = start(
                name or "", source, paths.splitlines() if isinstance(paths, str) else list(paths or []),
                self.served_builds.artifacts_root, self.served_builds.artifacts_root.parent / "populations", self.engine.cfg.model,
                self.engine.cfg.encoder, self.served_builds.use_build, serve, cfg, build_kwargs)
            return self._population_job

    def cancel_population_build(self) -> str:
        """Cancel: the running build stops at its next step and leaves nothing behind; returns the job's line."""
        self.rt.need_admin("cancelling a population build")
        job = self._population_job
        if job is None or not job.running:
            raise ValueError("no population build is running")
        job.cancel()
        return job.line()

    def nearest_build(self, name: str, embedding: np.ndarray | None = None) -> dict:
        """Which build's population the person's writing is nearest: the distance of their mean embedding to each
        build's nearest cluster centre at its default K (only the other builds' clusters.npz is read, no model),
        for the builds that embed with the served build's encoder, nearest first, each with cluster.closeness's
        words. Returns {"user", "builds", "nearest", "other_encoder" (ids not comparable), "message": one line
        when another build is nearer than the served one, else ""}."""
        name = self.store.user(name)["name"]
        enc, k, c = self.engine.meta.get("encoder_id"), self.engine.cfg.default_k, self.engine.clusters
        served = {"folder": self.served_builds.build.folder, "id": self.engine.artifacts_id, "task": self.task.name, "k": k,
                  "encoder_id": enc, "served": True, "embeddings": c.embeddings, "centroids": c.centroids[k],
                  "labels": c.labels[k]}
        others = [x for _, f in self.served_builds.build_choices()[1:] if (x := build_centres(f)) is not None]
        embedding = self.histories.embed_history(name) if embedding is None else embedding  # Save has just computed it
        res = nearest(embedding, [served, *(x for x in others if x["encoder_id"] == enc)])
        res |= {"user": name, "other_encoder": [x["id"] for x in others if x["encoder_id"] != enc], "message": ""}
        best, here = res["nearest"], next(r for r in res["builds"] if r["served"])
        if not best["served"]:
            res["message"] = (f"Of the {len(res['builds'])} builds here, **{md(best['id'])}** ({best['task']}) is "
                              f"nearest your writing (distance {best['distance']:.2f}, against {here['distance']:.2f} "
                              f"for the one served): there you are {best['words']}. Serve it in the *Populations* tab.")
        return res

