"""A build's folder as read before any model loads: its config.json, and the error that says what to run.

Light on purpose (json only): the CLI refuses a missing build, a method whose part of the build is not there,
or a bad history before it imports torch.
"""

from __future__ import annotations

import json
from pathlib import Path

from personalize.catalog import BY_NAME

# Profile-to-PEFT's hypernetwork, inside a build: the folder and its two files (methods.p2p reads these names)
P2P_DIR, P2P_WEIGHTS, P2P_CONFIG = "p2p", "hypernet.safetensors", "p2p.json"


class ArtifactsError(ValueError):
    """Missing or unusable artifacts; the message says what to run."""


def artifacts_meta(folder: Path) -> dict:
    """The build's config.json; a folder without one is told as such, with the command that makes a build."""
    if not (Path(folder) / "config.json").exists():
        raise ArtifactsError(f"no artifacts at {folder}: run `python -m personalize build` first")
    try:
        return json.loads((Path(folder) / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ArtifactsError(f"unreadable artifacts config {Path(folder) / 'config.json'}: {e}") from None


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
