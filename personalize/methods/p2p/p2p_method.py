"""The deployed method: one f_θ pass per person (cached), the LoRA hooked on while decoding."""

from __future__ import annotations

import statistics

import time
from collections import OrderedDict
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from personalize.methods.card.adapters import sft_loss
from personalize.methods.card.cluster import user_embeddings
from personalize.serving.rows import DecodeRow
from personalize.serving.generation import Generation, generate
from personalize.serving.settings import DecodingSettings
from personalize.methods.base import UserContext, fingerprint, record_report
from personalize.methods.p2p.p2p_config import ARTIFACTS_DIR, CONFIG, WEIGHTS, LoRA, P2PConfig
from personalize.methods.p2p.hooks import applied, model_shapes
from personalize.methods.p2p.hypernet import HyperLoRA, lora_nbytes
from personalize.methods.p2p.io import load
from personalize.methods.p2p.p2p_steer import P2PSteer

class P2PMethod:
    """Deployment: one f_θ pass per user (cached, keyed by the history's fingerprint), hooks while decoding.

    The architecture, rank and base adapter are those the hypernetwork was trained with (its own
    config); this method's cfg only says where the hypernetwork is and how many LoRAs to cache.
    """

    name = "p2p"
    batch = "a row on the K = 1 adapter with the person's generated LoRA added by hooks on that row only"
    config_class = P2PConfig
    stored = "the generated LoRA held to serve the user"

    @staticmethod
    def stored_bytes(user, info: dict) -> int:
        return int(info["lora_bytes"])

    @staticmethod
    def bench_figures(infos) -> dict:
        """The profile embedding it keeps per person, the median over people."""
        return {"profile_bytes": int(statistics.median(i["profile_bytes"] for i in infos))}

    def __init__(self, engine, store=None, cfg: P2PConfig = P2PConfig(), hypernet: HyperLoRA | None = None):
        self.engine, self.store, self.cfg = engine, store, cfg
        artifacts = getattr(engine, "folder", None)
        self.folder = Path(cfg.folder) if cfg.folder else (Path(artifacts) / ARTIFACTS_DIR if artifacts else None)
        if hypernet is None:
            hypernet = self._load_default() if not cfg.folder else load(self.folder)
        self.hyper = hypernet.to(engine.model.device).eval()
        n_layers, shapes = model_shapes(engine.model, self.hyper.cfg.modules)
        if n_layers != self.hyper.n_layers or shapes != self.hyper.shapes:
            raise ValueError(f"the hypernetwork was trained for {self.hyper.n_layers} layers {self.hyper.shapes}, "
                             f"this model has {n_layers} layers {shapes}")
        self._cache: OrderedDict[str, tuple[str, LoRA, bool]] = OrderedDict()  # user -> (key, LoRA, cold start)

    def _load_default(self) -> HyperLoRA:
        """The hypernetwork `build` trained next to the engine's adapters, with an error that says what to run."""
        if self.folder is None:
            raise ValueError("P2P: this engine was not loaded from an artifacts folder; pass P2PConfig(folder=...) "
                             "or a trained hypernet")
        if not (self.folder / CONFIG).exists() or not (self.folder / WEIGHTS).exists():
            raise ValueError(f"no P2P hypernetwork in the artifacts at {self.folder.parent} (built with --skip-p2p "
                             "or by an older build): run `python -m personalize build` again without --skip-p2p")
        return load(self.folder)

    def profile(self, user: UserContext) -> tuple[np.ndarray, bool]:
        """normalize(mean Enc(y_i)); with no history, the training users' mean profile (cold start)."""
        if not user.items:
            return self.hyper.mean_profile.cpu().numpy(), True
        return user_embeddings(self.engine.encoder, [[it.y for it in user.items]])[0], False

    def lora(self, user: UserContext) -> tuple[LoRA, bool]:
        key = fingerprint([it.y for it in user.items])
        hit = self._cache.get(user.name)
        if hit is None or hit[0] != key:
            profile, cold = self.profile(user)
            hit = (key, self.hyper.generate_lora(profile), cold)
            self._cache[user.name] = hit
            while len(self._cache) > self.cfg.max_cached:
                self._cache.popitem(last=False)
        self._cache.move_to_end(user.name)
        return hit[1], hit[2]

    def forget_user(self, name: str) -> None:
        """Drops a forgotten user's generated LoRA from the cache."""
        self._cache.pop(name, None)

    # ------------------------------------------------------------ prepare: the per-user work
    def prepare(self, user: UserContext, progress=None) -> dict:
        """Embeds the profile and generates the LoRA (kept in memory; storing the profile is enough to
        regenerate it). Empty history: the mean training profile, flagged cold_start."""
        t0 = time.perf_counter()
        profile, cold = self.profile(user)
        t1 = time.perf_counter()
        lora = self.hyper.generate_lora(profile)
        if lora[self.hyper.cfg.modules[0]][0].is_cuda:
            torch.cuda.synchronize()
        t2 = time.perf_counter()
        self._cache.pop(user.name, None)
        self._cache[user.name] = (fingerprint([it.y for it in user.items]), lora, cold)
        while len(self._cache) > self.cfg.max_cached:
            self._cache.popitem(last=False)
        info = {"method": self.name, "n_items": len(user.items), "cold_start": cold,
                "embed_s": round(t1 - t0, 4), "generate_lora_s": round(t2 - t1, 4), "prepare_s": round(t2 - t0, 4),
                "lora_bytes": lora_nbytes(lora), "profile_bytes": int(profile.astype(np.float32).nbytes)}
        record_report(self, user, info)
        return info

    # ------------------------------------------------------------ generation
    def is_prepared(self, user: UserContext) -> bool:
        return True  # the LoRA is one f_θ pass (milliseconds), made when a decode first needs it

    def rows(self, user: UserContext, prompts: list[str], settings: DecodingSettings,
             trace: bool = False) -> list[DecodeRow]:
        """Rows on the base adapter with this person's generated LoRA hooked on them alone (steer.P2PSteer)."""
        lora, cold = self.lora(user)
        steer = P2PSteer(lora, self.hyper.cfg.scale)
        return [DecodeRow(p, self.engine.cfg.budget, settings, self.hyper.cfg.base_adapter, steer,
                          trace=[{"base_adapter": self.hyper.cfg.base_adapter, "cold_start": cold}]) for p in prompts]

    def generate(self, user: UserContext, prompts: list[str], settings: DecodingSettings) -> list[Generation]:
        """Decoding with the generated LoRA hooked onto the base adapter; trace = [{"cold_start": ...}]."""
        lora, cold = self.lora(user)
        self.engine.use_adapter(self.hyper.cfg.base_adapter)
        with applied(self.engine.model, lora, self.hyper.cfg.scale):
            outs = generate(self.engine.model, self.engine.tok, list(prompts), self.engine.cfg.budget, settings)
        for g in outs:
            g.trace = [{"base_adapter": self.hyper.cfg.base_adapter, "cold_start": cold}]
        return outs

    def loss(self, user: UserContext, examples: Sequence[tuple[str, str]]) -> float:
        """Answer-token cross-entropy of examples under this user's generated LoRA (for eval and tests)."""
        lora, _ = self.lora(user)
        self.engine.use_adapter(self.hyper.cfg.base_adapter)
        with applied(self.engine.model, lora, self.hyper.cfg.scale):
            return sft_loss(self.engine.model, self.engine.tok, examples, self.engine.cfg.budget)
