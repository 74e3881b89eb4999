"""The person's BM25-nearest past items in the cluster model's prompt under `card` (StyleSettings.retrieval), on
people of sources kept for tuning: card with and without retrieval, card with retrieval of another person of the
same cluster (their items and style), the cluster model; ROUGE-L, the share of outputs that are one of the person's
past outputs word for word, and paired intervals.

    python -m benchmarks.retrieval_tune --artifacts B --data G --sources pytest-dev/pytest,encode/django-rest-framework \
        --limit 40 --cache fits.pt --json retrieval_tune.json
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np

from benchmarks.form_tune import onboarded, tuning_parser, tuning_people
from personalize.eval.evaluate import decode_people, shuffled_partners
from personalize.metrics import paired_interval, rouge_per_query


def main(argv=None) -> None:
    a = tuning_parser(__doc__).parse_args(argv)
    engine, queries = tuning_people(a)
    profiles = [engine.prepare_items(q.profile[:24]) for q in queries]
    fits = onboarded(engine, profiles, a.cache)
    head = engine.heads["tokens"]
    styles = [engine.fit_style(f.features, head, far=engine.is_far(f.k, f.distances))[0] for f in fits]
    prompts, golds = [q.input for q in queries], [q.gold for q in queries]
    pasts = [{" ".join(it.y.split()).casefold() for it in q.profile} for q in queries]
    partner = shuffled_partners([f.cluster for f in fits])
    base, scores, outputs = engine.cfg.style, {}, {}
    runs = (("cluster", "cluster", base, styles, profiles), ("card", "card", base, styles, profiles),
            ("card+retrieval", "card", replace(base, retrieval=True), styles, profiles),
            ("card+retrieval, another's", "card", replace(base, retrieval=True), [styles[j] for j in partner],
             [profiles[j] for j in partner]))
    for name, method, settings, sty, items in runs:
        engine.cfg = replace(engine.cfg, style=settings)
        outputs[name] = decode_people(engine, method, prompts, fits, sty, items)
        scores[name] = np.asarray(rouge_per_query(outputs[name], golds))
        copied = np.mean([" ".join(t.split()).casefold() in p for t, p in zip(outputs[name], pasts)])
        print(f"{name:28s} ROUGE-L {scores[name].mean():.4f}  copied {copied:.0%}", flush=True)
    diffs = {f"{x} - {y}": paired_interval(scores[x] - scores[y]) for x, y in (
        ("card+retrieval", "cluster"), ("card+retrieval", "card"), ("card+retrieval", "card+retrieval, another's"))}
    for k, d in diffs.items():
        print(f"{k:45s} {d['mean']:+.4f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]  {d['wins']} / {d['losses']}")
    if a.json:
        json.dump({"people": len(fits), "outputs": outputs, "differences": diffs}, open(a.json, "w"))


if __name__ == "__main__":
    main()
