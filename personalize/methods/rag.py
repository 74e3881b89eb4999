"""RAG baseline (METHOD §5): BM25 over the user's own history, top-4 items placed before the task prompt.

The retrieved items are serialised one per line as "history input → history
output" (only the output for a free-form item, whose input is our own
template of a rewrite); decoding uses the base model with adapters disabled,
so every gain comes from the context. The context has its own token
allowance (`context_tokens`): the task prompt keeps the same budget as in the
other methods, and each retrieved line is cut to its share.
"""

from __future__ import annotations

import pickle
import time
from dataclasses import dataclass

import numpy as np
from rank_bm25 import BM25Okapi

from personalize.serving.rows import DecodeRow
from personalize.data import Item
from personalize.serving.generation import Generation
from personalize.serving.settings import DecodingSettings
from personalize.methods.base import UserContext, clip, fingerprint, framed_generate, framed_rows, n_tokens, \
    task_input, words
from personalize.methods.scaffold import HEADER

SLACK = 16  # tokens for the header, newlines and re-tokenisation at the joins


@dataclass(frozen=True)
class RagConfig:
    top_k: int = 4  # retrieved items (METHOD §5)
    context_tokens: int = 128  # all retrieved lines together; each line gets context_tokens // top_k

    def __post_init__(self):
        if self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if self.context_tokens < 8 * self.top_k:
            raise ValueError(f"context_tokens must be >= 8 per retrieved item, got {self.context_tokens}")


class RagIndex:
    """BM25 over one user's items; a document is the item's input content plus its output."""

    def __init__(self, items: list[Item], task):
        self.items = items
        self.docs = [words(task_input(task, it.x) + " " + it.y) for it in items]
        self.bm25 = BM25Okapi(self.docs) if any(self.docs) else None  # BM25 divides by the mean length

    def search(self, query: str, k: int) -> list[tuple[int, float]]:
        """(item index, score) of the k best items; ties keep history order (newest first in LaMP)."""
        q = words(query)
        scores = self.bm25.get_scores(q) if self.bm25 is not None and q else np.zeros(len(self.items))
        order = np.argsort(-np.asarray(scores), kind="stable")[:k]
        return [(int(i), float(scores[i])) for i in order]


class RagMethod:
    name = "rag"
    batch = "a plain row on the frozen LM; its prompt carries the retrieved items"
    config_class = RagConfig
    stored = "BM25 index with its items (pickled)"

    def stored_bytes(self, user: UserContext, info: dict) -> int:
        return len(pickle.dumps(RagIndex(list(user.items), self.engine.task)))

    def __init__(self, engine, store=None, cfg: RagConfig = RagConfig()):
        self.engine, self.store, self.cfg = engine, store, cfg
        self._indexes: dict[str, tuple[str, RagIndex]] = {}  # user -> (history fingerprint, index)

    # ------------------------------------------------------------ prepare: the per-user work
    def prepare(self, user: UserContext, progress=None) -> dict:
        """Builds the user's BM25 index (kept in memory: it takes milliseconds to rebuild)."""
        t0 = time.perf_counter()
        self._index(user)
        return {"method": self.name, "n_items": len(user.items), "index_s": round(time.perf_counter() - t0, 4)}

    def _index(self, user: UserContext) -> RagIndex:
        if not user.items:
            raise ValueError(f"{self.name} needs at least one history item for user {user.name!r}")
        key = fingerprint([t for it in user.items for t in (it.x, it.y)])
        cached = self._indexes.get(user.name)
        if cached is None or cached[0] != key:
            cached = self._indexes[user.name] = (key, RagIndex(list(user.items), self.engine.task))
        return cached[1]

    # ------------------------------------------------------------ retrieval
    def retrieve(self, user: UserContext, prompt: str) -> list[tuple[int, float]]:
        """(item index, BM25 score) of the top-k items for this prompt; the query is its input content."""
        return self._index(user).search(task_input(self.engine.task, prompt), self.cfg.top_k)

    def line(self, user: UserContext, i: int) -> str:
        """One retrieved item, cut to its share of the context (the output is kept whole when it can be)."""
        tok, it, share = self.engine.tok, user.items[i], self.cfg.context_tokens // self.cfg.top_k
        out = clip(tok, it.y, min(self.engine.cfg.budget.max_target_tokens, share))
        room = share - n_tokens(tok, out) - 2  # " → "
        if i in user.templated or room < 4:
            return out
        return f"{clip(tok, task_input(self.engine.task, it.x), room)} → {out}"

    def context(self, user: UserContext, prompt: str) -> tuple[str, list[tuple[int, float]]]:
        hits = self.retrieve(user, prompt)
        return "\n".join([HEADER] + [self.line(user, i) for i, _ in hits]), hits

    def build_prompt(self, user: UserContext, prompt: str, prefix: str = "") -> tuple[str, list[tuple[int, float]]]:
        """The prompt the base model reads: [prefix] + retrieved lines + the task prompt (cut to its budget)."""
        ctx, hits = self.context(user, prompt)
        body = clip(self.engine.tok, prompt, self.engine.cfg.budget.max_prompt_tokens)
        return "\n\n".join(p for p in (prefix, ctx, body) if p), hits

    @property
    def extra_tokens(self) -> int:
        """How far past the task prompt's budget this method's prompts may reach."""
        return self.cfg.context_tokens + SLACK

    # ------------------------------------------------------------ generation
    def generate(self, user: UserContext, prompts: list[str], settings: DecodingSettings) -> list[Generation]:
        """Base-model decoding of the augmented prompts; trace = [{"retrieved": item ids, "scores": BM25}]."""
        return framed_generate(self.engine, self._built(user, prompts), self.extra_tokens, settings)

    def is_prepared(self, user: UserContext) -> bool:
        return True  # the BM25 index is built on the fly (milliseconds)

    def rows(self, user: UserContext, prompts: list[str], settings: DecodingSettings,
             trace: bool = False) -> list[DecodeRow]:
        """`generate`'s decoding as mixed-batch rows: the augmented prompts on the frozen LM."""
        return framed_rows(self.engine, self._built(user, prompts), self.extra_tokens, settings)

    def _built(self, user: UserContext, prompts: list[str], prefix: str = "",
               info: dict | None = None) -> list[tuple[str, list]]:
        """(the prompt with the retrieved items, its trace) per prompt."""
        built = [self.build_prompt(user, p, prefix=prefix) for p in prompts]
        return [(b, retrieved_trace(user, hits, info)) for b, hits in built]


def retrieved_trace(user: UserContext, hits, info: dict | None = None) -> list[dict]:
    """Generation.trace of an output whose prompt carries the user's items: which (their ids) and their BM25."""
    return [{"retrieved": [user.items[i].id or str(i) for i, _ in hits], "scores": [round(s, 4) for _, s in hits],
             **(info or {})}]
