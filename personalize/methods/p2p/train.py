"""Training f_θ on a population (SFT through the generated LoRAs) and the losses it reports."""

from __future__ import annotations

import random
import time
from typing import Callable, Mapping, Sequence

import numpy as np
import torch
from transformers import get_cosine_schedule_with_warmup

from personalize.methods.card.adapters import answer_loss, sft_batch
from personalize.methods.card.cluster import item_embeddings
from personalize.lm.tokens import TokenBudget
from personalize.methods.p2p.p2p_config import P2PConfig
from personalize.methods.p2p.hooks import applied, model_shapes
from personalize.methods.p2p.hypernet import HyperLoRA

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


def _leave_out(embs: np.ndarray, targets: Sequence[int]) -> np.ndarray:
    keep = np.ones(len(embs), bool)
    keep[list(targets)] = False
    return _normalize(embs[keep].mean(0))


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
    if isinstance(target, tuple):  # a (model, tokenizer) pair
        (model, tok), budget, engine = target, cfg.budget or TokenBudget(), None
    else:
        model, tok, budget, engine = target.model, target.tok, cfg.budget or target.cfg.budget, target
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
    pool = usable | held  # Enc(y_i) of every item, normalised (cluster.user_embeddings' convention)
    embs = {n: np.asarray(e, dtype=np.float32)
            for n, e in zip(pool, item_embeddings(encoder, [[it.y for it in items] for items in pool.values()]))}
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
    sched = get_cosine_schedule_with_warmup(opt, cfg.steps // 10, max(cfg.steps, 1))  # as adapters.train_adapter's
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
