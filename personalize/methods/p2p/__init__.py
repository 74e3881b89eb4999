"""Profile-to-PEFT (METHOD §4): a hypernetwork maps a user's profile to a LoRA in one forward pass.

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

What is where (the layout of peft's tuners): p2p_config.py (P2PConfig, file names), hypernet.py (HyperLoRA),
hooks.py (applying a generated LoRA to a model, to all rows or to chosen rows), train.py (losses, train_p2p),
io.py (save, load), p2p_method.py (P2PMethod), p2p_steer.py (its rows' steer in a mixed batch).
"""

from personalize.methods.p2p.p2p_config import ARTIFACTS_DIR, CONFIG, FORMAT, WEIGHTS, LoRA, P2PConfig
from personalize.methods.p2p.hooks import applied, applied_rows, lora_targets, model_shapes
from personalize.methods.p2p.hypernet import HyperLoRA, lora_nbytes
from personalize.methods.p2p.io import load, save
from personalize.methods.p2p.p2p_method import P2PMethod
from personalize.methods.p2p.train import profile_loss, rows_loss, train_p2p

__all__ = ["ARTIFACTS_DIR", "CONFIG", "FORMAT", "WEIGHTS", "LoRA", "P2PConfig", "HyperLoRA", "lora_nbytes",
           "applied", "applied_rows", "lora_targets", "model_shapes", "load", "save", "P2PMethod", "profile_loss",
           "rows_loss", "train_p2p"]
