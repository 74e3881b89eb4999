"""The store's schema and its migration step, the names every table shares, the small helpers the store's parts
use, and `PeopleTables`, the store's part that is about who a person is rather than what they wrote: whether the
current login may reach them (`Access`, below, on the owner a person was stored with) and the histories a Save
replaced, kept so that they can come back. store.py holds the connection and the other operations.

Whose people a request may reach (`Access`, `acting_as`): with logins (app.py --auth), a person belongs to the login
that made them: another login cannot see, open, change, rate as, export or forget them (to it they are an unknown
name); an admin login reaches everyone; a campaign's people are reachable by every login, since raters must read
the histories of the items they judge. Without logins one person uses the studio at this machine and reaches
everything. Work that no login runs (the CLI) runs as no one and reaches everything: every event of the page runs as
its login (ui/common.run_as_login), so no handler can forget to say who asks, and a job an event starts in another
thread runs as that login too (`as_starter`: a new thread starts as no one). Here, beside the person rules, because
the store applies it to every person it reads or writes by name.
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import sqlite_utils

from personalize.data import Item

SCHEMA_VERSION = 5  # 2: vectors.style (token bias, kNN memory); 3: every fitted style kept as a version, votes;
# 4: human-evaluation campaigns (their tables: humaneval/campaign_schema.py); 5: a person's owner (the login that
# made them, Access below) and the histories a Save replaced
VERSION_SOURCES = ("history", "vote", "import")  # what produced a version of a user's style
FEEDBACK_SOURCES = ("rate", "up", "down")  # a Rate vote, a thumbs up / down on a Compare column
WINNERS = ("a", "b", "tie", "both_bad")
MAX_NAME = 64
# People a campaign stores to generate its outputs (humaneval.campaign_pool.person_name) are named in this reserved
# namespace and kept out of users(), the studio's list of its own users; no ordinary user is named so.
CAMPAIGN_PREFIX = "campaign:"

_LOGIN: ContextVar[str | None] = ContextVar("personalize_login", default=None)


@contextmanager
def acting_as(login: str | None) -> Iterator[None]:
    """Runs the block as `login` (None: as no one, e.g. the CLI)."""
    token = _LOGIN.set(login)
    try:
        yield
    finally:
        _LOGIN.reset(token)


def current_login() -> str | None:
    return _LOGIN.get()


def as_starter(fn: Callable) -> Callable:
    """`fn` run, wherever it runs, as the login that asks now: a background job reaches only its starter's people.
    Why: a thread starts as no one, who reaches everyone; another login's Train my own adapter trained over a person
    it could not open (issue 58)."""
    login = current_login()

    def run(*args, **kwargs):
        with acting_as(login):
            return fn(*args, **kwargs)
    return run


@dataclass(frozen=True)
class Access:
    """The rule: which people the current login may reach, and whom a person it makes belongs to."""

    logins: bool = False  # the studio has logins (--auth); without them everything is reachable
    admins: frozenset[str] = frozenset()

    def __post_init__(self):
        if self.admins and not self.logins:
            raise ValueError("admins need logins (--auth)")
        object.__setattr__(self, "admins", frozenset(self.admins))

    def may_reach(self, owner: str | None, campaign: bool = False) -> bool:
        return self.sees_everyone() or campaign or owner == current_login()

    def sees_everyone(self) -> bool:
        who = current_login()
        return not self.logins or who is None or who in self.admins

    def new_owner(self) -> str | None:
        """The owner recorded for a person made now: the login, or None without logins."""
        return current_login() if self.logins else None


# Raw DDL because sqlite-utils' create() cannot express AUTOINCREMENT or CHECK constraints.
# AUTOINCREMENT: generation/rating ids are referenced elsewhere and must never be reused.
# Ratings have no foreign keys on purpose: they outlive deleted users and generations.
# Blobs use user '' for "no user" because NULLs never conflict in a primary key.
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS users (
  name TEXT PRIMARY KEY, task TEXT NOT NULL, created TEXT NOT NULL, updated TEXT NOT NULL, owner TEXT);
CREATE TABLE IF NOT EXISTS items (
  id INTEGER PRIMARY KEY AUTOINCREMENT, user TEXT NOT NULL REFERENCES users(name),
  position INTEGER NOT NULL, x TEXT NOT NULL, y TEXT NOT NULL, neutral TEXT);
CREATE UNIQUE INDEX IF NOT EXISTS idx_items_user_position ON items(user, position);
CREATE TABLE IF NOT EXISTS assignments (
  user TEXT NOT NULL REFERENCES users(name), artifacts TEXT NOT NULL, k INTEGER NOT NULL,
  cluster INTEGER NOT NULL, distances TEXT NOT NULL, updated TEXT NOT NULL,
  PRIMARY KEY (user, artifacts, k));
CREATE TABLE IF NOT EXISTS vectors (
  user TEXT NOT NULL REFERENCES users(name), artifacts TEXT NOT NULL, vector BLOB NOT NULL,
  d INTEGER NOT NULL, model_id TEXT NOT NULL, stats TEXT NOT NULL, updated TEXT NOT NULL, style BLOB,
  version INTEGER, PRIMARY KEY (user, artifacts));
CREATE TABLE IF NOT EXISTS versions (
  id INTEGER PRIMARY KEY AUTOINCREMENT, user TEXT NOT NULL REFERENCES users(name), artifacts TEXT NOT NULL,
  created TEXT NOT NULL, source TEXT NOT NULL, note TEXT NOT NULL, vector BLOB NOT NULL, d INTEGER NOT NULL,
  model_id TEXT NOT NULL, stats TEXT NOT NULL, style BLOB);
CREATE INDEX IF NOT EXISTS idx_versions_user ON versions(user, artifacts);
CREATE TABLE IF NOT EXISTS feedback (
  id INTEGER PRIMARY KEY AUTOINCREMENT, user TEXT NOT NULL REFERENCES users(name), created TEXT NOT NULL,
  source TEXT NOT NULL CHECK (source IN ('rate', 'up', 'down')), prompt TEXT NOT NULL, preferred TEXT,
  other TEXT, rating INTEGER);
CREATE INDEX IF NOT EXISTS idx_feedback_user ON feedback(user);
CREATE TABLE IF NOT EXISTS generations (
  id INTEGER PRIMARY KEY AUTOINCREMENT, created TEXT NOT NULL, user TEXT REFERENCES users(name),
  artifacts TEXT NOT NULL, method TEXT NOT NULL, prompt TEXT NOT NULL, output TEXT NOT NULL,
  settings TEXT NOT NULL, latency_s REAL NOT NULL, n_tokens INTEGER NOT NULL, extra TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS idx_generations_user ON generations(user);
CREATE TABLE IF NOT EXISTS ratings (
  id INTEGER PRIMARY KEY AUTOINCREMENT, created TEXT NOT NULL, rater TEXT NOT NULL,
  prompt TEXT NOT NULL, user TEXT, method_a TEXT NOT NULL, output_a TEXT NOT NULL,
  method_b TEXT NOT NULL, output_b TEXT NOT NULL,
  winner TEXT NOT NULL CHECK (winner IN ('a', 'b', 'tie', 'both_bad')),
  settings TEXT NOT NULL, gen_a INTEGER, gen_b INTEGER);
CREATE INDEX IF NOT EXISTS idx_ratings_created ON ratings(created);
CREATE TABLE IF NOT EXISTS replaced (
  id INTEGER PRIMARY KEY AUTOINCREMENT, user TEXT NOT NULL REFERENCES users(name), replaced TEXT NOT NULL,
  task TEXT NOT NULL, items TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS blobs (
  user TEXT NOT NULL, kind TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,
  updated TEXT NOT NULL, PRIMARY KEY (user, kind, key));
"""


