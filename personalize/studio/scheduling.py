"""Where the studio's decodes run: in this process (the default, serving.scheduler.DecodeScheduler) or on a Ray
Serve deployment (`app.py --decode auto | ray://HOST:PORT`, distributed.remote.RemoteDecoder) behind the same
submit/run. SQLite, the page, fits and the building of rows stay here either way; Ray is imported only when asked.
"""

from __future__ import annotations

from dataclasses import dataclass

from personalize.serving.scheduler import DecodeScheduler, SchedulerConfig


@dataclass(frozen=True)
class DecodeTarget:
    """address: None decodes in-process; "auto" starts or joins a local Ray; else a cluster ("ray://HOST:10001"
    or "HOST:6379"). replicas, num_gpus, num_cpus: per deployment and per replica."""

    address: str | None = None
    replicas: int = 1
    num_gpus: float = 0.0
    num_cpus: float = 1.0

    def __post_init__(self):
        if self.address is not None and not self.address.strip():
            raise ValueError("--decode needs 'auto' or a Ray address (ray://HOST:10001)")
        if self.replicas < 1 or self.num_gpus < 0 or self.num_cpus <= 0:
            raise ValueError("--decode needs replicas >= 1, num_gpus >= 0 and num_cpus > 0")


def make_scheduler(engine, lock, scheduler: SchedulerConfig, target: DecodeTarget):
    """The studio's scheduler: in-process, or the remote decoder over the deployment (ConnectionError when Ray
    cannot be reached: the app says so at start)."""
    local = DecodeScheduler(engine, lock, scheduler)
    if target.address is None:
        return local
    from personalize.distributed.pool import RayConfig
    from personalize.distributed.remote import RemoteDecoder
    from personalize.distributed.serve import ServeConfig

    return RemoteDecoder(local, RayConfig(address=target.address),
                         ServeConfig(replicas=target.replicas, num_gpus=target.num_gpus, num_cpus=target.num_cpus,
                                     scheduler=scheduler))
