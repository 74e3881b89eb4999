"""Every row of a mixed batch with its own LoRA, added by one gathered matmul pair per target module.

peft's mixed-adapter batches (`generate(adapter_names=...)`) run, at every LoRA layer and every decoding
step, one sub-batch per distinct adapter: index the rows, two Linear calls, the scaling, an index_put. On
a 2-core CPU that loop was ~25 ms of a six-row Compare step (benchmarks/mixed_step.py). Here each row's
LoRA terms (its peft adapter, and a generated LoRA such as P2P's on the rows that have one) are gathered
once per batch into per-row matrices A [R, d_in, r] and B [R, r, d_out] (scaling folded into B, zeros
for the frozen LM's rows), and a forward hook on each target module adds bmm(bmm(x, A), B) while peft's
own LoRA layers are switched off. The terms are peft's (x Aᵀ) Bᵀ · scaling, summed in one matmul: the
same function up to float rounding (outputs compared with peft's path in tests/serving/test_row_lora.py).
"""

from __future__ import annotations

import re
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn as nn

from personalize.lm.onednn import per_adapter_set

NO_ADAPTER = "__base__"  # peft's name for "no LoRA" in a mixed-adapter batch
LAYER_NUMBER = re.compile(r"(?:^|\.)layers\.(\d+)\.")  # a module inside block N of the model

Generated = tuple[dict, float]  # (LoRA: module type -> (A [1, L, r, d_in], B [1, L, d_out, r]), scale)


@dataclass(frozen=True)
class Target:
    module: nn.Module
    kind: str  # the module's name in its block (q_proj, ...): what a generated LoRA names
    layer: int | None  # its block's number
    is_peft: bool  # a peft LoRA layer (its adapters are in lora_A / lora_B)


def targets(model) -> list[Target]:
    """Every peft LoRA layer and every linear module in a numbered block (a generated LoRA may target one)."""
    def build(model):
        out = []
        for name, mod in model.named_modules():
            is_peft = hasattr(mod, "lora_A") and hasattr(mod, "base_layer")
            found = LAYER_NUMBER.search(name)
            inner = ".base_layer" in name or ".lora_" in name
            if is_peft or (found and isinstance(mod, nn.Linear) and not inner):
                out.append(Target(mod, name.rsplit(".", 1)[-1], int(found.group(1)) if found else None, is_peft))
        return out
    return per_adapter_set(model, "_row_lora_targets", build)


def supported(model, adapters: Sequence[str]) -> bool:
    """Whether the batch's adapters are plain LoRAs on linear layers, unmerged (the gathered form's terms);
    a DoRA or other peft variant, or a merged adapter, decodes on peft's own path (serving.runner.decode_rows)."""
    used = set(adapters)
    for t in targets(model):
        m = t.module
        if t.is_peft and not used.isdisjoint(m.lora_A):
            if getattr(m, "merged", False) or not used.isdisjoint(getattr(m, "lora_variant", {})) or any(
                    not isinstance(m.lora_A[a], nn.Linear) for a in used if a in m.lora_A):
                return False
    return True


def _stacks(module, used: set[str]) -> tuple[dict[str, int], torch.Tensor, torch.Tensor]:
    """A peft LoRA layer's adapters stacked once: (name -> index, Aᵀ [n + 1, d_in, r], scaled Bᵀ
    [n + 1, r, d_out]), index 0 all zeros (a row without LoRA), ranks zero-padded to the largest. Rebuilt when
    the adapters change, or when one the batch `used` is another tensor or was trained since (its version)."""
    names = tuple(module.lora_A)
    hit = getattr(module, "_row_lora_stacks", None)
    if hit is not None and hit[0] == names and all(
            module.lora_A[a].weight is wa and wa._version == va and module.lora_B[a].weight is wb and
            wb._version == vb for a, (wa, va, wb, vb) in hit[1].items() if a in used):
        return hit[2]
    ref = module.lora_A[names[0]].weight
    r = max(module.lora_A[a].weight.shape[0] for a in names)
    A = ref.new_zeros(len(names) + 1, ref.shape[1], r)
    B = ref.new_zeros(len(names) + 1, r, module.lora_B[names[0]].weight.shape[0])
    seen = {}
    with torch.no_grad():
        for j, a in enumerate(names, 1):
            wa, wb = module.lora_A[a].weight, module.lora_B[a].weight
            A[j, :, : wa.shape[0]] = wa.t()
            B[j, : wb.shape[1]] = wb.t() * module.scaling[a]
            seen[a] = (wa, wa._version, wb, wb._version)
    out = ({a: j for j, a in enumerate(names, 1)}, A, B)
    module._row_lora_stacks = (names, seen, out)
    return out


