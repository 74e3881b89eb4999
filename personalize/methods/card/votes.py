"""Votes refine a person's style: a decided preference is one more piece of their writing.

A vote on a person's outputs (a Rate vote on their pair, a thumbs up / down on a
Compare column) says which text is more like them. The preferred text becomes one
more target of the person's own objective, like an item of their history:

- tokens head: its tokens ranked among the cluster model's candidates (the same
  conditional-logit rows as the history), weighted by `vote_weight` against one
  history row; a thumbs down's text adds rows whose token the fit pushes down
  (unlikelihood, Welleck et al. 2020) instead;
- pair heads: a pair, the preferred text against the other one (a Rate vote), or
  against the cluster model's own greedy output (a thumbs up; the build's implicit
  pairs are made the same way), or that output against the rejected text (down).

λ and the token bias are refitted on history + votes (P and U frozen: an LBFGS of
milliseconds after one teacher-forced pass over the new text); the kNN memory stays
the history's, the person's own words. Whether the refined style helps is judged as at
onboarding: fitted without the held-out history items, scored on them.

`simulate` measures the loop on LaMP people: a simulated person prefers, of two CARD
samples, the one closer to their held-out text (`python -m personalize simulate-feedback`).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np
import torch

from personalize.methods.card import card_decode, onboard
from personalize.methods.card.adapters import adapter_name
from personalize.data import Item
from personalize.serving.settings import DecodingSettings
from personalize.methods.engine import Engine
from personalize.methods.card.onboard import UserFit
from personalize.methods.card.head import PairData, TokenData, fit_user
from personalize.metrics import paired_interval, rouge_per_query
from personalize.methods.card.style import UserStyle, style_diagnostics


@dataclass(frozen=True)
class FeedbackSettings:
    """How much votes count against the history."""

    vote_weight: float = 2.0  # a vote's token row (or pair) counts this many history rows
    # tokens head, a vote between two texts (Rate): the other text's rows pushed down with this weight (0: the
    # preferred text alone is used; > 0: tokens the two texts share roughly cancel, their differences count)
    rejected_weight: float = 0.0
    max_votes: int = 200  # the newest votes used in a refit

    def __post_init__(self):
        if not self.vote_weight > 0 or self.rejected_weight < 0 or self.max_votes < 1:
            raise ValueError("vote_weight must be > 0, rejected_weight >= 0 and max_votes >= 1")


@dataclass(frozen=True)
class Vote:
    """One decided preference: `preferred` (None for a thumbs down) over `other` (None for a thumbs up)."""

    prompt: str
    preferred: str | None
    other: str | None = None
    id: int | None = None  # the store's feedback row, when stored

    def __post_init__(self):
        if not (self.preferred or "").strip() and not (self.other or "").strip():
            raise ValueError("a vote needs the text it was about")

    @classmethod
    def from_row(cls, row: dict) -> "Vote":
        return cls(row["prompt"], row["preferred"], row["other"], row["id"])


@dataclass
class Refinement:
    """A refit of one person's style on history + votes."""

    style: UserStyle
    diagnostics: dict
    curve: list[float]
    n_votes: int
    seconds: float


class VoteFeatures:
    """Teacher-forced features of vote texts under the adapter a style is fitted over (a cluster's, or a cluster of
    one's own), computed once per (text, adapter)."""

    def __init__(self, engine: Engine, max_entries: int = 4096):
        self.engine, self.max_entries = engine, max_entries
        self._cache: dict[tuple, object] = {}

    def get(self, adapter: str, pairs: Sequence[tuple[str, str]]) -> list:
        key = lambda p: (self.engine.artifacts_id, adapter, p)  # noqa: E731
        todo = list(dict.fromkeys(p for p in pairs if key(p) not in self._cache))
        if todo:
            self.engine.use_adapter(adapter)
            for p, f in zip(todo, onboard.features(self.engine, [Item(y=y, x=x) for x, y in todo])):
                self._cache[key(p)] = f
            while len(self._cache) > self.max_entries:
                self._cache.pop(next(iter(self._cache)))
        return [self._cache[key(p)] for p in pairs]

    def clear(self) -> None:
        self._cache.clear()


def vote_rows(feats: VoteFeatures, votes: Sequence[Vote], adapter: str, weight: float,
              rejected_weight: float = 0.0) -> TokenData:
    """The tokens head's rows of the votes: preferred texts raised, thumbs-down texts lowered, and with
    `rejected_weight` the other text of a two-text vote lowered too."""
    texts, weights = [], []
    for v in votes:
        if v.preferred:
            texts.append((v.prompt, v.preferred)), weights.append(weight)
            if v.other and rejected_weight:
                texts.append((v.prompt, v.other)), weights.append(-rejected_weight)
        else:
            texts.append((v.prompt, v.other)), weights.append(-weight)
    parts = [TokenData.from_features([f], weight=w) for f, w in zip(feats.get(adapter, texts), weights)]
    return TokenData.cat(parts)


