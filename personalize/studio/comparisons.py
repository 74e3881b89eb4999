"""Decoding for the tabs: every method's rows (methods.registry) sent to the scheduler as one request, Compare's
stream of tokens per column, outputs stored as generations, and Why (CARD step by step)."""

from __future__ import annotations

import functools
import json
import queue
import time
from itertools import accumulate
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator, Sequence

from personalize.serving.generation import Generation
from personalize.serving.settings import DecodingSettings
from personalize.catalog import ALL_METHODS, CARD_ROWS, CORE_METHODS
from personalize.methods.registry import METHODS
from personalize.methods.card.person import stored_with_rewrites
from personalize.lm.tokens import decode as decode_text
from personalize.methods.base import UserContext
from personalize.store import StoreError
from personalize.serving.scheduler import DecodeScheduler
from personalize.studio.histories import Histories, UserState
from personalize.studio.first_use_jobs import FirstUseJobs
from personalize.studio.service import Service

FAILED = (ValueError, StoreError, FileNotFoundError, RuntimeError)  # a method that cannot run: its column says why


@dataclass
class MethodOutput:
    method: str
    text: str = ""
    latency_s: float = 0.0
    n_tokens: int = 0
    gen_id: int | None = None
    info: dict = field(default_factory=dict)  # what the method chose (EXACT's attributes, RAG's items)
    error: str | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.n_tokens / self.latency_s if self.latency_s > 0 else 0.0


@dataclass(frozen=True)
class ComparePlan:
    """What Compare runs, checked before anything decodes: the person, the prompt (resolve_prompt), their state at
    K, which methods' first use does per-person work (EXACT's attribute search, OPPU's training) and the methods
    in the order they run (slow first uses last)."""
    name: str
    prompt: str
    state: UserState
    first_use: dict[str, bool]
    order: list[str]


@dataclass(frozen=True)
class Explanation:
    """Why's answer: CARD's output token by token, and the person's place in the build it was decoded at."""
    text: str
    steps: list[dict]  # per token: the chosen one, the cluster model's, the candidates on one scale (step_figure)
    pieces: list[tuple[str, bool]]  # the text in displayed pieces, each marked changed or kept (text_pieces)
    alpha: float
    fitted: bool
    cluster: int
    k: int


def generation_settings(state: UserState, s: DecodingSettings) -> dict:
    """What a stored generation was decoded with (a Quick pair reuses an output only under the same)."""
    return {"alpha": s.alpha, "top_k": s.top_k, "max_new_tokens": s.max_new_tokens, "k": state.k,
            "cluster": state.cluster, "fitted": state.fitted}


def text_pieces(tok, steps: Sequence[dict]) -> list[tuple[str, bool]]:
    """(text, changed) per displayed piece: byte-level tokens that only together form a character (an
    emoji is often 2-4 tokens) are merged, changed if any of them was; special tokens are dropped."""
    ids, shown, out, changed = [], "", [], False
    for st in steps:
        ids.append(st["token_id"])
        changed = changed or st["changed"]
        text = tok.decode(ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):  # an incomplete character: wait for its next bytes
            continue
        if text[len(shown):]:
            out.append((text[len(shown):], changed))
        shown, changed = text, False
    return out


