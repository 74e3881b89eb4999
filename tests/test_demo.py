"""The demo population: size, determinism, and styles a reader (and a model) can tell apart."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

from personalize.data import TASKS, read_lamp
from personalize.demo import STYLES, write_demo

EMOJI = re.compile(r"[\U0001F300-\U0001FAFF\u2300-\u23FF\u2600-\u27BF]")


def _by_style(folder: Path) -> dict[str, list[list[str]]]:
    """Per style, per user: all texts the user wrote (profile outputs and gold)."""
    _, qs = read_lamp(folder, "dev")
    out: dict[str, list[list[str]]] = defaultdict(list)
    for q in qs:
        out[q.user.rsplit("_", 1)[0]].append([it.y for it in q.profile] + [q.gold])
    return out


def _caps(text: str) -> float:
    letters = [c for c in text if c.isalpha()]
    return sum(c.isupper() for c in letters) / len(letters)


def test_demo_population(tmp_path: Path) -> None:
    folder = write_demo(tmp_path / "demo")
    task, qs = read_lamp(folder, "dev")
    assert task is TASKS["tweets"]
    assert len(qs) >= 48 and len({q.user for q in qs}) == len(qs)
    assert len({q.user.rsplit("_", 1)[0] for q in qs}) >= 6 and set(STYLES) == {q.user.rsplit("_", 1)[0] for q in qs}
    assert qs[0].user == "terse_01"
    for q in qs:
        assert len(q.profile) >= 16 and q.gold
        assert q.input.startswith(TASKS["tweets"].prefix)
        assert all(it.x.startswith(TASKS["tweets"].prefix) and 0 < len(it.y) < 200 for it in q.profile)
        assert len({it.y for it in q.profile}) == len(q.profile)


def test_demo_is_deterministic(tmp_path: Path) -> None:
    a, b, c = write_demo(tmp_path / "a"), write_demo(tmp_path / "b"), write_demo(tmp_path / "c", seed=1)
    names = ("dev_questions.json", "dev_outputs.json", "dev_meta.json")
    assert all((a / n).read_bytes() == (b / n).read_bytes() for n in names)
    assert (a / names[0]).read_bytes() != (c / names[0]).read_bytes()


def test_styles_are_distinguishable(tmp_path: Path) -> None:
    styles = _by_style(write_demo(tmp_path, n_users_per_style=8, n_items=20))
    texts = {s: [t for user in users for t in user] for s, users in styles.items()}
    assert all(t == t.lower() and not EMOJI.search(t) for t in texts["terse"])
    assert all(len(EMOJI.findall(t)) >= 2 for t in texts["emoji"])
    assert all(_caps(t) > 0.95 for t in texts["hype"])
    assert all(t.count("#") >= 2 for t in texts["hashtag"])
    for s in ("formal", "academic"):
        assert all(t[0].isupper() and "#" not in t and not EMOJI.search(t) and _caps(t) < 0.3 for t in texts[s])
    assert sum(t.endswith(".") for t in texts["formal"]) > 0.9 * len(texts["formal"])
    hedges = ("suggest", "Anecdotally", "Field note", "Empirically", "Data point", "Observation", "We report", "Interestingly")
    assert all(any(h in t for h in hedges) for t in texts["academic"])
    assert not any(any(h in t for h in hedges) for t in texts["formal"])


def test_users_differ_inside_a_style(tmp_path: Path) -> None:
    """Each user has quirks: the word a user most often adds to the neutral content differs inside a cluster."""
    _, qs = read_lamp(write_demo(tmp_path), "dev")
    signatures: dict[str, set[str]] = defaultdict(set)
    for q in qs:
        added = Counter(w for it in q.profile for w in set(it.y.lower().split()) - set(it.x.lower().split()))
        word, n = min(added.items(), key=lambda kv: (-kv[1], kv[0]))
        assert n >= 0.4 * len(q.profile), (q.user, added)
        signatures[q.user.rsplit("_", 1)[0]].add(word)
    assert all(len(s) >= 6 for s in signatures.values()), signatures


def test_cli(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[1]
    run = lambda *a: subprocess.run([sys.executable, "-m", "personalize.demo", *a], cwd=root,  # noqa: E731
                                    capture_output=True, text=True, check=True).stdout
    assert "--out" in run("--help")
    assert str(tmp_path) in run("--out", str(tmp_path), "--users-per-style", "2", "--items", "16")
    assert len(read_lamp(tmp_path, "dev")[1]) == 2 * len(STYLES)
