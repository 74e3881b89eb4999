"""The decoding deployment on Ray Serve: each replica holds one loaded build (the LM, every cluster LoRA, the heads)
and runs the in-process mixed-batch scheduler (serving.scheduler.DecodeScheduler) on the rows it is sent, so the
requests that reach one replica within the scheduler's window decode as one batch, as in one studio.

Rows travel as they are (serving.rows.DecodeRow: prompt, budget, settings, adapter, the steer with the person's
style); a steer's head, which every replica already holds, travels as its name (HeadRef) and is put back here.
Tokens stream back as they are decoded (DecoderReplica.decode is a generator), so the Compare columns fill as they
do in-process.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
from dataclasses import dataclass
from typing import Sequence

from personalize.methods.card.adapters import BASE_ADAPTER, adapter_name
from personalize.methods.engine import Engine
from personalize.serving.row_lora import NO_ADAPTER
from personalize.serving.rows import DecodeRow
from personalize.serving.scheduler import DecodeScheduler, SchedulerConfig

APP = "personalize-decoder"


@dataclass(frozen=True)
class ServeConfig:
    """How many replicas decode, and what each one takes."""

    replicas: int = 1
    num_gpus: float = 0.0  # per replica: 1 where each replica has a GPU of its own
    num_cpus: float = 1.0  # per replica
    max_ongoing_requests: int = 64  # requests a replica accepts at once (its scheduler batches them)
    scheduler: SchedulerConfig = SchedulerConfig()

    def __post_init__(self):
        if self.replicas < 1 or self.num_gpus < 0 or self.num_cpus <= 0 or self.max_ongoing_requests < 1:
            raise ValueError("need replicas >= 1, num_gpus >= 0, num_cpus > 0 and max_ongoing_requests >= 1")


@dataclass(frozen=True)
class HeadRef:
    """A steer's head by its objective's name: the replica's own copy stands in for it."""

    objective: str


def _swap_heads(rows: Sequence[DecodeRow], swap) -> list[DecodeRow]:
    out = []
    for r in rows:
        st = r.steer
        if st is not None and dataclasses.is_dataclass(st):
            changes = {f.name: swap(getattr(st, f.name)) for f in dataclasses.fields(st)}
            changes = {k: v for k, v in changes.items() if v is not getattr(st, k)}
            if changes:
                r = dataclasses.replace(r, steer=dataclasses.replace(st, **changes))
        out.append(r)
    return out


def held_by_build(engine: Engine, rows: Sequence[DecodeRow]) -> bool:
    """Whether every adapter the rows read (their own and a twin's) is one of the build's, which every replica and
    worker loads; rows on another (a person's OPPU LoRA, trained beside the studio's database) decode in-process."""
    built = {adapter_name(k, c) for k in engine.cfg.ks for c in range(k)} | {BASE_ADAPTER, None, NO_ADAPTER}
    return all(r.adapter in built and (r.steer is None or r.steer.twin_adapter in built) for r in rows)


def pack_rows(engine: Engine, rows: Sequence[DecodeRow]) -> list[DecodeRow]:
    """The rows to send: every head of the build replaced by its HeadRef."""
    names = {id(h): o for o, h in engine.heads.items()}
    return _swap_heads(rows, lambda v: HeadRef(names[id(v)]) if id(v) in names else v)


def unpack_rows(engine: Engine, rows: Sequence[DecodeRow]) -> list[DecodeRow]:
    """The rows received, with this replica's heads back in place of their HeadRefs."""
    return _swap_heads(rows, lambda v: engine.heads[v.objective] if isinstance(v, HeadRef) else v)


class DecoderReplica:
    """One replica: the build loaded once, its own scheduler, decode(rows) -> Generations."""

    def __init__(self, artifacts: str, card_cfg, scheduler: SchedulerConfig):
        self.engine = Engine.load(artifacts, card_cfg.model)
        self.engine.cfg = card_cfg  # the studio's settings (its objective and decoding), not only the build's
        self.scheduler = DecodeScheduler(self.engine, threading.RLock(), scheduler)

    async def decode(self, rows: list[DecodeRow]):
        """A stream (the caller asks with `handle.options(stream=True)`): ("steps", [(row, token), ...]) as the
        scheduler decodes them, so the studio's columns fill token by token, then ("done", the Generations)."""
        loop, steps = asyncio.get_running_loop(), asyncio.Queue()

        def put(item) -> None:  # from the scheduler's thread, in order: every step, then the end
            loop.call_soon_threadsafe(steps.put_nowait, item)

        future = self.scheduler.submit(lambda: unpack_rows(self.engine, rows), lambda i, t: put((i, t)))
        future.add_done_callback(lambda _: put(None))
        done = False
        while not done:
            got = [await steps.get()]
            while not steps.empty():  # the steps that came meanwhile go as one message
                got.append(steps.get_nowait())
            if done := got[-1] is None:
                got.pop()
            if got:
                yield "steps", got
        yield "done", future.result()  # the rows' own error is raised here, to the caller

    def info(self) -> dict:
        """What this replica is: its process (tests kill it) and its build."""
        return {"pid": os.getpid(), "artifacts": self.engine.artifacts_id}


def deploy(ray, engine: Engine, cfg: ServeConfig):
    """The deployment with cfg.replicas replicas of `engine`'s build, started (or updated) on the connected Ray;
    returns its handle."""
    from ray import serve

    dep = serve.deployment(DecoderReplica, name="decoder", num_replicas=cfg.replicas,
                           max_ongoing_requests=cfg.max_ongoing_requests,
                           ray_actor_options={"num_cpus": cfg.num_cpus, "num_gpus": cfg.num_gpus})
    serve.start(http_options={"location": "NoServer"})  # the studio calls it through handles: no HTTP proxy
    return serve.run(dep.bind(str(engine.folder), engine.cfg, cfg.scheduler), name=APP, route_prefix=None)
