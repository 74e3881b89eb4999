"""A batch's shared prompt prefix read once (lm/prefix.py), timed both ways in one run (issue 58): the head's
teacher-forced pass over each of --people demo people's texts (as the build reads them, one person a call), and
--steps training steps of a fresh LoRA at the demo's batch size (as the K = 1 adapter trains). The order of the two
ways alternates between repeats (PERSONALIZE_SHARED_PREFIX switches them); prints each repeat, the medians, their
ratio, and how far the two ways' outputs lie apart (log-probabilities and the training loss).

    python -m benchmarks.shared_prefix [--data data/demo] [--people 12] [--steps 4] [--repeats 3] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from personalize.data import read_lamp
from personalize.fitting.plan import DEMO_BUILD_ARGS, build_args, build_plan
from personalize.lm import prefix
from personalize.lm.features import teacher_forced
from personalize.lm.models import load_lm
from personalize.lm.tokens import prompt_ids
from personalize.methods.card.adapters import new_peft_model, rows_answer_loss


def shared_share(tok, texts, budget) -> float:
    """The share of the prompts' tokens that every prompt of a person opens with (the part read once)."""
    ids = [prompt_ids(tok, x, budget) for x, _ in texts]
    return prefix.shared_length(ids) / (sum(map(len, ids)) / len(ids))


def one_way(model, tok, people, examples, cfg, steps: int) -> dict:
    t = time.perf_counter()
    feats = [teacher_forced(model, tok, texts, cfg.head.n_layers, cfg.budget, top_k=cfg.head.top_k) for texts in people]
    passes = time.perf_counter() - t
    params = [p for n, p in model.named_parameters() if "lora_" in n]
    for p in params:
        p.requires_grad_(True)
    model.train()
    t, losses = time.perf_counter(), []
    for s in range(steps):
        loss = rows_answer_loss(model, tok, examples[s * cfg.lora.batch_size: (s + 1) * cfg.lora.batch_size],
                                cfg.budget)
        loss.backward()  # no optimiser step: both ways read the same weights, so their losses compare
        for p in params:
            p.grad = None
        losses.append(loss.item())
    model.eval()
    for p in params:
        p.requires_grad_(False)
    return {"passes_s": passes, "steps_s": time.perf_counter() - t, "losses": losses,
            "logprob": [f.logprob for fs in feats for f in fs]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="data/demo")
    p.add_argument("--people", type=int, default=12)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    _, _, cfg, _ = build_plan(build_args(["--data", a.data, "--out", "/tmp/unused", *DEMO_BUILD_ARGS]))
    _, queries = read_lamp(a.data, "dev")
    people = [[(it.x, it.y) for it in q.profile[: cfg.items_per_user]] for q in queries[: a.people]]
    examples = [ex for texts in people for ex in texts]
    lm = load_lm(cfg.model)
    torch.manual_seed(0)
    model = new_peft_model(lm.model, cfg.lora)
    share = statistics.median(shared_share(lm.tokenizer, texts, cfg.budget) for texts in people)
    print(f"{len(people)} people, {len(examples)} texts; a person's prompts share {share:.0%} of their tokens "
          f"(median); {a.steps} training steps of {cfg.lora.batch_size}; {a.repeats} repeat(s)", flush=True)
    runs = {"whole": [], "shared prefix": []}
    for r in range(a.repeats):
        for way in (("whole", "shared prefix") if r % 2 == 0 else ("shared prefix", "whole")):
            os.environ[prefix.SWITCH] = "1" if way == "shared prefix" else "0"
            got = one_way(model, lm.tokenizer, people, examples, cfg, a.steps)
            runs[way].append(got)
            print(f"  repeat {r + 1}, {way}: passes {got['passes_s']:.1f} s, steps {got['steps_s']:.1f} s", flush=True)
    os.environ.pop(prefix.SWITCH, None)
    rows = []
    for what in ("passes_s", "steps_s"):
        before, after = (statistics.median(x[what] for x in runs[w]) for w in runs)
        rows.append((what, before, after))
    apart = max(float((x - y).abs().max()) for x, y in zip(runs["whole"][0]["logprob"],
                                                           runs["shared prefix"][0]["logprob"]))
    loss_apart = max(abs(x - y) for x, y in zip(runs["whole"][0]["losses"], runs["shared prefix"][0]["losses"]))
    print(f"\n| seconds (median of {a.repeats}) | whole prompts | shared prefix read once | ratio |\n|---|---|---|---|")
    for what, before, after in rows:
        name = {"passes_s": f"teacher-forced passes ({len(people)} people)",
                "steps_s": f"training steps ({a.steps} of {cfg.lora.batch_size}, forward + backward)"}[what]
        print(f"| {name} | {before:.1f} | {after:.1f} | {after / before:.2f} |")
    print(f"\nthe two ways apart: log-probabilities at most {apart:.2e}, training losses at most {loss_apart:.2e}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"share": share, "rows": rows, "logprob_apart": apart, "loss_apart": loss_apart,
                       "runs": {w: [{k: v for k, v in x.items() if k != "logprob"} for x in rs]
                                for w, rs in runs.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
