"""Fitting a stored person (the CLI's `onboard`, the app's Fit my style): items from the store → neutral rewrites →
clusters for every K → λ, all stored.

The fit happens first and the store is written only when it succeeded, so an
interrupted or failed fit leaves the previous vector in place.
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from personalize.methods.card import onboard
from personalize.data import Item
from personalize.metrics import repeated_text
from personalize.methods.card.adapters import cluster_adapter
from personalize.methods.card.neutral import keeps_content
from personalize.methods.card.own import owner_key
from personalize.methods.engine import Engine
from personalize.methods.card.onboard import UserFit
from personalize.store import Store, StoredItem


def stored_with_rewrites(engine: Engine, store: Store, name: str, progress=None,
                         stored: Sequence[StoredItem] | None = None) -> tuple[list[StoredItem], dict[int, str]]:
    """The user's stored items, read once (`stored`: read by the caller already), and their neutral rewrites (§1.8)
    by index: the missing ones are generated once and stored, so every item without a prompt has one; one stored
    before rewrites had to keep their content (keeps_content) is made again."""
    stored = list(store.items(name) if stored is None else stored)
    if not stored:
        raise ValueError(f"user {name!r} has no history items")
    todo = [i for i, s in enumerate(stored) if not s.x and not (s.neutral and keeps_content(s.y, s.neutral))]
    if todo and progress:
        progress("neutral rewrites")
    rewrites = engine.neutral_rewrites([stored[i].y for i in todo])
    store.set_neutral([(stored[i].id, r) for i, r in zip(todo, rewrites)])
    return stored, {i: s.neutral for i, s in enumerate(stored) if s.neutral} | dict(zip(todo, rewrites))


def prepared_items(engine: Engine, store: Store, name: str, progress=None) -> list[Item]:
    """The user's items with every prompt filled (stored_with_rewrites), in the order a fit and Explore read them
    (held_out_order): they hold out the first ones, the newest that can be held out."""
    stored, neutral = stored_with_rewrites(engine, store, name, progress)
    # the item's number in the person's own history (as My writing and UserContext.of_stored number it)
    items = engine.prepare_items([Item(y=s.y, x=s.x, id=str(s.position + 1)) for s in stored], neutral=neutral)
    order, holdable = held_out_order(stored, neutral)
    return onboard.HoldOrder.of([items[i] for i in order], holdable)


def held_out_order(stored: Sequence[StoredItem], neutral: dict[int, str]) -> tuple[list[int], int]:
    """(the stored items' indices in the order a fit reads them, how many of the first may be held out): newest first
    (the store's order, data.newest_first: a paste's last lines, a dated file's newest), then the items whose
    neutral rewrite nearly repeats the text itself ("changelog" → "Changelog."): held out, they would judge a fit
    by an answer its prompt gives away (issue 59). Short texts (commit subjects) mostly are such items."""
    def gives_answer(i: int) -> bool:
        rewrite = neutral.get(i) if not stored[i].x else None
        return bool(rewrite) and repeated_text(rewrite, [stored[i].y]) is not None
    given = [gives_answer(i) for i in range(len(stored))]
    order = [i for i in range(len(stored)) if not given[i]] + [i for i in range(len(stored)) if given[i]]
    return order, given.count(False)


def held_out_numbers(items: Sequence[Item], n_hold: int) -> list[int]:
    """The numbers (in the person's own history, as My writing shows them) of the items a fit holds out."""
    return sorted(int(it.id) for it in items[:n_hold] if it.id.isdigit())


def fit_with_own(engine: Engine, name: str, items: list[Item], fit: UserFit | None = None) -> UserFit:
    """A person's fit as the build decodes them (eval's onboarding): a person beyond its clusters (OwnSettings.far)
    gets their own adapter, trained on these items from their nearest cluster's, and the style fitted over it
    (a cluster of one); a near person keeps the fit over their cluster. `fit`: the one made already."""
    fit = fit or onboard.fit(engine, items)
    if not (engine.cfg.own.far and fit.far) or fit.cold_start:
        return fit
    if not engine.own.is_current(name, items):
        engine.own.train(name, items, cluster_adapter(fit.k, fit.cluster))
    return onboard.fit(engine, items, k=fit.k, own=owner_key(name))


def store_assignments(engine: Engine, store: Store, name: str, embedding: np.ndarray) -> dict[int, int]:
    """The user's nearest centroid for every built K, stored; returns K -> cluster."""
    out = {}
    for k in engine.clusters.centroids:
        c, d = engine.assign(embedding, k)
        store.set_assignment(name, engine.artifacts_id, k, c, d)
        out[k] = c
    return out


def fit_person(engine: Engine, store: Store, name: str, k: int | None = None, progress=None,
               kept_pass=None) -> tuple[UserFit, list[Item]]:
    """The person's fit, stored, and the items it was fitted on (the request's one read of the person).
    `kept_pass`: onboard.fit's, a teacher-forced pass made before (the studio's read-ahead after Save)."""
    t0 = time.perf_counter()
    items = prepared_items(engine, store, name, progress)
    rewrite_s = time.perf_counter() - t0
    own = owner_key(name) if engine.own.is_current(name, items) else None  # a cluster of one: their own adapter
    fit = onboard.fit(engine, items, k=k, progress=progress, kept_pass=kept_pass, own=own)
    if rewrite_s > 0.01:
        fit.stages_s = {"neutral rewrites": round(rewrite_s, 4), **fit.stages_s}
    emb = engine.embed(items)
    # the clusters and the style in one transaction: a crash leaves both old or both new
    store.save_vector(name, engine.artifacts_id, fit.lam, engine.lm.model_id, fit.stats(),
                      fit.style.extras_bytes() if fit.style is not None else None,
                      assignments={k: engine.assign(emb, k) for k in engine.clusters.centroids})
    return fit, items
