"""What every use case of the studio shares: the served build's engine, the store, the settings, the model lock, the
decode scheduler and the two background executors (first-use jobs; model work nobody waits on), the methods made on
the engine, and the small rules several tabs apply (K snapping, prompts, decoding settings, the user name).

The model lock is held per decode batch (the scheduler) and by fits and trainings (per step, for the background
first-use work of EXACT and OPPU); store reads and votes do not take it. Work nobody waits on (first uses, Save's
rewrites and read-ahead, EXACT's feedback) takes it as `model_lock.background`, which lets a waiting person in
first (serving/model_lock.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from personalize.schema import Access, as_starter
from personalize.catalog import BY_NAME
from personalize.serving.settings import DecodingSettings
from personalize.data import Item
from personalize.methods.card.votes import FeedbackSettings
from personalize.fitting.plan import DEFAULT_DB, DEMO_ARTIFACTS, DEMO_DATA
from personalize.humaneval.arena import Arena
from personalize.humaneval.campaign import Campaigns
from personalize.lm.cpu_threads import ReleasingExecutor, release_team
from personalize.methods.engine import Engine
from personalize.methods.registry import get_method, local_config
from personalize.serving.model_lock import ModelLock
from personalize.serving.scheduler import SchedulerConfig
from personalize.store import Store
from personalize.studio.coming import Coming
from personalize.studio.scheduling import DecodeTarget, make_scheduler


@dataclass(frozen=True)
class StudioConfig:
    artifacts: str = DEMO_ARTIFACTS  # the build served first
    # every sub-folder with a build's config.json is offered, one task at a time; None: the parent of `artifacts`
    artifacts_root: str | None = None
    db: str = DEFAULT_DB
    demo_data: str = DEMO_DATA  # LaMP folder whose users the "demo user" picker offers
    export_dir: str | None = None  # None: "exports" beside the database (every file of a studio under its --db folder)
    max_history_chars: int = 2_000_000  # a paste or upload larger than this is refused, not truncated
    max_items: int = 500
    max_prompt_chars: int = 20_000
    scheduler: SchedulerConfig = SchedulerConfig()  # the cross-request batching window
    # the app's Save starts EXACT's attribute search and OPPU's training for the person in the background
    first_use_in_background: bool = True
    # after Save, a person beyond the build's clusters gets their own adapter in the background (a cluster of one)
    own_adapters: bool = True
    feedback: FeedbackSettings = FeedbackSettings()  # how much a vote counts against the history when λ is refitted
    decode: DecodeTarget = DecodeTarget()  # where decodes run: in-process, or a Ray Serve deployment (studio/decoder)
    # who may reach whose people (personalize/schema.py's Access): with logins, a login sees only the people it made; admins all
    logins: bool = False
    admins: tuple[str, ...] = ()
    # where the page's files live (Gradio's cache: uploads and downloads); Forget me clears the person from it
    cache_dir: str | None = None  # None: "cache" beside the database

    @property
    def page_files(self) -> Path:
        return Path(self.cache_dir) if self.cache_dir else Path(self.db).parent / "cache"

    @property
    def exports(self) -> Path:
        return Path(self.export_dir) if self.export_dir else Path(self.db).parent / "exports"

    def __post_init__(self):
        if min(self.max_history_chars, self.max_items, self.max_prompt_chars) < 1:
            raise ValueError("history, item and prompt limits must be >= 1")


class StarterExecutor(ReleasingExecutor):
    """The studio's background executor: each job runs as the login that submitted it (schema.as_starter), so a
    job a page event starts reaches only that login's people."""

    def submit(self, fn, /, *args, **kwargs):
        return super().submit(as_starter(fn), *args, **kwargs)


