"""A person's style beyond the user vector: λ plus what the population lacks (METHOD §1.10).

λ_u (D floats) only scales directions the shared head learnt on the build's
population, so a person outside it gets nothing from it (held-out commit authors:
own λ, λ = 1 and another user's λ decoded alike). Two per-person parts come from
the person's own text, from the same one teacher-forced pass onboarding already
makes, and cost milliseconds to fit:

- a sparse token bias b_u, fitted jointly with λ in the tokens head's convex
  objective: softmax over the candidates of ℓ + U((P h) ⊙ λ) + b[cand]. Its support
  is the tokens the person wrote and the tokens the cluster model would have
  written instead, so it can both raise "minor" and lower "MAINT".
- the person's form: a bias on their first tokens (a text's opening carries a convention,
  "BUG: …" or "Fix …", that the cluster model and the head's population correction impose on
  people who never write it, and that a bias over every position, fitted mostly on the rest
  of the text, barely moves; λ is pulled to 0 for the same reason, StyleSettings.lambda_prior). After an
  opening o of t tokens (t < form_positions), b_o(v) = log(1 + n_o(v) / (κ·p̄_o(v))): n_o(v)
  the person's texts that open with o and then v, p̄_o the cluster model's mean distribution
  at that place over those texts, κ the prior's weight in pseudo-texts. What the person opens
  with rises against everything the cluster model would open with instead, and after an
  opening they never wrote nothing changes (`fit_form`: a trie of their openings).
- a kNN memory (Khandelwal et al. 2020, kNN-LM, per person) of (key_t, next token)
  over every token of the history, key_t = P h_t (the head's projection; or the last
  layer's state, StyleSettings.key); at each step the neighbours' tokens form p_kNN,
  mixed into the corrected candidates: p = (1 − α·w)·softmax(ℓ̃_T) + α·w·p_kNN.

`style_scores` is the one scoring rule: decoding (decoding.CardLogitsProcessor)
and the held-out diagnostics both call it, so what is measured is what decodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.numpy import load as np_load, save as np_save

from personalize.catalog import STEERED  # card and its variants: their StyleSettings changes
from personalize.lm.features import SequenceFeatures
from personalize.methods.card.config import StyleSettings
from personalize.methods.card.head import PersonalizationHead, TokenData, opening_key


def variant(name: str, default: StyleSettings) -> StyleSettings:
    """The settings of a CARD variant: `card` is the build's default, the others switch parts on and off."""
    if name not in STEERED:
        raise ValueError(f"unknown CARD variant {name!r}; choose from {list(STEERED)}")
    return replace(default, **STEERED[name])


@dataclass
class UserStyle:
    """One person: λ (the paper's user vector), a sparse token bias, a kNN memory, the form bias on their openings,
    and whether it helps."""

    lam: np.ndarray  # [D] float32
    bias_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # [m]
    bias: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))  # [m]
    keys: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float16))  # [N, H] unit-norm states
    values: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # [N] the token that followed
    helps: bool | None = None  # None: too few items to tell
    form_keys: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # [f] opening_key(o)
    form_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # [f] token
    form_bias: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))  # [f] b_o(v) > 0
    knn_weight: float | None = None  # the memory's weight for this person (far from every cluster); None: the build's
    own: str | None = None  # fitted over its person's own adapter (own.py's key for it); None: over their cluster's

    @classmethod
    def of(cls, lam) -> "UserStyle":
        """λ alone (the paper's CARD, cold start, a vector stored before styles existed)."""
        if isinstance(lam, UserStyle):
            return lam
        return cls(np.asarray(lam, dtype=np.float32))

    def extras_bytes(self) -> bytes:
        """Bias, memory and form, for the store (λ is stored as the vector itself)."""
        return np_save({"bias_ids": self.bias_ids.astype(np.int32), "bias": self.bias.astype(np.float16),
                        "keys": self.keys.astype(np.float16), "values": self.values.astype(np.int32),
                        "form_keys": self.form_keys.astype(np.int64), "form_ids": self.form_ids.astype(np.int32),
                        "form_bias": self.form_bias.astype(np.float16),
                        "knn_weight": np.asarray([np.nan if self.knn_weight is None else self.knn_weight], np.float32),
                        "own": np.frombuffer((self.own or "").encode(), np.uint8)})

    @classmethod
    def from_stored(cls, stored) -> "UserStyle | None":
        """The style of a store.StoredStyle (None: not fitted)."""
        return None if stored is None else cls.from_bytes(stored.lam, stored.extras, stored.helps)

    @classmethod
    def from_bytes(cls, lam: np.ndarray, extras: bytes | None, helps: bool | None = None) -> "UserStyle":
        """The style from the store's λ and extras; `helps` comes from the fit's stored diagnostics."""
        if not extras:
            return cls(np.asarray(lam, np.float32), helps=helps)
        t = np_load(extras)
        style = cls(np.asarray(lam, np.float32), t["bias_ids"].astype(np.int64), t["bias"].astype(np.float32),
                    t["keys"], t["values"].astype(np.int64), helps)
        if "form_ids" in t:  # styles stored before the form bias have none
            style.form_keys, style.form_ids = t["form_keys"].astype(np.int64), t["form_ids"].astype(np.int64)
            style.form_bias = t["form_bias"].astype(np.float32)
        if "knn_weight" in t and not np.isnan(t["knn_weight"][0]):
            style.knn_weight = float(t["knn_weight"][0])
        if "own" in t and len(t["own"]):
            style.own = bytes(t["own"]).decode()
        return style

    def memory_weight(self, s: StyleSettings) -> float | None:
        """w for this person under settings s: the larger of their own (far from every cluster, unless s leaves
        that out) and the build's when its style has a memory; None: no memory."""
        build = s.knn_weight if s.memory else None
        if self.knn_weight is not None and s.far_knn_weight > 0:
            return max(self.knn_weight, build or 0.0)
        return build


