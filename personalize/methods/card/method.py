"""CARD's own three methods (base, cluster, card) in the methods' shape (base.Method), over the engine.

They need no per-user work beyond the fit (the cluster and λ come with the UserContext), so
`prepare` only reports, and `generate` / `rows` are the engine's.
"""

from __future__ import annotations

from dataclasses import dataclass

from personalize.serving.rows import DecodeRow
from personalize.serving.generation import Generation
from personalize.serving.settings import DecodingSettings
from personalize.methods.base import UserContext
from personalize.methods.card import card_decode


@dataclass(frozen=True)
class CoreConfig:
    """Nothing to set: the build's settings (adapters, head, style) decide everything."""


class _Core:
    name = ""
    config_class = CoreConfig
    batch = ""

    def __init__(self, engine, store=None, cfg: CoreConfig = CoreConfig()):
        self.engine, self.store, self.cfg = engine, store, cfg

    def prepare(self, user: UserContext, progress=None) -> dict:
        return {"method": self.name, "n_items": len(user.items), "prepare_s": 0.0}  # nothing to do: nothing timed

    def is_prepared(self, user: UserContext) -> bool:
        return True

    @property
    def needs_items(self) -> bool:
        """Whether its rows read the person's history (a CARD style that retrieves their items into the prompt)."""
        return False

    def generate(self, user: UserContext, prompts: list[str], settings: DecodingSettings) -> list[Generation]:
        return card_decode.generate(self.engine, prompts, self.name, user.cluster, user.lam, k=user.k, settings=settings,
                                    items=user.items if self.needs_items else None)

    def rows(self, user: UserContext, prompts: list[str], settings: DecodingSettings,
             trace: bool = False) -> list[DecodeRow]:
        return card_decode.rows(self.engine, prompts, self.name, user.cluster, user.lam, k=user.k, settings=settings, trace=trace,
                                items=user.items if self.needs_items else None)


class BaseMethod(_Core):
    name = "base"
    batch = "a plain row on the frozen LM (adapter '__base__')"


class ClusterMethod(_Core):
    name = "cluster"
    batch = "a plain row on the person's cluster LoRA"


class CardMethod(_Core):
    name = "card"
    stored = "the style in the store: λ, token bias, kNN memory, the openings' form bias"

    @property
    def needs_items(self) -> bool:
        return self.engine.cfg.style.retrieval
    batch = "a row on the cluster LoRA with CARD's re-ranking (its own λ, bias, memory and α) on its scores"
