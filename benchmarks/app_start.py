"""Start times of the studio. Later starts: process start → the page answers HTTP 200 (the model loading's page,
ui/waiting.py) → the studio serves ("studio serves: all"), repeated, medians reported.
The first start (--first-start): a fresh clone of this repository's HEAD, `make run` in it, each stage timed.

    .venv/bin/python benchmarks/app_start.py [--repeats 5] [-- app.py flags]
    .venv/bin/python benchmarks/app_start.py --first-start [--repeats 3] [--venv .venv] [--json first.json]
        [--shots OUT --history subjects.txt --prompt "..."]

Later starts: run after the first start has built the demo artifacts (it refuses to time a build). The machines
here are shared and noisy, so it prints every run and the median, and the part spent before the models load
(Python imports) as reported by the app's own "ready in" line.

The first start: from `make run` on the clone, when pip ended (the venv's .installed stamp), when the page first
answered HTTP 200 (the first start's page, ui/waiting.py), when the studio itself answered (its page's title is the
studio's), the build's stages as its log reports them ("<stage> done in X s"), then --repeats later starts of the
same clone, then `make extra` (the optional weight `make run` leaves out), timed. --venv copies a built venv instead
of pip's install (to time the rest on a busy day); it says so.
--shots: headless Chromium on the first start: each tab's waiting state while the build runs, the studio once it
serves (card's part), then a new person's history saved and the first Compare of the methods ticked by default,
timed to its Done line (one text a line in --history); then the page when card's part arrives (the title line says
so) and the same Compare pressed again, and the page when the build is all done ("still finishing" goes). Each `studio serves: <part>` line of
`make run` is timed (serves_s).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from personalize.eval import bench_serving as serving  # noqa: E402  (the bench's own start timer: one implementation)


def one_start(app_args: list[str], timeout: float) -> tuple[float, float, float | None]:
    """(seconds to the page's HTTP 200, to "studio serves: all", the app's own "ready in" seconds: the page, the
    model stack's imports, artifacts, models and UI)."""
    try:
        page, wall, log = serving.one_start(app_args, timeout)
    except RuntimeError as e:
        raise SystemExit(str(e)) from None
    m = re.search(r"ready in ([\d.]+) s", log)
    return page, wall, float(m.group(1)) if m else None


def _title(port: int) -> str | None:
    """The served page's title (Gradio's /config), or None while nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/config", timeout=2) as r:
            return json.loads(r.read()).get("title")
    except (OSError, ValueError):
        return None


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_run(clone: Path, log: Path, timeout: float, stamp: Path | None = None, walk=None) -> dict:
    """`make run` in `clone` until the studio answers: seconds to pip's end (stamp), to the first HTTP 200, to the
    studio's own page; then stopped as Ctrl-C stops it. `walk`: a browser's (waiting(url), studio(url) → dict),
    called when the first start's page answers and when the studio does (its third, quit, by the caller)."""
    from personalize.ui.waiting import STUDIO_TITLE, TITLE as WAITING

    port, t0, out = _port(), time.perf_counter(), {"serves_s": {}}
    with log.open("w") as f:
        proc = subprocess.Popen(["make", "run", f"ARGS=--port {port}"], cwd=clone, stdout=f, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
    stop = threading.Event()

    def parts():  # each `studio serves: <part>` line timed as it is printed, while the walk holds the loop below
        while not stop.is_set():
            for part in re.findall(r"studio serves: (cluster|card|all)\b", log.read_text(errors="replace")):
                out["serves_s"].setdefault(part, round(time.perf_counter() - t0, 1))
            time.sleep(0.2)

    threading.Thread(target=parts, daemon=True).start()
    try:
        while "studio_s" not in out or "all" not in out["serves_s"]:
            if proc.poll() is not None:
                raise SystemExit(f"make run exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            now = round(time.perf_counter() - t0, 1)
            if stamp is not None and "pip_s" not in out and stamp.exists():
                out["pip_s"] = now
            title = _title(port)
            if title is not None:
                if "page_s" not in out and walk is not None and title == WAITING:
                    walk[0](f"http://127.0.0.1:{port}/")
                out.setdefault("page_s", now)
                if title == STUDIO_TITLE and "studio_s" not in out:  # (the loop goes on until `all` serves)
                    out["studio_s"] = now
                    if walk is not None:
                        out["browser"] = walk[1](f"http://127.0.0.1:{port}/")
            if now > timeout:
                raise SystemExit(f"the studio did not answer within {timeout:.0f} s:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        return out
    finally:
        stop.set()
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def first_start(a) -> dict:
    """A fresh clone of HEAD, `make run`, each stage; then later starts of the same clone."""
    root = Path(tempfile.mkdtemp(prefix="first-start-"))
    clone = root / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    if a.venv:  # a copied venv: pip's time is not measured
        shutil.copytree(a.venv, clone / ".venv", symlinks=True)
        (clone / ".venv" / "bin" / ".installed").touch()
    res = {"commit": subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=clone, text=True).strip(),
           "venv": "copied (pip not timed)" if a.venv else "pip install"}
    walk = browser_walk(Path(a.shots), a.history, a.prompt) if a.shots else None
    try:
        res |= make_run(clone, root / "first.log", a.timeout,
                        None if a.venv else clone / ".venv" / "bin" / ".installed", walk)
    finally:
        if walk is not None:
            walk[2]()  # Chromium quits whether the run got to the studio or not
    log = (root / "first.log").read_text()
    res["stages_s"] = {m.group(1): float(m.group(2)) for m in re.finditer(r"\] (.+?) done in ([\d.]+) s", log)}
    if "pip_s" in res:
        res["page_after_pip_s"] = round(res["page_s"] - res["pip_s"], 1)
    later = [make_run(clone, root / f"later{i}.log", a.timeout) for i in range(a.repeats)]
    res["later_page_s"], res["later_s"] = [r["page_s"] for r in later], [r["studio_s"] for r in later]
    if not a.venv:  # what `make run` no longer installs (requirements-extra.txt): pip's time it saves
        t = time.perf_counter()
        subprocess.run(["make", "extra"], cwd=clone, check=True, stdout=subprocess.DEVNULL)
        res["extra_pip_s"] = round(time.perf_counter() - t, 1)
    print(json.dumps(res, indent=1))
    print(f"make run on a fresh clone: page {res['page_s']} s, studio {res['studio_s']} s, parts served "
          f"{res['serves_s']}"
          + (f" (pip ended at {res['pip_s']} s; the page {res['page_after_pip_s']} s after)" if "pip_s" in res else
             " (venv copied)") + f"; later starts: the page {res['later_page_s']} s (median "
          f"{statistics.median(res['later_page_s'])}), the studio {res['later_s']} s (median "
          f"{statistics.median(res['later_s'])})")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    if not a.keep:
        shutil.rmtree(root, ignore_errors=True)
    else:
        print(f"kept: {root}")
    return res


def browser_walk(shots: Path, history: str, prompt: str):
    """The first start as a person sees it (make_run's `walk`): the waiting page's tabs, then the studio: a history
    saved under a new name and Compare pressed at once with the methods ticked by default."""
    from selenium.webdriver.support.ui import WebDriverWait

    from personalize.ui.waiting import TITLE as WAITING, WAITS
    from tools.browser import Page, chromium

    d = chromium(shots)
    p = Page(d, shots)

    def waiting(url: str) -> None:
        d.get(url)
        p.until_text("first-start-status", "Building", "writing")
        for i, (tab, _) in enumerate(WAITS):
            p.tab(tab)
            time.sleep(0.5)
            p.shot(f"waiting-{i:02d}-{tab.lower().replace(' ', '-')}")

    def pressed(button: str, status: str, *needles: str) -> tuple[str, float]:
        """The button pressed, then its status line until it holds a needle; a line that holds one already (the
        same Compare pressed again) is first waited out, so the answer is the new one."""
        t0 = time.perf_counter()
        shown = any(n in p.el(f"#{status}").text for n in needles)
        p.click(button)
        if shown:
            WebDriverWait(d, 120, 0.2).until(lambda _: not any(n in p.el(f"#{status}").text for n in needles))
        return p.until_text(status, *needles), round(time.perf_counter() - t0, 1)

    def studio(url: str) -> dict:
        out = {}
        p.wait.until(lambda _: d.title != WAITING)  # the page reloads itself into the studio
        p.el("#user-name")
        p.shot("studio-1-served")
        p.type("user-name", "first-hour")
        p.type("history", "\n".join(line.strip() for line in open(history) if line.strip()))
        out["saved"], out["save_s"] = pressed("save-history", "writing-status", "Saved", "⚠️")
        p.tab("Compare")
        p.type("prompt", prompt)
        out["compare"], out["first_compare_s"] = pressed("compare-button", "compare-status", "Done:", "⚠️")
        p.shot("studio-2-first-compare")
        out["first_compare_card"] = p.el("#compare-status").text
        t0 = time.perf_counter()  # the build's later parts arrive while the page is open (its title line says so)
        WebDriverWait(d, 900, 2).until(lambda _: "card comes with its head" not in p.el("#header").text)
        out["card_after_compare_s"] = round(time.perf_counter() - t0, 1)
        out["compare_when_card_came"] = p.el("#compare-status").text  # the Compare made before still stands
        p.shot("studio-3-card-arrived")
        out["compare_with_card"], out["compare_with_card_s"] = pressed("compare-button", "compare-status", "Done:",
                                                                       "⚠️")
        p.shot("studio-4-compare-with-card")
        WebDriverWait(d, 900, 2).until(lambda _: "still finishing" not in p.el("#header").text)
        out["all_after_compare_s"] = round(time.perf_counter() - t0, 1)
        out["compare_when_all_came"] = p.el("#compare-status").text
        p.shot("studio-5-all-served")
        return out

    return waiting, studio, d.quit


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--first-start", action="store_true", help="time `make run` on a fresh clone, stage by stage")
    p.add_argument("--venv", default=None, help="--first-start: copy this venv instead of pip's install")
    p.add_argument("--json", default=None, help="--first-start: write the figures here")
    p.add_argument("--keep", action="store_true", help="--first-start: keep the clone and its logs")
    p.add_argument("--shots", default=None, help="--first-start: a browser's screenshots go here (see above)")
    p.add_argument("--history", default=None, help="--shots: the new person's texts, one a line")
    p.add_argument("--prompt", default="Fix the parser's handling of empty lines", help="--shots: Compare's prompt")
    p.add_argument("app_args", nargs="*", help="flags passed to app.py (after --)")
    a = p.parse_args()
    if a.first_start:
        a.timeout = max(a.timeout, 3600)
        first_start(a)
        return
    pages, walls, loads = [], [], []
    for i in range(a.repeats):
        page, wall, load = one_start(a.app_args, a.timeout)
        pages.append(page)
        walls.append(wall)
        loads.append(load)
        print(f"start {i + 1}/{a.repeats}: the page (HTTP 200) after {page:.2f} s, the studio serves after "
              f"{wall:.2f} s (app's ready line: {load} s)", flush=True)
    known = [x for x in loads if x is not None]
    load = f"; the app's ready line: {statistics.median(known):.2f} s" if known else ""
    print(f"median over {a.repeats} starts: the page {statistics.median(pages):.2f} s (min {min(pages):.2f}, max "
          f"{max(pages):.2f}), the studio serves {statistics.median(walls):.2f} s (min {min(walls):.2f}, max "
          f"{max(walls):.2f}){load}")


if __name__ == "__main__":
    main()
