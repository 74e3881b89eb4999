"""The CLI as a user runs it: --help everywhere, clear errors with exit 2, and one end-to-end run
on the bundled SmolLM2 model (build → onboard → generate → eval → bench) on a small demo population."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from personalize.methods.card.style import UserStyle
from personalize.demo import write_demo
from personalize.store import Store

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = ["build", "onboard", "generate", "eval", "bench", "demo"]


def cli(*args, check=None, timeout=1200):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "personalize", *map(str, args)], capture_output=True, text=True,
                       cwd=ROOT, env=env, timeout=timeout)
    if check is not None:
        assert r.returncode == check, f"exit {r.returncode}\nstdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}"
    return r


def test_help_of_every_command():
    r = cli("--help", check=0)
    for c in COMMANDS:
        assert c in r.stdout
        assert "usage:" in cli(c, "--help", check=0).stdout


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("demo")
    write_demo(d, n_users_per_style=2, n_items=6)
    return d


def test_k_larger_than_population_fails_before_any_work(demo_dir, tmp_path):
    r = cli("build", "--data", demo_dir, "--ks", "1,50", "--default-k", "1", "--out", tmp_path / "a", check=2)
    assert "larger than the population" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "a").exists()


def test_unloadable_model_id_is_a_clear_error(demo_dir, tmp_path):
    r = cli("build", "--data", demo_dir, "--ks", "1", "--default-k", "1", "--model", "no-such-org/no-such-model",
            "--out", tmp_path / "a", check=2)
    assert "could not load model 'no-such-org/no-such-model'" in r.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "a.partial").exists()


def test_missing_artifacts_and_data(tmp_path):
    r = cli("onboard", "--artifacts", tmp_path / "none", "--history", tmp_path / "h.txt", check=2)
    assert "no artifacts" in r.stderr
    r = cli("build", "--data", tmp_path / "nowhere", check=2)
    assert "not a folder" in r.stderr


def test_four_bit_on_cpu_is_refused(demo_dir, tmp_path):
    r = cli("build", "--data", demo_dir, "--ks", "1", "--default-k", "1", "--load-in-4bit", "--device", "cpu",
            "--out", tmp_path / "a", check=2)
    assert "needs a CUDA GPU" in r.stderr


@pytest.fixture(scope="module")
def artifacts(demo_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("art") / "demo"
    r = cli("build", "--data", demo_dir, "--ks", "1,2", "--default-k", "2", "--limit-users", "8", "--val-users", "2",
            "--base-steps", "2", "--cluster-steps", "1", "--items-per-user", "4", "--head-epochs", "2",
            "--p2p-steps", "1", "--max-prompt-tokens", "32", "--max-target-tokens", "16", "--tune-steps", "style",
            "--out", out, check=0)  # the choice's one step the test reads (test_tune runs every step on tiny models)
    (out.parent / "build.log").write_text(r.stdout)
    return out


def test_build_flags_are_the_settings_fields(tmp_path):
    """build's setting flags are made from the fields: no flag means the field's default, a flag reaches its field
    (and what depends on it), and the field's help is the flag's."""
    import argparse

    from personalize.fitting.plan import add_build_args, build_args, build_plan
    from personalize.lm.tokens import TokenBudget
    from personalize.methods.card.config import CardConfig, HeadSettings, LoraSettings

    _, _, cfg, _ = build_plan(build_args(["--data", str(tmp_path)]))
    default = CardConfig()
    assert (cfg.ks, cfg.items_per_user, cfg.n_val_users, cfg.objectives) == (
        default.ks, default.items_per_user, default.n_val_users, default.objectives)
    assert cfg.lora == LoraSettings() and cfg.head == HeadSettings() and cfg.budget == TokenBudget()
    assert not cfg.own.far  # a cluster of one after Save is a build's choice (docs/results/2026-11-28-issue-48-far.md "Who is far")
    _, _, cfg, _ = build_plan(build_args(["--data", str(tmp_path), "--ks", "1,2", "--objectives", "tokens, pairs",
                                          "--head-epochs", "3", "--layers", "2", "--max-target-tokens", "12",
                                          "--cluster-steps", "5", "--val-users", "7", "--own-adapters-for-far"]))
    assert cfg.own.far
    assert cfg.ks == (1, 2) and cfg.default_k == 2 and cfg.objectives == ("tokens", "pairs")
    assert (cfg.head.epochs, cfg.head.n_layers, cfg.budget.max_target_tokens, cfg.lora.cluster_steps,
            cfg.n_val_users) == (3, 2, 12, 5, 7)
    p = argparse.ArgumentParser()
    add_build_args(p)
    text = " ".join(p.format_help().split())
    assert "steps per cluster adapter, from the K = 1 weights (default 8)" in text


def test_oppu_steps_flag_is_the_config_field():
    """eval's --oppu-steps is OppuConfig.max_steps: its default when not given, its value when given (validated there)."""
    import argparse

    from personalize.eval.commands import _add_method_budgets, _method_configs
    from personalize.fitting.plan import UsageError
    from personalize.methods.oppu_config import OppuConfig

    p = argparse.ArgumentParser()
    _add_method_budgets(p)
    assert _method_configs(p.parse_args([]))["oppu"] == {"max_steps": OppuConfig().max_steps}
    assert _method_configs(p.parse_args(["--oppu-steps", "7"]))["oppu"] == {"max_steps": 7}
    with pytest.raises(UsageError, match="max_steps"):
        _method_configs(p.parse_args(["--oppu-steps", "0"]))
    assert f"(default {OppuConfig().max_steps})" in " ".join(p.format_help().split())