# Every table keyed by a user, children first (deleting a user removes their rows in this order).
USER_TABLES = ("items", "vectors", "versions", "assignments", "generations", "blobs", "feedback", "replaced")


# One vote per rater and pair of stored outputs (either order), enforced by SQLite for several processes.
_ONE_VOTE = ("CREATE UNIQUE INDEX IF NOT EXISTS idx_ratings_one_vote ON ratings(rater, min(gen_a, gen_b), "
             "max(gen_a, gen_b)) WHERE gen_a IS NOT NULL AND gen_b IS NOT NULL")


class StoreError(ValueError):
    """Clear, user-facing error (unknown user, bad schema version...)."""


@dataclass(frozen=True)
class Tables:
    """Tables a higher package keeps in the store (it owns their DDL; the store must not import it): created by the
    migration step (CREATE ... IF NOT EXISTS, so an existing file keeps its rows), and cleared of a forgotten person
    by `forget(db, name)` in Store.forget's transaction, which returns what it changed ({key: rows}); in the columns
    `ids` ("table.column": a rater's id) the person's name becomes the anonymous id Store.forget gives them."""
    name: str
    ddl: str
    forget: Callable[[sqlite_utils.Database, str], dict[str, int]] | None = None
    ids: tuple[str, ...] = ()


