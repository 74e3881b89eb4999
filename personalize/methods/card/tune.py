"""Decoding settings chosen on validation people, never on the people eval scores (METHOD §1.9.2).

One greedy pass over the settings that decide what a person sees, each step
keeping the best validation copy-aware ROUGE-L (metrics.copy_aware: an output that repeats
one of the person's past texts and is not the answer scores 0; ties: the simpler setting):
1. repetition control, on the cluster model (the same setting then serves every method);
2. which parts of the person's style `card` decodes with (style.VARIANTS: λ alone,
   + token bias, + kNN memory, both, the retrieved items in the prompt);
3. α, under the rule the head was trained with (1 = as trained);
4. the kNN mixture weight w, when the memory is on; 5. the fallback to the cluster model.
Then the harm guard: `card` keeps the chosen settings only when a paired bootstrap over the
validation people puts its gain over the cluster model above 0; otherwise α = 0 and `card`
decodes as the cluster model, and the report says why. A setting chosen on a handful of
people is noise, so the guard asks for MIN_PEOPLE of them where the data has them.

`build` runs it all on its validation people (people held out of the population: their
query, or their newest item); `python -m personalize tune` re-runs it on an existing build,
by default on people of the build's sources who are not in its population, and writes the
choice into the artifacts' config.json, so a decoding change never needs a rebuild.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from tqdm import tqdm

from personalize.methods.card import card_decode, onboard
from personalize.methods.card.config import FORMAT_VERSION
from personalize.data import Item, read_lamp, select_sources
from personalize.serving.settings import DecodingSettings
from personalize.methods.engine import Engine
from personalize.methods.card.onboard import UserFit
from personalize.methods.card.person import fit_with_own
from personalize.metrics import copy_aware, looping, paired_interval, rouge_scores

REPETITION = ((1.0, 0), (1.0, 4), (1.0, 3), (1.2, 4))  # (penalty on generated tokens, no-repeat n-gram)
STYLES = {  # candidates for `card`, simplest first
    "lambda": dict(bias=False, memory=False, retrieval=False),
    "bias": dict(bias=True, memory=False, retrieval=False),
    "memory": dict(bias=False, memory=True, retrieval=False),
    "bias+memory": dict(bias=True, memory=True, retrieval=False),
    "retrieval+bias+memory": dict(bias=True, memory=True, retrieval=True),
}
ALPHAS = (0.5, 1.0, 2.0)
KNN_WEIGHTS = (0.15, 0.3, 0.5)
MIN_PEOPLE = 30  # validation people the harm guard wants before it lets `card` differ from the cluster model


def decode_each(engine: Engine, method: str, prompts, fits, items, s: DecodingSettings) -> list[str]:
    """Every person's output in one mixed batch (each row exactly what it gives decoded alone, as eval decodes
    it): a setting costs one decode of all the validation people, not one per cluster."""
    rows = [r for p, f, it in zip(prompts, fits, items)
            for r in card_decode.rows(engine, [p], method, f.cluster, f.style, k=f.k, settings=s, items=it)]
    return [g.text for g in engine.decode_rows(rows)] if rows else []


class Trials:
    """Each setting's outputs decoded once: the choice revisits settings (α = 1 after the style step, the fallback
    off, the guard's card and cluster), and a decode of every validation person is the choice's whole cost. The
    key is what the method's rows read: the cluster model ignores α and the style, card reads them all."""

    def __init__(self, engine: Engine, prompts, golds, fits, items, decode: Callable | None = None):
        self.engine, self.prompts, self.golds, self.fits, self.items = engine, prompts, golds, fits, items
        self.pasts = [[it.y for it in its] for its in items]  # what a setting could hand back instead of writing
        # decode(method, prompts, fits, items, settings) -> texts: decode_each here, or in shards (`tune --ray`)
        self.decode = decode or partial(decode_each, engine)
        self.outputs: dict = {}
        self.decodes = 0  # decodes of all the validation people (tests read it)

    def key(self, method: str):
        cfg = self.engine.cfg
        if not card_decode.rows_kind(method).steered:  # α does not change its output
            return method, replace(cfg.decoding, alpha=0.0)
        return method, cfg.decoding, cfg.style

    def texts(self, method: str) -> list[str]:
        key = self.key(method)
        if key not in self.outputs:
            self.decodes += 1
            self.outputs[key] = self.decode(method, self.prompts, self.fits, self.items, self.engine.cfg.decoding)
        return self.outputs[key]

    def score(self, method: str) -> dict:
        """The copy-aware ROUGE-L the choice is made on (a setting that wins only by copying loses), with the raw
        figure, the repeat share and the loop share beside it."""
        outs = self.texts(method)
        copies = copy_aware(outs, self.golds, self.pasts)
        return {"rougeL_copy_aware": round(copies["rougeL_copy_aware"], 4),
                "rougeL": round(rouge_scores(outs, self.golds)["rougeL"], 4),
                "repeats_near": round(copies["repeats_near"], 4),
                "looping": round(sum(looping(o) for o in outs) / max(len(outs), 1), 4)}

    def per_person(self, method: str) -> list[float]:
        """Each person's copy-aware ROUGE-L (metrics.copy_aware), for the guard's paired interval."""
        return copy_aware(self.texts(method), self.golds, self.pasts)["per_query"]


