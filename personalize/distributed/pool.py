"""Ray as a pool of shards: `connect` starts or joins Ray (a clear error when it cannot), `map_shards` runs one
function over shards as Ray tasks, retried when their worker dies, with one progress bar that advances as shards
finish. Ray is imported here only, and only when called."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

PACKAGE = Path(__file__).resolve().parents[1]  # personalize/: shipped to the workers (runtime_env py_modules)


@dataclass(frozen=True)
class RayConfig:
    """Where Ray runs and how its tasks are retried. address: "auto" starts a local Ray or joins the one already
    running on this machine (`ray start --head`); anything else is a cluster's address ("HOST:6379", or
    "ray://HOST:10001" for Ray Client)."""

    address: str = "auto"
    num_cpus: int | None = None  # a local Ray started here gets this many CPUs (None: all of them)
    max_retries: int = 3  # a task whose worker dies is run again this many times
    cpus_per_task: float = 1.0
    shards: int | None = None  # shards per map (None: one per CPU in the cluster)
    env: dict = field(default_factory=dict)  # environment variables of the workers

    def __post_init__(self):
        if not self.address or not self.address.strip():
            raise ValueError("--ray needs 'auto' or a cluster address (HOST:PORT or ray://HOST:PORT)")
        if (self.num_cpus is not None and self.num_cpus < 1) or self.max_retries < 0 or self.cpus_per_task <= 0 \
                or (self.shards is not None and self.shards < 1):
            raise ValueError("need num_cpus >= 1, max_retries >= 0, cpus_per_task > 0 and shards >= 1")


def connect(cfg: RayConfig):
    """The ray module, initialised once per process: a local instance (address "auto") or the cluster at
    cfg.address. Raises ConnectionError with the address and how to start one when Ray cannot be reached."""
    try:
        import ray
    except ImportError as e:  # Ray is optional weight: make run does not install it
        raise ConnectionError("Ray is not installed here: run `make extra` (or .venv/bin/pip install -r "
                              "requirements-extra.txt)") from e
    if ray.is_initialized():
        return ray
    if cfg.address != "auto":
        check_reachable(cfg.address)
    runtime_env = {"py_modules": [str(PACKAGE)], "env_vars": {"TOKENIZERS_PARALLELISM": "false", **cfg.env}}
    kwargs = {"runtime_env": runtime_env, "include_dashboard": False, "log_to_driver": False}
    try:
        if cfg.address == "auto":
            ray.init(num_cpus=cfg.num_cpus, **kwargs)
        else:
            ray.init(address=cfg.address, **kwargs)
    except Exception as e:  # Ray raises ConnectionError, RuntimeError or its own errors
        raise ConnectionError(f"cannot reach Ray at {cfg.address!r}: {e}. Start a cluster with `ray start --head` "
                              "(and `ray start --address HEAD:6379` on each other machine), then pass that address")
    return ray


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """A TCP connect to HOST:PORT first: ray.init retries an address nobody listens on for about a minute before
    it gives up, and a typo should be told at once."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    host = host.strip("[]")  # an IPv6 address: [::1]:6379
    if not host or not port.isdigit():
        return  # a form Ray reads itself (e.g. a bare host): its own error then
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise ConnectionError(f"cannot reach Ray at {address!r}: nothing answers at {host}:{port} ({e}). Start a "
                              "cluster with `ray start --head` (and `ray start --address HEAD:6379` on each other "
                              "machine), then pass that address") from None


def shard_count(ray, cfg: RayConfig, n_items: int) -> int:
    """How many shards n items become: cfg.shards, else one per CPU Ray has; never more than the items."""
    n = cfg.shards or max(1, int(ray.cluster_resources().get("CPU", 1) // cfg.cpus_per_task))
    return max(1, min(n, n_items))


def split(items: Sequence, n: int) -> list[list]:
    """items in n consecutive runs of near-equal length (order kept; no empty run unless there are no items)."""
    n = max(1, min(n, len(items)))
    q, r = divmod(len(items), n)  # the first r runs take one more
    return [list(items[i * q + min(i, r): (i + 1) * q + min(i + 1, r)]) for i in range(n)]


def map_shards(ray, cfg: RayConfig, fn: Callable, shards: Sequence[tuple], weights: Sequence[int] | None = None,
               progress=None, on_done: Callable[[int, object], None] | None = None) -> list:
    """fn(*shard) for every shard as a Ray task (retried cfg.max_retries times when its worker dies), results in
    the shards' order. `progress`: a tqdm bar advanced by each shard's weight (default 1) as it finishes;
    `on_done(i, result)`: called here as the i-th shard finishes (a caller that stores results as they come, so an
    interrupted run keeps what finished)."""
    task = ray.remote(max_retries=cfg.max_retries, num_cpus=cfg.cpus_per_task)(fn)
    refs = [task.remote(*args) for args in shards]
    weight = dict(zip(refs, weights or [1] * len(refs)))
    index = {ref: i for i, ref in enumerate(refs)}
    results, pending = {}, list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        for ref in done:
            results[ref] = ray.get(ref)
            if on_done is not None:
                on_done(index[ref], results[ref])
            if progress is not None:
                progress.update(weight[ref])
    return [results[r] for r in refs]
