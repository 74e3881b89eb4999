"""Command line: `python -m personalize {build,onboard,generate,eval,tune,bench,demo,simulate-feedback,style-key,forget,
campaign}`.

Bad input ends with one clear line on stderr and exit status 2, never a
traceback, and nothing half-written (artifacts and vectors are replaced only
when the step that makes them has succeeded).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from personalize.fitting.plan import (DEMO_ARTIFACTS, UsageError, add_build_args, comma_list,
                                      comma_names, ensure_demo, ints, model_config, run_build)

DEFAULT_DB = "data/studio.db"


def _decoding_args(p):
    p.add_argument("--alpha", type=float, default=None, help="steering strength α (default: chosen by build on dev)")
    p.add_argument("--top-k", type=int, default=None, help="candidates re-ranked per step (default 50)")
    p.add_argument("--max-tokens", type=int, default=None, help="max new tokens (default 32)")


def _decoding(engine, a):
    s = engine.cfg.decoding
    changes = {k: v for k, v in {"alpha": a.alpha, "top_k": a.top_k, "max_new_tokens": a.max_tokens}.items() if v is not None}
    return replace(s, **changes)


def _rerank_changes(spec: str | None) -> dict:
    """--rerank "n=8,greedy=false": fields of card_rerank's settings (rerank.RerankSettings checks them), read
    before any model loads."""
    import dataclasses

    from personalize.card.decoding import RerankSettings

    defaults, changes = RerankSettings(), {}
    for part in comma_list(spec):
        key, _, value = (x.strip() for x in part.partition("="))
        if key not in {f.name for f in dataclasses.fields(RerankSettings)}:
            raise UsageError(f"--rerank: unknown setting {key!r}; settings: {list(dataclasses.asdict(defaults))}")
        kind = type(getattr(defaults, key))
        if kind is bool and value.lower() not in ("true", "false"):
            raise UsageError(f"--rerank: {key} is true or false, got {value!r}")
        try:
            changes[key] = value.lower() == "true" if kind is bool else kind(value)
            replace(defaults, **changes)
        except ValueError as e:
            raise UsageError(f"--rerank: {e}") from e
    return changes


def _engine(a):
    from personalize.methods.engine import Engine

    path = Path(a.artifacts)
    if not (path / "config.json").exists():
        raise UsageError(f"no artifacts at {path}: build them with `python -m personalize build --data DIR --out {path}`")
    return Engine.load(path, model_config(a) if hasattr(a, "model") else None)


# ---------------------------------------------------------------- commands

def cmd_build(a) -> None:
    run_build(a)


def cmd_onboard(a) -> None:
    from personalize.data import read_history_file
    from personalize.fitting.person import onboard
    from personalize.store import Store

    from personalize.data import TASKS
    from personalize.methods.engine import artifacts_meta

    if not (Path(a.artifacts) / "config.json").exists():
        raise UsageError(f"no artifacts at {a.artifacts}: build them with `python -m personalize build`")
    items = read_history_file(a.history, task=TASKS[artifacts_meta(Path(a.artifacts))["task"]])
    engine = _engine(a)
    store = Store(a.db)
    name = a.user or Path(a.history).stem
    store.add_user(name, items, engine.task.name, replace=a.replace)
    t0 = time.perf_counter()
    fit = onboard(engine, store, name, k=a.k, progress=lambda s: print(f"  {s} ...", flush=True))
    print(f"user {name}: {fit.n_items} items, cluster {fit.cluster} of K={fit.k} "
          f"(distances {', '.join(f'{d:.3f}' for d in fit.distances)})")
    for s, v in fit.stages_s.items():
        print(f"  {s:<18} {v * 1000:9.1f} ms")
    print(f"  {'total':<18} {(time.perf_counter() - t0) * 1000:9.1f} ms")
    if fit.cold_start:
        print(f"  cold start: fewer than {engine.cfg.min_fit_items} items, λ = 1 (the cluster's shared head)")
    d = fit.diagnostics
    if d.get("n"):
        print(f"  held-out {d['unit']} (n={d['n']}): accuracy own style {d['acc_own']:.3f}, λ=1 {d['acc_ones']:.3f}, "
              f"other users' λ {d.get('acc_other', float('nan')):.3f}"
              + (f", log-prob rule {d['acc_logprob_rule']:.3f}" if "acc_logprob_rule" in d else "")
              + (f", γ·Δlogp alone {d['acc_covariate_only']:.3f}" if "acc_covariate_only" in d else "")
              + (f", no head {d['acc_no_head']:.3f}" if "acc_no_head" in d else ""))
        if "specificity_gap" in d:
            print(f"  user-specificity gap (own − others' margin): {d['specificity_gap']:+.4f}")
        if "helps" in d:
            print("  your style " + ("beats" if d["helps"] else "does not beat") + " the cluster model on your held-out"
                  " items" + ("" if d["helps"] else ": card falls back to the cluster model's output"))
    print(f"stored in {store.path} (vector: {store.vector_bytes(name, engine.artifacts_id)} bytes)")


def _user_state(engine, store, name, k):
    from personalize.store import StoreError

    got = store.vector(name, engine.artifacts_id)
    if got is None:
        store.user(name)  # raises "unknown user" first when that is the problem
        raise StoreError(f"user {name!r} has no vector for artifacts {engine.artifacts_id}: run `onboard` first")
    _, info = got
    from personalize.card.style import UserStyle

    lam = UserStyle.from_stored(store.style(name, engine.artifacts_id))  # λ with the person's token bias and memory
    k = k or info["stats"].get("k") or engine.cfg.default_k
    a = store.assignment(name, engine.artifacts_id, k)
    if a is None:
        raise StoreError(f"user {name!r} has no cluster for K={k}; built: {sorted(engine.clusters.centroids)}")
    return lam, a["cluster"], k


def cmd_generate(a) -> None:
    from personalize.store import Store

    if not a.prompt.strip():
        raise UsageError("--prompt is empty")
    engine = _engine(a)
    store = Store(a.db)
    lam, cluster, k = _user_state(engine, store, a.user, a.k)
    s = _decoding(engine, a)
    prompt = engine.task.prompt(a.prompt) if a.template else a.prompt
    from personalize.catalog import CARD_METHODS, CORE_METHODS
    from personalize.methods.registry import METHODS, get_method
    from personalize.methods.base import UserContext

    methods = comma_names(a.methods)
    from personalize.card.style import variant
    known = [*CORE_METHODS, *CARD_METHODS[1:], *METHODS]
    unknown = [m for m in methods if m not in known]
    if unknown:
        raise UsageError(f"unknown methods {unknown}; choose from {known}")
    for m in methods:
        if m in METHODS:
            user = UserContext.from_store(store, a.user, engine.task, cluster, k, lam)
            g = get_method(m, engine, store).generate(user, [prompt], s)[0]
        else:
            retrieve = m in CARD_METHODS and variant(m, engine.cfg.style).retrieval
            items = UserContext.from_store(store, a.user, engine.task).items if retrieve else None
            g = engine.generate([prompt], m, cluster, lam, k=k, settings=s, items=items)[0]
        store.add_generation(a.user, engine.artifacts_id, m, prompt, g.text, {"alpha": s.alpha, "top_k": s.top_k,
                             "max_new_tokens": s.max_new_tokens, "k": k, "cluster": cluster}, g.latency_s, g.n_tokens)
        print(f"[{m}] ({g.latency_s:.2f} s, {g.n_tokens} tokens)\n{g.text}\n")


def _method_configs(a) -> dict[str, dict]:
    """The CPU budgets of EXACT and OPPU from --exact-pairs / --oppu-steps, checked before any model loads."""
    from personalize.methods.exact import ExactConfig
    from personalize.methods.oppu import OppuConfig

    configs = {"exact": {"max_pairs": a.exact_pairs}}
    if a.oppu_steps is not None:
        configs["oppu"] = {"max_steps": a.oppu_steps}
    try:
        ExactConfig(**configs["exact"]), OppuConfig(**configs.get("oppu", {}))
    except ValueError as e:
        raise UsageError(str(e)) from e
    return configs


def _add_method_budgets(p: argparse.ArgumentParser) -> None:
    p.add_argument("--oppu-steps", type=int, default=None, help="cap on OPPU's training steps per user (default 40)")
    p.add_argument("--exact-pairs", type=int, default=4,
                   help="history pairs EXACT indexes per user (default 4, a CPU budget: indexing costs about "
                        "half a minute per pair on a 2-core CPU; EXACT's own default is 32)")


def cmd_eval(a) -> None:
    from personalize.eval.evaluate import format_table, run_eval

    configs = _method_configs(a)
    objectives = _objectives_first(a)
    rerank = _rerank_changes(a.rerank)
    engine = _engine(a)
    engine.cfg = replace(engine.cfg, objectives=objectives, rerank=replace(engine.cfg.rerank, **rerank))
    # the head's own α from the build's sweep on validation users (older builds swept the first head only)
    alpha = a.alpha if a.alpha is not None else \
        engine.meta.get("report", {}).get("alpha_by_objective", {}).get(objectives[0], {}).get("alpha")
    if alpha is not None:
        engine.cfg = replace(engine.cfg, decoding=replace(engine.cfg.decoding, alpha=alpha))
    t0 = time.perf_counter()
    result = run_eval(engine, a.data, a.split, comma_names(a.methods), a.limit, method_configs=configs,
                      sources=comma_list(a.sources))
    result["settings"]["wall_s"] = round(time.perf_counter() - t0, 1)
    print(format_table(result))
    print("held-out diagnostics (mean over users):", json.dumps(result["diagnostics"]))
    for pair, d in result["differences"].items():
        print(f"  {pair:<28} ROUGE-L {d['mean']:+.4f}  95% CI [{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}]"
              f"  wins/losses {d['wins']}/{d['losses']}")
    print("seconds per person:", json.dumps({m: v["seconds_per_person"] for m, v in result["methods"].items()}))
    print("user-specificity:", json.dumps(result["specificity"]))
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(result, indent=2))
        print(f"wrote {a.json}")


def cmd_tune(a) -> None:
    from personalize.fitting.tune import STEPS, tune

    engine = _engine(a)
    t0 = time.perf_counter()
    report = tune(engine, a.data, a.split, a.users, write=not a.dry_run, steps=comma_list(a.steps) or STEPS)
    print(json.dumps({k: report[k] for k in ("chosen_decoding", "chosen_style", "users", "helps_share")}, indent=1))
    if "rerank" in report:
        print("card_rerank:", json.dumps(report["rerank"]))
    if "guard" in report:
        print(report["guard"]["why"])
    print(f"tuned in {time.perf_counter() - t0:.0f} s" + ("" if a.dry_run else f"; written to {a.artifacts}/config.json"))


def cmd_simulate_feedback(a) -> None:
    from personalize.data import select_sources
    from personalize.data import read_lamp
    from personalize.fitting.votes import FeedbackSettings, SimulationSettings, simulate

    s = SimulationSettings(checkpoints=ints(a.votes), n_eval=a.eval_items, n_vote=a.vote_items,
                           preference=a.preference, seed=a.seed)
    fs = FeedbackSettings(vote_weight=a.vote_weight, rejected_weight=a.rejected_weight)
    engine = _engine(a)
    if "tokens" not in engine.heads:
        raise UsageError("simulate-feedback needs artifacts with a tokens head (build --objectives tokens)")
    _, queries = read_lamp(a.data, a.split)
    queries = [q for q in select_sources(queries, comma_list(a.sources)) if q.gold and q.profile]
    need = s.n_eval - 1 + s.n_vote + engine.cfg.min_fit_items
    queries = [q for q in queries if len(q.profile) >= need][: a.users]
    if not queries:
        raise UsageError(f"no user in {a.data} ({a.split}) has {need} profile items (held out: {s.n_eval - 1} + "
                         f"{s.n_vote}, history: {engine.cfg.min_fit_items} or more)")
    cut = s.n_eval - 1 + s.n_vote + a.max_items
    people = [(q.user or q.id, engine.prepare_items(q.profile[:cut]), q.input, q.gold) for q in queries]
    t0 = time.perf_counter()
    res = simulate(engine, people, s, fs, _decoding(engine, a),
                   progress=lambda i, n, u: print(f"  [{i}/{n}] {u} ({time.perf_counter() - t0:.0f} s)", flush=True))
    res["settings"] = {"artifacts": engine.artifacts_id, "data": str(a.data), "split": a.split,
                       "sources": sorted({q.source for q in queries if q.source}), "n": len(res["people"]),
                       "vote_weight": fs.vote_weight, "rejected_weight": fs.rejected_weight, "preference": s.preference, "checkpoints": list(s.checkpoints),
                       "n_eval": s.n_eval, "n_vote": s.n_vote, "history_items_max": a.max_items,
                       "wall_s": round(time.perf_counter() - t0, 1)}
    for row in res["curve"]:
        print(f"  votes {row['votes']:>3}: ROUGE-L eval {row['rougeL_eval']:.4f}  voted prompts {row['rougeL_voted']:.4f}"
              f"  held-out acc {row['acc_eval']:.4f}  log-prob {row['logp_eval']:.4f}")
    for pair, d in res["differences"].items():
        print(f"  {pair:<26} {d['mean']:+.4f}  95% CI [{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}]  "
              f"wins/losses {d['wins']}/{d['losses']}")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(res, indent=2))
        print(f"wrote {a.json}")


def cmd_style_key(a) -> None:
    from personalize.studio.own_data import BuildInfo, export_keys, import_keys
    from personalize.store import Store

    if not (Path(a.artifacts) / "config.json").exists():
        raise UsageError(f"no artifacts at {a.artifacts}: a style key belongs to a build; give --artifacts DIR")
    build, store = BuildInfo.of_folder(a.artifacts), Store(a.db)
    try:
        if a.action == "export":
            text = export_keys(store, build, a.user, a.all_versions)
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            Path(a.out).write_text(text)
            n = text.count("\n") + 1
            print(f"wrote {n} style key{'s' * (n != 1)} of {a.user} ({max(len(t) for t in text.splitlines())} "
                  f"characters at most) to {a.out}")
        else:
            try:
                text = Path(a.file).read_text(encoding="utf-8")
            except UnicodeDecodeError:
                raise UsageError(f"{a.file} is not a style key (not text)") from None
            res = import_keys(store, build, text, a.user)
            print(f"imported {len(res['versions'])} version(s) for {res['user']} (current: version "
                  f"{res['versions'][-1]})" + (f"; {res['trimmed']} smallest bias entries were left out of the key"
                                               if res["trimmed"] else ""))
    finally:
        store.close()


def cmd_forget(a) -> None:
    from personalize.studio.own_data import forget_user
    from personalize.store import Store

    store = Store(a.db)
    try:
        res = forget_user(store, a.user, Path(a.db).parent / "oppu", Path(a.export_dir))
    finally:
        store.close()
    kept = ("files", "ratings_anonymised", "campaign_items_anonymised")
    removed = ", ".join(f"{v} {k}" for k, v in res.items() if k not in kept and v)
    print(f"forgot {a.user}: {removed or 'no rows'} deleted; {res['ratings_anonymised']} rating(s) and "
          f"{res.get('campaign_items_anonymised', 0)} campaign item(s) anonymised; "
          f"{len(res['files'])} file(s) removed; database vacuumed")


def cmd_campaign(a) -> None:
    """Human-eval campaigns: create from a LaMP folder, generate the outputs (resumable), status, export, import,
    the LLM judge, close."""
    from personalize.humaneval import campaign
    from personalize.store import Store

    store = Store(a.db)
    try:
        camps = campaign.Campaigns(store)
        if a.action == "create":
            from personalize.methods.engine import artifacts_meta

            if not (Path(a.artifacts) / "config.json").exists():
                raise UsageError(f"no artifacts at {a.artifacts}: build them with `python -m personalize build`")
            meta = artifacts_meta(Path(a.artifacts))
            c = campaign.create_from_lamp(
                store, a.name, a.data, a.split, a.limit, a.artifacts, meta.get("id", "unbuilt"), meta["task"],
                sources=comma_list(a.sources), methods=comma_names(a.methods), reference=a.reference, mode=a.mode, raters_per_item=a.raters_per_item,
                attention_every=a.attention_every, alpha=a.alpha, top_k=a.top_k, max_new_tokens=a.max_tokens,
                min_raters_per_unit=a.min_raters_per_unit)
            out = camps.outputs(a.name)
            print(f"created campaign {c['name']!r}: {len(camps.items(a.name))} items, arms {', '.join(c['config'].arms)}, "
                  f"{c['config'].mode}, {c['config'].raters_per_item} ratings per unit; outputs {out['done']}/"
                  f"{out['total']}: next `python -m personalize campaign generate --name {a.name} --db {a.db}`")
        elif a.action == "generate":
            from tqdm import tqdm

            from personalize.studio.facade import Studio, StudioConfig

            c = camps.get(a.name)
            studio = Studio.load(StudioConfig(artifacts=a.artifacts or c["config"].artifacts, db=a.db))
            bar = tqdm(total=None, unit="output", desc=f"campaign {a.name}")

            def tick(i, n, what):
                bar.total = n
                bar.n = i
                bar.set_postfix_str(what[:40])
                bar.refresh()
            try:
                res = studio.generate_campaign(a.name, tick)
            finally:
                bar.close()
            print(f"generated {res['generated']} output(s) in {res['seconds']} s; outputs {res['outputs']['done']}/"
                  f"{res['outputs']['total']}" + "".join(f"\n  failed: {f}" for f in res["failed"]))
        elif a.action == "status":
            res = camps.results(a.name)
            print(json.dumps(res, indent=2, ensure_ascii=False) if a.json else campaign.format_status(res))
        elif a.action == "export":
            path, summary, n = camps.export(a.name, a.out)
            print(f"wrote {n} judgment(s) to {path} and the summary to {summary}")
        elif a.action == "import":
            res = camps.import_judgments(a.name, a.file)
            print(f"imported {res['added']} judgment(s); {res['duplicates']} already here, {res['unmatched']} unmatched")
        elif a.action == "judge":
            from personalize.humaneval.judge import Judge, JudgeConfig

            judge = Judge(JudgeConfig(model=a.model))
            res = campaign.run_judge(camps, a.name, judge, lambda i, n, w: print(f"  judge {w}", flush=True)
                                     if i % 10 == 0 else None)
            corr = camps.results(a.name)["judge"]
            print(f"{judge.label} judged {res['judged']} unit(s); rank correlation with the raters: "
                  f"{json.dumps(corr and corr['rank_correlation'])}")
        elif a.action in ("close", "open"):
            camps.set_status(a.name, "closed" if a.action == "close" else "open")
            print(f"campaign {a.name!r} is {'closed' if a.action == 'close' else 'open'}")
    finally:
        store.close()


def cmd_population(a) -> None:
    """A LaMP folder from where people's writing already lives: git histories, Debian changelogs, a table."""
    from personalize.fitting import population
    from personalize.data import HistoryError

    if a.min_items < 1 or a.max_items < a.min_items:
        raise UsageError(f"need 1 <= --min-items <= --max-items (got {a.min_items} and {a.max_items})")
    limits = {"split": a.split, "min_items": a.min_items, "max_items": a.max_items}
    t0 = time.perf_counter()
    try:
        if a.action == "from-git":
            report = population.from_git(a.repo, a.out, **limits)
        elif a.action == "from-changelogs":
            report = population.from_changelogs(a.docs, a.out, **limits)
        else:
            report = population.from_table(a.file, a.out, task=a.task, **limits)
    except HistoryError as e:
        raise UsageError(str(e)) from None
    print(report.summary())
    if report.note:
        print(f"note: {report.note}")
    split = "" if a.split == "dev" else f" --split {a.split}"
    print(f"wrote {a.out} ({a.split}_questions.json, {a.split}_outputs.json, {a.split}_meta.json) in "
          f"{time.perf_counter() - t0:.1f} s; next: `python -m personalize build --data {a.out}{split}`")


