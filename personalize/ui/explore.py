"""Explore: α and K swept for the user against their own held-out items (λ refitted without them)."""

from __future__ import annotations

import gradio as gr

from personalize.ui.common import EXPECTED, Markdown, _err, bind
from personalize.ui.controls import Shared
from personalize.studio.explorer import Sweep
from personalize.studio.histories import number_ranges
from personalize.ui.figures import explore_figures


CLEARED = (None, None, [])  # a refused sweep leaves no figure or row of an earlier one beside its message


def explore(studio, name, alpha_text, n, alpha, top_k, max_tokens, progress=gr.Progress()):
    """(status, α plot, K plot, table rows); a refusal clears the plots and the table."""
    try:
        name = studio.need_user(name)
        values = studio.explorer.parse_alphas(alpha_text)
        progress(0, desc="fitting λ without the held-out items")
        res = studio.explorer.explore(name, values, int(n), studio.settings(alpha, top_k, max_tokens),
                             progress=lambda f, d: progress(f, desc=d))
    except EXPECTED as e:
        return (_err(e), *CLEARED)
    fa, fk = explore_figures(res)
    rows = [["α", r.alpha, "card", r.copy_aware, r.rougeL, repeats_cell(r, res), r.length] for r in res.alpha]
    rows += [["K", r.k, r.method, r.copy_aware, r.rougeL, repeats_cell(r, res), r.length] for r in res.k]
    return explore_message(res), fa, fk, rows


def repeats_cell(point, res: Sweep) -> str:
    """"2 of 4": the point's outputs that repeat one of the person's other texts."""
    return f"{round(point.repeats * len(res.golds))} of {len(res.golds)}"


def explore_message(res: Sweep) -> str:
    """The sweep's status line: what was held out and fitted on, and the best α by the copy-aware score (an old
    text handed back counts 0), read as a hint."""
    best, n_aside = res.best_alpha(), res.n_set_aside
    aside = (f" ({n_aside} item{'s' * (n_aside != 1)} repeating a held-out one left out of the fit too)"
             if n_aside else "")
    which = f" ({number_ranges(res.numbers)} in My writing)" if res.numbers else ""
    return (f"Held out your newest {len(res.golds)} items{which}, λ fitted on {res.n_fit}{aside}; nothing of them "
            f"is in the style, its memory or what it retrieves. Best α here: **{best.alpha}** "
            f"(ROUGE-L {best.copy_aware:.3f}, where an output that repeats one of your other texts scores 0; its "
            f"outputs repeat one in {repeats_cell(best, res)}); few items, so read it as a hint.")


def build(studio, shared: Shared) -> None:
    with gr.Tab("Explore", id="explore"):
        Markdown("Sweeps α and K for the user: λ is refitted without the held-out items (nothing stored), then "
                 "CARD and the cluster model generate for their prompts; ROUGE-L against your own texts, where an "
                 "output that repeats one of your other texts scores 0 (the raw ROUGE-L beside it), and how many "
                 "outputs repeat one.")
        with gr.Row():
            alphas = gr.Textbox("0, 0.5, 1, 2, 4", label="α values", elem_id="alphas")
            n_hold = gr.Slider(1, 12, value=4, step=1, label="Held-out items", elem_id="n-holdout")
        run_btn = gr.Button("Run sweep", variant="primary", elem_id="explore-button")
        status = Markdown(elem_id="explore-status")
        with gr.Row():
            alpha_plot = gr.Plot(elem_id="explore-alpha")
            k_plot = gr.Plot(elem_id="explore-k")
        table = gr.Dataframe(headers=["sweep", "value", "method", "ROUGE-L (copies 0)", "ROUGE-L", "repeats",
                                      "words"], interactive=False,
                             elem_id="explore-table")

    shared.of_person((status, ""), (alpha_plot, None), (k_plot, None), (table, []))
    run_btn.click(bind(explore, studio), [shared.user, alphas, n_hold, *shared.decoding.sliders],
                  [status, alpha_plot, k_plot, table], concurrency_id="model")