def refine_tokens(engine: Engine, history, n_hold: int, votes: Sequence[Vote], adapter: str,
                  feats: VoteFeatures, s: FeedbackSettings = FeedbackSettings(), far: bool = False) -> Refinement:
    """The tokens head's style refitted on the history's features (one pass, kept from the fit) and the votes, both
    under `adapter`, the one the style is fitted over; `far`: the person's fit found them beyond the build's
    clusters (their memory at its own weight)."""
    t0 = time.perf_counter()
    votes = list(votes)[-s.max_votes:]
    head = engine.heads["tokens"]
    rows = vote_rows(feats, votes, adapter, s.vote_weight, s.rejected_weight)
    engine.use_adapter(adapter)
    diag, _, _ = onboard.held_out_style(engine, history, n_hold, head, rows, far=far)
    style, curve = onboard.fit_style(engine, history, head, rows, far=far)
    style.helps = True if votes else diag.get("helps")  # the person asked for their style: no fallback
    return Refinement(style, diag, curve, len(votes), time.perf_counter() - t0)


def refine_pairs(engine: Engine, objective: str, history: PairData, n_items: int, n_hold: int,
                 votes: Sequence[Vote], k: int, cluster: int, feats: VoteFeatures,
                 s: FeedbackSettings = FeedbackSettings(), adapter: str | None = None) -> Refinement:
    """A pair head's λ refitted on the history's pairs and one pair per vote, under `adapter` (the one the style is
    fitted over; None: the cluster's); a vote without a second text is paired with the cluster model's output."""
    t0 = time.perf_counter()
    votes = list(votes)[-s.max_votes:]
    adapter = adapter or adapter_name(k, cluster)
    missing = [v.prompt for v in votes if not (v.preferred and v.other)]
    greedy = dict(zip(missing, card_decode.generate(engine, missing, "cluster", cluster, k=k))) if missing else {}
    pairs = [(v.preferred or greedy[v.prompt].text, v.other or greedy[v.prompt].text) for v in votes]
    chosen = feats.get(adapter, [(v.prompt, a) for v, a in zip(votes, (p[0] for p in pairs))])
    rejected = feats.get(adapter, [(v.prompt, b) for v, b in zip(votes, (p[1] for p in pairs))])
    data = history.with_votes(chosen, rejected, s.vote_weight)
    diag = onboard.held_out_pairs(engine, objective, data, n_hold, n_items)
    lam, curve = fit_user(engine.heads[objective], data, engine.cfg.head)
    style = UserStyle.of(lam.numpy().astype(np.float32))
    style.helps = True if votes else diag.get("helps")
    return Refinement(style, diag, curve, len(votes), time.perf_counter() - t0)


# ---------------------------------------------------------------- the simulation (docs/RESULTS.md)

@dataclass(frozen=True)
class SimulationSettings:
    checkpoints: tuple[int, ...] = (0, 5, 10, 20)  # votes after which the person's held-out texts are scored
    n_eval: int = 4  # held-out items scored (the query and the newest profile items)
    n_vote: int = 10  # further held-out items whose prompts the simulated person votes on
    temperature: float = 1.0  # CARD samples shown for a vote
    preference: str = "closer"  # "closer": the sample nearer (ROUGE-L) the person's text; "random": a coin
    seed: int = 0

    def __post_init__(self):
        if sorted(self.checkpoints) != list(self.checkpoints) or self.checkpoints[0] != 0:
            raise ValueError("checkpoints must rise from 0")
        if self.n_eval < 1 or self.n_vote < 1 or self.temperature <= 0:
            raise ValueError("n_eval, n_vote >= 1 and temperature > 0")
        if self.preference not in ("closer", "random"):
            raise ValueError("preference must be 'closer' or 'random'")


def split_person(items: Sequence[Item], query_prompt: str, gold: str, s: SimulationSettings):
    """(eval items, vote items, history): the query and the newest items are held out, the rest is history."""
    held = [Item(y=gold, x=query_prompt), *items]
    return held[: s.n_eval], held[s.n_eval: s.n_eval + s.n_vote], list(held[s.n_eval + s.n_vote:])


