"""The studio decoding on Ray Serve (`--decode auto`, 2 replicas on the tiny build): the same outputs as in-process,
streamed token by token to the Compare columns; a replica killed mid-decode costs at most that column (an error
that says so, nothing stored half), the studio goes on; a Ray that cannot be reached is a clear error at start
(marker `ray`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from personalize.distributed.serve import ServeConfig
from personalize.studio.scheduling import DecodeTarget
from personalize.studio.facade import Studio, StudioConfig

from tools.browser import Page, chromium, served
from conftest import tiny_studio

pytestmark = pytest.mark.ray
ROOT = Path(__file__).resolve().parents[2]
METHODS = ["base", "cluster", "card", "cope"]


def _person(studio) -> None:
    studio.histories.save_history("bo", studio.histories.demo_items("terse_01"), "tweets")
    studio.fits.fit("bo")


def _texts(studio, prompt, s) -> dict[str, str]:
    outs = {o.method: o for o in studio.comparisons.compare("bo", prompt, METHODS, s)}
    assert all(o.error is None for o in outs.values()), {m: o.error for m, o in outs.items()}
    return {m: o.text for m, o in outs.items()}


def _streamed(studio, prompt, s) -> tuple[dict[str, str], dict]:
    """A Compare as the page sees it: each column's last streamed text, and its output."""
    last, outs = {}, {}
    for kind, m, value in studio.comparisons.compare_stream(studio.comparisons.compare_plan("bo", prompt, False, None, METHODS),
                                                         s):
        if kind == "text":
            last[m] = value
        elif kind == "done":
            outs[m] = value
    return last, outs


def test_studio_on_two_replicas_decodes_as_in_process_and_survives_a_killed_replica(ray_local, tiny_artifacts,
                                                                                    tmp_path):
    from ray import serve

    local = tiny_studio(tiny_artifacts, tmp_path / "local")
    _person(local)
    s = local.runtime.settings(alpha=1.0, max_new_tokens=6)
    prompt = local.runtime.task.prompt("the bus was late")
    want = _texts(local, prompt, s)
    local.runtime.scheduler.close()

    (tmp_path / "remote").mkdir()
    remote = Studio.load(StudioConfig(own_adapters=False, artifacts=str(tiny_artifacts["artifacts"]), db=str(tmp_path / "remote" / "s.db"),
                                      demo_data=str(tiny_artifacts["demo"]),
                                      decode=DecodeTarget("auto", ServeConfig(replicas=2, num_cpus=0.5))))
    try:
        _person(remote)
        last, outs = _streamed(remote, prompt, s)
        assert {m: o.text for m, o in outs.items()} == want
        assert last == want  # every column streamed its tokens from the replica
        assert remote.runtime.scheduler.remote_requests == 1  # the Compare's columns travel as one request (issue 50)
        status = serve.status().applications["personalize-decoder"].deployments["decoder"]
        assert status.replica_states.get("RUNNING") == 2
        pids = {r.result()["pid"] for r in [remote.runtime.scheduler.handle.info.remote() for _ in range(20)]}

        got: list = []
        run = threading.Thread(target=lambda: got.extend(_streamed(remote, prompt, s)))
        run.start()
        time.sleep(0.05)
        os.kill(sorted(pids)[0], signal.SIGKILL)  # one replica dies while the Compare decodes
        run.join(300)
        last, outs = got
        assert set(outs) == set(METHODS)
        for m, o in outs.items():  # each column: the right text (retried on the live replica, streamed once) or
            if o.error is None:    # an error saying so
                assert o.text == want[m] and last[m] == want[m]
            else:
                assert "Ray" in o.error and o.gen_id is None
        stored = remote.runtime.store.generations(user="bo")
        assert all(g["output"] == want[g["method"]] for g in stored)  # nothing half
        assert _texts(remote, prompt, s) == want  # the studio goes on
    finally:
        remote.runtime.scheduler.close()
        serve.shutdown()  # the replicas go; the session's Ray stays for the other tests


