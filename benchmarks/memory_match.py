"""The memory's weight by the context's match, chosen on people of sources kept for
tuning, never on the people the study scores: each person onboarded once with a memory (far_share 1), then, per
setting, their memory's weight set and their query decoded as `card` with their own style and with a partner's of
the same cluster (card_shuffled); ROUGE-L, card − card_shuffled and card − cluster with paired intervals, for all
and for the people beyond the build's clusters (closeness < 0.1) and the others; "copied": the share of outputs that
are one of the person's past outputs word for word (with --copy-stop each setting also with a copy stop).

Both candidates lost (docs/RESULTS.md, "(c′)") and live here, not in the package: `matched` scales each row's memory
weight w by clip((s − m) / (1 − m), 0, 1), s the context's cosine similarity to the nearest memory entry; the copy
stop forbids end-of-sequence where a row's answer so far is one of the person's past outputs (their memory's texts).

    python -m benchmarks.memory_match --artifacts B --data G --sources pytest-dev/pytest,encode/django-rest-framework \
        --limit 40 --json memory_match.json
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import replace

import numpy as np
import torch

from benchmarks.form_study import copied_share
from benchmarks.form_tune import closeness, onboarded, tuning_parser, tuning_people
from personalize.methods.card import decoding
from personalize.methods.card.style import memory_keys
from personalize.eval.evaluate import decode_people, shuffled_partners
from personalize.metrics import paired_interval, rouge_per_query


def past_outputs(values: list[int], eos_id: int) -> set[tuple[int, ...]]:
    """The texts a memory's values hold (each past output's tokens, ended by end-of-sequence)."""
    out, cur = set(), []
    for t in values:
        if t == eos_id:
            if cur:
                out.add(tuple(cur))
            cur = []
        else:
            cur.append(t)
    return out


@contextmanager
def matched(match: float, copy_stop: bool, eos_id: int):
    """While the block runs, CARD's memory weight follows the context's match (match > 0), and with `copy_stop` no
    row ends on one of its person's past outputs."""
    scores, call = decoding.style_scores, decoding.CardLogitsProcessor.__call__

    def style_scores(head, st, s, h, cand, base, alpha, standardize=False, openings=None):
        weights = list(st.knn_weights)
        for r, mem in enumerate(st.memory):
            if mem is not None and match > 0:
                q = memory_keys(h[r: r + 1].float(), mem[0].shape[-1], s.key, head)[0]
                if q.shape[-1] == mem[0].shape[-1]:
                    best = float((mem[0] @ q).max())
                    weights[r] = (weights[r] or 0.0) * min(1.0, max(0.0, (best - match) / (1 - match)))
        return scores(head, replace(st, knn_weights=weights), s, h, cand, base, alpha, standardize, openings)

    def stopped(self, input_ids, out_scores):
        pasts = getattr(self, "_pasts", None)
        if pasts is None:  # the first step sees the prompt alone
            self._pasts = [past_outputs(m[1].tolist(), eos_id) if m is not None else set()
                           for m in self.styles.memory]
            self._answers = [[] for _ in self._pasts]
        else:
            self._answers = [a + [t] for a, t in zip(self._answers, input_ids[:, -1].tolist())]
        out = call(self, input_ids, out_scores)
        for r, past in enumerate(self._pasts):
            if past and tuple(self._answers[r]) in past:  # ending here would hand back a past output whole
                out[r, eos_id] = float("-inf")
        return out

    decoding.style_scores = style_scores
    if copy_stop:
        decoding.CardLogitsProcessor.__call__ = stopped
    try:
        yield
    finally:
        decoding.style_scores, decoding.CardLogitsProcessor.__call__ = scores, call


def match_quantiles(engine, fits) -> list[float]:
    """How well a person's new text matches their past: each item's states against the memory of their other
    items (the nearest entry's cosine similarity), quantiles 10-90 % over all tokens of all people."""
    head, s = engine.heads["tokens"], engine.cfg.style
    sims = []
    for f in fits:
        keys = [memory_keys(x.h.float(), engine.lm.hidden_size, s.key, head) for x in f.features or []]
        for i, k in enumerate(keys):
            rest = [o for j, o in enumerate(keys) if j != i]
            if rest:
                sims.append((k @ torch.cat(rest).T).max(-1).values)
    return np.quantile(torch.cat(sims).numpy(), [0.1, 0.25, 0.5, 0.75, 0.9]).round(3).tolist()


