"""For people unlike the build's population: which of the build's adapters (K = 1 and each cluster of the default K)
writes their next text best, and would their own items' likelihood under each pick it? On people of sources kept for
tuning: ROUGE-L of each adapter's greedy output, of the embedding-assigned cluster (onboarding's), of the adapter
whose mean log-likelihood of the person's first 8 items is highest, and the per-person best (an upper bound).

    python -m benchmarks.which_adapter --artifacts B --data G --sources pytest-dev/pytest,encode/django-rest-framework \
        --limit 40 --cache fits.pt
"""

from __future__ import annotations

import numpy as np

from benchmarks.form_tune import onboarded, tuning_parser, tuning_people
from personalize.lm.features import teacher_forced
from personalize.methods.card.adapters import BASE_ADAPTER, adapter_name
from personalize.metrics import paired_interval, rouge_per_query
from personalize.serving import generation


def main(argv=None) -> None:
    a = tuning_parser(__doc__).parse_args(argv)
    engine, queries, profiles = tuning_people(a)
    fits = onboarded(engine, profiles, a.cache)
    golds, k = [q.gold for q in queries], engine.cfg.default_k
    names = [BASE_ADAPTER] + [adapter_name(k, c) for c in range(k)]
    rouge, loglik = np.zeros((len(fits), len(names))), np.zeros((len(fits), len(names)))
    for j, name in enumerate(names):
        engine.use_adapter(name)
        outs = generation.generate(engine.model, engine.tok, [q.input for q in queries], engine.cfg.budget,
                                   engine.cfg.decoding)
        rouge[:, j] = rouge_per_query([g.text for g in outs], golds)
        for i, items in enumerate(profiles):
            feats = teacher_forced(engine.model, engine.tok, [(it.x, it.y) for it in items[:8]], 1, engine.cfg.budget)
            loglik[i, j] = np.mean([f.mean_logprob for f in feats])
        print(f"{name:8s} ROUGE-L {rouge[:, j].mean():.4f}", flush=True)
    rows = np.arange(len(fits))
    assigned = np.array([names.index(adapter_name(f.k, f.cluster) if f.k > 1 else BASE_ADAPTER) for f in fits])
    picked = loglik.argmax(1)
    d = paired_interval(rouge[rows, picked] - rouge[rows, assigned])
    print(f"assigned {rouge[rows, assigned].mean():.4f}  likelihood-picked {rouge[rows, picked].mean():.4f}  "
          f"best per person {rouge.max(1).mean():.4f}; picked − assigned {d['mean']:+.4f} "
          f"[{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}] ({d['wins']} / {d['losses']}); picks "
          f"{dict(zip(names, np.bincount(picked, minlength=len(names)).tolist()))}, assigned "
          f"{dict(zip(names, np.bincount(assigned, minlength=len(names)).tolist()))}")


if __name__ == "__main__":
    main()
