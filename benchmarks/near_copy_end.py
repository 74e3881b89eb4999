"""The no-copy guard's near-copy end (issue 57), measured in one run: git authors of a project the demo build never
saw, their older subjects saved as a paste, fitted, then card decoded with their style (α = the build's, the
fallback set aside: this measures what the style writes) on their newest real changes, with the line-end rule and
without it (the run limit alone). Per arm: outputs that repeat one of the pasted subjects (word for word / near),
copy-aware ROUGE-L against the real subjects; the authors' own repeat rate beside it.

    python -m personalize population from-git --out J --max-items 40 --repo REPO
    python -m benchmarks.near_copy_end J [--authors 6] [--changes 5] [--history 24] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from personalize.data import history_text, read_lamp  # noqa: E402
from personalize.metrics import copy_aware, paired_interval  # noqa: E402
from personalize.methods.card import card_decode, no_copy  # noqa: E402
from personalize.studio.facade import Studio, StudioConfig  # noqa: E402

HISTORY = 24


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data")
    p.add_argument("--authors", type=int, default=6)
    p.add_argument("--changes", type=int, default=5, help="each author's newest changes decoded")
    p.add_argument("--history", type=int, default=HISTORY, help="the subjects before them, saved as the history")
    p.add_argument("--artifacts", default="data/artifacts/demo")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    _, queries = read_lamp(a.data, "dev")
    people = [q for q in queries if len(q.profile) >= a.changes + a.history][: a.authors]
    db = Path(tempfile.mkdtemp())
    studio = Studio.load(StudioConfig(artifacts=a.artifacts, db=str(db / "studio.db"), demo_data="data/demo"))
    studio.load_pending()
    s = studio.runtime.settings()
    real_breaks = no_copy.line_breaks
    arms = {"line end kept from near copies": real_breaks, "run limit alone": lambda tok: frozenset()}
    preds = {arm: [] for arm in arms}
    golds, pasts, t0 = [], [], time.perf_counter()
    for n, q in enumerate(people, 1):
        changes, history = q.profile[: a.changes], q.profile[a.changes: a.changes + a.history]
        name = f"author-{n}"
        studio.save_from(name, history_text([it.y for it in reversed(history)]), None, studio.runtime.task.name)
        studio.histories.rewrites.result()
        studio.fits.fit(name)
        state = studio.histories.user_state(name)
        state.lam.helps = True  # the style as fitted, whatever its teacher-forced figure: what it writes
        for arm, breaks in arms.items():
            card_decode.line_breaks = breaks  # what card's rows take their line ends from
            for change in changes:
                (row,) = studio.comparisons.rows("card", state, change.x, s)
                (g,) = studio.runtime.engine.decode_rows([row])
                preds[arm].append(g.text)
        card_decode.line_breaks = real_breaks
        golds += [c.y for c in changes]
        pasts += [[it.y for it in history]] * len(changes)
        print(f"{n}/{len(people)} authors, {time.perf_counter() - t0:.0f} s", flush=True)
    out = {"authors": len(people), "outputs": len(golds), "alpha": s.alpha,
           "golds": copy_aware(golds, golds, pasts)}
    scored = {arm: copy_aware(p, golds, pasts) for arm, p in preds.items()}
    for arm, sc in scored.items():
        out[arm] = {k: sc[k] for k in ("rougeL_copy_aware", "repeats", "repeats_near")}
    first, second = list(scored)
    out["difference"] = paired_interval([x - y for x, y in zip(scored[first]["per_query"], scored[second]["per_query"])])
    out["outputs_by_arm"] = preds
    print(json.dumps({k: v for k, v in out.items() if k != "outputs_by_arm"}, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
