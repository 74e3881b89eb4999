"""CARD at the person's own setting (issue 23, item 2b): the steering strength α and whether their nearest items go
before the prompt, chosen per person on their own held-out items, during the fit, in one mixed batch.

Why: one setting for a whole population moves everyone alike, and on people of a source no build saw the
population's forms ("BUG:", "DOC:") come with it. The person's newest items, held out of their style's fit, say
how far *their* text should move from the cluster model: their prompts are decoded under every candidate (α = 0
is the cluster model) with the style fitted without them, retrieving from their other items, and the setting
whose outputs are closest to what they really wrote (ROUGE-L) is kept. The build's setting stays unless another
is strictly better, so a person with no held-out items, or with items that cannot tell, decodes as `card` does.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from personalize.card.style import OwnSetting
from personalize.catalog import PERSONAL
from personalize.data import Item
from personalize.metrics import rouge_per_query
from personalize.methods.card import decode as card_decode

FACTORS = (0.0, 0.5, 2.0)  # further α candidates, as multiples of the build's (0: the cluster model's output)


@dataclass(frozen=True)
class OwnChoice:
    """The person's setting and the mean ROUGE-L of their held-out items under every candidate."""

    setting: OwnSetting
    scores: dict[OwnSetting, float]
    n_items: int


def candidates(build_alpha: float, factors: Sequence[float] = FACTORS) -> list[OwnSetting]:
    """The build's setting first (ties keep it), the other α, then retrieval. A build whose guard set α = 0 still
    lets a person's own items ask for the style: its candidates scale from α = 1."""
    if any(f < 0 for f in factors):
        raise ValueError(f"α factors must be >= 0, got {list(factors)}")
    scale = build_alpha or 1.0
    others = sorted({f * scale for f in (*factors, 1.0)} - {build_alpha})
    return [OwnSetting(build_alpha), *(OwnSetting(a) for a in others), OwnSetting(scale, retrieval=True)]


def choose_own_setting(engine, fit, items: Sequence[Item], factors: Sequence[float] = FACTORS) -> OwnChoice:
    """The setting of `fit`'s person: their first fit.n_hold items (the newest, held out of fit.held_style) decoded
    under every candidate in one mixed batch (engine.decode_rows), retrieving from their other items."""
    build = OwnSetting(engine.cfg.decoding.alpha)
    held, rest = list(items[: fit.n_hold]), list(items[fit.n_hold:])
    if not held or fit.held_style is None:
        return OwnChoice(build, {}, 0)
    options = candidates(build.alpha, factors)
    prompts, golds = [it.x for it in held], [it.y for it in held]
    rows = []
    for o in options:
        rows += card_decode.rows(engine, prompts, PERSONAL, fit.cluster, replace(fit.held_style, own=o), k=fit.k,
                                 items=rest)
    texts = [g.text for g in engine.decode_rows(rows)]
    n = len(held)
    scores = {o: float(np.mean(rouge_per_query(texts[j * n: (j + 1) * n], golds))) for j, o in enumerate(options)}
    best = max(options, key=lambda o: (scores[o], o == build))
    return OwnChoice(best, scores, n)
