"""Tests for personalize.store on a real SQLite file."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import numpy as np
import pytest
import sqlite_utils

from personalize.data import Item
from personalize.store import SCHEMA_VERSION, Store, StoredItem, StoreError, Tables

HISTORY = [Item(y="first post", x="title 1", id="a"), Item(y="second post"), Item(y="third")]


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "sub" / "studio.db")
    s.add_user("alice", HISTORY, task="news")
    return s


def test_fresh_db_has_tables_wal_and_version(tmp_path: Path) -> None:
    path = tmp_path / "new" / "studio.db"
    Store(path).close()
    db = sqlite_utils.Database(path)
    assert {"meta", "users", "items", "assignments", "vectors", "generations", "ratings",
            "blobs"} <= set(db.table_names())
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db["meta"].get("schema_version")["value"] == str(SCHEMA_VERSION)
    Store(path).close()  # reopening an existing DB works


def test_newer_schema_version_refused(tmp_path: Path) -> None:
    path = tmp_path / "studio.db"
    Store(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(StoreError, match="schema version 99"):
        Store(path)


def test_users_and_items_round_trip(store: Store) -> None:
    assert [u["name"] for u in store.users()] == ["alice"]
    user = store.user("alice")
    assert user["task"] == "news" and user["n_items"] == 3
    assert user["created"].endswith("+00:00")
    items = store.items("alice")
    assert [(i.position, i.x, i.y, i.neutral) for i in items] == [
        (0, "title 1", "first post", None), (1, "", "second post", None), (2, "", "third", None)]
    assert all(isinstance(i, StoredItem) and i.user == "alice" for i in items)

    store.add_user("bob", [Item(y="hi")], task="email")
    assert [u["name"] for u in store.users()] == ["alice", "bob"]
    store.add_items("alice", [Item(y="fourth"), Item(y="fifth", x="t5")])
    items = store.items("alice")
    assert [i.position for i in items] == [0, 1, 2, 3, 4] and items[-1].x == "t5"

    store.set_neutral([(items[0].id, "neutral one"), (items[1].id, "neutral two")])
    assert [i.neutral for i in store.items("alice")][:3] == ["neutral one", "neutral two", None]
    store.update_item(items[0].id, "edited")
    edited = store.items("alice")[0]
    assert (edited.y, edited.x, edited.neutral) == ("edited", "title 1", None)
    store.update_item(items[0].id, "edited 2", x="new title")
    assert store.items("alice")[0].x == "new title"

    store.delete_item(items[1].id)
    assert [i.y for i in store.items("alice")] == ["edited 2", "third", "fourth", "fifth"]
    assert store.user("alice")["n_items"] == 4


def test_name_validation_and_duplicates(store: Store) -> None:
    for bad in ["", "   ", "x" * 65]:
        with pytest.raises(StoreError):
            store.add_user(bad, HISTORY, task="news")
    store.add_user("  carol  ", HISTORY, task="news")
    assert store.user("carol")["name"] == "carol"
    with pytest.raises(StoreError, match="user 'alice' exists"):
        store.add_user("alice", HISTORY, task="news")
    with pytest.raises(StoreError):
        store.add_user("dave", [], task="news")
    with pytest.raises(StoreError):
        store.add_user("dave", [Item(y="")], task="news")


def test_unknown_user_errors(store: Store) -> None:
    for call in [lambda: store.user("nobody"), lambda: store.items("nobody"),
                 lambda: store.add_items("nobody", HISTORY), lambda: store.delete_user("nobody"),
                 lambda: store.set_assignment("nobody", "art", 3, 0, [0.1]),
                 lambda: store.save_vector("nobody", "art", np.zeros(2), "m", {}),
                 lambda: store.add_generation("nobody", "art", "card", "p", "o", {}, 0.1, 1),
                 lambda: store.put_blob("nobody", "exact", "k", {})]:
        with pytest.raises(StoreError, match="unknown user 'nobody'"):
            call()
    with pytest.raises(StoreError, match="unknown item"):
        store.update_item(12345, "y")
    with pytest.raises(StoreError, match="unknown item"):
        store.delete_item(12345)
    with pytest.raises(StoreError, match="unknown item"):
        store.set_neutral([(store.items("alice")[0].id, "ok"), (12345, "bad")])
    assert store.items("alice")[0].neutral is None  # the whole batch was rolled back
    with pytest.raises(StoreError, match="unknown generation"):
        store.generation(999)


def test_replace_user(store: Store) -> None:
    store.set_assignment("alice", "art", 3, 1, [0.5, 0.1, 0.9])
    store.save_vector("alice", "art", np.ones(4), "model", {"loss": 1.0})
    gen = store.add_generation("alice", "art", "card", "p", "o", {}, 0.1, 3)
    created = store.user("alice")["created"]
    store.add_user("alice", [Item(y="new only")], task="email", replace=True)
    user = store.user("alice")
    assert (user["task"], user["n_items"], user["created"]) == ("email", 1, created)
    assert [(i.position, i.y) for i in store.items("alice")] == [(0, "new only")]
    assert store.assignment("alice", "art", 3) is None
    assert store.vector("alice", "art") is None
    assert store.generation(gen)["user"] == "alice"  # generations are kept


def test_failed_add_user_leaves_previous_data(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    store.save_vector("alice", "art", np.ones(3), "model", {})
    before = store.items("alice")
    with pytest.raises(StoreError):  # rejected up front
        store.add_user("alice", [Item(y="ok"), Item(y="  ")], task="email", replace=True)

    def boom(self: sqlite_utils.db.Table, *args: object, **kwargs: object) -> None:
        raise sqlite3.OperationalError("disk on fire")

    # fail after the old items/vectors were deleted, inside the same transaction
    monkeypatch.setattr(sqlite_utils.db.Table, "insert_all", boom)
    with pytest.raises(sqlite3.OperationalError, match="disk on fire"):
        store.add_user("alice", [Item(y="new")], task="email", replace=True)
    monkeypatch.undo()
    assert store.items("alice") == before
    assert store.user("alice")["task"] == "news"
    assert store.vector("alice", "art") is not None
    store.add_user("zed", [Item(y="works again")], task="news")  # connection still usable


def test_assignments_round_trip(store: Store) -> None:
    assert store.assignment("alice", "art", 3) is None
    store.set_assignment("alice", "art", 3, 2, [0.3, 0.2, 0.1])
    store.set_assignment("alice", "art", 5, 4, np.array([1.0, 2.0, 3.0, 4.0, 0.5]))
    a = store.assignment("alice", "art", 3)
    assert a is not None and a["cluster"] == 2 and a["distances"] == [0.3, 0.2, 0.1]
    store.set_assignment("alice", "art", 3, 0, [0.0, 1.0, 2.0])  # upsert
    assert store.assignment("alice", "art", 3)["cluster"] == 0
    assert store.assignment("alice", "art", 5)["cluster"] == 4
    assert store.assignment("alice", "other", 3) is None


def test_vectors_round_trip(store: Store) -> None:
    assert store.vector("alice", "art") is None and store.vector_bytes("alice", "art") == 0
    vec = np.random.default_rng(0).standard_normal(37).astype(np.float32)
    store.save_vector("alice", "art", vec, "qwen-0.5b", {"loss": 0.25, "steps": 10})
    assert store.vector_bytes("alice", "art") == 4 * 37
    got, meta = store.vector("alice", "art")
    assert got.dtype == np.float32 and np.array_equal(got, vec)
    assert meta["d"] == 37 and meta["model_id"] == "qwen-0.5b"
    assert meta["stats"] == {"loss": 0.25, "steps": 10} and meta["updated"]
    store.save_vector("alice", "art", np.arange(5, dtype=np.float64), "m2", {})  # upsert
    got, meta = store.vector("alice", "art")
    assert np.array_equal(got, np.arange(5)) and meta["d"] == 5 and meta["model_id"] == "m2"
    assert store.vector_bytes("alice", "art") == 20
    with pytest.raises(StoreError):
        store.save_vector("alice", "art", np.zeros((2, 2)), "m", {})


def test_generations_round_trip(store: Store) -> None:
    g1 = store.add_generation("alice", "art", "card", "prompt 1", "out 1", {"temp": 0.7}, 1.5, 20,
                              extra={"cluster": 2})
    g2 = store.add_generation(None, "art", "base", "prompt 2", "out 2", {"temp": 0.0}, 0.5, 10)
    g3 = store.add_generation("alice", "art", "base", "prompt 3", "out 3", {}, 0.2, 5)
    assert [g["id"] for g in store.generations()] == [g3, g2, g1]
    assert [g["id"] for g in store.generations(user="alice")] == [g3, g1]
    assert [g["id"] for g in store.generations(method="base")] == [g3, g2]
    assert [g["id"] for g in store.generations(user="alice", method="card")] == [g1]
    assert [g["id"] for g in store.generations(limit=1)] == [g3]
    g = store.generation(g1)
    assert g["settings"] == {"temp": 0.7} and g["extra"] == {"cluster": 2}
    assert (g["user"], g["method"], g["prompt"], g["output"]) == ("alice", "card", "prompt 1", "out 1")
    assert g["latency_s"] == 1.5 and g["n_tokens"] == 20 and g["created"]
    assert store.generation(g2)["user"] is None and store.generation(g2)["extra"] == {}


def test_ratings_round_trip_and_validation(store: Store) -> None:
    r1 = store.add_rating("r1", "p", "alice", "card", "oa", "base", "ob", "a", {"seed": 1},
                          gen_a=1, gen_b=2)
    r2 = store.add_rating("r2", "p2", None, "base", "x", "card", "y", "both_bad", {})
    ratings = store.ratings()
    assert [r["id"] for r in ratings] == [r1, r2]
    assert ratings[0]["winner"] == "a" and ratings[0]["settings"] == {"seed": 1}
    assert (ratings[0]["gen_a"], ratings[0]["gen_b"], ratings[1]["user"]) == (1, 2, None)
    with pytest.raises(StoreError, match="invalid winner"):
        store.add_rating("r1", "p", None, "a", "x", "b", "y", "A", {})
    with pytest.raises(StoreError):
        store.add_rating("  ", "p", None, "a", "x", "b", "y", "tie", {})
    assert len(store.ratings()) == 2


def test_blobs_round_trip(store: Store) -> None:
    assert store.blob("alice", "exact", "memory") is None
    store.put_blob("alice", "exact", "memory", {"items": [1, 2]})
    store.put_blob("alice", "exact", "a-key", {"v": 1})
    store.put_blob("alice", "exact", "memory", {"items": [3]})  # upsert
    store.put_blob(None, "exact", "memory", {"global": True})
    assert store.blob("alice", "exact", "memory") == {"items": [3]}
    assert store.blob(None, "exact", "memory") == {"global": True}
    assert [(b["key"], b["value"]) for b in store.blobs("alice", "exact")] == [
        ("a-key", {"v": 1}), ("memory", {"items": [3]})]
    assert store.blobs("alice", "pag") == []


def test_delete_user_keeps_ratings(store: Store) -> None:
    store.set_assignment("alice", "art", 3, 1, [0.1])
    store.save_vector("alice", "art", np.ones(2), "m", {})
    gen = store.add_generation("alice", "art", "card", "p", "o", {}, 0.1, 1)
    store.put_blob("alice", "pag", "summary", {"text": "s"})
    store.add_rating("r", "p", "alice", "card", "o", "base", "o2", "tie", {}, gen_a=gen)
    store.delete_user("alice")
    assert store.users() == []
    with pytest.raises(StoreError):
        store.items("alice")
    assert store.generations() == [] and store.blob("alice", "pag", "summary") is None
    assert store.vector_bytes("alice", "art") == 0
    assert len(store.ratings()) == 1
    store.add_user("alice", HISTORY, task="news")  # the name can be reused
    assert store.assignment("alice", "art", 3) is None and store.vector("alice", "art") is None


def test_concurrent_ratings_from_threads(tmp_path: Path) -> None:
    path = tmp_path / "studio.db"
    stores = [Store(path) for _ in range(8)]
    errors: list[BaseException] = []

    def rate(s: Store, t: int) -> None:
        try:
            for i in range(25):
                s.add_rating(f"rater{t}", f"p{i}", None, "card", "a", "base", "b", "tie", {"i": i})
        except BaseException as e:  # surfaced below: pytest misses thread exceptions
            errors.append(e)

    threads = [threading.Thread(target=rate, args=(s, t)) for t, s in enumerate(stores)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    assert len(Store(path).ratings()) == 200
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM ratings").fetchone()[0] == 200


def test_one_store_shared_by_threads(store: Store) -> None:
    def work(t: int) -> None:
        for i in range(20):
            store.add_generation("alice", "art", f"m{t}", "p", "o", {}, 0.1, i)
            store.generations(user="alice", limit=5)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(store.generations(user="alice")) == 120


def test_version_1_database_gains_the_style_column_and_keeps_its_vectors(tmp_path: Path) -> None:
    """A studio.db written before styles existed opens, keeps λ, and then stores a whole style."""
    from personalize.methods.card.style import UserStyle

    path = tmp_path / "old.db"
    db = sqlite_utils.Database(path)
    db.executescript("""
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE users (name TEXT PRIMARY KEY, task TEXT NOT NULL, created TEXT NOT NULL, updated TEXT NOT NULL);
CREATE TABLE vectors (user TEXT NOT NULL REFERENCES users(name), artifacts TEXT NOT NULL, vector BLOB NOT NULL,
  d INTEGER NOT NULL, model_id TEXT NOT NULL, stats TEXT NOT NULL, updated TEXT NOT NULL, PRIMARY KEY (user, artifacts));
