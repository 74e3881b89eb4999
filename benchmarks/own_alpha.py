"""The person's own strength: α chosen per person by decoding their own held-out items (Explore's sweep, made at
onboarding). The fallback (cluster model or style, by teacher-forced accuracy on the held-out items) lowered card;
this asks the decoded text itself. Per person: the style fitted without their newest items (the fit's held-out
split) decodes those items' prompts at each α; the α with the best ROUGE-L against what they really wrote (ties: the
build's α) decodes their query with the style fitted on everything. card_shuffled: another person's style at the α
chosen on that person's own items. People of sources kept for tuning (never the study's); paired intervals.

    python -m benchmarks.own_alpha --artifacts B --data G --sources pytest-dev/pytest,encode/django-rest-framework \
        --limit 40 --cache fits.pt --alphas 0,1,2
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace

import numpy as np

from benchmarks.form_tune import baseline, judged_line, tuning_parser
from personalize.methods.card import card_decode
from personalize.metrics import rouge_per_query


def main(argv=None) -> None:
    p = tuning_parser(__doc__)
    p.add_argument("--alphas", default="0,1,2")
    a = p.parse_args(argv)
    b = baseline(a)
    engine, profiles, fits, styles, prompts = b.engine, b.profiles, b.fits, b.styles, b.prompts
    alphas, build_alpha = [float(x) for x in a.alphas.split(",")], engine.cfg.decoding.alpha

    def held_score(f, items, alpha: float) -> float:
        held = items[: f.n_hold]
        outs = card_decode.generate(engine, [it.x for it in held], "card", f.cluster, [f.held_style] * len(held),
                                    k=f.k, settings=replace(engine.cfg.decoding, alpha=alpha))
        return float(np.mean(rouge_per_query([g.text for g in outs], [it.y for it in held])))

    chosen = []
    for f, items in zip(fits, profiles):
        if not f.n_hold or f.held_style is None:
            chosen.append(build_alpha)
            continue
        scores = {al: held_score(f, items, al) for al in alphas}
        best = max(scores.values())
        chosen.append(build_alpha if scores.get(build_alpha) == best else max(scores, key=scores.get))
    print("chosen α:", dict(Counter(chosen)), flush=True)

    def decode(i: int, j: int) -> str:  # person i's query with person j's style at j's α
        f = fits[j]
        s = replace(engine.cfg.decoding, alpha=chosen[j])
        return card_decode.generate(engine, [prompts[i]], "card", f.cluster, [styles[j]], k=f.k, settings=s)[0].text

    res = {"people": len(fits), "cluster": float(b.cluster.mean()), "card": float(b.card.mean()), "alphas": alphas,
           "chosen": chosen, **b.judge(decode)}
    print(f"own α: {judged_line(res)}", flush=True)
    if a.json:
        json.dump(res, open(a.json, "w"))


if __name__ == "__main__":
    main()
