"""The studio's decoder on Ray Serve (`app.py --decode ADDRESS`): the seam is the studio scheduler's own
submit/run, so every decode of every tab (Compare, Why, Quick pair, campaigns) goes through it unchanged.

A request's rows are built here, under the studio's model lock, as before (a person's style travels in their
steer); they are decoded by a replica of the deployment (serve.py), whose scheduler batches them with the requests
that reached it at the same time. Rows on an adapter the replicas do not hold (a person's own OPPU LoRA, trained
beside this studio's database) decode in-process. A replica that dies mid-decode: the request is sent once more
(Serve routes it to a live replica); if that fails too, the caller gets a RuntimeError that says so, which the
Compare column shows, and nothing is stored for it. Tokens stream from the replica to the caller's on_step as they
are decoded (a retried request goes on from the tokens already shown), so the Compare columns fill as in-process.
"""

from __future__ import annotations

import contextvars
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Sequence

from personalize.serving.generation import Generation
from personalize.distributed.pool import RayConfig, connect
from personalize.distributed.serve import ServeConfig, deploy, held_by_build, pack_rows
from personalize.serving.rows import DecodeRow
from personalize.serving.scheduler import DecodeScheduler


class RemoteDecoder:
    """DecodeScheduler's submit/run/close over the deployment's replicas (local: the in-process fallback)."""

    def __init__(self, local: DecodeScheduler, ray_cfg: RayConfig, serve_cfg: ServeConfig = ServeConfig(),
                 attempts: int = 2, timeout_s: float = 600.0):
        if attempts < 1 or timeout_s <= 0:
            raise ValueError("need attempts >= 1 and timeout_s > 0")
        self.local, self.serve_cfg, self.attempts, self.timeout_s = local, serve_cfg, attempts, timeout_s
        self.lock = local.lock
        self.ray = connect(ray_cfg)
        self._deploy_lock = threading.Lock()
        self._deployed: str | None = None
        self.handle = None
        self._ensure_deployed()
        self.pool = ThreadPoolExecutor(max_workers=serve_cfg.max_ongoing_requests, thread_name_prefix="remote-decode")
        self.batches: list[dict] = []  # the replicas keep their own; here: requests sent and where they went
        self.remote_requests = 0

    @property
    def engine(self):
        return self.local.engine

    @engine.setter
    def engine(self, engine) -> None:  # the studio serves another build: the replicas follow on the next decode
        self.local.engine = engine

    def _ensure_deployed(self):
        with self._deploy_lock:
            if self._deployed != self.engine.artifacts_id:
                self.handle = deploy(self.ray, self.engine, self.serve_cfg)
                self._deployed = self.engine.artifacts_id
            return self.handle

    def submit(self, build: Callable[[], Sequence[DecodeRow]],
               on_step: Callable[[int, int], None] | None = None) -> Future:
        return self.pool.submit(contextvars.copy_context().run, self._run, build, on_step)  # as the scheduler's

    def run(self, build: Callable[[], Sequence[DecodeRow]], on_step=None) -> list[Generation]:
        if self.local.caller_holds_lock():  # a fit that decodes holds the model: in-process, as the scheduler does
            return self.engine.decode_rows(list(build()), on_step=on_step)
        return self._run(build, on_step)

    def _run(self, build, on_step) -> list[Generation]:
        with self.lock:  # building may load an adapter or prepare a method on the studio's own model
            rows = list(build())
        if not rows or not held_by_build(self.engine, rows):  # an adapter the replicas lack: here
            return self.local.run(lambda: rows, on_step)
        handle, packed = self._ensure_deployed(), pack_rows(self.engine, rows)
        shown = [0] * len(packed)  # tokens per row already passed to on_step: a retry does not repeat them
        last: Exception | None = None
        for _ in range(self.attempts):
            try:
                gens = self._stream(handle, packed, on_step, shown)
                self.remote_requests += 1
                return gens
            except ValueError:  # the rows' own error (the replica raised it): the caller's, as in-process
                raise
            except Exception as e:  # a replica that died or cannot be reached: once more, on a live one
                last = e
        raise RuntimeError(f"decoding on Ray failed after {self.attempts} attempts ({type(last).__name__}); "
                           "nothing was stored, try again")

    def _stream(self, handle, packed, on_step, shown: list[int]) -> list[Generation]:
        """One attempt: the replica's tokens passed to on_step as they come (those beyond `shown`), then its
        Generations; cancelled after timeout_s (a replica that hangs)."""
        stream = handle.options(stream=True).decode.remote(packed)
        timer = threading.Timer(self.timeout_s, stream.cancel)
        timer.daemon = True
        timer.start()
        got = [0] * len(packed)
        try:
            for kind, value in stream:
                if kind == "done":
                    return value
                for i, token in value:
                    got[i] += 1
                    if got[i] > shown[i] and on_step is not None:
                        shown[i] = got[i]
                        try:
                            on_step(i, token)
                        except Exception:  # a page that went away stops its stream, not the decode
                            on_step = None
        finally:
            timer.cancel()
        raise ConnectionError("the replica's stream ended without its outputs")

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.local.close()
