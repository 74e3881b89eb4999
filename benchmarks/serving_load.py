"""Load on a real server: N sessions press Compare at once over HTTP while raters vote; the votes' latency.

    .venv/bin/python benchmarks/serving_load.py [--artifacts data/artifacts/demo] [--people 8] [--rounds 3]

Starts the studio (app.build_app) on 127.0.0.1 with a fresh database and saves N demo people. The clients run in
a process of their own, as browsers do: per round, raters first draw blind pairs (Quick pair's /new_pair), cast
votes with nothing decoding (the baseline), then N Compare requests (base, cluster, card, cope, p2p) leave at the
same moment and, while they decode, raters vote, one every 0.4 s. A vote is sent the way the page sends it: one
POST to /gradio_api/run/vote_tie (a `queue=False` event: no queue, no event stream), in the rater's session.
`--votes-via client` sends them through gradio_client instead, whose queue protocol (join, then an event
stream) costs ~75 ms even on an idle server. Prints every Compare's wall time, the votes' latency (median, p95,
max) idle and under load, and the scheduler's batches. The machines here are noisy: rounds repeat, medians are
reported.
"""

from __future__ import annotations

import argparse
import multiprocessing
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

METHODS = ["base", "cluster", "card", "cope", "p2p"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def open_page(client) -> None:
    """What a browser does on opening the page: run its load events (the session starts here, not at the first
    click; Gradio builds a session's state, ~20 ms of its event loop, on a session's first event)."""
    for dep in client.config["dependencies"]:
        if dep.get("queue") is not False and not dep["inputs"] and any(t[1] == "load" for t in dep["targets"]):
            client.predict(fn_index=dep["id"])


class Rater:
    """One browser session that drew a blind pair and votes on it."""

    def __init__(self, url: str, name: str, via: str):
        from gradio_client import Client

        self.url, self.name, self.via = url, name, via
        self.client = Client(url, verbose=False)
        open_page(self.client)

    def draw(self, person: str, prompt: str) -> None:
        self.client.predict(person, self.name, prompt, ["base", "cluster"], "", True, 1.0, 50, 4, api_name="/new_pair")

    def vote(self, http) -> float:
        """The vote's latency in ms; raises unless it was stored."""
        t0 = time.perf_counter()
        if self.via == "client":
            msg = self.client.predict(self.name, api_name="/vote_tie")
        else:  # the page's request: inputs (pair id state, rater) in the session that drew the pair
            r = http.post(f"{self.url}gradio_api/run/vote_tie",
                          json={"data": [None, self.name], "session_hash": self.client.session_hash})
            r.raise_for_status()
            msg = r.json()["data"][0]
        ms = (time.perf_counter() - t0) * 1000
        if "stored" not in msg:
            raise RuntimeError(f"a vote was not stored: {msg}")
        return ms


def clients(url: str, people: list[str], a: argparse.Namespace, r: int, out) -> None:
    """One round from the clients' process: idle votes, then N Compares at once with votes meanwhile."""
    import httpx
    from gradio_client import Client

    try:
        raters = [Rater(url, f"rater{i % a.raters}", a.votes_via) for i in range(2 * a.votes)]
        for i, rater in enumerate(raters):
            rater.draw(people[i % len(people)], f"a day at the lake {r} {i}")
        idle, busy = raters[: a.votes], raters[a.votes:]
        with httpx.Client() as http:
            idle_ms = [rater.vote(http) for rater in idle]
            barrier = threading.Barrier(len(people) + 1, timeout=300)  # a session that failed to open breaks it
            errors, walls = [], []

            def press(p):
                try:
                    c = Client(url, verbose=False)
                    open_page(c)
                    barrier.wait()
                    t0 = time.perf_counter()
                    res = c.predict(p, f"the market opened early today ({p})", True, None, METHODS, 1.0, 50,
                                    a.tokens, None, api_name="/compare")
                    walls.append(time.perf_counter() - t0)
                    if not res[0].startswith("Done"):
                        errors.append(res[0])
                except Exception as e:  # reported by the server's process
                    errors.append(repr(e))

            threads = [threading.Thread(target=press, args=(p,)) for p in people]
            [t.start() for t in threads]
            barrier.wait()
            time.sleep(0.3)
            busy_ms = []
            for rater in busy:
                if not any(t.is_alive() for t in threads):
                    break
                busy_ms.append(rater.vote(http))
                time.sleep(a.every)
            [t.join() for t in threads]
        out.put({"idle_ms": idle_ms, "busy_ms": busy_ms, "walls": walls, "errors": errors})
    except Exception as e:
        out.put({"errors": [repr(e)]})


def quantiles(ms: list[float]) -> str:
    p95 = statistics.quantiles(ms, n=20, method="inclusive")[18] if len(ms) > 1 else ms[0]  # within the data
    return f"n={len(ms)} median {statistics.median(ms):.0f} ms, p95 {p95:.0f} ms, max {max(ms):.0f} ms"


def main(argv=None) -> None:
    from personalize.serving.scheduler import SchedulerConfig

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--artifacts", default="data/artifacts/demo")
    ap.add_argument("--demo-data", default="data/demo")
    ap.add_argument("--people", type=int, default=8)
    ap.add_argument("--raters", type=int, default=4)
    ap.add_argument("--votes", type=int, default=24, help="votes cast per round while the Compares decode (and as many idle)")
    ap.add_argument("--every", type=float, default=0.4, help="seconds between two votes")
    ap.add_argument("--votes-via", choices=["page", "client"], default="page",
                    help="page: one POST as the browser sends it (default); client: gradio_client's queue protocol")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--nice", type=int, default=SchedulerConfig.nice, help="the decode thread's nice value")
    ap.add_argument("--window-ms", type=float, default=SchedulerConfig.window_ms, help="the scheduler's window")
    a = ap.parse_args(argv)

    import app as studio_app

    from personalize.studio.facade import Studio, StudioConfig

    tmp = Path(tempfile.mkdtemp())
    studio = Studio.load(StudioConfig(artifacts=a.artifacts, db=str(tmp / "studio.db"), demo_data=a.demo_data,
                                      export_dir=str(tmp / "exports"), first_use_in_background=False,
                                      scheduler=SchedulerConfig(nice=a.nice, window_ms=a.window_ms)))
    ui = studio_app.build_app(studio)
    port = free_port()
    ui.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    url = f"http://127.0.0.1:{port}/"
    people = sorted(studio.runtime.demo_users)[: a.people]
    for p in people:
        studio.histories.save_history(p, studio.histories.demo_items(p), studio.runtime.task.name)
    spawn = multiprocessing.get_context("spawn")  # a fresh interpreter: the clients share nothing with the server
    compare_s, idle_ms, busy_ms = [], [], []
    for r in range(a.rounds):
        out = spawn.Queue()
        studio.runtime.scheduler.batches.clear()
        proc = spawn.Process(target=clients, args=(url, people, a, r, out))
        proc.start()
        res = out.get()
        proc.join()
        if res["errors"]:
            raise SystemExit(f"round {r}: {res['errors'][:3]}")
        walls = res["walls"]
        compare_s += walls
        idle_ms += res["idle_ms"]
        busy_ms += res["busy_ms"]
        print(f"round {r}: {len(people)} Compares in {max(walls):.1f} s (each {sorted(round(w, 1) for w in walls)}); "
              f"decode batches (requests, rows): {dict(Counter((b['requests'], b['rows']) for b in studio.runtime.scheduler.batches))}", flush=True)
    print(f"votes ({a.votes_via}) with nothing decoding: {quantiles(idle_ms)}")
    print(f"votes ({a.votes_via}) during the Compares: {quantiles(busy_ms)}")
    print(f"Compare wall time: median {statistics.median(compare_s):.1f} s, max {max(compare_s):.1f} s")
    ui.close()
    studio.runtime.scheduler.close()


if __name__ == "__main__":
    main()
