"""The memory's weight by the context's match (StyleSettings.knn_match), chosen on people of sources kept for
tuning, never on the people the study scores: each person onboarded once with a memory (far_share 1), then, per
setting, their memory's weight set and their query decoded as `card` with their own style and with a partner's of
the same cluster (card_shuffled); ROUGE-L, card − card_shuffled and card − cluster with paired intervals, for all
and for the people beyond the build's clusters (closeness < 0.1) and the others; "copied": the share of outputs that
are one of the person's past outputs word for word (with --copy-stop each setting also with StyleSettings.copy_stop).

    python -m benchmarks.memory_match --artifacts B --data G --sources pytest-dev/pytest,encode/django-rest-framework \
        --limit 40 --json memory_match.json
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import torch

from benchmarks.form_study import copied_share
from benchmarks.form_tune import closeness, onboarded, tuning_parser, tuning_people
from personalize.methods.card.style import memory_keys
from personalize.eval.evaluate import decode_people, shuffled_partners
from personalize.metrics import paired_interval, rouge_per_query


def match_quantiles(engine, fits) -> list[float]:
    """How well a person's new text matches their past: each item's states against the memory of their other
    items (the nearest entry's cosine similarity), quantiles 10-90 % over all tokens of all people."""
    head, s = engine.heads["tokens"], engine.cfg.style
    sims = []
    for f in fits:
        keys = [memory_keys(x.h.float(), engine.lm.hidden_size, s.key, head) for x in f.features or []]
        for i, k in enumerate(keys):
            rest = [o for j, o in enumerate(keys) if j != i]
            if rest:
                sims.append((k @ torch.cat(rest).T).max(-1).values)
    return np.quantile(torch.cat(sims).numpy(), [0.1, 0.25, 0.5, 0.75, 0.9]).round(3).tolist()


def main(argv=None) -> None:
    p = tuning_parser(__doc__)
    p.add_argument("--matches", default="0.6,0.8,0.9")
    p.add_argument("--weights", default="0.3,0.5")
    p.add_argument("--copy-stop", action="store_true", help="also each setting with StyleSettings.copy_stop")
    a = p.parse_args(argv)
    engine, queries, profiles = tuning_people(a)
    base_style = engine.cfg.style
    engine.cfg = replace(engine.cfg, style=replace(base_style, far_share=1.0))  # everyone's memory kept
    fits = onboarded(engine, profiles, a.cache)
    close = np.array([closeness(engine, f) for f in fits])
    far = close < base_style.far_share
    print(f"{len(fits)} people, {far.sum()} beyond the clusters; match quantiles 10-90 %: "
          f"{match_quantiles(engine, fits)}", flush=True)
    prompts, golds = [q.input for q in queries], [q.gold for q in queries]
    partner = shuffled_partners([f.cluster for f in fits])
    engine.cfg = replace(engine.cfg, style=base_style)
    cluster = np.array(rouge_per_query(decode_people(engine, "cluster", prompts, fits, [f.style for f in fits],
                                                     profiles), golds))
    rows = []

    def score(name: str, settings, weight) -> None:
        engine.cfg = replace(engine.cfg, style=settings)
        styles = [replace(f.style, knn_weight=weight(i)) for i, f in enumerate(fits)]
        other = np.array(rouge_per_query(decode_people(engine, "card", prompts, fits, [styles[j] for j in partner],
                                                       profiles), golds))
        texts = decode_people(engine, "card", prompts, fits, styles, profiles)
        own = np.array(rouge_per_query(texts, golds))
        copied = copied_share(texts, queries)
        row = {"setting": name, "rougeL": float(own.mean()), "per_query": own.tolist(), "copied": copied,
               "shuffled_per_query": other.tolist()}
        for part, sel in (("all", np.ones(len(own), bool)), ("far", far), ("others", ~far)):
            row[f"card-shuffled {part}"] = paired_interval(own[sel] - other[sel])
            row[f"card-cluster {part}"] = paired_interval(own[sel] - cluster[sel])
        rows.append(row)
        d, c = row["card-shuffled all"], row["card-cluster all"]
        print(f"{name:34s} ROUGE-L {own.mean():.4f}  card−shuffled {d['mean']:+.4f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]"
              f"  card−cluster {c['mean']:+.4f} [{c['ci95'][0]:+.3f}, {c['ci95'][1]:+.3f}]  far/others −shuffled "
              f"{row['card-shuffled far']['mean']:+.4f} / {row['card-shuffled others']['mean']:+.4f}  copied {copied:.0%}",
              flush=True)

    print(f"{'cluster':34s} ROUGE-L {cluster.mean():.4f}", flush=True)
    w_far = base_style.far_knn_weight
    score("far memory only (card)", base_style, lambda i: w_far if far[i] else None)
    score(f"memory for all, w {w_far:g}", base_style, lambda i: w_far)
    for w in map(float, a.weights.split(",")):
        for m in map(float, a.matches.split(",")):
            for stop in ((False, True) if a.copy_stop else (False,)):
                score(f"memory for all, w {w:g}, match {m:g}" + (", copy stop" if stop else ""),
                      replace(base_style, knn_match=m, copy_stop=stop), lambda i, w=w: w)
    if a.json:
        json.dump({"people": len(fits), "far": int(far.sum()), "cluster_per_query": cluster.tolist(), "rows": rows},
                  open(a.json, "w"))


if __name__ == "__main__":
    main()
