"""Whose people a request may reach: the login it runs as, and the rule the store applies to every person it reads
or writes by name.

With logins (app.py --auth), a person belongs to the login that made them: another login cannot see, open, change,
rate as, export or forget them (to it they are an unknown name); an admin login reaches everyone; a campaign's people
are reachable by every login, since raters must read the histories of the items they judge. Without logins one
person uses the studio at this machine and reaches everything. Work that no login runs (the CLI, background jobs a
request started) runs as no one and reaches everything: every event of the page runs as its login
(ui/common.run_as_login), so no handler can forget to say who asks.

A shared module: it imports no package of personalize, so the store can apply it.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Iterator

_LOGIN: ContextVar[str | None] = ContextVar("personalize_login", default=None)


@contextmanager
def acting_as(login: str | None) -> Iterator[None]:
    """Runs the block as `login` (None: as no one, e.g. the CLI)."""
    token = _LOGIN.set(login)
    try:
        yield
    finally:
        _LOGIN.reset(token)


def current_login() -> str | None:
    return _LOGIN.get()


@dataclass(frozen=True)
class Access:
    """The rule: which people the current login may reach, and whom a person it makes belongs to."""

    logins: bool = False  # the studio has logins (--auth); without them everything is reachable
    admins: frozenset[str] = frozenset()

    def __post_init__(self):
        if self.admins and not self.logins:
            raise ValueError("admins need logins (--auth)")
        object.__setattr__(self, "admins", frozenset(self.admins))

    def may_reach(self, owner: str | None, campaign: bool = False) -> bool:
        who = current_login()
        if not self.logins or who is None or who in self.admins:
            return True
        return campaign or owner == who

    def sees_everyone(self) -> bool:
        who = current_login()
        return not self.logins or who is None or who in self.admins

    def new_owner(self) -> str | None:
        """The owner recorded for a person made now: the login, or None without logins."""
        return current_login() if self.logins else None
