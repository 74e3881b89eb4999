"""Populations from real sources: git repositories made here with real commits, gzipped Debian changelogs, CSV and
JSONL tables; each written folder read back with read_lamp, and one built and evaluated on a tiny model."""

from __future__ import annotations

import csv
import gzip
import json
import os
import subprocess
from pathlib import Path

import pytest

from personalize.cli import main
from personalize.data import TASKS, HistoryError, read_lamp
from personalize.methods.card.neutral import plain
from personalize.fitting.changelogs import from_changelogs
from personalize.fitting.population import from_git, from_table

COMMIT_START = "Write the commit message subject line for this change.\nFiles changed:\n"


# ---------------------------------------------------------------- git

def git(repo: Path, *args: str, env: dict | None = None) -> str:
    r = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                       env={**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(repo.parent), **(env or {})})
    assert r.returncode == 0, r.stderr
    return r.stdout if args[0] == "show" else r.stdout.strip()


class Repo:
    """A real repository; every commit by a given author at a given time (author and committer alike)."""

    def __init__(self, path: Path, origin: str | None = None):
        self.path, self.t = path, 1_700_000_000
        path.mkdir()
        git(path, "init", "-q", "-b", "main")
        if origin:
            git(path, "remote", "add", "origin", origin)

    def commit(self, who: tuple[str, str], subject: str, file: str | None = None, body: str = "") -> str:
        self.t += 3600
        f = self.path / (file or f"{subject.split()[0].lower()}.txt")
        f.write_text((f.read_text() if f.exists() else "") + f"{subject}\nline two of {subject}\n")
        git(self.path, "add", "-A")
        name, mail = who
        env = {"GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": mail, "GIT_COMMITTER_NAME": name,
               "GIT_COMMITTER_EMAIL": mail, "GIT_AUTHOR_DATE": f"{self.t} +0000", "GIT_COMMITTER_DATE": f"{self.t} +0000"}
        git(self.path, "commit", "-q", "-m", subject + (f"\n\n{body}" if body else ""), env=env)
        return git(self.path, "rev-parse", "HEAD")

    def merge(self, who: tuple[str, str], branch: str) -> None:
        self.t += 3600
        name, mail = who
        env = {"GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": mail, "GIT_COMMITTER_NAME": name,
               "GIT_COMMITTER_EMAIL": mail, "GIT_AUTHOR_DATE": f"{self.t} +0000", "GIT_COMMITTER_DATE": f"{self.t} +0000"}
        git(self.path, "merge", "-q", "--no-ff", "-m", f"Merge branch '{branch}'", branch, env=env)


ALICE = ("Alice Liddell", "alice@example.org")
ALICE_OLD = ("alice", "ALICE@old.example")  # the same person under an old address: .mailmap joins them
BOB = ("Bob Stone", "bob@example.org")
CAROL = ("Carol Wu", "carol@example.org")
BOT = ("dependabot[bot]", "49699333+dependabot[bot]@users.noreply.github.com")


@pytest.fixture(scope="module")
def widgets(tmp_path_factory) -> dict:
    """alice: 10 commits (one under her old address, the newest with a squash suffix) and a revert; bob: 9 on a
    branch merged by alice; carol: 3; dependabot: 2."""
    r = Repo(tmp_path_factory.mktemp("git") / "widgets", "git@github.com:acme/widgets.git")
    (r.path / ".mailmap").write_text(f"{ALICE[0]} <{ALICE[1]}> <{ALICE_OLD[1]}>\n")
    hashes = {"alice": [r.commit(ALICE_OLD, "start the widget module", "widget.py")]}
    hashes["alice"] += [r.commit(ALICE, f"widget: tidy part {i}", "widget.py") for i in range(4)]
    r.commit(BOT, "Bump numpy from 1.26 to 2.0", "requirements.txt")
    git(r.path, "checkout", "-q", "-b", "feature")
    hashes["bob"] = [r.commit(BOB, f"Feature step {i}.", f"feature{i % 3}.py") for i in range(9)]
    git(r.path, "checkout", "-q", "main")
    r.merge(ALICE, "feature")
    hashes["carol"] = [r.commit(CAROL, f"docs: typo {i}", "README.md") for i in range(3)]
    hashes["alice"] += [r.commit(ALICE, f"widget: tidy part {i}", "widget.py") for i in range(4, 8)]
    r.commit(ALICE, 'Revert "widget: tidy part 7"', "widget.py", body="This reverts a commit.")
    r.commit(BOT, "Bump flask from 2 to 3", "requirements.txt")
    hashes["alice"].append(r.commit(ALICE, "Add widget cache (#12)", "cache.py"))
    return {"repo": r, "hashes": hashes}


