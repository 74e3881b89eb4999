"""CARD writes new text like the person, not one of their past texts handed back (issue 57; METHOD §1.10).

The person's memory at α > 0 votes for the tokens that followed the nearest past states, so once an output starts
like a past text the memory can walk it to the end: a third of card's outputs were a past subject word for word,
where people repeat themselves in 1-6 %. PastTextGuard is a transformers LogitsProcessor, after CARD's, that masks
the token which would make the output hold a run of more than `limit` tokens of one past text, unless the prompt
holds that run too (a file name, an issue number the change names). `limit` is the person's own reuse: how long a
run their texts typically share with another of their texts (own_reuse), never below StyleSettings.copy_run_floor.
Their words and form stay; a past text as a whole does not. Nor does one nearly: a line (or the whole output) may not
end while it is within NEAR of a past text in its tokens (the LCS's F, as ROUGE-L reads words): "clarify block scope
docs" for the person's "clarify block outer scope docs" went through the run limit, the near-copy end does not.
"""

from __future__ import annotations

import math
from functools import lru_cache
from statistics import median
from typing import Sequence

import torch
from transformers import LogitsProcessor

from personalize.methods.card.config import StyleSettings
from personalize.metrics import NEAR


def past_texts(values: Sequence[int], eos: int | None) -> tuple[tuple[int, ...], ...]:
    """The person's past texts as token ids, from their memory's values (every token they wrote, each text ending
    at end-of-sequence, which stays: a short past text written out and ended is a copy too)."""
    out, cur = [], []
    for t in (int(v) for v in values):
        cur.append(t)
        if t == eos:
            out.append(tuple(cur))
            cur = []
    return tuple(t for t in out + [tuple(cur)] if t)


LONGEST_RUN = 32  # runs of more tokens than this count as this long (a cap on own_reuse's work for long texts)


@lru_cache(maxsize=256)
def own_reuse(texts: tuple[tuple[int, ...], ...], floor: int) -> int:
    """The run the person reuses: the median over their texts of the longest run (up to LONGEST_RUN tokens) each
    shares with another of them (their phrases and templates), at least `floor`. Cached: a person decodes often."""
    where: dict[tuple[int, ...], set[int]] = {}  # every run of every text -> the texts that hold it
    for i, t in enumerate(texts):
        for a in range(len(t)):
            for b in range(a + 1, min(len(t), a + LONGEST_RUN) + 1):
                where.setdefault(t[a:b], set()).add(i)
    runs = [max((len(g) for g, held in where.items() if i in held and len(held) > 1), default=0)
            for i in range(len(texts))]
    return max(floor, int(median(runs)) if runs else 0)


@lru_cache(maxsize=8)
def line_breaks(tok) -> frozenset[int]:
    """The tokens that end a line or the text: end-of-sequence and every token whose text holds a newline."""
    ids = {i for i in range(len(tok)) if "\n" in tok.decode([i])}
    return frozenset(ids | ({tok.eos_token_id} if tok.eos_token_id is not None else set()))


def lcs_f(a: Sequence[int], b: Sequence[int]) -> float:
    """The F-measure of the longest common subsequence of two token lists (ROUGE-L's, on tokens)."""
    if not a or not b:
        return 0.0
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    n = prev[-1]
    return 0.0 if n == 0 else 2 * n / (len(a) + len(b))


def _grams(texts: Sequence[Sequence[int]], n: int) -> dict[tuple[int, ...], set[int]]:
    """Every run of n + 1 tokens of the texts, as its first n tokens -> the tokens that may not follow them."""
    out: dict[tuple[int, ...], set[int]] = {}
    for t in texts:
        for i in range(len(t) - n):
            out.setdefault(tuple(t[i: i + n]), set()).add(t[i + n])
    return out


