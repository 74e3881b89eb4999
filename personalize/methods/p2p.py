"""Profile-to-PEFT (METHOD §4, seeds/002): a hypernetwork maps a user's profile to a LoRA in one forward pass.

    φ^{m,l}_u = [Enc(profile_u) ‖ E_mod[m] ‖ E_dep[l]]
    (A^{m,l}_u, B^{m,l}_u) = Unflatten(f_θ(φ^{m,l}_u)),   A: [r, d_in], B: [d_out, r]
    y = W x + (α/r) · B A x        on q_proj and v_proj of every layer (paper: r = 8)
    θ* = argmin_θ E_u [ L_SFT(LM ⊕ Gen_θ(profile_u), H_u) ]

Choices where the paper is silent or does not fit this project (METHOD preamble):
- Profile: the paper embeds an LLM-written summary plus items retrieved for the current query; here
  Enc(profile) = normalize(mean_i Enc(y_i)), the user embedding CARD clusters on (cluster.user_embeddings),
  so one LoRA serves all of a user's queries. In training the profile leaves out the items whose loss is
  taken (the paper's "profile from H^{<t}, loss on H^{≥t}"), so f_θ cannot just copy a target.
- f_θ: a shared trunk (Linear-SiLU-Linear-SiLU-LayerNorm) and one output Linear per module type, because
  q_proj and v_proj have different output sizes under grouped-query attention.
- Initialisation: if the output layer started at zero, A = B = 0, and then ∂L/∂A = Bᵀ(…) = 0 and
  ∂L/∂B = (…)Aᵀ = 0: no gradient would ever reach θ. Like peft's LoRA init (A random, B = 0) but with
  B non-zero so that the gradient reaches both halves: the LayerNorm makes the trunk's features unit-RMS,
  so output weights of std 1/√(d_in·hidden) give A entries of std 1/√d_in (peft's A scale) and weights
  of std init_b_std/√hidden give B entries of std init_b_std (1e-3). The deltas are then small (~1e-3
  of the frozen projection) but non-zero, and they already depend on the profile.
- The LoRA is applied with forward hooks on the q_proj/v_proj modules (out += (α/r)·(x Aᵀ) Bᵀ), on top of
  the K = 1 adapter by default (`base_adapter`, the same starting point as OPPU); A and B may carry a
  batch dimension, so one training batch holds rows of different users.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import re
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np
import torch
import torch.nn as nn
from safetensors.torch import load_file, save_file
from transformers import get_cosine_schedule_with_warmup

from ..adapters import BASE_ADAPTER, answer_loss, sft_batch
from ..cluster import user_embeddings
from ..decoding import DecodingSettings, Generation, generate
from ..tokens import TokenBudget
from . import UserContext, fingerprint

FORMAT = 1
WEIGHTS, CONFIG = "hypernet.safetensors", "p2p.json"
ARTIFACTS_DIR = "p2p"  # where build saves the hypernetwork inside the artifacts folder

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


# ------------------------------------------------------------ the hypernetwork

class HyperLoRA(nn.Module):
    """f_θ: profile embedding [b, E] → per module type, A [b, L, r, d_in] and B [b, L, d_out, r]."""

    def __init__(self, cfg: P2PConfig, emb_dim: int, n_layers: int, shapes: Mapping[str, tuple[int, int]]):
        super().__init__()
        if set(shapes) != set(cfg.modules):
            raise ValueError(f"shapes {sorted(shapes)} do not match the config's modules {cfg.modules}")
        self.cfg, self.emb_dim, self.n_layers = cfg, emb_dim, n_layers
        self.shapes = {m: (int(shapes[m][0]), int(shapes[m][1])) for m in cfg.modules}  # (d_in, d_out)
        r, h = cfg.rank, cfg.hidden
        self.mod_emb = nn.Embedding(len(cfg.modules), cfg.mod_dim)
        self.dep_emb = nn.Embedding(n_layers, cfg.dep_dim)
        self.trunk = nn.Sequential(nn.Linear(emb_dim + cfg.mod_dim + cfg.dep_dim, h), nn.SiLU(),
                                   nn.Linear(h, h), nn.SiLU(), nn.LayerNorm(h))
        self.heads = nn.ModuleDict({m: nn.Linear(h, r * (d_in + d_out)) for m, (d_in, d_out) in self.shapes.items()})
        self.register_buffer("mean_profile", torch.zeros(emb_dim))  # cold start: the training users' mean
        with torch.no_grad():
            for m, (d_in, _) in self.shapes.items():
                w = self.heads[m].weight
                w[: r * d_in].normal_(0.0, 1.0 / math.sqrt(d_in * h))  # A ~ 1/√d_in, peft's LoRA A scale
                w[r * d_in:].normal_(0.0, cfg.init_b_std / math.sqrt(h))  # B small, not zero
                self.heads[m].bias.zero_()

    def forward(self, profiles: torch.Tensor) -> LoRA:
        b, E = profiles.shape
        M, L = len(self.cfg.modules), self.n_layers
        e = (profiles * math.sqrt(E)).float()  # unit-norm embedding → unit-RMS entries, like E_mod and E_dep
        phi = torch.cat([e[:, None, None, :].expand(b, M, L, E),
                         self.mod_emb.weight[None, :, None, :].expand(b, M, L, -1),
                         self.dep_emb.weight[None, None, :, :].expand(b, M, L, -1)], dim=-1)
        feats = self.trunk(phi)  # [b, M, L, hidden]
        r, out = self.cfg.rank, {}
        for j, m in enumerate(self.cfg.modules):
            d_in, d_out = self.shapes[m]
            flat = self.heads[m](feats[:, j])  # [b, L, r·(d_in + d_out)]
            out[m] = (flat[..., : r * d_in].reshape(b, L, r, d_in), flat[..., r * d_in:].reshape(b, L, d_out, r))
        return out

    def generate_lora(self, profile) -> LoRA:
        """One user's LoRA (batch dimension 1), without gradients: the deployment path."""
        p = torch.as_tensor(np.asarray(profile, dtype=np.float32), device=self.mean_profile.device)
        with torch.no_grad():
            return self(p.reshape(1, -1))