def test_from_git_keeps_people_and_counts_the_rest(widgets, tmp_path):
    out = tmp_path / "pop"
    rep = from_git([widgets["repo"].path], out, min_items=8)
    assert (rep.people, rep.items) == (2, 10 + 9)
    assert rep.dropped["people with < 8 items"] == 1 and rep.dropped["bot commits"] == 2
    assert rep.dropped["merges"] == 1 and rep.dropped["reverts"] == 1
    assert "kept 2 people, 19 items" in rep.summary() and "1 people with < 8 items, 2 bot commits, 1 merges, 1 reverts" in rep.summary()

    task, queries = read_lamp(out, "dev")
    assert task is TASKS["commit_subjects"]
    by_user = {q.user: q for q in queries}
    assert set(by_user) == {"Alice Liddell", "Bob Stone"}  # the mailmap's name; alice's old address joined
    alice, bob = by_user["Alice Liddell"], by_user["Bob Stone"]
    newest = widgets["hashes"]["alice"][-1]
    assert alice.id == f"acme/widgets@{newest}" and alice.source == "acme/widgets"
    assert alice.gold == "Add widget cache"  # the squash suffix stripped
    assert [it.y for it in alice.profile][:2] == ["widget: tidy part 7", "widget: tidy part 6"]  # newest first
    assert alice.profile[-1].y == "start the widget module" and len(alice.profile) == 9
    assert bob.gold == "Feature step 8." and len(bob.profile) == 8
    for q in queries:
        for x in (q.input, *(it.x for it in q.profile)):
            assert x.startswith(COMMIT_START) and "\nDiff excerpt:\ndiff --git a/" in x
    # the stat is git show's, line for line; the excerpt is the start of the -U1 diff
    repo = widgets["repo"].path
    stat = git(repo, "show", "--stat=80", "--format=", newest)
    diff = git(repo, "show", "--format=", "-U1", newest)
    assert alice.input == f"{COMMIT_START}{stat}Diff excerpt:\n{diff}"
    ids = [q.id for q in queries] + [it.id for q in queries for it in q.profile]
    assert len(set(ids)) == len(ids)
    meta = json.loads((out / "dev_meta.json").read_text())
    assert {tuple(sorted(m)) for m in meta} == {("id", "source", "user")}

    rep = from_git([repo], tmp_path / "cap", min_items=8, max_items=8)
    assert rep.items == 2 + 16 and all(len(q.profile) == 8 for q in read_lamp(tmp_path / "cap", "dev")[1])


def test_from_git_long_diff_is_cut_at_a_line(tmp_path):
    r = Repo(tmp_path / "big")
    for i in range(3):
        (r.path / "big.txt").write_text("".join(f"row {j} of change {i}\n" for j in range(400)))
        r.commit(ALICE, f"Rewrite big file {i}", "big.txt")
    rep = from_git([r.path], tmp_path / "pop", min_items=2)
    q = read_lamp(tmp_path / "pop", "dev")[1][0]
    excerpt = q.input.split("Diff excerpt:\n", 1)[1]
    assert rep.people == 1 and 800 < len(excerpt) <= 1000 and excerpt.endswith("\n")
    assert q.source == "big"  # no origin: the folder's name


