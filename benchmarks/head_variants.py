"""Head settings compared on one build's features: early stopping, weight decay, D, learning rate.

    .venv/bin/python -m benchmarks.head_variants --artifacts A --objective tokens \
        --variants '[{"patience": 0}, {"patience": 2}, {"patience": 2, "d": 32}]'

Reads the build's own population, training users, clusters and held-out split (build.head_data), so the
features are computed once and each variant costs only its training. Prints one JSON line per variant with
the held-out diagnostics the build reports (docs/results/2026-11-22-first-builds.md, "Head objectives ... and
regularisation").
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

from personalize.methods.card.build import _population, _population_diagnostics, head_data
from personalize.data import read_lamp
from personalize.methods.engine import Engine
from personalize.methods.card.head import PersonalizationHead, train_population


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--artifacts", required=True, type=Path)
    p.add_argument("--objective", required=True, help="a head objective the build trained")
    p.add_argument("--variants", required=True, help="JSON list of HeadSettings overrides")
    a = p.parse_args()
    variants = json.loads(a.variants)
    engine = Engine.load(a.artifacts)
    cfg, meta = engine.cfg, engine.meta
    if a.objective not in meta["head_users"]:
        raise SystemExit(f"{a.artifacts} has no {a.objective!r} head; built: {sorted(meta['head_users'])}")
    _, queries = read_lamp(meta["data"], meta["split"])
    names = meta["users"]
    population = _population(queries, cfg.items_per_user, len(names))
    train = meta["head_users"][a.objective]
    cluster = {n: int(engine.clusters.labels[cfg.default_k][names.index(n)]) for n in train}
    t0 = time.time()
    fit, held = head_data(engine, {n: population[n] for n in train}, cluster, a.objective)
    print(f"features {time.time() - t0:.0f} s", flush=True)
    for v in variants:
        s = replace(cfg.head, objective=a.objective, **v)
        head = PersonalizationHead(engine.lm.hidden_size * s.n_layers, engine.lm.model.config.vocab_size, s.d)
        t1 = time.time()
        lams, curve = train_population(head, fit, s, held_out=held)
        head.eval().requires_grad_(False)
        diag = _population_diagnostics(head, held, lams, replace(cfg, head=s))
        print(json.dumps({"variant": v, "epochs_run": len(curve), "train_loss": [round(curve[0], 4), round(curve[-1], 4)],
                          "gamma": round(float(head.gamma), 3), "seconds": round(time.time() - t1, 1),
                          "held_out": {k: x for k, x in diag.items() if k.startswith("acc") or k == "specificity_gap"}}),
              flush=True)


if __name__ == "__main__":
    main()
