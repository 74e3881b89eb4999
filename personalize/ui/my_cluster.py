"""My cluster: where the user falls among the population at a chosen K, with texts from their cluster."""

from __future__ import annotations

from dataclasses import replace

import gradio as gr

from personalize.display import md, md_quoting
from personalize.ui.common import Markdown, bind, guarded
from personalize.ui.controls import Shared
from personalize.ui.figures import cluster_figure
from personalize.ui import text as page_text


def cluster_examples_md(examples) -> str:
    """(population user, one of their texts) pairs under My cluster."""
    if not examples:
        return ""
    return "**Texts from your cluster:**\n" + "\n".join(f"- *{md(u)}*: {md(t)}" for u, t in examples)


@guarded(5)
def show_cluster(studio, name, k, previous=None):
    """(status, examples, map, K, K): the K snapped to a built one goes to the user's K and back to the slider."""
    view = studio.clusters.cluster_view(name, k, previous)
    fig, k, st = cluster_figure(view.map), view.k, view.state
    if st is None:  # a name without a history is told what My writing tells it
        return (md_quoting(view.message, (name or "").strip()) or
                "Enter a user name and save a history to see where you fall."), "", fig, k, k
    return page_text.cluster_summary(studio, replace(st, name=md(st.name))), cluster_examples_md(view.examples), fig, k, k


def build(studio, shared: Shared) -> None:
    d = shared.decoding
    with gr.Tab("My cluster", id="cluster") as tab:
        d.k_slider.render()
        status = Markdown(elem_id="cluster-status")
        examples = Markdown(elem_id="cluster-examples")
        plot = gr.Plot(elem_id="cluster-plot")

    shared.of_person((status, ""), (examples, ""), (plot, None))
    fn, outputs = bind(show_cluster, studio), [status, examples, plot, d.k, d.k_slider]
    # `input` fires for the keyboard (arrow keys, the number box) as well as the mouse; `release` is mouse-only.
    # Only the last of a burst of steps is run; the K the slider came from sets the direction of the snap.
    d.k_slider.input(fn, [shared.user, d.k_slider, d.k], outputs, trigger_mode="always_last", api_name="cluster")
    shared.saved.then(fn, [shared.user, d.k_slider], outputs)
    tab.select(fn, [shared.user, d.k_slider], outputs)
    shared.stored.change(fn, [shared.stored, d.k_slider], outputs)
