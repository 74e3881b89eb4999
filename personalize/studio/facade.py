"""The studio: every operation of the web app on one loaded engine and one store, with no UI code.

`Studio` holds one runtime.Runtime (the engine, the store, the model lock, the scheduler and the executors) and one
service per concern (builds, histories, clusters, jobs, decode, fits, votes, campaigns, explore, own_data,
population_jobs); the tabs (personalize/ui) call the services directly, one use case per event. app.py only lays
out widgets, so the behaviour (what is stored, what an error says, what a sweep measures) is tested without a
browser. Every decode goes through one scheduler
(serving/scheduler.py): the requests of all sessions that arrive within a few tens of ms decode as one mixed batch.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

from personalize.catalog import BY_NAME, STEERED
from personalize.data import Item
from personalize.humaneval import campaign_pool
from personalize.methods.engine import Engine
from personalize.store import Store
from personalize.studio.builds import Builds, lamp_users, population_texts
from personalize.studio.campaign_desk import CampaignDesk
from personalize.studio.clusters import ClusterViews
from personalize.studio.coming import Coming
from personalize.studio.comparisons import Comparisons
from personalize.studio.explorer import Explorer
from personalize.studio.fits import Fits
from personalize.studio.histories import Histories, Saved
from personalize.studio.first_use_jobs import FirstUseJobs
from personalize.studio.own_data import OwnData
from personalize.studio.population_jobs import PopulationJobs
from personalize.studio.runtime import Runtime, StudioConfig
from personalize.studio.voting import Votes


class Studio:
    """The app's use cases: one runtime (studio.runtime: engine, store, settings, lock) and one service per
    concern, which the tabs call directly (studio.fits.fit, studio.comparisons.compare_stream, ...), never the
    runtime itself; the two operations here span services."""

    def __init__(self, engine: Engine, store: Store, cfg: StudioConfig = StudioConfig(),
                 demo_users: dict[str, list[Item]] | None = None, population: dict[str, list[str]] | None = None):
        self.runtime = rt = Runtime(engine, store, cfg, demo_users, population)
        # the rules the tabs apply around a use case, the runtime's own (the page reaches them here, never the
        # runtime): the name checked, the sliders' decoding settings, a slider's K snapped to a built one
        self.need_user, self.settings, self.snap_k = rt.need_user, rt.settings, rt.snap_k
        self.served_builds = Builds(rt)
        self.histories = Histories(rt)
        self.clusters = ClusterViews(rt, self.histories)
        self.first_use_jobs = FirstUseJobs(rt)
        self.comparisons = Comparisons(rt, self.histories, self.first_use_jobs)
        self.fits = Fits(rt, self.histories)
        # a cluster of one: after Save's rewrites, a far person's own adapter trains; ready, their style is refitted
        self.histories.after_rewrites.insert(0, self.first_use_jobs.own_after_save)
        self.first_use_jobs.after_own.append(self.fits.refit_over_own)
        self.votes = Votes(rt, self.histories, self.comparisons, self.fits)
        self.campaigns = rt.campaigns  # a rater's units and judgments, the results; changing one: campaign_desk
        self.campaign_desk = CampaignDesk(rt)
        self.own_data = OwnData(rt, self.fits)
        self.explorer = Explorer(rt)
        self.population_jobs = PopulationJobs(rt, self.served_builds, self.histories)

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

    @property
    def served(self) -> Engine:
        """The build served now (a task switch replaces it), read only: what the page says about it."""
        return self.runtime.engine

    @property
    def cfg(self) -> StudioConfig:
        return self.runtime.cfg

    @property
    def store(self) -> Store:
        return self.runtime.store

    @property
    def coming(self) -> Coming:
        """The served build's parts still being built (the first start serves card before its guard and P2P)."""
        return self.runtime.coming

    def follow_build(self, coming: Coming) -> None:
        """Serves the build's card part while its build goes on: what `coming` names waits, and says when it comes."""
        self.runtime.coming = coming

    def take_built_parts(self, coming: Coming = Coming()) -> None:
        """The served build went on in its folder (build's on_part): the head, the guard's decision and P2P, as far
        as they are there, taken under the model lock; `coming`: what is still to come. The weights held, the
        people's histories, fits and first-use work stay: the same build id."""
        with self.runtime.model_lock:
            self.runtime.engine.take_built_parts()
            for m in [m for m in self.runtime.methods if m in STEERED or BY_NAME[m].needs]:
                del self.runtime.methods[m]  # made again: the head and the hypernetwork are in the folder now
        self.runtime.coming = coming

    def load_pending(self) -> None:
        """What the start left for after the page answers: the other cluster adapters (~1 s). A request
        that needs them first loads them itself (Engine.use_adapter, decode_rows)."""
        with self.runtime.model_lock:
            self.runtime.engine.load_pending_adapters()

    # ------------------------------------------------------------ use cases that span services
    def save_from(self, name: str | None, text: str | None, file: str | None, task: str,
                  demo: str | None = None, replace: bool = True) -> Saved:
        """My writing's Save: the name checked, the history chosen (history_from), stored (save_history) under
        the task served (a history is placed, fitted and decoded in the served build's task). Without `replace`,
        a name that has a history is answered with ReplaceAsk (the page asks first)."""
        name = self.runtime.need_user(name)
        served = self.runtime.task.name
        if task and task != served:
            raise ValueError(f"the studio serves {served} ({self.runtime.engine.artifacts_id}), not {task}: choose "
                             f"{task} in the Task list to switch to its build, or save under {served}")
        items = self.histories.history_from(text, file, demo)
        if not replace:
            self.histories.ask_before_replacing(name, items)
        res = self.histories.save_history(name, items, task)
        if len(self.served_builds.build_choices()) > 1:  # another build here may be nearer the person's writing (nearest_build)
            res = dataclasses.replace(res, nearer=self.population_jobs.nearest_build(res.name, res.embedding)["message"])
        # the slow first uses (EXACT, OPPU) start after the person's Fit (after_fit) or at their first Compare, not
        # here: started at Save, EXACT's decode of the history held the model while the person's Fit waited
        return res

    def generate_campaign(self, name: str, progress: Callable[[int, int, str], None] | None = None) -> dict:
        self.runtime.need_admin("generating a campaign's outputs")
        return campaign_pool.generate(self, name, progress)
