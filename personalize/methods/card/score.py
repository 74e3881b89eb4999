"""The teacher-forced score of a text after a row's prompt: under a plain row the model's own softmax, under a CARD
row the distribution CARD decodes from (style.style_scores on the step's top-k and the memory's tokens, with the
form bias on the answer's opening), so a gold text's log-probability says what decoding would give it.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Sequence

import torch

from personalize.methods.card.head import opening_keys
from personalize.methods.card.style import StyleTensors, style_scores
from personalize.lm.features import HiddenCapture
from personalize.lm.prefix import position_ids
from personalize.lm.onednn import onednn_linears
from personalize.lm.tokens import left_pad, prompt_ids, target_ids
from personalize.methods.card.steer import CardSteer
from personalize.serving.row_lora import NO_ADAPTER, row_loras, supported
from personalize.serving.rows import DecodeRow
from personalize.serving.runner import check_adapters


def _pick(ids: torch.Tensor, scores: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """log-softmax of each step's scores at the target token ([T, m] → [T]); −inf where it is not a candidate."""
    logp = scores.float().log_softmax(-1)
    hit = ids == target[:, None]  # a candidate set holds a token once
    return torch.where(hit.any(1), logp.masked_fill(~hit, 0.0).sum(1), float("-inf"))


def card_logprobs(row: DecodeRow, logits: torch.Tensor, h: torch.Tensor, target: torch.Tensor,
                  widen: bool = True) -> torch.Tensor:
    """Per-step log-probabilities [T] of `target` under a CARD row's decoding distribution, from the cluster
    model's logits [T, V] and the states h [T, nH] that predict each token: exactly what CardLogitsProcessor
    gives at each step, log-softmaxed. A token outside the step's candidates (the top-k and the memory's
    tokens) is one decoding never picks: −inf, or with `widen` its log-prob among the candidates and itself."""
    st, s = row.steer, row.settings
    vals, cand = logits.float().topk(min(s.top_k, logits.shape[-1]), dim=-1)
    openings = opening_keys(target.tolist())  # the answer's tokens before each step

    def scored(rows, cand_, vals_):
        tensors = StyleTensors.of([st.style] * len(rows), st.settings)
        ids, sc = style_scores(st.head, tensors, st.settings, h[rows], cand_, vals_, s.alpha, s.standardize,
                               openings=[openings[int(r)] for r in rows])
        return _pick(ids, sc, target[rows])

    everything = torch.arange(len(target))
    out = scored(everything, cand, vals)
    miss = torch.isinf(out).nonzero()[:, 0]
    if widen and len(miss):
        t = target[miss, None]
        out[miss] = scored(miss, torch.cat([cand[miss], t], 1),
                           torch.cat([vals[miss], logits[miss].float().gather(1, t)], 1))
    return out


@torch.no_grad()
def score_sequences(model, tok, rows: Sequence[DecodeRow], candidates: Sequence[str | Sequence[int]],
                    length_norm: bool = False, widen: bool = True, batch_size: int = 32) -> torch.Tensor:
    """The teacher-forced score [N] of candidate i after row i's prompt, under row i's adapter and steer: the
    sum (or, `length_norm`, the mean) over its tokens of log p(token | prompt, tokens before). A plain row (no
    steer) reads the model's own softmax; a CARD row the distribution CARD decodes from (card_logprobs). A
    text is tokenised as training does (tokens.target_ids: the row's budget, end-of-sequence appended); a list
    of token ids is scored as given. One forward pass per `batch_size` rows, every row with its own LoRA."""
    if len(rows) != len(candidates):
        raise ValueError(f"{len(rows)} rows for {len(candidates)} candidates")
    if any(r.steer is not None and not isinstance(r.steer, CardSteer) for r in rows):
        raise ValueError("score_sequences scores plain and CARD rows only")
    layers = {r.steer.n_layers for r in rows if isinstance(r.steer, CardSteer)}
    if len(layers) > 1:
        raise ValueError(f"CARD rows of one call must read the same layers, got {sorted(layers)}")
    targets = [target_ids(tok, c, r.budget) if isinstance(c, str) else [int(t) for t in c]
               for r, c in zip(rows, candidates)]
    if any(not t for t in targets):
        raise ValueError("a candidate without tokens")
    out = torch.empty(len(rows))
    for i in range(0, len(rows), batch_size):
        sl = slice(i, i + batch_size)
        lps = _chunk_logprobs(model, tok, rows[sl], targets[sl], next(iter(layers), 0), widen)
        out[sl] = torch.stack([lp.mean() if length_norm else lp.sum() for lp in lps])
    return out


def _chunk_logprobs(model, tok, rows: Sequence[DecodeRow], targets: Sequence[list[int]], n_layers: int,
                    widen: bool) -> list[torch.Tensor]:
    seqs = [prompt_ids(tok, r.prompt, r.budget) + t for r, t in zip(rows, targets)]
    ids, mask = left_pad(seqs, tok.pad_token_id, model.device)
    keep = max(len(t) for t in targets) + 1  # left padding: every candidate sits in the last columns
    adapters = [r.adapter or NO_ADAPTER for r in rows]
    with ExitStack() as stack:
        cap = stack.enter_context(HiddenCapture(model, n_layers)) if n_layers else None
        kwargs = dict(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask), logits_to_keep=keep)
        if hasattr(model, "peft_config"):
            check_adapters(model, adapters)
            if supported(model, adapters):  # each row's LoRA gathered into one matmul pair per module
                stack.enter_context(onednn_linears(model))
                stack.enter_context(row_loras(model, adapters))
            else:  # a DoRA or merged adapter: peft's own mixed-adapter path
                kwargs["adapter_names"] = adapters
        elif any(a != NO_ADAPTER for a in adapters):
            raise ValueError("rows with adapters need a peft model")
        logits = model(**kwargs).logits
        h = torch.cat([o[:, -keep:] for o in cap.outputs], -1).float().cpu() if cap else None
    out = []
    for j, (r, t) in enumerate(zip(rows, targets)):
        pos = torch.arange(keep - len(t) - 1, keep - 1)  # the positions that predict the candidate's tokens
        lg, tgt = logits[j, pos.to(logits.device)].float().cpu(), torch.tensor(t)
        if isinstance(r.steer, CardSteer):
            out.append(card_logprobs(r, lg, h[j, pos], tgt, widen))
        else:
            out.append(lg.log_softmax(-1).gather(1, tgt[:, None])[:, 0])
    return out
