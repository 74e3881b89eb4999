"""Fit my style on pasted histories, as the app's two buttons do: right after Save, and after the neutral rewrites.

    .venv/bin/python benchmarks/fit_after_save.py [--artifacts data/artifacts/demo] [--demo-data data/demo] [--people 6]

People are the demo picker's newcomers (people the build never saw), their history pasted (no prompts, so §1.8's
neutral rewrites run from Save). Every other person clicks Fit at once; the others wait for the rewrites first,
as a person who looks at their cluster does. Prints each fit's seconds and stages, then the two medians.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
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
    from personalize.studio.facade import Studio, StudioConfig

    folder = Path(tempfile.mkdtemp(prefix="fit-after-save-"))
    st = Studio.load(StudioConfig(artifacts=a.artifacts, db=str(folder / "s.db"), demo_data=a.demo_data,
                                  export_dir=str(folder / "exports")))
    people = [u for label, u in st.demo_choices() if "new" in label][: a.people]
    times: dict[str, list[float]] = {"right after Save": [], "after the rewrites": []}
    for i, person in enumerate(people):
        items = list(st.parse(st.demo_history(person)))[: a.items]
        name = f"fit{i}"
        st.save_history(name, items, st.task.name)
        mode = "after the rewrites" if i % 2 else "right after Save"
        if i % 2:
            st.histories.rewrites.result()  # noqa: SLF001 - the background rewrites Save started
        t0 = time.perf_counter()
        fit = st.fit(name)
        times[mode].append(round(time.perf_counter() - t0, 2))
        print(f"{person[:30]:30s} {len(items):3d} items  {mode:20s} {times[mode][-1]:6.2f} s  "
              f"{ {k: round(v, 2) for k, v in fit.stages_s.items()} }", flush=True)
    for mode, v in times.items():
        if v:
            print(f"{mode}: median {statistics.median(v):.2f} s of {v}")
    st.store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
