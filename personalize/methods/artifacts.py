"""A build's folder as read before any model loads: its config.json, and the error that says what to run.

Light on purpose (json only): the CLI refuses a missing build or a bad history before it imports torch.
"""

from __future__ import annotations

import json
from pathlib import Path


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