def simulate_person(engine: Engine, items: Sequence[Item], query_prompt: str, gold: str, s: SimulationSettings,
                    fs: FeedbackSettings, decoding: DecodingSettings, feats: VoteFeatures) -> dict:
    """One person's curve: at every checkpoint, ROUGE-L of greedy CARD on the eval and the vote prompts and the
    head's teacher-forced diagnostics on the eval texts."""
    rng = random.Random(s.seed)
    evals, pool, history = split_person(items, query_prompt, gold, s)
    fit: UserFit = onboard.fit(engine, history)
    if fit.cold_start or fit.features is None:
        raise ValueError("too few history items to fit a style")
    k, cluster, style = fit.k, fit.cluster, fit.style
    head = engine.heads["tokens"]
    engine.use_adapter(adapter_name(k, cluster))
    eval_rows = TokenData.from_features(onboard.features(engine, evals))
    votes: list[Vote] = []
    points, ties = [], 0
    sample = replace(decoding, do_sample=True, temperature=s.temperature)
    torch.manual_seed(s.seed)
    for target in s.checkpoints:
        attempts = 0
        while len(votes) < target and attempts < 4 * target:
            need = target - len(votes)
            batch = [pool[(len(votes) + j) % len(pool)] for j in range(need)]
            outs = card_decode.generate(engine, [b.x for b in batch] * 2, "card", cluster, style, k=k, settings=sample)
            for j, it in enumerate(batch):
                a, b = outs[j].text, outs[j + len(batch)].text
                attempts += 1
                if a.strip() == b.strip():
                    ties += 1  # nothing to choose between: no vote
                    continue
                if s.preference == "random":
                    win = rng.random() < 0.5
                else:
                    ra, rb = rouge_per_query([a, b], [it.y, it.y])
                    if ra == rb:
                        ties += 1
                        continue
                    win = ra > rb
                votes.append(Vote(it.x, a if win else b, b if win else a))
            style = refine_tokens(engine, fit.features, fit.n_hold, votes, adapter_name(k, cluster), feats, fs,
                                  far=fit.far).style
        engine.use_adapter(adapter_name(k, cluster))
        diag = style_diagnostics(head, eval_rows, style, [], engine.cfg.style, 1.0)
        scored = {}
        for name, group in (("eval", evals), ("voted", pool)):
            gens = card_decode.generate(engine, [it.x for it in group], "card", cluster, style, k=k, settings=decoding)
            scored[name] = float(np.mean(rouge_per_query([g.text for g in gens], [it.y for it in group])))
        points.append({"votes": len(votes), "rougeL_eval": scored["eval"], "rougeL_voted": scored["voted"],
                       "acc_eval": diag.get("acc_own"), "logp_eval": diag.get("margin_own"),
                       "acc_no_head": diag.get("acc_no_head")})
    return {"cluster": cluster, "k": k, "n_history": len(history), "points": points, "ties": ties}


def simulate(engine: Engine, people: Sequence[tuple[str, Sequence[Item], str, str]], s: SimulationSettings,
             fs: FeedbackSettings = FeedbackSettings(), decoding: DecodingSettings | None = None,
             progress: Callable[[int, int, str], None] | None = None) -> dict:
    """`people`: (name, profile items with prompts, query prompt, gold). Returns per-person curves, the mean
    curve and paired bootstrap intervals of each checkpoint against 0 votes."""
    if "tokens" not in engine.heads:
        raise ValueError("the feedback simulation needs a tokens head in the artifacts")
    decoding = decoding or engine.cfg.decoding
    feats = VoteFeatures(engine)
    rows, skipped = [], []
    for i, (name, items, prompt, gold) in enumerate(people):
        try:
            rows.append({"user": name, **simulate_person(engine, items, prompt, gold, s, fs, decoding, feats)})
        except ValueError as e:
            skipped.append({"user": name, "why": str(e)})
        feats.clear()
        if progress:
            progress(i + 1, len(people), name)
    if not rows:
        raise ValueError("no person could be simulated (each needs n_eval + n_vote held-out items and a history)")
    curve, diffs = [], {}
    for j, c in enumerate(s.checkpoints):
        pts = [r["points"][j] for r in rows]
        curve.append({"votes": c, "n": len(pts), **{key: _mean([p[key] for p in pts])
                                                    for key in ("rougeL_eval", "rougeL_voted", "acc_eval", "logp_eval")},
                      "votes_reached": round(float(np.mean([p["votes"] for p in pts])), 2)})
        if c:
            for key in ("rougeL_eval", "rougeL_voted", "logp_eval"):
                pairs = [(r["points"][j][key], r["points"][0][key]) for r in rows]
                d = [a - b for a, b in pairs if a is not None and b is not None]  # None: no held-out token scored
                if d:
                    diffs[f"{key} @{c} - @0"] = paired_interval(np.asarray(d), seed=s.seed)
    return {"curve": curve, "differences": diffs, "people": rows, "skipped": skipped}


def _mean(values) -> float | None:
    kept = [v for v in values if v is not None]
    return round(float(np.mean(kept)), 4) if kept else None
