"""Who may log in (`--auth`) and how often they may try: the page's login check, as Gradio's launch(auth=...) calls it.

`parse_auth` reads `--auth` (USER:PASSWORD,... or @FILE) into (user, password) pairs; `Login` is the callable Gradio
calls with the typed name and password on each POST /login. It compares passwords in constant time
(hmac.compare_digest, also for an unknown name, so the answer's time does not tell which names exist) and throttles
failed attempts, because Gradio's own list check lets a script try passwords as fast as the server answers:

- per name: after `per_name` failures within `window` seconds, that name is refused (even with the right password)
  for `first_delay` seconds, and each further failure after a refusal doubles the delay, up to `max_delay`; a
  successful login clears the name's count;
- overall: after `overall` failures within `window` seconds across all names (a spray over many names), every
  login is refused until the oldest of them leaves the window.

A refusal answers at once with HTTP 429 and the seconds to wait: Gradio calls a plain callable on its event loop, so
sleeping there would stall every page, not just the guesser. Gradio's login page says nothing for a 429, so
`LoginNotice`, a middleware of the server (app.launch_options), adds a script to that page that shows the refusal
(why, and how long to wait) under its title. The throttle lives in memory (a restart clears it) and
counts per name, not per address (Gradio does not pass the request): someone who fails a name on purpose can keep its
owner out for the delay, which SECURITY.md states.
"""

from __future__ import annotations

import hmac
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

AUTH_HELP = ("raters who may log in: USER:PASSWORD, several separated by commas (u1:p1,u2:p2), or @FILE with one "
             "USER:PASSWORD a line (blank lines and # comments skipped; use a file when a password holds a comma); "
             "or env STUDIO_AUTH. Required when --host is not a loopback address. With it, a vote counts under the "
             "logged-in user name (the Quick pair tab's rater id is that name, not editable) and each rater votes once "
             "per pair of outputs; a login sees only the people it created (--admin: all); 5 failed logins for a "
             "name lock it for 30 s, doubling with each further failure")


def parse_auth(value: str | None) -> list[tuple[str, str]] | None:
    """--auth as Gradio's launch(auth=...) takes it: [(user, password), ...]; None when not given. The password
    is everything after an entry's first colon; whitespace around an entry is ignored. Errors never echo a
    password."""
    if not value or not value.strip():
        return None
    value = value.strip()
    if value.startswith("@"):
        path = Path(value[1:]).expanduser()
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise SystemExit(f"error: --auth {value}: cannot read {path} ({e.__class__.__name__})") from None
        entries = [(f"{path} line {i}", line.strip()) for i, line in enumerate(text.splitlines(), 1)
                   if line.strip() and not line.strip().startswith("#")]
        if not entries:
            raise SystemExit(f"error: --auth {value}: no USER:PASSWORD line in {path}")
    else:
        entries = [(f"entry {i}", e.strip()) for i, e in enumerate(value.split(","), 1)]
    pairs: dict[str, str] = {}
    for where, entry in entries:
        user, sep, password = entry.partition(":")
        user = user.strip()  # Gradio's login form strips the user name too
        if not sep or not user or not password:
            raise SystemExit(f"error: --auth must be USER:PASSWORD[,USER:PASSWORD...] or @FILE; {where} is not")
        if user in pairs:
            raise SystemExit(f"error: --auth names the user {user!r} twice ({where})")
        pairs[user] = password
    return list(pairs.items())


def parse_admins(values: list[str] | None, users: list[str] | None) -> tuple[str, ...]:
    """`--admin` (given several times, or comma-separated) as a tuple of login names, each one of `users` (the
    --auth names); an admin without logins would be everyone, so it is refused."""
    names = [n.strip() for v in values or () for n in v.split(",") if n.strip()]
    if not names:
        return ()
    if users is None:
        raise SystemExit("error: --admin names a login, so it needs --auth USER:PASSWORD")
    unknown = [n for n in names if n not in users]
    if unknown:
        raise SystemExit(f"error: --admin {', '.join(unknown)}: not among the --auth users ({', '.join(users)})")
    return tuple(dict.fromkeys(names))


class TooManyAttempts(Exception):
    """Login refused by the throttle, whatever the password; `seconds` until the name (or everyone) may try again."""

    def __init__(self, seconds: float, everyone: bool = False):
        self.seconds = seconds
        who = "every login" if everyone else "this user name"
        super().__init__(f"too many failed logins: {who} may try again in {max(1, round(seconds))} s")


@dataclass
class _Name:
    failures: deque = field(default_factory=deque)  # times of the recent failures
    locked_until: float = 0.0
    delay: float = 0.0  # the last lock's length; doubles with each failure after a lock


