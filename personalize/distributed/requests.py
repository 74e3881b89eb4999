"""`campaign generate --ray`: decode requests (one method's rows for one prompt, built by the studio) in shards as
Ray tasks. A worker keeps the build (workers.engine) and decodes each request of its shard alone, as the studio's
scheduler decodes a request that arrives by itself, so the outputs are the serial run's. Rows travel as they do to
Ray Serve (serve.pack_rows: a steer's head by name). Rows on an adapter the build does not hold (a person's OPPU
LoRA, trained beside the studio's database) decode here, through the caller's `local`."""

from __future__ import annotations

from typing import Callable, Sequence

from personalize.serving.generation import Generation
from personalize.distributed import workers
from personalize.distributed.pool import RayConfig, connect, map_shards, shard_count, split
from personalize.distributed.serve import held_by_build, pack_rows, unpack_rows
from personalize.methods.engine import Engine
from personalize.serving.rows import DecodeRow

Outcome = list[Generation] | str  # a request's generations, or why it failed (the error of its rows)


def decode_requests(folder: str, cfg, requests: list[list[DecodeRow]]) -> list[Outcome]:
    """On a worker: each request decoded alone."""
    engine = workers.engine(folder, cfg)
    out: list[Outcome] = []
    for rows in requests:
        try:
            out.append(engine.decode_rows(unpack_rows(engine, rows)))
        except (ValueError, RuntimeError) as e:  # the rows' own error, as in-process decoding raises it
            out.append(str(e))
    return out


class RequestShards:
    """A studio's decode requests in shards on Ray (campaign_pool.generate's `shards`)."""

    def __init__(self, engine: Engine, cfg: RayConfig):
        self.engine, self.cfg = engine, cfg
        self.ray = connect(cfg)

    def decode(self, requests: Sequence[Sequence[DecodeRow]], local: Callable[[Sequence[DecodeRow]], list[Generation]],
               on_done: Callable[[int, Outcome], None]) -> None:
        """Every request decoded; on_done(i, outcome) here as each one is ready (the held-back ones first)."""
        remote = []
        for i, rows in enumerate(requests):
            if held_by_build(self.engine, rows):
                remote.append(i)
                continue
            try:
                on_done(i, local(rows))
            except (ValueError, RuntimeError) as e:
                on_done(i, str(e))
        parts = split(remote, shard_count(self.ray, self.cfg, len(remote))) if remote else []
        folder, cfg = str(self.engine.folder), self.engine.cfg

        def finished(j: int, outcomes: list[Outcome]) -> None:
            for i, outcome in zip(parts[j], outcomes):
                on_done(i, outcome)
        map_shards(self.ray, self.cfg, decode_requests,
                   [(folder, cfg, [pack_rows(self.engine, requests[i]) for i in p]) for p in parts],
                   on_done=finished)
