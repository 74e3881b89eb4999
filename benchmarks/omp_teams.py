"""Why threads hand their OpenMP team back (personalize/lm/cpu_threads.py): one Compare's decode, timed in a worker
thread while the main thread keeps the team it made loading the model, and after it hands it back.

    .venv/bin/python benchmarks/omp_teams.py [--artifacts data/artifacts/demo] [--repeats 5] [--tokens 24]

The rows are those of one Compare (base, cluster, card, cope with its twin row, p2p) for one demo person,
decoded by Engine.decode_rows in a thread, as the scheduler does; `card alone` is the same prompt's card row.
Prints medians and ratios; both conditions alternate in one process, so a noisy minute hits both.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def in_thread(fn):
    """fn() in a fresh thread (as the scheduler's worker runs it); its seconds."""
    took = []

    def body():
        t0 = time.perf_counter()
        fn()
        took.append(time.perf_counter() - t0)
    t = threading.Thread(target=body)
    t.start()
    t.join()
    return took[0]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--artifacts", default="data/artifacts/demo")
    ap.add_argument("--demo-data", default="data/demo")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=24)
    a = ap.parse_args(argv)

    import torch

    from personalize.eval.bench_serving import demo_compare
    from personalize.lm.cpu_threads import release_team

    studio, rows, card = demo_compare(a.artifacts, a.demo_data, a.tokens)
    print(f"{len(rows)} rows (+ COPE's twin), {a.tokens} tokens, torch threads {torch.get_num_threads()}")

    def main_team():
        """The main thread runs a parallel op, as loading the model does, and keeps its team."""
        x = torch.randn(256, 4096)
        for _ in range(3):
            x.exp_()
            x.clamp_(max=1.0)

    times = {"kept": [], "handed back": []}
    alone = {"kept": [], "handed back": []}
    in_thread(lambda: studio.runtime.engine.decode_rows(rows))  # warm-up
    for i in range(a.repeats):
        for cond in ("kept", "handed back"):
            main_team()
            if cond == "handed back":
                release_team()
            times[cond].append(in_thread(lambda: studio.runtime.engine.decode_rows(rows)))
            alone[cond].append(in_thread(lambda: studio.runtime.engine.decode_rows(card)))
            print(f"  {i + 1}/{a.repeats} main's team {cond}: compare {times[cond][-1]:.2f} s, "
                  f"card alone {alone[cond][-1]:.2f} s", flush=True)
    med = {c: statistics.median(v) for c, v in times.items()}
    one = {c: statistics.median(v) for c, v in alone.items()}
    for c in times:
        print(f"main thread's team {c:11s}: compare {med[c]:.2f} s, card alone {one[c]:.2f} s, "
              f"ratio {med[c] / one[c]:.2f}")
    print(f"compare kept / handed back: {med['kept'] / med['handed back']:.2f}x")


if __name__ == "__main__":
    main()
