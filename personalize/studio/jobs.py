"""First-use jobs: a method's minutes of per-user work (catalog.SLOW_FIRST_USE: EXACT's attribute search, OPPU's
training) run in the background, one at a time, with their progress."""

from __future__ import annotations

import time

from personalize.catalog import SLOW_FIRST_USE
from personalize.fitting.person import prepared_items
from personalize.lm.cpu_threads import trim_memory
from personalize.methods.base import UserContext
from personalize.store import StoreError
from personalize.studio.service import Service


def job_line(job: dict) -> str:
    """A first-use job's progress as the Compare column shows it."""
    what = {"exact": "searching your attributes", "oppu": "training your own LoRA"}.get(job["method"], "preparing")
    if job["state"] == "queued":
        return f"first use: {what} (queued behind other first-use work)…"
    part = f" {job['done']}/{job['total']}" if job["total"] else ""
    return f"first use: {what}{part}, {time.time() - job['started']:.0f} s so far; the other columns do not wait…"


class FirstUseJobs(Service):
    def __init__(self, rt):
        super().__init__(rt)

    def needs_indexing(self, name: str, method: str) -> bool:
        """True when a method's first use for this user will do minutes of per-user work (SLOW_FIRST_USE:
        EXACT's attribute search, OPPU's adapter training), which runs as a background job."""
        if method not in SLOW_FIRST_USE:
            return False
        try:
            return not self.rt.method(method).is_prepared(UserContext.from_store(self.store, name, self.task))
        except (ValueError, StoreError):  # no rewrites yet, or no such user: the first use will tell
            return True

    def start_first_use(self, name: str, method: str) -> dict:
        """The method's per-user work (EXACT's attribute search, OPPU's training) as a background job, started
        once per user and history; the job dict shows its progress ("done" of "total") while it runs."""
        key = (name, method)
        job = self.rt.jobs.get(key)
        if job is not None and job["state"] in ("queued", "running"):
            return job
        job = self.rt.jobs[key] = {"user": name, "method": method, "state": "queued", "done": 0, "total": 0,
                                "error": None, "started": time.time()}

        def progress(done: int, total: int) -> None:
            job["done"], job["total"] = done, total

        def work() -> None:
            job["state"] = "running"
            try:
                with self.model_lock.background:  # the rewrites: a few short decodes, once per history
                    prepared_items(self.engine, self.store, name)
                user = UserContext.from_store(self.store, name, self.task)
                m = self.rt.method(method)
                if not m.is_prepared(user):
                    m.prepare(user, progress=progress)
                job["state"] = "done"
            except Exception as e:  # a deleted user or a failed pass: the column says so when it runs
                job["state"], job["error"] = "error", str(e)
            finally:
                trim_memory()  # the training's freed activations back to the system, not kept by the heap
            job["seconds"] = round(time.time() - job["started"], 1)

        self.rt.first_use.submit(work)
        return job

    def after_fit(self, name: str) -> None:
        """The app's Fit: the methods' first use starts in the background now, not at Save (Save's own background
        work, the rewrites and the fit's pass, comes first)."""
        if self.cfg.first_use_in_background:
            self.prepare_first_use(name)

    def prepare_first_use(self, name: str) -> list[dict]:
        """Background first use of every method that needs per-user work (after a fit)."""
        return [self.start_first_use(name, m) for m in SLOW_FIRST_USE if self.needs_indexing(name, m)]

    def wait_first_use(self, name: str, method: str, poll_s: float = 0.2) -> dict:
        """Starts (or joins) the method's first-use job for the person and waits for it."""
        job = self.start_first_use(name, method)
        while job["state"] in ("queued", "running"):
            time.sleep(poll_s)
        return job
