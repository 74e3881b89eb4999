"""A small human-eval campaign run end to end, with SIMULATED raters and an LLM judge (issue 10,
docs/results/2026-11-23-issue-10.md).

The raters here are not people: they are three rules, stated below, so that the campaign machinery (assignment,
agreement, position bias, the judge–rater rank correlation) can be shown on real outputs. A real study replaces
them with people in the app's Rate tab; nothing else changes.

- `overlap`: prefers the output whose words occur more in the person's history (share of the output's word types
  found among the history's); a tie within 0.05; "both bad" when both are under 0.1.
- `overlap-noisy`: the same rule, but one judgment in five is flipped and one in six is "A" whatever is shown
  (a tired rater with a position bias).
- `length`: prefers the output whose word count is nearer the median length of the person's history items.

    python benchmarks/campaign_study.py --artifacts data/artifacts/scholarly_titles \\
        --data ../shared/data/scholarly_titles --sources emnlp --limit 8 [--judge-model ID] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WORD = re.compile(r"\w+")


def words(text: str) -> list[str]:
    return WORD.findall((text or "").lower())


def overlap(history, text) -> float:
    vocab = {w for h in history for w in words(h)}
    mine = set(words(text))
    return len(mine & vocab) / len(mine) if mine else 0.0


def rule_overlap(a, rng) -> str:
    x, y = (overlap(a.history, t) for t in a.outputs)
    if max(x, y) < 0.1:
        return "both_bad"
    return "tie" if abs(x - y) < 0.05 else ("a" if x > y else "b")


def rule_noisy(a, rng) -> str:
    if rng.random() < 1 / 6:
        return "a"  # whatever is shown (attention checks included)
    v = rule_overlap(a, rng)
    return {"a": "b", "b": "a"}.get(v, v) if rng.random() < 0.2 else v


def rule_length(a, rng) -> str:
    target = statistics.median(len(words(h)) for h in a.history) if a.history else 10
    x, y = (abs(len(words(t)) - target) for t in a.outputs)
    return "tie" if x == y else ("a" if x < y else "b")


RATERS = {"sim-overlap": rule_overlap, "sim-overlap-noisy": rule_noisy, "sim-length": rule_length}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--artifacts", default="data/artifacts/scholarly_titles")
    p.add_argument("--data", default="../shared/data/scholarly_titles")
    p.add_argument("--split", default="dev")
    p.add_argument("--sources", default="emnlp", help="people the build left out (its --exclude-sources)")
    p.add_argument("--limit", type=int, default=8)
    p.add_argument("--methods", default="base,cluster,card")
    p.add_argument("--judge-model", default=None)
    p.add_argument("--attention-every", type=int, default=6)
    p.add_argument("--seed", type=int, default=0, help="the assignment's tie-breaks")
    p.add_argument("--db", default=None, help="default: a new database in a temporary folder")
    p.add_argument("--json", default=None)
    p.add_argument("--figure", default=None, help="write the results figure (HTML) here")
    a = p.parse_args(argv)
    from personalize.humaneval.campaign_report import format_status
    from personalize.humaneval.campaign_pool import run_judge
    from personalize.humaneval.judge import Judge, JudgeConfig
    from personalize.studio.facade import Studio, StudioConfig

    db = a.db or str(Path(tempfile.mkdtemp(prefix="campaign-study-")) / "studio.db")
    studio = Studio.load(StudioConfig(artifacts=a.artifacts, db=db))
    studio.runtime.campaigns.rng.seed(a.seed)
    name = f"study-{a.limit}"
    timings = {}
    if name not in studio.runtime.campaigns.names():
        studio.campaign_desk.create_campaign(name, a.data, a.split, a.limit, a.methods.split(","), reference=True,
                               raters_per_item=len(RATERS), attention_every=a.attention_every, sources=a.sources)
    t0 = time.perf_counter()
    gen = studio.generate_campaign(name, lambda i, n, w: print(f"  generate {i}/{n}: {w}", flush=True))
    timings["generate_s"] = round(time.perf_counter() - t0, 1)
    print(f"outputs {gen['outputs']} in {timings['generate_s']} s; failed {gen['failed']}")
    t0 = time.perf_counter()
    for rater, rule in RATERS.items():
        rng = random.Random(rater)
        while (unit := studio.campaigns.next(name, rater)) is not None:
            studio.campaigns.submit(unit.id, rater, rule(unit, rng))
    timings["rate_s"] = round(time.perf_counter() - t0, 1)
    t0 = time.perf_counter()
    judge = Judge(JudgeConfig(model=a.judge_model))
    run_judge(studio.runtime.campaigns, name, judge, lambda i, n, w: print(f"  judge {w}", flush=True) if i % 10 == 0 else None)
    timings["judge_s"] = round(time.perf_counter() - t0, 1)
    res = studio.campaigns.results(name)
    print(format_status(res))
    print(f"timings: {timings}")
    if a.figure:
        from personalize.ui.campaigns import results_figure

        results_figure(res).write_html(a.figure, include_plotlyjs="cdn")
    if a.json:
        Path(a.json).write_text(json.dumps({"results": res, "timings": timings, "db": db}, indent=2))
    studio.runtime.store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
