"""What a Ray worker process keeps between its tasks, loaded by the first task that needs it: a build (the Engine of
an artifacts folder, with the driver's settings), or the LM a build trains its cluster adapters on. A task names what
it needs (a folder, the settings); the first one on a worker pays the load, the others reuse it."""

from __future__ import annotations

from personalize.methods.card.config import CardConfig
from personalize.methods.engine import Engine

_ENGINES: dict[str, Engine] = {}
_TRAINING: dict[str, tuple] = {}


def engine(folder: str, cfg: CardConfig) -> Engine:
    """The build in `folder`, decoding with the driver's settings `cfg` (its objective, α, style)."""
    if folder not in _ENGINES:
        _ENGINES[folder] = Engine.load(folder, cfg.model)
    got = _ENGINES[folder]
    got.cfg = cfg
    return got


def training_model(cfg: CardConfig) -> tuple:
    """(peft model, tokenizer): the build's LM with a K = 1 adapter slot, for training cluster adapters on."""
    from personalize.methods.card.adapters import new_peft_model
    from personalize.lm.models import load_lm

    key = repr((cfg.model, cfg.lora))
    if key not in _TRAINING:
        lm = load_lm(cfg.model)
        _TRAINING[key] = (new_peft_model(lm.model, cfg.lora), lm.tokenizer)
    return _TRAINING[key]
