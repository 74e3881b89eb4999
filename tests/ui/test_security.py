"""docs/SECURITY.md, line by line: logins and their throttle, the files the server serves and takes, paths a person
types, text shown as text, and requests over the limits. The HTTP tests run the real app (app.build_app with
app.launch_options, as app.py launches it) on 127.0.0.1 over the tiny artifacts and a real SQLite file."""

from __future__ import annotations

import hmac
import json
import re
import sys
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import app as studio_app  # noqa: E402
from personalize.ui.login import Login, TooManyAttempts, parse_admins  # noqa: E402

from tools.browser import free_port, served  # noqa: E402
from conftest import tiny_studio  # noqa: E402

SECRET = "zebra-okapi-secret-phrase"  # in files outside the page's folder: no answer may ever hold it
XSS = ['<script>window.__xss=1</script>', '<img src=x onerror="window.__xss=2">']


class Clock:
    """A clock the test moves: the throttle's waits without waiting."""

    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


# ---------------------------------------------------------------- logins: constant-time check, throttle

def test_login_checks_every_password_with_compare_digest(monkeypatch):
    calls = []
    real = hmac.compare_digest
    monkeypatch.setattr(hmac, "compare_digest", lambda a, b: calls.append((a, b)) or real(a, b))
    login = Login({"ana": "pw-ana"})
    assert login("ana", "pw-ana") is True
    assert login("ana", "pw-ana ") is False and login("ana", "") is False
    assert login("nobody", "pw-ana") is False  # an unknown name is compared too (same time), and never matches
    assert len(calls) == 4
    assert "pw-ana" not in repr(login) and "ana" in repr(login)  # a log or traceback shows names, not passwords


def test_five_failures_lock_a_name_for_a_growing_delay_even_with_the_right_password():
    clock = Clock()
    login = Login({"ana": "pw", "ben": "pw2"}, clock=clock)
    for _ in range(5):
        assert login.check("ana", "guess") is False
    with pytest.raises(TooManyAttempts, match="this user name may try again in 30 s"):
        login.check("ana", "pw")  # the right password too: the lock is not an oracle
    assert login.check("ben", "pw2") is True  # another name is not locked
    clock.t += 31
    assert login.check("ana", "wrong again") is False  # the lock ended; one more failure locks twice as long
    with pytest.raises(TooManyAttempts) as e:
        login.check("ana", "pw")
    assert 59 <= e.value.seconds <= 60
    clock.t += 61
    login.check("ana", "wrong")
    with pytest.raises(TooManyAttempts) as e:
        login.check("ana", "pw")
    assert 119 <= e.value.seconds <= 120
    clock.t += 121
    assert login.check("ana", "pw") is True  # a success clears the count: four failures do not lock again
    for _ in range(4):
        assert login.check("ana", "x") is False
    assert login.check("ana", "pw") is True


def test_many_failures_over_many_names_refuse_every_login_until_the_window_passes():
    clock = Clock()
    login = Login({"ana": "pw"}, overall=20, window=60, clock=clock)
    for i in range(20):
        assert login.check(f"spray{i}", "guess") is False  # no name reaches its own limit
    with pytest.raises(TooManyAttempts, match="every login"):
        login.check("ana", "pw")
    clock.t += 61
    assert login.check("ana", "pw") is True
    assert len(login._names) == 0  # names quiet for a window are dropped: a spray does not grow memory


def test_admin_must_be_a_login(monkeypatch, tmp_path):
    assert parse_admins(["ana", "ben,ana"], ["ana", "ben", "cy"]) == ("ana", "ben")
    assert parse_admins(None, None) == ()
    with pytest.raises(SystemExit, match="needs --auth"):
        parse_admins(["ana"], None)
    with pytest.raises(SystemExit, match="eve: not among the --auth users"):
        parse_admins(["ana,eve"], ["ana"])
    # app.py builds the studio with them: logins on, the admins named
    seen = []

    def load(cfg, **_):
        seen.append(cfg)
        raise ValueError("stop here")  # an expected error: main answers 2 without a model

    from personalize.studio.facade import Studio

    monkeypatch.setattr(Studio, "load", staticmethod(load))
    args = ["--artifacts", str(tmp_path / "none"), "--db", str(tmp_path / "s.db"), "--port", str(free_port())]
    assert studio_app.main([*args, "--auth", "ana:1,ben:2", "--admin", "ben"]) == 2
    assert seen[-1].logins is True and seen[-1].admins == ("ben",)
    assert studio_app.main(args) == 2
    assert seen[-1].logins is False and seen[-1].admins == ()
    with pytest.raises(SystemExit):
        studio_app.main([*args, "--admin", "ben"])


