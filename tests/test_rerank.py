"""card_rerank (rerank.py): the sequence score is what CARD's decoding computes step by step, the choice is the
best-scoring candidate, reproducible, and each person of a batch gets their own; on tiny random models."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from personalize.card.adapters import BASE_ADAPTER, LoraSettings, new_peft_model
from personalize.methods.card.steer import CardSteer
from personalize.serving.rows import DecodeRow
from personalize.data import read_lamp
from personalize.card.decoding import CardLogitsProcessor, DecodingSettings, SeededSampler
from personalize.lm.features import HiddenCapture
from personalize.card.head import PersonalizationHead
from personalize.card.decoding import RerankSettings
from personalize.methods.card.rerank import Query, candidate_rows, rerank, score_sequences
from personalize.card.head import opening_key
from personalize.card.style import StyleSettings, StyleTensors, UserStyle
from personalize.lm.tokens import TokenBudget, prompt_ids
from personalize.methods.card import decode as card_decode

BUDGET = TokenBudget(max_prompt_tokens=24, max_target_tokens=8)
PROMPTS = ["Paraphrase: the train was late again", "Paraphrase: we won the match on Sunday"]
STYLE = StyleSettings(bias=True, memory=True, fallback=False, key="head", knn_neighbours=4, knn_weight=0.4)


@pytest.fixture()
def card(tiny_model, tokenizer):
    """A tiny peft model with a LoRA that moves the logits, a head with a real U, and a style with λ, a bias,
    a memory and a form bias (every part of style_scores)."""
    model = new_peft_model(tiny_model, LoraSettings(r=4, alpha=8, targets=("q_proj", "v_proj")))
    for n, p in model.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.5)
    torch.manual_seed(5)
    head = PersonalizationHead(2 * 32, len(tokenizer), 8)
    torch.nn.init.normal_(head.U, std=1.0)
    head.requires_grad_(False)
    rng = np.random.default_rng(0)
    keys = rng.normal(size=(40, 8)).astype(np.float32)
    style = UserStyle(rng.normal(1, 0.5, 8).astype(np.float32), np.arange(100, 400, 3), rng.normal(0, 2, 100).astype(
        np.float32), (keys / np.linalg.norm(keys, axis=1, keepdims=True)).astype(np.float16),
        rng.integers(0, 2000, 40))
    # the form bias on the answer's first token (empty opening): the score must read it as decoding does
    style.form_ids = np.arange(len(tokenizer))
    style.form_keys = np.full(len(style.form_ids), opening_key(()), np.int64)
    style.form_bias = rng.uniform(0, 4, len(style.form_ids)).astype(np.float32)
    return model, head, style


def _row(head, style, prompt, alpha=1.5, top_k=20):
    return DecodeRow(prompt, BUDGET, DecodingSettings(alpha=alpha, top_k=top_k), BASE_ADAPTER,
                     CardSteer(head, style, STYLE, 2))


def _step_by_step(model, tok, row, n_tokens=6):
    """Decode with the CARD processor one full forward per step, taking the best token at even steps and the
    third best at odd ones; returns the tokens and each step's log-probability under the processor's scores."""
    seq = torch.tensor([prompt_ids(tok, row.prompt, row.budget)])
    tokens, logps = [], []
    with HiddenCapture(model, 2) as cap, torch.no_grad():
        proc = CardLogitsProcessor(row.steer.head, StyleTensors.of([row.steer.style], STYLE), STYLE, cap,
                                   row.settings.alpha, row.settings.top_k)
        for t in range(n_tokens):
            logits = model(input_ids=seq).logits[:, -1].float()
            logp = proc(seq, logits.clone()).log_softmax(-1)[0]
            nxt = int(logp.topk(3).indices[0 if t % 2 == 0 else 2])
            tokens.append(nxt)
            logps.append(float(logp[nxt]))
            seq = torch.cat([seq, torch.tensor([[nxt]])], 1)
    return tokens, logps


def test_the_score_is_the_sum_of_cards_step_by_step_log_probs(card, tokenizer):
    model, head, style = card
    rows = [_row(head, style, PROMPTS[0]), _row(head, style, PROMPTS[1], alpha=0.7, top_k=30)]
    decoded = [_step_by_step(model, tokenizer, r, n) for r, n in zip(rows, (6, 4))]  # two lengths: padding
    scores = score_sequences(model, tokenizer, rows, [t for t, _ in decoded])
    for s, (_, lps) in zip(scores, decoded):
        assert np.isfinite(lps).all()
        assert float(s) == pytest.approx(sum(lps), abs=1e-4)
    mean = score_sequences(model, tokenizer, rows[:1], [decoded[0][0]], length_norm=True)
    assert float(mean) == pytest.approx(sum(decoded[0][1]) / 6, abs=1e-4)


def test_a_plain_row_scores_the_models_own_log_probs_and_a_token_outside_the_candidates(card, tokenizer):
    model, head, style = card
    tokens = tokenizer("late once more", add_special_tokens=False)["input_ids"]
    seq = torch.tensor([prompt_ids(tokenizer, PROMPTS[0], BUDGET) + tokens])
    with torch.no_grad():
        logp = model(input_ids=seq).logits[0, -len(tokens) - 1: -1].float().log_softmax(-1)
    own = float(logp.gather(1, torch.tensor(tokens)[:, None]).sum())
    plain = DecodeRow(PROMPTS[0], BUDGET, DecodingSettings(), BASE_ADAPTER)
    assert float(score_sequences(model, tokenizer, [plain], [tokens])) == pytest.approx(own, abs=1e-4)
    # a CARD row over its top-2 only: a text it would never decode is −inf as decoding scores it, finite widened
    narrow = _row(head, style, PROMPTS[0], top_k=2)
    assert float(score_sequences(model, tokenizer, [narrow], [tokens], widen=False)) == float("-inf")
    assert np.isfinite(float(score_sequences(model, tokenizer, [narrow], [tokens])))
    # a text is tokenised as training does: its tokens and end-of-sequence
    text = score_sequences(model, tokenizer, [plain], ["late once more"])
    ids = score_sequences(model, tokenizer, [plain], [tokens + [tokenizer.eos_token_id]])
    assert torch.equal(text, ids)


def test_the_seeded_sampler_draws_within_top_k_and_top_p_whatever_the_batch():
    scores = torch.tensor([[5.0, 4.0, 1.0, 0.5, -2.0, 0.0]])
    draws = []
    for _ in range(2):
        s = SeededSampler(7, temperature=1.0, top_p=0.9, top_k=3)
        draws.append([int(s(None, scores.clone()).argmax()) for _ in range(50)])
    assert draws[0] == draws[1] and set(draws[0]) <= {0, 1} and len(set(draws[0])) == 2  # 2 is outside top-p 0.9
    one = SeededSampler(7, 1.0, 1.0, 1)(None, scores.clone())
    assert int(one.argmax()) == 0 and torch.isinf(one).sum() == 5
    with pytest.raises(ValueError):
        RerankSettings(n=1)
    with pytest.raises(ValueError):
        RerankSettings(top_p=0.0)


@pytest.fixture(scope="module")
def people(tiny_artifacts):
    from personalize.methods.engine import Engine

    engine = Engine.load(tiny_artifacts["artifacts"])
    # the style steers (α = 1): the tiny build's guard keeps α = 0, at which card_rerank is the cluster model
    engine.cfg = replace(engine.cfg, decoding=replace(engine.cfg.decoding, alpha=1.0))
    _, qs = read_lamp(tiny_artifacts["demo"], "dev")
    fits = [engine.fit(engine.prepare_items(list(q.profile[:6]))) for q in (qs[0], qs[-1])]
    return engine, fits


def test_rerank_keeps_its_best_candidate_reproducibly(people):
    engine, fits = people
    rs = RerankSettings(n=5)
    queries = [Query(p, f.cluster, f.k, f.style) for p, f in zip(PROMPTS, fits)]
    out = rerank(engine, queries, rs=rs)
    for q, g in zip(queries, out):
        assert [c["candidate"] for c in g.trace] == ["cluster", "card", "sample 1", "sample 2", "sample 3"]
        chosen = [c for c in g.trace if c["chosen"]]
        assert len(chosen) == 1 and chosen[0]["text"] == g.text
        assert chosen[0]["score"] == max(c["score"] for c in g.trace)  # never below cluster's or card's greedy
        # the trace's scores are score_sequences' under the person's CARD row, at the rerank α
        _, _, row = candidate_rows(engine, q, engine.cfg.decoding, rs)
        assert row.settings.alpha == rs.alpha and row.steer.style is q.style and not row.steer.settings.fallback
        ids = [engine.tok(c["text"], add_special_tokens=False)["input_ids"] + [engine.tok.eos_token_id]
               for c in g.trace]
        again = score_sequences(engine.model, engine.tok, [row] * len(ids), ids, length_norm=True)
        assert again.tolist() == pytest.approx([c["score"] for c in g.trace], abs=1e-4)
    assert [g.trace for g in rerank(engine, queries, rs=rs)] == [g.trace for g in out]  # the same draws again
    alone = rerank(engine, queries[1:], rs=rs)[0]  # a person's candidates do not depend on the batch
    assert alone.trace == out[1].trace
    assert [c["text"] for c in rerank(engine, queries[:1], rs=replace(rs, seed=1))[0].trace][2:] != \
        [c["text"] for c in out[0].trace][2:]
    built, engine.cfg = engine.cfg, replace(engine.cfg, rerank=rs)
    try:  # the method's way in: Engine.generate with the engine's rerank settings
        via = card_decode.generate(engine, [PROMPTS[1]], "card_rerank", fits[1].cluster, fits[1].style, k=fits[1].k)[0]
    finally:
        engine.cfg = built
    assert via.trace == alone.trace
    with pytest.raises(ValueError, match="two stages"):
        card_decode.rows(engine, [PROMPTS[0]], "card_rerank", fits[0].cluster, fits[0].style, k=fits[0].k)


def test_two_people_in_one_batch_get_each_their_own_choice(people):
    """Same prompt, same cluster, samples only: both people see the same candidates, and a style that favours
    one candidate's own tokens picks it, the other person's picks theirs, in one batch as alone."""
    engine, fits = people
    built, engine.cfg = engine.cfg, replace(engine.cfg, style=replace(engine.cfg.style, bias=True))
    try:
        _two_people(engine, fits)
    finally:
        engine.cfg = built


def _two_people(engine, fits):
    rs = RerankSettings(n=6, greedy=False, temperature=1.5, top_p=1.0)
    base = Query(PROMPTS[0], fits[0].cluster, fits[0].k, UserStyle.of(fits[0].style.lam))
    texts = [c["text"] for c in rerank(engine, [base], rs=rs)[0].trace]
    a, b = next((x, y) for x in texts for y in texts if x != y)
    ta, tb = (set(engine.tok(t, add_special_tokens=False)["input_ids"]) for t in (a, b))

    def liking(own: set, other: set) -> UserStyle:
        ids = np.array(sorted(own - other), np.int64)
        return UserStyle(base.style.lam, ids, np.full(len(ids), 8.0, np.float32))

    assert ta - tb and tb - ta
    qa, qb = replace(base, style=liking(ta, tb)), replace(base, style=liking(tb, ta))
    both = rerank(engine, [qa, qb], rs=rs)
    assert [c["text"] for c in both[0].trace] == [c["text"] for c in both[1].trace] == texts
    assert (both[0].text, both[1].text) == (a, b)
    assert [rerank(engine, [q], rs=rs)[0].text for q in (qa, qb)] == [a, b]


def test_eval_and_tune_take_card_rerank(people, tiny_artifacts):
    from personalize.eval.evaluate import run_eval
    from personalize.fitting.tune import choose_decoding

    engine, fits = people
    res = run_eval(engine, tiny_artifacts["demo"], "dev", ["card", "card_rerank", "card_rerank_shuffled"], limit=3,
                   n_boot=50)
    assert set(res["methods"]) == {"card", "card_rerank", "card_rerank_shuffled"}
    assert all(v["seconds_per_person"] > 0 for v in res["methods"].values())
    assert {"card_rerank - card", "card_rerank - card_rerank_shuffled"} <= set(res["differences"])
    assert res["specificity"]["decoded_rerank_rougeL"] is not None
    for p in res["predictions"]:  # the chosen candidate and its rivals, with their scores, in the JSON
        assert [c["text"] for c in p["card_rerank_candidates"] if c["chosen"]] == [p["card_rerank"]]
    _, qs = read_lamp(tiny_artifacts["demo"], "dev")
    qs = qs[:2]
    items = [engine.prepare_items(list(q.profile[:6])) for q in qs]
    before = engine.cfg
    eng, report = choose_decoding(engine, [q.input for q in qs], [q.gold for q in qs], fits, items,
                                  steps=("rerank",), guard=False)
    assert report["rerank"]["chosen"] in report["rerank"]["sweep"] and "card" in report["rerank"]
    assert eng.cfg.decoding == before.decoding and eng.cfg.style == before.style  # card itself is not changed
    engine.cfg = before
