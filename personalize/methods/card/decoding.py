"""Reward-guided decoding (CARD, docs/METHOD.md §1.5) as a transformers LogitsProcessor.

At each step the cluster model's logits ℓ_t are cut to their top-k candidates
and re-ranked by the person's style (style.style_scores, the same rule the
held-out diagnostics use): ℓ̃ = ℓ_T + α·(Δ_T + b[T]), with Δ_t = U((P h_t) ⊙ λ)
exactly as the tokens head was trained (α = 1 as trained, docs/METHOD.md §1.9.2; pair
heads, whose Δ has no logit scale, standardise it to the logits' spread), then
mixed with the person's kNN memory (weight α·w), then no_copy.PastTextGuard keeps the
output from completing one of the person's past texts. Only the k rows U[T_t] are
multiplied. At α = 0 the processor passes ℓ on unchanged, so decoding returns the
cluster model's output whatever the style holds. The hidden states come from forward hooks,
so generate() keeps its KV cache.
"""

from __future__ import annotations

from typing import Sequence

import torch
from transformers import LogitsProcessor

from personalize.lm.features import HiddenCapture
from personalize.methods.card.head import PersonalizationHead, next_opening, opening_key
from personalize.methods.card.style import StyleTensors, UserStyle, style_scores
from personalize.methods.card.config import StyleSettings
from personalize.methods.card.no_copy import line_breaks, past_text_guard
from personalize.lm.tokens import TokenBudget
from personalize.serving import generation
from personalize.serving.generation import Generation
from personalize.serving.settings import DecodingSettings


def _one_scale(scores: torch.Tensor, ids: torch.Tensor, new: torch.Tensor) -> dict:
    """A step of the Why view on one scale: log-probabilities among the step's candidates (the top-k and the
    memory's tokens), the cluster model's ("before", from its logits at those ids) and CARD's ("after"); the
    correction is their difference. CARD's scores are logits without a memory and log-probabilities with
    one, so neither raw number can stand beside the cluster model's logits."""
    used = ids >= 0
    base = scores.detach().float().cpu().gather(-1, ids.clamp(min=0)).masked_fill(~used, float("-inf"))
    return {"cand": ids.clone(), "before": base.log_softmax(-1), "after": new.float().log_softmax(-1)}


class CardLogitsProcessor(LogitsProcessor):
    """Re-ranks the top-k candidates by each row's style and masks every other token.

    At α = 0 it hands the scores on unchanged, whatever the style holds (λ, bias, memory): the row's chain is then
    the cluster row's, token for token, also where repetition control acts after it (a penalty can move a top-k
    token below one outside the top-k). `sampled`: the row samples, and generate's own top-k is off for CARD
    rows, so the top-k is kept here at α = 0 too (the cluster row's sampling set)."""

    def __init__(self, head: PersonalizationHead, styles: StyleTensors, style: StyleSettings, capture: HiddenCapture,
                 alpha: float, top_k: int, standardize: bool = False, sampled: bool = False):
        self.head, self.styles, self.style, self.capture = head, styles, style, capture
        self.alpha, self.top_k, self.standardize, self.sampled = alpha, top_k, standardize, sampled
        self.trace: list[dict] | None = None  # set to [] to record each step (the app's "Why" view)
        self.plain = alpha == 0  # style_scores: α scales everything of the person's
        self.openings: list[int] | None = None  # each row's answer so far, as style's form bias reads it

    @torch.no_grad()
    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        vals, cand = scores.topk(min(self.top_k, scores.shape[-1]), dim=-1)
        if self.plain and self.trace is not None:  # the Why view's steps: the cluster model's top-k, as they are
            self.trace.append(_one_scale(scores, cand.cpu(), vals.cpu()))
        if self.plain:  # the cluster model exactly, whatever the head and the style hold
            return torch.full_like(scores, float("-inf")).scatter(-1, cand, vals) if self.sampled else scores
        # generate calls once a step: the first call sees the prompt alone, each later one the last token chosen
        last = input_ids[:, -1].tolist()
        self.openings = ([opening_key(())] * len(last) if self.openings is None
                         else [next_opening(k, t) for k, t in zip(self.openings, last)])
        ids, new = style_scores(self.head, self.styles, self.style, self.capture.last().cpu(), cand.cpu(),
                                vals.cpu(), self.alpha, self.standardize, openings=self.openings)
        if self.trace is not None:  # candidates and the memory's extra tokens (id -1: an unused slot)
            self.trace.append(_one_scale(scores, ids, new))
        out = torch.full_like(scores, float("-inf"))
        valid = ids >= 0
        rows = torch.arange(len(ids))[:, None].expand_as(ids)
        out[rows[valid], ids[valid].to(out.device)] = new[valid].to(out.dtype).to(out.device)
        return out


@torch.no_grad()
def card_generate(model, tok, prompts: list[str], budget: TokenBudget, s: DecodingSettings,
                  head: PersonalizationHead, styles: Sequence[UserStyle], style: StyleSettings = StyleSettings(),
                  n_layers: int = 4, trace: bool = False, scaffold: Sequence[str] = ()) -> list[Generation]:
    """serving.generation.generate with CARD's processor last before repetition control, one style per prompt;
    `trace`: each step's candidates, scores and the token really chosen (repetition control acts after CARD)."""
    if styles is None or len(styles) != len(prompts):
        raise ValueError("CARD needs one style per prompt")
    with HiddenCapture(model, n_layers) as cap:
        card = CardLogitsProcessor(head, StyleTensors.of(styles, style), style, cap, s.alpha, s.top_k,
                                   s.standardize, s.do_sample)
        card.trace = [] if trace else None
        # at α = 0: the cluster's model, unguarded
        guard = past_text_guard(styles, style, tok.eos_token_id, line_breaks(tok)) if s.alpha > 0 else None

        def chosen(out: torch.Tensor, start: int) -> None:
            for t, step in enumerate(card.trace or []):
                step["chosen"] = out[:, start + t].cpu() if start + t < out.shape[1] else None

        gens = generation.generate(model, tok, prompts, budget, s, [card, *([guard] if guard else [])], scaffold,
                                   own_top_k=False, after=chosen)
    for g in gens:
        g.trace = card.trace
    return gens
