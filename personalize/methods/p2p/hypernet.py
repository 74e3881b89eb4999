"""f_θ: a profile embedding → a LoRA (A, B per module type and layer) in one forward pass."""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np
import torch
import torch.nn as nn

from personalize.methods.p2p.p2p_config import LoRA, P2PConfig

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
