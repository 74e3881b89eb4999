"""kill -9 of the studio in the middle of a fit, of an OPPU training and of a vote: nothing is lost.

Each kill is a real SIGKILL of a real process that is working: a worker process (started once per module, with
the tiny artifacts' engine loaded) forks one child per kill; the child opens the store or the OPPU folder itself,
prints a marker right before the work (FITTING, VOTING, TRAINING, SAVING...), and the test sleeps a chosen delay
after reading it and kills the child. Forking keeps each kill at a fraction of a second instead of a fresh
interpreter's import and load (seconds), so every scenario kills several times at different moments.

After each kill, as a restarted studio would: the store opens, `PRAGMA integrity_check` is ok, the user's vector is
the previous one or the whole new fit (never a mix), every vote the child reported committed is there intact, and
a fresh OPPU method loads only a complete adapter (the previous one or the new one), or says that training is
needed, never a half-written one. Besides the kills at chosen delays (which land wherever the work happens to
be), three kills land at exact points of an adapter save, the child pausing there: the weights file half written,
the weights whole but no meta yet, and the old adapter moved aside but the new one not yet renamed in.

How many kills each scenario survived is printed at the end of the module ("test_crash: N kills survived") and
attached to each test (`kills`, `outcomes`; in junit xml as the suite properties `crash_<scenario>_kills`).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import queue
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from personalize.data import Item, read_lamp
from personalize.store import Store

pytestmark = pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "win32",
                                reason="the crash tests fork a worker process (POSIX only)")

ROOT = Path(__file__).resolve().parents[1]
KILLS: dict[str, int] = {}  # scenario -> SIGKILLs that landed in a working process
OUTCOMES: dict[str, dict[str, int]] = {}  # scenario -> what a restart found -> count
FIT_FRACTIONS = (0.1, 0.35, 0.6, 0.85, 1.0, 1.6)  # kill moments as fractions of one measured onboarding
WRITE_DELAYS = (0.004, 0.02, 0.05)  # seconds into a loop of vector writes
VOTE_DELAYS = (0.0, 0.003, 0.02, 0.05, 0.1, 0.2)  # seconds after the first vote of a loop of votes
TRAIN_FRACTIONS = (0.15, 0.4, 0.7, 0.9, 1.0, 1.3)  # of one measured OPPU training + save, user with an adapter
FIRST_FRACTIONS = (0.5, 0.95)  # ... user without one
SAVE_DELAYS = (0.001, 0.006, 0.015, 0.03, 0.06)  # seconds into a loop of adapter saves


def rating(i: int) -> dict:
    """The i-th vote the child writes (the parent rebuilds it to compare); texts long enough to overflow a page."""
    return {"rater": f"rater {i % 7}", "prompt": f"prompt {i} " + "p" * 300, "user": None if i % 3 else f"u{i}",
            "method_a": "card", "output_a": f"a{i} " + "α" * 2500,
            "method_b": "oppu", "output_b": f"b{i} " + "b" * 3000,
            "winner": ("a", "b", "tie", "both_bad")[i % 4], "settings": {"i": i, "alpha": i / 7},
            "gen_a": i, "gen_b": i + 1}


WORKER = '''
import ctypes, json, os, signal, sys, time
sys.path.insert(0, ROOT)
import numpy as np
from personalize.data import Item
from personalize.store import Store
from personalize.methods.engine import Engine
from personalize.methods.card.person import fit_person
from personalize.methods.base import UserContext
from personalize.methods.oppu import OppuConfig, OppuMethod, adapter_id

ENGINE = Engine.load(sys.stdin.readline().strip())  # the artifacts, sent once built (imports go on meanwhile)


def say(*parts):
    sys.stdout.write(" ".join(map(str, parts)) + "\\n")
    sys.stdout.flush()


RATING

def fit(job):
    store = Store(job["db"])
    for r in range(job["rounds"]):
        say("FITTING", r)
        t0 = time.perf_counter()
        fit_person(ENGINE, store, job["user"])
        say("SAVED", r, time.perf_counter() - t0)


def write(job):  # one fit, then its vector and the previous one written in turn
    store = Store(job["db"])
    done, _ = fit_person(ENGINE, store, job["user"])
    new = (done.lam, ENGINE.lm.model_id, done.stats(), done.style.extras_bytes() if done.style is not None else None)
    v0 = (np.asarray(job["v0"], np.float32), job["v0_model"], {"v0": True}, None)
    say("WRITING")
    for r in range(job["rounds"]):
        vec, model_id, stats, style = (new, v0)[r % 2]
        store.save_vector(job["user"], ENGINE.artifacts_id, vec, model_id, stats, style)
        say("WROTE", r)


def vote(job):
    store = Store(job["db"])
    say("VOTING")
    for i in range(job["start"], job["start"] + job["rounds"]):
        say("COMMITTED", store.add_rating(**rating(i)), i)


def _method_and_user(job):
    items = [Item(y=y, x=x, id=str(i)) for i, (x, y) in enumerate(job["items"])]
    return OppuMethod(ENGINE, cfg=OppuConfig(**job["cfg"])), UserContext(job["user"], items)


def train(job):
    method, user = _method_and_user(job)
    for r in range(job["rounds"]):
        say("TRAINING", r)
        t0 = time.perf_counter()
        info = method.prepare(user)
        say("SAVED", r, time.perf_counter() - t0, info["train_s"])


def save(job):  # the new adapter loaded from a copy, then saved over the previous one again and again
    method, user = _method_and_user(job)
    source = OppuMethod(ENGINE, cfg=OppuConfig(**job["cfg"] | {"folder": job["source"]}))
    ada = source.activate(user)
    info = {k: v for k, v in source.saved(ada)[1].items() if k != "files"}
    pause = job.get("pause")
    if pause == "aside":  # stop between the two renames: the old adapter moved aside, the new one not yet in place
        rename = os.rename

        def paused_rename(src, dst):
            rename(src, dst)
            if ".old-" in str(dst):
                say("PAUSED")
                time.sleep(120)

        os.rename = paused_rename
    elif pause == "meta":  # stop with the new weights written but not yet their meta
        dumps = json.dumps

        def paused_dumps(obj, *a, **kw):
            if isinstance(obj, dict) and "files" in obj and "history" in obj:
                say("PAUSED")
                time.sleep(120)
            return dumps(obj, *a, **kw)

        json.dumps = paused_dumps
    elif pause == "weights":  # stop with the new weights file cut in half, as a kill inside its write leaves it
        import peft.peft_model

        write = peft.peft_model.safe_save_file

        def torn_write(tensors, filename, *a, **kw):
            write(tensors, filename, *a, **kw)
            os.truncate(filename, os.path.getsize(filename) // 2)
            say("PAUSED")
            time.sleep(120)

        peft.peft_model.safe_save_file = torn_write
    say("SAVING")
    for r in range(job["rounds"]):
        method.save(ada, info)
        say("SAVED", r)


JOBS = {"fit": fit, "write": write, "vote": vote, "train": train, "save": save}
say("READY")
for line in sys.stdin:
    job = json.loads(line)
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:  # the child: does the job until killed
        try:
            ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: never outlive the worker (Linux)
        except (AttributeError, OSError):
            pass
        try:
            JOBS[job["job"]](job)
            say("DONE")
        except BaseException as e:
            say("ERROR", repr(e).replace("\\n", " "))
        finally:
            sys.stdout.flush()
            os._exit(0)
    say("CHILD", pid)
    _, status = os.waitpid(pid, 0)
    say("REAPED", pid, os.WTERMSIG(status) if os.WIFSIGNALED(status) else -1)
'''


class Worker:
    """A Python process with the engine loaded that forks one child per job; `run` kills the child with SIGKILL
    `delay` seconds after it printed `marker` (or lets it finish when no marker is given)."""

    def __init__(self, folder: Path):
        script = folder / "worker.py"
        script.write_text(WORKER.replace("ROOT", repr(str(ROOT)), 1).replace("RATING", inspect.getsource(rating), 1))
        env = os.environ | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
                            "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
        self.stderr_path = folder / "worker.err"
        self._err = self.stderr_path.open("w")
        self.proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._err, text=True, env=env, cwd=folder)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.busy, self.pid = False, None  # a job sent and its child not yet reaped; that child's pid
        threading.Thread(target=self._read, daemon=True).start()

    def load(self, artifacts: Path) -> None:
        self.proc.stdin.write(f"{artifacts}\n")
        self.proc.stdin.flush()
        self._expect(lambda line: line == "READY", 300)

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def _next(self, deadline: float) -> str:
        try:
            line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"worker silent; stderr:\n{self.stderr()}") from None
        if line is None:
            raise AssertionError(f"worker exited; stderr:\n{self.stderr()}")
        if line.startswith("ERROR"):
            raise AssertionError(f"child failed: {line}; stderr:\n{self.stderr()}")
        return line

    def _expect(self, match, timeout: float) -> list[str]:
        deadline, seen = time.monotonic() + timeout, []
        while True:
            seen.append(self._next(deadline))
            if match(seen[-1]):
                return seen

    def stderr(self) -> str:
        self._err.flush()
        return self.stderr_path.read_text()[-3000:]

    def run(self, scenario: str | None, job: dict, marker: str | None = None, delay: float = 0.0,
            timeout: float = 300) -> list[str]:
        """The child's output lines; with a marker the child is killed and the kill counted for `scenario`."""
        self._settle()
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        self.busy, self.pid = True, None
        deadline = time.monotonic() + timeout
        if marker is None:
            seen = self._expect(self._child_line, timeout)
            self.busy = False
            assert "DONE" in seen and seen[-1].endswith(" -1"), seen
            return seen
        seen = []
        while self.pid is None or not any(line == marker or line.startswith(marker + " ") for line in seen):
            line = self._next(deadline)
            seen.append(line)
            self._child_line(line)
            assert not line.startswith(("DONE", "REAPED")), f"the child finished before the kill: {seen}"
        time.sleep(delay)
        with contextlib.suppress(ProcessLookupError):  # a child that died by itself: the check below says so
            os.kill(self.pid, signal.SIGKILL)
        seen += self._expect(self._child_line, deadline - time.monotonic())
        self.busy = False
        assert seen[-1] == f"REAPED {self.pid} {int(signal.SIGKILL)}", f"the kill did not land mid-work: {seen}"
        KILLS[scenario] = KILLS.get(scenario, 0) + 1
        return [line for line in seen if not line.startswith(("CHILD", "REAPED"))]

    def _child_line(self, line: str) -> bool:
        """Notes the child's pid; True once the worker reaped it."""
        if line.startswith("CHILD "):
            self.pid = int(line.split()[1])
        return line.startswith("REAPED")

    def _settle(self) -> None:
        """After a failed run: the child killed (it would train or vote for hours) and its lines read away, so
        the next run starts in step."""
        deadline, killed = time.monotonic() + 60, None
        while self.busy:
            if self.pid is not None and killed != self.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                killed = self.pid
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError("the worker is stuck after an earlier failure") from None
            if line is None:
                raise AssertionError(f"worker exited; stderr:\n{self.stderr()}")
            self.busy = not self._child_line(line)

    def close(self) -> None:
        if self.busy and self.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._err.close()


