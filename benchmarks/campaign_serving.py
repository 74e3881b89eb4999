"""How fast a rater gets the next judgment while 20 raters judge at once (issue 10, item 7).

The real app (app.build_app) on a real server on 127.0.0.1; a campaign of 20 items × 3 arms (60 units, 20
ratings each) whose outputs are in the pool; 20 rater threads, each with its own Gradio client (its own session),
judge 50 units each through the Rate tab's endpoints — the same ones the page calls. Each judge call stores the
judgment and returns the next unit, so its latency is "the time to serve the next judgment". Prints the median and
p95 (per repeat and their medians) and checks that 1,000 rows were stored, none lost or doubled.

    python benchmarks/campaign_serving.py [--artifacts data/artifacts/demo] [--repeats 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VERDICT_ENDPOINTS = ("/campaign_a", "/campaign_b", "/campaign_tie", "/campaign_bad")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_campaign(studio, name: str, n_items: int = 20, raters_per_item: int = 20) -> None:
    """A pairwise campaign whose outputs are already in the pool (serving involves no model)."""
    from personalize.campaign import CampaignConfig, CampaignItem

    items = [CampaignItem(f"load-user-{i}", f"prompt {i}", tuple(f"item {i}.{j}" for j in range(6)))
             for i in range(n_items)]
    studio.campaigns.create(name, items, CampaignConfig(("base", "cluster", "card"), raters_per_item=raters_per_item))
    for item, m in studio.campaigns.missing(name):
        studio.campaigns.add_output(item["id"], m, f"{m} says something about prompt {item['position']}", 0.0)


def run_raters(url: str, name: str, n_raters: int = 20, n_each: int = 50, seed: int = 0) -> dict:
    """n_raters threads judge n_each units each over HTTP; returns latencies (s) of the judge calls and errors."""
    from gradio_client import Client

    latencies, errors, counts = [], [], {}
    lock = threading.Lock()
    start = threading.Barrier(n_raters)

    def rater(i: int) -> None:
        rng = random.Random(seed + i)
        who = f"rater-{i:02d}"
        try:
            c = Client(url, verbose=False)
            start.wait()
            aid = c.predict(name, who, api_name="/campaign_next")[0]
            mine, done = [], 0
            while done < n_each:
                if aid is None:
                    raise AssertionError(f"{who}: no unit left after {done}")
                t0 = time.perf_counter()
                out = c.predict(name, who, aid, api_name=rng.choice(VERDICT_ENDPOINTS))
                mine.append(time.perf_counter() - t0)
                if not str(out[9]).startswith("Judgment #"):
                    raise AssertionError(f"{who}: {out[9]}")
                aid, done = out[0], done + 1
            with lock:
                latencies.extend(mine)
                counts[who] = done
        except Exception as e:  # reported by the caller
            with lock:
                errors.append(f"{who}: {e!r}")

    threads = [threading.Thread(target=rater, args=(i,)) for i in range(n_raters)]
    t0 = time.perf_counter()
    [t.start() for t in threads]
    [t.join(timeout=900) for t in threads]
    return {"latencies": latencies, "errors": errors, "counts": counts, "wall_s": time.perf_counter() - t0}


def stats(latencies) -> dict:
    xs = sorted(latencies)
    return {"n": len(xs), "median_ms": round(1000 * statistics.median(xs), 1),
            "p95_ms": round(1000 * xs[min(len(xs) - 1, int(0.95 * len(xs)))], 1)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--artifacts", default="data/artifacts/demo")
    p.add_argument("--raters", type=int, default=20)
    p.add_argument("--each", type=int, default=50)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    import app as studio_app
    from personalize.studio import Studio, StudioConfig

    folder = Path(tempfile.mkdtemp(prefix="campaign-serving-"))
    studio = Studio.load(StudioConfig(artifacts=a.artifacts, db=str(folder / "studio.db"),
                                      export_dir=str(folder / "exports")))
    app = studio_app.build_app(studio)
    port = free_port()
    app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    runs = []
    try:
        for r in range(a.repeats):
            name = f"load-{r}"
            load_campaign(studio, name)
            res = run_raters(f"http://127.0.0.1:{port}/", name, a.raters, a.each, seed=r)
            rows = studio.campaigns.judgments(name)
            pairs = {(x["rater"], x["first"], x["second"], x["item"]) for x in rows}
            run = stats(res["latencies"]) | {"stored": len(rows), "distinct": len(pairs), "errors": len(res["errors"]),
                                             "wall_s": round(res["wall_s"], 1),
                                             "judgments_per_s": round(len(rows) / res["wall_s"], 1)}
            runs.append(run)
            print(f"repeat {r + 1}: {run}" + "".join(f"\n  {e}" for e in res["errors"][:5]), flush=True)
    finally:
        app.close()
        studio.store.close()
    out = {"raters": a.raters, "each": a.each, "repeats": runs,
           "median_ms": statistics.median(r["median_ms"] for r in runs),
           "p95_ms": statistics.median(r["p95_ms"] for r in runs)}
    print(f"next judgment under {a.raters} raters × {a.each}: median {out['median_ms']} ms, p95 {out['p95_ms']} ms "
          f"(medians of {a.repeats} repeats); stored {[r['stored'] for r in runs]}, distinct "
          f"{[r['distinct'] for r in runs]}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