def test_p2p_build_flags_reach_build(monkeypatch, demo_dir, tmp_path, capsys):
    """--skip-p2p and --p2p-steps as build() receives them; a contradiction or a bad value is a clear error."""
    import personalize.methods.card.build
    from personalize.cli import main

    got = []
    monkeypatch.setattr(personalize.methods.card.build, "build", lambda *a, **kw: got.append(kw["p2p"]))
    base = ["build", "--data", str(demo_dir), "--ks", "1", "--default-k", "1", "--out", str(tmp_path / "a")]
    assert main(base) == 0 and got[-1].steps == personalize.methods.card.build.P2P_STEPS
    assert main([*base, "--p2p-steps", "7"]) == 0 and got[-1].steps == 7
    assert main([*base, "--skip-p2p"]) == 0 and got[-1] is None
    assert main([*base, "--skip-p2p", "--p2p-steps", "7"]) == 2 and "no effect with --skip-p2p" in capsys.readouterr().err
    assert main([*base, "--p2p-steps", "-1"]) == 2 and "steps must be >= 0" in capsys.readouterr().err
    assert len(got) == 3


def test_end_to_end_on_the_bundled_model(artifacts, demo_dir, tmp_path, capsys):
    meta = json.loads((artifacts / "config.json").read_text())
    assert meta["model_id"].startswith("bundled:") and meta["task"] == "tweets"
    for f in ["clusters.npz", "head_tokens.safetensors", "adapters/k1c0/adapter_config.json",
              "adapters/k2c1/adapter_config.json"]:
        assert (artifacts / f).exists(), f
    assert meta["report"]["adapters"][0]["tokens"] > 0
    # the P2P hypernetwork is trained by the same build, timed, reported and saved inside the artifacts
    assert (artifacts / "p2p" / "hypernet.safetensors").exists() and (artifacts / "p2p" / "p2p.json").exists()
    p2p_report = meta["report"]["p2p"]
    assert p2p_report["steps"] == 1 and p2p_report["tokens"] > 0 and p2p_report["seconds"] > 0
    assert meta["report"]["stages_s"]["p2p hypernetwork"] >= p2p_report["seconds"]
    assert "p2p hypernetwork done in" in (artifacts.parent / "build.log").read_text()
    assert not (artifacts.parent / "demo.partial").exists()

    db = tmp_path / "studio.db"
    hist = tmp_path / "mine.txt"
    hist.write_text("\n".join(f"omg the {w} was SO good today!!! 🔥🔥" for w in
                              ["coffee", "train", "concert", "pizza", "run", "book", "match", "movie"]))
    r = cli("onboard", "--artifacts", artifacts, "--history", hist, "--user", "ana", "--db", db, check=0)
    assert "user ana: 8 items, cluster" in r.stdout and "fit" in r.stdout
    store = Store(db)
    assert len(store.items("ana")) == 8 and all(i.neutral for i in store.items("ana"))
    lam, info = store.vector("ana", meta["id"])
    style = UserStyle.from_stored(store.style("ana", meta["id"]))  # λ (512 bytes) + the parts of the style the build's choice kept on
    assert lam.shape == (128,) and store.vector_bytes("ana", meta["id"]) == 512 + len(style.extras_bytes())
    parts = meta["settings"]["style"]  # the build chose them on its validation people (tune's steps)
    assert meta["report"]["tune"]["style"]["chosen"] in ("lambda", "bias", "memory", "bias+memory",
                                                         "retrieval+bias+memory")
    if parts["memory"]:
        assert len(style.values) > 8 and style.keys.shape[1] == len(style.lam)
    if parts["bias"]:
        assert 0 < len(style.bias_ids) <= 512
    assert store.assignment("ana", meta["id"], 2) is not None

    # onboarding the same name again without --replace is refused, and the stored user is intact
    r = cli("onboard", "--artifacts", artifacts, "--history", hist, "--user", "ana", "--db", db, check=2)
    assert "exists" in r.stderr and len(Store(db).items("ana")) == 8

    r = cli("generate", "--artifacts", artifacts, "--user", "ana", "--prompt", "I liked the new cafe.", "--template",
            "--methods", "base,cluster,card,rag,cope,p2p", "--alpha", "0", "--max-tokens", "12", "--db", db, check=0)
    outs = [block.split("\n", 1)[1].strip() for block in r.stdout.strip().split("\n\n")]
    assert r.stdout.count("[") >= 3 and outs[1] == outs[2]  # α = 0: CARD is the cluster model
    assert "[p2p] (" in r.stdout
    assert {g["method"] for g in Store(db).generations(user="ana")} == {"base", "cluster", "card", "rag", "cope", "p2p"}

    # artifacts without a hypernetwork (--skip-p2p, or an older build): p2p is refused with what to run
    import shutil

    bare = tmp_path / "no_p2p"
    shutil.copytree(artifacts, bare)
    shutil.rmtree(bare / "p2p")
    r = cli("generate", "--artifacts", bare, "--user", "ana", "--prompt", "x", "--methods", "p2p", "--db", db, check=2)
    assert "no P2P hypernetwork" in r.stderr and "personalize build" in r.stderr and "Traceback" not in r.stderr

    r = cli("generate", "--artifacts", artifacts, "--user", "nobody", "--prompt", "x", "--db", db, check=2)
    assert "unknown user 'nobody'" in r.stderr

    out_json = tmp_path / "eval.json"
    r = cli("eval", "--artifacts", artifacts, "--data", demo_dir, "--limit", "2", "--methods",
            "base,cluster,card,bm25_copy,rag,p2p,oppu", "--oppu-steps", "1", "--json", out_json, check=0)
    res = json.loads(out_json.read_text())
    assert set(res["methods"]) == {"base", "cluster", "card", "bm25_copy", "rag", "p2p", "oppu"}
    assert res["settings"]["method_configs"]["oppu"] == {"max_steps": 1}  # trains each user's LoRA on first use
    assert all(0 <= v["rougeL"] <= 1 and v["n"] == 2 for v in res["methods"].values())
    assert "R-L" in r.stdout

    # wrong settings are refused before anything loads (in this process: the same main, without a torch import)
    from personalize.cli import main

    assert main(["eval", "--artifacts", str(artifacts), "--data", str(demo_dir), "--exact-pairs", "0"]) == 2
    assert "max_pairs" in capsys.readouterr().err
    assert main(["eval", "--artifacts", str(artifacts), "--data", str(demo_dir), "--objective", "hard_pairs"]) == 2
    err = capsys.readouterr().err
    assert "heads for ['tokens']" in err and "--objectives hard_pairs" in err


