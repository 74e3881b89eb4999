"""Every file path named in the code, its docstrings and the docs exists (issue 50): a reader who follows one finds it.

A path is a name with a folder and an extension (methods/card/own.py, docs/RESULTS.md); it may be written from the
repository's root or from personalize/, tests/ or docs/, or from the naming file's folder. What is no file of this
repository is listed below with its reason, and a file that left the package is named with the commit that holds it.
The rounds kept in docs/results/ are history: each names at its top the commit it was measured at, and the files it
names are that commit's, so its pages are not checked against today's tree (their first line is).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PATH = re.compile(r"(?<![\w./-])((?:[A-Za-z_][\w-]*/)+[\w-]+\.(?:py|md|sh|json|ini))\b")
COMMIT = re.compile(r"\b[0-9a-f]{7,40}\b")
BASES = (ROOT, ROOT / "personalize", ROOT / "tests", ROOT / "docs")
NOT_OURS = {  # a path named as what it stands for, not as a file here
    "OUT/": "a folder the command is given (gpu_check, far_person_shots)",
    "src/": "another repository's files (a fetched repository's commit, a test's diff)",
    "adapters/": "inside a build's artifacts folder",
}
HISTORY = ROOT / "docs" / "results"  # past rounds: the files they name are those of the commit named at their top


def named_paths():
    files = [ROOT / "app.py", ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for folder in ("personalize", "tests", "benchmarks", "tools"):
        files += sorted((ROOT / folder).rglob("*.py"))
    for f in files:
        if f == Path(__file__).resolve():  # its own check names a missing path on purpose
            continue
        if HISTORY in f.parents:  # a past round: the commit at its top holds what it names (checked below)
            continue
        for i, line in enumerate(f.read_text().splitlines(), 1):
            for m in PATH.finditer(line):
                yield f, i, line, m.group(1)


def test_every_named_path_exists():
    missing = []
    for f, i, line, name in named_paths():
        if any(name.startswith(p) for p in NOT_OURS) or COMMIT.search(line):  # a listed reason, or its commit
            continue
        if not any((base / name).exists() for base in (*BASES, f.parent)):
            missing.append(f"{f.relative_to(ROOT)}:{i}: {name}")
    assert not missing, "\n".join(missing)


def test_every_history_page_names_its_commit_at_its_top():
    pages = sorted(HISTORY.glob("*.md"))
    assert pages, "docs/results/ holds the earlier rounds"
    for page in pages:
        first = page.read_text().splitlines()[0]
        assert COMMIT.search(first), f"{page.relative_to(ROOT)} does not name its commit on its first line"


def test_the_check_finds_a_missing_path(tmp_path):
    assert PATH.findall("see methods/card/decode.py and `docs/RESULTS.md`") == ["methods/card/decode.py",
                                                                               "docs/RESULTS.md"]
    assert not (ROOT / "personalize" / "methods/card/decode.py").exists()
