"""Mixed batches: the outputs of many methods and many users decoded by ONE `generate` call.

A method that can join a mixed batch describes each output as a `DecodeRow` (rows.py):
its prompt, budget and settings, the LoRA the row runs (peft's mixed-adapter
batches, `adapter_names`: one adapter per row, "__base__" for the frozen LM)
and what acts on the row while it decodes: its `Steer` (rows.py), which the
method implements beside it (CARD's re-ranking with the row's own λ and α;
COPE's contrast, which adds a twin row running π_base; P2P's generated LoRA
on the row only). The runner knows no method: it asks each row's steer for its
processors, twin, hidden states and LoRA. Every row has its own chain of logits processors, applied to its
rows of the batch alone, so each row's scores are exactly those it gets when
it decodes by itself; greedy decoding then picks the same tokens (tested row
by row against each method's own `generate`, on the tiny and the bundled
model). Sampled rows decode per settings group (a shared random stream would
make one person's sample depend on who else was in the batch).
"""

from __future__ import annotations

import dataclasses
import time
from contextlib import ExitStack
from typing import Callable, Sequence

import torch
from transformers import DynamicCache, LogitsProcessor, LogitsProcessorList, StoppingCriteria, \
    StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

from personalize.serving.generation import EchoStop, Generation, MinNewTokens, repetition_processors, sampling, \
    trim_echo
from personalize.serving.settings import DecodingSettings
from personalize.lm.utf8 import utf8_guard
from personalize.lm.features import HiddenCapture
from personalize.lm.prefix import position_ids
from personalize.lm.models import compile_switch, uses_static_cache
from personalize.lm.onednn import onednn_linears
from personalize.lm.tokens import decode, left_pad, prompt_ids
from personalize.serving.row_lora import NO_ADAPTER, gathered, hooked, peft_layers, supported
from personalize.serving.rows import DecodeRow


class RowProcessors(LogitsProcessor):
    """Every row's own processor chain, each applied to that row's slice of the batch alone."""

    def __init__(self, chains: Sequence[tuple[list[int], list[LogitsProcessor]]]):
        self.chains = [(torch.tensor(rows), procs) for rows, procs in chains if procs]

    @torch.no_grad()
    def __call__(self, input_ids, scores):
        out = scores.clone()
        for rows, procs in self.chains:
            ids, s = input_ids[rows], scores[rows]
            for p in procs:
                s = p(ids, s)
            out[rows] = s
        return out


class RowCapture:
    """HiddenCapture seen by one row's CARD processor: the row's own hidden states."""

    def __init__(self, capture: HiddenCapture, rows: list[int]):
        self.capture, self.rows = capture, rows

    def last(self) -> torch.Tensor:
        return self.capture.last()[self.rows]


class RowBudget(StoppingCriteria):
    """Each row stops at its own max_new_tokens (generate's own limit is the batch's largest)."""

    def __init__(self, prompt_length: int, max_new: Sequence[int]):
        self.prompt_length, self.max_new = prompt_length, torch.tensor(max_new)

    def __call__(self, input_ids, scores, **kwargs) -> torch.BoolTensor:
        return (input_ids.shape[1] - self.prompt_length >= self.max_new).to(input_ids.device)


class RowStreamer(BaseStreamer):
    """Calls `on_step(tokens)` with each step's new token of every row (generate's first put is the prompt)."""

    def __init__(self, on_step: Callable[[list[int]], None]):
        self.on_step, self._prompt_seen = on_step, False

    def put(self, value):
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self.on_step(value.reshape(-1).tolist())

    def end(self):
        pass


def sampling_key(s: DecodingSettings):
    """Rows that may share one generate call: every greedy row, or sampled rows of equal settings."""
    return None if not s.do_sample else (s.temperature, s.top_k)


