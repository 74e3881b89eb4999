"""My writing: the user's history (paste, upload, a demo user), its items edited one by one, the task served,
and Forget me."""

from __future__ import annotations

import gradio as gr

from personalize.data import TASKS
from personalize.display import md, md_quoting
from personalize.studio.histories import ReplaceAsk
from personalize.ui.common import Markdown, bind, guarded
from personalize.ui.controls import N_SERVED, Shared, served_values
from personalize.ui import text as page_text

FORGET_NOTE = ("Deletes everything the studio keeps of this user: history, styles and their versions, votes, "
               "generated outputs, EXACT memory, OPPU adapter and exports that hold them. Ratings keep only their "
               "verdict (no texts, no name: where the name was typed as a rater id, an anonymous id replaces it).")


def item_choices(studio, name: str | None):
    """Compare's history-item picker, refilled with this user's items."""
    return gr.update(choices=studio.histories.item_choices(name), value=None)


def served(studio) -> tuple:
    """What a task switch or a page load refreshes: the shared controls, then the demo users of the build."""
    return (*served_values(studio), gr.update(choices=studio.histories.demo_choices(), value=None))


@guarded(4, 2)
def load_demo(studio, demo, name):
    text, name = studio.histories.demo_pick(demo, name)
    return text, name, "", None  # the box holds a fresh, unsaved history


def user_changed(studio, name, shown_for, picked):
    """A typed name: the box, the items and the pickers follow it; the stored-user picker no longer shows someone
    else (it shows the name only when that is the person picked)."""
    res = studio.histories.switch_user(name, shown_for)
    message = md_quoting(res.message, (name or "").strip())  # the library's line quotes the name
    picker = gr.skip() if picked == (name or "").strip() else gr.update(value=None)
    return (("" if res.clear else gr.skip()), res.rows, item_choices(studio, name), message, res.shown_for,
            picker, replaced_choices(studio, name), "")  # "Forgot …" was about the name before


def replaced_choices(studio, name: str | None):
    """The restore picker, refilled with this user's replaced histories."""
    return gr.update(choices=studio.histories.replaced_choices(name), value=None)


@guarded(1 + N_SERVED + 2)
def switch_task(studio, task_name):
    """The task dropdown always shows the task served: after "no build for it", the one still served."""
    res = studio.served_builds.switch_task(task_name)
    if not res.switched:
        return (res.message, *[gr.skip()] * (N_SERVED + 1), studio.served.task.name)
    return (res.message, *served(studio), studio.served.task.name)


@guarded(7)
def save(studio, name, text, file, task_name, demo, confirmed_for):
    """Save; under a name that has a history, the first press asks and a second press (same name) replaces."""
    typed = (name or "").strip()
    try:
        res = studio.save_from(name, text, file, task_name, demo, replace=bool(typed) and confirmed_for == typed)
    except ReplaceAsk as ask:
        return (f"⚠️ {md_quoting(str(ask), typed)}", *[gr.skip()] * 5, typed)
    return (page_text.save_message(studio, res, shown_name=md(res.name)), studio.histories.item_rows(res.name),
            gr.update(choices=studio.histories.user_names()), item_choices(studio, res.name), res.name,
            replaced_choices(studio, res.name), None)


@guarded(5)
def restore_history(studio, name, replaced_id):
    """The restored history in the table and in the text box (which held the one it replaced)."""
    msg = studio.histories.restore_history(name, replaced_id)
    typed = name.strip()
    return (md_quoting(msg, typed), studio.histories.item_rows(typed), replaced_choices(studio, typed),
            studio.histories.as_paste(typed), typed)


@guarded(3)
def update_item(studio, name, item_id, text):
    msg = studio.histories.update_item(name, item_id, text)
    return msg, studio.histories.item_rows(name.strip()), item_choices(studio, name.strip())


@guarded(3)
def delete_item(studio, name, item_id):
    msg = studio.histories.delete_item(name, item_id)
    return msg, studio.histories.item_rows(name.strip()), item_choices(studio, name.strip())


@guarded(8)
def open_user(studio, name):
    """A stored person opened. The task list keeps the task served: a person of another task is opened under it
    (the line says so), and the next new person's Save is not refused for a task nobody chose."""
    if not name:
        return (gr.skip(),) * 8
    u = studio.histories.open_user(name)
    other = "" if u["task"] == studio.served.task.name else (
        f" They were saved under {md(u['task'])}; this studio serves {md(studio.served.task.name)} (choose "
        f"{md(u['task'])} in the Task list to switch to its build).")
    # the text box is emptied: it held someone else's text (the opened user's items are in the table)
    return (f"Opened **{md(u['name'])}** ({u['n_items']} items, task {md(u['task'])}).{other}", name,
            studio.histories.item_rows(name), item_choices(studio, name), replaced_choices(studio, name), "", None, "")


