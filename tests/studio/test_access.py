"""A person belongs to whoever made them (personalize/schema.py's Access): with logins, another login can neither see, open,
change, rate as, export nor forget them; without logins a Save never replaces a history silently, and a replaced
history comes back. Checked in the library (a real SQLite file, the tiny models) and over HTTP with two logins on a
real Gradio server, down to the bytes of the database files, the exports and the page's file cache after Forget me."""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from pathlib import Path

import pytest

from personalize.schema import acting_as
from personalize.humaneval.table_export import export_table
from personalize.store import Store, StoreError
from personalize.studio.facade import Studio, StudioConfig
from personalize.studio.histories import ReplaceAsk

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

ANA = [f"ana writes about the {w} of the harbour at dawn" for w in ("gulls", "ropes", "tides", "boats", "nets", "fog")]
BEN = [f"ben logs the {w} numbers every single evening" for w in ("train", "sensor", "meter", "pump", "valve", "fan")]


def logins_studio(tiny_artifacts, folder: Path, admins=("root",)) -> Studio:
    return Studio.load(StudioConfig(own_adapters=False, artifacts=str(tiny_artifacts["artifacts"]), db=str(folder / "studio.db"),
                                    demo_data=str(tiny_artifacts["demo"]), export_dir=str(folder / "exports"),
                                    logins=True, admins=admins))


@pytest.fixture(scope="module")
def studio(tiny_artifacts, tmp_path_factory):
    s = logins_studio(tiny_artifacts, tmp_path_factory.mktemp("access"))
    yield s
    s.runtime.store.close()


def test_a_login_reaches_only_the_people_it_made(studio):
    task = studio.runtime.task.name
    with acting_as("ana"):
        studio.save_from("ana-notes", "\n".join(ANA), None, task)
        studio.comparisons.compare("ana-notes", "a prompt of ana's", ["base"], studio.runtime.settings(max_new_tokens=3)).__next__()
    with acting_as("ben"):
        studio.save_from("ben-log", "\n".join(BEN), None, task)
        assert studio.histories.user_names() == ["ben-log"]  # ana's person is not listed...
        for reach in (lambda: studio.histories.open_user("ana-notes"), lambda: studio.runtime.store.items("ana-notes"),
                      lambda: studio.fits.fit("ana-notes"), lambda: studio.fits.versions("ana-notes"),
                      lambda: studio.histories.update_item("ana-notes", 1, "mine now"),
                      lambda: studio.own_data.forget("ana-notes", True), lambda: studio.own_data.style_key("ana-notes"),
                      lambda: next(iter(studio.comparisons.compare("ana-notes", "p", ["base"], studio.runtime.settings())))):
            with pytest.raises(StoreError, match="is taken"):  # ...nor reached: to ben her name is taken
                reach()
        assert studio.histories.item_rows("ana-notes") == [] and studio.histories.replaced_choices("ana-notes") == []
        typed = studio.histories.switch_user("ana-notes", None)  # the page says what Save will, not "New user"
        assert typed.rows == [] and "is taken" in typed.message and "New user" not in typed.message
        assert "New user" in studio.histories.switch_user("nobody-yet", None).message
        with pytest.raises(StoreError, match="taken"):  # a Save under her name is refused, whatever ben confirms
            studio.save_from("ana-notes", "\n".join(BEN), None, task, replace=True)
        assert not any("ana" in json.dumps(r) for r in studio.runtime.store.generations())
    with acting_as("ana"):
        assert [s.y for s in studio.runtime.store.items("ana-notes")] == ANA[::-1]  # untouched
        assert studio.histories.user_names() == ["ana-notes"]
    with acting_as("root"):  # an admin sees everyone
        assert studio.histories.user_names() == ["ana-notes", "ben-log"]
    assert studio.histories.user_names() == ["ana-notes", "ben-log"]  # so does work no login runs (the CLI, jobs)