def test_browser_compare_of_every_method_on_two_replicas_as_in_process(ray_local, tiny_artifacts, tmp_path):
    """The studio as `app.py --decode auto --decode-replicas 2` serves it: a Compare of every method in headless
    Chromium; each column's output is the one in-process decoding gives."""
    from ray import serve

    from personalize.catalog import ALL_METHODS

    (tmp_path / "remote").mkdir()
    remote = Studio.load(StudioConfig(own_adapters=False, artifacts=str(tiny_artifacts["artifacts"]), db=str(tmp_path / "remote" / "s.db"),
                                      demo_data=str(tiny_artifacts["demo"]),
                                      decode=DecodeTarget("auto", ServeConfig(replicas=2, num_cpus=0.5))))
    driver = chromium(tmp_path)
    try:
        _person(remote)
        with served(remote) as url:
            p = Page(driver, tmp_path / "shots")
            driver.get(url)
            p.type("user-name", "bo")
            p.until_text("writing-status", "stored items")
            p.tab("Compare")
            p.choose_methods(ALL_METHODS)
            p.type("prompt", "the bus was late")
            p.click("compare-button")
            assert p.until_text("compare-status", "Done", "⚠️").startswith(f"Done: {len(ALL_METHODS)} methods")
            shown = {m: " ".join(p.text(f"out-{m}").split()) for m in ALL_METHODS}
        assert remote.runtime.scheduler.remote_requests > 0
    finally:
        driver.quit()
        remote.runtime.scheduler.close()
        serve.shutdown()
    page = {g["method"]: g for g in remote.runtime.store.generations(user="bo")}
    g = next(iter(page.values()))
    local = tiny_studio(tiny_artifacts, tmp_path / "local")
    _person(local)
    s = local.runtime.settings(g["settings"]["alpha"], g["settings"]["top_k"], g["settings"]["max_new_tokens"])
    want = {o.method: o for o in local.comparisons.compare("bo", g["prompt"], ALL_METHODS, s, g["settings"]["k"])}
    assert {m: g["output"] for m, g in page.items()} == {m: o.text for m, o in want.items() if o.error is None}
    for m, o in want.items():  # and the page shows it (or the method's own error, as in-process)
        assert " ".join((o.text if o.error is None else o.error).split()) in shown[m], (m, shown[m])


def test_a_ray_that_cannot_be_reached_is_a_clear_error_at_start(tiny_artifacts, tmp_path):
    r = subprocess.run([sys.executable, "app.py", "--artifacts", str(tiny_artifacts["artifacts"]), "--db",
                        str(tmp_path / "s.db"), "--demo-data", str(tiny_artifacts["demo"]), "--decode",
                        "ray://127.0.0.1:1"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "error: cannot reach Ray at 'ray://127.0.0.1:1'" in r.stderr


def test_rows_travel_with_the_head_by_name_and_come_back_with_the_replicas_own():
    from types import SimpleNamespace

    from personalize.methods.card.style import UserStyle
    from personalize.methods.card.config import StyleSettings
    from personalize.distributed.serve import HeadRef, pack_rows, unpack_rows
    from personalize.lm.tokens import TokenBudget
    from personalize.methods.card.steer import CardSteer
    from personalize.serving.rows import DecodeRow
    from personalize.serving.settings import DecodingSettings
    import numpy as np

    here, there = object(), object()
    row = DecodeRow("p", TokenBudget(8, 4), DecodingSettings(), "k2c1",
                    CardSteer(here, UserStyle.of(np.ones(4, np.float32)), StyleSettings(), 4))
    plain = DecodeRow("p", TokenBudget(8, 4), DecodingSettings(), "k2c1")
    sent = pack_rows(SimpleNamespace(heads={"tokens": here}), [row, plain])
    assert sent[0].steer.head == HeadRef("tokens") and sent[1] is plain and row.steer.head is here
    got = unpack_rows(SimpleNamespace(heads={"tokens": there}), sent)
    assert got[0].steer.head is there and got[0].steer.style is row.steer.style


def test_an_address_is_checked_for_a_listener_before_ray_is_asked():
    """check_reachable: a port that listens passes (IPv4, ray:// and IPv6 forms), a closed one is a ConnectionError
    naming the address at once; `auto` never reaches it (connect skips it)."""
    import socket

    from personalize.distributed.pool import check_reachable

    with socket.create_server(("127.0.0.1", 0)) as srv:
        port = srv.getsockname()[1]
        check_reachable(f"127.0.0.1:{port}")
        check_reachable(f"ray://127.0.0.1:{port}")
    with pytest.raises(ConnectionError, match=f"cannot reach Ray at 'ray://127.0.0.1:{port}'"):
        check_reachable(f"ray://127.0.0.1:{port}")  # the listener is gone
    if socket.has_ipv6:
        try:
            srv6 = socket.create_server(("::1", 0), family=socket.AF_INET6)
        except OSError:
            return  # no IPv6 loopback here
        with srv6:
            check_reachable(f"[::1]:{srv6.getsockname()[1]}")
