"""The Rate tab: a rater works through a campaign's blinded units (personalize.campaign).

The rater sees the instruction, the person's history (scrollable), the prompt and the blinded output(s), judges
with a button or a key (1/A, 2/B, 3/T tie, 4/X both bad, S skip) and gets the next unit at once from the stored
pool; no model runs here. The rater id is the logged-in user name with --auth, else the id typed in
(arena.rater_id). Every handler is a plain function of the Studio, so tests call them without a server; the
assignment id travels in a hidden number box, so API clients (tests/ui/test_app.py's 20 raters) use the same
endpoints as the page.
"""

from __future__ import annotations

import functools

import gradio as gr

from personalize.humaneval.arena import rater_id
from personalize.humaneval.campaign_schema import CRITERIA, Assignment
from personalize.display import md
from personalize.studio.facade import Studio
from personalize.ui.common import guarded, logged_in, rater_box

VERDICTS = {"campaign-a": ("a", "A is more like them  [1]"), "campaign-b": ("b", "B is more like them  [2]"),
            "campaign-tie": ("tie", "Tie  [3]"), "campaign-bad": ("both_bad", "Both are bad  [4]")}
SHORTCUTS = {"1": "campaign-a", "a": "campaign-a", "2": "campaign-b", "b": "campaign-b", "3": "campaign-tie",
             "t": "campaign-tie", "4": "campaign-bad", "x": "campaign-bad", "s": "campaign-skip"}
# Keys work while the Rate tab is shown and no text box has the focus.
SHORTCUTS_JS = """() => {
  const keys = %s;
  document.addEventListener('keydown', (e) => {
    const t = e.target, tag = (t && t.tagName || '').toLowerCase();
    if (e.ctrlKey || e.metaKey || e.altKey || tag === 'input' || tag === 'textarea' || (t && t.isContentEditable)) return;
    const id = keys[e.key.toLowerCase()];
    const btn = id && document.getElementById(id);
    if (btn && btn.offsetParent !== null) { e.preventDefault(); btn.click(); }
  });
}""" % str(SHORTCUTS).replace("'", '"')
N_OUT, STATUS = 14, 9  # the outputs every handler returns, in this order (see `_view`), and the status line's place


def _view(a: Assignment | None, status: str) -> tuple:
    """(assignment id, progress, instruction, history, prompt, output A, output B, pairwise row, rubric row,
    status, campaign, the three rubric scores) for one unit, or the end of the work when `a` is None. The rubric's
    scores are cleared for every unit, so a rater never submits the previous unit's scores by mistake."""
    cleared = (None,) * len(CRITERIA)
    if a is None:
        hidden = gr.update(visible=False)
        return (None, "", "", "", "", "", "", hidden, hidden, status, gr.skip(), *cleared)
    history = "\n\n".join(f"{i + 1}. {md(h, limit=600)}" for i, h in enumerate(a.history))
    shown = [f"**Output {label}**\n\n{md(text)}" for label, text in zip("AB", a.outputs)]
    pairwise = len(a.outputs) == 2
    return (a.id, f"**{a.done} of {a.total} done** · campaign {md(a.campaign)}",
            f"### {md(a.instruction)}", history or "(no history)", f"**Prompt:** {md(a.prompt, limit=2000)}",
            shown[0], shown[1] if pairwise else "", gr.update(visible=pairwise), gr.update(visible=not pairwise),
            status, gr.skip(), *cleared)


def _done(studio: Studio, campaign: str, rater: str) -> str:
    done, total = studio.campaigns.rater_progress(campaign, rater)
    return f"✅ Nothing left for you in this campaign ({done} of {total} done). Thank you!"


@guarded(N_OUT, STATUS)
def next_unit(studio: Studio, campaign: str | None, typed: str | None, request: gr.Request | None = None) -> tuple:
    """The rater's pending unit, or the next one."""
    rater = rater_id(typed, logged_in(request))
    if not campaign:
        raise ValueError("choose a campaign first" if studio.campaigns.names() else
                         "no campaign yet: make one in the Campaigns tab, then choose it here")
    a = studio.campaigns.next(campaign, rater)
    return _view(a, "" if a else _done(studio, campaign, rater))