@guarded(8)
def forget(studio, name, ok):
    """Forget me: the status line, and the page no longer holds the person (name, history box, items, and the line
    above the items that counted them)."""
    res = studio.own_data.forget(name, ok)
    ids = (f"{res.rater_ids_anonymised} vote(s) cast with the name as rater id kept under an anonymous id, "
           if res.rater_ids_anonymised else "")
    return (f"Forgot **{md(name.strip())}**: {res.rows_deleted} stored rows deleted, {res.ratings_anonymised} rating(s) "
            f"and {res.campaign_items_anonymised} campaign item(s) kept without texts or name, {ids}"
            f"{sum(res.exports.values())} of their record(s) taken out of {len(res.exports)} export(s), "
            f"{len(res.files)} file(s) removed, database compacted.",
            False, [], gr.update(choices=studio.histories.user_names(), value=None), "", "", None,
            studio.histories.standing(""))


def build(studio, shared: Shared) -> None:
    with gr.Tab("My writing", id="writing"):
        with gr.Row():
            task = gr.Dropdown(sorted(TASKS), value=studio.served.task.name, label="Task", elem_id="task")
            demo_user = gr.Dropdown(studio.histories.demo_choices(), label="Demo user", value=None, elem_id="demo-user")
            demo_btn = gr.Button("Load demo user", elem_id="load-demo")
        history = gr.Textbox(lines=10, max_lines=20, label="Your writing history (one item per line, or blocks "
                             "separated by a blank line)", elem_id="history")
        upload = gr.File(label="…or upload .txt / .jsonl / .csv / LaMP questions .json",
                         file_types=[".txt", ".jsonl", ".csv", ".json"], elem_id="upload")
        save_btn = gr.Button("Save history", variant="primary", elem_id="save-history")
        status = Markdown(elem_id="writing-status")
        items = gr.Dataframe(headers=["#", "text", "neutral rewrite"], interactive=False,
                             label="Stored items, newest first (a paste's last line is 1)",
                             elem_id="items")
        with gr.Row():
            item_id = gr.Textbox(label="Item number", placeholder="the # of an item above", max_lines=1,
                                 elem_id="item-id")  # a Number box would show 0 before anything is typed
            item_text = gr.Textbox(label="New text", elem_id="item-text", scale=3)
            edit_btn = gr.Button("Update item", elem_id="update-item")
            delete_btn = gr.Button("Delete item", variant="stop", elem_id="delete-item")
        with gr.Accordion("Earlier histories", open=False, elem_id="earlier-box"):
            Markdown("A Save under a name that has a history asks first, then keeps the replaced history here.")
            with gr.Row():
                earlier = gr.Dropdown([], label="Replaced history", value=None, elem_id="earlier-pick", scale=3)
                restore_btn = gr.Button("Restore it", elem_id="restore-history")
        with gr.Accordion("Forget me", open=False, elem_id="forget-box"):
            Markdown(FORGET_NOTE)
            with gr.Row():
                forget_ok = gr.Checkbox(label="Yes, delete everything of this user", elem_id="forget-confirm")
                forget_btn = gr.Button("Forget me", variant="stop", elem_id="forget-button")
            forget_status = Markdown(elem_id="forget-status")
        confirm_for = gr.State(None)  # the name whose history a second Save may replace (save asked first)

    user, stored, shown_for, pick = shared.user, shared.stored, shared.shown_for, shared.prompt.item
    shared.task, shared.demo_user = task, demo_user
    served_outputs = [*shared.served_outputs, demo_user]
    assert len(served_outputs) == N_SERVED + 1
    demo_btn.click(bind(load_demo, studio), [demo_user, user], [history, user, status, shown_for])
    user.input(bind(user_changed, studio), [user, shown_for, stored],
               [history, items, pick, status, shown_for, stored, earlier, forget_status],
               concurrency_limit=None, trigger_mode="always_last", show_progress="hidden")
    shared.of_person((confirm_for, None))  # another name: no replace pending
    task.input(bind(switch_task, studio), [task], [status, *served_outputs, task], concurrency_id="model",
               api_name="switch_task")
    shared.saved = save_btn.click(bind(save, studio), [user, history, upload, task, demo_user, confirm_for],
                                  [status, items, stored, pick, shown_for, earlier, confirm_for],
                                  api_name="save_history")
    restore_btn.click(bind(restore_history, studio), [user, earlier], [status, items, earlier, history, shown_for])
    edit_btn.click(bind(update_item, studio), [user, item_id, item_text], [status, items, pick])
    delete_btn.click(bind(delete_item, studio), [user, item_id], [status, items, pick])
    stored.change(bind(open_user, studio), [stored], [status, user, items, pick, earlier, history, shown_for,
                                                    forget_status])
    forget_btn.click(bind(forget, studio), [user, forget_ok],
                     [forget_status, forget_ok, items, stored, user, history, shown_for, status], concurrency_id="model",
                     api_name="forget")
    # a page opened after a switch (in another session) shows the build now served
    shared.app.load(lambda: (*served(studio), studio.served.task.name), None, [*served_outputs, task])
