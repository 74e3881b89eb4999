"""The serving benchmark (`bench --json` key "serving"): what the scheduler and mixed batches buy, measured.

- compare_s / single_s: one Compare of base, cluster, card, cope, p2p for one person (one mixed batch) against
  card alone, same prompt and number of tokens, through the studio's own path, interleaved, medians;
- concurrent: 8 people over 4 clusters pressing Compare at once (scheduled_s: wall time until all are done,
  p50_s / p95_s of their latencies) against the same work one decode at a time, as the studio served it
  before the scheduler (sequential_s: each method of each person alone, behind one lock);
- exact_first_use_s: EXACT's attribute search for one person with the shared-prompt cache, and the old
  full-sequence path's time on the same pairs (exact_first_use_old_s);
- fit: Fit my style on a pasted history (texts only, so §1.8's neutral rewrites run from Save), clicked right
  after Save and after the rewrites ended, as the app's two buttons do; medians over people (fit_after_save);
  with the model work a fit right after Save waits for (TFLOP) and the least time it can take at this machine's
  best fp32 GEMM rate (floor_right_after_save_s);
- start_s: the app's later start, process start to HTTP 200 (the build already made).
"""

from __future__ import annotations

import dataclasses
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Sequence

from personalize.catalog import BY_NAME, SERVING_METHODS

ROOT = Path(__file__).resolve().parents[2]


def _median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def bench_serving(engine, store, names: Sequence[str], prompts: Sequence[str], settings, repeats: int = 3,
                  n_people: int = 8, k: int = 4, exact_pairs: int = BY_NAME["exact"].budget["max_pairs"],
                  start_repeats: int = 3, progress=print) -> dict:
    """The figures of the module docstring; `names` are people already in `store` (onboarded under
    `engine`), `prompts` one per person (cycled)."""
    from personalize.studio.facade import Studio, StudioConfig
    from personalize.lm.cpu_threads import release_team

    studio = Studio(engine, store, StudioConfig(artifacts=str(engine.folder), db=str(store.path),
                                                first_use_in_background=False))
    k = k if k in engine.clusters.centroids else max(engine.clusters.centroids)
    methods = list(SERVING_METHODS)
    try:
        studio.runtime.method("p2p")
    except (ValueError, FileNotFoundError) as e:
        methods.remove("p2p")
        progress(f"serving: p2p left out ({e})")
    release_team()  # as in the app, the main thread keeps no OpenMP team while the scheduler decodes (lm/cpu_threads.py)
    s = dataclasses.replace(settings, max_new_tokens=settings.max_new_tokens, min_new_tokens=settings.max_new_tokens)
    n0, p0 = names[0], prompts[0]

    def run(name, prompt, ms) -> float:
        t0 = time.perf_counter()
        outs = list(studio.comparisons.compare(name, prompt, ms, s, k))
        bad = [o for o in outs if o.error]
        if bad:
            raise RuntimeError(f"{bad[0].method} failed in the serving bench: {bad[0].error}")
        return time.perf_counter() - t0

    run(n0, p0, methods), run(n0, p0, ["card"])  # warm-up (P2P's LoRA, first allocations)
    compare, single = [], []
    for _ in range(repeats):
        compare.append(run(n0, p0, methods))
        single.append(run(n0, p0, ["card"]))
    progress(f"serving: compare {_median(compare):.2f} s, card alone {_median(single):.2f} s")

    # 8 people over (up to) 4 clusters: people of different clusters first
    by_cluster: dict[int, list[str]] = {}
    for n in names:
        by_cluster.setdefault(studio.histories.user_state(n, k).cluster, []).append(n)
    order = [n for i in range(max(map(len, by_cluster.values()))) for c in sorted(by_cluster)
             for n in by_cluster[c][i:i + 1]]
    people = [order[i % len(order)] for i in range(n_people)]
    asks = [(n, prompts[i % len(prompts)]) for i, n in enumerate(people)]

    t0 = time.perf_counter()  # before the scheduler: each method of each person decoded alone, in turn
    for n, p in asks:
        state = studio.histories.user_state(n, k)
        for m in methods:
            with studio.runtime.model_lock:
                studio.runtime.method(m).generate(_context(studio, state), [p], s)
    sequential = time.perf_counter() - t0
    release_team()
    progress(f"serving: {n_people} people one decode at a time {sequential:.1f} s")

    latencies: list[float] = [0.0] * len(asks)
    barrier = threading.Barrier(len(asks))

    def press(i, n, p):
        barrier.wait()
        latencies[i] = run(n, p, methods)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=press, args=(i, n, p)) for i, (n, p) in enumerate(asks)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    scheduled = time.perf_counter() - t0
    q = statistics.quantiles(latencies, n=20) if len(latencies) > 1 else latencies * 19
    progress(f"serving: {n_people} people at once {scheduled:.1f} s (p50 {_median(latencies):.1f} s)")
    out = {"methods": methods, "tokens": s.max_new_tokens, "repeats": repeats,
           "compare_s": round(_median(compare), 3), "single_s": round(_median(single), 3),
           "compare_over_single": round(_median(compare) / _median(single), 3),
           "concurrent": {"people": n_people, "clusters": len({studio.histories.user_state(n, k).cluster for n in people}),
                          "k": k, "sequential_s": round(sequential, 2), "scheduled_s": round(scheduled, 2),
                          "p50_s": round(_median(latencies), 2), "p95_s": round(q[18], 2),
                          "speedup": round(sequential / scheduled, 2),
                          "batches": studio.runtime.scheduler.batches[-10:]}}
    out |= exact_first_use(studio, n0, exact_pairs, progress)
    out["fit"] = fit_after_save(studio, [[i.y for i in store.items(n)] for n in names], progress=progress)
    if start_repeats:
        out["start_s"] = later_start(engine.folder, repeats=start_repeats, progress=progress)
    studio.runtime.scheduler.close()
    return out


