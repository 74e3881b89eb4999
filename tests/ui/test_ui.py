"""The app's rules (Studio methods the tabs call) and the tabs' handlers, called without a server, on the tiny
artifacts and a real SQLite file; and the page built from the tab modules, without starting it."""

from __future__ import annotations

import gradio as gr
import pytest

from personalize.data import Item
from personalize.store import StoreError
from personalize.ui import compare, explore, leaderboard_tab as leaderboard, quick_pair, why, writing

from conftest import tiny_studio

LINES = [f"ok so the {w} was fine i guess" for w in ("bus", "tea", "rain", "film", "shop", "walk", "game", "cake")]
NO_PROGRESS = lambda *a, **k: None  # noqa: E731  (gr.Progress outside an event)


@pytest.fixture(scope="module")
def studio(tiny_artifacts, tmp_path_factory):
    s = tiny_studio(tiny_artifacts, tmp_path_factory.mktemp("ui"))
    yield s
    s.runtime.store.close()


# ---------------------------------------------------------------- rules the UI calls

def test_user_name_and_alpha_list_rules(studio):
    assert studio.runtime.need_user("  ana ") == "ana"
    for blank in (None, "", "   "):
        with pytest.raises(ValueError, match="user name"):
            studio.runtime.need_user(blank)
    assert studio.explorer.parse_alphas("0, 0.5;2 ,") == [0.0, 0.5, 2.0]
    assert studio.explorer.parse_alphas("") == [] and studio.explorer.parse_alphas(None) == []
    with pytest.raises(ValueError, match="numbers separated by commas, got '1, x'"):
        studio.explorer.parse_alphas("1, x")
    with pytest.raises(ValueError, match="at most 12"):
        studio.explorer.parse_alphas(",".join(["1"] * 13))


def test_items_are_changed_only_by_their_owner(studio):
    """Item numbers are each person's own (1, 2, … in their history), never the store's global row ids: the
    second person's items start at 1 too, and a number reaches only the person's own item."""
    res = studio.save_from(" ivy ", "\n".join(LINES), None, "tweets")
    assert res.name == "ivy" and res.n_items == 8 and "ivy" in studio.histories.user_names()
    studio.histories.save_history("jon", [Item(LINES[0]), Item(LINES[1])], "tweets")
    assert [r[0] for r in studio.histories.item_rows("ivy")] == list(range(1, 9))
    assert [r[0] for r in studio.histories.item_rows("jon")] == [1, 2]  # not 9, 10
    assert studio.histories.item_choices("jon")[0] == (f"1: {LINES[0]}", 1)
    assert studio.histories.update_item("ivy", 1, "edited") == "Item 1 updated. Refit to use it."
    assert studio.runtime.store.items("ivy")[0].y == "edited" and studio.runtime.store.items("jon")[0].y == LINES[0]
    assert studio.histories.update_item("ivy", " 2 ", "typed") == "Item 2 updated. Refit to use it."  # the page's box
    with pytest.raises(ValueError, match="ivy has no item 9"):
        studio.histories.update_item("ivy", 9, "not mine")
    with pytest.raises(ValueError, match="enter the number"):
        studio.histories.update_item("ivy", None, "x")
    with pytest.raises(ValueError, match="one of this user's items"):
        studio.histories.delete_item("ivy", 99)
    assert "deleted" in studio.histories.delete_item("jon", 1.0)
    with pytest.raises(ValueError, match="last item"):
        studio.histories.delete_item("jon", 2)
    assert [r[0] for r in studio.histories.item_rows("jon")] == [2]  # a number stays the item's when another goes
    assert studio.runtime.store.items("jon")[0].y == LINES[1] and len(studio.runtime.store.items("ivy")) == 8
    assert "deleted" in studio.histories.delete_item("ivy", float(3)) and len(studio.runtime.store.items("ivy")) == 7
    with pytest.raises(StoreError):
        studio.histories.update_item("nobody", 1, "x")


