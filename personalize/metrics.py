"""Evaluation metrics (METHOD §6): ROUGE-1 / ROUGE-L F1 with stemming, macro-averaged over queries."""

from __future__ import annotations

from typing import Sequence

from rouge_score import rouge_scorer

_SCORER = rouge_scorer.RougeScorer(["rouge1", "rougeL"], use_stemmer=True)


def rouge_scores(predictions: Sequence[str], golds: Sequence[str]) -> dict[str, float]:
    if len(predictions) != len(golds):
        raise ValueError("predictions and golds differ in length")
    if not golds:
        return {"rouge1": 0.0, "rougeL": 0.0, "n": 0}
    r1 = rl = 0.0
    for p, g in zip(predictions, golds):
        s = _SCORER.score(g, p)
        r1, rl = r1 + s["rouge1"].fmeasure, rl + s["rougeL"].fmeasure
    return {"rouge1": r1 / len(golds), "rougeL": rl / len(golds), "n": len(golds)}
