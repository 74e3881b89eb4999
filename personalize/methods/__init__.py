"""Comparison methods (METHOD §2-§5): RAG, PAG, EXACT, COPE, OPPU and Profile-to-PEFT, and CARD's own three
(core.py: base, cluster, card), all in one shape: the `Method` protocol of base.py.

Every method is a module with a frozen `XConfig` (validated where it is built)
and an `XMethod(engine, store=None, cfg=XConfig())` with `prepare(user)`,
`is_prepared(user)`, `generate(user, prompts, settings)` and `rows(...)`, its
decoding as rows of a mixed batch (batch.py), so the app, eval, bench and the
scheduler treat them alike (the peft-tuners pattern of STYLE.md). What a method
chose for an output (retrieved items, attributes) is in `Generation.trace`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from personalize.data import Item, Task
from personalize.lm.tokens import TokenBudget


@dataclass
class UserContext:
    """One user as the methods see them: history with prompts filled, cluster and λ from onboarding."""

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
        """The stored history with prompts filled from the stored neutral rewrites (onboard writes them)."""
        items, templated = [], set()
        for i, s in enumerate(store.items(name)):
            if not s.x and not s.neutral:
                raise ValueError(f"item {s.position + 1} of user {name!r} has no prompt and no neutral rewrite: "
                                 "onboard first")
            if not s.x:
                templated.add(i)
            # the item's number in the person's own history (as My writing shows it), not the store's row id
            items.append(Item(y=s.y, x=s.x or task.prompt(s.neutral), id=str(s.position + 1)))
        return cls(name, items, cluster, k, lam, frozenset(templated))


# ------------------------------------------------------------ helpers shared by the methods

def clip(tok, text: str, n_tokens: int) -> str:
    """`text` cut to its first n_tokens tokens, the way tokens.prompt_ids cuts a prompt."""
    ids = tok(text, add_special_tokens=False)["input_ids"]
    return text if len(ids) <= n_tokens else tok.decode(ids[:n_tokens]).strip()


def n_tokens(tok, text: str) -> int:
    return len(tok(text, add_special_tokens=False)["input_ids"])


def task_input(task: Task, x: str) -> str:
    """The content of a prompt without the task's fixed instruction (it would match every item)."""
    p = task.prefix
    return x[len(p):].strip() if p and x.startswith(p) else x


def words(text: str) -> list[str]:
    """Lowercase word tokens (BM25's tokenisation)."""
    return re.findall(r"\w+", text.lower())


def widened(budget: TokenBudget, extra: int) -> TokenBudget:
    """The prompt budget plus the tokens a method adds, so prompt_ids never cuts the task input away."""
    return dataclasses.replace(budget, max_prompt_tokens=budget.max_prompt_tokens + extra)


def fingerprint(texts: Sequence[str]) -> str:
    return hashlib.sha1("\x1f".join(texts).encode()).hexdigest()[:16]


# ------------------------------------------------------------ registry (imported last: the modules use the above)

from personalize.methods.base import Method  # noqa: E402
from personalize.methods.card.method import BaseMethod, CardMethod, ClusterMethod, CoreConfig  # noqa: E402
from personalize.methods.cope import CopeConfig, CopeMethod  # noqa: E402
from personalize.methods.exact import ExactConfig, ExactMethod  # noqa: E402
from personalize.methods.oppu import OppuConfig, OppuMethod  # noqa: E402
from personalize.methods.p2p import P2PConfig, P2PMethod  # noqa: E402
from personalize.methods.pag import PagConfig, PagMethod  # noqa: E402
from personalize.methods.rag import RagConfig, RagMethod  # noqa: E402

METHODS: dict[str, type] = {"rag": RagMethod, "pag": PagMethod, "exact": ExactMethod, "cope": CopeMethod,
                            "oppu": OppuMethod, "p2p": P2PMethod}  # the compared methods
CORE: dict[str, type] = {"base": BaseMethod, "cluster": ClusterMethod, "card": CardMethod}
REGISTRY: dict[str, type] = {**CORE, **METHODS}  # every method the studio serves


def get_method(name: str, engine, store=None, **cfg):
    """The method `name` on this engine; keyword arguments are its config's fields."""
    if name not in REGISTRY:
        raise ValueError(f"unknown method {name!r}; choose from {sorted(REGISTRY)}")
    cls = REGISTRY[name]
    return cls(engine, store, cls.config_class(**cfg))


__all__ = ["UserContext", "METHODS", "CORE", "REGISTRY", "Method", "get_method", "BaseMethod", "ClusterMethod",
           "CardMethod", "CoreConfig", "RagConfig", "RagMethod", "PagConfig", "PagMethod",
           "ExactConfig", "ExactMethod", "CopeConfig", "CopeMethod", "OppuConfig", "OppuMethod", "P2PConfig", "P2PMethod"]
