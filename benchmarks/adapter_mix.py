"""Issue 23, item 2c: can a person's adapter as a mix of the build's cluster adapters (PER-PCS / PROPER style) move
their text? Measured before building it into onboarding.

For each person of a left-out source (their query and ≤ 24 profile items): the build's pieces (the K = 1 adapter
and the default K's cluster adapters) score the person's own profile items, teacher-forced (mean log-prob per
token), one pass per piece. Then four adapters decode the person's query (greedy, the build's decoding) and score
its gold: the nearest centroid's (the `cluster` method), the piece their own items like best, the uniform mix of
all pieces, and the posterior mix (weights ∝ exp of each piece's summed log-prob of their items: which piece
would have written them). Mixes are exact sums of the LoRA deltas (peft `add_weighted_adapter`, "cat"). An
oracle (the best piece for the gold itself) bounds what any choice among the pieces could give.

    python -m benchmarks.adapter_mix --artifacts A --data ../shared/data/commit_subjects --sources scipy/scipy \
        --limit 40 --json mix.json
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from tqdm import tqdm

from personalize.methods.card.adapters import BASE_ADAPTER, adapter_name
from personalize.data import read_lamp, select_sources
from personalize.methods.card.score import score_sequences
from personalize.methods.engine import Engine
from personalize.metrics import paired_interval, rouge_per_query
from personalize.serving.rows import DecodeRow


def piece_scores(engine: Engine, pieces: list[str], items) -> np.ndarray:
    """[pieces, items] summed log-prob of each item's text after its prompt under each piece."""
    cfg = engine.cfg
    rows = [DecodeRow(it.x, cfg.budget, cfg.decoding, p) for p in pieces for it in items]
    s = score_sequences(engine.model, engine.tok, rows, [it.y for it in items] * len(pieces))
    return s.numpy().reshape(len(pieces), len(items))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--artifacts", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--split", default="dev")
    ap.add_argument("--sources", default="")
    ap.add_argument("--limit", type=int, default=40)
    ap.add_argument("--max-items", type=int, default=24)
    ap.add_argument("--score-items", type=int, default=12, help="profile items the pieces score (the newest)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    engine = Engine.load(a.artifacts)
    k = engine.cfg.default_k
    pieces = [BASE_ADAPTER] + [adapter_name(k, c) for c in range(k)] if k > 1 else [BASE_ADAPTER]
    _, queries = read_lamp(a.data, a.split)
    queries = [q for q in select_sources(queries, [s for s in a.sources.split(",") if s])
               if q.gold is not None and q.profile][: a.limit]
    cfg, model = engine.cfg, engine.model
    kinds = ("nearest", "own_best", "uniform_mix", "posterior_mix")
    out = {m: [] for m in (*kinds, "oracle_piece")}
    gold_lp = {m: [] for m in (*kinds, "oracle_piece")}
    people, t0 = [], time.perf_counter()
    for q in tqdm(queries, desc="people", mininterval=2.0):
        items = engine.prepare_items(q.profile[: a.max_items])
        nearest, _ = engine.assign(engine.embed(items), k)
        own = piece_scores(engine, pieces, items[: a.score_items]).sum(1)  # [pieces]
        post = np.exp(own - own.max())
        post /= post.sum()
        made = {"uniform_mix": [1.0 / len(pieces)] * len(pieces), "posterior_mix": post.tolist()}
        for name, w in made.items():
            if name in model.peft_config:
                model.delete_adapter(name)
            model.add_weighted_adapter(pieces, w, name, combination_type="cat")
        adapters = {"nearest": adapter_name(k, nearest) if k > 1 else BASE_ADAPTER,
                    "own_best": pieces[int(own.argmax())], **{n: n for n in made}}
        rows = [DecodeRow(q.input, cfg.budget, cfg.decoding, adapters[m]) for m in kinds]
        rows += [DecodeRow(q.input, cfg.budget, cfg.decoding, p) for p in pieces]
        lp = score_sequences(model, engine.tok, rows, [q.gold] * len(rows), length_norm=True).tolist()
        gens = engine.decode_rows(rows)
        piece_rouge = rouge_per_query([g.text for g in gens[len(kinds):]], [q.gold] * len(pieces))
        best = int(np.argmax(piece_rouge))
        for j, m in enumerate(kinds):
            out[m].append(gens[j].text)
            gold_lp[m].append(lp[j])
        out["oracle_piece"].append(gens[len(kinds) + best].text)
        gold_lp["oracle_piece"].append(max(lp[len(kinds):]))
        people.append({"id": q.id, "gold": q.gold, "nearest": adapters["nearest"], "own_best": adapters["own_best"],
                       "posterior": [round(x, 4) for x in post.tolist()],
                       "own_logprob": [round(float(x), 3) for x in own], "piece_rougeL": piece_rouge,
                       **{m: out[m][-1] for m in out}})
    golds = [q.gold for q in queries]
    rouge = {m: rouge_per_query(v, golds) for m, v in out.items()}
    rng = np.random.default_rng(0)
    res = {"n": len(queries), "pieces": pieces, "seconds": round(time.perf_counter() - t0, 1),
           "rougeL": {m: round(float(np.mean(v)), 4) for m, v in rouge.items()},
           "gold_logprob": {m: round(float(np.mean(v)), 4) for m, v in gold_lp.items()},
           "differences": {f"{m} - nearest": paired_interval(np.asarray(rouge[m]) - np.asarray(rouge["nearest"]),
                                                             2000, rng=rng) for m in rouge if m != "nearest"},
           "own_best_is_nearest": sum(p["own_best"] == p["nearest"] for p in people),
           "people": people}
    print(json.dumps({k_: v for k_, v in res.items() if k_ != "people"}, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
