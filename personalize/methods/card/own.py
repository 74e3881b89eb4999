"""A cluster of one (docs/METHOD.md §1.11): a person no cluster fits gets a LoRA of their own, and CARD on top.

CARD's premise is that a cluster's adapter is a good base for its members. For a person further from every centroid
than the build's own people are from theirs, none is: their style is there teacher-forced, but the cluster model's
greedy text carries it only by copying (docs/RESULTS.md). So they become a cluster of one: a copy of their nearest
cluster's adapter, its upper `OwnSettings.layers` blocks trained on their items as SFT pairs (as the cluster adapters
and OPPU are), and their style (λ, bias, memory, form) fitted and decoded over it as over a cluster's.

Why it costs a fraction of OPPU: the lower blocks are frozen, so their states are computed once per item
(`lower_states`) and every step runs only the upper blocks on them (forward and backward); it starts from a cluster
already near the task, so it needs fewer steps. Only the trained blocks are stored (≤ 1 MB a person at the defaults),
as one safetensors file `<adapter_id>.own.safetensors` beside the person's OPPU adapter (so Forget me finds both),
written whole or not at all (a temporary file renamed into place); the rest is the source cluster's, named in the
file's metadata with the history's fingerprint it was trained on.
"""

from __future__ import annotations

import os
import re
import time
from collections import OrderedDict
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

from peft import get_peft_model_state_dict
from safetensors import safe_open
from safetensors.torch import save_file

from personalize.data import Item
from personalize.methods.base import fingerprint
from personalize.methods.card.adapters import BASE_ADAPTER, add_warm_adapter, answer_loss, blocks, lower_states, \
    pad_states, put_adapter, train_adapter, upper_only
from personalize.methods.oppu import adapter_id

SUFFIX = ".own.safetensors"
_LAYER = re.compile(r"\.layers\.(\d+)\.")


def owner_key(name: str) -> str:
    """The person's key: their adapter's file stem and, with "_own", its peft name (OPPU's id, so Forget me's
    sweep of `<id>*` takes both)."""
    return adapter_id(name)


def history_key(items: Sequence[Item]) -> str:
    """What the adapter was trained on: the texts only (the prompts are the build's rewrites of them), in any order
    (training draws them shuffled; the store's order and a fit's held-out order must name one history)."""
    return fingerprint(sorted(it.y for it in items))


def layer_of(param_name: str) -> int | None:
    m = _LAYER.search(param_name)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class Trained:
    """One own adapter's training: where it is, what it cost, what it was trained from."""

    key: str
    source: str
    steps: int
    tokens: int
    train_s: float
    bytes: int
    loss: list[float]


