"""Later-start time of the studio: process start → the page answers HTTP 200, repeated, median reported.

    .venv/bin/python benchmarks/app_start.py [--repeats 5] [-- app.py flags]

Run it after the first start has built the demo artifacts (it refuses to time a build). The machines here
are shared and noisy, so it prints every run and the median, and the part spent before the models load
(Python imports) as reported by the app's own "ready in" line.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from personalize.eval import bench_serving as serving  # noqa: E402  (the bench's own start timer: one implementation)


def one_start(app_args: list[str], timeout: float) -> tuple[float, float | None]:
    """(seconds to HTTP 200, the app's own "ready in" seconds: artifacts, models and UI, imports excluded)."""
    try:
        wall, log = serving.one_start(app_args, timeout)
    except RuntimeError as e:
        raise SystemExit(str(e)) from None
    m = re.search(r"ready in ([\d.]+) s", log)
    return wall, float(m.group(1)) if m else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("app_args", nargs="*", help="flags passed to app.py (after --)")
    a = p.parse_args()
    walls, loads = [], []
    for i in range(a.repeats):
        wall, load = one_start(a.app_args, a.timeout)
        walls.append(wall)
        loads.append(load)
        print(f"start {i + 1}/{a.repeats}: HTTP 200 after {wall:.2f} s (app's ready line: {load} s)", flush=True)
    known = [x for x in loads if x is not None]
    load = f"; the app's ready line (after imports): {statistics.median(known):.2f} s" if known else ""
    print(f"median: {statistics.median(walls):.2f} s to HTTP 200 over {a.repeats} starts "
          f"(min {min(walls):.2f}, max {max(walls):.2f}){load}")


if __name__ == "__main__":
    main()