@guarded(N_OUT, STATUS)
def judge_unit(studio: Studio, verdict: str | None, campaign: str | None, typed: str | None, assignment: float | None,
               *scores, request: gr.Request | None = None) -> tuple:
    """Stores the judgment (a verdict, or the rubric's scores), then serves the next unit."""
    rater = rater_id(typed, logged_in(request))
    if assignment is None:
        raise ValueError("load a unit first (Start)")
    if verdict == "skip":
        studio.campaigns.skip(int(assignment), rater)
        said = "Skipped."
    else:
        rubric = dict(zip(CRITERIA, scores)) if verdict is None else None
        said = f"Judgment #{studio.campaigns.submit(int(assignment), rater, verdict, rubric)} stored."
    a = studio.campaigns.next(campaign, rater)
    return _view(a, said if a else f"{said} {_done(studio, campaign, rater)}")


def campaign_choices(studio: Studio, current: str | None = None):
    """The campaigns now stored; the one chosen stays chosen."""
    names = studio.campaigns.names()
    return gr.update(choices=names, value=current if current in names else (names[-1] if names else None))


def build(studio: Studio, shared=None) -> None:
    from personalize.ui.common import Markdown

    with gr.Tab("Rate", id="rate") as tab:
        Markdown("Judge a campaign's outputs blind: which one is more like something **this person** would write? "
                 "Keys: **1**/A, **2**/B, **3** tie, **4** both bad, **S** skip.")
        with gr.Row():
            campaign = gr.Dropdown(choices=studio.campaigns.names(), label="Campaign", elem_id="rate-campaign",
                                   allow_custom_value=True)
            rater = gr.Textbox(label="Rater id", placeholder="your name or initials", elem_id="rate-rater")
            start = gr.Button("Start / resume", variant="primary", elem_id="rate-start")
        progress = Markdown(elem_id="rate-progress")
        instruction = Markdown(elem_id="rate-instruction")
        with gr.Row(equal_height=False):
            with gr.Column(scale=2):
                Markdown("**The person's writing** (their history)")
                history = Markdown(elem_id="rate-history", max_height=360)
            with gr.Column(scale=3):
                prompt = Markdown(elem_id="rate-prompt")
                with gr.Row():
                    out_a = Markdown(elem_id="rate-out-a", elem_classes="method-out")
                    out_b = Markdown(elem_id="rate-out-b", elem_classes="method-out")
        with gr.Row(visible=False) as pairwise_row:
            buttons = {eid: gr.Button(label, elem_id=eid) for eid, (_, label) in VERDICTS.items()}
        with gr.Row(visible=False) as rubric_row:
            sliders = [gr.Radio([1, 2, 3, 4, 5], label=c, elem_id=f"rate-{c}") for c in CRITERIA]
            submit = gr.Button("Submit scores", elem_id="campaign-submit")
        skip = gr.Button("Skip [S]", size="sm", elem_id="campaign-skip")
        status = Markdown(elem_id="rate-status")
        assignment = gr.Number(visible=False, precision=0, elem_id="rate-assignment")
    outs = [assignment, progress, instruction, history, prompt, out_a, out_b, pairwise_row, rubric_row, status,
            campaign, *sliders]
    assert len(outs) == N_OUT and outs[STATUS] is status
    ev = dict(queue=False)  # SQLite work of milliseconds: no model, so no queue (and its SSE round trips) at all

    # closures, not partials: Gradio hands the request (the logged-in rater) only to a plain function
    def next_fn(campaign, typed, request: gr.Request):
        return next_unit(studio, campaign, typed, request)

    def verdict_fn(verdict):
        def fn(campaign, typed, assignment, request: gr.Request):
            return judge_unit(studio, verdict, campaign, typed, assignment, request=request)
        return fn

    def scores_fn(campaign, typed, assignment, style, content, fluency, request: gr.Request):
        return judge_unit(studio, None, campaign, typed, assignment, style, content, fluency, request=request)

    start.click(next_fn, [campaign, rater], outs, api_name="campaign_next", **ev)
    for eid, btn in buttons.items():
        btn.click(verdict_fn(VERDICTS[eid][0]), [campaign, rater, assignment], outs,
                  api_name=eid.replace("-", "_"), **ev)
    skip.click(verdict_fn("skip"), [campaign, rater, assignment], outs, api_name="campaign_skip", **ev)
    submit.click(scores_fn, [campaign, rater, assignment, *sliders], outs, api_name="campaign_scores", **ev)
    tab.select(functools.partial(campaign_choices, studio), campaign, campaign, queue=False)
    if shared is not None and getattr(shared, "app", None) is not None:
        shared.app.load(rater_box, None, rater)
        shared.app.load(None, None, None, js=SHORTCUTS_JS)