@pytest.fixture(scope="module")
def worker(request, tmp_path_factory):
    w = Worker(tmp_path_factory.mktemp("worker"))  # imports while the tiny artifacts are built, when they are not yet
    try:
        w.load(request.getfixturevalue("tiny_artifacts")["artifacts"])
        yield w
    finally:
        w.close()


@pytest.fixture(scope="module", autouse=True)
def kill_report(request):
    """The module's count of kills, printed past pytest's output capture (the results doc quotes it)."""
    yield
    if not KILLS:
        return
    line = (f"test_crash: {sum(KILLS.values())} kills survived ("
            + ", ".join(f"{k}: {v}" for k, v in KILLS.items()) + f"); outcomes {json.dumps(OUTCOMES)}")
    capture = request.config.pluginmanager.getplugin("capturemanager")
    terminal = request.config.pluginmanager.getplugin("terminalreporter")
    with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
        if terminal is not None:
            terminal.write_line("\n" + line)
        else:
            print(line)


def report(request, scenario: str, **extra) -> None:
    """The kills and outcomes of a scenario as properties of its test (junit xml: `record_testsuite_property`,
    which every junit family keeps)."""
    props = {"kills": KILLS.get(scenario, 0), "outcomes": json.dumps(OUTCOMES.get(scenario, {}))} | extra
    request.node.user_properties.extend(props.items())
    suite = request.getfixturevalue("record_testsuite_property")
    for k, v in props.items():
        suite(f"crash_{scenario}_{k}", v)


