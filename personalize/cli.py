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
from contextlib import closing
from pathlib import Path

from personalize.catalog import CARD_METHODS, COMPARED, CORE_METHODS
from personalize.eval import commands
from personalize.fitting.plan import (DEFAULT_DB, DEMO_ARTIFACTS, DEMO_DATA, UsageError, add_build_args, comma_list,
                                      decoding, decoding_args, ensure_demo, load_engine, run_build)



# ---------------------------------------------------------------- commands

def cmd_build(a) -> None:
    def on_ray(cfg):
        from personalize.distributed.adapter_jobs import RayAdapters

        return RayAdapters(cfg)
    run_build(a, cluster_trainer=commands.on_ray(a, on_ray))


def cmd_onboard(a) -> None:
    """A missing build, a bad history file or a taken name is refused before the models load (seconds, not ten)."""
    from personalize.data import TASKS, read_history_file
    from personalize.methods.artifacts import artifacts_meta
    from personalize.store import Store

    items = read_history_file(a.history, task=TASKS[artifacts_meta(Path(a.artifacts))["task"]])
    name = a.user or Path(a.history).stem
    store = Store(a.db)
    if store.may_reach(name) and not a.replace:  # the CLI reaches every stored user
        raise UsageError(f"user {name!r} exists: pass --replace to replace their history and style")
    from personalize.methods.card.person import fit_person

    engine = load_engine(a)
    store.add_user(name, items, engine.task.name, replace=a.replace)
    t0 = time.perf_counter()
    fit, _ = fit_person(engine, store, name, k=a.k, progress=lambda s: print(f"  {s} ...", flush=True))
    print(f"user {name}: {fit.n_items} items, cluster {fit.cluster} of K={fit.k} "
          f"(distances {', '.join(f'{d:.3f}' for d in fit.distances)})")
    for s, v in fit.stages_s.items():
        print(f"  {s:<18} {v * 1000:9.1f} ms")
    print(f"  {'total':<18} {(time.perf_counter() - t0) * 1000:9.1f} ms")
    if fit.cold_start:
        print(f"  cold start: fewer than {engine.cfg.min_fit_items} items, λ = 1 (the cluster's shared head)")
    d = fit.diagnostics
    if d.get("n"):
        optional = {"acc_logprob_rule": "log-prob rule", "acc_covariate_only": "γ·Δlogp alone", "acc_no_head": "no head"}
        print(f"  held-out {d['unit']} (n={d['n']}): accuracy own style {d['acc_own']:.3f}, λ=1 {d['acc_ones']:.3f}, "
              f"other users' λ {d.get('acc_other', float('nan')):.3f}"
              + "".join(f", {label} {d[k]:.3f}" for k, label in optional.items() if k in d))
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
    from personalize.methods.card.style import UserStyle

    lam = UserStyle.from_stored(store.style(name, engine.artifacts_id))  # λ with the person's token bias and memory
    k = k or info["stats"].get("k") or engine.cfg.default_k
    a = store.assignment(name, engine.artifacts_id, k)
    if a is None:
        raise StoreError(f"user {name!r} has no cluster for K={k}; built: {sorted(engine.clusters.centroids)}")
    return lam, a["cluster"], k