def main(argv=None) -> None:
    p = tuning_parser(__doc__)
    p.add_argument("--matches", default="0.6,0.8,0.9")
    p.add_argument("--weights", default="0.3,0.5")
    p.add_argument("--copy-stop", action="store_true", help="also each setting with StyleSettings.copy_stop")
    a = p.parse_args(argv)
    engine, queries, profiles = tuning_people(a)
    base_style = engine.cfg.style
    engine.cfg = replace(engine.cfg, style=replace(base_style, far_share=1.0))  # everyone's memory kept
    fits = onboarded(engine, profiles, a.cache)
    close = np.array([closeness(engine, f) for f in fits])
    far = close < base_style.far_share
    print(f"{len(fits)} people, {far.sum()} beyond the clusters; match quantiles 10-90 %: "
          f"{match_quantiles(engine, fits)}", flush=True)
    prompts, golds = [q.input for q in queries], [q.gold for q in queries]
    partner = shuffled_partners([f.cluster for f in fits])
    engine.cfg = replace(engine.cfg, style=base_style)
    cluster = np.array(rouge_per_query(decode_people(engine, "cluster", prompts, fits, [f.style for f in fits],
                                                     profiles), golds))
    rows = []

    def score(name: str, settings, weight, match: float = 0.0, stop: bool = False) -> None:
        engine.cfg = replace(engine.cfg, style=settings)
        styles = [replace(f.style, knn_weight=weight(i)) for i, f in enumerate(fits)]
        with matched(match, stop, engine.tok.eos_token_id):
            other = np.array(rouge_per_query(decode_people(engine, "card", prompts, fits,
                                                           [styles[j] for j in partner], profiles), golds))
            texts = decode_people(engine, "card", prompts, fits, styles, profiles)
        own = np.array(rouge_per_query(texts, golds))
        copied = copied_share(texts, queries)
        row = {"setting": name, "rougeL": float(own.mean()), "per_query": own.tolist(), "copied": copied,
               "shuffled_per_query": other.tolist()}
        for part, sel in (("all", np.ones(len(own), bool)), ("far", far), ("others", ~far)):
            row[f"card-shuffled {part}"] = paired_interval(own[sel] - other[sel])
            row[f"card-cluster {part}"] = paired_interval(own[sel] - cluster[sel])
        rows.append(row)
        d, c = row["card-shuffled all"], row["card-cluster all"]
        print(f"{name:34s} ROUGE-L {own.mean():.4f}  card−shuffled {d['mean']:+.4f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]"
              f"  card−cluster {c['mean']:+.4f} [{c['ci95'][0]:+.3f}, {c['ci95'][1]:+.3f}]  far/others −shuffled "
              f"{row['card-shuffled far']['mean']:+.4f} / {row['card-shuffled others']['mean']:+.4f}  copied {copied:.0%}",
              flush=True)

    print(f"{'cluster':34s} ROUGE-L {cluster.mean():.4f}", flush=True)
    w_far = base_style.far_knn_weight
    score("far memory only (card)", base_style, lambda i: w_far if far[i] else None)
    score(f"memory for all, w {w_far:g}", base_style, lambda i: w_far)
    for w in map(float, a.weights.split(",")):
        for m in map(float, a.matches.split(",")):
            for stop in ((False, True) if a.copy_stop else (False,)):
                score(f"memory for all, w {w:g}, match {m:g}" + (", copy stop" if stop else ""),
                      base_style, lambda i, w=w: w, m, stop)
    if a.json:
        json.dump({"people": len(fits), "far": int(far.sum()), "cluster_per_query": cluster.tolist(), "rows": rows},
                  open(a.json, "w"))


if __name__ == "__main__":
    main()