def newcomer_studio(artifacts: str, demo_data: str, people: int, prefix: str) -> tuple[object, list[list[str]]]:
    """(a studio on a throwaway database, the texts of the demo picker's first `people` newcomers: people the
    build never saw), for the benchmarks that paste histories as a newcomer does."""
    from personalize.studio.facade import Studio, StudioConfig

    folder = Path(tempfile.mkdtemp(prefix=prefix))
    st = Studio.load(StudioConfig(artifacts=artifacts, db=str(folder / "s.db"), demo_data=demo_data,
                                  export_dir=str(folder / "exports")))
    names = [u for label, u in st.histories.demo_choices() if "new" in label][:people]
    return st, [[i.y for i in st.histories.parse(st.histories.demo_history(n))] for n in names]


def fit_after_save(studio, histories: Sequence[Sequence[str]], n_items: int = 24, progress=print) -> dict:
    """Each history pasted under a new name (texts only: no prompts, so Save starts the neutral rewrites), then
    Fit my style: every other person at once ("right after Save"), the others once the rewrites ended ("after
    the rewrites", as a person who looks at their cluster first). Seconds a fit, per mode and their medians."""
    from personalize.data import Item

    times: dict[str, list[float]] = {"right_after_save_s": [], "after_rewrites_s": []}
    tflop: list[float] = []
    shared: list[float] = []  # the same work with the prompts' common beginning made once
    on_cpu = studio.runtime.engine.model.device.type == "cpu"
    counts = sorted({len(texts[:n_items]) for texts in histories})  # what was pasted: shorter histories paste fewer
    for i, texts in enumerate(histories):
        name, mode = f"pasted-{i}", ("after_rewrites_s" if i % 2 else "right_after_save_s")
        studio.histories.save_history(name, [Item(y=t) for t in texts[:n_items]], studio.runtime.task.name)
        if i % 2:
            studio.histories.rewrites.result()  # Save's background work: the rewrites, then the fit's pass
        t0 = time.perf_counter()
        fit = studio.fits.fit(name)
        times[mode].append(round(time.perf_counter() - t0, 2))
        progress(f"serving: Fit my style, {fit.n_items} pasted items, {mode[:-2].replace('_', ' ')}: "
                 f"{times[mode][-1]:.2f} s {({k: round(v, 2) for k, v in fit.stages_s.items()})}")
        if not i % 2 and on_cpu:
            tflop.append(fit_tflop(studio, name))
            shared.append(fit_tflop(studio, name, shared_prefix=True))
    items = counts[0] if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    out = {"items": items, **times, **{f"median_{k}": round(_median(v), 2) for k, v in times.items()}}
    if not on_cpu:  # the floor is the CPU's: a GPU's rate is another question
        return out
    rate = gemm_gflops()
    floor = [float(f"{t * 1e3 / rate:.3g}") for t in tflop]
    floor_shared = [float(f"{t * 1e3 / rate:.3g}") for t in shared]
    progress(f"serving: right after Save the model work is {_median(tflop):.2f} TFLOP ({_median(shared):.2f} with "
             f"the prompts' common beginning made once); at this machine's best fp32 GEMM rate ({rate:.0f} GFLOP/s) "
             f"no fit can take under {_median(floor):.2f} s ({_median(floor_shared):.2f} s)")
    return {**out, "right_after_save_tflop": tflop, "right_after_save_tflop_shared_prefix": shared,
            "gemm_gflops": round(rate, 1), "floor_right_after_save_s": floor,
            "median_floor_right_after_save_s": float(f"{_median(floor):.3g}"),
            "floor_shared_prefix_s": floor_shared,
            "median_floor_shared_prefix_s": float(f"{_median(floor_shared):.3g}")}


