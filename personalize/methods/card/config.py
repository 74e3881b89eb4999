"""CARD's settings, each field once with its default, validation and help (the command line is made from them):
LoraSettings, HeadSettings, StyleSettings and CardConfig, every setting of the offline build and the online stage,
saved with the artifacts. Settings only, so that the command line reads them without the model code.

One nested dataclass, written as JSON next to the artifacts, so that a later
run (onboard, generate, eval, the app) uses exactly the settings of the build.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from personalize.flags import setting
from personalize.lm.model_config import EncoderConfig, ModelConfig
from personalize.lm.tokens import TokenBudget
from personalize.serving.settings import DecodingSettings

# of the artifacts folder; Engine.load refuses newer ones. 2: decoding applies the tokens head's trained rule
# (raw Δ) and the person's style, so α chosen by a version-1 build means something else (the demo is rebuilt)
FORMAT_VERSION = 2


OBJECTIVES = ("tokens", "pairs", "hard_pairs")
PAIR_OBJECTIVES = ("pairs", "hard_pairs")  # objectives that need negatives
KEYS = ("state", "head")  # what a person's memory is keyed by


@dataclass(frozen=True)
class LoraSettings:
    """LoRA and its training budget. Paper (Qwen3-8B): r=16, alpha=32, dropout 0.05,
    targets q,k,v,o,gate,up,down, 10 epochs, cosine decay. Defaults here fit a 2-core CPU."""

    r: int = 8
    alpha: int = 16
    dropout: float = 0.05
    targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    lr: float = 1e-3
    batch_size: int = 8
    base_steps: int = setting(60, "K = 1 adapter steps (batch 8), on everyone")
    cluster_steps: int = setting(8, "steps per cluster adapter, from the K = 1 weights")
    eval_every: int = 10  # held-out loss curve (METHOD §1.9.4: train until it flattens)
    seed: int = 0
    cluster_layers: int = setting(0, "upper blocks a cluster adapter trains (0: all); its lower blocks stay the K = 1 "
                                     "adapter's, so their states are computed once per text and shared by every "
                                     "cluster")

    def __post_init__(self):
        if self.r < 1 or self.alpha <= 0 or not 0 <= self.dropout < 1:
            raise ValueError("LoRA needs r >= 1, alpha > 0 and 0 <= dropout < 1")
        if self.base_steps < 0 or self.cluster_steps < 0 or self.batch_size < 1 or self.cluster_layers < 0:
            raise ValueError("steps and cluster_layers must be >= 0 and batch_size >= 1")


@dataclass(frozen=True)
class HeadSettings:
    d: int = setting(128, "head dimension D (paper: 128 best of 32/64/128/256)")
    n_layers: int = setting(4, "last layers whose states form h_t (paper: 4 best of 1/4/8)")
    objective: str = "tokens"
    top_k: int = 50
    beta: float = 1.0  # Bradley–Terry temperature ("pairs")
    rho: float = 0.01  # pull of λ_u towards 1: the cold-start vector
    epochs: int = setting(20, "the head's epochs on the population")
    # > 0: stop when held-out loss has not improved for this many epochs, keeping the best epoch. Default 2: on
    # scholarly_titles dev every objective overfits without it (held-out top-1 0.50 vs 0.60 with no head)
    patience: int = setting(2, "early stopping on held-out users' items: epochs without improvement (0 = off)")
    lr: float = 1e-3
    weight_decay: float = setting(0.0, "AdamW weight decay on the head's P and U (not λ, whose prior is ρ)")
    lambda_lr_scale: float = 30.0  # population λ's learning rate, relative to P and U's
    batch_users: int = 8
    fit_iters: int = 50  # LBFGS iterations for a new user's λ
    n_samples: int = 1  # hard_pairs: sampled cluster outputs per item, beside the greedy one
    n_other: int = 1  # hard_pairs, build only: other users' texts of the same cluster per item
    temperature: float = 1.0  # hard_pairs: sampling temperature of the sampled negatives (top_k candidates)
    seed: int = 0

    def __post_init__(self):
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
        if self.d < 1 or self.n_layers < 1 or self.top_k < 2:
            raise ValueError("head needs d >= 1, n_layers >= 1, top_k >= 2")
        if self.rho < 0 or self.beta <= 0 or self.weight_decay < 0:
            raise ValueError("rho and weight_decay must be >= 0 and beta > 0")
        if self.n_samples < 0 or self.n_other < 0 or self.temperature <= 0:
            raise ValueError("n_samples and n_other must be >= 0 and temperature > 0")


@dataclass(frozen=True)
class StyleSettings:
    """Which parts of a person's style CARD decodes with, and their strengths (chosen on dev, docs/RESULTS.md)."""

    bias: bool = True  # sparse per-user token bias fitted jointly with λ (tokens head)
    memory: bool = True  # per-user kNN memory of (state, next token)
    retrieval: bool = False  # the user's BM25-nearest history items in the cluster model's prompt
    fallback: bool = True  # decode as the cluster model when the style loses to it on the user's held-out items
    rho_bias: float = 0.01  # L2 pull of the bias towards 0 (λ's is HeadSettings.rho, towards 1)
    max_bias_tokens: int = 512  # the bias keeps this many largest |b| entries (6 bytes each when stored)
    knn_weight: float = 0.3  # w: share of p_kNN in the mixture
    knn_neighbours: int = 16
    knn_temperature: float = 0.05  # softmax temperature over the neighbours' cosine similarities
    max_memory: int = 4096  # entries kept (newest items first)
    key: str = "head"  # memory keys: "state" (the last layer's state, H floats) or "head" (P h, D floats: smaller)
    form: bool = True  # the person's form: a bias on the answer's first tokens (fit_form)
    form_positions: int = 3  # the first tokens it covers
    form_prior: float = 8.0  # κ: the cluster model's own distribution counts as this many of the person's texts
    form_cap: float = 10.0  # the largest raise, in logits (a token outside every top-k has no p̄ to divide by)
    # λ's prior centre: 0, none of the population's correction where the person's text does not show it (the
    # head's Δ at λ = 1 carries the population's form: "BUG:" for people who never write it); 1, the population's
    lambda_prior: float = 0.0
    # a person further from their nearest cluster than all but `far_share` of the build's own people (closeness)
    # gets their memory at this weight at least, whatever `memory` says: the cluster model writes a population's
    # form that is not theirs, and their own past words are what carries them (0: off)
    far_knn_weight: float = 0.15
    far_share: float = 0.1
    # no run of more than the person's own reuse (at least `copy_run_floor` tokens) of one of their past texts,
    # unless the prompt holds it (no_copy.PastTextGuard): a past text handed back is not written for the prompt
    no_copy: bool = True
    copy_run_floor: int = 4

    def __post_init__(self):
        if self.copy_run_floor < 1:
            raise ValueError("copy_run_floor >= 1 (tokens)")
        if not 0 <= self.knn_weight <= 1 or self.knn_neighbours < 1 or self.knn_temperature <= 0:
            raise ValueError("knn_weight in [0, 1], knn_neighbours >= 1 and knn_temperature > 0")
        if self.rho_bias <= 0 or self.max_bias_tokens < 1 or self.max_memory < 1:
            raise ValueError("rho_bias > 0, max_bias_tokens >= 1 and max_memory >= 1")
        if self.form_positions < 0 or self.form_prior <= 0 or self.form_cap <= 0:
            raise ValueError("form_positions >= 0, form_prior > 0 and form_cap > 0")
        if not 0 <= self.far_knn_weight <= 1 or not 0 <= self.far_share <= 1:
            raise ValueError("far_knn_weight and far_share in [0, 1]")
        if self.key not in KEYS:
            raise ValueError(f"key must be one of {KEYS}, got {self.key!r}")


