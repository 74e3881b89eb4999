"""Evaluation as held-out people really are: sources left out of the build, paired bootstrap intervals,
the shuffled-style control, and decoding settings chosen on validation people (tune)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from personalize.methods.card import onboard
from personalize.data import select_sources
from personalize.data import Query, read_lamp, write_lamp
from personalize.methods.engine import Engine
from personalize.eval.evaluate import paired_differences, run_eval, shuffled_partners
from personalize.metrics import Repeat, copy_aware, repeated_text, rouge_per_query
from personalize.methods.card.tune import choose_decoding, save_choice
from personalize.methods.card import card_decode


def test_shuffled_partners_stay_in_the_cluster_and_never_pick_oneself():
    clusters = [0, 0, 0, 1, 1, 2, 0, 1]
    for seed in range(20):
        p = shuffled_partners(clusters, seed)
        assert all(p[i] != i for i in range(len(clusters)))
        assert all(clusters[p[i]] == clusters[i] for i in range(len(clusters)) if clusters.count(clusters[i]) > 1)
    assert shuffled_partners([3], 0) == [0]  # alone: nobody to swap with


def test_paired_bootstrap_interval_brackets_the_mean_and_sees_a_sure_gain():
    rng = np.random.default_rng(0)
    cluster = rng.uniform(0, 0.5, 200)
    per_query = {"cluster": list(cluster), "card": list(cluster + 0.05 + rng.normal(0, 0.01, 200)),
                 "base": list(cluster + rng.normal(0, 0.2, 200))}
    d = paired_differences(per_query, n_boot=500)
    gain = d["card - cluster"]
    assert gain["ci95"][0] > 0 and gain["ci95"][0] <= gain["mean"] <= gain["ci95"][1]
    assert gain["wins"] + gain["losses"] == 200
    noise = d["cluster - base"]
    assert noise["ci95"][0] < 0 < noise["ci95"][1]  # no difference: the interval straddles 0
    assert "card - bm25_copy" not in d  # only pairs of methods that were run


def test_a_past_text_handed_back_scores_nothing_unless_it_is_the_answer():
    past = ["Fix typo in README", "Bump version to 1.18.2", "Add support for HTTP/3"]
    assert repeated_text("fix typo in readme.", past) == Repeat(0, True)  # case and punctuation aside
    assert repeated_text("Bump version to 1.18.3", past) == Repeat(1, False)  # within ROUGE-L 0.8
    assert repeated_text("Add retries to the proxy pool", past) is None and repeated_text("", past) is None
    assert repeated_text("Add support for HTTP/3\nand a second line", past) == Repeat(2, True)  # a line handed back
    golds = ["Fix typo in the docs", "Bump version to 1.18.2", "Add support for HTTP/3 proxies"]
    outs = ["Fix typo in README", "bump version to 1.18.2", "Add HTTP/3 proxies"]
    res = copy_aware(outs, golds, [past] * 3)
    raw = rouge_per_query(outs, golds)
    assert raw[0] > 0.4 and res["per_query"][0] == 0.0  # a copy that is not the answer is a miss, not a hit
    assert res["per_query"][1] == raw[1] == 1.0  # a repeat that is the answer stays a hit
    assert res["per_query"][2] == raw[2] > 0  # new text is scored as ROUGE-L scores it
    assert res["repeats"] == res["repeats_near"] == pytest.approx(2 / 3)


def test_sources_select_and_unknown_sources_are_refused():
    qs = [Query(str(i), "x", (), "g", f"u{i}", src) for i, src in enumerate(["a/a", "b/b", "a/a", None])]
    assert [q.id for q in select_sources(qs, ["a/a"])] == ["0", "2"]
    assert [q.id for q in select_sources(qs, exclude=["a/a"])] == ["1", "3"]
    with pytest.raises(ValueError, match="unknown sources"):
        select_sources(qs, ["c/c"])


@pytest.fixture(scope="module")
def engine(tiny_artifacts):
    return Engine.load(tiny_artifacts["artifacts"])


@pytest.fixture(scope="module")
def two_sources(tiny_artifacts, tmp_path_factory):
    """The demo's users relabelled as coming from two sources, as a LaMP folder with a meta file."""
    task, qs = read_lamp(tiny_artifacts["demo"], "dev")
    qs = [replace(q, source="left/out" if i % 3 == 0 else "built/in") for i, q in enumerate(qs)]
    folder = tmp_path_factory.mktemp("sources")
    write_lamp(folder, "dev", task, qs)
    return folder, [q for q in qs if q.source == "left/out"]


