"""Onboarding a stored user: items from the store → neutral rewrites → clusters for every K → λ, all stored.

The fit happens first and the store is written only when it succeeded, so an
interrupted or failed fit leaves the previous vector in place.
"""

from __future__ import annotations

import time

from .data import Item
from .engine import Engine, UserFit
from .store import Store


def onboard(engine: Engine, store: Store, name: str, k: int | None = None, objective: str | None = None,
            progress=None) -> UserFit:
    stored = store.items(name)
    if not stored:
        raise ValueError(f"user {name!r} has no history items")
    items = [Item(y=s.y, x=s.x, id=str(s.id)) for s in stored]
    t0 = time.perf_counter()
    todo = [i for i, s in enumerate(stored) if not s.x and not s.neutral]
    if todo and progress:
        progress("neutral rewrites")
    rewrites = engine.neutral_rewrites([stored[i].y for i in todo])
    store.set_neutral([(stored[i].id, r) for i, r in zip(todo, rewrites)])
    neutral = {i: s.neutral for i, s in enumerate(stored) if s.neutral} | dict(zip(todo, rewrites))
    items = engine.prepare_items(items, neutral=neutral)
    rewrite_s = time.perf_counter() - t0
    fit = engine.fit(items, k=k, objective=objective, progress=progress)
    if rewrite_s > 0.01:
        fit.stages_s = {"neutral rewrites": round(rewrite_s, 4), **fit.stages_s}
    emb = engine.embed(items)
    for kk in engine.clusters.centroids:
        c, d = engine.assign(emb, kk)
        store.set_assignment(name, engine.artifacts_id, kk, c, d)
    store.save_vector(name, engine.artifacts_id, fit.lam, engine.lm.model_id, fit.stats())
    return fit