def test_prompts_from_text_an_item_or_compare(studio):
    studio.histories.save_history("kim", [Item(t) for t in LINES[:4]], "tweets")
    task = studio.runtime.task
    assert studio.histories.resolve_prompt(" hello ", True) == (task.prompt("hello"), None)
    assert studio.histories.resolve_prompt("hello", False, None) == ("hello", None)
    item = studio.runtime.store.items("kim")[1]
    full, ref = studio.histories.resolve_prompt("", True, 2, "kim")  # a picked item (number 2), no text: its prompt, its text
    assert ref == item.y and full == (item.x or task.prompt(item.neutral or item.y))
    assert studio.histories.resolve_prompt("typed wins", False, 2, "kim") == ("typed wins", None)
    assert studio.histories.item_reference("kim", 2) == item.y and studio.histories.item_reference("kim", None) is None
    studio.histories.save_history("lou", [Item("lou's own words here")], "tweets")
    assert studio.histories.item_reference("lou", 2) is None  # kim's second item is not lou's
    with pytest.raises(ValueError, match="no longer exists"):
        studio.histories.resolve_prompt(None, True, 10**9, "kim")
    with pytest.raises(ValueError, match="empty"):
        studio.histories.resolve_prompt("  ", True)
    # Quick pair: its own box, else Compare's; never wrapped twice
    assert studio.histories.pair_prompt("", "from compare", False) == "from compare"
    assert studio.histories.pair_prompt("mine", "from compare", True) == task.prompt("mine")
    assert studio.histories.pair_prompt(None, task.prompt("x"), True) == task.prompt("x")


def test_history_choice_cluster_view_and_guards(studio):
    demo = sorted(studio.runtime.demo_users)[0]
    text, name = studio.histories.demo_pick(demo, "")
    assert name == demo and studio.histories.demo_pick(demo, "lee")[1] == "lee"
    with pytest.raises(ValueError, match="pick a demo user"):
        studio.histories.demo_pick(None, "lee")
    assert studio.histories.history_from(text, None, demo) == studio.histories.demo_items(demo)  # the demo user's prompts come along
    assert [it.y for it in studio.histories.history_from(text + "\nmore", None, demo)][0] == "more"  # edited: a paste
    view = studio.clusters.cluster_view("", 3, previous=2)
    assert view.state is None and view.k == 4 and view.map.user is None
    studio.histories.save_history("mo", [Item(t) for t in LINES], "tweets")
    view = studio.clusters.cluster_view(" mo ", None)
    assert view.state.name == "mo" and view.k == studio.runtime.snap_k(None) and view.map.user[0] == "mo"
    with pytest.raises(ValueError, match="version to restore"):
        studio.fits.restore("mo", None)
    with pytest.raises(ValueError, match="tick the box"):
        studio.own_data.forget("mo", False)
    assert studio.runtime.store.user("mo")
    with pytest.raises(ValueError, match="choose at least one method"):
        studio.comparisons.compare_plan("mo", "hi", True, None, [])
    plan = studio.comparisons.compare_plan("mo", "hi", True, None, ["exact", "base"])
    assert plan.order == ["base", "exact"] and plan.first_use == {"exact": True, "base": False}


# ---------------------------------------------------------------- handlers, no server

def test_writing_handlers_answer_in_the_status_line(studio):
    msg, rows, users, picks, shown, earlier, confirm = writing.save(studio, "nia", "\n".join(LINES), None, "tweets",
                                                                    None, None)
    assert "Saved **8** items for **nia**" in msg and len(rows) == 8 and shown == "nia" and confirm is None
    assert "nia" in users["choices"] and len(picks["choices"]) == 8 and earlier["choices"] == []
    out = writing.save(studio, "nia", "\n".join(LINES[:3]), None, "tweets", None, None)  # a name with a history:
    assert "already has 8 stored items" in out[0] and out[-1] == "nia"  # asked first, the next press confirms
    assert len(studio.runtime.store.items("nia")) == 8
    out = writing.save(studio, "nia", "\n".join(LINES[:3]), None, "tweets", None, "nia")
    assert "Saved **3** items" in out[0] and len(out[5]["choices"]) == 1  # the 8 kept under Earlier histories
    msg, rows, earlier, box, shown = writing.restore_history(studio, "nia", out[5]["choices"][0][1])
    assert "Restored 8 items" in msg and len(rows) == 8
    assert box == "\n".join(LINES) and shown == "nia"  # the text box shows the restored history, not the replaced one
    out = writing.update_item(studio, "nia", 10**9, "x")  # expected errors: the status line, the rest kept
    assert out[0].startswith("⚠️") and "nia has no item" in out[0]
    assert all(isinstance(o, type(gr.skip())) for o in out[1:])
    out = writing.save(studio, "", "text", None, "tweets", None, None)
    assert "user name" in out[0] and len(out) == 7
    assert writing.open_user(studio, None) == (gr.skip(),) * 8


