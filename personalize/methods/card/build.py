"""The offline stage of CARD: population → clusters → cluster LoRAs → head (P, U, population λ) → α,
then the Profile-to-PEFT hypernetwork on the same users (a comparison method that also needs training).

Writes versioned artifacts: config.json (settings, users, report), clusters.npz,
adapters/ (peft, one folder per adapter), head_<objective>.safetensors, p2p/ (the
hypernetwork, absent when skipped; P2PMethod finds it there).
Every stage prints progress and its wall time, and the report keeps tokens
trained and held-out loss curves (METHOD §1.2, §1.9.4).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import threading
import time
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from safetensors.torch import save_file
from tqdm import tqdm

from personalize.methods.card import onboard
from personalize.methods.card.adapters import BASE_ADAPTER, ClusterJob, LowerStates, adapter_name, adapter_state, \
    add_warm_adapter, cluster_adapter, new_peft_model, put_adapter, train_adapter, train_cluster_adapter
from personalize.methods.card.cluster import Clusters, fit_clusters, user_embeddings
from personalize.methods.card.config import FORMAT_VERSION, CardConfig
from personalize.data import Item, Query, read_lamp, select_sources
from personalize.methods.engine import Engine
from personalize.methods.card.onboard import split_held_out
from personalize.methods.card.head import PairData, PersonalizationHead, diagnostics, train_population
from personalize.methods import p2p as p2p_mod
from personalize.methods.artifacts import portable
from personalize.methods.p2p import P2PConfig, train_p2p
from personalize.lm.models import file_lock, load_encoder, load_lm

P2P_STEPS = 20  # build's default hypernetwork steps: a CPU budget (the paper trains 20k steps on a GPU)
# each stage's share of the fraction build's `progress` hook reports, in order (roughly the demo build's times on a
# 2-core CPU, 2026-11-29: 20 (a fresh clone's, with the GGUF's conversion), -, 7, 65, 18, 80, 81, 25 s); once a stage
# starts, every stage before it counts as done, skipped ones too (a demo of changelogs has its prompts: no rewrites).
# The first start's page estimates when each part comes from them (ui/waiting.py's HEAD_SHARE: the share once the
# head is trained).
STAGE_SHARES = {"load models": 0.06, "neutral rewrites": 0.1, "clusters": 0.02, "K=1 adapter": 0.2,
                "cluster adapters": 0.06, "head": 0.24, "decoding choice": 0.25, "p2p hypernetwork": 0.08, "save": 0.0}


class BuildCancelled(Exception):
    """build() was stopped by its `cancel` event at a step: no artifacts folder was written (nor left `.partial`)."""


class _Steps:
    """build's optional hooks: `progress(stage, fraction of the whole build)` and a `cancel` event checked at every
    step (a stage's start, a training step, a person's features, a decoding setting). Without hooks: nothing."""

    def __init__(self, progress: Callable[[str, float], None] | None, cancel: threading.Event | None):
        self.progress, self.cancel, self.shown = progress, cancel, 0.0

    def __call__(self, stage: str, within: float = 0.0, report: bool = True) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise BuildCancelled(f"build cancelled at {stage}")
        if report and self.progress is not None:  # never backwards (a second head objective shares the head's part)
            names, name = list(STAGE_SHARES), stage.split(" (")[0]
            before = sum(STAGE_SHARES[n] for n in names[: names.index(name)]) if name in names else self.shown
            self.shown = max(self.shown, min(1.0, before + STAGE_SHARES.get(name, 0.0) * min(1.0, within)))
            self.progress(stage, self.shown)


# trains cluster adapters elsewhere (distributed/adapter_jobs.py: as Ray tasks): (jobs, the K = 1 adapter's
# weights, the settings) -> (the adapter's weights, its report) per job, in the jobs' order
ClusterTrainer = Callable[[Sequence[ClusterJob], dict, CardConfig], list[tuple[dict, dict]]]


def _log(msg: str) -> None:
    print(f"[build {datetime.now():%H:%M:%S}] {msg}", flush=True)


@contextmanager
def _bar(desc: str, total: int, on_step: Callable[[float], None], fmt: str = ".3f"):
    """A training loop's tqdm bar, and its progress hook (step, steps, loss) that also reports the share done."""
    with tqdm(total=total, desc=desc, leave=False, mininterval=2.0) as bar:
        yield lambda s, n, loss: (bar.update(1), bar.set_postfix(loss=f"{loss:{fmt}}"), on_step(s / n))


