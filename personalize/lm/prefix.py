"""A batch's shared prompt prefix, read once: its keys and values serve every row.

Every prompt opens alike: the chat template's system turn and the task's first words (39 of the Debian demo's ~111
tokens a text, 39 % of a person's texts' tokens with their shared template). Causal attention never lets a prefix's
states see what follows, so one pass over it (batch 1) gives what each row's own pass would, and the rows' pass reads
only what follows it, its mask and positions counting the prefix. Teacher-forced passes (the head's features, a
person's fit) and the adapters' training steps (gradients flow through the one prefix pass) run on it: the same
products, float rounding aside, for about the shared share less of the work.
"""

from __future__ import annotations

import os
from typing import Sequence

import torch
from transformers import DynamicCache

from personalize.lm.tokens import left_pad

MIN_SHARED = 8  # fewer shared tokens are not worth a second forward call
SWITCH = "PERSONALIZE_SHARED_PREFIX"  # 0: every row reads its whole prompt (benchmarks/shared_prefix.py times both)


def enabled() -> bool:
    """The environment's switch, read at each use so a benchmark can alternate both ways in one process."""
    value = os.environ.get(SWITCH, "1").strip()
    if value not in ("0", "1"):
        raise ValueError(f"{SWITCH} must be 0 (no shared prefix) or 1 (the default), not {value!r}")
    return value == "1"


def shared_length(seqs: Sequence[Sequence[int]], limit: int | None = None, least: int = MIN_SHARED) -> int:
    """How many tokens every sequence opens with alike, at most `limit` (default: each keeps one token of its own);
    0 when fewer than `least` (or a single row: nothing to share; or the switch off)."""
    if len(seqs) < 2 or not enabled():
        return 0
    limit = min(len(s) for s in seqs) - 1 if limit is None else limit
    n = 0
    for column in zip(*seqs):
        if n >= limit or any(t != column[0] for t in column):
            break
        n += 1
    return n if n >= least else 0


def position_ids(mask: torch.Tensor) -> torch.Tensor:
    """Each token's position among its row's real tokens (left padding skipped)."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


class SharedPrefix:
    """The keys and values of `ids` under the model as it is now (its active adapter; with gradients when enabled, so
    a training step's loss reaches the adapter through the prefix too)."""

    def __init__(self, model, ids: Sequence[int]):
        out = model(input_ids=torch.tensor([list(ids)], device=model.device), use_cache=True, logits_to_keep=1)
        self.layers = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        self.length = len(ids)
        self.config = model.config

    def cache(self, rows: int) -> DynamicCache:
        """A fresh cache holding the prefix for `rows` rows (views, no copies; the rows' pass appends to it)."""
        return DynamicCache([(k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1)) for k, v in self.layers],
                            config=self.config)


def forward_rows(model, seqs: Sequence[Sequence[int]], pad_id: int, limit: int | None = None, **kwargs):
    """The model over left-padded `seqs`, their shared prefix (at most `limit` tokens) read once. Returns (the
    output, the rows' left-padded ids and mask as passed): the output's columns are the ids' columns, the last of
    each row its newest token, as a whole left-padded pass would give them."""
    n = shared_length(seqs, limit)
    ids, mask = left_pad([list(s[n:]) for s in seqs], pad_id, model.device)
    if not n:
        return model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask), **kwargs), ids, mask
    prefix = SharedPrefix(model, seqs[0][:n])
    whole = torch.cat([torch.ones(len(seqs), n, dtype=mask.dtype, device=mask.device), mask], 1)
    out = model(input_ids=ids, attention_mask=whole, position_ids=position_ids(whole)[:, n:],
                past_key_values=prefix.cache(len(seqs)), use_cache=True, **kwargs)
    return out, ids, mask
