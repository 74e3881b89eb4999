"""Who is far (issue 48, item 3): StyleSettings.far_share chosen on people the study never scores, not by hand.

Each person of the build's validation people and of the sources kept for tuning is decoded both ways: as a near
person (card over their cluster's adapter) and as a cluster of one (their own adapter, their style fitted over it as
a far person's). A share t makes everyone whose closeness (cluster.closeness: the share of the build's own people
further out than them) is below t a cluster of one; each t's score is the mean copy-aware ROUGE-L of that rule
(metrics.copy_aware: an old text handed back scores 0), with the paired
interval against no one far and against the built default. The rule chosen is the best mean; the smallest share of
the ties (fewer people trained).

    python -m benchmarks.far_sweep --artifacts B --data G --sources pytest-dev/pytest,encode/django-rest-framework \
        --limit 40 --validation 30 --json far_sweep.json
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from benchmarks.form_tune import tuning_parser, tuning_people
from personalize.methods.card import onboard
from personalize.methods.card.adapters import cluster_adapter
from personalize.methods.card.cluster import closeness
from personalize.methods.card.own import owner_key
from personalize.methods.card.tune import decode_each, validation_people
from personalize.metrics import copy_aware, paired_interval

SHARES = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0)


def main() -> None:
    p = tuning_parser(__doc__)
    p.add_argument("--validation", type=int, default=30, help="the build's validation people taken too (0: none)")
    a = p.parse_args()
    engine, queries, profiles = tuning_people(a)
    people = [(q.input, q.gold, items, q.user) for q, items in zip(queries, profiles)]
    if a.validation:
        people = [(x, y, engine.prepare_items(items), f"validation {i}")
                  for i, (x, y, items) in enumerate(validation_people(engine, engine.meta["data"],
                                                                   engine.meta.get("split", "dev"), a.validation))
                  ] + people
    built = engine.cfg
    near_cfg = replace(built, style=replace(built.style, far_share=0.0))  # nobody far: card over the cluster
    far_cfg = replace(built, style=replace(built.style, far_share=1.0))  # everyone far: their memory as far people's
    c, rows = engine.clusters, []
    print(f"{len(people)} people; built far_share {built.style.far_share}, α {built.decoding.alpha}", flush=True)
    with engine.own.scratch():
        for n, (prompt, gold, items, user) in enumerate(people):
            t0 = time.perf_counter()
            engine.cfg = near_cfg
            near = onboard.fit(engine, items)
            if near.cold_start:
                continue
            share = float(closeness(c.embeddings, c.centroids[near.k], c.labels[near.k], min(near.distances))[1])
            cluster, card = (decode_each(engine, m, [prompt], [near], [items], built.decoding)[0]
                             for m in ("cluster", "card"))
            engine.cfg = far_cfg
            engine.own.train(f"p{n}", items, cluster_adapter(near.k, near.cluster))
            own = onboard.fit(engine, items, k=near.k, own=owner_key(f"p{n}"))
            card_own = decode_each(engine, "card", [prompt], [own], [items], built.decoding)[0]
            engine.own.forget(f"p{n}")
            rows.append({"user": user, "closeness": round(share, 4), "gold": gold, "cluster": cluster,
                         "card": card, "card_own": card_own, "past": [it.y for it in items]})
            print(f"[{n + 1}/{len(people)}] {user}: closeness {share:.3f}, {time.perf_counter() - t0:.0f} s", flush=True)
    engine.cfg = built
    golds = [r["gold"] for r in rows]
    pasts = [r["past"] for r in rows]  # copy-aware (issue 57): an output handing back a past text scores 0
    scores = {m: np.asarray(copy_aware([r[m] for r in rows], golds, pasts)["per_query"])
              for m in ("cluster", "card", "card_own")}
    share = np.asarray([r["closeness"] for r in rows])
    rule = {t: np.where(share < t, scores["card_own"], scores["card"]) for t in SHARES}
    default = built.style.far_share
    rule.setdefault(default, np.where(share < default, scores["card_own"], scores["card"]))
    table = {str(t): {"far_people": int((share < t).sum()), "rougeL": round(float(v.mean()), 4),
                      "minus_none_far": paired_interval(v - rule[0.0]),
                      "minus_default": paired_interval(v - rule[default]),
                      "minus_cluster": paired_interval(v - scores["cluster"])} for t, v in sorted(rule.items())}
    best = max(sorted(rule), key=lambda t: round(float(rule[t].mean()), 4))  # the smallest share of the ties
    print(f"\n| far_share | far people | copy-aware ROUGE-L | − no one far | − far_share {default:g} | − cluster |\n|---|---|---|---|---|---|")
    for t, r in table.items():
        cells = [f"{r[k]['mean']:+.4f} [{r[k]['ci95'][0]:+.4f}, {r[k]['ci95'][1]:+.4f}]"
                 for k in ("minus_none_far", "minus_default", "minus_cluster")]
        print(f"| {t} | {r['far_people']} of {len(rows)} | {r['rougeL']:.4f} | " + " | ".join(cells) + " |")
    print(f"\nchosen: far_share {best:g} (cluster model alone {scores['cluster'].mean():.4f})")
    if a.json:
        Path(a.json).write_text(json.dumps({"people": len(rows), "chosen": best, "table": table, "rows": rows},
                                           indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
