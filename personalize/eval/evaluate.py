"""Evaluation (METHOD §6) and the efficiency benchmark (paper Table 1 and Table 5 layouts).

eval: every query's user is onboarded from their profile only (the query is
never used for fitting), then each method generates for the query; ROUGE-1 /
ROUGE-L against the gold. bench: every figure measured in one run, repeated,
medians reported, ratios taken between runs interleaved in time; the Table 5
rows (RAG, OPPU, P2P, CARD, plus EXACT) on the same users, prompt and number
of decoded tokens.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
import tempfile
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Sequence

import numpy as np
from rank_bm25 import BM25Okapi
from tqdm import tqdm

from personalize.card.adapters import adapter_name
from personalize.data import Item, read_lamp, select_sources
from personalize.catalog import BENCH_METHODS, CARD_METHODS, CORE_METHODS, VARIANTS
from personalize.methods.engine import Engine, UserFit
from personalize.card.head import fit_user
from personalize.methods.registry import METHODS, REGISTRY, get_method, local_config
from personalize.methods.base import UserContext
from personalize.metrics import looping, paired_interval, rouge_per_query, rouge_scores
from personalize.eval.loops import Person, format_loops, loop_shares
from personalize.card.style import style_diagnostics, variant
from personalize.store import Store
from personalize.methods.card import card_decode

SHUFFLED = {"card_shuffled": "card"}  # the method decoded with another person's style
# eval's own columns beside the registry's methods: the core, CARD's variants, the shuffled control, the floor
EVAL_CORE = (*CORE_METHODS, *VARIANTS, *SHUFFLED, "bm25_copy")  # paper Table 5 rows, plus EXACT's indexing


def _words(s: str) -> list[str]:
    return s.lower().split()


def bm25_scores(query: str, profile: Sequence[Item]) -> np.ndarray:
    """Each profile item's BM25 score for the query (its input, else its output; lowercase words)."""
    docs = [_words(it.x or it.y) for it in profile]
    return BM25Okapi(docs).get_scores(_words(query)) if docs else np.zeros(0)


def bm25_copy(query: str, profile: Sequence[Item]) -> str:
    """The no-model floor of shared/data/README: copy the output of the BM25-nearest profile item."""
    scores = bm25_scores(query, profile)
    return profile[int(np.argmax(scores))].y if len(scores) else ""


