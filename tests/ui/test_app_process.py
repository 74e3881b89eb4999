"""app.py as a person starts it, in its own process on 127.0.0.1 over the tiny artifacts: every file it writes
lives under the folder of its --db (the database, the exports, the page's files), and its page folder is emptied
when it is stopped with SIGTERM (issue 49)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from personalize.ui.waiting import LOADING_TITLE, STUDIO_TITLE
from tools.browser import free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def instance(tiny_artifacts, tmp_path):
    """A second instance, started from another working folder with `--db elsewhere/studio.db`."""
    cwd, root, port = tmp_path / "cwd", tmp_path / "elsewhere", free_port()
    cwd.mkdir()
    log = (tmp_path / "app.log").open("w")
    args = ["--db", str(root / "studio.db"), "--port", str(port), "--artifacts", str(tiny_artifacts["artifacts"]),
            "--demo-data", str(tiny_artifacts["demo"])]
    proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), *args], cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:  # the model loading's page first, then the studio
        try:
            if httpx.get(f"{url}config", timeout=5).json().get("title") == STUDIO_TITLE:
                break
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.5)
    assert proc.poll() is None, (tmp_path / "app.log").read_text()
    yield {"proc": proc, "url": url, "cwd": cwd, "root": root}
    if proc.poll() is None:
        proc.kill()
    proc.wait(30)
    log.close()


def test_every_file_of_an_instance_lives_under_its_db_folder_and_its_page_files_go_when_it_stops(instance):
    from gradio_client import Client

    proc, url, cwd, root = instance["proc"], instance["url"], instance["cwd"], instance["root"]
    up = httpx.post(f"{url}gradio_api/upload", files={"files": ("mine.txt", b"my own words\n" * 20)}, timeout=60)
    assert up.status_code == 200 and Path(up.json()[0]).is_relative_to(root / "cache"), up.text
    status, got = Client(url, verbose=False).predict("votes", "jsonl", api_name="/export_table")
    assert f"`{root / 'exports'}" in status and Path(got).exists(), status  # its exports: beside its database
    written = {p.relative_to(root).parts[0] for p in root.rglob("*") if p.is_file()}
    assert written <= {"studio.db", "studio.db-wal", "studio.db-shm", "exports", "cache"}, written
    assert not list(cwd.rglob("*"))  # nothing in the folder it was started from (data/exports was, there)
    assert [p for p in (root / "cache").rglob("*") if p.is_file()]  # the upload, the export handed to the page

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) is not None
    assert not list((root / "cache").iterdir())  # the page's files went with the server
    assert list((root / "exports").rglob("*.jsonl"))  # the exports stay (until deleted, or Forget me)


def test_the_page_answers_before_the_model_stack_is_imported_then_becomes_the_studio(tiny_artifacts, tmp_path):
    """Issue 58, item 3: app.py imports gradio and the page's few modules only, serves the model loading's page
    (with the login, where there is one), and the studio replaces it on the same address once loaded; `make run`'s
    output says when the studio serves."""
    out = subprocess.run([sys.executable, "-c", "import sys, app; print(sorted(m for m in ('torch', 'transformers', "
                          "'peft', 'personalize.studio.facade') if m in sys.modules))"], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout  # the model stack is not imported with the page
    port, log_path = free_port(), tmp_path / "app.log"
    args = ["--db", str(tmp_path / "studio.db"), "--port", str(port), "--artifacts", str(tiny_artifacts["artifacts"]),
            "--demo-data", str(tiny_artifacts["demo"])]
    titles = []
    with log_path.open("w") as log:
        proc = subprocess.Popen([sys.executable, "-u", str(ROOT / "app.py"), *args], cwd=ROOT, stdout=log,
                                stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None and STUDIO_TITLE not in titles:
            try:
                title = httpx.get(f"http://127.0.0.1:{port}/config", timeout=5).json().get("title")
                if not titles or titles[-1] != title:
                    titles.append(title)
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.1)
        assert titles == [LOADING_TITLE, STUDIO_TITLE], (titles, log_path.read_text())
        deadline = time.monotonic() + 30
        while "studio serves: all" not in log_path.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        text = log_path.read_text()
        assert text.index("loading the model") < text.index("ready in") < text.index("studio serves: all"), text
    finally:
        proc.kill()
        proc.wait(30)
