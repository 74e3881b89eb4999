"""The plain generate every method shares: repetition control as transformers LogitsProcessors, the prompt's echo
stopped, and the batch decoded with the active adapter (its settings: settings.DecodingSettings).

Repetition is controlled in the generated text only: transformers' `repetition_penalty` also penalises the
prompt's tokens (it cost the cluster model ROUGE-L on held-out commits, whose subjects reuse words of the diff,
docs/RESULTS.md), so the library's processors are given the prompt length to ignore.
"""

from __future__ import annotations

import functools
import math
import re
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from transformers import LogitsProcessor, LogitsProcessorList, MinNewTokensLengthLogitsProcessor, \
    NoRepeatNGramLogitsProcessor, RepetitionPenaltyLogitsProcessor

from personalize.lm.models import compile_switch
from personalize.lm.tokens import TokenBudget, decode, left_pad, prompt_ids
from personalize.lm.utf8 import utf8_guard
from personalize.serving.settings import DecodingSettings


class GeneratedNoRepeatNGram(NoRepeatNGramLogitsProcessor):
    """The library's n-gram blocker over the generated tokens only (the prompt may repeat the diff's words)."""

    def __init__(self, n: int, prompt_length: int):
        super().__init__(n)
        self.prompt_length = prompt_length

    def __call__(self, input_ids, scores):
        return super().__call__(input_ids[:, self.prompt_length:], scores)


class NoThirdRepeat(LogitsProcessor):
    """No n-gram of up to `max_n` generated tokens a third time back to back: when a row's last 3n − 1 tokens are
    two copies of an n-gram and its first n − 1 tokens, the token that would finish the third copy is masked.

    Why: a loop ("dev-dev-dev-", "Synthesizer.\nSynthesizer.\n") is a short period repeated; the no-repeat n-gram
    rule stops it too but also bans a text's own forms the second time ("* CVE-2025-" on every changelog line), so
    the build's tuning may switch it off. Two copies stay allowed ("very very", a date twice), and n-grams made
    of digits alone are exempt (SmolLM2 spells numbers digit by digit: "#1000000"). `digits`: a [V] mask of the
    digit tokens (digit_tokens), or None."""

    def __init__(self, max_n: int, prompt_length: int, digits: torch.Tensor | None = None):
        self.max_n, self.prompt_length, self.digits = max_n, prompt_length, digits

    @torch.no_grad()
    def __call__(self, input_ids, scores):
        gen = input_ids[:, self.prompt_length:]
        if gen.shape[1] < 2:
            return scores
        tails = gen[:, -(3 * self.max_n - 1):].tolist()
        banned = [(r, t) for r, tail in enumerate(tails) for t in self._finishing(tail)]
        if not banned:
            return scores
        out = scores.clone()
        rows, toks = zip(*banned)
        out[list(rows), list(toks)] = -math.inf
        return out

    def _finishing(self, g: list[int]) -> list[int]:
        """The tokens that would finish a third back-to-back copy after the tokens `g`."""
        out, length = [], len(g)
        for n in range(1, self.max_n + 1):
            if 3 * n - 1 > length:
                break
            if g[length - 3 * n + 1: length - n] == g[length - 2 * n + 1:]:  # period n over the last 3n - 1
                gram = g[length - n:]
                if self.digits is None or not all(bool(self.digits[t]) for t in gram if t < len(self.digits)):
                    out.append(g[length - n])
        return out


@functools.lru_cache(maxsize=8)
def digit_tokens(tok) -> torch.Tensor:
    """[V] True for the tokens that spell digits alone (NoThirdRepeat leaves numbers such as "1000" alone)."""
    mask = torch.zeros(len(tok), dtype=torch.bool)
    for t, i in tok.get_vocab().items():
        text = tok.convert_tokens_to_string([t]).strip()
        if i < len(mask) and text.isdigit():
            mask[i] = True
    return mask


def _starts(scaffold: Sequence[str], n: int) -> list[tuple[str, ...]]:
    """Each scaffold line's first n words (lowercase), for the lines that have n."""
    return [tuple(w[:n]) for w in (line.lower().split() for line in scaffold) if len(w) >= n]


def echo_at(text: str, scaffold: Sequence[str], n: int = 3) -> int | None:
    """Where in `text` a scaffold line's first n words begin (case and spacing aside), or None."""
    starts = _starts(scaffold, n)
    spans = [(m.start(), m.group().lower()) for m in re.finditer(r"\S+", text)]
    words = [w for _, w in spans]
    for i in range(len(words) - n + 1):
        if tuple(words[i: i + n]) in starts:
            return spans[i][0]
    return None


def trim_echo(text: str, scaffold: Sequence[str], n: int = 3) -> str:
    """The text before an echo of the scaffold (EchoStop ends the row where one begins; its start is cut here)."""
    at = echo_at(text, scaffold, n) if scaffold else None
    return text if at is None else text[:at].rstrip()


