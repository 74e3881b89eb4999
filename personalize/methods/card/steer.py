"""CARD's steering: what a CARD variant decodes with (card_parts: the head, the variant's style settings, one
UserStyle per prompt), and its rows' steer in a mixed batch (serving.rows.Steer): decoding.CardLogitsProcessor with
the row's own style and α, on the hidden states of the batch's last n layers."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from personalize.methods.card.decoding import CardLogitsProcessor
from personalize.methods.card.no_copy import past_text_guard
from personalize.serving.settings import DecodingSettings
from personalize.methods.card.head import PersonalizationHead
from personalize.methods.card.config import PAIR_OBJECTIVES, StyleSettings
from personalize.methods.card.style import StyleTensors, UserStyle, variant
from personalize.serving.rows import Steer


@dataclass(frozen=True)
class CardSteer(Steer):
    """CARD's correction on this row (decoding.CardLogitsProcessor with the row's own style)."""

    head: PersonalizationHead
    style: UserStyle
    settings: StyleSettings
    n_layers: int
    eos_token_id: int | None = None  # where the person's past texts end (no_copy.PastTextGuard)
    line_breaks: frozenset[int] = frozenset()  # the tokens that end a line (no_copy.line_breaks: the near-copy end)
    restricts_top_k = True  # CARD keeps the top-k candidates itself

    @property
    def hidden_layers(self) -> int:
        return self.n_layers

    def check(self, row) -> None:
        if row.adapter is None:
            raise ValueError("CARD corrects a cluster model: a CARD row needs its cluster adapter")

    def processors(self, settings, first, repeats, hidden, trace):
        proc = CardLogitsProcessor(self.head, StyleTensors.of([self.style], self.settings), self.settings, hidden,
                                   settings.alpha, settings.top_k, settings.standardize, settings.do_sample)
        if trace:
            proc.trace = []
        guard = (past_text_guard([self.style], self.settings, self.eos_token_id, self.line_breaks)
                 if settings.alpha > 0 else None)
        return [*first, proc, *([guard] if guard else []), *repeats], (proc if trace else None)

    def steps(self, tracer, new, k: int) -> list:
        """The Why view's dicts, each with the token chosen."""
        for t, step in enumerate(tracer.trace):
            step["chosen"] = new[t: t + 1].cpu() if t < len(new) else None
        return tracer.trace


def card_parts(engine, method: str, lam, n: int, s: DecodingSettings, objective: str | None = None):
    """What a CARD variant decodes with: (head, style settings, one UserStyle per prompt, decoding settings)."""
    objective = objective or engine.cfg.objectives[0]
    head = engine.heads[objective]
    style = variant(method, engine.cfg.style)
    if objective != "tokens":  # bias and memory are fitted from the tokens head's pass
        style = replace(style, bias=False, memory=False)
    return head, style, person_styles(lam, n, head.d), replace(s, standardize=objective in PAIR_OBJECTIVES)


def person_styles(lam, n: int, d: int) -> list[UserStyle]:
    """One UserStyle per prompt from a person's style: a UserStyle, a λ ([D], or [B, D] one per prompt), a list of
    either, or None (λ = 1)."""
    if lam is None:
        return [UserStyle.of(np.ones(d, np.float32))] * n
    if isinstance(lam, UserStyle):
        return [lam] * n
    if isinstance(lam, (list, tuple)):
        return [UserStyle.of(x) for x in lam]
    arr = np.asarray(lam, dtype=np.float32)
    return [UserStyle.of(r) for r in arr] if arr.ndim == 2 else [UserStyle.of(arr)] * n