def test_bench_on_the_tiny_build(tiny_artifacts, tmp_path, capsys):
    """`bench` end to end (onboarding, fit, Table 5's rows, serving) on the tiny build: its figures measure nothing
    there, its table and JSON keys are what this checks (benchmarks run it on real builds)."""
    artifacts = tiny_artifacts["artifacts"]
    bench_json = tmp_path / "bench.json"
    r = cli("bench", "--artifacts", artifacts, "--users", "3", "--items", "6", "--repeats", "1", "--json", bench_json,
            "--methods", "rag,oppu,card", "--oppu-steps", "1", "--serving-people", "3", "--exact-pairs", "1",
            "--start-repeats", "1", check=0)  # exact: see test_bench_methods_side_by_side
    b = json.loads(bench_json.read_text())
    assert b["bytes_per_user"] > 512 and b["fit_ms"] > 0 and b["decode_overhead_ratio"] > 0  # λ + bias + memory
    assert {"same_cluster", "cross_cluster"} <= set(b["switch_ms"]) and b["onboarding_s"]["total"] > 0
    # paper Table 5, measured side by side in the same run
    # and beside OPPU, a cluster of one: each person's own adapter and their style over it (issue 48)
    assert list(b["methods"]) == ["rag", "oppu", "card", "card, own adapter"]
    for m, row in b["methods"].items():
        assert row["onboarding_s"] > 0 and row["latency_s_per_query"] > 0 and row["bytes_per_user"] > 0, (m, row)
    assert b["methods"]["card"]["bytes_per_user"] == b["bytes_per_user"]
    assert b["methods"]["oppu"]["bytes_per_user"] > b["methods"]["card"]["bytes_per_user"]  # a LoRA vs a style (tiny: 4 layers)
    own = b["methods"]["card, own adapter"]
    assert 0 < own["training_s"] <= own["onboarding_s"] and "of OPPU's onboarding time" in r.stdout
    assert "| oppu |" in r.stdout and "latency s/query" in r.stdout
    sv = b["serving"]  # mixed batches and the scheduler (eval/bench_serving.py), names fixed
    assert sv["methods"] == ["base", "cluster", "card", "cope"]  # and p2p where the build has its hypernetwork
    assert sv["compare_s"] > 0 and sv["single_s"] > 0
    assert {"sequential_s", "scheduled_s", "p50_s", "p95_s"} <= set(sv["concurrent"])
    assert max(x["requests"] for x in sv["concurrent"]["batches"]) > 1  # people shared a batch
    assert sv["exact_first_use_s"] > 0 and sv["exact_first_use_old_s"] > 0 and sv["exact_same_attributes"]
    fit = sv["fit"]  # Fit my style on a pasted history: right after Save (rewrites still running) and after them
    assert len(fit["right_after_save_s"]) == 2 and len(fit["after_rewrites_s"]) == 1
    assert fit["median_right_after_save_s"] > 0 and fit["median_after_rewrites_s"] > 0
    assert fit["items"] == 6 and "Fit my style, 6 pasted items, right after Save (s)" in r.stdout  # as pasted
    assert "after the neutral rewrites (s)" in r.stdout
    # the floor of a fit right after Save (its model work at the machine's best GEMM rate) is below what it took
    assert len(fit["right_after_save_tflop"]) == 2 and min(fit["right_after_save_tflop"]) > 0 < fit["gemm_gflops"]
    assert all(0 < f <= t for f, t in zip(fit["floor_right_after_save_s"], fit["right_after_save_s"]))
    assert all(0 < a < b for a, b in zip(fit["right_after_save_tflop_shared_prefix"], fit["right_after_save_tflop"]))
    assert "right after Save, floor at" in r.stdout
    assert 0 < sv["start_s"] < 180 and "app later start" in r.stdout
    from personalize.cli import main

    assert main(["bench", "--artifacts", str(artifacts), "--methods", "rag,nope"]) == 2
    assert "unknown ['nope']" in capsys.readouterr().err


