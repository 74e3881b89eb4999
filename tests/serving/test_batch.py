"""Mixed batches (serving/runner.py): every method's rows decoded in ONE generate give, row by row, exactly the output
that the method's own `generate` gives alone (greedy), on the tiny built artifacts."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from personalize.methods.card.steer import CardSteer
from personalize.serving.rows import DecodeRow
from personalize.serving.settings import DecodingSettings
from personalize.methods.base import UserContext
from personalize.methods.card import card_decode

from conftest import tiny_studio

PROMPTS = ["Paraphrase: the train was late again", "Paraphrase: we won the match on Sunday"]


@pytest.fixture(scope="module")
def studio(tiny_artifacts, tmp_path_factory):
    st = tiny_studio(tiny_artifacts, tmp_path_factory.mktemp("batch"))
    users = sorted(st.runtime.demo_users)[:2]
    for u in users:
        st.histories.save_history(u, st.histories.demo_items(u), st.runtime.engine.task.name)
        st.fits.fit(u)
    st.users = users
    yield st
    st.runtime.store.close()


def contexts(studio):
    from personalize.methods.card.person import prepared_items

    out = []
    for u in studio.users:
        state = studio.histories.user_state(u)
        prepared_items(studio.runtime.engine, studio.runtime.store, u)
        out.append((state, UserContext.from_store(studio.runtime.store, u, studio.runtime.task, state.cluster, state.k, state.lam)))
    return out


def alone(studio, method, state, user, prompt, s):
    e = studio.runtime.engine
    if method in ("base", "cluster", "card"):
        return card_decode.generate(e, [prompt], method, state.cluster, state.lam, k=state.k, settings=s)[0]
    return studio.runtime.method(method).generate(user, [prompt], s)[0]


def rows_of(studio, method, state, user, prompt, s):
    e = studio.runtime.engine
    if method in ("base", "cluster", "card"):
        return card_decode.rows(e, [prompt], method, state.cluster, state.lam, k=state.k, settings=s)
    return studio.runtime.method(method).rows(user, [prompt], s)


METHODS = ("base", "cluster", "card", "cope", "rag", "pag")


def test_one_batch_of_every_method_and_user_equals_each_alone(studio):
    s = studio.runtime.engine.cfg.decoding
    ctx = contexts(studio)
    plan = [(m, st, u, p, s) for st, u in ctx for m in METHODS for p in PROMPTS]
    plan.append(("card", *ctx[0], PROMPTS[0], dataclasses.replace(s, alpha=3.0, max_new_tokens=3)))  # own α, length
    rows = [r for m, st, u, p, s_ in plan for r in rows_of(studio, m, st, u, p, s_)]
    assert any(isinstance(r.steer, CardSteer) for r in rows) and len({r.adapter for r in rows}) >= 2
    steps = {}
    batched = studio.runtime.engine.decode_rows(rows, on_step=lambda i, t: steps.setdefault(i, []).append(t))
    for i, ((m, st, u, p, s_), g) in enumerate(zip(plan, batched)):
        ref = alone(studio, m, st, u, p, s_)
        assert (g.text, g.n_tokens, g.note) == (ref.text, ref.n_tokens, ref.note), (m, st.name, p)
        if m in ("rag", "pag"):
            assert g.trace == ref.trace
    assert all(len(v) >= batched[i].n_tokens for i, v in steps.items())  # every token was streamed
    assert batched[-1].n_tokens <= 3


def test_traces_of_card_and_cope_rows_match_their_own_decoding(studio):
    s = studio.runtime.engine.cfg.decoding
    (state, user), _ = contexts(studio)
    e = studio.runtime.engine
    card = card_decode.rows(e, [PROMPTS[0]], "card", state.cluster, state.lam, k=state.k, settings=s, trace=True)
    cope = studio.runtime.method("cope").rows(user, [PROMPTS[1]], s, trace=True)
    g_card, g_cope = e.decode_rows(card + [DecodeRow(PROMPTS[1], e.cfg.budget, s)] + cope)[0::2]
    ref_card = card_decode.generate(e, [PROMPTS[0]], "card", state.cluster, state.lam, k=state.k, settings=s, trace=True)[0]
    ref_cope = studio.runtime.method("cope").generate(user, [PROMPTS[1]], s, trace=True)[0]
    for a, b in zip(g_card.trace, ref_card.trace):
        assert a["cand"].equal(b["cand"]) and a["chosen"].equal(b["chosen"])
        assert torch.allclose(a["after"], b["after"], atol=1e-4)  # rows of other lengths pad this one: float noise
    assert [st["token"] for st in g_cope.trace] == [st["token"] for st in ref_cope.trace]


def test_sampled_rows_decode_apart_from_greedy_ones(studio):
    e = studio.runtime.engine
    greedy = e.cfg.decoding
    sampled = dataclasses.replace(greedy, do_sample=True, temperature=0.7)
    rows = card_decode.rows(e, PROMPTS, "cluster", 0, k=2, settings=greedy) + card_decode.rows(e, PROMPTS, "base", settings=sampled)
    out = e.decode_rows(rows)
    ref = card_decode.generate(e, PROMPTS, "cluster", 0, k=2, settings=greedy)
    assert [g.text for g in out[:2]] == [g.text for g in ref]


def test_rows_with_an_unknown_adapter_are_refused(studio):
    e = studio.runtime.engine
    with pytest.raises(ValueError, match="not loaded"):
        e.decode_rows([DecodeRow(PROMPTS[0], e.cfg.budget, DecodingSettings(max_new_tokens=2), "k9c9")])


def test_eight_threads_comparing_at_once_get_what_each_gets_alone(tiny_artifacts, tmp_path):
    """8 people (over every cluster of K = 4) press Compare at the same moment: the scheduler mixes their
    requests into shared batches, and each person gets exactly the outputs they get alone."""
    import threading

    st = tiny_studio(tiny_artifacts, tmp_path)
    try:
        users = sorted(st.runtime.demo_users)[:8]
        for u in users:
            st.histories.save_history(u, st.histories.demo_items(u), st.runtime.engine.task.name)
            st.fits.fit(u, k=4)
        assert len({st.histories.user_state(u, 4).cluster for u in users}) >= 3
        s, methods = st.runtime.engine.cfg.decoding, ["base", "cluster", "card", "cope", "rag", "pag"]
        prompt = {u: f"Paraphrase: {st.histories.demo_items(u)[0].y}" for u in users}
        alone = {u: {o.method: (o.text, o.error) for o in st.comparisons.compare(u, prompt[u], methods, s, k=4)} for u in users}
        assert all(e is None for a in alone.values() for _, e in a.values())
        st.runtime.scheduler.batches.clear()
        together, barrier = {}, threading.Barrier(len(users))

        def press(u):
            barrier.wait()
            together[u] = {o.method: (o.text, o.error) for o in st.comparisons.compare(u, prompt[u], methods, s, k=4)}

        threads = [threading.Thread(target=press, args=(u,)) for u in users]
        [t.start() for t in threads]
        [t.join(120) for t in threads]
        assert together == alone
        assert max(b["requests"] for b in st.runtime.scheduler.batches) > len(methods)  # people shared a batch
    finally:
        st.runtime.store.close()


def test_the_libraries_path_gives_the_same_outputs(studio):
    """fast=False (peft's adapter_names, P2P's row hooks, every row prefilled, F.linear's head) is the
    reference the fast path is held to."""
    from personalize.serving.runner import decode_rows

    s = studio.runtime.engine.cfg.decoding
    e = studio.runtime.engine
    rows = [r for st, u in contexts(studio) for m in METHODS for r in rows_of(studio, m, st, u, PROMPTS[0], s)]
    fast = e.decode_rows(rows)
    ref = decode_rows(e.model, e.tok, rows, fast=False)
    assert [(g.text, g.n_tokens, g.note) for g in fast] == [(g.text, g.n_tokens, g.note) for g in ref]


def test_identical_plain_rows_decode_once_and_keep_their_own_note(studio, monkeypatch):
    e = studio.runtime.engine
    s = e.cfg.decoding
    plain = card_decode.rows(e, [PROMPTS[0]], "cluster", 0, k=2, settings=s)[0]
    rows = [plain, dataclasses.replace(plain, note="fell back", trace=[{"x": 1}]), DecodeRow(PROMPTS[1], e.cfg.budget, s)]
    sizes, generate = [], e.model.generate
    monkeypatch.setattr(e.model, "generate", lambda **kw: sizes.append(kw["input_ids"].shape[0]) or generate(**kw))
    steps = {}
    out = e.decode_rows(rows, on_step=lambda i, t: steps.setdefault(i, []).append(t))
    assert sizes == [2]  # the two identical rows ran as one
    assert out[0].text == out[1].text and out[0].note is None and out[1].note == "fell back"
    assert out[1].trace == [{"x": 1}] and steps[0] == steps[1]


def test_a_static_cache_decodes_the_same_tokens(studio):
    """ModelConfig.static_cache: generate sizes a StaticCache (compiled into CUDA graphs on a GPU); every method's
    rows of a mixed batch, and CARD alone, give the tokens they give with the dynamic cache."""
    e = studio.runtime.engine
    s = e.cfg.decoding
    ctx = contexts(studio)
    plan = [(m, st, u, p) for st, u in ctx for m in METHODS for p in PROMPTS[:1]]
    rows = [r for m, st, u, p in plan for r in rows_of(studio, m, st, u, p, s)]
    state = ctx[0][0]
    dynamic = [g.text for g in e.decode_rows(rows)]
    card = card_decode.generate(e, PROMPTS, "card", state.cluster, state.lam, k=state.k, settings=s)
    config = e.model.generation_config
    config.cache_implementation = "static"
    try:
        from personalize.lm.models import uses_static_cache

        assert uses_static_cache(e.model)
        assert [g.text for g in e.decode_rows(rows)] == dynamic
        assert getattr(e.model.get_base_model(), "_previous_max_cache_length", 0) > 0  # generate made a StaticCache
        again = card_decode.generate(e, PROMPTS, "card", state.cluster, state.lam, k=state.k, settings=s)
        assert [g.text for g in again] == [g.text for g in card]
    finally:
        config.cache_implementation = None