def run_eval(engine: Engine, data_dir: str | Path, split: str, methods: Sequence[str], limit: int | None = None,
             max_items: int = 24, method_configs: dict[str, dict] | None = None, sources: Sequence[str] = (),
             n_boot: int = 1000, seed: int = 0, shards=None) -> dict:
    """ROUGE per method on the queries of `sources` (all when empty), with paired bootstrap intervals of the
    differences that matter (card − cluster, ...), the decoded user-specificity (card − card_shuffled) and the
    teacher-forced one (each user's held-out tokens under their own style vs another evaluated user's).
    `shards` (eval.ray_eval.RayShards): onboarding and decoding run there in shards, with the same results."""
    task, queries = read_lamp(data_dir, split)
    queries = [q for q in select_sources(queries, sources) if q.gold is not None and q.profile][: limit or None]
    if not queries:
        raise ValueError(f"no queries with a gold output and a profile in {data_dir} ({split})")
    known = (*EVAL_CORE, *METHODS)
    unknown = [m for m in methods if m not in known]
    if unknown:
        raise ValueError(f"unknown methods {unknown}; choose from {list(known)}")
    built = set(engine.meta.get("report", {}).get("sources", {}).get("built", []))
    seen = sorted({q.source for q in queries if q.source} & built)
    fits: list[UserFit] = []
    profiles: list[list[Item]] = []
    t0 = time.perf_counter()
    if shards is not None:
        profiles, fits = shards.onboard(queries, max_items, n_methods=len(methods))
    for q in tqdm(queries if shards is None else [], desc="onboarding", mininterval=2.0):
        profiles.append(engine.prepare_items(q.profile[:max_items]))
        fits.append(engine.fit(profiles[-1]))
    onboard_s = time.perf_counter() - t0
    partner = shuffled_partners([f.cluster for f in fits], seed)
    preds: dict[str, list[str]] = {}
    gold_lp: dict[str, list[float | None]] = {}  # each gold's log-prob per token under the method's own rows
    no_gold_lp: dict[str, str] = {}  # methods whose rows the scorer cannot read, and why
    seconds: dict[str, float] = {}
    for m in methods:
        preds[m] = [""] * len(queries)
        t_method = time.perf_counter()
        gold_lp[m] = [None] * len(queries)
        (shards.predict if shards is not None else partial(_predict, engine))(
            m, task, queries, profiles, fits, partner, method_configs, preds[m], gold_lp[m])
        seconds[m] = (time.perf_counter() - t_method) / len(queries)
        if any(v is None for v in gold_lp[m]):
            no_gold_lp[m] = NO_GOLD_LOGPROB.get(SHUFFLED.get(m, m), "its rows are not plain or CARD rows")
    golds = [q.gold for q in queries]
    scored = {m: v for m, v in gold_lp.items() if m not in no_gold_lp}
    per_query = {m: rouge_per_query(preds[m], golds) for m in methods}
    table = {m: {k: round(v, 4) if isinstance(v, float) else v for k, v in rouge_scores(preds[m], golds).items()}
             | {"looping": round(sum(looping(p) for p in preds[m]) / len(queries), 4),
                "seconds_per_person": round(seconds[m], 3)} for m in methods}
    diag_keys = sorted({k for f in fits for k in f.diagnostics if isinstance(f.diagnostics[k], (float, bool))})
    diag = {k: round(float(np.mean([f.diagnostics[k] for f in fits if k in f.diagnostics])), 4) for k in diag_keys}
    return {"task": task.name, "methods": table, "diagnostics": diag,
            "differences": paired_differences(per_query, n_boot, seed),
            "gold_logprob": {m: round(float(np.mean(v)), 4) for m, v in scored.items()}
            | {m: {"none": why} for m, why in no_gold_lp.items()},
            "gold_logprob_differences": paired_differences(scored, n_boot, seed),
            "specificity": {"decoded_rougeL": _gap(per_query, "card", "card_shuffled"),
                            "teacher_forced": teacher_forced_specificity(engine, fits, partner)},
            "settings": {"artifacts": engine.artifacts_id, "data": str(data_dir), "split": split, "n": len(queries),
                         "sources": sorted({q.source for q in queries if q.source}), "sources_in_build": seen,
                         "max_items": max_items, "alpha": engine.cfg.decoding.alpha, "top_k": engine.cfg.decoding.top_k,
                         "max_new_tokens": engine.cfg.decoding.max_new_tokens,
                         "repetition_penalty": engine.cfg.decoding.repetition_penalty,
                         "no_repeat_ngram": engine.cfg.decoding.no_repeat_ngram, "k": engine.cfg.default_k,
                         "objective": engine.cfg.objectives[0], "style": dataclasses.asdict(engine.cfg.style),
                         "onboarding_s_total": round(onboard_s, 1), "method_configs": method_configs or {}},
            "predictions": [{"id": q.id, "user": q.user, "source": q.source, "gold": q.gold,
                             **{m: preds[m][i] for m in methods},
                             **{f"{m}_gold_logprob": round(v[i], 4) for m, v in scored.items()}}
                            for i, q in enumerate(queries)]}


NO_GOLD_LOGPROB = {  # methods whose gold log-prob eval does not report, and why
    "bm25_copy": "no model: it copies a past text",
    "cope": "its rows contrast two forward passes (a twin row), which the scorer does not run",
    "p2p": "its rows carry a generated LoRA, which the scorer does not apply",
}


