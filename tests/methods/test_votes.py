"""Votes refine a user's style: weighted rows, the refit, versions, before/after, Rate votes, the simulation."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from personalize.methods.card import onboard
from personalize.methods.card.style import UserStyle
from personalize.methods.card.adapters import adapter_name
from personalize.data import Item
from personalize.methods.card.votes import FeedbackSettings, SimulationSettings, Vote, simulate, split_person
from personalize.methods.card.head import VOTE_ITEM, PairData, TokenData

from conftest import tiny_studio
from personalize.methods.card.style import style_diagnostics

TERSE = [f"ok so the {w} was fine i guess" for w in ("bus", "tea", "rain", "film", "shop", "walk", "game", "cake")]


def _rows(n=6, k=4, seed=0, weight=None):
    g = torch.Generator().manual_seed(seed)
    return TokenData(torch.randn(n, 3, generator=g), torch.randint(0, 50, (n, k), generator=g),
                     torch.randn(n, k, generator=g), torch.randint(0, k, (n,), generator=g), weight)


def test_weighted_rows_raise_preferred_tokens_and_lower_rejected_ones():
    logits = torch.randn(6, 4, generator=torch.Generator().manual_seed(1))
    plain = _rows()
    assert torch.isclose(plain.loss(logits), F.cross_entropy(logits, plain.target))
    same = _rows(weight=torch.full((6,), 2.0))  # a uniform weight changes nothing (the loss is normalised)
    assert torch.isclose(same.loss(logits), plain.loss(logits))
    down = _rows(weight=torch.full((6,), -1.0))
    p = logits.softmax(-1).gather(1, down.target[:, None]).squeeze(1)
    assert torch.isclose(down.loss(logits), -torch.log1p(-p).mean(), atol=1e-6)
    both = TokenData.cat([plain, _rows(seed=2, weight=torch.full((6,), 3.0))])
    assert both.weight.tolist() == [1.0] * 6 + [3.0] * 6 and len(both) == 12


def test_vote_pairs_are_never_held_out():
    pairs = PairData([object()] * 3, [object()] * 3, [0, 1, 2])
    voted = pairs.with_votes([object()], [object()], 2.0)
    assert voted.items[-1] == VOTE_ITEM and voted.weight == [1.0, 1.0, 1.0, 2.0]
    held = voted.select(lambda i: i < 1)
    assert len(held) == 1 and held.weight == [1.0]
    with pytest.raises(ValueError, match="text"):
        Vote("p", None, " ")
    with pytest.raises(ValueError):
        FeedbackSettings(vote_weight=0)


@pytest.fixture(scope="module")
def studio(tiny_artifacts, tmp_path_factory):
    s = tiny_studio(tiny_artifacts, tmp_path_factory.mktemp("feedback"))
    yield s
    s.runtime.store.close()


def _score(studio, name, text, prompt, style):
    """The head's teacher-forced log-prob of `text` under the user's style (the rule decoding applies)."""
    stats = studio.runtime.store.vector(name, studio.runtime.engine.artifacts_id)[1]["stats"]
    eng = studio.runtime.engine
    eng.use_adapter(adapter_name(stats["k"], stats["cluster"]))
    rows = TokenData.from_features(onboard.features(eng, [Item(y=text, x=prompt)]))
    return style_diagnostics(eng.heads["tokens"], rows, style, [], eng.cfg.style, 1.0)["margin_own"]


def test_a_thumbs_up_refits_the_style_towards_the_text_as_a_new_version(studio, monkeypatch):
    # the style with its token bias, whatever the tiny build's decoding choice kept (λ alone barely moves here)
    cfg = studio.runtime.engine.cfg
    monkeypatch.setattr(studio.runtime.engine, "cfg", replace(cfg, style=replace(cfg.style, bias=True)))
    studio.histories.save_history("vic", [Item(y=t) for t in TERSE], "tweets")
    prompt = studio.runtime.task.prompt("the match")
    s = studio.runtime.settings(max_new_tokens=5)
    # a text the model wrote (as every column's is): its tokens are among the cluster model's candidates, which
    # is what the tokens head ranks (the tiny random model's candidates rarely hold a hand-written text's tokens)
    LIKED = next(studio.comparisons.compare("vic", studio.runtime.task.prompt("a parade"), ["cluster"], studio.runtime.settings(max_new_tokens=8))).text
    res = studio.votes.thumb("vic", True, s, prompt=prompt, text=LIKED)  # not fitted: the vote waits
    assert res.refit is None and "fit" in res.message.lower()
    studio.fits.fit("vic")  # the fit takes the vote already cast into account
    versions = studio.fits.versions("vic")
    assert [v["source"] for v in versions] == ["vote", "history"] and versions[0]["current"]
    assert versions[0]["votes"] == 1
    first = versions[1]["version"]
    old = UserStyle.from_stored(studio.runtime.store.version_style("vic", studio.runtime.engine.artifacts_id, first)[0])

    res = studio.votes.thumb("vic", True, s, prompt=prompt, text=LIKED)
    assert res.refit.version == studio.fits.versions("vic")[0]["version"] and res.refit.n_votes == 2
    assert res.before is not None and res.after is not None and "refitted" in res.message
    new = UserStyle.from_stored(studio.runtime.store.style("vic", studio.runtime.engine.artifacts_id))
    # the tiny head's U is ~0 after two epochs, so it is the token bias (fitted jointly with λ) that moves here
    changed = not np.allclose(new.lam, old.lam) or dict(zip(new.bias_ids.tolist(), new.bias.tolist())) != dict(
        zip(old.bias_ids.tolist(), old.bias.tolist()))
    assert changed
    # the preferred text is likelier under the refined style than under the history-only one
    assert _score(studio, "vic", LIKED, prompt, new) > _score(studio, "vic", LIKED, prompt, old) + 0.05
    # its memory is still the history's (votes train λ and the bias only)
    assert np.array_equal(new.values, old.values)

    # a thumbs down lowers the text again
    down = studio.votes.thumb("vic", False, s, prompt=prompt, text=LIKED)
    lowered = UserStyle.from_stored(studio.runtime.store.style("vic", studio.runtime.engine.artifacts_id))
    assert down.refit.n_votes == 3 and _score(studio, "vic", LIKED, prompt, lowered) < _score(studio, "vic", LIKED, prompt, new)

    # any version can be restored; restoring adds no version, it moves "current"
    n = len(studio.fits.versions("vic"))
    msg = studio.fits.restore("vic", first)
    assert str(first) in msg and len(studio.fits.versions("vic")) == n
    assert np.array_equal(UserStyle.from_stored(studio.runtime.store.style("vic", studio.runtime.engine.artifacts_id)).lam, old.lam)
    assert [v["version"] for v in studio.fits.versions("vic") if v["current"]] == [first]
    with pytest.raises(ValueError, match="no version"):
        studio.fits.restore("vic", 10_000)


def test_before_and_after_are_cards_outputs_with_the_old_and_new_style(studio):
    studio.histories.save_history("wen", [Item(y=t) for t in TERSE], "tweets")
    studio.fits.fit("wen")
    s = studio.runtime.settings(alpha=3.0, max_new_tokens=6)
    prompt = studio.runtime.task.prompt("the storm")
    shown = next(studio.comparisons.compare("wen", prompt, ["card"], s)).text
    liked = next(studio.comparisons.compare("wen", prompt, ["base"], s)).text
    res = studio.votes.thumb("wen", True, s, prompt=prompt, text=liked, before=shown)
    assert res.before == shown
    again = next(studio.comparisons.compare("wen", prompt, ["card"], s)).text
    assert res.after == again  # what Compare shows from now on


def test_a_rate_vote_on_a_users_pair_refines_their_style_in_the_background(studio):
    studio.histories.save_history("xia", [Item(y=t) for t in TERSE], "tweets")
    studio.fits.fit("xia")
    s = studio.runtime.settings(alpha=2.0, max_new_tokens=5)
    drawn = studio.votes.new_pair("xia", studio.runtime.task.prompt("we won"), ["base", "card"], s).pair
    # the tiny model may write the same text twice (no decided vote): the pair is opened again with two texts
    # that differ, as a rater sees them, so that the vote is always a decided one
    other = drawn.outputs[1] + " (edited)" if drawn.outputs[0].strip() == drawn.outputs[1].strip() else drawn.outputs[1]
    pair = studio.runtime.arena.open("xia", drawn.prompt, drawn.methods, (drawn.outputs[0], other), settings=drawn.settings)
    n = len(studio.fits.versions("xia"))
    studio.votes.vote(pair.id, "b", "rater-x")
    studio.votes.wait_feedback()
    rows = studio.runtime.store.feedback("xia")
    assert len(rows) == 1 and rows[0]["source"] == "rate" and rows[0]["preferred"] == pair.outputs[1]
    assert rows[0]["other"] == pair.outputs[0] and rows[0]["rating"] is not None
    versions = studio.fits.versions("xia")
    assert len(versions) == n + 1 and versions[0]["source"] == "vote"


def test_simulated_votes_give_a_curve_per_checkpoint(studio, tiny_artifacts):
    from personalize.data import read_lamp

    _, queries = read_lamp(tiny_artifacts["demo"], "dev")
    s = SimulationSettings(checkpoints=(0, 2), n_eval=2, n_vote=3)
    q = queries[0]
    evals, pool, history = split_person(list(q.profile), q.input, q.gold, s)
    assert evals[0].y == q.gold and len(pool) == 3 and len(history) == len(q.profile) - 4
    eng = studio.runtime.engine
    people = [(q.user, eng.prepare_items(q.profile), q.input, q.gold) for q in queries[:2]]
    res = simulate(eng, people, s, decoding=studio.runtime.settings(max_new_tokens=4))
    assert [c["votes"] for c in res["curve"]] == [0, 2] and len(res["people"]) + len(res["skipped"]) == 2
    person = res["people"][0]
    assert person["points"][0]["votes"] == 0 and person["points"][1]["votes"] <= 2
    assert "rougeL_eval @2 - @0" in res["differences"]


def test_a_person_who_voted_gets_their_style_even_where_it_lost_on_held_out_items():
    from personalize.store import decodes_own
    from personalize.studio.fits import fit_verdict

    lost = {"helps": False, "acc_own": 0.30, "acc_no_head": 0.40}
    assert decodes_own({"diagnostics": lost}) is False  # the fallback applies (CARD shows the cluster model)
    assert decodes_own({"diagnostics": lost, "n_votes": 2}) is True  # the votes ask for the person's own style
    assert "2 votes ask for it" in fit_verdict(lost, n_votes=2) and "30% vs 40%" in fit_verdict(lost, n_votes=2)


@pytest.fixture(scope="module")
def pairs_studio(tiny_artifacts, tmp_path_factory):
    """The tiny population built again with the pairs head first (votes become pairs for it)."""
    from dataclasses import replace

    from personalize.methods.card.build import build
    from personalize.methods.artifacts import artifacts_meta
    from personalize.methods.card.config import CardConfig

    root = tmp_path_factory.mktemp("pairs")
    cfg = CardConfig.from_dict(artifacts_meta(tiny_artifacts["artifacts"])["settings"])
    cfg = replace(cfg, objectives=("pairs",), head=replace(cfg.head, objective="pairs"), ks=(1, 2))
    out = build(tiny_artifacts["demo"], "dev", root / "artifacts", cfg, p2p=None)
    s = tiny_studio({**tiny_artifacts, "artifacts": out}, root)
    yield s
    s.runtime.store.close()


def test_a_pair_heads_vote_is_a_pair_and_refits_lambda(pairs_studio):
    studio = pairs_studio
    studio.histories.save_history("yun", [Item(y=t) for t in TERSE], "tweets")
    studio.fits.fit("yun")
    s = studio.runtime.settings(alpha=2.0, max_new_tokens=5)
    prompt = studio.runtime.task.prompt("the match")
    before = UserStyle.from_stored(studio.runtime.store.style("yun", studio.runtime.engine.artifacts_id))
    res = studio.votes.thumb("yun", True, s, prompt=prompt, text="ok so the match was fine i guess")
    assert res.refit is not None and res.refit.n_votes == 1 and res.refit.diagnostics.get("unit") != "tokens"
    after = UserStyle.from_stored(studio.runtime.store.style("yun", studio.runtime.engine.artifacts_id))
    assert after.helps is True and len(after.bias_ids) == 0  # a pair head has λ only
    if studio.runtime.engine.heads["pairs"].U.abs().sum() > 0:  # φ = 0 for an untrained U: no pair can move λ then
        assert not np.array_equal(after.lam, before.lam)
    stats = studio.runtime.store.vector("yun", studio.runtime.engine.artifacts_id)[1]["stats"]
    assert stats["objective"] == "pairs" and stats["n_votes"] == 1
    assert [v["source"] for v in studio.fits.versions("yun")][:1] == ["vote"]
