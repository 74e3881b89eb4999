"""A thread that finished its torch work hands its OpenMP team back (personalize/lm/cpu_threads.py)."""

from __future__ import annotations

import inspect
import os
import sys
import threading
import time

import pytest
import torch

from personalize.lm.cpu_threads import ReleasingExecutor, _libgomp, hands_back_team, release_team


def _tids() -> set[int]:
    """The process's OS threads (a test process starts and ends threads of its own: compare sets, not counts)."""
    return {int(t) for t in os.listdir("/proc/self/task")}


def _gone(tids: set[int], within_s: float = 2.0) -> bool:
    """Whether the threads `tids` have exited (a released helper leaves a moment after the release returns)."""
    deadline = time.monotonic() + within_s
    while tids & _tids():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _parallel_op() -> None:
    x = torch.randn(512, 2048)
    for _ in range(3):
        x.exp_().clamp_(max=1.0)


def _in_thread(fn):
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", fn()))
    t.start()
    t.join()
    return out["r"]


@pytest.fixture
def two_threads():
    """Teams of one helper thread, even on a 1-core runner."""
    n = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(n)


@pytest.mark.skipif(_libgomp() is None, reason="torch here does not run on libgomp")
def test_a_thread_frees_its_team_and_makes_a_new_one_on_its_next_parallel_op(two_threads):
    def body():
        torch.set_num_threads(2)
        seen = {"before": _tids()}
        _parallel_op()
        seen["with team"] = _tids()
        seen["released"] = release_team()
        seen["after"] = _tids()
        _parallel_op()  # still works: a new team
        seen["again"] = _tids()
        release_team()
        return seen

    seen = _in_thread(body)
    helpers = seen["with team"] - seen["before"]
    assert seen["released"] is True and helpers
    assert _gone(helpers)  # the team's helper exited when it was handed back
    assert seen["again"] - seen["after"]  # the next parallel op made a new one


@pytest.mark.skipif(_libgomp() is None, reason="torch here does not run on libgomp")
def test_handlers_streams_and_background_jobs_leave_no_team_behind(two_threads):
    def helpers_of(work):
        """Runs work() (in the calling thread), returns the threads it started other than the caller."""
        before = _tids()
        work()
        return _tids() - before - {threading.get_native_id()}

    with ReleasingExecutor(max_workers=1) as pool:
        helpers = pool.submit(helpers_of, _parallel_op).result()
        assert helpers and _gone(helpers)  # the worker lives on, its team's helper does not

    def handler(studio, text):  # a handler as ui.common.bind wraps it
        got["helpers"] = helpers_of(_parallel_op)
        return text.upper()
    got = {}
    assert _in_thread(lambda: (hands_back_team(handler)(None, "ok"), _gone(got["helpers"]))) == ("OK", True)
    assert got["helpers"]

    def stream(studio, n):  # a streaming handler (Compare): each step may run on another worker thread
        for i in range(n):
            yield i, helpers_of(_parallel_op)
    steps = _in_thread(lambda: [(i, h, _gone(h)) for i, h in hands_back_team(stream)(None, 2)])
    assert [i for i, _, _ in steps] == [0, 1]
    assert all(h and gone for _, h, gone in steps)  # each step's team existed while it worked, then left


def test_wrapping_keeps_name_signature_and_generators():
    def fit(studio, name: str, k: int = 4):
        return name, k

    def stream(studio, prompt: str):
        yield prompt

    w = hands_back_team(fit)
    assert w.__name__ == "fit" and list(inspect.signature(w).parameters) == ["studio", "name", "k"]
    assert w(None, "ana") == ("ana", 4)
    g = hands_back_team(stream)
    assert inspect.isgeneratorfunction(g) and g.__name__ == "stream"  # Gradio streams it as before
    assert list(g(None, "hi")) == ["hi"]
    assert isinstance(release_team(), bool)  # callable anywhere, a thread with no team included


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="no per-thread nice value here")
def test_the_decode_thread_runs_below_the_request_handlers(monkeypatch):
    from types import SimpleNamespace

    from personalize.serving import scheduler
    from personalize.serving.scheduler import DecodeScheduler, SchedulerConfig

    # a runner whose decode reports the priority of the thread that ran it
    monkeypatch.setattr(scheduler, "decode_rows", lambda model, tok, rows, on_step=None:
                        [os.getpriority(os.PRIO_PROCESS, threading.get_native_id())] * len(rows))
    here = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    s = DecodeScheduler(SimpleNamespace(model=None, tok=None), cfg=SchedulerConfig(window_ms=0, nice=3))
    try:
        assert s.run(lambda: ["row"]) == [min(19, here + 3)]
    finally:
        s.close()
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == here  # the caller's is unchanged
    with pytest.raises(ValueError, match="nice"):
        SchedulerConfig(nice=20)


def _rss_mb() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim and /proc are Linux's")
def test_trim_memory_gives_the_heaps_freed_pages_back():
    """What a first-use job leaves: freed blocks the heap keeps (live blocks between them stop free() from
    shrinking it). trim_memory hands those pages back."""
    from personalize.lm.cpu_threads import trim_memory

    blocks, pins = [], []
    for _ in range(3000):  # 192 MB below the mmap threshold, on the heap, each with a live block after it
        blocks.append(bytearray(64 * 1024))
        pins.append(bytearray(1024))
    del blocks
    held = _rss_mb()
    assert trim_memory()
    assert held - _rss_mb() > 100, "the freed 192 MB stayed resident"
    del pins
