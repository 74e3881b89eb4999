"""Cross-request batching: decode requests that arrive within a short window run as ONE mixed batch.

Why a scheduler of our own rather than Gradio's batched events (`batch=True`, `max_batch_size`): Gradio
batches calls of one event function with one signature, and a batched function cannot be a generator; the
studio must mix requests of different events (a Compare of six methods, a Rate pair, the Why view, a
campaign's outputs), of any user, cluster and method, and stream each row's tokens back to its own page.
So every decode goes through `DecodeScheduler.submit` or `run`: the request's rows are built and decoded in the
scheduler's one worker thread, with the rows of every request that arrived within `window_ms` of the one
before it (at most `max_wait_ms` after the first; serving.runner.decode_rows), and each request gets its own rows'
outputs. The window slides because requests sent at one moment do not arrive at one: 8 Compares sent
together over HTTP reached the scheduler over 57-90 ms (Gradio starts each handler in turn), and with a
fixed 30 ms window the later ones waited for the first batch to finish (~4 s) before their own began
(benchmarks/serving_load.py). A batch runs to its end: rows do not join a decode under way. The model
lock is held per batch, not per request; fits and trainings take the same lock between their steps, so
they run one at a time and a decode never waits for more than one of their steps.
"""

from __future__ import annotations

import contextvars
import functools
import queue
import threading
import time
from concurrent.futures import Future
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable, Sequence

from personalize.serving.rows import DecodeRow
from personalize.serving.generation import Generation
from personalize.serving.runner import decode_rows
from personalize.lm.cpu_threads import lower_priority, release_team


@dataclass(frozen=True)
class SchedulerConfig:
    window_ms: float = 50.0  # a batch waits this long after its newest request for another one...
    max_wait_ms: float = 200.0  # ...but no longer than this after its first
    max_rows: int = 64  # rows per generate call (memory; a longer queue decodes in several batches)
    nice: int = 10  # the decode thread's priority below the request handlers' (0: the same)

    def __post_init__(self):
        if not 0 <= self.window_ms <= self.max_wait_ms <= 5000 or self.max_rows < 1 or not 0 <= self.nice <= 19:
            raise ValueError("need 0 <= window_ms <= max_wait_ms <= 5000, max_rows >= 1 and nice in 0..19")


@dataclass
class _Request:
    build: Callable[[], Sequence[DecodeRow]]
    on_step: Callable[[int, int], None] | None
    future: Future
    rows: list[DecodeRow] | None = None


class DecodeScheduler:
    """One worker thread that turns the decode requests of a window into mixed batches. `engine`: what holds the
    model and tokenizer the runner decodes with (`.model`, `.tok`); nothing above serving is called."""

    def __init__(self, engine, lock=None, cfg: SchedulerConfig = SchedulerConfig()):
        self.engine, self.cfg = engine, cfg
        self.lock = lock if lock is not None else nullcontext()
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self.batches: list[dict] = []  # the last batches' sizes and times (bench, tests)

    def submit(self, build: Callable[[], Sequence[DecodeRow]],
               on_step: Callable[[int, int], None] | None = None) -> Future:
        """`build()` makes the request's rows (in the worker, under the model lock: it may load an adapter);
        the future gets their Generations. `on_step(row, token)` streams each row's tokens. `build` runs in the
        caller's context (its context variables: the login whose people the rows may read), not the worker's."""
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="decode-scheduler", daemon=True)
                self._thread.start()
        req = _Request(functools.partial(contextvars.copy_context().run, build), on_step, Future())
        self._queue.put(req)
        return req.future

    def run(self, build: Callable[[], Sequence[DecodeRow]], on_step=None) -> list[Generation]:
        """The request's Generations; a caller that already holds the model lock (a fit that decodes) decodes
        in its own thread, since the worker would wait for that lock forever."""
        if self.caller_holds_lock():
            return decode_rows(self.engine.model, self.engine.tok, list(build()), on_step)
        return self.submit(build, on_step).result()

    def caller_holds_lock(self) -> bool:
        """Whether this thread holds the model lock (an RLock: a fit that decodes)."""
        owned = getattr(self.lock, "_is_owned", None)
        return owned is not None and owned()

    def close(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(10)

    # ------------------------------------------------------------ worker
    def _loop(self) -> None:
        lower_priority(self.cfg.nice)  # a vote or a page load is served between our steps (lm/cpu_threads.py)
        while True:
            first = self._queue.get()
            if first is None:
                return
            pending, start = [first], time.perf_counter()
            last = start
            while True:
                left = min(last + self.cfg.window_ms / 1000, start + self.cfg.max_wait_ms / 1000) - time.perf_counter()
                try:
                    nxt = self._queue.get(timeout=left) if left > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._queue.put(None)
                    break
                pending.append(nxt)
                last = time.perf_counter()
            try:
                self._serve(pending)
            except BaseException as e:  # never leave a caller waiting
                for r in pending:
                    if not r.future.done():
                        r.future.set_exception(e)
            if self._queue.empty():
                release_team()  # idle: a fit elsewhere must not run throttled beside our team (lm/cpu_threads.py)

    def _serve(self, pending: list[_Request]) -> None:
        with self.lock:
            ready = []
            for r in pending:
                if not r.future.set_running_or_notify_cancel():
                    continue
                try:
                    r.rows = list(r.build())
                    ready.append(r)
                except Exception as e:  # this request's error (unknown user, unprepared method), not the batch's
                    r.future.set_exception(e)
            for chunk in _chunks(ready, self.cfg.max_rows):
                self._decode(chunk)

    def _decode(self, chunk: list[_Request]) -> None:
        rows = [row for r in chunk for row in r.rows]
        owner = [(r, j) for r in chunk for j in range(len(r.rows))]  # the batch's row i is owner[i]'s row j

        def step(i: int, token: int) -> None:
            r, j = owner[i]
            if r.on_step is not None:
                try:
                    r.on_step(j, token)
                except Exception:  # a page that went away must not stop everyone's batch
                    r.on_step = None

        t0 = time.perf_counter()
        try:
            gens = decode_rows(self.engine.model, self.engine.tok, rows, step) if rows else []
        except Exception:
            if len(chunk) == 1:
                raise
            for r in chunk:  # one request's rows broke the batch: decode each request alone
                try:
                    r.future.set_result(decode_rows(self.engine.model, self.engine.tok, r.rows, r.on_step))
                except Exception as e:
                    r.future.set_exception(e)
            return
        self.batches = (self.batches + [{"requests": len(chunk), "rows": len(rows),
                                         "seconds": round(time.perf_counter() - t0, 3)}])[-100:]
        for r in chunk:
            r.future.set_result(gens[: len(r.rows)])
            gens = gens[len(r.rows):]


def _chunks(requests: list[_Request], max_rows: int):
    """Consecutive requests packed up to max_rows rows (a request is never split)."""
    chunk, n = [], 0
    for r in requests:
        if chunk and n + len(r.rows) > max_rows:
            yield chunk
            chunk, n = [], 0
        chunk.append(r)
        n += len(r.rows)
    if chunk:
        yield chunk