# ---------------------------------------------------------------- fitting the per-person parts

def memory_keys(h: torch.Tensor, hidden: int, key: str, head: PersonalizationHead | None = None) -> torch.Tensor:
    """Unit-norm keys of states h [N, nH]: the last layer's part, or the head's projection P h."""
    k = head.z(h) if key == "head" else h[:, -hidden:].float()
    return F.normalize(k.float(), dim=-1)


def memory_from_features(feats: Sequence[SequenceFeatures], hidden: int, max_entries: int, key: str = "state",
                         head: PersonalizationHead | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(keys, values): the key of the state before every token the person wrote, and that token."""
    if not feats:
        return np.zeros((0, hidden), np.float16), np.zeros(0, np.int64)
    h = torch.cat([f.h for f in feats])[:max_entries]
    ids = torch.cat([f.ids for f in feats])[:max_entries]
    with torch.no_grad():
        return memory_keys(h, hidden, key, head).half().numpy(), ids.numpy().astype(np.int64)


def fit_lambda_bias(head: PersonalizationHead, data: TokenData, rho: float, rho_bias: float, max_bias_tokens: int,
              iters: int = 50, center: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[float]]:
    """λ and the token bias jointly (P, U frozen): the tokens head's convex conditional-logit objective,
    ℓ + f·λ + b[cand], with λ pulled to `center` (1: the population's correction) and b to 0. Returns λ, bias ids,
    bias values, the loss curve."""
    lam = torch.full((head.d,), float(center), requires_grad=True)
    if not len(data):
        return lam.detach(), torch.zeros(0, dtype=torch.long), torch.zeros(0), []
    # the tokens a bias may touch: those the person wrote and those the cluster model preferred
    support = torch.unique(torch.cat([data.cand.gather(1, data.target[:, None]).squeeze(1), data.cand[:, 0]]))
    with torch.no_grad():
        f = head.token_features(data.h, data.cand)
        pos = torch.searchsorted(support, data.cand).clamp(max=len(support) - 1)
        inside = support[pos] == data.cand  # candidates with a bias entry
    b = torch.zeros(len(support), requires_grad=True)
    opt = torch.optim.LBFGS([lam, b], lr=1.0, max_iter=iters, line_search_fn="strong_wolfe")
    curve: list[float] = []

    def closure():
        opt.zero_grad()
        logits = data.base + (f * lam).sum(-1) + torch.where(inside, b[pos], 0.0)
        loss = data.loss(logits) + rho * ((lam - center) ** 2).sum() + rho_bias * (b ** 2).sum()
        loss.backward()
        curve.append(loss.item())
        return loss

    opt.step(closure)
    b = b.detach()
    keep = b.abs().argsort(descending=True)[:max_bias_tokens]
    keep = keep[b[keep] != 0]
    return lam.detach(), support[keep], b[keep], curve


def fit_form(feats: Sequence[SequenceFeatures], positions: int, prior: float, cap: float,
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(opening key, token, bias) of the person's form: b_o(v) = log(1 + n_o(v) / (κ·p̄_o(v))), capped, for every
    token v the person wrote after an opening o of fewer than `positions` tokens (the module's docstring says why)."""
    keys, ids, vals = [], [], []
    for t in range(positions):
        groups: dict[int, list[SequenceFeatures]] = {}
        for f in feats:
            if len(f.ids) > t and f.top_ids is not None and len(f.top_ids) > t:
                groups.setdefault(opening_key(f.ids[:t].tolist()), []).append(f)
        for key, rows in groups.items():
            cand = torch.cat([f.top_ids[t] for f in rows])
            probs = torch.cat([torch.softmax(f.top_logits[t].float(), -1) for f in rows]) / len(rows)
            wrote, counts = torch.unique(torch.stack([f.ids[t] for f in rows]), return_counts=True)
            uniq, inv = torch.unique(cand, return_inverse=True)
            p_bar = torch.zeros(len(uniq)).index_add_(0, inv, probs)
            at = torch.searchsorted(uniq, wrote).clamp(max=len(uniq) - 1)
            p_w = torch.where(uniq[at] == wrote, p_bar[at], 0.0).clamp_min(1e-6)  # outside every top-k: the floor
            keys += [key] * len(wrote)
            ids.append(wrote), vals.append(torch.log1p(counts.float() / (prior * p_w)).clamp(max=cap))
    if not ids:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32)
    return (np.asarray(keys, np.int64), torch.cat(ids).numpy().astype(np.int64),
            torch.cat(vals).numpy().astype(np.float32))


# ---------------------------------------------------------------- the scoring rule (decoding and diagnostics)

@dataclass
class StyleTensors:
    """A batch of styles as tensors, one row per sequence being decoded."""

    lam: torch.Tensor  # [B, D]
    bias: list[tuple[torch.Tensor, torch.Tensor]]  # per row: (ids sorted ascending, values)
    memory: list[tuple[torch.Tensor, torch.Tensor]]  # per row: (keys [N, H] float, values [N])
    knn_weights: list[float | None] = field(default_factory=list)  # per row: w (UserStyle.memory_weight)
    form: list[dict[int, tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=list)  # per row: key → bias

    @classmethod
    def of(cls, styles: Sequence[UserStyle], s: StyleSettings) -> "StyleTensors":
        lam = torch.stack([torch.as_tensor(st.lam, dtype=torch.float32) for st in styles])
        bias = [_sorted(st.bias_ids, st.bias) if s.bias else (torch.zeros(0, dtype=torch.long), torch.zeros(0))
                for st in styles]
        weights = [st.memory_weight(s) for st in styles]
        memory = [(torch.as_tensor(st.keys).float(), torch.as_tensor(st.values)) if w and len(st.values)
                  else None for st, w in zip(styles, weights)]
        form = [_form_by_opening(st) if s.form else {} for st in styles]
        return cls(lam, bias, memory, weights, form)


def _form_by_opening(st: UserStyle) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """The form bias per opening key, each as (ids ascending, values)."""
    masks = ((int(key), st.form_keys == key) for key in np.unique(st.form_keys))
    return {key: _sorted(st.form_ids[at], st.form_bias[at]) for key, at in masks}


def _sorted(ids, vals) -> tuple[torch.Tensor, torch.Tensor]:
    """A bias as (ids ascending, values), sorted once per decode rather than at every step."""
    ids, vals = torch.as_tensor(ids, dtype=torch.long), torch.as_tensor(vals, dtype=torch.float32)
    order = ids.argsort()
    return ids[order], vals[order]


def bias_at(bias: tuple[torch.Tensor, torch.Tensor], cand: torch.Tensor) -> torch.Tensor:
    """b[cand] for one row's candidates ([k] → [k]), the row's bias ids sorted; 0 where it has no entry."""
    ids, vals = bias
    if not len(ids):
        return torch.zeros(cand.shape, dtype=torch.float32)
    pos = torch.searchsorted(ids, cand).clamp(max=len(ids) - 1)
    return torch.where(ids[pos] == cand, vals[pos], 0.0)


def style_scores(head: PersonalizationHead, st: StyleTensors, s: StyleSettings, h: torch.Tensor, cand: torch.Tensor,
                 base: torch.Tensor, alpha: float, standardize: bool = False,
                 openings: Sequence[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The candidates' corrected scores: (ids [B, k + n], scores [B, k + n]), −inf where unused.

    ℓ̃_T = ℓ_T + α·(Δ_T + b[T] + b_t[T]) (the tokens head's trained rule at α = 1; with `standardize`, Δ is
    centred and scaled to the logits' spread first, for heads whose Δ has no logit scale; b_o, the form bias
    after each row's opening, `openings` [B] of opening_key); then, with a memory,
    log((1 − w')·softmax(ℓ̃_T) + w'·p_kNN) over the candidates and the neighbours' tokens, w' = min(1, α·w), w
    the row's own (UserStyle.memory_weight): α scales everything of the person's, so α = 0 is the cluster model
    exactly."""
    h, base = h.float(), base.float()
    if alpha == 0:
        return cand, base
    delta = head.correction(h, st.lam, cand)
    if standardize:
        spread = base.std(-1, keepdim=True).nan_to_num(0.0)
        delta = (delta - delta.mean(-1, keepdim=True)) / (delta.std(-1, keepdim=True) + 1e-6) * spread
    delta = delta + torch.stack([bias_at(b, c) for b, c in zip(st.bias, cand)])
    if openings is not None and any(st.form):
        zero = (torch.zeros(0, dtype=torch.long), torch.zeros(0))
        delta = delta + torch.stack([bias_at(f.get(int(o), zero), c) for f, o, c in zip(st.form, openings, cand)])
    scores = base + alpha * delta
    if not any(m is not None for m in st.memory):
        return cand, scores
    n = s.knn_neighbours
    ids = torch.cat([cand, torch.full((len(cand), n), -1, dtype=cand.dtype)], 1)  # -1: an unused slot
    out = torch.cat([scores, torch.full((len(cand), n), float("-inf"))], 1)
    for r, mem in enumerate(st.memory):
        if mem is None:
            continue
        keys, vals = mem
        q = memory_keys(h[r: r + 1], keys.shape[-1], s.key, head)[0]
        if q.shape[-1] != keys.shape[-1]:  # a memory keyed the other way (settings changed since the fit)
            continue
        sims = keys @ q
        top = sims.topk(min(n, len(sims)))
        w = torch.softmax(top.values / s.knn_temperature, -1)
        weight = min(1.0, alpha * st.knn_weights[r])
        p = (1 - weight) * torch.softmax(scores[r], -1)
        nb = vals[top.indices]
        hit = nb[:, None] == cand[r][None, :]  # [n, k]: neighbour tokens already among the candidates
        p = p + weight * (w[:, None] * hit).sum(0)
        extra = ~hit.any(1)
        # neighbours' tokens outside the candidates get their own slots (merged when repeated)
        uniq, inv = torch.unique(nb[extra], return_inverse=True)
        pk = torch.zeros(len(uniq)).index_add_(0, inv, w[extra]) * weight
        out[r, : cand.shape[1]] = p.clamp_min(1e-30).log()
        ids[r, cand.shape[1]: cand.shape[1] + len(uniq)] = uniq
        out[r, cand.shape[1]: cand.shape[1] + len(uniq)] = pk.clamp_min(1e-30).log()
    return ids, out


@torch.no_grad()
def style_diagnostics(head: PersonalizationHead, held: TokenData, own: UserStyle, others: Sequence[UserStyle],
                      s: StyleSettings, alpha: float = 1.0) -> dict:
    """Held-out next-token accuracy and log-prob with the person's own style, with others' styles and with no
    head, under `style_scores` (the rule decoding applies). `helps`: own style beats the cluster model."""
    if not len(held):
        return {"n": 0}

    def score(style: UserStyle | None):
        if style is None:
            logp = torch.log_softmax(held.base, -1)
            return float((held.base.argmax(-1) == held.target).float().mean()), float(
                logp.gather(1, held.target[:, None]).mean())
        accs, lps = [], []
        for i in range(0, len(held), 256):
            sl = slice(i, i + 256)
            st = StyleTensors.of([style] * len(held.target[sl]), s)
            ids, sc = style_scores(head, st, s, held.h[sl], held.cand[sl], held.base[sl], alpha,
                                   openings=None if held.opening is None else held.opening[sl])
            logp = torch.log_softmax(sc, -1)
            tgt = held.cand[sl].gather(1, held.target[sl, None])
            is_t = ids == tgt
            accs.append((ids.gather(1, sc.argmax(-1, keepdim=True)) == tgt).float().squeeze(1))
            lps.append(torch.where(is_t, logp, torch.zeros_like(logp)).sum(-1))  # candidates hold the target once
        return float(torch.cat(accs).mean()), float(torch.cat(lps).mean())

    acc_none, m_none = score(None)
    acc_own, m_own = score(own)
    acc_ones, m_ones = score(UserStyle.of(np.ones_like(own.lam)))  # the shared head alone
    out = {"unit": "tokens", "n": len(held), "acc_no_head": acc_none, "margin_no_head": m_none,
           "acc_own": acc_own, "margin_own": m_own, "acc_ones": acc_ones, "margin_ones": m_ones}
    if others:
        pairs = [score(o) for o in others]
        out["acc_other"] = float(np.mean([a for a, _ in pairs]))
        out["margin_other"] = float(np.mean([m for _, m in pairs]))
        out["specificity_gap"] = m_own - out["margin_other"]
    out["helps"] = bool(acc_own > acc_none or (acc_own == acc_none and m_own > m_none))
    return out
