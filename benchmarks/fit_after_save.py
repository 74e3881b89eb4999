"""Fit my style on pasted histories, as the app's two buttons do: right after Save, and after the neutral rewrites.

    .venv/bin/python benchmarks/fit_after_save.py [--artifacts data/artifacts/demo] [--demo-data data/demo] [--people 6]

People are the demo picker's newcomers (people the build never saw), their history pasted (no prompts, so §1.8's
neutral rewrites run from Save). Every other person clicks Fit at once; the others wait for the rewrites first,
as a person who looks at their cluster does (the fit measured by `bench`, eval/bench_serving.fit_after_save).
Prints each fit's seconds and stages, then the two medians, and the floor of a fit right after Save: the model work
it waits for (the rewrites and the pass, counted from the person's tokens) at this machine's best fp32 GEMM rate.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--artifacts", default="data/artifacts/demo")
    p.add_argument("--demo-data", default="data/demo")
    p.add_argument("--people", type=int, default=6)
    p.add_argument("--items", type=int, default=24)
    a = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from personalize.eval.bench_serving import fit_after_save, newcomer_studio

    st, histories = newcomer_studio(a.artifacts, a.demo_data, a.people, "fit-after-save-")
    got = fit_after_save(st, histories, n_items=a.items)
    for mode in ("right_after_save_s", "after_rewrites_s"):
        print(f"{mode[:-2].replace('_', ' ')}: median {got['median_' + mode]:.2f} s of {got[mode]}")
    if "right_after_save_tflop" in got:  # the CPU's floor (none when the model runs on a GPU)
        print(f"right after Save, the model work: {got['right_after_save_tflop']} TFLOP; at this machine's best fp32 "
              f"GEMM rate ({got['gemm_gflops']} GFLOP/s) no fit takes under median "
              f"{got['median_floor_right_after_save_s']:.2f} s of {got['floor_right_after_save_s']}")
        print(f"  with the prompts' common beginning made once: {got['right_after_save_tflop_shared_prefix']} TFLOP, "
              f"median {got['median_floor_shared_prefix_s']:.2f} s of {got['floor_shared_prefix_s']}")
    st.runtime.store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
