"""Knobs of `card` a build chooses on population-like people, tried on people of sources kept for tuning (never the
study's): the person's BM25-nearest past items in the prompt (StyleSettings.retrieval), the strength α and the
token bias's pull (StyleSettings.rho_bias). Each setting decoded with the person's own style (and items) and with
another person's of the same cluster, beside the cluster model; ROUGE-L, the share of outputs that are one of the
person's past outputs word for word, and paired intervals.

    python -m benchmarks.style_knobs --artifacts B --data G --sources pytest-dev/pytest,encode/django-rest-framework \
        --limit 40 --cache fits.pt --retrieval --alphas 2,4 --rho-bias 0.001 --json style_knobs.json
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import replace

import numpy as np

from benchmarks.form_study import copied_share
from benchmarks.form_tune import onboarded, own_styles, tuning_parser, tuning_people
from personalize.eval.evaluate import decode_people, shuffled_partners
from personalize.methods.rag import RagMethod
from personalize.metrics import paired_interval, rouge_per_query


@contextmanager
def newest_items(on: bool):
    """While on, retrieval hands the prompt the person's newest items (profiles are newest first), not the
    BM25-nearest: their form without the nearest subject to copy."""
    if not on:
        yield
        return
    was = RagMethod.retrieve
    RagMethod.retrieve = lambda self, user, prompt: [(i, 0.0) for i in range(min(self.cfg.top_k, len(user.items)))]
    try:
        yield
    finally:
        RagMethod.retrieve = was


def main(argv=None) -> None:
    p = tuning_parser(__doc__)
    p.add_argument("--retrieval", action="store_true", help="card with retrieval")
    p.add_argument("--recent", action="store_true",
                   help="card with the person's newest items in the prompt in place of their BM25-nearest")
    p.add_argument("--alphas", default="", help="card at these α (comma-separated)")
    p.add_argument("--rho-bias", default="", help="card with the bias fitted at these pulls (comma-separated)")
    a = p.parse_args(argv)
    engine, queries, profiles = tuning_people(a)
    fits = onboarded(engine, profiles, a.cache)
    style, decoding = engine.cfg.style, engine.cfg.decoding
    prompts, golds = [q.input for q in queries], [q.gold for q in queries]
    partner = shuffled_partners([f.cluster for f in fits])

    def decode(method, settings, styles, items, s=decoding):
        engine.cfg = replace(engine.cfg, style=settings)
        texts = decode_people(engine, method, prompts, fits, styles, items, settings=s)
        return texts, np.asarray(rouge_per_query(texts, golds)), copied_share(texts, queries)

    def styles_at(settings):
        engine.cfg = replace(engine.cfg, style=settings)
        return own_styles(engine, fits)

    own = styles_at(style)
    _, cluster, _ = decode("cluster", style, own, profiles)
    settings = [("card", style, decoding)]
    settings += [("card + retrieval", replace(style, retrieval=True), decoding)] if a.retrieval else []
    settings += [("card + recent items", replace(style, retrieval=True), decoding)] if a.recent else []
    settings += [(f"card α {x}", style, replace(decoding, alpha=float(x))) for x in a.alphas.split(",") if x]
    settings += [(f"card ρ_bias {x}", replace(style, rho_bias=float(x)), decoding) for x in a.rho_bias.split(",") if x]
    print(f"{len(fits)} people; cluster ROUGE-L {cluster.mean():.4f}", flush=True)
    rows = []
    for name, st, s in settings:
        styles = own if st.rho_bias == style.rho_bias else styles_at(st)
        with newest_items(name.endswith("recent items")):
            texts, score, copied = decode("card", st, styles, profiles, s)
            _, other, _ = decode("card", st, [styles[j] for j in partner], [profiles[j] for j in partner], s)
        row = {"setting": name, "rougeL": float(score.mean()), "copied": copied, "outputs": texts,
               "minus_cluster": paired_interval(score - cluster), "minus_shuffled": paired_interval(score - other)}
        rows.append(row)
        c, o = row["minus_cluster"], row["minus_shuffled"]
        print(f"{name:22s} ROUGE-L {score.mean():.4f}  another's {other.mean():.4f}  copied {copied:.0%}  "
              f"−cluster {c['mean']:+.4f} [{c['ci95'][0]:+.3f}, {c['ci95'][1]:+.3f}]  "
              f"−shuffled {o['mean']:+.4f} [{o['ci95'][0]:+.3f}, {o['ci95'][1]:+.3f}]", flush=True)
    if a.json:
        json.dump({"people": len(fits), "cluster": float(cluster.mean()), "settings": rows}, open(a.json, "w"))


if __name__ == "__main__":
    main()
