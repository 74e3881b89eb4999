"""card_cad (issue 23, item 2d): the person's nearest items before the prompt, their effect amplified by
context-aware decoding (Shi et al. 2023, "Trusting Your Evidence"): p(y | items, x)^(1+β) / p(y | x)^β on the
person's cluster model, among the tokens the model with their items finds plausible.

Why: on held-out people, copying a person's nearest past text beats every model output, and a small model given
those texts in its prompt still writes its population's forms. Contrasting the two prompts keeps what the
person's own texts add. One row and a twin on the same adapter with the plain prompt, in lockstep (the runner's
twin, as COPE's); COPE's processor gives both the contrast, since (1+β)·a − β·b ranks tokens as a − β/(1+β)·b.
"""

from __future__ import annotations

from dataclasses import dataclass
from personalize.methods.cope import CopeSteer


@dataclass(frozen=True)
class ContrastConfig:
    """β: how far the person's items are trusted beyond the model's prior (the paper's 0.5); τ: plausibility, the
    tokens kept have p(token | items, x) ≥ τ · the best one's."""

    beta: float = 0.5
    tau: float = 0.1

    def __post_init__(self):
        if self.beta < 0:
            raise ValueError(f"beta must be >= 0, got {self.beta}")
        if not 0 <= self.tau <= 1:
            raise ValueError(f"tau must be in [0, 1], got {self.tau}")


@dataclass(frozen=True)
class ContrastSteer(CopeSteer):
    """A row whose prompt carries the person's items, contrasted with its twin: the same adapter, the plain prompt."""

    plain_prompt: str = ""
    twin_error = "card_cad: the row and its plain-prompt twin chose different tokens"

    @property
    def twin_prompt(self) -> str:
        return self.plain_prompt


def contrast_steer(adapter: str, plain_prompt: str, cfg: ContrastConfig = ContrastConfig()) -> ContrastSteer:
    """The steer of a row whose prompt carries the person's items (decode.rows builds the row)."""
    return ContrastSteer(cfg.beta / (1 + cfg.beta), cfg.tau, adapter, plain_prompt=plain_prompt)
