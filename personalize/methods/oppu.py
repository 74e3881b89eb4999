"""OPPU baseline (METHOD §5; "One PEFT Per User"): one LoRA per user, SFT on that user's history.

Each user's adapter starts from the K = 1 adapter (the task-adapted model,
`k1c0`) and is trained with the same masked-prompt SFT as the cluster
adapters (adapters.train_adapter), so OPPU differs from the cluster model
only in whose data the last adapter saw. The adapter is saved under
`<folder>/<safe user name>/` (peft format, plus `oppu.json` with the training
report and a fingerprint of the history it was trained on) and loaded on
demand; at most `max_in_memory` user adapters stay in the peft model, the
least recently used is deleted first.

Saving survives a kill at any moment: the new adapter is written whole into
`<name>.partial-<pid>/` (its `oppu.json` last, with the size of every file),
then the old folder is renamed to `<name>.old-<pid>` and the new one renamed
into place; the old copy is removed afterwards. A folder is only used when it
is complete (`complete_meta`: the meta parses, the weights file holds every
tensor its header lists, the sizes match), partial folders are never read, and
a save killed between its two renames leaves the previous adapter in the
`.old-` folder, which is used until the next save.

Short histories: with fewer than `min_items` items there is nothing to fit
without memorising one text, so such a user gets the documented fallback,
the K = 1 model (`prepare` says `cold_start: True`); no adapter is trained.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import time
import warnings
from collections import OrderedDict
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import replace
from pathlib import Path
from typing import Callable

from personalize.methods.card.adapters import BASE_ADAPTER, add_warm_adapter, lora_bytes, sft_loss, train_adapter
from personalize.serving.rows import DecodeRow
from personalize.serving.generation import Generation, generate
from personalize.serving.settings import DecodingSettings
from personalize.methods.base import UserContext, fingerprint, record_report
from personalize.methods.oppu_config import OppuConfig

META = "oppu.json"
WEIGHTS = "adapter_model.safetensors"  # what peft's save_pretrained writes (safe serialisation)
CONFIG = "adapter_config.json"
PARTIAL = ".partial-"  # <name>.partial-<pid>: a save being written (or killed while writing); never loaded
ASIDE = ".old-"  # <name>.old-<pid>: the previous adapter, moved aside while the new one is renamed in


def adapter_id(name: str) -> str:
    """A peft adapter and folder name for a user: [A-Za-z0-9_] only (peft names become module keys,
    which may not contain '.'), plus a hash so that different names never collide."""
    clean = re.sub(r"[^A-Za-z0-9_]", "_", name)[:40]
    return f"u_{clean}_{hashlib.sha1(name.encode()).hexdigest()[:8]}"


def _history_key(user) -> str:
    return fingerprint([t for it in user.items for t in (it.x, it.y)])


def _whole_safetensors(path: Path) -> bool:
    """True when the file holds its whole header and every byte of the tensors that header lists (a write cut
    off anywhere fails this); the tensors themselves are not read."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little")
            if len(head) < 8 or n > size - 8:
                return False
            header = json.loads(f.read(n))
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return False
    return 8 + n + end == size


def complete_meta(path: Path) -> dict | None:
    """The meta of the adapter saved in `path` when the folder holds a whole adapter, else None: the meta
    (written last) and peft's config parse, the weights are whole, and every file has the size the meta
    recorded (adapters saved before sizes were recorded are checked without them)."""
    try:
        meta = json.loads((path / META).read_text())
        json.loads((path / CONFIG).read_text())
        sizes = meta.get("files", {})
        if any((path / name).stat().st_size != size for name, size in sizes.items()):
            return None
    except (OSError, ValueError, AttributeError, TypeError):
        return None
    return meta if _whole_safetensors(path / WEIGHTS) else None