def cmd_generate(a) -> None:
    from personalize.methods.artifacts import require_parts
    from personalize.store import Store

    if not a.prompt.strip():
        raise UsageError("--prompt is empty")
    methods = comma_list(a.methods)
    known = [*CORE_METHODS, *CARD_METHODS[1:], *COMPARED]
    unknown = [m for m in methods if m not in known]
    if unknown:
        raise UsageError(f"unknown methods {unknown}; choose from {known}")
    store = Store(a.db)
    store.user(a.user)  # an unknown user, a method or a build's part that is not there: told before the models load
    require_parts(a.artifacts, methods)
    engine = load_engine(a)
    lam, cluster, k = _user_state(engine, store, a.user, a.k)
    s = decoding(engine, a)
    prompt = engine.task.prompt(a.prompt) if a.template else a.prompt
    from personalize.methods.card.style import variant
    from personalize.methods.base import UserContext
    from personalize.methods.card import card_decode
    from personalize.methods.registry import METHODS, get_method

    for m in methods:
        if m in METHODS:
            user = UserContext.from_store(store, a.user, engine.task, cluster, k, lam)
            g = get_method(m, engine, store).generate(user, [prompt], s)[0]
        else:
            retrieve = m in CARD_METHODS and variant(m, engine.cfg.style).retrieval
            items = UserContext.from_store(store, a.user, engine.task).items if retrieve else None
            g = card_decode.generate(engine, [prompt], m, cluster, lam, k=k, settings=s, items=items)[0]
        store.add_generation(a.user, engine.artifacts_id, m, prompt, g.text, {"alpha": s.alpha, "top_k": s.top_k,
                             "max_new_tokens": s.max_new_tokens, "k": k, "cluster": cluster}, g.latency_s, g.n_tokens)
        print(f"[{m}] ({g.latency_s:.2f} s, {g.n_tokens} tokens)\n{g.text}\n")


def cmd_tune(a) -> None:
    from personalize.methods.card.tune import STEPS, tune

    engine = load_engine(a)

    def on_ray(cfg):
        from personalize.distributed.people import PeopleShards

        return PeopleShards(engine, cfg, desc="tune on Ray (people × decodes)")
    shards = commands.on_ray(a, on_ray)
    t0 = time.perf_counter()
    try:
        steps = tuple(x for x in comma_list(a.steps) if x != "none") if a.steps else STEPS  # none: the guards alone
        report = tune(engine, a.data, a.split, a.users, write=not a.dry_run, steps=steps,
                      shards=shards, far_data=a.far_data, far_sources=comma_list(a.far_sources))
    finally:
        if shards is not None:
            shards.close()
    print(json.dumps({k: report[k] for k in ("chosen_decoding", "chosen_style", "users", "helps_share")}, indent=1))
    for part in ("guard", "own"):
        if part in report:
            print(report[part]["why"])
    print(f"tuned in {time.perf_counter() - t0:.0f} s" + ("" if a.dry_run else f"; written to {a.artifacts}/config.json"))


def cmd_style_key(a) -> None:
    from personalize.studio.own_data import BuildInfo, export_keys, import_keys
    from personalize.store import Store

    if not (Path(a.artifacts) / "config.json").exists():
        raise UsageError(f"no artifacts at {a.artifacts}: a style key belongs to a build; give --artifacts DIR")
    build = BuildInfo.of_folder(a.artifacts)
    with closing(Store(a.db)) as store:
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
            print(f"imported {len(res.versions)} version(s) for {res.user} (current: version "
                  f"{res.versions[-1]})" + (f"; {res.trimmed} smallest bias entries were left out of the key"
                                            if res.trimmed else ""))


def cmd_forget(a) -> None:
    from personalize.studio.own_data import forget_user
    from personalize.store import Store

    with closing(Store(a.db)) as store:
        root = Path(a.db).parent  # every file of a studio lives beside its database
        res = forget_user(store, a.user, root / "oppu", Path(a.export_dir or root / "exports"), root / "cache")
    removed = ", ".join(f"{v} {k}" for k, v in res.deleted.items() if v)
    print(f"forgot {a.user}: {removed or 'no rows'} deleted; {res.ratings_anonymised} rating(s) and "
          f"{res.campaign_items_anonymised} campaign item(s) anonymised; {res.rater_ids_anonymised} vote(s) cast under "
          f"the name kept under an anonymous rater id; {len(res.files)} file(s) removed; "
          f"database vacuumed")


