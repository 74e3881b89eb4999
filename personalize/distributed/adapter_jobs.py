"""`build --ray`: the build's cluster adapters trained as Ray tasks, one task per adapter (each is independent of
the others: card.build.ClusterTrainer). A worker loads the LM once (workers.training_model), takes the K = 1
adapter's weights the driver trained, trains the adapter under its own random stream
(card.adapters.train_cluster_adapter, as the serial build does) and sends back its weights and report."""

from __future__ import annotations

from typing import Sequence

from peft import set_peft_model_state_dict
from tqdm import tqdm

from personalize.methods.card.adapters import BASE_ADAPTER, ClusterJob, adapter_state, train_cluster_adapter
from personalize.methods.card.config import CardConfig
from personalize.distributed import workers
from personalize.distributed.pool import RayConfig, connect, map_shards


def train_job(cfg: CardConfig, base: dict, job: ClusterJob) -> tuple[dict, dict]:
    """On a worker: one cluster adapter from the K = 1 weights `base`; (its weights, its report)."""
    model, tok = workers.training_model(cfg)
    set_peft_model_state_dict(model, base, adapter_name=BASE_ADAPTER)
    report = train_cluster_adapter(model, tok, job, cfg.lora, cfg.budget)
    state = adapter_state(model, job.name)
    model.set_adapter(BASE_ADAPTER)
    model.delete_adapter(job.name)  # the worker keeps only the LM and the K = 1 slot between jobs
    return state, report


class RayAdapters:
    """card.build's cluster_trainer on Ray: every job a task (retried when its worker dies), one bar over them."""

    def __init__(self, cfg: RayConfig):
        self.cfg = cfg
        self.ray = connect(cfg)

    def __call__(self, jobs: Sequence[ClusterJob], base: dict, cfg: CardConfig) -> list[tuple[dict, dict]]:
        ref = self.ray.put(base)  # sent once, read by every task
        with tqdm(total=len(jobs), desc="cluster adapters on Ray", mininterval=2.0) as bar:
            return map_shards(self.ray, self.cfg, train_job, [(cfg, ref, j) for j in jobs], progress=bar)
