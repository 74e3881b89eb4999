"""The harm guard (issue 23): a build never ships a `card` that did not beat the cluster model on its validation
people; tested on the rule's own numbers and on the tiny build with a harmful α."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np

from personalize.methods.card import onboard
from personalize.data import read_lamp
from personalize.methods.engine import Engine
from personalize.methods.card.tune import MIN_PEOPLE, guard_verdict, harm_guard


def test_the_guard_keeps_card_only_when_its_gain_is_above_noise():
    rng = np.random.default_rng(0)
    cluster = rng.uniform(0.1, 0.3, 40)
    better = guard_verdict(cluster + 0.05 + rng.normal(0, 0.02, 40), cluster, alpha=1.0)
    assert better["kept"] and better["alpha"] == 1.0 and better["card_minus_cluster"]["ci95"][0] > 0
    noisy = guard_verdict(cluster + rng.normal(0.005, 0.1, 40), cluster, alpha=1.0)
    assert not noisy["kept"] and noisy["alpha"] == 0.0 and "not above 0" in noisy["why"]
    worse = guard_verdict(cluster - 0.05, cluster, alpha=2.0)
    assert not worse["kept"] and worse["alpha_chosen"] == 2.0 and worse["alpha"] == 0.0
    few = guard_verdict(cluster[:6] + 0.1, cluster[:6], alpha=1.0)  # six people can pass, but the build says so
    assert few["people"] == 6 and f"fewer than the {MIN_PEOPLE} wanted" in few["why"]
    assert not guard_verdict(cluster + 0.1, cluster, alpha=0.0)["kept"]  # α = 0 is the cluster model already


def test_a_harmful_alpha_is_refused_on_the_tiny_build(tiny_artifacts):
    """People whose real texts are what the cluster model writes: α = 60 steers card away from them (a random
    tiny model has no better notion of a person's text), so the guard must fall back to the cluster model."""
    from personalize.eval.evaluate import decode_people

    engine = Engine.load(tiny_artifacts["artifacts"])
    engine.cfg = replace(engine.cfg, decoding=replace(engine.cfg.decoding, alpha=60.0, max_new_tokens=8),
                         style=replace(engine.cfg.style, fallback=False))
    _, queries = read_lamp(tiny_artifacts["demo"], "dev")
    people = [q for q in queries if q.gold and len(q.profile) >= 3][:8]
    items = [engine.prepare_items(list(q.profile)) for q in people]
    fits = [onboard.fit(engine, it) for it in items]
    prompts = [q.input for q in people]
    golds = decode_people(engine, "cluster", prompts, fits, [f.style for f in fits], items)
    card = decode_people(engine, "card", prompts, fits, [f.style for f in fits], items)
    assert sum(c != g for c, g in zip(card, golds)) >= 4  # α = 60 does change the text
    engine, verdict = harm_guard(engine, prompts, golds, fits, items)
    assert not verdict["kept"] and verdict["alpha_chosen"] == 60.0, verdict
    assert engine.cfg.decoding.alpha == 0.0 and "cluster model" in verdict["why"]


def test_the_build_reports_its_guard(tiny_artifacts):
    """The build's own decoding choice ran the guard, on validation people it counted, and shipped its α."""
    meta = json.loads((tiny_artifacts["artifacts"] / "config.json").read_text())
    guard = meta["report"]["tune"]["guard"]
    assert guard["people"] >= 1 and guard["why"]
    assert meta["settings"]["decoding"]["alpha"] == guard["alpha"]
    assert guard["alpha"] == 0.0 or guard["card_minus_cluster"]["ci95"][0] > 0
    chose = meta["report"]["validation_people"]  # by name, so the studio offers others as its newcomers
    assert len(chose) == guard["people"] and len(set(chose)) == len(chose)


def test_each_setting_is_decoded_once_and_the_choice_is_the_same(tiny_artifacts):
    """The choice revisits settings (α = 1 after the style step, the fallback off, the guard's pair); decoding
    each once must give the very report that decoding every option afresh gives, with fewer decodes."""
    from personalize.methods.card.tune import Trials, choose_decoding, decode_each

    class Afresh(Trials):
        def texts(self, method):
            self.decodes += 1
            return decode_each(self.engine, method, self.prompts, self.fits, self.items, self.engine.cfg.decoding)

    engine = Engine.load(tiny_artifacts["artifacts"])
    engine.cfg = replace(engine.cfg, decoding=replace(engine.cfg.decoding, max_new_tokens=6))
    start = engine.cfg
    _, queries = read_lamp(tiny_artifacts["demo"], "dev")
    people = [q for q in queries if q.gold and len(q.profile) >= 3][:6]
    items = [engine.prepare_items(list(q.profile)) for q in people]
    fits = [onboard.fit(engine, it) for it in items]
    prompts, golds = [q.input for q in people], [q.gold for q in people]
    runs = {}
    for name, cls in (("once", Trials), ("afresh", Afresh)):
        engine.cfg = start
        dec = cls(engine, prompts, golds, fits, items)
        engine, report = choose_decoding(engine, prompts, golds, fits, items, decoder=dec)
        runs[name] = (report, engine.cfg, dec.decodes)
    assert runs["once"][0] == runs["afresh"][0] and runs["once"][1] == runs["afresh"][1]
    assert runs["once"][2] < runs["afresh"][2], (runs["once"][2], runs["afresh"][2])


def test_each_kind_is_judged_on_its_own_kind(tiny_artifacts, monkeypatch):
    """Validation people beyond the build's clusters never choose the near people's settings or trip their guard;
    they judge the own adapters (a cluster of one), each trained for them and decoded over, and a loss switches
    those off for far people alone."""
    import personalize.methods.card.tune as tune

    engine = Engine.load(tiny_artifacts["artifacts"])
    engine.cfg = replace(engine.cfg, decoding=replace(engine.cfg.decoding, max_new_tokens=4),
                         own=replace(engine.cfg.own, steps=1, far=True))  # a build with --own-adapters-for-far
    _, queries = read_lamp(tiny_artifacts["demo"], "dev")
    people = [q for q in queries if q.gold and len(q.profile) >= 3][:6]
    items = [engine.prepare_items(list(q.profile)) for q in people]
    fits = [onboard.fit(engine, it) for it in items]
    for f in fits[:3]:
        f.far = True
    prompts, golds = [q.input for q in people], [q.gold for q in people]
    seen = []
    real_guard = tune.harm_guard
    monkeypatch.setattr(tune, "harm_guard", lambda e, p, *rest, **kw: (seen.append(list(p)), real_guard(e, p, *rest, **kw))[1])
    monkeypatch.setattr(tune, "FAR_MIN_PEOPLE", 2)
    trained = []
    real_train = engine.own.train
    monkeypatch.setattr(engine.own, "train", lambda name, *a, **kw: (trained.append(name), real_train(name, *a, **kw))[1])
    engine, report = tune.choose_decoding(engine, prompts, golds, fits, items, steps=("fallback",))
    assert seen == [prompts[3:]] and report["users"] == 3 and report["far_users"] == 3
    assert trained == ["validation 0", "validation 1", "validation 2"]
    own = report["own"]
    assert own["people"] == 3 and own["why"].startswith("own adapters")
    assert engine.cfg.own.far == own["kept"] == (own["card_minus_cluster"]["ci95"][1] >= 0)
    assert not list(engine.own.folder.glob("*.own.safetensors"))  # the validation people's adapters are scratch
    monkeypatch.setattr(tune, "FAR_MIN_PEOPLE", 10)  # too few to judge: the product's default stands, no training
    trained.clear()
    _, few = tune.own_guard(engine, prompts[:3], golds[:3], fits[:3], items[:3])
    assert few["kept"] and "fewer than the 10" in few["why"] and not trained