def _fsync(path: Path) -> None:
    """Flushes a file (or a folder's entries) to disk; folders cannot be opened on every platform."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        with suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def _abandoned(path: Path, marker: str) -> bool:
    """True when the process that wrote a leftover folder (`<name><marker><pid>`) is gone (or was this one, or the
    name holds no pid), so it may be removed."""
    try:
        pid = int(path.name.rsplit(marker, 1)[1])
    except (IndexError, ValueError):
        return True
    if pid == os.getpid():
        return True
    if os.name != "posix":  # os.kill(pid, 0) would terminate the process on Windows
        return False
    try:
        os.kill(pid, 0)
    except OSError as e:  # gone, or (any other error) alive and owned by someone else
        return isinstance(e, ProcessLookupError)
    return False


class OppuMethod:
    name = "oppu"
    batch = "a plain row on the person's own LoRA (loaded into the peft model when the rows are built)"
    config_class = OppuConfig
    stored = "the user's LoRA adapter on disk"
    first_use_note = "training your own LoRA"
    per_person_files = True  # its config's `folder` holds them (registry.local_config)

    def __init__(self, engine, store=None, cfg: OppuConfig = OppuConfig()):
        self.engine, self.store, self.cfg = engine, store, cfg
        self.folder = Path(cfg.folder) if cfg.folder else Path("data") / "oppu" / str(engine.artifacts_id)
        self._loaded: OrderedDict[str, None] = OrderedDict()  # user adapters in the peft model, oldest first
        self.lock = nullcontext()  # the studio's model lock: training takes it per step, so decodes interleave

    # ------------------------------------------------------------ prepare: the per-user work
    def prepare(self, user: UserContext, progress: Callable[[int, int], None] | None = None) -> dict:
        """Trains, saves and loads the user's adapter; returns its report (time, tokens, bytes, loss).
        The model lock is held per training step (and for the short set-up), never for the whole training."""
        t0 = time.perf_counter()
        if len(user.items) < self.cfg.min_items:
            info = {"method": self.name, "n_items": len(user.items), "cold_start": True, "adapter": BASE_ADAPTER,
                    "reason": f"{len(user.items)} item(s) < min_items={self.cfg.min_items}: the K = 1 model is used",
                    "prepare_s": round(time.perf_counter() - t0, 4)}
            record_report(self, user, info)
            return info
        eng, ada = self.engine, adapter_id(user.name)
        examples = [(it.x, it.y) for it in user.items]
        lora = eng.cfg.lora
        settings = replace(lora, lr=self.cfg.lr or lora.lr, batch_size=self.cfg.batch_size or lora.batch_size)
        steps = min(self.cfg.max_steps, max(1, math.ceil(self.cfg.epochs * len(examples) / settings.batch_size)))
        loss_before = None
        with self.lock:
            if ada in eng.model.peft_config:  # prepared before: start again from the K = 1 weights
                self._unload(ada)
            self._make_room(keep=None)
            if self.cfg.report_loss:
                eng.use_adapter(BASE_ADAPTER)
                loss_before = sft_loss(eng.model, eng.tok, examples, eng.cfg.budget)
            add_warm_adapter(eng.model, ada, settings, source=BASE_ADAPTER)
            self._loaded[ada] = None
            eng.use_adapter(ada)  # through the engine, so its record of the active adapter stays true

        @contextmanager
        def step():
            with self.lock:  # another request may have switched adapters since the last step
                eng.use_adapter(ada)
                yield

        report = train_adapter(eng.model, eng.tok, ada, examples, steps, settings, eng.cfg.budget,
                               progress=None if progress is None else lambda i, n, _loss: progress(i, n),
                               step_context=step)
        with self.lock:
            eng.use_adapter(ada)
            loss_after = sft_loss(eng.model, eng.tok, examples, eng.cfg.budget) if self.cfg.report_loss else None
        path = self.folder / ada
        info = {"method": self.name, "n_items": len(examples), "cold_start": False, "adapter": ada, "path": str(path),
                "steps": steps, "tokens": report["tokens"], "train_s": report["seconds"],
                "lora_bytes": lora_bytes(eng.model, ada),
                "loss_before": loss_before, "loss_after": loss_after, "history": _history_key(user)}
        self.save(ada, info)
        info["disk_bytes"] = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
        info["prepare_s"] = round(time.perf_counter() - t0, 4)
        record_report(self, user, info)
        return info

    def save(self, ada: str, info: dict) -> Path:
        """Writes the in-memory adapter `ada` with `info` as its meta to `<folder>/<ada>/`, so that a process
        killed at any moment leaves either the previous adapter or the new one, never a mix (module doc)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        final, pid = self.folder / ada, os.getpid()
        staging = self.folder / f"{ada}{PARTIAL}{pid}"
        shutil.rmtree(staging, ignore_errors=True)
        self.engine.model.save_pretrained(str(staging), selected_adapters=[ada])  # peft writes <staging>/<ada>/
        new = staging / ada
        files = sorted(f for f in new.iterdir() if f.is_file())
        for f in files:
            _fsync(f)
        meta = info | {"files": {f.name: f.stat().st_size for f in files}}
        with open(new / META, "w") as f:  # last: a folder with a meta has everything else
            f.write(json.dumps(meta, indent=2))
            f.flush()
            os.fsync(f.fileno())
        _fsync(new)
        aside = self.folder / f"{ada}{ASIDE}{pid}"
        if final.exists():  # a folder cannot be renamed over a non-empty one: move the old one aside first
            shutil.rmtree(aside, ignore_errors=True)
            os.rename(final, aside)
        os.rename(new, final)
        _fsync(self.folder)
        shutil.rmtree(staging, ignore_errors=True)  # now only peft's model card
        for left in [*self.folder.glob(f"{ada}{ASIDE}*"), *self.folder.glob(f"{ada}{PARTIAL}*")]:
            if _abandoned(left, ASIDE if ASIDE in left.name else PARTIAL):  # earlier kills' leftovers
                shutil.rmtree(left, ignore_errors=True)
        return final

    def saved(self, ada: str) -> tuple[Path, dict] | None:
        """(folder, meta) of the user's complete saved adapter, or None: `<folder>/<ada>/` when it is whole,
        else the previous adapter a save left in `<ada>.old-<pid>` when it was killed between its two renames.
        `.partial-` folders are never used."""
        meta = complete_meta(self.folder / ada)
        if meta is not None:
            return self.folder / ada, meta

        def age(p: Path) -> float:
            try:
                return p.stat().st_mtime
            except OSError:
                return 0.0

        for old in sorted(self.folder.glob(f"{ada}{ASIDE}*"), key=age, reverse=True):
            meta = complete_meta(old)
            if meta is not None:
                return old, meta
        return None

    def is_current(self, user: UserContext) -> bool:
        """True when the user's saved adapter was trained on their present history (or none is needed)."""
        if len(user.items) < self.cfg.min_items:
            return True
        saved = self.saved(adapter_id(user.name))
        return saved is not None and saved[1].get("history") == _history_key(user)

    # ------------------------------------------------------------ adapters in memory
    def activate(self, user: UserContext) -> str:
        """Makes the user's adapter the active one (loaded from disk if needed); returns its name.
        Cold-start users (and users never prepared, with a short history) get the K = 1 adapter."""
        if len(user.items) < self.cfg.min_items:
            self.engine.use_adapter(BASE_ADAPTER)
            return BASE_ADAPTER
        ada = adapter_id(user.name)
        if ada not in self.engine.model.peft_config:
            saved = self.saved(ada)
            if saved is None:  # none, or only a half-written one
                raise ValueError(f"no complete OPPU adapter for user {user.name!r} at {self.folder / ada}: "
                                 "run prepare(user) first")
            path, meta = saved
            if meta.get("history") not in (None, _history_key(user)):
                warnings.warn(f"user {user.name!r}: history changed since the OPPU adapter was trained; "
                              "run prepare(user) again to retrain it", stacklevel=2)
            self._make_room(keep=ada)
            self.engine.model.load_adapter(str(path), adapter_name=ada)
            for p in self.engine.model.parameters():
                p.requires_grad_(False)
        self._loaded[ada] = None
        self._loaded.move_to_end(ada)
        self.engine.use_adapter(ada)
        return ada

    def _make_room(self, keep: str | None) -> None:
        """Deletes the least recently used user adapters until one more fits."""
        while len(self._loaded) >= self.cfg.max_in_memory:
            victim = next((a for a in self._loaded if a != keep), None)
            if victim is None:
                return
            self._unload(victim)

    def stored_bytes(self, user, info: dict) -> int:
        return int(info.get("disk_bytes", 0))  # 0: a cold-start user keeps nothing of their own

    def release(self) -> None:
        """Deletes every user adapter this method loaded from the peft model (their files stay), e.g. after
        a bench on a long-lived engine."""
        for ada in list(self._loaded):
            self._unload(ada)

    def _unload(self, ada: str) -> None:
        self.engine.use_adapter(BASE_ADAPTER)  # never delete the active adapter under the engine
        if ada in self.engine.model.peft_config:
            self.engine.model.delete_adapter(ada)
        self._loaded.pop(ada, None)

    is_prepared = is_current

    # ------------------------------------------------------------ generation
    def rows(self, user: UserContext, prompts: list[str], settings: DecodingSettings,
             trace: bool = False) -> list[DecodeRow]:
        """Rows on the user's own adapter (loaded into the peft model now: call under the model lock);
        the adapter must be trained already (prepare, a background job in the studio)."""
        if not self.is_current(user):
            raise ValueError(f"OPPU: no adapter for {user.name!r}'s present history yet: prepare it first")
        ada = self.activate(user)
        return [DecodeRow(p, self.engine.cfg.budget, settings, ada, trace=[{"adapter": ada}]) for p in prompts]

    def generate(self, user: UserContext, prompts: list[str], settings: DecodingSettings) -> list[Generation]:
        """Greedy (or sampled) decoding with the user's own adapter, trained first when it is missing or was
        trained on an older history (so an app's first OPPU request for a user is slow); trace = [{"adapter"}]."""
        if not self.is_current(user):
            self.prepare(user)
        ada = self.activate(user)
        outs = generate(self.engine.model, self.engine.tok, list(prompts), self.engine.cfg.budget, settings)
        for g in outs:
            g.trace = [{"adapter": ada}]
        return outs
