"""Choosing the form bias's settings (StyleSettings.form_*) on people of sources kept for tuning, never on the people
the study scores: each person onboarded once, then, per setting, their form refitted from the same pass (closed form)
and their query decoded as `card`; ROUGE-L and the share of outputs in the population's "XXX:" prefix form.

    python -m benchmarks.form_tune --artifacts B --data G --sources pytest-dev/pytest,encode/django-rest-framework \
        --limit 40 --json form_tune.json
"""

from __future__ import annotations

import argparse
import itertools
import json
from dataclasses import replace

import numpy as np

from benchmarks.form_study import prefix_share
from personalize.card.style import fit_form
from personalize.data import read_lamp, select_sources
from personalize.eval.evaluate import decode_people
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
    return p


def tuning_people(a) -> tuple[Engine, list]:
    """The build loaded, and the first --limit people of --sources with a gold output and a profile."""
    _, queries = read_lamp(a.data, "dev")
    return Engine.load(a.artifacts), [q for q in select_sources(queries, a.sources.split(",")) if q.gold and q.profile
                                      ][: a.limit]


def main(argv=None) -> None:
    p = tuning_parser(__doc__)
    p.add_argument("--priors", default="0.5,2,8")
    p.add_argument("--positions", default="1,3")
    a = p.parse_args(argv)
    engine, queries = tuning_people(a)
    profiles = [engine.prepare_items(q.profile[:24]) for q in queries]
    fits = [engine.fit(items) for items in profiles]
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
    for prior, positions, extra in itertools.product(map(float, a.priors.split(",")), map(int, a.positions.split(",")),
                                                     (True, False)):
        s = replace(base_style, form=True, form_prior=prior, form_positions=positions, form_extra=extra)
        styles = []
        for f in fits:
            st = replace(f.style)
            st.form_keys, st.form_ids, st.form_bias = fit_form(f.features or [], positions, prior, s.form_cap)
            styles.append(st)
        score(f"κ {prior:g}, {positions} places, extra {'on' if extra else 'off'}", "card", s, styles)
    print(f"{len(queries)} people; golds in the prefix form: {prefix_share(golds):.0%}")
    if a.json:
        json.dump({"people": len(queries), "golds_prefix": prefix_share(golds), "rows": rows}, open(a.json, "w"))


if __name__ == "__main__":
    main()
