"""What a command asks for: `build`'s arguments (shared by the CLI, the app's first start and the Populations tab) and
the settings and keyword arguments they mean (build_plan), the first start's demo build (its people, its arguments,
ensure_demo), and what the CLI's and eval's commands share (the engine they load, the decoding they change). Imports no model code at import time: the CLI's light commands stay light.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from personalize.methods.card.config import CardConfig

DEMO_ARTIFACTS = "data/artifacts/demo"


class UsageError(ValueError):
    """Bad command-line input: one clear line on stderr and exit status 2."""


def ints(s: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in s.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from None


def comma_list(s: str | None) -> tuple[str, ...]:
    return tuple(x.strip() for x in (s or "").split(",") if x.strip())


def comma_names(s: str) -> list[str]:
    return [m.strip() for m in s.split(",") if m.strip()]


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="LM: 'bundled' (SmolLM2-135M-Instruct GGUF), a Hugging Face id or a folder")
    p.add_argument("--device", default=None, help="auto | cpu | cuda | cuda:N")
    p.add_argument("--dtype", default=None, help="auto | float32 | bfloat16 | float16")
    p.add_argument("--load-in-4bit", action="store_true", help="4-bit weights via bitsandbytes (CUDA only)")


def model_config(a, base=None):
    from personalize.lm.models import ModelConfig

    base = base or ModelConfig()
    changes = {k: v for k, v in {"name_or_path": a.model, "device": a.device, "dtype": a.dtype}.items() if v}
    if a.load_in_4bit:
        changes["load_in_4bit"] = True
    return replace(base, **changes) if changes else None


def decoding_args(p: argparse.ArgumentParser) -> None:
    """The decoding settings a command may change."""
    p.add_argument("--alpha", type=float, default=None, help="steering strength α (default: chosen by build on dev)")
    p.add_argument("--top-k", type=int, default=None, help="candidates re-ranked per step (default 50)")
    p.add_argument("--max-tokens", type=int, default=None, help="max new tokens (default 32)")


def decoding(engine, a):
    """The build's decoding settings with the command's changes."""
    s = engine.cfg.decoding
    changes = {k: v for k, v in {"alpha": a.alpha, "top_k": a.top_k, "max_new_tokens": a.max_tokens}.items() if v is not None}
    return replace(s, **changes)


def load_engine(a):
    """The build a command names (--artifacts), with its --model changes."""
    from personalize.methods.engine import Engine

    path = Path(a.artifacts)
    if not (path / "config.json").exists():
        raise UsageError(f"no artifacts at {path}: build them with `python -m personalize build --data DIR --out {path}`")
    return Engine.load(path, model_config(a) if hasattr(a, "model") else None)


def add_build_args(p: argparse.ArgumentParser) -> None:
    """`build`'s arguments."""
    p.add_argument("--data", required=True, help="folder with {split}_questions.json (and outputs, meta)")
    p.add_argument("--split", default="dev")
    p.add_argument("--ks", type=ints, default=(1, 2, 4, 8), help="cluster counts to build (must include 1)")
    p.add_argument("--default-k", type=int, default=None, help="K the head is trained on and methods use (default 4)")
    p.add_argument("--limit-users", type=int, default=None, help="use the first N users only")
    p.add_argument("--sources", default="", help="only users from these sources (comma-separated repositories or venues, "
                                                  "as the data's meta file names them)")
    p.add_argument("--exclude-sources", default="", help="leave users of these sources out of the build, to score "
                                                          "them later as people the build never saw (eval --sources)")
    p.add_argument("--out", default=None, help="artifacts folder (default data/artifacts/<data folder name>)")
    p.add_argument("--objectives", default="tokens", help="head objectives to train, first = CARD's default: any of tokens,pairs,hard_pairs "
                        "(METHOD §1.9.3 b, a, c)")
    p.add_argument("--items-per-user", type=int, default=16)
    p.add_argument("--val-users", type=int, default=30,
                   help="validation people: the decoding choice and the harm guard (people outside the population "
                        "first, then population users held out of training)")
    p.add_argument("--base-steps", type=int, default=60, help="K=1 adapter steps (batch 8)")
    p.add_argument("--cluster-steps", type=int, default=8, help="steps per cluster adapter")
    p.add_argument("--head-epochs", type=int, default=20)
    p.add_argument("--head-weight-decay", type=float, default=0.0, help="AdamW weight decay on the head's P and U")
    p.add_argument("--head-patience", type=int, default=2,
                   help="early stopping on held-out users' items: epochs without improvement (0 = off)")
    p.add_argument("--d", type=int, default=128, help="head dimension D")
    p.add_argument("--layers", type=int, default=4, help="last layers whose states form h_t")
    p.add_argument("--max-prompt-tokens", type=int, default=160)
    p.add_argument("--max-target-tokens", type=int, default=40)
    p.add_argument("--encoder", default=None, help="sentence encoder: 'bundled' (all-MiniLM-L6-v2) or a sentence-transformers id")
    p.add_argument("--p2p-steps", type=int, default=None,
                   help="Profile-to-PEFT hypernetwork training steps (default 20, a CPU budget; 0 = untrained)")
    p.add_argument("--skip-p2p", action="store_true",
                   help="do not train the P2P hypernetwork (the p2p method is then unavailable with these artifacts)")
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
    from personalize.methods.card.adapters import LoraSettings
    from personalize.methods.card.config import CardConfig
    from personalize.methods.card.head import HeadSettings
    from personalize.fitting.build import P2P_STEPS
    from personalize.lm.models import EncoderConfig, ModelConfig
    from personalize.lm.tokens import TokenBudget
    from personalize.methods.p2p import P2PConfig

    cfg = CardConfig()
    cfg = replace(
        cfg, ks=a.ks, default_k=a.default_k or (4 if 4 in a.ks else max(a.ks)),
        objectives=tuple(comma_names(a.objectives)), items_per_user=a.items_per_user, n_val_users=a.val_users,
        model=model_config(a) or ModelConfig(), encoder=EncoderConfig(a.encoder) if a.encoder else cfg.encoder,
        budget=TokenBudget(a.max_prompt_tokens, a.max_target_tokens),
        lora=replace(LoraSettings(), base_steps=a.base_steps, cluster_steps=a.cluster_steps),
        head=replace(HeadSettings(), epochs=a.head_epochs, d=a.d, n_layers=a.layers, patience=a.head_patience,
                     weight_decay=a.head_weight_decay),
    )
    if a.skip_p2p and a.p2p_steps is not None:
        raise UsageError("--p2p-steps has no effect with --skip-p2p: give one of them")
    p2p = None if a.skip_p2p else P2PConfig(steps=P2P_STEPS if a.p2p_steps is None else a.p2p_steps)
    out = Path(a.out or f"data/artifacts/{data.name}")
    return data, out, cfg, {"limit_users": a.limit_users, "p2p": p2p, "sources": comma_list(a.sources),
                            "exclude_sources": comma_list(a.exclude_sources)}


