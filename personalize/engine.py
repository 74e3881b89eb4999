"""The online stage: one loaded LM with every cluster adapter, the encoder and the heads.

Loaded once (CLI command, app, eval, bench); a user is then a cluster id and a
λ vector, so switching users costs a dictionary look-up and, across clusters,
one `set_adapter` call. Onboarding = embed → assign → features → λ fit.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from safetensors.torch import load_file

from .adapters import BASE_ADAPTER, adapter_name, load_adapters
from .cluster import assign, user_embeddings
from .config import FORMAT_VERSION, CardConfig
from .data import Item, Task, TASKS
from .decoding import DecodingSettings, Generation, generate
from .features import generate_with_states, teacher_forced
from .head import PAIR_OBJECTIVES, PairData, PersonalizationHead, TokenData, diagnostics, fit_user
from .models import LM, ModelConfig, load_encoder, load_lm
from .neutral import neutral

NEUTRAL_TEMPLATE = "Rewrite the following text in plain, neutral English: {text}"
CORE_METHODS = ("base", "cluster", "card")


class ArtifactsError(ValueError):
    """Missing or unusable artifacts; the message says what to run."""


@dataclass
class Clusters:
    """The population's embeddings and k-means centroids for every built K."""

    users: list[str]
    embeddings: np.ndarray  # [N, E]
    centroids: dict[int, np.ndarray]  # K -> [K, E]
    labels: dict[int, np.ndarray]  # K -> [N]


@dataclass
class UserFit:
    """What onboarding produced for one user, and what it cost."""

    cluster: int
    distances: list[float]
    k: int
    lam: np.ndarray
    objective: str
    n_items: int
    stages_s: dict[str, float] = field(default_factory=dict)
    diagnostics: dict = field(default_factory=dict)
    loss_curve: list[float] = field(default_factory=list)
    cold_start: bool = False

    @property
    def total_s(self) -> float:
        return sum(self.stages_s.values())

    def stats(self) -> dict:
        return {"cluster": self.cluster, "k": self.k, "objective": self.objective, "n_items": self.n_items,
                "stages_s": self.stages_s, "diagnostics": self.diagnostics, "loss_curve": self.loss_curve,
                "cold_start": self.cold_start}


