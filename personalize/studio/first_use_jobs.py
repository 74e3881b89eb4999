"""First-use jobs: a method's minutes of per-user work (catalog.SLOW_FIRST_USE: EXACT's attribute search, OPPU's
training) run in the background, one at a time, with their progress."""

from __future__ import annotations

import time

from personalize.methods.card import onboard
from personalize.catalog import SLOW_FIRST_USE
from personalize.data import Item
from personalize.methods.card.adapters import cluster_adapter
from personalize.methods.card.person import prepared_items
from personalize.lm.cpu_threads import trim_memory
from personalize.methods.base import UserContext
from personalize.store import StoreError
from personalize.studio.service import Service


OWN = "own adapter"  # the job of a person's own adapter (a cluster of one), beside the methods' first uses


WHAT = {"exact": "EXACT's attribute search", "oppu": "OPPU's training", OWN: "own adapter"}
THEIRS = {"exact": "EXACT attribute search", "oppu": "OPPU training", OWN: "own adapter"}  # after "another person's"


def job_what(job: dict, reached: bool, mine: bool = False) -> str:
    """What a job does and for whom: "EXACT's attribute search for ana", "your own adapter"; a person the login
    does not reach is "another person's" (store.may_reach), never named."""
    what = WHAT.get(job["method"], f"{job['method']}'s first use")
    if mine:
        return f"your {what}" if job["method"] == OWN else what
    if not reached:
        return f"another person's {THEIRS.get(job['method'], what)}"
    return f"{job['user']}'s own adapter" if job["method"] == OWN else f"{what} for {job['user']}"


def ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 < 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def in_line(jobs: list[dict], job: dict | None = None) -> list[dict]:
    """The jobs ahead of a queued one (None: every job waiting or running), in the order the one worker takes
    them: the running job, then queued own adapters, then the methods' first uses, each as they came
    (FirstUseJobs._submit's rule)."""
    waiting = [j for j in jobs if j["state"] in ("queued", "running")]
    order = sorted(waiting, key=lambda j: (j["state"] != "running", j["method"] != OWN, j["seq"]))
    if job is None:
        return order
    return order[:order.index(job)] if job in order else []


def left_s(job: dict, now: float) -> float | None:
    """Seconds left, measured from this job's own steps (from its first progress report on), else None: a rate
    taken over the time it queued told 1160 s for a minute's training (issue 59)."""
    first = job.get("first_step")
    if not first or not job["total"] or job["done"] <= first[1]:
        return None
    return (now - first[0]) / (job["done"] - first[1]) * (job["total"] - job["done"])


def wait_line(job: dict, ahead: list[tuple[dict, bool]], what: str, now: float | None = None) -> str:
    """A waiting job in words: what it waits for, its place in the queue (and behind what) and the seconds since
    its own start; `ahead` pairs each job before it with whether the login reaches its person."""
    now = now or time.time()
    if job["state"] == "queued":
        place = (f"{ordinal(len(ahead) + 1)} in line, behind " + ", ".join(job_what(j, r) for j, r in ahead)
                 if ahead else "next in line")
        return f"{what}: queued for {now - job['queued']:.0f} s, {place}"
    steps = f", {job['done']}/{job['total']} steps" if job["total"] else ""
    left = left_s(job, now)
    return (f"{what}: running for {now - job['started']:.0f} s{steps}"
            + (f", about {left:.0f} s left" if left is not None else ""))


def job_line(job: dict, ahead: list[tuple[dict, bool]] = ()) -> str:
    """A first-use job's progress as the Compare column shows it (FirstUseJobs.line gives `ahead`)."""
    return f"first use, {wait_line(job, list(ahead), job_what(job, True, mine=True))}; the other columns do not wait…"


def own_line(job: dict | None, ahead: list[tuple[dict, bool]] = ()) -> str:
    """What card decodes over while a person's own adapter trains (Compare's card column and Fit say it)."""
    if job is None or job["state"] == "done":
        return ""
    if job["state"] == "error":
        return f"your own adapter could not be trained ({job['error']}): card decodes over your nearest cluster's"
    return (wait_line(job, list(ahead), "your own adapter") + "; until it is ready, card decodes over your nearest "
            "cluster's adapter")


