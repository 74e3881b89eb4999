"""The cost curve of a cluster of one (issue 48): on the far people of the sources kept for tuning (never the study's),
each OwnSettings setting (upper blocks trained, steps) trains every far person's own adapter from their nearest
cluster's, fits their style over it and decodes their query as card at the build's α and at α = 0 (the adapter
alone); ROUGE-L against the cluster model and card over the cluster, training seconds and bytes stored. With --oppu,
OPPU on the same people (its default steps, or --oppu-steps) for the time ratio and the quality bar.

    python -m benchmarks.own_curve --artifacts B --data G --sources pytest-dev/pytest,encode/django-rest-framework \
        --limit 40 --grid 6:8,6:16,6:32,12:16 --oppu --json own_curve.json
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from benchmarks.form_tune import tuning_parser, tuning_people
from personalize.methods.card import onboard
from personalize.methods.base import UserContext
from personalize.methods.card import card_decode
from personalize.methods.card.adapters import cluster_adapter
from personalize.methods.card.own import owner_key
from personalize.methods.oppu import OppuConfig, OppuMethod
from personalize.metrics import paired_interval, rouge_per_query


def main() -> None:
    p = tuning_parser(__doc__)
    p.add_argument("--grid", default="6:8,6:16,6:32,12:16", help="layers:steps settings, comma-separated")
    p.add_argument("--oppu", action="store_true", help="OPPU on the same people too")
    p.add_argument("--oppu-steps", type=int, default=None)
    a = p.parse_args()
    engine, queries, profiles = tuning_people(a)
    tmp = tempfile.TemporaryDirectory()
    engine.own.folder = Path(tmp.name) / "own"
    fits = [onboard.fit(engine, items) for items in profiles]
    far = [i for i, f in enumerate(fits) if f.far and not f.cold_start]
    print(f"{len(far)} of {len(fits)} tuning people are beyond the build's clusters (α = {engine.cfg.decoding.alpha})",
          flush=True)
    golds = [queries[i].gold for i in far]
    s, s0 = engine.cfg.decoding, replace(engine.cfg.decoding, alpha=0.0)

    def decode(i: int, fit, settings, method: str = "card") -> str:
        return card_decode.generate(engine, [queries[i].input], method, fit.cluster, fit.style, k=fit.k,
                                    settings=settings)[0].text

    texts = {"cluster": [decode(i, fits[i], s, "cluster") for i in far],
             "card over the cluster": [decode(i, fits[i], s) for i in far]}
    rows = {}
    for setting in a.grid.split(","):
        layers, steps = (int(x) for x in setting.split(":"))
        engine.cfg = replace(engine.cfg, own=replace(engine.cfg.own, layers=layers, steps=steps))
        seconds, sizes, card, alone = [], [], [], []
        for i in far:
            name = f"{queries[i].user}@{setting}"
            t0 = time.perf_counter()
            got = engine.own.train(name, profiles[i], cluster_adapter(fits[i].k, fits[i].cluster))
            seconds.append(time.perf_counter() - t0)
            sizes.append(got.bytes)
            own = onboard.fit(engine, profiles[i], k=fits[i].k, own=owner_key(name))
            card.append(decode(i, own, s))
            alone.append(decode(i, own, s0))
            engine.own.forget(name)
        key = f"{layers} blocks, {steps} steps"
        texts[f"card, own ({key})"], texts[f"own at α = 0 ({key})"] = card, alone
        rows[key] = {"train_s": round(statistics.median(seconds), 2), "bytes": int(statistics.median(sizes))}
        print(key, rows[key], f"card {np.mean(rouge_per_query(card, golds)):.4f}", flush=True)
    if a.oppu:
        oppu = OppuMethod(engine, cfg=OppuConfig(folder=str(Path(tmp.name) / "oppu"), report_loss=False,
                                                 **({"max_steps": a.oppu_steps} if a.oppu_steps else {})))
        seconds, sizes, outs = [], [], []
        for i in far:
            user = UserContext(queries[i].user, profiles[i])
            t0 = time.perf_counter()
            info = oppu.prepare(user)
            seconds.append(time.perf_counter() - t0)
            sizes.append(info.get("disk_bytes", 0))
            outs.append(oppu.generate(user, [queries[i].input], s)[0].text)
        oppu.release()
        texts["oppu"] = outs
        rows["oppu"] = {"train_s": round(statistics.median(seconds), 2), "bytes": int(statistics.median(sizes))}
    scores = {m: rouge_per_query(v, golds) for m, v in texts.items()}
    base = np.asarray(scores["cluster"])
    table = {m: {"rougeL": round(float(np.mean(v)), 4),
                 "minus_cluster": paired_interval(np.asarray(v) - base) if m != "cluster" else None}
             for m, v in scores.items()}
    print(f"\n| {len(far)} far tuning people | ROUGE-L | − cluster [95 %] |\n|---|---|---|")
    for m, r in table.items():
        d = r["minus_cluster"]
        print(f"| {m} | {r['rougeL']:.4f} | " + (f"{d['mean']:+.4f} [{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}]"
                                                if d else "") + " |")
    print("\n| setting | training s (median) | bytes stored |\n|---|---|---|")
    for k, r in rows.items():
        print(f"| {k} | {r['train_s']} | {r['bytes']:,} |")
    if a.json:
        outputs = [{"user": queries[i].user, "gold": queries[i].gold, "prompt": queries[i].input,
                    **{m: v[j] for m, v in texts.items()}} for j, i in enumerate(far)]
        Path(a.json).write_text(json.dumps({"people": len(far), "table": table, "cost": rows, "outputs": outputs},
                                           indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