class EchoStop(LogitsProcessor):
    """Ends a row once its output starts repeating a line of its prompt's scaffold (the task's instruction, a
    method's framing: methods/scaffold.py): the first `n` words of such a line, on the row's current line. The
    words before the echo stay; trim_echo cuts the echo's start. Why: a frozen model given retrieved items
    after a header writes the next "input → output" pair, its own instruction included, instead of an answer."""

    def __init__(self, tok, scaffold: Sequence[str], prompt_length: int, n: int = 3, window: int = 24):
        self.tok, self.prompt_length, self.n, self.window = tok, prompt_length, n, window
        self.starts = set(_starts(scaffold, n))

    @torch.no_grad()
    def __call__(self, input_ids, scores):
        if not self.starts or input_ids.shape[1] - self.prompt_length < self.n:
            return scores
        tails = input_ids[:, max(self.prompt_length, input_ids.shape[1] - self.window):].tolist()
        eos = self.tok.eos_token_id
        if eos is None or eos >= scores.shape[-1]:
            return scores
        done = [r for r, t in enumerate(tails) if torch.isfinite(scores[r, eos])  # not inside a character
                and self._echoes(self.tok.decode(t).rsplit("\n", 1)[-1])]
        if not done:
            return scores
        out = scores.clone()
        out[done] = -math.inf
        out[done, eos] = 0.0
        return out

    def _echoes(self, line: str) -> bool:
        w = line.lower().split()
        return any(tuple(w[i: i + self.n]) in self.starts for i in range(len(w) - self.n + 1))


class MinNewTokens(MinNewTokensLengthLogitsProcessor):
    """The library's no-end-of-sequence-yet rule (its settings and checks), applied by indexing the end ids:
    the library scans the whole vocabulary (arange + isin + where, ~0.3 ms) at every step of every row,
    even once the minimum is reached, when the scores pass unchanged."""

    def __call__(self, input_ids, scores):
        if input_ids.shape[-1] - self.prompt_length_to_skip >= self.min_new_tokens:
            return scores
        out = scores.clone()
        out[:, self.eos_token_id.to(scores.device)] = -math.inf
        return out


def repetition_processors(s: DecodingSettings, prompt_length: int, eos_token_id: int | None = None,
                          utf8: LogitsProcessor | None = None, tok=None) -> list[LogitsProcessor]:
    """Repetition control shared by every method, over the generated tokens only; with `eos_token_id`, also
    no end-of-sequence before the first token (a memory's neighbours may vote for it: an empty output); with
    `utf8` (lm.utf8.utf8_guard), whole characters only, last, on the final scores. `tok`: the tokenizer, whose
    digit tokens the loop rule (NoThirdRepeat) leaves alone."""
    out: list[LogitsProcessor] = []
    if eos_token_id is not None:
        out.append(MinNewTokens(prompt_length, 1, eos_token_id))
    if s.repetition_penalty != 1.0:
        out.append(RepetitionPenaltyLogitsProcessor(float(s.repetition_penalty), prompt_ignore_length=prompt_length))
    if s.no_repeat_ngram:
        out.append(GeneratedNoRepeatNGram(s.no_repeat_ngram, prompt_length))
    if s.loop_period:
        out.append(NoThirdRepeat(s.loop_period, prompt_length, None if tok is None else digit_tokens(tok)))
    if utf8 is not None:
        out.append(utf8)
    return out


@dataclass
class Generation:
    text: str
    n_tokens: int
    latency_s: float
    trace: list[dict] | None = None
    note: str | None = None  # what the reader should know (CARD's fallback to the cluster model)


def sampling(s: DecodingSettings, own_top_k: bool = True) -> dict:
    """generate's temperature and top-k: the settings' when sampling (no top-k of its own where a processor keeps
    one), none when greedy (the model's generation config must not add them)."""
    if not s.do_sample:
        return {"temperature": None, "top_k": None}
    return {"temperature": s.temperature, "top_k": s.top_k if own_top_k else None}


@torch.no_grad()
def generate(model, tok, prompts: list[str], budget: TokenBudget, s: DecodingSettings, processors=(),
             scaffold: Sequence[str] = (), own_top_k: bool = True,
             after: Callable[[torch.Tensor, int], None] | None = None) -> list[Generation]:
    """Batched decoding with the active adapter. `processors` act after the UTF-8 guard and before repetition
    control (a steering processor goes last among them: it then sees the guarded scores, and repetition control
    acts on its choice); `own_top_k`: generate's own top-k when sampling (off where a processor keeps its own);
    `scaffold`: lines of the prompts that no output may repeat (EchoStop, then trim_echo); `after(out, prompt
    length)`: a look at the generated ids."""
    ids, mask = left_pad([prompt_ids(tok, x, budget) for x in prompts], tok.pad_token_id, model.device)
    utf8 = utf8_guard(tok, ids.shape[1])  # first too: a steering processor's top-k are then whole-character tokens
    repeats = repetition_processors(s, ids.shape[1], tok.eos_token_id, utf8, tok)
    if scaffold:
        repeats.append(EchoStop(tok, scaffold, ids.shape[1]))
    kwargs = dict(input_ids=ids, attention_mask=mask, max_new_tokens=s.max_new_tokens,
                  min_new_tokens=s.min_new_tokens or None, pad_token_id=tok.pad_token_id, do_sample=s.do_sample,
                  repetition_penalty=None, top_p=None, **sampling(s, own_top_k))
    t0 = time.perf_counter()
    chain = LogitsProcessorList([*([utf8] if utf8 else []), *processors, *repeats])
    out = model.generate(**kwargs, **compile_switch(model), logits_processor=chain)
    dt = time.perf_counter() - t0
    if after is not None:
        after(out, ids.shape[1])
    eos = tok.eos_token_id
    results = []
    for row in out[:, ids.shape[1]:].tolist():
        n = row.index(eos) + 1 if eos in row else len(row)
        results.append(Generation(trim_echo(decode(tok, row[:n]), scaffold), n, dt / len(prompts)))
    return results