def now() -> str:
    """ISO-8601 UTC with fixed precision, so timestamps also sort as strings."""
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True)  # sorted: equal settings give equal strings


def _name(name: str) -> str:
    """Validated, stripped user name: names appear in URLs, CLI args and file names."""
    stripped = name.strip() if isinstance(name, str) else ""
    if not 1 <= len(stripped) <= MAX_NAME:
        raise StoreError(f"invalid user name {name!r}: need 1-{MAX_NAME} non-blank characters")
    return stripped


def _taken(name: str) -> StoreError:
    """What a login is told of a name another login holds, whatever it asked (PeopleTables)."""
    return StoreError(f"the name '{name}' is taken: choose another user name")


def _check_text(y: object, x: object, what: str) -> None:
    """Empty texts are useless history; rejecting them early keeps writes all-or-nothing."""
    if not isinstance(y, str) or not y.strip() or not isinstance(x, str):
        raise StoreError(f"{what} has no text (y must be a non-empty string, x a string)")


def _item_rows(user: str, items: Sequence[Item], start: int) -> list[dict]:
    for i, item in enumerate(items):
        _check_text(item.y, item.x, f"item {i} of user '{user}'")
    return [{"user": user, "position": start + i, "x": it.x, "y": it.y, "neutral": None}
            for i, it in enumerate(items)]


def migrate(db: sqlite_utils.Database, path: Path, parts: Sequence[Tables] = ()) -> None:
    """The store's migration step (one transaction): an older schema to SCHEMA_VERSION, then every table made,
    the store's own and those of `parts`."""
    if db["meta"].exists():
        row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        version = int(row[0]) if row else SCHEMA_VERSION
        if version == 1 and db["vectors"].exists():  # v1 → v2: styles are added beside the vectors
            if "style" not in db["vectors"].columns_dict:
                db.execute("ALTER TABLE vectors ADD COLUMN style BLOB")
            version = 2
        if version == 2 and db["vectors"].exists():  # v2 → v3: the stored styles become the first versions
            db.execute("ALTER TABLE vectors ADD COLUMN version INTEGER")
            for statement in _SCHEMA.split(";"):  # not executescript: it would commit half a migration
                if "versions" in statement and statement.strip():
                    db.execute(statement)
            for r in list(db["vectors"].rows):
                vid = db["versions"].insert(
                    {"user": r["user"], "artifacts": r["artifacts"], "created": r["updated"],
                     "source": "history", "note": "fitted before versions were kept", "vector": r["vector"],
                     "d": r["d"], "model_id": r["model_id"], "stats": r["stats"], "style": r["style"]}).last_pk
                db.execute("UPDATE vectors SET version = ? WHERE user = ? AND artifacts = ?",
                           [vid, r["user"], r["artifacts"]])
            version = 3
        if version == 3:  # v3 → v4: the campaign tables are new (made with the parts, below)
            version = 4
        if version == 4:  # v4 → v5: users.owner (the people made before logins belong to no login); the table of
            if db["users"].exists() and "owner" not in db["users"].columns_dict:  # replaced histories is new
                db.execute("ALTER TABLE users ADD COLUMN owner TEXT")
            version = 5
        if version != SCHEMA_VERSION:
            raise StoreError(
                f"{path} has schema version {version}, but this code only knows "
                f"version {SCHEMA_VERSION}: upgrade personalize or use another database")
    db.executescript(_SCHEMA)
    for part in parts:
        db.executescript(part.ddl)
    try:  # the one-vote rule across processes; a database that already holds repeated votes keeps the
        db.execute(_ONE_VOTE)  # rule of Arena.vote alone (it checks has_rating under its lock)
    except sqlite3.IntegrityError:
        pass
    db["meta"].upsert({"key": "schema_version", "value": str(SCHEMA_VERSION)}, pk="key")


