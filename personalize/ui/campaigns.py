"""The Campaigns tab: the researcher's side of a human-eval campaign (personalize.campaign).

Create one from a LaMP folder, generate its outputs ahead of rating (progress bar; resumable), watch progress,
read the results (strengths or rubric means with intervals, Krippendorff's α, position bias, each rater against
the others, the LLM judge and its rank correlation with the raters), export, import, close. Handlers are plain
functions of the Studio; the figures are built from `studio.campaigns.results` alone.
"""

from __future__ import annotations

import functools

import gradio as gr
import plotly.graph_objects as go

from personalize.humaneval import campaign_files
from personalize.humaneval.campaign_schema import CRITERIA, DEFAULT_ITEMS, REFERENCE, CampaignConfig
from personalize.humaneval.campaign_report import copies_text, overlap_text
from personalize.display import md, plot_text
from personalize.catalog import ALL_METHODS, CORE_METHODS
from personalize.studio.facade import Studio
from personalize.ui.common import EXPECTED, _err, bind, guarded
from personalize.ui.downloads import hand_out


def _pct(v) -> str:
    return "—" if v is None else f"{v:.0%}"


def _num(v) -> str:
    return "—" if v is None else f"{v:.3f}"


def results_md(res: dict) -> str:
    ag, out = res["agreement"], res["outputs"]
    lines = [f"**{md(res['name'])}** ({res['status']}, {res['mode']}): {res['items']} items; arms "
             f"{', '.join(md(a) for a in res['arms'])}",
             f"Outputs **{out['done']} / {out['total']}** generated · **{res['judgments']}** judgments by "
             f"{res['raters']} rater(s)"]
    if res["mode"] == "pairwise":
        pb = ag["position_bias"]
        kept = ", ".join(f"{md(m['method'])} {m['strength']:.0f} [{m['lower']:.0f}, {m['upper']:.0f}]"
                         for m in res["leaderboard_without_copies"])
        lines.append(f"{copies_text(res)} {kept or 'no votes left'}.")
        lines.append(f"Agreement: Krippendorff's α (nominal) **{_num(ag['krippendorff_alpha'])}** · position bias: "
                     f"A won **{_pct(pb['a_share'])}** of {pb['n']} decided judgments "
                     f"[{_pct(pb['lower'])}, {_pct(pb['upper'])}] (50% = none)")
    else:
        lines.append("Agreement: Krippendorff's α (interval) " + ", ".join(
            f"{c} **{_num(v)}**" for c, v in ag["krippendorff_alpha"].items()))
    lines[-1] += f" · {overlap_text(res)}"
    if res["reference"]:
        lines.append(f"The reference (the person's real text, blinded) ranks **{res['reference']['rank']} of "
                     f"{res['reference']['of']}**.")
    att = res["attention"]
    if att["checks"]:
        lines.append(f"Attention checks (kept out of the figures): {att['checks']}, passed {_pct(att['pass_rate'])}"
                     + "".join(f"; {md(r)} {_pct(v)}" for r, v in att["raters"].items()))
    j = res["judge"]
    if j:
        rc = j["rank_correlation"]
        lines.append(f"LLM judge {md(j['model'])}: {j['judgments']} judgments; rank correlation with the raters "
                     f"Spearman **{_num(rc['spearman'])}**, Kendall **{_num(rc['kendall'])}** over {rc['n']} arms")
    return "\n\n".join(lines)


def results_figure(res: dict) -> go.Figure:
    fig = go.Figure()
    rows = res["leaderboard"]
    if res["mode"] == "pairwise":
        fig.add_scatter(x=[plot_text(r["method"]) for r in rows], y=[r["strength"] for r in rows], mode="markers",
                        name="raters", marker={"size": 13, "color": ["gold" if r["method"] == REFERENCE else
                                                                      "#1f77b4" for r in rows]},
                        error_y={"type": "data", "symmetric": False, "array": [r["upper"] - r["strength"] for r in rows],
                                 "arrayminus": [r["strength"] - r["lower"] for r in rows]})
        title = f"Bradley–Terry strength (Elo scale), 95% bootstrap intervals, {res['judgments']} judgments"
    else:
        for c in CRITERIA:
            fig.add_bar(name=c, x=[plot_text(r["method"]) for r in rows], y=[r[c] for r in rows],
                        error_y={"type": "data", "symmetric": False, "array": [r[c + "_upper"] - r[c] for r in rows],
                                 "arrayminus": [r[c] - r[c + "_lower"] for r in rows]})
        fig.update_layout(barmode="group", yaxis={"range": [0, 5.2]})
        title = f"Mean rubric scores (1–5), 95% bootstrap intervals, {res['judgments']} judgments"
    fig.update_layout(title=title, height=400, margin={"l": 10, "r": 10, "t": 50, "b": 10})
    return fig


