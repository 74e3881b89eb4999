"""The personalization studio, a Gradio app over personalize.studio.Studio.

    python app.py [--host 127.0.0.1] [--port 7860] [--db data/studio.db] [--artifacts data/artifacts/demo]
                  [--auth u1:p1,u2:p2 | --auth @raters.txt] [--admin u1]

Tabs: My writing, My cluster, Fit my style, Compare, Why, Rate, Quick pair, Leaderboard, Campaigns, Export,
Explore, Populations; each is a module of personalize/ui with build(studio, shared), listed in page order by tabs(). Every
handler calls one Studio method; what it shows and collects is in the SQLite store.
Expected problems (bad input, unknown user, a stale vote) are answered in the tab's
status line and change nothing else; model work runs in Gradio's queue with a progress bar.
Text from people and models (history items, names, prompts, outputs, errors quoting them) is shown as
written, never rendered or executed: it enters Markdown and plots only through personalize.display.
With --auth, a vote counts under the logged-in user name (arena.rater_id), once per rater and pair; logins are
checked and throttled by personalize.ui.login.Login. What each login may reach, and the tests for it: docs/SECURITY.md.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import signal
import sys
import threading
import time
from pathlib import Path

import gradio as gr

# Only what the page before the studio needs is imported here (gradio, the login, the waiting page: seconds); the
# model stack (torch, transformers, peft, the studio) comes behind that page, in main (issue 58: a later start
# shows the page within 5 s of `make run`).
from personalize.ui import waiting
from personalize.ui.common import CSS, EXPECTED, run_as_login
from personalize.ui.downloads import OwnDownloads, empty
from personalize.ui.login import AUTH_HELP, Login, LoginNotice, parse_admins, parse_auth

from personalize.fitting.plan import DEFAULT_DB, DEMO_ARTIFACTS, DEMO_DATA  # noqa: E402  (StudioConfig's defaults)


def tabs():
    """The tabs in page order: each lays itself out and wires its events, reading the shared components."""
    from personalize.ui import campaigns, compare, explore, export_tab, fit, leaderboard_tab, my_cluster, populations, \
        quick_pair, rate, why, writing

    return (
        writing.build,  # My writing
        my_cluster.build,  # My cluster
        fit.build,  # Fit my style
        compare.build,  # Compare
        why.build,  # Why
        rate.build,  # Rate: a campaign's rater view (blinded units from the stored pool)
        quick_pair.build,  # Quick pair: a typed prompt, two blinded outputs generated on the spot
        leaderboard_tab.build,  # Leaderboard
        campaigns.build,  # Campaigns: create, generate, results, export / import, close
        export_tab.build,  # Export
        explore.build,  # Explore
        populations.build,  # Populations: make a population (git, Debian changelogs, a table), build it, serve it
    )


# Gradio's cache (uploads, downloads): every `delete_cache[0]` seconds, files older than `delete_cache[1]` go (all of
# them when the server stops); a download link lives a day at most.
DELETE_CACHE = (3600, 86400)


def page_files(studio) -> Path:
    """Points Gradio's file cache at the studio's page folder (StudioConfig.page_files), so that the files the page
    takes and hands out live where Forget me looks and nowhere in /tmp. Gradio reads GRADIO_TEMP_DIR when a
    component is made and when the server starts (components' GRADIO_CACHE, the upload route's folder), so this
    runs before the Blocks is; one folder a process (the variable is the process's)."""
    folder = studio.runtime.cfg.page_files.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    os.environ["GRADIO_TEMP_DIR"] = str(folder)
    return folder


def launch_options(studio) -> dict:
    """launch()'s limits for this studio: an upload larger than a history may be (at 4 bytes a character, UTF-8's
    widest) is refused by the upload route itself (HTTP 413) before it is written; the database files are never
    served, whatever the cache folder is set to; a download is served to the login it was handed to only
    (ui/downloads.py); the login page says why a login is refused and for how long (ui/login.py)."""
    from starlette.middleware import Middleware

    db = Path(studio.runtime.cfg.db).resolve()
    return {"max_file_size": 4 * studio.runtime.cfg.max_history_chars,
            "blocked_paths": [str(db), f"{db}-wal", f"{db}-shm", f"{db}-journal"],
            "app_kwargs": {"middleware": [Middleware(OwnDownloads, page_files=studio.runtime.cfg.page_files),
                                          Middleware(LoginNotice)]}}


def build_app(studio) -> gr.Blocks:
    from personalize.ui.controls import follow_build, forget_previous_person, page_top

    page_files(studio)
    with gr.Blocks(title=waiting.STUDIO_TITLE, analytics_enabled=False, delete_cache=DELETE_CACHE) as app:
        shared = page_top(studio, app)
        with gr.Tabs():  # one row of tabs (each tab's build keeps its components inside its own tab)
            for build in tabs():
                build(studio, shared)
        forget_previous_person(studio, shared)  # no tab keeps the previous person's results after a switch
        follow_build(studio, shared)  # the first start's last parts (card's check, P2P) arrive while it serves
        run_as_login(app)  # every event runs as its login: the store lets it reach only that login's people
    app.queue(default_concurrency_limit=1)
    return app


# ---------------------------------------------------------------- start-up

def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def early_page(a, auth) -> tuple[gr.Blocks, "waiting.FirstStart | None"]:
    """The page before the studio, on the studio's address with its login: the first start's (the demo built once,
    with its progress, ui/waiting.py) where the demo is missing, else the model loading's. Either reloads into the
    studio when it answers there."""
    from personalize.fitting.plan import demo_ready

    demo, art = Path(a.demo_data), Path(a.artifacts)
    job = None
    if art.resolve() == Path(DEMO_ARTIFACTS).resolve() and not demo_ready(demo, art):
        job = waiting.FirstStart(demo, art).start()
        page = waiting.waiting_page(job)
    else:
        page = waiting.loading_page(waiting.ModelLoad())
    page.launch(server_name=a.host, server_port=a.port, auth=Login.of(auth), share=False, show_error=False,
                prevent_thread_lock=True, quiet=True, js=waiting.RELOAD_JS)
    print(f"first start: the page answers at http://{a.host}:{a.port} while the demo builds" if job else
          f"the page answers at http://{a.host}:{a.port}; loading the model", flush=True)
    return page, job


def load_studio(a, auth, admins, job):
    """The studio (the model stack imported here), once the first start's build, if any, has written its cluster
    part (the build then goes on behind the studio: serve_parts)."""
    from personalize.distributed.serve import ServeConfig
    from personalize.studio.facade import Studio, StudioConfig
    from personalize.studio.scheduling import DecodeTarget

    target = DecodeTarget(a.decode, ServeConfig(**{k: v for k, v in (("replicas", a.decode_replicas),
                                                                     ("num_gpus", a.decode_gpus)) if v is not None}))
    if job is not None:
        job.cluster.wait()
        if job.error:
            raise ValueError(f"the demo build failed: {job.error}")
    studio = Studio.load(StudioConfig(artifacts=a.artifacts, db=a.db, demo_data=a.demo_data, decode=target,
                                      logins=auth is not None, admins=admins), adapters_later=True)
    if job is not None:
        studio.follow_build(job.coming())
    return studio


def serve_parts(studio, job) -> None:
    """Says when each part of the studio serves, one line each: `studio serves: cluster` (all but card and P2P), `studio
    serves: card` (the head trained: card with the planned settings), `studio serves: all` (card's check decided,
    P2P in); a later start says the last at once. The parts after the first are taken by a thread of their own while
    the studio serves."""
    if job is None:
        print("studio serves: all", flush=True)
        return

    def follow():
        from tqdm import tqdm

        from personalize.studio.coming import Coming

        for part, reached in (("cluster", job.cluster), ("card", job.card), ("all", job.done)):
            reached.wait()
            if part != "cluster" or job.error:
                studio.take_built_parts(job.coming())  # what the folder holds now (a failed build's head too)
            if job.error:  # what serves keeps serving; the next start builds the demo again (its part is marked)
                studio.follow_build(Coming.waiting(not studio.served.heads, failed=job.error))
                print(f"error: the demo build's last parts failed ({job.error}): the studio serves what it had; the "
                      "next start builds the demo again", file=sys.stderr, flush=True)
                return
            tqdm.write(f"studio serves: {part}", file=sys.stdout)  # its own line, above the build's progress bars
            sys.stdout.flush()

    threading.Thread(target=follow, name="first-start-parts", daemon=True).start()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="The personalization studio (Gradio).")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: this machine only)")
    p.add_argument("--port", type=int, default=7860)
    p.add_argument("--db", default=DEFAULT_DB, help="the database; its folder holds every file the studio writes")
    p.add_argument("--artifacts", default=DEMO_ARTIFACTS, help="CARD artifacts (the demo is built if missing)")
    p.add_argument("--demo-data", default=DEMO_DATA)
    p.add_argument("--auth", default=os.environ.get("STUDIO_AUTH"), metavar="USER:PASSWORD[,...] | @FILE",
                   help=AUTH_HELP)
    p.add_argument("--decode", default=None, metavar="auto | ray://HOST:10001",
                   help="decode on a Ray Serve deployment ('auto': a local Ray; docs/SCALING.md); default: in-process")
    p.add_argument("--decode-replicas", type=int, default=None,
                   help="replicas of the decoding deployment (default: ServeConfig's, 1)")
    p.add_argument("--decode-gpus", type=float, default=None,
                   help="GPUs per replica (1 where each has its own; default: ServeConfig's)")
    p.add_argument("--admin", action="append", metavar="USER[,USER...]",
                   help="an --auth login that may see, open and export every person (not only those it created); "
                        "may be given several times")
    a = p.parse_args(argv)
    auth = parse_auth(a.auth)
    admins = parse_admins(a.admin, None if auth is None else [u for u, _ in auth])
    if not _loopback(a.host) and auth is None:
        print(f"error: --host {a.host} shares the studio beyond this machine; give --auth USER:PASSWORD",
              file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    if a.decode is not None and a.decode.strip() not in ("", "auto"):
        from personalize.distributed.pool import check_reachable

        try:
            check_reachable(a.decode)  # before a first start's build starts and the model loads, not after
        except ConnectionError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    page, job = early_page(a, auth)
    try:
        studio = load_studio(a, auth, admins, job)
        app = build_app(studio)
    except (*EXPECTED, ConnectionError) as e:  # ConnectionError: --decode names a Ray that cannot be reached
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        page.close()
    print(f"ready in {time.perf_counter() - t0:.1f} s: http://{a.host}:{a.port}", flush=True)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a stop closes the server as Ctrl-C does
    try:
        app.launch(server_name=a.host, server_port=a.port, auth=Login.of(auth), share=False, css=CSS,
                   show_error=False, prevent_thread_lock=True, **launch_options(studio))
        serve_parts(studio, job)
        studio.load_pending()  # the page answers already; the other cluster adapters load now (~1 s)
        app.block_thread()
    finally:
        empty(studio.runtime.cfg.page_files)  # no upload or download outlives the server
    return 0


if __name__ == "__main__":
    sys.exit(main())
