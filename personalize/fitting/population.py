"""Populations from where people's writing already lives: git histories, Debian changelogs, a table.

Each source becomes a LaMP folder (data.write_lamp) that `build` and `eval` read: one query per person,
their newest item, with their earlier items, newest first, as the profile. Real people write in their
own style without being asked to, so these are evaluation populations nobody had to collect; the
rules below (bots, merges, reverts, team uploads, rebuilds out) keep only text a person chose the
words of, and every rule's toll is counted so a thin population can be explained.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from personalize.data import (TASKS, HistoryError, Item, Query, Task, csv_rows, parse_json, short_text, task_named,
                              write_lamp)
from personalize.methods.card.neutral import plain

COMMIT_PROMPT = TASKS["commit_subjects"].instruction + "\nFiles changed:\n{stat}Diff excerpt:\n{diff}"


@dataclass
class PopulationReport:
    """What a population command kept and, counted, why the rest was left out."""

    people: int
    items: int  # every text written: one query per person plus their profile items
    dropped: dict[str, int] = field(default_factory=dict)
    out: Path | None = None
    note: str = ""

    def summary(self) -> str:
        why = ", ".join(f"{n:,} {what}" for what, n in self.dropped.items() if n) or "nothing"
        return (f"kept {self.people:,} people, {self.items:,} items ({self.people:,} queries + "
                f"{self.items - self.people:,} profile items); dropped: {why}")


@dataclass(frozen=True)
class Entry:
    """One text of a person before it becomes a query or a profile item."""

    y: str
    x: str
    id: str
    source: str
    time: float = 0.0


def check_limits(min_items: int, max_items: int) -> None:
    if min_items < 1 or max_items < min_items:
        raise HistoryError(f"need 1 <= min_items <= max_items (got min_items={min_items}, max_items={max_items})")


def _unique_names(people: Mapping[str, Sequence[Entry]], names: Mapping[str, str]) -> dict[str, str]:
    """Display names that build can tell apart (it keys people by name): a shared name gets its key appended."""
    count = Counter(names.get(k) or k for k in people)
    return {k: (n if count[n] == 1 or n == k else f"{n} <{k}>") for k in people for n in [names.get(k) or k]}


def write_population(out: str | Path, split: str, task: Task, people: Mapping[str, Sequence[Entry]],
                     names: Mapping[str, str], min_items: int, max_items: int, dropped: Mapping[str, int],
                     query_input: Callable[[Entry], str] | None = None) -> PopulationReport:
    """Per-person texts (newest first) → one query per person, written only when someone is left.

    The newest text is the query because that is how the person will be scored: predicting what they
    write next from what they wrote before. Nothing is written for an empty population, since a folder
    without queries is one that `build` and `eval` would reject anyway, later and less clearly.
    """
    check_limits(min_items, max_items)
    short = sum(1 for es in people.values() if len(es) - 1 < min_items)
    dropped = {f"people with < {min_items} items": short, **dropped}
    kept = {k: list(es[: max_items + 1]) for k, es in people.items() if len(es) - 1 >= min_items}
    if not kept:
        why = ", ".join(f"{n:,} {w}" for w, n in dropped.items() if n) or "no items at all"
        raise HistoryError(f"no person has at least {min_items} earlier items, so nothing was written ({why})")
    display = _unique_names(kept, names)
    queries = []
    for key in sorted(kept, key=lambda k: (display[k].casefold(), k)):
        first, *rest = kept[key]
        queries.append(Query(first.id, (query_input or (lambda e: e.x))(first),
                             tuple(Item(e.y, e.x, e.id) for e in rest), first.y, display[key], first.source))
    ids = [q.id for q in queries] + [it.id for q in queries for it in q.profile]
    if len(set(ids)) != len(ids):  # the sources' ids are unique by construction; a clash is a bug, not bad input
        raise AssertionError(f"duplicate item id {Counter(ids).most_common(1)[0][0]!r}")
    write_lamp(out, split, task, queries)
    return PopulationReport(len(queries), sum(1 + len(q.profile) for q in queries), dropped, Path(out))


def newest_first(entries: Iterable[Entry]) -> list[Entry]:
    return sorted(entries, key=lambda e: -e.time)  # stable: equal times keep the source's own order


def cut_lines(text: str, limit: int) -> str:
    """At most `limit` characters ending at a line break (the first line cut at a space if it alone is longer),
    so a prompt never ends mid-token of a half line."""
    out, n = [], 0
    for line in text.splitlines(keepends=True):
        if n + len(line) > limit:
            break
        out.append(line)
        n += len(line)
    if out or not text:
        return "".join(out)
    head = text[:limit]
    return head.rsplit(" ", 1)[0] if " " in head[limit // 2:] else head


# ---------------------------------------------------------------- git

_BOT = re.compile(r"\[bot\]|dependabot|renovate|github-actions|actions?@github\.com|pre-commit-ci|greenkeeper|"
                  r"mergify|snyk-bot|imgbot|allcontributors|(?<![a-z0-9])bot@|[-_.]bot(?![a-z0-9])|^bot$| bot$",
                  re.IGNORECASE)
_SQUASH = re.compile(r"\s*\(#\d+\)$")
_MARK = "\x01population\x01"


def is_bot(name: str, mail: str) -> bool:
    return bool(_BOT.search(name.strip()) or _BOT.search(mail.strip()))


def _git_env(repo: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE")}
    # a folder inside some other repository is not that repository: git must not search the parents
    env["GIT_CEILING_DIRECTORIES"] = str(repo.resolve().parent)
    return env


def _git(repo: Path, *args: str, fail: str | None = None) -> str:
    """git's output; `fail`: what a non-zero exit says (else git's last line of error)."""
    try:
        r = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, env=_git_env(repo))
    except FileNotFoundError:
        raise HistoryError("git is not installed (it reads the repositories)") from None
    if r.returncode:
        raise HistoryError(fail or _git_failed(repo, args[0], r.stderr, r.returncode))
    return r.stdout.decode("utf-8", "replace")


def _git_failed(repo: Path, command: str, stderr: bytes, rc: int) -> str:
    err = stderr.decode("utf-8", "replace").strip().splitlines()
    return f"{repo}: git {command} failed: {err[-1] if err else f'exit {rc}'}"


def repo_source(repo: Path) -> str:
    """owner/name from the origin URL (https, ssh or scp-like), else the folder's name."""
    try:
        url = _git(repo, "config", "--get", "remote.origin.url").strip()
    except HistoryError:  # no origin: config --get exits 1
        url = ""
    parts = [p for p in re.split(r"[/:]", url.rstrip("/")) if p]
    if not parts:
        folder = repo.resolve()
        if folder.name in (".git", "repo"):  # a clone's .git, or a mirror laid out as owner+name/repo
            folder = folder.parent
        name = folder.name.replace("+", "/")
        return name[:-4] if name.endswith(".git") and len(name) > 4 else name
    parts[-1] = parts[-1][:-4] if parts[-1].endswith(".git") else parts[-1]
    return "/".join(parts[-2:])


