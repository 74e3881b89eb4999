"""The contract every method keeps (CARD's three core methods and the six compared ones alike).

A method is made as `Cls(engine, store=None, cfg=Cls.config_class())`; `prepare` does its per-user work
(an index, an attribute search, a LoRA), `is_prepared` says whether that work is done for this history,
`generate` decodes on its own (eval and bench use it), and `rows` describes the same decoding as rows of
a mixed batch (batch.DecodeRow), so the studio's scheduler decodes every method of every person in one
`generate` call; `batch` says in words how the method's rows differ from a plain row. The test
tests/test_method_contract.py checks all of it over every registered method.
"""

from __future__ import annotations

from typing import Callable, ClassVar, Protocol, runtime_checkable

from personalize.serving.runner import DecodeRow
from personalize.card.decoding import DecodingSettings, Generation


@runtime_checkable
class Method(Protocol):
    name: ClassVar[str]
    config_class: ClassVar[type]
    batch: ClassVar[str]  # how its rows join a mixed batch (adapter, steer, prompt), in words

    def prepare(self, user, progress: Callable[[int, int], None] | None = None) -> dict:
        """Per-user work; returns what it did and how long it took ({"method": name, ...})."""

    def is_prepared(self, user) -> bool:
        """True when `rows` and `generate` will not do per-user work first."""

    def generate(self, user, prompts: list[str], settings: DecodingSettings) -> list[Generation]:
        """One Generation per prompt, decoded by this method alone."""

    def rows(self, user, prompts: list[str], settings: DecodingSettings, trace: bool = False) -> list[DecodeRow]:
        """One row per prompt; decoded in any mixed batch, each gives what `generate` gives (greedy)."""
