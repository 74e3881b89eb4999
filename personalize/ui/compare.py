"""Compare: the chosen methods' outputs for one prompt, streamed column by column, with 👍 / 👎 per column
(a vote refits the user's style)."""

from __future__ import annotations

import time

import gradio as gr

from personalize.display import md
from personalize.catalog import ALL_METHODS, BY_NAME, DEFAULT_METHODS, STEERED
from personalize.methods.registry import REGISTRY
from personalize.ui.common import DECODE_SESSIONS, EXPECTED, Markdown, _err, bind, guarded, version_rows
from personalize.studio.fits import LOSING_STYLE_NOTE, decodes_losing_style
from personalize.ui.controls import Shared


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
    if o.info and o.info.get("repeats"):  # one of the person's past texts handed back, not new text for this prompt
        extra += f"\n\n⚠️ *{md(o.info['repeats'])}*"
    return (f"**{md(o.method)}** · {o.latency_s:.2f} s · {o.n_tokens} tok · {o.tokens_per_s:.1f} tok/s\n\n"
            f"{md(o.text) if o.text else '*(empty output)*'}{extra}")


def refine_md(res, method: str, up: bool) -> str:
    """After a thumb (studio.voting.Thumb): what was refitted, and CARD's output for the same prompt before and
    after."""
    return (f"{'👍' if up else '👎'} on **{md(method)}**: {md(res.message)}\n\n"
            f"**CARD before:** {md(res.before) if res.before else '*(not shown before)*'}\n\n"
            f"**CARD after:** {md(res.after) if res.after else '*(empty output)*'}")


def first_use_md(studio, method: str) -> str:
    """A column's placeholder while a method does its per-user work for the first time (a background job,
    started when the history was saved or fitted; its progress replaces this line)."""
    note = getattr(REGISTRY.get(method), "first_use_note", None)
    if note:
        return (f"**{method}**\n\n*first use: {note.format(**BY_NAME[method].budget)} in the "
                "background; the other columns do not wait…*")
    return f"**{method}**\n\n*waiting…*"


def columns(chosen) -> list:
    """Which method columns are shown: each column and its output box together (updates for every column, then
    every box), so a column ticked before the first Generate shows its title above its 👍 / 👎."""
    shown = [m in (chosen or []) for m in ALL_METHODS]
    return [gr.update(visible=v) for v in shown] * 2


def pick_item(studio, name, item) -> str:
    ref = studio.histories.item_reference(name, item)
    return "" if ref is None else f"**Reference (your text):**\n\n{md(ref)}"


STREAM_EVERY_S = 0.15


def streaming_md(method: str, text: str) -> str:
    """A column while its tokens arrive."""
    return f"**{md(method)}** · *decoding…*\n\n{md(text)}▌"


def done_line(name: str, n: int, note: str, prompt: str) -> str:
    """The status line after a Compare, the prompt on it as one line: a prompt's line breaks and indentation (a
    diff's) would make Markdown an indented code block, where the escapes of md show as backslashes."""
    return (f"Done: {n} method{'s' * (n != 1)} for **{md(name)}**{note}. "
            f"Prompt: {md(' '.join(prompt.split()), limit=200)}")


def compare(studio, name, text, templated, item, chosen, alpha, top_k, max_tokens, k):
    """Yields (status, one update per method column) as tokens and outputs come in."""
    hidden = {m: gr.update(visible=m in (chosen or [])) for m in ALL_METHODS}
    try:
        plan = studio.comparisons.compare_plan(name, text, templated, item, chosen, k)
        s = studio.settings(alpha, top_k, max_tokens)
    except EXPECTED as e:
        yield (_err(e), *hidden.values())
        return
    name, state, full = plan.name, plan.state, plan.prompt
    note = "" if state.fitted or studio.coming.head else " (not fitted yet: CARD uses λ = 1, your cluster's shared head)"
    steered = any(m in STEERED for m in chosen)
    if steered and (check := studio.coming.check_line()):
        note += f" ({check})"
    if steered and decodes_losing_style(studio.served, state.lam, s.alpha):
        note += f" ({LOSING_STYLE_NOTE})"  # the Fit verdict's "does not beat", said beside the output too
    # each column's current Markdown; every yield sends fresh updates of all of them, since Gradio drops the value
    # of an update object yielded a second time (a finished column would keep its streamed text)
    shown = {m: first_use_md(studio, m) if plan.first_use[m] else f"**{m}**\n\n*waiting…*" for m in chosen}

    def updates():
        return [gr.update(value=shown[m], visible=True) if m in shown else gr.update(visible=False) for m in ALL_METHODS]

    yield (f"Generating {len(chosen)} methods for **{md(name)}**, cluster {state.cluster} of K = {state.k}{note}…",
           *updates())
    done, last = set(), 0.0
    try:
        for kind, m, value in studio.comparisons.compare_stream(plan, s):
            if kind == "text":
                shown[m] = streaming_md(m, value)
            elif kind == "progress":
                shown[m] = f"**{md(m)}**\n\n*{md(value)}*"
            else:
                done.add(m)
                shown[m] = method_md(value)
            if kind == "text" and time.perf_counter() - last < STREAM_EVERY_S:
                continue  # the page gets the text so far a few times a second, not once per token and column
            last = time.perf_counter()
            yield (f"{len(done)}/{len(chosen)} done{note}.", *updates())
    except EXPECTED as e:
        yield (_err(e), *updates())
        return
    yield (done_line(name, len(chosen), note, full), *updates())


@guarded(2)
def thumb(studio, method, up, name, alpha, top_k, max_tokens, k):
    """👍 / 👎 on a column: (status, the versions table when the style was refitted)."""
    res = studio.votes.thumb(studio.need_user(name), up, studio.settings(alpha, top_k, max_tokens), k,
                             method=method)
    if res.refit is None:
        return md(res.message), gr.skip()
    return refine_md(res, method, up), version_rows(studio, name)


def build(studio, shared: Shared) -> None:
    p, d = shared.prompt, shared.decoding
    with gr.Tab("Compare", id="compare"):
        with gr.Row():
            p.text.render()
            p.templated.render()
        with gr.Row():
            p.item.render()
            reference = Markdown(elem_id="reference")
        methods = gr.CheckboxGroup(list(ALL_METHODS), value=list(DEFAULT_METHODS), label="Methods",
                                   elem_id="methods")
        with gr.Row():
            for slider in d.sliders:
                slider.render()
        compare_btn = gr.Button("Generate", variant="primary", elem_id="compare-button")
        status = Markdown(elem_id="compare-status")
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

    shared.of_person((status, ""), (reference, ""), (refine_status, ""), *((outs[m], f"**{m}**") for m in ALL_METHODS))
    p.item.change(bind(pick_item, studio), [shared.user, p.item], [reference])
    compare_btn.click(bind(compare, studio), [shared.user, *p.inputs, methods, *d.inputs], [status, *outs.values()],
                      concurrency_id="decode", concurrency_limit=DECODE_SESSIONS, api_name="compare")
    methods.change(columns, [methods], [*cols.values(), *outs.values()])
    for (m, up), btn in thumbs.items():
        btn.click(bind(thumb, studio, m, up), [shared.user, *d.inputs], [refine_status, shared.versions],
                  concurrency_id="model")