def _objectives_first(a) -> tuple[str, ...]:
    """The built heads with --objective first (onboarding and card use the first), checked before models load."""
    from personalize.methods.engine import artifacts_meta

    if not (Path(a.artifacts) / "config.json").exists():
        raise UsageError(f"no artifacts at {a.artifacts}: build them with `python -m personalize build`")
    built = tuple(artifacts_meta(Path(a.artifacts))["settings"]["objectives"])
    if a.objective is None:
        return built
    if a.objective not in built:
        raise UsageError(f"--objective {a.objective}: these artifacts have heads for {list(built)}; "
                         f"build with --objectives {a.objective} to add it")
    return (a.objective, *[o for o in built if o != a.objective])


def cmd_bench(a) -> None:
    from personalize.data import read_lamp
    from personalize.catalog import BENCH_METHODS
    from personalize.eval.evaluate import format_bench, run_bench

    unknown = [m for m in comma_names(a.methods) if m not in BENCH_METHODS]
    if unknown:
        raise UsageError(f"bench --methods: unknown {unknown}; choose from {list(BENCH_METHODS)}")
    if a.repeats < 1 or a.users < 1 or a.items < 2 or a.serving_people < 1 or a.start_repeats < 0:
        raise UsageError("bench needs --users >= 1, --items >= 2, --repeats >= 1, --serving-people >= 1 and "
                         "--start-repeats >= 0")
    configs = _method_configs(a)
    engine = _engine(a)
    meta_data = a.data or engine.meta.get("data")
    task, queries = read_lamp(meta_data, a.split or engine.meta.get("split", "dev"))
    queries = [q for q in queries if len(q.profile) >= 2]
    step = max(1, len(queries) // max(a.users, 1))  # people spread over the file: LaMP files group alike people
    queries = queries[::step][: a.users]
    users = {(q.user or q.id): list(q.profile[: a.items]) for q in queries}
    if not queries:
        raise UsageError(f"no users with at least 2 profile items in {meta_data}")
    methods = comma_names(a.methods)
    t0 = time.perf_counter()
    b = run_bench(engine, users, queries[0].input, repeats=a.repeats, methods=methods, method_configs=configs,
                  prompts=[q.input for q in queries],
                  serving={"n_people": a.serving_people, "exact_pairs": a.exact_pairs, "start_repeats": a.start_repeats})
    b["settings"]["wall_s"] = round(time.perf_counter() - t0, 1)
    print(format_bench(b))
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(b, indent=2))
        print(f"wrote {a.json}")