def _check_repo(repo: Path) -> None:
    if not repo.exists():
        raise HistoryError(f"{repo}: no such folder")
    _git(repo, "rev-parse", "--git-dir", fail=f"{repo}: not a git repository")


def _commit_changes(repo: Path, hashes: Sequence[str], stat_chars: int, diff_chars: int) -> dict[str, tuple[str, str]]:
    """hash → (stat, diff excerpt), from ONE `git log --no-walk --stdin` for all the commits kept: one process
    instead of two `git show` per commit (seconds instead of minutes on a big history). The output is streamed,
    keeping only each commit's first characters, so a commit that vendors megabytes costs no memory."""
    out: dict[str, tuple[list[str], list[str]]] = {}
    with tempfile.TemporaryFile() as stdin, tempfile.TemporaryFile() as stderr:
        stdin.write("".join(h + "\n" for h in hashes).encode())
        stdin.seek(0)
        proc = subprocess.Popen(
            ["git", "-C", str(repo), "log", "--no-walk=unsorted", "--stdin", "--no-color", "--no-ext-diff",
             f"--format={_MARK}%H", "--stat=80", "-p", "-U1"],
            stdin=stdin, stdout=subprocess.PIPE, stderr=stderr, env=_git_env(repo))
        stat: list[str] = []
        diff: list[str] = []
        phase, used = "", 0
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode("utf-8", "replace")
            if line.startswith(_MARK):
                stat, diff, phase, used = [], [], "head", 0
                out[line[len(_MARK):].strip()] = (stat, diff)
                continue
            if phase == "head":  # `---` separates the (empty) message from the stat
                phase = "stat"
                if line.rstrip("\n") == "---":
                    continue
            if phase == "stat":
                if line.strip():
                    stat.append(line)
                    continue
                phase, used = "diff", 0
                continue
            if phase == "diff" and used < diff_chars:
                diff.append(line)
                used += len(line)
        rc = proc.wait()
        if rc:
            stderr.seek(0)
            raise HistoryError(_git_failed(repo, "log", stderr.read(), rc))
    result = {}
    for h, (stat, diff) in out.items():
        s = "".join(stat)
        if len(s) > stat_chars:  # keep the "N files changed" summary: how big a change is shapes its subject
            s = cut_lines("".join(stat[:-1]), stat_chars - len(stat[-1])) + stat[-1]
        result[h] = (s, cut_lines("".join(diff), diff_chars))
    return result


