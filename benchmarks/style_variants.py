"""The per-person style's settings judged teacher-forced on validation people (no decoding: seconds each).

For each person of the build's sources outside its population (tune.validation_people), one teacher-forced
pass under their cluster's model; the style is fitted on their older items and scored on their newest ones
(20 %) with style.style_scores, the rule decoding applies: next-token accuracy and log-prob with their own
style, with the next person's style (the specificity) and with no head. Each variant is a JSON dict of
StyleSettings fields (and "alpha").

    python -m benchmarks.style_variants --artifacts data/artifacts/commit_subjects --users 16 \\
        --variants '[{"bias": false, "memory": false}, {"memory": false}, {"bias": false}, {}]'
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

import numpy as np

from personalize.methods.card import onboard
from personalize.methods.card.adapters import BASE_ADAPTER, adapter_name
from personalize.methods.engine import Engine
from personalize.methods.card.head import TokenData
from personalize.methods.card.style import style_diagnostics
from personalize.methods.card.tune import validation_people


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--artifacts", required=True)
    p.add_argument("--users", type=int, default=16)
    p.add_argument("--variants", default='[{}]')
    p.add_argument("--alpha", type=float, default=1.0, help="α of every variant unless it gives its own (1: as trained)")
    a = p.parse_args(argv)
    engine = Engine.load(a.artifacts)
    head, cfg = engine.heads["tokens"], engine.cfg
    people = validation_people(engine, engine.meta["data"], engine.meta.get("split", "dev"), a.users)
    t0 = time.perf_counter()
    data = []
    for _, _, profile in people:
        items = engine.prepare_items(profile)
        c, _ = engine.assign(engine.embed(items), cfg.default_k)
        engine.use_adapter(adapter_name(cfg.default_k, c) if cfg.default_k > 1 else BASE_ADAPTER)
        feats = onboard.features(engine, items)
        n_hold = max(1, int(round(cfg.holdout * len(items))))
        data.append((feats[n_hold:], TokenData.from_features(feats[:n_hold])))
    print(f"{len(data)} people, features in {time.perf_counter() - t0:.0f} s")
    print("| variant | acc no head | acc own | acc other | log-p no head | log-p own | log-p other | gap | bytes |")
    print("|---|---|---|---|---|---|---|---|---|")
    for v in json.loads(a.variants):
        alpha = v.pop("alpha", a.alpha)
        engine.cfg = replace(cfg, style=replace(cfg.style, **v))
        styles = [onboard.fit_style(engine, fit, head)[0] for fit, _ in data]
        rows = [style_diagnostics(head, held, styles[i], [styles[(i + 1) % len(styles)]], engine.cfg.style, alpha)
                for i, (_, held) in enumerate(data)]
        rows = [r for r in rows if r.get("n")]
        m = {k: np.mean([r[k] for r in rows]) for k in ("acc_no_head", "acc_own", "acc_other", "margin_no_head",
                                                         "margin_own", "margin_other", "specificity_gap")}
        size = int(np.median([len(s.extras_bytes()) + 4 * len(s.lam) for s in styles]))
        label = json.dumps(v | ({"alpha": alpha} if alpha != a.alpha else {}))
        print(f"| {label} | {m['acc_no_head']:.3f} | {m['acc_own']:.3f} | {m['acc_other']:.3f} | "
              f"{m['margin_no_head']:.3f} | {m['margin_own']:.3f} | {m['margin_other']:.3f} | "
              f"{m['specificity_gap']:+.3f} | {size:,} |", flush=True)
    engine.cfg = cfg


if __name__ == "__main__":
    main()