class PeopleTables:
    """Store's person rules: reach (`_require`, `may_reach`, `refuse_taken`, `_claim`) and replaced histories. Uses
    the store's connection (`db`), lock (`_lock`), reads (`query`), write transaction (`_write`) and rule (`access`)."""

    def _require(self, name: str) -> str:
        """The stored person's name; "unknown" when there is none, "taken" when the current login may not reach
        them (the one wording for a name another login holds, on every tab: nothing else of the person is told)."""
        name = _name(name)
        with self._lock:
            if not self._claim(self.db, name):
                raise StoreError(f"unknown user '{name}'")
        return name

    def may_reach(self, name: str | None) -> bool:
        """Whether the current login reaches this person (None: rows of no person, which only a login that sees
        everyone reaches)."""
        if name is None:
            return self.access.sees_everyone()
        try:
            self._require(name)
        except StoreError:
            return False
        return True

    def refuse_taken(self, name: str) -> str:
        """The name, stripped, unless another login holds it: then the store's one wording (taken), before any work
        under it starts (a job, a new person), as every read of that person would say."""
        if self.taken(name):
            raise _taken(_name(name))
        return _name(name)

    def taken(self, name: str) -> bool:
        """Whether `name` belongs to a person the current login may not reach (a Save under it is refused, so the
        page says so before the Save; nothing else of the person is told)."""
        name = _name(name)
        with self._lock:
            row = self.db.execute("SELECT owner FROM users WHERE name = ?", [name]).fetchone()
        return row is not None and not self.access.may_reach(row[0], name.startswith(CAMPAIGN_PREFIX))

    def _claim(self, db, name: str) -> bool:
        """Whether `name` is stored already (for a read, or a write under it); a name another login holds is
        refused (it is taken, and nothing of its person is shown)."""
        row = db.execute("SELECT owner FROM users WHERE name = ?", [name]).fetchone()
        if row is not None and not self.access.may_reach(row[0], name.startswith(CAMPAIGN_PREFIX)):
            raise _taken(name)
        return row is not None

    @staticmethod
    def _replace_history(db, name: str, task: str, rows: list[dict]) -> None:
        """The user's history becomes `rows`; the one it replaces is kept so that it can be restored
        (restore_history), its styles stay as versions, and the current style and clusters, fitted on it, go."""
        at = now()
        old_task = db.execute("SELECT task FROM users WHERE name = ?", [name]).fetchone()[0]
        old = [{"x": r["x"], "y": r["y"]} for r in db["items"].rows_where("user = ?", [name], order_by="position")]
        if old:
            db["replaced"].insert({"user": name, "replaced": at, "task": old_task, "items": _dumps(old)})
        for table in ("items", "vectors", "assignments"):
            db[table].delete_where("user = ?", [name])
        db["users"].update(name, {"task": task, "updated": at})
        db["items"].insert_all(rows)

    def replaced_histories(self, name: str) -> list[dict]:
        """[{"id", "replaced", "task", "n_items"}] of the histories Saves replaced, newest first."""
        return self.query("SELECT id, replaced, task, json_array_length(items) AS n_items FROM replaced"
                          " WHERE user = ? ORDER BY id DESC", [self._require(name)])

    def restore_history(self, name: str, replaced_id: int) -> int:
        """Brings a replaced history back (the one it replaces is kept in turn); returns its number of items."""
        with self._write() as db:
            name = self._require(name)
            row = db.execute("SELECT task, items FROM replaced WHERE id = ? AND user = ?",
                             [int(replaced_id), name]).fetchone()
            if row is None:
                raise StoreError(f"user '{name}' has no replaced history {replaced_id}")
            db["replaced"].delete(int(replaced_id))
            items = [Item(x=i["x"], y=i["y"]) for i in json.loads(row[1])]
            self._replace_history(db, name, row[0], _item_rows(name, items, 0))
            return len(items)