STEPS = ("repetition", "style", "alpha", "knn_weight", "fallback")


def choose_decoding(engine: Engine, prompts: Sequence[str], golds: Sequence[str], fits: Sequence[UserFit],
                    items: Sequence[Sequence[Item]], progress=None, steps: Sequence[str] = STEPS,
                    alphas: Sequence[float] = ALPHAS, decoder: Trials | None = None) -> tuple[Engine, dict]:
    """The greedy pass above on (prompt, gold) of validation people fitted on `items`, then the harm guard;
    returns the engine with the chosen settings in engine.cfg and the sweep. `steps` re-runs only some steps,
    the others kept as built."""
    unknown = [x for x in steps if x not in STEPS]
    if unknown:
        raise ValueError(f"unknown tune steps {unknown}; choose from {STEPS}")
    report: dict = {"users": len(prompts)}
    far = [i for i, f in enumerate(fits) if f.far and not f.cold_start] if engine.cfg.own.far and not decoder else []
    if far and len(far) < len(fits):  # each kind judged on its own kind: the steps and the guard on the near people
        near = [i for i in range(len(fits)) if i not in far]
        kinds = [[xs[i] for i in idx] for idx in (near, far) for xs in (prompts, golds, fits, items)]
        (prompts, golds, fits, items), far_people = kinds[:4], kinds[4:]
        report |= {"users": len(prompts), "far_users": len(far)}
    dec = decoder or Trials(engine, prompts, golds, fits, items)

    def pick(name, options, apply, method="card"):
        if name not in steps:
            return
        scores = {}
        for label, value in options:
            engine.cfg = apply(value)
            scores[label] = dec.score(method)
            if progress:
                progress(f"{name} {label}: {scores[label]}")
        best = max(scores, key=lambda k: scores[k]["rougeL_copy_aware"])  # first of ties: options go simplest first
        chosen = dict(options)[best]
        engine.cfg = apply(chosen)
        report[name] = {"chosen": best, "sweep": scores}

    decoding = lambda **v: replace(engine.cfg, decoding=replace(engine.cfg.decoding, **v))  # noqa: E731
    style = lambda **v: replace(engine.cfg, style=replace(engine.cfg.style, **v))  # noqa: E731
    pick("repetition", [(f"penalty {p}, no-repeat {n}", (p, n)) for p, n in REPETITION],
         lambda v: decoding(repetition_penalty=v[0], no_repeat_ngram=v[1]), method="cluster")
    if "repetition" in report:
        report["cluster_rougeL"] = report["repetition"]["sweep"][report["repetition"]["chosen"]]["rougeL_copy_aware"]
    if "alpha" in steps:
        engine.cfg = decoding(alpha=1.0)
    pick("style", list(STYLES.items()), lambda v: style(fallback=False, **v))
    pick("alpha", [(str(a), a) for a in alphas if a > 0], lambda a: decoding(alpha=a))
    if engine.cfg.style.memory:
        pick("knn_weight", [(str(w), w) for w in KNN_WEIGHTS], lambda w: style(knn_weight=w))
    pick("fallback", [("off", False), ("on", True)], lambda v: style(fallback=v))
    engine, report["guard"] = harm_guard(engine, prompts, golds, fits, items, decoder=dec,
                                         apart=report.get("far_users", 0))
    if progress:
        progress(f"guard: {report['guard']['why']}")
    if "far_users" in report:  # the far people's default, on them
        engine, report["own"] = own_guard(engine, *far_people)
        if progress:
            progress(f"own adapters: {report['own']['why']}")
    report["chosen_decoding"] = {k: v for k, v in asdict(engine.cfg.decoding).items()
                                 if k in ("alpha", "repetition_penalty", "no_repeat_ngram")}
    report["chosen_style"] = asdict(engine.cfg.style)  # (report["style"] is the style step's sweep)
    return engine, report


