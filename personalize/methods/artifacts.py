"""A build's folder as read before any model loads: its config.json, and the error that says what to run.

Light on purpose (json only): the CLI refuses a missing build, a method whose part of the build is not there,
or a bad history before it imports torch.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from personalize.catalog import BY_NAME

# Profile-to-PEFT's hypernetwork, inside a build: the folder and its two files (methods.p2p reads these names)
P2P_DIR, P2P_WEIGHTS, P2P_CONFIG = "p2p", "hypernet.safetensors", "p2p.json"


class ArtifactsError(ValueError):
    """Missing or unusable artifacts; the message says what to run."""


def artifacts_meta(folder: Path) -> dict:
    """The build's config.json, its paths resolved (`resolved`); a folder without one is told as such, with the
    command that makes a build."""
    if not (Path(folder) / "config.json").exists():
        raise ArtifactsError(f"no artifacts at {folder}: run `python -m personalize build` first")
    try:
        return resolved(json.loads((Path(folder) / "config.json").read_text()), folder)
    except (OSError, json.JSONDecodeError) as e:
        raise ArtifactsError(f"unreadable artifacts config {Path(folder) / 'config.json'}: {e}") from None


# A build is relocatable (issue 59): the local paths it names are written relative to its folder, so that a moved
# or copied checkout serves as it is. These fields may hold one; those written so are listed under RELATIVE.
PATH_FIELDS = ("data", "model_id", "settings.model.name_or_path", "settings.encoder.name_or_path")
RELATIVE = "relative_paths"


def _get(meta: dict, field: str):
    *parents, key = field.split(".")
    for p in parents:
        meta = meta.get(p) if isinstance(meta, dict) else None
    return (meta, key) if isinstance(meta, dict) and isinstance(meta.get(key), str) else (None, key)


def portable(meta: dict, folder: Path, checkout: Path) -> dict:
    """`meta` as written into `folder`: a local path inside `checkout` (where the build ran) relative to the folder,
    so that it moves with the checkout; a path elsewhere (a model in /opt) stays as given, since it does not move.
    The bundled model's conversion cache is this machine's, not the build's: it is not written (a copied checkout
    once converted the model again into the first clone's folder)."""
    meta = json.loads(json.dumps(meta))
    meta.get("settings", {}).get("model", {}).pop("cache_dir", None)
    inside = Path(os.path.abspath(checkout))
    relative = []
    for field in PATH_FIELDS:
        holder, key = _get(meta, field)
        if holder is None or not Path(holder[key]).exists():
            continue  # not a local path: "bundled", a hub id
        path = Path(os.path.abspath(holder[key]))
        if path.is_relative_to(inside):
            holder[key] = os.path.relpath(path, os.path.abspath(folder))
            relative.append(field)
    return meta | {RELATIVE: relative}


def resolved(meta: dict, folder: Path) -> dict:
    """`meta` as read from `folder`: its relative paths joined to the folder (a folder given relative gives paths
    relative to the same place); the conversion cache a build before issue 59 recorded is dropped, so that this
    checkout's own is used."""
    meta.get("settings", {}).get("model", {}).pop("cache_dir", None)
    for field in meta.get(RELATIVE, ()):
        holder, key = _get(meta, field)
        if holder is not None:
            holder[key] = os.path.normpath(os.path.join(folder, holder[key]))
    return meta


# Each optional part of a build (catalog's `needs`): its files, and what its absence is told as
PARTS = {"p2p": ((f"{P2P_DIR}/{P2P_CONFIG}", f"{P2P_DIR}/{P2P_WEIGHTS}"),
                 "no P2P hypernetwork in the artifacts at {folder} (built with --skip-p2p or by an older build): "
                 "run `python -m personalize build` again without --skip-p2p")}


def require_parts(folder: Path, methods) -> None:
    """Refuses a method whose part of the build (catalog's `needs`) is missing, before any model loads: a build
    made with --skip-p2p, or by an older version, has no P2P hypernetwork."""
    artifacts_meta(folder)  # no build at all is told as such
    for m in methods:
        need = BY_NAME[m].needs if m in BY_NAME else None
        if need and not all((Path(folder) / f).exists() for f in PARTS[need][0]):
            raise ArtifactsError(PARTS[need][1].format(folder=folder))
