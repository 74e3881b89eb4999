"""The demo build's cluster adapters, trained both ways in one run (issue 58, item 1): every block (the build before)
and the upper `--cluster-layers` blocks over the K = 1 adapter's lower states, computed once a text and shared by every
cluster adapter (the demo's setting now). One K = 1 adapter (the build's, trained once here), the built demo's people,
clusters, settings, steps and seeds; the order of the two ways alternates between repeats. Prints the cluster stage's
seconds both ways and their ratio, and each way's held-out loss: every validation person's texts (the build never
trains on them) under their nearest cluster's adapter, at each K.

    python -m benchmarks.demo_training --artifacts data/artifacts/demo --data data/demo [--repeats 1] [--json F]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from personalize.data import read_lamp
from personalize.fitting.plan import DEMO_BUILD_ARGS, build_args, build_plan
from personalize.lm.models import load_encoder, load_lm
from personalize.methods.card.adapters import BASE_ADAPTER, ClusterJob, LowerStates, adapter_name, new_peft_model, \
    sft_loss, train_adapter, train_cluster_adapter
from personalize.methods.card.cluster import user_embeddings


def jobs_of(meta: dict, clusters, users: dict, ks) -> list[ClusterJob]:
    """The build's cluster jobs (build._build's), from the built demo's labels."""
    names = meta["users"]
    val = set(meta["report"].get("val_users", []))
    out = []
    for k in sorted(ks):
        for c in range(k) if k != 1 else ():
            members = [n for n in names if n not in val and clusters[f"labels_k{k}"][names.index(n)] == c]
            out.append(ClusterJob(adapter_name(k, c), tuple((it.x, it.y) for n in members for it in users[n])))
    return out


def cluster_stage(model, tok, cfg, jobs, held: dict, upper: bool) -> dict:
    """Every cluster adapter from the K = 1 weights, timed; then the held-out loss under each person's nearest."""
    lora = cfg.lora if upper else replace(cfg.lora, cluster_layers=0)
    t0 = time.perf_counter()
    states = LowerStates.for_settings(model, tok, lora, cfg.budget)
    for job in jobs:
        train_cluster_adapter(model, tok, job, lora, cfg.budget, states=states)
    seconds = time.perf_counter() - t0
    losses = {}
    for k, by_adapter in held.items():
        n = sum(len(v) for v in by_adapter.values())
        total = 0.0
        for ada, texts in by_adapter.items():
            model.set_adapter(ada)
            total += sft_loss(model, tok, texts, cfg.budget) * len(texts)
        losses[f"K={k}"] = total / n
    for job in jobs:
        model.delete_adapter(job.name)
    model.set_adapter(BASE_ADAPTER)
    return {"cluster adapters": seconds, "held_out_loss": losses, "states": 0 if states is None else len(states)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--artifacts", default="data/artifacts/demo")
    p.add_argument("--data", default="data/demo")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    meta = json.loads((Path(a.artifacts) / "config.json").read_text())
    clusters = np.load(f"{a.artifacts}/clusters.npz")
    _, _, cfg, _ = build_plan(build_args(["--data", a.data, "--out", "/tmp/unused", *DEMO_BUILD_ARGS]))
    _, queries = read_lamp(a.data, "dev")
    by_name = {q.user or q.id: q for q in queries}
    users = {n: list(by_name[n].profile[: cfg.items_per_user]) for n in meta["users"]}
    val = set(meta["report"].get("val_users", []))
    examples = [(it.x, it.y) for n in meta["users"] if n not in val for it in users[n]]
    jobs = jobs_of(meta, clusters, users, cfg.ks)
    people = [n for n in meta["report"]["validation_people"] if n not in users]
    emb = user_embeddings(load_encoder(cfg.encoder), [[it.y for it in by_name[n].profile] for n in people])
    held = {}
    for k in sorted(k for k in cfg.ks if k > 1):
        nearest = np.linalg.norm(emb[:, None] - clusters[f"centroids_k{k}"][None], axis=-1).argmin(1)
        held[k] = {}
        for n, c in zip(people, nearest):
            held[k].setdefault(adapter_name(k, int(c)), []).extend((it.x, it.y) for it in by_name[n].profile[:4])
    lm = load_lm(cfg.model)
    torch.manual_seed(0)
    model = new_peft_model(lm.model, cfg.lora)
    print(f"{len(users)} people, {len(examples)} training texts, {len(jobs)} cluster adapters, {len(people)} "
          f"validation people; cluster adapters' upper blocks: {cfg.lora.cluster_layers}; {a.repeats} repeat(s)",
          flush=True)
    t0 = time.perf_counter()
    train_adapter(model, lm.tokenizer, BASE_ADAPTER, examples, cfg.lora.base_steps, cfg.lora, cfg.budget)
    print(f"K = 1 adapter (the same both ways): {time.perf_counter() - t0:.1f} s", flush=True)
    runs = {"all blocks": [], "upper blocks": []}
    for r in range(a.repeats):
        for upper in ((False, True) if r % 2 == 0 else (True, False)):
            way = "upper blocks" if upper else "all blocks"
            got = cluster_stage(model, lm.tokenizer, cfg, jobs, held, upper)
            runs[way].append(got)
            print(f"  repeat {r + 1}, {way}: {got['cluster adapters']:.1f} s, held-out loss "
                  f"{json.dumps({k: round(v, 4) for k, v in got['held_out_loss'].items()})}, states {got['states']}",
                  flush=True)
    before = statistics.median(x["cluster adapters"] for x in runs["all blocks"])
    after = statistics.median(x["cluster adapters"] for x in runs["upper blocks"])
    print(f"\n| cluster adapters ({len(jobs)}) | all blocks | upper {cfg.lora.cluster_layers} blocks | ratio |\n"
          f"|---|---|---|---|\n| seconds (median of {a.repeats}) | {before:.1f} | {after:.1f} | {after / before:.2f} |")
    for k in held:
        lo = [statistics.median(x["held_out_loss"][f"K={k}"] for x in runs[w]) for w in runs]
        print(f"| held-out loss at K = {k} ({len(people)} validation people) | {lo[0]:.4f} | {lo[1]:.4f} | |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"before_s": before, "after_s": after, "runs": runs, "cluster_layers": cfg.lora.cluster_layers},
                      f, indent=1)


if __name__ == "__main__":
    main()
