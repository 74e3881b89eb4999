"""EXACT (METHOD §2): greedy attribute sets per preference pair, retrieved by prompt similarity.

Offline, each pair (x, y_w, y_l) gets the k = 3 attributes of the library
(the EXACT paper's Table 4) chosen greedily: each step adds the a maximising
log π(y_w | x, A∪{a}) − log π(y_l | x, A∪{a}). The candidates of a step share
every token up to the candidate attribute (the prompt, "Attributes:" and the
set chosen so far), so that prefix is read once, its KV cache copied to the
candidates, and only the rest (the candidate's name, the template's end and
the answer) is run per candidate (`shared_prefix`; the old full-sequence pass,
`lm_margins`, stays as the reference: same sequences, same choices). The memory keeps, per distinct
prompt, the best-scoring set (store blobs of kind "exact_memory", key = the
prompt). Online, the new prompt's nearest memory prompt (cosine of encoder
embeddings) lends its attributes, appended as a line "Attributes: a1, a2, a3"
(the EXACT paper, §4.1), and the base model decodes. The chosen set is returned in
Generation.trace = [{"attributes", "retrieved_prompt", "similarity"}].
"""

from __future__ import annotations

import copy
import json
import statistics
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch
from transformers import DynamicCache

from personalize.serving.rows import DecodeRow
from personalize.serving.generation import Generation
from personalize.serving.settings import DecodingSettings
from personalize.lm.features import teacher_forced
from personalize.lm.onednn import onednn_linears
from personalize.lm.tokens import prompt_ids, target_ids
from personalize.methods.base import UserContext, clip, framed_generate, framed_rows, task_input, widened

# the EXACT paper's Table 4 (42 attributes, from Drift); the descriptions are ours, for the app's "why" view.
ATTRIBUTES: dict[str, str] = {
    "Base": "no particular steer: the model's default answer",
    "Formal": "formal register, complete sentences, no colloquialisms",
    "Concise": "short and to the point, no filler",
    "Vivid": "concrete, colourful imagery and word choice",
    "Modest": "humble, understated claims",
    "Engineer": "technical precision, an engineer's level of detail",
    "Persuasive": "argues to win the reader over",
    "Emotion": "feelings expressed openly",
    "Humor": "playful, witty, funny",
    "Energy": "lively, upbeat, enthusiastic",
    "Code": "code, commands and identifiers where they fit",
    "Easy": "plain words any reader follows",
    "Direct": "says the point plainly, without hedging",
    "Social": "friendly and conversational, addresses people",
    "Western": "Western cultural references and norms",
    "Eastern": "Eastern cultural references and norms",
    "Respect": "polite and respectful",
    "Internet Slang": "online slang, abbreviations and emoji",
    "Proverb": "sayings and proverbs",
    "Critical": "questions claims and points out flaws",
    "Vague": "general, non-committal wording",
    "Creative": "original, imaginative phrasing",
    "Analytic": "logical, step-by-step reasoning",
    "Empathetic": "acknowledges the reader's feelings",
    "Sycophant": "flatters and agrees with the reader",
    "Old-fashioned": "traditional, dated wording and values",
    "Meritocratic": "values effort, skill and achievement",
    "Myopic": "looks only at the immediate, short term",
    "Principled": "guided by firm moral principles",
    "Hedonist": "values pleasure and enjoyment",
    "Utilitarian": "weighs outcomes: the greatest good",
    "Realist": "pragmatic, sees things as they are",
    "Pessimistic": "expects the worst",
    "Storyteller": "narrates, tells anecdotes",
    "Flexible": "open to alternatives, adaptable",
    "Spontaneous": "impulsive, off the cuff",
    "Collectivist": "puts the group and community first",
    "Individualistic": "puts personal freedom first",
    "Exclamatory": "exclamations!",
    "Conspiracy": "suspects hidden agendas",
    "Tech Industry Priority": "favours the tech industry's view and priorities",
    "Eco-friendly": "cares about the environment",
}
MEMORY_KIND = "exact_memory"
ATTR_TOKENS = 48  # room for the attribute line past the prompt budget
PAIRS_PER_TURN = 4  # history pairs decoded per hold of the model lock (~3.7 s on 2 cores for the studio's 4)

Row = tuple[str, str, str, tuple[str, ...]]  # (x, y_w, y_l, attribute set)
ScoreFn = Callable[[Sequence[Row]], np.ndarray]


