"""Fit my style: the user's style fitted on their history, its versions (restore one), and the style key."""

from __future__ import annotations

import time

import gradio as gr

from personalize.display import md
from personalize.ui.common import EXPECTED, VERSION_COLUMNS, Markdown, _err, bind, guarded, version_rows
from personalize.ui.controls import Shared
from personalize.ui.figures import loss_figure
from personalize.ui import text as page_text

INTRO = ("Fits your style on your history: neutral rewrites of pasted items and one teacher-forced pass of your "
         "cluster's model (of your own adapter, for a cluster of one), started when you saved, then milliseconds "
         "to fit your user vector λ (128 numbers) jointly with a sparse bias over the words you use, a bias on how "
         "you open a text (your first words, counted from your history), and a memory of what you wrote after each "
         "state of that pass.")
STAGES = ["assign", "neutral rewrites", "negatives", "features", "fit"]  # studio.fits.fit's progress, in order


def fit(studio, name, k, progress=gr.Progress()):
    try:
        name = studio.need_user(name)
        progress(0, desc="starting")
        t0 = time.perf_counter()
        res = studio.fits.fit(name, k, progress=lambda st: progress(
            (STAGES.index(st) if st in STAGES else 0) / len(STAGES), desc=st))
        total = time.perf_counter() - t0
        studio.first_use_jobs.after_fit(name)
    except EXPECTED as e:
        return _err(e) + " (the stored vector, if any, is unchanged)", gr.skip()
    held = studio.histories.held_out_line(name, res.n_hold)  # which of their lines judged it
    return (page_text.fit_message(studio, name, res, total, shown_name=md(name)) + (f"\n\n{held}" if held else ""),
            loss_figure(res.loss_curve) if res.loss_curve else None)


def version_to_restore(table) -> int | None:
    """What the Version box offers for the versions table shown (newest first): the newest version that is not
    the current one, else the current one (a person with one version sees 1, never a version 0 that does not
    exist), else nothing."""
    rows = table.values.tolist() if hasattr(table, "values") else list(table or [])
    rows = [dict(zip(VERSION_COLUMNS, r)) for r in rows if r and str(r[0]).strip() not in ("", "nan")]
    if not rows:
        return None
    current = [str(r.get("current")).strip().lower() in ("true", "1", "yes") for r in rows]  # cells read back
    pick = next((r for r, cur in zip(rows, current) if not cur), rows[0])
    return int(float(pick["version"]))


def decoded_check(studio, name, fitted):
    """Fit's verdict by decoding the held-out items (Explore's computation at α = 0 and the build's α), saying at
    once that it waits and what for (studio.explorer.verdict_lines); nothing after a fit that failed (its status
    says why, and the stored style is unchanged)."""
    if not str(fitted or "").startswith("Fitted"):
        yield ""
        return
    try:
        for final, line in studio.explorer.verdict_lines(studio.need_user(name)):
            yield f"**{md(line)}**" if final else f"*{md(line)}*"
    except EXPECTED as e:
        yield _err(e)


@guarded(1)
def own_adapter(studio, name):
    """Fit's switch: the person's own adapter, trained in the background (a cluster of one)."""
    name = studio.need_user(name)
    if studio.first_use_jobs.has_own(name):
        return md("Your own adapter is trained on your present history already; card decodes over it once fitted.")
    studio.first_use_jobs.start_own(name)
    return md(studio.first_use_jobs.base_words(name, False))


@guarded(2)
def restore(studio, name, version):
    return md(studio.fits.restore(name, version)), version_rows(studio, name)


@guarded(2)
def key_export(studio, name):
    key = studio.own_data.style_key(studio.need_user(name))
    return f"Your style key ({len(key)} characters): copy it with the button in the box.", key


@guarded(2)
def key_import(studio, name, text):
    res = studio.own_data.import_style_key(text, (name or "").strip() or None)
    return (f"Imported the key's style for **{md(res.user)}** as version {res.versions[-1]}"
            + (f" ({res.trimmed} smallest word-bias entries were left out of the key)." if res.trimmed
               else ".") + res.own_line), version_rows(studio, res.user)


def build(studio, shared: Shared) -> None:
    with gr.Tab("Fit my style", id="fit"):
        Markdown(INTRO)
        with gr.Row():
            fit_btn = gr.Button("Fit my style", variant="primary", elem_id="fit-button")
            own_btn = gr.Button("Train my own adapter", elem_id="own-adapter")
        check = Markdown(elem_id="fit-check")
        status = Markdown(elem_id="fit-status")
        plot = gr.Plot(elem_id="fit-plot")
        Markdown("**Versions of your style.** Every fit and every vote (👍 / 👎 in *Compare*, votes on your "
                 "outputs in *Quick pair*) refits your style and keeps the new version; any version can be restored.")
        shared.versions.render()
        with gr.Row():
            version_id = gr.Number(label="Version", precision=0, elem_id="version-id")
            restore_btn = gr.Button("Restore this version", elem_id="restore-version")
            refresh_btn = gr.Button("Refresh", elem_id="versions-refresh")
        Markdown("**Your style key**: your fitted style (λ and word bias), your clusters and this build's id in one "
                 "line of text, nothing of your writing. Keep it, or paste it into another studio that serves the "
                 "same build.")
        with gr.Row():
            key_btn = gr.Button("Show my style key", elem_id="key-export")
            import_btn = gr.Button("Import the key below", elem_id="key-import")
        style_key = gr.Textbox(label="Style key", lines=3, max_lines=6, buttons=["copy"], elem_id="style-key")
        owner_status = Markdown(elem_id="owner-status")

    user, versions, rows = shared.user, shared.versions, bind(version_rows, studio)
    shared.of_person((status, ""), (check, ""), (plot, None), (style_key, ""), (owner_status, ""))
    fitted = fit_btn.click(bind(fit, studio), [user, shared.decoding.k], [status, plot], concurrency_id="model",
                           api_name="fit")
    fitted.then(rows, [user], [versions])
    fitted.then(bind(decoded_check, studio), [user, status], [check], concurrency_id="model")
    own_btn.click(bind(own_adapter, studio), [user], [status])
    restore_btn.click(bind(restore, studio), [user, version_id], [owner_status, versions])
    refresh_btn.click(rows, [user], [versions])
    versions.change(version_to_restore, [versions], [version_id], queue=False, show_progress="hidden")
    key_btn.click(bind(key_export, studio), [user], [owner_status, style_key])
    import_btn.click(bind(key_import, studio), [user, style_key], [owner_status, versions])