def outcome(scenario: str, what: str) -> None:
    OUTCOMES.setdefault(scenario, {})
    OUTCOMES[scenario][what] = OUTCOMES[scenario].get(what, 0) + 1


@pytest.fixture(scope="module")
def demo_items(tiny_artifacts) -> list[Item]:
    _, queries = read_lamp(tiny_artifacts["demo"], "dev")
    return max((q.profile for q in queries), key=len)


def restarted(db: Path) -> Store:
    """The store as a restarted studio opens it, after checking the file is sound."""
    with sqlite3.connect(db) as conn:  # a plain connection first: recovers the WAL
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    conn.close()
    store = Store(db)
    assert store.db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert store.db.execute("PRAGMA foreign_key_check").fetchall() == []
    return store


def vector_row(store: Store, user: str, artifacts: str) -> dict:
    row = store.db.execute("SELECT * FROM vectors WHERE user = ? AND artifacts = ?", [user, artifacts]).fetchone()
    names = [d[0] for d in store.db.execute("SELECT * FROM vectors LIMIT 0").description]
    return dict(zip(names, row))


def check_vector(store: Store, user: str, artifacts: str, v0: np.ndarray, ref: dict) -> str:
    """'previous' or 'new': the stored vector is v0 or the complete reference fit, with its own columns."""
    row = vector_row(store, user, artifacts)
    vec, info = store.vector(user, artifacts)  # parses too
    assert info["d"] == len(vec) == len(v0) and np.isfinite(vec).all()
    if row["vector"] == v0.astype("<f4").tobytes():
        assert row["style"] is None and row["model_id"] == "v0-model" and json.loads(row["stats"]) == {"v0": True}
        got = "previous"
    else:
        assert row["vector"] == ref["vector"], "a vector that is neither the previous one nor the full fit"
        assert row["style"] == ref["style"] and row["model_id"] == ref["model_id"] and row["d"] == ref["d"]
        assert json.loads(row["stats"])["n_items"] == json.loads(ref["stats"])["n_items"]
        got = "new"
    if row.get("version") is not None:  # schema 3: the current vector is also a stored version, the same bytes
        v = store.db.execute("SELECT vector, style FROM versions WHERE id = ?", [row["version"]]).fetchone()
        assert v is not None and v[0] == row["vector"] and v[1] == row["style"]
    for k, cluster, distances in store.db.execute("SELECT k, cluster, distances FROM assignments"):
        assert 0 <= cluster < k and len(json.loads(distances)) == k
    return got


