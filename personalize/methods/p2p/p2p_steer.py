"""Profile-to-PEFT's steering of its rows in a mixed batch (serving.rows.Steer): the person's generated LoRA added
on their rows alone, over the row's adapter (gathered with the row LoRAs on the fast path; forward hooks on the
libraries' own path)."""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass

from personalize.methods.p2p.hooks import applied_rows
from personalize.serving.rows import Steer


@dataclass(frozen=True)
class P2PSteer(Steer):
    """A generated LoRA (methods/p2p) added on this row only, over the row's adapter."""

    lora: dict
    scale: float

    def row_lora(self) -> tuple[dict, float]:
        return self.lora, self.scale

    @classmethod
    def reference_hooks(cls, model, rows):
        """hooks.applied_rows for every scale among the rows."""
        stack = ExitStack()
        for scale in {st.scale for _, st in rows}:
            stack.enter_context(applied_rows(model, [(i, st.lora) for i, st in rows if st.scale == scale], scale))
        return stack