def test_model_handlers_without_a_server(studio):
    studio.histories.save_history("oz", [Item(t) for t in LINES], "tweets")
    status, *_ = explore.explore(studio, "oz", "1, x", 4, 1.0, 50, 4, progress=NO_PROGRESS)
    assert status.startswith("⚠️") and "must be numbers" in status
    first = next(compare.compare(studio, "oz", "hi", True, None, [], 1.0, 50, 4, None))
    assert "choose at least one method" in first[0] and len(first) == 1 + len(compare.ALL_METHODS)
    steps = list(compare.compare(studio, "oz", "the bus", True, None, ["base"], 1.0, 50, 4, None))
    assert steps[-1][0].startswith("Done: 1 method for **oz**") and "tok/s" in steps[-1][1]["value"]
    status, tokens, _, _, res = why.why(studio, "oz", "the bus", True, None, 1.0, 50, 4, None)
    assert "the user vector changed" in status and isinstance(tokens, list)
    assert res.steps and why.why_step(len(res.steps) + 5, res) != gr.skip()  # past the end: the last step
    assert why.why_step(0, None) == gr.skip()  # nothing explained yet: the plot is left as it is

    status, a, b, pid = quick_pair.draw_pair(studio, "oz", "rae", "the tea", ["base", "cluster"], "", True, 1.0, 50,
                                             4, None)
    assert "which output fits **oz**'s style" in status and a.startswith("**A**") and pid
    voted, cleared = quick_pair.vote(studio, "tie", pid, "ignored", login="rae")  # --auth: the logged-in name
    assert "stored (tie, rater rae)" in voted and cleared is None
    again, _ = quick_pair.vote(studio, "a", pid, "rae")
    assert again.startswith("⚠️")  # the pair is closed
    status, rows, *_ = leaderboard.standings(studio)
    assert " between " in status and rows
    studio.votes.wait_feedback()


def test_the_page_has_the_tabs_in_order_and_unique_element_ids(studio):
    import app as studio_app

    page = studio_app.build_app(studio)
    blocks = list(page.blocks.values())
    tabs = [b.label for b in blocks if isinstance(b, gr.Tab)]
    assert tabs == ["My writing", "My cluster", "Fit my style", "Compare", "Why", "Rate", "Quick pair", "Leaderboard",
                    "Campaigns", "Export", "Explore", "Populations"]
    ids = [b.elem_id for b in blocks if getattr(b, "elem_id", None)]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    # the shared decoding controls exist once, shown in Compare
    assert ids.count("alpha") == ids.count("k-slider") == ids.count("prompt") == ids.count("versions") == 1


def test_rate_handlers_serve_units_and_clear_the_rubric_scores(studio):
    """The Rate tab's handlers without a server: a rubric unit is judged, the next one comes with the scores
    cleared (no rater resubmits the previous unit's scores by mistake); an incomplete score keeps what was typed."""
    from personalize.humaneval.campaign_schema import CampaignConfig, CampaignItem
    from personalize.ui import rate

    items = [CampaignItem(f"p{i}", f"prompt {i}", tuple(f"h{i}.{j}" for j in range(5))) for i in range(2)]
    studio.runtime.campaigns.create("ui-rubric", items, CampaignConfig(("base", "card"), mode="rubric", raters_per_item=1))
    for item, m in studio.runtime.campaigns.missing("ui-rubric"):
        studio.runtime.campaigns.add_output(item["id"], m, f"{m} text {item['position']}", 0.0)
    first = rate.next_unit(studio, "ui-rubric", "r1")
    assert len(first) == rate.N_OUT and first[1].startswith("**0 of 4 done**") and first[0] is not None
    kept = rate.judge_unit(studio, None, "ui-rubric", "r1", first[0], 4, None, 5)
    assert "rubric" in kept[rate.STATUS] and all(isinstance(v, dict) for v in kept[-3:])  # gr.skip(): kept
    after = rate.judge_unit(studio, None, "ui-rubric", "r1", first[0], 4, 3, 5)
    assert after[rate.STATUS].startswith("Judgment #") and after[0] != first[0]
    assert after[-3:] == (None, None, None) and after[1].startswith("**1 of 4 done**")
    assert rate.next_unit(studio, "ui-rubric", "")[rate.STATUS].startswith("⚠️")  # no rater id
    assert "choose a campaign first" in rate.next_unit(studio, None, "r1")[rate.STATUS]