class FirstUseJobs(Service):
    def __init__(self, rt):
        super().__init__(rt)
        self.after_own: list = []  # f(name), run when a person's own adapter is ready (Fits refits the style over it)
        self._seq = 0  # the order jobs came in (in_line)

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
        once per user and history; the job dict shows its progress ("done" of "total") while it runs. Another
        login's person is taken: their job is neither started, joined nor shown."""
        name = self.rt.need_person(name)

        def run(job, progress) -> None:
            with self.model_lock.background:  # the rewrites: a few short decodes, once per history
                prepared_items(self.engine, self.store, name)
            user = UserContext.from_store(self.store, name, self.task)
            m = self.rt.method(method)
            if not m.is_prepared(user):
                m.prepare(user, progress=progress)

        return self._submit(name, method, run)

    def _submit(self, name: str, what: str, run) -> dict:
        """`run(job, progress)` as the person's background job `what`, one at a time behind the others (a queued own
        adapter before the methods' first uses: the walk's waited 241 s behind EXACT and OPPU); joins the
        job already queued or running. An error is the job's state: the page says it where it waits. The job runs
        as the login that asked (runtime.StarterExecutor); the starts below check the person first."""
        key = (name, what)
        job = self.rt.jobs.get(key)
        if job is not None and job["state"] in ("queued", "running"):
            return job
        self._seq += 1
        job = self.rt.jobs[key] = {"user": name, "method": what, "state": "queued", "done": 0, "total": 0,
                                   "error": None, "queued": time.time(), "started": None, "seq": self._seq}

        def progress(done: int, total: int) -> None:
            job.setdefault("first_step", (time.time(), done))  # the remaining time is measured from here
            job["done"], job["total"] = done, total

        def work() -> None:
            if what != OWN and self._own_queued():  # an own adapter someone asked for goes before a method's
                self.rt.first_use.submit(work)      # first use (OPPU's training alone is minutes): to the back
                return
            job["started"], job["state"] = time.time(), "running"
            try:
                run(job, progress)
                job["state"] = "done"
            except Exception as e:  # a deleted user or a failed pass: the column says so when it runs
                job["state"], job["error"] = "error", str(e)
            finally:
                trim_memory()  # the training's freed activations back to the system, not kept by the heap
            job["seconds"] = round(time.time() - job["queued"], 1)

        self.rt.first_use.submit(work)
        return job

    def ahead_of(self, job: dict) -> list[tuple[dict, bool]]:
        """The jobs before `job` in the queue, each with whether the current login reaches its person."""
        return [(j, self.store.may_reach(j["user"])) for j in in_line(list(self.rt.jobs.values()), job)]

    def line(self, job: dict) -> str:
        """job_line with the job's place in the queue."""
        return job_line(job, self.ahead_of(job))

    def own_words(self, name: str) -> str:
        """own_line for the person's own-adapter job, with its place in the queue."""
        job = self.own_job(name)
        return own_line(job, self.ahead_of(job) if job else ())

    def running(self) -> list[tuple[dict, bool]]:
        """Every first-use job queued or running, in the worker's order (what other background work waits behind)."""
        return [(j, self.store.may_reach(j["user"])) for j in in_line(list(self.rt.jobs.values()))]

    def _own_queued(self) -> bool:
        return any(j["method"] == OWN and j["state"] == "queued" for j in list(self.rt.jobs.values()))

    def after_fit(self, name: str) -> None:
        """The app's Fit: the methods' first use starts in the background now, not at Save (Save's own background
        work, the rewrites and the fit's pass, comes first), for every method whose first use is per-user work."""
        if self.cfg.first_use_in_background:
            for m in SLOW_FIRST_USE:
                if self.needs_indexing(name, m):
                    self.start_first_use(name, m)

    def wait_first_use(self, name: str, method: str, poll_s: float = 0.2) -> dict:
        """Starts (or joins) the method's first-use job for the person and waits for it."""
        job = self.start_first_use(name, method)
        while job["state"] in ("queued", "running"):
            time.sleep(poll_s)
        return job

    # ------------------------------------------------------------ a cluster of one (methods/card/own.py)
    def wants_own(self, name: str) -> bool:
        """Whether the person gets an adapter of their own: beyond the build's clusters (OwnSettings.far, the
        far test Save's placement makes) and without a current one."""
        k = self.engine.cfg.default_k
        placed = self.store.assignment(name, self.engine.artifacts_id, k)
        return (self.engine.cfg.own.far and placed is not None and onboard.is_far(self.engine, k, placed["distances"])
                and not self.has_own(name))

    def has_own(self, name: str) -> bool:
        try:
            return self.engine.own.is_current(name, [Item(y=s.y) for s in self.store.items(name)])
        except StoreError:
            return False

    def own_after_save(self, name: str) -> None:
        """Save's background work, after the rewrites: the person's own adapter when they are far."""
        if self.cfg.own_adapters and self.wants_own(name):
            self.start_own(name)

    def start_own(self, name: str) -> dict:
        """Trains the person's own adapter in the background (one first-use job at a time), warm-started from
        their nearest cluster's at the build's K; a job dict shows its progress. Fit's switch starts it for anyone.
        An error leaves card over the cluster's adapter, and the page says why. Another login's person is taken,
        before anything is queued (issue 58: the job ran as no one and trained over them)."""
        name = self.rt.need_person(name)
        self.rt.need_head("Your own adapter (its style is fitted over it)")

        def run(job, progress) -> None:
            with self.model_lock.background:
                items = prepared_items(self.engine, self.store, name)
            k = self.engine.cfg.default_k
            cluster = int(self.store.assignment(name, self.engine.artifacts_id, k)["cluster"])
            job["trained"] = self.engine.own.train(name, items, cluster_adapter(k, cluster), progress=progress)
            for then in self.after_own:  # the style refitted over it: "done" means card decodes over it
                then(name)

        return self._submit(name, OWN, run)

    def own_job(self, name: str) -> dict | None:
        """The person's own-adapter job; None for a person the login does not reach (jobs are keyed by name)."""
        return self.rt.jobs.get((name, OWN)) if self.store.may_reach(name) else None

    def base_words(self, name: str, own: bool) -> str:
        """What card decodes over for this person, in words (Fit says it; Compare's card column notes it)."""
        if own:
            return ("CARD decodes over **your own adapter**: you are a cluster of one (an adapter trained on your "
                    "history from your nearest cluster's), your style on top.")
        training = self.own_words(name)
        if training:
            return training[0].upper() + training[1:] + "; your style is fitted again over it when it is."
        by_itself = "; for people no cluster fits it starts by itself at Save" if self.engine.cfg.own.far else ""
        return ("CARD decodes over your cluster's adapter. *Train my own adapter* trains one on your history "
                f"(about a minute{by_itself}).")