def lora_nbytes(lora: LoRA) -> int:
    return sum(t.numel() * t.element_size() for a, b in lora.values() for t in (a, b))


# ------------------------------------------------------------ applying a generated LoRA

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def lora_targets(model, modules: Sequence[str]) -> list[tuple[nn.Module, str, int]]:
    """(module, module type, layer) for every q_proj/v_proj-like module; on a peft model these are the
    LoRA wrappers, so a hook's output already holds the active adapter's delta."""
    out = []
    for name, mod in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        found = _LAYER.search(name)
        if leaf in modules and found:
            out.append((mod, leaf, int(found.group(1))))
    return out


def model_shapes(model, modules: Sequence[str]) -> tuple[int, dict[str, tuple[int, int]]]:
    """Number of layers and (d_in, d_out) of each target module type; every layer must agree."""
    shapes: dict[str, set] = {m: set() for m in modules}
    layers = set()
    for mod, m, l in lora_targets(model, modules):
        shapes[m].add((int(mod.in_features), int(mod.out_features)))
        layers.add(l)
    missing = [m for m, s in shapes.items() if not s]
    if missing:
        raise ValueError(f"the model has no {missing} modules inside numbered layers; P2P targets {list(modules)}")
    if any(len(s) > 1 for s in shapes.values()):
        raise ValueError(f"target modules differ in shape across layers: {shapes}")
    if layers != set(range(len(layers))):
        raise ValueError(f"target layers are not 0..L-1: {sorted(layers)}")
    return len(layers), {m: next(iter(s)) for m, s in shapes.items()}


def _hook(A: torch.Tensor, B: torch.Tensor, scale: float):
    def hook(module, args, out):
        x = args[0]
        return out + scale * ((x @ A.to(x.dtype).transpose(-1, -2)) @ B.to(x.dtype).transpose(-1, -2))
    return hook


@contextmanager
def applied(model, lora: LoRA, scale: float):
    """The generated LoRA on the model while the block runs: out += scale · (x Aᵀ) Bᵀ at each target.
    A and B have a batch dimension of 1 (one user for every row) or of the batch size (a user per row)."""
    handles = []
    try:
        for mod, m, l in lora_targets(model, list(lora)):
            A, B = lora[m]
            handles.append(mod.register_forward_hook(_hook(A[:, l], B[:, l], scale)))
        yield
    finally:
        for h in handles:
            h.remove()


