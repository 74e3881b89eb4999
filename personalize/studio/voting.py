"""Votes: blind pairs (Quick pair) and their votes, thumbs on a Compare column (a refit at once, CARD before and
after), a decided vote as an EXACT preference pair, and the leaderboard."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from personalize.serving.settings import DecodingSettings
from personalize.methods.card.person import prepared_items
from personalize.humaneval.arena import BlindPair, StalePair, rater_id
from personalize.humaneval.copies import copy_summary, mark_copies, stored_texts, without_copies
from personalize.humaneval.bradley_terry import LeaderboardConfig, leaderboard
from personalize.methods.base import UserContext
from personalize.store import StoreError
from personalize.studio.comparisons import Comparisons, MethodOutput, generation_settings
from personalize.studio.fits import Fits, Refit
from personalize.studio.histories import Histories, UserState
from personalize.studio.service import Service


@dataclass(frozen=True)
class Thumb:
    """A thumb's answer: the refit it made (None: the vote waits for the person's first fit), CARD's output for the
    prompt before and after it, and what to tell the person."""
    refit: Refit | None
    before: str | None
    after: str | None
    message: str


@dataclass(frozen=True)
class DrawnPair:
    """A blind pair as drawn for a rater: `seen`, that rater already voted on these two outputs (one vote per rater
    and pair); no rater, None and False."""

    pair: BlindPair
    rater: str | None
    seen: bool


class Votes(Service):
    def __init__(self, rt, histories: Histories, comparisons: Comparisons, fits: Fits):
        super().__init__(rt)
        self.histories = histories
        self.comparisons = comparisons
        self.fits = fits

    def new_pair(self, name: str | None, prompt: str | None, methods: Sequence[str], s: DecodingSettings,
                 k: int | None = None, *, fallback_prompt: str | None = None, templated: bool = True,
                 rater: str | None = None, logged_in: str | None = None) -> DrawnPair:
        """Two methods at random, each output generated now (or reused when this prompt and these settings
        were already generated for the user), shown in random order. The prompt is pair_prompt's (its own text,
        else `fallback_prompt`; in the task template when `templated`); with a `rater` (arena.rater_id: the
        logged-in name under --auth, else the typed id; checked before any model work), whether they already voted
        on these two outputs."""
        name = self.rt.need_user(name)
        who = None if rater is None and logged_in is None else rater_id(rater, logged_in)
        prompt = self.histories.pair_prompt(prompt, fallback_prompt, templated)
        state = self.histories.user_state(name, k)
        a, b = self.rt.arena.draw(methods or [])
        outs = [self._reuse(state, m, prompt, s) or self.comparisons.run_method(m, state, prompt, s) for m in (a, b)]
        failed = [o for o in outs if o.error]
        if failed:
            raise ValueError(f"{failed[0].method} could not run: {failed[0].error}")
        pair = self.rt.arena.open(state.name, prompt, (a, b), (outs[0].text, outs[1].text),
                                  (outs[0].gen_id, outs[1].gen_id),
                                  generation_settings(state, s) | {"artifacts": self.engine.artifacts_id})
        return DrawnPair(pair, who, who is not None and self.store.has_rating(who, *pair.gen_ids))

    def _reuse(self, state: UserState, method: str, prompt: str, s: DecodingSettings) -> MethodOutput | None:
        want = generation_settings(state, s)
        for g in self.store.generations(user=state.name, method=method, limit=50):
            if g["prompt"] == prompt and g["settings"] == want and g["artifacts"] == self.engine.artifacts_id:
                return MethodOutput(method, g["output"], g["latency_s"], g["n_tokens"], g["id"], g["extra"])
        return None

    def vote(self, pair_id: str | None, winner: str, rater: str | None = None,
             logged_in: str | None = None) -> tuple[BlindPair, int, str]:
        """Stores the vote under arena.rater_id (with --auth: the logged-in name, always): (pair, rating id, rater).
        A decided vote also refits the person's style and becomes an EXACT preference pair, in the background."""
        who = rater_id(rater, logged_in)
        drawn = self.rt.arena.pending(pair_id) if pair_id else None
        if drawn is not None and drawn.user and not self.store.may_reach(drawn.user):  # another login's person's pair
            raise StalePair("this pair was already rated or is no longer open: draw a new pair")
        pair, rid = self.rt.arena.vote(pair_id, winner, who)
        if winner in ("a", "b") and pair.user and pair.outputs[0].strip() != pair.outputs[1].strip():
            win, lose = pair.outputs if winner == "a" else pair.outputs[::-1]
            try:
                self.store.add_feedback(pair.user, "rate", pair.prompt, win, lose, rating=rid)
            except StoreError:
                pass  # the user was forgotten meanwhile: the vote counts for the leaderboard only
            else:
                self.rt.background.submit(self._refine_quietly, pair.user)
            self.rt.background.submit(self._exact_feedback, pair.user, pair.prompt, win, lose)
        return pair, rid, who

    def repeat_marks(self, pair: BlindPair) -> list[str]:
        """After the vote, which of the two outputs was one of the person's past texts handed back ("A repeats
        your text 12"): a vote for a copy is then seen as one."""
        return [f"{label} {line}" for label, out in zip("AB", pair.outputs)
                if (line := self.histories.repeat_line(pair.user, out))]

    def _refine_quietly(self, name: str) -> None:
        try:
            self.fits.refine(name)
        except (ValueError, StoreError) as e:  # not fitted yet, or deleted: the vote is kept for the next fit
            self.rt.feedback_log.append({"user": name, "refine": str(e)})

    def _exact_feedback(self, name: str, prompt: str, preferred: str, other: str) -> None:
        try:
            with self.model_lock.background:
                prepared_items(self.engine, self.store, name)
                user = UserContext.from_store(self.store, name, self.task)
                entry = self.rt.method("exact").add_feedback(user, prompt, preferred, other)
            self.rt.feedback_log.append({"user": name, "prompt": prompt, "attributes": entry["attributes"]})
        except Exception as e:  # a deleted user or a failed scoring pass must not break voting
            self.rt.feedback_log.append({"user": name, "prompt": prompt, "error": str(e)})

    def wait_feedback(self) -> None:
        """Blocks until queued EXACT updates are done (tests, shutdown)."""
        self.rt.background.submit(lambda: None).result()

    def leaderboard(self, cfg: LeaderboardConfig = LeaderboardConfig(), leave_out_copies: bool = False) -> dict:
        """The blind votes' standings, with `copies` (humaneval.copies.copy_summary: pairs where an output repeats
        the person's past text, votes won by such a copy); `leave_out_copies`: standings without those pairs."""
        marked = mark_copies(self.store.ratings(), stored_texts(self.store))
        lb = leaderboard(without_copies(marked) if leave_out_copies else marked, cfg)
        return lb | {"copies": copy_summary(marked)}

    def thumb(self, name: str, up: bool, s: DecodingSettings, k: int | None = None, *, method: str | None = None,
              prompt: str | None = None, text: str | None = None, before: str | None = None) -> Thumb:
        """A thumbs up (this is like me) or down (this is not): stored, λ refitted at once, and CARD's output for the
        same prompt before and after. On a Compare column (`method`): that method's newest output for the person
        (the one shown), "before" CARD's output for the same prompt when Compare showed one; else on `text` for
        `prompt`, `before` CARD's output already shown."""
        self.rt.need_head("A 👍 / 👎 (it refits your style)")
        if method is not None:
            prompt, text, before = self._shown(name, method, s)
            name = self.store.user(name)["name"]
        prompt = self.rt.check_prompt(prompt)
        if not (text or "").strip():
            raise ValueError("this column has no output to vote on")
        state = self.histories.user_state(name, k)
        if before is None and state.fitted:
            before = self.comparisons.decode("card", state, prompt, s).text
        self.store.add_feedback(state.name, "up" if up else "down", prompt, text if up else None, None if up else text)
        try:
            r = self.fits.refine(state.name)
        except ValueError as e:  # not fitted: the vote waits for the fit
            return Thumb(None, before, None, f"Vote kept. {e}.")
        out = self.comparisons.run_method("card", self.histories.user_state(state.name, k), prompt, s)  # stored: the next vote's "before"
        if out.error:
            raise ValueError(f"card could not run after the refit: {out.error}")
        return Thumb(r, before, out.text, f"λ refitted on your history and {r.n_votes} vote{'s' * (r.n_votes != 1)} "
                                          f"in {r.seconds:.2f} s (version {r.version}). {r.verdict}")

    def _shown(self, name: str, method: str, s: DecodingSettings) -> tuple[str, str, str | None]:
        """(prompt, output, CARD's output for that prompt or None): the column's newest output for the person."""
        gens = self.store.generations(user=self.store.user(name)["name"], method=method, limit=1)
        if not gens:
            raise ValueError(f"no {method} output for {name!r} yet: generate in Compare first")
        g = gens[0]
        same = lambda c: c["prompt"] == g["prompt"] and all(  # noqa: E731
            c["settings"].get(key) == v for key, v in (("alpha", s.alpha), ("top_k", s.top_k),
                                                       ("max_new_tokens", s.max_new_tokens)))
        card = [c for c in self.store.generations(user=g["user"], method="card", limit=20) if same(c)]
        return g["prompt"], g["output"], card[0]["output"] if card else None
