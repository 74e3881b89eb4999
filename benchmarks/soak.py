"""Soak: does the studio's memory stay bounded over a long sitting?

    .venv/bin/python benchmarks/soak.py [--artifacts data/artifacts/demo] [--compares 200] [--fits 20] [--people 5]

Starts app.py as its own process on 127.0.0.1 with a fresh database (the app as a person meets it) and drives it
over HTTP as the page does: several people save their histories and fit (`--fits` in all), press Compare
(`--compares` in all, cycling people, prompts and methods), and paste 5 MB histories that the studio refuses.
The server's resident memory (VmRSS of its process) is read after a warm-up round (every kind of request once
for every person, every method included, so the per-person first uses that Fit starts in the background, OPPU's
training and EXACT's search, are done: a first run that read it before them saw 2.9 GB become 5.9 GB when the
first OPPU training ran, then stay) and at the end; the figure to watch is end / warm-up (target ≤ 1.25). Progress is printed as
it goes; the machines here are noisy, so the run's time varies, its memory much less.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
METHODS = ["base", "cluster", "card", "cope", "rag", "pag", "p2p"]
FIRST_USE = ["oppu", "exact"]  # per-person work on first use: in the warm-up only (minutes a person)
PROMPTS = ["the bus was late again this morning", "we shipped the new release today", "fix the crash on start-up",
           "the garden needs water", "update the documentation for the parser", "a long day at the office"]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def histories(demo: Path, n: int) -> list[tuple[str, str]]:
    """n people's histories from the build's own demo folder (their texts, one per line)."""
    from personalize.data import read_lamp

    _, queries = read_lamp(demo, "dev")
    step = max(1, len(queries) // n)  # spread over the file: its people come grouped by style
    return [(f"soak{i}", "\n\n".join(it.y for it in q.profile)) for i, q in enumerate(queries[::step][:n])]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--artifacts", default="data/artifacts/demo")
    p.add_argument("--demo-data", default=None, help="LaMP folder the people come from (default: the build's data)")
    p.add_argument("--compares", type=int, default=200)
    p.add_argument("--fits", type=int, default=20)
    p.add_argument("--people", type=int, default=5)
    p.add_argument("--refusals", type=int, default=5, help="5 MB pastes, refused")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from gradio_client import Client

    art = Path(a.artifacts)
    meta = json.loads((art / "config.json").read_text())
    demo = Path(a.demo_data or meta.get("data") or "data/demo")
    task = meta["task"]
    people = histories(demo, a.people)
    folder = Path(tempfile.mkdtemp(prefix="soak-"))
    port = free_port()
    server = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--port", str(port), "--db", str(folder / "s.db"),
                               "--artifacts", str(art), "--demo-data", str(demo)], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in server.stdout:  # "ready in … s: http://…"
            if line.startswith("ready in"):
                break
        else:
            raise SystemExit(f"the studio did not start (exit {server.wait()})")
        url = f"http://127.0.0.1:{port}/"
        for _ in range(120):
            try:
                c = Client(url, verbose=False)
                break
            except Exception:
                time.sleep(1)
        t0 = time.perf_counter()
        figures: dict = {"artifacts": str(art), "people": len(people), "rss_mb": {}}
        big = "x" * 5_100_000

        def refuse():
            out = c.predict("soak-big", big, None, task, None, api_name="/save_history")
            assert "limit" in out[0] or "⚠️" in out[0], out[0][:200]

        def compare(i, methods=None):
            name = people[i % len(people)][0]
            methods = methods or METHODS[i % 3: i % 3 + 5]
            out = c.predict(name, f"{PROMPTS[i % len(PROMPTS)]} {i}", True, None, methods, 1.0, 50, a.max_tokens,
                            None, api_name="/compare")
            assert out[0].startswith("Done"), out[0][:200]

        fits = 0
        # warm-up: every kind of request once for every person
        for name, text in people:
            c.predict(name, text, None, task, None, api_name="/save_history")
            c.predict(name, None, api_name="/fit")
            fits += 1
        refuse()
        for i in range(len(people)):  # every method once a person: it waits for the first uses that Fit started in
            compare(i, FIRST_USE + METHODS)  # the background (OPPU's training, EXACT's search), the work that grows
        figures["rss_mb"]["warm_up"] = round(rss_mb(server.pid), 1)
        print(f"warm-up done in {time.perf_counter() - t0:.0f} s: {figures['rss_mb']['warm_up']:.0f} MB", flush=True)
        done, refusals = len(people), 1
        while done < a.compares:
            compare(done)
            done += 1
            if fits < a.fits and done % max(1, a.compares // a.fits) == 0:
                name, _ = people[fits % len(people)]
                c.predict(name, None, api_name="/fit")
                fits += 1
            if refusals < a.refusals and done % max(1, a.compares // a.refusals) == 0:
                refuse()
                refusals += 1
            if done % 20 == 0:
                print(f"  {done}/{a.compares} Compares, {fits} fits, {refusals} refusals: "
                      f"{rss_mb(server.pid):.0f} MB, {time.perf_counter() - t0:.0f} s", flush=True)
        figures["rss_mb"]["end"] = round(rss_mb(server.pid), 1)
        figures |= {"compares": done, "fits": fits, "refusals": refusals, "seconds": round(time.perf_counter() - t0, 1),
                    "end_over_warm_up": round(figures["rss_mb"]["end"] / figures["rss_mb"]["warm_up"], 3)}
        print(json.dumps(figures, indent=1))
        if a.json:
            Path(a.json).write_text(json.dumps(figures, indent=1))
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
