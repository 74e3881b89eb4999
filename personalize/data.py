"""LaMP files, task templates and free-form histories: the one place user text enters the library.

Everything that reads a user's writing goes through here, so that bad input
fails early with a HistoryError whose message can be shown to the user as is.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import tempfile
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence


class HistoryError(ValueError):
    """Bad user input: empty, malformed, too large. Message is shown to the user as is."""


@dataclass(frozen=True)
class Item:
    """One history item: the text the user wrote (y) and the prompt it answers (x, "" until a neutral rewrite fills it)."""

    y: str
    x: str = ""
    id: str = ""


@dataclass(frozen=True)
class Task:
    """A generation task: its LaMP name and the template that turns an input into a prompt."""

    name: str
    lamp_name: str
    template: str
    instruction: str = ""  # the fixed line a full prompt starts with, where the template is "{text}"

    def prompt(self, text: str) -> str:
        return self.template.replace("{text}", text)

    @property
    def prefix(self) -> str:
        """The fixed text before the slot; "" when inputs are already full prompts."""
        return self.template.split("{text}")[0]

    @property
    def fixed_start(self) -> str:
        """What every prompt of this task starts with: the template's prefix, else its full prompts' instruction.
        Retrieval strips it (it would match every item, and repeated before the prompt it is what a small model
        copies)."""
        return self.prefix or self.instruction


TASKS: dict[str, Task] = {
    t.name: t
    for t in (
        Task("scholarly_titles", "ScholarlyTitleGeneration", "Generate a title for the following abstract of a paper: {text}"),
        Task("commit_subjects", "CommitSubjectGeneration", "{text}",
             "Write the commit message subject line for this change."),
        Task("headlines", "NewsHeadlineGeneration", "Generate a headline for the following article: {text}"),
        Task("tweets", "TweetParaphrasing", "Paraphrase the following tweet without any explanation before or after it: {text}"),
        Task("changelog_entries", "DebianChangelogGeneration", "{text}",
             "Write the Debian changelog entry for this upload."),
        Task("writing", "PersonalWriting", "{text}"),
        Task("rewrite", "PersonalRewrite",
             "Rewrite the following text in your own words, without any explanation before or after it: {text}"),
    )
}
# Names other files use for the same tasks (the LaMP benchmark numbers its tasks).
_ALIASES = {"lamp_4": "headlines", "lamp_5": "scholarly_titles", "lamp_7": "tweets"}


@dataclass(frozen=True)
class Query:
    """One query of a LaMP split: the full prompt, the user's profile, and the gold output when known."""

    id: str
    input: str
    profile: tuple[Item, ...]
    gold: str | None = None
    user: str | None = None
    source: str | None = None  # where the user's writing comes from (a repository, a venue): held-out splits


def query_source(meta: dict) -> str | None:
    """The source a meta row names: its repository, venue, or the venue of an ACL Anthology paper id
    ("2025.emnlp-main.12" -> "emnlp"); None when the row names none."""
    for key in ("source", "repo", "venue"):
        if isinstance(meta.get(key), str):
            return meta[key]
    paper = meta.get("query_paper")
    if isinstance(paper, str) and "." in paper:
        return paper.split(".")[1].split("-")[0]
    return None


def task_named(name: str) -> Task | None:
    """The task a name, LaMP name or LaMP number refers to, or None."""
    key = name.strip().lower().replace("-", "_")
    for t in TASKS.values():
        if key in (t.name, t.lamp_name.lower()):
            return t
    return TASKS.get(_ALIASES.get(key, ""))


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n / 1e3:.1f} KB"


