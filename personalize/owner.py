"""What belongs to the user: their style, to take elsewhere as a key, and the right to be forgotten.

Both work on the store and the build's description alone (no model is loaded), so
the CLI runs them in a second and the app calls the same functions.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from safetensors import safe_open

from . import stylekey
from .store import Store


@dataclass(frozen=True)
class BuildInfo:
    """What a style key must match: the artifacts id, and what its λ means there."""

    artifacts: str
    task: str
    model_id: str
    ks: tuple[int, ...]
    default_k: int
    objective: str
    d: int

    @classmethod
    def of_engine(cls, engine) -> "BuildInfo":
        obj = engine.cfg.objectives[0]
        return cls(engine.artifacts_id, engine.task.name, engine.lm.model_id, tuple(sorted(engine.clusters.centroids)),
                   engine.cfg.default_k, obj, engine.heads[obj].d)

    @classmethod
    def of_folder(cls, folder: str | Path) -> "BuildInfo":
        from .engine import artifacts_meta

        folder = Path(folder)
        meta = artifacts_meta(folder)
        st = meta["settings"]
        obj = st["objectives"][0]
        with safe_open(str(folder / f"head_{obj}.safetensors"), "np") as f:
            d = f.get_slice("U").get_shape()[1]
        model = st.get("model", {})
        return cls(meta["id"], meta["task"], str(meta.get("model_id") or model.get("name_or_path", "")),
                   tuple(st["ks"]), int(st["default_k"]), obj, int(d))


def export_keys(store: Store, build: BuildInfo, name: str, all_versions: bool = False) -> str:
    """The user's current style (or every version, oldest first, one key per line) as style keys."""
    name = store.user(name)["name"]
    rows = store.versions(name, build.artifacts)
    if not rows:
        raise ValueError(f"{name!r} has no fitted style under the artifacts {build.artifacts}: fit it first")
    chosen = rows if all_versions else ([r for r in rows if r["current"]] or rows[-1:])
    clusters = {}
    for k in build.ks:
        a = store.assignment(name, build.artifacts, k)
        if a is not None:
            clusters[k] = {"cluster": a["cluster"], "distances": a["distances"]}
    task = store.user(name)["task"]
    keys = []
    for r in chosen:
        style, _ = store.version_style(name, build.artifacts, r["id"])
        keys.append(stylekey.encode(stylekey.StyleKey(
            name, build.artifacts, task, build.model_id, style.lam, style.bias_ids, style.bias, style.helps,
            clusters, r["source"], r["note"], r["created"])))
    return "\n".join(keys)


def import_keys(store: Store, build: BuildInfo, text: str, name: str | None = None) -> dict:
    """Stores the style of each key (one per line) for `name` (default: the key's user) as a new version, the
    last one current, with the key's clusters. Refused, saying what to do, when a key was made elsewhere."""
    keys = [stylekey.decode(line) for line in (text or "").splitlines() if line.strip()]
    if not keys:
        raise stylekey.StyleKeyError("paste a style key (it starts with card-style-1:)")
    for key in keys:
        if key.artifacts != build.artifacts:
            raise stylekey.StyleKeyError(
                f"this key was made for the artifacts {key.artifacts} ({key.task}); this studio serves "
                f"{build.artifacts} ({build.task}). Load that build, or paste your writing here and fit a new style.")
        if len(key.lam) != build.d:
            raise stylekey.StyleKeyError(f"the key's λ has {len(key.lam)} values; this build's head has {build.d}")
    last = keys[-1]
    user = store.ensure_user(name or last.user, last.task)
    cluster = last.clusters.get(build.default_k, {"cluster": 0})["cluster"]
    stats = {"cluster": cluster, "k": build.default_k, "objective": build.objective, "imported": True}
    clusters = {k: (a["cluster"], a["distances"]) for k, a in last.clusters.items() if k in build.ks}
    vids = [store.save_vector(user, build.artifacts, key.lam, key.model_id,
                              stats | {"diagnostics": {"helps": key.helps}}, key.style.extras_bytes(), source="import",
                              note=f"{key.source} version of {key.created[:19].replace('T', ' ')}",
                              assignments=clusters if key is last else None)
            for key in keys]
    return {"user": user, "versions": vids, "trimmed": sum(k.trimmed for k in keys)}


def forget_user(store: Store, name: str, oppu_root: Path, export_dir: Path) -> dict:
    """Deletes the user from the store (store.forget: one transaction, ratings anonymised, file vacuumed) and
    the files beside it that hold them: their OPPU adapters (every build, partial saves included) and exports
    that quote their name or one of their texts. Returns what went."""
    name = store.user(name)["name"]
    texts = [s.y for s in store.items(name)]
    out = store.forget(name)
    files = user_files(name, Path(oppu_root), Path(export_dir), texts)
    for f in files:
        if f.is_dir():
            shutil.rmtree(f, ignore_errors=True)
        else:
            f.unlink(missing_ok=True)
    return out | {"files": [str(f) for f in files]}


def user_files(name: str, oppu_root: Path, export_dir: Path, texts) -> list[Path]:
    from .methods.oppu import adapter_id

    out = sorted(oppu_root.glob(f"*/{adapter_id(name)}*")) if oppu_root.is_dir() else []
    # the name as a JSON value or as a whole CSV field, and any of their texts long enough to be theirs
    needles = [json.dumps(name, ensure_ascii=False), json.dumps(name), f",{name},", f",{name}\n", f"\n{name},",
               *(t for t in texts if len(t) >= 8)]
    if export_dir.is_dir():
        for f in sorted(export_dir.rglob("*")):
            if f.is_file() and any(n in f.read_text(errors="ignore") for n in needles):
                out.append(f)
    return out
