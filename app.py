"""The personalization studio, a Gradio app over personalize.studio.Studio.

    python app.py [--host 127.0.0.1] [--port 7860] [--db data/studio.db] [--artifacts data/artifacts/demo]
                  [--auth u1:p1,u2:p2 | --auth @raters.txt]

Tabs: My writing, My cluster, Fit my style, Compare, Why, Rate, Quick pair, Leaderboard, Campaigns, Export,
Explore, Populations; each is a module of personalize/ui with build(studio, shared), listed in page order in TABS. Every
handler calls one Studio method; what it shows and collects is in the SQLite store.
Expected problems (bad input, unknown user, a stale vote) are answered in the tab's
status line and change nothing else; model work runs in Gradio's queue with a progress bar.
Text from people and models (history items, names, prompts, outputs, errors quoting them) is shown as
written, never rendered or executed: it enters Markdown and plots only through personalize.display.
With --auth, a vote counts under the logged-in user name (arena.rater_id), once per rater and pair.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
import time
from pathlib import Path

import gradio as gr

from personalize.studio.decoder import DecodeTarget
from personalize.studio.facade import Studio, StudioConfig
from personalize.ui import campaigns, cluster, compare, explore, export, fit, leaderboard, populations, quick_pair, rate, why, writing
from personalize.ui.common import CSS, EXPECTED
from personalize.ui.controls import forget_previous_person, page_top

# The tabs in page order: each lays itself out and wires its events, reading the shared components.
TABS = (
    writing.build,  # My writing
    cluster.build,  # My cluster
    fit.build,  # Fit my style
    compare.build,  # Compare
    why.build,  # Why
    rate.build,  # Rate: a campaign's rater view (blinded units from the stored pool)
    quick_pair.build,  # Quick pair: a typed prompt, two blinded outputs generated on the spot
    leaderboard.build,  # Leaderboard
    campaigns.build,  # Campaigns: create, generate, results, export / import, close
    export.build,  # Export
    explore.build,  # Explore
    populations.build,  # Populations: make a population (git, Debian changelogs, a table), build it, serve it
)


def build_app(studio: Studio) -> gr.Blocks:
    with gr.Blocks(title="Personalization studio", analytics_enabled=False) as app:
        shared = page_top(studio, app)
        for build in TABS:
            build(studio, shared)
        forget_previous_person(studio, shared)  # no tab keeps the previous person's results after a switch
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


AUTH_HELP = ("raters who may log in: USER:PASSWORD, several separated by commas (u1:p1,u2:p2), or @FILE with one "
             "USER:PASSWORD a line (blank lines and # comments skipped; use a file when a password holds a comma); "
             "or env STUDIO_AUTH. Required when --host is not a loopback address. With it, a vote counts under the "
             "logged-in user name (the Quick pair tab's rater id is that name, not editable) and each rater votes once "
             "per pair of outputs")


def parse_auth(value: str | None) -> list[tuple[str, str]] | None:
    """--auth as Gradio's launch(auth=...) takes it: [(user, password), ...]; None when not given. The password
    is everything after an entry's first colon; whitespace around an entry is ignored. Errors never echo a
    password."""
    if not value or not value.strip():
        return None
    value = value.strip()
    if value.startswith("@"):
        path = Path(value[1:]).expanduser()
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise SystemExit(f"error: --auth {value}: cannot read {path} ({e.__class__.__name__})") from None
        entries = [(f"{path} line {i}", line.strip()) for i, line in enumerate(text.splitlines(), 1)
                   if line.strip() and not line.strip().startswith("#")]
        if not entries:
            raise SystemExit(f"error: --auth {value}: no USER:PASSWORD line in {path}")
    else:
        entries = [(f"entry {i}", e.strip()) for i, e in enumerate(value.split(","), 1)]
    pairs: dict[str, str] = {}
    for where, entry in entries:
        user, sep, password = entry.partition(":")
        user = user.strip()  # Gradio's login form strips the user name too
        if not sep or not user or not password:
            raise SystemExit(f"error: --auth must be USER:PASSWORD[,USER:PASSWORD...] or @FILE; {where} is not")
        if user in pairs:
            raise SystemExit(f"error: --auth names the user {user!r} twice ({where})")
        pairs[user] = password
    return list(pairs.items())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="The personalization studio (Gradio).")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: this machine only)")
    p.add_argument("--port", type=int, default=7860)
    p.add_argument("--db", default="data/studio.db")
    p.add_argument("--artifacts", default="data/artifacts/demo", help="CARD artifacts (the demo is built if missing)")
    p.add_argument("--demo-data", default="data/demo")
    p.add_argument("--auth", default=os.environ.get("STUDIO_AUTH"), metavar="USER:PASSWORD[,...] | @FILE",
                   help=AUTH_HELP)
    p.add_argument("--decode", default=None, metavar="auto | ray://HOST:10001",
                   help="decode on a Ray Serve deployment ('auto': a local Ray; docs/SCALING.md); default: in-process")
    p.add_argument("--decode-replicas", type=int, default=1, help="replicas of the decoding deployment")
    p.add_argument("--decode-gpus", type=float, default=0.0, help="GPUs per replica (1 where each has its own)")
    a = p.parse_args(argv)
    auth = parse_auth(a.auth)
    if not _loopback(a.host) and auth is None:
        print(f"error: --host {a.host} shares the studio beyond this machine; give --auth USER:PASSWORD",
              file=sys.stderr)
        return 2
    from personalize.fitting.plan import DEMO_ARTIFACTS, ensure_demo

    t0 = time.perf_counter()
    try:
        target = DecodeTarget(a.decode, a.decode_replicas, a.decode_gpus)
        if target.address not in (None, "auto"):
            from personalize.distributed.pool import check_reachable

            check_reachable(target.address)  # before a first start's build and the model's load, not after
        if Path(a.artifacts).resolve() == Path(DEMO_ARTIFACTS).resolve():
            ensure_demo(Path(a.demo_data), Path(a.artifacts))
        studio = Studio.load(StudioConfig(artifacts=a.artifacts, db=a.db, demo_data=a.demo_data, decode=target),
                             adapters_later=True)
    except (*EXPECTED, ConnectionError) as e:  # ConnectionError: --decode names a Ray that cannot be reached
        print(f"error: {e}", file=sys.stderr)
        return 2
    app = build_app(studio)
    print(f"ready in {time.perf_counter() - t0:.1f} s: http://{a.host}:{a.port}", flush=True)
    app.launch(server_name=a.host, server_port=a.port, auth=auth, share=False, css=CSS, show_error=False,
               prevent_thread_lock=True)
    studio.load_pending()  # the page answers already; the other cluster adapters load now (~1 s)
    app.block_thread()
    return 0


if __name__ == "__main__":
    sys.exit(main())