def short_text(text: str, limit: int = 60) -> str:
    """Text from the user's input fit for an error message: one printable line, not megabytes of it."""
    text = text if text.isprintable() else repr(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_SURROGATE = re.compile(r"[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def parse_json(text: str, where: str, line: int | None = None) -> Any:
    """Parse JSON; every way it can fail is a HistoryError: bad syntax, nesting past the recursion limit, a number
    past Python's 4300-digit limit, or an unpaired \\ud800 escape (a str no file, database or tokenizer takes)."""
    at = f"{where} line {line}" if line else where
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise HistoryError(f"{where} line {line or e.lineno}: not valid JSON ({e.msg})") from None
    except RecursionError:
        raise HistoryError(f"{at}: not valid JSON (nested too deeply)") from None
    except ValueError:  # the int digits limit
        raise HistoryError(f"{at}: not valid JSON (a number has too many digits)") from None
    if _SURROGATE_ESCAPE.search(text):  # paired escapes (an emoji written with ensure_ascii) are fine, lone ones not
        stack = [obj]
        while stack:
            v = stack.pop()
            if isinstance(v, dict):
                stack += [*v, *v.values()]
            elif isinstance(v, list):
                stack += v
            elif isinstance(v, str) and (bad := _SURROGATE.search(v)):
                raise HistoryError(f"{at}: a string has an unpaired surrogate escape ({ascii(bad.group())}), "
                                   "which is not valid text")
    return obj


def _load_json(path: Path) -> Any:
    if not path.is_file():
        raise HistoryError(f"{path}: file not found")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise HistoryError(f"{path}: not UTF-8 text") from None
    return parse_json(text, str(path))


def _item(p: dict[str, Any]) -> Item | None:
    """A LaMP profile dict (or a loose {"text"}/{"output","input"} record) as an Item; None if unusable.

    The keys say which task the item comes from, so they also pick the template for raw inputs.
    """

    def get(*keys: str) -> str | None:
        return next((p[k] for k in keys if isinstance(p.get(k), str)), None)

    pid = str(p.get("id", ""))
    title, abstract, text = get("title"), get("abstract"), get("text")
    if title is not None and abstract is not None:
        return Item(title, TASKS["scholarly_titles"].prompt(abstract), pid)
    if title is not None and text is not None:
        return Item(title, TASKS["headlines"].prompt(text), pid)
    y = get("output", "y", "text")
    return None if y is None else Item(y, get("input", "x") or "", pid)


def items_to_lamp_profile(items: Sequence[Item]) -> list[dict[str, str]]:
    """Items as LaMP profile dicts: {"id","input","output"}, or {"id","text"} for free-form items (as LaMP-7)."""
    return [{"id": it.id, "input": it.x, "output": it.y} if it.x else {"id": it.id, "text": it.y} for it in items]


def _detect(raw: list[dict[str, Any]], where: Path) -> Task:
    """The task of a questions file without an outputs file: by its prompt, else by its profile keys."""
    first = str(raw[0]["input"])
    for t in TASKS.values():
        if t.fixed_start and first.startswith(t.fixed_start):
            return t
    keys = next((set(p) for q in raw for p in q["profile"] if isinstance(p, dict)), set())
    for need, name in (({"title", "abstract"}, "scholarly_titles"), ({"title", "text"}, "headlines"),
                       ({"input", "output"}, "commit_subjects"), ({"text"}, "tweets")):
        if need <= keys:
            return TASKS[name]
    raise HistoryError(f"{where}: cannot tell the task; add an outputs file with a \"task\" field")


def read_lamp(folder: str | Path, split: str) -> tuple[Task, list[Query]]:
    """Read a LaMP split; outputs (golds, possibly for a subset of queries) and meta (users) files are optional."""
    folder = Path(folder)
    qpath, opath, mpath = (folder / f"{split}_{k}.json" for k in ("questions", "outputs", "meta"))
    raw = _load_json(qpath)
    if not isinstance(raw, list) or not all(
        isinstance(q, dict) and "id" in q and isinstance(q.get("input"), str) and isinstance(q.get("profile"), list)
        for q in raw
    ):
        raise HistoryError(f"{qpath}: expected a list of {{\"id\", \"input\", \"profile\": [...]}} objects")
    if not raw:
        raise HistoryError(f"{qpath}: no queries")
    ids = [str(q["id"]) for q in raw]
    if len(set(ids)) != len(ids):
        raise HistoryError(f"{qpath}: duplicate query id {short_text(Counter(ids).most_common(1)[0][0])}")

    task, golds = None, {}
    if opath.exists():
        out = _load_json(opath)
        if not isinstance(out, dict) or not isinstance(out.get("golds"), list) or not all(
            isinstance(g, dict) and "id" in g and isinstance(g.get("output"), str) for g in out["golds"]
        ):
            raise HistoryError(f"{opath}: expected {{\"task\", \"golds\": [{{\"id\", \"output\"}}, ...]}}")
        golds = {str(g["id"]): g["output"] for g in out["golds"]}
        unknown = sorted(golds.keys() - set(ids))
        if unknown or len(golds) != len(out["golds"]):
            raise HistoryError(f"{opath}: output ids do not match {qpath.name} "
                               f"(e.g. {short_text(repr((unknown or ['duplicates'])[0]))})")
        if isinstance(out.get("task"), str):
            task = task_named(out["task"])
            if task is None:
                raise HistoryError(f"{opath}: unknown task {short_text(repr(out['task']))}; known: {', '.join(TASKS)}")
    task = task or _detect(raw, qpath)

    users: dict[str, str] = {}
    sources: dict[str, str] = {}
    if mpath.exists():
        rows = _load_json(mpath)
        if not isinstance(rows, list) or not all(isinstance(r, dict) and "id" in r for r in rows):
            raise HistoryError(f"{mpath}: expected a list of {{\"id\", \"user\"}} objects")
        users = {str(r["id"]): str(r["user"]) for r in rows if r.get("user") is not None}
        sources = {str(r["id"]): src for r in rows if (src := query_source(r)) is not None}

    queries = []
    for q, qid in zip(raw, ids):
        profile = []
        for j, p in enumerate(q["profile"]):
            item = _item(p) if isinstance(p, dict) else None
            if item is None:
                keys = sorted(p) if isinstance(p, dict) else type(p).__name__
                raise HistoryError(f"{qpath}: query {short_text(qid)} profile item {j} is unusable "
                                   f"(keys: {short_text(str(keys))})")
            profile.append(item)
        queries.append(Query(qid, q["input"], tuple(profile), golds.get(qid), users.get(qid), sources.get(qid)))
    return task, queries


def _write_json(path: Path, obj: Any | None) -> None:
    """Write atomically (temp file + os.replace); None removes the file so no stale one is read back."""
    if obj is None:
        path.unlink(missing_ok=True)
        return
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(obj, f, ensure_ascii=False, indent=1)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; these are ordinary data files
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_lamp(folder: str | Path, split: str, task: Task, queries: Sequence[Query], meta: bool = True) -> None:
    """Write a LaMP split that read_lamp reads back; outputs only if any gold, meta only if any user."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    questions = [{"id": q.id, "input": q.input, "profile": items_to_lamp_profile(q.profile)} for q in queries]
    golds = [{"id": q.id, "output": q.gold} for q in queries if q.gold is not None]
    users = [{"id": q.id, "user": q.user} | ({"source": q.source} if q.source else {})
             for q in queries if q.user is not None]
    _write_json(folder / f"{split}_questions.json", questions)
    _write_json(folder / f"{split}_outputs.json", {"task": task.lamp_name, "golds": golds} if golds else None)
    _write_json(folder / f"{split}_meta.json", users if meta and users else None)


_BAD_CHARS = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f\ufffd]")


def _check_text(text: str, source: str) -> None:
    if "\x00" in text or len(_BAD_CHARS.findall(text)) > 0.05 * len(text):
        raise HistoryError(f"{source} looks like binary data, not text")
    if bad := _SURROGATE.search(text):  # a browser can send half an emoji; no database or tokenizer takes it
        raise HistoryError(f"{source} has a broken character at position {bad.start()} (half of an emoji or "
                           "other surrogate pair); remove it and try again")


class History(list):
    """A parsed history: the items (a plain list of Item) and how many exact repeats were dropped."""

    duplicates: int = 0


def _clean(items: Sequence[Item], max_items: int, source: str) -> History:
    """Strip, drop empties, drop exact repeats (keeping order, counted in .duplicates), and enforce the item limit."""
    seen, out = set(), History()
    for it in items:
        it = replace(it, y=it.y.strip(), x=it.x.strip())
        if it.y and (it.y, it.x) in seen:
            out.duplicates += 1
        elif it.y:
            seen.add((it.y, it.x))
            out.append(it)
    if not out:
        raise HistoryError(f"{source} is empty: no text found")
    if len(out) > max_items:
        raise HistoryError(f"{source} has {len(out)} items; the limit is {max_items}. Keep your most recent ones.")
    return out


def parse_history(text: str, max_items: int = 500, max_chars: int = 2_000_000) -> list[Item]:
    """A pasted history: blank-line separated blocks if there are blank lines, else one item per line; newest
    first (LaMP's order), a paste read as written, its last line the newest (as_written)."""
    if len(text) > max_chars:
        raise HistoryError(f"history is {len(text):,} characters ({_size(len(text))}); the limit is {max_chars:,}")
    _check_text(text, "history")
    return _blocks(text, max_items, "history")


def history_text(texts: Sequence[str]) -> str:
    """Texts (in the order written, oldest first) as a paste that parse_history reads back: one a line, or blocks
    separated by a blank line when a text has several lines."""
    return ("\n\n" if any("\n" in t for t in texts) else "\n").join(texts)


def _blocks(text: str, max_items: int, source: str) -> list[Item]:
    """Plain text as items; source names the paste or the file in errors."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").strip()
    blank = re.compile(r"\n[ \t]*\n")
    parts = blank.split(text) if blank.search(text) else text.split("\n")
    return as_written(_clean([Item(y=p) for p in parts], max_items, source))


def as_written(items: History) -> History:
    """Items in the order written (oldest first, as a paste or a diary runs) turned newest first, LaMP's order that
    the store keeps: a fit holds out the first items, so a paste's are its last lines (issue 59)."""
    out = History(reversed(items))
    out.duplicates = items.duplicates
    return out


def _from_jsonl(text: str, name: str) -> list[Item]:
    items, dates = [], []
    for n, line in enumerate(re.split(r"\r\n?|\n", text), 1):  # not splitlines: JSON strings may hold \x85, \u2028
        if not line.strip():
            continue
        obj = parse_json(line, name, n)
        item = Item(y=obj) if isinstance(obj, str) else _item(obj) if isinstance(obj, dict) else None
        if item is None:
            raise HistoryError(f"{name} line {n}: expected a JSON string or an object with a \"text\" or \"output\" field")
        items.append(item)
        dates.append(_date_of(obj))
    return newest_first(items, dates)


DATE_KEYS = ("date", "time", "timestamp", "created_at", "created")


def _date_of(record) -> Any:
    return next((record[k] for k in DATE_KEYS if k in record), None) if isinstance(record, dict) else None


def _when(value) -> float | None:
    """A date as a number: ISO-8601 text (a day, or a time; no zone read as UTC) or seconds since 1970."""
    from datetime import datetime, timezone

    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if re.fullmatch(r"\d{9,}(\.\d*)?", str(value).strip()):  # seconds, as a CSV cell holds them
        return float(value)
    try:
        t = datetime.fromisoformat(str(value).strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return (t if t.tzinfo else t.replace(tzinfo=timezone.utc)).timestamp()


def newest_first(items: Sequence[Item], dates: Sequence[Any], written: bool = True) -> list[Item]:
    """The items newest first (LaMP's order) by their dates when every one has one, so a dated history holds out
    its newest whichever way its file is sorted (issue 59); else in the order written, the last the newest, as
    a paste (`written` False: in LaMP's order already, a LaMP profile)."""
    when = [_when(d) if d is not None else None for d in dates]
    if not items or any(w is None for w in when):
        return list(reversed(items)) if written else list(items)
    return [it for _, it in sorted(zip(when, items), key=lambda p: -p[0])]


def csv_rows(text: str, name: str) -> list[list[str]]:
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        return list(reader)
    except csv.Error as e:
        raise HistoryError(f"{name} line {reader.line_num}: not valid CSV ({e})") from None


def _from_csv(text: str, name: str) -> list[Item]:
    rows = csv_rows(text, name)
    if not rows:
        raise HistoryError(f"{name} is empty")
    header, rows = [h.strip().lower() for h in rows[0]], rows[1:]
    col = lambda i, r: r[i] if i < len(r) else ""  # noqa: E731
    y = next((header.index(k) for k in ("text", "output", "y") if k in header), None)
    if y is None:  # else the first column that holds text (not ids, numbers or blanks)
        y = next((i for i in range(len(header))
                  if any(col(i, r).strip() and not re.fullmatch(r"[\d.,:+-]*", col(i, r).strip()) for r in rows)), None)
    if y is None:
        raise HistoryError(f"{name}: no usable column; expected a \"text\" or \"output\" column "
                           f"(found: {short_text(', '.join(header))})")
    x = next((header.index(k) for k in ("input", "x") if k in header), None)
    d = next((header.index(k) for k in DATE_KEYS if k in header), None)
    return newest_first([Item(y=col(y, r), x=col(x, r) if x is not None else "") for r in rows],
                        [col(d, r) if d is not None else None for r in rows])


def _from_json(text: str, name: str) -> list[Item]:
    obj = parse_json(text, name)
    if isinstance(obj, list) and obj and isinstance(obj[0], dict) and "profile" in obj[0]:
        obj = obj[0]  # a LaMP questions file: the first query's profile
    profile = obj.get("profile") if isinstance(obj, dict) else obj
    if not isinstance(profile, list):
        raise HistoryError(f"{name}: expected a LaMP questions file or a list of profile items")
    items = []
    for j, p in enumerate(profile):
        item = Item(y=p) if isinstance(p, str) else _item(p) if isinstance(p, dict) else None
        if item is None:
            raise HistoryError(f"{name}: item {j} has no \"text\", \"output\" or \"title\" field")
        items.append(item)
    # a LaMP profile is newest first; a plain list of texts is read as written, as a paste
    return newest_first(items, [_date_of(p) for p in profile], written=not isinstance(obj, dict))


def read_history_file(path: str | Path, task: Task | None = None, max_bytes: int = 5_000_000,
                      max_items: int = 500) -> list[Item]:
    """A user's history from .txt, .jsonl, .csv or .json (LaMP); raw inputs get the task's template."""
    path = Path(path)
    name = path.name
    if not path.is_file():
        raise HistoryError(f"{name}: file not found")
    size = path.stat().st_size
    if size > max_bytes:
        raise HistoryError(f"{name} is {size:,} bytes ({_size(size)}); the limit is {max_bytes:,}")
    data = path.read_bytes()
    if not data.strip():
        raise HistoryError(f"{name} is empty")
    if data.startswith((b"\xff\xfe", b"\xfe\xff", b"\x00\x00\xfe\xff")):  # the BOMs of UTF-16 and UTF-32
        raise HistoryError(f"{name} is UTF-16 or UTF-32 text; save it as UTF-8 and upload it again")
    if b"\x00" in data:
        raise HistoryError(f"{name} looks like a binary file, not text")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise HistoryError(f"{name} is not UTF-8 text (bad byte at offset {e.start})") from None
    _check_text(text, name)
    suffix = path.suffix.lower()
    if suffix not in (".jsonl", ".csv", ".json"):
        return _blocks(text, max_items, name)  # read as a paste
    items = {".jsonl": _from_jsonl, ".csv": _from_csv, ".json": _from_json}[suffix](text, name)
    if task is not None:  # an input that is not yet a prompt gets the task's template
        items = [replace(it, x=it.x if not it.x or (task.prefix and it.x.startswith(task.prefix)) else task.prompt(it.x))
                 for it in items]
    return _clean(items, max_items, name)


def select_sources(queries: list[Query], sources: Sequence[str] = (), exclude: Sequence[str] = ()) -> list[Query]:
    """The queries whose source is among `sources` (all when empty) and not among `exclude`."""
    if (sources or exclude) and not any(q.source for q in queries):
        raise ValueError("this data names no sources (no meta file with a repo or venue): drop --sources/--exclude-sources")
    known = {q.source for q in queries}
    unknown = [x for x in (*sources, *exclude) if x not in known]
    if unknown:
        raise ValueError(f"unknown sources {unknown}; this data has {sorted(s for s in known if s)}")
    out = [q for q in queries if (not sources or q.source in sources) and q.source not in exclude]
    if not out:
        raise ValueError("no queries left after selecting sources")
    return out
