"""Explore: α and K sweeps against the person's own held-out items.

Why the split is strict: a score on an item the style saw is not a score. The held-out items, and every other
item of the history with the same text or the same prompt (a history of commit subjects repeats "Update
translations"), are left out of everything the sweep fits or decodes with: λ, the token bias and the kNN memory
(all fitted on the rest), the items retrieved into the prompt (the rest only) and the embedding that picks the
cluster at each K."""

from __future__ import annotations

import math
import re
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import numpy as np

from personalize.methods.card import onboard
from personalize.serving.settings import DecodingSettings
from personalize.data import Item
from personalize.methods.card.person import held_out_numbers, prepared_items
from personalize.metrics import copy_aware, paired_interval, rouge_scores
from personalize.schema import as_starter
from personalize.studio.fits import decoded_verdict
from personalize.studio.first_use_jobs import in_line, job_what
from personalize.studio.service import Service
from personalize.methods.card import card_decode
from personalize.methods.card.adapters import cluster_adapter
from personalize.methods.card.own import owner_key
from personalize.methods.card.style import UserStyle


def _same(text: str) -> str:
    """A text as compared for repeats: case and spacing do not make an item new."""
    return re.sub(r"\s+", " ", text).strip().casefold()


def split_held_out(items: Sequence[Item], n_holdout: int) -> tuple[list[Item], list[Item], int]:
    """(held out, the rest to fit on, how many repeats of a held-out item were set aside): the first `n_holdout`
    items (the newest that may be: onboard.HoldOrder; Explorer.explore checks how many may) are held out, and any
    other item whose text or prompt equals one of theirs is left out of the rest too, so no copy of a held-out
    answer reaches the fit, the memory or the retrieved items."""
    held = list(items[:n_holdout])
    texts, prompts = {_same(it.y) for it in held}, {_same(it.x) for it in held if it.x}
    rest = [it for it in items[n_holdout:] if _same(it.y) not in texts and not (it.x and _same(it.x) in prompts)]
    return held, rest, len(items) - n_holdout - len(rest)


def no_prompt_without_answer(n_holdable: int, n_items: int, n_holdout: int) -> str:
    """Why fewer items than asked can be held out: the others' neutral rewrites nearly repeat them."""
    return (f"only {n_holdable} of your {n_items} items can be held out, not {n_holdout}: the neutral rewrite of "
            f"the other {n_items - n_holdable} nearly repeats the text itself (short texts, such as commit "
            "subjects, often do), so a held-out prompt would give its answer away")


def check_alphas(alphas: Sequence[float]) -> list[float]:
    """The α values a sweep accepts: one or more finite numbers >= 0 (nan and inf are no strength)."""
    values = [float(a) for a in alphas]
    if not values:
        raise ValueError("give one or more α values (numbers >= 0 separated by commas, e.g. 0, 0.5, 1)")
    bad = [a for a in values if not math.isfinite(a) or a < 0]
    if bad:
        raise ValueError(f"α values must be finite numbers >= 0; not {', '.join(map(str, bad))}")
    return values


@dataclass(frozen=True)
class SweepPoint:
    """One point of a sweep: the person's held-out prompts decoded at one α (or K) by one method."""
    method: str
    alpha: float
    k: int
    cluster: int
    copy_aware: float  # ROUGE-L, an output that repeats one of the fitted items' texts scoring 0 (metrics.copy_aware)
    rougeL: float  # ROUGE-L as it is, beside it
    repeats: float  # the share of outputs that repeat one of those texts (word for word or within ROUGE-L 0.8)
    length: float  # words per output, mean
    outputs: list[str]
    per_item: tuple[float, ...] = ()  # each held-out item's copy-aware score (the check's paired interval)