@torch.no_grad()
def decode_rows(model, tok, rows: Sequence[DecodeRow], on_step: Callable[[int, int], None] | None = None,
                fast: bool = True) -> list[Generation]:
    """One `generate` per sampling group (one in all for greedy rows) over rows of any adapter and method.
    `on_step(row, token)` is called as each row's tokens are decoded (the app streams them).

    fast (the default): each row's LoRA gathered into one matmul pair per module (row_lora.py), the prompt
    prefilled once per distinct (prompt, LoRA) (shared_prefill), the linear layers through oneDNN on the CPU
    (lm/onednn.py). fast=False: the libraries' own way, peft's `adapter_names`, P2P's row hooks, every row
    prefilled, `F.linear`: the reference the tests and benchmarks/mixed_step.py compare with (same greedy
    outputs)."""
    first: dict = {}  # identical plain greedy rows decode once (e.g. a card row that fell back = the cluster row)
    copies: dict[int, list[int]] = {}
    for i, r in enumerate(rows):
        plain = r.steer is None and not r.settings.do_sample
        same = (r.prompt, r.budget, r.settings, r.adapter, r.scaffold) if plain else i
        copies.setdefault(first.setdefault(same, i), []).append(i)
    groups: dict = {}
    for i in copies:
        groups.setdefault(sampling_key(rows[i].settings), []).append(i)
    out: list[Generation | None] = [None] * len(rows)
    for idx in groups.values():
        step = None if on_step is None else \
            (lambda j, t, idx=idx: [on_step(c, t) for c in copies[idx[j]]])
        for i, g in zip(idx, _decode_group(model, tok, [rows[i] for i in idx], step, fast)):
            for c in copies[i]:
                out[c] = g if c == i else dataclasses.replace(g, trace=rows[c].trace, note=rows[c].note)
    return out


def _decode_group(model, tok, rows: Sequence[DecodeRow], on_step, fast: bool) -> list[Generation]:
    if not rows:
        return []
    n = len(rows)
    ids = [prompt_ids(tok, r.prompt, r.budget) for r in rows]
    twins = [i for i, r in enumerate(rows) if r.steer is not None and r.steer.twin_adapter is not None]
    batch = ids + [ids[i] for i in twins]
    # row n + j is row twins[j]'s twin (COPE: its π_base)
    adapters = [r.adapter or NO_ADAPTER for r in rows] + [rows[i].steer.twin_adapter for i in twins]
    input_ids, mask = left_pad(batch, tok.pad_token_id, model.device)
    length = input_ids.shape[1]
    s0 = rows[0].settings
    steered = [(i, r.steer) for i, r in enumerate(rows) if r.steer is not None]
    with ExitStack() as stack:
        capture = None
        layers = {st.hidden_layers for _, st in steered if st.hidden_layers}
        if layers:
            if len(layers) > 1:
                raise ValueError(f"CARD rows of one batch must read the same layers, got {sorted(layers)}")
            capture = stack.enter_context(HiddenCapture(model, layers.pop()))
        generated = {i: lora for i, st in steered if (lora := st.row_lora()) is not None}  # row -> (LoRA, scale)
        t0 = time.perf_counter()
        prefix = None
        if hasattr(model, "peft_config"):
            check_adapters(model, adapters)
            fast = fast and supported(model, adapters)  # a DoRA or merged adapter: peft's own path
        if fast:
            weights = gathered(model, adapters, generated)
            stack.enter_context(onednn_linears(model))
            if not uses_static_cache(model):  # generate sizes its own static cache
                prefix = shared_prefill(model, input_ids, mask, adapters, generated, weights)
            stack.enter_context(hooked(model, weights))
        elif generated:
            for kind in dict.fromkeys(type(rows[i].steer) for i in generated):
                stack.enter_context(kind.reference_hooks(model, [(i, rows[i].steer) for i in generated
                                                                 if type(rows[i].steer) is kind]))
        chains, steppers = [], {}
        utf8 = utf8_guard(tok, length)  # whole characters: first (a steer's candidates) and last
        for i, r in enumerate(rows):
            s = r.settings
            first = [*([utf8] if utf8 else []), *([MinNewTokens(length, s.min_new_tokens, tok.eos_token_id)]
                                                  if s.min_new_tokens else [])]
            repeats = repetition_processors(s, length, tok.eos_token_id, utf8, tok)
            if r.scaffold:  # last: it ends the row, once whole characters allow an end
                repeats.append(EchoStop(tok, r.scaffold, length))
            if r.steer is None:
                chains.append(([i], [*first, *repeats]))
                continue
            own = [i, n + twins.index(i)] if r.steer.twin_adapter is not None else [i]
            hidden = RowCapture(capture, [i]) if r.steer.hidden_layers else None
            procs, tracer = r.steer.processors(s, first, repeats, hidden, r.want_trace)
            chains.append((own, procs))
            if tracer is not None:
                steppers[i] = tracer
        kwargs = dict(input_ids=input_ids, attention_mask=mask, max_new_tokens=max(r.settings.max_new_tokens for r in rows),
                      pad_token_id=tok.pad_token_id, do_sample=s0.do_sample, repetition_penalty=None, top_p=None,
                      logits_processor=LogitsProcessorList([RowProcessors(chains)]),
                      stopping_criteria=StoppingCriteriaList(
                          [RowBudget(length, [r.settings.max_new_tokens for r in rows] +
                                     [rows[i].settings.max_new_tokens for i in twins])]),
                      **sampling(s0, not any(st.restricts_top_k for _, st in steered)))
        if not fast and hasattr(model, "peft_config"):
            stack.enter_context(peft_layers(model, on=True))  # peft's rows need them, whatever adapter is active
            kwargs["adapter_names"] = adapters
        elif not hasattr(model, "peft_config") and any(a != NO_ADAPTER for a in adapters):
            raise ValueError("rows with adapters need a peft model")
        if on_step is not None:
            kwargs["streamer"] = RowStreamer(lambda toks: [on_step(j, t) for j, t in enumerate(toks[:n])])
        if prefix is not None:
            kwargs["past_key_values"] = prefix
        generated = model.generate(**kwargs, **compile_switch(model))
        dt = time.perf_counter() - t0
    new = generated[:, length:]
    eos, results = tok.eos_token_id, []
    for j, i in enumerate(twins):
        if not torch.equal(new[i], new[n + j]):  # the twin's invariant (COPE's: methods/cope.py)
            raise RuntimeError(rows[i].steer.twin_error)
    for i, r in enumerate(rows):
        row = new[i, : r.settings.max_new_tokens].tolist()
        k = row.index(eos) + 1 if eos in row else len(row)
        trace = r.trace
        if i in steppers:
            trace = r.steer.steps(steppers[i], new[i], k)
        results.append(Generation(trim_echo(decode(tok, row[:k]), r.scaffold), k, dt / n, trace, r.note))
    return results


