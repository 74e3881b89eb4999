"""The LM head of a decoding step on the CPU: logits = W·xᵀ for a few rows instead of x·Wᵀ.

A decoding step multiplies a handful of rows by the 49k × 576 head (113 MB in fp32). torch's
`F.linear` (x·Wᵀ) runs that shape at well under memory speed on this CPU once there is more than one row:
measured in SmolLM2's decode, 10 ms at 1 row, 25 ms at 6 and 34 ms at 7, against 5-11 ms for W·xᵀ, which
is the same product with the weight as the left operand (benchmarks/mixed_step.py, a whole 32-token
decode of 6 rows: 3.47 → 3.05 s; of 1 row: unchanged). The same swap on the decoder's own linear layers
did not pay (their weights are 30x smaller), so only the head is changed, only on the CPU, and only while
a mixed batch decodes (batch.decode_rows); training and long prefills keep `F.linear`.
"""

from __future__ import annotations

import types
from contextlib import contextmanager

import torch
import torch.nn as nn
import torch.nn.functional as F

MAX_ROWS = 16  # rows above which x·Wᵀ is the better kernel again (a prefill, a training batch)


def _forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    flat = x.reshape(-1, x.shape[-1])
    if flat.shape[0] > MAX_ROWS or torch.is_grad_enabled():
        return F.linear(x, self.weight, self.bias)
    y = torch.mm(self.weight, flat.t()).t()
    if self.bias is not None:
        y = y + self.bias
    return y.reshape(*x.shape[:-1], self.weight.shape[0])


@contextmanager
def skinny_head(model):
    """While the block runs, the model's output embedding computes W·xᵀ for up to MAX_ROWS rows (CPU only)."""
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Linear) or head.weight.device.type != "cpu" or "forward" in head.__dict__:
        yield
        return
    head.forward = types.MethodType(_forward, head)
    try:
        yield
    finally:
        del head.forward