@dataclass(frozen=True)
class OwnSettings:
    """A cluster of one (methods/card/own.py): who gets an adapter of their own, and what it costs to train."""

    # off by default, chosen on people the study never scores (benchmarks/far_sweep.py,
    # docs/results/2026-11-28-issue-48-far.md "Who is far", before issue 57 counted a copy as a loss):
    # on 60 validation and tuning people no far_share beat no one far, and on the 83 far of 154 left-out people card
    # over an own adapter wrote no closer to them than card over the cluster (it copies their past subjects less often)
    far: bool = setting(False, "a person beyond the build's clusters (StyleSettings.far_share) gets their own adapter "
                               "after Save (Fit's button trains one for anyone)")
    layers: int = setting(6, "upper blocks of the nearest cluster's adapter trained on the person's items (the lower "
                             "blocks' states are computed once); 6 of SmolLM2's 30 keep the file under 1 MB")
    steps: int = setting(16, "optimiser steps from the cluster's weights (OPPU: up to 40 from the K = 1 adapter's)")
    lr: float = 2e-3
    batch_size: int = 8

    def __post_init__(self):
        if self.layers < 1 or self.steps < 1 or self.lr <= 0 or self.batch_size < 1:
            raise ValueError("own adapter: layers, steps and batch_size >= 1, lr > 0")