# ---------------------------------------------------------------- the real server

@pytest.fixture(scope="module")
def studio(tiny_artifacts, tmp_path_factory):
    s = tiny_studio(tiny_artifacts, tmp_path_factory.mktemp("security"))
    yield s
    s.runtime.store.close()


@pytest.fixture(scope="module")
def server(studio):
    folder = Path(studio.runtime.cfg.db).parent
    (folder / "exports").mkdir(exist_ok=True)
    (folder / "exports" / "generations.jsonl").write_text(json.dumps({"output": SECRET}) + "\n")
    (folder / "secret.txt").write_text(f"{SECRET}\n" * 12)
    login = Login({"ana": "pw-ana", "ben": "pw-ben"})
    with served(studio, **studio_app.launch_options(studio)) as url, \
            served(studio, auth=login, **studio_app.launch_options(studio)) as auth_url:
        yield {"url": url, "auth_url": auth_url, "folder": folder, "login": login}


def upload(url: str, name: str, content: bytes, cookies=None) -> httpx.Response:
    return httpx.post(f"{url}gradio_api/upload", files={"files": (name, content)}, cookies=cookies, timeout=60)


def call(url: str, api: str, data: list) -> tuple[str, str]:
    """One API call as a script makes it: (the event's kind, its data as text)."""
    r = httpx.post(f"{url}gradio_api/call/{api}", json={"data": data}, timeout=60)
    r.raise_for_status()
    stream = httpx.get(f"{url}gradio_api/call/{api}/{r.json()['event_id']}", timeout=300).text
    events = re.findall(r"event: (\w+)\ndata: (.*)", stream)
    return next((kind, payload) for kind, payload in events if kind in ("complete", "error"))


def test_the_login_route_throttles_without_stalling_the_server(server):
    url = server["auth_url"]
    server["login"]._names.clear()
    post = lambda user, pw: httpx.post(f"{url}login", data={"username": user, "password": pw}, timeout=30)  # noqa: E731
    assert [post("ana", f"guess{i}").status_code for i in range(5)] == [400] * 5
    refused = post("ana", "pw-ana")
    assert refused.status_code == 429 and "try again in 30 s" in refused.text and refused.headers["retry-after"] == "30"
    ok = post("ben", "pw-ben")  # the other login, and the page for everyone, answer at once
    assert ok.status_code == 200 and ok.cookies
    assert httpx.get(url, timeout=10).status_code == 200
    server["login"]._names.clear()


def test_a_locked_login_sees_why_and_for_how_long_on_the_login_page(server, tmp_path):
    """Issue 49: after 5 failed logins the 429's text showed over HTTP only; Gradio's login page said nothing. In
    Chromium, the refused person now reads why and how long to wait under the page's title."""
    from selenium.webdriver.common.by import By

    from tools.browser import Page, chromium

    url, login = server["auth_url"], server["login"]
    login._names.clear()
    for i in range(5):
        assert httpx.post(f"{url}login", data={"username": "ana", "password": f"guess{i}"}).status_code == 400
    driver = chromium(tmp_path)
    try:
        page = Page(driver, tmp_path / "shots")
        driver.get(url)
        page.el("input[type=password]")
        name, password = [e for e in driver.find_elements(By.CSS_SELECTOR, "input") if e.is_displayed()][:2]
        name.send_keys("ana")
        password.send_keys("pw-ana")  # the right password: refused all the same while the name is locked
        next(b for b in driver.find_elements(By.TAG_NAME, "button") if "login" in b.text.lower()).click()
        shown = page.wait.until(lambda d: page.el("#login-refused").text)
        assert re.search(r"too many failed logins: this user name may try again in (30|[12]\d) s", shown), shown
    finally:
        driver.quit()
        login._names.clear()


