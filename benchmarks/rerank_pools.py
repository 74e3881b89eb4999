"""card_rerank's candidate pools, read from one eval run's JSON (no model: seconds).

`eval --methods ...,card_rerank --rerank n=8` keeps, per query, every candidate (the cluster model's greedy
output, CARD's, samples 1..6) with its score under the person's style. A sample's seed depends on the rerank
seed, the prompt and its number only (rerank.sample_seed), and a candidate's score on its text and the
person's style only, so the choice within a prefix or a subset of those candidates is the choice rerank makes
with that pool: 2 (cluster or card), 4 (+ samples 1-2), 8, samples only (6), and the oracle (the candidate
with the best ROUGE-L: what a perfect reranker of this pool would reach). Each pool's ROUGE-L, its paired
bootstrap interval against the cluster model and card, and how often it kept each kind of candidate.

    python -m benchmarks.rerank_pools /tmp/eval.json
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

import numpy as np

from personalize.metrics import paired_interval
from personalize.metrics import rouge_per_query

POOLS = {"cluster or card (n = 2)": slice(0, 2), "greedy + 2 samples (n = 4)": slice(0, 4),
         "greedy + 6 samples (n = 8)": slice(0, 8), "6 samples only": slice(2, 8)}


def choose(cands: list[dict], pool: slice) -> dict:
    sub = cands[pool]
    return sub[int(np.argmax([c["score"] for c in sub]))]  # the first of equal scores, as rerank


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("eval_json")
    p.add_argument("--method", default="card_rerank")
    p.add_argument("--n-boot", type=int, default=2000)
    a = p.parse_args(argv)
    res = json.loads(open(a.eval_json).read())
    preds = res["predictions"]
    golds = [q["gold"] for q in preds]
    base = {m: rouge_per_query([q[m] for q in preds], golds) for m in ("cluster", "card") if m in preds[0]}
    rows = {}
    for name, pool in {**POOLS, "oracle (best ROUGE-L of the 8)": None}.items():
        chosen = []
        for q in preds:
            cands = q[f"{a.method}_candidates"]
            if pool is None:
                r = rouge_per_query([c["text"] for c in cands], [q["gold"]] * len(cands))
                chosen.append(cands[int(np.argmax(r))])
            else:
                chosen.append(choose(cands, pool))
        r = rouge_per_query([c["text"] for c in chosen], golds)
        rows[name] = {"rougeL": round(float(np.mean(r)), 4),
                      "kept": dict(Counter(c["candidate"].split()[0] for c in chosen))}
        for m, b in base.items():
            rows[name][f"- {m}"] = paired_interval(np.asarray(r) - np.asarray(b), a.n_boot)
    print(json.dumps({"n": len(preds), **{m: round(float(np.mean(b)), 4) for m, b in base.items()}, "pools": rows},
                     indent=1))


if __name__ == "__main__":
    main()
