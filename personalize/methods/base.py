"""The contract every method keeps (CARD's three core methods and the six compared ones alike), the person as the
methods see them (UserContext), and the helpers the methods share.

A method is made as `Cls(engine, store=None, cfg=Cls.config_class())`; `prepare` does its per-user work
(an index, an attribute search, a LoRA), `is_prepared` says whether that work is done for this history,
`generate` decodes on its own (eval and bench use it), and `rows` describes the same decoding as rows of
a mixed batch (serving.rows.DecodeRow), so the studio's scheduler decodes every method of every person in one
`generate` call; `batch` says in words how the method's rows differ from a plain row. The test
tests/methods/test_method_contract.py checks all of it over every registered method.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Callable, ClassVar, Protocol, Sequence, runtime_checkable

import numpy as np

from personalize.data import Item, Task
from personalize.lm.tokens import TokenBudget
from personalize.store import StoreError, StoredItem

from personalize.serving.rows import DecodeRow
from personalize.serving.generation import Generation, generate
from personalize.methods.scaffold import scaffold_lines
from personalize.serving.settings import DecodingSettings


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


@dataclass
class UserContext:
    """One user as the methods see them: history with prompts filled, cluster and λ from their fit."""

    name: str
    items: list[Item]  # every x filled (free-form items: the task template of the neutral rewrite, §1.8)
    cluster: int = 0
    k: int = 1
    lam: np.ndarray | None = None
    templated: frozenset[int] = field(default_factory=frozenset)  # items whose x was built from a rewrite

    def __post_init__(self):
        if any(not it.x for it in self.items):
            raise ValueError(f"user {self.name!r}: every item needs its prompt x (run the neutral rewrites first)")
        if self.k < 1 or not 0 <= self.cluster < self.k:
            raise ValueError(f"cluster must be in 0..k-1, got cluster={self.cluster}, k={self.k}")

    @classmethod
    def from_store(cls, store, name: str, task: Task, cluster: int = 0, k: int = 1,
                   lam: np.ndarray | None = None) -> "UserContext":
        """The stored history with prompts filled from the stored neutral rewrites (a fit writes them)."""
        stored = store.items(name)
        neutral = {i: s.neutral for i, s in enumerate(stored) if s.neutral}
        return cls.of_stored(name, stored, neutral, task, cluster, k, lam)

    @classmethod
    def of_stored(cls, name: str, stored: Sequence[StoredItem], neutral: dict[int, str], task: Task,
                  cluster: int = 0, k: int = 1, lam: np.ndarray | None = None) -> "UserContext":
        """Stored items (read once by the caller) with prompts filled from their neutral rewrites, by index."""
        items, templated = [], set()
        for i, s in enumerate(stored):
            if not s.x and not neutral.get(i):
                raise ValueError(f"item {s.position + 1} of user {name!r} has no prompt and no neutral rewrite: "
                                 "onboard first")
            if not s.x:
                templated.add(i)
            # the item's number in the person's own history (as My writing shows it), not the store's row id
            items.append(Item(y=s.y, x=s.x or task.prompt(neutral[i]), id=str(s.position + 1)))
        return cls(name, items, cluster, k, lam, frozenset(templated))


# ------------------------------------------------------------ helpers shared by the methods

def clip(tok, text: str, n_tokens: int) -> str:
    """`text` cut to its first n_tokens tokens, the way tokens.prompt_ids cuts a prompt."""
    ids = tok(text, add_special_tokens=False)["input_ids"]
    return text if len(ids) <= n_tokens else tok.decode(ids[:n_tokens]).strip()


def n_tokens(tok, text: str) -> int:
    return len(tok(text, add_special_tokens=False)["input_ids"])


def task_input(task: Task, x: str) -> str:
    """The content of a prompt without the task's fixed start (Task.fixed_start)."""
    p = task.fixed_start
    return x[len(p):].strip() if p and x.startswith(p) else x


def words(text: str) -> list[str]:
    """Lowercase word tokens (BM25's tokenisation)."""
    return re.findall(r"\w+", text.lower())


def widened(budget: TokenBudget, extra: int) -> TokenBudget:
    """The prompt budget plus the tokens a method adds, so prompt_ids never cuts the task input away."""
    return dataclasses.replace(budget, max_prompt_tokens=budget.max_prompt_tokens + extra)


def framed_generate(engine, built: Sequence[tuple[str, list]], extra: int,
                    settings: DecodingSettings) -> list[Generation]:
    """The prompts a method built (each with its trace) decoded on the frozen LM, the budget widened by `extra`
    and the prompts' framing never the answer (methods/scaffold.py)."""
    if not built:
        return []
    engine.use_adapter(None)
    outs = generate(engine.model, engine.tok, [b for b, _ in built], widened(engine.cfg.budget, extra), settings,
                    scaffold=scaffold_lines(engine.task))
    for g, (_, trace) in zip(outs, built):
        g.trace = trace
    return outs


def framed_rows(engine, built: Sequence[tuple[str, list]], extra: int, settings: DecodingSettings) -> list[DecodeRow]:
    """framed_generate's decoding as rows of a mixed batch: plain rows on the frozen LM."""
    budget, scaffold = widened(engine.cfg.budget, extra), scaffold_lines(engine.task)
    return [DecodeRow(b, budget, settings, None, trace=t, scaffold=scaffold) for b, t in built]


def record_report(method, user, info: dict) -> None:
    """A method's report of its per-user work as a store blob (kind: the method's name, key: the artifacts id)."""
    if method.store is not None:
        with suppress(StoreError):  # users not in the store (evaluation populations)
            method.store.put_blob(user.name, method.name, str(method.engine.artifacts_id), info)


def fingerprint(texts: Sequence[str]) -> str:
    return hashlib.sha1("\x1f".join(texts).encode()).hexdigest()[:16]
