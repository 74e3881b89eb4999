"""How often each method's outputs loop or echo their prompt's scaffold (issue 36), as the studio decodes them.

Each person asks their own query as Compare asks it: every method's rows for the person in ONE mixed batch
(engine.decode_rows, the scheduler's path), so each method's repetition control is measured where it acts.
metrics.looping (an n-gram of up to 6 units three times back to back, or one phrase over half the units) and
metrics.echoes (a line of the task's instruction or of a method's framing repeated) are counted per method; the
first few offending outputs are kept as examples. `bench` prints this table for its people
(format_loops); benchmarks/loops.py measures held-out people of a build.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

from tqdm import tqdm

from personalize.catalog import ALL_METHODS
from personalize.data import Item
from personalize.methods.base import UserContext
from personalize.methods.registry import get_method, local_config
from personalize.methods.scaffold import scaffold_lines
from personalize.metrics import echoes, looping
from personalize.store import Store

TOKENS = 128  # the longest output the studio allows (the Max new tokens slider)


@dataclasses.dataclass(frozen=True)
class Person:
    """One person asking one query: their history (prompts filled) and their fit."""

    name: str
    query: str
    items: tuple[Item, ...]
    fit: object  # methods.engine.UserFit


def method_objects(engine, store: Store, methods: Sequence[str], folder: Path, configs: dict | None = None,
                   progress=print) -> dict:
    """Every method that can run on this build ({name: method}); one that cannot (P2P without its hypernetwork)
    is left out with a line saying why."""
    out = {}
    for m in methods:
        cfg = local_config(m, folder / m) | dict((configs or {}).get(m, {}))
        try:
            out[m] = get_method(m, engine, store, **cfg)
        except (ValueError, FileNotFoundError) as e:
            progress(f"loops: {m} left out ({e})")
    return out


def decode_people(engine, store: Store, people: Sequence[Person], methods: dict, settings) -> dict[str, list[str]]:
    """Each person's outputs of every method, one mixed batch per person (a Compare); per-person work (EXACT's
    search, OPPU's adapter, PAG's summary) is done first where it is not done yet."""
    texts: dict[str, list[str]] = {m: [] for m in methods}
    for p in tqdm(people, desc="loops", mininterval=2.0):
        user = UserContext(p.name, list(p.items), p.fit.cluster, p.fit.k, p.fit.lam)
        store.add_user(p.name, list(p.items), engine.task.name, replace=True)  # EXACT and PAG keep state per person
        rows, owners = [], []
        for m, method in methods.items():
            if not method.is_prepared(user):
                method.prepare(user)
            made = method.rows(user, [p.query], settings)
            rows += made
            owners += [m] * len(made)
        for m, g in zip(owners, engine.decode_rows(rows)):
            texts[m].append(g.text)
    return texts


def shares(texts: dict[str, list[str]], scaffold: Sequence[str], examples: int = 3) -> dict:
    """Per method: outputs, the share that loops, the share that echoes the scaffold, and a few of each."""
    out = {}
    for m, outs in texts.items():
        loops = [t for t in outs if looping(t)]
        echoed = [t for t in outs if echoes(t, scaffold)]
        out[m] = {"n": len(outs), "looping": round(len(loops) / max(len(outs), 1), 4),
                  "echoes": round(len(echoed) / max(len(outs), 1), 4),
                  "loop_examples": loops[:examples], "echo_examples": echoed[:examples]}
    n = sum(r["n"] for r in out.values())
    out["all"] = {"n": n, "looping": round(sum(r["looping"] * r["n"] for r in out.values()) / max(n, 1), 4),
                  "echoes": round(sum(r["echoes"] * r["n"] for r in out.values()) / max(n, 1), 4)}
    return out


def loop_shares(engine, store: Store, people: Sequence[Person], folder: Path, methods: Sequence[str] = ALL_METHODS,
                configs: dict | None = None, tokens: Sequence[int | None] = (None, TOKENS), progress=print) -> dict:
    """The shares (shares) at the build's decoding settings, which the studio starts with, with max_new_tokens
    each of `tokens` (None: the studio's default). {"<tokens> tokens": {method: {...}, "all": {...}}}."""
    objects = method_objects(engine, store, methods, folder, configs, progress)
    scaffold = scaffold_lines(engine.task)
    out = {}
    for n in tokens:
        s = engine.cfg.decoding if n is None else dataclasses.replace(engine.cfg.decoding, max_new_tokens=n)
        out[f"{s.max_new_tokens} tokens"] = shares(decode_people(engine, store, people, objects, s), scaffold)
    for m in objects.values():
        if hasattr(m, "release"):
            m.release()  # OPPU's adapters leave the model
    return out


def format_loops(table: dict) -> str:
    """One row per method: its outputs' loop and echo shares at each setting."""
    settings = list(table)
    head = "| method | " + " | ".join(f"loops, {s} | echoes, {s}" for s in settings) + " |"
    lines = [head, "|---" * (1 + 2 * len(settings)) + "|"]
    methods = [m for m in table[settings[0]] if m != "all"] + ["all"]
    for m in methods:
        cells = []
        for s in settings:
            r = table[s].get(m, {})
            cells += [f"{r.get('looping', 0):.1%} of {r.get('n', 0)}", f"{r.get('echoes', 0):.1%}"]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