def rater_rows(res: dict) -> list[list]:
    att = res["attention"]["raters"]
    return [[r, v["n"], _pct(v["agreement"]), _pct(att.get(r))] for r, v in res["agreement"]["raters"].items()]


@guarded(3)
def show(studio: Studio, name: str | None) -> tuple:
    if not name:
        raise ValueError("choose or create a campaign first")
    res = studio.campaigns.results(name)
    return results_md(res), results_figure(res), rater_rows(res)


@guarded(2)
def create(studio: Studio, name, data, split, sources, limit, methods, reference, mode, per_item, attention,
           min_raters=None) -> tuple:
    overlap = {"min_raters_per_unit": int(min_raters)} if min_raters else {}  # 0 or empty: the default (2)
    c = studio.campaign_desk.create_campaign(name, data, split or "dev", int(limit or 0), methods or [], sources or "",
                                             reference=bool(reference), mode=mode, raters_per_item=int(per_item or 0),
                                             attention_every=int(attention or 0), **overlap)
    names = studio.campaigns.names()
    return (f"Created **{md(c['name'])}**: generate its outputs next (below).",
            gr.update(choices=names, value=c["name"]))


def generate(studio: Studio, name: str | None, progress=gr.Progress()) -> str:
    try:
        if not name:
            raise ValueError("choose a campaign first")
        res = studio.generate_campaign(name, lambda i, n, what: progress((i, n), desc=f"generating: {what}"))
    except EXPECTED as e:
        return _err(e)
    failed = "".join(f"\n- ⚠️ {md(f)}" for f in res["failed"])
    return (f"Generated {res['generated']} output(s) in {res['seconds']} s; outputs {res['outputs']['done']} / "
            f"{res['outputs']['total']}.{failed}")


def judge(studio: Studio, name: str | None, model: str | None, progress=gr.Progress()) -> str:
    try:
        if not name:
            raise ValueError("choose a campaign first")
        res = studio.campaign_desk.judge_campaign(name, (model or "").strip() or None,
                                    lambda i, n, what: progress((i, n), desc=f"LLM judge: {what}"))
    except EXPECTED as e:
        return _err(e)
    return f"The LLM judge ({md(res['judge']['model']) if res['judge'] else 'none'}) has judged the units."


@guarded(1)
def set_status(studio: Studio, status: str, name: str | None) -> str:
    studio.campaign_desk.set_campaign_status(name or "", status)
    return f"Campaign **{md(name)}** is {status}."


@guarded(2)
def export(studio: Studio, name: str | None, fmt: str) -> tuple:
    path, summary, n = studio.campaign_desk.export_campaign(name or "", fmt)
    return f"Exported {n} judgment(s).", hand_out(studio.cfg.page_files, path, summary)


@guarded(1)
def import_file(studio: Studio, name: str | None, file) -> str:
    if not file:
        raise ValueError("choose an exported .jsonl or .csv file")
    res = campaign_files.import_judgments(studio.campaigns, name or "", file)
    return f"Imported {res['added']} judgment(s); {res['duplicates']} were here already, {res['unmatched']} unmatched."


