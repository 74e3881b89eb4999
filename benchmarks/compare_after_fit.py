"""Compare right after Fit my style, while EXACT's and OPPU's first uses run in the background, against the same
Compare once they are done: what a newcomer's next click costs.

    .venv/bin/python benchmarks/compare_after_fit.py [--artifacts data/artifacts/demo] [--demo-data data/demo] \
        [--people 2] [--history FILE]

Each person (a demo picker's newcomer, or one history file of one text per line) is pasted, Saved, fitted once
Save's background work ended (as a person who looks at their cluster first), and the app's Fit starts the first
uses; Compare (base, cluster, card, rag, cope) is pressed at once, then again when the first uses are done.
Prints seconds to the first streamed token and to the last column, per person and as medians. --at-save: the first
Compare pressed right after Save instead (the rewrites, and a far person's own adapter, still in the background).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
METHODS = ["base", "cluster", "card", "rag", "cope"]
PROMPT = "Reject cookie values that contain a quoted semicolon when parsing the Cookie header"


def timed_compare(st, name: str, prompt: str) -> tuple[float, float]:
    """(seconds to the first streamed token, seconds to the last column) of one Compare."""
    t0, first = time.perf_counter(), None
    plan = st.comparisons.compare_plan(name, prompt, False, None, METHODS)
    for kind, _, _ in st.comparisons.compare_stream(plan, st.runtime.settings()):
        if kind == "text" and first is None:
            first = time.perf_counter() - t0
    return round(first or 0.0, 2), round(time.perf_counter() - t0, 2)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--artifacts", default="data/artifacts/demo")
    p.add_argument("--demo-data", default="data/demo")
    p.add_argument("--people", type=int, default=2)
    p.add_argument("--history", default=None, help="one person's texts, one per line (instead of the demo's)")
    p.add_argument("--items", type=int, default=24)
    p.add_argument("--at-save", action="store_true", help="the first Compare right after Save, nothing waited for")
    a = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from personalize.eval.bench_serving import newcomer_studio

    st, histories = newcomer_studio(a.artifacts, a.demo_data, 0 if a.history else a.people, "compare-after-fit-")
    if a.history:
        histories = [[t for t in Path(a.history).read_text().splitlines() if t.strip()]]
    prompt = st.histories.resolve_prompt(PROMPT, True)[0]
    got: dict[str, list[tuple[float, float]]] = {"first uses running": [], "first uses done": []}
    for i, texts in enumerate(histories):
        name = f"newcomer-{i}"
        st.save_from(name, "\n".join(texts[: a.items]), None, st.runtime.task.name)
        if a.at_save:
            got.setdefault("right after Save", []).append(timed_compare(st, name, prompt))
            print(f"{name}: right after Save {got['right after Save'][-1]} (first token s, last column s)", flush=True)
            continue
        st.histories.rewrites.result()
        st.fits.fit(name)
        st.first_use_jobs.after_fit(name)  # the app's Fit: EXACT's and OPPU's first uses start now
        got["first uses running"].append(timed_compare(st, name, prompt))
        for m in ("exact", "oppu"):
            st.first_use_jobs.wait_first_use(name, m)
        got["first uses done"].append(timed_compare(st, name, prompt))
        print(f"{name}: right after Fit {got['first uses running'][-1]}, first uses done {got['first uses done'][-1]}"
              " (first token s, last column s)", flush=True)
    for mode, runs in got.items():
        if not runs:
            continue
        print(f"Compare, {mode}: first token median {statistics.median(r[0] for r in runs):.2f} s, "
              f"last column median {statistics.median(r[1] for r in runs):.2f} s ({len(runs)} people)")
    st.runtime.store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
