"""How fast a rater gets the next judgment while 20 raters judge at once (issue 10, item 7).

The real app (`app.py`, its own process, as `make run` starts it) on 127.0.0.1; a campaign of 20 items × 3 arms
(60 units, 20 ratings each) whose outputs are in the pool; 20 rater threads, each with its own connection,
judge 50 units each through the Rate tab's endpoints with the requests the page sends. Each judge call stores the
judgment and returns the next unit, so its latency is "the time to serve the next judgment". Three figures,
medians over repeats: raters who click the moment a unit shows (the server saturated: 20 requests always in
flight), raters who think `--pace` seconds on average (still several times faster than people), and the studio's
own part without the web server. Each run checks that 1,000 rows were stored, none lost or doubled.

    python benchmarks/campaign_serving.py [--artifacts data/artifacts/demo] [--repeats 3] [--pace 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import random
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VERDICT_ENDPOINTS = ("campaign_a", "campaign_b", "campaign_tie", "campaign_bad")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_campaign(studio, name: str, n_items: int = 20, raters_per_item: int = 20) -> None:
    """A pairwise campaign whose outputs are already in the pool (serving involves no model)."""
    from personalize.humaneval.campaign_schema import CampaignConfig, CampaignItem

    items = [CampaignItem(f"load-user-{i}", f"prompt {i}", tuple(f"item {i}.{j}" for j in range(6)))
             for i in range(n_items)]
    studio.runtime.campaigns.create(name, items, CampaignConfig(("base", "cluster", "card"), raters_per_item=raters_per_item))
    for item, m in studio.runtime.campaigns.missing(name):
        studio.runtime.campaigns.add_output(item["id"], m, f"{m} says something about prompt {item['position']}", 0.0)


def run_raters(url: str, name: str, n_raters: int = 20, n_each: int = 50, seed: int = 0, pace_s: float = 0.0) -> dict:
    """n_raters threads judge n_each units each over HTTP, with the requests the page itself sends (POST
    /gradio_api/run/<endpoint>: the Rate tab's events run outside the queue); each thread has its own connection.
    pace_s: mean think time between judgments (exponential; 0 = each rater clicks the moment the next unit is
    shown). Returns the latencies (s) of the judge calls, errors and each rater's count."""
    import httpx

    api = url.rstrip("/") + "/gradio_api/run/"
    latencies, errors, counts = [], [], {}
    lock = threading.Lock()
    start = threading.Barrier(n_raters)

    def call(c, endpoint, *data, session):
        r = c.post(api + endpoint, json={"data": list(data), "session_hash": session}, timeout=120)
        r.raise_for_status()
        return r.json()["data"]

    def rater(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        who = f"rater-{i:02d}"
        session = secrets.token_hex(6)  # one page load's session: the page sends its hash with each event
        try:
            with httpx.Client() as c:
                start.wait()
                aid = call(c, "campaign_next", name, who, session=session)[0]
                mine, done = [], 0
                while done < n_each:
                    if aid is None:
                        raise AssertionError(f"{who}: no unit left after {done}")
                    if pace_s:
                        time.sleep(rng.expovariate(1 / pace_s))
                    t0 = time.perf_counter()
                    out = call(c, rng.choice(VERDICT_ENDPOINTS), name, who, aid, session=session)
                    mine.append(time.perf_counter() - t0)
                    status = out[9]  # (id, progress, instruction, history, prompt, A, B, rows ×2, status, campaign)
                    if not str(status).startswith("Judgment #"):
                        raise AssertionError(f"{who}: {status}")
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


def library_times(studio, name: str, n_raters: int = 20, n_each: int = 50) -> list[float]:
    """The studio's own share of a judgment (store it, pick and load the next unit: the Rate handler), under
    n_raters threads at once in one process: what remains when the web server's cost is taken away."""
    from personalize.ui.rate import judge_unit, next_unit

    times, lock = [], threading.Lock()

    def rater(i):
        who = f"lib-{i:02d}"
        aid = next_unit(studio, name, who)[0]
        mine = []
        for _ in range(n_each):
            t0 = time.perf_counter()
            aid = judge_unit(studio, "a", name, who, aid)[0]
            mine.append(time.perf_counter() - t0)
        with lock:
            times.extend(mine)

    threads = [threading.Thread(target=rater, args=(i,)) for i in range(n_raters)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    return times


def stats(latencies) -> dict:
    xs = sorted(latencies)
    return {"n": len(xs), "median_ms": round(1000 * statistics.median(xs), 1),
            "p95_ms": round(1000 * xs[min(len(xs) - 1, int(0.95 * len(xs)))], 1)}


def start_server(artifacts: str, db: Path, port: int) -> subprocess.Popen:
    """The app as `make run` starts it, in its own process (the raters' clients then do not share its cores'
    Python interpreter); returns once it answers."""
    import httpx

    proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--port", str(port), "--db", str(db),
                             "--artifacts", artifacts], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.time()
    while time.time() - t0 < 300:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise RuntimeError("the app did not start")
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError("the app did not answer within 300 s")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--artifacts", default="data/artifacts/demo")
    p.add_argument("--raters", type=int, default=20)
    p.add_argument("--each", type=int, default=50)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--pace", type=float, default=2.0, help="mean think time (s) of the paced run")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    from personalize.studio.facade import Studio, StudioConfig

    folder = Path(tempfile.mkdtemp(prefix="campaign-serving-"))
    db = folder / "studio.db"
    studio = Studio.load(StudioConfig(artifacts=a.artifacts, db=str(db), export_dir=str(folder / "exports")))
    port = free_port()
    server = start_server(a.artifacts, db, port)
    out = {"raters": a.raters, "each": a.each, "pace_s": a.pace}
    try:
        for mode, pace in (("closed", 0.0), ("paced", a.pace)):
            runs = []
            for r in range(a.repeats):
                name = f"load-{mode}-{r}"
                load_campaign(studio, name)
                res = run_raters(f"http://127.0.0.1:{port}/", name, a.raters, a.each, seed=r, pace_s=pace)
                rows = studio.runtime.campaigns.judgments(name)
                distinct = {(x["rater"], x["first"], x["second"], x["item"]) for x in rows}
                run = stats(res["latencies"]) | {"stored": len(rows), "distinct": len(distinct),
                                                 "errors": len(res["errors"]), "wall_s": round(res["wall_s"], 1)}
                runs.append(run)
                print(f"{mode} repeat {r + 1}: {run}" + "".join(f"\n  {e}" for e in res["errors"][:5]), flush=True)
            out[mode] = {"repeats": runs, "median_ms": statistics.median(x["median_ms"] for x in runs),
                         "p95_ms": statistics.median(x["p95_ms"] for x in runs)}
        lib = []
        for r in range(a.repeats):
            load_campaign(studio, f"load-lib-{r}")
            lib.append(stats(library_times(studio, f"load-lib-{r}", a.raters, a.each)))
        out["studio"] = {"repeats": lib, "median_ms": statistics.median(x["median_ms"] for x in lib),
                         "p95_ms": statistics.median(x["p95_ms"] for x in lib)}
    finally:
        server.kill()
        server.wait()
        studio.runtime.store.close()
    print(f"next judgment, {a.raters} raters × {a.each} judgments at once (medians of {a.repeats} repeats):")
    print(f"  over HTTP, each rater clicking the moment the unit shows: median {out['closed']['median_ms']} ms, "
          f"p95 {out['closed']['p95_ms']} ms")
    print(f"  over HTTP, raters thinking {a.pace} s on average: median {out['paced']['median_ms']} ms, "
          f"p95 {out['paced']['p95_ms']} ms")
    print(f"  the studio's own part (store, pick, load; no web server): median {out['studio']['median_ms']} ms, "
          f"p95 {out['studio']['p95_ms']} ms")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
