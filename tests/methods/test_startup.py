"""Start-up: the one-pass adapter loading gives exactly the adapters peft's load_adapter gives, one by one."""

from __future__ import annotations

from pathlib import Path

import torch
from peft import PeftModel

from personalize.methods.card.adapters import adapter_name, load_adapters
from personalize.methods.card.config import CardConfig
from personalize.methods.artifacts import artifacts_meta
from personalize.lm.models import load_lm


def test_one_pass_loading_equals_peft_adapter_by_adapter(tiny_artifacts):
    folder = Path(tiny_artifacts["artifacts"])
    cfg = CardConfig.from_dict(artifacts_meta(folder)["settings"])
    names = [adapter_name(k, c) for k in cfg.ks for c in range(k)]
    new = load_adapters(load_lm(cfg.model).model, folder / "adapters", names)
    old = PeftModel.from_pretrained(load_lm(cfg.model).model, str(folder / "adapters" / names[0]), adapter_name=names[0])
    for n in names[1:]:
        old.load_adapter(str(folder / "adapters" / n), adapter_name=n)
    a = {k: v for k, v in new.state_dict().items() if "lora_" in k}
    b = {k: v for k, v in old.state_dict().items() if "lora_" in k}
    assert set(a) == set(b) and len(a) > 0 and all(torch.equal(a[k], b[k]) for k in a)
    assert new.peft_config == old.peft_config and new.active_adapter == old.active_adapter == names[0]
    assert not any(p.requires_grad for p in new.parameters()) and not new.training
    x = torch.tensor([[1, 2, 3, 4]])
    for n in names:  # every adapter acts as peft's does
        new.set_adapter(n), old.set_adapter(n)
        with torch.no_grad():
            assert torch.equal(new(input_ids=x).logits, old(input_ids=x).logits), n


def test_adapters_left_for_later_load_on_first_need_and_decode_alike(tiny_artifacts):
    """The app's start loads one cluster adapter, answers, then the rest (Studio.load_pending); a request that
    comes first loads them itself, and every adapter then gives what a full load gives."""
    from personalize.methods.engine import Engine

    folder = Path(tiny_artifacts["artifacts"])
    full = Engine.load(folder)
    later = Engine.load(folder, adapters_later=True)
    names = sorted(full.model.peft_config)
    assert len(later.model.peft_config) == 1 < len(names)
    assert later.loaded_adapters() == set(names)  # asking loads them
    again = Engine.load(folder, adapters_later=True)
    x = torch.tensor([[1, 2, 3, 4]])
    for n in names:  # use_adapter loads what is pending first
        for e in (full, again):
            e.use_adapter(n)
        with torch.no_grad():
            assert torch.equal(full.model(input_ids=x).logits, again.model(input_ids=x).logits), n
    assert set(again.model.peft_config) == set(names) and not any(p.requires_grad for p in again.model.parameters())
