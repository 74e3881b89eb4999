"""Reranking by the person's style (issue 23, item 2a): `card_rerank`, a CARD variant.

Teacher-forced, a person's style ranks their real text well, but greedy decoding with a per-token correction
barely moves the text: at each step it can only reorder the cluster model's top-k, and a different first
token rarely pays off within a greedy path. `card_rerank` scores whole sequences instead:

1. candidates: `RerankSettings.n` outputs of the cluster model for each prompt, decoded in ONE mixed batch
   (serving.runner.decode_rows, every person and cluster together, each prompt prefilled once): its greedy output and
   CARD's own greedy output (so reranking can never do worse, on the style's own score, than choosing
   between the two), and samples (temperature, top-p within the decoding top-k), each row with its own
   seed (serving.rows.SampleSteer), so a person's candidates do not depend on who else is in the batch;
2. `score_sequences`: every candidate teacher-forced under the person's style in one forward pass per chunk
   of rows, the per-step log-probabilities of the distribution CARD decodes from (style.style_scores on the
   top-k, log-softmax over the step's candidates: the cluster model's log-prob plus α·correction,
   normalised as decoding normalises it), summed or averaged over the candidate's tokens;
3. the highest score is kept (ties: the first candidate, the cluster model's greedy output).

`score_sequences` also gives the teacher-forced log-probability of any text (a person's gold, say) under a
plain row (the model's own softmax) or a CARD row (the style's decoding distribution).
"""

from __future__ import annotations

import hashlib
import time
from contextlib import ExitStack
from dataclasses import dataclass, replace
from typing import Sequence

import torch

from personalize.card.adapters import BASE_ADAPTER, adapter_name
from personalize.methods.card.steer import CardSteer, card_parts
from personalize.serving.rows import DecodeRow, SampleSteer
from personalize.serving.runner import check_adapters
from personalize.card.decoding import RerankSettings, DecodingSettings, Generation
from personalize.lm.features import HiddenCapture, position_ids
from personalize.lm.onednn import onednn_linears
from personalize.serving.row_lora import NO_ADAPTER, row_loras, supported
from personalize.card.head import next_opening, opening_key
from personalize.card.style import StyleTensors, style_scores
from personalize.lm.tokens import left_pad, prompt_ids, target_ids


@dataclass(frozen=True)
class Query:
    """One output to choose: the prompt and the person (cluster, K, style: a UserStyle, a λ or None for λ = 1)."""

    prompt: str
    cluster: int = 0
    k: int | None = None
    style: object = None


# ---------------------------------------------------------------- the sequence score

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
    openings, key = [], opening_key(())  # the answer's tokens before each step, as decoding's form bias reads them
    for t in target.tolist():
        openings.append(key)
        key = next_opening(key, t)

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


# ---------------------------------------------------------------- candidates and the choice

def sample_seed(seed: int, prompt: str, j: int) -> int:
    """The j-th sample's seed for a prompt: the same draw wherever the row sits in a batch."""
    return int.from_bytes(hashlib.sha1(f"{seed}\x1f{j}\x1f{prompt}".encode()).digest()[:8], "little") >> 1


def candidate_rows(engine, q: Query, s: DecodingSettings, rs: RerankSettings, objective: str | None = None,
                   budget=None) -> tuple[list[DecodeRow], list[str], DecodeRow]:
    """(the candidates' rows, their labels, the CARD row that scores them) for one query."""
    budget = budget or engine.cfg.budget
    k = q.k or engine.cfg.default_k
    ada = adapter_name(k, q.cluster) if k > 1 else BASE_ADAPTER
    greedy = replace(s, do_sample=False, alpha=rs.alpha)
    head, style, (st,), cs = card_parts(engine, "card_rerank", q.style, 1, greedy, objective)
    card = DecodeRow(q.prompt, budget, cs, ada, CardSteer(head, st, style, engine.cfg.head.n_layers))
    rows, labels = ([DecodeRow(q.prompt, budget, greedy, ada), card], ["cluster", "card"]) if rs.greedy else ([], [])
    for j in range(rs.n - len(rows)):
        rows.append(DecodeRow(q.prompt, budget, greedy, ada,
                              SampleSteer(sample_seed(rs.seed, q.prompt, j), rs.temperature, rs.top_p)))
        labels.append(f"sample {j + 1}")
    return rows, labels, card


def rerank(engine, queries: Sequence[Query], settings: DecodingSettings | None = None,
           rs: RerankSettings | None = None, objective: str | None = None, budget=None) -> list[Generation]:
    """Each query's candidates (every query's in one mixed batch), scored under its person's style (one pass per
    chunk), the best kept. Generation.trace: the candidates with their scores, the chosen one marked;
    latency_s: the whole work (decoding and scoring) divided among the queries."""
    s = settings or engine.cfg.decoding
    rs = rs or engine.cfg.rerank
    if not queries:
        return []
    t0 = time.perf_counter()
    plan = [candidate_rows(engine, q, s, rs, objective, budget) for q in queries]
    gens = engine.decode_rows([r for rows, _, _ in plan for r in rows])
    eos, score_rows, texts, slot, at = engine.tok.eos_token_id, [], [], {}, 0
    for i, (rows, _, card) in enumerate(plan):  # a text that several candidates of a query share: scored once
        for g in gens[at: at + len(rows)]:
            if (i, g.text) not in slot:
                slot[i, g.text] = len(texts)
                score_rows.append(card)
                texts.append(engine.tok(g.text, add_special_tokens=False)["input_ids"] + [eos])
        at += len(rows)
    scores = score_sequences(engine.model, engine.tok, score_rows, texts, length_norm=rs.length_norm)
    per = (time.perf_counter() - t0) / len(queries)
    out, at = [], 0
    for i, (rows, labels, _) in enumerate(plan):
        cands = gens[at: at + len(rows)]
        at += len(rows)
        sc = torch.stack([scores[slot[i, g.text]] for g in cands])
        best = int(sc.argmax())  # the first of equal scores: the cluster model's greedy output comes first
        trace = [{"candidate": lab, "text": g.text, "score": float(v), "chosen": j == best}
                 for j, (lab, g, v) in enumerate(zip(labels, cands, sc))]
        out.append(Generation(cands[best].text, cands[best].n_tokens, per, trace))
    return out
