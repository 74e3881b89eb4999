"""The feedback curve as a plotly figure: held-out ROUGE-L (and ROUGE-L on the prompts voted on) after N
votes, one line per `simulate-feedback --json` run (e.g. the closer-text preference and the random control).

    python -m benchmarks.feedback_curve closer=/tmp/closer.json random=/tmp/random.json --out docs/feedback_curve.html
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import plotly.graph_objects as go
from plotly.subplots import make_subplots


def figure(runs: dict[str, dict]) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=("held-out prompts (never voted on)", "prompts voted on"))
    for label, res in runs.items():
        votes = [c["votes"] for c in res["curve"]]
        n = res["curve"][0]["n"]
        for col, key in ((1, "rougeL_eval"), (2, "rougeL_voted")):
            fig.add_trace(go.Scatter(x=votes, y=[c[key] for c in res["curve"]], mode="lines+markers",
                                     name=f"{label} (n = {n})", legendgroup=label, showlegend=col == 1), row=1, col=col)
    fig.update_xaxes(title_text="votes")
    fig.update_yaxes(title_text="ROUGE-L (mean over people)")
    s = next(iter(runs.values()))["settings"]
    fig.update_layout(title=f"Votes refine the style: {s['artifacts']}, {', '.join(s['sources']) or s['data']}, "
                            f"vote weight {s['vote_weight']}", height=420, width=980)
    return fig


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", help="LABEL=FILE.json, one per simulate-feedback run")
    p.add_argument("--out", default="docs/feedback_curve.html")
    a = p.parse_args(argv)
    runs = {}
    for r in a.runs:
        label, _, path = r.partition("=")
        runs[label] = json.loads(Path(path).read_text())
    fig = figure(runs)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    fig.write_html(a.out, include_plotlyjs="cdn")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
