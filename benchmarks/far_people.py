"""How many people of some sources a build counts as beyond its clusters (cluster.closeness, the rule of
StyleSettings.far_share), and what a far person's stored style weighs with their own memory.

    python -m benchmarks.far_people --artifacts B --data G --sources psf/black,pallets/werkzeug [--limit 40] \
        [--bytes 8]
"""

from __future__ import annotations

import argparse

import numpy as np

from personalize.methods.card import onboard
from personalize.methods.card.cluster import closeness
from personalize.data import read_lamp, select_sources
from personalize.methods.engine import Engine


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--artifacts", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--split", default="dev")
    p.add_argument("--sources", default="", help="comma-separated (default: every person of the data)")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--bytes", type=int, default=0, help="fit this many far people and report their styles' bytes")
    a = p.parse_args(argv)
    engine = Engine.load(a.artifacts)
    _, queries = read_lamp(a.data, a.split)
    queries = [q for q in select_sources(queries, [s for s in a.sources.split(",") if s]) if q.gold and q.profile]
    queries = queries[: a.limit] if a.limit else queries
    c, k = engine.clusters, engine.cfg.default_k
    shares, far = [], []
    for q in queries:
        items = engine.prepare_items(q.profile[:24])
        _, d = engine.assign(engine.embed(items), k)
        shares.append(closeness(c.embeddings, c.centroids[k], c.labels[k], min(d))[1])
        if shares[-1] < engine.cfg.style.far_share:
            far.append(items)
    s = np.asarray(shares)
    cut = engine.cfg.style.far_share
    print(f"{len(s)} people: far (closeness < {cut:g}) {np.mean(s < cut):.1%}, "
          f"beyond every member {np.mean(s == 0):.1%}, median closeness {np.median(s):.3f}")
    sizes = []
    for items in far[: a.bytes]:
        fit = onboard.fit(engine, items)
        sizes.append((len(fit.style.extras_bytes()), len(fit.style.values)))
    if sizes:
        print(f"{len(sizes)} far people's stored style beyond λ: median {np.median([b for b, _ in sizes]):.0f} bytes "
              f"({min(b for b, _ in sizes)}-{max(b for b, _ in sizes)}), memory entries median "
              f"{np.median([n for _, n in sizes]):.0f}")


if __name__ == "__main__":
    main()
