"""Candidate (d) of the form study, PROPER's group-to-user step at CARD's cost: a LoRA of the person's own on the
last block's MLP, over their cluster's model. The last MLP is position-wise, so its inputs (the residual after the
last attention, at the answer tokens) are captured once by a teacher-forced pass and the LoRA trains on them alone:
no prompt token and no other block is run again, a step is the MLP and the LM head over the person's answer tokens.
Scored on people of sources kept for tuning: the cluster model with the person's MLP LoRA against without it and
with another person's; ROUGE-L, the copied share, paired intervals, seconds a person.

    python -m benchmarks.own_mlp --artifacts B --data G --sources pytest-dev/pytest,encode/django-rest-framework \
        --limit 40 --cache fits.pt --ranks 4 --steps 1,10 --lrs 0.003
"""

from __future__ import annotations

import json
import math
import time
from contextlib import contextmanager
from statistics import median

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.form_study import copied_share
from benchmarks.form_tune import onboarded, own_styles, tuning_parser, tuning_people
from personalize.eval.evaluate import decode_people, shuffled_partners
from personalize.lm.features import decoder_layers
from personalize.methods.card.adapters import BASE_ADAPTER, adapter_name, sft_batch
from personalize.metrics import paired_interval, rouge_per_query

KINDS = ("gate_proj", "up_proj", "down_proj")


def mlp_inputs(engine, items) -> tuple[torch.Tensor, torch.Tensor]:
    """(the residual after the last block's attention at each position that predicts an answer token [N, H], that
    token [N]) under the active model: one teacher-forced pass."""
    model = engine.model
    block = decoder_layers(model)[-1]
    seen = {}
    handle = block.post_attention_layernorm.register_forward_pre_hook(lambda m, a: seen.__setitem__("r", a[0]))
    try:
        ids, mask, labels = sft_batch(engine.tok, [(it.x, it.y) for it in items], engine.cfg.budget, model.device)
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask, logits_to_keep=1)
    finally:
        handle.remove()
    at = labels[:, 1:] != -100
    return seen["r"][:, :-1][at].float(), labels[:, 1:][at]


def modules(engine):
    block = decoder_layers(engine.model)[-1]
    return block, {k: getattr(block.mlp, k) for k in KINDS}


def new_lora(engine, rank: int, seed: int) -> dict:
    _, mods = modules(engine)
    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, m in mods.items():
        A = torch.empty(m.in_features, rank)
        bound = 1 / math.sqrt(m.in_features)
        A.uniform_(-bound, bound, generator=g)
        out[k] = (A.requires_grad_(), torch.zeros(rank, m.out_features, requires_grad=True))
    return out


@contextmanager
def applied(engine, lora: dict | None, scale: float):
    """While the block runs, the last MLP adds x A B · scale (every row: decode one person's batch at a time)."""
    if lora is None:
        yield
        return
    _, mods = modules(engine)
    handles = [mods[k].register_forward_hook(lambda m, a, o, A=A, B=B: o + (a[0].float() @ A @ B * scale).to(o.dtype))
               for k, (A, B) in lora.items()]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def train(engine, r: torch.Tensor, y: torch.Tensor, rank: int, steps: int, lr: float, scale: float,
          decay: float) -> tuple[dict, list[float]]:
    block, _ = modules(engine)
    base = engine.model.get_base_model() if hasattr(engine.model, "get_base_model") else engine.model
    norm, head = base.model.norm, base.lm_head
    lora = new_lora(engine, rank, 0)
    opt = torch.optim.Adam([p for ab in lora.values() for p in ab], lr=lr)
    curve = []
    with applied(engine, lora, scale):
        for _ in range(steps):
            h = r + block.mlp(block.post_attention_layernorm(r))
            loss = F.cross_entropy(head(norm(h)).float(), y)
            reg = decay * sum((A @ B).pow(2).sum() for A, B in lora.values())
            opt.zero_grad()
            (loss + reg).backward()
            opt.step()
            curve.append(loss.item())
    return {k: (A.detach(), B.detach()) for k, (A, B) in lora.items()}, curve