def test_a_job_checks_whose_person_it_is_and_runs_as_its_starter(studio, monkeypatch):
    """Issue 58: ben's *Train my own adapter* on ana's person answered "training (0/? steps)" and trained over her,
    since the job's thread ran as no one. Now starting any job for her is taken and queues nothing, her job is not
    shown to him, and a job runs as the login that started it (background work too)."""
    from personalize.schema import current_login
    from personalize.studio.first_use_jobs import OWN

    jobs, rt = studio.first_use_jobs, studio.runtime
    with acting_as("ben"):
        for start in (lambda: jobs.start_own("ana-notes"), lambda: jobs.start_first_use("ana-notes", "exact"),
                      lambda: jobs.wait_first_use(" ana-notes ", "oppu")):
            with pytest.raises(StoreError, match="is taken"):
                start()
        with pytest.raises(StoreError, match="is taken"):
            studio.need_user("ana-notes")
    assert not [key for key in rt.jobs if key[0] == "ana-notes"]

    seen = []  # (login, reaches ben's person) where the training runs
    monkeypatch.setattr(studio.served.own, "train", lambda name, *a, **kw: seen.append(
        (current_login(), rt.store.may_reach("ben-log"))))
    monkeypatch.setattr(jobs, "after_own", [])
    with acting_as("ana"):
        job = jobs.start_own("ana-notes")
        assert rt.background.submit(current_login).result(30) == "ana"
    with acting_as("ben"):
        assert jobs.own_job("ana-notes") is None and jobs.base_words("ana-notes", False).startswith("CARD decodes")
    deadline = time.time() + 120
    while job["state"] in ("queued", "running") and time.time() < deadline:
        time.sleep(0.1)
    assert job["state"] == "done" and seen == [("ana", False)], (job, seen)
    del rt.jobs[("ana-notes", OWN)]


def test_what_changes_the_studio_for_everyone_is_an_admins(studio, tiny_artifacts):
    from personalize.data import TASKS

    other = next(t for t in TASKS if t != studio.runtime.task.name)
    with acting_as("ben"):
        for change in (lambda: studio.served_builds.switch_task(other), lambda: studio.served_builds.serve_build(str(studio.runtime.engine.folder)),
                       lambda: studio.campaign_desk.create_campaign("c", tiny_artifacts["demo"], limit=1),
                       lambda: studio.population_jobs.start_population_build("table", "p", "people.csv"),
                       lambda: studio.campaign_desk.set_campaign_status("c", "closed")):
            with pytest.raises(ValueError, match="only an admin"):
                change()
    with acting_as("root"):
        studio.campaign_desk.create_campaign("c", tiny_artifacts["demo"], limit=1, methods=("base", "cluster"))
    with acting_as("ben"):  # a campaign's people are read by every rater: judging them is the campaign's purpose
        person = next(u["name"] for u in studio.runtime.store.users(campaign=True) if u["name"].startswith("campaign:"))
        assert studio.runtime.store.items(person)


def test_exports_hold_only_the_logins_own_rows(studio, tmp_path):
    with acting_as("ben"):
        path, n = export_table(studio.runtime.store, "generations", "jsonl", tmp_path / "ben")
        assert "ana" not in path.read_text()
    with acting_as("ana"):
        path, n = export_table(studio.runtime.store, "generations", "jsonl", tmp_path / "ana")
        assert n >= 1 and "a prompt of ana's" in path.read_text()
        assert "ana" in str(studio.campaign_desk._export_folder())  # each login exports into its own folder


