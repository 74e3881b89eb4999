"""CARD at the person's own α (issue 23, item 2b): the steering strength chosen per person on their own held-out
items, during the fit, in one mixed batch.

Why: one α for a whole population moves everyone alike, and on people of a source no build saw the population's
forms ("BUG:", "DOC:") come with it. The person's newest items, held out of their style's fit, say how far
*their* text moves from the cluster model: their prompts are decoded at every candidate α (0 = the cluster model)
with the style fitted without them, and the α whose outputs are closest to what they really wrote (ROUGE-L) is
kept. The build's α stays unless another one is strictly better, so a person with no held-out items, or with
items that cannot tell, decodes as `card` does.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from personalize.data import Item
from personalize.metrics import rouge_per_query
from personalize.methods.card import decode as card_decode

FACTORS = (0.0, 0.5, 1.0, 2.0)  # candidate α as multiples of the build's (0: the cluster model's output)


@dataclass(frozen=True)
class AlphaChoice:
    """The person's α and the mean ROUGE-L of their held-out items at every candidate."""

    alpha: float
    scores: dict[float, float]
    n_items: int


def choose_alpha(engine, fit, items: Sequence[Item], factors: Sequence[float] = FACTORS) -> AlphaChoice:
    """The α of `fit`'s person: their first fit.n_hold items (the newest, held out of fit.held_style) decoded at
    every candidate in one mixed batch (engine.decode_rows), scored against their real texts."""
    build_alpha = engine.cfg.decoding.alpha
    if any(f < 0 for f in factors):
        raise ValueError(f"α factors must be >= 0, got {list(factors)}")
    held = list(items[: fit.n_hold])
    if not held or fit.held_style is None:
        return AlphaChoice(build_alpha, {}, 0)
    alphas = [build_alpha] + sorted({f * build_alpha for f in factors} - {build_alpha})  # the build's first: ties keep it
    prompts, golds = [it.x for it in held], [it.y for it in held]
    rows = []
    for a in alphas:
        method = "cluster" if a == 0 else "card"
        rows += card_decode.rows(engine, prompts, method, fit.cluster, fit.held_style, k=fit.k,
                                 settings=replace(engine.cfg.decoding, alpha=a))
    texts = [g.text for g in engine.decode_rows(rows)]
    n = len(held)
    scores = {a: float(np.mean(rouge_per_query(texts[j * n: (j + 1) * n], golds))) for j, a in enumerate(alphas)}
    best = max(alphas, key=lambda a: (scores[a], a == build_alpha))
    return AlphaChoice(best, scores, n)
