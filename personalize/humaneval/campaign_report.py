"""A campaign's results (METHOD §6): strengths or rubric means with intervals (pairwise: also without the pairs where
an output repeats the person's past text, and how many votes went to such a copy), the reference's place, agreement
(Krippendorff's α, position bias, each rater against the others), the attention checks and the LLM judge, from the
judgments of a campaign.Campaigns; and the status as text for a terminal.
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

from personalize.humaneval import agreement
from personalize.humaneval.campaign_schema import CRITERIA, REFERENCE, CampaignConfig, canonical_label
from personalize.humaneval.bradley_terry import LeaderboardConfig, leaderboard
from personalize.humaneval.copies import copy_summary, mark_copies, without_copies


def results(camps, name: str, cfg: LeaderboardConfig = LeaderboardConfig()) -> dict:
    """The study's figures (the module's first line) for the campaign `name`."""
    c = camps.get(name)
    conf: CampaignConfig = c["config"]
    rows = camps.judgments(name)
    main = [r for r in rows if not r["attention"]]
    checks = [r for r in rows if r["attention"]]
    judge_rows = camps.judgments(name, judge=True)
    res = {"name": c["name"], "status": c["status"], "mode": conf.mode, "arms": list(conf.arms),
           "items": len(camps.items(name)), "outputs": camps.outputs(name), "judgments": len(main),
           "raters": len({r["rater"] for r in main}), "attention": _attention(checks, conf.mode),
           "min_raters_per_unit": conf.min_raters_per_unit}
    shared = lambda units: sum(len(v) >= 2 for v in units.values())  # noqa: E731  α's units: two raters judged them
    if conf.mode == "pairwise":
        history = {it["position"]: it["history"] for it in camps.items(name)}  # the person's past texts, per item
        marked = mark_copies(main, lambda r: history.get(r["item"], ()))  # votes on an old text handed back
        human = _strengths(main, cfg)
        res["copies"] = copy_summary(marked, winner="verdict")  # verdict: a/b as the rater saw them
        res["leaderboard_without_copies"] = _strengths(without_copies(marked), cfg)["methods"]
        units = {}
        for r in main:
            units.setdefault((r["first"], r["second"], r["item"]), {})[r["rater"]] = canonical_label(r)
        res["agreement"] = {"krippendorff_alpha": agreement.krippendorff_alpha(units, "nominal"),
                            "position_bias": agreement.position_bias([r["verdict"] for r in main]),
                            "raters": agreement.rater_agreement(units), "shared_units": shared(units)}
        res["leaderboard"] = human["methods"]
        judge_scores = _judge_wins(judge_rows) or {
            m["method"]: m["strength"] for m in _strengths(judge_rows, cfg)["methods"]}
        human_scores = {m["method"]: m["strength"] for m in human["methods"]}
    else:
        scored = [{"method": r["method_a"], **r["scores"]} for r in main if r["scores"]]
        res["leaderboard"] = agreement.rubric_means(scored, CRITERIA, seed=cfg.seed)
        per = {crit: {} for crit in CRITERIA}
        for r in main:
            for crit in CRITERIA:
                per[crit].setdefault((r["first"], r["item"]), {})[r["rater"]] = r["scores"][crit]
        res["agreement"] = {"krippendorff_alpha": {k: agreement.krippendorff_alpha(u, "interval")
                                                   for k, u in per.items()},
                            "position_bias": None,
                            "raters": agreement.rater_agreement(per["style"]), "shared_units": shared(per["style"])}
        judge_scores = {m["method"]: m["mean"] for m in agreement.rubric_means(
            [{"method": r["method_a"], **r["scores"]} for r in judge_rows if r["scores"]], CRITERIA, n_boot=1)}
        human_scores = {m["method"]: m["mean"] for m in res["leaderboard"]}
    ranked = [m["method"] for m in res["leaderboard"]]
    res["reference"] = ({"rank": ranked.index(REFERENCE) + 1, "of": len(ranked)}
                        if REFERENCE in ranked else None)
    res["judge"] = None if not judge_rows else {
        "model": judge_rows[0]["rater"], "judgments": len(judge_rows), "scores": judge_scores,
        "verdicts": dict(Counter(r["verdict"] for r in judge_rows if r["verdict"])),
        "rank_correlation": agreement.rank_correlation(human_scores, judge_scores)}
    return res


def _strengths(rows: Sequence[dict], cfg: LeaderboardConfig) -> dict:
    """Bradley–Terry over the judgments in canonical order (first vs second arm, the winner unswapped)."""
    return leaderboard([{"method_a": r["first"], "method_b": r["second"], "winner": r["winner"]}
                        for r in rows if r["winner"]], cfg)


def _judge_wins(rows: Sequence[dict]) -> dict[str, float]:
    """Each arm's mean probability of winning by the judge (its p_a, not its thresholded verdict): a weak judge
    whose verdicts are mostly ties still ranks the arms. Empty when the judge kept no probabilities."""
    wins: dict[str, list[float]] = {}
    for r in rows:
        p = (r["scores"] or {}).get("p_a")
        if p is None:
            return {}
        wins.setdefault(r["first"], []).append(p)
        wins.setdefault(r["second"], []).append(1 - p)
    return {m: round(sum(v) / len(v), 4) for m, v in wins.items()}


def _attention(rows: Sequence[dict], mode: str) -> dict:
    """Pass rate of the attention checks, overall and per rater (the reference preferred to the degenerate
    output; in rubric mode the degenerate output scored 2 or less on average)."""
    def passed(r):
        if mode == "pairwise":
            return canonical_label(r) == REFERENCE
        return sum(r["scores"].values()) / len(r["scores"]) <= 2
    per: dict[str, list[bool]] = {}
    for r in rows:
        per.setdefault(r["rater"], []).append(passed(r))
    every = [p for v in per.values() for p in v]
    return {"checks": len(every), "pass_rate": (sum(every) / len(every)) if every else None,
            "raters": {k: round(sum(v) / len(v), 3) for k, v in per.items()}}


def overlap_text(res: dict) -> str:
    """How many units agreement is computed over: "agreement needs 2 raters on a unit: N units have them"."""
    n, m = res["agreement"].get("shared_units", 0), res.get("min_raters_per_unit") or 1
    return (f"agreement needs 2 raters on a unit: {n} unit{'' if n == 1 else 's'} {'has' if n == 1 else 'have'} "
            f"them (a started unit goes to {m} rater{'' if m == 1 else 's'} before new ones open)")


def copies_text(res: dict) -> str:
    """"2 of 30 judged pairs hold an output that repeats the person's past text; 1 vote went to such a copy"."""
    c = res["copies"]
    return (f"{c['with_a_copy']} of {c['pairs']} judged pairs hold an output that repeats the person's past text; "
            f"{c['won_by_a_copy']} vote{'' if c['won_by_a_copy'] == 1 else 's'} went to such a copy. Without "
            "those pairs:")


def format_status(res: dict) -> str:
    """`campaign status` for a terminal: progress, the leaderboard, agreement, attention, the judge."""
    def num(v, fmt="{:.3f}"):
        return "—" if v is None else fmt.format(v)
    ag = res["agreement"]
    lines = [f"campaign {res['name']} ({res['status']}, {res['mode']}): {res['items']} items, arms "
             f"{', '.join(res['arms'])}",
             f"outputs {res['outputs']['done']}/{res['outputs']['total']}; {res['judgments']} judgments by "
             f"{res['raters']} rater(s)"]
    if res["mode"] == "pairwise":
        lines.append("Bradley–Terry strength (Elo scale, 95% bootstrap interval):")
        lines += [f"  {m['method']:>10}  {m['strength']:7.1f}  [{m['lower']:.1f}, {m['upper']:.1f}]  {m['votes']} votes"
                  for m in res["leaderboard"]]
        lines.append(copies_text(res))
        lines += [f"  {m['method']:>10}  {m['strength']:7.1f}  [{m['lower']:.1f}, {m['upper']:.1f}]  {m['votes']} votes"
                  for m in res["leaderboard_without_copies"]]
        pb = ag["position_bias"]
        lines.append(f"Krippendorff's α (nominal): {num(ag['krippendorff_alpha'])}; position bias: A won "
                     f"{num(pb['a_share'], '{:.0%}')} of {pb['n']} decided [{num(pb['lower'], '{:.0%}')}, "
                     f"{num(pb['upper'], '{:.0%}')}]")
    else:
        lines.append("Mean rubric scores (1–5, 95% bootstrap interval):")
        lines += [f"  {m['method']:>10}  " + "  ".join(f"{c} {m[c]:.2f} [{m[c + '_lower']:.2f}, {m[c + '_upper']:.2f}]"
                                                     for c in CRITERIA) for m in res["leaderboard"]]
        lines.append("Krippendorff's α (interval): " + ", ".join(f"{k} {num(v)}"
                                                               for k, v in ag["krippendorff_alpha"].items()))
    lines.append(f"  {overlap_text(res)}")
    if res["reference"]:
        lines.append(f"the reference ranks {res['reference']['rank']} of {res['reference']['of']}")
    lines += [f"  rater {r}: agrees with the others on {num(v['agreement'], '{:.0%}')} of {v['n']} shared units"
              for r, v in ag["raters"].items()]
    att = res["attention"]
    if att["checks"]:
        lines.append(f"attention checks: {att['checks']}, passed {num(att['pass_rate'], '{:.0%}')}")
    if res["judge"]:
        rc = res["judge"]["rank_correlation"]
        lines.append(f"LLM judge {res['judge']['model']}: {res['judge']['judgments']} judgments "
                     f"({', '.join(f'{k} {v}' for k, v in sorted(res['judge']['verdicts'].items()))}); rank correlation "
                     f"with the raters: Spearman {num(rc['spearman'])}, Kendall {num(rc['kendall'])} (n = {rc['n']})")
    return "\n".join(lines)
