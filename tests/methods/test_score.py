"""The teacher-forced score of a text (score.py) is what CARD's decoding computes step by step, and a plain row's
is the model's own softmax; on tiny random models."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from personalize.methods.card.adapters import BASE_ADAPTER, new_peft_model
from personalize.methods.card.config import LoraSettings
from personalize.methods.card.steer import CardSteer
from personalize.serving.rows import DecodeRow
from personalize.methods.card.decoding import CardLogitsProcessor
from personalize.serving.settings import DecodingSettings
from personalize.lm.features import HiddenCapture
from personalize.methods.card.head import PersonalizationHead
from personalize.methods.card.score import score_sequences
from personalize.methods.card.head import opening_key
from personalize.methods.card.style import StyleTensors, UserStyle
from personalize.methods.card.config import StyleSettings
from personalize.lm.tokens import TokenBudget, prompt_ids

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