def build(data_dir: str | Path, split: str, out: str | Path, cfg: CardConfig = CardConfig(),
          limit_users: int | None = None, seed: int = 0,
          p2p: P2PConfig | None = P2PConfig(steps=P2P_STEPS), sources: Sequence[str] = (),
          exclude_sources: Sequence[str] = (), progress: Callable[[str, float], None] | None = None,
          cancel: threading.Event | None = None, cluster_trainer: ClusterTrainer | None = None,
          tune_steps: Sequence[str] | None = None, on_part: Callable[[str, Path], None] | None = None) -> Path:
    """Run the whole offline stage and write the artifacts folder (replaced only on success).
    p2p: the hypernetwork's training settings (budget and base adapter: the build's); None skips it.
    sources / exclude_sources: keep only (or leave out) users whose query comes from these sources
    (repositories, venues: `Query.source`), so that eval can score people of a source the build never saw.
    progress: called with (stage, fraction of the whole build) at every step; cancel: an event checked at every
    step, and once more before the finished folder is renamed in: set, the build raises BuildCancelled and
    leaves no artifacts folder behind (the app's Populations tab builds in a thread with both).
    cluster_trainer: trains the cluster adapters elsewhere (`build --ray`), with the same weights; None: here.
    tune_steps: the decoding choice's steps to run (tune.STEPS; None: all); the others keep `cfg`'s settings, and the
    harm guards run whatever they are (the first start's demo starts from the measured best: fitting/plan.py).
    on_part(part, out): the build serves as it is built (the app's first start, issue 58). Once the cluster model can
    decode, `out` is written with the clusters and adapters (config.json's `part` "cluster": a later start does not
    take it for a whole build) and on_part("cluster", out) is called; the head is then added in place ("card": card
    decodes with the planned settings, its guard still to run), then the guard's decision and P2P's hypernetwork
    ("all"): each in place, under the same id (what people saved over it stays theirs), each told to on_part.

    Two processes building the same `out` at once (two first starts) take turns under a lock on
    `<out>.lock`; one that waited and finds `out` freshly written by the other returns it as it is."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    before = _signature(out / "config.json")  # what was there before waiting: a deliberate rebuild replaces it
    waiting = lambda: _log(f"another process is building {out}; waiting ...")  # noqa: E731
    with file_lock(out.with_name(out.name + ".lock"), on_wait=waiting) as waited:
        after = _signature(out / "config.json")
        if waited and after is not None and after != before:
            _log(f"{out} was built by the other process meanwhile: using it")
            return out
        with torch.random.fork_rng():  # the same build from the same seed (LoRA init, dropout), caller's stream kept
            torch.manual_seed(seed)
            return _build(data_dir, split, out, cfg, limit_users, seed, p2p, sources, exclude_sources,
                          _Steps(progress, cancel), cluster_trainer, tune_steps, on_part)


def _signature(path: Path) -> tuple[int, int] | None:
    """Which file is at `path` (inode, mtime): a build's rename puts a new one there."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def _build(data_dir, split, out: Path, cfg: CardConfig, limit_users, seed, p2p, sources, exclude_sources,
           step: _Steps, cluster_trainer: ClusterTrainer | None, tune_steps: Sequence[str] | None,
           on_part: Callable[[str, Path], None] | None = None) -> Path:
    t_all = time.perf_counter()
    report: dict = {"stages_s": {}}

    @contextmanager
    def timed(name):
        step(name)
        t = time.perf_counter()
        _log(f"{name} ...")
        try:
            yield
        finally:
            report["stages_s"][name] = round(time.perf_counter() - t, 2)
            _log(f"{name} done in {report['stages_s'][name]:.1f} s")

    task, queries = read_lamp(data_dir, split)
    queries = select_sources(queries, sources, exclude_sources)
    users = _population(queries, cfg.items_per_user, limit_users)
    if len(users) < max(cfg.ks):
        raise ValueError(f"K={max(cfg.ks)} is larger than the population ({len(users)} users): lower --ks")
    names = list(users)
    rng = random.Random(seed)
    # validation people choose the decoding settings and guard card against harm: people of the data outside the
    # population first (their query), then population users held out of training (their newest item)
    chosen_on = [q for q in queries if (q.user or q.id) not in users and q.gold and len(q.profile) >= 3]
    outside = [(q.input, q.gold, list(q.profile[:cfg.items_per_user])) for q in chosen_on[: cfg.n_val_users]]
    need = min(cfg.n_val_users - len(outside), len(names) // 4)  # at most a quarter of the population held out
    val_users = set(rng.sample(names, min(need, max(0, len(names) - max(cfg.ks))))) if need > 0 else set()
    _log(f"{task.name}: {len(names)} users ({len(val_users)} held out of training), {len(outside)} people outside "
         f"the population, {sum(len(v) for v in users.values())} items; {len(outside) + len(val_users)} validation people")

    with timed("load models"):
        lm = load_lm(cfg.model)
        encoder = load_encoder(cfg.encoder)
        model = new_peft_model(lm.model, cfg.lora)
    engine = Engine(cfg, replace(lm, model=model), model, encoder, None, {}, task, {})

    if any(not it.x for its in users.values() for it in its):
        with timed("neutral rewrites"):
            for i, n in enumerate(tqdm(names, desc="neutral rewrites", mininterval=2.0)):
                step("neutral rewrites", i / len(names))
                users[n] = engine.prepare_items(users[n])

    with timed("clusters"):
        emb = user_embeddings(encoder, [[it.y for it in users[n]] for n in names])
        centroids = fit_clusters(emb, cfg.ks, seed)
        labels = {k: np.linalg.norm(emb[:, None] - c[None], axis=-1).argmin(1) for k, c in centroids.items()}
        engine.clusters = Clusters(names, emb, centroids, labels)
        report["cluster_sizes"] = {k: np.bincount(labels[k], minlength=k).tolist() for k in cfg.ks}

    train_names = [n for n in names if n not in val_users]
    held_out = [(it.x, it.y) for n in sorted(val_users) for it in users[n][:2]]
    report["adapters"] = []
    with timed("K=1 adapter"):
        ex = [(it.x, it.y) for n in train_names for it in users[n]]
        with _bar("K=1 adapter", cfg.lora.base_steps, lambda f: step("K=1 adapter", f)) as tick:
            r = train_adapter(model, lm.tokenizer, BASE_ADAPTER, ex, cfg.lora.base_steps, cfg.lora, cfg.budget,
                              held_out, progress=tick)
        report["adapters"].append(r)
        _log(f"K=1: {r['tokens']} tokens, held-out loss {r['held_out_loss']}")
    with timed("cluster adapters"):
        jobs = []
        for k in sorted(cfg.ks):
            for c in range(k) if k != 1 else ():
                members = [n for n in train_names if labels[k][names.index(n)] == c]
                held = [(it.x, it.y) for n in names if labels[k][names.index(n)] == c and n in val_users
                        for it in users[n][:2]]
                jobs.append(ClusterJob(adapter_name(k, c), tuple((it.x, it.y) for n in members for it in users[n]),
                                       tuple(held)))
        # with --cluster-layers: their upper blocks only, over the K = 1 adapter's lower states, computed once a text
        states = LowerStates.for_settings(model, lm.tokenizer, cfg.lora, cfg.budget)
        report["adapters"] += _cluster_adapters(model, lm.tokenizer, jobs, cfg, step, cluster_trainer, states)

    served = None  # config.json of the parts served so far (on_part), written in place from here on
    if on_part is not None:
        report["tune"] = {"guard": {"running": True, "kept": True,
                                    "why": "card's check on this build's validation people: not run yet"}}
        served = _save(out, cfg, task.name, names, {}, engine.clusters, model, {}, {}, report, str(data_dir), split,
                       None, step, part="cluster")
        on_part("cluster", out)

    heads, head_users, lambdas = {}, {}, {}
    report["head"] = {}
    kd = cfg.default_k
    for obj in cfg.objectives:
        with timed(f"head ({obj})"):
            cluster = {n: int(labels[kd][names.index(n)]) for n in train_names}
            fit_data, held_data = head_data(engine, {n: users[n] for n in train_names}, cluster, obj, seed,
                                            on_user=lambda i, n: step(f"head ({obj})", 0.5 * i / n))
            head = PersonalizationHead(lm.hidden_size * cfg.head.n_layers, lm.model.config.vocab_size, cfg.head.d)
            with _bar(f"head {obj}", cfg.head.epochs, lambda f: step(f"head ({obj})", 0.5 + 0.5 * f), ".4f") as tick:
                lams, curve = train_population(head, fit_data, cfg.head, held_out=held_data, progress=tick)
            head.eval().requires_grad_(False)
            diag = _population_diagnostics(head, held_data, lams, cfg)
            report["head"][obj] = {"loss_curve": curve, "held_out": diag}
            if obj == "hard_pairs":
                report["head"][obj]["gamma"] = round(float(head.gamma), 4)  # the fixed log-prob weight
            _log(f"head {obj}: loss {curve[0]:.4f} -> {curve[-1]:.4f}; held-out {json.dumps(diag)}")
            heads[obj], head_users[obj] = head, list(lams)
            lambdas[obj] = torch.stack([lams[n] for n in lams]) if lams else torch.ones(0, cfg.head.d)
    engine.heads = heads
    engine.population_lams = {o: dict(zip(head_users[o], lambdas[o].numpy())) for o in heads}

    val = [(items[0].x, items[0].y, items[1:]) for n in sorted(val_users) if len(items := users[n]) >= 3] + outside
    # who chose the settings, by name: the studio offers people the build never saw at all as its newcomers
    report["validation_people"] = ([n for n in sorted(val_users) if len(users[n]) >= 3]
                                   + [q.user or q.id for q in chosen_on[: len(outside)]])
    if served is not None:
        report["tune"]["guard"] |= {"people": len(val), "why": "card's check on this build's validation people: running"}
        _write_heads(out, heads, lambdas)
        served = _update(out, served, {"head_users": head_users, "report": report}, part="card")
        on_part("card", out)
    if val and any(a > 0 for a in cfg.alphas):
        with timed("decoding choice"):  # tune.py's whole choice, then its harm guard (never on eval's queries, §1.9.2)
            from personalize.methods.card.tune import STEPS, choose_decoding

            prompts, golds, items, fits = [], [], [], []
            for i, (prompt, gold, profile) in enumerate(tqdm(val, desc="validation people", mininterval=2.0)):
                step(f"decoding choice ({i} of {len(val)} validation people fitted)", 0.5 * i / len(val))
                prompts.append(prompt), golds.append(gold), items.append(engine.prepare_items(profile))
                fits.append(onboard.fit(engine, items[-1]))
            engine.cfg = cfg
            decoding = f"decoding choice (card and the cluster model decoding for {len(val)} validation people)"
            step(decoding, 0.5)
            engine, report["tune"] = choose_decoding(
                engine, prompts, golds, fits, items, progress=lambda m: (step(decoding, 0.5), _log(f"  {m}")),
                alphas=[a for a in cfg.alphas if a > 0], steps=STEPS if tune_steps is None else tune_steps)
            cfg = engine.cfg
            report["alpha_sweep"] = report["tune"].get("alpha", {}).get("sweep")
            report["alpha_by_objective"] = {cfg.objectives[0]: {"alpha": cfg.decoding.alpha,
                                                                "sweep": report["alpha_sweep"]}}
    else:
        cfg = replace(cfg, decoding=replace(cfg.decoding, alpha=0.0))
        report["tune"] = {"guard": {"kept": False, "alpha": 0.0, "people": len(val),
                                    "why": "card decodes as the cluster model (α = 0): no validation people to "
                                           "show that the person's style helps"}}
        _log(report["tune"]["guard"]["why"])

    hyper = None
    if p2p is None:
        report["p2p"] = {"skipped": "--skip-p2p"}
        _log("P2P hypernetwork skipped (--skip-p2p)")
    elif not any(len(users[n]) >= 2 for n in train_names):
        report["p2p"] = {"skipped": "no training user has 2 items (a profile and a target)"}
        _log(f"P2P hypernetwork skipped: {report['p2p']['skipped']}")
    else:
        with timed("p2p hypernetwork"):  # f_θ over the K = 1 adapter; the α users give its held-out curve
            p2p = replace(p2p, base_adapter=BASE_ADAPTER, budget=None, seed=seed, folder=None)
            with _bar("p2p hypernetwork", p2p.steps, lambda f: step("p2p hypernetwork", f)) as tick:
                hyper, r = train_p2p(engine, engine.encoder, {n: users[n] for n in train_names}, p2p,
                                     progress=tick, held_out_users={n: users[n] for n in sorted(val_users)})
            loss, curve = r["train_users_loss"], r["held_out_loss"]
            _log(f"p2p: {r['users']} users, {r['steps']} steps, {r['tokens']} tokens, {r['seconds']} s, "
                 f"training users' loss {loss['before']} -> {loss['after']}, held-out {curve[:1] + curve[-1:]}")
            report["p2p"] = {**r, "folder": p2p_mod.ARTIFACTS_DIR}

    report["val_users"] = sorted(val_users)  # `tune` re-chooses decoding settings on them
    report["sources"] = {"only": list(sources), "excluded": list(exclude_sources),
                         "built": sorted({q.source for q in queries if q.source})}
    report["total_s"] = round(time.perf_counter() - t_all, 1)
    step("save")
    if served is not None:
        if hyper is not None:
            _write_p2p(out, hyper, served["id"], report["p2p"])
        _update(out, served, {"settings": cfg.to_dict(), "report": report})
        _log(f"artifacts written to {out} (id {served['id']}) in {report['total_s']} s: the guard decided, P2P is in")
        on_part("all", out)
        return out
    _save(Path(out), cfg, task.name, names, head_users, engine.clusters, model, heads, lambdas, report,
          str(data_dir), split, hyper, step)
    return out


def _cluster_adapters(model, tok, jobs: list[ClusterJob], cfg: CardConfig, step: _Steps,
                      trainer: ClusterTrainer | None, states: LowerStates | None = None) -> list[dict]:
    """Every cluster adapter, warm-started from the K = 1 adapter: trained here one after another, or by `trainer`
    (each job apart) and put into the model in the same order; each under its own random stream
    (adapters.train_cluster_adapter), so both ways give the same weights. A cluster without training users (or
    with no cluster steps) keeps the K = 1 weights."""
    trained = [j for j in jobs if j.examples and cfg.lora.cluster_steps > 0]
    names = {j.name for j in trained}
    done = dict(zip([j.name for j in trained], trainer(trained, adapter_state(model, BASE_ADAPTER), cfg))) \
        if trainer is not None and trained else {}
    reports = []
    for i, job in enumerate(jobs):
        step("cluster adapters", i / len(jobs))
        if job.name not in names:
            add_warm_adapter(model, job.name, cfg.lora)
            reports.append({"adapter": job.name, "steps": 0, "examples": 0, "tokens": 0})
            continue
        if job.name in done:
            state, r = done[job.name]
            put_adapter(model, job.name, cfg.lora, state)
        else:
            r = train_cluster_adapter(model, tok, job, cfg.lora, cfg.budget,
                                      progress=lambda s, n, loss: step("cluster adapters", (i + s / n) / len(jobs)),
                                      states=states)
        reports.append(r)
        _log(f"{job.name}: {len(job.examples)} examples, {r['tokens']} tokens, {r['seconds']} s, "
             f"held-out loss {r['held_out_loss'][:1] + r['held_out_loss'][-1:]}")
    return reports


def head_data(engine: Engine, users: dict[str, list[Item]], cluster: dict[str, int], obj: str,
              seed: int = 0, on_user: Callable[[int, int], None] | None = None) -> tuple[dict, dict]:
    """Each training user's features for one head objective, read by their cluster's model at the default K,
    split into the items the head fits and the held-out ones that drive early stopping and the diagnostics.
    on_user(i, n): called before the i-th of the n users' features are read."""
    cfg = engine.cfg
    kd = cfg.default_k
    data = {}
    for i, n in enumerate(tqdm(users, desc=f"features ({obj})", mininterval=2.0)):
        if on_user is not None:
            on_user(i, len(users))
        engine.use_adapter(cluster_adapter(kd, cluster[n]))
        data[n] = onboard.user_data(engine, users[n], obj)
    if obj == "hard_pairs" and cfg.head.n_other:
        data = _other_users_negatives(data, cluster, cfg.head.n_other, seed)
    fit, held = {}, {}
    for n, items in users.items():
        h = int(round(cfg.holdout * len(items)))
        if h and len(items) >= 5:
            fit[n], held[n] = split_held_out(data[n], h, len(items))
        else:
            fit[n] = data[n]
    return fit, held


def _other_users_negatives(data: dict[str, PairData], cluster: dict[str, int], n_other: int,
                           seed: int) -> dict[str, PairData]:
    """hard_pairs (METHOD §1.9.3c): each item's text also against `n_other` real texts of other users in the
    same cluster (their own prompts, read by the same cluster model), so that neither likelihood nor
    "human vs model" separates the pair: only the user's style does."""
    rng = random.Random(seed)
    own = {n: {i: c for c, i in zip(d.chosen, d.items)} for n, d in data.items()}  # item → y+ features
    out = {}
    for n, d in data.items():
        pool = [f for m, texts in own.items() if m != n and cluster[m] == cluster[n] for f in texts.values()]
        extra = [(i, c, rng.choice(pool)) for i, c in own[n].items() for _ in range(n_other)] if pool else []
        out[n] = PairData(d.chosen + [c for _, c, _ in extra], d.rejected + [r for _, _, r in extra],
                          d.items + [i for i, _, _ in extra], d.covariate)
    return out


def _population(queries: list[Query], items_per_user: int, limit: int | None) -> dict[str, list[Item]]:
    users: dict[str, list[Item]] = {}
    for q in queries:
        name = q.user or q.id
        if name in users or not q.profile:
            continue
        users[name] = list(q.profile[:items_per_user])
        if limit and len(users) >= limit:
            break
    if not users:
        raise ValueError("no users with a non-empty profile in this data")
    return users


def _population_diagnostics(head, held: dict, lams: dict, cfg: CardConfig) -> dict:
    """Mean of each user's held-out diagnostics, against 8 other users' λ (METHOD §1.9.1)."""
    rows = []
    names = list(held)
    for i, n in enumerate(names):
        if n not in lams or not len(held[n]):
            continue
        others = [lams[m] for m in names[i + 1:] + names[:i] if m in lams][:8]
        rows.append(diagnostics(head, held[n], lams[n], others, cfg.head))
    keys = sorted({k for r in rows for k, v in r.items() if isinstance(v, (int, float))})
    return {k: round(float(np.mean([r[k] for r in rows if k in r])), 4) for k in keys} | {"users": len(rows)}


def _save(out: Path, cfg, task, names, head_users, clusters, model, heads, lambdas, report, data_dir, split,
          hyper, step: _Steps, part: str | None = None) -> dict:
    """The whole folder, written beside `out` and renamed over it; its config.json's content is returned. `part`:
    a servable part of a build still running (on_part), marked in config.json."""
    tmp = out.with_name(out.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    model.save_pretrained(str(tmp / "adapters"), selected_adapters=list(model.peft_config))  # every adapter
    np.savez(tmp / "clusters.npz", embeddings=clusters.embeddings,
             **{f"centroids_k{k}": c for k, c in clusters.centroids.items()},
             **{f"labels_k{k}": l for k, l in clusters.labels.items()})
    _write_heads(tmp, heads, lambdas)
    created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    digest = hashlib.sha1(f"{out.name}{created}{cfg.to_dict()}".encode()).hexdigest()[:8]
    meta = {"format_version": FORMAT_VERSION, "name": out.name, "id": f"{out.name}-{digest}", "created": created,
            "task": task, "model_id": cfg.model.model_id, "encoder_id": cfg.encoder.model_id,
            "data": data_dir, "split": split, "users": names, "head_users": head_users,
            "settings": cfg.to_dict(), "report": report} | ({"part": part} if part else {})
    if hyper is not None:
        p2p_mod.save(hyper, tmp / p2p_mod.ARTIFACTS_DIR, {"artifacts_id": meta["id"], "report": report["p2p"]})
    _write_config(tmp, meta, out)
    try:  # the last moment a cancel stops the build: the finished folder goes, `out` stays as it was
        step("save", report=not part)  # (a part's save is not the build's end: its progress goes on)
    except BuildCancelled:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    if part:
        _log(f"{out} serves its {part} part (id {meta['id']}); the build goes on")
    else:
        _log(f"artifacts written to {out} (id {meta['id']}) in {report['total_s']} s")
    return meta


def _write_config(folder: Path, meta: dict, out: Path) -> None:
    """config.json in `folder` (the build's `out`, or the folder renamed into it), replaced at once; the paths inside
    the checkout it was built in (the working folder) relative to `out`, so that it moves with it."""
    written = portable(json.loads(json.dumps(meta, default=_json_default)), out, checkout=Path.cwd())
    tmp = folder / ".config.json.partial"
    tmp.write_text(json.dumps(written, indent=2))
    os.replace(tmp, folder / "config.json")


def _write_heads(folder: Path, heads: dict, lambdas: dict) -> None:
    """head_<objective>.safetensors, each written beside and renamed into place (a part served reads it whole)."""
    for obj, head in heads.items():
        tmp = folder / f".head_{obj}.partial"
        save_file({"P": head.P.weight.detach().contiguous(), "U": head.U.detach().contiguous(),
                   "h_mean": head.h_mean, "h_std": head.h_std, "gamma": head.gamma,
                   "lambdas": lambdas[obj].contiguous()}, str(tmp))
        os.replace(tmp, folder / f"head_{obj}.safetensors")


def _write_p2p(out: Path, hyper, artifacts_id: str, report: dict) -> None:
    """P2P's hypernetwork added to a served folder: written beside, its folder renamed in whole."""
    tmp = out / f".{p2p_mod.ARTIFACTS_DIR}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    p2p_mod.save(hyper, tmp, {"artifacts_id": artifacts_id, "report": report})
    shutil.rmtree(out / p2p_mod.ARTIFACTS_DIR, ignore_errors=True)
    tmp.rename(out / p2p_mod.ARTIFACTS_DIR)


def _update(out: Path, served: dict, changes: dict, part: str | None = None) -> dict:
    """config.json of a served folder with `changes`, replaced at once (after the files it names are in place), the
    part it now is marked (None: the whole build); the id stays. Returns the new content (as _save does)."""
    meta = {k: v for k, v in served.items() if k != "part"} | changes | ({"part": part} if part else {})
    _write_config(out, meta, out)
    if part:
        _log(f"{out} serves its {part} part (id {meta['id']}); the build goes on")
    return json.loads(json.dumps(meta, default=_json_default))


def _json_default(o):
    if isinstance(o, (np.number, np.ndarray)):  # numpy scalars and arrays as Python numbers and lists
        return o.tolist()
    raise TypeError(type(o))
