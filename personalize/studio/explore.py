"""Explore: α and K sweeps against the person's own held-out items."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Sequence

import numpy as np

from personalize.card.decoding import DecodingSettings
from personalize.fitting.person import prepared_items
from personalize.metrics import rouge_scores
from personalize.studio.service import Service
from personalize.methods.card import decode as card_decode


class Explorer(Service):
    def __init__(self, rt):
        super().__init__(rt)

    def explore(self, name: str, alphas: Sequence[float], n_holdout: int = 4, s: DecodingSettings | None = None,
                progress: Callable[[float, str], None] | None = None) -> dict:
        """α and K sweeps against the user's own held-out items: λ is refitted without them (not stored), then
        CARD (and the cluster model, for K) generates for their prompts; ROUGE-L and output length per point."""
        s = s or self.engine.cfg.decoding
        if not alphas or any(a < 0 for a in alphas):
            raise ValueError("give one or more α values >= 0")
        with self.model_lock:
            items = prepared_items(self.engine, self.store, name)
            if len(items) < n_holdout + self.engine.cfg.min_fit_items:
                raise ValueError(f"explore needs at least {n_holdout + self.engine.cfg.min_fit_items} history items "
                                 f"({n_holdout} held out, the rest to fit λ); {name!r} has {len(items)}")
            held, rest = items[:n_holdout], items[n_holdout:]
            prompts, golds = [it.x for it in held], [it.y for it in held]
            total, done = len(alphas) + 2 * len(self.ks) + 1, 0

            def tick(what):
                nonlocal done
                done += 1
                if progress:
                    progress(done / total, what)

            fit = self.engine.fit(rest)
            tick("fit the style on the other items")
            emb = self.engine.embed(rest)

            def score(method, k, cluster, alpha):
                outs = card_decode.generate(self.engine, prompts, method, cluster, fit.style, k=k, settings=replace(s, alpha=alpha),
                                            items=rest)
                texts = [g.text for g in outs]
                return {"rougeL": round(rouge_scores(texts, golds)["rougeL"], 4),
                        "length": round(float(np.mean([len(t.split()) for t in texts])), 2), "outputs": texts}

            alpha_rows = []
            for a in alphas:
                alpha_rows.append({"alpha": float(a), **score("card", fit.k, fit.cluster, float(a))})
                tick(f"α = {a}")
            k_rows = []
            for k in self.ks:
                c, _ = self.engine.assign(emb, k)
                for m in ("cluster", "card"):
                    k_rows.append({"k": k, "method": m, "cluster": c, **score(m, k, c, s.alpha)})
                    tick(f"K = {k} ({m})")
        return {"alpha": alpha_rows, "k": k_rows, "golds": golds, "prompts": prompts, "n_fit": len(rest),
                "default_alpha": s.alpha}

    def parse_alphas(self, text: str | None, most: int = 12) -> list[float]:
        """Explore's α values: numbers separated by commas (or semicolons), at most `most` of them."""
        try:
            values = [float(v) for v in (text or "").replace(";", ",").split(",") if v.strip()]
        except ValueError:
            raise ValueError(f"α values must be numbers separated by commas, got {text!r}") from None
        if len(values) > most:
            raise ValueError(f"at most {most} α values per sweep")
        return values
