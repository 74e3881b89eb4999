"""A batch's shared prompt prefix read once (lm/prefix.py) gives what each row's whole pass gives: logits, states,
an answer loss and its gradient on a LoRA, on a tiny random Llama with the real chat template."""

from __future__ import annotations

import pytest
import torch

from personalize.lm.features import HiddenCapture, teacher_forced
from personalize.lm.prefix import forward_rows, position_ids, shared_length
from personalize.lm.tokens import TokenBudget, left_pad, prompt_ids, target_ids
from personalize.methods.card.adapters import rows_answer_loss, sft_batch, answer_loss, new_peft_model
from personalize.methods.card.config import LoraSettings

BUDGET = TokenBudget(max_prompt_tokens=48, max_target_tokens=12)
EXAMPLES = [("Write the changelog entry for this upload. Package: zlib", "* New upstream release."),
            ("Write the changelog entry for this upload. Package: a much longer name, with more words in it",
             "* Fix the build with gcc 14 (Closes: #1234)."),
            ("Write the changelog entry for this upload. Package: bash", "* Rebuild.")]


def test_shared_length_leaves_each_row_a_token_of_its_own():
    assert shared_length([[1, 2, 3, 4], [1, 2, 3, 5]], least=1) == 3
    assert shared_length([[1, 2, 3], [1, 2, 3, 4]], least=1) == 2  # the shorter keeps its last token
    assert shared_length([[1, 2, 3, 4], [1, 2, 3, 5]], limit=2, least=1) == 2
    assert shared_length([[1, 2, 3, 4], [1, 2, 3, 5]]) == 0  # below MIN_SHARED: not worth a second call
    assert shared_length([[1] * 20]) == 0  # a single row shares with nobody
    assert shared_length([[9] + [1] * 20, [1] * 21], least=1) == 0


def test_the_switch_reads_every_prompt_whole(monkeypatch):
    monkeypatch.setenv("PERSONALIZE_SHARED_PREFIX", "0")
    assert shared_length([[1, 2, 3, 4], [1, 2, 3, 5]], least=1) == 0
    monkeypatch.setenv("PERSONALIZE_SHARED_PREFIX", "yes")
    with pytest.raises(ValueError, match="PERSONALIZE_SHARED_PREFIX must be 0"):
        shared_length([[1, 2, 3, 4], [1, 2, 3, 5]], least=1)


def test_rows_read_over_their_shared_prefix_as_read_whole(tiny_model, tokenizer):
    seqs = [prompt_ids(tokenizer, x, BUDGET) + target_ids(tokenizer, y, BUDGET) for x, y in EXAMPLES]
    assert shared_length(seqs) >= 20  # the system turn and the task's words
    ids, mask = left_pad(seqs, tokenizer.pad_token_id)
    with torch.no_grad(), HiddenCapture(tiny_model, 2) as cap:
        whole = tiny_model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask)).logits
        h_whole = cap.all()
        out, rows, rmask = forward_rows(tiny_model, seqs, tokenizer.pad_token_id)
        h_rows = cap.all()
    assert rows.shape[1] < ids.shape[1] and int(rmask.sum()) < int(mask.sum())
    width = rows.shape[1]  # the rows' columns are the whole pass's last ones
    for i, s in enumerate(seqs):
        n = int(rmask[i].sum())
        torch.testing.assert_close(out.logits[i, width - n:], whole[i, ids.shape[1] - n:], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(h_rows[i, width - n:], h_whole[i, ids.shape[1] - n:], atol=1e-4, rtol=1e-4)


def test_teacher_forced_over_a_shared_prefix_as_each_read_alone(tiny_model, tokenizer):
    feats = teacher_forced(tiny_model, tokenizer, EXAMPLES, 2, BUDGET, top_k=5)
    for ex, f in zip(EXAMPLES, feats):
        (alone,) = teacher_forced(tiny_model, tokenizer, [ex], 2, BUDGET, top_k=5)  # one row: no prefix
        assert torch.equal(f.top_ids, alone.top_ids)
        torch.testing.assert_close(f.logprob, alone.logprob, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(f.h.float(), alone.h.float(), atol=2e-3, rtol=2e-3)


def test_an_adapters_loss_and_gradient_through_the_shared_prefix(tiny_model, tokenizer):
    """Training reads the prefix once with gradients: the LoRA's gradient is the whole batch's."""
    model = new_peft_model(tiny_model, LoraSettings(r=4, dropout=0.0))
    params = [p for n, p in model.named_parameters() if "lora_" in n]
    for p in params:
        p.requires_grad_(True)
    with torch.no_grad():  # LoRA B starts at 0: move it, so the prefix's states depend on the adapter
        for p in params:
            p.add_(0.05 * torch.randn_like(p))

    def grads(loss):
        for p in params:
            p.grad = None
        loss.backward()
        return [p.grad.clone() for p in params], loss.item()

    ids, mask, labels = sft_batch(tokenizer, EXAMPLES, BUDGET, "cpu")
    g_whole, l_whole = grads(answer_loss(model, ids, mask, labels))
    g_rows, l_rows = grads(rows_answer_loss(model, tokenizer, EXAMPLES, BUDGET))
    assert abs(l_whole - l_rows) < 1e-4
    for a, b in zip(g_whole, g_rows):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)
    assert any(g.abs().sum() > 0 for g in g_rows)
