"""Whole characters only: a LogitsProcessor that keeps a byte-level tokenizer's output valid UTF-8.

Why: a byte-level BPE (SmolLM2's, Qwen's) spells an emoji as several byte tokens. A correction that favours one of
them (CARD's style learned from a person who writes emoji, its kNN memory) can pick a first byte and then a word,
and the output shows "omg the���� run". The guard lets a row that is inside a character go on only with the bytes
that finish it, and a row that is not begin only with tokens that do not start mid-character; no end of sequence
inside a character. A tokenizer without byte tokens gets no guard (`utf8_guard` returns None).
"""

from __future__ import annotations

import functools

import torch
from transformers import LogitsProcessor


def _byte_decoder(tok) -> dict[str, int] | None:
    """Token text → bytes map of a byte-level BPE tokenizer (GPT-2's alphabet), or None."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode  # GPT-2's byte alphabet

    dec = {c: b for b, c in bytes_to_unicode().items()}
    sample = [t for t in tok.get_vocab() if t not in tok.all_special_tokens][:2000]
    return dec if sample and all(all(ch in dec for ch in t) for t in sample) else None


def token_bytes(tok) -> list[bytes | None]:
    """Each token id's bytes (None: a special token, or a tokenizer whose tokens are not byte-level)."""
    dec = _byte_decoder(tok)
    out: list[bytes | None] = [None] * len(tok)
    if dec is None:
        return out
    special = set(tok.all_special_tokens)
    for t, i in tok.get_vocab().items():
        if i < len(out) and t not in special and all(ch in dec for ch in t):
            out[i] = bytes(dec[ch] for ch in t)
    return out


def _lead_length(b: int) -> int:
    """The length of the character a byte starts (0: a continuation byte)."""
    return 1 if b < 0x80 else 0 if b < 0xC0 else 2 if b < 0xE0 else 3 if b < 0xF0 else 4


def pending(data: bytes) -> int:
    """How many continuation bytes `data` still needs to end on a whole character (0: it does)."""
    for back in range(1, min(4, len(data)) + 1):
        n = _lead_length(data[-back])
        if n:
            return max(0, n - back)
    return 0


class Utf8Guard(LogitsProcessor):
    """Masks the tokens that would leave a row's new bytes invalid; prompt_length: where each row's new tokens
    start (left-padded batches: the same for all rows). Needs, per row, at most the last four tokens' bytes."""

    def __init__(self, table: "Utf8Table", prompt_length: int, eos_token_id: int | None = None):
        self.table, self.prompt_length, self.eos = table, prompt_length, eos_token_id

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        new, vocab = input_ids[:, self.prompt_length:], scores.shape[-1]
        needs = [pending(self.table.tail(row[-4:].tolist())) for row in new]
        bad = torch.stack([self.table.bad_after(n, vocab) for n in needs]).clone()
        if self.eos is not None and self.eos < vocab:
            bad[:, self.eos] = torch.tensor(needs) > 0  # no end of sequence inside a character
        return scores.masked_fill(bad.to(scores.device), float("-inf"))


class Utf8Table:
    """Per token: how many continuation bytes it opens with, and whether it is only those; one per tokenizer."""

    def __init__(self, tokens: list[bytes | None]):
        self.tokens = tokens
        lead, only = [], []
        for b in tokens:
            k = 0
            while b and k < len(b) and _lead_length(b[k]) == 0:
                k += 1
            lead.append(k)
            only.append(bool(b) and k == len(b))
        self.lead = torch.tensor(lead)
        self.only = torch.tensor(only)
        self.starts_mid = self.lead > 0
        self._bad: dict[tuple[int, int], torch.Tensor] = {}

    def tail(self, ids: list[int]) -> bytes:
        return b"".join(self.tokens[i] or b"" for i in ids if 0 <= i < len(self.tokens))

    def bad_after(self, need: int, vocab: int) -> torch.Tensor:
        """The tokens a row that needs `need` continuation bytes may not take next."""
        key = (need, vocab)
        if key not in self._bad:
            lead = torch.zeros(vocab, dtype=torch.long)
            only = torch.zeros(vocab, dtype=torch.bool)
            n = min(vocab, len(self.lead))
            lead[:n], only[:n] = self.lead[:n], self.only[:n]
            ok = (lead == need) | (only & (lead < need)) if need else lead == 0
            if need:  # tokens without bytes (special ones) cannot finish a character
                known = torch.zeros(vocab, dtype=torch.bool)
                known[:n] = torch.tensor([b is not None for b in self.tokens[:n]])
                ok &= known
            self._bad[key] = ~ok
        return self._bad[key]


@functools.lru_cache(maxsize=8)
def _table(tok) -> Utf8Table | None:
    tokens = token_bytes(tok)
    return Utf8Table(tokens) if any(b is not None for b in tokens) else None


def utf8_guard(tok, prompt_length: int) -> Utf8Guard | None:
    """The guard for rows of this tokenizer whose new tokens start at prompt_length; None without byte tokens."""
    table = _table(tok)
    return None if table is None else Utf8Guard(table, prompt_length, tok.eos_token_id)
