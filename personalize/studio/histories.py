"""A person's history: parsing a paste or a file, saving it (clusters assigned at once, the neutral rewrites started
in the background), editing their own items, the demo people, and where the person stands under the served build."""

from __future__ import annotations

from contextlib import suppress
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from personalize.methods.card.cluster import closeness, is_member
from personalize.methods.card.neutral import keeps_content
from personalize.methods.card.style import UserStyle
from personalize.data import TASKS, HistoryError, Item, history_text, parse_history, read_history_file
from personalize.methods.card.person import held_out_order, prepared_items, store_assignments
from personalize.metrics import repeated_text
from personalize.store import StoreError
from personalize.studio.service import Service


def shown_rewrite(item) -> str:
    """A stored item's neutral rewrite as the page may show it (its table, a picked item's prompt): empty where it
    adds content its text lacks (one stored before rewrites were checked for it; the next fit makes it again)."""
    return item.neutral if item.neutral and keeps_content(item.y, item.neutral) else ""


def number_ranges(numbers: Sequence[int]) -> str:
    """[3, 18, 19, 20] -> "3, 18-20"."""
    runs: list[list[int]] = []
    for n in sorted(numbers):
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


@dataclass
class UserState:
    """Where a user stands under the loaded artifacts: cluster at K, and λ if fitted (else λ = 1)."""

    name: str
    k: int
    cluster: int
    distances: list[float]
    lam: "UserStyle | None"  # the fitted style (λ, token bias, kNN memory); None: not fitted, λ = 1
    fit_stats: dict = field(default_factory=dict)

    @property
    def fitted(self) -> bool:
        return self.lam is not None


@dataclass(frozen=True)
class NameSwitch:
    """What My writing shows when the name is edited: whether the box empties, whose saved text it still holds,
    the name's stored items and a line about them."""
    clear: bool
    shown_for: str | None
    rows: list[list]
    message: str


@dataclass(frozen=True)
class Saved:
    """A saved history: the name as stored, its items (after `duplicates` exact repeats were dropped), its cluster
    at every K, the task, how close it is to its cluster (words), its embedding, and `nearer`: a line naming
    another build here whose population is nearer (Studio.save_from; empty when none)."""
    name: str
    n_items: int
    clusters: dict[int, int]
    duplicates: int
    task: str
    closeness: str
    embedding: np.ndarray = field(repr=False)
    nearer: str = ""


class ReplaceAsk(ValueError):
    """Save under a name that already has a history: the page asks before replacing it (a second Save does)."""


def item_number(value: str | float | None) -> int | None:
    """An item's number as typed in My writing's box ("" or None: none typed); a fraction or a word is refused."""
    text = str(value if value is not None else "").strip()
    if not text:
        return None
    with suppress(ValueError):  # not a number: refused below, as a fraction is
        if (number := float(text)).is_integer():
            return int(number)
    raise ValueError(f"an item number is a whole number from the table's first column, such as 3 (got {text!r})")