class RecordTables:
    """Store's records of what happened: generations, human-eval ratings, votes on a person's outputs, and the
    methods' per-person blobs. Uses the store's connection (`db`), lock (`_lock`), write transaction (`_write`),
    row reader (`_get`) and person rules (PeopleTables)."""

    # generations
    def add_generation(self, user: str | None, artifacts: str, method: str, prompt: str, output: str,
                       settings: dict, latency_s: float, n_tokens: int, extra: dict | None = None) -> int:
        with self._write() as db:
            if user is not None:
                user = self._require(user)
            table = db["generations"].insert(
                {"created": now(), "user": user, "artifacts": artifacts, "method": method,
                 "prompt": prompt, "output": output, "settings": _dumps(settings),
                 "latency_s": float(latency_s), "n_tokens": int(n_tokens),
                 "extra": _dumps(extra or {})})
            return int(table.last_pk)

    @staticmethod
    def _decode(row: dict, *fields: str) -> dict:
        return row | {f: json.loads(row[f]) for f in fields}

    def generations(self, user: str | None = None, method: str | None = None,
                    limit: int | None = None) -> list[dict]:
        """The generations, newest first, of the people the current login reaches."""
        where = {"user = ?": user, "method = ?": method}
        clauses = [c for c, v in where.items() if v is not None]
        with self._lock:
            rows = self.db["generations"].rows_where(
                " AND ".join(clauses) or None, [v for v in where.values() if v is not None],
                order_by="id DESC", limit=limit)
            return [self._decode(r, "settings", "extra") for r in rows if self.may_reach(r["user"])]

    def generation(self, gen_id: int) -> dict:
        row = self._get("generations", gen_id)
        if row is None or not self.may_reach(row["user"]):
            raise StoreError(f"unknown generation {gen_id}")
        return self._decode(row, "settings", "extra")

    # human-eval ratings
    def add_rating(self, rater: str, prompt: str, user: str | None, method_a: str, output_a: str,
                   method_b: str, output_b: str, winner: str, settings: dict,
                   gen_a: int | None = None, gen_b: int | None = None) -> int:
        if winner not in WINNERS:
            raise StoreError(f"invalid winner {winner!r}: expected one of {', '.join(WINNERS)}")
        if not isinstance(rater, str) or not rater.strip():
            raise StoreError("rater name must not be empty")
        try:
            with self._write() as db:
                table = db["ratings"].insert(
                    {"created": now(), "rater": rater.strip(), "prompt": prompt, "user": user,
                     "method_a": method_a, "output_a": output_a, "method_b": method_b,
                     "output_b": output_b, "winner": winner, "settings": _dumps(settings),
                     "gen_a": gen_a, "gen_b": gen_b})
                return int(table.last_pk)
        except sqlite3.IntegrityError:
            if self.has_rating(rater, gen_a, gen_b):
                raise StoreError(f"{rater.strip()} already voted on these two outputs (one vote per rater and "
                                 "pair)") from None
            raise

    def has_rating(self, rater: str, gen_a: int | None, gen_b: int | None) -> bool:
        """Whether `rater` already voted on these two stored generations (in either order)."""
        if gen_a is None or gen_b is None:
            return False
        with self._lock:
            sql = ("SELECT 1 FROM ratings WHERE rater = ? AND ((gen_a = ? AND gen_b = ?) OR (gen_a = ? AND gen_b = ?))"
                   " LIMIT 1")
            return self.db.execute(sql, [rater.strip(), gen_a, gen_b, gen_b, gen_a]).fetchone() is not None

    def ratings(self) -> list[dict]:
        with self._lock:
            rows = self.db["ratings"].rows_where(order_by="created, id")
            return [self._decode(r, "settings") for r in rows]

    # votes on a user's outputs (training data for their style)
    def add_feedback(self, name: str, source: str, prompt: str, preferred: str | None, other: str | None = None,
                     rating: int | None = None) -> int:
        """A decided preference about the user's style: `preferred` is the text they chose (None for a thumbs
        down), `other` the text they did not."""
        if source not in FEEDBACK_SOURCES:
            raise StoreError(f"invalid feedback source {source!r}: expected one of {', '.join(FEEDBACK_SOURCES)}")
        if not (preferred or "").strip() and not (other or "").strip():
            raise StoreError("a vote needs the text it was about")
        with self._write() as db:
            name = self._require(name)
            return int(db["feedback"].insert({"user": name, "created": now(), "source": source, "prompt": prompt,
                                              "preferred": preferred, "other": other, "rating": rating}).last_pk)

    def feedback(self, name: str) -> list[dict]:
        """The user's votes, oldest first."""
        with self._lock:
            return list(self.db["feedback"].rows_where("user = ?", [self._require(name)], order_by="id"))

    # method-specific per-user blobs (name None = not tied to a user)
    def put_blob(self, name: str | None, kind: str, key: str, value: dict) -> None:
        with self._write() as db:
            user = "" if name is None else self._require(name)
            db["blobs"].upsert({"user": user, "kind": kind, "key": key, "value": _dumps(value),
                                "updated": now()}, pk=("user", "kind", "key"))

    def blob(self, name: str | None, kind: str, key: str) -> dict | None:
        if name and not self.may_reach(name):
            return None
        row = self._get("blobs", name or "", kind, key)
        return None if row is None else json.loads(row["value"])

    def blobs(self, name: str | None, kind: str) -> list[dict]:
        """[{"key", "value", "updated"}] of one kind, sorted by key."""
        with self._lock:
            if name and not self.may_reach(name):
                return []
            rows = self.db["blobs"].rows_where("user = ? AND kind = ?", [name or "", kind],
                                                select="key, value, updated", order_by="key")
            return [self._decode(r, "value") for r in rows]