def test_the_file_route_serves_the_page_folder_only(server, studio):
    url, folder = server["url"], server["folder"]
    cache = studio.runtime.cfg.page_files.resolve()
    r = upload(url, "../../../escaped.txt", b"hello from an upload")
    assert r.status_code == 200, r.text
    stored = Path(r.json()[0])
    assert stored.resolve().is_relative_to(cache) and stored.name == "escaped.txt"  # Gradio's cache is the page folder
    assert not (folder / "escaped.txt").exists() and not (folder.parent / "escaped.txt").exists()
    assert httpx.get(f"{url}gradio_api/file={stored}", timeout=30).text == "hello from an upload"
    outside = [folder / "studio.db", folder / "exports" / "generations.jsonl", folder / "secret.txt",
               Path("/etc/passwd"), f"{cache}/../secret.txt", f"{cache}/..%2Fsecret.txt", "../secret.txt",
               "data/studio.db", "data/exports", "%2Fetc%2Fpasswd"]
    for path in outside:
        r = httpx.get(f"{url}gradio_api/file={path}", timeout=30)
        assert r.status_code in (403, 404) and SECRET not in r.text and "root:" not in r.text, (path, r.status_code)
    r = httpx.get(f"{server['auth_url']}gradio_api/file={stored}", timeout=30)
    assert r.status_code in (401, 403), r.status_code  # with logins, not even the page's files without one


def test_the_database_is_never_served_even_from_a_cache_folder_that_holds_it(studio, tmp_path):
    folder = Path(studio.runtime.cfg.db).parent
    rt = studio.runtime
    cfg = rt.cfg
    rt.cfg = replace(cfg, cache_dir=str(folder))  # a careless --cache-dir: the database's own folder
    try:
        with served(studio, **studio_app.launch_options(studio)) as url:
            r = httpx.get(f"{url}gradio_api/file={folder / 'studio.db'}", timeout=30)
            assert r.status_code == 403, r.status_code
            assert httpx.get(f"{url}gradio_api/file={folder / 'secret.txt'}", timeout=30).status_code == 200  # reachable
    finally:
        rt.cfg = cfg
        studio_app.page_files(studio)  # the module's servers keep using the page folder


def test_an_upload_over_the_limit_is_refused_before_it_is_written(server, studio):
    limit = studio_app.launch_options(studio)["max_file_size"]
    assert limit == 4 * studio.runtime.cfg.max_history_chars
    before = set(studio.runtime.cfg.page_files.rglob("*"))
    r = upload(server["url"], "huge.txt", b"x" * (limit + 1))
    assert r.status_code == 413 and f"maximum allowed size of {limit} bytes" in r.text, (r.status_code, r.text)
    assert not [p for p in set(studio.runtime.cfg.page_files.rglob("*")) - before if p.name == "huge.txt"]


# ---------------------------------------------------------------- files named in a request: only the page's own

def test_a_request_naming_a_file_outside_the_page_folder_reads_nothing(server, studio):
    url, folder = server["url"], server["folder"]
    n = len(studio.runtime.store.users())
    for path in (str(folder / "secret.txt"), f"{studio.runtime.cfg.page_files}/../secret.txt", "/etc/passwd"):
        file = {"path": path, "meta": {"_type": "gradio.FileData"}, "orig_name": "h.txt"}
        kind, payload = call(url, "save_history", ["mallory", "", file, studio.runtime.task.name, None])
        assert SECRET not in payload and "root:" not in payload, payload
        assert kind == "error" or "⚠️" in payload, (kind, payload)
    assert len(studio.runtime.store.users()) == n and not any(u["name"] == "mallory" for u in studio.runtime.store.users())


def test_a_history_file_with_a_dotted_name_is_read_as_the_uploaded_file(server, studio):
    url = server["url"]
    r = upload(url, "../../secret.txt", "\n".join(f"line {i} of my own writing" for i in range(10)).encode())
    path = r.json()[0]
    file = {"path": path, "meta": {"_type": "gradio.FileData"}, "orig_name": "../../secret.txt"}
    kind, payload = call(url, "save_history", ["dotted", "", file, studio.runtime.task.name, None])
    assert kind == "complete" and "Saved" in payload and SECRET not in payload, payload
    assert [it.y for it in studio.runtime.store.items("dotted")][0] == "line 9 of my own writing"  # the newest


