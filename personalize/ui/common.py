"""What every tab shares: expected errors as the status line, Markdown that shows text as written, binding
handlers to the studio, and the versions table (Fit shows it, a thumb in Compare refreshes it)."""

from __future__ import annotations

import functools
import inspect

import gradio as gr
from gradio import utils as gr_utils

from personalize.schema import acting_as

from personalize.humaneval.arena import StalePair
from personalize.data import HistoryError
from personalize.display import md
from personalize.methods.artifacts import ArtifactsError
from personalize.store import StoreError
from personalize.lm.cpu_threads import hands_back_team

# Problems a person can cause (bad input, unknown user, a stale vote): answered in the tab's status line.
# Gradio sessions decoding at once (Compare, Why, Quick pair): their requests meet in the studio's scheduler and
# decode as one mixed batch; fits, builds and campaign generation keep the "model" group, one at a time.
DECODE_SESSIONS = 16
EXPECTED = (HistoryError, StoreError, StalePair, ArtifactsError, ValueError, FileNotFoundError)
CSS = ".method-out {min-height: 6em} #vote-status {font-size: 1.05em}"
# Every Markdown of the app: no LaTeX (a "$$" in someone's text is text). Text from people and models goes into
# Markdown only through display.md, so that it is shown as written and never rendered or executed.
Markdown = functools.partial(gr.Markdown, latex_delimiters=[])
VERSION_COLUMNS = ("version", "created", "source", "note", "votes", "helps", "current")


def _err(e: Exception) -> str:
    return f"⚠️ {md(e)}"  # error messages quote names, items and input


def guarded(n_outputs: int, status_index: int = 0):
    """Expected errors become the status line; every other output keeps its value (gr.skip)."""
    def wrap(fn):
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except EXPECTED as e:
                out = [gr.skip()] * n_outputs
                out[status_index] = _err(e)
                return tuple(out) if n_outputs > 1 else out[0]
        return inner
    return wrap


def bind(fn, *args):
    """`fn` with its first arguments fixed (the studio, a method, a vote), named as `fn` on Gradio's API page;
    Gradio's worker thread hands its OpenMP team back afterwards (lm/cpu_threads.py).
    Gradio still finds a gr.Progress default in what is left; a gr.Request parameter it finds only on a plain
    function, so handlers that need the request are wrapped in a closure instead."""
    bound = functools.partial(fn, *args)
    bound.__name__ = fn.__name__
    return hands_back_team(bound)


def run_as_login(app: gr.Blocks) -> None:
    """Every event handler of the page runs as the login that sent it (schema.acting_as), so the store lets it
    reach only that login's people. One wrapper over all of them, made after the tabs are laid out: a handler
    cannot forget to say who asks."""
    for block_fn in app.fns.values():
        if block_fn.fn is not None and not getattr(block_fn.fn, "runs_as_login", False):
            block_fn.fn = _as_login(block_fn.fn)


def _as_login(fn):
    """`fn` with one more positional parameter, typed gr.Request (Gradio fills it), that sets the login around
    each call (each step of a generator: Gradio may run its steps in different threads)."""
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())
    if any(p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params):
        raise TypeError(f"{getattr(fn, '__name__', fn)}: a page handler takes its inputs as positional parameters")
    hints = gr_utils.get_type_hints(fn)  # resolved where fn was written; Gradio reads the wrapper's
    if inspect.isgeneratorfunction(fn) or inspect.isgeneratorfunction(inspect.unwrap(fn)):
        def wrapper(*args):
            *inputs, request = args
            login = logged_in(request)
            steps = fn(*inputs)
            try:
                while True:
                    with acting_as(login):
                        try:
                            out = next(steps)
                        except StopIteration:
                            return
                    yield out
            finally:
                steps.close()  # the page went away: the handler is closed too
    else:
        def wrapper(*args):
            *inputs, request = args
            with acting_as(logged_in(request)):
                return fn(*inputs)
    request = inspect.Parameter("login_request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=gr.Request,
                                default=None)
    wrapper.__signature__ = sig.replace(parameters=[*params, request])
    wrapper.__annotations__ = {**hints, "login_request": gr.Request}
    wrapper.__name__ = getattr(fn, "__name__", "fn")
    wrapper.__doc__ = getattr(fn, "__doc__", None)
    wrapper.runs_as_login = True
    return wrapper


def logged_in(request: gr.Request | None) -> str | None:
    """The user name logged in with --auth; None without it."""
    return getattr(request, "username", None) if request is not None else None


def rater_box(request: gr.Request):
    """With --auth the rater id is the logged-in user name: shown, and not editable (Quick pair and Rate)."""
    who = logged_in(request)
    if not who:
        return gr.skip()
    return gr.update(value=who, interactive=False, label="Rater id (the user you logged in as)")


def version_rows(studio, name: str | None) -> list[list]:
    """The user's style versions as table rows, newest first; none without a (known) user."""
    try:
        return [[r[c] for c in VERSION_COLUMNS] for r in studio.fits.versions(studio.need_user(name))]
    except EXPECTED:
        return []