def harm_guard(engine: Engine, prompts: Sequence[str], golds: Sequence[str], fits: Sequence[UserFit],
               items: Sequence[Sequence[Item]], n_boot: int = 2000,
               decoder: Trials | None = None, apart: int = 0) -> tuple[Engine, dict]:
    """`card` as chosen, or the cluster model (α = 0) unless the paired bootstrap 95 % interval of card −
    cluster (copy-aware ROUGE-L per person: a past text handed back scores 0) lies above 0 on the validation
    people. Never a default that harms."""
    s = engine.cfg.decoding
    dec = decoder or Trials(engine, prompts, golds, fits, items)
    card, cluster = dec.per_person("card"), dec.per_person("cluster")
    verdict = guard_verdict(card, cluster, s.alpha, n_boot, apart)
    if not verdict["kept"]:
        engine.cfg = replace(engine.cfg, decoding=replace(s, alpha=0.0))
    return engine, verdict


FAR_MIN_PEOPLE = 10  # far validation people the own adapters' guard wants before it judges them


def own_guard(engine: Engine, prompts: Sequence[str], golds: Sequence[str], fits: Sequence[UserFit],
              items: Sequence[Sequence[Item]], n_boot: int = 2000) -> tuple[Engine, dict]:
    """Far people's default judged on far validation people (a cluster of one, methods/card/own.py): each gets their
    own adapter and their style over it, card over it is decoded at the chosen α against the cluster model; the own
    adapters stay on unless that loses (the interval below 0). OPPU-class training for people no cluster fits is the
    product's decision; this guard only keeps it from harming. Too few far people to judge: the default stands."""
    if len(fits) < FAR_MIN_PEOPLE:
        return engine, {"kept": True, "people": len(fits),
                        "why": f"own adapters kept for far people: {len(fits)} far validation people, fewer than the "
                               f"{FAR_MIN_PEOPLE} this guard judges on (a build can hold out whole sources for them)"}
    with engine.own.scratch():
        own = [fit_with_own(engine, f"validation {i}", it, f) for i, (f, it) in enumerate(zip(fits, items))]
        pasts = [[it.y for it in its] for its in items]
        card, cluster = (copy_aware(decode_each(engine, m, prompts, own, items, engine.cfg.decoding), golds,
                                    pasts)["per_query"] for m in ("card", "cluster"))
    gain = paired_interval(np.asarray(card, float) - np.asarray(cluster, float), n_boot)
    kept = gain["ci95"][1] >= 0
    why = (f"own adapters {'kept' if kept else 'off'} for far people: card over them − cluster copy-aware ROUGE-L "
           f"{gain['mean']:+.4f} {gain['ci95']} on {len(fits)} far validation people"
           + ("" if kept else ", an interval below 0"))
    if not kept:
        engine.cfg = replace(engine.cfg, own=replace(engine.cfg.own, far=False))
    return engine, {"kept": kept, "people": len(fits), "card_minus_cluster": gain, "why": why}


def guard_verdict(card: Sequence[float], cluster: Sequence[float], alpha: float, n_boot: int = 2000,
                  apart: int = 0) -> dict:
    """The harm guard's rule on per-person scores: keep α only when the paired bootstrap 95 % interval of
    card − cluster lies above 0; in plain words, why. `apart`: validation people beyond the clusters, judged apart."""
    gain = paired_interval(np.asarray(card, float) - np.asarray(cluster, float), n_boot)
    kept = alpha > 0 and gain["ci95"][0] > 0
    where = f"on {len(card)} validation people" + (
        f" near the clusters ({apart} beyond them judged apart, on their own adapters)" if apart else
        f" (fewer than the {MIN_PEOPLE} wanted: the data has no more)" if len(card) < MIN_PEOPLE else "")
    if kept:
        why = (f"card kept (α = {alpha}): card − cluster copy-aware ROUGE-L {gain['mean']:+.4f} {gain['ci95']} "
               f"{where}")
    else:
        why = (f"card decodes as the cluster model (α = 0): the chosen setting (α = {alpha}) did not beat it, "
               f"card − cluster copy-aware ROUGE-L {gain['mean']:+.4f} {gain['ci95']} {where}, an interval not "
               "above 0")
    return {"kept": kept, "alpha_chosen": alpha, "alpha": alpha if kept else 0.0, "people": len(card),
            "card_minus_cluster": gain, "why": why}


