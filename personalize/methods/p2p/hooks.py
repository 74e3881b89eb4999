"""Applying a generated LoRA: forward hooks on the target modules (out += scale · (x Aᵀ) Bᵀ), for every row
of a batch (`applied`) or only for chosen rows of a mixed batch (`applied_rows`)."""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from typing import Sequence

import torch
import torch.nn as nn

from personalize.serving.row_lora import LAYER_NUMBER
from personalize.methods.p2p.p2p_config import LoRA


def lora_targets(model, modules: Sequence[str]) -> list[tuple[nn.Module, str, int]]:
    """(module, module type, layer) for every q_proj/v_proj-like module; on a peft model these are the
    LoRA wrappers, so a hook's output already holds the active adapter's delta."""
    named = ((mod, name.rsplit(".", 1)[-1], LAYER_NUMBER.search(name)) for name, mod in model.named_modules())
    return [(mod, leaf, int(found.group(1))) for mod, leaf, found in named if leaf in modules and found]


def model_shapes(model, modules: Sequence[str]) -> tuple[int, dict[str, tuple[int, int]]]:
    """Number of layers and (d_in, d_out) of each target module type; every layer must agree."""
    shapes: dict[str, set] = {m: set() for m in modules}
    layers = set()
    for mod, m, l in lora_targets(model, modules):
        shapes[m].add((int(mod.in_features), int(mod.out_features)))
        layers.add(l)
    missing = [m for m, s in shapes.items() if not s]
    if missing:
        raise ValueError(f"the model has no {missing} modules inside numbered layers; P2P targets {list(modules)}")
    if any(len(s) > 1 for s in shapes.values()):
        raise ValueError(f"target modules differ in shape across layers: {shapes}")
    if layers != set(range(len(layers))):
        raise ValueError(f"target layers are not 0..L-1: {sorted(layers)}")
    return len(layers), {m: next(iter(s)) for m, s in shapes.items()}


def _hook(A: torch.Tensor, B: torch.Tensor, scale: float):
    def hook(module, args, out):
        x = args[0]
        return out + scale * ((x @ A.to(x.dtype).transpose(-1, -2)) @ B.to(x.dtype).transpose(-1, -2))
    return hook


@contextmanager
def applied(model, lora: LoRA, scale: float):
    """The generated LoRA on the model while the block runs: out += scale · (x Aᵀ) Bᵀ at each target.
    A and B have a batch dimension of 1 (one user for every row) or of the batch size (a user per row)."""
    with ExitStack() as hooks:
        for mod, m, l in lora_targets(model, list(lora)):
            A, B = lora[m]
            hooks.callback(mod.register_forward_hook(_hook(A[:, l], B[:, l], scale)).remove)
        yield


@contextmanager
def applied_rows(model, loras: Sequence[tuple[int, LoRA]], scale: float):
    """Generated LoRAs on chosen rows of a mixed batch: (row, LoRA with batch dimension 1) pairs; rows that
    share one LoRA object are computed together, every other row's output is left exactly as it is.
    Each delta is `applied`'s expression, so a row gets what it gets decoding alone."""
    groups: dict[int, tuple[LoRA, list[int]]] = {}
    for row, lora in loras:
        groups.setdefault(id(lora), (lora, []))[1].append(row)
    if not groups:
        yield
        return
    modules = list(next(iter(groups.values()))[0])
    with ExitStack() as hooks:
        for mod, m, layer in lora_targets(model, modules):
            parts = [(torch.tensor(rows), lora[m][0][:, layer], lora[m][1][:, layer]) for lora, rows in groups.values()]
            hooks.callback(mod.register_forward_hook(_rows_hook(parts, scale)).remove)
        yield


def _rows_hook(parts, scale: float):
    def hook(module, args, out):
        x = args[0]
        out = out.clone()
        for rows, A, B in parts:
            xs = x[rows.to(x.device)]
            out[rows] = out[rows] + scale * ((xs @ A.to(x.dtype).transpose(-1, -2)) @ B.to(x.dtype).transpose(-1, -2))
        return out
    return hook
