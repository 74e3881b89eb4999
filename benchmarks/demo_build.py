"""The first start's demo build (fitting/plan.ensure_demo's recipe: DEMO_BUILD_ARGS, DEMO_DECODING, DEMO_STYLE, the
harm guards alone) into another folder, each part timed from the build's start as `build(on_part=...)` reports it
(issue 58: a change to the demo's training measured on the demo's own build, the studio's folder left alone). The
build's log gives each stage's seconds; `tune --artifacts OUT --steps none --dry-run` then scores its validation people.

    python -m benchmarks.demo_build OUT [--data data/demo] [build flags, e.g. --cluster-steps 2]
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

from personalize.fitting.plan import DEMO_BUILD_ARGS, DEMO_DECODING, DEMO_STYLE, build_args, build_plan, \
    demo_people_args
from personalize.methods.card.build import build


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--data", default="data/demo")
    a, more = p.parse_known_args()
    data, out, cfg, kwargs = build_plan(build_args(["--data", a.data, "--out", a.out, *DEMO_BUILD_ARGS,
                                                    "--tune-steps", "none", *demo_people_args(Path(a.data)),
                                                    *more]))
    cfg = replace(cfg, decoding=replace(cfg.decoding, **DEMO_DECODING), style=replace(cfg.style, **DEMO_STYLE))
    t0, parts = time.perf_counter(), {}

    def on_part(part, _folder):
        parts[part] = round(time.perf_counter() - t0, 1)
        print(f"part {part} at {parts[part]} s", flush=True)

    build(data, "dev", out, cfg, **kwargs, on_part=on_part)
    print(f"parts (s from the build's start): {json.dumps(parts)}")


if __name__ == "__main__":
    main()
