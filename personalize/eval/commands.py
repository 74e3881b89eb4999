"""The CLI's evaluation commands (`eval`, `bench`, `simulate-feedback`): their arguments and what they run. The CLI
(cli.py) adds them to its parser; nothing of the app or the library imports this module. Model code is imported
when a command runs, not before.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

from personalize.catalog import BENCH_METHODS, BY_NAME
from personalize.flags import add_flags
from personalize.methods.oppu_config import OppuConfig
from personalize.fitting.plan import DEMO_ARTIFACTS, UsageError, comma_list, decoding, decoding_args, ints, load_engine


def _method_configs(a) -> dict[str, dict]:
    """The CPU budgets of EXACT and OPPU from --exact-pairs / --oppu-steps, checked before any model loads."""
    from personalize.methods.exact import ExactConfig

    configs = {"exact": {"max_pairs": a.exact_pairs}, "oppu": {"max_steps": a.oppu_steps}}
    try:
        ExactConfig(**configs["exact"]), OppuConfig(**configs["oppu"])
    except ValueError as e:
        raise UsageError(str(e)) from e
    return configs


def _add_method_budgets(p: argparse.ArgumentParser) -> None:
    add_flags(p, OppuConfig, {"max_steps": "--oppu-steps"})
    pairs = BY_NAME["exact"].budget["max_pairs"]  # the studio's too (catalog.py)
    p.add_argument("--exact-pairs", type=int, default=pairs,
                   help=f"history pairs EXACT indexes per user (default {pairs}, a CPU budget: indexing costs about "
                        "half a minute per pair on a 2-core CPU; EXACT's own default is 32)")


def cmd_eval(a) -> None:
    from personalize.eval.evaluate import format_table, run_eval

    configs = _method_configs(a)
    objectives = _objectives_first(a)
    engine = load_engine(a)
    engine.cfg = replace(engine.cfg, objectives=objectives)
    # the head's own α from the build's sweep on validation users (older builds swept the first head only)
    alpha = a.alpha if a.alpha is not None else \
        engine.meta.get("report", {}).get("alpha_by_objective", {}).get(objectives[0], {}).get("alpha")
    if alpha is not None:
        engine.cfg = replace(engine.cfg, decoding=replace(engine.cfg.decoding, alpha=alpha))

    def ray_shards(cfg):  # --ray: eval's onboarding and decoding as Ray tasks
        from personalize.eval.ray_eval import RayShards

        return RayShards(engine, cfg)
    shards = on_ray(a, ray_shards)
    t0 = time.perf_counter()
    try:
        result = run_eval(engine, a.data, a.split, comma_list(a.methods), a.limit, method_configs=configs,
                          sources=comma_list(a.sources), shards=shards)
    finally:
        if shards is not None:
            shards.close()
    result["settings"]["wall_s"] = round(time.perf_counter() - t0, 1)
    print(format_table(result))
    print("held-out diagnostics (mean over users):", json.dumps(result["diagnostics"]))
    print("the people's own golds repeat a past text:", json.dumps(result["golds"]))
    for label, key in (("copy-aware", "differences_copy_aware"), ("ROUGE-L", "differences")):
        for pair, d in result[key].items():
            print(f"  {pair:<28} {label} {d['mean']:+.4f}  95% CI [{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}]"
                  f"  wins/losses {d['wins']}/{d['losses']}")
    print("gold log-prob per token under each method:", json.dumps(result["gold_logprob"]))
    for pair, d in result["gold_logprob_differences"].items():
        print(f"  {pair:<28} gold log-prob {d['mean']:+.4f}  95% CI [{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}]")
    print("seconds per person:", json.dumps({m: v["seconds_per_person"] for m, v in result["methods"].items()}))
    print("user-specificity:", json.dumps(result["specificity"]))
    _write_json(a.json, result)


def _write_json(path: str | None, result: dict) -> None:
    """--json PATH: the whole result written there (nothing without the flag)."""
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(result, indent=2))
        print(f"wrote {path}")


def on_ray(a, make):
    """--ray ADDRESS: make(RayConfig), the command's work on Ray (connected; a Ray that cannot be reached is a usage
    error); None without the flag, and then Ray is not imported."""
    if not getattr(a, "ray", None):
        return None
    from personalize.distributed.pool import RayConfig

    try:
        return make(RayConfig(address=a.ray, num_cpus=a.ray_cpus))
    except (ValueError, ConnectionError) as e:
        raise UsageError(f"--ray: {e}") from e


def add_ray_args(p: argparse.ArgumentParser) -> None:
    """--ray and --ray-cpus, for the commands whose batch work fans out over Ray."""
    p.add_argument("--ray", default=None, metavar="ADDRESS",
                   help="run the work in shards on Ray: 'auto' starts or joins a local Ray, HOST:6379 or "
                        "ray://HOST:10001 joins a cluster (docs/SCALING.md); without it nothing uses Ray")
    p.add_argument("--ray-cpus", type=int, default=None, help="CPUs of a local Ray started by --ray auto (default: all)")


def _objectives_first(a) -> tuple[str, ...]:
    """The built heads with --objective first (onboarding and card use the first), checked before models load."""
    from personalize.methods.artifacts import artifacts_meta

    built = tuple(artifacts_meta(Path(a.artifacts))["settings"]["objectives"])
    if a.objective is None:
        return built
    if a.objective not in built:
        raise UsageError(f"--objective {a.objective}: these artifacts have heads for {list(built)}; "
                         f"build with --objectives {a.objective} to add it")
    return (a.objective, *[o for o in built if o != a.objective])


def cmd_bench(a) -> None:
    from personalize.data import read_lamp
    from personalize.eval.bench import format_bench, run_bench

    methods = comma_list(a.methods)
    unknown = [m for m in methods if m not in BENCH_METHODS]
    if unknown:
        raise UsageError(f"bench --methods: unknown {unknown}; choose from {list(BENCH_METHODS)}")
    if a.repeats < 1 or a.users < 1 or a.items < 2 or a.serving_people < 1 or a.start_repeats < 0:
        raise UsageError("bench needs --users >= 1, --items >= 2, --repeats >= 1, --serving-people >= 1 and "
                         "--start-repeats >= 0")
    configs = _method_configs(a)
    engine = load_engine(a)
    meta_data = a.data or engine.meta.get("data")
    task, queries = read_lamp(meta_data, a.split or engine.meta.get("split", "dev"))
    queries = [q for q in queries if len(q.profile) >= 2]
    step = max(1, len(queries) // max(a.users, 1))  # people spread over the file: LaMP files group alike people
    queries = queries[::step][: a.users]
    users = {(q.user or q.id): list(q.profile[: a.items]) for q in queries}
    if not queries:
        raise UsageError(f"no users with at least 2 profile items in {meta_data}")
    t0 = time.perf_counter()
    b = run_bench(engine, users, queries[0].input, repeats=a.repeats, methods=methods, method_configs=configs,
                  prompts=[q.input for q in queries], loops=not a.no_loops, static=a.static_cache,
                  serving={"n_people": a.serving_people, "exact_pairs": a.exact_pairs, "start_repeats": a.start_repeats})
    b["settings"]["wall_s"] = round(time.perf_counter() - t0, 1)
    print(format_bench(b))
    _write_json(a.json, b)


def cmd_simulate_feedback(a) -> None:
    from personalize.data import read_lamp, select_sources
    from personalize.methods.card.votes import FeedbackSettings, SimulationSettings, simulate

    s = SimulationSettings(checkpoints=ints(a.votes), n_eval=a.eval_items, n_vote=a.vote_items,
                           preference=a.preference, seed=a.seed)
    fs = FeedbackSettings(vote_weight=a.vote_weight, rejected_weight=a.rejected_weight)
    engine = load_engine(a)
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
    res = simulate(engine, people, s, fs, decoding(engine, a),
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
    _write_json(a.json, res)


def add_eval(sub) -> None:
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
    e.add_argument("--objective", default=None,
                   help="which built head onboards users and steers card (tokens, pairs, hard_pairs; default: the build's first)")
    _add_method_budgets(e)
    add_ray_args(e)
    e.add_argument("--json", default=None)
    e.set_defaults(fn=cmd_eval)


def add_bench(sub) -> None:
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
    n.add_argument("--no-loops", action="store_true",
                   help="leave out the loop / echo table (every studio method decoded again for every person)")
    n.add_argument("--static-cache", action="store_true",
                   help="also time the cluster model's decode with a static KV cache (on a GPU its first decode "
                        "compiles it into CUDA graphs, which takes a while)")
    _add_method_budgets(n)
    n.add_argument("--json", default=None)
    n.set_defaults(fn=cmd_bench)


def add_simulate_feedback(sub) -> None:
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
    decoding_args(f)
    f.set_defaults(fn=cmd_simulate_feedback)
