"""Evaluation metrics (METHOD §6): ROUGE-1 / ROUGE-L F1 with stemming, macro-averaged over queries; whether an
output loops or echoes its prompt's scaffold (issue 36)."""

from __future__ import annotations

import re
from collections import Counter
from functools import lru_cache
from typing import Sequence

import numpy as np


@lru_cache(maxsize=1)
def _scorer():
    """Made on first use: rouge-score pulls in nltk, which the app's start does not need."""
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rouge1", "rougeL"], use_stemmer=True)


def _scores(predictions: Sequence[str], golds: Sequence[str]) -> list[dict]:
    if len(predictions) != len(golds):
        raise ValueError("predictions and golds differ in length")
    return [_scorer().score(g, p) for p, g in zip(predictions, golds)]


def rouge_per_query(predictions: Sequence[str], golds: Sequence[str]) -> list[float]:
    """ROUGE-L F1 of each query (for paired bootstrap intervals)."""
    return [s["rougeL"].fmeasure for s in _scores(predictions, golds)]


def rouge_scores(predictions: Sequence[str], golds: Sequence[str]) -> dict[str, float]:
    scores = _scores(predictions, golds)
    if not scores:
        return {"rouge1": 0.0, "rougeL": 0.0, "n": 0}
    return {k: sum(s[k].fmeasure for s in scores) / len(scores) for k in ("rouge1", "rougeL")} | {"n": len(scores)}


_UNIT = re.compile(r"\w+|[^\w\s]+")  # a word, or a run of punctuation ("...", "****" are one unit each)


def text_units(text: str) -> list[str]:
    """The units the loop check counts, lowercase: words and runs of punctuation. Not the model's tokens, so that
    every method and model is measured alike ("dev-dev-dev" is dev, -, dev, -, dev)."""
    return _UNIT.findall(text.lower())


def looping(text: str, max_n: int = 6, times: int = 3, cover: float = 0.5) -> bool:
    """True when the text loops (issue 36's check): some n-gram of up to `max_n` units (text_units) occurs
    `times` times back to back anywhere ("dev-dev-dev-dev", "Synthesizer. Synthesizer. Synthesizer."), or one
    phrase of up to `max_n` units, seen at least `times` times, covers over `cover` of the units ("The previous
    response was: a The previous response was: b The previous response was: c")."""
    w = text_units(text)
    for n in range(1, max_n + 1):
        for i in range(len(w) - times * n + 1):
            if all(w[i + j * n: i + (j + 1) * n] == w[i: i + n] for j in range(1, times)):
                return True
    for n in range(1, max_n + 1):
        counts = Counter(tuple(w[i: i + n]) for i in range(len(w) - n + 1))
        if any(c >= times and c * n > cover * len(w) for c in counts.values()):
            return True
    return False


def _norm(line: str) -> str:
    return " ".join(line.lower().split())


def echoes(text: str, scaffold: Sequence[str], min_words: int = 3) -> bool:
    """True when the output repeats a line of the prompt's scaffold (its instruction, a retrieved-item header):
    a scaffold line of `min_words` or more words inside the output, or an output line of that many words that
    begins one (an echo cut short by the token budget). `scaffold`: the lines no output should repeat."""
    lines = [_norm(s) for s in scaffold]
    lines = [s for s in lines if len(s.split()) >= min_words]
    if not lines:
        return False
    flat = _norm(text)
    outs = [o for o in (_norm(x) for x in text.splitlines()) if len(o.split()) >= min_words]
    return any(s in flat for s in lines) or any(s.startswith(o) for o in outs for s in lines)


def paired_interval(d: np.ndarray, n_boot: int = 1000, seed: int = 0, rng: np.random.Generator | None = None) -> dict:
    """Mean of paired differences with its bootstrap 95 % interval (the pairs resampled), wins and losses."""
    rng = rng or np.random.default_rng(seed)
    d = np.asarray(d, dtype=float)
    boots = d[rng.integers(0, len(d), size=(n_boot, len(d)))].mean(1)
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return {"mean": round(float(d.mean()), 4), "ci95": [round(float(lo), 4), round(float(hi), 4)],
            "wins": int((d > 0).sum()), "losses": int((d < 0).sum()), "n": len(d)}
