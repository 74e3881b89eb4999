"""A population from Debian changelogs (`population from-changelogs`): every Debian system ships, under
/usr/share/doc, each package's changelog.Debian.gz, whose entries are one maintainer's words about one upload.
Team uploads, binary-only rebuilds and no-change rebuilds are left out (their words are not a person's own), and
every rule's toll is counted in the report (population.PopulationReport).
"""

from __future__ import annotations

import email.utils
import gzip
import re
import zlib
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import timezone
from pathlib import Path
from typing import Sequence

from personalize.data import TASKS, HistoryError
from personalize.fitting.population import Entry, PopulationReport, check_limits, cut_lines, newest_first, \
    write_population

DEBIAN_DOCS = "/usr/share/doc"  # where every Debian-based system keeps its packages' changelog.Debian.gz
CHANGELOG_PROMPT = (TASKS["changelog_entries"].instruction + "\nPackage: {pkg}\n"
                    "Version: {version} (previous: {previous})\nDistribution: {dists}; {fields}")


_HEADER = re.compile(r"^(\w[-+0-9a-z.]*) \(([^ ()]+)\) ([^;]+?)\s*;\s*(.*?)\s*$", re.IGNORECASE)
_TRAILER = re.compile(r"^ -- (.*?)\s*<([^>]*)>\s*(.*?)\s*$")
_TEAM = re.compile(r"^\s*\[ .+ \]\s*$")
_BINNMU = re.compile(r"\+b\d")
_REBUILD = ("rebuild", "no-change rebuild", "no change rebuild", "binary-only non-maintainer upload")


@dataclass(frozen=True)
class ChangelogEntry:
    package: str
    version: str
    previous: str
    dists: str
    fields: str
    body: list[str]
    name: str
    mail: str
    date: str


def parse_changelog(text: str) -> tuple[list[ChangelogEntry], int]:
    """A changelog's entries, newest first, and how many headers had no trailer (malformed)."""
    raw: list[dict] = []
    cur: dict | None = None
    malformed = 0
    for line in text.splitlines():
        if m := _HEADER.match(line):
            malformed += cur is not None
            cur = {"package": m[1], "version": m[2], "dists": m[3], "fields": m[4], "body": []}
        elif cur is not None and (t := _TRAILER.match(line)):
            raw.append(cur | {"name": t[1], "mail": t[2], "date": t[3]})
            cur = None
        elif cur is not None:
            cur["body"].append(line)
    malformed += cur is not None
    return [ChangelogEntry(previous=raw[i + 1]["version"] if i + 1 < len(raw) else "none", **e)
            for i, e in enumerate(raw)], malformed


def changelog_body(lines: Sequence[str], limit: int = 400) -> str:
    """The maintainer's own text: the two-space indent of the format removed, their bullets and
    'Closes: #' kept exactly, cut at a line boundary."""
    body = "\n".join(re.sub(r"^ {1,2}", "", ln.rstrip()) for ln in lines).strip("\n")  # blank lines are "" here
    return cut_lines(body, limit).rstrip("\n")


def _is_rebuild(e: ChangelogEntry, body: str) -> bool:
    if _BINNMU.search(e.version):
        return True
    bullets = [ln for ln in body.splitlines() if ln.strip()]
    if not bullets or sum(ln.lstrip().startswith("*") for ln in bullets) > 1:
        return False
    text = " ".join(ln.strip() for ln in bullets).lstrip("* ").lower()
    return text.startswith(_REBUILD)


def _read_gz(path: Path) -> str:
    data = gzip.decompress(path.read_bytes())
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:  # old entries in latin-1
        return data.decode("latin-1")


def changelog_prompt(e: ChangelogEntry) -> str:
    return CHANGELOG_PROMPT.format(pkg=e.package, version=e.version, previous=e.previous, dists=e.dists,
                                   fields=e.fields)


def from_changelogs(docs: str | Path, out: str | Path, split: str = "dev", min_items: int = 8, max_items: int = 24,
                    body_chars: int = 400) -> PopulationReport:
    """Debian changelog entries per maintainer (the signer, keyed by name: a maintainer's several e-mail
    addresses are one person, _person_key). Team uploads (several authors' "[ Name ]" sections) and rebuilds
    (no words of the signer) are left out; an entry several binary packages share counts once."""
    check_limits(min_items, max_items)
    docs = Path(docs)
    if not docs.is_dir():
        raise HistoryError(f"{docs}: no such folder")
    files = sorted(docs.glob("*/changelog.Debian.gz"))
    if not files:
        raise HistoryError(f"{docs}: no */changelog.Debian.gz files")
    dropped: Counter[str] = Counter()
    seen: set[tuple[str, str]] = set()
    people: dict[str, list[Entry]] = defaultdict(list)
    names: dict[str, tuple[float, str]] = {}
    for path in files:
        try:
            entries, malformed = parse_changelog(_read_gz(path))
        except (OSError, EOFError, zlib.error, gzip.BadGzipFile):
            dropped["unreadable files"] += 1
            continue
        dropped["malformed entries"] += malformed
        for e in entries:
            if (e.package, e.version) in seen:
                continue  # the same source package's changelog under another binary package: not a drop
            seen.add((e.package, e.version))
            body = changelog_body(e.body, body_chars)
            try:
                when = email.utils.parsedate_to_datetime(e.date)
            except (TypeError, ValueError, IndexError):
                dropped["entries with an unreadable date"] += 1
                continue
            when = when if when.tzinfo else when.replace(tzinfo=timezone.utc)
            if _is_rebuild(e, body):
                dropped["rebuilds (binNMU, no-change)"] += 1
            elif not body.strip():
                dropped["empty entries"] += 1
            elif any(_TEAM.match(ln) for ln in e.body):
                dropped["team entries ([ Name ] sections)"] += 1
            elif not e.mail.strip():
                dropped["entries without a signer's e-mail"] += 1
            else:
                key, t = _person_key(e.name, e.mail), when.timestamp()
                people[key].append(Entry(body, changelog_prompt(e), f"{e.package}_{e.version}", e.package, t))
                if key not in names or t > names[key][0]:
                    names[key] = (t, e.name.strip())
    order = ("team entries ([ Name ] sections)", "rebuilds (binNMU, no-change)", "empty entries", "malformed entries",
             "entries with an unreadable date", "entries without a signer's e-mail", "unreadable files")
    return write_population(out, split, TASKS["changelog_entries"],
                            {k: newest_first(v) for k, v in people.items()}, {k: v[1] for k, v in names.items()},
                            min_items, max_items, {k: dropped[k] for k in order})


def _person_key(name: str, mail: str) -> str:
    """Who signed: their name, case and spacing folded (maintainers sign from several addresses over the years,
    and one person split in two would be "new" to a build that trained on the other half); the e-mail only
    where no name is given."""
    return " ".join(name.split()).casefold() or mail.strip().lower()
