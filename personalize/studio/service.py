"""The base of the studio's use cases: a service over the runtime (runtime.Runtime). Light on purpose: the CLI's
commands that use a service's functions (style keys, forget) import no model code through it."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from personalize.methods.engine import Engine
    from personalize.store import Store
    from personalize.studio.runtime import Runtime, StudioConfig


class Service:
    """A use case over the runtime; the served build, store and settings are the runtime's (a build switch
    changes them for every service at once)."""

    def __init__(self, rt: "Runtime"):
        self.rt = rt

    @property
    def engine(self) -> "Engine":
        return self.rt.engine

    @property
    def store(self) -> "Store":
        return self.rt.store

    @property
    def cfg(self) -> "StudioConfig":
        return self.rt.cfg

    @property
    def model_lock(self):
        return self.rt.model_lock

    @property
    def task(self):
        return self.rt.engine.task

    @property
    def ks(self) -> list[int]:
        return self.rt.ks
