"""P2P's generated LoRA on chosen rows of a mixed batch (p2p.hooks.applied_rows): each row's logits exactly
those it gets alone under `applied`, and a row without a LoRA exactly the model's own."""

from __future__ import annotations

import torch

from personalize.methods.p2p import P2PConfig, applied, applied_rows, train_p2p
from personalize.lm.prefix import position_ids
from personalize.lm.tokens import TokenBudget, left_pad, prompt_ids

from test_methods_training import STYLES, HashEncoder, history


def test_applied_rows_equals_each_row_alone(tiny_model, tokenizer):
    users = {s: history(s) for s in STYLES}
    hyper, _ = train_p2p((tiny_model, tokenizer), HashEncoder(), users,
                         P2PConfig(steps=2, rank=2, hidden=16, eval_users=2, base_adapter=None, init_b_std=0.5))
    enc = HashEncoder()
    la, lb = (hyper.generate_lora(enc.encode([it.y for it in users[s]]).mean(0)) for s in list(STYLES)[:2])
    scale = hyper.cfg.scale
    seqs = [prompt_ids(tokenizer, f"Paraphrase: {t}", TokenBudget()) for t in ("hello there", "a", "bye now")]
    ids, mask = left_pad(seqs, tokenizer.pad_token_id)
    with torch.no_grad(), applied_rows(tiny_model, [(0, la), (2, lb)], scale):
        mixed = tiny_model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask)).logits
    for row, lora in ((0, la), (1, None), (2, lb)):
        one_ids, one_mask = left_pad([seqs[row]], tokenizer.pad_token_id)
        with torch.no_grad():
            if lora is None:
                alone = tiny_model(input_ids=one_ids, attention_mask=one_mask).logits
            else:
                with applied(tiny_model, lora, scale):
                    alone = tiny_model(input_ids=one_ids, attention_mask=one_mask).logits
        n = len(seqs[row])
        assert torch.allclose(mixed[row, -n:], alone[0], atol=1e-5), row
    with torch.no_grad(), applied_rows(tiny_model, [(0, la)], scale):
        plain = tiny_model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask)).logits
    assert torch.equal(plain[1:], tiny_model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask)).logits[1:])  # rows 1, 2 untouched
