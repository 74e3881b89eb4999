"""The personalization studio, a Gradio app over personalize.studio.Studio.

    python app.py [--host 127.0.0.1] [--port 7860] [--db data/studio.db] [--artifacts data/artifacts/demo]
                  [--auth u1:p1,u2:p2 | --auth @raters.txt]

Tabs: My writing, My cluster, Fit my style, Compare, Why, Rate, Leaderboard, Export, Explore.
Every handler calls one Studio method; what it shows and collects is in the SQLite store.
Expected problems (bad input, unknown user, a stale vote) are answered in the tab's
status line and change nothing else; model work runs in Gradio's queue with a progress bar.
Text from people and models (history items, names, prompts, outputs, errors quoting them) is shown as
written, never rendered or executed: it enters Markdown and plots only through personalize.display.
With --auth, a vote counts under the logged-in user name (arena.rater_id), once per rater and pair.
"""

from __future__ import annotations

import argparse
import functools
import ipaddress
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import gradio as gr
import plotly.graph_objects as go

from personalize.arena import StalePair, rater_id
from personalize.data import TASKS, HistoryError
from personalize.display import md, md_quoting, plot_text
from personalize.engine import ArtifactsError
from personalize.export import export_predictions, export_table
from personalize.studio import ALL_METHODS, DEFAULT_METHODS, Studio, StudioConfig, fit_verdict
from personalize.store import StoreError

EXPECTED = (HistoryError, StoreError, StalePair, ArtifactsError, ValueError, FileNotFoundError)
VOTES = {"vote-a": ("a", "A is better"), "vote-b": ("b", "B is better"), "vote-tie": ("tie", "Tie"),
         "vote-bad": ("both_bad", "Both are bad")}
CSS = ".method-out {min-height: 6em} #vote-status {font-size: 1.05em}"
# Every Markdown of the app: no LaTeX (a "$$" in someone's text is text). Text from people and models goes into
# Markdown only through display.md, so that it is shown as written and never rendered or executed.
Markdown = functools.partial(gr.Markdown, latex_delimiters=[])


def _err(e: Exception) -> str:
    return f"⚠️ {md(e)}"  # error messages quote names, items and input


def guarded(n_outputs: int, status_index: int = 0):
    """Expected errors become the status line; every other output keeps its value (gr.skip)."""
    def wrap(fn):
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except EXPECTED as e:
                out = [gr.skip()] * n_outputs
                out[status_index] = _err(e)
                return tuple(out) if n_outputs > 1 else out[0]
        return inner
    return wrap


def _need_user(name: str | None) -> str:
    if not name or not name.strip():
        raise ValueError("enter a user name first (top of the page)")
    return name.strip()


# ---------------------------------------------------------------- figures

def cluster_figure(m: dict) -> go.Figure:
    fig = go.Figure()
    for c in sorted(set(m["labels"])):
        idx = [i for i, lab in enumerate(m["labels"]) if lab == c]
        fig.add_scatter(x=[m["xy"][i][0] for i in idx], y=[m["xy"][i][1] if len(m["xy"][i]) > 1 else 0 for i in idx],
                        mode="markers", name=f"cluster {c}", text=[plot_text(m["users"][i]) for i in idx],
                        marker={"size": 8})
    cx = m["centroids"]
    fig.add_scatter(x=[p[0] for p in cx], y=[p[1] if len(p) > 1 else 0 for p in cx], mode="markers+text",
                    name="centroids", text=[str(i) for i in range(len(cx))], textposition="top center",
                    marker={"symbol": "x", "size": 12, "color": "black"})
    if "user" in m:
        u = m["user"]
        fig.add_scatter(x=[u["xy"][0]], y=[u["xy"][1] if len(u["xy"]) > 1 else 0], mode="markers+text",
                        name=plot_text(u["name"]), text=[plot_text(u["name"])], textposition="bottom center",
                        marker={"symbol": "star", "size": 20, "color": "gold", "line": {"width": 1, "color": "black"}})
    fig.update_layout(title=f"Population (PCA of user embeddings), K = {m['k']}", height=460,
                      margin={"l": 10, "r": 10, "t": 40, "b": 10})
    return fig


def loss_figure(curve: list[float]) -> go.Figure:
    fig = go.Figure(go.Scatter(y=curve, mode="lines+markers"))
    fig.update_layout(title="λ fit: loss per LBFGS iteration", xaxis_title="iteration", yaxis_title="loss", height=320)
    return fig


def step_figure(step: dict) -> go.Figure:
    toks = [plot_text(repr(c["token"])) for c in step["candidates"]]
    fig = go.Figure([go.Bar(name="before (cluster model)", x=toks, y=[c["before"] for c in step["candidates"]]),
                     go.Bar(name="after (α·Δ added)", x=toks, y=[c["after"] for c in step["candidates"]])])
    fig.update_layout(barmode="group", title="Top candidates' logits at this step", height=380)
    return fig


def leaderboard_figures(lb: dict) -> tuple[go.Figure, go.Figure]:
    rows = lb["methods"]
    bt = go.Figure(go.Scatter(
        x=[plot_text(r["method"]) for r in rows], y=[r["strength"] for r in rows], mode="markers",
        error_y={"type": "data", "symmetric": False, "array": [r["upper"] - r["strength"] for r in rows],
                 "arrayminus": [r["strength"] - r["lower"] for r in rows]}, marker={"size": 12}))
    bt.update_layout(title=f"Bradley–Terry strength (Elo scale), 95% bootstrap intervals, {lb['n_votes']} votes",
                     height=380)
    names = [r["method"] for r in rows]
    z = [[lb["win_rate"][a][b] for b in names] for a in names]
    shown = [plot_text(n) for n in names]
    heat = go.Figure(go.Heatmap(z=z, x=shown, y=shown, zmin=0, zmax=1, colorscale="RdBu",
                                text=[[("" if v is None else f"{v:.2f}") for v in row] for row in z],
                                texttemplate="%{text}"))
    heat.update_layout(title="Win rate of row vs column (ties = ½)", height=380)
    return bt, heat