def commit_prompt(stat: str, diff: str) -> str:
    return COMMIT_PROMPT.format(stat=stat, diff=diff)


def from_git(repos: Sequence[str | Path], out: str | Path, split: str = "dev", min_items: int = 8,
             max_items: int = 24, diff_chars: int = 1000, stat_chars: int = 1500) -> PopulationReport:
    """Commit subjects per author, across the repositories given (one person per author e-mail, as the
    mailmap gives it), in the layout of the commit_subjects data. Merges, reverts and bots are left out:
    their subjects are written by a tool or a template, not by the person."""
    check_limits(min_items, max_items)
    repos = [Path(r) for r in repos]
    if not repos:
        raise HistoryError("no repository given")
    for r in repos:
        _check_repo(r)
    dropped: Counter[str] = Counter()
    # author e-mail → (repo index, hash, author time, subject, name)
    commits: dict[str, list[tuple[int, str, float, str, str]]] = defaultdict(list)
    seen: set[str] = set()
    sources = [repo_source(r) for r in repos]
    for ri, repo in enumerate(repos):
        try:
            _git(repo, "rev-parse", "--verify", "--quiet", "HEAD")
        except HistoryError:
            dropped["empty repositories"] += 1
            continue
        dropped["merges"] += int(_git(repo, "rev-list", "--merges", "--count", "HEAD").strip() or 0)
        log = _git(repo, "log", "--no-merges", "--format=%H%x00%aN%x00%aE%x00%at%x00%s", "HEAD")
        for line in log.splitlines():
            fields = line.split("\x00", 4)
            if len(fields) != 5:
                continue
            h, name, mail, t, subject = fields
            if h in seen:  # a fork or a clone given twice: the same commit once
                dropped["commits also in another repository"] += 1
                continue
            seen.add(h)
            subject = _SQUASH.sub("", subject.strip())
            if is_bot(name, mail):
                dropped["bot commits"] += 1
            elif subject.startswith(("Revert ", 'Revert"')):
                dropped["reverts"] += 1
            elif not subject:
                dropped["empty subjects"] += 1
            else:
                key = mail.strip().lower() or name.strip()
                commits[key].append((ri, h, float(t or 0), subject, name.strip()))
    # Only the commits that will be written get their stat and diff read.
    chosen: dict[str, list[tuple[int, str, float, str, str]]] = {}
    need: dict[int, list[str]] = defaultdict(list)
    for key, cs in commits.items():
        cs.sort(key=lambda c: -c[2])
        enough = len(cs) - 1 >= min_items
        chosen[key] = cs[: max_items + 1] if enough else cs
        for ri, h, *_ in chosen[key] if enough else ():
            need[ri].append(h)
    changes: dict[str, tuple[str, str]] = {}
    for ri, hashes in need.items():
        changes |= _commit_changes(repos[ri], hashes, stat_chars, diff_chars)
    people = {key: [Entry(subject, commit_prompt(*changes.get(h, ("", ""))), f"{sources[ri]}@{h}", sources[ri], t)
                    for ri, h, t, subject, _ in cs] for key, cs in chosen.items()}
    names = {key: cs[0][4] for key, cs in chosen.items()}
    order = ("bot commits", "merges", "reverts", "empty subjects", "commits also in another repository",
             "empty repositories")
    return write_population(out, split, TASKS["commit_subjects"], people, names, min_items, max_items,
                            {k: dropped[k] for k in order})


# ---------------------------------------------------------------- a table

REWRITE_NOTE = ("query inputs are rule-based neutral versions of each person's newest text (personalize.neutral.plain: "
                "symbols, hashtags, shouting and repeated punctuation removed), not a model's rewrites")