def fit_tflop(studio, name: str, shared_prefix: bool = False) -> float:
    """The model work a Fit right after Save waits for, counted from the person's stored items: §1.8's rewrites
    (their prompts and decoded tokens) and the teacher-forced pass (prompt on the rewrite, then the item). Two FLOP
    per weight per token: the decoder blocks for every token, the word head where a token is decoded or scored;
    attention, LoRA and padding are left out, so the count is a floor. `shared_prefix`: the prompts' common
    beginning (the chat template's system turn, the rewrite instruction) counted once, as a cache could."""
    from os.path import commonprefix

    from personalize.lm.tokens import prompt_ids, target_ids
    from personalize.methods.card.neutral import NEUTRAL_TEMPLATE, plain

    e = studio.runtime.engine
    tok, budget = e.tok, e.cfg.budget
    head = e.model.get_input_embeddings().weight.numel()  # the word head's size, tied to the embedding or not
    blocks = sum(p.numel() for n, p in e.model.named_parameters() if ".layers." in n and "lora_" not in n)
    rewrite_prompts, pass_prompts, read, headed = [], [], 0, 0
    for s in studio.runtime.store.items(name):
        x = s.x
        if not x:  # a pasted text: rewritten first, then its rewrite is the pass's prompt
            rewritten = s.neutral != plain(s.y)  # else the model's rewrite was refused: count one token of it
            decoded = len(tok(s.neutral, add_special_tokens=False)["input_ids"]) + 1 if rewritten else 1
            rewrite_prompts.append(prompt_ids(tok, NEUTRAL_TEMPLATE.format(text=s.y), budget))
            read, headed = read + decoded, headed + decoded
            x = e.task.prompt(s.neutral)
        target = len(target_ids(tok, s.y, budget))
        pass_prompts.append(prompt_ids(tok, x, budget))
        read, headed = read + target, headed + target
    for prompts in (rewrite_prompts, pass_prompts):
        read += sum(map(len, prompts))
        if shared_prefix and len(prompts) > 1:
            read -= (len(prompts) - 1) * len(commonprefix(prompts))
    return float(f"{2 * (blocks * read + head * headed) / 1e12:.4g}")


def gemm_gflops(repeats: int = 10, rows: int = 512) -> float:
    """This machine's best fp32 matrix-multiply rate on the model's linear shapes, with both kernels the model can
    run (MKL's F.linear and oneDNN's packed linear, lm/onednn.py): an upper bound on the rate of the model's work,
    so work / rate is a time no fit can beat."""
    import torch

    best = 0.0
    for n_in, n_out in ((576, 576), (576, 1536), (1536, 576)):
        x, w = torch.randn(rows, n_in), torch.randn(n_out, n_in)
        runs = [lambda: torch.nn.functional.linear(x, w)]
        if torch.backends.mkldnn.is_available():
            packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
            runs.append(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [None], ""))
        for run in runs:
            run()
            for _ in range(repeats):
                t0 = time.perf_counter()
                for _ in range(5):
                    run()
                best = max(best, 2 * rows * n_in * n_out * 5 / (time.perf_counter() - t0) / 1e9)
    return best


