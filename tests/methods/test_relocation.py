"""A build folder is relocatable (issue 59, item 5): config.json names no absolute path, a moved or copied checkout
serves as it is, and nothing is written where the first one was (a copy once converted the bundled model again
into the first clone's data/models)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from personalize.data import Item
from personalize.lm.model_config import ModelConfig
from personalize.methods.artifacts import RELATIVE, artifacts_meta, portable, resolved

from conftest import tiny_studio


def strings(o):
    if isinstance(o, dict):
        for v in o.values():
            yield from strings(v)
    elif isinstance(o, list):
        for v in o:
            yield from strings(v)
    elif isinstance(o, str):
        yield o


def tree(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


def test_local_paths_are_written_relative_and_read_back_where_the_folder_is(tmp_path):
    (tmp_path / "demo").mkdir()
    (tmp_path / "lm").mkdir()
    meta = {"data": str(tmp_path / "demo"), "model_id": str(tmp_path / "lm"),
            "settings": {"model": {"name_or_path": str(tmp_path / "lm"), "cache_dir": "/elsewhere/data/models"},
                         "encoder": {"name_or_path": "bundled"}}}
    written = portable(meta, tmp_path / "artifacts", checkout=tmp_path)
    assert written["data"] == "../demo" and written["settings"]["model"]["name_or_path"] == "../lm"
    assert "cache_dir" not in written["settings"]["model"] and written["settings"]["encoder"]["name_or_path"] == "bundled"
    assert not any(s.startswith("/") for s in strings(written))
    moved = resolved(json.loads(json.dumps(written)), Path("/new/place/artifacts"))
    assert moved["data"] == "/new/place/demo" and moved["model_id"] == "/new/place/lm"
    assert resolved(json.loads(json.dumps(written)), Path("data/artifacts"))["data"] == "data/demo"  # as given


def test_a_path_outside_the_checkout_stays_as_given_and_an_old_build_loads(tmp_path):
    outside = tmp_path / "opt" / "model"
    outside.mkdir(parents=True)
    meta = {"settings": {"model": {"name_or_path": str(outside)}}}
    co = tmp_path / "co"
    assert portable(meta, co / "data" / "artifacts" / "demo", co)["settings"]["model"]["name_or_path"] == str(outside)
    # a build from before: absolute paths, read as they are; its recorded conversion cache is not this checkout's
    old = {"data": "data/demo", "settings": {"model": {"name_or_path": "bundled", "cache_dir": "/tmp/snap/data/models"}}}
    got = resolved(old, tmp_path / "art")
    assert got["data"] == "data/demo" and "cache_dir" not in got["settings"]["model"]


def test_a_copied_checkout_serves_without_writing_outside_itself(tiny_artifacts, tmp_path, monkeypatch):
    """A build made inside a checkout (its model and population there, the way `make run` makes the demo's), the
    checkout copied and the first one moved away: the copy loads, saves a person and fits them; the first one's
    place stays empty and the moved one unchanged."""
    from conftest import tiny_build_config
    from personalize.methods.card.build import build

    first, copy, moved = tmp_path / "first", tmp_path / "copy", tmp_path / "moved"
    for part in ("lm", "demo"):
        shutil.copytree(tiny_artifacts["root"] / part, first / "data" / part)
    monkeypatch.chdir(first)
    build(Path("data/demo"), "dev", first / "data" / "artifacts" / "demo", tiny_build_config(first / "data" / "lm"),
          p2p=None, tune_steps=())
    meta = json.loads((first / "data" / "artifacts" / "demo" / "config.json").read_text())
    assert set(meta[RELATIVE]) == {"data", "model_id", "settings.model.name_or_path"}
    assert not any(s.startswith("/") for s in strings(meta)) and "cache_dir" not in meta["settings"]["model"]
    shutil.copytree(first, copy)
    first.rename(moved)
    before = tree(moved)

    monkeypatch.chdir(copy)
    art = {"artifacts": copy / "data" / "artifacts" / "demo", "demo": copy / "data" / "demo"}
    studio = tiny_studio(art, copy / "data")
    try:
        engine = studio.runtime.engine
        assert Path(engine.cfg.model.name_or_path) == copy / "data" / "lm"
        assert Path(engine.meta["data"]) == copy / "data" / "demo" and studio.runtime.demo_users
        assert engine.cfg.model.cache_dir == ModelConfig().cache_dir  # this checkout's, never a recorded one
        p = studio.runtime.task.prompt
        studio.histories.save_history("mover", [Item(f"a short note {i} about the bus", x=p(f"note {i}"))
                                                for i in range(6)], "tweets")
        studio.fits.fit("mover")
    finally:
        studio.runtime.store.close()
    assert not first.exists() and tree(moved) == before


def test_the_bundled_models_conversion_cache_is_not_the_builds(tiny_artifacts):
    """The cache a build ran with is not written: a copy converts, if at all, into its own data/models."""
    meta = json.loads((tiny_artifacts["artifacts"] / "config.json").read_text())
    assert "cache_dir" not in meta["settings"]["model"]
