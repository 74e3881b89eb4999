"""Populations: a population made from where people's writing lives (a git repository, Debian changelogs, a table),
what that step kept and dropped, then its build in the background (progress bar, Cancel) while every other tab keeps
answering; the new build is served when written (or chosen under *Serve a build*, with every other build here).
The job is the library's (population_jobs.PopulationJob, held by the Studio); a timer polls it."""

from __future__ import annotations

import gradio as gr

from personalize.ui.common import Markdown, bind, guarded
from personalize.ui.controls import N_SERVED, Shared
from personalize.ui.writing import served

SOURCE_CHOICES = [("a git repository on this machine", "git"), ("Debian maintainers' changelogs", "changelogs"),
                  ("a table (.csv / .jsonl: user, text[, input][, time])", "table")]
PATH_LABELS = {"git": "Git repository path(s) on this machine, one per line",
               "changelogs": "Debian docs folder (one <package>/changelog.Debian.gz per package)",
               "table": "Upload the table below"}
INTRO = ("Make a **population** from where people's writing already lives and build CARD's artifacts on it: commit "
         "subjects per author from git, Debian maintainers' changelog entries, or a table of (user, text). The "
         "build trains with the first start's settings on this machine's CPU (minutes; K at most a third of the "
         "people) and its own copy of the model, so every tab keeps answering meanwhile; Cancel stops it at its next "
         "step and leaves nothing behind.")
N_POLL = 4 + N_SERVED + 4  # counts, status, bar, builds, the served controls, demo picker, task, timer, seen


def source_changed(source):
    """The path box and the upload for the source chosen (no Studio call)."""
    return (gr.update(label=PATH_LABELS[source], visible=source != "table",
                      value="/usr/share/doc" if source == "changelogs" else ""),
            gr.update(visible=source == "table"))


@guarded(3)
def start(studio, source, name, path, file, serve):
    """Build: the job starts (studio.population_jobs.start_population_build) and the timer starts polling it."""
    job = studio.population_jobs.start_population_build(source, name, file if source == "table" else path, bool(serve))
    return job.line(), "", gr.Timer(active=True)


@guarded(1)
def cancel(studio):
    return studio.population_jobs.cancel_population_build()


def poll(studio, seen):
    """The job as the page shows it: counts, line, percent; once it has ended (shown once per page, `seen`): the
    builds on offer and, when it was served, every control that depends on the build served."""
    job = studio.population_jobs.population_job
    if job is None:
        return ("", "", 0, *[gr.skip()] * (N_SERVED + 3), gr.Timer(active=False), seen)
    key = f"{job.name}@{job.started}"
    head = (job.counts(), job.line(), 100 if job.state == "done" else round(100 * job.fraction))
    if job.running or key == seen:
        return (*head, *[gr.skip()] * (N_SERVED + 3), gr.Timer(active=job.running), seen)
    builds = gr.update(choices=studio.served_builds.build_choices(), value=str(job.out) if job.state == "done" else None)
    now = (*served(studio), studio.served.task.name) if job.served else [gr.skip()] * (N_SERVED + 2)
    return (*head, builds, *now, gr.Timer(active=False), key)


@guarded(2 + N_SERVED + 2)
def serve(studio, folder):
    """Serve a build: every session decodes with it from now on (studio.served_builds.serve_build)."""
    msg = studio.served_builds.serve_build(folder)
    return (msg, gr.update(choices=studio.served_builds.build_choices(), value=None), *served(studio), studio.served.task.name)


def build(studio, shared: Shared) -> None:
    with gr.Tab("Populations", id="populations") as tab:
        Markdown(INTRO)
        with gr.Row():
            source = gr.Radio(SOURCE_CHOICES, value="changelogs", label="Source", elem_id="population-source", scale=3)
            name = gr.Textbox(label="Name of the build (a folder under the artifacts)", placeholder="e.g. my-team",
                              elem_id="population-name", scale=2)
        path = gr.Textbox("/usr/share/doc", label=PATH_LABELS["changelogs"], lines=2, elem_id="population-path")
        upload = gr.File(label="Table (.csv or .jsonl)", file_types=[".csv", ".jsonl"], visible=False,
                         elem_id="population-file")
        with gr.Row():
            serve_when_built = gr.Checkbox(True, label="Serve it when it is built (for every session)",
                                           elem_id="population-serve")
            start_btn = gr.Button("Make and build", variant="primary", elem_id="population-build")
            cancel_btn = gr.Button("Cancel", variant="stop", elem_id="population-cancel")
        counts = Markdown(elem_id="population-counts")
        status = Markdown(elem_id="population-status")
        bar = gr.Slider(0, 100, value=0, step=1, interactive=False, label="Build progress (%)",
                        elem_id="population-progress")
        with gr.Row():
            builds = gr.Dropdown(studio.served_builds.build_choices(), value=None, label="Serve a build (every build here)",
                                 elem_id="population-builds", scale=3)
            serve_btn = gr.Button("Serve it", elem_id="population-serve-build")
        serve_status = Markdown(elem_id="population-serve-status")
        timer = gr.Timer(1.0, active=False)
        seen = gr.State(None)  # the ended job this page has shown

    page = [*shared.served_outputs, shared.demo_user, shared.task]
    polled = [counts, status, bar, builds, *page, timer, seen]
    assert len(polled) == N_POLL
    source.change(source_changed, [source], [path, upload], queue=False, show_progress="hidden")
    start_btn.click(bind(start, studio), [source, name, path, upload, serve_when_built], [status, counts, timer],
                    api_name="build_population")
    cancel_btn.click(bind(cancel, studio), None, [status], concurrency_limit=None, api_name="cancel_population")
    timer.tick(bind(poll, studio), [seen], polled, concurrency_limit=None, show_progress="hidden",
               api_name="population_status")
    serve_btn.click(bind(serve, studio), [builds], [serve_status, builds, *page], concurrency_id="model")
    tab.select(lambda: gr.update(choices=studio.served_builds.build_choices()), None, [builds], show_progress="hidden")
    shared.app.load(bind(poll, studio), [seen], polled)  # a page opened during a build follows it