def _read_table(path: Path) -> tuple[list[str], list[dict[str, object]]]:
    """(columns found, rows as dicts with lower-cased keys), in file order."""
    if not path.is_file():
        raise HistoryError(f"{path}: file not found")
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise HistoryError(f"{path.name} is not UTF-8 text (bad byte at offset {e.start})") from None
    if not text.strip():
        raise HistoryError(f"{path.name} is empty")
    if path.suffix.lower() == ".csv":
        rows = csv_rows(text, path.name)
        header = [h.strip().lower() for h in rows[0]]
        return header, [{h: r[i] for i, h in enumerate(header) if i < len(r)}
                        for r in rows[1:] if any(c.strip() for c in r)]
    if path.suffix.lower() == ".jsonl":
        columns: dict[str, None] = {}
        out = []
        for n, line in enumerate(re.split(r"\r\n?|\n", text), 1):
            if not line.strip():
                continue
            obj = parse_json(line, path.name, n)
            if not isinstance(obj, dict):
                raise HistoryError(f"{path.name} line {n}: expected a JSON object with \"user\" and \"text\"")
            row = {str(k).strip().lower(): v for k, v in obj.items()}
            columns |= dict.fromkeys(row)
            out.append(row)
        return list(columns), out
    raise HistoryError(f"{path.name}: expected a .csv or .jsonl file")


def _times(rows: Sequence[dict[str, object]], name: str) -> list[float]:
    """The `time` column as numbers (seconds) or ISO dates; one unreadable value stops the command, since a
    half-sorted history would pick the wrong newest item."""
    values = [r.get("time") for r in rows]
    try:
        return [float(v) for v in values]  # type: ignore[arg-type]
    except (TypeError, ValueError):
        pass
    out = []
    for n, v in enumerate(values, 1):
        try:
            t = datetime.fromisoformat(str(v).strip().replace("Z", "+00:00"))
        except ValueError:
            raise HistoryError(f"{name} row {n}: time {short_text(repr(v))} is neither a number nor an ISO date") from None
        out.append((t if t.tzinfo else t.replace(tzinfo=timezone.utc)).timestamp())
    return out


def from_table(path: str | Path, out: str | Path, task: str | None = None, split: str = "dev", min_items: int = 8,
               max_items: int = 24) -> PopulationReport:
    """Rows of (user, text[, input][, time][, source]): any export a team already has (posts, reviews,
    messages) becomes a population. Without an input column the items are free-form and the query's prompt is
    a rule-based neutral version of the gold, because a prompt holding the gold itself would score copying."""
    check_limits(min_items, max_items)
    path = Path(path)
    columns, rows = _read_table(path)
    if "user" not in columns or "text" not in columns:
        raise HistoryError(f"{path.name}: needs a \"user\" and a \"text\" column; found: "
                           f"{short_text(', '.join(columns) or 'none', 200)}")
    if not rows:
        raise HistoryError(f"{path.name} has no rows")
    has_input = "input" in columns
    chosen = task_named(task) if task else TASKS["writing" if has_input else "rewrite"]
    if chosen is None:
        raise HistoryError(f"unknown task {short_text(repr(task))}; known: {', '.join(TASKS)}")
    if not has_input and not chosen.prefix:
        raise HistoryError(f"task {chosen.name} takes full prompts: {path.name} needs an \"input\" column for it "
                           f"(found: {short_text(', '.join(columns), 200)})")
    times = _times(rows, path.name) if "time" in columns else [0.0] * len(rows)
    order = sorted(range(len(rows)), key=lambda i: times[i])  # oldest first; file order among equal times
    dropped: Counter[str] = Counter()
    people: dict[str, list[Entry]] = defaultdict(list)
    seen: set[tuple[str, str, str]] = set()
    text_of = lambda v: "" if v is None else (v if isinstance(v, str) else str(v))  # noqa: E731
    for rank, i in enumerate(order):
        r = rows[i]
        user, y = text_of(r.get("user")).strip(), text_of(r.get("text")).strip()
        raw_x = text_of(r.get("input")).strip()
        why = ("rows without a user" if not user else "rows without text" if not y
               else "rows without an input" if has_input and not raw_x
               else "repeated rows" if (user, raw_x, y) in seen  # in the profile, it would answer the query by copying
               else None)
        if why:
            dropped[why] += 1
            continue
        seen.add((user, raw_x, y))
        x = "" if not has_input else raw_x if not chosen.prefix or raw_x.startswith(chosen.prefix) \
            else chosen.prompt(raw_x)
        source = text_of(r.get("source")).strip() or path.name
        people[user].append(Entry(y, x, f"row{i + 1}", source, float(rank)))
    report = write_population(
        out, split, chosen, {k: v[::-1] for k, v in people.items()}, {k: k for k in people}, min_items, max_items,
        dict(dropped), query_input=None if has_input else (lambda e: chosen.prompt(plain(e.y))))
    if not has_input:
        report.note = REWRITE_NOTE
    return report
