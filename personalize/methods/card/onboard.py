"""CARD's onboarding (METHOD §1.4, §1.6): a person's cluster, then their style (λ, token bias, kNN memory, form)
fitted on one teacher-forced pass under their cluster's adapter (or their own, own.py), with held-out diagnostics.
Functions over a loaded `Engine`: the engine holds the build, this module what CARD does with it for one person.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from personalize.data import Item
from personalize.lm.features import generate_with_states, teacher_forced
from personalize.methods.card.adapters import adapter_name
from personalize.methods.card.cluster import closeness
from personalize.methods.card.head import PairData, PersonalizationHead, TokenData, diagnostics, fit_user
from personalize.methods.card.style import UserStyle, fit_form, fit_lambda_bias, memory_from_features, style_diagnostics
from personalize.methods.engine import Engine


class HoldOrder(list):
    """A person's items in the order a fit reads them, of which only the first `holdable` may be held out to judge
    it (person.held_out_order: the others' prompts give their answers away); a plain list holds all out."""

    holdable: int = 0

    @classmethod
    def of(cls, items: Sequence[Item], holdable: int) -> "HoldOrder":
        out = cls(items)
        out.holdable = holdable
        return out


def holdable(items: Sequence[Item]) -> int:
    return items.holdable if isinstance(items, HoldOrder) else len(items)


@dataclass
class UserFit:
    """What a fit produced for one user, and what it cost."""

    cluster: int
    distances: list[float]
    k: int
    lam: np.ndarray
    objective: str
    n_items: int
    stages_s: dict[str, float] = field(default_factory=dict)
    diagnostics: dict = field(default_factory=dict)
    loss_curve: list[float] = field(default_factory=list)
    cold_start: bool = False
    style: UserStyle | None = None  # λ with the person's token bias and memory (None: λ alone)
    # the tokens head's held-out items and the style fitted without them (eval's teacher-forced specificity)
    held: TokenData | None = field(default=None, repr=False)
    held_style: UserStyle | None = field(default=None, repr=False)
    # the tokens head's one teacher-forced pass over every item (votes refit λ without redoing it) and n held out
    features: list | None = field(default=None, repr=False)
    n_hold: int = 0
    far: bool = False  # further from every cluster than the build's people (StyleSettings.far_share)

    @property
    def total_s(self) -> float:
        return sum(self.stages_s.values())

    def stats(self) -> dict:
        return {"cluster": self.cluster, "k": self.k, "objective": self.objective, "n_items": self.n_items,
                "stages_s": self.stages_s, "diagnostics": self.diagnostics, "loss_curve": self.loss_curve,
                "cold_start": self.cold_start, "far": self.far,
                "own_adapter": bool(self.style is not None and self.style.own)}


def draw_negatives(engine: Engine, items: Sequence[Item], objective: str) -> list[tuple[int, object]]:
    """(item index, y− features) under the active cluster model: its greedy output for every item and,
    for "hard_pairs", `n_samples` sampled outputs per item too (seeded, so a refit gives the same λ)."""
    hs, prompts = engine.cfg.head, [it.x for it in items]

    def draw(**sampling):
        return generate_with_states(engine.model, engine.tok, prompts, hs.n_layers, engine.cfg.budget,
                                    max_new_tokens=engine.cfg.budget.max_target_tokens, **sampling)

    negs = list(enumerate(draw()))
    if objective == "hard_pairs" and hs.n_samples:
        torch.manual_seed(hs.seed)
        for _ in range(hs.n_samples):
            negs += list(enumerate(draw(sample=True, top_k=hs.top_k, temperature=hs.temperature)))
    return negs


def user_data(engine: Engine, items: Sequence[Item], objective: str, negatives=None):
    """The head's training signal for these items under the active cluster model."""
    if objective == "tokens":
        return TokenData.from_features(features(engine, items))
    chosen = teacher_forced(engine.model, engine.tok, [(it.x, it.y) for it in items], engine.cfg.head.n_layers,
                            engine.cfg.budget)
    if negatives is None:
        negatives = draw_negatives(engine, items, objective)
    return PairData([chosen[i] for i, _ in negatives], [f for _, f in negatives], [i for i, _ in negatives],
                    covariate=objective == "hard_pairs")


def fit(engine: Engine, items: Sequence[Item], k: int | None = None, objective: str | None = None,
        progress=None, kept_pass: Callable[[int, int, Sequence[Item]], list | None] | None = None,
        own: str | None = None) -> UserFit:
    """Onboard a user from their items: cluster, then λ (with held-out diagnostics). `kept_pass(k, cluster,
    items)`: the teacher-forced pass over these items under that cluster's model when one was made already
    (the studio reads ahead after Save), else None; the pass is most of a fit's time. `own`: the key of the
    person's own adapter (a cluster of one, own.py): the style is fitted over it instead of the cluster's."""
    k = k or engine.cfg.default_k
    objective = objective or engine.cfg.objectives[0]
    if objective not in engine.heads:
        raise ValueError(f"no {objective!r} head in these artifacts; built: {sorted(engine.heads)}")
    head, stages = engine.heads[objective], {}

    def stage(name, fn):
        if progress:
            progress(name)
        t0 = time.perf_counter()
        out = fn()
        stages[name] = round(time.perf_counter() - t0, 4)
        return out

    items = list(items)
    cluster, distances = stage("assign", lambda: engine.assign(engine.embed(items), k))
    if any(not it.x for it in items):
        items = stage("neutral rewrites", lambda: engine.prepare_items(items))
    ones = np.ones(head.d, dtype=np.float32)
    if len(items) < engine.cfg.min_fit_items:
        return UserFit(cluster, distances, k, ones, objective, len(items), stages, cold_start=True)
    base = engine.own.activate(own) if own else None
    engine.use_adapter(base or adapter_name(k, cluster))
    n_hold = n_held_out(engine, items)
    if objective == "tokens":  # one pass (or the one kept), then λ + bias + memory, judged under the decoding rule
        feats = kept_pass(k, cluster, items) if kept_pass is not None and base is None else None
        if feats is None:
            feats = stage("features", lambda: features(engine, items))
        else:
            stages["features (made already)"] = 0.0
        far = is_far(engine, k, distances)
        diag, held_style, held = held_out_style(engine, feats, n_hold, head, far=far)
        style, curve = stage("fit", lambda: fit_style(engine, feats, head, far=far))
        style.helps, style.own = diag.get("helps"), own if base else None
        return UserFit(cluster, distances, k, style.lam, "tokens", len(items), stages, diag, curve, style=style,
                       held=held, held_style=held_style, features=feats, n_hold=n_hold, far=far)
    negs = stage("negatives", lambda: draw_negatives(engine, items, objective))  # a pair head (config.OBJECTIVES)
    data = stage("features", lambda: user_data(engine, items, objective, negatives=negs))
    diag = held_out_pairs(engine, objective, data, n_hold, len(items))
    lam, curve = stage("fit", lambda: fit_user(head, data, engine.cfg.head))
    lam = lam.numpy().astype(np.float32)
    return UserFit(cluster, distances, k, lam, objective, len(items), stages, diag, curve, style=UserStyle.of(lam))


def n_held_out(engine: Engine, items: Sequence[Item]) -> int:
    """Items held out of a fit to judge it (the first ones: the newest, in LaMP order), of those that may be (a
    HoldOrder's)."""
    return min(int(round(engine.cfg.holdout * len(items))) if len(items) >= 5 else 0, holdable(items))


def features(engine: Engine, items: Sequence[Item]):
    """One teacher-forced pass over the person's texts under the active model (states, top-k, ids)."""
    hs = engine.cfg.head
    return teacher_forced(engine.model, engine.tok, [(it.x, it.y) for it in items], hs.n_layers, engine.cfg.budget,
                          top_k=hs.top_k)


def is_far(engine: Engine, k: int, distances: Sequence[float]) -> bool:
    """Whether a person this far from the nearest of K centres is further out than all but
    StyleSettings.far_share of the build's own people (cluster.closeness)."""
    c = engine.clusters
    if k not in c.centroids or not len(distances):
        return False
    return closeness(c.embeddings, c.centroids[k], c.labels[k], min(distances))[1] < engine.cfg.style.far_share


def fit_style(engine: Engine, feats, head: PersonalizationHead, votes: TokenData | None = None,
              far: bool = False) -> tuple[UserStyle, list[float]]:
    """λ (with the token bias when the style uses one) and the kNN memory from one pass's features; `far`: the
    person is beyond the build's clusters, so their memory is kept at StyleSettings.far_knn_weight.
    `votes`: rows of the texts the person preferred (or rejected), weighted (methods/card/votes.py); they join the
    fit of λ and the bias, not the memory (the memory keeps the person's own text)."""
    st, hs = engine.cfg.style, engine.cfg.head
    data = TokenData.from_features(feats)
    if votes is not None and len(votes):
        data = TokenData.cat([data, votes])
    if st.bias:
        lam, ids, vals, curve = fit_lambda_bias(head, data, hs.rho, st.rho_bias, st.max_bias_tokens, hs.fit_iters,
                                                center=st.lambda_prior)
    else:
        lam, curve = fit_user(head, data, hs)
        ids, vals = torch.zeros(0, dtype=torch.long), torch.zeros(0)
    own_weight = st.far_knn_weight if far and st.far_knn_weight > 0 else None
    keys, values = (memory_from_features(feats, engine.lm.hidden_size, st.max_memory, st.key, head)
                    if st.memory or own_weight else (None, None))
    style = UserStyle(lam.numpy().astype(np.float32), ids.numpy(), vals.numpy().astype(np.float32),
                      knn_weight=own_weight)
    if keys is not None:
        style.keys, style.values = keys, values
    if st.form:
        style.form_keys, style.form_ids, style.form_bias = fit_form(feats, st.form_positions, st.form_prior,
                                                                   st.form_cap)
    return style, curve


def held_out_style(engine: Engine, feats, n_hold: int, head: PersonalizationHead, votes: TokenData | None = None,
                   far: bool = False):
    """(diagnostics, style fitted without them, held-out rows) on the first n_hold items (the newest, in LaMP
    order), judged at α = 1, the rule the head was trained with: whether the style helps is the person's,
    not the slider's. Votes join the fit, never the held-out items."""
    if not n_hold:
        return {}, None, None
    own, _ = fit_style(engine, feats[n_hold:], head, votes, far=far)
    held = TokenData.from_features(feats[:n_hold])
    others = [UserStyle.of(o) for o in list(engine.population_lams.get("tokens", {}).values())[:16]]
    diag = style_diagnostics(head, held, own, others, engine.cfg.style, 1.0)
    lam_only = diagnostics(head, held, torch.as_tensor(own.lam), [torch.as_tensor(o.lam) for o in others],
                           engine.cfg.head)
    diag |= {"lambda_only": {k_: v for k_, v in lam_only.items() if isinstance(v, (int, float))}}
    return diag, own, held


def held_out_pairs(engine: Engine, objective: str, data: PairData, n_hold: int, n_items: int) -> dict:
    """A pair head's diagnostics on the first n_hold items, λ fitted without them, against 16 population λ."""
    if not n_hold:
        return {}
    head, hs = engine.heads[objective], engine.cfg.head
    fit_part, held = split_held_out(data, n_hold, n_items)
    lam_fit, _ = fit_user(head, fit_part, hs)
    others = list(engine.population_lams.get(objective, {}).values())[:16]
    return diagnostics(head, held, lam_fit, [torch.as_tensor(o) for o in others], hs)


def split_held_out(data, n_hold: int, n_items: int):
    """Held-out = the first n_hold items (the newest, in LaMP order)."""
    if isinstance(data, PairData):
        return data.select(lambda i: i >= n_hold), data.select(lambda i: i < n_hold)
    # TokenData rows are in item order; split by the share of items (rows are token positions)
    cut = int(len(data) * n_hold / n_items)
    w, opening = data.weight, data.opening
    sl = lambda a, b: TokenData(data.h[a:b], data.cand[a:b], data.base[a:b], data.target[a:b],  # noqa: E731
                                None if w is None else w[a:b], None if opening is None else opening[a:b])
    return sl(cut, len(data)), sl(0, cut)
