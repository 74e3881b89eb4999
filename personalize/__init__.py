"""personalize: CARD (cluster LoRA + reward-guided decoding with per-user vectors) and the methods it is compared with.

Packages by concern, each importing only the layers below it (docs/ARCHITECTURE.md, .importlinter):
cli > eval | ui > studio > distributed > humaneval | fitting > methods > serving > card > lm; the shared top-level modules
(store, data, metrics, display, catalog, demo) import no package.
"""

__version__ = "0.1.0"

import logging as _logging

# bitsandbytes (imported by peft) warns on every CPU start about an optional kernel
# package it could fetch from a hub; 4-bit is CUDA-only here, so the warning is noise.
_logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(_logging.ERROR)
