"""Leaderboard: the blind votes as Bradley–Terry strengths with bootstrap intervals, and win rates."""

from __future__ import annotations

import gradio as gr

from personalize.ui.common import Markdown, bind
from personalize.ui.controls import Shared
from personalize.ui.figures import leaderboard_figures

COLUMNS = ("method", "strength", "lower", "upper", "votes", "wins", "losses", "ties")


def standings(studio):
    """(status, table rows, strength plot, win-rate plot)."""
    lb = studio.votes.leaderboard()
    if not lb["methods"]:
        return "No votes yet: cast some in *Quick pair*.", [], None, None
    bt, heat = leaderboard_figures(lb)
    rows = [[r[c] for c in COLUMNS] for r in lb["methods"]]
    n = lb["n_votes"]
    return f"{n} vote{'' if n == 1 else 's'} between {len(rows)} methods.", rows, bt, heat


def build(studio, shared: Shared) -> None:
    with gr.Tab("Leaderboard", id="leaderboard") as tab:
        refresh = gr.Button("Refresh", elem_id="lb-refresh")
        status = Markdown(elem_id="lb-status")
        table = gr.Dataframe(headers=list(COLUMNS), interactive=False, elem_id="lb-table")
        with gr.Row():
            plot = gr.Plot(elem_id="lb-plot")
            heat = gr.Plot(elem_id="lb-heat")

    fn, outputs = bind(standings, studio), [status, table, plot, heat]
    refresh.click(fn, None, outputs, concurrency_limit=None)
    tab.select(fn, None, outputs, concurrency_limit=None)