def test_save_asks_before_replacing_and_the_replaced_history_comes_back(tiny_artifacts, tmp_path):
    from conftest import tiny_studio

    s = tiny_studio(tiny_artifacts, tmp_path)
    try:
        task = s.runtime.task.name
        s.save_from("kim", "\n".join(ANA), None, task, replace=False)  # a new name: saved at once
        with pytest.raises(ReplaceAsk, match="already has 6 stored items"):
            s.save_from("kim", "\n".join(BEN[:4]), None, task, replace=False)
        assert [x.y for x in s.runtime.store.items("kim")] == ANA[::-1]  # asked, nothing replaced
        s.save_from("kim", "\n".join(BEN[:4]), None, task, replace=True)
        assert [x.y for x in s.runtime.store.items("kim")] == BEN[:4][::-1]
        (label, rid), = s.histories.replaced_choices("kim")
        assert "6 items" in label
        assert "Restored 6 items" in s.histories.restore_history("kim", rid)
        assert [x.y for x in s.runtime.store.items("kim")] == ANA[::-1]
        (label, _), = s.histories.replaced_choices("kim")  # the history it replaced is kept in turn
        assert "4 items" in label
        s.own_data.forget("kim", True)
        assert b"harbour" not in Path(s.runtime.cfg.db).read_bytes()  # the replaced histories go with Forget me
    finally:
        s.runtime.store.close()


def test_an_older_database_gets_owners(tmp_path):
    db = tmp_path / "old.db"
    con = sqlite3.connect(db)
    con.executescript("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
                      "INSERT INTO meta VALUES ('schema_version', '4');"
                      "CREATE TABLE users (name TEXT PRIMARY KEY, task TEXT NOT NULL, created TEXT NOT NULL, "
                      "updated TEXT NOT NULL); INSERT INTO users VALUES ('old', 'tweets', 't', 't');")
    con.commit()
    con.close()
    store = Store(db)
    assert store.users()[0]["owner"] is None  # made before logins: no login's (an admin reaches them)
    store.close()


# ---------------------------------------------------------------- over HTTP, two logins


@pytest.fixture(scope="module")
def two_logins(tiny_artifacts, tmp_path_factory):
    from tools.browser import served

    folder = tmp_path_factory.mktemp("two-logins")
    s = logins_studio(tiny_artifacts, folder, admins=())
    with served(s, auth=[("ana", "pa"), ("ben", "pb")]) as url:
        yield {"studio": s, "url": url, "folder": folder}
    s.runtime.store.close()


def test_two_logins_over_http(two_logins):
    """The issue's check: ben's Save under ana's person's name leaves her history; ben's export holds none of
    hers, ana's holds hers; after ana's Forget me no byte of her texts is in the database files, the exports or
    the page's file cache (the link she was given answers 404), and ben's rows are all there."""
    import httpx
    from gradio_client import Client

    studio, url, folder = two_logins["studio"], two_logins["url"], two_logins["folder"]
    task = studio.runtime.task.name
    ana, ben = Client(url, verbose=False, auth=("ana", "pa")), Client(url, verbose=False, auth=("ben", "pb"))
    assert "Saved" in ana.predict("harbour", "\n".join(ANA), None, task, None, api_name="/save_history")[0]
    ana.predict("harbour", "the harbour prompt of ana", True, None, ["base"], 1.0, 50, 4, api_name="/compare")
    assert "Saved" in ben.predict("ben-log", "\n".join(BEN), None, task, None, api_name="/save_history")[0]
    ben.predict("ben-log", "the meter prompt of ben", True, None, ["base"], 1.0, 50, 4, api_name="/compare")

    msg = ben.predict("harbour", "\n".join(BEN), None, task, None, api_name="/save_history")[0]
    msg2 = ben.predict("harbour", "\n".join(BEN), None, task, None, api_name="/save_history")[0]  # "confirmed"
    assert "taken" in msg and "taken" in msg2, (msg, msg2)
    assert [s.y for s in studio.runtime.store.items("harbour")] == ANA[::-1]
    assert "taken" in ben.predict("harbour", True, api_name="/forget")[0]
    ben_cookies = httpx.post(f"{url}login", data={"username": "ben", "password": "pb"}).cookies
    assert "harbour" not in httpx.get(f"{url}config", cookies=ben_cookies).text  # the page itself names no one

    status, ben_file = ben.predict("generations", "jsonl", api_name="/export_table")
    ben_rows = Path(ben_file).read_text()
    assert "meter prompt of ben" in ben_rows and "harbour" not in ben_rows, status
    status, ana_file = ana.predict("generations", "jsonl", api_name="/export_table")
    assert "harbour prompt of ana" in Path(ana_file).read_text() and "meter" not in Path(ana_file).read_text()
    (served_file,) = [f for f in studio.runtime.cfg.page_files.rglob("generations.jsonl") if "harbour" in f.read_text()]
    link = f"{url}gradio_api/file={served_file}"
    cookies = httpx.post(f"{url}login", data={"username": "ana", "password": "pa"}).cookies
    assert httpx.get(link, cookies=cookies).status_code == 200  # her download, before

    assert "Forgot" in ana.predict("harbour", True, api_name="/forget")[0]
    needles = [t.encode() for t in ANA] + [b"harbour prompt of ana", b"harbour"]
    for f in [folder / "studio.db", folder / "studio.db-wal", *studio.runtime.cfg.exports.rglob("*"),
              *studio.runtime.cfg.page_files.rglob("*")]:
        if f.is_file():
            data = f.read_bytes()
            assert not any(n in data for n in needles), f
    gone = httpx.get(link, cookies=cookies)  # the link she was given serves nothing: Gradio answers a file that is
    assert gone.status_code in (403, 404) and b"harbour" not in gone.content  # not there 403, as one not allowed
    with acting_as("ben"):
        assert [s.y for s in studio.runtime.store.items("ben-log")] == BEN[::-1]
        assert any("meter prompt of ben" in g["prompt"] for g in studio.runtime.store.generations())


