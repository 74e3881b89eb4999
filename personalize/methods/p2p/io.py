"""Saving and loading a trained hypernetwork (safetensors weights + a JSON config)."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import load_file, save_file

from personalize.methods.p2p.p2p_config import CONFIG, FORMAT, WEIGHTS, P2PConfig
from personalize.methods.p2p.hypernet import HyperLoRA

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
