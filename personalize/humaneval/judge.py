"""An LLM judge for human-evaluation campaigns: the paper's human study next to an automatic one.

Any causal LM can judge; the default is the bundled SmolLM2-135M-Instruct, which is labelled as a weak
judge because a 135M model's preferences are barely above chance. The judge never generates: it reads
the next-token distribution after the chat template's assistant prefix, which is cheap and deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from personalize.lm.models import BUNDLED, LM, load_lm
from personalize.lm.model_config import BUNDLED_ID, ModelConfig

QUESTION = "Which output is more like something this person would write? Answer A or B."
CRITERIA = {
    "style": "Rate 1-5 how well the output matches this person's writing style (tone, length, wording).",
    "content": "Rate 1-5 how well the output's content answers the prompt the way this person would.",
    "fluency": "Rate 1-5 how fluent and well-formed the output is.",
}
SYSTEM = "You are a careful judge of personal writing style. Answer with a single character."


@dataclass(frozen=True)
class JudgeConfig:
    """Which LM judges and how much of the person's history it reads."""

    model: str | None = None  # None = the bundled model; else a Hugging Face id or local folder
    max_history: int = 5  # history items shown to the judge (the first ones, in the order given)
    max_chars: int = 300  # per history item / output, truncated
    tie_margin: float = 0.05  # |p_a - 0.5| below this is a tie
    device: str = "auto"

    def __post_init__(self):
        if self.model is not None and (not isinstance(self.model, str) or not self.model.strip()):
            raise ValueError(f"model must be None (the bundled model) or a non-empty model id/path, got {self.model!r}")
        if not isinstance(self.max_history, int) or self.max_history < 0:
            raise ValueError(f"max_history must be an integer >= 0, got {self.max_history!r}")
        if not isinstance(self.max_chars, int) or self.max_chars < 1:
            raise ValueError(f"max_chars must be an integer >= 1, got {self.max_chars!r}")
        if not 0.0 <= self.tie_margin < 0.5:
            raise ValueError(f"tie_margin must be in [0, 0.5), got {self.tie_margin!r}")
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {self.device!r}")


class Judge:
    """Pairwise preferences and 1-5 rubric scores read from one LM's next-token probabilities."""

    def __init__(self, cfg: JudgeConfig = JudgeConfig(), lm: LM | None = None):
        # Reuse the studio's already-loaded LM when given, so the model is not loaded twice.
        self.cfg = cfg
        self.lm = lm if lm is not None else load_lm(ModelConfig(cfg.model or BUNDLED, device=cfg.device))
        tok = self.lm.tokenizer
        tok.padding_side = "left"
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        # Answer token ids: the first token the tokenizer produces when the answer is appended right after
        # the assistant prefix, i.e. exactly the token the model would emit there ("A" with no leading
        # space after the template's newline for SmolLM2, "▁A"-style for sentencepiece tokenizers).
        prefix = self._chat("x")
        self.ab_ids = [self._answer_id(prefix, s) for s in ("A", "B")]
        self.digit_ids = [self._answer_id(prefix, str(d)) for d in range(1, 6)]

    @property
    def label(self) -> str:
        return "SmolLM2-135M-Instruct (bundled; a weak judge)" if self.lm.model_id == BUNDLED_ID else self.lm.model_id

    def _answer_id(self, prefix: str, answer: str) -> int:
        tok = self.lm.tokenizer
        base = tok.encode(prefix, add_special_tokens=False)
        ids = tok.encode(prefix + answer, add_special_tokens=False)
        if ids[: len(base)] != base or len(ids) <= len(base):
            raise ValueError(f"cannot find a token id for answer {answer!r} with this tokenizer")
        return ids[len(base)]

    def _chat(self, content: str) -> str:
        msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}]
        return self.lm.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)

    def _cut(self, text: str) -> str:
        text = " ".join(str(text).split())
        return text if len(text) <= self.cfg.max_chars else text[: self.cfg.max_chars].rstrip() + "…"

    def _context(self, history: Sequence[str], prompt: str) -> str:
        items = [f"- {self._cut(h)}" for h in list(history)[: self.cfg.max_history]]
        shown = "\n".join(items) if items else "(no history)"
        return f"Texts this person wrote before:\n{shown}\n\nPrompt: {self._cut(prompt)}\n\n"

    @torch.inference_mode()
    def _next_probs(self, texts: list[str], ids: list[int]) -> torch.Tensor:
        """Probabilities over `ids` (renormalised) of the next token after each text, in one padded batch."""
        tok, model = self.lm.tokenizer, self.lm.model
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.lm.device)
        # Left padding: positions count real tokens only, so a row's logits do not depend on its batch-mates.
        pos = (enc["attention_mask"].cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], position_ids=pos).logits
        return torch.softmax(logits[:, -1, ids].float(), dim=-1).cpu()

    def pairwise(self, history: Sequence[str], prompt: str, output_a: str, output_b: str) -> dict:
        """Which output reads more like the person. Both orders are scored and averaged
        (p_a = mean of p(A | a first) and p(B | a second)) so the judge's position bias cancels."""
        ctx = self._context(history, prompt)
        a, b = self._cut(output_a), self._cut(output_b)
        texts = [self._chat(f"{ctx}Output A: {x}\n\nOutput B: {y}\n\n{QUESTION}") for x, y in ((a, b), (b, a))]
        p = self._next_probs(texts, self.ab_ids)
        p_a = float((p[0, 0] + p[1, 1]) / 2)
        verdict = "tie" if abs(p_a - 0.5) < self.cfg.tie_margin else ("a" if p_a > 0.5 else "b")
        return {"verdict": verdict, "p_a": p_a}

    def rubric(self, history: Sequence[str], prompt: str, output: str) -> dict:
        """Style, content and fluency on 1-5: the expected value of the digit distribution (renormalised
        over "1".."5"), smoother and more informative than the argmax digit."""
        ctx = self._context(history, prompt)
        out = self._cut(output)
        texts = [self._chat(f"{ctx}Output: {out}\n\n{q} Answer with one digit.") for q in CRITERIA.values()]
        p = self._next_probs(texts, self.digit_ids)
        scores = p @ torch.arange(1, 6, dtype=p.dtype)
        return {k: float(s) for k, s in zip(CRITERIA, scores)}
