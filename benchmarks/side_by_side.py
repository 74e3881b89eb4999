"""Two real people, one prompt: what each method writes for each of them (docs/results/2026-11-23-issue-13.md, "Two
real people, one prompt").

Each person is onboarded from their own history (a LaMP query's profile, or a text file of their writing);
both get the same prompt (by default the first person's query), so what differs between their columns is
them. Prints a Markdown table.

    python -m benchmarks.side_by_side --artifacts data/artifacts/commit_subjects \\
        --data ../shared/data/commit_subjects --users "Ralf Gommers,Nathan Goldbaum"
    python -m benchmarks.side_by_side --artifacts data/artifacts/demo --histories a.txt,b.txt --prompt "..."
"""

from __future__ import annotations

import argparse
from pathlib import Path

from personalize.methods.card import onboard
from personalize.data import read_history_file, read_lamp
from personalize.methods.engine import Engine
from personalize.methods.card import card_decode

METHODS = ("base", "cluster", "card_paper", "card")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--artifacts", required=True)
    p.add_argument("--data", default=None, help="LaMP folder whose users --users names")
    p.add_argument("--users", default="", help="two user names of --data (comma-separated)")
    p.add_argument("--histories", default="", help="or two history files (comma-separated)")
    p.add_argument("--prompt", default=None, help="default: the first user's query (wrapped in the task template "
                                                  "when given here)")
    p.add_argument("--max-items", type=int, default=24)
    a = p.parse_args(argv)
    engine = Engine.load(a.artifacts)
    people, prompt = [], None
    if a.users:
        _, queries = read_lamp(a.data, "dev")
        by = {q.user: q for q in queries}
        for name in a.users.split(","):
            q = by[name.strip()]
            people.append((name.strip(), list(q.profile[: a.max_items])))
            prompt = prompt or q.input
    for path in filter(None, a.histories.split(",")):
        people.append((Path(path).stem, list(read_history_file(path, task=engine.task))[: a.max_items]))
    prompt = engine.task.prompt(a.prompt) if a.prompt else prompt
    rows = {}
    for name, profile in people:
        items = engine.prepare_items(profile)
        fit = onboard.fit(engine, items)
        d = fit.diagnostics
        rows[name] = {"_cluster": fit.cluster, "helps": d.get("helps"), "acc": (d.get("acc_own"), d.get("acc_no_head"))}
        for m in METHODS:
            g = card_decode.generate(engine, [prompt], m, fit.cluster, fit.style, items=items)[0]
            rows[name][m] = g.text + (" *(fallback: cluster model)*" if g.note else "")
    print(f"prompt: {prompt[:300]!r}\n")
    print("| method | " + " | ".join(f"{n} (cluster {r['_cluster']})" for n, r in rows.items()) + " |")
    print("|---" * (len(rows) + 1) + "|")
    for m in METHODS:
        print(f"| {m} | " + " | ".join(r[m].replace("|", "\\|").replace("\n", " ") for r in rows.values()) + " |")
    for n, r in rows.items():
        print(f"{n}: held-out next-token accuracy own style {r['acc'][0]}, cluster model {r['acc'][1]}, helps {r['helps']}")


if __name__ == "__main__":
    main()
