"""One truth on the page (issue 59): after Forget me every tab says the same of the name, and a neutral rewrite
shown to a person says no more than their text. Library level on the tiny model; the handlers without a server."""

from __future__ import annotations

import pytest

from personalize.data import Item
from personalize.methods.card.neutral import accept, keeps_content, neutral, plain

from conftest import tiny_studio

LINES = [f"ok so the {w} was fine i guess" for w in ("bus", "tea", "rain", "film", "shop", "walk", "game", "cake")]


@pytest.fixture(scope="module")
def studio(tiny_artifacts, tmp_path_factory):
    s = tiny_studio(tiny_artifacts, tmp_path_factory.mktemp("one-truth"))
    yield s
    s.runtime.store.close()


# ---------------------------------------------------------------- rewrites keep their content

@pytest.mark.parametrize("text, rewrite", [
    ("new update on the game just dropped lol", "The latest version of the game is 0.7.4."),  # a number it lacks
    ("exam went way better this time", "The new exam is better than the old one, says the teacher."),  # new words
])
def test_a_rewrite_that_adds_content_is_refused(text, rewrite):
    assert not keeps_content(text, rewrite) and not accept(text, rewrite)
    assert neutral(text, rewrite) == plain(text)


@pytest.mark.parametrize("text, rewrite", [
    ("omg the coffee was SO good today!!! 🔥🔥", "The coffee was very good today."),
    ("cant wait for the weekend omg", "I cannot wait for the weekend."),  # a plain word or two is not content
    ("bus 42 late again", "Bus 42 is late again."),  # its own number kept
])
def test_a_rewrite_that_only_rephrases_is_kept(text, rewrite):
    assert keeps_content(text, rewrite) and neutral(text, rewrite) == rewrite


def test_a_stored_rewrite_that_adds_content_is_not_shown_and_is_made_again(studio):
    from personalize.methods.card.person import stored_with_rewrites

    studio.histories.save_history("rex", [Item(t) for t in LINES[:4]], "tweets")
    studio.histories.rewrites.result()  # the background rewrites of Save, done
    store, first = studio.runtime.store, studio.runtime.store.items("rex")[0]
    store.set_neutral([(first.id, "The bus was fine, says version 2.1 of the timetable.")])  # from before the check
    assert studio.histories.item_rows("rex")[0][2] == ""
    p, _ = studio.histories.resolve_prompt(None, True, 1, "rex")
    assert "2.1" not in p and LINES[0] in p
    stored_with_rewrites(studio.runtime.engine, store, "rex")  # the next fit's pass
    assert keeps_content(LINES[0], store.items("rex")[0].neutral) and studio.histories.item_rows("rex")[0][2]


# ---------------------------------------------------------------- after Forget me

def test_after_forget_me_every_tab_says_the_same_of_the_name(studio):
    from personalize.ui import my_cluster, writing

    studio.histories.save_history("bayer", [Item(t) for t in LINES], "tweets")
    assert "stored items" in studio.histories.switch_user("bayer", None).message
    out = writing.forget(studio, "bayer", True)
    assert out[0].startswith("Forgot") and out[2] == [] and out[4] == "" and out[-1] == ""  # the count line gone
    typed = studio.histories.switch_user("bayer", None)  # the name typed again
    view = studio.clusters.cluster_view("bayer", None)
    assert typed.message.startswith("New user **bayer**") and view.state is None and view.map.user is None
    assert view.message == typed.message
    assert my_cluster.show_cluster(studio, "bayer", None)[0] == typed.message
