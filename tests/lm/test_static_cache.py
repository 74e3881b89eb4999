"""ModelConfig.static_cache: generate decodes with a fixed-size KV cache (which transformers compiles into CUDA
graphs on a GPU) and gives the same tokens; a forward with hooks (CARD's hidden-state capture, a mixed batch's row
LoRAs) is never compiled, since torch.compile does not guard on hooks. The compile is exercised on the CPU with
dynamo's eager backend: the same graph capture, without a GPU's kernels."""

from __future__ import annotations

import pytest
import torch
from transformers import CompileConfig

from personalize.lm.models import compile_switch
from personalize.lm.tokens import TokenBudget, left_pad, prompt_ids
from personalize.serving.generation import generate
from personalize.serving.settings import DecodingSettings

PROMPTS = ["Paraphrase: the train was late again", "Paraphrase: we won the match on Sunday"]


@pytest.fixture()
def compiled(tiny_model):
    """The tiny model with a static cache, its decode step compiled wherever it runs (dynamo, eager backend)."""
    config = tiny_model.generation_config
    config.cache_implementation = "static"
    cc = CompileConfig(backend="eager")
    cc._compile_all_devices = True  # transformers compiles on a GPU only, unless told
    config.compile_config = cc
    return tiny_model


def texts(model, tok):
    s = DecodingSettings(max_new_tokens=8, repetition_penalty=1.0, no_repeat_ngram=0, loop_period=0)
    return [g.text for g in generate(model, tok, PROMPTS, TokenBudget(), s)]


def shifted(model):
    """A hook that moves the last block's MLP output: a change a compiled step would miss."""
    return model.model.layers[-1].mlp.register_forward_hook(lambda mod, args, out: out + 3.0)


def test_a_static_cache_and_its_compiled_step_give_the_dynamic_cache_tokens(tiny_model, tokenizer):
    plain = texts(tiny_model, tokenizer)
    h = shifted(tiny_model)
    moved = texts(tiny_model, tokenizer)
    h.remove()
    assert moved != plain  # the hook changes the text: the check below can fail
    config = tiny_model.generation_config
    config.cache_implementation = "static"
    assert texts(tiny_model, tokenizer) == plain
    assert tiny_model._previous_max_cache_length > 0  # generate made a StaticCache
    cc = CompileConfig(backend="eager")
    cc._compile_all_devices = True
    config.compile_config = cc
    torch._dynamo.reset()
    assert texts(tiny_model, tokenizer) == plain  # compiled
    h = shifted(tiny_model)  # added after the step was compiled
    try:
        assert compile_switch(tiny_model) == {"disable_compile": True}
        assert texts(tiny_model, tokenizer) == moved  # the hook runs: the hooked forward stayed eager
    finally:
        h.remove()
    assert compile_switch(tiny_model) == {}
    assert texts(tiny_model, tokenizer) == plain


def test_without_the_switch_a_compiled_step_misses_a_new_hook(compiled, tokenizer):
    """Why compile_switch exists: the same decode with compile left on ignores the hook at every compiled step."""
    torch._dynamo.reset()
    texts(compiled, tokenizer)  # the decode step compiled
    ids, mask = left_pad([prompt_ids(tokenizer, x, TokenBudget()) for x in PROMPTS], tokenizer.pad_token_id,
                         compiled.device)
    kwargs = dict(input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=False,
                  pad_token_id=tokenizer.pad_token_id)
    h = shifted(compiled)
    try:
        stale, eager = compiled.generate(**kwargs), compiled.generate(**kwargs, disable_compile=True)
    finally:
        h.remove()
    assert not torch.equal(stale, eager)