def _predict(engine: Engine, m: str, task, queries, profiles, fits, partner, method_configs, out: list[str],
             gold_lp: list | None = None) -> None:
    """Method m's output for every query, into `out`, and each gold's teacher-forced log-prob per token under the
    method's own row into `gold_lp`."""
    if m == "bm25_copy":
        out[:] = [bm25_copy(q.input, q.profile) for q in queries]
        return
    s = engine.cfg.decoding
    if m in METHODS:
        with tempfile.TemporaryDirectory() as tmp:  # per-user state (EXACT memory, OPPU adapters) is scratch
            cfg = local_config(m, Path(tmp) / m) | dict((method_configs or {}).get(m, {}))
            store = Store(Path(tmp) / "eval.db")
            method = get_method(m, engine, store, **cfg)
            for i, q in enumerate(tqdm(queries, desc=m, mininterval=2.0)):
                user = UserContext(q.user or q.id, profiles[i], fits[i].cluster, fits[i].k, fits[i].lam)
                store.add_user(user.name, user.items, task.name, replace=True)  # EXACT and PAG keep state per user
                out[i] = method.generate(user, [q.input], s)[0].text
                if gold_lp is not None:  # now, while the person's own adapter (OPPU) is loaded
                    gold_lp[i] = gold_logprobs(engine, method.rows(user, [q.input], s), [q.gold])[0]
            if hasattr(method, "release"):
                method.release()
        return
    styles = method_styles(m, fits, partner)
    out[:] = decode_people(engine, SHUFFLED.get(m, m), [q.input for q in queries], fits, styles, profiles, desc=m)
    if gold_lp is not None:
        gold_lp[:] = core_gold_logprobs(engine, m, queries, fits, styles, profiles)


def method_styles(m: str, fits: Sequence[UserFit], partner: Sequence[int]) -> list:
    """The style each person decodes with under core method m: their own, or their partner's (card_shuffled)."""
    return [fits[partner[i] if m in SHUFFLED else i].style for i in range(len(fits))]


def core_gold_logprobs(engine: Engine, m: str, queries, fits, styles, profiles) -> list[float | None]:
    """Each gold's log-prob per token under core method m's row for its person (gold_logprobs)."""
    rows = [card_decode.rows(engine, [q.input], SHUFFLED.get(m, m), f.cluster, st, k=f.k,
                             settings=engine.cfg.decoding, items=it)[0]
            for q, f, st, it in zip(queries, fits, styles, profiles)]
    return gold_logprobs(engine, rows, [q.gold for q in queries])


def gold_logprobs(engine: Engine, rows: Sequence, golds: Sequence[str]) -> list[float | None]:
    """Each gold's teacher-forced log-probability per token under its row (score.score_sequences: a plain row's
    softmax under its adapter, a CARD row's decoding distribution): the low-noise figure beside ROUGE. None for
    a row the scorer does not read (a twin or a generated LoRA)."""
    from personalize.methods.card.score import score_sequences
    from personalize.methods.card.steer import CardSteer

    ok = [i for i, r in enumerate(rows) if r.steer is None or isinstance(r.steer, CardSteer)]
    out: list[float | None] = [None] * len(rows)
    if ok:
        scores = score_sequences(engine.model, engine.tok, [rows[i] for i in ok], [golds[i] for i in ok],
                                 length_norm=True)
        for i, v in zip(ok, scores.tolist()):
            out[i] = v
    return out


def decode_people(engine: Engine, method: str, prompts: Sequence[str], fits: Sequence[UserFit],
                  styles: Sequence, items: Sequence[Sequence[Item]], settings=None, batch: int = 8,
                  desc: str | None = None) -> list[str]:
    """One output per person for a core method or CARD variant: people of a cluster decode together in batches;
    a CARD that retrieves the person's own items into the prompt decodes each person alone."""
    out = [""] * len(prompts)
    alone = decodes_alone(engine, method)
    for b in tqdm(decode_batches(engine, method, fits, batch), desc=desc, mininterval=2.0, disable=desc is None):
        c = -1 if card_decode.rows_kind(method) == "base" else fits[b[0]].cluster
        gens = card_decode.generate(engine, [prompts[i] for i in b], method, max(c, 0), [styles[i] for i in b],
                                    k=fits[b[0]].k, settings=settings, items=items[b[0]] if alone else None)
        for i, g in zip(b, gens):
            out[i] = g.text
    return out


def decode_batches(engine: Engine, method: str, fits: Sequence[UserFit], batch: int = 8) -> list[list[int]]:
    """decode_people's batches (people's indices): a cluster's people in order, `batch` at a time (all people
    together for base; one at a time for a CARD that retrieves). Shards made of whole batches decode exactly as
    one run does."""
    groups: dict[int, list[int]] = {}
    for i, f in enumerate(fits):
        groups.setdefault(-1 if card_decode.rows_kind(method) == "base" else f.cluster, []).append(i)
    size = 1 if decodes_alone(engine, method) else batch
    return [idx[j: j + size] for idx in groups.values() for j in range(0, len(idx), size)]


