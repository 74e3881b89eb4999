"""What the browser tests and the browser benchmarks share: the studio's Gradio app served on 127.0.0.1, a headless
Chromium, and Page (the elements a test reads and drives, by their elem_id)."""

from __future__ import annotations

import re

import shutil
import socket
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import app as studio_app  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def served(studio, **launch):
    """The studio's app on a free port of this machine (as `app.py` serves it, with its launch_options); yields its
    URL."""
    app = studio_app.build_app(studio)
    port = free_port()
    app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, css=studio_app.CSS,
               **{**studio_app.launch_options(studio), **launch})
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        app.close()


def chromium(download_dir: Path):
    """A headless Chromium (Debian's chromium and chromedriver) with its profile in download_dir."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser_bin = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_bin = shutil.which("chromedriver")
    if not browser_bin or not driver_bin:
        pytest.fail("Chromium and chromedriver are needed (apt-get install chromium chromium-driver; `make test` "
                    "installs them)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = browser_bin
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1400,1000"):
        opts.add_argument(flag)
    opts.add_argument(f"--user-data-dir={download_dir / 'profile'}")
    return webdriver.Chrome(service=Service(driver_bin), options=opts)


class Page:
    """The page as a person uses it: type, click, open a tab, wait for a text."""

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
        """The element's text once Gradio's overlay is gone: "processing | 1.2s", "queue: 1/2", or a gr.Progress
        line ("decoding your held-out items - 0.0%") over the text an earlier event left."""
        t = self.text(elem_id)
        return None if "processing |" in t or "queue:" in t or re.search(r" - \d+(\.\d+)?%", t) else t

    def until_text(self, elem_id, *needles) -> str:
        return self.wait.until(lambda d: (t := self.settled(elem_id)) is not None and any(n in t for n in needles) and t)

    def fit(self, name) -> str:
        """Fit my style for the named person; the page's new report once it says they were fitted (an earlier fit's
        report stays on the page, under a progress overlay, while the new fit runs)."""
        self.tab("Fit my style")
        before = self.text("fit-status")
        self.click("fit-button")
        fit = self.wait.until(lambda d: (t := self.settled("fit-status")) is not None and t != before
                              and (f"Fitted {name}" in t or "⚠️" in t) and t)
        assert f"Fitted {name}" in fit, fit
        return fit

    def choose_methods(self, methods):
        """Ticks exactly these methods in Compare (on the Compare tab)."""
        from selenium.webdriver.common.by import By

        for box in self.d.find_elements(By.CSS_SELECTOR, "#methods label"):
            tick = box.find_element(By.CSS_SELECTOR, "input")
            if tick.is_selected() != (box.text.strip() in methods):
                box.click()

    def shot(self, name):
        self.shots.mkdir(parents=True, exist_ok=True)
        self.d.save_screenshot(str(self.shots / f"{name}.png"))