def test_one_person_across_repositories(widgets, tmp_path):
    """The same e-mail in two repositories is one person whose query is their newest commit anywhere; a clone
    given beside its original adds no commit twice."""
    other = Repo(tmp_path / "gadgets")
    other.t = widgets["repo"].t + 10_000  # newer than anything in widgets
    for i in range(2):
        other.commit(CAROL, f"gadget: part {i}", "gadget.py")
    clone = tmp_path / "widgets-clone"
    subprocess.run(["git", "clone", "-q", str(widgets["repo"].path), str(clone)], check=True)
    rep = from_git([widgets["repo"].path, other.path, clone], tmp_path / "pop", min_items=4)
    queries = {q.user: q for q in read_lamp(tmp_path / "pop", "dev")[1]}
    carol = queries["Carol Wu"]
    assert carol.gold == "gadget: part 1" and carol.source == "gadgets" and len(carol.profile) == 4
    assert [it.id.split("@")[0] for it in carol.profile] == ["gadgets", "acme/widgets", "acme/widgets", "acme/widgets"]
    assert rep.people == 3 and rep.dropped["commits also in another repository"] > 20


def test_from_git_errors_through_the_cli(tmp_path, capsys):
    plain_dir = tmp_path / "plain"
    plain_dir.mkdir()
    assert main(["population", "from-git", "--repo", str(plain_dir), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "not a git repository" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert main(["population", "from-git", "--repo", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o")]) == 2
    assert "no such folder" in capsys.readouterr().err
    r = Repo(tmp_path / "tiny")
    r.commit(ALICE, "one")
    assert main(["population", "from-git", "--repo", str(r.path), "--out", str(tmp_path / "o")]) == 2
    assert "no person has at least 8 earlier items" in capsys.readouterr().err and not (tmp_path / "o").exists()
    assert main(["population", "from-git", "--repo", str(r.path), "--out", str(tmp_path / "o"), "--min-items", "3",
                 "--max-items", "2"]) == 2
    assert "--min-items" in capsys.readouterr().err


def test_from_git_cli_prints_the_counts(widgets, tmp_path, capsys):
    out = tmp_path / "pop"
    assert main(["population", "from-git", "--repo", str(widgets["repo"].path), "--out", str(out), "--split", "test"]) == 0
    printed = capsys.readouterr().out
    assert "kept 2 people, 19 items" in printed and "1 people with < 8 items" in printed and "wrote" in printed
    assert (out / "test_questions.json").exists() and not (out / "dev_questions.json").exists()


# ---------------------------------------------------------------- Debian changelogs

def entry(pkg, version, body, who, day, dist="unstable", urgency="urgency=medium"):
    return (f"{pkg} ({version}) {dist}; {urgency}\n\n" + "".join(f"  {ln}\n" if ln else "\n" for ln in body) +
            f"\n -- {who[0]} <{who[1]}>  {day} 2024 12:00:00 +0000\n\n")


ANA, BEN, CY = ("Ana Maint", "ana@debian.org"), ("Ben Packer", "Ben@Debian.org"), ("Cy Once", "cy@debian.org")
ANA_HOME = ("Ana  Maint", "ana@home.example")  # the same maintainer signing from another address: one person


def write_changelog(folder: Path, entries: list[str]) -> None:
    folder.mkdir(parents=True)
    (folder / "changelog.Debian.gz").write_bytes(gzip.compress("".join(entries).encode()))


@pytest.fixture()
def docs(tmp_path) -> Path:
    d = tmp_path / "doc"
    long = [f"* Change number {i} with a fairly long explanation of what it does." for i in range(12)]
    write_changelog(d / "alpha", [
        entry("alpha", "1.0-4", ["* New upstream release.", "  - Refresh patches.", "* Closes: #1000"], ANA, "Mon, 10 Jun"),
        entry("alpha", "1.0-3+b1", ["* Binary-only non-maintainer upload for amd64; no source changes."],
              ("buildd", "buildd@debian.org"), "Sun, 09 Jun", urgency="urgency=low, binary-only=yes"),
        entry("alpha", "1.0-3", ["[ Jane Helper ]", "* Fix typo.", "", "[ Ana Maint ]", "* Upload."], ANA, "Sat, 08 Jun"),
        entry("alpha", "1.0-2", long, ANA, "Fri, 07 Jun"),
        entry("alpha", "1.0-1", ["* Initial release (Closes: #999)"], ANA, "Thu, 06 Jun"),
    ])
    shared = (d / "alpha" / "changelog.Debian.gz").read_bytes()
    (d / "alpha-doc").mkdir()
    (d / "alpha-doc" / "changelog.Debian.gz").write_bytes(shared)  # a second binary package of the same source
    write_changelog(d / "beta", [entry("beta", f"2.{i}-1", [f"* beta change {i}"], BEN if i % 2 else ANA_HOME if i < 4 else ANA,
                                       f"Mon, 0{i + 1} Apr") for i in range(8, -1, -1)])
    write_changelog(d / "gamma", [
        entry("gamma", "0.3-1", ["* No-change rebuild against libfoo2"], BEN, "Tue, 02 Jul"),
        entry("gamma", "0.2-1", ["* gamma by ben"], BEN, "Mon, 01 Jul", dist="experimental", urgency="urgency=low"),
        entry("gamma", "0.1-1", ["* gamma by cy"], CY, "Wed, 01 May"),
    ])
    (d / "broken").mkdir()
    (d / "broken" / "changelog.Debian.gz").write_bytes(b"not gzip at all")
    (d / "emptydoc").mkdir()  # no changelog: not counted
    return d


def test_from_changelogs(docs, tmp_path):
    out = tmp_path / "deb"
    rep = from_changelogs(docs, out, min_items=4)
    # ana: alpha 1.0-4, 1.0-2, 1.0-1 + beta 2.0, 2.2, 2.4, 2.6, 2.8 = 8; ben: beta 2.1, 2.3, 2.5, 2.7 + gamma 0.2 = 5
    assert (rep.people, rep.items) == (2, 13)
    assert rep.dropped == {"people with < 4 items": 1, "team entries ([ Name ] sections)": 1,
                           "rebuilds (binNMU, no-change)": 2, "empty entries": 0, "malformed entries": 0,
                           "entries with an unreadable date": 0, "entries without a signer's e-mail": 0,
                           "unreadable files": 1}
    task, queries = read_lamp(out, "dev")
    assert task is TASKS["changelog_entries"]
    q = {q.user: q for q in queries}
    ana, ben = q["Ana Maint"], q["Ben Packer"]
    assert ana.input == ("Write the Debian changelog entry for this upload.\nPackage: alpha\n"
                         "Version: 1.0-4 (previous: 1.0-3+b1)\nDistribution: unstable; urgency=medium")
    assert ana.gold == "* New upstream release.\n  - Refresh patches.\n* Closes: #1000"
    assert ana.source == "alpha" and ana.id == "alpha_1.0-4"
    assert [it.id for it in ana.profile][:2] == ["alpha_1.0-2", "alpha_1.0-1"]  # June before April: newest first
    cut = ana.profile[0].y
    assert len(cut) <= 400 and cut.startswith("* Change number 0") and cut.endswith("what it does.")
    assert ben.gold == "* gamma by ben" and ben.source == "gamma"
    assert "Distribution: experimental; urgency=low" in ben.input
    assert q["Ana Maint"].profile[-1].x.endswith("Version: 2.0-1 (previous: none)\nDistribution: unstable; urgency=medium")
    # without the outputs file the task is still recognised, by the prompt
    (out / "dev_outputs.json").unlink()
    assert read_lamp(out, "dev")[0] is TASKS["changelog_entries"]


def test_from_changelogs_cli(docs, tmp_path, capsys):
    assert main(["population", "from-changelogs", "--docs", str(docs), "--out", str(tmp_path / "d"),
                 "--min-items", "4"]) == 0
    printed = capsys.readouterr().out
    assert "kept 2 people, 13 items" in printed and "1 team entries" in printed and "1 unreadable files" in printed
    assert main(["population", "from-changelogs", "--docs", str(tmp_path / "none"), "--out", str(tmp_path / "e")]) == 2
    assert "no such folder" in capsys.readouterr().err


# ---------------------------------------------------------------- tables

def test_table_with_inputs_csv(tmp_path):
    f = tmp_path / "posts.csv"
    rows = ["User,Text,INPUT,Source"] + [f"u{u},answer {i} of u{u},question {i},forum{u}" for i in range(5)
                                         for u in range(3)]
    rows += ["u0,,question x,forum0", ",orphan,question y,f", "u1,answer 0 of u1,question 0,forum1"]
    f.write_text("\n".join(rows) + "\n")
    rep = from_table(f, tmp_path / "w", min_items=3)
    assert (rep.people, rep.items) == (3, 15)
    assert rep.dropped == {"people with < 3 items": 0, "rows without text": 1, "rows without a user": 1,
                           "repeated rows": 1}
    task, queries = read_lamp(tmp_path / "w", "dev")
    assert task is TASKS["writing"]
    q0 = queries[0]
    assert (q0.user, q0.input, q0.gold, q0.source) == ("u0", "question 4", "answer 4 of u0", "forum0")
    assert [(it.x, it.y) for it in q0.profile][:1] == [("question 3", "answer 3 of u0")]
    # --task with an instruction: the raw inputs get its template
    from_table(f, tmp_path / "t", task="tweets", min_items=3)
    task, queries = read_lamp(tmp_path / "t", "dev")
    assert task is TASKS["tweets"] and queries[0].input == TASKS["tweets"].prompt("question 4")


def test_free_form_jsonl_sorted_by_time(tmp_path):
    f = tmp_path / "notes.jsonl"
    rows = [{"user": "zoe", "text": f"OMG note {i}!!! #wow 🔥", "time": 100 - i} for i in range(6)]  # newest first
    rows += [{"user": "yan", "text": f"note {i}", "time": f"2024-01-0{i + 1}T10:00:00"} for i in range(1)]
    f.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n")
    with pytest.raises(HistoryError, match="neither a number nor an ISO date"):
        from_table(f, tmp_path / "x", min_items=2)
    f.write_text("\n".join(json.dumps(r | {"time": r["time"] if isinstance(r["time"], int) else 1}, ensure_ascii=False)
                           for r in rows) + "\n")
    rep = from_table(f, tmp_path / "n", min_items=2)
    assert rep.people == 1 and rep.dropped["people with < 2 items"] == 1 and "neutral" in rep.note
    task, (q,) = read_lamp(tmp_path / "n", "dev")
    assert task is TASKS["rewrite"] and q.source == "notes.jsonl"
    assert q.gold == "OMG note 0!!! #wow 🔥"  # time 100: the newest
    assert q.input == TASKS["rewrite"].prompt(plain(q.gold)) and q.gold not in q.input
    assert [it.y for it in q.profile][:2] == ["OMG note 1!!! #wow 🔥", "OMG note 2!!! #wow 🔥"]
    assert all(it.x == "" for it in q.profile)
    questions = json.loads((tmp_path / "n" / "dev_questions.json").read_text())
    assert set(questions[0]["profile"][0]) == {"id", "text"}


def test_table_errors_through_the_cli(tmp_path, capsys):
    def run(f: Path, *extra: str) -> str:
        assert main(["population", "from-table", "--file", str(f), "--out", str(tmp_path / "o"), *extra]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1
        return err

    f = tmp_path / "a.csv"
    f.write_text("author,body\nx,y\n")
    assert "needs a \"user\" and a \"text\" column; found: author, body" in run(f)
    f.write_text("user,text\n")
    assert "has no rows" in run(f)
    f.write_text("")
    assert "is empty" in run(f)
    g = tmp_path / "b.jsonl"
    g.write_text('{"user": "a", "text": "b"}\n[1, 2]\n')
    assert "line 2: expected a JSON object" in run(g)
    g.write_text('{"user": "a", "text": "b"}\n' * 3)
    assert "no person has at least 8 earlier items" in run(g)
    assert "task writing takes full prompts" in run(g, "--task", "writing")
    assert "unknown task 'nope'" in run(g, "--task", "nope")
    (tmp_path / "a.txt").write_text("user,text\n")
    assert "expected a .csv or .jsonl file" in run(tmp_path / "a.txt")
    assert "file not found" in run(tmp_path / "missing.csv")


# ---------------------------------------------------------------- build and eval accept a folder

def test_build_and_eval_accept_a_table_population(tokenizer, tmp_path, capsys):
    """A table export (the demo's twelve writers as CSV rows of user, text and the neutral content as input) →
    from_table → the real build on a tiny random Llama → `eval` through the CLI."""
    from conftest import save_tiny_lm

    from personalize.methods.card.config import LoraSettings
    from personalize.methods.card.build import build
    from personalize.methods.card.config import CardConfig
    from personalize.serving.settings import DecodingSettings
    from personalize.demo import write_demo
    from personalize.methods.card.config import HeadSettings
    from personalize.lm.model_config import ModelConfig
    from personalize.lm.tokens import TokenBudget

    tweets = TASKS["tweets"]
    _, demo = read_lamp(write_demo(tmp_path / "demo", n_users_per_style=2, n_items=10), "dev")
    f = tmp_path / "people.csv"
    with f.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["user", "text", "input"])
        for q in demo:  # oldest first: the profile reversed, then the query
            for x, y in [(it.x, it.y) for it in reversed(q.profile)] + [(q.input, q.gold)]:
                w.writerow([q.user, y, x[len(tweets.prefix):]])
    rep = from_table(f, tmp_path / "lamp", task="tweets")
    assert (rep.people, rep.items) == (12, 132)
    task, queries = read_lamp(tmp_path / "lamp", "dev")
    assert task is tweets and sorted((q.user, q.input, q.gold, len(q.profile)) for q in queries) == \
        sorted((q.user, q.input, q.gold, len(q.profile)) for q in demo)

    save_tiny_lm(tokenizer, tmp_path / "lm")
    card = CardConfig(model=ModelConfig(str(tmp_path / "lm"), device="cpu"), ks=(1, 2), default_k=2,
                      budget=TokenBudget(32, 12), items_per_user=8, n_val_users=2,
                      lora=LoraSettings(r=4, alpha=8, targets=("q_proj", "v_proj"), batch_size=4, base_steps=2,
                                        cluster_steps=1),
                      head=HeadSettings(d=16, epochs=2), decoding=DecodingSettings(max_new_tokens=6), alphas=(0.0, 1.0))
    art = build(tmp_path / "lamp", "dev", tmp_path / "art", card, p2p=None)
    assert json.loads((art / "config.json").read_text())["task"] == "tweets"
    capsys.readouterr()
    assert main(["eval", "--artifacts", str(art), "--data", str(tmp_path / "lamp"), "--methods", "base,cluster,card",
                 "--limit", "2"]) == 0
    table = capsys.readouterr().out
    assert all(m in table for m in ("base", "cluster", "card"))


def test_a_mirror_without_origin_is_named_by_its_owner_and_name_folder(widgets, tmp_path):
    """A bare mirror laid out as owner+name/repo (as the fetch tool leaves it), with no origin URL: its people's
    source is owner/name, not "repo"."""
    from personalize.fitting.population import repo_source

    mirror = tmp_path / "acme+gizmos" / "repo"
    mirror.parent.mkdir()
    subprocess.run(["git", "clone", "-q", "--bare", str(widgets["repo"].path), str(mirror)], check=True)
    subprocess.run(["git", "-C", str(mirror), "remote", "remove", "origin"], check=True)
    assert repo_source(mirror) == "acme/gizmos"
    from_git([mirror], tmp_path / "pop", min_items=8)
    assert {q.source for q in read_lamp(tmp_path / "pop", "dev")[1]} == {"acme/gizmos"}
