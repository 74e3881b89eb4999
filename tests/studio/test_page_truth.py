"""What the page says is true (issue 36, "What the page says"): Explore scores only on items nothing of the style
saw, refuses non-numbers and clears what an earlier sweep showed; the Fit verdict says what the decoding does;
a member of the build's population is told so; Compare marks each column done when its own row ends. Library
level, on the tiny model (tests/conftest.py); what only the page shows is checked in tests/ui/test_app.py."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from personalize.methods.card import onboard
from personalize.data import Item

from conftest import tiny_studio

PLANTED = "zanzibar quokkas juggle vermilion teapots at dawn"
WORDS = ("bus", "tea", "rain", "film", "shop", "walk", "game", "cake", "lamp", "boat")


@pytest.fixture(scope="module")
def studio(tiny_artifacts, tmp_path_factory):
    s = tiny_studio(tiny_artifacts, tmp_path_factory.mktemp("truth"))
    yield s
    s.runtime.store.close()


def planted_history(studio) -> list[Item]:
    """The newest item (held out first) is PLANTED; an older item repeats it (other case and spacing, its own
    prompt), so only the rule that sets repeats aside keeps it out of the fit."""
    p = studio.runtime.task.prompt
    return [Item(PLANTED, x=p("what the quokkas did this morning")),
            *[Item(f"ok so the {w} was fine i guess", x=p(f"a note about the {w}")) for w in WORDS],
            Item("  " + PLANTED.upper().replace(" ", "  "), x=p("another morning"))]


# ---------------------------------------------------------------- Explore

def test_explore_never_fits_or_decodes_with_a_held_out_item(studio, monkeypatch):
    """A planted held-out item is scored on (it is a gold) and reaches nothing else: not the items the style
    (λ, bias, memory) is fitted on, not the embedding that picks the cluster, not any prompt the model decodes,
    although the style retrieves the person's nearest items into the prompt (the held-out item's own prompt would
    retrieve it first)."""
    from personalize.serving import generation

    studio.histories.save_history("planted", planted_history(studio), "tweets")
    cfg = studio.runtime.engine.cfg
    monkeypatch.setattr(studio.runtime.engine, "cfg", dataclasses.replace(
        cfg, style=dataclasses.replace(cfg.style, retrieval=True, memory=True, bias=True, fallback=False)))
    fitted, embedded, prompts = [], [], []
    fit, embed, generate = onboard.fit, studio.runtime.engine.embed, generation.generate
    monkeypatch.setattr(onboard, "fit", lambda e, items, *a, **k: fitted.extend(items) or fit(e, items, *a, **k))
    monkeypatch.setattr(studio.runtime.engine, "embed", lambda items: embedded.extend(items) or embed(items))
    monkeypatch.setattr(generation, "generate", lambda m, t, ps, *a, **k: prompts.extend(ps) or generate(m, t, ps, *a, **k))
    res = studio.explorer.explore("planted", [0.0, 1.0], n_holdout=2, s=studio.runtime.settings(max_new_tokens=4))

    assert res.golds.count(PLANTED) == 1 and res.n_set_aside == 1 and res.n_fit == len(WORDS) - 1
    assert fitted and embedded and prompts
    seen = " ".join(f"{it.x} {it.y}" for it in fitted + embedded).casefold()
    assert "quokka" not in seen and "zanzibar" not in seen
    assert not any("zanzibar" in p.casefold() for p in prompts)
    retrieved = [p for p in prompts if "ok so the" in p]  # the rest's items did reach the prompts: retrieval ran
    assert retrieved


def test_explore_keeps_a_history_that_is_only_repeats_from_fitting(studio):
    """Held-out items repeated through the whole history leave nothing to fit on: said, not scored."""
    studio.histories.save_history("echo", [Item(f"same words {i % 2}", x=studio.runtime.task.prompt(f"p {i}")) for i in range(8)],
                        "tweets")
    with pytest.raises(ValueError, match="repeating a held-out one"):
        studio.explorer.explore("echo", [1.0], n_holdout=2)


@pytest.mark.parametrize("text", ["nan, inf", "1, inf", "-inf", "0.5, NaN", "1e999"])
def test_explore_refuses_what_is_not_a_finite_strength(studio, text):
    with pytest.raises(ValueError, match="finite numbers >= 0"):
        studio.explorer.parse_alphas(text)
    with pytest.raises(ValueError, match="finite numbers >= 0"):
        studio.explorer.explore("planted", [float(v) for v in text.split(",")])


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
    from personalize.methods.card.cluster import closeness, is_member, member_distances

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
    # "at its edge" starts where the build's far memory does (StyleSettings.far_share), not at a fixed 10 %
    between = float(np.quantile(loo, 0.7))  # further out than most of the build's people, not all
    words, further = closeness(emb, centroids, labels, between, edge=0.5)
    assert 0 < further < 0.5 and "at its edge: further out than 50 % of" in words
    assert "within its usual range" in closeness(emb, centroids, labels, between, edge=0.1)[0]
    # two members in one cluster: leaving one out moves the centre onto the other
    two = np.stack([emb[0], emb[1]])
    assert np.allclose(member_distances(two, two.mean(0, keepdims=True), np.zeros(2, int)),
                       np.linalg.norm(emb[0] - emb[1]), atol=1e-5)


def test_the_build_s_own_people_are_told_they_are_in_it(studio):
    """For every K and every member of the tiny build, their own distances read as one of the build's people;
    the demo writers saved in the studio (their writing near, not equal to, the build's) are never "far"."""
    c = studio.runtime.engine.clusters
    for k, cents in c.centroids.items():
        for e in c.embeddings:
            assert "one of this build's own people" in studio.histories.closeness(k, np.linalg.norm(cents - e[None], axis=1))
    for user in c.users[:3]:
        res = studio.histories.save_history(user, studio.histories.demo_items(user), "tweets")
        assert res.closeness and "far from every" not in res.closeness, res.closeness


# ---------------------------------------------------------------- Compare

def test_each_compare_column_is_done_when_its_own_row_ends(studio, monkeypatch):
    """base's row stops after 2 tokens, card's after 8, in one mixed batch: base is done (and stored) while card
    is still decoding, not when the batch ends; its output is what the runner returns for its row."""
    studio.histories.save_history("cole", [Item(f"ok so the {w} was fine i guess") for w in WORDS], "tweets")
    rows, submitted = studio.comparisons.rows, []
    short = lambda rs: [dataclasses.replace(r, settings=dataclasses.replace(r.settings, max_new_tokens=2))  # noqa: E731
                        for r in rs]
    monkeypatch.setattr(studio.comparisons, "rows", lambda m, *a, **k: short(rows(m, *a, **k)) if m == "base"
                        else rows(m, *a, **k))
    submit = studio.runtime.scheduler.submit
    monkeypatch.setattr(studio.runtime.scheduler, "submit",
                        lambda build, on_step=None: submitted.append(submit(build, on_step)) or submitted[-1])
    s = dataclasses.replace(studio.runtime.settings(alpha=1.0, max_new_tokens=8), min_new_tokens=8)
    plan = studio.comparisons.compare_plan("cole", "the bus", True, None, ["base", "card"])
    events = list(studio.comparisons.compare_stream(plan, s))
    kinds = [(kind, m) for kind, m, _ in events]
    base_done = kinds.index(("done", "base"))
    assert ("text", "card") in kinds[base_done + 1:], kinds  # card still streamed after base was done
    done = {m: v for kind, m, v in events if kind == "done"}
    assert done["base"].n_tokens == 2 and done["card"].n_tokens == 8 and done["base"].gen_id is not None
    assert done["base"].latency_s < done["card"].latency_s
    (request,) = submitted  # both columns' rows: one request to the scheduler
    final = dict(zip(["base", "card"], request.result()))
    assert all(done[m].text == final[m].text and done[m].n_tokens == final[m].n_tokens for m in done)
    assert studio.runtime.store.generation(done["base"].gen_id)["output"] == final["base"].text


def test_a_column_whose_rows_break_the_compares_request_fails_alone(studio, monkeypatch):
    """A Compare's columns go to the scheduler as one request; a row that breaks its batch (here an adapter the
    build does not hold) sends each column again alone, so only its own column shows the error."""
    studio.histories.save_history("cole", [Item(f"ok so the {w} was fine i guess") for w in WORDS], "tweets")
    rows, submitted = studio.comparisons.rows, []
    broken = lambda m, *a, **k: [dataclasses.replace(r, adapter="k9c9") for r in rows(m, *a, **k)]  # noqa: E731
    monkeypatch.setattr(studio.comparisons, "rows", lambda m, *a, **k: (broken if m == "base" else rows)(m, *a, **k))
    submit = studio.runtime.scheduler.submit
    monkeypatch.setattr(studio.runtime.scheduler, "submit",
                        lambda build, on_step=None: submitted.append(submit(build, on_step)) or submitted[-1])
    plan = studio.comparisons.compare_plan("cole", "the bus", True, None, ["base", "cluster"])
    done = {m: v for kind, m, v in studio.comparisons.compare_stream(plan, studio.runtime.settings(max_new_tokens=3))
            if kind == "done"}
    assert "k9c9" in done["base"].error and done["cluster"].error is None and done["cluster"].text
    assert len(submitted) == 3  # the Compare's one request, then each column alone


def test_the_done_line_shows_a_diff_prompt_as_written():
    """A diff's blank line and indented lines made the prompt an indented code block, where md's escapes show as
    backslashes before # and backticks; on one line it renders as written."""
    from markdown_it import MarkdownIt

    from personalize.ui.compare import done_line

    prompt = "diff --git a/x b/x\n\n    # Fix `foo` in bar\n\tdef x(): # y *not bold*\n"
    html = MarkdownIt("commonmark").render(done_line("ed", 2, "", prompt))
    assert "<pre>" not in html and "<code>" not in html and "\\" not in html and "<em>" not in html
    assert "Prompt: diff --git a/x b/x # Fix `foo` in bar def x(): # y *not bold*" in html


# ---------------------------------------------------------------- Fit: the verdict and the decoding agree

@pytest.fixture(scope="module")
def fitted(studio):
    """A fit whose held-out items have scored words: the tiny random model's top candidates rarely hold the
    person's next word (no held-out rows, "too few to tell"), so each step's last candidate is made that word."""
    from personalize.studio.fits import held_out_interval

    studio.histories.save_history("vera", [Item(f"ok so the {w} was fine i guess") for w in WORDS], "tweets")
    fit = studio.fits.fit("vera")
    for f in fit.features:
        f.top_ids[:, -1] = f.ids
    diag, own, _ = onboard.held_out_style(studio.runtime.engine, fit.features, fit.n_hold, studio.runtime.engine.heads["tokens"])
    diag["own_minus_cluster"] = held_out_interval(studio.runtime.engine, dataclasses.replace(fit, held_style=own))
    return dataclasses.replace(fit, diagnostics=diag, held_style=own)


def test_the_verdict_gives_its_uncertainty_over_the_held_out_items(studio, fitted):
    """The fit's held-out difference (own style − cluster model, next-word accuracy) comes with a bootstrap
    interval over the held-out items, the same difference the verdict's percentages show, and the page says it."""
    from personalize.ui import text as page_text

    d = fitted.diagnostics
    gain = d["own_minus_cluster"]
    assert d["n"] > 0 and gain["items"] == fitted.n_hold >= 2
    assert gain["mean"] == pytest.approx(d["acc_own"] - d["acc_no_head"], abs=1e-6)
    assert gain["ci95"][0] <= gain["mean"] <= gain["ci95"][1]
    msg = page_text.fit_message(studio, "vera", fitted, 1.0)
    assert f"over your {gain['items']} held-out items" in msg and "95 % interval" in msg


def test_a_fit_measures_its_interval_when_its_held_out_items_have_words(studio, monkeypatch):
    """Fits.fit adds the interval to the verdict's diagnostics whenever it can be measured."""
    from personalize.studio import fits

    monkeypatch.setattr(fits, "held_out_interval", lambda engine, fit: {"mean": 0.0, "ci95": [0.0, 0.0], "items": 2})
    monkeypatch.setattr(fits, "fit_person", lambda *a, **k: (dataclasses.replace(
        onboard.fit(studio.fits.engine, studio.histories.demo_items("formal_01")), diagnostics={"n": 3}), []))
    assert studio.fits.fit("vera").diagnostics["own_minus_cluster"]["items"] == 2


@pytest.mark.parametrize("fallback", [True, False])
def test_a_losing_style_is_said_beside_what_card_decodes(studio, fitted, monkeypatch, fallback):
    """A person whose held-out items say the style loses: with the build's fallback, the verdict says the cluster
    model's output and CARD's row is the cluster model's; without it, the verdict says CARD keeps the style, why,
    and how to get the cluster model, CARD's row is steered by the style, and Compare says so beside it."""
    from personalize.methods.card.card_decode import FALLBACK_NOTE
    from personalize.studio.fits import LOSING_STYLE_NOTE, fit_verdict, kept_reason
    from personalize.ui import compare

    cfg = studio.runtime.engine.cfg
    monkeypatch.setattr(studio.runtime.engine, "cfg", dataclasses.replace(
        cfg, style=dataclasses.replace(cfg.style, fallback=fallback)))
    lost = dict(fitted.diagnostics, helps=False)
    verdict = fit_verdict(lost, fallback=fallback, why_kept=kept_reason(studio.runtime.engine.meta))
    user_state = studio.histories.user_state

    def losing(name, k=None):
        st = user_state(name, k)
        st.lam.helps = False
        return st

    monkeypatch.setattr(studio.histories, "user_state", losing)
    s = studio.runtime.settings(alpha=1.0, max_new_tokens=3)
    (row,) = studio.comparisons.rows("card", studio.histories.user_state("vera"), studio.runtime.task.prompt("the bus"), s)
    status = next(compare.compare(studio, "vera", "the bus", True, None, ["card"], 1.0, 50, 3, None))[0]
    if fallback:
        assert "show your cluster's model's output for you" in verdict and "still decodes" not in verdict
        assert row.steer is None and row.note == FALLBACK_NOTE and LOSING_STYLE_NOTE not in status
    else:
        assert "still decodes CARD with it: on its validation people" in verdict and "α = 0" in verdict
        assert row.steer is not None and row.note is None and LOSING_STYLE_NOTE in status


def test_why_the_build_keeps_a_losing_style_is_what_its_tune_measured():
    """A tie on the validation people is said as a tie (the old text claimed the fallback lowered ROUGE-L)."""
    from personalize.studio.fits import kept_reason

    def meta(off, on):
        return {"report": {"tune": {"fallback": {"chosen": "off", "sweep": {"off": {"rougeL": off},
                                                                            "on": {"rougeL": on}}}}}}

    assert "changed nothing measurable (ROUGE-L 0.056 either way)" in kept_reason(meta(0.0556, 0.0556))
    assert "lowered ROUGE-L (0.200 vs 0.250" in kept_reason(meta(0.25, 0.2))
    assert "did not try" in kept_reason({})


# ---------------------------------------------------------------- Fit: the Version box

def test_the_version_box_offers_a_version_that_exists():
    """One version (the current): 1, never 0; after a refit, the newest one that is not current; read back from
    the page as a pandas table too."""
    import pandas as pd

    from personalize.ui.common import VERSION_COLUMNS
    from personalize.ui.fit import version_to_restore

    one = [[1, "t", "fit", "", 0, True, True]]
    three = [[3, "t", "vote", "", 1, True, True], [2, "t", "fit", "", 0, False, False], [1, "t", "fit", "", 0, 1, 0]]
    assert version_to_restore([]) is None and version_to_restore(None) is None
    assert version_to_restore(one) == 1 and version_to_restore(three) == 2
    assert version_to_restore(pd.DataFrame(three, columns=VERSION_COLUMNS)) == 2
    assert version_to_restore(pd.DataFrame([["", "", "", "", "", "", ""]], columns=VERSION_COLUMNS)) is None
    restored = [[3, "t", "vote", "", 1, True, "false"], [2, "t", "fit", "", 0, False, "false"], [1, "t", "fit", "", 0, 1, "true"]]
    assert version_to_restore(restored) == 3


def test_one_reading_of_an_interval_on_every_verdict():
    """Issue 59, item 1: an interval above 0 reads "better", below 0 "worse", across 0 "not sure", whatever the count
    (it stands beside the words): "+7 to +40 over 4 items" and "+6 to +44 over 5" read alike."""
    from personalize.studio.fits import _uncertainty, interval_word

    assert "over your 4 held-out items: better" in _uncertainty({"mean": 0.2, "ci95": [0.07, 0.4], "items": 4})
    assert "over your 5 held-out items: better" in _uncertainty({"mean": 0.2, "ci95": [0.06, 0.44], "items": 5})
    assert "worse" in _uncertainty({"mean": -0.2, "ci95": [-0.3, -0.05], "items": 8})
    assert "not sure" in _uncertainty({"mean": 0.1, "ci95": [-0.1, 0.3], "items": 8})
    assert [interval_word(*i) for i in ((0.01, 0.2), (-0.2, -0.01), (0.0, 0.2), (-0.1, 0.1))] == \
        ["better", "worse", "not sure", "not sure"]


def test_the_verdict_names_the_base_a_cluster_of_one_was_judged_against(studio, fitted):
    """A person over their own adapter had their style judged against it, not against their cluster's model: the
    teacher-forced verdict on the Fit page says so (issue 48, item 4), and a person without one keeps the cluster."""
    from personalize.ui import text as page_text

    over_own = dataclasses.replace(fitted, style=dataclasses.replace(fitted.style, own="u_vera_own"))
    own_page, cluster_page = (page_text.fit_message(studio, "vera", f, 1.0) for f in (over_own, fitted))
    said = lambda page: page.split("Teacher-forced, on your held-out words:")[1].split("\n\n")[0]  # noqa: E731
    assert "your own adapter" in said(own_page) and "cluster's model" not in said(own_page)
    assert "your cluster's model" in said(cluster_page) and "own adapter" not in said(cluster_page)


def test_the_fit_page_says_how_far_the_person_is_what_they_get_and_what_alpha_does(studio, fitted, monkeypatch):
    """The Fit report's form paragraph: the person's closeness in the cluster's words, the words they open with
    (from their fitted form bias), and what α does; a person far from every cluster is told the cluster model
    writes like its population, not like them."""
    from personalize.methods.card.head import opening_key
    from personalize.ui import text as page_text

    st = dataclasses.replace(fitted.style, knn_weight=None)  # near: the build's own style, no memory of theirs
    fitted = dataclasses.replace(fitted, style=st, far=False)
    assert len(st.form_ids) and (st.form_keys == opening_key(())).any()  # the fit made the person's form
    monkeypatch.setattr(studio.histories, "closeness", lambda k, d: "close to its centre: nearer than most of its own members")
    near = page_text.fit_message(studio, "vera", fitted, 1.0)
    at_start = st.form_keys == opening_key(())
    first = st.form_ids[at_start][st.form_bias[at_start].argmax()]
    assert "How you write against this build's writers" in near and "close to its centre" in near
    assert "0 is the cluster model exactly" in near and studio.runtime.engine.tok.decode([int(first)]).strip() in near
    assert "which is not yours" not in near
    assert "nats a token likelier under your style than under other people's" in near  # the gap, in words
    assert "your own past texts are mixed in" not in near  # a near person's style has no memory of their own
    assert "makes you a cluster of one" not in near  # offered to the far alone (every page names the button)
    monkeypatch.setattr(studio.histories, "closeness", lambda k, d: "far from every cluster of this build: further out")
    beyond = page_text.fit_message(studio, "vera", fitted, 1.0)
    assert "which is not yours" in beyond
    # a far person is offered a cluster of one (off by default: OwnSettings.far), with what it measured
    assert "*Train my own adapter* makes you a cluster of one" in beyond and "30 % of outputs against 45 %" in beyond
    assert "makes you a cluster of one" not in page_text.fit_message(
        studio, "vera", dataclasses.replace(fitted, style=dataclasses.replace(st, own="own-vera")), 1.0)
    far = dataclasses.replace(fitted, style=dataclasses.replace(st, knn_weight=0.15), far=True)
    assert "your own past texts are mixed in" in page_text.fit_message(studio, "vera", far, 1.0)
    cfg = studio.runtime.engine.cfg  # a build whose guard kept card at the cluster model: the page does not promise the style
    monkeypatch.setattr(studio.runtime.engine, "cfg", dataclasses.replace(cfg, decoding=dataclasses.replace(cfg.decoding,
                                                                                                  alpha=0.0)))
    kept = page_text.fit_message(studio, "vera", fitted, 1.0)
    assert "At this build's α = 0, card writes as your cluster's model" in kept and "What you get" not in kept
    memory_and_items = page_text.fit_message(studio, "vera", far, 1.0)  # at α = 0 too: every part waits for α > 0
    assert "your own past texts are mixed in" in memory_and_items and "What you get" not in memory_and_items
    assert memory_and_items.index("What α above 0 gives you") < memory_and_items.index("At this build's α = 0")
    # a build that places the person's nearest past texts before the prompt and decodes at α = 2: both said
    assert "placed before it" not in near and "starts at this build's α" not in near
    monkeypatch.setattr(studio.runtime.engine, "cfg", dataclasses.replace(
        cfg, style=dataclasses.replace(cfg.style, retrieval=True), decoding=dataclasses.replace(cfg.decoding, alpha=2.0)))
    monkeypatch.setitem(studio.runtime.engine.meta, "report", {"tune": {"alpha": {"chosen": "2.0"}}})
    two = page_text.fit_message(studio, "vera", fitted, 1.0)
    assert "Your past texts nearest the prompt are also placed before it" in two
    assert "it starts at this build's α = 2, the strength its validation people were decoded best with" in two


def test_fit_verdict_by_decoding_is_explores_rows(studio, monkeypatch):
    from personalize.studio.fits import interval_word

    """Issue 48, item 5: Fit's decoded verdict and Explore's rows at α = 0 and the build's α are one computation on
    the same held-out items (a third of the history), said with its count and interval; a build at α = 0 and a
    history too short to hold items out say so instead of a figure."""
    engine = studio.runtime.engine
    decoding = dataclasses.replace(engine.cfg.decoding, alpha=2.0, max_new_tokens=4)
    monkeypatch.setattr(engine, "cfg", dataclasses.replace(engine.cfg, decoding=decoding))
    studio.histories.save_history("judged", studio.histories.demo_items("formal_01"), "tweets")
    n = len(studio.runtime.store.items("judged")) // 3
    check = studio.explorer.check("judged")
    rows = studio.explorer.explore("judged", [0.0, 2.0], n_holdout=n, with_k=False).alpha
    assert (check.base, check.card, check.alpha) == (rows[0].copy_aware, rows[1].copy_aware, 2.0) and not check.own
    assert check.difference["n"] == n and check.difference["mean"] == pytest.approx(check.card - check.base, abs=1e-3)
    words = studio.explorer.verdict("judged")
    lo, hi = check.difference["ci95"]
    assert f"Explore with {n} held out" in words and f"over {n} items: {interval_word(lo, hi)}" in words
    assert f"scores {check.card:.3f} against {check.base:.3f}" in words and "your cluster's model" in words
    assert f"card repeated one in {check.card_repeats} of {n}" in words  # the copying the score counted

    studio.histories.save_history("brief", studio.histories.demo_items("formal_01")[:4], "tweets")
    assert studio.explorer.check("brief") is None and "Too few items" in studio.explorer.verdict("brief")
    monkeypatch.setattr(engine, "cfg", dataclasses.replace(engine.cfg, decoding=dataclasses.replace(decoding, alpha=0.0)))
    assert studio.explorer.check("judged") is None and "α = 0" in studio.explorer.verdict("judged")


def test_fit_check_decodes_the_style_where_its_refit_lost_teacher_forced(studio, monkeypatch):
    """Fit's check is what decides the fallback, so its sweep decodes the style itself: a style refitted on the
    other items whose teacher-forced figure lost (helps False), under a build with the fallback on, is still decoded
    at every α, never replaced by the cluster model's output (which swept the base against itself: "card 0.397
    against 0.397" for a person whose card Compare then decoded with the style)."""
    from personalize.methods.card import card_decode

    engine = studio.runtime.engine
    cfg = engine.cfg
    monkeypatch.setattr(engine, "cfg", dataclasses.replace(
        cfg, style=dataclasses.replace(cfg.style, fallback=True),
        decoding=dataclasses.replace(cfg.decoding, alpha=1.0, max_new_tokens=4)))
    studio.histories.save_history("lost", studio.histories.demo_items("formal_01"), "tweets")
    fit, generate, notes = onboard.fit, card_decode.generate, []

    def lost(*a, **k):
        f = fit(*a, **k)
        f.style.helps = False
        return f

    def noted(*a, **k):
        outs = generate(*a, **k)
        notes.extend(g.note for g in outs)
        return outs

    monkeypatch.setattr(onboard, "fit", lost)
    monkeypatch.setattr(card_decode, "generate", noted)
    check = studio.explorer.check("lost")
    assert check is not None and notes
    assert card_decode.FALLBACK_NOTE not in notes and card_decode.OWN_FALLBACK_NOTE not in notes


def test_fit_verdict_by_decoding_lets_a_person_in_between_its_steps(studio, monkeypatch):
    """The decoded check follows every Fit and nobody waits on it: it takes the model lock as background work, one
    step at a time, so a person's Compare (a foreground holder) goes in after at most one of its decodes."""
    import threading
    import time

    from personalize.methods.card import card_decode

    engine = studio.runtime.engine
    decoding = dataclasses.replace(engine.cfg.decoding, alpha=2.0, max_new_tokens=2)
    monkeypatch.setattr(engine, "cfg", dataclasses.replace(engine.cfg, decoding=decoding))
    studio.histories.save_history("waited", studio.histories.demo_items("formal_01"), "tweets")
    events, generate = [], card_decode.generate

    def step(*a, **k):
        events.append("check")
        time.sleep(0.5)
        return generate(*a, **k)

    monkeypatch.setattr(card_decode, "generate", step)
    check = threading.Thread(target=studio.explorer.check, args=("waited",))
    check.start()
    while not events:
        time.sleep(0.01)
    with studio.runtime.model_lock:  # a person's request, while the check decodes its first α
        events.append("person")
    check.join()
    assert events == ["check", "person", "check"], events


def test_explores_plots_name_the_base():
    """α = 0 is a cluster of one's own adapter, not the cluster model, and their card decodes over it at every K:
    the sweep's plots say which."""
    from types import SimpleNamespace

    from personalize.ui.figures import explore_figures

    row = SimpleNamespace(alpha=0.0, rougeL=0.5, copy_aware=0.4, length=6)
    for own, base in ((True, "your own adapter"), (False, "the cluster model")):
        fa, fk = explore_figures(SimpleNamespace(alpha=[row], k=[], own=own))
        assert fa.layout.title.text.endswith(f"(α = 0: {base})")
        assert ("own adapter at every K" in fk.layout.title.text) == own


def test_the_decoded_verdicts_fallback_is_the_persons_base():
    """Card's fallback decodes over the person's base (card_decode: their own adapter where they have one), so the
    decoded verdict names that base in both places, never the cluster model for a cluster of one."""
    from types import SimpleNamespace

    from personalize.studio.fits import decoded_verdict

    for own, base in ((True, "your own adapter"), (False, "your cluster's model")):
        check = SimpleNamespace(difference={"n": 8, "mean": -0.2, "ci95": [-0.3, -0.1]}, own=own, alpha=1.0,
                                card=0.3, base=0.5, card_repeats=1, base_repeats=0, numbers=(1, 2, 3))
        said = decoded_verdict(check, fallback=True)
        assert f"({base})" in said and f"So Compare shows {base}'s output for card (the fallback)" in said
        assert own is False or "cluster's model" not in said


def test_an_old_text_handed_back_is_marked_in_compare_quick_pair_and_the_leaderboard(studio):
    """Issue 57, items 4-5: an output that repeats one of the person's past texts says so ("repeats your text 2"),
    whichever method wrote it; after a blind vote the reveal says which output was one; the leaderboard counts the
    votes that went to a copy and can leave those pairs out."""
    from personalize.humaneval.arena import BlindPair
    from personalize.serving.generation import Generation
    from personalize.ui import compare, leaderboard_tab

    texts = ["the harbour gulls at dawn again", "ropes coiled on the quay after rain", "tides turn slow in march",
             "boats painted blue for the summer", "nets drying by the old church wall", "fog rolls over the pier"]
    studio.histories.save_history("copied", [Item(x="", y=t) for t in texts], studio.runtime.task.name)
    state = studio.histories.user_state("copied")
    s = studio.runtime.settings(max_new_tokens=4)
    for method in ("exact", "rag", "base"):  # the mark is the page's, for every method
        out = studio.comparisons.stored(method, state, "a prompt", s, Generation("Ropes coiled on the quay, after rain", 5, 0.1))
        assert out.info["repeats"] == "repeats your text 2" and "⚠️ *repeats your text 2*" in compare.method_md(out)
    near = studio.comparisons.stored("card", state, "p", s, Generation("boats painted blue for summer", 5, 0.1))
    assert near.info["repeats"] == "repeats your text 4 nearly"
    new = studio.comparisons.stored("card", state, "p", s, Generation("a lighthouse keeper's first letter", 5, 0.1))
    assert "repeats" not in new.info and "repeats your" not in compare.method_md(new)

    pair = BlindPair("x", "copied", "p", ("base", "card"), ("a lighthouse at noon", "fog rolls over the pier"), (None, None), {})
    assert studio.votes.repeat_marks(pair) == ["B repeats your text 6"]
    store = studio.runtime.store
    store.add_rating("r1", "p", "copied", "base", "a lighthouse at noon", "card", "fog rolls over the pier", "b", {})
    store.add_rating("r1", "q", "copied", "base", "ropes for the new boat", "card", "a storm at sea", "a", {})
    lb = studio.votes.leaderboard()
    assert lb["copies"] == {"pairs": 2, "with_a_copy": 1, "won_by_a_copy": 1} and lb["n_votes"] == 2
    assert studio.votes.leaderboard(leave_out_copies=True)["n_votes"] == 1
    status, *_ = leaderboard_tab.standings(studio, True)
    assert "1 of 2 voted pairs hold an output that repeats" in status and "1 vote went to the copy" in status


@pytest.mark.parametrize("teacher_forced_helps", [True, False])
def test_the_decoded_check_decides_what_card_decodes(studio, monkeypatch, teacher_forced_helps):
    """Issue 59, item 1: one rule, the figure Fit shows first. A decoded check whose interval lies below 0 makes
    Compare's card the person's base (the fallback) even where the teacher-forced figure said the style helps; one
    that is not below 0 keeps the style even where the teacher-forced figure lost; the verdict says which."""
    from personalize.methods.card.card_decode import FALLBACK_NOTE
    from personalize.studio.explorer import HeldOutCheck

    cfg = studio.runtime.engine.cfg
    monkeypatch.setattr(studio.runtime.engine, "cfg", dataclasses.replace(
        cfg, style=dataclasses.replace(cfg.style, fallback=True), decoding=dataclasses.replace(cfg.decoding, alpha=1.0)))
    name = f"decided-{teacher_forced_helps}"
    studio.histories.save_history(name, studio.histories.demo_items("formal_01"), "tweets")
    studio.fits.fit(name)
    store, art = studio.runtime.store, studio.runtime.engine.artifacts_id
    vec, meta = store.vector(name, art)
    stats = meta["stats"] | {"diagnostics": meta["stats"].get("diagnostics", {}) | {"helps": teacher_forced_helps}}
    store.save_vector(name, art, vec, meta["model_id"], stats, store.style(name, art).extras)
    s = studio.runtime.settings(alpha=1.0, max_new_tokens=3)
    prompt = studio.runtime.task.prompt("the bus")

    def card_row():
        (row,) = studio.comparisons.rows("card", studio.histories.user_state(name), prompt, s)
        return row

    assert (card_row().steer is not None) == teacher_forced_helps  # no decoded check yet: the teacher-forced figure
    for lo, hi, steered in ((-0.3, -0.1, False), (-0.1, 0.2, True)):
        check = HeldOutCheck(1.0, 0.1, 0.2, {"mean": (lo + hi) / 2, "ci95": [lo, hi], "n": 5}, False)
        monkeypatch.setattr(studio.explorer, "check", lambda n, progress=None, c=check: c)
        words = studio.explorer.verdict(name)
        row = card_row()
        assert (row.steer is not None) == steered and (row.note == FALLBACK_NOTE) != steered
        if steered:
            assert "not sure" in words and "So Compare decodes card with your style at this build's α = 1" in words
        else:
            assert "worse" in words and "So Compare shows your cluster's model's output for card" in words
