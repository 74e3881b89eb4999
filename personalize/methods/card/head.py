"""The personalization head and user vectors (METHOD §1.4-§1.6, §1.9.3).

Δ_t = U ((P h_t) ⊙ λ_u): P and U are shared by everyone and learnt once on the
population; a user is only λ_u (D floats). Because Δ is linear in λ_u, fitting a
new user is a D-dimensional convex problem that takes milliseconds.

Three objectives, all selectable (the ablation METHOD §1.9.3 asks for):
- "pairs" (a): the paper's Bradley–Terry loss on implicit pairs (user text y+
  vs the cluster model's greedy output y−), r_u(x, y) = λ_u · φ(x, y).
- "tokens" (b): the corrected logits must rank the user's actual next token
  among the cluster model's top-k candidates (a softmax over the candidates,
  the re-ranking decoding applies). Needs no negatives, only one
  teacher-forced pass over the user's own texts.
- "hard_pairs" (c): "pairs" with negatives that likelihood cannot tell from
  the user's text as easily (sampled cluster outputs; in the build also other
  users' real texts of the same cluster), and the cluster model's mean
  log-probability as a covariate with a fixed weight γ, fitted once on the
  population: the pair logit is β(λ_u·Δφ + γ·Δlogp), so the "lower likelihood
  ⇒ human" rule that saturates (a) is already explained and λ_u must carry
  the rest.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import reduce
from itertools import accumulate
from typing import Sequence

import torch
import torch.nn.functional as F

from personalize.lm.features import SequenceFeatures
from personalize.methods.card.config import HeadSettings

VOTE_ITEM = 1 << 30  # the item index of a vote's pair (PairData.with_votes)


class PersonalizationHead(torch.nn.Module):
    """P ∈ R^{D×nH} and U ∈ R^{|V|×D}; only the k candidate rows of U are ever multiplied."""

    def __init__(self, in_dim: int, vocab_size: int, d: int):
        super().__init__()
        self.P = torch.nn.Linear(in_dim, d, bias=False)
        self.U = torch.nn.Parameter(torch.zeros(vocab_size, d))  # unseen tokens get no correction
        # Last-layer states carry a few huge activations; standardising them keeps P well scaled.
        self.register_buffer("h_mean", torch.zeros(in_dim))
        self.register_buffer("h_std", torch.ones(in_dim))
        # hard_pairs: weight of the cluster model's mean log-prob in the pair logit; fixed once fitted (0 otherwise)
        self.register_buffer("gamma", torch.zeros(()))

    def set_feature_stats(self, h: torch.Tensor) -> None:
        h = h.float()
        self.h_mean.copy_(h.mean(0) if len(h) else torch.zeros_like(self.h_mean))
        # fewer than two states (a tiny population, or no user token among the candidates) have no spread
        self.h_std.copy_(h.std(0).clamp_min(1e-3) if len(h) > 1 else torch.ones_like(self.h_std))

    def z(self, h: torch.Tensor) -> torch.Tensor:
        """z_t = P h_t (on standardised states).  [N, D]"""
        return self.P((h.float() - self.h_mean) / self.h_std)

    @property
    def d(self) -> int:
        return self.U.shape[1]

    def token_features(self, h: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
        """f[n, j] = U[cand[n, j]] ⊙ P h[n], so that Δ[n, j] = f[n, j] · λ.  [N, k, D]"""
        return self.U[cand] * self.z(h)[:, None, :]

    def correction(self, h: torch.Tensor, lam: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
        """Δ_t restricted to the candidates: [N, k]."""
        return (self.U[cand] * (self.z(h) * lam)[:, None, :]).sum(-1)

    def phi(self, f: SequenceFeatures) -> torch.Tensor:
        """φ(x, y) = (1/|y|) Σ_t U[y_t] ⊙ P h_t, so that r_u(x, y) = λ_u · φ.  [D]"""
        return (self.U[f.ids] * self.z(f.h)).mean(0)


# ---------------------------------------------------------------- per-user data

OPENING_MOD = (1 << 61) - 1  # keys of openings: a polynomial hash mod a Mersenne prime (stable across runs)


def opening_key(ids: Sequence[int]) -> int:
    """The key of an answer's opening (its first tokens), the empty one included: the form bias's context."""
    return reduce(next_opening, ids, 1)


def opening_keys(ids: Sequence[int]) -> list[int]:
    """The key of the opening before each of `ids` (the empty one first), as decoding's form bias reads them."""
    return list(accumulate(ids, next_opening, initial=opening_key(())))[:-1]


def next_opening(key: int, token: int) -> int:
    """The key of an opening one token longer (distinct sequences, distinct keys before the modulus: the base
    exceeds any vocabulary's size)."""
    return (key * 1_000_003 + int(token) + 1) % OPENING_MOD


