"""personalize: CARD (cluster LoRA + reward-guided decoding with per-user vectors) and the methods it is compared with."""

__version__ = "0.1.0"
