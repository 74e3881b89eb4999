"""The page before the studio serves: while the first start's demo build runs (issue 49), with the build's stage, a
progress bar, the time left and what each tab waits for; and on every start while the model stack is imported and the
build loaded (issue 58: the page and its login within seconds of `make run`, "loading the model" behind them). Then
app.py stops it and starts the studio on the same address; the page reloads itself once the studio answers (its
title is the studio's)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import gradio as gr

from personalize.display import md

STUDIO_TITLE = "Personalization studio"  # the studio's own page (app.build_app)
TITLE = f"{STUDIO_TITLE} · building the demo"
LOADING_TITLE = f"{STUDIO_TITLE} · loading the model"
# the build's share done once its head is trained (methods/card/build.py's STAGE_SHARES up to the head's end, a test
# keeps them equal; this module imports no model code): when card's part arrives
HEAD_SHARE = 0.68
# what each tab waits for: the build's parts, in the order the build makes them (methods/card/build.py's stages)
WAITS = (
    ("My writing", "the clusters: Save places your history among the build's people"),
    ("My cluster", "the clusters and their people"),
    ("Fit my style", "the head (it follows the cluster model): your style is fitted over your cluster's model"),
    ("Compare", "the cluster adapters (every column but card's and P2P's first; card follows with the head, P2P last)"),
    ("Why", "the head"),
    ("Rate", "the cluster model (a campaign's card and P2P outputs follow their parts)"),
    ("Quick pair", "the cluster adapters (card's side follows with the head)"),
    ("Leaderboard", "the cluster model"),
    ("Campaigns", "the cluster model"),
    ("Export", "the cluster model"),
    ("Explore", "the head"),
    ("Populations", "the whole build (a second build waits for the first)"),
)
# reloads the page when the address answers with the studio's title: the studio replaced this page
RELOAD_JS = f"""() => {{
  setInterval(async () => {{
    try {{
      const c = await (await fetch('config', {{cache: 'no-store'}})).json();
      if (c.title === {STUDIO_TITLE!r}) location.reload();
    }} catch (e) {{}}
  }}, 3000);
}}"""


@dataclass
class FirstStart:
    """The first start's demo build (fitting.plan.ensure_demo) in a thread, with build's progress as it reports it."""

    demo: Path
    artifacts: Path
    stage: str = "writing the demo's people"
    fraction: float = 0.0
    error: str | None = None
    started: float = field(default_factory=time.time)
    done: threading.Event = field(default_factory=threading.Event)

    # the build's parts as they are written (build's on_part): the studio serves from the cluster part on
    cluster: threading.Event = field(default_factory=threading.Event)
    card: threading.Event = field(default_factory=threading.Event)

    def start(self) -> "FirstStart":
        threading.Thread(target=self._run, name="first-start-build", daemon=True).start()
        return self

    def _run(self) -> None:
        from personalize.fitting.plan import ensure_demo

        try:
            ensure_demo(self.demo, self.artifacts, progress=self._progress, on_part=self._part)
        except Exception as e:  # the page and the terminal say why; app.py exits with it
            self.error = f"{type(e).__name__}: {e}"
        finally:
            self.done.set()
            self.cluster.set(), self.card.set()  # whoever waits for a part stops waiting (done, or job.error says)

    def _progress(self, stage: str, fraction: float) -> None:
        self.stage, self.fraction = stage, fraction

    def _part(self, part: str, _folder) -> None:
        reached = getattr(self, part, None)  # the cluster and card parts' events (the last, "all", is `done`)
        if isinstance(reached, threading.Event):
            reached.set()

    def coming(self):
        """What the studio does not serve yet while this build finishes (studio.coming.Coming.waiting, before or after
        its card part), with this build's progress; nothing once it is done."""
        from personalize.studio.coming import Coming

        if self.done.is_set() and not self.error:
            return Coming()
        return Coming.waiting(not self.card.is_set(), lambda: (self.stage, self.fraction, time.time() - self.started),
                              HEAD_SHARE, failed=self.error or "")

    def line(self, now: float | None = None) -> str:
        """Where the build stands, in words: its stage, its share, the time so far and an estimate of the time left
        (from the share done so far, once there is enough of it to say)."""
        spent = (now or time.time()) - self.started
        if self.error:
            return f"The demo build failed after {spent:.0f} s: {md(self.error)}"
        if self.done.is_set() or self.cluster.is_set():
            return (f"The cluster model can decode ({spent:.0f} s); loading it, then this page turns into the studio "
                    "by itself (the head, card's check and P2P follow while you use it).")
        left = (f", about {spent * (1 - self.fraction) / self.fraction / 60:.0f} min left"
                if self.fraction >= 0.05 else "")
        return (f"Building the demo once (later starts take seconds): **{self.stage}**, {self.fraction:.0%} "
                f"after {spent / 60:.1f} min{left}.")  # the stage is the build's own word, never a person's


def waiting_page(job: FirstStart) -> gr.Blocks:
    """The page the first start serves while `job` builds: the progress, then each tab with what it waits for."""
    with gr.Blocks(title=TITLE, analytics_enabled=False) as page:
        gr.Markdown("# Personalization studio\nThe first start builds the demo the studio serves. The studio opens "
                    "once the cluster model can decode; card follows when its head is trained, then its check on the "
                    "validation people and P2P's hypernetwork, while you use the studio. This page follows the build "
                    "and reloads itself into the studio.")
        bar = gr.Slider(0, 100, value=0, label="demo build (%)", interactive=False, elem_id="first-start-bar")
        status = gr.Markdown(job.line(), elem_id="first-start-status")
        with gr.Tabs():
            for tab, what in WAITS:
                with gr.Tab(tab):
                    gr.Markdown(f"**{tab}** waits for {what}.")
        gr.Timer(2.0).tick(lambda: (round(100 * job.fraction, 1), job.line()), outputs=[bar, status],
                           show_progress="hidden")
    return page


@dataclass
class ModelLoad:
    """A start whose build exists: the model stack imported and the build loaded behind the page."""

    started: float = field(default_factory=time.time)
    fraction: float = 0.0

    def line(self, now: float | None = None) -> str:
        spent = (now or time.time()) - self.started
        return (f"Loading the model: {spent:.0f} s so far (about 10 s on 2 cores); this page turns into the studio by "
                "itself.")


def loading_page(load: ModelLoad) -> gr.Blocks:
    """The page while the model loads: the studio's title line, and what it waits for."""
    with gr.Blocks(title=LOADING_TITLE, analytics_enabled=False) as page:
        gr.Markdown("# Personalization studio")
        status = gr.Markdown(load.line(), elem_id="loading-status")
        gr.Timer(1.0).tick(load.line, outputs=[status], show_progress="hidden")
    return page