def decodes_alone(engine: Engine, method: str) -> bool:
    """A CARD that retrieves the person's items decodes one person a call; at α = 0 it decodes as the cluster
    model does, in its batches (the same padding: the same tokens)."""
    if engine.cfg.decoding.alpha == 0:
        return False
    return method in CARD_METHODS and variant(method, engine.cfg.style).retrieval


def shuffled_partners(clusters: Sequence[int], seed: int = 0) -> list[int]:
    """For each user, another evaluated user: a derangement within the same cluster where the cluster has two
    or more users, else any other user (card_shuffled: the decoded user-specificity)."""
    rng = random.Random(seed)
    n = len(clusters)
    out = list(range(n))
    by: dict[int, list[int]] = {}
    for i, c in enumerate(clusters):
        by.setdefault(c, []).append(i)
    for members in by.values():
        if len(members) >= 2:
            rot = rng.randrange(1, len(members))  # a rotation by r ≠ 0 moves everyone
            order = members[:]
            rng.shuffle(order)
            for a, b in zip(order, order[rot:] + order[:rot]):
                out[a] = b
        elif n > 1:
            out[members[0]] = rng.choice([j for j in range(n) if j != members[0]])
    return out


def paired_differences(per_query: dict[str, list[float]], n_boot: int = 1000, seed: int = 0) -> dict:
    """Mean ROUGE-L difference and its paired bootstrap 95 % interval (queries resampled) for each pair that
    the comparison rests on, among the methods present."""
    pairs = [("card", "cluster"), ("cluster", "base"), ("card", "base"), ("card", "card_shuffled"),
             ("card", "bm25_copy"), ("card", "card_paper")]
    pairs += [(v, "cluster") for v in (*VARIANTS, "oppu")]
    pairs += [("card", "oppu")]  # OPPU, the per-person LoRA, is the bar
    rng = np.random.default_rng(seed)
    out = {}
    for a, b in dict.fromkeys(pairs):
        if a in per_query and b in per_query:
            out[f"{a} - {b}"] = paired_interval(np.asarray(per_query[a]) - np.asarray(per_query[b]), n_boot, rng=rng)
    return out


def _gap(per_query: dict[str, list[float]], a: str, b: str) -> float | None:
    if a not in per_query or b not in per_query:
        return None
    return round(float(np.mean(per_query[a]) - np.mean(per_query[b])), 4)


def teacher_forced_specificity(engine: Engine, fits: Sequence[UserFit], partner: Sequence[int]) -> dict:
    """Each user's held-out tokens (the newest profile items) scored by style_scores with their own style and
    with their card_shuffled partner's (both fitted without those items): next-token accuracy and log-prob."""
    head = engine.heads.get("tokens")
    rows = []
    for i, f in enumerate(fits):
        j = partner[i]
        if head is None or f.held is None or fits[j].held_style is None or j == i:
            continue
        own = style_diagnostics(head, f.held, f.held_style, [fits[j].held_style], engine.cfg.style,
                                engine.cfg.decoding.alpha)
        if own.get("n"):
            rows.append(own)
    if not rows:
        return {"users": 0}
    keys = ("acc_no_head", "acc_ones", "acc_own", "acc_other", "margin_no_head", "margin_own", "margin_other",
            "specificity_gap")
    return {k: round(float(np.mean([r[k] for r in rows])), 4) for k in keys} | {"users": len(rows)}


def format_table(result: dict) -> str:
    """The paper's Table 1 layout: one row per task, one column per method (ROUGE-1 / ROUGE-L)."""
    methods = list(result["methods"])
    head = "| task | " + " | ".join(methods) + " |"
    sep = "|---" * (len(methods) + 1) + "|"
    r1 = f"| {result['task']} R-1 | " + " | ".join(f"{result['methods'][m]['rouge1']:.4f}" for m in methods) + " |"
    rl = f"| {result['task']} R-L | " + " | ".join(f"{result['methods'][m]['rougeL']:.4f}" for m in methods) + " |"
    return "\n".join([head, sep, r1, rl])


# ---------------------------------------------------------------- bench

