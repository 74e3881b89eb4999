"""Evaluation metrics (METHOD §6): ROUGE-1 / ROUGE-L F1 with stemming, macro-averaged over queries."""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import numpy as np


@lru_cache(maxsize=1)
def _scorer():
    """Made on first use: rouge-score pulls in nltk, which the app's start does not need."""
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rouge1", "rougeL"], use_stemmer=True)


def rouge_per_query(predictions: Sequence[str], golds: Sequence[str]) -> list[float]:
    """ROUGE-L F1 of each query (for paired bootstrap intervals)."""
    if len(predictions) != len(golds):
        raise ValueError("predictions and golds differ in length")
    return [_scorer().score(g, p)["rougeL"].fmeasure for p, g in zip(predictions, golds)]


def rouge_scores(predictions: Sequence[str], golds: Sequence[str]) -> dict[str, float]:
    if len(predictions) != len(golds):
        raise ValueError("predictions and golds differ in length")
    if not golds:
        return {"rouge1": 0.0, "rougeL": 0.0, "n": 0}
    r1 = rl = 0.0
    for p, g in zip(predictions, golds):
        s = _scorer().score(g, p)
        r1, rl = r1 + s["rouge1"].fmeasure, rl + s["rougeL"].fmeasure
    return {"rouge1": r1 / len(golds), "rougeL": rl / len(golds), "n": len(golds)}


def looping(text: str, min_repeats: int = 3, max_n: int = 8) -> bool:
    """True when the text ends in `min_repeats` or more back-to-back copies of one word n-gram (n ≤ max_n):
    "I am pleased to report that I am pleased to report that ..." or "#game #game #game"."""
    w = text.split()
    for n in range(1, max_n + 1):
        if len(w) < n * min_repeats:
            break
        tail = w[-n:]
        if all(w[len(w) - (i + 1) * n: len(w) - i * n] == tail for i in range(min_repeats)):
            return True
    return False


def paired_interval(d: np.ndarray, n_boot: int = 1000, seed: int = 0, rng: np.random.Generator | None = None) -> dict:
    """Mean of paired differences with its bootstrap 95 % interval (the pairs resampled), wins and losses."""
    rng = rng or np.random.default_rng(seed)
    d = np.asarray(d, dtype=float)
    boots = d[rng.integers(0, len(d), size=(n_boot, len(d)))].mean(1)
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return {"mean": round(float(d.mean()), 4), "ci95": [round(float(lo), 4), round(float(hi), 4)],
            "wins": int((d > 0).sum()), "losses": int((d < 0).sum()), "n": len(d)}