def run_build(a, **more) -> None:
    """`build` as its arguments ask (build_plan); `more`: build()'s other keyword arguments (`cluster_trainer`)."""
    data, out, cfg, kwargs = build_plan(a)  # first: a wrong folder is told before the model code loads
    from personalize.fitting.build import build

    build(data, a.split, out, cfg, **kwargs, **more)


# Sized for a first start of minutes on a 2-core CPU (docs/RESULTS.md, "Real people out of the box"): K up to 4 for
# 48 people (6 cluster adapters instead of 14 for K = 1, 2, 4, 8); P2P's hypernetwork gets a token budget of 2 steps.
# 32 target tokens = the app's default.
DEMO_BUILD_ARGS = ["--ks", "1,2,4", "--default-k", "4", "--base-steps", "20", "--cluster-steps", "2", "--p2p-steps", "2",
                   "--items-per-user", "12", "--max-prompt-tokens", "64", "--max-target-tokens", "32"]


DEMO_MIN_PEOPLE = 40  # real people the first start wants before it builds on them instead of the synthetic writers
DEMO_POPULATION = 48  # of them in the build; the others choose its decoding (30) or are new people to try


def write_demo_people(demo: Path, docs: str | Path | None = None) -> str:
    """The first start's people: real ones where the machine has them (every Debian system ships its
    maintainers' changelogs), else the synthetic tweet writers. Returns which, in words."""
    import shutil
    import tempfile

    from personalize.data import HistoryError
    from personalize.demo import write_demo
    from personalize.fitting.changelogs import DEBIAN_DOCS, from_changelogs

    docs = docs or DEBIAN_DOCS
    demo.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=demo.parent, prefix=f".{demo.name}."))
    try:
        report = from_changelogs(docs, tmp, min_items=12, max_items=24)
        if report.people >= DEMO_MIN_PEOPLE:
            try:
                os.replace(tmp, demo)
            except OSError:  # another process wrote it first: theirs stands
                pass
            return f"{report.people} Debian maintainers' changelog entries from {docs} ({report.summary()})"
        why = f"only {report.people} maintainers with 12 or more entries under {docs}"
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


def ensure_demo(demo: Path, art: Path) -> None:
    """The first-run path of `demo` and the app: write the demo population and build it, once."""
    if not (demo / "dev_questions.json").exists():
        print(f"first start: the demo's people are {write_demo_people(demo)}", flush=True)
    from personalize.methods.card.config import FORMAT_VERSION
    from personalize.methods.artifacts import ArtifactsError, artifacts_meta

    try:
        old = (art / "config.json").exists() and artifacts_meta(art).get("format_version", 0) < FORMAT_VERSION
    except ArtifactsError:
        old = True  # unreadable: build anew
    if old:
        print(f"the demo artifacts in {art} were built by an older version: rebuilding them", flush=True)
    if old or not (art / "config.json").exists():
        print(f"first start: building the demo artifacts in {art} (a few minutes, once) ...", flush=True)
        run_build(build_args(["--data", str(demo), "--out", str(art), *DEMO_BUILD_ARGS, *demo_people_args(demo)]))
