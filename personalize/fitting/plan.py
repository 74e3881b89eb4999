"""What a command asks for: `build`'s arguments (shared by the CLI, the app's first start and the Populations tab) and
the settings and keyword arguments they mean (build_plan), the first start's demo build (its people, its arguments,
ensure_demo), and what the CLI's and eval's commands share (the engine they load, the decoding they change). Imports no model code at import time: the CLI's light commands stay light.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from personalize.flags import add_flags, add_overrides, flag_values

if TYPE_CHECKING:
    from personalize.methods.card.config import CardConfig

DEMO_ARTIFACTS = "data/artifacts/demo"  # the build the studio serves first (built at the first start)
DEMO_DATA = "data/demo"  # the first start's people (a LaMP folder)
DEFAULT_DB = "data/studio.db"  # the studio's database; its folder is the data root of everything a studio writes


class UsageError(ValueError):
    """Bad command-line input: one clear line on stderr and exit status 2."""


def ints(s: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in s.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from None


def comma_list(s: str | None) -> tuple[str, ...]:
    return tuple(x.strip() for x in (s or "").split(",") if x.strip())


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="LM: 'bundled' (SmolLM2-135M-Instruct GGUF), a Hugging Face id or a folder")
    p.add_argument("--device", default=None, help="auto | cpu | cuda | cuda:N")
    p.add_argument("--dtype", default=None, help="auto | float32 | bfloat16 | float16")
    p.add_argument("--load-in-4bit", action="store_true", help="4-bit weights via bitsandbytes (CUDA only)")
    p.add_argument("--static-cache", action="store_true",
                   help="decode with a fixed-size KV cache (on a GPU, compiled into CUDA graphs)")


def model_config(a):
    from personalize.lm.model_config import ModelConfig

    changes = {k: v for k, v in {"name_or_path": a.model, "device": a.device, "dtype": a.dtype}.items() if v}
    changes |= {k: True for k in ("load_in_4bit", "static_cache") if getattr(a, k, False)}
    return replace(ModelConfig(), **changes) if changes else None


DECODING_FLAGS = {"alpha": "--alpha", "top_k": "--top-k", "max_new_tokens": "--max-tokens"}


def decoding_args(p: argparse.ArgumentParser) -> None:
    """The decoding settings a command may change."""
    from personalize.serving.settings import DecodingSettings  # settings only: no model code

    add_overrides(p, DecodingSettings, DECODING_FLAGS)


def decoding(engine, a):
    """The build's decoding settings with the command's changes (the override flags given)."""
    return replace(engine.cfg.decoding, **{k: v for k, v in flag_values(a, DECODING_FLAGS).items() if v is not None})


def load_engine(a):
    """The build a command names (--artifacts), with its --model changes."""
    from personalize.methods.engine import Engine

    path = Path(a.artifacts)
    if not (path / "config.json").exists():
        raise UsageError(f"no artifacts at {path}: build them with `python -m personalize build --data DIR --out {path}`")
    if part := json.loads((path / "config.json").read_text()).get("part"):
        raise UsageError(f"the build at {path} is unfinished (only its {part} part was written: a first start still "
                         "building it, or stopped): start the app to build it again, or `python -m personalize build`")
    return Engine.load(path, model_config(a) if hasattr(a, "model") else None)


# build's flags made from the settings' fields (flags.add_flags): field → flag
CARD_FLAGS = {"ks": "--ks", "objectives": "--objectives", "items_per_user": "--items-per-user", "n_val_users": "--val-users"}
LORA_FLAGS = {"base_steps": "--base-steps", "cluster_steps": "--cluster-steps", "cluster_layers": "--cluster-layers"}
HEAD_FLAGS = {"epochs": "--head-epochs", "weight_decay": "--head-weight-decay", "patience": "--head-patience", "d": "--d",
              "n_layers": "--layers"}
BUDGET_FLAGS = {"max_prompt_tokens": "--max-prompt-tokens", "max_target_tokens": "--max-target-tokens"}
OWN_FLAGS = {"far": "--own-adapters-for-far"}


def add_build_args(p: argparse.ArgumentParser) -> None:
    """`build`'s arguments: the settings' own flags (add_flags) and what only a build is told."""
    from personalize.lm.tokens import TokenBudget  # settings only: no model code
    from personalize.methods.card.config import CardConfig, HeadSettings, LoraSettings, OwnSettings

    p.add_argument("--data", required=True, help="folder with {split}_questions.json (and outputs, meta)")
    p.add_argument("--split", default="dev")
    p.add_argument("--default-k", type=int, default=None,
                   help=f"K the head is trained on and methods use (default {CardConfig.default_k} when built, else the "
                        "largest)")
    p.add_argument("--limit-users", type=int, default=None, help="use the first N users only")
    p.add_argument("--sources", default="", help="only users from these sources (comma-separated repositories or venues, "
                                                  "as the data's meta file names them)")
    p.add_argument("--exclude-sources", default="", help="leave users of these sources out of the build, to score "
                                                          "them later as people the build never saw (eval --sources)")
    p.add_argument("--out", default=None, help="artifacts folder (default data/artifacts/<data folder name>)")
    for cls, flags in ((CardConfig, CARD_FLAGS), (LoraSettings, LORA_FLAGS), (HeadSettings, HEAD_FLAGS),
                       (TokenBudget, BUDGET_FLAGS), (OwnSettings, OWN_FLAGS)):
        add_flags(p, cls, flags)
    p.add_argument("--encoder", default=None, help="sentence encoder: 'bundled' (all-MiniLM-L6-v2) or a sentence-transformers id")
    p.add_argument("--p2p-steps", type=int, default=None,
                   help="Profile-to-PEFT hypernetwork training steps (default 20, a CPU budget; 0 = untrained)")
    p.add_argument("--skip-p2p", action="store_true",
                   help="do not train the P2P hypernetwork (the p2p method is then unavailable with these artifacts)")
    p.add_argument("--tune-steps", default=None,
                   help="the decoding choice's steps to run, comma-separated (repetition, style, alpha, knn_weight, "
                        "fallback; 'none': the harm guards alone, on the settings as given); default: all")
    add_model_args(p)


def build_args(argv: list[str]) -> argparse.Namespace:
    """`build`'s arguments parsed alone (the first start's and the Populations tab's builds)."""
    p = argparse.ArgumentParser(prog="python -m personalize build")
    add_build_args(p)
    return p.parse_args(argv)


