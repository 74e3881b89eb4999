"""What a mixed batch costs against one row: one Compare's rows (base, cluster, card, cope with its twin, p2p)
against card alone, with each row's LoRA from peft's `adapter_names` (the reference) and with the fast path
(gathered LoRAs, shared prefill, oneDNN linears), and whether both give the same outputs.

    .venv/bin/python benchmarks/mixed_step.py [--artifacts data/artifacts/demo] [--repeats 5] [--tokens 32] [--kernels]
        [--scaling] [--ops]

The decodes run in a worker thread as the scheduler runs them; the conditions alternate in one process, so
a noisy minute hits all of them. Prints medians and the ratios; --profile adds torch's op table per path.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from omp_teams import in_thread  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--artifacts", default="data/artifacts/demo")
    ap.add_argument("--demo-data", default="data/demo")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--scaling", action="store_true",
                    help="also plain rows (the frozen LM, distinct prompts) in batches of 1, 2, 4 and 8: what a row "
                         "adds to a step")
    ap.add_argument("--ops", action="store_true",
                    help="count the operators a step runs (a GPU launches a kernel for each: where a small model's "
                         "decode is launch-bound, the ratio of these counts is the ratio of times), in the model and "
                         "in the rows' logits processors")
    ap.add_argument("--kernels", action="store_true",
                    help="also the fast path with torch's F.linear instead of oneDNN (PERSONALIZE_ONEDNN=0)")
    a = ap.parse_args(argv)

    import torch

    from personalize.serving.runner import decode_rows
    from personalize.eval.bench_serving import demo_compare
    from personalize.lm.cpu_threads import release_team

    studio, compare, card = demo_compare(a.artifacts, a.demo_data, a.tokens)
    e = studio.runtime.engine
    e.load_pending_adapters()
    sets = {"compare": compare, "card alone": card}
    print(f"{len(sets['compare'])} rows (+ COPE's twin), {a.tokens} tokens, torch threads {torch.get_num_threads()}")
    outs = {}
    paths = {"fast": True, "reference": False}
    if a.kernels:
        paths["fast, F.linear"] = True

    def decode(k: str, path: str):
        os.environ["PERSONALIZE_ONEDNN"] = "0" if path == "fast, F.linear" else "1"
        return decode_rows(e.model, e.tok, sets[k], fast=paths[path])

    for path in paths:  # warm-up, and the outputs of each path
        outs[path] = [g.text for g in decode("compare", path)]
    release_team()  # as the app's threads do (lm/cpu_threads.py): the main thread keeps no OpenMP team
    same = outs["fast"] == outs["reference"]  # (F.linear's rounding may differ from oneDNN's: not compared)
    print(f"same outputs on both paths: {same}")
    if not same:
        for x, y in zip(outs["fast"], outs["reference"]):
            print(f"  fast      {x!r}\n  reference {y!r}")
    times = {(k, p): [] for k in sets for p in paths}
    for i in range(a.repeats):
        for (k, p) in times:
            times[(k, p)].append(in_thread(lambda: decode(k, p)))
        print(f"  {i + 1}/{a.repeats}: " + ", ".join(f"{k} {p} {v[-1]:.2f} s" for (k, p), v in times.items()),
              flush=True)
    med = {c: statistics.median(v) for c, v in times.items()}
    for p in paths:
        print(f"{p:9s}: compare {med[('compare', p)]:.2f} s, card alone {med[('card alone', p)]:.2f} s, "
              f"ratio {med[('compare', p)] / med[('card alone', p)]:.2f}")
    print(f"compare reference / fast: {med[('compare', 'reference')] / med[('compare', 'fast')]:.2f}x, "
          f"card alone: {med[('card alone', 'reference')] / med[('card alone', 'fast')]:.2f}x")
    if a.kernels:
        print(f"fast path, F.linear / oneDNN: compare {med[('compare', 'fast, F.linear')] / med[('compare', 'fast')]:.2f}x, "
              f"card alone {med[('card alone', 'fast, F.linear')] / med[('card alone', 'fast')]:.2f}x")
    if a.scaling:
        import dataclasses

        plain = [dataclasses.replace(compare[0], prompt=f"{compare[0].prompt} {i}") for i in range(8)]
        sizes = (1, 2, 4, 8)
        for n in sizes:  # warm-up
            decode_rows(e.model, e.tok, plain[:n])
        took = {n: [] for n in sizes}
        for _ in range(a.repeats):
            for n in sizes:
                took[n].append(in_thread(lambda: decode_rows(e.model, e.tok, plain[:n])))
        one = statistics.median(took[1])
        print("plain rows: " + ", ".join(f"{n} {statistics.median(v):.2f} s ({statistics.median(v) / one:.2f}x)"
                                         for n, v in took.items()))
    if a.ops:
        for k in sets:
            n, counts = op_counts(lambda: decode(k, "fast"))
            per = {part: round(c / n, 1) for part, c in counts.items()}
            print(f"ops per step, {k} ({n} steps): " + ", ".join(f"{part} {v}" for part, v in per.items()))
            n, calls = sync_counts(lambda: decode(k, "fast"))
            print("  host syncs on a GPU per step (calls that copy a device value to the host): "
                  + ", ".join(f"{m} {c / n:.1f}" for m, c in calls.items()))
    if a.profile:
        from torch.profiler import ProfilerActivity, profile

        gpu = torch.cuda.is_available() and e.model.device.type == "cuda"
        for (k, p) in times:
            with profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if gpu else [])]) as prof:
                decode(k, p)
            order = "self_cuda_time_total" if gpu else "self_cpu_time_total"
            print(f"--- {k}, {p}\n" + prof.key_averages().table(sort_by=order, row_limit=25))


VIEWS = {"aten::view", "aten::reshape", "aten::slice", "aten::select", "aten::unsqueeze", "aten::squeeze",
         "aten::expand", "aten::as_strided", "aten::t", "aten::transpose", "aten::permute", "aten::alias",
         "aten::detach", "aten::empty", "aten::empty_like", "aten::_reshape_alias", "aten::unbind", "aten::split",
         "aten::narrow", "aten::contiguous", "aten::lift_fresh", "aten::resolve_conj", "aten::resolve_neg",
         "aten::empty_strided", "aten::result_type", "aten::is_nonzero", "aten::_unsafe_view", "aten::numpy_T"}


def op_counts(run) -> tuple[int, dict[str, int]]:
    """(decode steps, {part: leaf operators}) of one decode: operators with no operator inside them, views aside,
    split into those under the rows' logits processors and the rest (the model, its hooks, generate's own)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    from personalize.serving import runner

    steps = [0]
    was = runner.RowProcessors.__call__

    def labelled(self, input_ids, scores):
        steps[0] += 1
        with record_function("row processors"):
            return was(self, input_ids, scores)

    runner.RowProcessors.__call__ = labelled
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            run()
    finally:
        runner.RowProcessors.__call__ = was
    counts = {"processors": 0, "model and the rest": 0}
    for ev in prof.events():
        if not ev.name.startswith("aten::") or ev.name in VIEWS or any(c.name.startswith("aten::") for c in ev.cpu_children):
            continue
        up, inside = ev.cpu_parent, False
        while up is not None and not inside:
            inside, up = up.name == "row processors", up.cpu_parent
        counts["processors" if inside else "model and the rest"] += 1
    return max(steps[0], 1), counts


SYNCS = ("tolist", "item", "cpu", "__bool__", "__int__", "__float__", "__index__", "numpy")


def sync_counts(run) -> tuple[int, dict[str, int]]:
    """(decode steps, {Tensor method: calls}) of one decode, for the methods that wait for a GPU's queue when the
    tensor is on the GPU (on the CPU they are free: counted here all the same)."""
    import torch

    from personalize.serving import runner

    calls = dict.fromkeys(SYNCS, 0)
    steps = [0]
    saved = {m: getattr(torch.Tensor, m) for m in SYNCS}
    was = runner.RowProcessors.__call__

    def counted(m):
        def f(self, *args, **kwargs):
            calls[m] += 1
            return saved[m](self, *args, **kwargs)
        return f

    def stepped(self, input_ids, scores):
        steps[0] += 1
        return was(self, input_ids, scores)

    runner.RowProcessors.__call__ = stepped
    for m in SYNCS:
        setattr(torch.Tensor, m, counted(m))
    try:
        run()
    finally:
        for m, f in saved.items():
            setattr(torch.Tensor, m, f)
        runner.RowProcessors.__call__ = was
    return max(steps[0], 1), calls


if __name__ == "__main__":
    main()
