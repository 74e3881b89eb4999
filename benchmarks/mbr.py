"""Minimum Bayes risk over the person's own distribution: n samples of card (the person's style) plus its greedy
output, the candidate most like the rest kept (ROUGE-L as the utility). Teacher-forced, a person's own style gives
their held-out text +0.41 nats a token over another person's, yet the greedy text carries little of it: MBR reads
the whole distribution, not its argmax. The same selection over the cluster model's samples and over another
person's style says how much of any gain is the selection and how much the person. People of sources kept for
tuning (never the study's); paired intervals.

    python -m benchmarks.mbr --artifacts B --data G --sources pytest-dev/pytest,encode/django-rest-framework \
        --limit 40 --cache fits.pt --samples 8 --temperatures 0.7,1.0
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import torch

from benchmarks.form_study import copied_share
from benchmarks.form_tune import baseline, interval_text, tuning_parser
from personalize.eval.evaluate import decode_people
from personalize.methods.card import card_decode
from personalize.metrics import paired_interval, rouge_per_query


def consensus(cands: list[str]) -> str:
    """The candidate with the highest summed ROUGE-L against the others (MBR; the first of equals)."""
    n = len(cands)
    if n == 1:
        return cands[0]
    pairs = [(i, j) for i in range(n) for j in range(n) if i != j]
    s = rouge_per_query([cands[i] for i, _ in pairs], [cands[j] for _, j in pairs])
    score = np.zeros(n)
    for (i, _), v in zip(pairs, s):
        score[i] += v
    return cands[int(np.argmax(score))]


def main(argv=None) -> None:
    p = tuning_parser(__doc__)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--temperatures", default="0.7,1.0")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    b = baseline(a)
    engine, queries, profiles, fits, styles, partner = b.engine, b.queries, b.profiles, b.fits, b.styles, b.partner
    prompts, golds, cluster, card = b.prompts, b.golds, b.cluster, b.card
    cluster_g = decode_people(engine, "cluster", prompts, fits, styles, profiles)  # the greedy texts join the pools
    card_g = decode_people(engine, "card", prompts, fits, styles, profiles)
    rows = []
    for t in map(float, a.temperatures.split(",")):
        s = replace(engine.cfg.decoding, do_sample=True, temperature=t)

        def pool(method: str, i: int, j: int, greedy: str) -> list[str]:  # person i's query, person j's style
            torch.manual_seed(a.seed * 7919 + i)
            f = fits[j]
            gens = card_decode.generate(engine, [prompts[i]] * a.samples, method, f.cluster, [styles[j]] * a.samples,
                                        k=f.k, settings=s)
            return [greedy] + [g.text for g in gens]

        res = {}
        for name, method, who, greedy in (("cluster_mbr", "cluster", None, cluster_g), ("card_mbr", "card", None, card_g),
                                          ("shuffled_mbr", "card", partner, None)):
            texts = []
            for i in range(len(fits)):
                j = i if who is None else who[i]
                g = greedy[i] if greedy is not None else card_decode.generate(
                    engine, [prompts[i]], "card", fits[j].cluster, [styles[j]], k=fits[j].k)[0].text
                texts.append(consensus(pool(method, i, j, g)))
            res[name] = (np.asarray(rouge_per_query(texts, golds)), texts)
        own = res["card_mbr"][0]
        row = {"temperature": t, "samples": a.samples, **{k: float(v[0].mean()) for k, v in res.items()},
               "card_mbr-cluster": paired_interval(own - cluster), "card_mbr-card": paired_interval(own - card),
               "card_mbr-shuffled_mbr": paired_interval(own - res["shuffled_mbr"][0]),
               "card_mbr-cluster_mbr": paired_interval(own - res["cluster_mbr"][0]),
               "copied": copied_share(res["card_mbr"][1], queries), "outputs": res["card_mbr"][1]}
        rows.append(row)
        print(f"T {t:g}: card_mbr {row['card_mbr']:.4f} cluster_mbr {row['cluster_mbr']:.4f} shuffled_mbr "
              f"{row['shuffled_mbr']:.4f} | −cluster {interval_text(row['card_mbr-cluster'])} −card {interval_text(row['card_mbr-card'])} "
              f"−shuffled_mbr {interval_text(row['card_mbr-shuffled_mbr'])} −cluster_mbr {interval_text(row['card_mbr-cluster_mbr'])} "
              f"copied {row['copied']:.0%}", flush=True)
    if a.json:
        json.dump({"people": len(fits), "cluster": float(cluster.mean()), "card": float(card.mean()), "rows": rows},
                  open(a.json, "w"))


if __name__ == "__main__":
    main()