# ---------------------------------------------------------------- a fit


def test_kill_during_fit_keeps_the_previous_vector_or_the_whole_new_one(worker, tiny_artifacts, demo_items,
                                                                       tmp_path, request):
    from personalize.methods.artifacts import artifacts_meta

    artifacts = artifacts_meta(tiny_artifacts["artifacts"])["id"]
    db = tmp_path / "studio.db"
    store = Store(db)
    store.add_user("ann", demo_items, "tweets")
    store.close()
    shutil.copy(db, tmp_path / "ref.db")
    lines = worker.run(None, {"job": "fit", "db": str(tmp_path / "ref.db"), "user": "ann", "rounds": 2})
    fit_s = next(float(line.split()[2]) for line in lines if line.startswith("SAVED 0 "))  # as the killed ones: cold
    ref_store = Store(tmp_path / "ref.db")
    ref = vector_row(ref_store, "ann", artifacts)
    ref_store.close()
    v0 = np.linspace(-1.0, 2.0, ref["d"]).astype(np.float32)
    assert ref["vector"] != v0.tobytes()

    def kill(kind: str, marker: str, delay: float) -> None:
        store = restarted(db)
        store.save_vector("ann", artifacts, v0, "v0-model", {"v0": True})  # the previous vector, each time
        store.close()
        job = {"job": kind, "db": str(db), "user": "ann", "rounds": 10_000, "v0": v0.tolist(), "v0_model": "v0-model"}
        lines = worker.run("fit", job, marker, delay)
        store = restarted(db)
        got = check_vector(store, "ann", artifacts, v0, ref)
        if kind == "fit" and any(line.startswith("SAVED") for line in lines):
            assert got == "new", "a completed fit was lost"
        outcome("fit", f"{kind}: {got}")
        store.close()

    for frac in FIT_FRACTIONS:  # anywhere in the fit: features, λ, assignments, the vector write
        kill("fit", "FITTING 0", frac * fit_s)
    for delay in WRITE_DELAYS:  # inside the vector writes themselves
        kill("write", "WRITING", delay)
    report(request, "fit", fit_s=fit_s)
    assert KILLS["fit"] == len(FIT_FRACTIONS) + len(WRITE_DELAYS)


# ---------------------------------------------------------------- a vote