def test_eval_scores_only_the_left_out_source_with_intervals_and_both_specificities(engine, two_sources):
    folder, left_out = two_sources
    methods = ["base", "cluster", "card", "card_paper", "card_bias", "card_knn", "card_rag", "card_shuffled",
               "bm25_copy"]
    res = run_eval(engine, folder, "dev", methods, sources=["left/out"], n_boot=200)
    assert res["settings"]["n"] == len(left_out) and res["settings"]["sources"] == ["left/out"]
    assert {p["source"] for p in res["predictions"]} == {"left/out"}
    assert set(res["methods"]) == set(methods) and all("looping" in v for v in res["methods"].values())
    for pair in ("card - cluster", "cluster - base", "card - card_shuffled", "card - bm25_copy"):
        d = res["differences"][pair]
        assert d["n"] == len(left_out) and d["ci95"][0] <= d["mean"] <= d["ci95"][1]
    assert set(res["specificity"]) == {"decoded_rougeL_copy_aware", "decoded_rougeL", "teacher_forced"}
    for m in methods:  # every method's copying beside its ROUGE-L, and the copy-aware differences with intervals
        assert {"rougeL_copy_aware", "repeats", "repeats_near"} <= set(res["methods"][m])
        assert res["methods"][m]["rougeL_copy_aware"] <= res["methods"][m]["rougeL"] + 1e-9
    assert res["differences_copy_aware"]["card - cluster"]["n"] == len(left_out)
    assert set(res["golds"]) == {"repeats", "repeats_near"}
    copied = res["methods"]["bm25_copy"]  # the floor hands back a past text every time: every output a repeat
    assert copied["repeats"] == 1.0 and all(p["bm25_copy_repeats"] for p in res["predictions"])
    scores = {m: res["methods"][m]["rougeL"] for m in ("card", "card_shuffled")}
    assert res["specificity"]["decoded_rougeL"] == pytest.approx(scores["card"] - scores["card_shuffled"], abs=1e-3)


def test_tune_chooses_on_validation_people_and_the_build_reads_the_choice_back(engine, tiny_artifacts, tmp_path):
    import shutil

    folder = tmp_path / "art"
    shutil.copytree(tiny_artifacts["artifacts"], folder)
    eng = Engine.load(folder)
    task, qs = read_lamp(tiny_artifacts["demo"], "dev")
    people = qs[:3]
    items = [eng.prepare_items(list(q.profile[:6])) for q in people]
    fits = [onboard.fit(eng, its) for its in items]
    eng, report = choose_decoding(eng, [q.input for q in people], [q.gold for q in people], fits, items)
    assert {"repetition", "style", "alpha", "fallback", "chosen_decoding", "chosen_style"} <= set(report)
    assert report["style"]["chosen"] in report["style"]["sweep"]
    assert report["alpha"]["chosen"] == str(report["guard"]["alpha_chosen"])  # then the harm guard's verdict:
    assert eng.cfg.decoding.alpha == (report["guard"]["alpha_chosen"] if report["guard"]["kept"] else 0.0)
    save_choice(folder, eng, report)
    meta = json.loads((folder / "config.json").read_text())
    assert meta["format_version"] == 2 and meta["report"]["tune"]["users"] == 3
    again = Engine.load(folder)
    assert again.cfg.decoding == eng.cfg.decoding and again.cfg.style == eng.cfg.style


def test_a_person_beyond_every_cluster_is_fitted_with_their_own_memory(engine, tiny_artifacts, monkeypatch):
    """is_far reads the build's own people (cluster.closeness); a far person's fit keeps their memory at
    StyleSettings.far_knn_weight and says so in its stats, a near person's follows the build's style."""
    k = engine.cfg.default_k
    c = engine.clusters
    assert onboard.is_far(engine, k, [1e6] * k) and not onboard.is_far(engine, k, [0.0] * k)
    task, qs = read_lamp(tiny_artifacts["demo"], "dev")
    items = engine.prepare_items(list(qs[0].profile[:8]))
    cfg = engine.cfg
    engine.cfg = replace(cfg, style=replace(cfg.style, memory=False, far_knn_weight=0.2))
    try:
        monkeypatch.setattr(onboard, "is_far", lambda e, k_, d: True)
        far = onboard.fit(engine, items)
        monkeypatch.setattr(onboard, "is_far", lambda e, k_, d: False)
        near = onboard.fit(engine, items)
    finally:
        engine.cfg = cfg
    assert far.far and far.stats()["far"] and far.style.knn_weight == 0.2 and len(far.style.values)
    assert not near.far and near.style.knn_weight is None and not len(near.style.values)
    assert c.centroids[k].shape[0] == k


