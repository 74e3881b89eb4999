"""Every method of catalog.py by name: its class, and `get_method` (one way for the studio, the CLI, eval, tune
and the serving benchmark to reach any of them, CARD's included)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from personalize.catalog import COMPARED, CORE_METHODS
from personalize.methods.card.method import BaseMethod, CardMethod, ClusterMethod
from personalize.methods.cope import CopeMethod
from personalize.methods.exact import ExactMethod
from personalize.methods.oppu import OppuMethod
from personalize.methods.p2p.p2p_method import P2PMethod
from personalize.methods.pag import PagMethod
from personalize.methods.rag import RagMethod

_CLASSES = (BaseMethod, ClusterMethod, CardMethod, RagMethod, PagMethod, ExactMethod, CopeMethod, OppuMethod, P2PMethod)
REGISTRY: dict[str, type] = {cls.name: cls for cls in _CLASSES}  # every method the studio serves
METHODS: dict[str, type] = {name: REGISTRY[name] for name in COMPARED}  # the compared methods
assert set(REGISTRY) == {*CORE_METHODS, *COMPARED}, "catalog.py and the method classes disagree"


def local_config(name: str, folder: Path | None, **budgets) -> dict:
    """The fields of method `name`'s config that depend on where it runs: `folder` for a method that keeps files per
    person (per_person_files), and those of the caller's `budgets` its config has (EXACT's max_pairs, say)."""
    cls = REGISTRY[name]
    fields = {f.name for f in dataclasses.fields(cls.config_class)}
    out = {k: v for k, v in budgets.items() if k in fields}
    if getattr(cls, "per_person_files", False):
        if folder is None:
            raise ValueError(f"{name} keeps files per person: it needs a folder for them")
        out["folder"] = str(folder)
    return out


def get_method(name: str, engine, store=None, **cfg):
    """The method `name` on this engine; keyword arguments are its config's fields."""
    if name not in REGISTRY:
        raise ValueError(f"unknown method {name!r}; choose from {sorted(REGISTRY)}")
    cls = REGISTRY[name]
    return cls(engine, store, cls.config_class(**cfg))
