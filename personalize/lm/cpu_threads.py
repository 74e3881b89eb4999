"""CPU threads: a thread that has finished its torch work hands its OpenMP team back.

Why: libgomp (the OpenMP runtime of torch's Linux wheels) keeps a team of helper threads for every thread
that ran a parallel op, for as long as that thread lives, and once the helpers of all teams outnumber the
cores it stops spin-waiting in *every* team (libgomp's `gomp_throttled_spin_count_var`): each of the hundreds of
parallel ops of a decode step then sleeps on a futex and waits to be woken. A serving process has many such
threads (the main thread that loaded the model, Gradio's workers that fit, the first-use and background
workers, the scheduler's decode thread), so the decode thread ran throttled. Measured on this 2-core machine
(benchmarks/omp_teams.py, medians of 5): a six-row Compare decode took 3.4 s in a worker thread with its
team alone and 6.3 s once the main thread also kept the team it made while loading the model.

So whoever goes idle hands its team back with OpenMP 5's `omp_pause_resource_all`, which frees the calling
thread's team only; the thread's next parallel op makes a new one (a few tens of µs). Elsewhere (another
OpenMP runtime, no libgomp loaded, macOS) this does nothing.
"""

from __future__ import annotations

import ctypes
import functools
import inspect
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from pathlib import Path

_OMP_PAUSE_HARD = 2  # omp_pause_resource_t: omp_pause_soft = 1, omp_pause_hard = 2


_found: list = []  # [the libgomp handle or None], once it is known


def _libgomp():
    """The libgomp this process already loaded (torch's own copy, whatever its file name), or None: loading
    another copy would have its own teams and free none of torch's. Not settled before torch is imported
    (torch loads it)."""
    if _found:
        return _found[0]
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        maps = ""
    lib = None
    for path in sorted({line.split()[-1] for line in maps.splitlines() if "libgomp" in line and "/" in line}):
        try:
            lib = ctypes.CDLL(path)
            lib.omp_pause_resource_all.restype = ctypes.c_int
            lib.omp_pause_resource_all.argtypes = [ctypes.c_int]
            break
        except (OSError, AttributeError):
            lib = None
    if lib is not None or "torch" in sys.modules:
        _found.append(lib)
    return lib


def release_team() -> bool:
    """Frees the calling thread's OpenMP team; True where the runtime did it. Harmless inside a parallel
    region (the runtime refuses) and on a thread without a team."""
    lib = _libgomp()
    return lib is not None and lib.omp_pause_resource_all(_OMP_PAUSE_HARD) == 0


def hands_back_team(fn):
    """`fn` followed by release_team() in the thread that ran it; for a generator function, after each of
    its steps (Gradio may run a streaming handler's steps on different worker threads)."""
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def steps(*args, **kwargs):
            it = fn(*args, **kwargs)
            try:
                while True:
                    try:
                        value = next(it)
                    except StopIteration as stop:
                        return stop.value
                    finally:
                        release_team()
                    yield value
            finally:
                it.close()  # a page that went away closes us: close the handler too
        return steps

    @functools.wraps(fn)
    def inner(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        finally:
            release_team()
    return inner


class ReleasingExecutor(ThreadPoolExecutor):
    """A ThreadPoolExecutor whose worker hands its OpenMP team back after every job."""

    def submit(self, fn, /, *args, **kwargs):
        return super().submit(hands_back_team(fn), *args, **kwargs)


def lower_priority(nice: int = 10) -> None:
    """This thread, and the OpenMP helpers it starts from now on, yield the cores to request handlers
    (Linux keeps a nice value per thread, and new threads inherit it). Votes cast as the page casts them
    while 8 Compares decoded (benchmarks/serving_load.py --rounds 3, ~60 votes): median 6 ms, p95 43 ms,
    max 63 ms with the decode thread at nice 10; median 12, p95 63, max 154 ms at the handlers' priority.
    Where threads have no nice value of their own, or it cannot be raised, nothing changes."""
    with suppress(AttributeError, OSError):
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))


def trim_memory() -> bool:
    """Give the heap's freed pages back to the system (glibc's malloc_trim). Why: after a first-use job (OPPU's
    training of a person's adapter) glibc keeps the activations' freed arenas, so the studio's resident memory
    stayed 2.9 GB higher for good (benchmarks/soak.py: 2.9 → 5.9 GB at the first OPPU training, then flat);
    measured once on the Debian demo build: 4,293 MB after a training, 1,762 MB after the trim. Where libc has
    no malloc_trim (musl, macOS) nothing happens and it returns False."""
    try:
        return bool(ctypes.CDLL(None).malloc_trim(0))
    except (OSError, AttributeError):
        return False