class OwnAdapters:
    """The people's own adapters on one engine: trained, saved, loaded on demand (at most `max_in_memory` in the
    peft model, the least recently used deleted first: a batch's rows must all find theirs, so it is kept wide,
    3.7 MB each for SmolLM2's whole adapter), forgotten."""

    def __init__(self, engine, folder: str | Path, max_in_memory: int = 32):
        self.engine, self.folder, self.max_in_memory = engine, Path(folder), max_in_memory
        self._loaded: OrderedDict[str, None] = OrderedDict()
        self.lock = nullcontext()  # the studio's model lock (its background side): taken per step

    @property
    def settings(self):
        return self.engine.cfg.own

    @contextmanager
    def scratch(self, max_in_memory: int = 10_000):
        """People's adapters that are nobody's to keep (eval's, tune's): a temporary folder, every one in memory
        (a batch's rows must all find theirs); the folder and the limit as they were afterwards."""
        import tempfile

        kept = self.folder, self.max_in_memory
        with tempfile.TemporaryDirectory() as tmp:
            self.folder, self.max_in_memory = Path(tmp), max(max_in_memory, kept[1])
            try:
                yield self
            finally:
                for ada in list(self._loaded):
                    self._unload(ada)
                self.folder, self.max_in_memory = kept

    def path(self, key: str) -> Path:
        return self.folder / f"{key}{SUFFIX}"

    def meta(self, key: str) -> dict | None:
        """The saved adapter's metadata, or None when there is none (or not a whole one)."""
        try:
            with safe_open(str(self.path(key)), framework="pt") as f:
                meta = dict(f.metadata() or {})
                list(f.keys())
        except Exception:  # a missing, cut or foreign file (safetensors raises its own error types)
            return None
        return meta if meta.get("source") else None

    def is_current(self, name: str, items: Sequence[Item]) -> bool:
        """True when the person's saved adapter was trained on this history, from an adapter this build has."""
        meta = self.meta(owner_key(name))
        return (meta is not None and meta.get("history") == history_key(items)
                and meta.get("artifacts") == str(self.engine.artifacts_id))

    # ------------------------------------------------------------ training
    def train(self, name: str, items: Sequence[Item], source: str,
              progress: Callable[[int, int], None] | None = None) -> Trained:
        """The person's adapter: `source` (their nearest cluster's) copied, its upper blocks trained on their
        items (prompts filled), saved. The model lock is taken per step, so decodes run between the steps."""
        eng, st = self.engine, self.settings
        if len(items) < 2:
            raise ValueError(f"{name!r} has {len(items)} item(s): an adapter of one's own needs 2 or more")
        key = owner_key(name)
        ada = self.peft_name(key)
        lora = replace(eng.cfg.lora, lr=st.lr, batch_size=st.batch_size)
        n_layers = len(blocks(eng.model))
        first = max(0, n_layers - st.layers)
        examples = [(it.x, it.y) for it in items]
        with self.lock:
            eng.use_adapter(source)
            self._unload(ada)
            self._make_room()
            add_warm_adapter(eng.model, ada, lora, source=source)
            self._loaded[ada] = None
            eng.use_adapter(ada)
            states = lower_states(eng.model, eng.tok, examples, eng.cfg.budget, first)

        @contextmanager
        def step():
            with self.lock:
                eng.use_adapter(ada)
                with upper_only(eng.model, first):
                    yield

        def batch_loss(batch):
            h, mask, labels = pad_states([states[i] for i in batch], eng.model.device)
            return (lambda: answer_loss(eng.model, None, mask, labels, inputs_embeds=h)), int(mask.sum())

        t0 = time.perf_counter()
        report = train_adapter(eng.model, eng.tok, ada, list(range(len(examples))), st.steps, lora, eng.cfg.budget,
                               progress=None if progress is None else lambda i, n, _l: progress(i, n),
                               step_context=step, layers_from=first, batch_loss=batch_loss)
        seconds = time.perf_counter() - t0
        with self.lock:
            upper = {k: v.detach().to("cpu", copy=True).contiguous()
                     for k, v in get_peft_model_state_dict(eng.model, adapter_name=ada).items()
                     if (layer_of(k) or -1) >= first}
        meta = {"source": source, "history": history_key(items), "artifacts": str(eng.artifacts_id),
                "layers_from": str(first), "steps": str(st.steps), "tokens": str(report["tokens"]),
                "train_s": f"{seconds:.2f}"}
        self._save(key, upper, meta)
        return Trained(key, source, st.steps, report["tokens"], round(seconds, 2), self.path(key).stat().st_size,
                       [round(x, 4) for x in report["loss"]])

    def _save(self, key: str, tensors: dict, meta: dict) -> None:
        """Written whole into a temporary file, then renamed over the old one: a kill leaves one or the other."""
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.folder / f".{key}.{os.getpid()}.tmp"
        save_file(tensors, str(tmp), metadata=meta)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, self.path(key))

    # ------------------------------------------------------------ in memory
    @staticmethod
    def peft_name(key: str) -> str:
        return f"{key}_own"

    def activate(self, key: str) -> str | None:
        """The peft name of the adapter saved under `key`, loaded into the peft model if it is not (call under the
        model lock); None when there is no whole saved adapter (or its source is not in this build)."""
        ada = self.peft_name(key)
        if ada in self.engine.model.peft_config:
            self._loaded[ada] = None
            self._loaded.move_to_end(ada)
            return ada
        meta = self.meta(key)
        if meta is None or meta["source"] not in self.engine.loaded_adapters():
            return None
        state = get_peft_model_state_dict(self.engine.model, adapter_name=meta["source"])
        with safe_open(str(self.path(key)), framework="pt") as f:
            state |= {k: f.get_tensor(k) for k in f.keys()}
        self._make_room()
        put_adapter(self.engine.model, ada, self.engine.cfg.lora, state)
        self._loaded[ada] = None
        return ada

    def _make_room(self) -> None:
        """Deletes the least recently used adapters until one more fits."""
        while self._loaded and len(self._loaded) >= self.max_in_memory:
            self._unload(next(iter(self._loaded)))

    def _unload(self, ada: str) -> None:
        if ada in self.engine.model.peft_config:
            if self.engine.active_adapter == ada:  # never delete the active adapter under the engine
                self.engine.use_adapter(BASE_ADAPTER)
            self.engine.model.delete_adapter(ada)
        self._loaded.pop(ada, None)

    def forget(self, name: str) -> None:
        """The person's adapter out of memory and off the disk."""
        key = owner_key(name)
        with self.lock:
            self._unload(self.peft_name(key))
        self.path(key).unlink(missing_ok=True)