# ------------------------------------------------------------ losses

def _rows_loss(model, tok, hyper: HyperLoRA, profiles: torch.Tensor, rows: Sequence[tuple[int, str, str]],
               budget: TokenBudget, reduction: str = "mean") -> tuple[torch.Tensor, int, int]:
    """SFT loss of rows (profile index, x, y), each under the LoRA generated from its own profile.
    Returns (loss, answer tokens, all tokens)."""
    lora = hyper(profiles)
    idx = torch.tensor([u for u, _, _ in rows], device=profiles.device)
    per_row = {m: (A[idx], B[idx]) for m, (A, B) in lora.items()}
    ids, mask, labels = sft_batch(tok, [(x, y) for _, x, y in rows], budget, model.device)
    with applied(model, per_row, hyper.cfg.scale):
        loss = answer_loss(model, ids, mask, labels, reduction=reduction)
    return loss, int((labels != -100).sum()), int(mask.sum())


@torch.no_grad()
def rows_loss(model, tok, hyper: HyperLoRA, profiles, rows, budget: TokenBudget, batch_size: int = 16) -> float:
    """Mean answer-token cross-entropy of rows (profile index, x, y) under their generated LoRAs."""
    profiles = torch.as_tensor(np.asarray(profiles, dtype=np.float32), device=hyper.mean_profile.device)
    total, n = 0.0, 0
    for i in range(0, len(rows), batch_size):
        chunk = rows[i: i + batch_size]
        used = sorted({u for u, _, _ in chunk})
        remap = {u: j for j, u in enumerate(used)}
        loss, k, _ = _rows_loss(model, tok, hyper, profiles[used], [(remap[u], x, y) for u, x, y in chunk],
                                budget, reduction="sum")
        total, n = total + loss.item(), n + k
    return total / max(n, 1)


def profile_loss(model, tok, hyper: HyperLoRA, profile, examples: Sequence[tuple[str, str]],
                 budget: TokenBudget) -> float:
    """Mean answer-token cross-entropy of examples (x, y) under the LoRA generated from one profile."""
    return rows_loss(model, tok, hyper, np.asarray(profile, dtype=np.float32)[None], [(0, x, y) for x, y in examples],
                     budget)


# ------------------------------------------------------------ training

def _normalize(v: np.ndarray) -> np.ndarray:
    return (v / (np.linalg.norm(v) + 1e-12)).astype(np.float32)


def _item_embeddings(encoder, users: Mapping[str, Sequence]) -> dict[str, np.ndarray]:
    """Enc(y_i) of every item, normalised, in one encoder call (cluster.user_embeddings' convention)."""
    names = list(users)
    flat = [it.y for n in names for it in users[n]]
    emb = encoder.encode(flat, batch_size=64, convert_to_numpy=True, normalize_embeddings=True)
    out, i = {}, 0
    for n in names:
        out[n] = np.asarray(emb[i: i + len(users[n])], dtype=np.float32)
        i += len(users[n])
    return out


def _leave_out(embs: np.ndarray, targets: Sequence[int]) -> np.ndarray:
    keep = np.ones(len(embs), bool)
    keep[list(targets)] = False
    return _normalize(embs[keep].mean(0))


def _unpack(target, cfg: P2PConfig):
    """(model, tok, budget, engine or None) from an Engine or a (model, tokenizer) pair."""
    if isinstance(target, tuple):
        model, tok = target
        return model, tok, cfg.budget or TokenBudget(), None
    return target.model, target.tok, cfg.budget or target.cfg.budget, target


def _activate(model, engine, name: str | None) -> None:
    """The adapter under the generated LoRA: through the engine when there is one (it tracks the
    active adapter), else on a bare peft model; a plain transformers model needs base_adapter=None."""
    if engine is not None:
        engine.use_adapter(name)
        return
    if name is None:
        if hasattr(model, "peft_config"):
            raise ValueError("base_adapter=None on a bare peft model: pass the Engine, or the unwrapped base model")
        return
    if name not in getattr(model, "peft_config", {}):
        raise ValueError(f"base_adapter={name!r} is not an adapter of this model; use base_adapter=None "
                         "for a plain model")
    model.set_adapter(name, inference_mode=True)


