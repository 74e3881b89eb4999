"""CardConfig: every setting of the offline build and the online stage, saved with the artifacts.

One nested dataclass, written as JSON next to the artifacts, so that a later
run (onboard, generate, eval, the app) uses exactly the settings of the build.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from personalize.methods.card.adapters import LoraSettings
from personalize.serving.generation import DecodingSettings
from personalize.methods.card.head import OBJECTIVES, HeadSettings
from personalize.lm.models import EncoderConfig, ModelConfig
from personalize.methods.card.style import StyleSettings
from personalize.lm.tokens import TokenBudget

# of the artifacts folder; Engine.load refuses newer ones. 2: decoding applies the tokens head's trained rule
# (raw Δ) and the person's style, so α chosen by a version-1 build means something else (the demo is rebuilt)
FORMAT_VERSION = 2


@dataclass(frozen=True)
class CardConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    budget: TokenBudget = field(default_factory=TokenBudget)
    lora: LoraSettings = field(default_factory=LoraSettings)
    head: HeadSettings = field(default_factory=HeadSettings)
    decoding: DecodingSettings = field(default_factory=DecodingSettings)
    style: StyleSettings = field(default_factory=StyleSettings)  # what `card` decodes with beside λ (METHOD §1.10)
    ks: tuple[int, ...] = (1, 2, 4, 8)
    default_k: int = 4  # the cluster count the head is trained on and methods use unless told
    objectives: tuple[str, ...] = ("tokens",)  # heads to train; the first one is CARD's default
    items_per_user: int = 16  # newest items of each population user used by the build
    holdout: float = 0.2  # share of each user's items kept out of fits, for diagnostics
    n_val_users: int = 30  # validation people (outside the population first): the decoding choice and the harm guard
    alphas: tuple[float, ...] = (0.0, 0.5, 1.0, 2.0, 4.0)
    min_fit_items: int = 2  # fewer items: cold start, λ = 1

    def __post_init__(self):
        if not self.ks or any(k < 1 for k in self.ks) or 1 not in self.ks:
            raise ValueError(f"ks must be positive and include 1 (the base adapter), got {self.ks}")
        if self.default_k not in self.ks:
            raise ValueError(f"default_k={self.default_k} must be one of the built ks {self.ks}")
        if not self.objectives or any(o not in OBJECTIVES for o in self.objectives):
            raise ValueError(f"objectives must be among {OBJECTIVES}, got {self.objectives}")
        if not 0 <= self.holdout < 1 or self.items_per_user < 1 or self.n_val_users < 0:
            raise ValueError("holdout in [0, 1), items_per_user >= 1, n_val_users >= 0")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "CardConfig":
        return _build(cls, d)

    def replace(self, **changes) -> "CardConfig":
        return dataclasses.replace(self, **changes)


def _build(cls, d: dict[str, Any]):
    """Rebuild nested frozen dataclasses from JSON (lists become tuples)."""
    kwargs = {}
    hints = {f.name: f for f in dataclasses.fields(cls)}
    for name, value in d.items():
        if name not in hints:
            continue  # settings removed since the artifacts were built
        default = hints[name].default_factory() if hints[name].default_factory is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(default) and isinstance(value, dict):
            value = _build(type(default), value)
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[name] = value
    return cls(**kwargs)


def dumps(cfg: CardConfig) -> str:
    return json.dumps(cfg.to_dict(), indent=2, sort_keys=True)