def _generated_rows(generated: dict[int, Generated], n_rows: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Per module type, the generated LoRAs of the batch's rows: Aᵀ [L, R, d_in, r], scaled Bᵀ [L, R, r, d_out]
    (zeros on rows without one), so a layer's slice is one contiguous [R, ...] block."""
    out = {}
    for kind in {k for lora, _ in generated.values() for k in lora}:
        have = [(i, lora[kind], scale) for i, (lora, scale) in generated.items() if kind in lora]
        A0, B0 = have[0][1]
        A = A0.new_zeros(A0.shape[1], n_rows, A0.shape[3], A0.shape[2])
        B = B0.new_zeros(B0.shape[1], n_rows, B0.shape[3], B0.shape[2])
        for i, (a, b), scale in have:
            A[:, i] = a[0].transpose(-1, -2)
            B[:, i] = b[0].transpose(-1, -2) * scale
        out[kind] = (A, B)
    return out


def gathered(model, adapters: Sequence[str], generated: dict[int, Generated] | None = None
             ) -> dict[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """Per target module, the batch's (A [R, d_in, r], B [R, r, d_out]); modules where no row has a term are
    left out."""
    extra = _generated_rows(generated or {}, len(adapters))
    used = set(adapters)
    out, rows = {}, None
    for t in targets(model):
        As, Bs = [], []
        if t.is_peft and t.module.lora_A and not used.isdisjoint(t.module.lora_A):
            index, A, B = _stacks(t.module, used)
            if rows is None or rows[0] != index:  # the same adapters in every layer: one index tensor
                rows = (index, torch.tensor([index.get(a, 0) for a in adapters], device=A.device))
            As.append(A.index_select(0, rows[1]))
            Bs.append(B.index_select(0, rows[1]))
        if t.layer is not None and t.kind in extra:
            As.append(extra[t.kind][0][t.layer])
            Bs.append(extra[t.kind][1][t.layer])
        if As:
            out[t.module] = (torch.cat(As, 2), torch.cat(Bs, 1)) if len(As) > 1 else (As[0], Bs[0])
    return out


def _hook(A: torch.Tensor, B: torch.Tensor):
    def hook(_module, args, out):
        x = args[0]
        return out + torch.bmm(torch.bmm(x.to(A.dtype), A), B).to(out.dtype)
    return hook


@contextmanager
def peft_layers(model, on: bool):
    """peft's own LoRA layers on or off while the block runs, then as they were (the engine's record of its active
    adapter stays true); peft's flag, without enable_adapters' requires_grad side effects."""
    was = {m: m.disable_adapters for m in (t.module for t in targets(model) if t.is_peft)}
    try:
        for m in was:
            m._disable_adapters = not on
        yield
    finally:
        for m, w in was.items():
            m._disable_adapters = w


@contextmanager
def hooked(model, weights: dict[nn.Module, tuple[torch.Tensor, torch.Tensor]]):
    """While the block runs, each module in `weights` adds its rows' bmm(bmm(x, A), B) (`gathered`'s, or a
    selection of its rows); peft's own LoRA layers are off meanwhile."""
    with peft_layers(model, on=False), ExitStack() as hooks:
        for mod, (A, B) in weights.items():
            hooks.callback(mod.register_forward_hook(_hook(A, B)).remove)
        yield


def row_loras(model, adapters: Sequence[str], generated: dict[int, Generated] | None = None):
    """While the block runs, row i of every forward gets the LoRA `adapters[i]` ("__base__": none) and, for rows
    in `generated`, that generated LoRA too; peft's own LoRA layers are off meanwhile."""
    return hooked(model, gathered(model, adapters, generated))
