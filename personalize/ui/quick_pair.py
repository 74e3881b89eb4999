"""Quick pair: the blind playground. A prompt typed (or Compare's), two methods drawn at random and generated
on the spot, shown in random order as A and B; their names are revealed after the vote."""

from __future__ import annotations

import gradio as gr

from personalize.display import md
from personalize.catalog import ALL_METHODS, DEFAULT_METHODS
from personalize.ui.common import DECODE_SESSIONS, EXPECTED, Markdown, _err, guarded, logged_in, rater_box
from personalize.ui.controls import Shared

VOTES = {"vote-a": ("a", "A is better"), "vote-b": ("b", "B is better"), "vote-tie": ("tie", "Tie"),
         "vote-bad": ("both_bad", "Both are bad")}
LABELS = {"a": "A", "b": "B", "tie": "tie", "both_bad": "both bad"}


def pair_md(label: str, output: str) -> str:
    """One side of a blind pair."""
    return f"**{label}**\n\n{md(output) if output else '*(empty)*'}"


def draw_pair(studio, name, rater, text, chosen, compare_text, templated, alpha, top_k, max_tokens, k,
              login: str | None = None):
    """(status, A, B, pair id): a new blind pair, the status saying when this rater already voted on it."""
    try:
        got = studio.votes.new_pair(name, text, chosen, studio.settings(alpha, top_k, max_tokens), k,
                                    fallback_prompt=compare_text, templated=templated, rater=rater or "", logged_in=login)
    except EXPECTED as e:
        return _err(e), gr.skip(), gr.skip(), None
    pair = got.pair
    return (f"Prompt: {md(pair.prompt, limit=300)} — which output fits **{md(pair.user)}**'s style better?"
            + (f"\n\n⚠️ **{md(got.rater)}** already voted on these two outputs (one vote per rater and pair): "
               "draw again, or change the prompt or settings." if got.seen else ""),
            pair_md("A", pair.outputs[0]), pair_md("B", pair.outputs[1]), pair.id)


@guarded(2)
def vote(studio, winner, pair_id, rater, login: str | None = None):
    """(status, pair id): the vote stored (the pair is then closed) and the methods revealed."""
    pair, rid, who = studio.votes.vote(pair_id, winner, rater, login)  # with --auth: the logged-in user, always
    copies = "".join(f" ⚠️ {md(m)}." for m in studio.votes.repeat_marks(pair))
    return (f"Vote #{rid} stored ({LABELS[winner]}, rater {md(who)}). **A was {md(pair.methods[0])}, "
            f"B was {md(pair.methods[1])}.**{copies} Draw a new pair to go on.", None)


def build(studio, shared: Shared) -> None:
    with gr.Tab("Quick pair", id="quick-pair"):
        Markdown("Blind comparison: two methods drawn at random, in random order, names hidden until you vote.")
        with gr.Row():
            rater = gr.Textbox(label="Rater id", elem_id="rater")
            prompt = gr.Textbox(label="Prompt (empty: the Compare prompt)", elem_id="pair-prompt", scale=3)
        methods = gr.CheckboxGroup(list(ALL_METHODS), value=list(DEFAULT_METHODS), label="Methods to draw from",
                                   elem_id="pair-methods")
        new_pair = gr.Button("New pair", variant="primary", elem_id="new-pair")
        with gr.Row(equal_height=True):
            out_a = Markdown("**A**", elem_id="out-a", elem_classes="method-out")
            out_b = Markdown("**B**", elem_id="out-b", elem_classes="method-out")
        with gr.Row():
            vote_btns = {eid: gr.Button(label, elem_id=eid) for eid, (_, label) in VOTES.items()}
        status = Markdown(elem_id="vote-status")
        pair_id = gr.State(None)

    # closures, not functools.partial: Gradio passes the request only to a parameter of a plain function
    def draw(name, typed, text, chosen, compare_text, templated, alpha, top_k, max_tokens, k, request: gr.Request):
        return draw_pair(studio, name, typed, text, chosen, compare_text, templated, alpha, top_k, max_tokens, k,
                         logged_in(request))

    def voter(winner):
        def cast(pid, typed, request: gr.Request):
            return vote(studio, winner, pid, typed, logged_in(request))
        return cast

    shared.of_person((out_a, "**A**"), (out_b, "**B**"), (status, ""), (pair_id, None))
    p = shared.prompt
    new_pair.click(draw, [shared.user, rater, prompt, methods, p.text, p.templated, *shared.decoding.inputs],
                   [status, out_a, out_b, pair_id], concurrency_id="decode", concurrency_limit=DECODE_SESSIONS, api_name="new_pair")
    for eid, btn in vote_btns.items():
        # a vote is SQLite work of milliseconds: no queue, so it is served at once while Compares decode
        btn.click(voter(VOTES[eid][0]), [pair_id, rater], [status, pair_id], queue=False,
                  api_name=eid.replace("-", "_"))
    shared.app.load(rater_box, None, [rater], show_progress="hidden")