class Engine:
    def __init__(self, cfg: CardConfig, lm: LM, model, encoder, clusters: Clusters,
                 heads: dict[str, PersonalizationHead], task: Task, meta: dict, population_lams: dict | None = None):
        self.cfg, self.lm, self.model, self.encoder = cfg, lm, model, encoder
        self.tok = lm.tokenizer
        self.clusters, self.heads, self.task, self.meta = clusters, heads, task, meta
        self.population_lams = population_lams or {}
        self._active: str | None = None
        self.folder: Path | None = None  # the artifacts folder, set by load (methods find their files there)

    # ------------------------------------------------------------ loading
    @classmethod
    def load(cls, folder: str | Path, model: ModelConfig | None = None) -> "Engine":
        folder = Path(folder)
        if not (folder / "config.json").exists():
            raise ArtifactsError(f"no CARD artifacts at {folder}: run `python -m personalize build` first")
        meta = artifacts_meta(folder)
        if meta.get("format_version", 0) > FORMAT_VERSION:
            raise ArtifactsError(f"artifacts at {folder} have format {meta['format_version']}, newer than this code "
                                 f"reads ({FORMAT_VERSION}): upgrade personalize or rebuild them")
        cfg = CardConfig.from_dict(meta["settings"])
        if model is not None:
            cfg = replace(cfg, model=model)
        lm = load_lm(cfg.model)
        names = [adapter_name(k, c) for k in cfg.ks for c in range(k)]
        peft_model = load_adapters(lm.model, folder / "adapters", names)
        z = np.load(folder / "clusters.npz")
        clusters = Clusters(users=meta["users"], embeddings=z["embeddings"],
                            centroids={k: z[f"centroids_k{k}"] for k in cfg.ks},
                            labels={k: z[f"labels_k{k}"] for k in cfg.ks})
        heads, lams = {}, {}
        for obj in cfg.objectives:
            t = load_file(str(folder / f"head_{obj}.safetensors"))
            head = PersonalizationHead(t["P"].shape[1], t["U"].shape[0], t["U"].shape[1])
            head.load_state_dict({"P.weight": t["P"], "U": t["U"], "h_mean": t["h_mean"], "h_std": t["h_std"],
                                  "gamma": t.get("gamma", torch.zeros(()))})  # no gamma: built before hard_pairs
            heads[obj] = head.eval().requires_grad_(False)
            lams[obj] = dict(zip(meta["head_users"][obj], t["lambdas"].numpy()))
        task = TASKS[meta["task"]]
        engine = cls(cfg, replace(lm, model=peft_model), peft_model, load_encoder(cfg.encoder), clusters,
                     heads, task, meta, lams)
        engine.folder = folder
        return engine

    @property
    def artifacts_id(self) -> str:
        return self.meta.get("id", "unbuilt")

    # ------------------------------------------------------------ adapters
    def use_adapter(self, name: str | None) -> None:
        """Switch the active cluster adapter in memory; None = the base model."""
        if name == self._active:
            return
        if name is None:
            self.model.base_model.disable_adapter_layers()
        else:
            if self._active is None:
                self.model.base_model.enable_adapter_layers()
            self.model.set_adapter(name, inference_mode=True)
        self._active = name

    # ------------------------------------------------------------ users
    def neutral_rewrites(self, texts: Sequence[str]) -> list[str]:
        """The base model's plain rewrite of each text, batched (§1.8); a rule-based plain version where the
        model's rewrite echoes the instruction or loses the content (neutral.py)."""
        if not texts:
            return []
        self.use_adapter(None)
        outs = generate(self.model, self.tok, [NEUTRAL_TEMPLATE.format(text=t) for t in texts], self.cfg.budget,
                        DecodingSettings(max_new_tokens=self.cfg.budget.max_target_tokens + 8))
        return [neutral(t, g.text) for g, t in zip(outs, texts)]

    def prepare_items(self, items: Sequence[Item], neutral: dict[int, str] | None = None) -> list[Item]:
        """Every item with a prompt: free-form items get the task template of a neutral rewrite."""
        rewrites = dict(neutral or {})
        todo = [i for i, it in enumerate(items) if not it.x and i not in rewrites]
        rewrites |= dict(zip(todo, self.neutral_rewrites([items[i].y for i in todo])))
        return [it if it.x else replace(it, x=self.task.prompt(rewrites[i])) for i, it in enumerate(items)]

    def embed(self, items: Sequence[Item]) -> np.ndarray:
        return user_embeddings(self.encoder, [[it.y for it in items]])[0]

    def assign(self, embedding: np.ndarray, k: int) -> tuple[int, list[float]]:
        if k not in self.clusters.centroids:
            raise ValueError(f"K={k} was not built; built: {sorted(self.clusters.centroids)}")
        return assign(embedding, self.clusters.centroids[k])

    def negatives(self, items: Sequence[Item], objective: str) -> list[tuple[int, object]]:
        """(item index, y− features) under the active cluster model: its greedy output for every item and,
        for "hard_pairs", `n_samples` sampled outputs per item too (seeded, so a refit gives the same λ)."""
        hs, prompts = self.cfg.head, [it.x for it in items]

        def draw(**sampling):
            return generate_with_states(self.model, self.tok, prompts, hs.n_layers, self.cfg.budget,
                                        max_new_tokens=self.cfg.budget.max_target_tokens, **sampling)

        negs = list(enumerate(draw()))
        if objective == "hard_pairs" and hs.n_samples:
            torch.manual_seed(hs.seed)
            for _ in range(hs.n_samples):
                negs += list(enumerate(draw(sample=True, top_k=hs.top_k, temperature=hs.temperature)))
        return negs

    def user_data(self, items: Sequence[Item], objective: str, negatives=None):
        """The head's training signal for these items under the active cluster model."""
        ex = [(it.x, it.y) for it in items]
        hs = self.cfg.head
        if objective == "tokens":
            feats = teacher_forced(self.model, self.tok, ex, hs.n_layers, self.cfg.budget, top_k=hs.top_k)
            return TokenData.from_features(feats)
        chosen = teacher_forced(self.model, self.tok, ex, hs.n_layers, self.cfg.budget)
        if negatives is None:
            negatives = self.negatives(items, objective)
        return PairData([chosen[i] for i, _ in negatives], [f for _, f in negatives], [i for i, _ in negatives],
                        covariate=objective == "hard_pairs")

    def fit(self, items: Sequence[Item], k: int | None = None, objective: str | None = None,
            progress=None) -> UserFit:
        """Onboard a user from their items: cluster, then λ (with held-out diagnostics)."""
        k = k or self.cfg.default_k
        objective = objective or self.cfg.objectives[0]
        if objective not in self.heads:
            raise ValueError(f"no {objective!r} head in these artifacts; built: {sorted(self.heads)}")
        head, stages = self.heads[objective], {}

        def stage(name, fn):
            if progress:
                progress(name)
            t0 = time.perf_counter()
            out = fn()
            stages[name] = round(time.perf_counter() - t0, 4)
            return out

        items = list(items)
        cluster, distances = stage("assign", lambda: self.assign(self.embed(items), k))
        if any(not it.x for it in items):
            items = stage("neutral rewrites", lambda: self.prepare_items(items))
        ones = np.ones(head.d, dtype=np.float32)
        if len(items) < self.cfg.min_fit_items:
            return UserFit(cluster, distances, k, ones, objective, len(items), stages, cold_start=True)
        self.use_adapter(adapter_name(k, cluster))
        if objective in PAIR_OBJECTIVES:
            negs = stage("negatives", lambda: self.negatives(items, objective))
            data = stage("features", lambda: self.user_data(items, objective, negatives=negs))
        else:
            data = stage("features", lambda: self.user_data(items, objective))
        n_hold = int(round(self.cfg.holdout * len(items))) if len(items) >= 5 else 0
        diag = {}
        if n_hold:
            fit_part, held = _split(data, n_hold, len(items))
            lam_fit, _ = fit_user(head, fit_part, self.cfg.head)
            others = list(self.population_lams.get(objective, {}).values())[:16]
            diag = diagnostics(head, held, lam_fit, [torch.as_tensor(o) for o in others], self.cfg.head)
        lam, curve = stage("fit", lambda: fit_user(head, data, self.cfg.head))
        return UserFit(cluster, distances, k, lam.numpy().astype(np.float32), objective, len(items), stages,
                       diag, curve)

    # ------------------------------------------------------------ generation
    def generate(self, prompts: Sequence[str], method: str, cluster: int | None = None, lam=None,
                 k: int | None = None, settings: DecodingSettings | None = None, objective: str | None = None,
                 trace: bool = False) -> list[Generation]:
        """Decode with one of the core methods: base, cluster (the user's cluster LoRA), card."""
        s = settings or self.cfg.decoding
        k = k or self.cfg.default_k
        if method == "base":
            self.use_adapter(None)
            return generate(self.model, self.tok, list(prompts), self.cfg.budget, s)
        if method not in ("cluster", "card"):
            raise ValueError(f"unknown method {method!r}; choose from {CORE_METHODS}")
        self.use_adapter(adapter_name(k, cluster or 0) if k > 1 else BASE_ADAPTER)
        if method == "cluster":
            return generate(self.model, self.tok, list(prompts), self.cfg.budget, s)
        head = self.heads[objective or self.cfg.objectives[0]]
        lam_t = torch.ones(head.d) if lam is None else torch.as_tensor(np.asarray(lam, dtype=np.float32))
        return generate(self.model, self.tok, list(prompts), self.cfg.budget, s, head=head, lam=lam_t,
                        n_layers=self.cfg.head.n_layers, trace=trace)


def _split(data, n_hold: int, n_items: int):
    """Held-out = the first n_hold items (the newest, in LaMP order)."""
    if isinstance(data, PairData):
        return data.select(lambda i: i >= n_hold), data.select(lambda i: i < n_hold)
    # TokenData rows are in item order; split by the share of items (rows are token positions)
    cut = int(len(data) * n_hold / n_items)
    sl = lambda a, b: TokenData(data.h[a:b], data.cand[a:b], data.base[a:b], data.target[a:b])  # noqa: E731
    return sl(cut, len(data)), sl(0, cut)


def artifacts_meta(folder: Path) -> dict:
    try:
        return json.loads((Path(folder) / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ArtifactsError(f"unreadable artifacts config {Path(folder) / 'config.json'}: {e}") from None