INSERT INTO meta VALUES ('schema_version', '1');
INSERT INTO users VALUES ('ann', 'tweets', 't', 't');
""")
    db["vectors"].insert({"user": "ann", "artifacts": "a1", "vector": np.ones(4, "<f4").tobytes(), "d": 4,
                          "model_id": "m", "stats": "{}", "updated": "t"})
    db.conn.close()
    store = Store(path)
    assert store.db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == str(SCHEMA_VERSION)
    old = UserStyle.from_stored(store.style("ann", "a1"))  # λ alone: no bias, no memory
    assert np.array_equal(old.lam, np.ones(4)) and len(old.bias_ids) == 0 and len(old.values) == 0
    first = store.versions("ann", "a1")  # v3: the stored style became the first version, and the current one
    assert [(v["source"], v["current"]) for v in first] == [("history", True)]
    assert store.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    style = UserStyle(np.full(4, 2, np.float32), np.array([7, 3]), np.array([0.5, -1.0], np.float32),
                      np.ones((3, 4), np.float16), np.array([5, 6, 7]))
    store.save_vector("ann", "a1", style.lam, "m", {"diagnostics": {"helps": False}}, style.extras_bytes())
    back = UserStyle.from_stored(store.style("ann", "a1"))
    assert back.helps is False and np.array_equal(back.bias_ids, [7, 3]) and np.allclose(back.bias, [0.5, -1.0])
    assert back.keys.shape == (3, 4) and np.array_equal(back.values, [5, 6, 7])
    assert store.vector_bytes("ann", "a1") == 16 + len(style.extras_bytes())
    versions = store.versions("ann", "a1")
    assert len(versions) == 2 and versions[-1]["current"] and not versions[0]["current"]
    store.restore_version("ann", "a1", versions[0]["id"])
    assert np.array_equal(UserStyle.from_stored(store.style("ann", "a1")).lam, np.ones(4))


def test_one_vote_per_rater_and_pair_holds_across_connections(tmp_path: Path) -> None:
    """Two Store objects on one file (two processes, in effect): the database itself refuses the second vote."""
    one, two = Store(tmp_path / "s.db"), Store(tmp_path / "s.db")
    one.add_rating("r1", "p", None, "card", "x", "base", "y", "a", {}, 5, 9)
    with pytest.raises(StoreError, match="already voted"):
        two.add_rating("r1", "p", None, "base", "y", "card", "x", "b", {}, 9, 5)  # the same pair, other order
    two.add_rating("r2", "p", None, "card", "x", "base", "y", "a", {}, 5, 9)  # another rater
    one.add_rating("r1", "p", None, "card", "x", "base", "y", "a", {})  # pairs not stored as generations: no rule
    one.add_rating("r1", "p", None, "card", "x", "base", "y", "a", {})
    assert len(one.ratings()) == 4
    one.close(), two.close()


def test_a_higher_package_s_tables_are_made_by_the_migration_step_and_cleared_by_forget(tmp_path: Path) -> None:
    """The store owns no table of a higher package: a Tables part brings its DDL and its share of "forget me"."""
    def forget(db, name):
        n = db["notes"].count_where("user = ?", [name])
        db["notes"].delete_where("user = ?", [name])
        return {"notes_removed": n}

    notes = Tables("notes", "CREATE TABLE IF NOT EXISTS notes (user TEXT NOT NULL, text TEXT NOT NULL);", forget)
    path = tmp_path / "s.db"
    plain = Store(path)
    assert "notes" not in plain.db.table_names()
    plain.add_user("ann", HISTORY, task="news")
    plain.attach(notes)
    plain.attach(notes)  # once per Store
    with plain.transaction() as db:
        db["notes"].insert({"user": "ann", "text": "hers"})
    plain.close()
    again = Store(path, parts=(notes,))  # an existing file keeps its rows
    assert again.query("SELECT text FROM notes") == [{"text": "hers"}]
    out = again.forget("ann")
    assert out["notes_removed"] == 1 and not again.query("SELECT * FROM notes")
    again.close()