@dataclass(frozen=True)
class CardConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    budget: TokenBudget = field(default_factory=TokenBudget)
    lora: LoraSettings = field(default_factory=LoraSettings)
    head: HeadSettings = field(default_factory=HeadSettings)
    decoding: DecodingSettings = field(default_factory=DecodingSettings)
    style: StyleSettings = field(default_factory=StyleSettings)  # what `card` decodes with beside λ (METHOD §1.10)
    own: OwnSettings = field(default_factory=OwnSettings)  # a cluster of one (METHOD §1.11)
    ks: tuple[int, ...] = setting((1, 2, 4, 8), "cluster counts to build (must include 1)")
    default_k: int = 4  # the cluster count the head is trained on and methods use unless told
    objectives: tuple[str, ...] = setting(("tokens",), "head objectives to train, the first CARD's default: any of "
                                          "tokens, pairs, hard_pairs (docs/METHOD.md §1.9.3 b, a, c)")
    items_per_user: int = setting(16, "newest items of each population user the build uses")
    holdout: float = 0.2  # share of each user's items kept out of fits, for diagnostics
    n_val_users: int = setting(30, "validation people: the decoding choice and the harm guard (people outside the "
                                   "population first, then population users held out of training)")
    alphas: tuple[float, ...] = (0.0, 0.5, 1.0, 2.0, 4.0)
    min_fit_items: int = 2  # fewer items: cold start, λ = 1

    def __post_init__(self):
        if not self.ks or any(k < 1 for k in self.ks) or 1 not in self.ks:
            raise ValueError(f"ks must be positive and include 1 (the base adapter), got {self.ks}")
        if self.default_k not in self.ks:
            raise ValueError(f"default_k={self.default_k} must be one of the built ks {self.ks}")
        if not self.objectives or any(o not in OBJECTIVES for o in self.objectives):
            raise ValueError(f"objectives must be among {OBJECTIVES}, got {self.objectives}")
        if not 0 <= self.holdout < 1 or self.items_per_user < 1 or self.n_val_users < 0:
            raise ValueError("holdout in [0, 1), items_per_user >= 1, n_val_users >= 0")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "CardConfig":
        return _build(cls, d)


def _build(cls, d: dict[str, Any]):
    """Rebuild nested frozen dataclasses from JSON (lists become tuples)."""
    kwargs = {}
    hints = {f.name: f for f in dataclasses.fields(cls)}
    for name, value in d.items():
        if name not in hints:
            continue  # settings removed since the artifacts were built
        default = hints[name].default_factory() if hints[name].default_factory is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(default) and isinstance(value, dict):
            value = _build(type(default), value)
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[name] = value
    return cls(**kwargs)