def explore_figures(res: dict) -> tuple[go.Figure, go.Figure]:
    a = res["alpha"]
    fa = go.Figure()
    fa.add_scatter(x=[r["alpha"] for r in a], y=[r["rougeL"] for r in a], name="ROUGE-L", mode="lines+markers")
    fa.add_scatter(x=[r["alpha"] for r in a], y=[r["length"] for r in a], name="words", mode="lines+markers",
                   yaxis="y2")
    fa.update_layout(title="CARD vs steering strength α (α = 0: the cluster model)", xaxis_title="α",
                     yaxis={"title": "ROUGE-L"}, yaxis2={"title": "words", "overlaying": "y", "side": "right"},
                     height=380)
    fk = go.Figure()
    for m in ("cluster", "card"):
        rows = [r for r in res["k"] if r["method"] == m]
        fk.add_scatter(x=[r["k"] for r in rows], y=[r["rougeL"] for r in rows], name=f"{m} ROUGE-L",
                       mode="lines+markers")
        fk.add_scatter(x=[r["k"] for r in rows], y=[r["length"] for r in rows], name=f"{m} words",
                       mode="lines+markers", yaxis="y2", line={"dash": "dot"})
    fk.update_layout(title="Cluster count K", xaxis_title="K", yaxis={"title": "ROUGE-L"},
                     yaxis2={"title": "words", "overlaying": "y", "side": "right"}, height=380)
    return fa, fk


# ---------------------------------------------------------------- text from people and models, as Markdown

def method_md(o) -> str:
    """One Compare column: the method's header line, then its output (or error), what it chose and its note,
    every piece of text from the model or the library shown as written."""
    if o.error:
        return f"**{md(o.method)}**\n\n⚠️ {md(o.error)}"
    extra = ""
    tr = (o.info.get("trace") or [{}])[0] if o.info else {}
    if "attributes" in tr:
        extra = f"\n\n*attributes:* {md(', '.join(map(str, tr['attributes'])))}"
    elif "retrieved" in tr:
        extra = f"\n\n*retrieved items:* {md(', '.join(map(str, tr['retrieved'])))}"
    if o.info and o.info.get("note"):
        extra += f"\n\n*note:* {md(o.info['note'])}"
    return (f"**{md(o.method)}** · {o.latency_s:.2f} s · {o.n_tokens} tok · {o.tokens_per_s:.1f} tok/s\n\n"
            f"{md(o.text) if o.text else '*(empty output)*'}{extra}")


VERSION_COLUMNS = ("version", "created", "source", "note", "votes", "helps", "current")


def refine_md(res: dict, method: str, up: bool) -> str:
    """After a thumb: what was refitted, and CARD's output for the same prompt before and after."""
    return (f"{'👍' if up else '👎'} on **{md(method)}**: {md(res['message'])}\n\n"
            f"**CARD before:** {md(res['before']) if res.get('before') else '*(not shown before)*'}\n\n"
            f"**CARD after:** {md(res['after']) if res.get('after') else '*(empty output)*'}")


def pair_md(label: str, output: str) -> str:
    """One side of a blind pair in Rate."""
    return f"**{label}**\n\n{md(output) if output else '*(empty)*'}"


def cluster_examples_md(examples) -> str:
    """(population user, one of their texts) pairs under My cluster."""
    if not examples:
        return ""
    return "**Texts from your cluster:**\n" + "\n".join(f"- *{md(u)}*: {md(t)}" for u, t in examples)


# ---------------------------------------------------------------- the app

def k_label(ks) -> str:
    return f"Cluster count K (snaps to a built value: {', '.join(map(str, ks))})"


def template_label(task_name: str) -> str:
    return f"wrap in the {task_name} task template"


