"""Every method of catalog.py by name: its class, and `get_method` (one way for the studio, the CLI, eval, tune
and the serving benchmark to reach any of them, CARD's included)."""

from __future__ import annotations

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
CORE: dict[str, type] = {name: REGISTRY[name] for name in CORE_METHODS}
METHODS: dict[str, type] = {name: REGISTRY[name] for name in COMPARED}  # the compared methods
assert set(REGISTRY) == {*CORE_METHODS, *COMPARED}, "catalog.py and the method classes disagree"


def get_method(name: str, engine, store=None, **cfg):
    """The method `name` on this engine; keyword arguments are its config's fields."""
    if name not in REGISTRY:
        raise ValueError(f"unknown method {name!r}; choose from {sorted(REGISTRY)}")
    cls = REGISTRY[name]
    return cls(engine, store, cls.config_class(**cfg))
