"""Ray, asked for by a flag: eval in shards gives the serial run's outputs, a task whose worker dies is run again,
and Ray is not imported without the flag. A local Ray with 2 CPUs on the tiny build (marker `ray`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from personalize.cli import main
from personalize.distributed.pool import RayConfig, split

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.ray


def _crash_once(marker: str, x: int) -> int:
    """Kills its own worker the first time (the marker file says it did), then answers."""
    if not os.path.exists(marker):
        Path(marker).write_text("died once")
        os._exit(1)
    return x * 10


def test_split_keeps_order_and_sizes():
    assert split(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert split([1], 4) == [[1]]
    with pytest.raises(ValueError):
        RayConfig(address=" ")


def test_a_shard_whose_worker_dies_is_run_again(ray_local, tmp_path):
    from personalize.distributed.pool import map_shards

    ray = ray_local
    cfg = RayConfig(max_retries=2)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this test module
    marker = str(tmp_path / "crashed")
    assert map_shards(ray, cfg, _crash_once, [(marker, 1), (marker, 2)]) == [10, 20]
    assert Path(marker).exists()


def _eval(tiny_artifacts, out: Path, *extra) -> dict:
    args = ["eval", "--artifacts", str(tiny_artifacts["artifacts"]), "--data", str(tiny_artifacts["demo"]),
            "--methods", "base,card,card_shuffled,rag,bm25_copy", "--limit", "4", "--json", str(out), *extra]
    assert main(args) in (0, None)
    return json.loads(out.read_text())


def _timeless(result: dict) -> dict:
    for m in result["methods"].values():
        m.pop("seconds_per_person")
    for k in ("onboarding_s_total", "wall_s"):
        result["settings"].pop(k)
    return result


def test_eval_on_ray_gives_the_serial_results(ray_local, tiny_artifacts, tmp_path):
    serial = _eval(tiny_artifacts, tmp_path / "serial.json")
    sharded = _eval(tiny_artifacts, tmp_path / "ray.json", "--ray", "auto")  # joins the fixture's local Ray
    assert [p["card"] for p in sharded["predictions"]] == [p["card"] for p in serial["predictions"]]
    assert _timeless(sharded) == _timeless(serial)


def test_without_the_flag_ray_is_not_imported():
    code = ("import sys; from personalize.cli import build_parser; import personalize.eval.commands, "
            "personalize.studio.facade; assert 'ray' not in sys.modules, 'ray imported'")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=300)
