"""Issue 23: how far could any mix of a method and BM25 copy get above copying? Read from an eval run, no model.

On commits of a source no build saw, copying the person's BM25-nearest past subject beats every model output,
OPPU's included. Before building a method that sometimes copies, this bounds what one could reach: per person,
the oracle that keeps the better of the method's output and the copy (no real choice can beat it), and a real
choice, a gate that copies when the nearest past item stands out from the next (its BM25 margin over the
second), its threshold chosen on one half of the people and scored on the other (2-fold, both ways).

    python -m benchmarks.copy_ceiling --eval scipy_all.json --data ../shared/data/commit_subjects --json ceiling.json
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from personalize.data import read_lamp
from personalize.eval.evaluate import bm25_scores
from personalize.metrics import paired_interval, rouge_per_query

COPY = "bm25_copy"


def bm25_margin(query: str, profile) -> float:
    """The nearest profile item's BM25 score minus the second's, as eval's bm25_copy scores them."""
    s = np.sort(bm25_scores(query, profile))[::-1]
    return float(s[0] - (s[1] if len(s) > 1 else 0.0))


def gate_2fold(margin: np.ndarray, method: np.ndarray, copy: np.ndarray,
               seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Per person, the gate's ROUGE-L and whether it copied: copy where margin ≥ the threshold chosen on the
    other half's people."""
    idx = np.random.default_rng(seed).permutation(len(margin))
    halves, copied = (idx[: len(idx) // 2], idx[len(idx) // 2:]), np.zeros(len(margin), dtype=bool)
    for fit, score in (halves, halves[::-1]):
        ths = np.concatenate([np.unique(margin[fit]), [np.inf]])  # inf: never copy
        best = max(ths, key=lambda t: np.where(margin[fit] >= t, copy[fit], method[fit]).mean())
        copied[score] = margin[score] >= best
    return np.where(copied, copy, method), copied


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--eval", required=True, help="an eval --json output whose methods include bm25_copy")
    ap.add_argument("--data", required=True)
    ap.add_argument("--split", default="dev")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    run = json.load(open(a.eval))
    preds = run["predictions"]
    methods = [m for m in run["methods"] if m != COPY]
    if COPY not in run["methods"] or not methods:
        raise SystemExit(f"{a.eval}: the run needs {COPY} and at least one method beside it")
    _, queries = read_lamp(a.data, a.split)
    by_id = {q.id: q for q in queries}
    if any(p["id"] not in by_id for p in preds):
        raise SystemExit(f"{a.eval}: its queries are not all in {a.data} ({a.split})")
    golds = [p["gold"] for p in preds]
    copy = np.asarray(rouge_per_query([p[COPY] for p in preds], golds))
    margin = np.asarray([bm25_margin(by_id[p["id"]].input, by_id[p["id"]].profile) for p in preds])
    report = {"n": len(preds), COPY: round(float(copy.mean()), 4), "methods": {}}
    print(f"{len(preds)} people; {COPY} ROUGE-L {copy.mean():.4f}")
    print(f"{'method':16s} {'alone':>7s} {'oracle':>7s} {'gate':>7s}  gate − copy [95 %]     copied")
    for m in methods:
        own = np.asarray(rouge_per_query([p[m] for p in preds], golds))
        gate, copied = gate_2fold(margin, own, copy)
        d = paired_interval(gate - copy, seed=0)
        report["methods"][m] = {"alone": round(float(own.mean()), 4),
                                "oracle": round(float(np.maximum(own, copy).mean()), 4),
                                "gate": round(float(gate.mean()), 4), "gate_copies": round(float(copied.mean()), 4),
                                "gate_minus_copy": d,
                                "oracle_minus_copy": paired_interval(np.maximum(own, copy) - copy, seed=0)}
        print(f"{m:16s} {own.mean():7.4f} {np.maximum(own, copy).mean():7.4f} {gate.mean():7.4f}  "
              f"{d['mean']:+.4f} [{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}]  {copied.mean():5.0%}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