def test_kill_during_votes_keeps_every_committed_vote_whole(worker, tmp_path, request):
    db = tmp_path / "studio.db"
    Store(db).close()
    committed: dict[int, int] = {}  # rating id -> i, as the killed children reported them
    start = 0
    for delay in VOTE_DELAYS:
        job = {"job": "vote", "db": str(db), "start": start, "rounds": 1_000_000}
        lines = worker.run("vote", job, "COMMITTED", delay)  # the delay runs from the first committed vote
        reported = {int(line.split()[1]): int(line.split()[2]) for line in lines if line.startswith("COMMITTED")}
        committed |= reported
        store = restarted(db)
        rows = store.ratings()
        by_id = {r["id"]: r for r in rows}
        assert len(by_id) == len(rows)
        for rid, i in committed.items():
            assert rid in by_id, f"committed vote {rid} lost"
            assert by_id[rid]["settings"]["i"] == i
        for r in rows:  # every row whole, the one committed but not yet reported too
            want = rating(r["settings"]["i"])
            assert {k: r[k] for k in want} == want, f"partial or mixed row {r['id']}"
        unreported = [r["id"] for r in rows if r["id"] not in committed and r["settings"]["i"] >= start]
        assert len(unreported) <= 1, unreported  # only the vote whose commit the kill beat the print of
        outcome("vote", "one more committed than reported" if unreported else "as reported")
        start = max(r["settings"]["i"] for r in rows) + 1
        store.close()
    report(request, "vote", votes=start)
    assert KILLS["vote"] == len(VOTE_DELAYS)


# ---------------------------------------------------------------- an OPPU training


@pytest.fixture(scope="module")
def engine(tiny_artifacts):
    from personalize.methods.engine import Engine

    return Engine.load(tiny_artifacts["artifacts"])


def test_kill_during_oppu_training_or_save_never_loads_a_half_written_adapter(worker, engine, demo_items, tmp_path,
                                                                             request):
    from personalize.methods.card.adapters import sft_loss
    from personalize.methods.base import UserContext
    from personalize.methods.oppu import ASIDE, PARTIAL, OppuConfig, OppuMethod, adapter_id

    folder = tmp_path / "oppu"
    cfg = {"folder": str(folder), "max_steps": 12}
    old, new = UserContext("ann", demo_items[:6]), UserContext("ann", demo_items)
    pairs = lambda u: [[it.x, it.y] for it in u.items]  # noqa: E731
    ada = adapter_id("ann")

    lines = worker.run(None, {"job": "train", "items": pairs(old), "user": "ann", "cfg": cfg, "rounds": 1})
    pristine = tmp_path / "pristine"  # the user's older, complete adapter
    shutil.copytree(folder, pristine)
    shutil.rmtree(folder)
    lines = worker.run(None, {"job": "train", "items": pairs(new), "user": "ann", "cfg": cfg, "rounds": 1})
    round_s = next(float(line.split()[2]) for line in lines if line.startswith("SAVED 0 "))  # as the killed: cold
    source = tmp_path / "new"  # the new adapter, which the save loop loads and then saves over the previous one
    shutil.copytree(folder, source)

    def debris() -> list[str]:
        return sorted(p.name for p in folder.glob("*") if PARTIAL in p.name or ASIDE in p.name)

    def check(had_adapter: bool, finished: bool) -> str:
        """What a restarted studio finds: a complete adapter that loads and gives the loss it was saved with,
        or (only when the user had none) 'run prepare' — never anything else."""
        method = OppuMethod(engine, cfg=OppuConfig(**cfg))  # fresh: nothing in memory
        saved = method.saved(ada)
        if saved is None:
            assert not had_adapter and not finished, "the previous (or a completed) adapter was lost"
            assert not method.is_current(new) and not method.is_current(old)
            with pytest.raises(ValueError, match="run prepare"):
                method.activate(new)
            return "none: run prepare"
        path, meta = saved
        assert PARTIAL not in path.name
        if method.is_current(new):
            which, user = "new", new
        else:
            assert method.is_current(old) and had_adapter, "an adapter for neither history"
            assert not finished, "a completed training was lost"
            which, user = "previous", old
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the meta it loads is its own: no "history changed"
            assert method.activate(user) == ada
        loss = sft_loss(engine.model, engine.tok, [(it.x, it.y) for it in user.items], engine.cfg.budget)
        assert loss == pytest.approx(meta["loss_after"], rel=1e-4), "the loaded weights are not the saved ones"
        method.release()
        return which + (" (from the copy moved aside)" if ASIDE in path.name else "")

    def kill(kind: str, had_adapter: bool, marker: str, delay: float, **job) -> None:
        shutil.rmtree(folder, ignore_errors=True)
        if had_adapter:
            shutil.copytree(pristine, folder)
        lines = worker.run("oppu", {"job": kind, "items": pairs(new), "user": "ann", "cfg": cfg,
                                    "rounds": 10_000, "source": str(source)} | job, marker, delay)
        finished = any(line.startswith("SAVED") for line in lines)
        got = check(had_adapter, finished)
        outcome("oppu", f"{kind}{' ' + job['pause'] if 'pause' in job else ''}: {got}"
                        f"{', debris left' if debris() else ''}")

    for frac in TRAIN_FRACTIONS:  # anywhere in training and the save that follows it
        kill("train", True, "TRAINING 0", frac * round_s)
    for frac in FIRST_FRACTIONS:  # a first training: no adapter before
        kill("train", False, "TRAINING 0", frac * round_s)
    for delay in SAVE_DELAYS:  # inside the save: weights, meta, renames, clean-up
        kill("save", True, "SAVING", delay)
    kill("save", True, "PAUSED", 0.0, pause="weights")  # the new weights file half written
    assert OUTCOMES["oppu"].get("save weights: previous, debris left") == 1
    kill("save", True, "PAUSED", 0.0, pause="meta")  # the new weights written, their meta not yet
    assert debris() and OUTCOMES["oppu"].get("save meta: previous, debris left") == 1  # the old one, in place
    kill("save", True, "PAUSED", 0.0, pause="aside")  # between the renames: only the moved-aside copy is whole
    assert not (folder / ada).exists() and debris()
    assert OUTCOMES["oppu"].get("save aside: previous (from the copy moved aside), debris left") == 1

    # the next save after the kills replaces the adapter and removes what the killed processes left
    info = OppuMethod(engine, cfg=OppuConfig(**cfg)).prepare(new)
    assert debris() == [] and (folder / ada / "oppu.json").exists() and not info["cold_start"]
    assert OppuMethod(engine, cfg=OppuConfig(**cfg)).is_current(new)
    report(request, "oppu", train_and_save_s=round_s)
    assert KILLS["oppu"] == len(TRAIN_FRACTIONS) + len(FIRST_FRACTIONS) + len(SAVE_DELAYS) + 3