class Comparisons(Service):
    def __init__(self, rt, histories: Histories, first_use_jobs: FirstUseJobs):
        super().__init__(rt)
        self.histories = histories
        self.first_use_jobs = first_use_jobs

    def person(self, state: UserState, stored=None) -> UserContext:
        """The person as the methods see them: their history, read once (`stored`: already read), missing neutral
        rewrites filled."""
        stored, neutral = stored_with_rewrites(self.engine, self.store, state.name, stored=stored)
        return UserContext.of_stored(state.name, stored, neutral, self.task, state.cluster, state.k, state.lam)

    def rows(self, method: str, state: UserState, prompt: str, s: DecodingSettings,
             trace: bool = False, person: Callable[[], UserContext] | None = None) -> list:
        """The method's rows for one prompt (serving.rows.DecodeRow); built in the scheduler's worker. `person`:
        the request's, so a request of several methods reads the person once."""
        if line := self.rt.coming.column(method):  # its part of the build is not served yet
            raise ValueError(line)
        person = person or (lambda: self.person(state))
        self.engine.loaded_adapters()  # a row may read any cluster's LoRA: those a start left for later load now
        if method in CORE_METHODS:  # their person needs no stored rewrites (card's own items when it retrieves them)
            m = self.rt.method(method)
            user = UserContext(state.name, person().items if m.needs_items else [], state.cluster, state.k, state.lam)
            rows = m.rows(user, [prompt], s, trace=trace)
            training = self.first_use_jobs.own_words(state.name) if CARD_ROWS[method].steered else ""
            return [replace(r, note="; ".join(filter(None, (r.note, training)))) if training else r for r in rows]
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; choose from {ALL_METHODS}")
        user = person()
        m = self.rt.method(method)
        if not m.is_prepared(user):  # normally done by the background job; here the caller waits for it
            m.prepare(user)
        return m.rows(user, [prompt], s, trace=trace)

    def decode(self, method: str, state: UserState, prompt: str, s: DecodingSettings,
               on_step: Callable[[int, int], None] | None = None, trace: bool = False) -> Generation:
        if self.first_use_jobs.needs_indexing(state.name, method):
            self.first_use_jobs.wait_first_use(state.name, method)  # in this thread: the scheduler's worker stays free
        return self.rt.scheduler.run(lambda: self.rows(method, state, prompt, s, trace), on_step)[0]

    def run_method(self, method: str, state: UserState, prompt: str, s: DecodingSettings,
                   on_step: Callable[[int, int], None] | None = None) -> MethodOutput:
        """One method's output, stored as a generation; a method that cannot run says why instead."""
        try:
            g = self.decode(method, state, prompt, s, on_step)
        except FAILED as e:
            return MethodOutput(method, error=str(e))
        return self.stored(method, state, prompt, s, g)

    def stored(self, method: str, state: UserState, prompt: str, s: DecodingSettings, g: Generation,
               history=None) -> MethodOutput:
        """The output stored as a generation, with its trace, note and whether it is one of the person's past texts
        handed back (`history`: their stored items, when the caller has read them already)."""
        try:  # a method's trace, kept in the store only when it is plain JSON (CARD's tensors are not)
            info = {"trace": g.trace} if g.trace and json.dumps(g.trace) else {}
        except TypeError:
            info = {}
        note = getattr(g, "note", None)  # why the method did what it did (CARD falling back to the cluster model)
        if note:
            info["note"] = str(note)
        if repeat := self.histories.repeat_line(state.name, g.text, history):  # an old text handed back, any method
            info["repeats"] = repeat
        gid = self.store.add_generation(state.name, self.engine.artifacts_id, method, prompt, g.text,
                                        generation_settings(state, s), g.latency_s, g.n_tokens, info)
        return MethodOutput(method, g.text, g.latency_s, g.n_tokens, gid, info)

    def compare(self, name: str, prompt: str, methods: Sequence[str], s: DecodingSettings,
                k: int | None = None) -> Iterator[MethodOutput]:
        """Each chosen method's output on a prompt already made, as soon as it is ready (the plan checked first)."""
        return (v for kind, _, v in self.compare_stream(self.compare_plan(name, prompt, False, None, methods, k), s)
                if kind == "done")

    def compare_stream(self, plan: ComparePlan, s: DecodingSettings,
                       poll_s: float = 0.5) -> Iterator[tuple[str, str, object]]:
        """(kind, method, value) events while the plan's Compare runs: ("text", m, the text so far) as tokens are
        decoded, ("progress", m, a line) while a method's first use prepares in the background, ("done", m,
        MethodOutput). The ready methods' rows go to the scheduler as one request (one mixed batch, shared with
        other sessions' requests); a method whose first use needs work waits for its background job, and the
        other columns do not wait for it. A column is done when its own row ends (its end-of-text or its token
        limit), not when the whole batch does: its output is then what the runner returns for that row (the
        same tokens, the row's note and what it retrieved), stored at once."""
        state, prompt = plan.state, plan.prompt
        # read by the first column that needs it, for all (they are built one at a time, under the model lock)
        history = functools.cache(lambda: self.store.items(state.name))  # read once, for every column and mark
        person = functools.cache(lambda: self.person(state, history()))
        events: queue.Queue = queue.Queue()
        tok, eos = self.engine.tok, self.engine.tok.eos_token_id
        tokens: dict[str, list[int]] = {m: [] for m in plan.order}
        built: dict[str, list] = {}  # each column's rows, as the scheduler's worker built them
        pressed = time.perf_counter()
        last_token: dict[str, float] = {}  # a column's latency is its own: from the press to its last token
        # a column ends with its own row where this process decodes it; on Ray Serve replicas (distributed/remote)
        # the streamed tokens are not yet the row's final text, so a column there ends with its request
        in_process = isinstance(self.rt.scheduler, DecodeScheduler)

        def start(columns: list[str]) -> None:
            """One request for these columns' rows."""
            owner: list[str] = []  # the request's row i is owner[i]'s

            def on_step(i: int, t: int) -> None:
                m = owner[i]
                # the column's one row, whose end its tokens show (no trace to assemble after); else: its request's
                got, mine = tokens[m], built.get(m) if in_process else None
                row = mine[0] if mine and len(mine) == 1 and not mine[0].want_trace else None
                limit = row.settings.max_new_tokens if row is not None else s.max_new_tokens
                if got and got[-1] == eos or len(got) >= limit:
                    return
                got.append(t)
                last_token[m] = time.perf_counter()
                ended = row is not None and (t == eos or len(got) >= limit)
                events.put(("ended" if ended else "token", m, None))

            def rows() -> list:
                for m in columns:
                    built[m] = list(self.rows(m, state, prompt, s, person=person))
                    owner.extend([m] * len(built[m]))
                return [r for m in columns for r in built[m]]

            self.rt.scheduler.submit(rows, on_step).add_done_callback(lambda f: events.put(("finished", columns, f)))

        def output(m: str, g: Generation | Exception) -> MethodOutput:
            if not isinstance(g, Exception):
                try:
                    g = replace(g, latency_s=last_token.get(m, time.perf_counter()) - pressed)
                    return self.stored(m, state, prompt, s, g, history())
                except FAILED as e:
                    g = e
            return MethodOutput(m, error=str(g))

        left = set(plan.order)
        for m in plan.order:  # a method whose part of the build is not served yet: its column says when it comes
            if line := self.rt.coming.column(m):
                left.discard(m)
                yield "done", m, MethodOutput(m, error=line)
        waiting = {m: self.first_use_jobs.start_first_use(state.name, m) for m in plan.order
                   if plan.first_use[m] and m in left}
        if len(waiting) < len(left):
            start([m for m in plan.order if m not in waiting and m in left])
        while left:
            try:
                kind, m, value = events.get(timeout=poll_s)
            except queue.Empty:
                kind = None
            if kind == "token" and m in left:
                yield "text", m, decode_text(tok, tokens[m])
            elif kind == "ended" and m in left:  # this column's row is over: done now, whatever the batch does
                left.discard(m)
                row, text = built[m][0], decode_text(tok, tokens[m])
                yield "done", m, output(m, Generation(text, len(tokens[m]), 0.0, row.trace, row.note))
            elif kind == "finished":
                try:
                    gens = value.result()
                    outs = {c: gens[i] for c, i in zip(m, accumulate((len(built[c]) for c in m), initial=0))}
                except FAILED as e:
                    outs = {c: e for c in m}
                    if len(m) > 1:  # one column's rows broke the request: each column again alone, its error its own
                        outs = {}
                        for c in [c for c in m if c in left]:
                            tokens[c].clear()
                            start([c])
                for c, g in outs.items():
                    if c in left:
                        left.discard(c)
                        yield "done", c, output(c, g)
            if ready := [m for m, job in waiting.items() if job["state"] in ("done", "error")]:
                start(ready)  # an error shows when the method runs (it retries the first use in the decode)
                waiting = {m: job for m, job in waiting.items() if m not in ready}
            if kind is None or kind == "finished":
                for m, job in waiting.items():
                    yield "progress", m, self.first_use_jobs.line(job)

    def why(self, name: str | None, text: str | None, s: DecodingSettings, k: int | None = None,
            templated: bool = False, item_id: float | None = None) -> Explanation:
        """CARD's decoding step by step on Compare's prompt (histories.resolve_prompt: the typed text, in the task
        template when `templated`, or a picked history item's): the token chosen, the cluster model's choice, and
        for the chosen token and its top rivals the log-probability among the step's candidates before (the
        cluster model), the correction and after (CARD), on one scale."""
        self.rt.need_head("Why")
        name = self.rt.need_user(name)
        prompt = self.histories.resolve_prompt(text, templated, item_id, name)[0]
        state = self.histories.user_state(name, k)
        g = self.decode("card", state, prompt, s, trace=True)
        tok, steps = self.engine.tok, []
        for st in (g.trace or [])[: g.n_tokens]:
            used = st["cand"][0] >= 0  # the top-k candidates and the memory's extra tokens
            cand, before, after = st["cand"][0][used], st["before"][0][used], st["after"][0][used]
            order = after.argsort(descending=True)
            chosen = int(st["chosen"][0]) if st.get("chosen") is not None else int(cand[order[0]])
            cluster_choice = int(cand[before.argmax()])
            shown = order[:10].tolist()  # the chosen token and the cluster model's are always among those shown
            shown += [j for j in range(len(cand)) if int(cand[j]) in (chosen, cluster_choice) and j not in shown]
            steps.append({"token": tok.decode([chosen]), "token_id": chosen, "changed": chosen != cluster_choice,
                          "cluster_token": tok.decode([cluster_choice]),
                          "candidates": [{"token": tok.decode([int(cand[j])]), "chosen": int(cand[j]) == chosen,
                                          "before": float(before[j]), "correction": float(after[j] - before[j]),
                                          "after": float(after[j])} for j in shown]})
        return Explanation(g.text, steps, text_pieces(tok, steps), s.alpha, state.fitted, state.cluster, state.k)

    def compare_plan(self, name: str | None, text: str | None, templated: bool, item_id: float | None,
                     methods: Sequence[str] | None, k: int | None = None) -> ComparePlan:
        """The Compare checked and resolved once, before anything decodes; compare_stream runs this plan."""
        name = self.rt.need_user(name)
        if not methods:
            raise ValueError("choose at least one method")
        if unknown := [m for m in methods if m not in ALL_METHODS]:
            raise ValueError(f"choose methods among {', '.join(ALL_METHODS)} (unknown: {unknown})")
        prompt = self.rt.check_prompt(self.histories.resolve_prompt(text, templated, item_id, name)[0])
        state = self.histories.user_state(name, k)
        first = {m: self.first_use_jobs.needs_indexing(name, m) for m in methods}
        return ComparePlan(name, prompt, state, first, sorted(methods, key=first.get))
