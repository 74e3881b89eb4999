"""COPE (METHOD §3) on a tiny random Llama with two different cluster LoRAs: the decoding rule, exactly."""

from __future__ import annotations

import math

import pytest
import torch

from personalize.methods.card.adapters import add_warm_adapter, new_peft_model
from personalize.methods.card.config import LoraSettings
from personalize.methods.card.config import CardConfig
from personalize.data import TASKS, Item
from personalize.serving.settings import DecodingSettings
from personalize.methods.engine import Engine
from personalize.methods.registry import METHODS, get_method
from personalize.methods.base import UserContext
from personalize.methods.cope import CopeConfig, CopeLogitsProcessor, CopeMethod
from personalize.lm.models import LM
from personalize.lm.tokens import TokenBudget, left_pad, prompt_ids
from personalize.methods.card import card_decode

BUDGET = TokenBudget(max_prompt_tokens=24, max_target_tokens=8)
PROMPTS = ["Paraphrase: the train was late again", "Paraphrase: coffee is ready", "Paraphrase: we won the match",
           "Paraphrase: rain all day"]
SETTINGS = DecodingSettings(max_new_tokens=8)
USER = UserContext("ann", [Item("late again, as usual", PROMPTS[0])], cluster=1, k=2)


@pytest.fixture()
def engine(tiny_model, tokenizer):
    """K = 1 adapter "k1c0" and clusters "k2c0", "k2c1", each with its own random LoRA so they disagree."""
    s = LoraSettings(r=4, alpha=8, targets=("q_proj", "v_proj"))
    model = new_peft_model(tiny_model, s)
    add_warm_adapter(model, "k2c0", s)
    add_warm_adapter(model, "k2c1", s)
    for i, name in enumerate(("k1c0", "k2c0", "k2c1")):
        g = torch.Generator().manual_seed(10 + i)
        for n, p in model.named_parameters():
            if "lora_B" in n and f".{name}." in n:
                p.data.normal_(0, 0.5, generator=g)
    model.eval()  # add_adapter creates its LoRA dropout in training mode
    cfg = CardConfig(budget=BUDGET, ks=(1, 2), default_k=2, decoding=SETTINGS)
    lm = LM(model=model, tokenizer=tokenizer, model_id="tiny", device=torch.device("cpu"))
    return Engine(cfg, lm, model, None, None, {}, TASKS["tweets"], {})


def test_processor_applies_the_rule_on_both_halves():
    torch.manual_seed(0)
    user, base = torch.randn(2, 30) * 3, torch.randn(2, 30) * 3
    out = CopeLogitsProcessor(alpha=0.5, tau=0.1, batch_size=2)(None, torch.cat([user, base]))
    assert torch.equal(out[:2], out[2:])
    lu, lb = user.log_softmax(-1), base.log_softmax(-1)
    for r in range(2):
        head = lu[r] >= lu[r].max() + math.log(0.1)
        assert set(torch.isfinite(out[r]).nonzero().squeeze(-1).tolist()) == set(head.nonzero().squeeze(-1).tolist())
        torch.testing.assert_close(out[r][head], (lu[r] - 0.5 * lb[r])[head])
    with pytest.raises(ValueError, match="duplicated batch"):
        CopeLogitsProcessor(0.3, 0.1, batch_size=3)(None, torch.cat([user, base]))


@pytest.mark.parametrize("k, cluster", [(2, 1), (1, 0)])
def test_alpha_zero_is_the_cluster_models_greedy_output(engine, k, cluster):
    user = UserContext("ann", [], cluster=cluster, k=k)
    cope = CopeMethod(engine, cfg=CopeConfig(alpha=0.0)).generate(user, PROMPTS, SETTINGS)
    plain = card_decode.generate(engine, PROMPTS, "cluster", cluster=cluster, k=k, settings=SETTINGS)
    assert [g.text for g in cope] == [g.text for g in plain]
    assert [g.n_tokens for g in cope] == [g.n_tokens for g in plain]


def test_chosen_tokens_stay_in_the_user_models_plausible_head(engine, tokenizer):
    """Checked twice: against the recorded V_head, and against π_user recomputed by teacher forcing."""
    tau, alpha = 0.1, 2.0  # a strong contrast, which would leave the head if it were not masked
    gens = CopeMethod(engine, cfg=CopeConfig(alpha=alpha, tau=tau)).generate(USER, PROMPTS, SETTINGS, trace=True)
    off_argmax = 0
    for p, g in zip(PROMPTS, gens):
        assert len(g.trace) == g.n_tokens >= 1
        tokens = [s["token"] for s in g.trace]
        assert all(t in s["head"].tolist() for t, s in zip(tokens, g.trace))
        # π_user over the same sequence, from a plain forward with only the user's adapter
        engine.use_adapter("k2c1")
        seq = prompt_ids(tokenizer, p, BUDGET) + tokens
        ids, mask = left_pad([seq], tokenizer.pad_token_id)
        with torch.no_grad():
            logp = engine.model(input_ids=ids, attention_mask=mask).logits[0].log_softmax(-1)
        for t, tok_id in enumerate(tokens):
            row = logp[len(seq) - len(tokens) - 1 + t]
            assert row[tok_id] >= row.max() + math.log(tau) - 1e-4
            off_argmax += int(tok_id != int(row.argmax()))
    assert off_argmax > 0  # the contrast did change choices, so the head check above was not vacuous


def test_alpha_changes_the_output_when_the_adapters_differ(engine):
    plain = CopeMethod(engine, cfg=CopeConfig(alpha=0.0)).generate(USER, PROMPTS, SETTINGS)
    contrast = CopeMethod(engine, cfg=CopeConfig(alpha=0.3)).generate(USER, PROMPTS, SETTINGS)
    assert [g.text for g in plain] != [g.text for g in contrast]


def test_frozen_lm_as_base_and_unknown_adapters(engine):
    gens = CopeMethod(engine, cfg=CopeConfig(base_adapter="__base__")).generate(USER, PROMPTS[:2], SETTINGS)
    assert len(gens) == 2 and all(g.n_tokens >= 1 for g in gens)
    with pytest.raises(ValueError, match="not loaded"):
        CopeMethod(engine).prepare(UserContext("ann", [], cluster=3, k=4))
    with pytest.raises(ValueError, match="alpha"):
        CopeConfig(alpha=-1)
    with pytest.raises(ValueError, match="tau"):
        CopeConfig(tau=1.5)


@pytest.mark.parametrize("n_items", [0, 1])
def test_cope_needs_no_history(engine, n_items):
    """Documented fallback: COPE reads the history only through the cluster, so none or one item is fine."""
    user = UserContext("ann", USER.items[:n_items], cluster=1, k=2)
    m = get_method("cope", engine, alpha=0.3)
    assert m.prepare(user)["user_adapter"] == "k2c1"
    assert len(m.generate(user, PROMPTS[:1], SETTINGS)) == 1


def test_registry_has_every_method_in_the_same_shape():
    assert set(METHODS) == {"rag", "pag", "exact", "cope", "oppu", "p2p"}
    for cls in METHODS.values():
        assert callable(cls.prepare) and callable(cls.generate) and isinstance(cls.name, str)
        assert cls.config_class.__dataclass_params__.frozen
    with pytest.raises(ValueError, match="unknown method"):
        get_method("nope", None)
