"""First-start work under two processes at once (two `python -m personalize build` on a fresh checkout):
the bundled model's conversion, the demo population and the build each happen whole, and neither process
fails or reads the other's half-written files."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path


from personalize.data import read_lamp

ROOT = Path(__file__).resolve().parents[2]


def _together(setup: str, action: str, n: int = 2, timeout: float = 240) -> list[tuple[int, str]]:
    """Run `setup` in n fresh interpreters, then release them all at once into `action` (imports take
    seconds and vary, so a plain pair of starts would not reliably overlap); (exit code, output) of each."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    code = f"import sys\n{setup}\nprint('ready', flush=True)\nsys.stdin.readline()\n{action}\n"
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, text=True, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for _ in range(n)]
    heads = []
    for p in procs:
        lines = []
        while (line := p.stdout.readline()) and line != "ready\n":
            lines.append(line)
        heads.append("".join(lines))
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    results = []
    for p, head in zip(procs, heads):
        out, _ = p.communicate(timeout=timeout)
        results.append((p.returncode, head + out))
    return results


def test_two_processes_convert_the_bundled_model_once(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    cache = tmp_path / "models"
    runs = _together("from transformers import AutoModelForCausalLM, AutoTokenizer\n"
                     "from personalize.lm.models import bundled_lm_folder",
                     f"print('FOLDER=' + str(bundled_lm_folder({str(cache)!r})))")
    assert all(rc == 0 for rc, _ in runs), runs
    folders = {line[len("FOLDER="):] for _, out in runs for line in out.splitlines() if line.startswith("FOLDER=")}
    assert folders == {str(cache / "smollm2-135m-instruct")}, runs
    assert sum(out.count("converting the bundled GGUF") for _, out in runs) == 1, runs  # once, not twice
    folder = Path(folders.pop())
    assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
    assert AutoModelForCausalLM.from_pretrained(folder).config.num_hidden_layers == 30
    assert sorted(p.name for p in cache.iterdir()) == [".smollm2-135m-instruct.lock", "smollm2-135m-instruct"]


_CARD = """
from personalize.methods.card.adapters import LoraSettings
from personalize.methods.card.build import build
from personalize.methods.card.config import CardConfig
from personalize.serving.generation import DecodingSettings
from personalize.methods.card.head import HeadSettings
from personalize.lm.models import ModelConfig
from personalize.lm.tokens import TokenBudget
card = CardConfig(model=ModelConfig({lm!r}, device="cpu"), ks=(1, 2), default_k=2, budget=TokenBudget(32, 12),
                  items_per_user=8, n_val_users=2,
                  lora=LoraSettings(r=4, alpha=8, targets=("q_proj", "v_proj"), batch_size=4, base_steps=2,
                                    cluster_steps=1),
                  head=HeadSettings(d=16, epochs=2), decoding=DecodingSettings(max_new_tokens=6), alphas=(0.0,))
"""


def test_two_processes_build_the_same_folder(tokenizer, tmp_path: Path) -> None:
    from conftest import save_tiny_lm
    from personalize.demo import write_demo
    from personalize.methods.artifacts import artifacts_meta

    save_tiny_lm(tokenizer, tmp_path / "lm")
    demo = write_demo(tmp_path / "demo", n_users_per_style=2, n_items=10)
    art = tmp_path / "art"
    runs = _together(_CARD.format(lm=str(tmp_path / "lm")), f"build({str(demo)!r}, 'dev', {str(art)!r}, card, p2p=None)")
    assert all(rc == 0 for rc, _ in runs), runs
    meta = artifacts_meta(art)
    assert meta["name"] == "art" and (art / "clusters.npz").is_file() and (art / "adapters").is_dir()
    assert not (tmp_path / "art.partial").exists() and not list(tmp_path.glob(".*tmp*"))
    # the second waited for the first and took its folder instead of building (and replacing) it again
    assert sum(out.count("artifacts written to") for _, out in runs) == 1, runs
    assert sum(out.count("another process is building") for _, out in runs) == 1, runs


def test_two_processes_write_the_demo(tmp_path: Path) -> None:
    from personalize.demo import write_demo

    runs = _together("from personalize.demo import write_demo",
                     f"write_demo({str(tmp_path / 'demo')!r}, n_users_per_style=4, n_items=12)")
    assert all(rc == 0 for rc, _ in runs), runs
    names = ("dev_questions.json", "dev_outputs.json", "dev_meta.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo"]  # no temp folder left beside it
    ref = write_demo(tmp_path / "ref", n_users_per_style=4, n_items=12)
    assert all((tmp_path / "demo" / n).read_bytes() == (ref / n).read_bytes() for n in names)
    assert len(read_lamp(tmp_path / "demo", "dev")[1]) == 4 * 6


def test_write_demo_again_replaces_an_existing_folder(tmp_path: Path) -> None:
    """Asked for on purpose, write_demo still rewrites a folder that has one (file by file, atomically)."""
    from personalize.demo import write_demo

    folder = tmp_path / "demo"
    first = (write_demo(folder, n_users_per_style=2, n_items=6) / "dev_questions.json").read_bytes()
    assert (write_demo(folder, n_users_per_style=2, n_items=6, seed=1) / "dev_questions.json").read_bytes() != first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo"]


def test_build_skips_only_a_folder_built_while_it_waited(tmp_path: Path, monkeypatch) -> None:
    """The lock's other side, without a real build: a build that waited for another process's build of the
    same folder returns that folder; a build on an existing folder nobody else is building still rebuilds."""
    import personalize.methods.card.build as b
    from personalize.lm.models import file_lock

    calls = []

    def fake_build(data_dir, split, out, *rest):
        calls.append(out)
        out.mkdir(exist_ok=True)
        (out / "config.json").write_text("{}")
        return out

    monkeypatch.setattr(b, "_build", fake_build)
    out = tmp_path / "art"
    b.build("data", "dev", out)
    b.build("data", "dev", out)  # deliberate rebuild of an existing folder
    assert len(calls) == 2
    with file_lock(tmp_path / "art.lock"):  # "another process" holds the lock ...
        t = threading.Thread(target=b.build, args=("data", "dev", out))
        t.start()
        time.sleep(0.3)
        (out / "config.json").unlink()
        (out / "config.json").write_text('{"new": 1}')  # ... and writes a fresh folder meanwhile
    t.join(10)
    assert not t.is_alive() and len(calls) == 2


def test_the_first_start_builds_from_the_measured_best_and_runs_the_guards_alone(tmp_path: Path, monkeypatch) -> None:
    """The demo's decoding choice re-tried settings RESULTS had ranked (370 s of a first start): the first start
    now builds with the best measured and only the harm guards judge it; its progress reaches the caller."""
    import personalize.methods.card.build as build_module
    from personalize.demo import write_demo
    from personalize.fitting import plan

    write_demo(tmp_path / "demo", n_users_per_style=2, n_items=4)
    seen = {}
    monkeypatch.setattr(build_module, "build", lambda data, split, out, cfg, **kw: seen.update(cfg=cfg, **kw))
    hook = lambda stage, fraction: None  # noqa: E731
    plan.ensure_demo(tmp_path / "demo", tmp_path / "art", progress=hook)
    assert seen["tune_steps"] == () and seen["progress"] is hook
    cfg = seen["cfg"]
    assert all(getattr(cfg.decoding, k) == v for k, v in plan.DEMO_DECODING.items())
    assert all(getattr(cfg.style, k) == v for k, v in plan.DEMO_STYLE.items())
    assert not plan.demo_ready(tmp_path / "demo", tmp_path / "art")  # nothing written by the stand-in build
