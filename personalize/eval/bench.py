"""The efficiency benchmark (paper Table 5 layout, METHOD §6): every figure measured in one run, repeated, medians
reported, ratios taken between runs interleaved in time; the Table 5 rows (RAG, OPPU, P2P, CARD, plus EXACT) on the
same users, prompt and number of decoded tokens.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import replace
from pathlib import Path
from statistics import median as _median
from typing import Sequence

from tqdm import tqdm

from personalize.methods.card import card_decode, onboard
from personalize.methods.card.adapters import cluster_adapter
from personalize.catalog import BENCH_METHODS, CARD_ROWS
from personalize.data import Item
from personalize.eval.loops import Person, format_loops, loop_shares
from personalize.lm.models import static_cache, uses_static_cache
from personalize.methods.base import UserContext
from personalize.methods.card.own import owner_key
from personalize.methods.engine import Engine
from personalize.methods.card.onboard import UserFit
from personalize.methods.card.head import fit_user
from personalize.methods.registry import METHODS, REGISTRY, local_config
from personalize.store import Store


def run_bench(engine: Engine, users: dict[str, list[Item]], prompt: str, repeats: int = 5,
              n_tokens: int = 24, methods: Sequence[str] = BENCH_METHODS,
              method_configs: dict[str, dict] | None = None, prompts: Sequence[str] | None = None,
              serving: dict | None = None, loops: bool = True, static: bool = False) -> dict:
    """Onboarding by stage, λ fit, CARD decode overhead, user switch, bytes per user; then `methods` side by side
    (bench_methods; method_configs: config fields per method, e.g. {"oppu": {"max_steps": 8}}); with `loops`, the
    share of each studio method's outputs that loop or echo (eval/loops.py: each person's own prompt, at the build's
    settings and at 128 tokens); then serving (serving.bench_serving, `serving` its keyword arguments: mixed
    batches, the scheduler, EXACT's first use, the app's start), whatever `methods` holds."""
    _check_bench_methods(methods)
    names = list(users)
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "bench.db")
        fits: dict[str, UserFit] = {}
        for n in tqdm(names, desc="onboarding", mininterval=2.0):
            t0 = time.perf_counter()
            store.add_user(n, users[n], engine.task.name)
            f = onboard.fit(engine, users[n])
            store.save_vector(n, engine.artifacts_id, f.lam, engine.lm.model_id, f.stats(),
                              f.style.extras_bytes() if f.style is not None else None)
            store.set_assignment(n, engine.artifacts_id, f.k, f.cluster, f.distances)
            f.stages_s["store"] = round(time.perf_counter() - t0 - f.total_s, 4)
            fits[n] = f
        stages = sorted({s for f in fits.values() for s in f.stages_s})
        onboarding = {s: round(_median([f.stages_s.get(s, 0.0) for f in fits.values()]), 4) for s in stages}
        onboarding["total"] = round(_median([f.total_s for f in fits.values()]), 4)

        # λ fit alone, repeated on one user's features
        n0 = names[0]
        engine.use_adapter(cluster_adapter(fits[n0].k, fits[n0].cluster))
        obj = engine.cfg.objectives[0]
        data = onboard.user_data(engine, engine.prepare_items(users[n0]), obj)
        fit_ms = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fit_user(engine.heads[obj], data, engine.cfg.head)
            fit_ms.append((time.perf_counter() - t0) * 1000)

        # decode overhead: CARD vs the cluster model, same prompt, same number of steps, interleaved
        s = replace(engine.cfg.decoding, max_new_tokens=n_tokens, min_new_tokens=n_tokens)
        f0 = fits[n0]
        ratios, t_cluster, t_card = [], [], []
        card_decode.generate(engine, [prompt], "cluster", f0.cluster, settings=s)  # warm-up
        for _ in range(repeats):
            a = card_decode.generate(engine, [prompt], "cluster", f0.cluster, settings=s)[0]
            b = card_decode.generate(engine, [prompt], "card", f0.cluster, f0.style, settings=s)[0]
            t_cluster.append(a.latency_s / a.n_tokens), t_card.append(b.latency_s / b.n_tokens)
            ratios.append(t_card[-1] / t_cluster[-1])
        # with `static`, the same cluster decode with a static cache (ModelConfig.static_cache; on a GPU,
        # compiled into CUDA graphs): its first decode pays the compile
        t_static, first_static = [], None
        if static and not uses_static_cache(engine.model):
            with static_cache(engine.model):
                first_static = card_decode.generate(engine, [prompt], "cluster", f0.cluster, settings=s)[0].latency_s
                for _ in range(repeats):
                    a = card_decode.generate(engine, [prompt], "cluster", f0.cluster, settings=s)[0]
                    t_static.append(a.latency_s / a.n_tokens)

        def switch(pair) -> float:
            """ms to switch from pair[0] to pair[1]: read λ and the assignment from the store, activate the adapter"""
            for name in pair:  # the time of the last: the switch to pair[1]
                t0 = time.perf_counter()
                store.vector(name, engine.artifacts_id)
                a = store.assignment(name, engine.artifacts_id, fits[name].k)
                engine.use_adapter(cluster_adapter(fits[name].k, a["cluster"]))
            return (time.perf_counter() - t0) * 1000

        same, cross = [], []
        by_cluster: dict[int, list[str]] = {}
        for n, f in fits.items():
            by_cluster.setdefault(f.cluster, []).append(n)
        pair_same = next((v[:2] for v in by_cluster.values() if len(v) >= 2), [n0, n0])
        clusters = list(by_cluster)
        pair_cross = [by_cluster[clusters[0]][0], by_cluster[clusters[1]][0]] if len(clusters) > 1 else None
        for _ in range(max(repeats, 20)):
            same.append(switch(pair_same))
            if pair_cross:
                cross.append(switch(pair_cross))
        bytes_per_user = _median([store.vector_bytes(n, engine.artifacts_id) for n in names])
        templated = {n: frozenset(i for i, it in enumerate(users[n]) if not it.x) for n in names}
        contexts = {n: UserContext(n, engine.prepare_items(users[n]), fits[n].cluster, fits[n].k, fits[n].lam,
                                   templated[n]) for n in names}
        table = bench_methods(engine, contexts, prompt, s, repeats, methods, store, Path(tmp), method_configs, fits)
        asks = list(prompts or [prompt])  # each person's own query, as Compare asks it: loops and echoes per method
        people = [Person(n, asks[i % len(asks)], tuple(contexts[n].items), fits[n]) for i, n in enumerate(names)]
        loops = loop_shares(engine, store, people, Path(tmp), configs=_loop_configs(method_configs)) if loops else {}
        from personalize.eval.bench_serving import bench_serving

        served = bench_serving(engine, store, names, list(prompts or [prompt]),
                               replace(engine.cfg.decoding, max_new_tokens=n_tokens), repeats=min(repeats, 3),
                               **(serving or {}))
    return {
        "serving": served, "loops": loops,
        "onboarding_s": onboarding, "fit_ms": round(_median(fit_ms), 3),
        "decode_overhead_ratio": round(_median(ratios), 4),
        "decode_ms_per_token": {"cluster": round(_median(t_cluster) * 1000, 2), "card": round(_median(t_card) * 1000, 2),
                                "cluster_static": round(_median(t_static) * 1000, 2) if t_static else None},
        "static_first_decode_s": None if first_static is None else round(first_static, 2),
        "switch_ms": {"same_cluster": round(_median(same), 4), "cross_cluster": round(_median(cross), 4) if cross else None},
        "bytes_per_user": int(bytes_per_user),
        "history_items": int(_median([len(v) for v in users.values()])),
        "methods": table,
        "settings": {"artifacts": engine.artifacts_id, "users": len(names), "repeats": repeats, "tokens": n_tokens,
                     "objective": engine.cfg.objectives[0], "device": str(engine.lm.device),
                     "method_configs": method_configs or {}},
    }


def _loop_configs(method_configs: dict | None) -> dict:
    """bench's budgets for the loop table's per-person work (EXACT's pairs, OPPU's steps), training only."""
    configs = {m: dict(c) for m, c in (method_configs or {}).items()}
    configs.setdefault("oppu", {})["report_loss"] = False
    return configs


def _check_bench_methods(methods: Sequence[str]) -> None:
    unknown = [m for m in methods if m not in BENCH_METHODS]
    if unknown:
        raise ValueError(f"bench measures {list(BENCH_METHODS)}; unknown: {unknown}")


def bench_methods(engine: Engine, users: dict[str, UserContext], prompt: str, settings, repeats: int,
                  methods: Sequence[str] = BENCH_METHODS, store: Store | None = None, folder: Path | None = None,
                  configs: dict[str, dict] | None = None, fits: dict[str, UserFit] | None = None) -> dict:
    """Paper Table 5, measured side by side: per method, onboarding time per user (median of `prepare`;
    CARD: its fit stages), latency per query (median wall time of `repeats` one-prompt queries, users
    in turn and methods interleaved, so a method's per-user switch, e.g. OPPU loading an evicted adapter,
    is part of it) and bytes stored per user (the method class's `stored` says what is counted). EXACT also gets
    `indexing_s`, its greedy attribute selection alone. A method that cannot run with these artifacts
    (P2P without a hypernetwork) is reported as {"skipped": reason}. `users` must be in `store` when
    one is given (OPPU, P2P and EXACT write their reports there); OPPU's adapters go to `folder`."""
    _check_bench_methods(methods)
    if any(m in CARD_ROWS for m in methods) and (fits is None or store is None):
        raise ValueError("the card row needs the users' fits and the store holding their λ vectors")
    if folder is None and any(getattr(REGISTRY[m], "per_person_files", False) for m in methods if m in REGISTRY):
        raise ValueError("a method that keeps files per person (OPPU's adapters) needs a folder for them")
    if not users or repeats < 1:
        raise ValueError("bench needs at least one user and repeats >= 1")
    configs, names = configs or {}, list(users)
    rows: dict[str, dict] = {}
    runners: dict = {}
    released = []  # methods that hold people's state in the engine's model (OPPU's adapters)
    # the own adapters' row is nobody's to keep: the engine's folder as it was after (OwnAdapters.scratch)
    with engine.own.scratch():
        try:
            for m in methods:
                if m in CARD_ROWS:  # CARD's row: its people's fits and stored styles
                    sizes = [store.vector_bytes(n, engine.artifacts_id) for n in names]
                    rows[m] = {"onboarding_s": round(_median([_fit_s(fits[n]) for n in names]), 4),
                               "bytes_per_user": int(_median(sizes))}
                    runners[m] = lambda u, m=m: card_decode.generate(
                        engine, [prompt], m, fits[u.name].cluster, fits[u.name].style, k=fits[u.name].k,
                        settings=settings)
                else:
                    # training only, per-person files in a temp folder
                    cfg = local_config(m, folder and folder / m, report_loss=False) | dict(configs.get(m, {}))
                    cls = METHODS[m]
                    method_cfg = cls.config_class(**cfg)  # bad settings are errors, not skipped rows
                    try:
                        method = cls(engine, store, method_cfg)
                    except ValueError as e:
                        rows[m] = {"skipped": str(e)}
                        continue
                    if hasattr(method, "release"):
                        released.append(method)
                    times, infos = [], []
                    for n in tqdm(names, desc=f"onboarding ({m})", mininterval=2.0):
                        t0 = time.perf_counter()
                        infos.append(method.prepare(users[n]))
                        times.append(time.perf_counter() - t0)
                    rows[m] = {"onboarding_s": round(_median(times), 4),
                               "bytes_per_user": int(_median([method.stored_bytes(users[n], info)
                                                              for n, info in zip(names, infos)]))}
                    if hasattr(method, "bench_figures"):
                        rows[m] |= method.bench_figures(infos)
                    runners[m] = lambda u, method=method: method.generate(u, [prompt], settings)
                rows[m]["stored"] = REGISTRY[m].stored
            if "card" in methods and "oppu" in methods:  # a cluster of one beside OPPU (issue 48)
                rows[OWN_ROW], runners[OWN_ROW] = _own_row(engine, users, fits, prompt, settings)

            for run in runners.values():  # warm-up: first-call costs are not per-query latency
                run(users[names[0]])
            latency: dict[str, list[float]] = {m: [] for m in runners}
            for r in tqdm(range(repeats), desc="latency", mininterval=2.0):
                u = users[names[r % len(names)]]
                for m, run in runners.items():
                    t0 = time.perf_counter()
                    run(u)
                    latency[m].append(time.perf_counter() - t0)
            for m, xs in latency.items():
                rows[m]["latency_s_per_query"] = round(_median(xs), 4)
        finally:
            for method in released:
                method.release()  # the users' adapters leave the engine's model
    return rows


OWN_ROW = "card, own adapter"


def _own_row(engine: Engine, users: dict[str, UserContext], fits: dict[str, UserFit], prompt: str,
             settings) -> tuple[dict, object]:
    """Each person as a cluster of one (methods/card/own.py): their own adapter trained from their cluster's and
    their style fitted over it, what the studio does after Save for a far person; its latency is card's over it."""
    seconds, trained, sizes, over = [], [], [], {}
    for n, u in tqdm(users.items(), desc="onboarding (own adapter)", mininterval=2.0):
        f = fits[n]
        t0 = time.perf_counter()
        got = engine.own.train(n, u.items, cluster_adapter(f.k, f.cluster))
        over[n] = onboard.fit(engine, u.items, k=f.k, own=owner_key(n))
        seconds.append(time.perf_counter() - t0)
        trained.append(got.train_s)
        sizes.append(got.bytes)
    row = {"onboarding_s": round(_median(seconds), 4), "training_s": round(_median(trained), 4),
           "bytes_per_user": int(_median(sizes)),
           "stored": "the upper blocks of the person's own LoRA (the style's bytes are card's row)"}
    return row, lambda u: card_decode.generate(engine, [prompt], "card", over[u.name].cluster, over[u.name].style,
                                               k=over[u.name].k, settings=settings)


def _fit_s(fit: UserFit) -> float:
    """CARD's onboarding work: embed and assign, features, λ fit (not the shared rewrites or the store)."""
    return sum(v for k, v in fit.stages_s.items() if k not in ("neutral rewrites", "store"))


def format_bench(b: dict) -> str:
    rows = [("onboarding total (s)", b["onboarding_s"]["total"])]
    rows += [(f"  {k} (s)", v) for k, v in b["onboarding_s"].items() if k != "total"]
    rows += [("λ fit (ms)", b["fit_ms"]), ("CARD decode overhead (x cluster)", b["decode_overhead_ratio"]),
             ("  cluster ms/token", b["decode_ms_per_token"]["cluster"]),
             ("  card ms/token", b["decode_ms_per_token"]["card"]),
             *([("  cluster ms/token, static cache", b["decode_ms_per_token"]["cluster_static"]),
                ("  static cache's first decode (s: a GPU compiles it)", b["static_first_decode_s"])]
               if b["decode_ms_per_token"].get("cluster_static") is not None else []),
             ("switch, same cluster (ms)", b["switch_ms"]["same_cluster"]),
             ("switch, across clusters (ms)", b["switch_ms"]["cross_cluster"]),
             ("bytes stored per user", b["bytes_per_user"]), ("history items per user", b["history_items"])]
    sv = b.get("serving")
    if sv:
        c = sv["concurrent"]
        rows += [(f"Compare of {', '.join(sv['methods'])} (s)", sv["compare_s"]), ("card alone (s)", sv["single_s"]),
                 ("  compare / single", sv["compare_over_single"]),
                 (f"{c['people']} people at once, scheduled (s)", c["scheduled_s"]),
                 ("  one decode at a time (s)", c["sequential_s"]), ("  speed-up", c["speedup"]),
                 ("  latency p50 / p95 (s)", f"{c['p50_s']} / {c['p95_s']}")]
        if "exact_first_use_s" in sv:
            rows += [("EXACT first use (s)", sv["exact_first_use_s"]), ("  old path (s)", sv["exact_first_use_old_s"])]
        if "fit" in sv:
            f = sv["fit"]
            rows += [(f"Fit my style, {f['items']} pasted items, right after Save (s)", f["median_right_after_save_s"]),
                     ("  after the neutral rewrites (s)", f["median_after_rewrites_s"])]
            if "median_floor_right_after_save_s" in f:
                rows += [(f"  right after Save, floor at {f['gemm_gflops']:.0f} GFLOP/s (s)",
                          f["median_floor_right_after_save_s"]),
                         ("    with the prompts' common beginning made once (s)", f["median_floor_shared_prefix_s"])]
        if "start_s" in sv:
            rows += [("app later start (s)", sv["start_s"])]
    w = max(len(r[0]) for r in rows)
    out = "\n".join(f"{k.ljust(w)}  {v}" for k, v in rows)
    out += "\n\n" + format_methods(b["methods"]) if b.get("methods") else ""
    return out + ("\n\nOutputs that loop or echo their prompt's scaffold, per method:\n" + format_loops(b["loops"])
                  if b.get("loops") else "")


def format_methods(table: dict) -> str:
    """The paper's Table 5 layout: one row per method (skipped ones say why)."""
    lines = ["| method | onboarding s/user | latency s/query | bytes/user | stored |", "|---|---|---|---|---|"]
    for m, r in table.items():
        if "skipped" in r:
            lines.append(f"| {m} | skipped: {r['skipped']} | | | |")
            continue
        onb = f"{r['onboarding_s']:.4f}" + (f" (indexing {r['indexing_s']:.4f})" if "indexing_s" in r else "")
        onb += f" (training {r['training_s']:.4f})" if "training_s" in r else ""
        lines.append(f"| {m} | {onb} | {r['latency_s_per_query']:.4f} | {r['bytes_per_user']:,} | {r['stored']} |")
    if OWN_ROW in table and "onboarding_s" in table.get("oppu", {}):
        lines.append(f"\n{OWN_ROW}: {table[OWN_ROW]['onboarding_s'] / table['oppu']['onboarding_s']:.2f} of OPPU's "
                     f"onboarding time, {table[OWN_ROW]['bytes_per_user'] / max(table['oppu']['bytes_per_user'], 1):.2f} "
                     "of its bytes")
    return "\n".join(lines)
