"""People unlike the build's population: ROUGE-L, the share of outputs in the population's prefix form, and paired
intervals, read from `eval --json` files (their per-person predictions), merged on the people they share.

    python -m personalize eval --artifacts B --data G --sources S --methods cluster,card,card_shuffled,... --json a.json
    python -m benchmarks.form_study a.json [b.json ...] [--pairs card-cluster,card-card_shuffled] [--show 3] [--data G]

Prints one table (people, ROUGE-L, the share opening with an upper-case word and a colon ("BUG:", "DOC:") of each method's outputs beside the golds'),
the paired differences with bootstrap 95 % intervals (people resampled) and how many outputs are identical, one row
per source, and, with --show, real people's outputs side by side. With --data (the people's LaMP folder), the share
of each method's outputs that are one of the person's own past outputs word for word (a copy, not a new text).
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict

import numpy as np

from personalize.data import read_lamp
from personalize.metrics import paired_interval, rouge_per_query

PREFIX = re.compile(r"^\s*[A-Z][A-Za-z]*:")  # "BUG:", "DOC:", "MAINT:": the population's form
SKIP = {"id", "user", "source", "gold", "own"}
DEFAULT_PAIRS = ("card-cluster", "card-card_shuffled", "card-card_no_form", "card_reach-card", "card-base",
                 "card-bm25_copy", "card-oppu", "oppu-cluster")


def merged(paths, concat: bool = False) -> list[dict]:
    """One row per person of the first file, with every method of every file that scored them; `concat`: the files
    hold different people of one protocol (one eval split by sources), and every person of every file is a row."""
    rows: dict[str, dict] = {}
    order: list[str] = []
    for n, path in enumerate(paths):
        for p in json.load(open(path))["predictions"]:
            if n == 0 or (concat and p["id"] not in rows):
                rows[p["id"]], _ = dict(p), order.append(p["id"])
            elif p["id"] in rows:
                rows[p["id"]].update({k: v for k, v in p.items() if k not in rows[p["id"]]})
    return [rows[i] for i in order]


def methods_of(rows) -> list[str]:
    names = [k for k in rows[0] if k not in SKIP and not k.endswith(("_gold_logprob", "_candidates", "_setting"))]
    return [m for m in names if all(m in r for r in rows)]


def prefix_share(texts) -> float:
    return float(np.mean([bool(PREFIX.match(t or "")) for t in texts])) if texts else float("nan")


def _norm(text: str | None) -> str:
    return " ".join((text or "").split()).casefold()


def copy_share(rows, method: str, pasts: dict[str, set[str]]) -> float:
    """The share of `method`'s outputs that repeat one of the person's own past outputs (whitespace and case
    aside)."""
    return float(np.mean([_norm(r[method]) in pasts.get(r["id"], set()) for r in rows]))


def copied_share(texts, queries) -> float:
    """The share of texts (one a query) that repeat one of that query's person's past outputs (their profile)."""
    return float(np.mean([_norm(t) in {_norm(it.y) for it in q.profile} for t, q in zip(texts, queries)]))


def near_copy_share(rows, method: str, pasts: dict[str, set[str]], bar: float = 0.8) -> float:
    """The share of `method`'s outputs within ROUGE-L `bar` of one of the person's past outputs (a copy with a word
    or two changed or added counts)."""
    near = []
    for r in rows:
        past = sorted(pasts.get(r["id"], set()))
        near.append(bool(past) and max(rouge_per_query([r[method] or ""] * len(past), past)) >= bar)
    return float(np.mean(near))


def past_outputs(folder: str, split: str = "dev") -> dict[str, set[str]]:
    """Each query's person's past outputs (their profile), normalised as copy_share compares them."""
    return {q.id: {_norm(it.y) for it in q.profile} for q in read_lamp(folder, split)[1]}


def report(rows, pairs, n_boot=1000, pasts: dict[str, set[str]] | None = None) -> str:
    methods = methods_of(rows)
    golds = [r["gold"] for r in rows]
    rl = {m: np.asarray(rouge_per_query([r[m] for r in rows], golds)) for m in methods}
    copies = pasts is not None
    out = [f"{len(rows)} people; golds in the prefix form: {prefix_share(golds):.0%}"
           + (f"; golds that repeat a past output: {copy_share(rows, 'gold', pasts):.0%}, near one: "
              f"{near_copy_share(rows, 'gold', pasts):.0%}" if copies else ""), "",
           "| method | ROUGE-L | prefix form |" + (" a past output copied | near one (ROUGE-L ≥ 0.8) |" if copies else ""),
           "|---|---|---|" + ("---|---|" if copies else "")]
    out += [f"| {m} | {rl[m].mean():.4f} | {prefix_share([r[m] for r in rows]):.0%} |"
            + (f" {copy_share(rows, m, pasts):.0%} | {near_copy_share(rows, m, pasts):.0%} |" if copies else "")
            for m in methods]
    out += ["", "| paired difference | mean | 95 % interval | wins / losses | identical outputs |", "|---|---|---|---|---|"]
    for pair in pairs:
        a, b = pair.split("-", 1)
        if a in rl and b in rl:
            d = paired_interval(rl[a] - rl[b], n_boot)
            same = sum(r[a] == r[b] for r in rows)
            out.append(f"| {a} − {b} | {d['mean']:+.4f} | [{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}] | "
                       f"{d['wins']} / {d['losses']} | {same} |")
    by = defaultdict(list)
    for i, r in enumerate(rows):
        by[r.get("source") or "?"].append(i)
    out += ["", "| source | people | golds' prefix form | " + " | ".join(methods) + " |",
            "|---|---|---|" + "---|" * len(methods)]
    for src, idx in sorted(by.items()):
        out.append(f"| {src} | {len(idx)} | {prefix_share([golds[i] for i in idx]):.0%} | "
                   + " | ".join(f"{rl[m][idx].mean():.3f}" for m in methods) + " |")
    return "\n".join(out)


def side_by_side(rows, n: int, methods) -> str:
    """n people, one per source where it can (the first of each), every method's output beside the gold."""
    seen, chosen = set(), []
    for r in rows:
        if r.get("source") not in seen and len(chosen) < n:
            seen.add(r.get("source")), chosen.append(r)
    out = []
    for r in chosen:
        out += ["", f"**{r['user']}** ({r.get('source')}), their real subject: `{r['gold']}`", "",
                "| method | output |", "|---|---|"]
        out += [f"| {m} | `{(r[m] or '').strip().splitlines()[0] if (r[m] or '').strip() else ''}` |" for m in methods]
    return "\n".join(out)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", help="eval --json files (people matched by query id)")
    p.add_argument("--pairs", default=",".join(DEFAULT_PAIRS), help="a-b differences to report (comma-separated)")
    p.add_argument("--show", type=int, default=0, help="real people's outputs side by side")
    p.add_argument("--data", default=None, help="the people's LaMP folder: the share of outputs copied from their past")
    p.add_argument("--concat", action="store_true", help="the files hold different people: every person is a row")
    p.add_argument("--apart", action="store_true", help="also the clusters of one (eval's `own`) and the others apart")
    a = p.parse_args(argv)
    rows = merged(a.files, a.concat)
    pasts = past_outputs(a.data) if a.data else None
    print(report(rows, a.pairs.split(","), pasts=pasts))
    for own, who in ((True, "clusters of one (their own adapter)"), (False, "the others (their cluster's adapter)")):
        if a.apart and (part := [r for r in rows if r.get("own") is own]):
            print(f"\n## {who}\n\n" + report(part, a.pairs.split(","), pasts=pasts))
    if a.show:
        print(side_by_side(rows, a.show, methods_of(rows)))


if __name__ == "__main__":
    main()
