"""SQLite store: users, history items, clusters, user vectors, generations, ratings, blobs, and the tables a
higher package keeps here (Tables: humaneval/campaign_schema.py's campaign tables).

One file (default data/studio.db) holds everything the studio keeps, so the CLI, the web app
and experiments share state. WAL mode, a 30 s busy timeout and `BEGIN IMMEDIATE` write
transactions let several threads and processes write at once (the web app serves concurrent
raters); a per-Store lock serialises use of its single connection across threads.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import sqlite_utils

from personalize.data import Item

from personalize.schema import (  # noqa: F401 (the store's names, where its users import them)
    Access, CAMPAIGN_PREFIX, FEEDBACK_SOURCES, MAX_NAME, SCHEMA_VERSION, USER_TABLES, VERSION_SOURCES, WINNERS, StoreError, Tables,
    PeopleTables, RecordTables, _check_text, _dumps, _item_rows, _name, migrate, now)


def decodes_own(stats: dict) -> bool | None:
    """UserStyle.helps from a fit's stats: whether CARD decodes with the style. A person who voted has asked for
    their own style, so CARD's fallback to the cluster model no longer applies to them; else the decoded check
    decides where it ran (Fit's first figure: card against the person's base on held-out items, decoded), and the
    teacher-forced one until then (issue 59: one rule, the figure the page shows first)."""
    if stats.get("n_votes"):
        return True
    if "decoded" in stats:
        return stats["decoded"]["helps"]
    return stats.get("diagnostics", {}).get("helps")


def _floats(blob: bytes) -> np.ndarray:
    """A stored λ as a writable float32 copy."""
    return np.frombuffer(blob, dtype="<f4").astype(np.float32)


@dataclass(frozen=True)
class StoredItem:
    """A history item as stored: its row id (for edits) and position in the user's history."""
    id: int
    user: str
    position: int
    x: str
    y: str
    neutral: str | None


@dataclass(frozen=True)
class StoredStyle:
    """A person's style as stored: λ, the rest as bytes (UserStyle.extras_bytes; None: λ alone), decodes_own."""
    lam: np.ndarray
    extras: bytes | None
    helps: bool | None


