"""Reward-guided decoding (CARD §1.5) as a transformers LogitsProcessor.

At each step the cluster model's logits ℓ_t are cut to their top-k candidates
and re-ranked by the user's correction: ℓ̃[j] = ℓ[j] + α·σ(ℓ_T)·ẑ(Δ_T)[j], with
ẑ the correction standardised over the candidates (METHOD §1.9.2), so α is in
units of the logits' spread. Only the k rows U[T_t] are multiplied. α = 0 keeps
the top-k of ℓ unchanged, so greedy decoding returns the cluster model's output.
The hidden states come from forward hooks, so generate() keeps its KV cache.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from .features import HiddenCapture
from .head import PersonalizationHead
from .tokens import TokenBudget, decode, left_pad, prompt_ids


@dataclass(frozen=True)
class DecodingSettings:
    alpha: float = 1.0  # steering strength; 0 = the cluster model
    top_k: int = 50
    max_new_tokens: int = 32
    min_new_tokens: int = 0  # > 0 only to time a fixed number of steps (bench)
    repetition_penalty: float = 1.0
    do_sample: bool = False
    temperature: float = 1.0
    standardize: bool = True

    def __post_init__(self):
        if self.alpha < 0 or self.top_k < 1 or self.max_new_tokens < 1:
            raise ValueError("alpha must be >= 0, top_k >= 1 and max_new_tokens >= 1")
        if self.repetition_penalty <= 0 or self.temperature <= 0:
            raise ValueError("repetition_penalty and temperature must be > 0")


class CardLogitsProcessor(LogitsProcessor):
    """Adds α·Δ_t on the top-k candidates and masks every other token."""

    def __init__(self, head: PersonalizationHead, lam: torch.Tensor, capture: HiddenCapture,
                 alpha: float, top_k: int, standardize: bool = True):
        self.head, self.lam, self.capture = head, lam, capture
        self.alpha, self.top_k, self.standardize = alpha, top_k, standardize
        self.trace: list[dict] | None = None  # set to [] to record each step (the app's "Why" view)

    @torch.no_grad()
    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        vals, cand = scores.topk(min(self.top_k, scores.shape[-1]), dim=-1)
        if self.alpha == 0 and self.trace is None:  # the cluster model's top-k, exactly, whatever the head holds
            return torch.full_like(scores, float("-inf")).scatter(-1, cand, vals)
        delta = self.head.correction(self.capture.last().to(self.lam.device), self.lam, cand.to(self.lam.device))
        delta = delta.to(vals.dtype).to(vals.device)
        if self.standardize:
            spread = vals.std(-1, keepdim=True).nan_to_num(0.0)
            delta = (delta - delta.mean(-1, keepdim=True)) / (delta.std(-1, keepdim=True) + 1e-6) * spread
        new = vals + self.alpha * delta
        if self.trace is not None:
            self.trace.append({"cand": cand.cpu(), "before": vals.cpu(), "after": new.cpu()})
        return torch.full_like(scores, float("-inf")).scatter(-1, cand, new)


@dataclass
class Generation:
    text: str
    n_tokens: int
    latency_s: float
    trace: list[dict] | None = None


@torch.no_grad()
def generate(model, tok, prompts: list[str], budget: TokenBudget, s: DecodingSettings,
             head: PersonalizationHead | None = None, lam: torch.Tensor | None = None,
             n_layers: int = 4, trace: bool = False, extra_processors=()) -> list[Generation]:
    """Batched decoding with the active adapter; CARD when a head and λ are given."""
    ids, mask = left_pad([prompt_ids(tok, x, budget) for x in prompts], tok.pad_token_id, model.device)
    processors = LogitsProcessorList(extra_processors)
    kwargs = dict(input_ids=ids, attention_mask=mask, max_new_tokens=s.max_new_tokens, min_new_tokens=s.min_new_tokens or None,
                  pad_token_id=tok.pad_token_id, do_sample=s.do_sample,
                  repetition_penalty=s.repetition_penalty, top_p=None)
    if s.do_sample:
        kwargs |= {"temperature": s.temperature, "top_k": None if head is not None else s.top_k}
    else:
        kwargs |= {"temperature": None, "top_k": None}
    t0 = time.perf_counter()
    if head is not None:
        with HiddenCapture(model, n_layers) as cap:
            card = CardLogitsProcessor(head, lam, cap, s.alpha, s.top_k, s.standardize)
            if trace:
                card.trace = []
            out = model.generate(**kwargs, logits_processor=LogitsProcessorList([*processors, card]))
    else:
        card = None
        out = model.generate(**kwargs, logits_processor=processors)
    dt = time.perf_counter() - t0
    eos = tok.eos_token_id
    results = []
    for row in out[:, ids.shape[1]:].tolist():
        n = row.index(eos) + 1 if eos in row else len(row)
        results.append(Generation(decode(tok, row[:n]), n, dt / len(prompts),
                                  card.trace if card is not None and trace else None))
    return results