def test_names_that_become_paths_stay_in_their_folder(studio, tmp_path):
    from personalize.studio.population_jobs import check_name

    root = tmp_path / "artifacts"
    root.mkdir()
    for bad in ("../evil", "/tmp/evil", "a/b", "..", ".hidden", "x" * 65, "a\\b"):
        with pytest.raises(ValueError, match="letters, digits"):
            check_name(bad, root)
    # a campaign's export file is named after the campaign: any name lands in the export folder
    name = "../../" + XSS[1]
    studio.campaign_desk.create_campaign(name, studio.runtime.cfg.demo_data, limit=1)
    path, summary, _ = studio.campaign_desk.export_campaign(name, "jsonl")
    export_dir = studio.runtime.cfg.exports.resolve()
    assert path.resolve().parent == export_dir and summary.resolve().parent == export_dir, path
    from personalize.ui import campaigns

    _, handed = campaigns.export(studio, name, "jsonl")  # the page's copies: in the page folder's downloads
    downloads = studio.runtime.cfg.page_files.resolve() / "downloads"
    assert [Path(f).read_bytes() for f in handed] == [path.read_bytes(), summary.read_bytes()]
    assert all(Path(f).is_relative_to(downloads) and Path(f).name == p.name for f, p in zip(handed, (path, summary)))


# ---------------------------------------------------------------- text is shown as text, over HTTP

def _markdown_outputs(url: str, api: str) -> list[int]:
    """Which of an endpoint's outputs the page renders as Markdown (/gradio_api/info)."""
    info = httpx.get(f"{url}gradio_api/info", timeout=30).json()["named_endpoints"][f"/{api}"]["returns"]
    return [i for i, r in enumerate(info) if r["component"] == "Markdown"]


def _rendered(markdown: object) -> str:
    """The HTML a CommonMark renderer (Gradio's marked follows the same rules) makes of the page's Markdown."""
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark").render(str(markdown or ""))


def _shown(markdown: object) -> str:
    """What a browser shows of it: tags dropped, entities decoded."""
    import html

    return html.unescape(re.sub(r"<[^>]*>", "", _rendered(markdown)))


def _assert_text_only(url: str, api: str, payload: str, planted: str) -> None:
    outputs = json.loads(payload)
    shown = [outputs[i] for i in _markdown_outputs(url, api)]
    assert any(planted in _shown(m) for m in shown), (api, shown)  # the text is shown as written...
    for m in shown:  # ...and none of it is markup
        assert "<script" not in _rendered(m) and "<img" not in _rendered(m), (api, m)


def test_html_in_a_name_history_and_prompt_is_shown_as_text(server, studio):
    url = server["url"]
    name = f"eve{XSS[1]}"
    history = "\n".join(f"{XSS[i % 2]} item {i} of the planted history" for i in range(10))
    kind, payload = call(url, "save_history", [name, history, None, studio.runtime.task.name, None])
    assert kind == "complete", payload
    _assert_text_only(url, "save_history", payload, XSS[1])
    kind, payload = call(url, "compare", [name, f"{XSS[0]} write this", True, None, ["base"], 1.0, 50, 4])
    assert kind == "complete", payload
    _assert_text_only(url, "compare", payload, XSS[0])


# ---------------------------------------------------------------- requests over the limits

def test_requests_over_the_limits_are_refused_with_the_limit(server, studio):
    url, cfg = server["url"], studio.runtime.cfg
    kind, payload = call(url, "save_history", ["big", "y" * (cfg.max_history_chars + 1), None, studio.runtime.task.name, None])
    assert f"the limit is {cfg.max_history_chars:,}" in _shown(json.loads(payload)[0]), payload
    assert not any(u["name"] == "big" for u in studio.runtime.store.users())
    studio.save_from("small", "\n".join(f"a short line {i}" for i in range(8)), None, studio.runtime.task.name, None)
    kind, payload = call(url, "compare", ["small", "p" * (cfg.max_prompt_chars + 1), True, None, ["base"], 1.0, 50, 4])
    assert f"the limit is {cfg.max_prompt_chars:,}" in _shown(json.loads(payload)[0]), payload
