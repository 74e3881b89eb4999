"""Evaluation (METHOD §6, paper Table 1 layout): every query's user is onboarded from their profile only (the query
is never used for fitting), then each method generates for the query; ROUGE-1 / ROUGE-L against the gold, paired
bootstrap intervals of the differences, the decoded and teacher-forced specificity. The efficiency benchmark is
bench.py.
"""

from __future__ import annotations

import dataclasses
import random
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Sequence

import numpy as np
from rank_bm25 import BM25Okapi
from tqdm import tqdm

from personalize.data import Item, read_lamp, select_sources
from personalize.catalog import CARD_METHODS, CORE_METHODS, VARIANTS
from personalize.methods.card.person import fit_with_own
from personalize.methods.engine import Engine
from personalize.methods.card.onboard import UserFit
from personalize.methods.registry import METHODS, get_method, local_config
from personalize.methods.base import UserContext
from personalize.metrics import copy_aware, looping, paired_interval, repeat_shares, repeated_text, rouge_per_query, \
    rouge_scores
from personalize.methods.card.style import style_diagnostics, variant
from personalize.store import Store
from personalize.methods.card import card_decode

SHUFFLED = {"card_shuffled": "card"}  # the method decoded with another person's style
# eval's own columns beside the registry's methods: the core, CARD's variants, the shuffled control, the floor
COPY = "bm25_copy"  # the floor: no model, the person's BM25-nearest past text copied
EVAL_CORE = (*CORE_METHODS, *VARIANTS, *SHUFFLED, COPY)  # paper Table 5 rows, plus EXACT's indexing


def _words(s: str) -> list[str]:
    return s.lower().split()


def bm25_copy(query: str, profile: Sequence[Item]) -> str:
    """The no-model floor of shared/data/README: copy the output of the BM25-nearest profile item (scored on its
    input, else its output; lowercase words)."""
    if not profile:
        return ""
    return profile[int(np.argmax(BM25Okapi([_words(it.x or it.y) for it in profile]).get_scores(_words(query))))].y


def run_eval(engine: Engine, *args, **kwargs) -> dict:
    """_run_eval with the far people's own adapters (a cluster of one) as scratch: the engine's own folder and its
    adapters in memory are as they were afterwards."""
    with engine.own.scratch():
        return _run_eval(engine, *args, **kwargs)


