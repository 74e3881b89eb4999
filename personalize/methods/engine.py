"""The loaded build: one LM with every cluster adapter, the encoder, the clusters and the heads, which the methods
decode with. Loaded once (CLI command, app, eval, bench); a person is then a cluster id and a style, so switching
people costs a dictionary look-up and, across clusters, one `set_adapter` call. What CARD does with it for one
person (onboarding, fit) is methods/card/onboard.py; its decoding is card/decoding.py and card_decode.py.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from safetensors.torch import load_file

from personalize.data import Item, Task, TASKS
from personalize.lm.cpu_threads import hands_back_team, release_team
from personalize.lm.model_config import EncoderConfig, ModelConfig
from personalize.lm.models import LM, load_encoder, load_lm
from personalize.methods.artifacts import ArtifactsError, artifacts_meta
from personalize.methods.card.adapters import adapter_name, add_adapters, load_adapters
from personalize.methods.card.cluster import Clusters, assign, user_embeddings
from personalize.methods.card.config import FORMAT_VERSION, CardConfig
from personalize.methods.card.head import PersonalizationHead
from personalize.methods.card.neutral import neutral, raw_rewrites
from personalize.methods.card.own import OwnAdapters
from personalize.serving.generation import Generation
from personalize.serving.rows import DecodeRow
from personalize.serving.runner import decode_rows


class Engine:
    def __init__(self, cfg: CardConfig, lm: LM, model, encoder, clusters: Clusters,
                 heads: dict[str, PersonalizationHead], task: Task, meta: dict, population_lams: dict | None = None):
        self.cfg, self.lm, self.model = cfg, lm, model
        self._encoder = encoder  # the model, or its EncoderConfig: loaded on first use (Engine.load)
        self._encoder_lock = threading.Lock()
        self.tok = lm.tokenizer
        self.clusters, self.heads, self.task, self.meta = clusters, heads, task, meta
        self.population_lams = population_lams or {}
        self._active: str | None = None
        self.folder: Path | None = None  # the artifacts folder, set by load (methods find their files there)
        self._pending_adapters: list[str] = []  # cluster adapters load(adapters_later=True) left for later
        self._adapters_lock = threading.Lock()
        # the people's own adapters (a cluster of one); the studio keeps them beside its database
        self.own = OwnAdapters(self, Path("data") / "oppu" / str(self.artifacts_id))

    # ------------------------------------------------------------ loading
    @classmethod
    def load(cls, folder: str | Path, model: ModelConfig | None = None, adapters_later: bool = False) -> "Engine":
        """The build in `folder`. adapters_later: only the first cluster adapter now, the others on first
        need or by load_pending_adapters (the app calls it once its page answers: ~1 s of its start)."""
        folder = Path(folder)
        meta = artifacts_meta(folder)
        if meta.get("format_version", 0) > FORMAT_VERSION:
            raise ArtifactsError(f"artifacts at {folder} have format {meta['format_version']}, newer than this code "
                                 f"reads ({FORMAT_VERSION}): upgrade personalize or rebuild them")
        cfg = CardConfig.from_dict(meta["settings"])
        if model is not None:
            cfg = replace(cfg, model=model)
        lm = load_lm(cfg.model)
        names = [adapter_name(k, c) for k in cfg.ks for c in range(k)]
        peft_model = load_adapters(lm.model, folder / "adapters", names[:1] if adapters_later else names)
        z = np.load(folder / "clusters.npz")
        clusters = Clusters(users=meta["users"], embeddings=z["embeddings"],
                            centroids={k: z[f"centroids_k{k}"] for k in cfg.ks},
                            labels={k: z[f"labels_k{k}"] for k in cfg.ks})
        heads, lams = _load_heads(folder, cfg, meta)
        task = TASKS[meta["task"]]
        engine = cls(cfg, replace(lm, model=peft_model), peft_model, cfg.encoder, clusters,
                     heads, task, meta, lams)
        engine.folder = folder
        engine._pending_adapters = names[1:] if adapters_later else []
        release_team()  # the loading thread (often the main one) keeps no OpenMP team: see lm/cpu_threads.py
        return engine

    @property
    def encoder(self):
        """The sentence encoder, loaded when first needed (a saved history, a build): a start of the app
        that serves no new person yet does not pay for it."""
        with self._encoder_lock:
            if isinstance(self._encoder, EncoderConfig):
                self._encoder = load_encoder(self._encoder)
        return self._encoder

    @encoder.setter
    def encoder(self, value) -> None:
        self._encoder = value

    @property
    def artifacts_id(self) -> str:
        return self.meta.get("id", "unbuilt")

    @property
    def part(self) -> str | None:
        """The part of a build still running that this engine serves (build's on_part: "cluster", "card"), else None."""
        return self.meta.get("part")

    def take_built_parts(self) -> None:
        """The build this engine serves a part of (build's on_part) went on in its folder: its settings (the guard's
        decision), report and the head, once there, read. The adapters and clusters held stay: the build's later
        parts add to them under the same id."""
        meta = artifacts_meta(self.folder)
        if meta.get("id") != self.artifacts_id:
            raise ArtifactsError(f"{self.folder} now holds build {meta.get('id')}, not {self.artifacts_id}: load it anew")
        cfg = replace(CardConfig.from_dict(meta["settings"]), model=self.cfg.model)
        if not self.heads:
            self.heads, self.population_lams = _load_heads(self.folder, cfg, meta)
        self.cfg, self.meta = cfg, meta

    # ------------------------------------------------------------ adapters
    @hands_back_team
    def load_pending_adapters(self) -> None:
        """The cluster adapters a start left for later, in one pass; callers hold the model (no decode or
        training runs on it meanwhile: the studio's model lock, or the one thread that uses the engine)."""
        with self._adapters_lock:
            if self._pending_adapters:
                add_adapters(self.model, self.folder / "adapters", self._pending_adapters)
                self._pending_adapters = []

    def loaded_adapters(self) -> set[str]:
        if self._pending_adapters:
            self.load_pending_adapters()
        return set(self.model.peft_config)

    @property
    def active_adapter(self) -> str | None:
        return self._active

    def use_adapter(self, name: str | None) -> None:
        """Switch the active cluster adapter in memory; None = the base model."""
        if self._pending_adapters:
            self.load_pending_adapters()
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
        """The base model's plain rewrite of each text (§1.8); a rule-based plain version where the model's
        rewrite echoes the instruction or loses the content (neutral.py)."""
        return [neutral(t, r) for t, r in zip(texts, raw_rewrites(self, texts))]

    def prepare_items(self, items: Sequence[Item], neutral: dict[int, str] | None = None) -> list[Item]:
        """Every item with a prompt: free-form items get the task template of a neutral rewrite."""
        rewrites = dict(neutral or {})
        todo = [i for i, it in enumerate(items) if not it.x and i not in rewrites]
        rewrites |= dict(zip(todo, self.neutral_rewrites([items[i].y for i in todo])))
        return [it if it.x else replace(it, x=self.task.prompt(rewrites[i])) for i, it in enumerate(items)]

    @hands_back_team  # asked for on a request's thread too (a K whose assignment is not stored yet)
    def embed(self, items: Sequence[Item]) -> np.ndarray:
        return user_embeddings(self.encoder, [[it.y for it in items]])[0]

    def assign(self, embedding: np.ndarray, k: int) -> tuple[int, list[float]]:
        if k not in self.clusters.centroids:
            raise ValueError(f"K={k} was not built; built: {sorted(self.clusters.centroids)}")
        return assign(embedding, self.clusters.centroids[k])

    def decode_rows(self, rows: Sequence[DecodeRow], on_step=None) -> list[Generation]:
        """A method's own batch (rewrites, EXACT, tune, eval), every adapter loaded; the studio's use the scheduler."""
        if self._pending_adapters:
            self.load_pending_adapters()
        return decode_rows(self.model, self.tok, rows, on_step)


def _load_heads(folder: Path, cfg: CardConfig, meta: dict) -> tuple[dict, dict]:
    """Each objective's head and its population's λ; none where the build serves only its cluster part so far."""
    heads, lams = {}, {}
    for obj in cfg.objectives:
        if obj not in meta.get("head_users", {}):
            continue  # the build's cluster part: the head is still training (build's on_part)
        t = load_file(str(folder / f"head_{obj}.safetensors"))
        head = PersonalizationHead(t["P"].shape[1], t["U"].shape[0], t["U"].shape[1])
        head.load_state_dict({"P.weight": t["P"], "U": t["U"], "h_mean": t["h_mean"], "h_std": t["h_std"],
                              "gamma": t.get("gamma", torch.zeros(()))})  # no gamma: built before hard_pairs
        heads[obj] = head.eval().requires_grad_(False)
        lams[obj] = dict(zip(meta["head_users"][obj], t["lambdas"].numpy()))
    return heads, lams
