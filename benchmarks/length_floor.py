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

from benchmarks.form_tune import baseline, judged_line, tuning_parser
from personalize.methods.card import card_decode


def floors(engine, profiles, q: float) -> list[int]:
    """Per person, the q-quantile of their past outputs' lengths in tokens."""
    return [int(np.quantile([len(engine.tok(it.y, add_special_tokens=False)["input_ids"]) for it in items] or [1], q))
            for items in profiles]


def main(argv=None) -> None:
    p = tuning_parser(__doc__)
    p.add_argument("--quantiles", default="0.25,0.5")
    a = p.parse_args(argv)
    b = baseline(a)
    engine, fits, styles, prompts = b.engine, b.fits, b.styles, b.prompts
    rows = []
    for q in map(float, a.quantiles.split(",")):
        floor = floors(engine, b.profiles, q)

        def decode(i: int, j: int) -> str:  # person i's query, with person j's style and floor
            s = replace(engine.cfg.decoding, min_new_tokens=max(1, min(floor[j], engine.cfg.decoding.max_new_tokens)))
            f = fits[j]
            return card_decode.generate(engine, [prompts[i]], "card", f.cluster, [styles[j]], k=f.k, settings=s)[0].text

        rows.append({"quantile": q, **b.judge(decode)})
        print(f"floor q {q:g}: {judged_line(rows[-1])}", flush=True)
    if a.json:
        json.dump({"people": len(fits), "cluster": float(b.cluster.mean()), "card": float(b.card.mean()), "rows": rows},
                  open(a.json, "w"))


if __name__ == "__main__":
    main()
