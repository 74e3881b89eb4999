"""A decode request as data: `DecodeRow` (one output to decode) and `Steer`, the protocol through which a method acts
on its own rows while a mixed batch decodes. The runner (runner.py) calls a row's steer and knows no method.

A steer can give its row
- processors: the row's logits processors (between its minimum-length and repetition control, or after them);
- a twin: a second row on another adapter decoded in lockstep, both rows seeing the same processors
  (COPE's π_base);
- hidden states: the batch's last n layers captured for its processors (CARD);
- a generated LoRA on its row alone (Profile-to-PEFT), with the hooks that apply it on the libraries' own path.
The steers are implemented beside their methods (methods/card/steer.py, methods/cope.py, methods/p2p/p2p_steer.py).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import ClassVar

from transformers import LogitsProcessor

from personalize.serving.settings import DecodingSettings
from personalize.lm.tokens import TokenBudget


class Steer:
    """What acts on a row while it decodes. The defaults are a steer that does nothing; a method's steer overrides
    what it needs (a frozen dataclass of the row's own parameters)."""

    twin_adapter: ClassVar[str | None] = None  # overridden by a field: the twin row's adapter
    hidden_layers: ClassVar[int | None] = None  # overridden by a field: the last layers its processors read
    restricts_top_k: ClassVar[bool] = False  # its processors keep the top-k themselves (sampling: none in generate)
    twin_error: ClassVar[str] = "a row and its twin chose different tokens"

    def check(self, row: "DecodeRow") -> None:
        """Raises ValueError when the row cannot be steered so."""

    def processors(self, settings: DecodingSettings, first: list[LogitsProcessor], repeats: list[LogitsProcessor],
                   hidden, trace: bool) -> tuple[list[LogitsProcessor], object | None]:
        """(the row's processor chain, the processor that records its steps when `trace`, else None).
        `first`: the row's minimum-length control; `repeats`: its repetition control; `hidden`: the row's hidden
        states (`.last()`) when hidden_layers is set, else None. The chain sees the row (and its twin) alone."""
        return [*first, *repeats], None

    def row_lora(self) -> tuple[dict, float] | None:
        """A LoRA generated for this row (its weights, its scale), added over the row's adapter; None: none."""
        return None

    @classmethod
    def reference_hooks(cls, model, rows: list[tuple[int, "Steer"]]):
        """The hooks that add these rows' generated LoRAs on the libraries' own path (the runner's fast=False)."""
        return nullcontext()

    def steps(self, tracer, new, k: int) -> list:
        """The recorded steps of the row's `tracer` in the shape its method's own generate gives them; `new`: the
        row's new tokens, `k`: how many of them it kept."""
        return tracer.trace


@dataclass
class DecodeRow:
    """One output to decode: what a method's `rows()` returns, what `decode_rows` turns into a Generation."""

    prompt: str
    budget: TokenBudget
    settings: DecodingSettings
    adapter: str | None = None  # None: the frozen LM
    steer: Steer | None = None
    trace: list | None = None  # what the method chose (Generation.trace), known before decoding
    note: str | None = None  # Generation.note (CARD's fallback to the cluster model)
    want_trace: bool = False  # CARD / COPE: record every step (the Why view)
    scaffold: tuple[str, ...] = ()  # lines of the prompt no output may repeat (generation.EchoStop): its framing

    def __post_init__(self):
        if self.steer is not None:
            self.steer.check(self)
