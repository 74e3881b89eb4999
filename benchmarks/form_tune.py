"""Choosing the form bias's settings (StyleSettings.form_*) on people of sources kept for tuning, never on the people
the study scores: each person onboarded once, then, per setting, their form refitted from the same pass (closed form)
and their query decoded as `card`; ROUGE-L and the share of outputs opening like the population's "BUG:" or "DOC:".

    python -m benchmarks.form_tune --artifacts B --data G --sources pytest-dev/pytest,encode/django-rest-framework \
        --limit 40 --json form_tune.json
"""

from __future__ import annotations

import argparse
import itertools
import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from benchmarks.form_study import prefix_share
from personalize.methods.card import onboard
from personalize.methods.card.head import TokenData
from personalize.methods.card.style import fit_form, fit_lambda_bias
from personalize.data import read_lamp, select_sources
from personalize.eval.evaluate import decode_people, shuffled_partners
from personalize.methods.engine import Engine
from personalize.metrics import rouge_per_query


def tuning_parser(doc: str) -> argparse.ArgumentParser:
    """The arguments every tuning study takes: the build, the people's folder, their sources, how many."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--artifacts", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--sources", required=True, help="sources kept for tuning (never the study's)")
    p.add_argument("--limit", type=int, default=40)
    p.add_argument("--json", default=None)
    p.add_argument("--cache", default=None, help="a file for the people's fits (reused by later runs)")
    return p


def tuning_people(a) -> tuple[Engine, list, list]:
    """The build loaded, the first --limit people of --sources with a gold output and a profile, and each one's
    profile prepared as onboarding takes it (its first 24 items)."""
    _, queries = read_lamp(a.data, "dev")
    engine = Engine.load(a.artifacts)
    queries = [q for q in select_sources(queries, a.sources.split(",")) if q.gold and q.profile][: a.limit]
    return engine, queries, [engine.prepare_items(q.profile[:24]) for q in queries]


def onboarded(engine: Engine, profiles, cache: str | None) -> list:
    """Each person's fit (their onboarding pass included), read from `cache` when it holds them, else made and saved
    there: settings that refit from the same pass need not redo it."""
    if cache and Path(cache).exists() and len(fits := torch.load(cache, weights_only=False)) >= len(profiles):
        return fits[: len(profiles)]  # the first people of a larger run's cache are these people
    fits = [onboard.fit(engine, items) for items in profiles]
    if cache:
        torch.save(fits, cache)
    return fits


def own_styles(engine: Engine, fits) -> list:
    """Each person's style refitted from their onboarding pass under the engine's settings now (a cached fit may
    hold another setting's)."""
    head = engine.heads["tokens"]
    return [onboard.fit_style(engine, f.features, head, far=onboard.is_far(engine, f.k, f.distances))[0] for f in fits]


@dataclass
class Baseline:
    """The tuning people as every later candidate starts: onboarded, their styles under the build's settings, a
    partner of the same cluster each (card_shuffled), and the cluster model's and card's ROUGE-L of their queries."""
    engine: Engine
    queries: list
    profiles: list
    fits: list
    styles: list
    partner: list[int]
    cluster: np.ndarray
    card: np.ndarray

    @property
    def prompts(self) -> list[str]:
        return [q.input for q in self.queries]

    @property
    def golds(self) -> list[str]:
        return [q.gold for q in self.queries]


def judged_line(r: dict) -> str:
    return (f"ROUGE-L {r['rougeL']:.4f}  −cluster {interval_text(r['minus_cluster'])}  −card "
            f"{interval_text(r['minus_card'])}  −shuffled {interval_text(r['minus_shuffled'])}  copied {r['copied']:.0%}")


def baseline(a) -> Baseline:
    engine, queries, profiles = tuning_people(a)
    fits = onboarded(engine, profiles, a.cache)
    styles = own_styles(engine, fits)
    prompts, golds = [q.input for q in queries], [q.gold for q in queries]
    cluster, card = (np.asarray(rouge_per_query(decode_people(engine, m, prompts, fits, styles, profiles), golds))
                     for m in ("cluster", "card"))
    print(f"{len(fits)} people; cluster {cluster.mean():.4f}, card {card.mean():.4f}", flush=True)
    return Baseline(engine, queries, profiles, fits, styles, shuffled_partners([f.cluster for f in fits]), cluster, card)


def interval_text(d: dict) -> str:
    return f"{d['mean']:+.4f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]"


def main(argv=None) -> None:
    p = tuning_parser(__doc__)
    p.add_argument("--priors", default="0.5,2,8")
    p.add_argument("--positions", default="1,3")
    p.add_argument("--centers", default="0", help="λ's prior centres to try")
    a = p.parse_args(argv)
    engine, queries, profiles = tuning_people(a)
    fits = onboarded(engine, profiles, a.cache)
    prompts, golds = [q.input for q in queries], [q.gold for q in queries]
    base_style = engine.cfg.style
    rows = []

    def score(name, method, settings, styles):
        engine.cfg = replace(engine.cfg, style=settings)
        out = decode_people(engine, method, prompts, fits, styles, profiles)
        rl = rouge_per_query(out, golds)
        rows.append({"setting": name, "rougeL": round(float(np.mean(rl)), 4), "prefix": prefix_share(out),
                     "per_query": rl})
        print(f"{name:40s} ROUGE-L {np.mean(rl):.4f}  prefix {prefix_share(out):.0%}", flush=True)

    score("cluster", "cluster", base_style, [f.style for f in fits])
    score("card without form", "card", replace(base_style, form=False), [f.style for f in fits])
    for prior, positions in itertools.product(map(float, a.priors.split(",")), map(int, a.positions.split(","))):
        s = replace(base_style, form=True, form_prior=prior, form_positions=positions)
        styles = []
        for f in fits:
            st = replace(f.style)
            st.form_keys, st.form_ids, st.form_bias = fit_form(f.features or [], positions, prior, s.form_cap)
            styles.append(st)
        score(f"κ {prior:g}, {positions} places", "card", s, styles)
    prior, positions = float(a.priors.split(",")[0]), int(a.positions.split(",")[-1])
    head, hs = engine.heads["tokens"], engine.cfg.head
    form = replace(base_style, form=True, form_prior=prior, form_positions=positions)
    for center in a.centers.split(","):
        styles = []
        for f in fits:  # λ's prior centre
            lam, ids, vals, _ = fit_lambda_bias(head, TokenData.from_features(f.features or []), hs.rho,
                                                form.rho_bias, form.max_bias_tokens, hs.fit_iters,
                                                center=float(center))
            st = replace(f.style, lam=lam.numpy(), bias_ids=ids.numpy(), bias=vals.numpy())
            st.form_keys, st.form_ids, st.form_bias = fit_form(f.features or [], positions, prior, form.form_cap)
            styles.append(st)
        score(f"λ pulled to {center}, form κ {prior:g}, {positions} places", "card", form, styles)
    print(f"{len(queries)} people; golds in the prefix form: {prefix_share(golds):.0%}")
    if a.json:
        json.dump({"people": len(queries), "golds_prefix": prefix_share(golds), "rows": rows}, open(a.json, "w"))


if __name__ == "__main__":
    main()
