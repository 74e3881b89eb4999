"""The real app: a Gradio server on 127.0.0.1 over tiny artifacts and a real SQLite file, driven over HTTP
(concurrent raters, bad input) and in headless Chromium (the whole path a person takes).

STUDIO_ARTIFACTS=<folder> runs the browser test on other artifacts (the README's screenshots come from the
demo build); SCREENSHOTS=<folder> keeps the screenshots there.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import app as studio_app  # noqa: E402
from personalize.studio import Studio, StudioConfig  # noqa: E402

HISTORY = "\n".join(f"omg the {w} was SO good today!!! 🔥🔥" for w in
                    ["coffee", "train", "concert", "pizza", "run", "book", "match", "movie", "beach", "show"])


# Two people who write differently (issue 13): terse lowercase lines, with two pasted twice, and formal sentences.
TERSE_LINES = ["fixed it", "tests pass now", "bump deps", "typo", "ok merged", "rm old script", "more logging",
               "wip parser", "fix ci again", "cleanup"]
TERSE_HISTORY = "\n".join(TERSE_LINES + TERSE_LINES[:2])
FORMAL_HISTORY = "\n".join([
    "This release corrects the handling of malformed configuration files.",
    "We have updated the documentation to describe the new command-line options.",
    "The build system now detects the compiler version before compiling the extensions.",
    "Furthermore, the test suite has been extended to cover the parser's error paths.",
    "Unfortunately, the previous change introduced a regression on big-endian platforms.",
    "The maintainers would like to thank all contributors for their careful reviews.",
    "Consequently, the default timeout has been increased to thirty seconds.",
    "Please note that the deprecated interface will be removed in the next major version.",
    "The installation instructions have been revised for clarity and completeness.",
    "In addition, several memory leaks in the networking module have been resolved.",
])
TWO_PEOPLE_PROMPT = "Fix build failure on arm64 with the new toolchain."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tiny_artifacts, tmp_path_factory):
    art = Path(os.environ.get("STUDIO_ARTIFACTS") or tiny_artifacts["artifacts"])
    demo = Path(os.environ.get("STUDIO_DEMO") or tiny_artifacts["demo"])
    folder = tmp_path_factory.mktemp("app")
    studio = Studio.load(StudioConfig(artifacts=str(art), db=str(folder / "studio.db"), demo_data=str(demo),
                                      export_dir=str(folder / "exports")))
    app = studio_app.build_app(studio)
    port = free_port()
    app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, css=studio_app.CSS)
    yield {"url": f"http://127.0.0.1:{port}/", "studio": studio, "folder": folder}
    app.close()
    studio.store.close()


def client(url):
    from gradio_client import Client

    return Client(url, verbose=False)


# ---------------------------------------------------------------- over HTTP

def test_concurrent_raters_lose_no_vote(server):
    studio = server["studio"]
    c = client(server["url"])
    msg, *_ = c.predict("rater-pool", HISTORY, None, "tweets", None, api_name="/save_history")
    assert "Saved **10** items" in msg
    n0 = len(studio.store.ratings())
    errors, stale = [], []

    def rater(i):
        try:
            ci = client(server["url"])  # its own session, as another browser would be
            out = ci.predict("rater-pool", f"r{i}", f"we won game {i}", ["base", "cluster"], "", True, 1.0, 50, 4,
                             api_name="/new_pair")
            assert "which output" in out[0], out[0]
            first = ci.predict(f"r{i}", api_name="/vote_tie")  # the pair id is session state: one output
            again = ci.predict(f"r{i}", api_name="/vote_a")  # a double click: the pair is gone
            assert "stored" in first, first
            stale.append("already rated" in again)
        except Exception as e:  # reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=rater, args=(i,)) for i in range(6)]
    [t.start() for t in threads]
    [t.join(timeout=600) for t in threads]
    assert not errors, errors
    assert len(studio.store.ratings()) - n0 == 6 and all(stale) and len(stale) == 6
    rows = [r for r in studio.store.ratings() if r["user"] == "rater-pool"]
    assert {r["rater"] for r in rows} == {f"r{i}" for i in range(6)}
    assert all(r["settings"]["alpha"] == 1.0 and r["output_a"] is not None for r in rows)


def test_bad_input_is_answered_and_nothing_is_lost(server, tmp_path):
    studio = server["studio"]
    c = client(server["url"])
    c.predict("keeper", HISTORY, None, "tweets", None, api_name="/save_history")
    before = [s.y for s in studio.store.items("keeper")]
    cases = {"empty": ("", None), "huge": ("x" * (5 * 1024 * 1024), None)}
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{broken\n')
    (tmp_path / "bin.txt").write_bytes(b"\x00\x01\x02\x03binary\xff")
    from gradio_client import handle_file

    cases |= {"malformed": ("", handle_file(str(tmp_path / "bad.jsonl"))),
              "binary": ("", handle_file(str(tmp_path / "bin.txt")))}
    expected = {"empty": "empty", "huge": "limit", "malformed": "not valid JSON", "binary": "binary"}
    for case, (text, file) in cases.items():
        msg = c.predict("keeper", text, file, "tweets", None, api_name="/save_history")[0]
        assert msg.startswith("⚠️") and expected[case] in msg, (case, msg)
    assert [s.y for s in studio.store.items("keeper")] == before  # the stored history is untouched

    status = c.predict("keeper", "   ", True, None, ["base", "card"], 1.0, 50, 4, api_name="/compare")[0]
    assert "empty" in status
    status = c.predict("", "hello", True, None, ["base"], 1.0, 50, 4, api_name="/compare")[0]
    assert "user name" in status
    vote = c.predict("r", api_name="/vote_a")  # no pair drawn in this session
    assert "already rated" in vote or "no longer open" in vote


def test_sharing_beyond_loopback_requires_auth():
    r = subprocess.run([sys.executable, str(ROOT / "app.py"), "--host", "0.0.0.0"], capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    assert r.returncode == 2 and "--auth" in r.stderr
    assert studio_app._loopback("127.0.0.1") and studio_app._loopback("localhost") and not studio_app._loopback("0.0.0.0")
    assert studio_app.parse_auth("ann:pw") == ("ann", "pw")
    with pytest.raises(SystemExit):
        studio_app.parse_auth("no-password")


# ---------------------------------------------------------------- in a browser

def _driver(download_dir: Path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_bin = shutil.which("chromedriver")
    if not chromium or not driver_bin:
        pytest.fail("Chromium and chromedriver are needed (apt-get install chromium chromium-driver; `make test` "
                    "installs them)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1400,1000"):
        opts.add_argument(flag)
    opts.add_argument(f"--user-data-dir={download_dir / 'profile'}")
    return webdriver.Chrome(service=Service(driver_bin), options=opts)


class Page:
    def __init__(self, driver, shots: Path):
        from selenium.webdriver.support.ui import WebDriverWait

        self.d, self.shots, self.wait = driver, shots, WebDriverWait(driver, 300, poll_frequency=0.3)

    def el(self, css):
        from selenium.webdriver.common.by import By

        return self.wait.until(lambda d: d.find_element(By.CSS_SELECTOR, css))

    def type(self, elem_id, text):
        box = self.el(f"#{elem_id} textarea, #{elem_id} input")
        box.clear()
        if len(text) > 200:  # send_keys is slow for long pastes
            self.d.execute_script("arguments[0].value = arguments[1];"
                                  "arguments[0].dispatchEvent(new Event('input', {bubbles: true}));", box, text)
        else:
            box.send_keys(text)

    def click(self, elem_id):
        b = self.el(f"#{elem_id}")
        self.d.execute_script("arguments[0].scrollIntoView({block: 'center'});", b)
        b.click()

    def tab(self, label):
        from selenium.webdriver.common.by import By

        t = self.wait.until(lambda d: d.find_element(By.XPATH, f"//button[@role='tab' and contains(., '{label}')]"))
        t.click()

    def text(self, elem_id) -> str:
        return self.el(f"#{elem_id}").text

    def settled(self, elem_id) -> str | None:
        """The element's text once Gradio's "processing | 1.2s" / "queue: 1/2" overlay is gone."""
        t = self.text(elem_id)
        return None if "processing |" in t or "queue:" in t else t

    def until_text(self, elem_id, *needles) -> str:
        return self.wait.until(lambda d: (t := self.settled(elem_id)) is not None and any(n in t for n in needles) and t)

    def shot(self, name):
        self.shots.mkdir(parents=True, exist_ok=True)
        self.d.save_screenshot(str(self.shots / f"{name}.png"))


def test_browser_path_paste_cluster_fit_compare_vote_leaderboard_export(server, tmp_path):
    shots = Path(os.environ.get("SCREENSHOTS") or tmp_path / "shots")
    driver = _driver(tmp_path)
    try:
        p = Page(driver, shots)
        driver.get(server["url"])
        p.type("user-name", "ana")
        p.type("history", HISTORY)
        p.click("save-history")
        assert "Saved 10 items for ana" in p.until_text("writing-status", "Saved", "⚠️")
        p.shot("1-my-writing")

        p.tab("My cluster")
        status = p.until_text("cluster-status", "cluster")
        assert "ana is in cluster" in status
        p.el("#cluster-plot .js-plotly-plot")
        p.shot("2-my-cluster")

        p.tab("Fit my style")
        p.click("fit-button")
        fit = p.until_text("fit-status", "Fitted", "⚠️")
        assert "Fitted ana" in fit and "bytes" in fit.split("Stored:")[1]
        p.shot("3-fit")

        p.tab("Compare")
        p.type("prompt", "I finally finished the marathon.")
        p.click("compare-button")
        done = p.until_text("compare-status", "Done", "⚠️")
        assert done.startswith("Done"), done
        for m in ("base", "cluster", "card", "exact", "rag", "cope"):
            assert "tok/s" in p.text(f"out-{m}") or "⚠️" in p.text(f"out-{m}"), m
        assert "attributes:" in p.text("out-exact")
        p.shot("4-compare")

        p.tab("Why")
        p.click("why-button")
        assert "tokens" in p.until_text("why-status", "changed", "⚠️")
        p.shot("5-why")

        p.tab("Leaderboard")
        before = p.until_text("lb-status", "votes", "No votes")

        p.tab("Rate")
        p.type("rater", "tester")
        p.click("new-pair")
        p.until_text("vote-status", "which output", "⚠️")
        assert "A" in p.text("out-a") and "B" in p.text("out-b")
        p.shot("6-rate")
        p.click("vote-a")
        voted = p.until_text("vote-status", "stored", "⚠️")
        assert "A was" in voted and "B was" in voted  # names revealed only after the vote
        p.click("vote-b")
        assert "already rated" in p.until_text("vote-status", "already rated", "Vote #999999")

        p.tab("Leaderboard")
        p.click("lb-refresh")
        n_votes = len(server["studio"].store.ratings())
        after = p.wait.until(lambda d: (t := p.settled("lb-status")) and t != before and " between " in t and t)
        assert f"{n_votes} vote{'' if n_votes == 1 else 's'} between" in after
        p.shot("7-leaderboard")

        p.tab("Export")
        p.click("export-votes-jsonl")
        exported = p.until_text("export-status", "Exported", "⚠️")
        assert f"Exported votes ({n_votes} rows)" in exported
        p.shot("8-export")

        p.tab("Explore")
        p.type("alphas", "0, 2")
        p.click("explore-button")
        res = p.until_text("explore-status", "Held out", "⚠️")
        assert "λ fitted on" in res, res
        p.el("#explore-alpha .js-plotly-plot")
        p.shot("9-explore")
    finally:
        driver.quit()


def test_switching_to_a_task_without_a_build_says_how_to_build_it(server):
    studio = server["studio"]
    served = studio.engine.artifacts_id
    missing = next(t for t, builds in studio.builds().items() if not builds)
    msg = client(server["url"]).predict(missing, api_name="/switch_task")[0]
    assert "personalize build --data" in msg and f"--out {studio.artifacts_root / missing}" in msg, msg
    assert studio.engine.artifacts_id == served  # still serving the build it had


def test_browser_two_people_get_their_own_card_outputs_and_nothing_loops(server, tmp_path):
    """A new person's walkthrough, twice: paste, save (duplicates reported), K from the keyboard with their own
    row marked, fit (the page says whether the vector helps), Compare; the two people's CARD outputs differ and
    no output ends in a loop."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    from personalize.metrics import looping

    studio = server["studio"]
    shots = Path(os.environ.get("SCREENSHOTS") or tmp_path / "shots")
    driver = _driver(tmp_path)
    methods = ("base", "cluster", "card")
    try:
        p = Page(driver, shots)
        driver.get(server["url"])
        p.tab("Compare")  # once per page: base, cluster and card only, and room for a loop to show
        for box in driver.find_elements(By.CSS_SELECTOR, "#methods label"):
            tick = box.find_element(By.CSS_SELECTOR, "input")
            if tick.is_selected() != (box.text.strip() in methods):
                box.click()
        p.type("max-tokens", "32")
        p.el("#max-tokens input").send_keys(Keys.TAB)
        outputs = {}
        for name, history, n_dup in (("tess", TERSE_HISTORY, 2), ("fred", FORMAL_HISTORY, 0)):
            p.tab("My writing")
            p.type("user-name", name)
            p.until_text("writing-status", f"New user {name}")
            assert p.el("#history textarea").get_attribute("value") == ""  # not the previous person's text
            p.type("history", history)
            p.click("save-history")
            saved = p.until_text("writing-status", "Saved", "⚠️")
            assert f"Saved 10 items for {name}" in saved, saved
            assert (f"({n_dup} duplicate items dropped)" in saved) == bool(n_dup), saved
            header = [th.text.strip().lower() for th in driver.find_elements(By.CSS_SELECTOR, "#items th")]
            assert sum(h == "id" for h in header) == 1 and "#" not in header, header  # one item id column

            p.tab("My cluster")
            status = p.until_text("cluster-status", f"{name} is in cluster")
            k0 = studio.snap_k(None)
            step, there, back = (1, Keys.ARROW_RIGHT, Keys.ARROW_LEFT) if k0 < max(studio.ks) else \
                (-1, Keys.ARROW_LEFT, Keys.ARROW_RIGHT)
            slider = p.el("#k-slider input[type=range]")
            slider.send_keys(there)  # one arrow key (2 -> 3 on the tiny build) moves on to the next built K (4)
            k1 = studio.snap_k(k0 + step, previous=k0)
            assert k1 != k0
            status = p.until_text("cluster-status", f"of K = {k1}.")
            assert status.count("◀ you") == 1, status  # the person's own row is marked
            slider.send_keys(back)
            p.until_text("cluster-status", f"of K = {studio.snap_k(k1 - step, previous=k1)}.")
            p.shot(f"two-people-{name}-cluster")

            p.tab("Fit my style")
            p.click("fit-button")
            fit = p.until_text("fit-status", f"Fitted {name}", "⚠️")
            assert f"Fitted {name}" in fit, fit
            assert any(s in fit for s in ("Your vector helps", "does not beat your cluster's model", "Too few items")), fit

            p.tab("Compare")
            p.type("prompt", TWO_PEOPLE_PROMPT)
            p.click("compare-button")
            done = p.until_text("compare-status", f"Done: {len(methods)} methods for {name}", "⚠️")
            assert done.startswith("Done"), done
            p.shot(f"two-people-{name}-compare")
            outputs[name] = {}
            for m in methods:
                assert "tok/s" in p.text(f"out-{m}"), (m, p.text(f"out-{m}"))
                (g,) = studio.store.generations(user=name, method=m, limit=1)
                assert g["settings"]["max_new_tokens"] == 32 and TWO_PEOPLE_PROMPT in g["prompt"]
                outputs[name][m] = g["output"]
        loops = {(n, m): t for n, outs in outputs.items() for m, t in outs.items() if looping(t)}
        assert not loops, loops
        assert outputs["tess"]["card"] != outputs["fred"]["card"], outputs
    finally:
        driver.quit()
