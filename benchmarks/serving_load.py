"""Load on a real server: N sessions press Compare at once over HTTP while raters vote; the votes' latency.

    .venv/bin/python benchmarks/serving_load.py [--artifacts data/artifacts/demo] [--people 8] [--rounds 3]

Starts the studio (app.build_app) on 127.0.0.1 with a fresh database, saves N demo people, opens one blind
pair per rater, then per round: N Compare requests (base, cluster, card, cope, p2p) at the same moment, and
while they decode raters cast votes, one every 0.25 s (Quick pair's /vote_* endpoints: the queue, the arena,
SQLite, no model). Prints every Compare's wall time, the votes' latency (median, p95, max) and the
scheduler's batches. The machines here are noisy: rounds repeat, medians are reported.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

METHODS = ["base", "cluster", "card", "cope", "p2p"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--artifacts", default="data/artifacts/demo")
    ap.add_argument("--demo-data", default="data/demo")
    ap.add_argument("--people", type=int, default=8)
    ap.add_argument("--raters", type=int, default=4)
    ap.add_argument("--votes", type=int, default=16, help="votes cast per round while the Compares decode")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=24)
    a = ap.parse_args(argv)

    import app as studio_app
    from gradio_client import Client

    from personalize.studio import Studio, StudioConfig

    tmp = Path(tempfile.mkdtemp())
    studio = Studio.load(StudioConfig(artifacts=a.artifacts, db=str(tmp / "studio.db"), demo_data=a.demo_data,
                                      export_dir=str(tmp / "exports"), first_use_in_background=False))
    ui = studio_app.build_app(studio)
    port = free_port()
    ui.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    url = f"http://127.0.0.1:{port}/"
    people = sorted(studio.demo_users)[: a.people]
    for p in people:
        studio.save_history(p, studio.demo_items(p), studio.task.name)
    compare_s, vote_ms = [], []
    for r in range(a.rounds):
        voters = []  # one session per vote, its blind pair decoded before the round starts
        for i in range(a.votes):
            c = Client(url, verbose=False)
            c.predict(people[i % len(people)], f"rater{i % a.raters}", f"a day at the lake {r} {i}",
                      ["base", "cluster"], "", True, 1.0, 50, 4, api_name="/new_pair")
            voters.append((f"rater{i % a.raters}", c))
        barrier = threading.Barrier(len(people) + 1)
        errors, walls = [], []

        def press(p):
            try:
                c = Client(url, verbose=False)
                barrier.wait()
                t0 = time.perf_counter()
                out = c.predict(p, f"the market opened early today ({p})", True, None, METHODS, 1.0, 50, a.tokens,
                                None, api_name="/compare")
                walls.append(time.perf_counter() - t0)
                if not out[0].startswith("Done"):
                    errors.append(out[0])
            except Exception as e:  # reported below
                errors.append(repr(e))

        threads = [threading.Thread(target=press, args=(p,)) for p in people]
        [t.start() for t in threads]
        studio.scheduler.batches.clear()
        barrier.wait()
        time.sleep(0.3)
        for rater, c in voters:
            if not any(t.is_alive() for t in threads):
                break
            t0 = time.perf_counter()
            msg = c.predict(rater, api_name="/vote_tie")
            vote_ms.append((time.perf_counter() - t0) * 1000)
            if "stored" not in msg:
                raise SystemExit(f"a vote was not stored: {msg}")
            time.sleep(0.25)
        [t.join() for t in threads]
        if errors:
            raise SystemExit(f"round {r}: {errors[:3]}")
        compare_s += walls
        print(f"round {r}: {len(people)} Compares in {max(walls):.1f} s (each {sorted(round(w, 1) for w in walls)}); "
              f"batches {[(b['requests'], b['rows']) for b in studio.scheduler.batches]}", flush=True)
    q = statistics.quantiles(vote_ms, n=20)
    print(f"votes during the Compares: n={len(vote_ms)} median {statistics.median(vote_ms):.0f} ms, "
          f"p95 {q[18]:.0f} ms, max {max(vote_ms):.0f} ms")
    print(f"Compare wall time: median {statistics.median(compare_s):.1f} s, max {max(compare_s):.1f} s")
    ui.close()
    studio.scheduler.close()


if __name__ == "__main__":
    main()
