"""Profile-to-PEFT's settings and file names (what build saves and the method reads)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from personalize.methods.card.adapters import BASE_ADAPTER
from personalize.lm.tokens import TokenBudget
from personalize.methods.artifacts import P2P_CONFIG as CONFIG
from personalize.methods.artifacts import P2P_DIR as ARTIFACTS_DIR  # the hypernetwork's folder inside a build
from personalize.methods.artifacts import P2P_WEIGHTS as WEIGHTS

FORMAT = 1

LoRA = dict  # module type -> (A [b, L, r, d_in], B [b, L, d_out, r])


@dataclass(frozen=True)
class P2PConfig:
    # the generated LoRA (paper: rank 8 on q_proj and v_proj)
    rank: int = 8
    alpha: float = 16.0  # deltas are scaled by alpha / rank, as in peft
    modules: tuple[str, ...] = ("q_proj", "v_proj")
    base_adapter: str | None = BASE_ADAPTER  # adapter under the generated LoRA; None = the plain base model
    # f_θ
    hidden: int = 256
    mod_dim: int = 32  # E_mod
    dep_dim: int = 32  # E_dep
    init_b_std: float = 1e-3  # std of B's entries at initialisation (see the module docstring)
    # training (paper: lr 2e-5, 20k steps, batch 32 on a 7B model; these fit a CPU and a 135M model).
    # An output weight feeds `hidden` features, so one Adam step moves B by ~hidden·lr: on SmolLM2-135M (the
    # demo users) lr 1e-3 diverged within 4 steps (loss 2.3 → 10.8); over 10 steps on 12 users 2e-5 gave
    # 1.65 → 1.41 and 1e-4 1.65 → 0.86.
    steps: int = 300
    lr: float = 1e-4
    weight_decay: float = 0.0
    users_per_step: int = 8
    items_per_user: int = 2  # targets per user and step; the rest of the history is the profile
    eval_users: int = 16  # training users whose newest item is the before/after loss (in-sample: it is
    #                       also a training target; held_out_users measure generalisation)
    eval_every: int = 50  # held-out users' loss curve
    budget: TokenBudget | None = None  # None: the engine's budget (TokenBudget() for a bare model)
    seed: int = 0
    # deployment
    folder: str | None = None  # hypernetwork folder; None: <engine's artifacts folder>/p2p (build writes it)
    max_cached: int = 16  # generated LoRAs kept in memory (regenerating one costs one f_θ pass)

    def __post_init__(self):
        if self.rank < 1 or self.alpha <= 0 or not self.modules:
            raise ValueError("P2P needs rank >= 1, alpha > 0 and at least one target module")
        if min(self.hidden, self.mod_dim, self.dep_dim) < 1 or self.init_b_std <= 0:
            raise ValueError("hidden, mod_dim and dep_dim must be >= 1 and init_b_std > 0")
        if self.steps < 0 or self.lr <= 0 or self.weight_decay < 0:
            raise ValueError("steps must be >= 0, lr > 0 and weight_decay >= 0")
        if min(self.users_per_step, self.items_per_user, self.eval_every, self.max_cached) < 1 or self.eval_users < 0:
            raise ValueError("users_per_step, items_per_user, eval_every and max_cached must be >= 1, eval_users >= 0")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "P2PConfig":
        d = {k: v for k, v in d.items() if k in {f.name for f in dataclasses.fields(cls)}}
        if isinstance(d.get("budget"), dict):
            d["budget"] = TokenBudget(**d["budget"])
        if "modules" in d:
            d["modules"] = tuple(d["modules"])
        return cls(**d)
