"""The model's lock lets a waiting person in before background work (personalize/serving/model_lock.py)."""

from __future__ import annotations

import threading
import time

from personalize.serving.model_lock import ModelLock
from personalize.serving.scheduler import DecodeScheduler


def test_a_waiting_person_goes_before_the_background_jobs_next_step():
    """A job that takes the lock per step, and a person who asks for it during a step: the person gets it at the
    end of that step, not after the job's remaining steps (a plain lock let the job take it straight back)."""
    lock, order, in_step = ModelLock(), [], threading.Event()

    def job():
        for step in range(10):
            with lock.background:
                order.append(f"job {step}")
                in_step.set()
                time.sleep(0.05)

    def person():
        in_step.wait()
        with lock:
            order.append("person")

    threads = [threading.Thread(target=job), threading.Thread(target=person)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert order.index("person") == 1, order  # right after the step it arrived in (a plain RLock: 2 to 4 here)
    assert [o for o in order if o != "person"] == [f"job {i}" for i in range(10)]  # the job still finishes


def test_the_lock_is_re_entrant_both_ways_and_the_scheduler_sees_who_holds_it():
    """A background job that holds the lock and calls code taking it (a fit that decodes) must not wait for a
    person who waits for the job; the scheduler decodes in the caller's thread when it holds the lock."""
    lock = ModelLock()
    sched = DecodeScheduler(engine=None, lock=lock)
    assert not sched.caller_holds_lock()
    seen = []

    def job():
        with lock.background:
            waiting = threading.Thread(target=lambda: lock.acquire() and lock.release(), daemon=True)
            waiting.start()
            time.sleep(0.05)  # a person now waits for us
            with lock.background, lock:  # re-entrant: no wait for the waiting person (else a deadlock)
                seen.append(sched.caller_holds_lock())
        waiting.join(5)
        seen.append(waiting.is_alive())

    worker = threading.Thread(target=job, daemon=True)  # a deadlock fails the test instead of hanging it
    worker.start()
    worker.join(10)
    assert not worker.is_alive() and seen == [True, False], seen
    assert not sched.caller_holds_lock()
