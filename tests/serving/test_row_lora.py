"""The fast mixed batch's parts on a tiny peft model: gathered per-row LoRAs (row_lora.py) give each row the
logits it gets alone under peft (and under P2P's `applied` for a generated LoRA); oneDNN's linears (lm/onednn.py)
give F.linear's logits; both leave the model as they found it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from peft import LoraConfig, get_peft_model

from personalize.serving.generation import MinNewTokens
from personalize.lm.prefix import position_ids
from personalize.methods.p2p import applied
from personalize.serving.row_lora import row_loras, supported
from personalize.lm.onednn import linears, onednn_linears
from personalize.lm.tokens import TokenBudget, left_pad, prompt_ids
from transformers import MinNewTokensLengthLogitsProcessor

SCALE = 0.7


def peft_model(tiny_model, ranks=(4, 2)):
    """Two adapters of different ranks on q, k, v, o, with B non-zero so that each one moves the logits."""
    torch.manual_seed(1)
    model = get_peft_model(tiny_model, LoraConfig(r=ranks[0], lora_alpha=8, target_modules=["q_proj", "k_proj",
                                                                                               "v_proj", "o_proj"]),
                           adapter_name="one")
    model.add_adapter("two", LoraConfig(r=ranks[1], lora_alpha=3, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    model.set_adapter("one")
    return model.eval()


def generated_lora(model, rank=3):
    """A P2P-shaped LoRA: module type -> (A [1, L, r, d_in], B [1, L, d_out, r])."""
    torch.manual_seed(2)
    cfg = model.config
    kv = cfg.num_key_value_heads * cfg.hidden_size // cfg.num_attention_heads
    L, d = cfg.num_hidden_layers, cfg.hidden_size
    return {"q_proj": (torch.randn(1, L, rank, d) * 0.3, torch.randn(1, L, d, rank) * 0.3),
            "v_proj": (torch.randn(1, L, rank, d) * 0.3, torch.randn(1, L, kv, rank) * 0.3)}


def batch(tokenizer, texts):
    seqs = [prompt_ids(tokenizer, f"Paraphrase: {t}", TokenBudget()) for t in texts]
    ids, mask = left_pad(seqs, tokenizer.pad_token_id)
    return seqs, ids, mask


def alone(model, tokenizer, seq, adapter, lora=None):
    ids, mask = left_pad([seq], tokenizer.pad_token_id)
    with torch.no_grad():
        if adapter == "__base__":
            with model.disable_adapter():
                return model(input_ids=ids, attention_mask=mask).logits[0]
        model.set_adapter(adapter)
        if lora is None:
            return model(input_ids=ids, attention_mask=mask).logits[0]
        with applied(model, lora, SCALE):
            return model(input_ids=ids, attention_mask=mask).logits[0]


def test_each_row_gets_its_own_adapter_and_generated_lora(tiny_model, tokenizer):
    model = peft_model(tiny_model)
    lora = generated_lora(model)
    seqs, ids, mask = batch(tokenizer, ["hello there", "a", "bye now", "the train was late"])
    adapters = ["one", "__base__", "two", "two"]
    with torch.no_grad(), row_loras(model, adapters, {3: (lora, SCALE)}):
        mixed = model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask)).logits
    refs = [alone(model, tokenizer, s, a, lora if i == 3 else None) for i, (s, a) in enumerate(zip(seqs, adapters))]
    for i, (s, ref) in enumerate(zip(seqs, refs)):
        assert torch.allclose(mixed[i, -len(s):], ref, atol=2e-4), i  # float rounding of logits ~5
    assert not torch.allclose(refs[2], refs[3][-refs[2].shape[0]:], atol=1e-3)  # the generated LoRA moved row 3


def test_the_model_is_left_as_it_was(tiny_model, tokenizer):
    model = peft_model(tiny_model)
    _, ids, mask = batch(tokenizer, ["hello there"])
    with torch.no_grad():
        before = model(input_ids=ids, attention_mask=mask).logits
        with row_loras(model, ["two"], {0: (generated_lora(model), SCALE)}):
            model(input_ids=ids, attention_mask=mask)
        after = model(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(before, after)
    assert not any(m._forward_hooks for m in model.modules())
    assert not any(getattr(m, "disable_adapters", False) for m in model.modules() if hasattr(m, "lora_A"))


def test_a_trained_or_replaced_adapter_is_seen(tiny_model, tokenizer):
    """The stacked adapters are cached per layer: training an adapter in place (its version counter) or
    loading another under the same name must show in the next batch."""
    model = peft_model(tiny_model)
    seqs, ids, mask = batch(tokenizer, ["hello there"])

    def mixed():
        with torch.no_grad(), row_loras(model, ["one"]):
            return model(input_ids=ids, attention_mask=mask).logits[0]

    first = mixed()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B.one" in n:
                p.mul_(-2.0)
    trained = mixed()
    assert not torch.allclose(first, trained, atol=1e-3)
    assert torch.allclose(trained, alone(model, tokenizer, seqs[0], "one"), atol=2e-4)
    model.set_adapter("two")
    model.delete_adapter("one")
    model.add_adapter("one", LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    assert torch.allclose(mixed(), alone(model, tokenizer, seqs[0], "__base__"), atol=2e-4)  # a new LoRA: B = 0


def test_onednn_linears_give_the_linear_outputs_and_are_undone(tiny_model, tokenizer):
    _, ids, mask = batch(tokenizer, ["hello there", "a"])
    head = tiny_model.get_output_embeddings()
    with torch.no_grad():
        ref = tiny_model(input_ids=ids, attention_mask=mask).logits
        with onednn_linears(tiny_model):
            assert "forward" in head.__dict__ and all("forward" in m.__dict__ for m in linears(tiny_model))
            got = tiny_model(input_ids=ids, attention_mask=mask).logits
            x = torch.randn(3, 1, head.in_features)
            assert torch.allclose(head(x), F.linear(x, head.weight), atol=1e-5)
    assert not any("forward" in m.__dict__ for m in tiny_model.modules())
    assert all(hasattr(m, "_onednn_weight") for m in linears(tiny_model))  # oneDNN ran, not F.linear's fallback
    assert torch.allclose(got, ref, atol=1e-4)
    with onednn_linears(tiny_model):  # with gradients (training): the library's own kernel
        x = torch.randn(2, head.in_features, requires_grad=True)
        head(x).sum().backward()
    assert x.grad is not None


def test_the_environment_switches_onednn_off(tiny_model, monkeypatch):
    head = tiny_model.get_output_embeddings()
    monkeypatch.setenv("PERSONALIZE_ONEDNN", "0")
    with onednn_linears(tiny_model):
        assert "forward" not in head.__dict__
    monkeypatch.setenv("PERSONALIZE_ONEDNN", "yes")
    with pytest.raises(ValueError, match="PERSONALIZE_ONEDNN must be 0"):
        with onednn_linears(tiny_model):
            pass
    monkeypatch.setenv("PERSONALIZE_ONEDNN", "1")
    with onednn_linears(tiny_model):
        assert "forward" in head.__dict__


def test_min_new_tokens_is_the_library_rule():
    torch.manual_seed(0)
    ours, lib = MinNewTokens(5, 3, [2, 7]), MinNewTokensLengthLogitsProcessor(5, 3, [2, 7])
    for length in range(5, 11):
        ids, scores = torch.zeros(2, length, dtype=torch.long), torch.randn(2, 10)
        assert torch.equal(ours(ids, scores), lib(ids, scores)), length


def test_a_dora_or_merged_adapter_is_left_to_peft(tiny_model):
    model = peft_model(tiny_model)
    assert supported(model, ["one", "__base__", "two"])
    model.add_adapter("dora", LoraConfig(r=2, use_dora=True, target_modules=["q_proj", "v_proj"]))
    assert not supported(model, ["one", "dora"]) and supported(model, ["one"])
    model.base_model.merge_adapter(["two"])
    assert not supported(model, ["two"])


def test_shared_prefill_reads_each_distinct_prompt_and_lora_once(tiny_model, tokenizer):
    """Rows 0 and 2 share prompt and adapter: three rows, two prefills; each row's cache is what a prefill of
    that row alone (with its own LoRA) leaves."""
    from transformers import DynamicCache

    from personalize.serving.runner import shared_prefill
    from personalize.serving.row_lora import gathered, hooked

    model = peft_model(tiny_model)
    seqs, ids, mask = batch(tokenizer, ["hello there", "hello there", "hello there"])
    adapters = ["one", "two", "one"]
    weights = gathered(model, adapters)
    calls = []
    decoder = model.get_base_model().get_decoder()
    handle = decoder.register_forward_pre_hook(lambda mod, args, kw: calls.append(kw["input_ids"].shape[0]),
                                               with_kwargs=True)
    with torch.no_grad():
        cache = shared_prefill(model, ids, mask, adapters, {}, weights)
    handle.remove()
    assert calls == [2]
    assert shared_prefill(model, ids[:2], mask[:2], adapters[:2], {}, gathered(model, adapters[:2])) is None
    for i, a in enumerate(adapters):
        own = DynamicCache(config=model.config)
        with torch.no_grad(), hooked(model, gathered(model, [a])):
            decoder(input_ids=ids[i:i + 1, :-1], attention_mask=mask[i:i + 1, :-1], past_key_values=own,
                    use_cache=True)
        assert torch.allclose(cache.layers[0].keys[i], own.layers[0].keys[0], atol=1e-5), i
        assert torch.allclose(cache.layers[-1].values[i], own.layers[-1].values[0], atol=1e-5), i