def demo_compare(artifacts: str, demo_data: str, tokens: int):
    """(studio, one Compare's rows, card's rows) for the first demo person, saved and fitted in a throwaway
    database: the rows a Compare of SERVING_METHODS decodes, at exactly `tokens` tokens (benchmarks)."""
    from personalize.studio.facade import Studio, StudioConfig

    tmp = Path(tempfile.mkdtemp())
    studio = Studio.load(StudioConfig(artifacts=artifacts, db=str(tmp / "studio.db"), demo_data=demo_data,
                                      first_use_in_background=False))
    name = sorted(studio.runtime.demo_users)[0]
    studio.histories.save_history(name, studio.histories.demo_items(name), studio.runtime.task.name)
    studio.fits.fit(name)
    state = studio.histories.user_state(name)
    prompt = studio.runtime.demo_users[name][0].y[:200]
    s = dataclasses.replace(studio.runtime.engine.cfg.decoding, max_new_tokens=tokens, min_new_tokens=tokens)
    rows = [r for m in SERVING_METHODS for r in studio.comparisons.rows(m, state, prompt, s)]
    return studio, rows, studio.comparisons.rows("card", state, prompt, s)


def _context(studio, state):
    """The person as the methods see them (prompts filled from the stored rewrites)."""
    from personalize.methods.base import UserContext
    from personalize.methods.card.person import prepared_items

    prepared_items(studio.runtime.engine, studio.runtime.store, state.name)
    return UserContext.from_store(studio.runtime.store, state.name, studio.runtime.task, state.cluster, state.k, state.lam)


def exact_first_use(studio, name: str, pairs: int, progress=print) -> dict:
    """EXACT's first use (prepare: the negatives' decode, then the attribute search) for one person, with the
    shared-prefix search and with the old full-sequence pass, on the same pairs; and whether they chose alike."""
    from personalize.methods.exact import ExactConfig, ExactMethod

    user = _context(studio, studio.histories.user_state(name))
    took, chosen = {}, {}
    for shared in (True, False):
        m = ExactMethod(studio.runtime.engine, None, ExactConfig(max_pairs=pairs, shared_prefix=shared))
        t0 = time.perf_counter()
        m.prepare(user)
        took[shared] = time.perf_counter() - t0
        chosen[shared] = {p: e["attributes"] for p, e in m.memory(user.name).items()}
    progress(f"serving: EXACT first use {took[True]:.1f} s (old path {took[False]:.1f} s, "
             f"same attributes: {chosen[True] == chosen[False]})")
    return {"exact_first_use_s": round(took[True], 2), "exact_first_use_old_s": round(took[False], 2),
            "exact_same_attributes": chosen[True] == chosen[False], "exact_pairs": pairs}


def _free_port() -> int:
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        return sk.getsockname()[1]


def one_start(app_args: Sequence[str] = (), timeout: float = 180.0) -> tuple[float, float, str]:
    """(seconds from `python app.py` to the page answering HTTP 200, to the studio serving: its "studio serves: all"
    line, the app's output), with a fresh database; refuses to time a first start (a build)."""
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "app.log"
        cmd = [sys.executable, "-u", str(ROOT / "app.py"), "--port", str(port), "--db", f"{tmp}/studio.db", *app_args]
        t0, page = time.perf_counter(), None
        with log.open("w") as out:
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=os.environ.copy())
        try:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"app.py exited with {proc.returncode}:\n{log.read_text()[-2000:]}")
                text = log.read_text()
                if "first start" in text:
                    raise RuntimeError("the artifacts are being built: start the app once before timing")
                if page is not None and "studio serves: all" in text:
                    return page, time.perf_counter() - t0, text
                if page is None:
                    try:
                        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1) as r:
                            if r.status == 200:
                                page = time.perf_counter() - t0
                    except OSError:
                        pass
                if time.perf_counter() - t0 > timeout:
                    raise RuntimeError(f"app.py did not answer within {timeout:.0f} s")
                time.sleep(0.05)
        finally:
            proc.terminate()
            proc.wait(30)


def later_start(artifacts, repeats: int = 3, timeout: float = 180.0, progress=print) -> float:
    """Median seconds from `python app.py` to the studio serving on a built artifacts folder (its page answers
    before: one_start)."""
    times = [one_start(["--artifacts", str(artifacts)], timeout)[1] for _ in range(repeats)]
    progress(f"serving: later start {_median(times):.1f} s (runs {[round(t, 1) for t in times]})")
    return round(_median(times), 2)
