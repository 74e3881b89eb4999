"""A thread that finished its torch work hands its OpenMP team back (personalize/threads.py)."""

from __future__ import annotations

import inspect
import os
import threading

import pytest
import torch

from personalize.threads import ReleasingExecutor, _libgomp, hands_back_team, release_team


def _os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _parallel_op() -> None:
    x = torch.randn(512, 2048)
    for _ in range(3):
        x.exp_().clamp_(max=1.0)


@pytest.mark.skipif(_libgomp() is None, reason="torch here does not run on libgomp")
def test_a_thread_frees_its_team_and_makes_a_new_one_on_its_next_parallel_op():
    seen = {}

    def body():
        torch.set_num_threads(2)  # this thread's team has one helper thread, even on a 1-core runner
        seen["before"] = _os_threads()
        _parallel_op()
        seen["with team"] = _os_threads()
        seen["released"] = release_team()
        seen["after"] = _os_threads()
        _parallel_op()  # still works: a new team
        seen["again"] = _os_threads()
        release_team()

    n = torch.get_num_threads()
    try:
        t = threading.Thread(target=body)
        t.start()
        t.join()
    finally:
        torch.set_num_threads(n)
    assert seen["released"] is True
    assert seen["with team"] == seen["before"] + 1
    assert seen["after"] == seen["before"]
    assert seen["again"] == seen["before"] + 1


@pytest.mark.skipif(_libgomp() is None, reason="torch here does not run on libgomp")
def test_handlers_streams_and_background_jobs_leave_no_team_behind():
    n = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        before = _os_threads()
        with ReleasingExecutor(max_workers=1) as pool:
            pool.submit(_parallel_op).result()
            worker_only = before + 1  # the executor's worker thread, without a helper
            assert _os_threads() == worker_only

        def handler(studio, text):  # a handler as ui.common.bind wraps it
            _parallel_op()
            return text.upper()
        wrapped = hands_back_team(handler)
        out = {}
        t = threading.Thread(target=lambda: out.setdefault("r", (wrapped(None, "ok"), _os_threads())))
        before = _os_threads()
        t.start()
        t.join()
        assert out["r"] == ("OK", before + 1)  # the handler's own thread, no helper of its team

        def stream(studio, n):  # a streaming handler (Compare): each step may run on another worker thread
            for i in range(n):
                _parallel_op()
                yield i, _os_threads()
        counts = {}
        t = threading.Thread(target=lambda: counts.setdefault("r", [(i, c, _os_threads())
                                                                     for i, c in hands_back_team(stream)(None, 2)]))
        t.start()
        t.join()
        assert [(i, after) for i, _, after in counts["r"]] == [(0, before + 1), (1, before + 1)]
        assert all(during == before + 2 for _, during, _ in counts["r"])  # the team was there while it worked
    finally:
        torch.set_num_threads(n)


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
def test_the_decode_thread_runs_below_the_request_handlers():
    from personalize.scheduler import DecodeScheduler, SchedulerConfig

    class Echo:  # an engine whose decode reports the priority of the thread that ran it
        def decode_rows(self, rows, on_step=None):
            return [os.getpriority(os.PRIO_PROCESS, threading.get_native_id())] * len(rows)

    here = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    s = DecodeScheduler(Echo(), cfg=SchedulerConfig(window_ms=0, nice=3))
    try:
        assert s.run(lambda: ["row"]) == [min(19, here + 3)]
    finally:
        s.close()
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == here  # the caller's is unchanged
    with pytest.raises(ValueError, match="nice"):
        SchedulerConfig(nice=20)
