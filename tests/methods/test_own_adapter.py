"""A cluster of one (methods/card/own.py) on a tiny random model: the upper blocks trained on the lower blocks' states
give the same loss as the whole model, the person's adapter lowers their loss and stores only its trained blocks,
loads back in a fresh engine, is the base card decodes over (their partner's for card_shuffled), and is forgotten."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from personalize.methods.card import card_decode
from personalize.methods.card.adapters import add_warm_adapter, answer_loss, lower_states, pad_states, sft_batch, \
    sft_loss, upper_only
from personalize.methods.card.config import OwnSettings
from personalize.methods.card.own import OwnAdapters, layer_of, owner_key
from personalize.methods.card.style import UserStyle
from tests.methods.test_methods_training import BUDGET, examples, history, make_engine


def own_engine(tiny_model, tokenizer, tmp_path, **settings):
    eng = make_engine(tiny_model, tokenizer)
    eng.cfg = replace(eng.cfg, own=OwnSettings(**({"layers": 2, "steps": 12, "lr": 5e-2, "batch_size": 4} | settings)))
    eng.own = OwnAdapters(eng, tmp_path / "own")
    return eng


def test_upper_blocks_on_lower_states_give_the_whole_models_loss(tiny_model, tokenizer, tmp_path):
    eng = own_engine(tiny_model, tokenizer, tmp_path)
    eng.use_adapter("k1c0")
    ex = examples("shouty")[:4]
    ids, mask, labels = sft_batch(tokenizer, ex, BUDGET, "cpu")
    with torch.no_grad():
        whole = answer_loss(eng.model, ids, mask, labels).item()
        states = lower_states(eng.model, tokenizer, ex, BUDGET, first=2)
        h, m, lab = pad_states(states, "cpu")
        with upper_only(eng.model, 2):
            upper = answer_loss(eng.model, None, m, lab, inputs_embeds=h).item()
    assert upper == pytest.approx(whole, rel=1e-4)


def test_own_adapter_trains_its_upper_blocks_saves_them_and_loads_back(tiny_model, tokenizer, tmp_path):
    eng = own_engine(tiny_model, tokenizer, tmp_path)
    items = history("shouty")
    eng.use_adapter("k1c0")
    before = sft_loss(eng.model, tokenizer, examples("shouty"), BUDGET)
    assert not eng.own.is_current("shouty", items)
    got = eng.own.train("shouty", items, "k1c0")
    assert got.source == "k1c0" and got.steps == 12 and got.tokens > 0 and got.bytes < 1_000_000
    assert eng.own.is_current("shouty", items) and not eng.own.is_current("shouty", items[:-1])
    # one history in any order: the store's (newest first) and a fit's (held_out_order) name the same adapter
    assert eng.own.is_current("shouty", items[::-1])
    ada = eng.own.activate(owner_key("shouty"))
    eng.use_adapter(ada)
    after = sft_loss(eng.model, tokenizer, examples("shouty"), BUDGET)
    assert after < 0.95 * before, (before, after)  # two of four blocks, 12 steps
    # the lower blocks are the source's, untouched; the upper ones moved
    params = dict(eng.model.named_parameters())
    for n, p in params.items():
        if f".{ada}." in n and "lora_" in n:
            src = params[n.replace(f".{ada}.", ".k1c0.")]
            assert torch.equal(p, src) == (layer_of(n) < 2), n
    # a fresh engine (another process) loads the saved blocks over its own copy of the source
    eng2 = own_engine(tiny_model, tokenizer, tmp_path)
    ada2 = eng2.own.activate(owner_key("shouty"))
    eng2.use_adapter(ada2)
    assert sft_loss(eng2.model, tokenizer, examples("shouty"), BUDGET) == pytest.approx(after, rel=1e-5)
    assert eng2.own.activate(owner_key("calm")) is None  # none trained
    eng2.own.forget("shouty")
    assert ada2 not in eng2.model.peft_config and not eng2.own.path(owner_key("shouty")).exists()


def test_a_cut_file_is_no_adapter(tiny_model, tokenizer, tmp_path):
    eng = own_engine(tiny_model, tokenizer, tmp_path, steps=1)
    eng.own.train("shouty", history("shouty"), "k1c0")
    path = eng.own.path(owner_key("shouty"))
    path.write_bytes(path.read_bytes()[:-10])
    assert eng.own.meta(owner_key("shouty")) is None
    assert not eng.own.is_current("shouty", history("shouty"))


def test_card_decodes_over_the_styles_own_adapter_and_cluster_stays_the_clusters(tiny_model, tokenizer, tmp_path):
    from personalize.methods.card.head import PersonalizationHead

    eng = own_engine(tiny_model, tokenizer, tmp_path, steps=1)
    eng.heads = {"tokens": PersonalizationHead(32, 8, 8).eval()}
    eng.own.train("shouty", history("shouty"), "k1c0")
    mine = UserStyle(torch.ones(8).numpy(), own=owner_key("shouty"))
    theirs = UserStyle(torch.ones(8).numpy())
    s = eng.cfg.decoding
    card = card_decode.rows(eng, ["Paraphrase: hi"] * 2, "card", 0, [mine, theirs], k=1, settings=s)
    assert [r.adapter for r in card] == [eng.own.peft_name(owner_key("shouty")), "k1c0"]
    assert card_decode.rows(eng, ["Paraphrase: hi"], "cluster", 0, mine, k=1, settings=s)[0].adapter == "k1c0"
    with pytest.raises(ValueError, match="decode alone"):
        card_decode.generate(eng, ["a", "b"], "card", 0, [mine, theirs], k=1, settings=s)
    # the style's key travels through the store's bytes
    back = UserStyle.from_bytes(mine.lam, mine.extras_bytes())
    assert back.own == owner_key("shouty") and UserStyle.from_bytes(theirs.lam, theirs.extras_bytes()).own is None
