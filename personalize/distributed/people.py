"""People onboarded and decoded in shards on Ray, for the commands that score or choose on many of them (`eval
--ray`: eval.ray_eval builds on this; `tune --ray`: card.tune's `shards`). Each shard is a Ray task on a worker
that keeps the build (workers.engine); one progress bar counts people × stages over every shard.
A person's fit is seeded (onboard.fit) and a mixed batch decodes each row as it decodes alone (serving.runner), so
the shards give what one process gives."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Sequence

from tqdm import tqdm

from personalize.methods.card import onboard
from personalize.serving.settings import DecodingSettings
from personalize.data import Item
from personalize.distributed import workers
from personalize.distributed.pool import RayConfig, connect, map_shards, shard_count, split
from personalize.methods.card.tune import decode_each
from personalize.methods.engine import Engine
from personalize.methods.card.onboard import UserFit


def light(f: UserFit) -> UserFit:
    """A fit without its teacher-forced features (what no shard reads again): what travels between processes."""
    return replace(f, features=None)


def for_decoding(f: UserFit) -> UserFit:
    """A light fit without its held-out items either (what a decode never reads)."""
    return replace(f, features=None, held=None, held_style=None)


def onboard_shard(folder: str, cfg, profiles: list[list[Item]], max_items: int | None) -> list[tuple[list, UserFit]]:
    """On a worker: each person's items (neutral rewrites filled) and fit."""
    engine = workers.engine(folder, cfg)
    people = (engine.prepare_items(profile[:max_items]) for profile in profiles)  # each prepared, then fitted
    return [(items, light(onboard.fit(engine, items))) for items in people]


def decode_each_shard(folder: str, cfg, method: str, prompts, fits, items, s: DecodingSettings) -> list[str]:
    """On a worker: tune's decode of a shard of its validation people (one mixed batch)."""
    return decode_each(workers.engine(folder, cfg), method, prompts, fits, items, s)


class PeopleShards:
    """A loaded build's people in shards on Ray, with the driver's settings (engine.cfg at each call)."""

    def __init__(self, engine: Engine, cfg: RayConfig, desc: str = "people × stages on Ray"):
        self.engine, self.cfg, self.desc = engine, cfg, desc
        self.ray = connect(cfg)
        self.folder = str(engine.folder)
        self.bar: tqdm | None = None

    def count(self, n: int) -> None:
        """n more people × stages to come on the one bar."""
        if self.bar is None:
            self.bar = tqdm(total=0, desc=self.desc, mininterval=2.0)
        self.bar.total += n
        self.bar.refresh()

    def parts(self, n: int) -> list[list[int]]:
        """0..n-1 in consecutive shards, one per CPU of the cluster (or RayConfig.shards)."""
        return split(list(range(n)), shard_count(self.ray, self.cfg, n))

    def map(self, fn: Callable, shards: Sequence[tuple], weights: Sequence[int]) -> list:
        return map_shards(self.ray, self.cfg, fn, shards, weights, self.bar)

    def onboard(self, profiles: Sequence[Sequence[Item]], max_items: int | None = None,
                stages: int = 1) -> tuple[list, list[UserFit]]:
        """(items, fit) of every person, in order; `stages`: the bar's share of each person (eval: 1 + methods)."""
        self.count(len(profiles) * stages)
        parts = self.parts(len(profiles))
        done = self.map(onboard_shard, [(self.folder, self.engine.cfg, [list(profiles[i]) for i in p], max_items)
                                        for p in parts], [len(p) for p in parts])
        pairs = [pair for shard in done for pair in shard]
        return [p for p, _ in pairs], [f for _, f in pairs]

    def decode_each(self, method: str, prompts, fits, items, s: DecodingSettings) -> list[str]:
        """card.tune.decode_each in shards of people (tune's Trials calls it once per setting)."""
        self.count(len(prompts))
        parts = self.parts(len(prompts))
        done = self.map(decode_each_shard, [(self.folder, self.engine.cfg, method, [prompts[i] for i in p],
                                             [for_decoding(fits[i]) for i in p], [items[i] for i in p], s)
                                            for p in parts],
                        [len(p) for p in parts])
        return [t for shard in done for t in shard]

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
