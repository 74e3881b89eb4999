"""personalize: CARD (cluster LoRA + reward-guided decoding with per-user vectors) and the methods it is compared with."""

__version__ = "0.1.0"

import logging as _logging

# bitsandbytes (imported by peft) warns on every CPU start about an optional kernel
# package it could fetch from a hub; 4-bit is CUDA-only here, so the warning is noise.
_logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(_logging.ERROR)