def test_rate_says_where_campaigns_come_from_when_there_is_none(studio, monkeypatch):
    from personalize.ui import rate

    monkeypatch.setattr(studio.runtime.campaigns, "names", lambda: [])  # a fresh studio: no campaign made yet
    assert "make one in the Campaigns tab" in rate.next_unit(studio, None, "r1")[rate.STATUS]


def test_an_item_number_is_read_as_typed():
    from personalize.studio.histories import item_number

    assert [item_number(v) for v in (None, "", "  ", "3", " 3 ", 3, 3.0, "3.0")] == [None, None, None, 3, 3, 3, 3, 3]
    for bad in ("three", "1.5", 2.5):
        with pytest.raises(ValueError, match="whole number"):
            item_number(bad)


def test_every_tab_sits_in_the_one_row_of_tabs(studio):
    """Issue 49: Explore and Populations sat under every tab as a second row of tabs (the Export tab's hidden API
    components, made outside its tab, ended Gradio's implicit row); all twelve are now in one Tabs, and nothing
    else is in it: the tab bar numbers its buttons by their place among the Tabs' children, so a State made beside a
    tab relabelled the next tab's button with the name of the one before once that tab was opened (two My cluster,
    no Fit my style)."""
    import app as studio_app

    page = studio_app.build_app(studio)
    tabs = [b for b in page.blocks.values() if isinstance(b, gr.Tab)]
    assert len(tabs) == 12 and len({id(t.parent) for t in tabs}) == 1 and isinstance(tabs[0].parent, gr.Tabs)
    ids = [t._id for t in tabs]  # the layout the page is sent: one node holds the twelve tabs, in order
    rows = [c for c in page.config["layout"]["children"] if any(g["id"] in ids for g in c.get("children", []))]
    assert len(rows) == 1 and [g["id"] for g in rows[0]["children"]] == ids, rows


def test_export_says_whose_records_it_holds(studio, monkeypatch):
    """With logins an export holds the login's own records (table_export.rows); without, every one: said on the tab
    of the page as built for the studio's setting."""
    import dataclasses

    import app as studio_app
    from personalize.ui.export_tab import export_scope

    assert export_scope(True).startswith("Your records only") and "every vote" in export_scope(False)

    def shown(page):
        return [b.value for b in page.blocks.values() if isinstance(b, gr.Markdown) and b.value in
                (export_scope(True), export_scope(False))]

    assert shown(studio_app.build_app(studio)) == [export_scope(False)]  # this studio runs without logins
    monkeypatch.setattr(studio.runtime, "cfg", dataclasses.replace(studio.runtime.cfg, logins=True))
    assert shown(studio_app.build_app(studio)) == [export_scope(True)]


def test_a_failed_fit_is_not_followed_by_the_decoded_check(studio, monkeypatch):
    """Fit's decoded check follows a fit that stored a style; after a refused one (the status says why) it decodes
    nothing and says nothing more."""
    from personalize.ui import fit

    asked = []
    monkeypatch.setattr(studio.explorer, "verdict", lambda name, progress=None: asked.append(name) or "decoded")
    assert list(fit.decoded_check(studio, "nobody", "⚠️ unknown user 'nobody' (the stored vector, if any, is "
                                  "unchanged)")) == [""] and not asked
    studio.histories.save_history("checked", studio.histories.demo_items("formal_01"), "tweets")
    lines = list(fit.decoded_check(studio, "checked", "Fitted **checked** in 0.5 s"))
    assert lines[-1] == "**decoded**" and "queued for the model" in lines[0]  # said at once, then the verdict
    assert asked == ["checked"]