def build_plan(a) -> tuple[Path, Path, CardConfig, dict]:
    """What `build`'s arguments ask for: (data, out, the settings, build()'s other keyword arguments); the app's
    Populations tab builds with the same arguments (population_jobs)."""
    data = Path(a.data)
    if not data.is_dir():  # told before the model code is imported
        raise UsageError(f"--data {data} is not a folder")
    from personalize.methods.card.config import CardConfig, HeadSettings, LoraSettings, OwnSettings
    from personalize.methods.card.build import P2P_STEPS
    from personalize.lm.model_config import EncoderConfig, ModelConfig
    from personalize.lm.tokens import TokenBudget
    from personalize.methods.p2p import P2PConfig

    cfg = CardConfig()
    cfg = replace(
        cfg, **flag_values(a, CARD_FLAGS), default_k=a.default_k or (cfg.default_k if cfg.default_k in a.ks else max(a.ks)),
        model=model_config(a) or ModelConfig(), encoder=EncoderConfig(a.encoder) if a.encoder else cfg.encoder,
        budget=TokenBudget(**flag_values(a, BUDGET_FLAGS)), lora=replace(LoraSettings(), **flag_values(a, LORA_FLAGS)),
        head=replace(HeadSettings(), **flag_values(a, HEAD_FLAGS)), own=replace(OwnSettings(), **flag_values(a, OWN_FLAGS)),
    )
    if a.skip_p2p and a.p2p_steps is not None:
        raise UsageError("--p2p-steps has no effect with --skip-p2p: give one of them")
    p2p = None if a.skip_p2p else P2PConfig(steps=P2P_STEPS if a.p2p_steps is None else a.p2p_steps)
    out = Path(a.out or f"data/artifacts/{data.name}")
    steps = None if a.tune_steps is None else tuple(x for x in comma_list(a.tune_steps) if x != "none")
    return data, out, cfg, {"limit_users": a.limit_users, "p2p": p2p, "sources": comma_list(a.sources),
                            "exclude_sources": comma_list(a.exclude_sources), "tune_steps": steps}


def run_build(a, **more) -> None:
    """`build` as its arguments ask (build_plan); `more`: build()'s other keyword arguments (`cluster_trainer`)."""
    data, out, cfg, kwargs = build_plan(a)  # first: a wrong folder is told before the model code loads
    from personalize.methods.card.build import build

    build(data, a.split, out, cfg, **kwargs, **more)


# Sized for a first start of minutes on a 2-core CPU (docs/RESULTS.md, "Real people out of the box"): K up to 4 for
# 48 people (6 cluster adapters instead of 14 for K = 1, 2, 4, 8); one cluster step and one P2P step, each at the full
# learning rate (until 2026-11-29 each ran 2 steps, the first a warm-up step at lr 0 that trained nothing).
# 32 target tokens = the app's default. The cluster adapters train their upper 10 of SmolLM2's 30 blocks over the K = 1
# adapter's lower states, computed once a text (benchmarks/demo_training.py: 0.63 of the time, held-out loss +0.7 %).
DEMO_BUILD_ARGS = ["--ks", "1,2,4", "--default-k", "4", "--base-steps", "20", "--cluster-steps", "1", "--p2p-steps", "1",
                   "--items-per-user", "12", "--max-prompt-tokens", "64", "--max-target-tokens", "32",
                   "--cluster-layers", "10"]


