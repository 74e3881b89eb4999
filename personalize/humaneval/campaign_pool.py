"""A campaign's items and output pool: items (and their people) from a LaMP folder, the outputs generated ahead of
rating by the studio (resumable, each stored once), and the LLM judge's pass over the units.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Callable, Sequence

from personalize.catalog import CARD_METHODS
from personalize.humaneval.campaign import Campaigns
from personalize.humaneval.campaign_schema import CampaignConfig, CampaignError, CampaignItem
from personalize.store import CAMPAIGN_PREFIX, MAX_NAME, Store


def lamp_items(folder: str | Path, split: str, limit: int, history_shown: int = 20, sources: Sequence[str] = ()):
    """The first `limit` queries of a LaMP split (of people from `sources` only, when given: people a build left
    out) as campaign items: (task, items, {user: profile items})."""
    from personalize.data import read_lamp, select_sources

    if limit < 1:
        raise CampaignError("--limit must be at least 1")
    task, queries = read_lamp(folder, split)
    picked = [q for q in select_sources(queries, tuple(sources)) if len(q.profile) >= 1][:limit]
    if not picked:
        raise CampaignError(f"no queries with a profile in {folder} ({split})")
    items, profiles = [], {}
    for q in picked:
        user = (q.user or q.id)[:64]
        profiles[user] = list(q.profile)
        items.append(CampaignItem(user, q.input, tuple(it.y for it in q.profile[:history_shown]), q.gold))
    return task, items, profiles


def person_name(task: str, user: str, history: Sequence[str]) -> str:
    """The name a campaign's person is stored under for generation: in the store's reserved campaign namespace
    (kept out of the studio's users, so a LaMP folder's people never mix with the studio's own), keyed by the
    task, the person's id and the history the raters see, so the same id with another profile (another folder
    or task) is another stored person, and the same person in two campaigns is stored and fitted once."""
    key = hashlib.sha1(json.dumps([task, user, list(history)]).encode()).hexdigest()[:8]
    return f"{CAMPAIGN_PREFIX}{key}:{user}"[:MAX_NAME].rstrip()


def _stored_person(store: Store, task: str, item: dict) -> str:
    """The stored user whose style generates an item's outputs: the campaign's own copy of the person, else (a
    campaign made before people were kept apart, or over the studio's own users) the user of that name."""
    own = person_name(task, item["user"], item["history"])
    return own if store.query("SELECT 1 FROM users WHERE name = ?", [own]) else item["user"]



def create_from_lamp(store: Store, name: str, data: str | Path, split: str, limit: int, artifacts: str | Path,
                     build: str, task: str, sources: Sequence[str] = (), **settings) -> dict:
    """A campaign over the first `limit` queries of a LaMP split, for the build `artifacts` serving `task`; each
    query's person is stored from their profile for generation, apart from the studio's users (person_name:
    a studio user of the same name is neither shown their history nor changed)."""
    lamp_task, items, profiles = lamp_items(data, split, int(limit), sources=sources)
    if lamp_task.name != task:
        raise CampaignError(f"{data} is a {lamp_task.name} folder, but the build serves {task}")
    cfg = CampaignConfig(artifacts=str(artifacts), build=build, data=str(data), split=split, task=task,
                         sources=tuple(sources), **settings)
    camps = Campaigns(store)
    if (name or "").strip() in camps.names():
        raise CampaignError(f"a campaign named {name.strip()!r} exists already")
    known = {u["name"] for u in store.users(campaign=True)}
    for it in items:
        stored = person_name(task, it.user, it.history[: cfg.history_shown])
        if stored not in known:
            store.add_user(stored, profiles[it.user], task, campaign=True)
            known.add(stored)
    return camps.create(name, items, cfg)


_FAILURES = (ValueError, RuntimeError, FileNotFoundError)  # a method that cannot run (StoreError is a ValueError)


def generate(studio, name: str, progress: Callable[[int, int, str], None] | None = None, shards=None) -> dict:
    """Fills the campaign's output pool, method by method; resumable: what is stored is not generated again, and
    each output is stored the moment it exists, so a kill loses at most the one being decoded.
    `shards` (distributed.requests.RequestShards, `campaign generate --ray`): the decodes run there in shards, the
    same outputs stored as each shard comes back (a kill loses the shards still running)."""
    camps = studio.runtime.campaigns
    c = camps.get(name)
    cfg: CampaignConfig = c["config"]
    if cfg.build and cfg.build != studio.runtime.engine.artifacts_id:
        raise CampaignError(f"campaign {name!r} was made for build {cfg.build} ({cfg.artifacts}); the studio runs "
                            f"{studio.runtime.engine.artifacts_id}: generate with that build")
    todo = camps.missing(name)
    s = studio.runtime.settings(cfg.alpha, cfg.top_k, cfg.max_new_tokens)
    fitted: set[str] = set()
    made, failed, t0 = 0, [], time.perf_counter()
    if shards is not None:
        made, failed = _generate_in_shards(studio, cfg, todo, s, shards, progress)
    else:
        for i, (item, method) in enumerate(todo):
            if progress:
                progress(i, len(todo), f"{method} for {item['user']}")
            out = studio.comparisons.run_method(method, _state(studio, cfg, item, method, fitted), item["prompt"], s)
            if out.error:
                failed.append(f"{method} for {item['user']}: {out.error}")
                continue
            made += camps.add_output(item["id"], method, out.text, out.latency_s)
    if progress:
        progress(len(todo), len(todo), "done")
    return {"generated": made, "failed": failed, "outputs": camps.outputs(name),
            "seconds": round(time.perf_counter() - t0, 1)}


def _state(studio, cfg: CampaignConfig, item: dict, method: str, fitted: set[str]):
    """The state an item's person decodes with: fitted first where card needs it and nobody has fitted them yet."""
    user = _stored_person(studio.runtime.store, cfg.task, item)
    if method in CARD_METHODS and user not in fitted and not studio.histories.user_state(user).fitted:
        studio.fits.fit(user)
    fitted.add(user)
    return studio.histories.user_state(user)


def _generate_in_shards(studio, cfg: CampaignConfig, todo, s, shards, progress) -> tuple[int, list[str]]:
    """generate's work with the decodes in shards: every request's rows built here in generate's order (each person
    fitted where generate fits them, a slow first use waited for as a decode waits for it), decoded there each
    request alone, as the studio's scheduler decodes a request that arrives by itself, and stored as they come."""
    fitted: set[str] = set()
    requests, rows, failed = [], [], []
    for item, method in todo:
        if progress:
            progress(0, len(todo), f"rows: {method} for {item['user']}")
        state = _state(studio, cfg, item, method, fitted)
        try:
            if studio.first_use_jobs.needs_indexing(state.name, method):
                studio.first_use_jobs.wait_first_use(state.name, method)
            with studio.runtime.model_lock:  # building may load an adapter or prepare a method on the model
                rows.append(studio.comparisons.rows(method, state, item["prompt"], s))
        except _FAILURES as e:
            failed.append(f"{method} for {item['user']}: {e}")
            continue
        requests.append((item, method, state))
    made, done = 0, 0

    def store(i: int, outcome) -> None:
        nonlocal made, done
        item, method, state = requests[i]
        done += 1
        if isinstance(outcome, str):
            failed.append(f"{method} for {item['user']}: {outcome}")
        else:
            out = studio.comparisons.stored(method, state, item["prompt"], s, outcome[0])
            made += studio.runtime.campaigns.add_output(item["id"], method, out.text, out.latency_s)
        if progress:
            progress(done, len(requests), f"{method} for {item['user']}")
    shards.decode(rows, lambda r: studio.runtime.scheduler.run(lambda: r), store)
    return made, failed


def run_judge(camps: Campaigns, name: str, judge, progress: Callable[[int, int, str], None] | None = None,
              lock=None) -> dict:
    """The LLM judge scores every unit whose outputs exist (units it judged already are kept): the campaign's
    ranking by the judge, next to the raters', answers RQ5."""
    from contextlib import nullcontext

    mode = camps.get(name)["config"].mode
    judged = {(r["first"], r["second"] or "", r["item"]) for r in camps.judgments(name, judge=True)}
    units = [u for u in camps.units(name) if (u["method_a"], u["method_b"], u["position"]) not in judged
             and u["output_a"] is not None and (not u["method_b"] or u["output_b"] is not None)]
    for i, u in enumerate(units):
        if progress:
            progress(i, len(units), f"unit {i + 1} of {len(units)}")
        with lock or nullcontext():
            if mode == "pairwise":
                v = judge.pairwise(u["history"], u["prompt"], u["output_a"], u["output_b"])
                verdict, scores, p_a = v["verdict"], None, v.get("p_a")
            else:
                verdict, scores, p_a = None, judge.rubric(u["history"], u["prompt"], u["output_a"]), None
        camps.add_judge(name, u["id"], judge.label, verdict, scores, p_a)
    return {"judged": len(units)}
