"""COPE decoding (the COPE paper's Eq. 1-3, METHOD §3): contrast the user's model with the task model over a plausible head.

V_head = {y : π_user(y|·) ≥ τ·max π_user}; next token = argmax over V_head of
log π_user(y) − α·log π_base(y) (τ = 0.1, α = 0.3 for LaMP). π_user is the
user's cluster LoRA "k{K}c{c}" (the K = 1 adapter when K = 1), π_base the
K = 1 task adapter (or "__base__", the frozen LM).

Both distributions come from ONE batched forward per step: the batch is
duplicated, rows [0, B) run the user's adapter and rows [B, 2B) the base
adapter through peft's mixed-adapter batches (`generate(adapter_names=...)`),
each row with its own KV cache. The processor writes the same contrastive
scores to row i and row i + B, so both copies pick the same token and stay
identical. COPE is an argmax rule, so decoding is always greedy.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from personalize.methods.card.adapters import BASE_ADAPTER, cluster_adapter
from personalize.serving.row_lora import NO_ADAPTER
from personalize.serving.rows import DecodeRow, Steer
from personalize.serving.generation import Generation, repetition_processors
from personalize.serving.settings import DecodingSettings
from personalize.lm.tokens import decode, left_pad, prompt_ids
from personalize.lm.utf8 import utf8_guard
from personalize.methods.base import UserContext



@dataclass(frozen=True)
class CopeConfig:
    alpha: float = 0.3  # contrastive weight (the COPE paper: 0.3 LaMP, 0.1 long form); 0 = the user's model
    tau: float = 0.1  # plausibility threshold, relative to the user model's top probability
    base_adapter: str = BASE_ADAPTER  # π_base: the K = 1 task adapter, or "__base__" for the frozen LM

    def __post_init__(self):
        if self.alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {self.alpha}")
        if not 0 <= self.tau <= 1:
            raise ValueError(f"tau must be in [0, 1], got {self.tau}")


class CopeLogitsProcessor(LogitsProcessor):
    """Scores of a duplicated batch [user rows; base rows] → the same contrastive scores on both halves."""

    def __init__(self, alpha: float, tau: float, batch_size: int):
        self.alpha, self.batch_size = alpha, batch_size
        self.log_tau = math.log(tau) if tau > 0 else float("-inf")
        self.trace: list[dict] | None = None  # set to [] to record V_head and the choice at every step

    @torch.no_grad()
    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        b = self.batch_size
        if scores.shape[0] != 2 * b:
            raise ValueError(f"COPE expects a duplicated batch of {2 * b} rows, got {scores.shape[0]}")
        user = torch.log_softmax(scores[:b].float(), -1)
        base = torch.log_softmax(scores[b:].float(), -1)
        head = user >= user.max(-1, keepdim=True).values + self.log_tau  # π_user ≥ τ·max π_user
        head &= torch.isfinite(user)  # a token masked before (whole characters only) stays masked, also at τ = 0
        reward = torch.where(head, user - self.alpha * base, torch.full_like(user, float("-inf")))
        if self.trace is not None:
            best = reward.argmax(-1)
            rows = torch.arange(b, device=best.device)
            self.trace.append({"head": [h.nonzero().squeeze(-1).cpu() for h in head], "token": best.cpu(),
                               "user_logprob": user[rows, best].cpu(), "base_logprob": base[rows, best].cpu()})
        return torch.cat([reward, reward]).to(scores.dtype)


@dataclass(frozen=True)
class CopeSteer(Steer):
    """COPE's contrast on a row of a mixed batch (serving.rows.Steer): the row gets a twin running `base_adapter`,
    and CopeLogitsProcessor gives both the same contrastive scores, so both pick the same token."""

    alpha: float
    tau: float
    base_adapter: str
    twin_error = "COPE: the user and base copies of a row chose different tokens"

    @property
    def twin_adapter(self) -> str:
        return self.base_adapter

    def processors(self, settings, first, repeats, hidden, trace):
        proc = CopeLogitsProcessor(self.alpha, self.tau, 1)
        if trace:
            proc.trace = []
        return [*first, proc, *repeats], (proc if trace else None)

    def steps(self, tracer, new, k: int) -> list:
        """One dict per step, as CopeMethod.generate gives them."""
        return [{"head": s["head"][0], "token": int(s["token"][0]), "user_logprob": float(s["user_logprob"][0]),
                 "base_logprob": float(s["base_logprob"][0])} for s in tracer.trace[:k]]


class CopeMethod:
    name = "cope"
    batch = "a row on π_user (the cluster LoRA) and a twin row on π_base; both get the contrastive scores"
    config_class = CopeConfig

    def __init__(self, engine, store=None, cfg: CopeConfig = CopeConfig()):
        self.engine, self.store, self.cfg = engine, store, cfg

    def adapters(self, user: UserContext) -> tuple[str, str]:
        """(π_user, π_base) adapter names, checked against the loaded ones."""
        name = cluster_adapter(user.k, user.cluster)
        loaded = self.engine.loaded_adapters() | {NO_ADAPTER}
        for n in (name, self.cfg.base_adapter):
            if n not in loaded:
                raise ValueError(f"adapter {n!r} is not loaded; loaded: {sorted(loaded)}")
        return name, self.cfg.base_adapter

    def prepare(self, user: UserContext, progress=None) -> dict:
        """Nothing to index: the history acts through the cluster adapter chosen at onboarding."""
        t0 = time.perf_counter()
        u, b = self.adapters(user)
        return {"method": self.name, "user_adapter": u, "base_adapter": b, "n_items": len(user.items),
                "prepare_s": round(time.perf_counter() - t0, 4)}

    def is_prepared(self, user: UserContext) -> bool:
        return True

    def rows(self, user: UserContext, prompts: list[str], settings: DecodingSettings,
             trace: bool = False) -> list[DecodeRow]:
        """One row per prompt on π_user, with a twin on π_base (serving/runner.py); COPE is greedy."""
        user_ad, base_ad = self.adapters(user)
        s = replace(settings, do_sample=False)
        return [DecodeRow(p, self.engine.cfg.budget, s, user_ad, CopeSteer(self.cfg.alpha, self.cfg.tau, base_ad),
                          want_trace=trace) for p in prompts]

    @torch.no_grad()
    def generate(self, user: UserContext, prompts: list[str], settings: DecodingSettings,
                 trace: bool = False) -> list[Generation]:
        """Greedy COPE decoding. With trace, Generation.trace holds one dict per step:
        {"head": V_head ids, "token", "user_logprob", "base_logprob"} (the app's "why" view, the tests' check)."""
        e, n = self.engine, len(prompts)
        user_ad, base_ad = self.adapters(user)
        if not prompts:
            return []
        e.use_adapter(user_ad)  # adapters on; each row then runs the adapter adapter_names gives it
        ids, mask = left_pad([prompt_ids(e.tok, x, e.cfg.budget) for x in prompts], e.tok.pad_token_id, e.model.device)
        proc = CopeLogitsProcessor(self.cfg.alpha, self.cfg.tau, n)
        utf8 = utf8_guard(e.tok, ids.shape[1])
        if trace:
            proc.trace = []
        t0 = time.perf_counter()
        out = e.model.generate(
            input_ids=torch.cat([ids, ids]), attention_mask=torch.cat([mask, mask]),
            adapter_names=[user_ad] * n + [base_ad] * n,
            logits_processor=LogitsProcessorList([*([utf8] if utf8 else []), proc,
                                                  *repetition_processors(settings, ids.shape[1], e.tok.eos_token_id, utf8,
                                                                         e.tok)]),
            max_new_tokens=settings.max_new_tokens, min_new_tokens=settings.min_new_tokens or None,
            repetition_penalty=None, pad_token_id=e.tok.pad_token_id,
            do_sample=False, temperature=None, top_k=None, top_p=None,
            disable_compile=True)  # per-row adapters: each pair of them would compile a graph of its own
        dt = time.perf_counter() - t0
        new = out[:, ids.shape[1]:]
        if not torch.equal(new[:n], new[n:]):  # the invariant the design rests on
            raise RuntimeError("COPE: the user and base copies of a row chose different tokens")
        eos, results = e.tok.eos_token_id, []
        for j, row in enumerate(new[:n].tolist()):
            k = row.index(eos) + 1 if eos in row else len(row)
            steps = None
            if trace:
                steps = [{"head": s["head"][j], "token": int(s["token"][j]),
                          "user_logprob": float(s["user_logprob"][j]), "base_logprob": float(s["base_logprob"][j])}
                         for s in proc.trace[:k]]
            results.append(Generation(decode(e.tok, row[:k]), k, dt / n, steps))
        return results
