"""Export: votes and generations as JSONL or CSV, a method's generations as LaMP predictions."""

from __future__ import annotations

import gradio as gr

from personalize.display import md
from personalize.catalog import ALL_METHODS
from personalize.ui.common import Markdown, bind, guarded
from personalize.ui.controls import Shared
from personalize.ui.downloads import hand_out


@guarded(2)
def export_table(studio, table, fmt):
    path, n = studio.campaign_desk.export_table(table, fmt)
    return f"Exported {table} ({n} rows) to `{path}`.", hand_out(studio.cfg.page_files, path)[0]


@guarded(2)
def export_predictions(studio, method):
    path = studio.campaign_desk.export_predictions(method)
    return (f"Exported {md(method)}'s generations as LaMP predictions to `{path}`.",
            hand_out(studio.cfg.page_files, path)[0])


def export_scope(logins: bool) -> str:
    """Whose records an export holds (humaneval.table_export.rows), said before anyone clicks."""
    if logins:
        return ("Your records only: the generations of the people your login made, and the votes you cast or that "
                "are about your people.")
    return "Everything this studio stored: it runs without logins, so every person's generations and every vote."


def build(studio, shared: Shared) -> None:
    with gr.Tab("Export", id="export"):
        Markdown(export_scope(studio.cfg.logins))
        with gr.Row():
            buttons = {(t, f): gr.Button(f"{t} as {f.upper()}", elem_id=f"export-{t}-{f}")
                       for t in ("votes", "generations") for f in ("jsonl", "csv")}
        with gr.Row():
            method = gr.Dropdown(list(ALL_METHODS), value="card", label="Method", elem_id="pred-method")
            pred_btn = gr.Button("Generations as LaMP predictions", elem_id="export-predictions")
        status = Markdown(elem_id="export-status")
        file = gr.File(label="Download", elem_id="export-file", interactive=False)
        # the page's API for scripts, /export_table(table, fmt) -> (status, file): made first, so it holds the
        # name; inside the tab, so that the tabs after it stay in the page's one row of tabs
        api_table, api_fmt = gr.Textbox(visible=False), gr.Textbox(visible=False)
        api_button = gr.Button(visible=False)
    api_button.click(bind(export_table, studio), [api_table, api_fmt], [status, file], concurrency_limit=None,
                     api_name="export_table")
    for (t, f), btn in buttons.items():
        btn.click(bind(export_table, studio, t, f), None, [status, file], concurrency_limit=None)
    pred_btn.click(bind(export_predictions, studio), [method], [status, file], concurrency_limit=None)
