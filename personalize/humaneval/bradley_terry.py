"""Human-eval leaderboard (METHOD §6): Bradley–Terry strengths with bootstrap intervals, and win rates.

The Chatbot Arena recipe: every blind vote is a battle between two methods; a
logistic regression without intercept on ±1 design rows gives log-strengths
β, shown on the Elo scale (1000 + 400·log10 e·β); a tie or "both bad" counts as
half a win for each side (one row each way). Intervals are percentiles over
bootstrap resamples of the votes, so a method seen in few votes gets a wide one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

ELO_SCALE, ELO_INIT = 400.0 / math.log(10), 1000.0


@dataclass(frozen=True)
class LeaderboardConfig:
    rounds: int = 200  # bootstrap resamples
    c: float = 10.0  # inverse L2 strength: keeps a method that never lost finite
    level: float = 0.95
    seed: int = 0

    def __post_init__(self):
        if self.rounds < 1 or self.c <= 0 or not 0 < self.level < 1:
            raise ValueError("rounds >= 1, c > 0 and level in (0, 1)")


def battles(ratings: Sequence[dict]) -> list[tuple[str, str, float]]:
    """(method a, method b, score of a): 1 a won, 0 b won, 0.5 tie or both bad; same-method votes dropped."""
    score = {"a": 1.0, "b": 0.0, "tie": 0.5, "both_bad": 0.5}
    return [(r["method_a"], r["method_b"], score[r["winner"]]) for r in ratings if r["method_a"] != r["method_b"]]


def bradley_terry(rows: Sequence[tuple[str, str, float]], methods: Sequence[str], c: float = 10.0) -> np.ndarray:
    """Log-strengths β (mean 0) of `methods` from battles; a half win adds one row each way."""
    index = {m: i for i, m in enumerate(methods)}
    x, y, w = [], [], []
    for a, b, s in rows:
        v = np.zeros(len(methods))
        v[index[a]], v[index[b]] = 1.0, -1.0
        for label, weight in ((1, s), (0, 1.0 - s)):
            if weight > 0:
                x.append(v)
                y.append(label)
                w.append(weight)
    if len(set(y)) < 2:  # one-sided votes: mirror a zero-weight row so the solver sees both classes
        x.append(-x[0])
        y.append(1 - y[0])
        w.append(1e-9)
    from sklearn.linear_model import LogisticRegression  # on first use: sklearn costs ~0.6 s of a start

    lr = LogisticRegression(fit_intercept=False, C=c, tol=1e-8, max_iter=1000)
    lr.fit(np.array(x), np.array(y), sample_weight=np.array(w))
    beta = lr.coef_[0]
    return beta - beta.mean()


def leaderboard(ratings: Sequence[dict], cfg: LeaderboardConfig = LeaderboardConfig()) -> dict:
    """{"methods": [{"method", "strength", "lower", "upper", "votes", "wins", "losses", "ties"}] best first,
    "win_rate": {a: {b: share of a's points against b}}, "n_votes"}."""
    rows = battles(ratings)
    if not rows:
        return {"methods": [], "win_rate": {}, "n_votes": 0}
    methods = sorted({m for a, b, _ in rows for m in (a, b)})
    elo = lambda beta: ELO_INIT + ELO_SCALE * beta  # noqa: E731
    point = elo(bradley_terry(rows, methods, cfg.c))
    rng = np.random.default_rng(cfg.seed)
    boots = np.array([elo(bradley_terry([rows[i] for i in rng.integers(0, len(rows), len(rows))], methods, cfg.c))
                      for _ in range(cfg.rounds)])
    tail = (1 - cfg.level) / 2 * 100
    lower, upper = np.percentile(boots, tail, axis=0), np.percentile(boots, 100 - tail, axis=0)
    table = []
    for i, m in enumerate(methods):
        mine = [(s if a == m else 1 - s) for a, b, s in rows if m in (a, b)]
        table.append({"method": m, "strength": round(float(point[i]), 1), "lower": round(float(lower[i]), 1),
                      "upper": round(float(upper[i]), 1), "votes": len(mine), "wins": sum(s == 1 for s in mine),
                      "losses": sum(s == 0 for s in mine), "ties": sum(s == 0.5 for s in mine)})
    table.sort(key=lambda r: -r["strength"])
    return {"methods": table, "win_rate": win_rates(rows, methods), "n_votes": len(rows)}


def win_rates(rows: Sequence[tuple[str, str, float]], methods: Sequence[str]) -> dict[str, dict[str, float | None]]:
    """Observed share of points of the row method against the column method (ties half); None if never met."""
    points = {a: {b: [0.0, 0] for b in methods} for a in methods}
    for a, b, s in rows:
        points[a][b][0] += s
        points[a][b][1] += 1
        points[b][a][0] += 1 - s
        points[b][a][1] += 1
    return {a: {b: (round(p / n, 3) if n else None) for b, (p, n) in cols.items()} for a, cols in points.items()}
