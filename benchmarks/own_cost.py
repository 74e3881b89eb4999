"""What a cluster of one costs beside OPPU (issue 48), on the same people in one run: each person's own adapter (their
nearest cluster's LoRA, its upper blocks trained over the lower blocks' states computed once) and the style fitted
over it, against OPPU's adapter (its default steps, from the K = 1 adapter), alternated person by person; seconds
and bytes stored, medians and the ratio; and what each writes for the person's query beside the cluster model, card
over the cluster (before) and their truth. --far: only people beyond the build's clusters.

    python -m benchmarks.own_cost --artifacts data/artifacts/demo --data G --sources encode/httpx --limit 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from personalize.methods.card import onboard
from personalize.data import read_lamp, select_sources
from personalize.methods.base import UserContext
from personalize.methods.card import card_decode
from personalize.methods.card.adapters import cluster_adapter
from personalize.methods.card.own import owner_key
from personalize.methods.engine import Engine
from personalize.methods.oppu import OppuConfig, OppuMethod


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--artifacts", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--sources", default="")
    p.add_argument("--limit", type=int, default=4)
    p.add_argument("--items", type=int, default=24)
    p.add_argument("--far", action="store_true")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    engine = Engine.load(a.artifacts)
    _, queries = read_lamp(a.data, "dev")
    queries = [q for q in select_sources(queries, [s for s in a.sources.split(",") if s])
               if len(q.profile) >= a.items]
    tmp = Path(tempfile.mkdtemp())
    engine.own.folder = tmp / "own"
    oppu = OppuMethod(engine, cfg=OppuConfig(folder=str(tmp / "oppu"), report_loss=False))
    rows, s = [], engine.cfg.decoding

    def write(method, fit):
        return card_decode.generate(engine, [q.input], method, fit.cluster, fit.style, k=fit.k, settings=s)[0].text

    for q in queries:
        if len(rows) == a.limit:
            break
        items = engine.prepare_items(q.profile[: a.items])
        fit = onboard.fit(engine, items)
        if a.far and not fit.far:
            continue
        said = {"truth": q.gold, "cluster": write("cluster", fit), "card before": write("card", fit)}
        t0 = time.perf_counter()
        got = engine.own.train(q.user, items, cluster_adapter(fit.k, fit.cluster))
        train_s = time.perf_counter() - t0
        over = onboard.fit(engine, items, k=fit.k, own=owner_key(q.user))
        own_s = time.perf_counter() - t0
        said["card after"] = write("card", over)
        t0 = time.perf_counter()
        user = UserContext(q.user, items)
        info = oppu.prepare(user)
        oppu_s = time.perf_counter() - t0
        said["oppu"] = oppu.generate(user, [q.input], s)[0].text
        rows.append({"user": q.user, "items": len(items), "far": fit.far, "own_train_s": round(train_s, 2),
                     "own_with_style_s": round(own_s, 2), "own_bytes": got.bytes, "oppu_s": round(oppu_s, 2),
                     "oppu_steps": info["steps"], "oppu_bytes": info["disk_bytes"], "prompt": q.input, **said})
        print(rows[-1], flush=True)
        engine.own.forget(q.user)
    oppu.release()
    med = {k: statistics.median(r[k] for r in rows) for k in ("own_train_s", "own_with_style_s", "own_bytes",
                                                              "oppu_s", "oppu_bytes")}
    med["time_ratio"] = round(med["own_with_style_s"] / med["oppu_s"], 3)
    med["bytes_ratio"] = round(med["own_bytes"] / med["oppu_bytes"], 3)
    print(json.dumps(med, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps({"people": rows, "median": med}, indent=1))


if __name__ == "__main__":
    main()