class Runtime:
    """The loaded build and what owns its use: one per studio, shared by every service."""

    def __init__(self, engine: Engine, store: Store, cfg: StudioConfig, demo_users: dict[str, list[Item]] | None,
                 population: dict[str, list[str]] | None):
        self.engine, self.store, self.cfg = engine, store, cfg
        store.access = Access(cfg.logins, frozenset(cfg.admins))  # every read and write by name applies it
        self.arena = Arena(store)
        self.campaigns = Campaigns(store)
        self.judges: dict[str | None, object] = {}  # LLM judges by model id, loaded on first use
        self.demo_users = demo_users or {}
        self.population = population or {}
        self.model_lock = ModelLock()  # a person's request first: work nobody waits on takes .background
        self.scheduler = make_scheduler(engine, self.model_lock, cfg.scheduler, cfg.decode)
        self.methods: dict[str, object] = {}
        self.coming = Coming()  # the served build's parts still being built (the first start's: studio.coming)
        self.keep_own_adapters(engine)
        # first-use work (EXACT's attribute search, OPPU's training): one at a time, beside the decodes
        self.first_use = StarterExecutor(max_workers=1, thread_name_prefix="studio-first-use")
        self.jobs: dict[tuple[str, str], dict] = {}  # (user, method) -> {"state", "done", "total", "error", ...}
        # one background worker for model work nobody waits on: EXACT feedback, the rewrites of a saved history
        self.background = StarterExecutor(max_workers=1, thread_name_prefix="studio-background")
        self.feedback_log: list[dict] = []
        release_team()  # the thread that loaded the engine and made the studio (the main one) keeps no team

    def keep_own_adapters(self, engine: Engine) -> None:
        """The people's own adapters (a cluster of one) beside their OPPU adapters, where Forget me looks; their
        training takes the model lock per step as background work."""
        engine.own.folder = Path(self.cfg.db).parent / "oppu" / str(engine.artifacts_id)
        engine.own.lock = self.model_lock.background

    def method(self, name: str):
        """The method `name` on the served build (methods.registry), made once."""
        if name not in self.methods:
            # a person's files (OPPU's adapters) live beside the database they belong to; its CPU budget: catalog's
            cfg = local_config(name, Path(self.cfg.db).parent / name / str(self.engine.artifacts_id),
                               **BY_NAME[name].budget)
            self.methods[name] = m = get_method(name, self.engine, self.store, **cfg)
            if hasattr(m, "lock"):  # background first-use work takes the model lock per step, not for minutes,
                m.lock = self.model_lock.background  # and lets a waiting person in between its steps
        return self.methods[name]

    # ------------------------------------------------------------ facts about the loaded artifacts
    @property
    def ks(self) -> list[int]:
        return sorted(self.engine.clusters.centroids)

    @property
    def task(self):
        return self.engine.task

    def snap_k(self, k: float | int | None, previous: int | None = None) -> int:
        """The built K nearest to a slider value (ties: the smaller). Given the K the slider came from, a value
        between built Ks moves on to the next built K in that direction, so that one arrow-key step (2 -> 3)
        reaches the next build (4) instead of snapping back (to 2)."""
        if k is None:
            return self.engine.cfg.default_k
        k = float(k)
        if previous is not None and k not in self.ks:
            if k > previous and any(b > previous for b in self.ks):
                return min((b for b in self.ks if b >= k), default=max(self.ks))
            if k < previous and any(b < previous for b in self.ks):
                return max((b for b in self.ks if b <= k), default=min(self.ks))
        return min(self.ks, key=lambda b: (abs(b - k), b))

    # ------------------------------------------------------------ rules several tabs apply
    def check_prompt(self, prompt: str | None) -> str:
        if not prompt or not prompt.strip():
            raise ValueError("the prompt is empty: type a prompt or pick a history item")
        if len(prompt) > self.cfg.max_prompt_chars:
            raise ValueError(f"the prompt has {len(prompt):,} characters; the limit is {self.cfg.max_prompt_chars:,}")
        return prompt.strip()

    def settings(self, alpha: float | None = None, top_k: int | None = None,
                 max_new_tokens: int | None = None) -> DecodingSettings:
        given = {"alpha": alpha, "top_k": top_k, "max_new_tokens": max_new_tokens}  # the sliders send floats
        return replace(self.engine.cfg.decoding, **{k: v if k == "alpha" else int(v) for k, v in given.items()
                                                    if v is not None})

    def need_admin(self, what: str) -> None:
        """What changes the studio for every session (the build served, populations, campaigns) is an admin's,
        when there are logins (schema.Access)."""
        if not self.store.access.sees_everyone():
            raise ValueError(f"{what} changes the studio for everyone: only an admin login may (app.py --admin NAME)")

    def need_head(self, what: str) -> None:
        """Refuses `what` while the first start's build still trains the head (studio.coming), saying when it comes."""
        if line := self.coming.head_line(what):
            raise ValueError(line)

    def need_user(self, name: str | None) -> str:
        """The user name typed at the top of the page, stripped; every tab that acts for a person needs one. A name
        another login holds is refused here, as taken: the same words on every button, before anything starts."""
        if not name or not name.strip():
            raise ValueError("enter a user name first (top of the page)")
        return self.store.refuse_taken(name)

    def need_person(self, name: str | None) -> str:
        """A stored person the current login reaches (else unknown, or taken): what a job checks before it starts,
        since its thread finds out only when the work is queued or done."""
        return self.store.user(self.need_user(name))["name"]
