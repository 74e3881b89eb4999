"""PAG baseline (METHOD §5): RAG plus a one-sentence profile of the user's writing, generated once by the LM.

The summary costs one generation per user, so it is made once (prepare), stored
(blob kind "pag_summary", key "summary") and reused by every later query and
process; it is made again only when the history or the LM changes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from personalize.serving.generation import generate
from personalize.serving.settings import DecodingSettings
from personalize.methods.base import UserContext, clip, fingerprint, n_tokens
from personalize.methods.rag import SLACK, RagConfig, RagMethod
from personalize.methods.scaffold import PROFILE_PREFIX

SUMMARY_INSTRUCTION = "Describe the writing style of this author in one sentence:"
SUMMARY_KIND, SUMMARY_KEY = "pag_summary", "summary"


@dataclass(frozen=True)
class PagConfig(RagConfig):
    summary_tokens: int = 48  # the summary's length, generated and placed in the prompt

    def __post_init__(self):
        super().__post_init__()
        if self.summary_tokens < 4:
            raise ValueError(f"summary_tokens must be >= 4, got {self.summary_tokens}")


class PagMethod(RagMethod):
    name = "pag"
    batch = "a plain row on the frozen LM; its prompt carries the style summary and retrieved items"
    config_class = PagConfig

    def __init__(self, engine, store=None, cfg: PagConfig = PagConfig()):
        super().__init__(engine, store, cfg)
        self._summaries: dict[str, dict] = {}  # in-memory copy (the only copy when there is no store)

    def prepare(self, user: UserContext, progress=None) -> dict:
        info = super().prepare(user)
        t0 = time.perf_counter()
        value, made = self.summary(user)
        return info | {"summary": value["summary"], "summary_generated": made,
                       "summary_s": round(time.perf_counter() - t0, 4)}

    def is_prepared(self, user: UserContext) -> bool:
        """True when this history's summary exists (else the first use writes it: one short decode)."""
        return not user.items or self._kept(user)[1] is not None

    def _kept(self, user: UserContext) -> tuple[str, dict | None]:
        """(this history and LM's key, the summary kept for them: in memory, else stored; None: none matches)."""
        key = fingerprint([it.y for it in user.items] + [self.engine.lm.model_id])
        value = self._summaries.get(user.name)
        if (value is None or value["history"] != key) and self.store is not None:
            value = self.store.blob(user.name, SUMMARY_KIND, SUMMARY_KEY)
        return key, value if value is not None and value.get("history") == key else None

    def summary(self, user: UserContext) -> tuple[dict, bool]:
        """The stored summary when it matches this history and LM, else a new one; (value, newly made)."""
        if not user.items:
            raise ValueError(f"{self.name} needs at least one history item for user {user.name!r}")
        key, value = self._kept(user)
        if made := value is None:
            value = {"summary": self._summarize([it.y for it in user.items]), "history": key,
                     "model_id": self.engine.lm.model_id, "n_items": len(user.items)}
            if self.store is not None:
                self.store.put_blob(user.name, SUMMARY_KIND, SUMMARY_KEY, value)
        self._summaries[user.name] = value
        return value, made

    def summary_prompt(self, texts: list[str]) -> str:
        """The instruction and as many of the user's texts (newest first) as fit the prompt budget."""
        tok, budget = self.engine.tok, self.engine.cfg.budget
        lines, used = [SUMMARY_INSTRUCTION], n_tokens(tok, SUMMARY_INSTRUCTION)
        for t in texts:
            line = "- " + clip(tok, t, budget.max_target_tokens)
            cost = n_tokens(tok, line) + 1
            if used + cost > budget.max_prompt_tokens - 4 and len(lines) > 1:
                break
            lines.append(line)
            used += cost
        return "\n".join(lines)

    def _summarize(self, texts: list[str]) -> str:
        self.engine.use_adapter(None)
        g = generate(self.engine.model, self.engine.tok, [self.summary_prompt(texts)], self.engine.cfg.budget,
                     DecodingSettings(max_new_tokens=self.cfg.summary_tokens))[0]
        return g.text

    @property
    def extra_tokens(self) -> int:
        return super().extra_tokens + self.cfg.summary_tokens + SLACK

    def _built(self, user: UserContext, prompts: list[str], prefix: str = "", info: dict | None = None):
        """RAG's prompts after a line with the summary; the trace adds {"summary": ...}."""
        summary = self.summary(user)[0]["summary"]
        prefix = f"{PROFILE_PREFIX} {clip(self.engine.tok, summary, self.cfg.summary_tokens)}" if summary else ""
        return super()._built(user, prompts, prefix, {"summary": summary})