def cmd_demo(a) -> None:
    """The first-run path: write the demo population, build it if missing, show methods side by side."""
    demo, art = Path(a.data), Path(a.artifacts)
    ensure_demo(demo, art)
    from personalize.data import read_lamp
    from personalize.methods.engine import Engine

    t0 = time.perf_counter()
    engine = Engine.load(art)
    print(f"ready in {time.perf_counter() - t0:.1f} s: {engine.artifacts_id} "
          f"({len(engine.model.peft_config)} adapters, K = {sorted(engine.clusters.centroids)})", flush=True)
    _, queries = read_lamp(demo, "dev")
    picks = [q for q in queries if q.user and q.user.endswith("_01")]
    for q in picks[: a.users]:
        fit = engine.fit(q.profile)
        print(f"\n=== {q.user}: cluster {fit.cluster}/{fit.k}, λ fit {fit.stages_s.get('fit', 0) * 1000:.1f} ms")
        print(f"prompt: {q.input}\ngold:   {q.gold}")
        for m in ("base", "cluster", "card"):
            g = engine.generate([q.input], m, fit.cluster, fit.style)[0]
            print(f"{m:>8}: {g.text}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m personalize", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    b = sub.add_parser("build", help="offline stage: clusters, cluster LoRAs, head, α", description="The offline stage of CARD on LaMP-format data.")
    add_build_args(b)
    b.set_defaults(fn=cmd_build)

    o = sub.add_parser("onboard", help="store a user, assign a cluster, fit λ", description="Onboard one user from a history file.")
    o.add_argument("--artifacts", required=True)
    o.add_argument("--history", required=True, help=".txt (one item per line or blank-line separated), .jsonl, .csv or LaMP .json")
    o.add_argument("--user", default=None, help="user name (default: the file's name)")
    o.add_argument("--db", default=DEFAULT_DB)
    o.add_argument("--k", type=int, default=None, help="cluster count to use (default: the build's)")
    o.add_argument("--replace", action="store_true", help="replace an existing user's history")
    o.set_defaults(fn=cmd_onboard)

    g = sub.add_parser("generate", help="outputs of several methods for one prompt", description="Generate for a stored user.")
    g.add_argument("--artifacts", required=True)
    g.add_argument("--user", required=True)
    g.add_argument("--prompt", required=True)
    g.add_argument("--methods", default="base,cluster,card",
                   help="any of base, cluster, card, rag, pag, exact, cope, oppu, p2p (p2p: trained by build)")
    g.add_argument("--template", action="store_true", help="wrap the prompt in the task's template")
    g.add_argument("--db", default=DEFAULT_DB)
    g.add_argument("--k", type=int, default=None)
    _decoding_args(g)
    g.set_defaults(fn=cmd_generate)

    e = sub.add_parser("eval", help="ROUGE-1/ROUGE-L per method on LaMP-format data", description="Evaluate methods (Table 1 layout).")
    e.add_argument("--artifacts", required=True)
    e.add_argument("--data", required=True)
    e.add_argument("--split", default="dev")
    e.add_argument("--methods", default="base,cluster,card,bm25_copy",
                   help="any of base, cluster, card, bm25_copy (the no-model floor), rag, pag, exact, cope, oppu, p2p")
    e.add_argument("--limit", type=int, default=None)
    e.add_argument("--sources", default="", help="score only users of these sources (comma-separated, e.g. the ones "
                                                  "the build left out with --exclude-sources)")
    e.add_argument("--alpha", type=float, default=None, help="override the build's α")
    e.add_argument("--rerank", default=None,
                   help="card_rerank's settings over the build's, e.g. \"n=8,greedy=false,temperature=1.0\" (n, greedy, "
                        "temperature, top_p, seed, alpha, length_norm: rerank.RerankSettings)")
    e.add_argument("--objective", default=None,
                   help="which built head onboards users and steers card (tokens, pairs, hard_pairs; default: the build's first)")
    _add_method_budgets(e)
    e.add_argument("--json", default=None)
    e.set_defaults(fn=cmd_eval)

    t = sub.add_parser("tune", help="choose repetition control, the style's parts, α and w on validation people",
                       description="Re-choose the decoding settings of a build on validation people (people of the "
                                   "build's sources outside its population) and write them into its config.json.")
    t.add_argument("--artifacts", required=True)
    t.add_argument("--data", default=None, help="LaMP folder (default: the build's)")
    t.add_argument("--split", default=None)
    t.add_argument("--users", type=int, default=30, help="validation people (the harm guard wants 30)")
    t.add_argument("--dry-run", action="store_true", help="print the choice, do not write it")
    t.add_argument("--steps", default="", help="re-run only these steps (comma-separated: repetition, style, alpha, "
                                               "knn_weight, fallback; and rerank, run only when named: card_rerank's "
                                               "candidates); the others keep the build's settings")
    t.set_defaults(fn=cmd_tune)

    n = sub.add_parser("bench", help="efficiency table measured in one run", description="Onboarding, fit, decoding overhead, switching, storage.")
    n.add_argument("--artifacts", required=True)
    n.add_argument("--data", default=None, help="users to onboard (default: the build's data)")
    n.add_argument("--split", default=None)
    n.add_argument("--users", type=int, default=8, help="people onboarded")
    n.add_argument("--serving-people", type=int, default=8, help="people pressing Compare at once (serving)")
    n.add_argument("--start-repeats", type=int, default=3, help="app starts timed (serving's start_s; 0 = none)")
    n.add_argument("--items", type=int, default=24, help="history items per user")
    n.add_argument("--repeats", type=int, default=5)
    n.add_argument("--methods", default="rag,oppu,p2p,card,exact",
                   help="Table 5 rows measured side by side: any of rag, oppu, p2p, card, exact ('' = none)")
    _add_method_budgets(n)
    n.add_argument("--json", default=None)
    n.set_defaults(fn=cmd_bench)

    f = sub.add_parser("simulate-feedback", help="votes refine λ: a simulated person votes, held-out ROUGE-L per vote count",
                       description="A simulated person prefers, of two CARD samples, the one closer to their held-out "
                                   "text; their style is refitted after each round of votes and scored on other "
                                   "held-out items (and on the prompts voted on).")
    f.add_argument("--artifacts", default=DEMO_ARTIFACTS)
    f.add_argument("--data", required=True, help="LaMP folder of the people simulated")
    f.add_argument("--split", default="dev")
    f.add_argument("--sources", default="", help="only people of these sources (e.g. repositories the build never saw)")
    f.add_argument("--users", type=int, default=16)
    f.add_argument("--votes", default="0,5,10,20", help="checkpoints: votes after which the person is scored")
    f.add_argument("--eval-items", type=int, default=4, help="held-out items scored: the query and the newest items")
    f.add_argument("--vote-items", type=int, default=10, help="further held-out items whose prompts are voted on")
    f.add_argument("--max-items", type=int, default=24, help="history items the style is fitted on")
    f.add_argument("--vote-weight", type=float, default=2.0, help="a vote's token row against one history row")
    f.add_argument("--rejected-weight", type=float, default=0.0,
                   help="the other sample's tokens pushed down with this weight (0: the preferred sample alone)")
    f.add_argument("--preference", choices=("closer", "random"), default="closer",
                   help="closer: the sample nearer the person's text; random: a coin (the control)")
    f.add_argument("--seed", type=int, default=0)
    f.add_argument("--json", default=None, help="write the curves here")
    _decoding_args(f)
    f.set_defaults(fn=cmd_simulate_feedback)

    k = sub.add_parser("style-key", help="export or import a user's style as a copyable key (≤ 4 KiB)",
                       description="A style key holds a user's fitted style (λ, token bias), clusters and the artifacts "
                                   "id, nothing of their history; it imports only into a studio with the same artifacts.")
    kk = k.add_subparsers(dest="action", required=True)
    ke = kk.add_parser("export", help="write the user's current style key (or every version) to a file")
    ke.add_argument("--user", required=True)
    ke.add_argument("--out", required=True, help="the file gets exactly the key (one key per line with --all-versions)")
    ke.add_argument("--all-versions", action="store_true", help="every version of the style, oldest first")
    ki = kk.add_parser("import", help="store the style(s) of a key file as new versions")
    ki.add_argument("--file", required=True)
    ki.add_argument("--user", default=None, help="store under this name (default: the name in the key)")
    for x in (ke, ki):
        x.add_argument("--db", default=DEFAULT_DB)
        x.add_argument("--artifacts", default=DEMO_ARTIFACTS, help="the build the studio serves")
        x.set_defaults(fn=cmd_style_key)

    fg = sub.add_parser("forget", help="delete everything of a user and anonymise their ratings",
                        description="Deletes the user's history, styles and versions, votes, generations, EXACT memory, "
                                    "OPPU adapters and exports that hold them; their ratings keep the verdict only. "
                                    "The database file is vacuumed afterwards.")
    fg.add_argument("--user", required=True)
    fg.add_argument("--db", default=DEFAULT_DB)
    fg.add_argument("--export-dir", default="data/exports")
    fg.set_defaults(fn=cmd_forget)

    cp = sub.add_parser("campaign", help="human-eval campaigns: create, generate, status, export, import, judge, close",
                        description="A fixed set of (user, prompt) items from a LaMP folder, every method's output "
                                    "generated ahead, blinded units served to raters in the app's Rate tab.")
    cc = cp.add_subparsers(dest="action", required=True)
    cr = cc.add_parser("create", help="a campaign over the first N queries of a LaMP split")
    cr.add_argument("--name", required=True)
    cr.add_argument("--artifacts", default=DEMO_ARTIFACTS, help="the build that generates the outputs")
    cr.add_argument("--data", required=True, help="a LaMP folder (its people are stored from their profiles)")
    cr.add_argument("--split", default="dev")
    cr.add_argument("--limit", type=int, default=10, help="the first N queries become the items")
    cr.add_argument("--sources", default="", help="only people from these sources (comma-separated; e.g. the ones "
                                                  "the build left out with --exclude-sources)")
    cr.add_argument("--methods", default="base,cluster,card", help="comma-separated methods to compare")
    cr.add_argument("--reference", action="store_true", help="the gold output takes part as one more blinded arm")
    cr.add_argument("--mode", choices=("pairwise", "rubric"), default="pairwise")
    cr.add_argument("--raters-per-item", type=int, default=3, help="judgments wanted per unit")
    cr.add_argument("--min-raters-per-unit", type=int, default=None,
                    help="a started unit goes to this many raters before any unrated unit is opened, so agreement "
                         "(Krippendorff's α) exists from the first raters (default 2; 1: plain least-rated first)")
    cr.add_argument("--attention-every", type=int, default=0,
                    help="every N-th unit a rater gets is an attention check (needs --reference; 0: none)")
    _decoding_args(cr)
    cg = cc.add_parser("generate", help="generate the missing outputs (resumable; each output stored once)")
    cg.add_argument("--artifacts", default=None, help="the build's folder (default: the one the campaign names)")
    cs = cc.add_parser("status", help="progress, agreement and leaderboard")
    cs.add_argument("--json", action="store_true", help="the status as JSON (keys items, outputs, judgments, "
                                                        "agreement, leaderboard, ...)")
    ce = cc.add_parser("export", help="one row per judgment (JSONL or CSV by extension) and a summary JSON")
    ce.add_argument("--out", required=True)
    ci = cc.add_parser("import", help="merge judgments exported by another studio (no duplicates)")
    ci.add_argument("--file", required=True)
    cj = cc.add_parser("judge", help="an LLM judge scores every unit (default: the bundled model, a weak judge)")
    cj.add_argument("--model", default=None, help="a Hugging Face id or folder (default: the bundled model)")
    cx = cc.add_parser("close", help="stop serving the campaign to raters")
    co = cc.add_parser("open", help="serve a closed campaign again")
    for x in (cr, cg, cs, ce, ci, cj, cx, co):
        if x is not cr:
            x.add_argument("--name", required=True)
        x.add_argument("--db", default=DEFAULT_DB)
        x.set_defaults(fn=cmd_campaign)

    pp = sub.add_parser("population", help="a LaMP folder from git histories, Debian changelogs or a table",
                        description="One query per person (their newest item; the profile: their earlier items, newest "
                                    "first), written as a LaMP folder that build and eval read. Prints what was kept "
                                    "and, counted, why the rest was dropped.")
    pc = pp.add_subparsers(dest="action", required=True)
    pg = pc.add_parser("from-git", help="commit subjects per author (bots, merges, reverts left out)")
    pg.add_argument("--repo", action="append", required=True,
                    help="a git repository (repeat for several; one person per author e-mail across them)")
    pd = pc.add_parser("from-changelogs", help="Debian changelog entries per maintainer (team uploads, rebuilds left out)")
    pd.add_argument("--docs", default="/usr/share/doc", help="folder of <package>/changelog.Debian.gz (default /usr/share/doc)")
    pt = pc.add_parser("from-table", help="rows of user, text (and optionally input, time, source) from .csv or .jsonl")
    pt.add_argument("--file", required=True, help=".csv (header names case-insensitive) or .jsonl")
    pt.add_argument("--task", default=None, help="the task the inputs belong to (default: writing with an input column, "
                                                 "else rewrite, whose prompt is a rule-based neutral version of the text)")
    for x in (pg, pd, pt):
        x.add_argument("--out", required=True, help="the LaMP folder to write")
        x.add_argument("--min-items", type=int, default=8, help="people with fewer earlier items are dropped (default 8)")
        x.add_argument("--max-items", type=int, default=24, help="profile items kept per person, newest (default 24)")
        x.add_argument("--split", default="dev", help="split name of the files (default dev)")
        x.set_defaults(fn=cmd_population)

    d = sub.add_parser("demo", help="build the demo once, then print methods side by side", description="The demo pipeline.")
    d.add_argument("--data", default="data/demo")
    d.add_argument("--artifacts", default=DEMO_ARTIFACTS)
    d.add_argument("--users", type=int, default=6)
    d.set_defaults(fn=cmd_demo)
    return p


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    try:
        a.fn(a)
    except (UsageError, ValueError, FileNotFoundError) as e:  # HistoryError, StoreError, ArtifactsError included
        print(f"error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # a model that cannot be loaded; looked up lazily so light commands import no torch
        models = sys.modules.get("personalize.lm.models")
        if models is None or not isinstance(e, models.ModelLoadError):
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: nothing was written for the unfinished step", file=sys.stderr)
        return 130
    return 0
