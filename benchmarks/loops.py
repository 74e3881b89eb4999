"""Issue 36: how often each method's outputs loop or echo their prompt's scaffold, on held-out people of a build.

The people are those of the data's split that the build neither trained on (config.json's users) nor chose its
decoding with (report.validation_people). Each is fitted from their history (at most --items items) and asks their
own query as Compare asks it: every method's rows in one mixed batch (eval/loops.py), at the build's decoding
settings (the studio's defaults) and at 128 new tokens. EXACT's search and OPPU's training are capped
(--exact-pairs, --oppu-steps: a CPU budget; the loops are the decoding's).

    .venv/bin/python -m benchmarks.loops --artifacts data/artifacts/demo --data data/demo --people 24 --json loops.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path

from personalize.methods.card import onboard
from personalize.catalog import ALL_METHODS
from personalize.data import read_lamp
from personalize.eval.loops import Person, format_loops, loop_shares
from personalize.methods.engine import Engine
from personalize.store import Store


def held_out(engine: Engine, data: str, split: str, n: int) -> list:
    """The split's first n queries of people the build neither trained on nor chose its decoding with."""
    seen = set(engine.meta.get("users", [])) | set(engine.meta.get("report", {}).get("validation_people", []))
    _, queries = read_lamp(data, split)
    return [q for q in queries if (q.user or q.id) not in seen and len(q.profile) >= 2][:n]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifacts", default="data/artifacts/demo")
    ap.add_argument("--data", default="data/demo")
    ap.add_argument("--split", default="dev")
    ap.add_argument("--people", type=int, default=24)
    ap.add_argument("--items", type=int, default=24, help="history items a person is fitted on")
    ap.add_argument("--methods", default=",".join(ALL_METHODS))
    ap.add_argument("--exact-pairs", type=int, default=2)
    ap.add_argument("--oppu-steps", type=int, default=8)
    ap.add_argument("--tokens", default="default,128", help="max new tokens: 'default' is the build's")
    ap.add_argument("--state", default=None,
                    help="a folder for the per-person work (EXACT's memory, PAG's summary, OPPU's adapters), kept so "
                         "that a second run (another version of the code) reuses it; default: a temporary one")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    engine = Engine.load(a.artifacts)
    queries = held_out(engine, a.data, a.split, a.people)
    if len(queries) < a.people:
        print(f"only {len(queries)} held-out people in {a.data} ({a.split})")
    people = []
    for q in queries:
        items = engine.prepare_items(list(q.profile[: a.items]))
        people.append(Person(q.user or q.id, q.input, tuple(items), onboard.fit(engine, items)))
    print(f"{len(people)} held-out people fitted in {time.perf_counter() - t0:.0f} s")
    tokens = [None if t == "default" else int(t) for t in a.tokens.split(",")]
    configs = {"exact": {"max_pairs": a.exact_pairs}, "oppu": {"max_steps": a.oppu_steps, "report_loss": False}}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(a.state or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        store = Store(folder / "loops.db")
        table = loop_shares(engine, store, people, folder, [m for m in a.methods.split(",") if m], configs, tokens)
    print(format_loops(table))
    result = {"table": table, "settings": {"artifacts": engine.artifacts_id, "data": a.data, "split": a.split,
                                           "people": [p.name for p in people], "items": a.items,
                                           "decoding": dataclasses.asdict(engine.cfg.decoding),
                                           "exact_pairs": a.exact_pairs, "oppu_steps": a.oppu_steps,
                                           "wall_s": round(time.perf_counter() - t0, 1)}}
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2, default=str))
        print(f"wrote {a.json}")
    return result


if __name__ == "__main__":
    main()
