"""On a CUDA GPU (`pytest -m cuda`, skipped where torch sees none): a mixed batch of every method's rows decodes on
the GPU as each row decodes alone; a model loads in 4 bit (bitsandbytes NF4) and decodes; issue 39's check
(benchmarks/gpu_check.py) runs in its tiny mode on cuda. And, on any machine, the check's tiny mode end to end on
the CPU, its table holding every row."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import ROOT, save_tiny_lm, tiny_build_config

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CHECK = ROOT / "benchmarks" / "gpu_check.py"
sys.path.insert(0, str(ROOT / "benchmarks"))


def run_check(tmp_path, *args, timeout=600):
    p = subprocess.run([sys.executable, str(CHECK), "--tiny", "--work", str(tmp_path / "work"), *args],
                       cwd=ROOT, capture_output=True, text=True, timeout=timeout, env={**os.environ, "OUT": str(tmp_path)})
    return p


def assert_full_table(p, tmp_path, columns):
    from gpu_check import ROWS

    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    table = (tmp_path / "gpu_check.md").read_text()
    assert table.strip() in p.stdout
    lines = {line.split(" | ")[0].removeprefix("| "): line for line in table.splitlines() if line.startswith("| ")}
    for row in ROWS:
        assert row in lines, row
        cells = lines[row].strip("| ").split(" | ")[1:]
        assert len(cells) == len(columns), (row, cells)
        for c, cell in zip(columns, cells):
            if c == 2 and (not torch.cuda.is_available() or row.startswith("eval")):
                continue  # the NF4 column needs CUDA, and it runs no eval
            assert not cell.startswith("—") or row == "OPPU / EXACT first use", (row, cell)
    assert "| total |" in table and "OVER BUDGET" not in table
    assert (tmp_path / "gpu_check.json").exists() and (tmp_path / "gpu_check.log").exists()


@pytest.mark.slow
def test_gpu_check_tiny_on_the_cpu(tmp_path):
    """The check's own stages (models from the shapes, build, bench, eval, the table) on the 8B shape's tiny twin:
    the columns the GPU run fills are filled here from the same code."""
    p = run_check(tmp_path, "--device", "cpu", "--columns", "1")
    assert_full_table(p, tmp_path, [1])
    assert "qwen3_8b" in p.stdout


def test_shapes_are_the_published_ones():
    import json

    q = json.loads((ROOT / "benchmarks" / "shapes" / "qwen3_8b.json").read_text())
    assert (q["hidden_size"], q["num_hidden_layers"], q["num_attention_heads"], q["num_key_value_heads"],
            q["intermediate_size"], q["vocab_size"], q["head_dim"]) == (4096, 36, 32, 8, 12288, 151936, 128)
    s = json.loads((ROOT / "benchmarks" / "shapes" / "smollm2_135m.json").read_text())
    assert (s["hidden_size"], s["num_hidden_layers"], s["vocab_size"]) == (576, 30, 49152)


# ---------------------------------------------------------------- on a GPU

@pytest.fixture(scope="module")
def cuda_studio(tokenizer, tmp_path_factory):
    """The tiny build, built and served on the GPU (float32), two demo people saved and fitted."""
    from dataclasses import replace

    from personalize.demo import write_demo
    from personalize.methods.card.build import build
    from personalize.studio.facade import Studio, StudioConfig

    root = tmp_path_factory.mktemp("cuda")
    save_tiny_lm(tokenizer, root / "lm")
    demo = write_demo(root / "demo", n_users_per_style=2, n_items=10)
    cfg = tiny_build_config(root / "lm")
    cfg = replace(cfg, model=replace(cfg.model, device="cuda", dtype="float32"))
    art = build(demo, "dev", root / "artifacts", cfg, p2p=None)
    st = Studio.load(StudioConfig(own_adapters=False, artifacts=str(art), db=str(root / "studio.db"), demo_data=str(demo),
                                  export_dir=str(root / "exports")))
    users = sorted(st.runtime.demo_users)[:2]
    for u in users:
        st.histories.save_history(u, st.histories.demo_items(u), st.runtime.engine.task.name)
        st.fits.fit(u)
    st.users = users
    yield st
    st.runtime.store.close()


@pytest.mark.cuda
@needs_cuda
def test_cuda_mixed_batch_of_every_method_equals_each_alone(cuda_studio):
    from test_batch import METHODS, PROMPTS, alone, contexts, rows_of

    st = cuda_studio
    assert st.runtime.engine.lm.device.type == "cuda"
    s = st.runtime.engine.cfg.decoding
    ctx = contexts(st)
    plan = [(m, state, u, p) for state, u in ctx for m in METHODS for p in PROMPTS]
    rows = [r for m, state, u, p in plan for r in rows_of(st, m, state, u, p, s)]
    batched = st.runtime.engine.decode_rows(rows)
    for (m, state, u, p), g in zip(plan, batched):
        ref = alone(st, m, state, u, p, s)
        assert (g.text, g.n_tokens, g.note) == (ref.text, ref.n_tokens, ref.note), (m, state.name, p)


def test_4bit_without_bitsandbytes_says_how_to_install_it(monkeypatch):
    """bitsandbytes is optional weight (requirements-extra.txt): on a GPU without it, one clear error, no traceback."""
    from personalize.lm import models
    from personalize.lm.model_config import ModelConfig

    monkeypatch.setattr(models, "resolve_device", lambda _: torch.device("cuda"))
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)
    with pytest.raises(models.ModelLoadError, match="make extra"):
        models.load_lm(ModelConfig("no/such-model", load_in_4bit=True))


@pytest.mark.cuda
@needs_cuda
def test_cuda_4bit_loads_and_decodes(tokenizer, tmp_path):
    pytest.importorskip("bitsandbytes")
    from transformers import LlamaConfig, LlamaForCausalLM

    from personalize.lm.models import load_lm
    from personalize.lm.model_config import ModelConfig

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, eos_token_id=tokenizer.eos_token_id,
                      pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path / "lm")
    tokenizer.save_pretrained(tmp_path / "lm")
    lm = load_lm(ModelConfig(str(tmp_path / "lm"), device="cuda", load_in_4bit=True))
    kinds = {type(m).__name__ for m in lm.model.modules()}
    assert "Linear4bit" in kinds, kinds
    ids = lm.tokenizer(["hello there"], return_tensors="pt").to(lm.device)
    out = lm.model.generate(**ids, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    assert out.shape[1] == ids["input_ids"].shape[1] + 4


@pytest.mark.cuda
@needs_cuda
def test_cuda_gpu_check_tiny(tmp_path):
    """The check's Python in its tiny mode on the GPU, every column (NF4 included)."""
    p = run_check(tmp_path, "--device", "cuda")
    assert_full_table(p, tmp_path, [0, 1, 2])