def main(argv=None) -> None:
    p = tuning_parser(__doc__)
    p.add_argument("--ranks", default="4")
    p.add_argument("--steps", default="10,30")
    p.add_argument("--lrs", default="0.003")
    p.add_argument("--decay", type=float, default=0.0)
    p.add_argument("--alpha", type=float, default=1.0, help="scale of the LoRA term")
    a = p.parse_args(argv)
    torch.manual_seed(0)
    engine, queries, profiles = tuning_people(a)
    for prm in engine.model.parameters():
        prm.requires_grad_(False)
    fits = onboarded(engine, profiles, a.cache)
    styles = own_styles(engine, fits)
    prompts, golds = [q.input for q in queries], [q.gold for q in queries]
    partner = shuffled_partners([f.cluster for f in fits])

    def one(method, i, lora):
        with applied(engine, lora, a.alpha):
            return decode_people(engine, method, [prompts[i]], [fits[i]], [styles[i]], [profiles[i]])[0]

    def copied(texts):
        return copied_share(texts, queries)

    base_out = {"cluster": decode_people(engine, "cluster", prompts, fits, styles, profiles),
                "card": decode_people(engine, "card", prompts, fits, styles, profiles)}
    caps, cap_s = [], []
    for f, items in zip(fits, profiles):
        engine.use_adapter(adapter_name(f.k, f.cluster) if f.k > 1 else BASE_ADAPTER)
        t0 = time.perf_counter()
        caps.append(mlp_inputs(engine, items))
        cap_s.append(time.perf_counter() - t0)
    print(f"{len(fits)} people; capture pass {median(cap_s):.2f} s (median), answer tokens "
          f"{median(len(y) for _, y in caps)} (median)", flush=True)
    rl = {m: np.asarray(rouge_per_query(v, golds)) for m, v in base_out.items()}
    results = {"cluster": {"rougeL": float(rl["cluster"].mean()), "copied": copied(base_out["cluster"])},
               "card": {"rougeL": float(rl["card"].mean()), "copied": copied(base_out["card"])}}
    print(f"cluster {rl['cluster'].mean():.4f}  card {rl['card'].mean():.4f}", flush=True)
    for rank in [int(x) for x in a.ranks.split(",")]:
        for lr in [float(x) for x in a.lrs.split(",")]:
            for steps in [int(x) for x in a.steps.split(",")]:
                loras, fit_s, drop = [], [], []
                for f, (r, y) in zip(fits, caps):
                    engine.use_adapter(adapter_name(f.k, f.cluster) if f.k > 1 else BASE_ADAPTER)
                    t0 = time.perf_counter()
                    lora, curve = train(engine, r, y, rank, steps, lr, a.alpha, a.decay)
                    fit_s.append(time.perf_counter() - t0)
                    loras.append(lora)
                    drop.append(curve[0] - curve[-1])
                name = f"r{rank} lr{lr:g} steps{steps}"
                for method in ("cluster",):
                    texts, other = [], []
                    for i in range(len(fits)):
                        engine.use_adapter(adapter_name(fits[i].k, fits[i].cluster) if fits[i].k > 1 else BASE_ADAPTER)
                        texts.append(one(method, i, loras[i]))
                        other.append(one(method, i, loras[partner[i]]))
                    own, oth = np.asarray(rouge_per_query(texts, golds)), np.asarray(rouge_per_query(other, golds))
                    d_c, d_s = paired_interval(own - rl["cluster"]), paired_interval(own - oth)
                    results[f"{method}+mlp {name}"] = {"rougeL": float(own.mean()), "shuffled": float(oth.mean()),
                                                      "copied": copied(texts), "fit_s": median(fit_s),
                                                      "loss_drop": median(drop), "minus_cluster": d_c,
                                                      "minus_shuffled": d_s, "outputs": texts}
                    print(f"{method}+mlp {name:22s} ROUGE-L {own.mean():.4f} (another's LoRA {oth.mean():.4f})  "
                          f"−cluster {d_c['mean']:+.4f} [{d_c['ci95'][0]:+.3f}, {d_c['ci95'][1]:+.3f}]  "
                          f"−shuffled {d_s['mean']:+.4f} [{d_s['ci95'][0]:+.3f}, {d_s['ci95'][1]:+.3f}]  "
                          f"copied {copied(texts):.0%}  fit {median(fit_s):.2f} s  loss drop {median(drop):.3f}",
                          flush=True)
    if a.json:
        json.dump({"people": len(fits), "capture_s": cap_s, "results": results}, open(a.json, "w"))


if __name__ == "__main__":
    main()
