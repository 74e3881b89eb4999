"""How long after Save a far person's own adapter is ready (issue 48: ≤ 60 s for a 24-item history), in-process, as
the app does it: Save a pasted history (texts only, so the neutral rewrites run first), then the own adapter's job
(methods/card/own.py, started by Save's background work when the person is beyond the build's clusters, or by
Fit's button pressed at once where the build leaves that to the person) and the style refitted over it. Prints
each person's seconds (Save, rewrites, the job, ready) and the medians.

    .venv/bin/python -m benchmarks.own_after_save --artifacts data/artifacts/demo --data G --sources encode/httpx --people 3

People: the first --people of a LaMP folder's dev split (their newest --items texts); a person the build places near
a cluster gets no own adapter and is reported as near.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from personalize.data import Item, read_lamp, select_sources
from personalize.methods.card import onboard
from personalize.studio.facade import Studio, StudioConfig


def ready_after_save(studio: Studio, name: str, texts: list[str], timeout: float = 900.0) -> dict:
    """One person: Save, then wait for their own adapter's job (None when Save's placement finds them near)."""
    t0 = time.perf_counter()
    studio.histories.save_history(name, [Item(y=t) for t in texts], studio.runtime.task.name)
    row = {"name": name, "items": len(texts), "save_s": round(time.perf_counter() - t0, 2)}
    jobs, engine = studio.first_use_jobs, studio.runtime.engine
    placed = studio.runtime.store.assignment(name, engine.artifacts_id, engine.cfg.default_k)
    if not onboard.is_far(engine, engine.cfg.default_k, placed["distances"]):  # near: card over their cluster
        return {**row, "far": False}
    if not engine.cfg.own.far:  # a build without --own-adapters-for-far: Fit's button, pressed at once
        jobs.start_own(name)
    while jobs.own_job(name) is None and time.perf_counter() - t0 < timeout:
        time.sleep(0.1)
    row["job_started_s"] = round(time.perf_counter() - t0, 2)  # the rewrites, then the job's queue
    job = jobs.own_job(name)
    while job["state"] in ("queued", "running") and time.perf_counter() - t0 < timeout:
        time.sleep(0.1)
    ready = time.perf_counter() - t0
    while "seconds" not in job and time.perf_counter() - t0 < timeout:  # written just after the state
        time.sleep(0.01)
    return {**row, "far": True, "state": job["state"], "error": job["error"], "job_s": job.get("seconds"),
            "ready_s": round(ready, 2), "bytes": getattr(job.get("trained"), "bytes", None)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--artifacts", default="data/artifacts/demo")
    p.add_argument("--data", required=True)
    p.add_argument("--sources", default="")
    p.add_argument("--people", type=int, default=3)
    p.add_argument("--items", type=int, default=24)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    _, queries = read_lamp(a.data, "dev")
    if a.sources:
        queries = select_sources(queries, a.sources.split(","))
    folder = Path(tempfile.mkdtemp(prefix="own_after_save."))
    studio = Studio.load(StudioConfig(artifacts=a.artifacts, db=str(folder / "s.db"), export_dir=str(folder / "x")))
    rows = []
    for q in queries[: a.people]:
        texts = [i.y for i in q.profile][-a.items:]
        rows.append(ready_after_save(studio, f"person-{len(rows)}", texts))
        print(json.dumps(rows[-1]), flush=True)
    far = [r for r in rows if r["far"] and r["state"] == "done"]
    summary = {"people": len(rows), "far": len(far),
               "median_ready_s": statistics.median(r["ready_s"] for r in far) if far else None,
               "median_job_s": statistics.median(r["job_s"] for r in far) if far else None,
               "median_job_started_s": statistics.median(r["job_started_s"] for r in far) if far else None}
    print(json.dumps(summary), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": rows, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
