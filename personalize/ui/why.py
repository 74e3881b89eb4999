"""Why: CARD's output token by token for Compare's prompt and settings, the tokens the user vector changed
marked, and each step's top candidates before and after the correction."""

from __future__ import annotations

import gradio as gr

from personalize.display import md
from personalize.ui.common import DECODE_SESSIONS, Markdown, bind, guarded
from personalize.ui.controls import Shared
from personalize.ui.figures import step_figure


@guarded(5)
def why(studio, name, text, templated, item, alpha, top_k, max_tokens, k):
    """(status, highlighted tokens, step slider, the first changed step's plot, the trace kept for the slider)."""
    res = studio.comparisons.why(name, text, studio.settings(alpha, top_k, max_tokens), k, templated, item)
    steps = res.steps
    changed = sum(st["changed"] for st in steps)
    tokens = [(piece, "changed" if changed_ else "kept") for piece, changed_ in res.pieces]
    status = (f"α = {res.alpha}, cluster {res.cluster} of K = {res.k}"
              f"{'' if res.fitted else ', λ = 1 (not fitted)'}: the user vector changed **{changed}** of "
              f"{len(steps)} tokens. Output: {md(res.text)}")
    first = next((i for i, st in enumerate(steps) if st["changed"]), 0)
    return (status, tokens, gr.update(maximum=max(len(steps) - 1, 1), value=first),
            step_figure(steps[first]) if steps else None, res)


def why_step(i, res):
    """The plot of step i of the trace shown (res: the Explanation kept in the page's state, or None)."""
    steps = res.steps if res is not None else []
    if not steps:
        return gr.skip()
    return step_figure(steps[min(int(i), len(steps) - 1)])


def build(studio, shared: Shared) -> None:
    with gr.Tab("Why", id="why"):
        Markdown("CARD token by token for the Compare prompt and settings: tokens the user vector changed are "
                 "marked *changed* (the cluster model would have picked another one).")
        why_btn = gr.Button("Explain CARD's output", variant="primary", elem_id="why-button")
        status = Markdown(elem_id="why-status")
        tokens = gr.HighlightedText(label="CARD output", color_map={"changed": "orange", "kept": "lightgray"},
                                    show_legend=True, elem_id="why-tokens")
        step = gr.Slider(0, 1, value=0, step=1, label="Step", elem_id="why-step")
        plot = gr.Plot(elem_id="why-plot")
        trace = gr.State(None)

    shared.of_person((status, ""), (tokens, None), (plot, None), (trace, None))
    why_btn.click(bind(why, studio), [shared.user, *shared.prompt.inputs, *shared.decoding.inputs],
                  [status, tokens, step, plot, trace], concurrency_id="decode", concurrency_limit=DECODE_SESSIONS)
    step.release(why_step, [step, trace], [plot])