def _cookies(url: str, user: str, password: str):
    import httpx

    return httpx.post(f"{url}login", data={"username": user, "password": password}).cookies


def test_a_download_link_serves_only_the_login_it_was_handed_to(two_logins):
    """Issue 49: the link of ana's export, fetched with ben's own session cookie, answered 200 with her rows (the
    file route checked that someone was logged in, not who). Now it answers ben 403 and still serves ana."""
    import httpx
    from gradio_client import Client

    studio, url = two_logins["studio"], two_logins["url"]
    with acting_as("ana"):
        studio.save_from("ana-diary", "\n".join(ANA), None, studio.runtime.task.name)
        next(iter(studio.comparisons.compare("ana-diary", "the diary prompt of ana", ["base"],
                                          studio.runtime.settings(max_new_tokens=3))))
    ana = Client(url, verbose=False, auth=("ana", "pa"))
    _, got = ana.predict("generations", "jsonl", api_name="/export_table")
    assert "diary prompt of ana" in Path(got).read_text()  # her client fetched it through the file route
    (handed,) = [f for f in studio.runtime.cfg.page_files.rglob("generations.jsonl")
                 if "diary prompt of ana" in f.read_text()]
    link = f"{url}gradio_api/file={handed}"
    assert httpx.get(link, cookies=_cookies(url, "ana", "pa")).status_code == 200
    for path in (link, f"{url}gradio_api/file={handed.parent}/../{handed.parent.name}/{handed.name}",
                 f"{url}gradio_api/file/{str(handed).lstrip('/')}"):
        theirs = httpx.get(path, cookies=_cookies(url, "ben", "pb"))
        assert theirs.status_code == 403 and b"diary" not in theirs.content, (path, theirs.status_code)