def train_p2p(target, encoder, users: Mapping[str, Sequence], cfg: P2PConfig = P2PConfig(),
              progress: Callable[[int, int, float], None] | None = None,
              held_out_users: Mapping[str, Sequence] | None = None) -> tuple[HyperLoRA, dict]:
    """Trains f_θ end to end over `users` (name → items with prompts x) with the frozen LM's SFT loss.

    Each step takes `users_per_step` users (cycling through a shuffled order) and `items_per_user` of
    each one's items as targets; the profile is the embedding of the user's other items. Users with
    fewer than 2 items cannot give both and are skipped (listed in the report). `target` is an Engine
    or a (model, tokenizer) pair. Returns the hypernetwork (eval mode) and its report.
    """
    model, tok, budget, engine = _unpack(target, cfg)
    bad = [n for n, items in {**users, **(held_out_users or {})}.items() if any(not it.x for it in items)]
    if bad:
        raise ValueError(f"items need their prompt x (neutral rewrites first); users without: {bad[:5]}")
    held_out_users = dict(held_out_users or {})
    usable = {n: list(items) for n, items in users.items() if len(items) >= 2}
    skipped = sorted(set(users) - set(usable))
    if not usable:
        raise ValueError("P2P training needs users with at least 2 history items (a profile and a target)")
    _activate(model, engine, cfg.base_adapter)
    n_layers, shapes = model_shapes(model, cfg.modules)
    t0 = time.perf_counter()
    held = {n: list(v) for n, v in held_out_users.items() if len(v) >= 2}
    embs = _item_embeddings(encoder, usable | held)
    names = sorted(usable)
    emb_dim = next(iter(embs.values())).shape[1]

    torch.manual_seed(cfg.seed)
    device = model.device
    hyper = HyperLoRA(cfg, emb_dim, n_layers, shapes).to(device)
    hyper.mean_profile.copy_(torch.as_tensor(_normalize(np.stack([embs[n].mean(0) for n in names]).mean(0))))

    def eval_set(pool: Sequence[str]):  # newest item (index 0 in LaMP order) against the rest as profile
        profiles = np.stack([_leave_out(embs[n], [0]) for n in pool]) if pool else np.zeros((0, emb_dim), np.float32)
        return profiles, [(j, usable.get(n, held.get(n))[0].x, usable.get(n, held.get(n))[0].y)
                          for j, n in enumerate(pool)]

    train_eval = eval_set(names[: cfg.eval_users])
    held_eval = eval_set(sorted(held))
    flags = [p.requires_grad for p in model.parameters()]
    was_training = model.training
    model.eval()  # frozen LM, no dropout; gradients still flow through it into θ
    for p in model.parameters():
        p.requires_grad_(False)
    opt = torch.optim.AdamW(hyper.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = get_cosine_schedule_with_warmup(opt, max(1, cfg.steps // 10), max(cfg.steps, 1))
    rng = random.Random(cfg.seed)
    order: list[str] = []
    curve, held_curve, tokens = [], [], 0
    try:
        hyper.eval()
        before = rows_loss(model, tok, hyper, *train_eval, budget) if train_eval[1] else None
        if held_eval[1]:
            held_curve.append((0, rows_loss(model, tok, hyper, *held_eval, budget)))
        hyper.train()
        for step in range(1, cfg.steps + 1):
            picked = []
            for _ in range(min(cfg.users_per_step, len(names))):
                if not order:
                    order = names[:]
                    rng.shuffle(order)
                picked.append(order.pop())
            profiles, rows = [], []
            for j, n in enumerate(picked):
                items = usable[n]
                targets = rng.sample(range(len(items)), min(cfg.items_per_user, len(items) - 1))
                profiles.append(_leave_out(embs[n], targets))
                rows += [(j, items[t].x, items[t].y) for t in targets]
            prof = torch.as_tensor(np.stack(profiles), device=device)
            loss, _, n_tok = _rows_loss(model, tok, hyper, prof, rows, budget)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(hyper.parameters(), 1.0)
            opt.step(), sched.step(), opt.zero_grad(set_to_none=True)
            tokens += n_tok
            curve.append(round(loss.item(), 4))
            if progress:
                progress(step, cfg.steps, loss.item())
            if held_eval[1] and (step % cfg.eval_every == 0 or step == cfg.steps):
                hyper.eval()
                held_curve.append((step, rows_loss(model, tok, hyper, *held_eval, budget)))
                hyper.train()
        hyper.eval()
        after = rows_loss(model, tok, hyper, *train_eval, budget) if train_eval[1] else None
    finally:
        for p, f in zip(model.parameters(), flags):
            p.requires_grad_(f)
        model.train(was_training)
    report = {"users": len(names), "skipped_users": skipped, "steps": cfg.steps, "tokens": tokens,
              "seconds": round(time.perf_counter() - t0, 2), "train_loss": curve,
              "train_users_loss": {"before": before, "after": after, "users": len(train_eval[1])},
              "held_out_loss": held_curve, "params": sum(p.numel() for p in hyper.parameters()),
              "emb_dim": emb_dim, "n_layers": n_layers, "shapes": hyper.shapes}
    return hyper.eval().requires_grad_(False), report


# ------------------------------------------------------------ save / load

def save(hyper: HyperLoRA, folder: str | Path, extra: dict | None = None) -> Path:
    """`hypernet.safetensors` (θ, E_mod, E_dep, mean profile) and `p2p.json` (config, shapes, extra)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().cpu().contiguous() for k, v in hyper.state_dict().items()}, str(folder / WEIGHTS))
    meta = {"format": FORMAT, "config": hyper.cfg.to_dict(), "emb_dim": hyper.emb_dim, "n_layers": hyper.n_layers,
            "shapes": {m: list(s) for m, s in hyper.shapes.items()}, **(extra or {})}
    (folder / CONFIG).write_text(json.dumps(meta, indent=2))
    return folder


def load(folder: str | Path, device=None) -> HyperLoRA:
    folder = Path(folder)
    if not (folder / CONFIG).exists() or not (folder / WEIGHTS).exists():
        raise ValueError(f"no P2P hypernetwork at {folder}: train one with personalize.methods.p2p.train_p2p "
                         "and save it there")
    meta = json.loads((folder / CONFIG).read_text())
    if meta.get("format") != FORMAT:
        raise ValueError(f"{folder / CONFIG} has format {meta.get('format')}, this code reads format {FORMAT}")
    hyper = HyperLoRA(P2PConfig.from_dict(meta["config"]), meta["emb_dim"], meta["n_layers"],
                      {m: tuple(s) for m, s in meta["shapes"].items()})
    hyper.load_state_dict(load_file(str(folder / WEIGHTS)))
    return hyper.to(device or "cpu").eval().requires_grad_(False)


# ------------------------------------------------------------ the method

class P2PMethod:
    """Deployment: one f_θ pass per user (cached, keyed by the history's fingerprint), hooks while decoding.

    The architecture, rank and base adapter are those the hypernetwork was trained with (its own
    config); this method's cfg only says where the hypernetwork is and how many LoRAs to cache.
    """

    name = "p2p"
    config_class = P2PConfig

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

    # ------------------------------------------------------------ onboarding
    def prepare(self, user: UserContext) -> dict:
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
        if self.store is not None:
            from ..store import StoreError

            try:
                self.store.put_blob(user.name, self.name, str(self.engine.artifacts_id), info)
            except StoreError:
                pass  # users not in the store (evaluation populations)
        return info

    # ------------------------------------------------------------ generation
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
        model, tok, budget = self.engine.model, self.engine.tok, self.engine.cfg.budget
        total, n = 0.0, 0
        with torch.no_grad(), applied(model, lora, self.hyper.cfg.scale):
            for i in range(0, len(examples), 16):
                ids, mask, labels = sft_batch(tok, examples[i: i + 16], budget, model.device)
                total += answer_loss(model, ids, mask, labels, reduction="sum").item()
                n += int((labels != -100).sum())
        return total / max(n, 1)