class PastTextGuard(LogitsProcessor):
    """Per row: no run of more than `limits[r]` tokens of one of its person's past texts (`pasts[r]`) in the
    generated text, unless the row's prompt holds it. The first call sees the prompt alone (generate calls once
    a step), which is where the prompt's runs are learnt. A row whose every candidate would copy ends there.
    `prompt_exempt` False: the prompt holds the person's own past texts (their retrieved items), so it exempts
    nothing."""

    def __init__(self, pasts: Sequence[Sequence[Sequence[int]]], limits: Sequence[int], eos: int | None,
                 prompt_exempt: bool = True, breaks: frozenset[int] = frozenset(), near: float = NEAR):
        self.limits, self.eos, self.prompt_exempt = list(limits), eos, prompt_exempt
        self.grams = [_grams(texts, n) for texts, n in zip(pasts, limits)]
        self.prompt_length: int | None = None
        # the near-copy end: a line may not end while it nearly is one of the row's past texts (breaks: the
        # tokens that end a line or the text; none given, only the runs are limited)
        self.breaks, self.near = sorted(breaks | ({eos} if eos is not None and breaks else set())), near
        self.texts = [[[t for t in text if t not in breaks] for text in texts] for texts in pasts]

    @torch.no_grad()
    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.prompt_length is None:
            self.prompt_length = input_ids.shape[1]
            # the prompt's own runs stay writable (not across padding)
            for r, row in enumerate(input_ids.tolist() if self.prompt_exempt else []):
                for prefix, nxt in _grams([row], self.limits[r]).items():
                    if prefix in self.grams[r] and self.eos not in prefix:
                        self.grams[r][prefix] -= nxt - {self.eos}
            return scores
        out = None
        for r, row in enumerate(input_ids[:, self.prompt_length:].tolist()):
            n = self.limits[r]
            banned = self.grams[r].get(tuple(row[-n:])) if len(row) >= n else None
            if not banned:
                continue
            out = scores.clone() if out is None else out
            out[r, list(banned)] = -math.inf
            if not torch.isfinite(out[r]).any() and self.eos is not None:
                out[r, self.eos] = 0.0
        if self.breaks:
            out = self._no_near_copy_end(input_ids[:, self.prompt_length:].tolist(), scores if out is None else out)
        return scores if out is None else out

    def _no_near_copy_end(self, rows: list[list[int]], scores: torch.FloatTensor) -> torch.FloatTensor:
        """Masks the line ends of a row whose current line nearly is one of its past texts, when a line end is among
        its likeliest tokens (the LCS is work: done only where the row could end the line now)."""
        likely = scores.topk(min(10, scores.shape[1]), dim=1).indices.tolist()
        breaks, out = set(self.breaks), scores
        for r, row in enumerate(rows):
            if not self.texts[r] or not breaks & set(likely[r]):
                continue
            cut = max((i for i, t in enumerate(row) if t in breaks), default=-1)
            line = row[cut + 1:]
            # F = 2·LCS / (|a| + |b|) <= 2·min / (|a| + |b|): a text much longer or shorter than the line cannot reach it
            near = (t for t in self.texts[r] if 2 * min(len(t), len(line)) >= self.near * (len(t) + len(line)))
            if len(line) < 2 or max((lcs_f(line, t) for t in near), default=0.0) < self.near:
                continue
            out = scores.clone() if out is scores else out
            kept = out[r].clone()
            out[r, self.breaks] = -math.inf
            if not torch.isfinite(out[r]).any():  # nothing else to write: it ends as it is
                out[r] = kept
        return out


def past_text_guard(styles: Sequence, settings: StyleSettings, eos: int | None,
                    breaks: frozenset[int] = frozenset()) -> PastTextGuard | None:
    """The guard for rows decoded with these UserStyles (one per row), or None where it has nothing to do: off in
    the settings, or no row's style holds past texts (no memory). A style that retrieves the person's items into
    the prompt gets no exemption from the prompt (those items are the texts not to hand back). `breaks`:
    line_breaks(tok), for the near-copy end."""
    if not settings.no_copy:
        return None
    pasts = [past_texts(getattr(st, "values", ()), eos) for st in styles]
    if not any(pasts):
        return None
    return PastTextGuard(pasts, [own_reuse(p, settings.copy_run_floor) for p in pasts], eos,
                         prompt_exempt=not settings.retrieval, breaks=breaks)