@dataclass
class Login:
    """Gradio's auth callable: `login(user, password)` is True for a right pair, False for a wrong one, and raises
    (HTTP 429 through Gradio's route; TooManyAttempts from `check`) while the throttle refuses the name."""

    users: dict[str, str]
    per_name: int = 5
    overall: int = 50
    window: float = 300.0
    first_delay: float = 30.0
    max_delay: float = 3600.0
    clock: Callable[[], float] = time.monotonic
    _names: dict[str, _Name] = field(default_factory=dict, repr=False)
    _recent: deque = field(default_factory=deque, repr=False)  # every failure's time, all names
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def of(cls, pairs: list[tuple[str, str]] | None, **limits) -> "Login | None":
        """The check for parse_auth's pairs (None: no logins)."""
        return None if pairs is None else cls(dict(pairs), **limits)

    def __repr__(self) -> str:  # never a password in a log or a traceback
        return f"Login(users={sorted(self.users)}, per_name={self.per_name}, overall={self.overall})"

    def check(self, user: str, password: str) -> bool:
        """True when `password` is the user's; raises TooManyAttempts without looking at it while refused."""
        now = self.clock()
        with self._lock:
            self._forget_old(now)
            if len(self._recent) >= self.overall:
                raise TooManyAttempts(self._recent[0] + self.window - now, everyone=True)
            entry = self._names.get(user)
            if entry is not None and entry.locked_until > now:
                raise TooManyAttempts(entry.locked_until - now)
            known = self.users.get(user)
            # the same comparison for an unknown name, so its timing does not tell that the name is unknown
            ok = hmac.compare_digest(password.encode(), (known if known is not None else "\0" + password).encode())
            ok = ok and known is not None
            if ok:
                self._names.pop(user, None)
                return True
            entry = self._names.setdefault(user, _Name())
            entry.failures.append(now)
            self._recent.append(now)
            if entry.delay:  # a failure right after a lock ended: the next lock is twice as long
                entry.delay = min(2 * entry.delay, self.max_delay)
                entry.locked_until = now + entry.delay
            elif len(entry.failures) >= self.per_name:
                entry.delay = self.first_delay
                entry.locked_until = now + entry.delay
            return False

    def __call__(self, user: str, password: str) -> bool:
        try:
            return self.check(user, password)
        except TooManyAttempts as e:
            from fastapi import HTTPException

            raise HTTPException(status_code=429, detail=str(e), headers={"Retry-After": str(max(1, round(e.seconds)))})

    def _forget_old(self, now: float) -> None:
        """Drops failures older than the window (a name keeps its growing delay while it stays within it)."""
        while self._recent and self._recent[0] <= now - self.window:
            self._recent.popleft()
        for user in list(self._names):
            entry = self._names[user]
            while entry.failures and entry.failures[0] <= now - self.window:
                entry.failures.popleft()
            if not entry.failures and entry.locked_until <= now - self.window:
                del self._names[user]  # quiet for a whole window after its lock: it starts afresh


# Shown by the login page on a refused login: the 429's text (why, and the wait) under the page's title.
_NOTICE = b"""<script>(() => {
  const fetch0 = window.fetch;
  window.fetch = async (...args) => {
    const r = await fetch0(...args);
    const url = new URL(String(args[0] && args[0].url || args[0]), location.href);
    if (!/\\/login\\/?$/.test(url.pathname)) return r;
    let p = document.getElementById("login-refused");
    if (r.status !== 429) { if (p) p.remove(); return r; }
    const said = await r.clone().json().then(j => j.detail, () => "too many failed logins: try again later");
    if (!p) {
      p = document.createElement("p");
      p.id = "login-refused";
      p.setAttribute("role", "alert");
      p.style.cssText = "color: var(--error-text-color, #b91c1c); font-weight: 600; margin: 0.5em 0";
      const title = document.querySelector("gradio-app h2");
      title ? title.after(p) : document.body.prepend(p);
    }
    p.textContent = `Login refused: ${said}.`;
    return r;
  };
})();</script>"""


class LoginNotice:
    """ASGI middleware: Gradio's login page (HTML whose config says `auth_required`) gets _NOTICE."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "GET":
            return await self.app(scope, receive, send)
        page: dict = {}

        async def send_page(message):
            if message["type"] == "http.response.start":
                headers = dict(message.get("headers", []))
                if headers.get(b"content-type", b"").startswith(b"text/html") and b"content-encoding" not in headers:
                    page.update(start=message, body=b"")
                    return
            if "start" not in page:
                return await send(message)
            page["body"] += message.get("body", b"")
            if message.get("more_body"):
                return
            body = page["body"]
            if b'"auth_required":true' in body:
                body = body.replace(b"</head>", _NOTICE + b"</head>", 1)
            headers = [(k, v) for k, v in page["start"]["headers"] if k.lower() != b"content-length"]
            await send({**page["start"], "headers": [*headers, (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, send_page)
