"""The person's length as a floor: card with no end-of-sequence before a quantile of the person's own outputs'
lengths (in tokens), tried on people of sources kept for tuning (never the study's). card writes shorter than the
people who write long (the longest-writing third: 5.5 words against their 7.1 on the 154 people of the study).
Each person decoded alone with their own floor; ROUGE-L, card − cluster and card − the same with another person's
style and floor, with paired intervals.

    python -m benchmarks.length_floor --artifacts B --data G --sources pytest-dev/pytest,encode/django-rest-framework \
        --limit 40 --cache fits.pt --quantiles 0.25,0.5
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np

from benchmarks.form_study import copied_share
from benchmarks.form_tune import baseline, tuning_parser
from personalize.methods.card import card_decode
from personalize.metrics import paired_interval, rouge_per_query


def floors(engine, profiles, q: float) -> list[int]:
    """Per person, the q-quantile of their past outputs' lengths in tokens."""
    return [int(np.quantile([len(engine.tok(it.y, add_special_tokens=False)["input_ids"]) for it in items] or [1], q))
            for items in profiles]


def main(argv=None) -> None:
    p = tuning_parser(__doc__)
    p.add_argument("--quantiles", default="0.25,0.5")
    a = p.parse_args(argv)
    b = baseline(a)
    engine, queries, profiles, fits, styles, partner = b.engine, b.queries, b.profiles, b.fits, b.styles, b.partner
    prompts, golds, cluster, card = b.prompts, b.golds, b.cluster, b.card
    rows = []
    for q in map(float, a.quantiles.split(",")):
        floor = floors(engine, profiles, q)

        def decode(i: int, j: int) -> str:  # person i's query, with person j's style and floor
            s = replace(engine.cfg.decoding, min_new_tokens=max(1, min(floor[j], engine.cfg.decoding.max_new_tokens)))
            f = fits[j]
            return card_decode.generate(engine, [prompts[i]], "card", f.cluster, [styles[j]], k=f.k, settings=s)[0].text

        texts = [decode(i, i) for i in range(len(fits))]
        own = np.asarray(rouge_per_query(texts, golds))
        other = np.asarray(rouge_per_query([decode(i, partner[i]) for i in range(len(fits))], golds))
        c, o = paired_interval(own - cluster), paired_interval(own - other)
        rows.append({"quantile": q, "rougeL": float(own.mean()), "minus_cluster": c, "minus_shuffled": o,
                     "minus_card": paired_interval(own - card), "copied": copied_share(texts, queries), "outputs": texts})
        print(f"floor q {q:g}: ROUGE-L {own.mean():.4f}  −cluster {c['mean']:+.4f} [{c['ci95'][0]:+.3f}, "
              f"{c['ci95'][1]:+.3f}]  −card {rows[-1]['minus_card']['mean']:+.4f}  −shuffled {o['mean']:+.4f} "
              f"[{o['ci95'][0]:+.3f}, {o['ci95'][1]:+.3f}]  copied {rows[-1]['copied']:.0%}", flush=True)
    if a.json:
        json.dump({"people": len(fits), "cluster": float(cluster.mean()), "card": float(card.mean()), "rows": rows},
                  open(a.json, "w"))


if __name__ == "__main__":
    main()