def test_card_falls_back_with_a_note_and_retrieves_only_for_its_own_rows(engine, tiny_artifacts, monkeypatch):
    """A style that lost to the cluster model on its held-out items decodes as the cluster model (its plain prompt,
    a note saying so) when fallback is on; a retrieving style puts the person's items before the prompt."""
    from personalize.methods.card.style import UserStyle

    task, qs = read_lamp(tiny_artifacts["demo"], "dev")
    items = engine.prepare_items(list(qs[0].profile[:6]))
    fit = onboard.fit(engine, items)
    prompt = qs[0].input
    lost = replace(fit.style, helps=False)
    cfg = engine.cfg
    try:
        engine.cfg = replace(cfg, style=replace(cfg.style, fallback=True, retrieval=True),
                             decoding=replace(cfg.decoding, alpha=1.0))  # α > 0: at 0 nothing of the style is used
        seen = []
        real = card_decode.retrieval_prompts
        monkeypatch.setattr(card_decode, "retrieval_prompts",
                            lambda eng, its, ps, b: seen.append(list(ps)) or real(eng, its, ps, b))
        cluster = card_decode.generate(engine, [prompt], "cluster", fit.cluster)[0]
        back = card_decode.generate(engine, [prompt], "card", fit.cluster, lost, items=items)[0]
        assert back.note and back.text == cluster.text and seen == []  # no retrieval for a fallback row
        kept = card_decode.generate(engine, [prompt], "card", fit.cluster, replace(lost, helps=True), items=items)[0]
        assert kept.note is None and seen == [[prompt]]
        built, _, chosen = real(engine, items, [prompt], engine.cfg.budget)
        assert kept.trace == chosen[0] and chosen[0][0]["retrieved"]  # which items: Compare shows them
        assert built[0].endswith(prompt) and any(it.y in built[0] for it in items)
        paper = card_decode.generate(engine, [prompt], "card_paper", fit.cluster, lost, items=items)[0]
        assert paper.note is None and len(seen) == 1  # card_paper: λ alone, no fallback, no retrieval
        row, = card_decode.rows(engine, [prompt], "card", fit.cluster, replace(lost, helps=True), items=items)
        assert row.trace == chosen[0] and row.prompt == built[0]  # the mixed batch's row: the same items, said
        assert isinstance(lost, UserStyle)
    finally:
        engine.cfg = cfg


def test_eval_says_who_it_scored_as_a_cluster_of_one(engine, two_sources, monkeypatch):
    """Each prediction says whether its person was a cluster of one (their own adapter, card over it), so that a
    study reads the far and the near people's figures apart from the run itself."""
    folder, _ = two_sources
    monkeypatch.setattr(engine, "cfg", replace(engine.cfg, own=replace(engine.cfg.own, far=True)))  # --own-adapters-for-far
    for far in (True, False):
        monkeypatch.setattr(onboard, "is_far", lambda e, k, d, far=far: far)
        res = run_eval(engine, folder, "dev", ["cluster", "card"], sources=["left/out"], limit=2, n_boot=10)
        assert [p["own"] for p in res["predictions"]] == [far, far], res["predictions"]


def test_eval_reports_each_golds_log_prob_under_each_methods_own_rows(engine, two_sources):
    """The low-noise figure beside ROUGE: base's equals a plain forward pass with every adapter off, OPPU's is
    read through the person's own LoRA (so it differs from the cluster model's), and a method without one
    distribution over the gold says why."""
    import torch

    from personalize.lm.tokens import prompt_ids, target_ids

    folder, left_out = two_sources
    res = run_eval(engine, folder, "dev", ["base", "cluster", "card", "oppu", "bm25_copy"], sources=["left/out"],
                   limit=3, n_boot=100, method_configs={"oppu": {"epochs": 2, "max_steps": 2, "report_loss": False}})
    lp = res["gold_logprob"]
    assert all(isinstance(lp[m], float) and lp[m] < 0 for m in ("base", "cluster", "card", "oppu"))
    assert "no model" in lp["bm25_copy"]["none"]
    first = res["predictions"][0]
    q = next(q for q in left_out if q.id == first["id"])
    budget = engine.cfg.budget
    ids, target = prompt_ids(engine.tok, q.input, budget), target_ids(engine.tok, q.gold, budget)
    with torch.no_grad(), engine.model.disable_adapter():
        logits = engine.model(input_ids=torch.tensor([ids + target])).logits[0, len(ids) - 1:-1].float()
    plain = logits.log_softmax(-1).gather(1, torch.tensor(target)[:, None]).mean().item()
    assert first["base_gold_logprob"] == pytest.approx(plain, abs=1e-3)
    assert any(p["oppu_gold_logprob"] != p["cluster_gold_logprob"] for p in res["predictions"])
    assert "card - oppu" in res["gold_logprob_differences"] and "card - oppu" in res["differences"]


