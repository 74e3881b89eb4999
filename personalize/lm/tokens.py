"""Tokenisation shared by training, features and decoding: chat prompts, targets, padding.

Every stage must see the same token sequence for a (prompt, text) pair, or the
hidden states that the head is trained on would not match those it sees while
decoding; so all of them build sequences here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from personalize.flags import setting

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class TokenBudget:
    """Truncation that keeps CPU training and decoding affordable (cost grows with tokens)."""

    max_prompt_tokens: int = setting(160, "the task input is cut to this many tokens before templating")
    max_target_tokens: int = setting(40, "history outputs (titles, subjects, tweets) are cut to this many tokens")

    def __post_init__(self):
        if self.max_prompt_tokens < 8 or self.max_target_tokens < 2:
            raise ValueError("token budget too small: max_prompt_tokens >= 8 and max_target_tokens >= 2")


def prompt_ids(tok, x: str, budget: TokenBudget) -> list[int]:
    """The model's chat prompt for task input x, ending where the answer starts."""
    ids = tok(x, add_special_tokens=False)["input_ids"]
    if len(ids) > budget.max_prompt_tokens:
        x = tok.decode(ids[: budget.max_prompt_tokens])
    if getattr(tok, "chat_template", None):
        text = tok.apply_chat_template([{"role": "user", "content": x}], add_generation_prompt=True, tokenize=False)
        return tok(text, add_special_tokens=False)["input_ids"]
    return tok(x + "\n", add_special_tokens=True)["input_ids"]


def target_ids(tok, y: str, budget: TokenBudget) -> list[int]:
    """The answer's tokens followed by end-of-sequence, so models learn to stop."""
    ids = tok(y, add_special_tokens=False)["input_ids"][: budget.max_target_tokens]
    return ids + [tok.eos_token_id]


def left_pad(seqs: list[list[int]], pad_id: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Left padding, so the last column is every row's newest token (what decoding needs)."""
    import torch  # here: TokenBudget is read by the command line, which loads no model code

    n = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), n), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), n), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, n - len(s):] = torch.tensor(s, dtype=torch.long)
        mask[i, n - len(s):] = 1
    return ids.to(device), mask.to(device)


def decode(tok, ids) -> str:
    """Text of generated ids; a multi-byte character cut by the token limit (a trailing U+FFFD) is dropped."""
    return tok.decode(ids, skip_special_tokens=True).strip().rstrip("\ufffd").rstrip()
