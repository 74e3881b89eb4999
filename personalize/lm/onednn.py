"""The model's linear layers through oneDNN while a mixed batch decodes on the CPU, with weights packed once.

torch's `F.linear` on the CPU is MKL's sgemm, which on this machine (an AMD EPYC, 2 cores) runs the shapes
of a decoding step far below memory speed once there are a few rows: a six-row decode of SmolLM2 took 3.15 s
on one thread and 2.33 s on two, where one row took the same on either, so its kernels were compute-bound.
oneDNN's linear (`torch.ops.mkldnn._linear_pointwise`, the kernel torch's own CPU compiler emits) with the
weight packed into its layout once runs the same products faster at every size measured, the 30 decoder
blocks of SmolLM2 at 1 / 6 / 48 / 256 rows in 28 / 24 / 74 / 278 ms against MKL's 42 / 46 / 109 / 370 ms,
its 49k × 576 head in 5 / 4 / 15 / 88 ms against 12 / 13 / 38 / 152 ms (docs/RESULTS.md,
benchmarks/linear_kernels.py). Same products, float rounding aside (the greedy outputs are compared with
`F.linear`'s in the tests). Only without gradients, in fp32 on the CPU, and for models whose linear weights
fit MAX_PACKED_BYTES: the packed copies live beside the weights. PERSONALIZE_ONEDNN=0 in the environment
keeps `F.linear` everywhere (a CPU where MKL is the faster one; benchmarks/mixed_step.py --kernels).
With another torch process busy on the same two cores every decode slowed 3-15x and swung 4x between
repeats whichever kernel ran it; oneDNN's median stayed ahead (docs/RESULTS.md).
"""

from __future__ import annotations

import os
import types
from contextlib import contextmanager

import torch
import torch.nn as nn
import torch.nn.functional as F

MAX_PACKED_BYTES = 2 << 30  # a second copy of the weights: fine for SmolLM2 (0.5 GiB), not for an 8B model
SWITCH = "PERSONALIZE_ONEDNN"


def enabled() -> bool:
    """The environment's switch, read at each use so a benchmark can alternate both kernels in one process."""
    value = os.environ.get(SWITCH, "1").strip()
    if value not in ("0", "1"):
        raise ValueError(f"{SWITCH} must be 0 (torch's F.linear) or 1 (oneDNN, the default), not {value!r}")
    return value == "1"


def packed(module: nn.Linear) -> torch.Tensor:
    """The module's weight in oneDNN's layout, packed once (again if the weight is replaced or changed)."""
    w = module.weight
    hit = getattr(module, "_onednn_weight", None)
    if hit is None or hit[0] is not w or hit[1] != w._version:
        hit = (w, w._version, torch.ops.mkldnn._reorder_linear_weight(w.detach(), None))
        module._onednn_weight = hit
    return hit[2]


def _forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if torch.is_grad_enabled() or x.dtype != torch.float32 or not x.numel():
        return F.linear(x, self.weight, self.bias)
    y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]), packed(self), self.bias, "none", [None], "")
    return y.reshape(*x.shape[:-1], self.weight.shape[0])


def per_adapter_set(model, attr: str, build):
    """`build(model)`, cached on the model as `attr` until its set of loaded adapters changes (adding one
    wraps modules; walking the ~6k modules costs ~20 ms, too much for every batch)."""
    key = frozenset(getattr(model, "peft_config", {}))
    hit = getattr(model, attr, None)
    if hit is None or hit[0] != key:
        hit = (key, build(model))
        setattr(model, attr, hit)
    return hit[1]


def linears(model) -> list[nn.Linear]:
    """The model's plain fp32 linear layers on the CPU, its head included (under peft: the LoRA layers' base
    layers, not the LoRA matrices); none when oneDNN is missing or their weights exceed MAX_PACKED_BYTES."""
    def build(model):
        mods = [m for n, m in model.named_modules() if type(m) is nn.Linear and ".lora_" not in n
                and m.weight.dtype == torch.float32 and m.weight.device.type == "cpu"]
        fits = sum(m.weight.numel() * 4 for m in mods) <= MAX_PACKED_BYTES
        return mods if fits and torch.backends.mkldnn.is_available() else []
    return per_adapter_set(model, "_onednn_linears", build)


@contextmanager
def onednn_linears(model):
    """While the block runs, the model's CPU linear layers compute through oneDNN (no-ops elsewhere)."""
    done = []
    try:
        for m in linears(model) if enabled() else ():
            if "forward" not in m.__dict__:
                m.forward = types.MethodType(_forward, m)
                done.append(m)
        yield
    finally:
        for m in done:
            del m.forward