def test_bad_history_files_are_refused_and_nothing_is_written(artifacts, tmp_path):
    db = tmp_path / "studio.db"
    cases = {"empty.txt": b"", "bin.txt": b"\x00\x01\x02binary", "bad.jsonl": b'{"text": "ok"}\n{not json\n'}
    for name, content in cases.items():
        (tmp_path / name).write_bytes(content)
        r = cli("onboard", "--artifacts", artifacts, "--history", tmp_path / name, "--user", "u", "--db", db, check=2)
        assert r.stderr.startswith("error:") and "Traceback" not in r.stderr
    r = cli("onboard", "--artifacts", artifacts, "--history", tmp_path / "missing.txt", "--db", db, check=2)
    assert "not found" in r.stderr
    assert not db.exists() or Store(db).users() == []


def test_mixed_batch_on_the_bundled_model_equals_each_method_alone(artifacts, demo_dir, tmp_path):
    """Issue 12: base, cluster, card, cope and p2p rows of two people on the same prompt in ONE generate give,
    row by row, what each method gives alone (greedy), on the bundled SmolLM2 build."""
    from personalize.data import read_lamp
    from personalize.methods.base import UserContext
    from personalize.methods.card.person import prepared_items
    from personalize.studio.facade import Studio, StudioConfig

    st = Studio.load(StudioConfig(own_adapters=False, artifacts=str(artifacts), db=str(tmp_path / "s.db"), demo_data=str(demo_dir),
                                  first_use_in_background=False))
    try:
        _, queries = read_lamp(demo_dir, "dev")
        people, plan = [q for q in queries if len(q.profile) >= 5][:2], []
        for q in people:
            st.histories.save_history(q.user, q.profile, "tweets")
            st.fits.fit(q.user)
            prepared_items(st.runtime.engine, st.runtime.store, q.user)
            state = st.histories.user_state(q.user)
            user = UserContext.from_store(st.runtime.store, q.user, st.runtime.task, state.cluster, state.k, state.lam)
            plan += [(m, user, people[0].input) for m in ("base", "cluster", "card", "cope", "p2p")]  # one prompt, two styles
        s = st.runtime.engine.cfg.decoding
        rows = [r for m, u, p in plan for r in st.runtime.method(m).rows(u, [p], s)]
        mixed = st.runtime.engine.decode_rows(rows)
        assert len({r.adapter for r in rows}) >= 3
        for (m, u, p), g in zip(plan, mixed):
            ref = st.runtime.method(m).generate(u, [p], s)[0]
            assert (g.text, g.n_tokens) == (ref.text, ref.n_tokens), (m, u.name, p)
    finally:
        st.runtime.scheduler.close()
        st.runtime.store.close()
