"""The model's lock, with a person first: work nobody waits on (a method's first use, Save's read-ahead) yields it.

One model serves every request, so every forward takes one re-entrant lock. Python's lock is not fair: a
background job that lets go between its steps takes the lock straight back, and a person's Compare clicked
right after Fit waited for EXACT's and OPPU's first uses (first token 6.7 s instead of 1 s). Background work
takes the lock through `ModelLock.background`, which waits while a foreground caller (the decode scheduler, a
fit) is waiting; a job that holds the lock per step then lets a person in after at most one step. A job that
waits hands its OpenMP team back first: kept, it made the person's decode run throttled (8.4 s instead of 4.4).
"""

from __future__ import annotations

import threading

from personalize.lm.cpu_threads import release_team


class ModelLock:
    """A re-entrant lock; `with lock:` is a person's request, `with lock.background:` is work that yields."""

    def __init__(self):
        self._lock = threading.RLock()
        self._cond = threading.Condition(threading.Lock())
        self._waiting = 0  # foreground callers waiting for the lock
        self.background = _Background(self)

    def _is_owned(self) -> bool:
        """Whether this thread holds the lock (the scheduler asks: a fit that decodes holds it already)."""
        return self._lock._is_owned()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._lock._is_owned():
            return self._lock.acquire()
        with self._cond:
            self._waiting += 1
        try:
            return self._lock.acquire(blocking, timeout)
        finally:
            with self._cond:
                self._waiting -= 1
                self._cond.notify_all()

    def release(self) -> None:
        self._lock.release()
        with self._cond:
            self._cond.notify_all()  # a background job waits for the lock to be free of waiters

    def acquire_background(self) -> None:
        """Takes the lock when no foreground caller waits for it; re-entrant without waiting (a job that holds it
        already must not wait for a caller who waits for the job)."""
        if self._lock._is_owned():
            self._lock.acquire()
            return
        while True:
            with self._cond:
                if self._waiting:
                    release_team()  # an idle team throttles the person's decode (lm/cpu_threads.py)
                    self._cond.wait_for(lambda: self._waiting == 0)
            if not self._lock.acquire(blocking=False):
                release_team()
                self._lock.acquire()
            with self._cond:
                if self._waiting == 0:
                    return
            self._lock.release()  # a person started waiting while we took it: they go first

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class _Background:
    """`with lock.background:`: the same lock, taken only when no person is waiting for it."""

    def __init__(self, lock: ModelLock):
        self.lock = lock

    def __enter__(self):
        self.lock.acquire_background()
        return self

    def __exit__(self, *exc) -> None:
        self.lock.release()