@dataclass
class TokenData:
    """A user's texts as candidate-ranking problems: only tokens inside the top-k count."""

    h: torch.Tensor  # [N, nH]
    cand: torch.Tensor  # [N, k]
    base: torch.Tensor  # [N, k] the cluster model's logits of the candidates
    target: torch.Tensor  # [N] index of the user's token among the candidates
    # [N] or None (all 1): a row's weight in the fit; < 0: a token the person rejected (a thumbs down), whose
    # probability the fit lowers (unlikelihood, Welleck et al. 2020) instead of raising
    weight: torch.Tensor | None = None
    opening: torch.Tensor | None = None  # [N] key of the text's tokens before each row (style.opening_key)

    @classmethod
    def from_features(cls, feats: Sequence[SequenceFeatures], weight: float | None = None) -> "TokenData":
        hs, cands, bases, tgts, opening = [], [], [], [], []
        for f in feats:
            hit = f.top_ids == f.ids[:, None]  # [T, k]
            keep = hit.any(-1)
            hs.append(f.h[keep]), cands.append(f.top_ids[keep]), bases.append(f.top_logits[keep])
            tgts.append(hit[keep].float().argmax(-1))
            opening.append(torch.tensor(opening_keys(f.ids.tolist()), dtype=torch.long)[keep])
        if not hs:
            return cls.empty()
        target = torch.cat(tgts)
        return cls(torch.cat(hs), torch.cat(cands), torch.cat(bases), target,
                   None if weight is None else torch.full((len(target),), float(weight)), torch.cat(opening))

    @classmethod
    def empty(cls) -> "TokenData":
        return cls(torch.zeros(0, 0), torch.zeros(0, 0, dtype=torch.long), torch.zeros(0, 0),
                   torch.zeros(0, dtype=torch.long))

    @classmethod
    def cat(cls, parts: Sequence["TokenData"]) -> "TokenData":
        """Rows of several sources in one problem (history and votes); weights default to 1."""
        parts = [p for p in parts if len(p)]
        if not parts:
            return cls.empty()
        weighted = any(p.weight is not None for p in parts)
        w = torch.cat([p.weights() for p in parts]) if weighted else None
        opening = torch.cat([p.opening for p in parts]) if all(p.opening is not None for p in parts) else None
        return cls(*(torch.cat([getattr(p, f) for p in parts]) for f in ("h", "cand", "base", "target")), w, opening)

    def weights(self) -> torch.Tensor:
        return torch.ones(len(self.target)) if self.weight is None else self.weight

    def loss(self, logits: torch.Tensor) -> torch.Tensor:
        """The conditional-logit loss of the rows' candidate logits [N, k], weighted; rejected rows add
        −log(1 − p) of their token."""
        if self.weight is None:
            return F.cross_entropy(logits, self.target)
        logp = logits.log_softmax(-1).gather(1, self.target[:, None]).squeeze(1)
        up = -logp
        down = -torch.log1p(-logp.exp().clamp(max=1 - 1e-6))
        w = self.weight
        return torch.where(w >= 0, w * up, -w * down).sum() / w.abs().sum().clamp(min=1e-12)

    def __len__(self):
        return len(self.target)


@dataclass
class PairData:
    """Implicit pairs: the user's text (chosen) against the cluster model's (rejected).

    `items[i]` is the history item pair i was built from (several negatives may share one
    item), so held-out splits never leak an item; `covariate` adds γ·Δlogp to the logit."""

    chosen: list[SequenceFeatures]
    rejected: list[SequenceFeatures]
    items: list[int] | None = None  # None: pair i is item i
    covariate: bool = False
    weight: list[float] | None = None  # None: every pair counts 1 (votes weigh against the history: methods/card/votes.py)

    def __post_init__(self):
        if len(self.chosen) != len(self.rejected):
            raise ValueError(f"{len(self.chosen)} chosen against {len(self.rejected)} rejected")
        if self.items is None:
            self.items = list(range(len(self.chosen)))

    def __len__(self):
        return len(self.chosen)

    def dlogp(self) -> torch.Tensor:
        """Δ of the cluster model's mean log-probability, chosen minus rejected.  [N]"""
        return torch.tensor([c.mean_logprob - r.mean_logprob for c, r in zip(self.chosen, self.rejected)])

    def select(self, keep) -> "PairData":
        idx = [i for i, it in enumerate(self.items) if keep(it)]
        return PairData([self.chosen[i] for i in idx], [self.rejected[i] for i in idx],
                        [self.items[i] for i in idx], self.covariate,
                        None if self.weight is None else [self.weight[i] for i in idx])

    def with_votes(self, chosen: Sequence[SequenceFeatures], rejected: Sequence[SequenceFeatures],
                   weight: float) -> "PairData":
        """These pairs and the votes' pairs, the votes weighted; a vote's item index is past every history item,
        so held-out splits (the first items) never take a vote."""
        n = len(self.chosen)
        return PairData(self.chosen + list(chosen), self.rejected + list(rejected),
                        self.items + [VOTE_ITEM] * len(chosen),
                        self.covariate, (self.weight or [1.0] * n) + [float(weight)] * len(chosen))

    def loss(self, logits: torch.Tensor) -> torch.Tensor:
        """−log σ of the pair logits, weighted."""
        if self.weight is None:
            return -F.logsigmoid(logits).mean()
        w = torch.tensor(self.weight)
        return -(w * F.logsigmoid(logits)).sum() / w.sum()


