"""Hidden-state features h_t (CARD §1.4): the last n decoder layers' states, captured by forward hooks.

The same hooks serve three places, so the head sees the same h_t in training
and in decoding: teacher-forced passes over a user's own texts, batched greedy
generation of negatives (the states are captured while generating, so no
second pass is needed), and reward-guided decoding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from personalize.lm.models import compile_switch
from personalize.lm.onednn import onednn_linears
from personalize.lm.prefix import forward_rows
from personalize.lm.tokens import TokenBudget, decode, left_pad, prompt_ids, target_ids


def decoder_layers(model) -> torch.nn.ModuleList:
    """The transformer blocks of any HF causal LM, under peft or not."""
    n = model.config.num_hidden_layers
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == n:
            return module
    raise ValueError("could not find the decoder layers of this model")


class HiddenCapture:
    """Forward hooks on the last `n_layers` blocks; `last()` is the newest position's h_t."""

    def __init__(self, model, n_layers: int, record_steps: bool = False):
        layers = decoder_layers(model)
        if not 1 <= n_layers <= len(layers):
            raise ValueError(f"n_layers must be in 1..{len(layers)}")
        self.layers = list(layers)[-n_layers:]
        self.record_steps = record_steps
        self.outputs: list[torch.Tensor | None] = [None] * n_layers
        self.steps: list[torch.Tensor] = []
        self._handles = []

    def _hook(self, i):
        def hook(_module, _args, output):
            out = output[0] if isinstance(output, tuple) else output
            self.outputs[i] = out
            if self.record_steps and i == len(self.layers) - 1:
                self.steps.append(self.last())
        return hook

    def __enter__(self):
        self.steps = []
        self._handles = [layer.register_forward_hook(self._hook(i)) for i, layer in enumerate(self.layers)]
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles = []

    def last(self) -> torch.Tensor:
        """[B, n_layers * H] at the last position of the newest forward."""
        return torch.cat([o[:, -1, :] for o in self.outputs], dim=-1).float()

    def all(self) -> torch.Tensor:
        """[B, T, n_layers * H] for every position of the newest forward."""
        return torch.cat(list(self.outputs), dim=-1).float()


@dataclass
class SequenceFeatures:
    """One answer y to prompt x under one model: per-token states, ids and model log-probs."""

    text: str
    ids: torch.Tensor  # [T] answer tokens (eos included when produced)
    h: torch.Tensor  # [T, n_layers * H] float16, the state that predicts each token
    logprob: torch.Tensor  # [T] the model's log-probability of each token
    top_ids: torch.Tensor | None = None  # [T, k] the model's top-k candidates at each step
    top_logits: torch.Tensor | None = None  # [T, k]

    @property
    def mean_logprob(self) -> float:
        return float(self.logprob.mean()) if len(self.logprob) else 0.0


@torch.no_grad()
def teacher_forced(
    model, tok, examples: Sequence[tuple[str, str]], n_layers: int, budget: TokenBudget,
    top_k: int = 0, batch_size: int = 16,
) -> list[SequenceFeatures]:
    """States of the model reading each (x, y): one forward per batch, no generation (the linear layers
    through oneDNN on the CPU: lm/onednn.py). Batches are made of examples of similar length (a short entry is
    not padded to a long one's width: the pass costs what its tokens cost), returned in the order given."""
    encoded = [(prompt_ids(tok, x, budget), target_ids(tok, y, budget)) for x, y in examples]
    order = sorted(range(len(examples)), key=lambda i: len(encoded[i][0]) + len(encoded[i][1]))
    out: list[SequenceFeatures | None] = [None] * len(examples)
    for i in range(0, len(order), batch_size):
        rows = order[i: i + batch_size]
        chunk = [examples[r] for r in rows]
        prompts = [encoded[r][0] for r in rows]
        targets = [encoded[r][1] for r in rows]
        keep = max(len(t) for t in targets) + 1  # left padding: every answer sits in the last columns
        with HiddenCapture(model, n_layers) as cap, onednn_linears(model):
            # the prompts' shared opening read once (lm/prefix.py: the hooks keep the rows' pass, the newest); the
            # LM head only where answers are predicted
            res, ids, _ = forward_rows(model, [p + t for p, t in zip(prompts, targets)], tok.pad_token_id,
                                       limit=min(len(p) for p in prompts) - 1, logits_to_keep=keep)
            logits, h = res.logits, cap.all()
        logp = torch.log_softmax(logits.float(), -1)
        width = ids.shape[1]
        for j, ((_, y), t) in enumerate(zip(chunk, targets)):
            pos = torch.arange(width - len(t) - 1, width - 1, device=ids.device)  # states that predict t
            lpos = pos - (width - keep)
            tgt = torch.tensor(t, device=ids.device)
            f = SequenceFeatures(text=y, ids=tgt.cpu(), h=h[j, pos].half().cpu(),
                                 logprob=logp[j, lpos, tgt].cpu())
            if top_k:
                vals, idx = logits[j, lpos].float().topk(top_k, dim=-1)
                f.top_ids, f.top_logits = idx.cpu(), vals.cpu()
            out[rows[j]] = f
    return out


@torch.no_grad()
def generate_with_states(
    model, tok, prompts: Sequence[str], n_layers: int, budget: TokenBudget,
    max_new_tokens: int = 32, batch_size: int = 24, sample: bool = False, top_k: int = 50,
    temperature: float = 1.0,
) -> list[SequenceFeatures]:
    """Greedy outputs (the negatives y−) with their h_t captured during generation; with `sample`, draws
    from the top_k candidates at `temperature` instead (the harder negatives of "hard_pairs": seed torch
    first for repeatable draws). logprob is the model's own, untempered."""
    out: list[SequenceFeatures] = []
    eos = tok.eos_token_id
    for i in range(0, len(prompts), batch_size):
        chunk = prompts[i: i + batch_size]
        ids, mask = left_pad([prompt_ids(tok, x, budget) for x in chunk], tok.pad_token_id, model.device)
        with HiddenCapture(model, n_layers, record_steps=True) as cap:
            gen = model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=sample,
                pad_token_id=tok.pad_token_id, output_logits=True, return_dict_in_generate=True,
                top_k=top_k if sample else None, top_p=None, temperature=temperature if sample else None,
                **compile_switch(model),
            )
        new = gen.sequences[:, ids.shape[1]:]
        states = torch.stack(cap.steps[: new.shape[1]], dim=1)  # [B, T, nH]
        logp = torch.log_softmax(torch.stack(gen.logits, dim=1).float(), -1)  # [B, T, V]
        for j in range(len(chunk)):
            row = new[j].tolist()
            n = row.index(eos) + 1 if eos in row else len(row)
            t = new[j, :n]
            out.append(SequenceFeatures(
                text=decode(tok, row[:n]), ids=t.cpu(), h=states[j, :n].half().cpu(),
                logprob=logp[j, torch.arange(n, device=t.device), t].cpu(),
            ))
    return out
