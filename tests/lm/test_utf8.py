"""Whole characters only (lm/utf8.py): with SmolLM2's byte-level tokenizer an emoji is several byte tokens, and a
correction that favours one of them (CARD's style of a person who writes emoji) showed "omg the���� run" in
Compare. A processor pushing toward a lone first byte and then a word must still give valid text, on both decoding
paths (the library's generate and the mixed-batch runner)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import LogitsProcessor

from personalize.serving.generation import generate
from personalize.serving.settings import DecodingSettings
from personalize.lm.tokens import TokenBudget
from personalize.lm.utf8 import pending, token_bytes, utf8_guard
from personalize.serving.rows import DecodeRow, Steer
from personalize.serving.runner import decode_rows

BUDGET = TokenBudget(max_prompt_tokens=16, max_target_tokens=8)
SETTINGS = DecodingSettings(max_new_tokens=6)


def lead_and_word(tokenizer) -> tuple[int, int]:
    """A token that is only the first two bytes of an emoji, and " the"."""
    tb = token_bytes(tokenizer)
    lead = next(i for i, b in enumerate(tb) if b == b"\xf0\x9f")
    return lead, tokenizer.encode(" the", add_special_tokens=False)[0]


class Push(LogitsProcessor):
    """Makes the first-bytes token, then " the", by far the best at every step (what a strong style did)."""

    def __init__(self, lead: int, word: int):
        self.lead, self.word = lead, word

    def __call__(self, input_ids, scores):
        out = scores.clone()
        out[:, self.lead] += 1e4
        out[:, self.word] += 5e3
        return out


@dataclass(frozen=True)
class PushSteer(Steer):
    lead: int = 0
    word: int = 0

    def processors(self, settings, first, repeats, hidden, trace):
        return [*first, Push(self.lead, self.word), *repeats], None


def test_inside_a_character_only_its_bytes_may_follow_and_no_end(tokenizer):
    lead, word = lead_and_word(tokenizer)
    guard = utf8_guard(tokenizer, prompt_length=1)
    scores = torch.zeros(2, len(tokenizer))
    out = guard(torch.tensor([[5, lead], [5, word]]), scores)
    tb = token_bytes(tokenizer)
    inside = (out[0] > float("-inf")).nonzero().flatten().tolist()
    assert word not in inside and tokenizer.eos_token_id not in inside and inside
    assert all(tb[i] and 0x80 <= tb[i][0] < 0xC0 for i in inside)  # continuation bytes only
    assert all(pending(tb[lead] + tb[i]) < 2 for i in inside)
    outside = out[1] > float("-inf")
    assert outside[word] and outside[lead] and outside[tokenizer.eos_token_id]
    assert not any(outside[i] for i, b in enumerate(tb) if b and 0x80 <= b[0] < 0xC0)


def test_a_push_toward_a_lone_first_byte_still_gives_whole_characters(tiny_model, tokenizer):
    lead, word = lead_and_word(tokenizer)
    prompt = "Write about your morning run."
    lib = generate(tiny_model, tokenizer, [prompt], BUDGET, SETTINGS, processors=[Push(lead, word)])[0]
    row = DecodeRow(prompt, BUDGET, SETTINGS, None, PushSteer(lead=lead, word=word))
    mixed = decode_rows(tiny_model, tokenizer, [row, DecodeRow(prompt, BUDGET, SETTINGS)])
    for text in (lib.text, mixed[0].text):
        assert "\ufffd" not in text and text.encode("utf-8").decode("utf-8") == text
        assert any(ord(c) > 0xFFFF for c in text), text  # it still wrote the emoji it was pushed to, whole
    assert mixed[0].text == lib.text
    assert utf8_guard(tokenizer, 0)(torch.tensor([[lead]]), torch.zeros(1, len(tokenizer)))[0, word] == float("-inf")
