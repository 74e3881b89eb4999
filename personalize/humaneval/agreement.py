"""Statistics of a human-evaluation campaign (CARD RQ5): can the raters be trusted, and do they agree with the metrics?

Pure functions over plain data. Reliability is Krippendorff's alpha (any number of raters, missing ratings
allowed) next to a per-rater agreement share that points at the odd rater out; position bias checks that the
blind a/b order did not pull votes; rank correlations compare a human ordering of methods with an automatic
one; rubric means carry bootstrap intervals so a small campaign shows its uncertainty. Method strengths from
pairwise votes are Bradley–Terry in `personalize.leaderboard`, not here.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Hashable, Mapping, Sequence

import numpy as np

LEVELS = ("nominal", "ordinal", "interval", "ratio")


def _given(value: Any) -> bool:
    """None and NaN mean "not rated", so an abstention never counts as a value."""
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def krippendorff_alpha(units: Mapping[Hashable, Mapping[str, Any]], level: str = "nominal") -> float | None:
    """Krippendorff's alpha of {unit: {rater: value}}; None where it is undefined: no unit rated by two raters,
    a single value in the whole data (the package raises), or no variation among the pairable values (it gives NaN).

    Nominal values may be any hashables (labels are coded to integers); other levels need numbers."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}")
    raters = sorted({r for ratings in units.values() for r, v in ratings.items() if _given(v)})
    values = {v for ratings in units.values() for v in ratings.values() if _given(v)}
    if level == "nominal":
        codes = {v: float(i) for i, v in enumerate(sorted(values, key=repr))}
    else:
        codes = {v: float(v) for v in values}
    data = np.full((len(raters), len(units)), np.nan)
    row = {r: i for i, r in enumerate(raters)}
    for j, ratings in enumerate(units.values()):
        for r, v in ratings.items():
            if _given(v):
                data[row[r], j] = codes[v]
    try:
        with np.errstate(invalid="ignore", divide="ignore"):
            import krippendorff  # here, not at import: scipy and friends cost ~0.3 s of the app's start

            a = krippendorff.alpha(reliability_data=data, level_of_measurement=level)
    except ValueError:  # "more than one value in the domain" / "a unit with values by at least two coders"
        return None
    return None if math.isnan(a) else float(a)


def rater_agreement(units: Mapping[Hashable, Mapping[str, Any]]) -> dict[str, dict]:
    """Per rater: {"n": units shared with another rater, "agreement": share of that rater's pairwise comparisons
    (other rater, unit) with the same value, None if never compared}. A low share flags a careless rater."""
    out: dict[str, dict] = {}
    for ratings in units.values():
        given = {r: v for r, v in ratings.items() if _given(v)}
        for r, v in given.items():
            stats = out.setdefault(r, {"n": 0, "same": 0, "pairs": 0})
            others = [w for s, w in given.items() if s != r]
            stats["n"] += bool(others)
            stats["same"] += sum(w == v for w in others)
            stats["pairs"] += len(others)
    return {r: {"n": s["n"], "agreement": s["same"] / s["pairs"] if s["pairs"] else None} for r, s in out.items()}


def position_bias(verdicts: Sequence[str], level: float = 0.95) -> dict:
    """Share of decided verdicts for the shown-left answer with a Wilson interval; an unbiased panel is near 0.5.
    Ties and "both bad" say nothing about position and are left out. All None when nothing was decided."""
    a, b = sum(v == "a" for v in verdicts), sum(v == "b" for v in verdicts)
    n = a + b
    if n == 0:
        return {"a_share": None, "n": 0, "lower": None, "upper": None}
    from scipy.stats import binomtest

    ci = binomtest(a, n).proportion_ci(confidence_level=level, method="wilson")
    return {"a_share": a / n, "n": n, "lower": float(ci.low), "upper": float(ci.high)}


def rank_correlation(x: Mapping[str, float], y: Mapping[str, float]) -> dict:
    """Spearman and Kendall (tau-b) between two scorings of the same methods, over their shared keys;
    correlations and p-values are None with fewer than 3 shared keys or a constant side (undefined)."""
    keys = sorted(set(x) & set(y))
    xs, ys = [float(x[k]) for k in keys], [float(y[k]) for k in keys]
    out = {"n": len(keys), "spearman": None, "spearman_p": None, "kendall": None, "kendall_p": None}
    if len(keys) < 3 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return out
    from scipy.stats import kendalltau, spearmanr

    rho, kt = spearmanr(xs, ys), kendalltau(xs, ys)
    out.update(spearman=float(rho.statistic), spearman_p=float(rho.pvalue),
               kendall=float(kt.statistic), kendall_p=float(kt.pvalue))
    return out


def rubric_means(rows: Sequence[Mapping], criteria: Sequence[str], n_boot: int = 1000, seed: int = 0,
                 level: float = 0.95) -> list[dict]:
    """Per method: mean of each rubric criterion with a percentile bootstrap interval over that method's rows
    (rows resampled whole, so criteria stay paired), and "mean" of the criterion means; best first."""
    by_method: dict[str, list[list[float]]] = {}
    for r in rows:
        by_method.setdefault(r["method"], []).append([float(r[c]) for c in criteria])
    rng = np.random.default_rng(seed)
    tail = (1 - level) / 2 * 100
    table = []
    for method in sorted(by_method):
        scores = np.array(by_method[method])
        means = scores.mean(axis=0)
        boots = scores[rng.integers(0, len(scores), (n_boot, len(scores)))].mean(axis=1)
        lower, upper = np.percentile(boots, tail, axis=0), np.percentile(boots, 100 - tail, axis=0)
        entry: dict[str, Any] = {"method": method, "n": len(scores)}
        for i, c in enumerate(criteria):
            entry.update({c: float(means[i]), f"{c}_lower": float(lower[i]), f"{c}_upper": float(upper[i])})
        entry["mean"] = float(means.mean())
        table.append(entry)
    table.sort(key=lambda e: -e["mean"])
    return table


def majority(values: Sequence[Any]) -> Any | None:
    """The most common value; None when empty or when two values tie for first (no majority to report)."""
    top = Counter(values).most_common(2)
    if not top or (len(top) == 2 and top[0][1] == top[1][1]):
        return None
    return top[0][0]
