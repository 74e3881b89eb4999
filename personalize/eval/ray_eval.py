"""`eval --ray`: onboarding and decoding in shards as Ray tasks, with the results of one serial run.

Each shard is a Ray task (retried when its worker dies) on a worker that loads the build once (the driver's settings,
`--objective` and `--alpha` included) and keeps it for the shards after. What stays in the driver: the
queries, the partners of card_shuffled, bm25_copy, the gold log-probs of the core methods and every figure.
Identical outputs rest on two things: a person's fit is seeded (onboard.fit), and a core method's shards are made of
whole decode batches (evaluate.decode_batches), so every row decodes in the batch it has in a serial run.
"""

from __future__ import annotations

from personalize.distributed import workers
from personalize.distributed.people import PeopleShards, for_decoding
from personalize.distributed.pool import RayConfig, shard_count, split
from personalize.eval.evaluate import COPY, SHUFFLED, _predict, core_gold_logprobs, decode_batches, decode_people, \
    method_styles
from personalize.methods.engine import Engine
from personalize.methods.registry import METHODS


def decode_shard(folder: str, cfg, method: str, prompts, fits, styles, profiles):
    return decode_people(workers.engine(folder, cfg), method, prompts, fits, styles, profiles)


def method_shard(folder: str, cfg, m: str, task, queries, profiles, fits, method_configs):
    engine = workers.engine(folder, cfg)
    out, gold = [""] * len(queries), [None] * len(queries)
    _predict(engine, m, task, queries, profiles, fits, list(range(len(queries))), method_configs, out, gold)
    return out, gold


class RayShards(PeopleShards):
    """What run_eval hands to Ray (its `shards`): onboard() and predict(), one progress bar over every shard."""

    def __init__(self, engine: Engine, cfg: RayConfig):
        super().__init__(engine, cfg, desc="eval on Ray (people × stages)")

    def onboard(self, queries, max_items: int, n_methods: int = 0) -> tuple[list, list]:
        return super().onboard([q.profile for q in queries], max_items, stages=1 + n_methods)

    def predict(self, m: str, task, queries, profiles, fits, partner, method_configs, out: list[str],
                gold_lp: list | None = None) -> None:
        """run_eval's _predict with the same results: a registry method's people in shards (each decoded alone,
        as serially), a core method's decode batches in shards, bm25_copy here."""
        n, cfg = len(queries), self.engine.cfg
        if m not in METHODS and m != COPY:
            core = SHUFFLED.get(m, m)
            styles = method_styles(m, fits, partner)
            batches = decode_batches(self.engine, core, fits)
            parts = [[i for b in run for i in b] for run in split(batches, shard_count(self.ray, self.cfg, len(batches)))]
            light = [for_decoding(f) for f in fits]
            done = self.map(decode_shard, [(self.folder, cfg, core, [queries[i].input for i in p],
                                            [light[i] for i in p], [styles[i] for i in p], [profiles[i] for i in p])
                                           for p in parts], [len(p) for p in parts])
            for p, texts in zip(parts, done):
                for j, i in enumerate(p):
                    out[i] = texts[j]
            if gold_lp is not None:  # in the driver: its batches are those of a serial run
                gold_lp[:] = core_gold_logprobs(self.engine, m, queries, fits, styles, profiles)
            return
        if m == COPY:
            _predict(self.engine, m, task, queries, profiles, fits, partner, method_configs, out)
            self.bar.update(n)
            return
        parts = self.parts(n)
        done = self.map(method_shard, [(self.folder, cfg, m, task, [queries[i] for i in p], [profiles[i] for i in p],
                                        [fits[i] for i in p], method_configs) for p in parts], [len(p) for p in parts])
        for p, (texts, gold) in zip(parts, done):
            for j, i in enumerate(p):
                out[i] = texts[j]
                if gold_lp is not None:
                    gold_lp[i] = gold[j]