class Histories(Service):
    def __init__(self, rt):
        super().__init__(rt)
        self.rewrites = None  # the background rewrites of the last saved history (a Future)
        self.after_rewrites: list = []  # f(name), run after them on the same worker (Fits.read_ahead)

    def parse(self, text: str | None = None, file: str | None = None) -> list[Item]:
        """Items from a paste or an uploaded file; HistoryError says what is wrong with either."""
        if file:
            return read_history_file(file, task=self.task, max_bytes=self.cfg.max_history_chars)
        if not text or not text.strip():
            raise HistoryError("the history is empty: paste some texts you wrote (one per line), or upload a file")
        return parse_history(text, max_items=self.cfg.max_items, max_chars=self.cfg.max_history_chars)

    def save_history(self, name: str, items: Sequence[Item], task: str, replace_existing: bool = True) -> Saved:
        """Stores the history under `name` (replacing theirs: vector and clusters go with it) and assigns
        clusters at once (embedding only: seconds); the fit is a separate, explicit step. The duplicates are the
        exact repeats that parsing dropped (`parse` returns a data.History that knows them)."""
        if task not in TASKS:
            raise ValueError(f"unknown task {task!r}; choose from {sorted(TASKS)}")
        self.store.add_user(name, items, task, replace=replace_existing)
        name = self.store.user(name)["name"]
        embedding = self.embed_history(name)
        clusters = self.assign_all(name, embedding)
        self.rewrites = self.rt.background.submit(self.prepare_rewrites, name)  # Fit then waits only for what is left
        k = self.engine.cfg.default_k
        a = self.store.assignment(name, self.engine.artifacts_id, k)
        return Saved(name, len(items), clusters, int(getattr(items, "duplicates", 0)), task,
                     self.closeness(k, a["distances"]) if a else "", embedding)

    def ask_before_replacing(self, name: str, items: Sequence[Item]) -> None:
        """ReplaceAsk when `name` has a stored history: a Save never replaces one silently."""
        try:
            n_old = self.store.user(name)["n_items"]
        except StoreError:
            return  # a new name (or one another login holds: the store refuses that Save itself)
        raise ReplaceAsk(f"**{name}** already has {n_old} stored items. Press **Save history** again to replace "
                         f"them with these {len(items)}; the replaced history is kept, and *Earlier histories* "
                         "below brings it back.")

    def replaced_choices(self, name: str | None) -> list[tuple[str, int]]:
        """The histories Saves replaced, newest first, as (label, id) for the restore picker."""
        try:
            rows = self.store.replaced_histories(name.strip()) if name and name.strip() else []
        except StoreError:
            return []
        return [(f"replaced {r['replaced'][:19].replace('T', ' ')} · {r['n_items']} items · {r['task']}", r["id"])
                for r in rows]

    def restore_history(self, name: str | None, replaced_id: float | None) -> str:
        """Brings back a history a Save replaced (the current one is kept in its place); clusters are assigned
        again, the style is fitted anew by the person."""
        name = self.rt.need_user(name)
        if replaced_id is None:
            raise ValueError("pick one of the earlier histories first")
        n = self.store.restore_history(name, int(replaced_id))
        self.assign_all(name)
        self.rewrites = self.rt.background.submit(self.prepare_rewrites, name)
        return f"Restored {n} items for **{name}** (the history they replaced is kept too). Fit again to use them."

    def item_rows(self, name: str | None) -> list[list]:
        """The stored items table: [number, text, neutral rewrite]; the number is the item's place in the person's
        own history (1, 2, …; kept when others are deleted), the one Update, Delete and Compare's picker take. A
        rewrite stored before rewrites had to keep their content and adding some is not shown (the next fit makes
        it again)."""
        try:
            return [[s.position + 1, s.y, shown_rewrite(s)] for s in self.store.items(name)] if name else []
        except StoreError:  # not stored (yet), or not a valid name
            return []

    def repeat_line(self, name: str | None, text: str, items=None) -> str | None:
        """"repeats your text 12" (word for word, or "nearly": within ROUGE-L 0.8) when `text` is one of the
        person's stored texts handed back, else None: the page marks it on every method's output (issue 57).
        `items`: the person's stored items, where the caller has read them already."""
        try:
            items = items if items is not None else self.store.items(name) if name else []
        except StoreError:
            return None
        r = repeated_text(text, [s.y for s in items])
        if r is None:
            return None
        return f"repeats your text {items[r.index].position + 1}" + ("" if r.exact else " nearly")

    def held_out_line(self, name: str, n_hold: int) -> str:
        """Which items a fit held out to judge itself, by their numbers in My writing, in person.held_out_order's
        rule (issue 59): the newest (a paste's last lines, a dated file's by its dates), not an item whose rewrite
        gives its answer away."""
        stored = self.store.items(name)
        order, n_holdable = held_out_order(stored, {i: s.neutral for i, s in enumerate(stored) if s.neutral})
        if n_hold <= 0:
            return ("Nothing held out to judge it: the neutral rewrites of your texts nearly repeat them (short texts, "
                    "such as commit subjects, often do), so a held-out prompt would give its answer away; "
                    f"{n_holdable} of your {len(stored)} could be held out." if len(stored) >= 5 and
                    n_holdable < round(self.engine.cfg.holdout * len(stored)) else "")
        numbers = [stored[i].position + 1 for i in order[:n_hold]]
        skipped = [stored[i].position + 1 for i in order[n_hold:] if stored[i].position + 1 < max(numbers)]
        return (f"Held out to judge it: your newest {len(numbers)} items (a paste's last lines; a file with dates, by "
                f"its dates): {number_ranges(numbers)} in My writing, which lists the newest first"
                + (f"; not {number_ranges(skipped)}, whose neutral rewrite nearly repeats the text (it would give "
                   "the answer away)" if skipped else "") + ".")

    def as_paste(self, name: str | None) -> str:
        """The person's stored history as text to paste back (oldest first, as written: data.as_written)."""
        return history_text([row[1] for row in reversed(self.item_rows(name))])

    def own_item(self, name: str | None, number: float | None):
        """The person's item with this number (item_rows), or None: another person's items are never reached."""
        if number is None or not name or not name.strip():
            return None
        return next((s for s in self.store.items(name.strip()) if s.position + 1 == int(number)), None)

    def switch_user(self, name: str | None, shown_for: str | None) -> NameSwitch:
        """My writing when the user name is edited. `shown_for` is the user whose saved (or opened) history the
        text box still holds (None: the box holds a fresh paste, or nothing). Another name empties the box, so a
        new user starts from an empty history, never from the previous user's text; a fresh paste is kept (it
        is the new user's)."""
        name = (name or "").strip()
        clear = shown_for is not None and name != shown_for
        rows = self.item_rows(name) if name else []
        return NameSwitch(clear, None if clear else shown_for, rows, self.standing(name, len(rows)))

    def standing(self, name: str | None, n_items: int | None = None) -> str:
        """Where a typed name stands, in the words every tab uses for it (My writing, My cluster): one truth after
        a Forget me or before a Save, never "New user" on one tab and "unknown user" on another. `n_items`: the
        name's stored items, when the caller has them."""
        name = (name or "").strip()
        n = len(self.item_rows(name)) if name and n_items is None else (n_items or 0)
        if not name:
            return ""
        if n:
            return f"**{name}** has {n} stored items (table below); paste new writing to replace them."
        if self._taken(name):
            return f"The name **{name}** is taken: choose another user name."
        return f"New user **{name}**: paste your writing (or upload a file) and save it."

    def _taken(self, name: str) -> bool:
        try:
            return self.store.taken(name)
        except StoreError:  # not a valid name: Save says why
            return False

    def demo_history(self, user: str) -> str:
        """The demo person's texts as a paste that parse_history reads back (data.history_text)."""
        return history_text([it.y for it in reversed(self.demo_items(user))])  # as written: the newest last

    def demo_choices(self) -> list[tuple[str, str]]:
        """The demo picker: people the build never saw first, marked "new" (they are how a newcomer is placed),
        then those outside its training who chose its decoding settings, then the build's own population."""
        built = set(self.engine.meta.get("users", []))
        chose = set(self.engine.meta.get("report", {}).get("validation_people", [])) - built
        new = sorted(u for u in self.rt.demo_users if u not in built and u not in chose)
        return ([(f"{u} · new, not in the build", u) for u in new]
                + [(f"{u} · not trained on (chose the build's settings)", u) for u in sorted(chose & set(self.rt.demo_users))]
                + [(u, u) for u in sorted(set(self.rt.demo_users) & built)])

    def demo_items(self, user: str) -> list[Item]:
        if user not in self.rt.demo_users:
            raise ValueError(f"unknown demo user {user!r}")
        return list(self.rt.demo_users[user])

    def embed_history(self, name: str) -> np.ndarray:
        """The person's mean text embedding (their place among the clusters of every build with this encoder)."""
        return self.engine.embed([Item(y=s.y) for s in self.store.items(name)])

    def assign_all(self, name: str, embedding: np.ndarray | None = None) -> dict[int, int]:
        emb = self.embed_history(name) if embedding is None else embedding
        return store_assignments(self.engine, self.store, name, emb)

    def user_state(self, name: str, k: int | None = None) -> UserState:
        k = self.rt.snap_k(k)
        a = self.store.assignment(name, self.engine.artifacts_id, k)
        if a is None:  # stored before these artifacts were loaded
            self.assign_all(name)
            a = self.store.assignment(name, self.engine.artifacts_id, k)
        got = self.store.vector(name, self.engine.artifacts_id)
        stats = got[1]["stats"] if got else {}
        style = UserStyle.from_stored(self.store.style(name, self.engine.artifacts_id)) if got else None  # λ + token bias + memory
        return UserState(self.store.user(name)["name"], k, a["cluster"], a["distances"], style, stats)

    def closeness(self, k: int, distances: Sequence[float]) -> str:
        """The nearest cluster's distance in plain words (cluster.closeness), against the build's own people; a
        person whose distances are one of theirs is told they are one of them; "at its edge" where the build's
        far memory starts (StyleSettings.far_share)."""
        c = self.engine.clusters
        words, _ = closeness(c.embeddings, c.centroids[k], c.labels[k], min(distances),
                             member=is_member(c.embeddings, c.centroids[k], distances),
                             edge=self.engine.cfg.style.far_share)
        return words

    def prepare_rewrites(self, name: str) -> None:
        """The neutral rewrites of a saved history (§1.8), in the background: the slow part of a first fit."""
        with suppress(ValueError, StoreError):  # deleted or replaced meanwhile: Fit redoes what is missing
            with self.model_lock.background:  # Save's work: a person's Compare or Fit waiting goes first
                prepared_items(self.engine, self.store, name)
            for then in self.after_rewrites:  # the lock let go between: a waiting decode goes first
                then(name)

    def user_names(self) -> list[str]:
        """The stored users' names (the page's "open a stored user" list)."""
        return [u["name"] for u in self.store.users()]

    def open_user(self, name: str) -> dict:
        """A stored user picked from the list: {"name", "task", "n_items", ...}; StoreError when unknown."""
        return self.store.user(name)

    def demo_pick(self, demo: str | None, name: str | None) -> tuple[str, str]:
        """A demo user's history as the text to save, and the name to save it under (the typed one, else the
        demo user's); one another login holds is refused as taken, as Save would."""
        if not demo:
            raise ValueError("pick a demo user first")
        return self.demo_history(demo), self.rt.need_user(name or demo)

    def history_from(self, text: str | None, file: str | None = None, demo: str | None = None) -> list[Item]:
        """Which history Save stores: an uploaded file first; else the demo user's items (their prompts come with
        their texts) while the box still holds that demo user's history; else the pasted text."""
        if file:
            return self.parse(file=file)
        if demo and text and text.strip() == self.demo_history(demo).strip():
            return self.demo_items(demo)
        return self.parse(text=text)

    def item_choices(self, name: str | None) -> list[tuple[str, int]]:
        """The user's items as Compare's prompt choices: ("id: the first 80 characters", id)."""
        return [(f"{r[0]}: {r[1][:80]}", r[0]) for r in self.item_rows(name)]

    def update_item(self, name: str | None, item_id: str | float | None, text: str) -> str:
        """Edits one of the user's own items, by its number in their history; returns the status line."""
        name = self.rt.need_user(name)
        number = item_number(item_id)
        if number is None:
            raise ValueError("enter the number of the item to change (first column of the table)")
        st = self.own_item(name, number)
        if st is None:
            raise ValueError(f"{name} has no item {number}")
        self.store.update_item(st.id, text)
        return f"Item {number} updated. Refit to use it."

    def delete_item(self, name: str | None, item_id: str | float | None) -> str:
        """Deletes one of the user's own items (by number), never their last one; returns the status line."""
        name = self.rt.need_user(name)
        number = item_number(item_id)
        st = self.own_item(name, number)
        if st is None:
            raise ValueError("enter the number of one of this user's items (first column of the table)")
        if len(self.store.items(name)) <= 1:
            raise ValueError("this is the user's last item: a user needs at least one")
        self.store.delete_item(st.id)
        return f"Item {number} deleted. Refit to forget it."

    def item_reference(self, name: str | None, item_id: float | None) -> str | None:
        """The text of the person's history item picked as Compare's prompt (what its outputs are read against)."""
        try:
            st = self.own_item(name, item_id)
        except StoreError:  # a name not stored (yet)
            return None
        return None if st is None else st.y

    def resolve_prompt(self, text: str | None, templated: bool, item_id: float | None = None,
                       name: str | None = None) -> tuple[str, str | None]:
        """(prompt, reference) for Compare and Why: a picked history item, when no text is typed, gives its own
        prompt (its task prompt, else the task template around its neutral rewrite) and its text as the
        reference; else the typed text, in the task template when `templated`, and no reference."""
        if item_id is not None and (not text or not text.strip()):
            st = self.own_item(name, item_id)
            if st is None:
                raise ValueError("that history item no longer exists")
            return st.x or self.task.prompt(shown_rewrite(st) or st.y), st.y
        text = self.rt.check_prompt(text)
        return (self.task.prompt(text) if templated else text), None

    def pair_prompt(self, text: str | None, fallback: str | None, templated: bool) -> str:
        """Quick pair's prompt: its own box, else Compare's; in the task template when `templated`, unless the
        text is already in it."""
        full = self.rt.check_prompt(text if text and text.strip() else fallback)
        return self.task.prompt(full) if templated and not full.startswith(self.task.prefix) else full
