"""The build's cluster adapters on their upper blocks (LoraSettings.cluster_layers, issue 58's cheaper demo training):
their lower blocks stay the K = 1 adapter's, each text's lower states are computed once and shared by every cluster
adapter, and a cluster adapter comes out the same from the shared states as from its own (a Ray worker's)."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from peft import set_peft_model_state_dict

from personalize.methods.card.adapters import ClusterJob, LowerStates, adapter_state, answer_loss, new_peft_model, \
    blocks, sft_batch, sft_loss, train_adapter, train_cluster_adapter
from personalize.methods.card.config import LoraSettings
from tests.methods.test_methods_training import BUDGET, examples

LORA = LoraSettings(r=4, alpha=8, dropout=0.0, targets=("q_proj", "v_proj"), lr=5e-2, batch_size=4, base_steps=3,
                    cluster_steps=2, cluster_layers=2)


def _model(tiny_model):
    torch.manual_seed(0)
    return new_peft_model(copy.deepcopy(tiny_model), LORA)


def test_upper_blocks_over_the_shared_states_give_the_whole_models_loss(tiny_model, tokenizer):
    model = _model(tiny_model)
    states = LowerStates.for_settings(model, tokenizer, LORA, BUDGET)
    assert states is not None and states.first == 2  # 4 blocks, the upper 2 trained
    assert LowerStates.for_settings(model, tokenizer, replace(LORA, cluster_layers=0), BUDGET) is None
    assert LowerStates.for_settings(model, tokenizer, replace(LORA, cluster_layers=4), BUDGET) is None  # all of them
    batch = examples("shouty")[:3]
    with torch.no_grad():
        whole = answer_loss(model, *sft_batch(tokenizer, batch, BUDGET, "cpu")).item()
        run, n_tokens = states.batch_loss(batch)
        upper = run().item()  # the upper blocks alone, for the step only
    assert len(blocks(model)) == 4  # the whole model again after it
    assert upper == pytest.approx(whole, rel=1e-4) and n_tokens > 0 and len(states) == 3
    states.batch_loss(batch[:2] + examples("shouty")[3:4])
    assert len(states) == 4  # each text once


def test_a_cluster_adapter_is_the_same_from_shared_states_or_its_own(tiny_model, tokenizer):
    """The build's first cluster adapter fills the cache, the next reads it; a Ray worker starts with none."""
    model = _model(tiny_model)
    train_adapter(model, tokenizer, "k1c0", examples("shouty") + examples("calm"), LORA.base_steps, LORA, BUDGET)
    base = adapter_state(model, "k1c0")
    shared = LowerStates.for_settings(model, tokenizer, LORA, BUDGET)
    train_cluster_adapter(model, tokenizer, ClusterJob("k2c1", tuple(examples("calm") + examples("shouty"))), LORA,
                          BUDGET, states=shared)
    filled = len(shared)
    job = ClusterJob("k2c0", tuple(examples("calm")))
    train_cluster_adapter(model, tokenizer, job, LORA, BUDGET, states=shared)
    assert filled > 0 and len(shared) < filled + LORA.cluster_steps * LORA.batch_size  # some texts were read again
    ours = adapter_state(model, "k2c0")
    other = _model(tiny_model)  # another process: the K = 1 weights sent, no states
    set_peft_model_state_dict(other, base, adapter_name="k1c0")
    train_cluster_adapter(other, tokenizer, job, LORA, BUDGET)
    theirs = adapter_state(other, "k2c0")
    assert ours.keys() == theirs.keys()
    for k in ours:
        torch.testing.assert_close(ours[k], theirs[k], rtol=1e-5, atol=1e-6)
    moved = [k for k in ours if not torch.equal(ours[k], base[k])]
    assert moved and all(".layers.2." in k or ".layers.3." in k for k in moved)  # the lower blocks are K = 1's


def test_an_upper_blocks_adapters_held_out_curve_reads_the_whole_model(tiny_model, tokenizer):
    """The step runs the upper blocks alone; the held-out loss after it is the whole model's (it once read the upper
    blocks over the token embeddings)."""
    model = _model(tiny_model)
    held = examples("calm")[:3]
    report = train_cluster_adapter(model, tokenizer, ClusterJob("k2c0", tuple(examples("shouty")), tuple(held)), LORA,
                                   BUDGET)
    model.set_adapter("k2c0")
    assert report["held_out_loss"][-1] == (LORA.cluster_steps, pytest.approx(sft_loss(model, tokenizer, held, BUDGET)))


def test_a_build_on_upper_blocks_keeps_the_k1_adapters_lower_blocks_in_every_cluster(tiny_artifacts, tmp_path):
    from conftest import tiny_build_config
    from personalize.methods.card.build import build

    cfg = tiny_build_config(tiny_artifacts["root"] / "lm")
    cfg = replace(cfg, lora=replace(cfg.lora, cluster_layers=2, cluster_steps=2))  # one step is all warm-up (lr 0)
    out = build(tiny_artifacts["demo"], "dev", tmp_path / "upper", cfg, p2p=None)
    k1 = load_file(out / "adapters" / "k1c0" / "adapter_model.safetensors")
    files = sorted(f for f in out.glob("adapters/k*/adapter_model.safetensors") if f.parent.name != "k1c0")
    assert len(files) == 6
    for f in files:
        state = load_file(f)
        assert state.keys() == k1.keys()
        lower = [k for k in state if ".layers.0." in k or ".layers.1." in k]
        assert lower and all(torch.equal(state[k], k1[k]) for k in lower), f
        assert any(not torch.equal(state[k], k1[k]) for k in state if k not in lower), f
    meta = json.loads((out / "config.json").read_text())
    assert [a.get("layers_from") for a in meta["report"]["adapters"]] == [None] + [2] * 6
    assert meta["settings"]["lora"]["cluster_layers"] == 2