def test_a_name_another_login_holds_is_taken_on_every_tab(two_logins):
    """Issue 49: to ben, ana's person was "taken" on My writing and "unknown user" on the other tabs; one wording
    now, on every tab that acts for a person."""
    from gradio_client import Client

    studio, url = two_logins["studio"], two_logins["url"]
    with acting_as("ana"):
        studio.save_from("ana-sketches", "\n".join(ANA), None, studio.runtime.task.name)
    ben = Client(url, verbose=False, auth=("ben", "pb"))
    said = {
        "save_history": ben.predict("ana-sketches", "\n".join(BEN), None, studio.runtime.task.name, None,
                                    api_name="/save_history")[0],
        "cluster": ben.predict("ana-sketches", 2, api_name="/cluster")[0],
        "fit": ben.predict("ana-sketches", api_name="/fit")[0],
        "compare": ben.predict("ana-sketches", "a prompt", True, None, ["base"], 1.0, 50, 4, api_name="/compare")[0],
        "new_pair": ben.predict("ana-sketches", "ben", "a prompt", ["base", "cluster"], "", True, 1.0, 50, 4,
                                api_name="/new_pair")[0],
        "forget": ben.predict("ana-sketches", True, api_name="/forget")[0],
    }
    for tab, line in said.items():
        assert "is taken" in line and "unknown" not in line, (tab, line)
    with acting_as("ana"):
        assert [s.y for s in studio.runtime.store.items("ana-sketches")] == ANA[::-1]


# ---------------------------------------------------------------- every route, as the other login

NAME_BOXES = ("user-name", "stored-users")  # where the page takes a person's name: the user box, the stored picker
# Views that answer a name they cannot reach with nothing (no status line of their own): the versions table, the
# item picked as Compare's reference, the tabs emptied when the name changes. Any other route must say "taken".
QUIET = {"version_rows", "version_rows_1", "pick_item", "switched"}


def name_routes(config: dict) -> list[dict]:
    """Every event of the page that takes a person's name, read from the server's own config: a route added later
    is pressed too."""
    boxes = {c["id"] for c in config["components"] if c.get("props", {}).get("elem_id") in NAME_BOXES}
    return [d for d in config["dependencies"] if boxes & set(d["inputs"])]


def route_inputs(route: dict, config: dict, name: str, values: dict) -> list:
    """The route's inputs as a client sends them (State left out: the server keeps it): the person's name in its
    name box (the user box when it has both), `values` by elem_id, else the component's own value."""
    comps = {c["id"]: c for c in config["components"]}
    given = [comps[i] for i in route["inputs"] if comps[i]["type"] != "state"]
    box = next(c["id"] for c in given if c["props"].get("elem_id") in NAME_BOXES)
    return [name if c["id"] == box else values.get(c["props"].get("elem_id"), c["props"].get("value")) for c in given]


def footprint(studio, name: str) -> dict:
    """All the studio keeps of a person, read as no one (who sees everyone) once the background work queued so far
    is done: their rows in every table (versions, the current style, votes, generations, blobs...), the ratings
    about them, their jobs, the own adapters on disk and every file under the data root that quotes them."""
    from personalize.schema import USER_TABLES

    store, rt = studio.runtime.store, studio.runtime
    for queue in (rt.first_use, rt.background):
        queue.submit(lambda: None).result(300)
    rows = {t: store.query(f"SELECT * FROM {t} WHERE user = ?", [name]) for t in (*USER_TABLES, "ratings")}
    rows["users"] = store.query("SELECT * FROM users WHERE name = ?", [name])
    root = Path(rt.cfg.db).parent
    own = sorted((str(p), p.stat().st_mtime_ns) for p in (root / "oppu").rglob("*") if p.is_file())
    quoting = sorted((str(p), p.stat().st_size) for p in root.rglob("*")
                     if p.is_file() and not p.name.startswith("studio.db") and name.encode() in p.read_bytes())
    jobs = {k: dict(v) for k, v in rt.jobs.items() if k[0] == name}
    return {"rows": rows, "own adapters": own, "files": quoting, "jobs": jobs}