def cmd_campaign(a) -> None:
    """Human-eval campaigns: create from a LaMP folder, generate the outputs (resumable), status, export, import,
    the LLM judge, close."""
    from personalize.humaneval import campaign, campaign_files, campaign_pool, campaign_report
    from personalize.store import Store

    with closing(Store(a.db)) as store:
        camps = campaign.Campaigns(store)
        if a.action == "create":
            from personalize.methods.artifacts import artifacts_meta

            meta = artifacts_meta(Path(a.artifacts))
            c = campaign_pool.create_from_lamp(
                store, a.name, a.data, a.split, a.limit, a.artifacts, meta.get("id", "unbuilt"), meta["task"],
                sources=comma_list(a.sources), methods=comma_list(a.methods), reference=a.reference, mode=a.mode, raters_per_item=a.raters_per_item,
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

            def on_ray(cfg):
                from personalize.distributed.requests import RequestShards

                return RequestShards(studio.runtime.engine, cfg)
            shards = commands.on_ray(a, on_ray)
            bar = tqdm(total=None, unit="output", desc=f"campaign {a.name}" + (" on Ray" if shards else ""))

            def tick(i, n, what):
                bar.total = n
                bar.n = i
                bar.set_postfix_str(what[:40])
                bar.refresh()
            try:
                res = campaign_pool.generate(studio, a.name, tick, shards=shards)
            finally:
                bar.close()
            print(f"generated {res['generated']} output(s) in {res['seconds']} s; outputs {res['outputs']['done']}/"
                  f"{res['outputs']['total']}" + "".join(f"\n  failed: {f}" for f in res["failed"]))
        elif a.action == "status":
            res = camps.results(a.name)
            print(json.dumps(res, indent=2, ensure_ascii=False) if a.json else campaign_report.format_status(res))
        elif a.action == "export":
            path, summary, n = campaign_files.export_judgments(camps, a.name, a.out)
            print(f"wrote {n} judgment(s) to {path} and the summary to {summary}")
        elif a.action == "import":
            res = campaign_files.import_judgments(camps, a.name, a.file)
            print(f"imported {res['added']} judgment(s); {res['duplicates']} already here, {res['unmatched']} unmatched")
        elif a.action == "judge":
            from personalize.humaneval.judge import Judge, JudgeConfig

            judge = Judge(JudgeConfig(model=a.model))
            res = campaign_pool.run_judge(camps, a.name, judge, lambda i, n, w: print(f"  judge {w}", flush=True)
                                     if i % 10 == 0 else None)
            corr = camps.results(a.name)["judge"]
            print(f"{judge.label} judged {res['judged']} unit(s); rank correlation with the raters: "
                  f"{json.dumps(corr and corr['rank_correlation'])}")
        elif a.action in ("close", "open"):
            camps.set_status(a.name, "closed" if a.action == "close" else "open")
            print(f"campaign {a.name!r} is {'closed' if a.action == 'close' else 'open'}")


def cmd_population(a) -> None:
    """A LaMP folder from where people's writing already lives: git histories, Debian changelogs, a table."""
    from personalize.fitting import changelogs, population
    from personalize.data import HistoryError

    if a.min_items < 1 or a.max_items < a.min_items:
        raise UsageError(f"need 1 <= --min-items <= --max-items (got {a.min_items} and {a.max_items})")
    limits = {"split": a.split, "min_items": a.min_items, "max_items": a.max_items}
    t0 = time.perf_counter()
    try:
        if a.action == "from-git":
            report = population.from_git(a.repo, a.out, **limits)
        elif a.action == "from-changelogs":
            report = changelogs.from_changelogs(a.docs, a.out, **limits)
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


def cmd_demo(a) -> None:
    """The first-run path: write the demo population, build it if missing, show methods side by side."""
    demo, art = Path(a.data), Path(a.artifacts)
    ensure_demo(demo, art)
    from personalize.data import read_lamp
    from personalize.methods.card import card_decode, onboard
    from personalize.methods.engine import Engine

    t0 = time.perf_counter()
    engine = Engine.load(art)
    print(f"ready in {time.perf_counter() - t0:.1f} s: {engine.artifacts_id} "
          f"({len(engine.model.peft_config)} adapters, K = {sorted(engine.clusters.centroids)})", flush=True)
    _, queries = read_lamp(demo, "dev")
    picks = [q for q in queries if q.user and q.user.endswith("_01")]
    for q in picks[: a.users]:
        fit = onboard.fit(engine, q.profile)
        print(f"\n=== {q.user}: cluster {fit.cluster}/{fit.k}, λ fit {fit.stages_s.get('fit', 0) * 1000:.1f} ms")
        print(f"prompt: {q.input}\ngold:   {q.gold}")
        for m in CORE_METHODS:
            g = card_decode.generate(engine, [q.input], m, fit.cluster, fit.style)[0]
            print(f"{m:>8}: {g.text}")


def build_parser() -> argparse.ArgumentParser:
    from personalize.humaneval.campaign_schema import DEFAULT_ITEMS as DEFAULT_CAMPAIGN_ITEMS  # settings, no model code

    p = argparse.ArgumentParser(prog="python -m personalize", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    b = sub.add_parser("build", help="offline stage: clusters, cluster LoRAs, head, α", description="The offline stage of CARD on LaMP-format data.")
    add_build_args(b)
    commands.add_ray_args(b)
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
    g.add_argument("--methods", default=",".join(CORE_METHODS),
                   help="any of base, cluster, card, rag, pag, exact, cope, oppu, p2p (p2p: trained by build)")
    g.add_argument("--template", action="store_true", help="wrap the prompt in the task's template")
    g.add_argument("--db", default=DEFAULT_DB)
    g.add_argument("--k", type=int, default=None)
    decoding_args(g)
    g.set_defaults(fn=cmd_generate)

    commands.add_eval(sub)

    t = sub.add_parser("tune", help="choose repetition control, the style's parts, α and w on validation people",
                       description="Re-choose the decoding settings of a build on validation people (people of the "
                                   "build's sources outside its population) and write them into its config.json.")
    t.add_argument("--artifacts", required=True)
    t.add_argument("--data", default=None, help="LaMP folder (default: the build's)")
    t.add_argument("--split", default=None)
    t.add_argument("--users", type=int, default=30, help="validation people (the harm guard wants 30)")
    t.add_argument("--dry-run", action="store_true", help="print the choice, do not write it")
    t.add_argument("--steps", default="", help="re-run only these steps (comma-separated: repetition, style, alpha, "
                                               "knn_weight, fallback; 'none': the harm guards alone); the others keep "
                                               "the build's settings")
    t.add_argument("--far-data", default=None, help="a LaMP folder of people unlike the build's (default: --data)")
    t.add_argument("--far-sources", default="", help="sources of --far-data held out for the far people's guard: "
                                                     "those of their people beyond the build's clusters judge the own "
                                                     "adapters (a cluster of one), never the near people's settings")
    commands.add_ray_args(t)
    t.set_defaults(fn=cmd_tune)

    commands.add_bench(sub)
    commands.add_simulate_feedback(sub)

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
    fg.add_argument("--export-dir", default=None, help="the studio's exports (default: exports beside --db)")
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
    cr.add_argument("--limit", type=int, default=DEFAULT_CAMPAIGN_ITEMS, help="the first N queries become the items")
    cr.add_argument("--sources", default="", help="only people from these sources (comma-separated; e.g. the ones "
                                                  "the build left out with --exclude-sources)")
    cr.add_argument("--methods", default=",".join(CORE_METHODS), help="comma-separated methods to compare")
    cr.add_argument("--reference", action="store_true", help="the gold output takes part as one more blinded arm")
    cr.add_argument("--mode", choices=("pairwise", "rubric"), default="pairwise")
    cr.add_argument("--raters-per-item", type=int, default=3, help="judgments wanted per unit")
    cr.add_argument("--min-raters-per-unit", type=int, default=None,
                    help="a started unit goes to this many raters before any unrated unit is opened, so agreement "
                         "(Krippendorff's α) exists from the first raters (default 2; 1: plain least-rated first)")
    cr.add_argument("--attention-every", type=int, default=0,
                    help="every N-th unit a rater gets is an attention check (needs --reference; 0: none)")
    decoding_args(cr)
    cg = cc.add_parser("generate", help="generate the missing outputs (resumable; each output stored once)")
    cg.add_argument("--artifacts", default=None, help="the build's folder (default: the one the campaign names)")
    commands.add_ray_args(cg)
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
    d.add_argument("--data", default=DEMO_DATA)
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
