"""Where the studio's decodes run: in this process (the default, serving.scheduler.DecodeScheduler) or on a Ray
Serve deployment (`app.py --decode auto | ray://HOST:PORT`, distributed.remote.RemoteDecoder) behind the same
submit/run. SQLite, the page, fits and the building of rows stay here either way; Ray is imported only when asked.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from personalize.distributed.serve import ServeConfig  # settings only: Ray is imported when a deployment starts
from personalize.serving.scheduler import DecodeScheduler, SchedulerConfig


@dataclass(frozen=True)
class DecodeTarget:
    """address: None decodes in-process; "auto" starts or joins a local Ray; else a cluster ("ray://HOST:10001"
    or "HOST:6379"). serve: the deployment's replicas and what each takes (one source: distributed.serve)."""

    address: str | None = None
    serve: ServeConfig = ServeConfig()

    def __post_init__(self):
        if self.address is not None and not self.address.strip():
            raise ValueError("--decode needs 'auto' or a Ray address (ray://HOST:10001)")


def make_scheduler(engine, lock, scheduler: SchedulerConfig, target: DecodeTarget):
    """The studio's scheduler: in-process, or the remote decoder over the deployment (ConnectionError when Ray
    cannot be reached: the app says so at start)."""
    local = DecodeScheduler(engine, lock, scheduler)
    if target.address is None:
        return local
    from personalize.distributed.pool import RayConfig
    from personalize.distributed.remote import RemoteDecoder

    return RemoteDecoder(local, RayConfig(address=target.address), replace(target.serve, scheduler=scheduler))