@dataclass(frozen=True)
class ExactConfig:
    k: int = 3  # attributes per prompt (the EXACT paper's default)
    library: tuple[str, ...] = tuple(ATTRIBUTES)
    max_pairs: int = 32  # history pairs scored at onboarding (newest first); ratings always count
    batch_size: int = 32  # sequences per forward in the scoring pass (memory, not semantics)
    shared_prefix: bool = True  # score a step's candidates over one cached prefix (False: the full-sequence pass)

    def __post_init__(self):
        if not 1 <= self.k <= len(self.library):
            raise ValueError(f"k must be in 1..{len(self.library)}, got {self.k}")
        if len(set(self.library)) != len(self.library) or any("," in a for a in self.library):
            raise ValueError("library attributes must be distinct and contain no commas")
        if self.max_pairs < 1 or self.batch_size < 2:
            raise ValueError("max_pairs must be >= 1 and batch_size >= 2")


def attributed(x: str, attrs: Sequence[str]) -> str:
    """The EXACT paper, §4.1: the prompt, then a line "Attributes:" with the comma-separated set."""
    return f"{x}\nAttributes: {', '.join(attrs)}" if attrs else x


class ExactMethod:
    name = "exact"
    batch = "a plain row on the frozen LM; its prompt ends with the retrieved attribute line"
    config_class = ExactConfig
    stored = "attribute memory (JSON)"
    first_use_note = "searching attributes for your {max_pairs} newest history items"

    def __init__(self, engine, store=None, cfg: ExactConfig = ExactConfig(), score_fn: ScoreFn | None = None):
        self.engine, self.store, self.cfg = engine, store, cfg
        self.score_fn: ScoreFn = score_fn or (self.cached_margins if cfg.shared_prefix else self.lm_margins)
        self.lock = nullcontext()  # the studio's model lock, taken per forward: decodes run between the chunks
        self.progress: Callable[[int, int], None] | None = None  # (pairs × steps done, total) while preparing
        self._memory: dict[str, dict[str, dict]] = {}  # user -> prompt -> entry (the store's copy when present)
        self._vectors: dict[str, np.ndarray] = {}  # prompt content -> unit embedding

    # ------------------------------------------------------------ scoring and greedy selection
    def lm_margins(self, rows: Sequence[Row]) -> np.ndarray:
        """log π(y_w | x, A) − log π(y_l | x, A) under the base model, every row in one teacher-forced pass."""
        e, budget = self.engine, self.engine.cfg.budget
        examples = []
        for x, yw, yl, attrs in rows:
            p = attributed(clip(e.tok, x, budget.max_prompt_tokens), attrs)
            examples += [(p, yw), (p, yl)]
        with self.lock:
            e.use_adapter(None)
            feats = teacher_forced(e.model, e.tok, examples, 1, widened(budget, ATTR_TOKENS),
                                   batch_size=self.cfg.batch_size)
        lp = np.array([float(f.logprob.sum()) for f in feats])
        return lp[0::2] - lp[1::2]

    @torch.no_grad()
    def cached_margins(self, rows: Sequence[Row]) -> np.ndarray:
        """lm_margins' values with each group of rows that share a pair and a chosen set read over one
        cached prefix: the same token sequences (each built whole, as lm_margins builds them), the linear layers
        through oneDNN on the CPU (lm/onednn.py)."""
        e = self.engine
        budget = widened(e.cfg.budget, ATTR_TOKENS)
        groups: dict[tuple, list[int]] = {}
        for i, (x, yw, yl, attrs) in enumerate(rows):
            groups.setdefault((x, yw, yl, attrs[:-1]), []).append(i)
        out = np.zeros(len(rows))
        for idx in groups.values():
            seqs, n_prompt = [], []
            for i in idx:
                x, yw, yl, attrs = rows[i]
                p = prompt_ids(e.tok, attributed(clip(e.tok, x, e.cfg.budget.max_prompt_tokens), attrs), budget)
                for y in (yw, yl):
                    seqs.append(p + target_ids(e.tok, y, budget))
                    n_prompt.append(len(p))
            lp = self._answer_logprobs(seqs, n_prompt)
            out[idx] = lp[0::2] - lp[1::2]
        return out

    def _answer_logprobs(self, seqs: list[list[int]], n_prompt: list[int]) -> np.ndarray:
        """Σ log π(answer tokens) of each sequence: their common prefix (inside every prompt) is run once and its
        cache copied to the others, which run right-padded after it; the LM head runs at answer positions only."""
        e = self.engine
        lm = e.model.get_base_model()
        n = min(n_prompt) - 1  # at least one prompt token after the prefix: it predicts the first answer token
        first = seqs[0]
        while n > 0 and any(s[:n] != first[:n] for s in seqs):
            n -= 1
        dev = e.model.device
        out = np.zeros(len(seqs))
        with self.lock, onednn_linears(e.model):
            e.use_adapter(None)
            prefix = DynamicCache()
            if n:
                lm.model(input_ids=torch.tensor([first[:n]], device=dev), past_key_values=prefix, use_cache=True)
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))  # chunks of like lengths: little padding
        for c in range(0, len(seqs), self.cfg.batch_size):
            chunk = order[c: c + self.cfg.batch_size]
            rest = [seqs[i][n:] for i in chunk]
            width = max(map(len, rest))
            ids = torch.full((len(rest), width), e.tok.pad_token_id, dtype=torch.long)
            mask = torch.zeros((len(rest), n + width), dtype=torch.long)
            mask[:, :n] = 1
            for j, r in enumerate(rest):
                ids[j, : len(r)] = torch.tensor(r)
                mask[j, n: n + len(r)] = 1
            cache = copy.deepcopy(prefix)
            if n:
                cache.batch_repeat_interleave(len(rest))
            with self.lock, onednn_linears(e.model):
                e.use_adapter(None)
                h = lm.model(input_ids=ids.to(dev), attention_mask=mask.to(dev), past_key_values=cache, use_cache=True,
                             position_ids=(n + torch.arange(width)).expand(len(rest), width).to(dev)).last_hidden_state
                for j, i in enumerate(chunk):  # positions n_prompt-1 .. end-1 predict the answer tokens
                    pos = torch.arange(n_prompt[i] - 1 - n, len(seqs[i]) - 1 - n, device=dev)
                    logp = torch.log_softmax(lm.lm_head(h[j, pos]).float(), -1)
                    tgt = torch.tensor(seqs[i][n_prompt[i]:], device=dev)
                    out[i] = float(logp[torch.arange(len(tgt), device=dev), tgt].sum())
        return out

    def select(self, pairs: Sequence[tuple[str, str, str]]) -> list[dict]:
        """Greedy k-attribute set per pair, in lockstep: step t scores every pair's candidates in one call."""
        chosen: list[list[str]] = [[] for _ in pairs]
        best = np.zeros(len(pairs))
        base = np.asarray(self.score_fn([(x, yw, yl, ()) for x, yw, yl in pairs]), dtype=float)
        for step in range(self.cfg.k):
            if self.progress:
                self.progress(1 + step, 1 + self.cfg.k)
            rows, owner = [], []
            for j, (x, yw, yl) in enumerate(pairs):
                for a in self.cfg.library:
                    if a not in chosen[j]:
                        rows.append((x, yw, yl, (*chosen[j], a)))
                        owner.append(j)
            scores = np.asarray(self.score_fn(rows), dtype=float)
            owner = np.asarray(owner)
            for j in range(len(pairs)):
                idx = np.flatnonzero(owner == j)
                top = idx[int(np.argmax(scores[idx]))]  # first maximum: library order breaks ties
                chosen[j].append(rows[top][3][-1])
                best[j] = scores[top]
        return [{"prompt": x, "attributes": c, "score": float(s), "base_score": float(b)}
                for (x, _, _), c, s, b in zip(pairs, chosen, best, base)]

    # ------------------------------------------------------------ pairs
    def history_pairs(self, user: UserContext) -> list[tuple[str, str, str]]:
        """(x, the user's text, the base model's output for x): the app's own pairs. The base model's outputs are
        decoded PAIRS_PER_TURN at a time, each under the lock (the studio's: a waiting person goes between), by the
        mixed-batch runner (the same texts as generate's, a third faster)."""
        items = user.items[: self.cfg.max_pairs]
        budget = self.engine.cfg.budget
        s = DecodingSettings(max_new_tokens=budget.max_target_tokens)
        outs: list[Generation] = []
        for i in range(0, len(items), PAIRS_PER_TURN):
            with self.lock:
                outs += self.engine.decode_rows([DecodeRow(it.x, budget, s) for it in items[i: i + PAIRS_PER_TURN]])
        return [(it.x, it.y, g.text) for it, g in zip(items, outs) if g.text.strip() != it.y.strip()]

    def rating_pairs(self, name: str) -> list[tuple[str, str, str]]:
        """(prompt, preferred, other) from this user's decided ratings; ties and both_bad say nothing."""
        if self.store is None:
            return []
        out = []
        for r in self.store.ratings():
            if r["user"] != name or r["winner"] not in ("a", "b"):
                continue
            win, lose = (r["output_a"], r["output_b"]) if r["winner"] == "a" else (r["output_b"], r["output_a"])
            if win.strip() != lose.strip():
                out.append((r["prompt"], win, lose))
        return out

    # ------------------------------------------------------------ memory
    def stored_bytes(self, user, info: dict) -> int:
        return sum(len(json.dumps(e).encode()) for e in self.memory(user.name).values())

    @staticmethod
    def bench_figures(infos: Sequence[dict]) -> dict:
        """Its greedy attribute selection alone, the median over people."""
        return {"indexing_s": round(statistics.median(i["select_s"] for i in infos), 4)}

    def memory(self, name: str) -> dict[str, dict]:
        """prompt -> {"prompt", "attributes", "score", "base_score", "source"}; the store is the truth."""
        if self.store is not None:
            self._memory[name] = {b["key"]: b["value"] for b in self.store.blobs(name, MEMORY_KIND)}
        return self._memory.setdefault(name, {})

    def forget_user(self, name: str) -> None:
        """Drops the in-memory copy of a forgotten user's memory (the store's is deleted with the user)."""
        self._memory.pop(name, None)

    def _merge(self, name: str, entries: list[dict], source: str) -> int:
        """Adds entries, keeping per prompt the best-scoring set (the EXACT paper, §4.1); returns how many changed."""
        mem, changed = self.memory(name), 0
        for e in entries:
            old = mem.get(e["prompt"])
            if old is None or e["score"] > old["score"]:
                entry = e | {"source": source}
                mem[e["prompt"]] = entry
                if self.store is not None:
                    self.store.put_blob(name, MEMORY_KIND, e["prompt"], entry)
                changed += 1
        return changed

    def is_prepared(self, user: UserContext) -> bool:
        return bool(self.memory(user.name))

    def prepare(self, user: UserContext, progress: Callable[[int, int], None] | None = None) -> dict:
        """Builds the memory from the history pairs and this user's ratings; `progress(done, total)` counts the
        negatives' decode and each greedy step."""
        t0 = time.perf_counter()
        if progress:
            progress(0, 1 + self.cfg.k)
        hist = self.history_pairs(user)
        t1 = time.perf_counter()
        rated = self.rating_pairs(user.name)
        if not hist and not rated:
            raise ValueError(f"{self.name} needs at least one preference pair for user {user.name!r}: "
                             "a history item or a decided rating")
        self.progress = progress
        try:
            entries = self.select(hist + rated)
        finally:
            self.progress = None
        if progress:
            progress(1 + self.cfg.k, 1 + self.cfg.k)
        changed = self._merge(user.name, entries[: len(hist)], "history")
        changed += self._merge(user.name, entries[len(hist):], "rating")
        t2 = time.perf_counter()
        return {"method": self.name, "n_pairs": len(entries), "n_rating_pairs": len(rated),
                "memory": len(self.memory(user.name)), "changed": changed,
                "negatives_s": round(t1 - t0, 4), "select_s": round(t2 - t1, 4)}

    def add_feedback(self, user: UserContext, prompt: str, preferred: str, other: str) -> dict:
        """One new pair (e.g. a rating in the app) into the memory, without a rebuild; returns its entry."""
        if preferred.strip() == other.strip():
            raise ValueError("preferred and other output are the same text: no preference to learn")
        entry = self.select([(prompt, preferred, other)])[0]
        self._merge(user.name, [entry], "feedback")
        return self.memory(user.name)[prompt]

    # ------------------------------------------------------------ retrieval and generation
    def _embed(self, texts: list[str]) -> np.ndarray:
        todo = [t for t in dict.fromkeys(texts) if t not in self._vectors]
        if todo:
            vecs = self.engine.encoder.encode(todo, convert_to_numpy=True, normalize_embeddings=True)
            self._vectors |= dict(zip(todo, np.asarray(vecs, dtype=np.float32)))
        return np.stack([self._vectors[t] for t in texts])

    def retrieve(self, user: UserContext, prompts: list[str]) -> list[tuple[dict, float]]:
        """(memory entry, cosine) of each prompt's nearest memory prompt (compared without the task instruction)."""
        mem = self.memory(user.name)
        if not mem:
            self.prepare(user)
            mem = self.memory(user.name)
        entries = list(mem.values())
        keys = self._embed([task_input(self.engine.task, e["prompt"]) for e in entries])
        query = self._embed([task_input(self.engine.task, p) for p in prompts])
        sims = query @ keys.T
        return [(entries[int(i)], float(row[i])) for row, i in zip(sims, sims.argmax(1))]

    def _built(self, user: UserContext, prompts: list[str]) -> list[tuple[str, list]]:
        """(prompt with the retrieved attributes appended, trace) per prompt."""
        hits = self.retrieve(user, prompts)
        budget = self.engine.cfg.budget
        return [(attributed(clip(self.engine.tok, p, budget.max_prompt_tokens), e["attributes"]),
                 [{"attributes": list(e["attributes"]), "retrieved_prompt": e["prompt"], "similarity": round(sim, 4)}])
                for p, (e, sim) in zip(prompts, hits)]

    def generate(self, user: UserContext, prompts: list[str], settings: DecodingSettings) -> list[Generation]:
        """Base-model decoding with the retrieved attributes appended to each prompt."""
        return framed_generate(self.engine, self._built(user, prompts) if prompts else [], ATTR_TOKENS, settings)

    def rows(self, user: UserContext, prompts: list[str], settings: DecodingSettings,
             trace: bool = False) -> list[DecodeRow]:
        return framed_rows(self.engine, self._built(user, prompts), ATTR_TOKENS, settings)
