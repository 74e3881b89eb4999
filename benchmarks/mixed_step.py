"""What a mixed batch costs against one row: one Compare's rows (base, cluster, card, cope with its twin, p2p)
against card alone, with each row's LoRA from peft's `adapter_names` (the reference) and with the fast path
(gathered LoRAs, shared prefill, oneDNN linears), and whether both give the same outputs.

    .venv/bin/python benchmarks/mixed_step.py [--artifacts data/artifacts/demo] [--repeats 5] [--tokens 32] [--kernels]

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
    if a.profile:
        from torch.profiler import ProfilerActivity, profile

        for (k, p) in times:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                decode(k, p)
            print(f"--- {k}, {p}\n" + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


if __name__ == "__main__":
    main()
