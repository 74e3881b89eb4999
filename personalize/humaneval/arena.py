"""Blind pairwise rating (METHOD §6, the Chatbot Arena's hygiene): two methods drawn at random, shown in
random order with their names hidden; a vote is taken once per pair and stored with its whole context.

Pending pairs live in memory under a random id. A vote names that id, and the
pair is popped atomically, so a second vote on the same pair (a double click, a
stale tab, a restart in between) is refused instead of counted twice.

One vote per rater and pair of outputs: a rater who already voted on the same two
stored generations (drawn again: the same prompt and settings reuse them) is
refused with AlreadyVoted. The refused vote changes nothing: the pair stays open
(its id is known only to the page that drew it, so in practice nobody else votes
on it; it ages out of the bounded pending list), and the rater draws a new pair.
Which rater id counts is `rater_id`'s rule: the logged-in user name when the app
runs with authentication, else the id typed in.
"""

from __future__ import annotations

import random
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Sequence

from personalize.store import WINNERS, Store


class StalePair(ValueError):
    """The pair was already rated, replaced or forgotten: draw a new one."""


class AlreadyVoted(ValueError):
    """This rater already voted on these two outputs (one vote per rater and pair)."""


def rater_id(typed: str | None, logged_in: str | None) -> str:
    """The rater id a vote counts under. With authentication (`logged_in`: the logged-in user name) it is
    that name, whatever was typed, so nobody votes under another rater's id; without it, the typed id,
    stripped. ValueError when there is neither."""
    if isinstance(logged_in, str) and logged_in.strip():
        return logged_in.strip()
    if isinstance(typed, str) and typed.strip():
        return typed.strip()
    raise ValueError("enter a rater id first")


@dataclass(frozen=True)
class BlindPair:
    id: str
    user: str | None
    prompt: str
    methods: tuple[str, str]  # (A, B) as shown
    outputs: tuple[str, str]
    gen_ids: tuple[int | None, int | None]
    settings: dict = field(default_factory=dict)
    created: float = field(default_factory=time.time)


def draw_methods(methods: Sequence[str], rng: random.Random) -> tuple[str, str]:
    """Two distinct methods, in random order (sample already shuffles)."""
    pool = list(dict.fromkeys(methods))
    if len(pool) < 2:
        raise ValueError("a blind pair needs at least two different methods")
    return tuple(rng.sample(pool, 2))


class Arena:
    """Pending blind pairs and the votes on them; thread-safe, so concurrent raters lose nothing."""

    def __init__(self, store: Store, max_pending: int = 10_000, seed: int | None = None):
        self.store, self.max_pending = store, max_pending
        self.rng = random.Random(seed)
        self._pending: OrderedDict[str, BlindPair] = OrderedDict()
        self._lock = threading.Lock()
        # held from the duplicate check to the stored vote, so that two concurrent votes by one rater on two
        # pairs of the same outputs cannot both pass the check (votes are milliseconds: one at a time is fine)
        self._vote_lock = threading.Lock()

    def draw(self, methods: Sequence[str]) -> tuple[str, str]:
        with self._lock:
            return draw_methods(methods, self.rng)

    def open(self, user: str | None, prompt: str, methods: tuple[str, str], outputs: tuple[str, str],
             gen_ids: tuple[int | None, int | None] = (None, None), settings: dict | None = None) -> BlindPair:
        pair = BlindPair(secrets.token_hex(8), user, prompt, tuple(methods), tuple(outputs), tuple(gen_ids),
                         dict(settings or {}))
        with self._lock:
            self._pending[pair.id] = pair
            while len(self._pending) > self.max_pending:
                self._pending.popitem(last=False)
        return pair

    def pending(self, pair_id: str) -> BlindPair | None:
        with self._lock:
            return self._pending.get(pair_id)

    def forget_user(self, name: str) -> int:
        """Drops the open pairs drawn for `name` (their prompt and outputs are that person's); returns how many.
        A vote on one of them is then refused as stale."""
        with self._lock:
            gone = [pid for pid, p in self._pending.items() if p.user == name]
            for pid in gone:
                del self._pending[pid]
        return len(gone)

    def vote(self, pair_id: str | None, winner: str, rater: str) -> tuple[BlindPair, int]:
        """Stores the vote (with prompt, both outputs, both methods, settings); returns the pair and rating id.
        StalePair: the pair is not open (already rated, or forgotten); AlreadyVoted: `rater` already voted on
        these two stored generations (the pair then stays open, nothing is stored)."""
        if winner not in WINNERS:
            raise ValueError(f"invalid vote {winner!r}: expected one of {', '.join(WINNERS)}")
        if not isinstance(rater, str) or not rater.strip():
            raise ValueError("enter a rater id before voting")
        rater = rater.strip()
        with self._vote_lock:
            with self._lock:
                pair = self._pending.get(pair_id) if pair_id else None
            if pair is None:
                raise StalePair("this pair was already rated or is no longer open: draw a new pair")
            if self.store.has_rating(rater, *pair.gen_ids):
                raise AlreadyVoted(f"rater {rater!r} already voted on these two outputs (one vote per rater and "
                                   "pair): draw a new pair, with another prompt or other settings")
            with self._lock:
                if self._pending.pop(pair.id, None) is None:  # forgotten meanwhile (max_pending)
                    raise StalePair("this pair was already rated or is no longer open: draw a new pair")
            try:
                rid = self.store.add_rating(rater, pair.prompt, pair.user, pair.methods[0], pair.outputs[0],
                                            pair.methods[1], pair.outputs[1], winner, pair.settings, *pair.gen_ids)
            except BaseException:
                with self._lock:  # the vote was not stored: the pair stays open for a retry
                    self._pending[pair.id] = pair
                raise
        return pair, rid
