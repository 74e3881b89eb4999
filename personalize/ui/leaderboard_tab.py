"""Leaderboard: the blind votes as Bradley–Terry strengths with bootstrap intervals, and win rates."""

from __future__ import annotations

import gradio as gr

from personalize.ui.common import Markdown, bind
from personalize.ui.controls import Shared
from personalize.ui.figures import leaderboard_figures

COLUMNS = ("method", "strength", "lower", "upper", "votes", "wins", "losses", "ties")


def standings(studio, leave_out_copies: bool = False):
    """(status, table rows, strength plot, win-rate plot); the status says how many votes were on a pair where an
    output repeats the person's past text, and how many went to the copy."""
    lb = studio.votes.leaderboard(leave_out_copies=bool(leave_out_copies))
    cp = lb["copies"]
    copies = (f" {cp['with_a_copy']} of {cp['pairs']} voted pairs hold an output that repeats the person's past text; "
              f"{cp['won_by_a_copy']} vote{'' if cp['won_by_a_copy'] == 1 else 's'} went to the copy"
              + (" (those pairs left out here)." if leave_out_copies else "."))
    if not lb["methods"]:
        empty = "No votes yet: cast some in *Quick pair*." if not cp["pairs"] else "No votes left." + copies
        return empty, [], None, None
    bt, heat = leaderboard_figures(lb)
    rows = [[r[c] for c in COLUMNS] for r in lb["methods"]]
    n = lb["n_votes"]
    return f"{n} vote{'' if n == 1 else 's'} between {len(rows)} methods.{copies}", rows, bt, heat


def build(studio, shared: Shared) -> None:
    with gr.Tab("Leaderboard", id="leaderboard") as tab:
        with gr.Row():
            refresh = gr.Button("Refresh", elem_id="lb-refresh")
            no_copies = gr.Checkbox(False, label="Leave out pairs where an output repeats the person's past text",
                                    elem_id="lb-no-copies")
        status = Markdown(elem_id="lb-status")
        table = gr.Dataframe(headers=list(COLUMNS), interactive=False, elem_id="lb-table")
        with gr.Row():
            plot = gr.Plot(elem_id="lb-plot")
            heat = gr.Plot(elem_id="lb-heat")

    fn, outputs = bind(standings, studio), [status, table, plot, heat]
    refresh.click(fn, [no_copies], outputs, concurrency_limit=None)
    no_copies.change(fn, [no_copies], outputs, concurrency_limit=None)
    tab.select(fn, [no_copies], outputs, concurrency_limit=None)