def build_app(studio: Studio) -> gr.Blocks:
    s0 = studio.engine.cfg.decoding
    ks = studio.ks
    task_names = sorted(TASKS)

    with gr.Blocks(title="Personalization studio", analytics_enabled=False) as app:
        header = Markdown(studio.header(), elem_id="header")
        with gr.Row():
            user = gr.Textbox(label="User name", placeholder="e.g. ana", elem_id="user-name", scale=2)
            stored = gr.Dropdown(choices=[u["name"] for u in studio.store.users()], label="…or open a stored user",
                                 value=None, elem_id="stored-users", scale=2)
        user_k = gr.State(studio.engine.cfg.default_k)
        shown_for = gr.State(None)  # whose saved history the text box holds (None: a fresh paste, or nothing)

        # ------------------------------------------------ My writing
        with gr.Tab("My writing", id="writing"):
            with gr.Row():
                task = gr.Dropdown(task_names, value=studio.task.name, label="Task", elem_id="task")
                demo_user = gr.Dropdown(sorted(studio.demo_users), label="Demo user", value=None, elem_id="demo-user")
                load_demo = gr.Button("Load demo user", elem_id="load-demo")
            history = gr.Textbox(lines=10, max_lines=20, label="Your writing history (one item per line, or blocks "
                                 "separated by a blank line)", elem_id="history")
            upload = gr.File(label="…or upload .txt / .jsonl / .csv / LaMP questions .json",
                             file_types=[".txt", ".jsonl", ".csv", ".json"], elem_id="upload")
            save = gr.Button("Save history", variant="primary", elem_id="save-history")
            writing_status = Markdown(elem_id="writing-status")
            items = gr.Dataframe(headers=["id", "text", "neutral rewrite"], interactive=False, label="Stored items",
                                 elem_id="items")
            with gr.Row():
                item_id = gr.Number(label="Item id", precision=0, elem_id="item-id")
                item_text = gr.Textbox(label="New text", elem_id="item-text", scale=3)
                edit = gr.Button("Update item", elem_id="update-item")
                delete = gr.Button("Delete item", variant="stop", elem_id="delete-item")
            with gr.Accordion("Forget me", open=False, elem_id="forget-box"):
                Markdown("Deletes everything the studio keeps of this user: history, styles and their versions, "
                         "votes, generated outputs, EXACT memory, OPPU adapter and exports that hold them. Ratings "
                         "keep only their verdict (no texts, no name).")
                with gr.Row():
                    forget_ok = gr.Checkbox(label="Yes, delete everything of this user", elem_id="forget-confirm")
                    forget_btn = gr.Button("Forget me", variant="stop", elem_id="forget-button")
                forget_status = Markdown(elem_id="forget-status")

        # ------------------------------------------------ My cluster
        with gr.Tab("My cluster", id="cluster") as cluster_tab:
            k_slider = gr.Slider(min(ks), max(ks), value=studio.engine.cfg.default_k, step=1, label=k_label(ks),
                                 elem_id="k-slider")
            cluster_status = Markdown(elem_id="cluster-status")
            cluster_examples = Markdown(elem_id="cluster-examples")
            cluster_plot = gr.Plot(elem_id="cluster-plot")

        # ------------------------------------------------ Fit my style
        with gr.Tab("Fit my style", id="fit"):
            Markdown("Fits your style on your history: neutral rewrites of pasted items (started when you "
                     "saved), one teacher-forced pass of your cluster's model, then milliseconds to fit your user "
                     "vector λ (128 numbers) jointly with a sparse bias over the words you use, beside a memory "
                     "of what you wrote after each state of that pass.")
            fit_btn = gr.Button("Fit my style", variant="primary", elem_id="fit-button")
            fit_status = Markdown(elem_id="fit-status")
            fit_plot = gr.Plot(elem_id="fit-plot")
            Markdown("**Versions of your style.** Every fit and every vote (👍 / 👎 in *Compare*, votes on your "
                     "outputs in *Rate*) refits your style and keeps the new version; any version can be restored.")
            versions = gr.Dataframe(headers=list(VERSION_COLUMNS), interactive=False, elem_id="versions")
            with gr.Row():
                version_id = gr.Number(label="Version", precision=0, elem_id="version-id")
                restore_btn = gr.Button("Restore this version", elem_id="restore-version")
                versions_btn = gr.Button("Refresh", elem_id="versions-refresh")
            Markdown("**Your style key**: your fitted style (λ and word bias), your clusters and this build's id in "
                     "one line of text, nothing of your writing. Keep it, or paste it into another studio that serves "
                     "the same build.")
            with gr.Row():
                key_btn = gr.Button("Show my style key", elem_id="key-export")
                key_import_btn = gr.Button("Import the key below", elem_id="key-import")
            style_key = gr.Textbox(label="Style key", lines=3, max_lines=6, buttons=["copy"], elem_id="style-key")
            owner_status = Markdown(elem_id="owner-status")

        # ------------------------------------------------ Compare
        with gr.Tab("Compare", id="compare"):
            with gr.Row():
                prompt = gr.Textbox(label="Prompt", lines=2, elem_id="prompt", scale=3)
                use_template = gr.Checkbox(value=True, label=template_label(studio.task.name), elem_id="use-template")
            with gr.Row():
                item_pick = gr.Dropdown([], label="…or a history item as the prompt (its text is the reference)",
                                        value=None, elem_id="item-pick", scale=3)
                reference = Markdown(elem_id="reference")
            methods = gr.CheckboxGroup(list(ALL_METHODS), value=list(DEFAULT_METHODS), label="Methods",
                                       elem_id="methods")
            with gr.Row():
                alpha = gr.Slider(0, 4, value=s0.alpha, step=0.1, label="Strength α (0 = the cluster model)",
                                  elem_id="alpha")
                top_k = gr.Slider(1, 200, value=s0.top_k, step=1, label="Top-k candidates", elem_id="top-k")
                max_tokens = gr.Slider(4, 128, value=s0.max_new_tokens, step=1, label="Max new tokens",
                                       elem_id="max-tokens")
            compare_btn = gr.Button("Generate", variant="primary", elem_id="compare-button")
            compare_status = Markdown(elem_id="compare-status")
            outs, cols, thumbs = {}, {}, {}
            with gr.Row(equal_height=True):
                for m in ALL_METHODS:
                    with gr.Column(min_width=180, visible=m in DEFAULT_METHODS) as cols[m]:
                        outs[m] = Markdown(f"**{m}**", elem_id=f"out-{m}", elem_classes="method-out",
                                           visible=m in DEFAULT_METHODS)
                        with gr.Row():
                            thumbs[m, True] = gr.Button("👍 like me", size="sm", elem_id=f"up-{m}")
                            thumbs[m, False] = gr.Button("👎 not me", size="sm", elem_id=f"down-{m}")
            refine_status = Markdown(elem_id="refine-status")

        # ------------------------------------------------ Why
        with gr.Tab("Why", id="why"):
            Markdown("CARD token by token for the Compare prompt and settings: tokens the user vector changed "
                     "are marked *changed* (the cluster model would have picked another one).")
            why_btn = gr.Button("Explain CARD's output", variant="primary", elem_id="why-button")
            why_status = Markdown(elem_id="why-status")
            why_tokens = gr.HighlightedText(label="CARD output", color_map={"changed": "orange", "kept": "lightgray"},
                                            show_legend=True, elem_id="why-tokens")
            why_step = gr.Slider(0, 1, value=0, step=1, label="Step", elem_id="why-step")
            why_plot = gr.Plot(elem_id="why-plot")
            why_state = gr.State({})

        # ------------------------------------------------ Rate
        with gr.Tab("Rate", id="rate"):
            Markdown("Blind comparison: two methods drawn at random, in random order, names hidden until you vote.")
            with gr.Row():
                rater = gr.Textbox(label="Rater id", elem_id="rater")
                rate_prompt = gr.Textbox(label="Prompt (empty: the Compare prompt)", elem_id="rate-prompt", scale=3)
            rate_methods = gr.CheckboxGroup(list(ALL_METHODS), value=list(DEFAULT_METHODS),
                                            label="Methods to draw from", elem_id="rate-methods")
            new_pair = gr.Button("New pair", variant="primary", elem_id="new-pair")
            with gr.Row(equal_height=True):
                out_a = Markdown("**A**", elem_id="out-a", elem_classes="method-out")
                out_b = Markdown("**B**", elem_id="out-b", elem_classes="method-out")
            with gr.Row():
                vote_btns = {eid: gr.Button(label, elem_id=eid) for eid, (_, label) in VOTES.items()}
            vote_status = Markdown(elem_id="vote-status")
            pair_id = gr.State(None)

        # ------------------------------------------------ Leaderboard
        with gr.Tab("Leaderboard", id="leaderboard") as lb_tab:
            lb_refresh = gr.Button("Refresh", elem_id="lb-refresh")
            lb_status = Markdown(elem_id="lb-status")
            lb_table = gr.Dataframe(headers=["method", "strength", "lower", "upper", "votes", "wins", "losses", "ties"],
                                    interactive=False, elem_id="lb-table")
            with gr.Row():
                lb_plot = gr.Plot(elem_id="lb-plot")
                lb_heat = gr.Plot(elem_id="lb-heat")

        # ------------------------------------------------ Export
        with gr.Tab("Export", id="export"):
            with gr.Row():
                exp_buttons = {(t, f): gr.Button(f"{t} as {f.upper()}", elem_id=f"export-{t}-{f}")
                               for t in ("votes", "generations") for f in ("jsonl", "csv")}
            with gr.Row():
                pred_method = gr.Dropdown(list(ALL_METHODS), value="card", label="Method", elem_id="pred-method")
                pred_btn = gr.Button("Generations as LaMP predictions", elem_id="export-predictions")
            export_status = Markdown(elem_id="export-status")
            export_file = gr.File(label="Download", elem_id="export-file", interactive=False)

        # ------------------------------------------------ Explore
        with gr.Tab("Explore", id="explore"):
            Markdown("Sweeps α and K for the user: λ is refitted without the held-out items (nothing stored), "
                     "then CARD and the cluster model generate for their prompts; ROUGE-L against your own texts.")
            with gr.Row():
                alphas = gr.Textbox("0, 0.5, 1, 2, 4", label="α values", elem_id="alphas")
                n_hold = gr.Slider(1, 12, value=4, step=1, label="Held-out items", elem_id="n-holdout")
            explore_btn = gr.Button("Run sweep", variant="primary", elem_id="explore-button")
            explore_status = Markdown(elem_id="explore-status")
            with gr.Row():
                explore_alpha = gr.Plot(elem_id="explore-alpha")
                explore_k = gr.Plot(elem_id="explore-k")
            explore_table = gr.Dataframe(headers=["sweep", "value", "method", "ROUGE-L", "words"], interactive=False,
                                         elem_id="explore-table")

        # ================================================ handlers
        item_rows = studio.item_rows

        def item_choices(name):
            return gr.update(choices=[(f"{r[0]}: {r[1][:80]}", r[0]) for r in studio.item_rows(name)], value=None)

        def load_demo_fn(demo, name):
            if not demo:
                raise ValueError("pick a demo user first")
            return studio.demo_history(demo), (name or demo), "", None  # the box holds a fresh, unsaved history

        load_demo.click(guarded(4, 2)(load_demo_fn), [demo_user, user], [history, user, writing_status, shown_for])

        def user_fn(name, owner):
            res = studio.switch_user(name, owner)
            message = md_quoting(res["message"], (name or "").strip())  # the library's line quotes the name
            return (("" if res["clear"] else gr.skip()), res["rows"], item_choices(name), message,
                    res["shown_for"], "")  # the Fit page no longer shows the previous person's fit

        user.input(user_fn, [user, shown_for], [history, items, item_pick, writing_status, shown_for, fit_status],
                   concurrency_limit=None, trigger_mode="always_last", show_progress="hidden")

        def served():
            """The widgets that depend on the build being served (after a switch, or on a page load)."""
            s, ks_ = studio.engine.cfg.decoding, studio.ks
            k0 = studio.engine.cfg.default_k
            return (studio.header(), gr.update(minimum=min(ks_), maximum=max(ks_), value=k0, label=k_label(ks_)), k0,
                    s.alpha, s.top_k, s.max_new_tokens, gr.update(label=template_label(studio.task.name)),
                    gr.update(choices=sorted(studio.demo_users), value=None))

        served_outputs = [header, k_slider, user_k, alpha, top_k, max_tokens, use_template, demo_user]

        @guarded(1 + len(served_outputs))
        def task_fn(task_name):
            res = studio.switch_task(task_name)
            if not res["switched"]:
                return (res["message"], *[gr.skip()] * len(served_outputs))
            return (res["message"], *served())

        task.input(task_fn, [task], [writing_status, *served_outputs], concurrency_id="model", api_name="switch_task")

        @guarded(5)
        def save_fn(name, text, file, task_name, demo):
            name = _need_user(name)
            if file:
                parsed = studio.parse(file=file)
            elif demo and text.strip() == studio.demo_history(demo).strip():
                parsed = studio.demo_items(demo)  # the demo user's prompts come along with their texts
            else:
                parsed = studio.parse(text=text)
            res = studio.save_history(name, parsed, task_name)
            return studio.save_message({**res, "name": md(res["name"])}), item_rows(res["name"]), \
                gr.update(choices=[u["name"] for u in studio.store.users()]), item_choices(res["name"]), res["name"]

        save_event = save.click(save_fn, [user, history, upload, task, demo_user],
                                [writing_status, items, stored, item_pick, shown_for], api_name="save_history")

        @guarded(3)
        def edit_fn(name, iid, text):
            name = _need_user(name)
            if iid is None:
                raise ValueError("enter the id of the item to change (first column of the table)")
            if int(iid) not in {s.id for s in studio.store.items(name)}:
                raise ValueError(f"item {int(iid)} is not one of {name}'s items")
            studio.store.update_item(int(iid), text)
            return f"Item {int(iid)} updated. Refit to use it.", item_rows(name), item_choices(name)

        @guarded(3)
        def delete_fn(name, iid):
            name = _need_user(name)
            if iid is None or int(iid) not in {s.id for s in studio.store.items(name)}:
                raise ValueError("enter the id of one of this user's items")
            if len(studio.store.items(name)) <= 1:
                raise ValueError("this is the user's last item: a user needs at least one")
            studio.store.delete_item(int(iid))
            return f"Item {int(iid)} deleted. Refit to forget it.", item_rows(name), item_choices(name)

        edit.click(edit_fn, [user, item_id, item_text], [writing_status, items, item_pick])
        delete.click(delete_fn, [user, item_id], [writing_status, items, item_pick])

        @guarded(7)
        def open_user(name):
            if not name:
                return (gr.skip(),) * 7
            u = studio.store.user(name)
            # the text box is emptied: it held someone else's text (the opened user's items are in the table)
            return (f"Opened **{md(u['name'])}** ({u['n_items']} items, task {md(u['task'])}).", name,
                    item_rows(name), item_choices(name), u["task"], "", None)

        stored.change(open_user, [stored], [writing_status, user, items, item_pick, task, history, shown_for])

        # My cluster
        @guarded(5)
        def cluster_fn(name, k, previous=None):
            k = studio.snap_k(k, previous)
            m = studio.population_map(name.strip() if name and name.strip() else None, k)
            if not name or not name.strip():
                return "Enter a user name and save a history to see where you fall.", "", cluster_figure(m), k, k
            st = studio.user_state(_need_user(name), k)
            ex = studio.cluster_examples(k, st.cluster)
            return studio.cluster_summary(replace(st, name=md(st.name))), cluster_examples_md(ex), \
                cluster_figure(m), k, k

        cluster_outputs = [cluster_status, cluster_examples, cluster_plot, user_k, k_slider]
        # `input` fires for the keyboard (arrow keys, the number box) as well as the mouse; `release` is mouse-only.
        # Only the last of a burst of steps is run; the K the slider came from sets the direction of the snap.
        k_slider.input(cluster_fn, [user, k_slider, user_k], cluster_outputs, trigger_mode="always_last",
                       api_name="cluster")
        save_event.then(cluster_fn, [user, k_slider], cluster_outputs)
        cluster_tab.select(cluster_fn, [user, k_slider], cluster_outputs)
        stored.change(cluster_fn, [stored, k_slider], cluster_outputs)

        def versions_fn(name):
            try:
                return [[r[c] for c in VERSION_COLUMNS] for r in studio.versions(_need_user(name))]
            except EXPECTED:
                return []

        # Fit
        def fit_fn(name, k, progress=gr.Progress()):
            try:
                name = _need_user(name)
                stages = ["assign", "neutral rewrites", "negatives", "features", "fit"]
                progress(0, desc="starting")
                t0 = time.perf_counter()
                fit = studio.fit(name, k, progress=lambda st: progress(
                    (stages.index(st) if st in stages else 0) / len(stages), desc=st))
                total = time.perf_counter() - t0
            except EXPECTED as e:
                return _err(e) + " (the stored vector, if any, is unchanged)", gr.skip()
            lines = [f"Fitted **{md(name)}** in **{total:.2f} s** ({fit.n_items} items, cluster {fit.cluster} of "
                     f"K = {fit.k}, objective {fit.objective}).", "", "| stage | seconds |", "|---|---|"]
            waited = total - fit.total_s
            if waited > 0.5:  # the model was busy: the rewrites started at Save (or another person's request)
                lines.append(f"| waiting for the model (neutral rewrites started at Save) | {waited:.3f} |")
            lines += [f"| {s} | {v:.3f} |" for s, v in fit.stages_s.items()]
            d = fit.diagnostics
            if not fit.cold_start:  # the answer first, in plain words: does the vector beat the cluster model?
                lines.insert(1, f"\n**{fit_verdict(d, fallback=studio.engine.cfg.style.fallback)}**\n")
            if fit.cold_start:
                lines.append(f"\n**Cold start**: fewer than {studio.engine.cfg.min_fit_items} items, so λ = 1 "
                             "(your cluster's shared head). Add more writing and refit.")
            elif d.get("n"):
                lines.append(f"\nHeld-out accuracy ({d.get('unit', 'tokens')}, n = {d['n']}): own style "
                             f"**{d.get('acc_own', float('nan')):.3f}**"
                             + (f", λ = 1 {d['acc_ones']:.3f}" if "acc_ones" in d else "")
                             + (f", other users' λ {d['acc_other']:.3f}" if "acc_other" in d else "")
                             + (f", no head {d['acc_no_head']:.3f}" if "acc_no_head" in d else "")
                             + (f", likelihood rule {d['acc_logprob_rule']:.3f}" if "acc_logprob_rule" in d else "")
                             + (f", γ·Δlogp alone {d['acc_covariate_only']:.3f}" if "acc_covariate_only" in d else "")
                             + (f"; user-specificity gap {d['specificity_gap']:+.4f}" if "specificity_gap" in d else ""))
            vec = studio.store.vector_bytes(name, studio.engine.artifacts_id)
            lines.append(f"\nStored: {vec} bytes.")
            return "\n".join(lines), (loss_figure(fit.loss_curve) if fit.loss_curve else None)

        fit_btn.click(fit_fn, [user, user_k], [fit_status, fit_plot], concurrency_id="model", api_name="fit").then(
            versions_fn, [user], [versions])

        def restore_fn(name, vid):
            try:
                if vid is None:
                    raise ValueError("enter the number of the version to restore (first column of the table)")
                msg = studio.restore_version(_need_user(name), int(vid))
            except EXPECTED as e:
                return _err(e), gr.skip()
            return md(msg), versions_fn(name)

        restore_btn.click(restore_fn, [user, version_id], [owner_status, versions])
        versions_btn.click(versions_fn, [user], [versions])

        def key_fn(name):
            try:
                key = studio.style_key(_need_user(name))
            except EXPECTED as e:
                return _err(e), gr.skip()
            return f"Your style key ({len(key)} characters): copy it with the button in the box.", key

        def key_import_fn(name, text):
            try:
                res = studio.import_style_key(text, (name or "").strip() or None)
            except EXPECTED as e:
                return _err(e), gr.skip()
            return (f"Imported the key's style for **{md(res['user'])}** as version {res['versions'][-1]}"
                    + (f" ({res['trimmed']} smallest word-bias entries were left out of the key)." if res["trimmed"]
                       else ".")), versions_fn(res["user"])

        key_btn.click(key_fn, [user], [owner_status, style_key])
        key_import_btn.click(key_import_fn, [user, style_key], [owner_status, versions])

        def forget_fn(name, ok):
            try:
                name = _need_user(name)
                if not ok:
                    raise ValueError("tick the box to confirm: forgetting cannot be undone")
                res = studio.forget(name)
            except EXPECTED as e:
                return _err(e), gr.skip(), gr.skip(), gr.skip()
            gone = sum(v for k_, v in res.items() if isinstance(v, int) and k_ != "ratings_anonymised")
            return (f"Forgot **{md(name)}**: {gone} stored rows deleted, {res['ratings_anonymised']} rating(s) kept "
                    f"without texts or name, {len(res['files'])} file(s) removed, database compacted.",
                    False, [], gr.update(choices=[u["name"] for u in studio.store.users()], value=None))

        forget_btn.click(forget_fn, [user, forget_ok], [forget_status, forget_ok, items, stored],
                         concurrency_id="model")

        # Compare
        def resolve_prompt(text, templated, item):
            if item is not None and (not text or not text.strip()):
                st = next((s for s in studio.store.items_by_id([int(item)])), None)
                if st is None:
                    raise ValueError("that history item no longer exists")
                return st.x or studio.task.prompt(st.neutral or st.y), st.y
            text = studio.check_prompt(text)
            return (studio.task.prompt(text) if templated else text), None

        def pick_item(item):
            if item is None:
                return ""
            st = next(iter(studio.store.items_by_id([int(item)])), None)
            return "" if st is None else f"**Reference (your text):**\n\n{md(st.y)}"

        item_pick.change(pick_item, [item_pick], [reference])

        def compare_fn(name, text, templated, item, chosen, a, k_, mt, k):
            hidden = {m: gr.update(visible=m in (chosen or [])) for m in ALL_METHODS}
            try:
                name = _need_user(name)
                if not chosen:
                    raise ValueError("choose at least one method")
                full, _ = resolve_prompt(text, templated, item)
                s = studio.settings(a, k_, mt)
                state = studio.user_state(name, k)
            except EXPECTED as e:
                yield (_err(e), *hidden.values())
                return
            note = "" if state.fitted else " (not fitted yet: CARD uses λ = 1, your cluster's shared head)"
            pending = {m: gr.update(value=f"**{m}**\n\n*waiting…*", visible=True) for m in chosen}
            if "exact" in chosen and studio.needs_indexing(name, "exact"):
                pending["exact"] = gr.update(value=f"**exact**\n\n*first use: searching attributes for your "
                                             f"{studio.cfg.exact_pairs} newest history items (about half a minute "
                                             "each on a 2-core CPU); later prompts reuse them…*", visible=True)
            if "oppu" in chosen and studio.needs_indexing(name, "oppu"):
                pending["oppu"] = gr.update(value="**oppu**\n\n*first use: training your own LoRA on your history "
                                            "(about 40 s on a 2-core CPU); later prompts reuse it…*", visible=True)
            yield (f"Generating {len(chosen)} methods for **{md(name)}**, cluster {state.cluster} of K = {state.k}"
                   f"{note}…",
                   *[pending.get(m, hidden[m]) for m in ALL_METHODS])
            done = {}
            order = sorted(chosen, key=lambda m: studio.needs_indexing(name, m))  # slow first uses go last
            for o in studio.compare(name, full, order, s, k):
                done[o.method] = gr.update(value=method_md(o), visible=True)
                yield (f"{len(done)}/{len(chosen)} done{note}.",
                       *[done.get(m, pending.get(m, hidden[m])) for m in ALL_METHODS])
            yield (f"Done: {len(chosen)} methods for **{md(name)}**{note}. Prompt: {md(full, limit=200)}",
                   *[done.get(m, hidden[m]) for m in ALL_METHODS])

        compare_btn.click(compare_fn, [user, prompt, use_template, item_pick, methods, alpha, top_k, max_tokens, user_k],
                          [compare_status, *outs.values()], concurrency_id="model", api_name="compare")

        methods.change(lambda chosen: [gr.update(visible=m in (chosen or [])) for m in ALL_METHODS], [methods],
                       list(cols.values()))

        def thumb_fn(method, up):
            def fn(name, a, k_, mt, k):
                try:
                    res = studio.thumb_column(_need_user(name), method, up, studio.settings(a, k_, mt), k)
                except EXPECTED as e:
                    return _err(e), gr.skip()
                if res["version"] is None:
                    return md(res["message"]), gr.skip()
                return refine_md(res, method, up), versions_fn(name)
            return fn

        for (m, up), btn in thumbs.items():
            btn.click(thumb_fn(m, up), [user, alpha, top_k, max_tokens, user_k], [refine_status, versions],
                      concurrency_id="model")

        # Why
        def why_fn(name, text, templated, item, a, k_, mt, k):
            try:
                name = _need_user(name)
                full, _ = resolve_prompt(text, templated, item)
                res = studio.why(name, full, studio.settings(a, k_, mt), k)
            except EXPECTED as e:
                return _err(e), gr.skip(), gr.skip(), gr.skip(), gr.skip()
            steps = res["steps"]
            changed = sum(st["changed"] for st in steps)
            tokens = [(text, "changed" if changed_ else "kept") for text, changed_ in res["pieces"]]
            status = (f"α = {res['alpha']}, cluster {res['cluster']} of K = {res['k']}"
                      f"{'' if res['fitted'] else ', λ = 1 (not fitted)'}: the user vector changed **{changed}** of "
                      f"{len(steps)} tokens. Output: {md(res['text'])}")
            first = next((i for i, st in enumerate(steps) if st["changed"]), 0)
            return (status, tokens, gr.update(maximum=max(len(steps) - 1, 1), value=first),
                    step_figure(steps[first]) if steps else None, res)

        why_btn.click(why_fn, [user, prompt, use_template, item_pick, alpha, top_k, max_tokens, user_k],
                      [why_status, why_tokens, why_step, why_plot, why_state], concurrency_id="model")

        def why_step_fn(i, res):
            steps = (res or {}).get("steps") or []
            if not steps:
                return gr.skip()
            return step_figure(steps[min(int(i), len(steps) - 1)])

        why_step.release(why_step_fn, [why_step, why_state], [why_plot])

        # Rate
        def logged_in(request: gr.Request | None) -> str | None:
            return getattr(request, "username", None) if request is not None else None

        def new_pair_fn(name, typed, text, chosen, cmp_text, templated, a, k_, mt, k, request: gr.Request):
            try:
                name = _need_user(name)
                rater_name = rater_id(typed, logged_in(request))
                src = text if text and text.strip() else cmp_text
                full = studio.check_prompt(src)
                full = studio.task.prompt(full) if templated and not full.startswith(studio.task.prefix) else full
                pair = studio.new_pair(name, full, chosen or [], studio.settings(a, k_, mt), k)
            except EXPECTED as e:
                return _err(e), gr.skip(), gr.skip(), None
            seen = studio.store.has_rating(rater_name, *pair.gen_ids)
            return (f"Prompt: {md(pair.prompt, limit=300)} — which output fits **{md(name)}**'s style better?"
                    + (f"\n\n⚠️ **{md(rater_name)}** already voted on these two outputs (one vote per rater and "
                       "pair): draw again, or change the prompt or settings." if seen else ""),
                    pair_md("A", pair.outputs[0]), pair_md("B", pair.outputs[1]), pair.id)

        new_pair.click(new_pair_fn, [user, rater, rate_prompt, rate_methods, prompt, use_template, alpha, top_k,
                                     max_tokens, user_k], [vote_status, out_a, out_b, pair_id], concurrency_id="model",
                       api_name="new_pair")

        def vote_fn(winner):
            def fn(pid, typed, request: gr.Request):
                try:
                    rater_name = rater_id(typed, logged_in(request))  # with --auth: the logged-in user, always
                    pair, rid = studio.vote(pid, winner, rater_name)
                except EXPECTED as e:
                    return _err(e), gr.skip()
                label = {"a": "A", "b": "B", "tie": "tie", "both_bad": "both bad"}[winner]
                return (f"Vote #{rid} stored ({label}, rater {md(rater_name)}). **A was {md(pair.methods[0])}, "
                        f"B was {md(pair.methods[1])}.** Draw a new pair to go on.", None)
            return fn

        for eid, btn in vote_btns.items():
            btn.click(vote_fn(VOTES[eid][0]), [pair_id, rater], [vote_status, pair_id], concurrency_limit=None,
                      api_name=eid.replace("-", "_"))

        def rater_box(request: gr.Request):
            """With --auth the rater id is the logged-in user name: shown, and not editable."""
            who = logged_in(request)
            if not who:
                return gr.skip()
            return gr.update(value=who, interactive=False, label="Rater id (the user you logged in as)")

        # Leaderboard
        def lb_fn():
            lb = studio.leaderboard()
            if not lb["methods"]:
                return "No votes yet: cast some in *Rate*.", [], None, None
            bt, heat = leaderboard_figures(lb)
            rows = [[r[c] for c in ("method", "strength", "lower", "upper", "votes", "wins", "losses", "ties")]
                    for r in lb["methods"]]
            n = lb["n_votes"]
            return f"{n} vote{'' if n == 1 else 's'} between {len(rows)} methods.", rows, bt, heat

        lb_refresh.click(lb_fn, None, [lb_status, lb_table, lb_plot, lb_heat], concurrency_limit=None)
        lb_tab.select(lb_fn, None, [lb_status, lb_table, lb_plot, lb_heat], concurrency_limit=None)

        # Export
        folder = Path(studio.cfg.export_dir)

        def export_fn(table, fmt):
            @guarded(2)
            def fn():
                path, n = export_table(studio.store, table, fmt, folder / time.strftime("%Y%m%d-%H%M%S"))
                return f"Exported {table} ({n} rows) to `{path}`.", str(path)
            return fn

        for (t, f), btn in exp_buttons.items():
            btn.click(export_fn(t, f), None, [export_status, export_file], concurrency_limit=None)

        @guarded(2)
        def pred_fn(method):
            path = export_predictions(studio.store, TASKS[studio.task.name].lamp_name, method,
                                      folder / time.strftime("%Y%m%d-%H%M%S"))
            return f"Exported {md(method)}'s generations as LaMP predictions to `{path}`.", str(path)

        pred_btn.click(pred_fn, [pred_method], [export_status, export_file], concurrency_limit=None)

        # Explore
        def explore_fn(name, alpha_text, n, a, k_, mt, progress=gr.Progress()):
            try:
                name = _need_user(name)
                try:
                    values = [float(v) for v in alpha_text.replace(";", ",").split(",") if v.strip()]
                except ValueError:
                    raise ValueError(f"α values must be numbers separated by commas, got {alpha_text!r}") from None
                if len(values) > 12:
                    raise ValueError("at most 12 α values per sweep")
                progress(0, desc="fitting λ without the held-out items")
                res = studio.explore(name, values, int(n), studio.settings(a, k_, mt),
                                     progress=lambda f, d: progress(f, desc=d))
            except EXPECTED as e:
                return _err(e), gr.skip(), gr.skip(), gr.skip()
            fa, fk = explore_figures(res)
            rows = [["α", r["alpha"], "card", r["rougeL"], r["length"]] for r in res["alpha"]]
            rows += [["K", r["k"], r["method"], r["rougeL"], r["length"]] for r in res["k"]]
            best = max(res["alpha"], key=lambda r: r["rougeL"])
            return (f"Held out {len(res['golds'])} items, λ fitted on {res['n_fit']}. Best α here: "
                    f"**{best['alpha']}** (ROUGE-L {best['rougeL']:.3f}); few items, so read it as a hint.",
                    fa, fk, rows)

        explore_btn.click(explore_fn, [user, alphas, n_hold, alpha, top_k, max_tokens],
                          [explore_status, explore_alpha, explore_k, explore_table], concurrency_id="model")

        app.load(lambda: gr.update(choices=[u["name"] for u in studio.store.users()]), None, [stored])
        app.load(rater_box, None, [rater], show_progress="hidden")
        # a page opened after a switch (in another session) shows the build now served
        app.load(lambda: (*served(), studio.task.name), None, [*served_outputs, task])
    app.queue(default_concurrency_limit=1)
    return app