def pair_logits(head: "PersonalizationHead", data: PairData, lam: torch.Tensor, s: HeadSettings,
                dphi: torch.Tensor | None = None) -> torch.Tensor:
    """β(λ·(φ(y+) − φ(y−)) + γ·Δlogp): the Bradley–Terry logit of every pair.  [N]"""
    if dphi is None:
        dphi = torch.stack([head.phi(c) - head.phi(r) for c, r in zip(data.chosen, data.rejected)])
    logit = dphi @ lam
    if data.covariate:
        logit = logit + head.gamma * data.dlogp()
    return s.beta * logit


def fit_covariate(head: "PersonalizationHead", pairs: Sequence[PairData], s: HeadSettings) -> float:
    """γ: the 1-D logistic fit of "chosen iff Δlogp·γ > 0" on the population's pairs, then held fixed."""
    parts = [p.dlogp() for p in pairs if p.covariate and len(p)]
    if not parts:
        return 0.0  # the paper's pairs: no covariate
    dlp = torch.cat(parts)
    g = torch.zeros((), requires_grad=True)
    opt = torch.optim.LBFGS([g], lr=1.0, max_iter=100, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = -F.logsigmoid(s.beta * g * dlp).mean() + 1e-4 * g ** 2  # the tiny ridge keeps separable data finite
        loss.backward()
        return loss

    opt.step(closure)
    head.gamma.fill_(float(g.detach()))
    return float(g.detach())


def user_loss(head: PersonalizationHead, lam: torch.Tensor, data, s: HeadSettings) -> torch.Tensor:
    """The objective's loss for one user (without the prior)."""
    if isinstance(data, TokenData):
        return data.loss(data.base + head.correction(data.h, lam, data.cand))
    return data.loss(pair_logits(head, data, lam, s))


def _states(data) -> torch.Tensor:
    if isinstance(data, TokenData):
        return data.h
    return torch.cat([f.h for f in data.chosen + data.rejected])


def train_population(
    head: PersonalizationHead, users: dict[str, TokenData | PairData], s: HeadSettings, progress=None,
    held_out: dict[str, TokenData | PairData] | None = None,
) -> tuple[dict[str, torch.Tensor], list[float]]:
    """Learn P, U and every training user's λ jointly (LM frozen, states cached).

    With `s.patience` > 0 and held-out data, training stops once the held-out loss
    (each user's own λ) has not improved for `patience` epochs, and the best epoch's
    P, U and λ are kept: U has |V|·D parameters and overfits a small population.
    """
    torch.manual_seed(s.seed)
    rng = random.Random(s.seed)
    torch.nn.init.normal_(head.P.weight, std=head.P.weight.shape[1] ** -0.5)
    names = [n for n, d in users.items() if len(d)]
    head.set_feature_stats(torch.cat([_states(users[n]) for n in names]))
    fit_covariate(head, [d for d in users.values() if isinstance(d, PairData)], s)
    lams = {n: torch.nn.Parameter(torch.ones(s.d)) for n in names}
    # λ gets a larger step: each λ_u sees only its own user's few examples per epoch
    opt = torch.optim.AdamW([{"params": list(head.parameters()), "weight_decay": s.weight_decay},
                             {"params": list(lams.values()), "lr": s.lr * s.lambda_lr_scale, "weight_decay": 0.0}],
                            lr=s.lr)
    held = {n: d for n, d in (held_out or {}).items() if n in lams and len(d)}
    curve, best, since_best = [], (float("inf"), None), 0
    for epoch in range(s.epochs):
        rng.shuffle(names)
        total = 0.0
        for i in range(0, len(names), s.batch_users):
            batch = names[i: i + s.batch_users]
            loss = sum(user_loss(head, lams[n], users[n], s) + s.rho * ((lams[n] - 1) ** 2).sum()
                       for n in batch) / len(batch)
            loss.backward()
            torch.nn.utils.clip_grad_norm_([*head.parameters(), *lams.values()], 1.0)
            opt.step(), opt.zero_grad(set_to_none=True)
            total += loss.item() * len(batch)
        curve.append(total / max(len(names), 1))
        if progress:
            progress(epoch + 1, s.epochs, curve[-1])
        if s.patience and held:
            with torch.no_grad():
                h_loss = sum(float(user_loss(head, lams[n], d, s)) for n, d in held.items()) / len(held)
            if h_loss < best[0]:
                state = {k: v.clone() for k, v in head.state_dict().items()}
                best, since_best = (h_loss, (state, {n: v.detach().clone() for n, v in lams.items()})), 0
            elif (since_best := since_best + 1) >= s.patience:
                break
    if best[1] is not None:
        head.load_state_dict(best[1][0])
        return best[1][1], curve
    return {n: v.detach().clone() for n, v in lams.items()}, curve


def fit_user(head: PersonalizationHead, data, s: HeadSettings) -> tuple[torch.Tensor, list[float]]:
    """A new user's λ with P, U frozen: a D-dim logistic / conditional-logit fit (LBFGS)."""
    lam = torch.ones(head.d, requires_grad=True)
    if not len(data):
        return lam.detach(), []
    with torch.no_grad():  # P and U are frozen: precompute what λ multiplies
        if isinstance(data, TokenData):
            f, base = head.token_features(data.h, data.cand), data.base
        else:
            dphi = torch.stack([head.phi(c) - head.phi(r) for c, r in zip(data.chosen, data.rejected)])
            offset = pair_logits(head, data, torch.zeros(head.d), s, dphi)  # γ·Δlogp, fixed
    opt = torch.optim.LBFGS([lam], lr=1.0, max_iter=s.fit_iters, line_search_fn="strong_wolfe")
    curve: list[float] = []

    def closure():
        opt.zero_grad()
        if isinstance(data, TokenData):
            loss = data.loss(base + (f * lam).sum(-1))
        else:
            loss = data.loss(s.beta * (dphi @ lam) + offset)
        loss = loss + s.rho * ((lam - 1) ** 2).sum()
        loss.backward()
        curve.append(loss.item())
        return loss

    opt.step(closure)
    return lam.detach(), curve


# ---------------------------------------------------------------- diagnostics (METHOD §1.9.1)

@torch.no_grad()
def diagnostics(head: PersonalizationHead, data, own: torch.Tensor, others: Sequence[torch.Tensor],
                s: HeadSettings) -> dict:
    """Accuracy and margin with own λ, λ = 1 and other users' λ, and the likelihood rule.

    A gain that λ = 1 also gives is the shared head's, not personalisation: the
    user-specificity gap (own margin minus other users' margin) says which.
    """
    ones = torch.ones_like(own)
    if not len(data):
        return {"n": 0}

    if isinstance(data, TokenData):
        def margin(lam):  # log-prob of the user's token among the candidates, corrected
            lp = torch.log_softmax(data.base + head.correction(data.h, lam, data.cand), -1)
            return lp.gather(1, data.target[:, None]).squeeze(1)

        def acc(lam):
            return float(((data.base + head.correction(data.h, lam, data.cand)).argmax(-1) == data.target).float().mean())

        out = {"unit": "tokens", "n": len(data),
               "acc_no_head": float((data.base.argmax(-1) == data.target).float().mean())}
    else:
        dphi = torch.stack([head.phi(c) - head.phi(r) for c, r in zip(data.chosen, data.rejected)])

        def margin(lam):  # the pair logit, γ·Δlogp included for hard_pairs
            return pair_logits(head, data, lam, s, dphi)

        def acc(lam):
            return float((margin(lam) > 0).float().mean())

        rule = [c.mean_logprob < r.mean_logprob for c, r in zip(data.chosen, data.rejected)]
        out = {"unit": "pairs", "n": len(data), "acc_logprob_rule": sum(rule) / len(rule)}
        if data.covariate:  # what the fixed likelihood term alone gets right: λ must add to it
            out["acc_covariate_only"] = float((pair_logits(head, data, torch.zeros_like(own), s, dphi) > 0).float().mean())
    out |= {"acc_own": acc(own), "acc_ones": acc(ones)}
    m_own = float(margin(own).mean())
    out["margin_own"] = m_own
    out["margin_ones"] = float(margin(ones).mean())
    if others:
        out["acc_other"] = sum(acc(o) for o in others) / len(others)
        m_other = sum(float(margin(o).mean()) for o in others) / len(others)
        out["margin_other"] = m_other
        out["specificity_gap"] = m_own - m_other
    return out