def test_every_route_of_every_tab_refuses_another_logins_person(two_logins):
    """Issue 58: every tab but Fit's *Train my own adapter* said "taken" to ben for ana's person; that button
    answered "training (0/? steps)" and, minutes later, she had a style version made over an adapter he started.
    Now every route of the page that takes a person's name (read from the server's config), called by ben with her
    person's name, says taken, and nothing of hers changes: rows, versions, jobs, own adapters, files."""
    from gradio_client import Client
    import httpx

    studio, url = two_logins["studio"], two_logins["url"]
    task, her, his = studio.runtime.task.name, "ana-quay", "ben-quay"
    with acting_as("ana"):
        studio.save_from(her, "\n".join(ANA[:4]), None, task)
        studio.save_from(her, "\n".join(ANA), None, task, replace=True)
        studio.histories.rewrites.result()
        studio.fits.fit(her)
        next(iter(studio.comparisons.compare(her, "the quay prompt of ana", ["base"],
                                             studio.runtime.settings(max_new_tokens=3))))
        version = studio.fits.versions(her)[0]["version"]
        assert studio.histories.replaced_choices(her)  # an earlier history to restore
    with acting_as("ben"):
        studio.save_from(his, "\n".join(BEN), None, task)
        studio.histories.rewrites.result()
        studio.fits.fit(his)
        his_key = studio.own_data.style_key(his)
    before = footprint(studio, her)

    cookies = httpx.post(f"{url}login", data={"username": "ben", "password": "pb"}).cookies
    config = httpx.get(f"{url}config", cookies=cookies).json()
    routes = name_routes(config)
    names = {r["api_name"] for r in routes}
    assert {"fit", "own_adapter", "save_history", "compare", "new_pair", "forget", "cluster", "restore",
            "key_import", "explore", "why"} <= names, names  # the enumeration finds the tabs' buttons
    demo = studio.histories.demo_choices()[0][1]
    values = {"history": "\n".join(BEN), "version-id": version, "item-id": "1", "item-text": "ben's now",
              "style-key": his_key, "forget-confirm": True, "prompt": "a prompt",
              "pair-prompt": "a prompt", "fit-status": "Fitted", "demo-user": demo, "rater": "ben",
              "alphas": "0, 1", "n-holdout": 2, "upload": None, "item-pick": None, "earlier-pick": None}
    ben = Client(url, verbose=False, auth=("ben", "pb"))
    said = {}
    for route in routes:
        args = route_inputs(route, config, her, values)
        try:
            said[route["api_name"]] = json.dumps(ben.predict(*args, fn_index=route["id"]), default=str)
        except Exception as e:  # noqa: BLE001 (a refusal by Gradio itself: e.g. a name not among his choices)
            said[route["api_name"]] = f"error: {e}"
    for route, answer in said.items():  # the stored picker: Gradio refuses a name not among his choices itself
        refused = ("is taken" in answer or route in QUIET
                   or answer.startswith(f"error: Value: {her} is not in the list of choices"))
        assert refused and not any(t in answer for t in ANA), (route, answer)
    assert footprint(studio, her) == before  # nothing of hers changed, nor started to (his own adapter press)


def test_a_quick_pair_drawn_for_one_logins_person_takes_no_vote_from_another(studio):
    """Issue 58, item 5's last gap: Quick pair's vote goes by the pair's id. Another login holding that id is
    answered as for a pair that is not open; nothing is stored, and the pair stays open for its own login."""
    from personalize.humaneval.arena import StalePair

    task, s = studio.runtime.task.name, studio.runtime.settings(max_new_tokens=3)
    with acting_as("ana"):
        studio.save_from("ana-pairs", "\n".join(ANA), None, task)
        drawn = studio.votes.new_pair("ana-pairs", "the harbour at noon", ["base", "cluster"], s)
    n = len(studio.runtime.store.ratings())
    with acting_as("ben"):
        with pytest.raises(StalePair, match="no longer open"):
            studio.votes.vote(drawn.pair.id, "a", rater="ben")
    assert len(studio.runtime.store.ratings()) == n and studio.runtime.arena.pending(drawn.pair.id) is not None
    with acting_as("ana"):
        pair, _, who = studio.votes.vote(drawn.pair.id, "tie", rater="ana")
    assert pair.id == drawn.pair.id and who == "ana" and len(studio.runtime.store.ratings()) == n + 1