@dataclass(frozen=True)
class Sweep:
    """Explore's result: the α points (CARD at the person's K), the K points (cluster model and CARD at the
    page's α), what was held out, and how many items the style was refitted on."""
    alpha: list[SweepPoint]
    k: list[SweepPoint]
    golds: list[str]
    prompts: list[str]
    n_fit: int
    n_set_aside: int  # repeats of a held-out item left out of the fit
    default_alpha: float
    own: bool = False  # decoded over an own adapter trained without the held-out items (a cluster of one)
    numbers: list[int] = field(default_factory=list)  # the held-out items' numbers in My writing

    def best_alpha(self) -> SweepPoint:
        """Ranked by the copy-aware score: an α that wins by handing back old texts loses."""
        return max(self.alpha, key=lambda r: r.copy_aware)


@dataclass(frozen=True)
class HeldOutCheck:
    """card at the build's α against the person's base (α = 0) on their held-out items, decoded: Fit's verdict and
    Explore's two rows at those α are one computation."""
    alpha: float
    card: float  # copy-aware ROUGE-L, mean over the held-out items
    base: float
    difference: dict  # metrics.paired_interval of card − base, item by item
    own: bool  # the base is the person's own adapter (else their cluster's model)
    card_repeats: int = 0  # held-out items whose card output repeats one of the person's other texts
    base_repeats: int = 0
    numbers: tuple[int, ...] = ()  # the held-out items' numbers in My writing