# The first start's decoding starts from the best its own choice measured on the Debian demo (docs/RESULTS.md, the
# demo build of 2026-11-27: repetition 1.2 / no-repeat 4, retrieval + bias + memory, w 0.5, the fallback, α 1) and
# runs the harm guards alone on it (--tune-steps none: minutes less); `python -m personalize tune --artifacts
# data/artifacts/demo` runs the whole choice again when asked.
DEMO_DECODING = {"repetition_penalty": 1.2, "no_repeat_ngram": 4, "alpha": 1.0}
DEMO_STYLE = {"bias": True, "memory": True, "retrieval": True, "knn_weight": 0.5, "fallback": True}


DEMO_MIN_PEOPLE = 40  # real people the first start wants before it builds on them instead of the synthetic writers
DEMO_POPULATION = 48  # of them in the build; the others choose its decoding (30) or are new people to try


def write_demo_people(demo: Path) -> str:
    """The first start's people: real ones where the machine has them (every Debian system ships its
    maintainers' changelogs), else the synthetic tweet writers. Returns which, in words."""
    import shutil
    import tempfile

    from personalize.data import HistoryError
    from personalize.demo import write_demo
    from personalize.fitting.changelogs import DEBIAN_DOCS, from_changelogs

    demo.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=demo.parent, prefix=f".{demo.name}."))
    try:
        report = from_changelogs(DEBIAN_DOCS, tmp, min_items=12, max_items=24)
        if report.people >= DEMO_MIN_PEOPLE:
            try:
                os.replace(tmp, demo)
            except OSError:  # another process wrote it first: theirs stands
                pass
            return f"{report.people} Debian maintainers' changelog entries from {DEBIAN_DOCS} ({report.summary()})"
        why = f"only {report.people} maintainers with 12 or more entries under {DEBIAN_DOCS}"
    except HistoryError as e:
        why = str(e)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    write_demo(demo)
    return f"the synthetic tweet writers ({why}; {DEMO_MIN_PEOPLE} real people wanted)"


def demo_people_args(demo: Path) -> list[str]:
    """Who the demo build trains on: the first DEMO_POPULATION real people, the next 30 choose its decoding and
    guard card, the rest are new people to try; the synthetic writers (48 in 6 styles) all train but the 6 held out
    to choose on, at K up to 8 so that no two styles share a cluster."""
    from personalize.data import read_lamp

    task, queries = read_lamp(demo, "dev")
    if task.name == "tweets":
        return ["--val-users", "6", "--ks", "1,2,4,8", "--default-k", "8"]
    return ["--limit-users", str(min(DEMO_POPULATION, len(queries)))]


def _outdated(art: Path) -> bool:
    """Whether the artifacts in `art` were built by an older version of this code, cannot be read, or are the card
    part of a build that never finished (a first start stopped during its guard: build's on_part)."""
    from personalize.methods.artifacts import ArtifactsError, artifacts_meta
    from personalize.methods.card.config import FORMAT_VERSION

    try:
        if not (art / "config.json").exists():
            return False
        meta = artifacts_meta(art)
        return meta.get("format_version", 0) < FORMAT_VERSION or bool(meta.get("part"))
    except ArtifactsError:
        return True  # unreadable: build anew


def demo_ready(demo: Path, art: Path) -> bool:
    """Whether the first start has nothing to build (ensure_demo would return at once)."""
    return (demo / "dev_questions.json").exists() and (art / "config.json").exists() and not _outdated(art)


def ensure_demo(demo: Path, art: Path, progress=None, on_part=None) -> None:
    """The first-run path of `demo` and the app: write the demo population and build it, once. `progress`: build's
    hook, (stage, fraction of the build) (the app's first-start page shows it); `on_part`: build's, (part, folder)
    when a part of the build can serve (the app serves card before the guard has decided and P2P is in)."""
    if not (demo / "dev_questions.json").exists():
        print(f"first start: the demo's people are {write_demo_people(demo)}", flush=True)
    old = _outdated(art)
    if old:
        print(f"the demo artifacts in {art} were built by an older version or not finished: rebuilding them",
              flush=True)
    if old or not (art / "config.json").exists():
        print(f"first start: building the demo artifacts in {art} (a few minutes, once) ...", flush=True)
        from personalize.methods.card.build import build

        data, out, cfg, kwargs = build_plan(build_args(["--data", str(demo), "--out", str(art), *DEMO_BUILD_ARGS,
                                                        "--tune-steps", "none", *demo_people_args(demo)]))
        cfg = replace(cfg, decoding=replace(cfg.decoding, **DEMO_DECODING), style=replace(cfg.style, **DEMO_STYLE))
        build(data, "dev", out, cfg, **kwargs, progress=progress, on_part=on_part)