# ---------------------------------------------------------------- start-up

def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


AUTH_HELP = ("raters who may log in: USER:PASSWORD, several separated by commas (u1:p1,u2:p2), or @FILE with one "
             "USER:PASSWORD a line (blank lines and # comments skipped; use a file when a password holds a comma); "
             "or env STUDIO_AUTH. Required when --host is not a loopback address. With it, a vote counts under the "
             "logged-in user name (the Rate tab's rater id is that name, not editable) and each rater votes once "
             "per pair of outputs")


def parse_auth(value: str | None) -> list[tuple[str, str]] | None:
    """--auth as Gradio's launch(auth=...) takes it: [(user, password), ...]; None when not given. The password
    is everything after an entry's first colon; whitespace around an entry is ignored. Errors never echo a
    password."""
    if not value or not value.strip():
        return None
    value = value.strip()
    if value.startswith("@"):
        path = Path(value[1:]).expanduser()
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise SystemExit(f"error: --auth {value}: cannot read {path} ({e.__class__.__name__})") from None
        entries = [(f"{path} line {i}", line.strip()) for i, line in enumerate(text.splitlines(), 1)
                   if line.strip() and not line.strip().startswith("#")]
        if not entries:
            raise SystemExit(f"error: --auth {value}: no USER:PASSWORD line in {path}")
    else:
        entries = [(f"entry {i}", e.strip()) for i, e in enumerate(value.split(","), 1)]
    pairs: dict[str, str] = {}
    for where, entry in entries:
        user, sep, password = entry.partition(":")
        user = user.strip()  # Gradio's login form strips the user name too
        if not sep or not user or not password:
            raise SystemExit(f"error: --auth must be USER:PASSWORD[,USER:PASSWORD...] or @FILE; {where} is not")
        if user in pairs:
            raise SystemExit(f"error: --auth names the user {user!r} twice ({where})")
        pairs[user] = password
    return list(pairs.items())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="The personalization studio (Gradio).")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: this machine only)")
    p.add_argument("--port", type=int, default=7860)
    p.add_argument("--db", default="data/studio.db")
    p.add_argument("--artifacts", default="data/artifacts/demo", help="CARD artifacts (the demo is built if missing)")
    p.add_argument("--demo-data", default="data/demo")
    p.add_argument("--auth", default=os.environ.get("STUDIO_AUTH"), metavar="USER:PASSWORD[,...] | @FILE",
                   help=AUTH_HELP)
    a = p.parse_args(argv)
    auth = parse_auth(a.auth)
    if not _loopback(a.host) and auth is None:
        print(f"error: --host {a.host} shares the studio beyond this machine; give --auth USER:PASSWORD",
              file=sys.stderr)
        return 2
    from personalize.cli import DEMO_ARTIFACTS, ensure_demo

    t0 = time.perf_counter()
    try:
        if Path(a.artifacts).resolve() == Path(DEMO_ARTIFACTS).resolve():
            ensure_demo(Path(a.demo_data), Path(a.artifacts))
        studio = Studio.load(StudioConfig(artifacts=a.artifacts, db=a.db, demo_data=a.demo_data))
    except EXPECTED as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    app = build_app(studio)
    print(f"ready in {time.perf_counter() - t0:.1f} s: http://{a.host}:{a.port}", flush=True)
    app.launch(server_name=a.host, server_port=a.port, auth=auth, share=False, css=CSS, show_error=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
