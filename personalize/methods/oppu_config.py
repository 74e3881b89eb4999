"""OPPU's settings, apart from its model code so that the CLI's flags read their defaults and help without
loading torch (methods/oppu.py holds the method)."""

from __future__ import annotations

from dataclasses import dataclass

from personalize.flags import setting


@dataclass(frozen=True)
class OppuConfig:
    epochs: float = setting(10.0, "passes over the user's history (the OPPU and CARD papers train 10 epochs)")
    max_steps: int = setting(40, "cap on OPPU's optimiser steps per user (a CPU budget); steps = "
                                 "ceil(epochs · items / batch)")
    lr: float | None = setting(None, "None: the build's LoRA learning rate")
    batch_size: int | None = setting(None, "None: the build's LoRA batch size")
    min_items: int = setting(2, "fewer items: no adapter, the K = 1 model (cold start)")
    max_in_memory: int = setting(4, "user adapters kept in the peft model at once")
    folder: str | None = setting(None, "None: data/oppu/<artifacts id>")
    report_loss: bool = setting(True, "SFT loss on the user's history before and after training (a pass each)")

    def __post_init__(self):
        if self.epochs <= 0 or self.max_steps < 1:
            raise ValueError(f"epochs must be > 0 and max_steps >= 1, got {self.epochs}, {self.max_steps}")
        if (self.lr is not None and self.lr <= 0) or (self.batch_size is not None and self.batch_size < 1):
            raise ValueError("lr must be > 0 and batch_size >= 1 when given")
        if self.min_items < 1 or self.max_in_memory < 1:
            raise ValueError(f"min_items and max_in_memory must be >= 1, got {self.min_items}, {self.max_in_memory}")