def test_only_whole_adapters_count_as_saved(engine, demo_items, tmp_path):
    """What a kill (or an older version of the code) can leave in an adapter folder, judged without one."""
    from personalize.methods.base import UserContext
    from personalize.methods.oppu import META, WEIGHTS, OppuConfig, OppuMethod, complete_meta

    method = OppuMethod(engine, cfg=OppuConfig(folder=str(tmp_path / "oppu"), max_steps=1, report_loss=False))
    user = UserContext("bob", demo_items)
    info = method.prepare(user)
    method.release()
    path = Path(info["path"])
    whole = {f.name: f.read_bytes() for f in path.iterdir()}
    meta = json.loads(whole[META])
    assert set(meta["files"]) == set(whole) - {META} and complete_meta(path)["history"] == info["history"]

    def damaged(name: str, data: bytes | None) -> dict | None:
        for f, b in whole.items():
            (path / f).write_bytes(b)
        if data is None:
            (path / name).unlink()
        else:
            (path / name).write_bytes(data)
        return complete_meta(path)

    weights = whole[WEIGHTS]
    legacy = json.dumps({k: v for k, v in meta.items() if k != "files"}).encode()
    assert damaged(META, legacy) is not None  # saved before sizes were recorded: still whole
    assert damaged(WEIGHTS, weights[:-1]) is None and damaged(WEIGHTS, weights + b"\0") is None
    assert damaged(WEIGHTS, weights[:7]) is None and damaged(WEIGHTS, b"") is None
    assert damaged(META, legacy) is not None and damaged(WEIGHTS, weights[: len(weights) // 2]) is None  # legacy too
    assert damaged(META, whole[META][:-3]) is None and damaged(META, None) is None
    assert damaged("adapter_config.json", None) is None
    assert OppuMethod(engine, cfg=method.cfg).saved(path.name) is None
    with pytest.raises(ValueError, match="run prepare"):
        OppuMethod(engine, cfg=method.cfg).activate(user)
    assert not OppuMethod(engine, cfg=method.cfg).is_current(user)
    assert damaged(META, whole[META]) is not None and OppuMethod(engine, cfg=method.cfg).is_current(user)
