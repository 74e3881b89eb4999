"""What the page says is true (issue 36, "What the page says"): Explore scores only on items nothing of the style
saw, refuses non-numbers and clears what an earlier sweep showed; the Fit verdict says what the decoding does;
a member of the build's population is told so; Compare marks each column done when its own row ends. Library
level, on the tiny model (tests/conftest.py); what only the page shows is checked in tests/test_app.py."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from personalize.data import Item

from conftest import tiny_studio

PLANTED = "zanzibar quokkas juggle vermilion teapots at dawn"
WORDS = ("bus", "tea", "rain", "film", "shop", "walk", "game", "cake", "lamp", "boat")


@pytest.fixture(scope="module")
def studio(tiny_artifacts, tmp_path_factory):
    s = tiny_studio(tiny_artifacts, tmp_path_factory.mktemp("truth"))
    yield s
    s.store.close()


def planted_history(studio) -> list[Item]:
    """The newest item (held out first) is PLANTED; an older item repeats it (other case and spacing, its own
    prompt), so only the rule that sets repeats aside keeps it out of the fit."""
    p = studio.task.prompt
    return [Item(PLANTED, x=p("what the quokkas did this morning")),
            *[Item(f"ok so the {w} was fine i guess", x=p(f"a note about the {w}")) for w in WORDS],
            Item("  " + PLANTED.upper().replace(" ", "  "), x=p("another morning"))]


# ---------------------------------------------------------------- Explore

def test_explore_never_fits_or_decodes_with_a_held_out_item(studio, monkeypatch):
    """A planted held-out item is scored on (it is a gold) and reaches nothing else: not the items the style
    (λ, bias, memory) is fitted on, not the embedding that picks the cluster, not any prompt the model decodes,
    although the style retrieves the person's nearest items into the prompt (the held-out item's own prompt would
    retrieve it first)."""
    from personalize.card import decoding

    studio.save_history("planted", planted_history(studio), "tweets")
    cfg = studio.engine.cfg
    monkeypatch.setattr(studio.engine, "cfg", dataclasses.replace(
        cfg, style=dataclasses.replace(cfg.style, retrieval=True, memory=True, bias=True, fallback=False)))
    fitted, embedded, prompts = [], [], []
    fit, embed, generate = studio.engine.fit, studio.engine.embed, decoding.generate
    monkeypatch.setattr(studio.engine, "fit", lambda items, *a, **k: fitted.extend(items) or fit(items, *a, **k))
    monkeypatch.setattr(studio.engine, "embed", lambda items: embedded.extend(items) or embed(items))
    monkeypatch.setattr(decoding, "generate", lambda m, t, ps, *a, **k: prompts.extend(ps) or generate(m, t, ps, *a, **k))
    res = studio.explore("planted", [0.0, 1.0], n_holdout=2, s=studio.settings(max_new_tokens=4))

    assert res["golds"].count(PLANTED) == 1 and res["n_set_aside"] == 1 and res["n_fit"] == len(WORDS) - 1
    assert fitted and embedded and prompts
    seen = " ".join(f"{it.x} {it.y}" for it in fitted + embedded).casefold()
    assert "quokka" not in seen and "zanzibar" not in seen
    assert not any("zanzibar" in p.casefold() for p in prompts)
    retrieved = [p for p in prompts if "ok so the" in p]  # the rest's items did reach the prompts: retrieval ran
    assert retrieved


def test_explore_keeps_a_history_that_is_only_repeats_from_fitting(studio):
    """Held-out items repeated through the whole history leave nothing to fit on: said, not scored."""
    studio.save_history("echo", [Item(f"same words {i % 2}", x=studio.task.prompt(f"p {i}")) for i in range(8)],
                        "tweets")
    with pytest.raises(ValueError, match="repeating a held-out one"):
        studio.explore("echo", [1.0], n_holdout=2)


@pytest.mark.parametrize("text", ["nan, inf", "1, inf", "-inf", "0.5, NaN", "1e999"])
def test_explore_refuses_what_is_not_a_finite_strength(studio, text):
    with pytest.raises(ValueError, match="finite numbers >= 0"):
        studio.parse_alphas(text)
    with pytest.raises(ValueError, match="finite numbers >= 0"):
        studio.explore("planted", [float(v) for v in text.split(",")])


def test_a_refused_sweep_clears_the_last_results(studio):
    """The tab's handler: a refusal is the status line and empty plots and table, never an older sweep's."""
    from personalize.ui import explore

    out = explore.explore(studio, "planted", "nan, inf", 2, 1.0, 50, 4, progress=lambda *a, **k: None)
    assert out[0].startswith("⚠️") and "finite" in out[0] and out[1:] == (None, None, [])
    out = explore.explore(studio, "planted", "", 2, 1.0, 50, 4, progress=lambda *a, **k: None)
    assert out[0].startswith("⚠️") and out[1:] == (None, None, [])


# ---------------------------------------------------------------- membership

def test_a_newcomer_is_compared_with_the_build_s_people_as_if_they_were_new_too():
    """Every member alone in their cluster (K = n): k-means put each centre on its member, so their own distances
    are all 0. A newcomer a hair from a member was told "further than any of the build's people"; measured as
    if each member had been left out (their nearest other centre), the newcomer is close, and a member
    re-entering with the same writing is told they are one of the build's people."""
    from personalize.card.cluster import closeness, is_member, member_distances

    rng = np.random.default_rng(0)
    emb = rng.normal(size=(5, 8)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    centroids, labels = emb.copy(), np.arange(5)
    loo = member_distances(emb, centroids, labels)
    others = np.linalg.norm(emb[:, None] - emb[None], axis=-1) + np.eye(5) * 9
    assert np.allclose(loo, others.min(1), atol=1e-5) and (loo > 0.5).all()
    near = emb[2] + 0.01 * rng.normal(size=8).astype(np.float32)
    d = np.linalg.norm(centroids - near[None], axis=1)
    words, further = closeness(emb, centroids, labels, float(d.min()), member=is_member(emb, centroids, d))
    assert further == 1.0 and "close to its centre" in words and "far from every" not in words
    mine = np.linalg.norm(centroids - emb[2][None], axis=1)
    assert is_member(emb, centroids, mine) and not is_member(emb, centroids, d)
    words, _ = closeness(emb, centroids, labels, float(mine.min()), member=True)
    assert "one of this build's own people" in words
    # two members in one cluster: leaving one out moves the centre onto the other
    two = np.stack([emb[0], emb[1]])
    assert np.allclose(member_distances(two, two.mean(0, keepdims=True), np.zeros(2, int)),
                       np.linalg.norm(emb[0] - emb[1]), atol=1e-5)


def test_the_build_s_own_people_are_told_they_are_in_it(studio):
    """For every K and every member of the tiny build, their own distances read as one of the build's people;
    the demo writers saved in the studio (their writing near, not equal to, the build's) are never "far"."""
    c = studio.engine.clusters
    for k, cents in c.centroids.items():
        for e in c.embeddings:
            assert "one of this build's own people" in studio.closeness(k, np.linalg.norm(cents - e[None], axis=1))
    for user in c.users[:3]:
        res = studio.save_history(user, studio.demo_items(user), "tweets")
        assert res["closeness"] and "far from every" not in res["closeness"], res["closeness"]
