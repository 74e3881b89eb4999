"""Ray, asked for by a flag: eval, build, tune and campaign generate in shards give the serial run's results, a task
whose worker dies is run again, and Ray is not imported without the flag. A local Ray with 2 CPUs on the tiny build
(marker `ray`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from personalize.cli import main
from personalize.distributed.pool import RayConfig, split

ROOT = Path(__file__).resolve().parents[2]
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


def _without_times(report: dict) -> dict:
    for k in ("stages_s", "total_s"):
        report.pop(k)
    for r in report["adapters"]:
        r.pop("seconds", None)
    return report


def test_build_on_ray_trains_the_serial_adapters(ray_local, tiny_artifacts, tmp_path):
    """The tiny build with its cluster adapters trained as Ray tasks: the same adapter weights (bitwise with one
    thread per process, as here; compared within 1e-5, since a driver with more threads may round differently),
    the same clusters, heads and report (timings aside)."""
    from safetensors.torch import load_file

    from conftest import tiny_build_config
    from personalize.distributed.adapter_jobs import RayAdapters
    from personalize.methods.card.build import build

    serial = tiny_artifacts["artifacts"]
    out = build(tiny_artifacts["demo"], "dev", tmp_path / "ray", tiny_build_config(tiny_artifacts["root"] / "lm"),
                p2p=None, cluster_trainer=RayAdapters(RayConfig()))
    files = sorted(p.relative_to(serial) for p in serial.rglob("*.safetensors"))
    assert len(files) == 1 + 7 and files == sorted(p.relative_to(out) for p in out.rglob("*.safetensors"))
    for f in files:
        ours, theirs = load_file(out / f), load_file(serial / f)
        assert ours.keys() == theirs.keys()
        for k in ours:
            torch.testing.assert_close(ours[k], theirs[k], rtol=1e-5, atol=1e-6)
    a, b = np.load(serial / "clusters.npz"), np.load(out / "clusters.npz")
    assert all(np.array_equal(a[k], b[k]) for k in a.files)
    meta = [json.loads((d / "config.json").read_text()) for d in (serial, out)]
    assert meta[0]["settings"] == meta[1]["settings"]
    assert _without_times(meta[0]["report"]) == _without_times(meta[1]["report"])


def test_tune_on_ray_makes_the_serial_choice(ray_local, tiny_artifacts):
    """tune's validation people onboarded and every setting decoded in 2 shards: the same report and choice."""
    from personalize.distributed.people import PeopleShards
    from personalize.methods.card.tune import tune
    from personalize.methods.engine import Engine

    engine = Engine.load(tiny_artifacts["artifacts"])
    engine.meta = {**engine.meta, "users": []}  # every demo person may then choose (none is outside the build)
    built = engine.cfg
    serial = tune(engine, tiny_artifacts["demo"], "dev", n_users=4, write=False)
    chosen, engine.cfg = engine.cfg, built
    shards = PeopleShards(engine, RayConfig())
    try:
        sharded = tune(engine, tiny_artifacts["demo"], "dev", n_users=4, write=False, shards=shards)
    finally:
        shards.close()
    assert sharded == serial and engine.cfg == chosen


def test_campaign_pool_on_ray_is_the_serial_pool(ray_local, tiny_artifacts, tmp_path):
    """campaign generate with its decodes in shards stores the outputs the serial run stores."""
    from conftest import tiny_studio
    from personalize.distributed.requests import RequestShards
    from personalize.humaneval.campaign_pool import generate

    pools = []
    for name in ("serial", "ray"):
        (tmp_path / name).mkdir()
        studio = tiny_studio(tiny_artifacts, tmp_path / name)
        try:
            studio.campaign_desk.create_campaign("c", tiny_artifacts["demo"], "dev", 3, ["base", "card", "cope", "rag"])
            res = generate(studio, "c", shards=RequestShards(studio.runtime.engine, RayConfig()) if name == "ray" else None)
            assert res["failed"] == [] and res["generated"] == 12
            pools.append(studio.runtime.store.query("SELECT i.position, o.method, o.output FROM campaign_outputs o JOIN "
                                            "campaign_items i ON i.id = o.item ORDER BY i.position, o.method"))
        finally:
            studio.runtime.store.close()
    assert pools[0] == pools[1]


def test_without_ray_installed_the_error_says_how_to_install_it(monkeypatch):
    """Ray is optional weight (requirements-extra.txt, not installed by `make run`): --ray / --decode say so."""
    from personalize.distributed.pool import connect

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ConnectionError, match="make extra"):
        connect(RayConfig("auto"))


def test_without_the_flag_ray_is_not_imported():
    code = ("import sys; from personalize.cli import build_parser; import personalize.eval.commands, "
            "personalize.studio.facade, personalize.methods.card.build, personalize.methods.card.tune, "
            "personalize.humaneval.campaign_pool; build_parser().parse_args(['build', '--data', '.']); "
            "assert 'ray' not in sys.modules, 'ray imported'")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=300)