def _run_eval(engine: Engine, data_dir: str | Path, split: str, methods: Sequence[str], limit: int | None = None,
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
        fits.append(fit_with_own(engine, q.user or q.id, profiles[-1]))
    onboard_s = time.perf_counter() - t0
    partner = shuffled_partners([f.cluster for f in fits], seed)
    preds: dict[str, list[str]] = {m: [""] * len(queries) for m in methods}
    # each gold's log-prob per token under the method's own rows
    gold_lp: dict[str, list[float | None]] = {m: [None] * len(queries) for m in methods}
    no_gold_lp: dict[str, str] = {}  # methods whose rows the scorer cannot read, and why
    seconds: dict[str, float] = {}
    for m in methods:
        t_method = time.perf_counter()
        (shards.predict if shards is not None else partial(_predict, engine))(
            m, task, queries, profiles, fits, partner, method_configs, preds[m], gold_lp[m])
        seconds[m] = (time.perf_counter() - t_method) / len(queries)
        if any(v is None for v in gold_lp[m]):
            no_gold_lp[m] = NO_GOLD_LOGPROB.get(SHUFFLED.get(m, m), "its rows are not plain or CARD rows")
    golds = [q.gold for q in queries]
    pasts = [[it.y for it in q.profile] for q in queries]  # what a method could hand back: the person's past texts
    scored = {m: v for m, v in gold_lp.items() if m not in no_gold_lp}
    per_query = {m: rouge_per_query(preds[m], golds) for m in methods}
    copies = {m: copy_aware(preds[m], golds, pasts) for m in methods}
    table = {m: {"rougeL_copy_aware": round(copies[m]["rougeL_copy_aware"], 4)}
             | {k: round(v, 4) if isinstance(v, float) else v for k, v in rouge_scores(preds[m], golds).items()}
             | {k: round(copies[m][k], 4) for k in ("repeats", "repeats_near")}
             | {"looping": round(sum(looping(p) for p in preds[m]) / len(queries), 4),
                "seconds_per_person": round(seconds[m], 3)} for m in methods}
    aware = {m: c["per_query"] for m, c in copies.items()}
    diag_keys = sorted({k for f in fits for k in f.diagnostics if isinstance(f.diagnostics[k], (float, bool))})
    diag = {k: round(float(np.mean([f.diagnostics[k] for f in fits if k in f.diagnostics])), 4) for k in diag_keys}
    return {"task": task.name, "methods": table, "diagnostics": diag,
            "golds": {k: round(v, 4) for k, v in repeat_shares(golds, pasts).items()},  # how often people repeat
            "differences_copy_aware": paired_differences(aware, n_boot, seed),
            "differences": paired_differences(per_query, n_boot, seed),
            "gold_logprob": {m: round(float(np.mean(v)), 4) for m, v in scored.items()}
            | {m: {"none": why} for m, why in no_gold_lp.items()},
            "gold_logprob_differences": paired_differences(scored, n_boot, seed),
            "specificity": {"decoded_rougeL_copy_aware": _gap(aware, "card", "card_shuffled"),
                            "decoded_rougeL": _gap(per_query, "card", "card_shuffled"),
                            "teacher_forced": teacher_forced_specificity(engine, fits, partner)},
            "settings": {"artifacts": engine.artifacts_id, "data": str(data_dir), "split": split, "n": len(queries),
                         "sources": sorted({q.source for q in queries if q.source}), "sources_in_build": seen,
                         "max_items": max_items, **{k: getattr(engine.cfg.decoding, k) for k in (
                             "alpha", "top_k", "max_new_tokens", "repetition_penalty", "no_repeat_ngram")},
                         "k": engine.cfg.default_k,
                         "objective": engine.cfg.objectives[0], "style": dataclasses.asdict(engine.cfg.style),
                         "onboarding_s_total": round(onboard_s, 1), "method_configs": method_configs or {}},
            "predictions": [{"id": q.id, "user": q.user, "source": q.source, "gold": q.gold,
                             "own": bool(fits[i].style is not None and fits[i].style.own),  # a cluster of one
                             **{m: preds[m][i] for m in methods},
                             **{f"{m}_repeats": _repeat_index(preds[m][i], pasts[i]) for m in methods},
                             **{f"{m}_gold_logprob": round(v[i], 4) for m, v in scored.items()}}
                            for i, q in enumerate(queries)]}


def _repeat_index(text: str, past: Sequence[str]) -> int | None:
    """The 1-based number of the past text (the query's profile order) that `text` repeats, or None."""
    r = repeated_text(text, past)
    return None if r is None else r.index + 1


NO_GOLD_LOGPROB = {  # methods whose gold log-prob eval does not report, and why
    COPY: "no model: it copies a past text",
    "cope": "its rows contrast two forward passes (a twin row), which the scorer does not run",
    "p2p": "its rows carry a generated LoRA, which the scorer does not apply",
}


def _predict(engine: Engine, m: str, task, queries, profiles, fits, partner, method_configs, out: list[str],
             gold_lp: list | None = None) -> None:
    """Method m's output for every query, into `out`, and each gold's teacher-forced log-prob per token under the
    method's own row into `gold_lp`."""
    if m == COPY:
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
    for b in tqdm(decode_batches(engine, method, fits, batch, styles), desc=desc, mininterval=2.0,
                  disable=desc is None):
        c = -1 if not card_decode.rows_kind(method).cluster_lora else fits[b[0]].cluster
        gens = card_decode.generate(engine, [prompts[i] for i in b], method, max(c, 0), [styles[i] for i in b],
                                    k=fits[b[0]].k, settings=settings, items=items[b[0]] if alone else None)
        for i, g in zip(b, gens):
            out[i] = g.text
    return out


def decode_batches(engine: Engine, method: str, fits: Sequence[UserFit], batch: int = 8,
                   styles: Sequence | None = None) -> list[list[int]]:
    """decode_people's batches (people's indices): a cluster's people in order, `batch` at a time (all people
    together for base; one at a time for a CARD that retrieves; a steered style over its person's own adapter with
    the others over it). Shards made of whole batches decode exactly as one run does."""
    kind = card_decode.rows_kind(method)
    groups: dict[tuple, list[int]] = {}
    for i, f in enumerate(fits):
        own = getattr(styles[i], "own", None) if styles is not None and kind.steered else None
        groups.setdefault((-1, None) if not kind.cluster_lora else (f.cluster, own), []).append(i)
    size = 1 if decodes_alone(engine, method) else batch
    return [idx[j: j + size] for idx in groups.values() for j in range(0, len(idx), size)]


def decodes_alone(engine: Engine, method: str) -> bool:
    """A CARD that retrieves the person's items decodes one person a call; at α = 0 it decodes as the cluster
    model does, in its batches (the same padding: the same tokens)."""
    return engine.cfg.decoding.alpha != 0 and method in CARD_METHODS and variant(method, engine.cfg.style).retrieval


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
    """Mean per-query score difference (ROUGE-L, or its copy-aware form) and its paired bootstrap 95 % interval
    (queries resampled) for each pair that the comparison rests on, among the methods present."""
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
    """The paper's Table 1 layout: one row per task, one column per method, led by the copy-aware ROUGE-L (a past
    text handed back scores 0), then ROUGE-1 / ROUGE-L and the shares of outputs that repeat a past text."""
    methods = list(result["methods"])
    head = "| task | " + " | ".join(methods) + " |"
    sep = "|---" * (len(methods) + 1) + "|"
    rows = [f"| {result['task']} {label} | " + " | ".join(f"{result['methods'][m][key]:.4f}" for m in methods) + " |"
            for label, key in (("R-L copy-aware", "rougeL_copy_aware"), ("R-1", "rouge1"), ("R-L", "rougeL"),
                               ("repeats", "repeats"), ("repeats near", "repeats_near"))]
    return "\n".join([head, sep, *rows])