def shared_prefill(model, input_ids: torch.Tensor, mask: torch.Tensor, adapters: Sequence[str],
                   generated: dict[int, tuple[dict, float]], weights: dict) -> DynamicCache | None:
    """The KV cache of every row's prompt but its last token, computed once per distinct (prompt, LoRA) and
    copied to the rows that share it (a Compare's cluster, card and cope rows read one prompt with one
    adapter); generate then runs the last prompt token of every row. `generated`: row -> (generated LoRA,
    scale); `weights`: the batch's row_lora.gathered, whose rows the prefill selects. None when no two rows
    share one."""
    keys = [(tuple(input_ids[i].tolist()), adapters[i], id(generated[i][0]) if i in generated else None,
             generated[i][1] if i in generated else None) for i in range(len(adapters))]
    first: dict = {}
    for i, k in enumerate(keys):
        first.setdefault(k, i)
    if len(first) == len(keys) or input_ids.shape[1] < 2:
        return None
    slot = {k: j for j, k in enumerate(first)}
    uniq = list(first.values())
    ids, m = input_ids[uniq, :-1], mask[uniq, :-1]
    cache = DynamicCache(config=model.config)
    pick = torch.tensor(uniq)
    with hooked(model, {mod: (A[pick.to(A.device)], B[pick.to(B.device)]) for mod, (A, B) in weights.items()}):
        decoder = (model.get_base_model() if hasattr(model, "peft_config") else model).get_decoder()
        decoder(input_ids=ids, attention_mask=m, position_ids=position_ids(m),
                past_key_values=cache, use_cache=True)  # the states of the LM head's input; no logits needed
    cache.batch_select_indices(torch.tensor([slot[k] for k in keys], device=input_ids.device))
    return cache


def check_adapters(model, adapters: Sequence[str]) -> None:
    missing = sorted({a for a in adapters if a != NO_ADAPTER} - set(model.peft_config))
    if missing:  # peft would silently run such rows without any LoRA
        raise ValueError(f"adapters {missing} are not loaded; loaded: {sorted(model.peft_config)}")
