"""The components several tabs read, made in one place (`page_top`) and handed to every tab as `Shared`.

The page's top (title, user name, stored users) is laid out here. The other shared components are made
unrendered and placed (`.render()`) by the one tab that shows them, where they always were: the decoding
controls α, top-k and max new tokens in Compare, the K slider in My cluster, the prompt in Compare, the
versions table in Fit my style. Compare, Why, Quick pair, Explore and Fit all read these same components.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import gradio as gr

from personalize.ui.common import VERSION_COLUMNS, Markdown
from personalize.ui import text as page_text

N_SERVED = 7  # len(Shared.served_outputs) == len(served_values(studio))


def k_label(ks) -> str:
    return f"Cluster count K (snaps to a built value: {', '.join(map(str, ks))})"


def template_label(task_name: str) -> str:
    return f"wrap in the {task_name} task template"


@dataclass
class Decoding:
    """What the methods decode with: α, top-k and max new tokens (shown in Compare), and the K the user is at
    (My cluster's slider sets it; the build's default until then)."""

    alpha: gr.Slider
    top_k: gr.Slider
    max_tokens: gr.Slider
    k: gr.State
    k_slider: gr.Slider

    @property
    def sliders(self) -> list:
        """The values studio.settings(alpha, top_k, max_new_tokens) takes."""
        return [self.alpha, self.top_k, self.max_tokens]

    @property
    def inputs(self) -> list:
        """The sliders and K: a model handler's last four arguments (alpha, top_k, max_tokens, k)."""
        return [*self.sliders, self.k]


@dataclass
class PromptInput:
    """Compare's prompt: Why explains CARD on it, Quick pair falls back to it."""

    text: gr.Textbox
    templated: gr.Checkbox
    item: gr.Dropdown  # …or a history item as the prompt; My writing keeps its choices to the user's items

    @property
    def inputs(self) -> list:
        return [self.text, self.templated, self.item]


@dataclass
class Shared:
    """The components more than one tab reads or writes. Each tab's build(studio, shared) lays out the rest."""

    app: gr.Blocks  # the page: for page-load events
    header: gr.Markdown  # the build served
    user: gr.Textbox  # the user name, top of the page
    stored: gr.Dropdown  # …or open a stored user
    shown_for: gr.State  # whose saved history My writing's box holds (None: a fresh paste, or nothing)
    decoding: Decoding
    prompt: PromptInput
    versions: gr.Dataframe  # the user's style versions: shown in Fit, a thumb in Compare adds one
    saved: object = None  # My writing's Save event (set by writing.build): My cluster redraws after it
    task: object = None  # My writing's task list and demo picker (set by writing.build): a build served from
    demo_user: object = None  # the Populations tab refreshes them too
    # what shows one person's results (a fit, outputs, a trace, a sweep), with its empty value: emptied when
    # the user name changes, so no tab shows a person's results under another's name (forget_previous_person)
    per_person: list = field(default_factory=list)

    def of_person(self, *pairs) -> None:
        """Registers (component, empty value) pairs as showing one person's results."""
        self.per_person.extend(pairs)

    @property
    def served_outputs(self) -> list:
        """What depends on the build served (after a task switch, or on a page load): served_values."""
        d = self.decoding
        return [self.header, d.k_slider, d.k, d.alpha, d.top_k, d.max_tokens, self.prompt.templated]


def served_values(studio) -> tuple:
    """Shared.served_outputs' values for the build now served."""
    s, ks, k0 = studio.settings(), studio.served_builds.ks, studio.snap_k(None)
    return (page_text.header(studio), gr.update(minimum=min(ks), maximum=max(ks), value=k0, label=k_label(ks)), k0,
            s.alpha, s.top_k, s.max_new_tokens, gr.update(label=template_label(studio.served.task.name)))


def page_top(studio, app: gr.Blocks) -> Shared:
    """Lays out the title and the user row; makes the other shared components for the tabs that show them."""
    header = Markdown(page_text.header(studio), elem_id="header")
    with gr.Row():
        user = gr.Textbox(label="User name", placeholder="e.g. ana", elem_id="user-name", scale=2)
        # empty in the page's config, which every visitor gets: each page load fills in its login's own people
        stored = gr.Dropdown(choices=[], label="…or open a stored user", value=None,
                             elem_id="stored-users", scale=2)
    s0, ks, k0 = studio.settings(), studio.served_builds.ks, studio.snap_k(None)
    decoding = Decoding(
        alpha=gr.Slider(0, 4, value=s0.alpha, step=0.1, label="Strength α (0 = the cluster model)", elem_id="alpha",
                        render=False),
        top_k=gr.Slider(1, 200, value=s0.top_k, step=1, label="Top-k candidates", elem_id="top-k", render=False),
        max_tokens=gr.Slider(4, 128, value=s0.max_new_tokens, step=1, label="Max new tokens", elem_id="max-tokens",
                             render=False),
        k=gr.State(k0),
        k_slider=gr.Slider(min(ks), max(ks), value=k0, step=1, label=k_label(ks), elem_id="k-slider", render=False))
    prompt = PromptInput(
        text=gr.Textbox(label="Prompt", lines=2, elem_id="prompt", scale=3, render=False),
        templated=gr.Checkbox(value=True, label=template_label(studio.served.task.name), elem_id="use-template",
                              render=False),
        item=gr.Dropdown([], label="…or a history item as the prompt (its text is the reference)", value=None,
                         elem_id="item-pick", scale=3, render=False))
    versions = gr.Dataframe(headers=list(VERSION_COLUMNS), interactive=False, elem_id="versions", render=False)
    app.load(lambda: gr.update(choices=studio.histories.user_names()), None, [stored])
    return Shared(app, header, user, stored, gr.State(None), decoding, prompt, versions)


def follow_build(studio, shared: Shared, every_s: float = 5.0) -> None:
    """While the first start's build finishes (studio.coming), the title line says what is still coming and when;
    once it is done, the page takes the build's settings (the α its check chose) without a reload. Ticks touch no
    person's data and skip the queue (a Compare in progress does not hold them)."""
    pending = gr.State(lambda: studio.coming.pending)

    def tick(was_pending):
        now = studio.coming.pending
        if was_pending and not now:  # it just finished: the title without the line, the α card's check chose
            return now, page_text.header(studio), studio.settings().alpha
        return now, page_text.header(studio) if now else gr.skip(), gr.skip()

    gr.Timer(every_s).tick(tick, [pending], [pending, shared.header, shared.decoding.alpha], queue=False,
                           show_progress="hidden")


def forget_previous_person(studio, shared: Shared) -> None:
    """When the user name changes (typed, a stored user opened, a demo user loaded, forgotten), every tab's
    results of the previous person are emptied and the versions table shows the new person's."""
    from personalize.ui.common import version_rows

    components = [c for c, _ in shared.per_person]
    empty = [v for _, v in shared.per_person]

    def switched(name):
        return (*empty, version_rows(studio, name))

    shared.user.change(switched, [shared.user], [*components, shared.versions], queue=False,
                       show_progress="hidden")