# ---------------------------------------------------------------- α = 0 is the cluster model (issue 36)

ZERO_CHECKS = {"defaults": {}, "a penalty after a narrow top-k": {"top_k": 2, "repetition_penalty": 3.0}}


@pytest.mark.parametrize("changes", list(ZERO_CHECKS.values()), ids=list(ZERO_CHECKS))
def test_every_card_method_at_alpha_zero_decodes_as_the_cluster_model(engine, tiny_artifacts, changes):
    """People with a fitted style that has a bias and a memory, and a build style that retrieves and never falls back: at α = 0 every CARD method's rows, in one mixed batch with the
    cluster rows, and each method's own generate give the cluster model's tokens. The narrow top-k with a strong
    penalty is where the old α = 0 (CARD's top-k kept, then the penalty) chose other tokens."""
    from personalize.catalog import CARD_METHODS

    task, qs = read_lamp(tiny_artifacts["demo"], "dev")
    cfg = engine.cfg
    s = replace(cfg.decoding, alpha=0.0, max_new_tokens=8, **changes)
    engine.cfg = replace(cfg, style=replace(cfg.style, bias=True, memory=True, retrieval=True, fallback=False))
    try:
        people = []
        for q in qs[:3]:
            items = engine.prepare_items(list(q.profile[:8]))
            fit = onboard.fit(engine, items)
            assert len(fit.style.values)  # the memory of the person's tokens
            rng = np.random.default_rng(len(people))  # λ and a bias planted (the tiny model's fit leaves both flat)
            ids = np.unique(np.concatenate([fit.style.values, rng.integers(0, len(engine.tok), 64)]))
            style = replace(fit.style, lam=rng.normal(1, 2, len(fit.style.lam)).astype(np.float32), bias_ids=ids,
                            bias=rng.normal(0, 4, len(ids)).astype(np.float32), helps=True)
            people.append((q.input, fit, style, items))
        rows = [card_decode.rows(engine, [p], "cluster", f.cluster, k=f.k, settings=s)[0] for p, f, _, _ in people]
        for m in CARD_METHODS:
            rows += [card_decode.rows(engine, [p], m, f.cluster, st, k=f.k, settings=s, items=it)[0]
                     for p, f, st, it in people]
        gens = engine.decode_rows(rows)
        n = len(people)
        cluster = [g.text for g in gens[:n]]
        assert len(set(cluster)) > 1 and all(cluster)
        for j, m in enumerate(CARD_METHODS):
            assert [g.text for g in gens[(j + 1) * n: (j + 2) * n]] == cluster, m
        for m in CARD_METHODS:
            alone = [card_decode.generate(engine, [p], m, f.cluster, st, k=f.k, settings=s, items=it)[0].text
                     for p, f, st, it in people]
            assert alone == [card_decode.generate(engine, [p], "cluster", f.cluster, k=f.k, settings=s)[0].text
                             for p, f, _, _ in people], m
        on = [card_decode.generate(engine, [p], "card", f.cluster, st, k=f.k, settings=replace(s, alpha=1.0),
                                   items=it)[0].text for p, f, st, it in people]
        assert on != cluster  # the same people's styles do move the output when α is not 0
    finally:
        engine.cfg = cfg


def test_eval_at_alpha_zero_gives_every_card_method_the_cluster_models_outputs(tiny_artifacts, tmp_path):
    """`eval --alpha 0` on a build whose style retrieves the person's items and never falls back: every person's
    card and CARD-variant outputs are the cluster model's."""
    import shutil

    from personalize.catalog import CARD_METHODS
    from personalize.cli import main

    art = tmp_path / "art"
    shutil.copytree(tiny_artifacts["artifacts"], art)
    meta = json.loads((art / "config.json").read_text())
    meta["settings"]["style"] |= {"retrieval": True, "fallback": False}
    (art / "config.json").write_text(json.dumps(meta))
    out = tmp_path / "eval.json"
    methods = ["cluster", *CARD_METHODS]
    assert main(["eval", "--artifacts", str(art), "--data", str(tiny_artifacts["demo"]), "--alpha", "0", "--limit",
                 "4", "--methods", ",".join(methods), "--json", str(out)]) in (0, None)
    res = json.loads(out.read_text())
    assert res["settings"]["alpha"] == 0.0 and res["settings"]["style"]["retrieval"]
    for p in res["predictions"]:
        assert all(p[m] == p["cluster"] for m in CARD_METHODS), p