class Explorer(Service):
    def explore(self, name: str, alphas: Sequence[float], n_holdout: int = 4, s: DecodingSettings | None = None,
                progress: Callable[[float, str], None] | None = None, with_k: bool = True, lock=None) -> Sweep:
        """α and K sweeps against the user's own held-out items: the style (λ, bias, memory) is refitted without
        them (not stored), then CARD (and the cluster model, for K) generates for their prompts, retrieving only
        from the rest; per point the copy-aware ROUGE-L, raw ROUGE-L, the share of outputs that repeat one of the
        rest's texts, and output length. `with_k` False: the α points alone. The model lock
        (`lock`: the runtime's, or its `.background` for work nobody waits on) is taken step by step, so a
        person's Compare gets in between."""
        self.rt.need_head("Explore")
        s, lock = s or self.engine.cfg.decoding, lock or self.model_lock
        alphas = check_alphas(alphas)
        with lock:
            items = prepared_items(self.engine, self.store, name)
        held, rest, set_aside = split_held_out(items, n_holdout)
        if len(rest) < self.engine.cfg.min_fit_items:
            raise ValueError(f"explore needs at least {n_holdout + self.engine.cfg.min_fit_items} different "
                             f"history items ({n_holdout} held out, the rest to fit λ); {name!r} has "
                             f"{len(items)}" + (f", {set_aside} of them repeating a held-out one"
                                                if set_aside else ""))
        if n_holdout > onboard.holdable(items):
            raise ValueError(no_prompt_without_answer(onboard.holdable(items), len(items), n_holdout))
        if progress:
            progress(0.0, "holding out your newest items")  # the model was ours once: a waiting page says running
        prompts, golds = [it.x for it in held], [it.y for it in held]
        pasts = [it.y for it in rest]  # what an output could hand back: the texts the style was fitted on
        own = self._own_without_held_out(name)
        ks = self.ks if with_k else ()
        total, done = len(alphas) + 2 * len(ks) + 1 + bool(own), 0

        def tick(what):
            nonlocal done
            done += 1
            if progress:
                progress(done / total, what)

        try:
            if own:  # a cluster of one: card decodes over their own adapter, so the sweep does too
                with lock:
                    placed = onboard.fit(self.engine, rest)
                self.engine.own.train(own, rest, cluster_adapter(placed.k, placed.cluster))  # locks by the step
                tick("your own adapter, trained without the held-out items")
            # the α and K points on the held-out prompts, the style fitted on `rest` (over `own`'s adapter if any)
            with lock:
                fit = onboard.fit(self.engine, rest, own=owner_key(own) if own else None)
                emb = self.engine.embed(rest)
            # the style itself at every α: this sweep is what decides the fallback (Fit's check), so the fallback
            # may not stand in for it (a refit whose teacher-forced figure lost would sweep the base against itself)
            style = replace(fit.style, helps=None)
            tick("fit the style on the other items")

            def point(method, k, cluster, alpha) -> SweepPoint:
                with lock:
                    outs = card_decode.generate(self.engine, prompts, method, cluster, style, k=k,
                                                settings=replace(s, alpha=alpha), items=rest)
                texts = [g.text for g in outs]
                copies = copy_aware(texts, golds, [pasts] * len(texts))
                return SweepPoint(method, alpha, k, cluster, round(copies["rougeL_copy_aware"], 4),
                                  round(rouge_scores(texts, golds)["rougeL"], 4), round(copies["repeats_near"], 4),
                                  round(float(np.mean([len(t.split()) for t in texts])), 2), texts,
                                  tuple(copies["per_query"]))

            alpha_rows = []
            for a in alphas:
                alpha_rows.append(point("card", fit.k, fit.cluster, a))
                tick(f"α = {a}")
            k_rows = []
            for k in ks:
                c, _ = self.engine.assign(emb, k)
                for m in ("cluster", "card"):
                    k_rows.append(point(m, k, c, s.alpha))
                    tick(f"K = {k} ({m})")
            return Sweep(alpha_rows, k_rows, golds, prompts, len(rest), set_aside, s.alpha, own is not None,
                         held_out_numbers(held, len(held)))
        finally:
            if own:
                self.engine.own.forget(own)  # the sweep's adapter: never the person's

    def _own_without_held_out(self, name: str) -> str | None:
        """For a person card decodes over their own adapter: the name of a sweep's own adapter trained on `rest`
        alone (the person's saw the held-out items); None for everyone else."""
        style = UserStyle.from_stored(self.store.style(name, self.engine.artifacts_id))  # None: not fitted
        return f"{name} · explore" if style is not None and style.own else None

    def check(self, name: str, progress: Callable[[float, str], None] | None = None) -> HeldOutCheck | None:
        """Fit's verdict by decoding, as Explore does: card at the build's α against α = 0 (the person's base) on
        the same held-out items (a third of the history, 2 to 8), each item's ROUGE-L paired. None where the build
        decodes card at α = 0 or the history is too short to hold any out. Scored copy-aware: an output that
        repeats one of the person's other texts and is not the held-out answer counts as a miss."""
        self.rt.need_head("Fit's check")
        a, (n_items, n_holdable) = self.engine.cfg.decoding.alpha, self.held_out_room(name)
        n_holdout = min(8, n_items // 3, n_holdable)
        if a <= 0 or n_holdout < 2:
            return None
        sweep = self.explore(name, [0.0, a], n_holdout, progress=progress, with_k=False,
                             lock=self.model_lock.background)  # nobody waits on it: a Compare goes first
        base, card = sweep.alpha
        return HeldOutCheck(a, card.copy_aware, base.copy_aware,
                            paired_interval(np.subtract(card.per_item, base.per_item), n_boot=2000), sweep.own,
                            round(card.repeats * len(sweep.golds)), round(base.repeats * len(sweep.golds)),
                            tuple(sweep.numbers))

    def verdict(self, name: str, progress: Callable[[float, str], None] | None = None) -> str:
        """Fit's verdict by decoding (check), in words, and the decision it makes: card decodes with the style
        unless the check's interval lies below 0 (then, with the build's fallback, the person's base), stored with
        the style that was checked; or why there is none (the teacher-forced verdict then decides)."""
        stored = self.store.vector(name, self.engine.artifacts_id)
        check = self.check(name, progress)
        if check is not None:
            worse = check.difference["ci95"][1] < 0
            if stored is not None:
                d = check.difference
                self.store.record_decoded_check(name, self.engine.artifacts_id, stored[1]["version"], {
                    "helps": not worse, "card": check.card, "base": check.base, "mean": d["mean"],
                    "ci95": d["ci95"], "n": d["n"], "alpha": check.alpha})
            return decoded_verdict(check, self.engine.cfg.style.fallback)
        if self.engine.cfg.decoding.alpha <= 0:
            return "This build decodes card at α = 0, so your base is what it writes; Explore sweeps α for you."
        n_items, n_holdable = self.held_out_room(name)
        if n_items // 3 >= 2 > n_holdable:
            return (f"No check by decoding: {no_prompt_without_answer(n_holdable, n_items, 2)}. Compare's outputs "
                    f"and your votes are the check here. {self.undecoded_decision(name)}")
        return ("Too few items to hold some out and decode them (6 or more); Explore says what it needs. "
                + self.undecoded_decision(name))

    def undecoded_decision(self, name: str) -> str:
        """What Compare's card decodes for a person without a decoded check, by the one rule (store.decodes_own:
        the teacher-forced figure then), in the words of the decoded verdict."""
        stored = self.store.style(name, self.engine.artifacts_id)
        style = UserStyle.from_stored(stored)
        base = "your own adapter" if style is not None and style.own else "your cluster's model"
        if stored is not None and stored.helps is False and self.engine.cfg.style.fallback:
            return (f"So Compare shows {base}'s output for card (the fallback): the teacher-forced figure on your "
                    "held-out words says your style loses. A 👍 on a card output asks for your style.")
        return f"So Compare decodes card with your style at this build's α = {self.engine.cfg.decoding.alpha:g}."

    def held_out_room(self, name: str) -> tuple[int, int]:
        """(the person's items, how many may be held out: person.held_out_order), rewrites made where missing."""
        with self.model_lock.background:
            items = prepared_items(self.engine, self.store, name)
        return len(items), onboard.holdable(items)

    def check_line(self, since: float, running: tuple[float, float, str] | None, now: float | None = None) -> str:
        """Fit's decoded check while it waits, in words: what it waits for (the model, which work nobody waits on
        shares step by step: the first-use jobs running), or how far it is, each timed from the check's own start
        (`since`; `running`: when it got the model, the fraction done and the step)."""
        now = now or time.time()
        what = "Checking by decoding your held-out items (card at α = 0 and at the build's α)"
        if running is not None:
            at, frac, step = running
            return f"{what}: running for {now - at:.0f} s, {frac:.0%} done ({step})…"
        busy = [job_what(j, self.store.may_reach(j["user"])) for j in in_line(list(self.rt.jobs.values()))
                if j["state"] == "running"]
        behind = f", sharing it step by step with {', '.join(busy)}" if busy else ""
        return f"{what}: queued for the model for {now - since:.0f} s{behind}…"

    def verdict_lines(self, name: str, poll_s: float = 1.0):
        """verdict for Fit, with a line at once and every `poll_s` while it waits and runs (issue 59: the verdict
        area stayed empty for minutes): yields (final, text), the last one the verdict. Errors are the verdict's."""
        since, state, out = time.time(), {}, {}

        def progress(frac: float, step: str) -> None:
            state["running"] = (state.get("running") or (time.time(),))[:1] + (frac, step)

        def run() -> None:
            try:
                out["verdict"] = self.verdict(name, progress)
            except Exception as e:  # raised below, in the page's thread
                out["error"] = e

        worker = threading.Thread(target=as_starter(run), name="studio-check", daemon=True)
        worker.start()
        yield False, self.check_line(since, None)  # at once, before the model is ours
        worker.join(poll_s)
        while worker.is_alive():
            yield False, self.check_line(since, state.get("running"))
            worker.join(poll_s)
        if "error" in out:
            raise out["error"]
        yield True, out["verdict"]

    def parse_alphas(self, text: str | None, most: int = 12) -> list[float]:
        """Explore's α values: finite numbers >= 0 separated by commas (or semicolons), at most `most` of them."""
        try:
            values = [float(v) for v in (text or "").replace(";", ",").split(",") if v.strip()]
        except ValueError:
            raise ValueError(f"α values must be numbers separated by commas, got {text!r}") from None
        if len(values) > most:
            raise ValueError(f"at most {most} α values per sweep")
        return check_alphas(values) if values else []  # none: explore says what to give