class Store(PeopleTables, RecordTables):
    """All studio state in one SQLite file; methods are thread-safe and each write is atomic."""

    def __init__(self, path: str | Path, parts: Sequence[Tables] = ()):
        self.path = Path(path)
        self.parts: dict[str, Tables] = {p.name: p for p in parts}  # the higher packages' tables kept here
        self.access = Access()  # whose people the current login reaches (the studio sets its logins' rule)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()  # reentrant so writes can call the read helpers
        conn = sqlite3.connect(self.path, timeout=30.0, check_same_thread=False)
        self.db = sqlite_utils.Database(conn)
        try:
            self.db.enable_wal()
            self.db.execute("PRAGMA foreign_keys = ON")
            with self._write() as db:
                migrate(db, self.path, tuple(self.parts.values()))
        except BaseException:
            conn.close()
            raise

    def attach(self, part: Tables) -> None:
        """Makes a higher package's tables (the migration step, once per Store) and has forget clear them."""
        with self._lock:
            if part.name in self.parts:
                return
            with self._write() as db:
                migrate(db, self.path, (part,))
            self.parts[part.name] = part

    def close(self) -> None:
        with self._lock:
            self.db.close()

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[dict]:
        """Rows of a read as dicts, under the connection's lock."""
        with self._lock:
            return [dict(r) for r in self.db.query(sql, list(params))]

    @contextmanager
    def _write(self) -> Iterator[sqlite_utils.Database]:
        """One transaction; IMMEDIATE takes the write lock up front so a busy DB waits, not fails."""
        with self._lock, self.db.conn:
            self.db.conn.execute("BEGIN IMMEDIATE")
            yield self.db

    transaction = _write  # the write transaction of the modules that keep their own tables here (humaneval/campaign.py)

    def _get(self, table: str, *pk: Any) -> dict | None:
        with self._lock:
            try:
                return self.db[table].get(pk)
            except sqlite_utils.db.NotFoundError:
                return None

    def _touch(self, name: str) -> None:
        self.db["users"].update(name, {"updated": now()})

    # users
    def add_user(self, name: str, items: Sequence[Item], task: str, replace: bool = False,
                 campaign: bool = False) -> None:
        """Stores a user with their history; `campaign`: one of a campaign's people (named CAMPAIGN_PREFIX...)."""
        name = _name(name)
        if name.startswith(CAMPAIGN_PREFIX) != campaign:
            raise StoreError(f"invalid user name {name!r}: names starting with {CAMPAIGN_PREFIX!r} are (only) "
                             "a campaign's people")
        if not items:
            raise StoreError(f"user '{name}' needs at least one history item")
        rows = _item_rows(name, items, 0)
        with self._write() as db:
            if not self._claim(db, name):
                self._insert_user(db, name, task, now())
                db["items"].insert_all(rows)
            elif not replace:
                raise StoreError(f"user '{name}' exists")
            else:
                self._replace_history(db, name, task, rows)

    def _insert_user(self, db, name: str, task: str, at: str) -> None:
        db["users"].insert({"name": name, "task": task, "created": at, "updated": at, "owner": self.access.new_owner()})

    def ensure_user(self, name: str, task: str) -> str:
        """The user, created without history when new (a style imported from a key needs no texts)."""
        name = _name(name)
        with self._write() as db:
            if not self._claim(db, name):
                self._insert_user(db, name, task, now())
        return name

    def users(self, campaign: bool = False) -> list[dict]:
        """[{"name", "task", "n_items", "created", "updated", "owner"}] sorted by name: the studio's users the
        current login reaches, and with `campaign` the people campaigns stored for generation too."""
        with self._lock:
            rows = self.db.query(
                "SELECT u.name, u.task, count(i.id) AS n_items, u.created, u.updated, u.owner FROM users u"
                " LEFT JOIN items i ON i.user = u.name WHERE ? OR substr(u.name, 1, ?) != ?"
                " GROUP BY u.name ORDER BY u.name", [int(campaign), len(CAMPAIGN_PREFIX), CAMPAIGN_PREFIX])
            return [r for r in rows if self.access.may_reach(r["owner"], r["name"].startswith(CAMPAIGN_PREFIX))]

    def user(self, name: str) -> dict:
        name = self._require(name)
        for u in self.users(campaign=True):
            if u["name"] == name:
                return u
        raise StoreError(f"unknown user '{name}'")

    def items(self, name: str) -> list[StoredItem]:
        with self._lock:
            name = self._require(name)
            rows = self.db["items"].rows_where("user = ?", [name], order_by="position")
            return [StoredItem(**row) for row in rows]

    def add_items(self, name: str, items: Sequence[Item]) -> None:
        with self._write() as db:
            name = self._require(name)
            (last,) = db.execute("SELECT max(position) FROM items WHERE user = ?", [name]).fetchone()
            db["items"].insert_all(_item_rows(name, items, 0 if last is None else last + 1))
            self._touch(name)

    def _item_user(self, item_id: int) -> str:
        row = self.db.execute("SELECT user FROM items WHERE id = ?", [item_id]).fetchone()
        if row is None or not self.may_reach(row[0]):
            raise StoreError(f"unknown item {item_id}")
        return row[0]

    def update_item(self, item_id: int, y: str, x: str | None = None) -> None:
        """Edits an item; its neutral rewrite no longer matches, so it is cleared."""
        with self._write() as db:
            user = self._item_user(item_id)
            _check_text(y, "" if x is None else x, f"item {item_id}")
            changes = {"y": y, "neutral": None} | ({} if x is None else {"x": x})
            db["items"].update(item_id, changes)
            self._touch(user)

    def delete_item(self, item_id: int) -> None:
        with self._write() as db:
            user = self._item_user(item_id)
            db["items"].delete(item_id)
            self._touch(user)

    def delete_user(self, name: str) -> None:
        """Removes the user and everything of theirs except ratings (votes stay countable)."""
        with self._write() as db:
            name = self._require(name)
            for table in USER_TABLES:
                db[table].delete_where("user = ?", [name])
            db["users"].delete(name)

    def forget(self, name: str) -> dict:
        """"Forget me": deletes everything of the user in one transaction and anonymises their ratings (the
        verdicts and methods stay for the leaderboard; prompt, outputs and user name go); where their name is a
        rater's id (typed as the rater id), it becomes one new anonymous id, the same in every table, so their
        votes still count once per pair and as one rater's. Then rewrites the file (VACUUM) and empties the
        write-ahead log, so no free page or WAL frame keeps their texts. Returns what was removed: {table: rows},
        "ratings_anonymised", "rater_ids_anonymised", and what each attached part's forget changed (the
        campaigns': "campaign_items_anonymised")."""
        with self._write() as db:
            name = self._require(name)
            out = {t: db[t].count_where("user = ?", [name]) for t in USER_TABLES}
            for table in USER_TABLES:
                db[table].delete_where("user = ?", [name])
            out["ratings_anonymised"] = db["ratings"].count_where("user = ?", [name])
            db.execute("UPDATE ratings SET user = NULL, prompt = '', output_a = '', output_b = '' WHERE user = ?",
                       [name])
            anonymous = f"forgotten-{secrets.token_hex(6)}"
            ids = ["ratings.rater", *(c for part in self.parts.values() for c in part.ids)]
            out["rater_ids_anonymised"] = sum(
                db.execute(f"UPDATE {t} SET {c} = ? WHERE {c} = ?", [anonymous, name]).rowcount
                for t, c in (i.split(".") for i in ids))
            for part in self.parts.values():
                if part.forget is not None:
                    out |= part.forget(db, name)
            db["users"].delete(name)
        with self._lock:
            self.db.execute("VACUUM")
            self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return out

    def set_neutral(self, item_ids_and_texts: Sequence[tuple[int, str]]) -> None:
        with self._write() as db:
            for item_id, text in item_ids_and_texts:
                self._item_user(item_id)
                db["items"].update(item_id, {"neutral": text})

    # clusters
    def set_assignment(self, name: str, artifacts: str, k: int, cluster: int,
                       distances: Sequence[float]) -> None:
        with self._write() as db:
            self._upsert_assignment(db, self._require(name), artifacts, k, cluster, distances)

    @staticmethod
    def _upsert_assignment(db, name: str, artifacts: str, k: int, cluster: int, distances: Sequence[float]) -> None:
        db["assignments"].upsert(
            {"user": name, "artifacts": artifacts, "k": int(k), "cluster": int(cluster),
             "distances": _dumps([float(d) for d in distances]), "updated": now()},
            pk=("user", "artifacts", "k"))

    def assignment(self, name: str, artifacts: str, k: int) -> dict | None:
        r = self._get("assignments", self._require(name), artifacts, int(k))
        return None if r is None else {k: r[k] for k in ("cluster", "updated")} | {
            "distances": json.loads(r["distances"])}

    # user vectors: the current style per (user, artifacts), and every version it had
    def save_vector(self, name: str, artifacts: str, vector: np.ndarray, model_id: str, stats: dict,
                    style: bytes | None = None, source: str = "history", note: str = "",
                    assignments: dict[int, tuple[int, Sequence[float]]] | None = None) -> int:
        """λ, and the rest of the person's style (style.UserStyle.extras_bytes) when there is one, as a new
        version that becomes the current one; returns the version id. `assignments` (K -> (cluster, distances))
        are written in the same transaction, so a crash never leaves a new cluster beside the old λ."""
        vec = np.asarray(vector)
        if vec.ndim != 1:
            raise StoreError(f"user vector must be 1-D, got shape {vec.shape}")
        if source not in VERSION_SOURCES:
            raise StoreError(f"invalid version source {source!r}: expected one of {', '.join(VERSION_SOURCES)}")
        with self._write() as db:
            name = self._require(name)
            row = {"user": name, "artifacts": artifacts, "vector": vec.astype("<f4").tobytes(), "d": len(vec),
                   "model_id": model_id, "stats": _dumps(stats), "style": style}
            vid = int(db["versions"].insert(row | {"created": now(), "source": source, "note": note}).last_pk)
            db["vectors"].upsert(row | {"updated": now(), "version": vid}, pk=("user", "artifacts"))
            for k, (cluster, distances) in (assignments or {}).items():
                self._upsert_assignment(db, name, artifacts, k, cluster, distances)
            return vid

    def record_decoded_check(self, name: str, artifacts: str, version: int, decoded: dict) -> bool:
        """The decoded check's verdict (`decoded["helps"]`: whether card decodes with the style) kept with style
        `version`, in its version row and, while it is the current one, the person's style; False when a newer
        version replaced it meanwhile (a check of a style no longer served decides nothing)."""
        with self._write() as db:
            name = self._require(name)
            for table, key in (("versions", "id"), ("vectors", "version")):
                r = db.execute(f"SELECT stats FROM {table} WHERE user = ? AND artifacts = ? AND {key} = ?",
                               [name, artifacts, int(version)]).fetchone()
                if r is None:
                    return False
                db.execute(f"UPDATE {table} SET stats = ? WHERE user = ? AND artifacts = ? AND {key} = ?",
                           [_dumps(json.loads(r[0]) | {"decoded": decoded}), name, artifacts, int(version)])
            return True

    def versions(self, name: str, artifacts: str) -> list[dict]:
        """[{"id", "created", "source", "note", "stats", "current"}] of the user's styles, oldest first."""
        with self._lock:
            name = self._require(name)
            cur = self.db.execute("SELECT version FROM vectors WHERE user = ? AND artifacts = ?",
                                  [name, artifacts]).fetchone()
            rows = self.db["versions"].rows_where("user = ? AND artifacts = ?", [name, artifacts],
                                                  select="id, created, source, note, stats", order_by="id")
            return [self._decode(r, "stats") | {"current": bool(cur) and r["id"] == cur[0]} for r in rows]

    def restore_version(self, name: str, artifacts: str, version: int) -> None:
        """Makes an earlier version the current style again (the versions themselves are never changed)."""
        with self._write() as db:
            name = self._require(name)
            r = db.execute("SELECT vector, d, model_id, stats, style FROM versions WHERE id = ? AND user = ? "
                           "AND artifacts = ?", [int(version), name, artifacts]).fetchone()
            if r is None:
                raise StoreError(f"user '{name}' has no version {version} under artifacts {artifacts}")
            db["vectors"].upsert({"user": name, "artifacts": artifacts, "vector": r[0], "d": r[1], "model_id": r[2],
                                  "stats": r[3], "style": r[4], "updated": now(), "version": int(version)},
                                 pk=("user", "artifacts"))

    def version_style(self, name: str, artifacts: str, version: int) -> tuple[StoredStyle, dict]:
        """One stored version (style.UserStyle.from_stored makes it a style), with its stats."""
        with self._lock:
            r = self.db.execute("SELECT vector, style, stats FROM versions WHERE id = ? AND user = ? AND artifacts = ?",
                                [int(version), self._require(name), artifacts]).fetchone()
        if r is None:
            raise StoreError(f"user '{name}' has no version {version} under artifacts {artifacts}")
        stats = json.loads(r[2])
        return StoredStyle(_floats(r[0]), r[1], decodes_own(stats)), stats

    def vector(self, name: str, artifacts: str) -> tuple[np.ndarray, dict] | None:
        r = self._get("vectors", self._require(name), artifacts)
        if r is None:
            return None
        return _floats(r["vector"]), {k: r[k] for k in ("d", "model_id", "updated", "version")} | {
            "stats": json.loads(r["stats"])}

    def style(self, name: str, artifacts: str) -> StoredStyle | None:
        """The person's whole style as stored (style.UserStyle.from_stored makes it a style), None if not fitted."""
        r = self._get("vectors", self._require(name), artifacts)
        if r is None:
            return None
        return StoredStyle(_floats(r["vector"]), r.get("style"), decodes_own(json.loads(r["stats"])))

    def vector_bytes(self, name: str, artifacts: str) -> int:
        """Bytes stored for the person's style: λ and, when fitted, the token bias and memory."""
        with self._lock:
            sql = "SELECT length(vector) + coalesce(length(style), 0) FROM vectors WHERE user = ? AND artifacts = ?"
            row = self.db.execute(sql, [name, artifacts]).fetchone() if self.may_reach(name) else None
        return int(row[0]) if row else 0
