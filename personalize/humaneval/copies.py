"""Votes on a person's old text handed back (issue 57): which judged pairs hold an output that repeats the person's
past text (metrics.repeated_text), how many votes went to such a copy, and the rows without them, so that a
leaderboard or a campaign's report can mark them or leave them out. A rater who prefers "their" old text has not
preferred new writing like theirs."""

from __future__ import annotations

from functools import lru_cache
from typing import Callable, Sequence

from personalize.metrics import repeated_text
from personalize.store import StoreError


def mark_copies(rows: Sequence[dict], past_of: Callable[[dict], Sequence[str]]) -> list[dict]:
    """Each judged row (output_a, output_b, a verdict) with `copy_a` / `copy_b`: whether that output repeats one of
    its person's past texts. `past_of(row)`: the texts of the row's person ([] for one no longer stored)."""
    out = []
    for r in rows:
        past = past_of(r)
        out.append(r | {f"copy_{s}": bool(r.get(f"output_{s}")) and repeated_text(r[f"output_{s}"], past) is not None
                        for s in "ab"})
    return out


def copy_summary(rows: Sequence[dict], winner: str = "winner") -> dict:
    """Over rows marked by mark_copies: the pairs that hold a copy, the votes won by a copy, of how many. `winner`:
    the key of the verdict in the rows' a/b order ("a", "b", a tie or neither)."""
    held = [r for r in rows if r["copy_a"] or r["copy_b"]]
    won = [r for r in held if r.get(winner) in ("a", "b") and r[f"copy_{r[winner]}"]]
    return {"pairs": len(rows), "with_a_copy": len(held), "won_by_a_copy": len(won)}


def without_copies(rows: Sequence[dict]) -> list[dict]:
    """The marked rows where neither output repeats a past text."""
    return [r for r in rows if not (r["copy_a"] or r["copy_b"])]


def stored_texts(store) -> Callable[[dict], list[str]]:
    """past_of for mark_copies over the blind votes: the texts of the row's `user` in a Store, [] for a person
    forgotten or not this login's (read once a person)."""
    @lru_cache(maxsize=None)
    def texts(user: str | None) -> tuple[str, ...]:
        try:
            return tuple(s.y for s in store.items(user)) if user else ()
        except StoreError:
            return ()
    return lambda row: texts(row.get("user"))
