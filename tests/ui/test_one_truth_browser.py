"""One truth on the page (issue 59), in headless Chromium on a real Gradio server over the tiny build: three people
whose Fit, Explore and Compare must say the same thing, and a forgotten one no tab still speaks of.

- lora: her style wins teacher-forced but loses decoded (the check is set to lose: a tiny random model decides no
  such thing by itself); Fit's check, Fit's teacher-forced line, Compare's card column and Explore agree that card
  shows her cluster's model, and Explore holds out the same items (its scores are the real ones: Explore's rows
  and the check are one computation, tests/studio/test_page_truth.py).
- olly: a cluster of one, over his own adapter; every tab names his own adapter, none the cluster model.
- fran: forgotten; no tab keeps her text, and her name typed again is a new user on every tab.

SCREENSHOTS=<folder> keeps the screenshots there.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from personalize.studio.facade import Studio, StudioConfig  # noqa: E402
from tools.browser import Page, chromium, served  # noqa: E402

FRAN = "\n".join(f"fran walked to the {w} again and wrote it down" for w in
                 ("mill", "bridge", "quay", "market", "chapel", "orchard", "station", "harbour"))


@pytest.fixture(scope="module")
def server(tiny_artifacts, tmp_path_factory):
    folder = tmp_path_factory.mktemp("one-truth-app")
    studio = Studio.load(StudioConfig(own_adapters=False, artifacts=str(tiny_artifacts["artifacts"]),
                                      db=str(folder / "studio.db"), demo_data=str(tiny_artifacts["demo"]),
                                      export_dir=str(folder / "exports")))
    with served(studio) as url:
        yield {"url": url, "studio": studio}
    studio.runtime.store.close()


def open_person(p: Page, name: str) -> None:
    """The name typed at the top, as a person returning to the page does."""
    p.tab("My writing")
    p.type("user-name", name)
    p.until_text("writing-status", name)


def compare_card(p: Page, prompt: str) -> str:
    p.tab("Compare")
    p.choose_methods(("cluster", "card"))
    p.type("prompt", prompt)
    p.click("compare-button")
    assert p.until_text("compare-status", "Done", "⚠️").startswith("Done")
    return p.text("out-card")


def explore(p: Page, alphas: str) -> str:
    p.tab("Explore")
    p.type("alphas", alphas)
    p.click("explore-button")
    return p.until_text("explore-status", "Held out", "⚠️")


def test_browser_fit_explore_and_compare_say_one_thing_for_three_people(server, tmp_path, monkeypatch):
    from selenium.webdriver.common.keys import Keys

    from personalize.methods.card.adapters import cluster_adapter
    from personalize.methods.card.person import prepared_items
    from personalize.studio.explorer import HeldOutCheck

    studio = server["studio"]
    eng, store = studio.runtime.engine, studio.runtime.store
    # a build that decodes card at α = 1 and falls back to the person's base where their style loses decoded
    monkeypatch.setattr(eng, "cfg", dataclasses.replace(
        eng.cfg, style=dataclasses.replace(eng.cfg.style, fallback=True),
        decoding=dataclasses.replace(eng.cfg.decoding, alpha=1.0, max_new_tokens=4)))
    # the demo people come with their prompts: held out, none gives its answer away
    for name, demo in (("lora", "formal_01"), ("olly", "formal_02")):
        studio.save_from(name, studio.histories.demo_history(demo), None, "tweets", demo=demo)
        studio.histories.rewrites.result()
    # olly's own adapter, trained from his nearest cluster's (the Train my own adapter button's work)
    items = prepared_items(eng, store, "olly")
    k = eng.cfg.default_k
    placed = int(store.assignment("olly", eng.artifacts_id, k)["cluster"])
    with studio.runtime.model_lock:
        eng.own.train("olly", list(items), cluster_adapter(k, placed))
    assert eng.own.is_current("olly", list(items))

    # lora: teacher-forced says her style helps, her decoded check says it loses
    real_fit, real_check = studio.fits.fit, studio.explorer.check

    def fit_that_wins_teacher_forced(name, *a, **kw):
        res = real_fit(name, *a, **kw)
        if name == "lora" and res.diagnostics:
            res.diagnostics.update(helps=True, acc_own=0.6, acc_no_head=0.4)
        return res

    def check_that_loses(name, progress=None):
        real = real_check(name, progress)
        if name != "lora" or real is None:
            return real
        return HeldOutCheck(real.alpha, 0.05, 0.30, {"mean": -0.25, "ci95": [-0.4, -0.1], "n": real.difference["n"]},
                            real.own, real.card_repeats, real.base_repeats, real.numbers)

    monkeypatch.setattr(studio.fits, "fit", fit_that_wins_teacher_forced)
    monkeypatch.setattr(studio.explorer, "check", check_that_loses)

    shots = Path(os.environ.get("SCREENSHOTS") or tmp_path / "shots")
    driver = chromium(tmp_path)
    try:
        p = Page(driver, shots)
        driver.get(server["url"])

        # ---- lora
        open_person(p, "lora")
        fit = p.fit("lora")
        assert "Teacher-forced" in fit and "Your vector helps" in fit, fit
        check = p.until_text("fit-check", "Decoded on your", "⚠️")
        assert "worse" in check and "So Compare shows your cluster's model's output for card" in check, check
        numbers = check.split("Decoded on your newest ")[1].split(" in My writing")[0]  # "8 items (1-8"
        n = int(numbers.split()[0])
        p.shot("one-truth-lora-fit")
        card = compare_card(p, "The harbour was quiet this morning.")
        assert "did not beat your cluster's model" in card, card  # the fallback, said on the column
        p.shot("one-truth-lora-compare")
        p.tab("Explore")
        p.type("n-holdout", str(n))
        p.el("#n-holdout input").send_keys(Keys.TAB)
        said = explore(p, "0, 1")
        assert said.startswith(f"Held out your newest {n} items ({numbers.split('(')[1]} in My writing)"), (said, check)
        p.shot("one-truth-lora-explore")

        # ---- olly: his own adapter, named the same on every tab
        open_person(p, "olly")
        fit = p.fit("olly")
        assert "your own adapter" in fit and "cluster model's output" not in fit, fit
        check = p.until_text("fit-check", "Decoded on your", "⚠️")
        assert "(your own adapter)" in check and "cluster's model" not in check, check
        card = compare_card(p, "The harbour was quiet this morning.")
        assert "own adapter" in card and "cluster's model" not in card, card
        said = explore(p, "0, 1")
        assert said.startswith("Held out your newest"), said
        assert "own adapter" in p.text("explore-alpha") or "own adapter" in p.text("explore-table") or \
            "own adapter" in said, said
        p.shot("one-truth-olly-explore")

        # ---- fran: saved, fitted, compared, then forgotten
        open_person(p, "fran")
        p.type("history", FRAN)
        p.click("save-history")
        assert "Saved 8 items for fran" in p.until_text("writing-status", "Saved", "⚠️")
        p.fit("fran")
        compare_card(p, "The mill was shut today.")
        p.tab("My writing")
        p.click("forget-box")
        p.el("#forget-confirm input").click()
        p.click("forget-button")
        assert "Forgot fran" in p.until_text("forget-status", "Forgot", "⚠️")
        p.wait.until(lambda d: p.el("#user-name input, #user-name textarea").get_attribute("value") == "")
        for tab, ids in (("My writing", ("writing-status", "items")), ("My cluster", ("cluster-status",)),
                         ("Fit my style", ("fit-status", "fit-check")), ("Compare", ("out-card", "compare-status")),
                         ("Explore", ("explore-status",))):
            p.tab(tab)
            for elem in ids:
                assert "fran" not in p.text(elem).lower() and "stored items" not in p.text(elem), (tab, elem)
        p.shot("one-truth-fran-forgotten")
        open_person(p, "fran")  # typed again: a new user on every tab
        assert "New user" in p.until_text("writing-status", "New user")
        p.tab("My cluster")
        assert "New user" in p.until_text("cluster-status", "New user", "unknown"), p.text("cluster-status")
        assert not any(u["name"] == "fran" for u in store.users())
    finally:
        driver.quit()
