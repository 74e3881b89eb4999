"""The studio: every operation of the web app on one loaded engine and one store, with no UI code.

`Studio` is a façade: the tabs (personalize/ui) call its methods, each one line into the use case that holds it
(one module each: builds, histories, clusters, jobs, decode, fits, votes, campaigns, explore, own_data,
population_jobs), all over one runtime.Runtime that owns the engine, the store, the model lock, the scheduler and
the executors. app.py only lays out widgets and calls these methods, so the behaviour (what is stored, what an
error says, what a sweep measures) is tested without a browser. Every decode goes through one scheduler
(serving/scheduler.py): the requests of all sessions that arrive within a few tens of ms decode as one mixed batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from personalize.card.decoding import DecodingSettings
from personalize.data import Item
from personalize.humaneval import campaign_pool
from personalize.humaneval.campaign_schema import Assignment
from personalize.humaneval.arena import BlindPair
from personalize.humaneval.leaderboard import LeaderboardConfig
from personalize.methods.engine import Engine, UserFit
from personalize.store import Store
from personalize.studio.builds import Build, Builds, lamp_users, population_texts
from personalize.studio.campaigns import CampaignDesk
from personalize.studio.clusters import ClusterViews
from personalize.studio.decode import Decoding, MethodOutput
from personalize.studio.explore import Explorer
from personalize.studio.fits import Fits
from personalize.studio.histories import Histories, UserState
from personalize.studio.jobs import FirstUseJobs
from personalize.studio.own_data import OwnData
from personalize.studio.population_jobs import Populations
from personalize.studio.runtime import Runtime, StudioConfig
from personalize.studio.votes import Votes


class Studio:
    """The app's operations: one runtime and the services over it; every public name the tabs call."""

    def __init__(self, engine: Engine, store: Store, cfg: StudioConfig = StudioConfig(),
                 demo_users: dict[str, list[Item]] | None = None, population: dict[str, list[str]] | None = None):
        self.runtime = rt = Runtime(engine, store, cfg, demo_users, population)
        self.served_builds = Builds(rt)
        self.histories = Histories(rt)
        self.clusters = ClusterViews(rt, self.histories)
        self.background_jobs = FirstUseJobs(rt)
        self.decoding = Decoding(rt, self.histories, self.background_jobs)
        self.fits = Fits(rt, self.histories)
        self.votes = Votes(rt, self.histories, self.decoding, self.fits)
        self.campaign_desk = CampaignDesk(rt)
        self.own_data = OwnData(rt, self.fits)
        self.explorer = Explorer(rt)
        self.populations = Populations(rt, self.served_builds, self.histories)

    @classmethod
    def load(cls, cfg: StudioConfig = StudioConfig(), engine: Engine | None = None,
             adapters_later: bool = False) -> "Studio":
        """adapters_later: the app's start, which answers first and then calls load_pending."""
        engine = engine or Engine.load(cfg.artifacts, adapters_later=adapters_later)
        store = Store(cfg.db)
        population = population_texts(engine)
        demo = Path(cfg.demo_data)
        demo_users = lamp_users(demo) if (demo / "dev_questions.json").exists() else {}
        return cls(engine, store, cfg, demo_users, population)

    def load_pending(self) -> None:
        """What the start left for after the page answers: the other cluster adapters (~1 s). A request
        that needs them first loads them itself (Engine.use_adapter, decode_rows)."""
        with self.model_lock:
            self.engine.load_pending_adapters()

    # ------------------------------------------------------------ what the runtime holds (a build switch replaces the engine)
    engine = property(lambda self: self.runtime.engine)
    store = property(lambda self: self.runtime.store)
    cfg = property(lambda self: self.runtime.cfg)
    model_lock = property(lambda self: self.runtime.model_lock)
    scheduler = property(lambda self: self.runtime.scheduler)
    arena = property(lambda self: self.runtime.arena)
    campaigns = property(lambda self: self.runtime.campaigns)
    jobs = property(lambda self: self.runtime.jobs)
    feedback_log = property(lambda self: self.runtime.feedback_log)

    @property
    def demo_users(self) -> dict[str, list[Item]]:
        return self.runtime.demo_users

    @demo_users.setter
    def demo_users(self, value: dict[str, list[Item]]) -> None:
        self.runtime.demo_users = value

    @property
    def population(self) -> dict[str, list[str]]:
        """The build's people's texts (cluster examples)."""
        return self.runtime.population

    @population.setter
    def population(self, value: dict[str, list[str]]) -> None:
        self.runtime.population = value

    # ------------------------------------------------------------ use cases that span services
    def save_from(self, name: str | None, text: str | None, file: str | None, task: str,
                  demo: str | None = None, replace: bool = True) -> dict:
        """My writing's Save: the name checked, the history chosen (history_from), stored (save_history) under
        the task served (a history is placed, fitted and decoded in the served build's task). Without `replace`,
        a name that has a history is answered with ReplaceAsk (the page asks first)."""
        name = self.runtime.need_user(name)
        if task and task != self.task.name:
            raise ValueError(f"the studio serves {self.task.name} ({self.engine.artifacts_id}), not {task}: choose "
                             f"{task} in the Task list to switch to its build, or save under {self.task.name}")
        items = self.histories.history_from(text, file, demo)
        if not replace:
            self.histories.ask_before_replacing(name, items)
        res = self.histories.save_history(name, items, task)
        if len(self.served_builds.build_choices()) > 1:  # another build here may be nearer the person's writing (nearest_build)
            res["nearer"] = self.populations.nearest_build(res["name"], res["embedding"])["message"]
        # the slow first uses (EXACT, OPPU) start after the person's Fit (after_fit) or at their first Compare, not
        # here: started at Save, EXACT's decode of the history held the model while the person's Fit waited
        return res

    def generate_campaign(self, name: str, progress: Callable[[int, int, str], None] | None = None) -> dict:
        self.runtime.need_admin("generating a campaign's outputs")
        return campaign_pool.generate(self, name, progress)

    # ------------------------------------------------------------ the runtime's rules (runtime.Runtime)
    @property
    def ks(self) -> list[int]:
        return self.runtime.ks

    @property
    def task(self):
        return self.runtime.task

    def snap_k(self, k: float | int | None, previous: int | None = None) -> int:
        return self.runtime.snap_k(k, previous)

    def method(self, name: str):
        return self.runtime.method(name)

    def check_prompt(self, prompt: str | None) -> str:
        return self.runtime.check_prompt(prompt)

    def settings(self, alpha: float | None = None, top_k: int | None = None,
                 max_new_tokens: int | None = None) -> DecodingSettings:
        return self.runtime.settings(alpha, top_k, max_new_tokens)

    def need_user(self, name: str | None) -> str:
        return self.runtime.need_user(name)

    # ------------------------------------------------------------ builds: one task's artifacts at a time (builds.Builds)
    @property
    def artifacts_root(self) -> Path:
        return self.served_builds.artifacts_root

    @property
    def build(self) -> Build:
        return self.served_builds.build

    def builds(self) -> dict[str, list[Build]]:
        return self.served_builds.builds()

    def build_hint(self, task: str) -> str:
        return self.served_builds.build_hint(task)

    def switch_task(self, task: str) -> dict:
        return self.served_builds.switch_task(task)

    def use_build(self, folder: str | Path) -> None:
        return self.served_builds.use_build(folder)

    def build_choices(self) -> list[tuple[str, str]]:
        return self.served_builds.build_choices()

    def serve_build(self, folder: str | None) -> str:
        return self.served_builds.serve_build(folder)

    # ------------------------------------------------------------ My writing (histories.Histories)
    def parse(self, text: str | None = None, file: str | None = None) -> list[Item]:
        return self.histories.parse(text, file)

    def save_history(self, name: str, items: Sequence[Item], task: str, replace_existing: bool = True) -> dict:
        return self.histories.save_history(name, items, task, replace_existing)

    def item_rows(self, name: str | None) -> list[list]:
        return self.histories.item_rows(name)

    def switch_user(self, name: str | None, shown_for: str | None) -> dict:
        return self.histories.switch_user(name, shown_for)

    def demo_history(self, user: str) -> str:
        return self.histories.demo_history(user)

    def demo_choices(self) -> list[tuple[str, str]]:
        return self.histories.demo_choices()

    def demo_items(self, user: str) -> list[Item]:
        return self.histories.demo_items(user)

    def embed_history(self, name: str) -> np.ndarray:
        return self.histories.embed_history(name)

    def assign_all(self, name: str, embedding: np.ndarray | None = None) -> dict[int, int]:
        return self.histories.assign_all(name, embedding)

    def user_state(self, name: str, k: int | None = None) -> UserState:
        return self.histories.user_state(name, k)

    def closeness(self, k: int, distances: Sequence[float]) -> str:
        return self.histories.closeness(k, distances)

    def user_names(self) -> list[str]:
        return self.histories.user_names()

    def open_user(self, name: str) -> dict:
        return self.histories.open_user(name)

    def demo_pick(self, demo: str | None, name: str | None) -> tuple[str, str]:
        return self.histories.demo_pick(demo, name)

    def history_from(self, text: str | None, file: str | None = None, demo: str | None = None) -> list[Item]:
        return self.histories.history_from(text, file, demo)

    def item_choices(self, name: str | None) -> list[tuple[str, int]]:
        return self.histories.item_choices(name)

    def replaced_choices(self, name: str | None) -> list[tuple[str, int]]:
        return self.histories.replaced_choices(name)

    def restore_history(self, name: str | None, replaced_id: float | None) -> str:
        return self.histories.restore_history(name, replaced_id)

    def update_item(self, name: str | None, item_id: float | None, text: str) -> str:
        return self.histories.update_item(name, item_id, text)

    def delete_item(self, name: str | None, item_id: float | None) -> str:
        return self.histories.delete_item(name, item_id)

    def item_reference(self, name: str | None, item_id: float | None) -> str | None:
        return self.histories.item_reference(name, item_id)

    def resolve_prompt(self, text: str | None, templated: bool, item_id: float | None = None,
                       name: str | None = None) -> tuple[str, str | None]:
        return self.histories.resolve_prompt(text, templated, item_id, name)

    def pair_prompt(self, text: str | None, fallback: str | None, templated: bool) -> str:
        return self.histories.pair_prompt(text, fallback, templated)

    # ------------------------------------------------------------ My cluster (clusters.ClusterViews)
    def cluster_examples(self, k: int, cluster: int, n: int = 4) -> list[tuple[str, str]]:
        return self.clusters.cluster_examples(k, cluster, n)

    def population_map(self, name: str | None, k: int) -> dict:
        return self.clusters.population_map(name, k)

    def cluster_view(self, name: str | None, k: float | None, previous: int | None = None) -> dict:
        return self.clusters.cluster_view(name, k, previous)

    # ------------------------------------------------------------ Fit my style, versions (fits.Fits)
    def fit(self, name: str, k: int | None = None, progress: Callable[[str], None] | None = None) -> UserFit:
        return self.fits.fit(name, k, progress)

    def refine(self, name: str) -> dict:
        return self.fits.refine(name)

    def versions(self, name: str) -> list[dict]:
        return self.fits.versions(name)

    def restore_version(self, name: str, version: int) -> str:
        return self.fits.restore_version(name, version)

    def restore(self, name: str | None, version: float | None) -> str:
        return self.fits.restore(name, version)

    # ------------------------------------------------------------ first-use jobs (jobs.FirstUseJobs)
    def needs_indexing(self, name: str, method: str) -> bool:
        return self.background_jobs.needs_indexing(name, method)

    def start_first_use(self, name: str, method: str) -> dict:
        return self.background_jobs.start_first_use(name, method)

    def after_fit(self, name: str) -> None:
        return self.background_jobs.after_fit(name)

    def prepare_first_use(self, name: str) -> list[dict]:
        return self.background_jobs.prepare_first_use(name)

    def wait_first_use(self, name: str, method: str, poll_s: float = 0.2) -> dict:
        return self.background_jobs.wait_first_use(name, method, poll_s)

    # ------------------------------------------------------------ Compare, Why (decode.Decoding)
    def run_method(self, method: str, state: UserState, prompt: str, s: DecodingSettings,
                   on_step: Callable[[int, int], None] | None = None) -> MethodOutput:
        return self.decoding.run_method(method, state, prompt, s, on_step)

    def compare(self, name: str, prompt: str, methods: Sequence[str], s: DecodingSettings,
                k: int | None = None) -> Iterator[MethodOutput]:
        return self.decoding.compare(name, prompt, methods, s, k)

    def compare_stream(self, name: str, prompt: str, methods: Sequence[str], s: DecodingSettings,
                       k: int | None = None, poll_s: float = 0.5) -> Iterator[tuple[str, str, object]]:
        return self.decoding.compare_stream(name, prompt, methods, s, k, poll_s)

    def why(self, name: str, prompt: str, s: DecodingSettings, k: int | None = None) -> dict:
        return self.decoding.why(name, prompt, s, k)

    def compare_plan(self, name: str | None, text: str | None, templated: bool, item_id: float | None,
                     methods: Sequence[str] | None, k: int | None = None) -> dict:
        return self.decoding.compare_plan(name, text, templated, item_id, methods, k)

    def explain(self, name: str | None, text: str | None, templated: bool, item_id: float | None,
                s: DecodingSettings, k: int | None = None) -> dict:
        return self.decoding.explain(name, text, templated, item_id, s, k)

    # ------------------------------------------------------------ Quick pair, thumbs, leaderboard (votes.Votes)
    def new_pair(self, name: str, prompt: str, methods: Sequence[str], s: DecodingSettings,
                 k: int | None = None) -> BlindPair:
        return self.votes.new_pair(name, prompt, methods, s, k)

    def vote(self, pair_id: str | None, winner: str, rater: str) -> tuple[BlindPair, int]:
        return self.votes.vote(pair_id, winner, rater)

    def wait_feedback(self) -> None:
        return self.votes.wait_feedback()

    def leaderboard(self, cfg: LeaderboardConfig = LeaderboardConfig()) -> dict:
        return self.votes.leaderboard(cfg)

    def thumb(self, name: str, prompt: str, text: str, up: bool, s: DecodingSettings, k: int | None = None,
              before: str | None = None) -> dict:
        return self.votes.thumb(name, prompt, text, up, s, k, before)

    def thumb_column(self, name: str, method: str, up: bool, s: DecodingSettings, k: int | None = None) -> dict:
        return self.votes.thumb_column(name, method, up, s, k)

    def quick_pair(self, name: str | None, prompt: str | None, fallback_prompt: str | None, templated: bool,
                   methods: Sequence[str] | None, s: DecodingSettings, k: int | None = None,
                   rater: str | None = None, logged_in: str | None = None) -> dict:
        return self.votes.quick_pair(name, prompt, fallback_prompt, templated, methods, s, k, rater, logged_in)

    def vote_as(self, pair_id: str | None, winner: str, rater: str | None = None,
                logged_in: str | None = None) -> tuple[BlindPair, int, str]:
        return self.votes.vote_as(pair_id, winner, rater, logged_in)

    # ------------------------------------------------------------ campaigns, Export (campaigns.CampaignDesk)
    def create_campaign(self, name: str, data: str | Path, split: str = "dev", limit: int = 10,
                        methods: Sequence[str] = ("base", "cluster", "card"), reference: bool = False,
                        mode: str = "pairwise", raters_per_item: int = 3, attention_every: int = 0,
                        alpha: float | None = None, top_k: int | None = None,
                        max_new_tokens: int | None = None, sources: Sequence[str] | str = (),
                        min_raters_per_unit: int | None = None) -> dict:
        return self.campaign_desk.create_campaign(name, data, split, limit, methods, reference, mode, raters_per_item, attention_every, alpha, top_k, max_new_tokens, sources, min_raters_per_unit)

    def next_judgment(self, name: str, rater: str) -> Assignment | None:
        return self.campaign_desk.next_judgment(name, rater)

    def submit_judgment(self, assignment: int, rater: str, verdict: str | None = None,
                        scores: dict | None = None) -> int:
        return self.campaign_desk.submit_judgment(assignment, rater, verdict, scores)

    def skip_judgment(self, assignment: int, rater: str) -> None:
        return self.campaign_desk.skip_judgment(assignment, rater)

    def set_campaign_status(self, name: str, status: str) -> None:
        return self.campaign_desk.set_campaign_status(name, status)

    def export_campaign(self, name: str, fmt: str = "jsonl") -> tuple[Path, Path, int]:
        return self.campaign_desk.export_campaign(name, fmt)

    def campaign_results(self, name: str) -> dict:
        return self.campaign_desk.campaign_results(name)

    def judge_campaign(self, name: str, model: str | None = None,
                       progress: Callable[[int, int, str], None] | None = None) -> dict:
        return self.campaign_desk.judge_campaign(name, model, progress)

    def export_table(self, table: str, fmt: str) -> tuple[Path, int]:
        return self.campaign_desk.export_table(table, fmt)

    def export_predictions(self, method: str) -> Path:
        return self.campaign_desk.export_predictions(method)

    # ------------------------------------------------------------ style key, forget me (own_data.OwnData)
    def style_key(self, name: str, all_versions: bool = False) -> str:
        return self.own_data.style_key(name, all_versions)

    def import_style_key(self, text: str, name: str | None = None) -> dict:
        return self.own_data.import_style_key(text, name)

    def forget(self, name: str) -> dict:
        return self.own_data.forget(name)

    def forget_me(self, name: str | None, confirmed: bool) -> dict:
        return self.own_data.forget_me(name, confirmed)

    # ------------------------------------------------------------ Explore (explore.Explorer)
    def explore(self, name: str, alphas: Sequence[float], n_holdout: int = 4, s: DecodingSettings | None = None,
                progress: Callable[[float, str], None] | None = None) -> dict:
        return self.explorer.explore(name, alphas, n_holdout, s, progress)

    def parse_alphas(self, text: str | None, most: int = 12) -> list[float]:
        return self.explorer.parse_alphas(text, most)

    # ------------------------------------------------------------ Populations (population_jobs.Populations)
    @property
    def population_job(self):
        return self.populations.population_job

    def start_population_build(self, source: str, name: str | None, paths: Sequence[str] | str | None = None,
                               serve: bool = True, cfg=None, build_kwargs: dict | None = None):
        return self.populations.start_population_build(source, name, paths, serve, cfg, build_kwargs)

    def cancel_population_build(self) -> str:
        return self.populations.cancel_population_build()

    def nearest_build(self, name: str, embedding: np.ndarray | None = None) -> dict:
        return self.populations.nearest_build(name, embedding)
