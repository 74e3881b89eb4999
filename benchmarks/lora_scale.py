"""Candidate (a) of the form study: the cluster adapter's strength per person. Each person's cluster LoRA is scaled
by s (peft's LoraLayer.set_scale), s chosen from a grid by the mean log-likelihood of their own items under the
scaled model (one teacher-forced pass per grid point; s = 1 is onboarding's own pass), and their style refitted from
the pass at s. Scored on people of sources kept for tuning: cluster and card at s = 1 against both at the chosen s.

    python -m benchmarks.lora_scale --artifacts B --data G --sources pytest-dev/pytest,encode/django-rest-framework \
        --limit 40 --scales 0,0.5,1 --json lora_scale.json
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from statistics import median

import numpy as np

from benchmarks.form_study import prefix_share
from benchmarks.form_tune import onboarded, tuning_parser, tuning_people
from personalize.methods.card.adapters import BASE_ADAPTER, adapter_name
from personalize.methods.card import card_decode
from personalize.methods.engine import Engine
from personalize.metrics import paired_interval, rouge_per_query


@contextmanager
def lora_scale(engine: Engine, adapter: str, scale: float):
    """The adapter's LoRA terms times `scale` inside the block (peft's own setting), restored after."""
    layers = [m for m in engine.model.modules() if hasattr(m, "set_scale") and adapter in getattr(m, "scaling", {})]
    for m in layers:
        m.set_scale(adapter, scale)
    try:
        yield
    finally:
        for m in layers:
            m.set_scale(adapter, 1.0)


def main(argv=None) -> None:
    p = tuning_parser(__doc__)
    p.add_argument("--scales", default="0,0.5,1")
    a = p.parse_args(argv)
    engine, queries, profiles = tuning_people(a)
    head = engine.heads["tokens"]
    scales = [float(x) for x in a.scales.split(",")]
    out = {m: [] for m in ("cluster", "card", "cluster_scaled", "card_scaled")}
    chosen, extra_s = [], []
    for q, items, fit in zip(queries, profiles, onboarded(engine, profiles, a.cache)):
        name = adapter_name(fit.k, fit.cluster) if fit.k > 1 else BASE_ADAPTER
        engine.use_adapter(name)
        t0, passes = time.perf_counter(), {1.0: fit.features}
        for s in scales:
            if s != 1.0:
                with lora_scale(engine, name, s):
                    passes[s] = engine.features(items)
        extra_s.append(time.perf_counter() - t0)
        loglik = {s: float(np.mean([f.mean_logprob for f in feats])) for s, feats in passes.items()}
        best = max(loglik, key=loglik.get)
        chosen.append(best)
        style, _ = engine.fit_style(passes[best], head)
        own, _ = engine.fit_style(passes[1.0], head)  # the build's style settings now, whatever the cache holds
        for m, s, st in (("cluster", 1.0, own), ("card", 1.0, own), ("cluster_scaled", best, style),
                         ("card_scaled", best, style)):
            with lora_scale(engine, name, s):
                g = card_decode.generate(engine, [q.input], m.replace("_scaled", ""), fit.cluster, st, k=fit.k)
            out[m].append(g[0].text)
        print(f"{q.user[:30]:30s} s = {best:g}  card: {out['card'][-1][:50]!r}  scaled: {out['card_scaled'][-1][:50]!r}",
              flush=True)
    golds = [q.gold for q in queries]
    rl = {m: np.asarray(rouge_per_query(v, golds)) for m, v in out.items()}
    for m in out:
        print(f"{m:15s} ROUGE-L {rl[m].mean():.4f}  prefix {prefix_share(out[m]):.0%}")
    diffs = {f"{x} - {y}": paired_interval(rl[x] - rl[y]) for x, y in (("card_scaled", "card"),
                                                                       ("cluster_scaled", "cluster"))}
    print(json.dumps(diffs))
    print(f"{len(queries)} people; chosen scales {dict(zip(*np.unique(chosen, return_counts=True)))}; "
          f"the extra passes {median(extra_s):.2f} s a person (median); golds' prefix {prefix_share(golds):.0%}")
    if a.json:
        json.dump({"people": len(queries), "outputs": out, "chosen": chosen, "extra_pass_s": extra_s,
                   "rougeL": {m: float(v.mean()) for m, v in rl.items()}, "differences": diffs}, open(a.json, "w"))


if __name__ == "__main__":
    main()