def validation_people(engine: Engine, data_dir: str | Path, split: str, n_users: int, max_items: int = 24):
    """People of the build's sources who are not in its population: (query prompt, gold, profile) each."""
    task, queries = read_lamp(data_dir, split)
    built = set(engine.meta.get("report", {}).get("sources", {}).get("built", []))
    population = set(engine.meta.get("users", []))
    people = [q for q in queries if (q.user or q.id) not in population and q.gold is not None and len(q.profile) >= 3
              and (not built or q.source in built)]
    if not people:
        raise ValueError(f"no validation people in {data_dir} ({split}): every user of the build's sources is in "
                         "its population; build with a smaller --limit-users")
    return [(q.input, q.gold, list(q.profile[:max_items])) for q in people[:n_users]]


def tune(engine: Engine, data_dir: str | Path | None = None, split: str | None = None, n_users: int = MIN_PEOPLE,
         write: bool = True, steps: Sequence[str] = STEPS, shards=None, far_data: str | Path | None = None,
         far_sources: Sequence[str] = ()) -> dict:
    """Choose the decoding settings on validation people and (with `write`) save them in the artifacts.
    `shards` (distributed.people.PeopleShards, `tune --ray`): the people onboarded and every setting's decode
    run there in shards, with the same choice. `far_sources` (of `far_data`): whole sources held out for the far
    people's guard; those of their people beyond the build's clusters judge the own adapters (own_guard)."""
    data_dir = data_dir or engine.meta.get("data")
    split = split or engine.meta.get("split", "dev")
    people = validation_people(engine, data_dir, split, n_users)
    n_own = len(people)
    if far_sources:
        _, extra = read_lamp(far_data or data_dir, split)
        people += [(q.input, q.gold, list(q.profile[:24])) for q in select_sources(extra, far_sources)
                   if q.gold is not None and len(q.profile) >= 3][:n_users]
    if shards is not None:
        items, fits = shards.onboard([profile for _, _, profile in people])
    else:
        items, fits = [], []
        for _, _, profile in tqdm(people, desc="onboarding", mininterval=2.0):
            items.append(engine.prepare_items(profile))
            fits.append(onboard.fit(engine, items[-1]))
    keep = [i for i in range(len(people)) if i < n_own or fits[i].far]  # of the held-out sources, the far alone
    people, items, fits = [people[i] for i in keep], [items[i] for i in keep], [fits[i] for i in keep]
    prompts, golds = [p for p, _, _ in people], [g for _, g, _ in people]
    # on Ray, the people's decodes run in shards (and both kinds are judged together: own adapters stay local)
    decoder = Trials(engine, prompts, golds, fits, items, decode=shards.decode_each) if shards is not None else None
    engine, report = choose_decoding(engine, prompts, golds, fits, items,
                                     progress=lambda m: print(f"  {m}", flush=True), steps=steps, decoder=decoder)
    report |= {"data": str(data_dir), "split": split,
               "helps_share": round(float(np.mean([bool(f.diagnostics.get("helps")) for f in fits])), 3)}
    if write and engine.folder is not None:
        save_choice(engine.folder, engine, report)
    return report


def save_choice(folder: Path, engine: Engine, report: dict) -> None:
    """Write the chosen settings into config.json (atomically), with the sweep in the report."""
    path = Path(folder) / "config.json"
    meta = json.loads(path.read_text())
    meta["settings"]["decoding"] = asdict(engine.cfg.decoding)
    meta["settings"]["style"] = asdict(engine.cfg.style)
    meta["settings"]["own"] = asdict(engine.cfg.own)
    obj = engine.cfg.objectives[0]
    meta["report"].setdefault("alpha_by_objective", {})[obj] = {"alpha": engine.cfg.decoding.alpha,
                                                                "sweep": report.get("alpha", {}).get("sweep")}
    meta["report"]["tune"] = meta["report"].get("tune", {}) | report  # a partial re-run keeps the other steps
    meta["format_version"] = FORMAT_VERSION  # α is now chosen under this version's decoding rule
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(meta, indent=2))
    tmp.replace(path)