def _median(xs):
    return statistics.median(xs)


def run_bench(engine: Engine, users: dict[str, list[Item]], prompt: str, repeats: int = 5,
              n_tokens: int = 24, methods: Sequence[str] = BENCH_METHODS,
              method_configs: dict[str, dict] | None = None, prompts: Sequence[str] | None = None,
              serving: dict | None = None, loops: bool = True) -> dict:
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
            f = engine.fit(users[n])
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
        engine.use_adapter(adapter_name(fits[n0].k, fits[n0].cluster) if fits[n0].k > 1 else "k1c0")
        obj = engine.cfg.objectives[0]
        data = engine.user_data(engine.prepare_items(users[n0]), obj)
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

        # user switch: read λ and the assignment from the store, activate the user's adapter
        def switch(name):
            lam, _ = store.vector(name, engine.artifacts_id)
            a = store.assignment(name, engine.artifacts_id, fits[name].k)
            engine.use_adapter(adapter_name(fits[name].k, a["cluster"]) if fits[name].k > 1 else "k1c0")
            return lam

        same, cross = [], []
        by_cluster: dict[int, list[str]] = {}
        for n, f in fits.items():
            by_cluster.setdefault(f.cluster, []).append(n)
        pair_same = next((v[:2] for v in by_cluster.values() if len(v) >= 2), [n0, n0])
        clusters = list(by_cluster)
        pair_cross = [by_cluster[clusters[0]][0], by_cluster[clusters[1]][0]] if len(clusters) > 1 else None
        for _ in range(max(repeats, 20)):
            switch(pair_same[0])
            t0 = time.perf_counter()
            switch(pair_same[1])
            same.append((time.perf_counter() - t0) * 1000)
            if pair_cross:
                switch(pair_cross[0])
                t0 = time.perf_counter()
                switch(pair_cross[1])
                cross.append((time.perf_counter() - t0) * 1000)
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
        "decode_ms_per_token": {"cluster": round(_median(t_cluster) * 1000, 2), "card": round(_median(t_card) * 1000, 2)},
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
    if "card" in methods and (fits is None or store is None):
        raise ValueError("the card row needs the users' fits and the store holding their λ vectors")
    if folder is None and any(getattr(REGISTRY[m], "per_person_files", False) for m in methods if m in REGISTRY):
        raise ValueError("a method that keeps files per person (OPPU's adapters) needs a folder for them")
    if not users or repeats < 1:
        raise ValueError("bench needs at least one user and repeats >= 1")
    configs, names = configs or {}, list(users)
    rows: dict[str, dict] = {}
    runners: dict = {}
    released = []  # methods that hold people's state in the engine's model (OPPU's adapters)
    try:
        for m in methods:
            if m == "card":
                rows[m] = {"onboarding_s": round(_median([_fit_s(fits[n]) for n in names]), 4),
                           "bytes_per_user": int(_median([store.vector_bytes(n, engine.artifacts_id) for n in names]))}
                runners[m] = lambda u: card_decode.generate(engine, [prompt], "card", fits[u.name].cluster, fits[u.name].style,
                                                       k=fits[u.name].k, settings=settings)
            else:
                # training only, per-person files in a temp folder
                cfg = local_config(m, folder / m, report_loss=False) | dict(configs.get(m, {}))
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


def _fit_s(fit: UserFit) -> float:
    """CARD's onboarding work: embed and assign, features, λ fit (not the shared rewrites or the store)."""
    return sum(v for k, v in fit.stages_s.items() if k not in ("neutral rewrites", "store"))


def format_bench(b: dict) -> str:
    rows = [("onboarding total (s)", b["onboarding_s"]["total"])]
    rows += [(f"  {k} (s)", v) for k, v in b["onboarding_s"].items() if k != "total"]
    rows += [("λ fit (ms)", b["fit_ms"]), ("CARD decode overhead (x cluster)", b["decode_overhead_ratio"]),
             ("  cluster ms/token", b["decode_ms_per_token"]["cluster"]),
             ("  card ms/token", b["decode_ms_per_token"]["card"]),
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
        lines.append(f"| {m} | {onb} | {r['latency_s_per_query']:.4f} | {r['bytes_per_user']:,} | {r['stored']} |")
    return "\n".join(lines)