def build(studio: Studio, shared=None) -> None:
    from personalize.ui.common import Markdown

    names = studio.campaigns.names()
    with gr.Tab("Campaigns", id="campaigns") as tab:
        Markdown("A **campaign** is a fixed set of (person, prompt) items whose outputs are generated ahead; raters "
                 "judge them blind in the **Rate** tab. Progress and results are here.")
        with gr.Accordion("New campaign from a LaMP folder", open=not names):
            with gr.Row():
                c_name = gr.Textbox(label="Name", elem_id="campaign-name")
                c_data = gr.Textbox(label="LaMP folder", value=str(studio.cfg.demo_data), elem_id="campaign-data")
                c_split = gr.Textbox(label="Split", value="dev", elem_id="campaign-split")
                c_sources = gr.Textbox(label="Only people from these sources (optional)",
                                       placeholder="e.g. emnlp: the ones the build left out", elem_id="campaign-sources")
                c_limit = gr.Number(label="Items (first N queries)", value=DEFAULT_ITEMS, precision=0, elem_id="campaign-limit")
            with gr.Row():
                c_methods = gr.CheckboxGroup(list(ALL_METHODS), value=list(CORE_METHODS), label="Methods",
                                             elem_id="campaign-methods")
                c_ref = gr.Checkbox(label="The reference (gold) takes part, blinded", value=True,
                                    elem_id="campaign-reference")
                c_mode = gr.Radio(["pairwise", "rubric"], value=CampaignConfig.mode, label="Mode", elem_id="campaign-mode")
                c_per = gr.Number(label="Ratings per unit", value=CampaignConfig.raters_per_item, precision=0,
                                  elem_id="campaign-per-item")
                c_min = gr.Number(label="Raters on a unit before new ones open (agreement needs 2; 0: 2)",
                                  value=0, precision=0, elem_id="campaign-min-raters")
                c_att = gr.Number(label="Attention check every N units (0: none)",
                                  value=CampaignConfig.attention_every, precision=0, elem_id="campaign-attention")
            c_create = gr.Button("Create", variant="primary", elem_id="campaign-create")
        with gr.Row():
            pick = gr.Dropdown(choices=names, value=names[-1] if names else None, label="Campaign",
                               allow_custom_value=True, elem_id="campaign-pick")
            refresh = gr.Button("Refresh results", elem_id="campaign-refresh")
            gen = gr.Button("Generate outputs", elem_id="campaign-generate")
            close = gr.Button("Close", size="sm", elem_id="campaign-close")
            reopen = gr.Button("Reopen", size="sm", elem_id="campaign-open")
        status = Markdown(elem_id="campaign-status")
        summary = Markdown(elem_id="campaign-summary")
        plot = gr.Plot(elem_id="campaign-plot")
        raters = gr.Dataframe(headers=["rater", "shared units", "agrees with the others", "attention passed"],
                              label="Raters", interactive=False, elem_id="campaign-raters")
        with gr.Accordion("LLM judge", open=False):
            j_model = gr.Textbox(label="Judge model (a Hugging Face id or folder; empty: the bundled 135M model, "
                                       "a weak judge)", elem_id="campaign-judge-model")
            j_run = gr.Button("Run the LLM judge", elem_id="campaign-judge")
        with gr.Accordion("Export / import judgments", open=False):
            with gr.Row():
                fmt = gr.Radio(["jsonl", "csv"], value="jsonl", label="Format", elem_id="campaign-format")
                exp = gr.Button("Export", elem_id="campaign-export")
                files = gr.File(label="Judgments and summary", file_count="multiple", elem_id="campaign-files")
            with gr.Row():
                upload = gr.File(label="Judgments exported by another studio", file_types=[".jsonl", ".csv"],
                                 elem_id="campaign-upload")
                imp = gr.Button("Import", elem_id="campaign-import")
    results, shown = [summary, plot, raters], functools.partial(show, studio)
    c_create.click(functools.partial(create, studio),
                   [c_name, c_data, c_split, c_sources, c_limit, c_methods, c_ref, c_mode, c_per, c_att, c_min],
                   [status, pick]
                   ).then(shown, pick, results)
    gen.click(bind(generate, studio), pick, status, concurrency_id="model").then(shown, pick, results)
    j_run.click(bind(judge, studio), [pick, j_model], status, concurrency_id="model").then(shown, pick, results)
    for btn, state in ((close, "closed"), (reopen, "open")):
        btn.click(functools.partial(set_status, studio, state), pick, status).then(shown, pick, results)
    exp.click(functools.partial(export, studio), [pick, fmt], [status, files])
    imp.click(functools.partial(import_file, studio), [pick, upload], status).then(shown, pick, results)
    for trigger in (refresh.click, pick.change, tab.select):
        trigger(shown, pick, results)
