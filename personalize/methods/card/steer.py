"""CARD's steering of its rows in a mixed batch (serving.rows.Steer): decoding.CardLogitsProcessor with the row's
own style and α, on the hidden states of the batch's last n layers."""

from __future__ import annotations

from dataclasses import dataclass

from personalize.card.decoding import CardLogitsProcessor
from personalize.card.head import PersonalizationHead
from personalize.card.style import StyleSettings, StyleTensors, UserStyle
from personalize.serving.rows import Steer


@dataclass(frozen=True)
class CardSteer(Steer):
    """CARD's correction on this row (decoding.CardLogitsProcessor with the row's own style)."""

    head: PersonalizationHead
    style: UserStyle
    settings: StyleSettings
    n_layers: int
    restricts_top_k = True  # CARD keeps the top-k candidates itself

    @property
    def hidden_layers(self) -> int:
        return self.n_layers

    def check(self, row) -> None:
        if row.adapter is None:
            raise ValueError("CARD corrects a cluster model: a CARD row needs its cluster adapter")

    def processors(self, settings, first, repeats, hidden, trace):
        proc = CardLogitsProcessor(self.head, StyleTensors.of([self.style], self.settings), self.settings, hidden,
                                   settings.alpha, settings.top_k, settings.standardize)
        if trace:
            proc.trace = []
        return [*first, proc, *repeats], (proc if trace else None)

    def steps(self, tracer, new, k: int) -> list:
        """The Why view's dicts, each with the token chosen."""
        for t, step in enumerate(tracer.trace):
            step["chosen"] = new[t: t + 1].cpu() if t < len(new) else None
        return tracer.trace
