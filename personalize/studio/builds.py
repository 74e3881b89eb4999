"""The builds a studio can serve: the ones under its artifacts root, one task at a time, and switching the served
one (for every session at once: only one build stays loaded)."""

from __future__ import annotations

import gc
import json
import time
from dataclasses import dataclass
from pathlib import Path

from personalize.data import TASKS, HistoryError, Item, read_lamp
from personalize.methods.artifacts import ArtifactsError
from personalize.methods.engine import Engine
from personalize.studio.service import Service


@dataclass(frozen=True)
class Build:
    """One artifacts folder the studio can serve."""

    folder: str
    id: str
    task: str
    created: str = ""


def find_builds(root: str | Path) -> list[Build]:
    """The builds directly under `root`: folders whose config.json names a known task and an id (a model
    folder's config.json names neither; an unfinished `<name>.partial` is skipped), newest first."""
    root, out = Path(root), []
    if not root.is_dir():
        return out
    for folder in sorted(root.iterdir()):
        if not folder.is_dir() or folder.name.endswith(".partial"):
            continue
        try:
            meta = json.loads((folder / "config.json").read_text())
        except (OSError, ValueError):
            continue
        if isinstance(meta, dict) and meta.get("task") in TASKS and isinstance(meta.get("id"), str):
            out.append(Build(str(folder), meta["id"], meta["task"], str(meta.get("created", ""))))
    return sorted(out, key=lambda b: b.created, reverse=True)


def build_command(task: str, root: str | Path) -> str:
    """The command that builds `task`'s artifacts under `root`: the task's LaMP folder where one is on this
    machine (../shared/data/<task> or data/<task>), else a placeholder for it."""
    data = next((str(d) for d in (Path("../shared/data") / task, Path("data") / task)
                 if (d / "dev_questions.json").exists()), f"<a LaMP folder of {task}>")
    return f".venv/bin/python -m personalize build --data {data} --split dev --out {Path(root) / task}"


def lamp_users(folder: Path, split: str = "dev") -> dict[str, list[Item]]:
    try:
        _, queries = read_lamp(folder, split)
    except (HistoryError, OSError, ValueError):
        return {}
    return {(q.user or q.id): list(q.profile) for q in queries}


def population_texts(engine: Engine) -> dict[str, list[str]]:
    """The build's users' texts, for cluster examples; empty when the build's data is not on this machine."""
    data = engine.meta.get("data")
    if not data or not Path(data).is_dir():
        return {}
    return {u: [it.y for it in items] for u, items in lamp_users(Path(data), engine.meta.get("split", "dev")).items()}


@dataclass(frozen=True)
class TaskSwitch:
    """The task dropdown's answer: whether another build now serves, the build serving the task (None: none yet)
    and what to tell the person (how to build one, when there is none)."""
    switched: bool
    build: Build | None
    message: str


class Builds(Service):
    @property
    def artifacts_root(self) -> Path:
        return Path(self.cfg.artifacts_root or Path(self.cfg.artifacts).parent)

    @property
    def build(self) -> Build:
        """The build being served."""
        folder = self.engine.folder or Path(self.cfg.artifacts)
        return Build(str(folder), self.engine.artifacts_id, self.task.name, str(self.engine.meta.get("created", "")))

    def builds(self) -> dict[str, list[Build]]:
        """Every known task -> its builds under the artifacts root (the one served first, then newest first);
        [] for a task with no build."""
        current = self.build
        found = [b for b in find_builds(self.artifacts_root) if Path(b.folder).resolve() != Path(current.folder).resolve()]
        return {t: ([current] if t == current.task else []) + [b for b in found if b.task == t] for t in TASKS}

    def build_hint(self, task: str) -> str:
        return (f"No build for **{task}** under `{self.artifacts_root}` yet, so the studio stays on "
                f"`{self.engine.artifacts_id}` ({self.task.name}). Build one (minutes to hours on a CPU, "
                f"see the README for the flags), then choose the task again:\n\n"
                f"```\n{build_command(task, self.artifacts_root)}\n```")

    def switch_task(self, task: str) -> TaskSwitch:
        """Serves `task`'s build (loading it in place of the current one), or says how to build it."""
        if task != self.task.name:
            self.rt.need_admin("switching the task")
        if task not in TASKS:
            raise ValueError(f"unknown task {task!r}; choose from {sorted(TASKS)}")
        if task == self.task.name:
            return TaskSwitch(False, self.build, f"Serving `{self.engine.artifacts_id}` ({task}).")
        candidates = self.builds()[task]
        if not candidates:
            return TaskSwitch(False, None, self.build_hint(task))
        b = candidates[0]
        t0 = time.perf_counter()
        self.use_build(b.folder)
        return TaskSwitch(True, self.build, f"Switched to `{self.engine.artifacts_id}` ({task}, K ∈ {self.ks}) in "
                                            f"{time.perf_counter() - t0:.1f} s. Save your history again to place it "
                                            f"in this build.")

    def use_build(self, folder: str | Path) -> None:
        """Loads the build in `folder` and serves it from now on, for every session of the app.
        Only one build stays loaded: each Engine holds its own copy of the language model and all its cluster
        adapters (~0.6 GB for the bundled 135M model in float32, many GB for larger ones) while reloading a
        build from local files takes seconds, and the app decodes one request at a time anyway. The new build
        is loaded before the old one is let go, so a build that fails to load leaves the current one serving."""
        with self.model_lock:
            try:
                engine = Engine.load(folder)
            except (KeyError, TypeError) as e:  # a config.json from another version of this code
                raise ArtifactsError(f"the build at {folder} cannot be read ({e!r}): rebuild it") from None
            old, self.rt.engine = self.rt.engine, engine
            self.rt.scheduler.engine = engine  # the next batch decodes with the new build
            self.rt.keep_own_adapters(engine)
            self.rt.methods = {}  # methods hold the engine they were made with
            self.rt.jobs = {}
            self.rt.population = population_texts(engine)
            data, split = engine.meta.get("data"), engine.meta.get("split", "dev")
            # the demo users on offer are the build's own population, when its data is on this machine
            ok = data and (Path(data) / f"{split}_questions.json").exists()
            self.rt.demo_users = lamp_users(Path(data), split) if ok else {}
            del old
            gc.collect()

    def build_choices(self) -> list[tuple[str, str]]:
        """Every build under the artifacts root as (label, folder): the one served first, then newest first."""
        served = self.build
        here = Path(served.folder).resolve()
        found = [b for b in find_builds(self.artifacts_root) if Path(b.folder).resolve() != here]
        return [(f"{b.id} ({b.task}){' · served now' if b is served else ''}", b.folder) for b in [served, *found]]

    def serve_build(self, folder: str | None) -> str:
        """Serves one of build_choices' builds for every session (use_build); returns the status line."""
        self.rt.need_admin("serving another build")
        if not folder:
            raise ValueError("choose a build first")
        if Path(folder).resolve() == Path(self.build.folder).resolve():
            return f"Serving `{self.engine.artifacts_id}` ({self.task.name}) already."
        if str(Path(folder).resolve()) not in {str(Path(f).resolve()) for _, f in self.build_choices()}:
            raise ValueError(f"{folder} is not a build under {self.artifacts_root}")
        t0 = time.perf_counter()
        self.use_build(folder)
        return (f"Serving `{self.engine.artifacts_id}` ({self.task.name}, K ∈ {self.ks}) now, loaded in "
                f"{time.perf_counter() - t0:.1f} s. Save your history again to place it in this build.")
