"""The app's plots. Names and tokens from people and models enter them only through display.plot_text
(Plotly reads <b>, <br>, <a> in labels)."""

from __future__ import annotations

import plotly.graph_objects as go

from personalize.display import plot_text


def cluster_figure(m) -> go.Figure:
    """My cluster (a studio.clusters.PopulationMap): the population's user embeddings (PCA), one colour per cluster,
    centroids, the user's star."""
    fig = go.Figure()
    for c in sorted(set(m.labels)):
        idx = [i for i, lab in enumerate(m.labels) if lab == c]
        fig.add_scatter(x=[m.xy[i][0] for i in idx], y=[m.xy[i][1] if len(m.xy[i]) > 1 else 0 for i in idx],
                        mode="markers", name=f"cluster {c}", text=[plot_text(m.users[i]) for i in idx],
                        marker={"size": 8})
    cx = m.centroids
    fig.add_scatter(x=[p[0] for p in cx], y=[p[1] if len(p) > 1 else 0 for p in cx], mode="markers+text",
                    name="centroids", text=[str(i) for i in range(len(cx))], textposition="top center",
                    marker={"symbol": "x", "size": 12, "color": "black"})
    if m.user is not None:
        name, xy = m.user
        fig.add_scatter(x=[xy[0]], y=[xy[1] if len(xy) > 1 else 0], mode="markers+text",
                        name=plot_text(name), text=[plot_text(name)], textposition="bottom center",
                        marker={"symbol": "star", "size": 20, "color": "gold", "line": {"width": 1, "color": "black"}})
    fig.update_layout(title={"text": f"Population (PCA of user embeddings), K = {m.k}",
                             "subtitle": {"text": "two directions of the embedding's many: a person at a cluster's "
                                                  "edge can look near its centre here; the table's distances are the "
                                                  "real ones"}}, height=460,
                      margin={"l": 10, "r": 10, "t": 60, "b": 10})
    return fig


def loss_figure(curve: list[float]) -> go.Figure:
    fig = go.Figure(go.Scatter(y=curve, mode="lines+markers"))
    fig.update_layout(title="λ fit: loss per LBFGS iteration", xaxis_title="iteration", yaxis_title="loss", height=320)
    return fig


def step_figure(step: dict) -> go.Figure:
    """Why: one decoding step, the chosen token (marked ✓) and its rivals, on one scale: the log-probability
    among the step's candidates under the cluster model, CARD's correction, and under CARD."""
    cands = step["candidates"]
    toks = [plot_text(("✓ " if c.get("chosen") else "") + repr(c["token"])) for c in cands]
    fig = go.Figure([go.Bar(name="before: cluster model", x=toks, y=[c["before"] for c in cands]),
                     go.Bar(name="correction (your style)", x=toks, y=[c.get("correction", 0.0) for c in cands]),
                     go.Bar(name="after: CARD", x=toks, y=[c["after"] for c in cands])])
    fig.update_layout(barmode="group", height=380, yaxis_title="log-probability among the candidates",
                      title="The chosen token (✓) and its rivals: before + correction = after")
    return fig


def leaderboard_figures(lb: dict) -> tuple[go.Figure, go.Figure]:
    """Bradley–Terry strengths with their intervals, and the win-rate matrix."""
    rows = lb["methods"]
    bt = go.Figure(go.Scatter(
        x=[plot_text(r["method"]) for r in rows], y=[r["strength"] for r in rows], mode="markers",
        error_y={"type": "data", "symmetric": False, "array": [r["upper"] - r["strength"] for r in rows],
                 "arrayminus": [r["strength"] - r["lower"] for r in rows]}, marker={"size": 12}))
    bt.update_layout(title=f"Bradley–Terry strength (Elo scale), 95% bootstrap intervals, {lb['n_votes']} votes",
                     height=380)
    names = [r["method"] for r in rows]
    z = [[lb["win_rate"][a][b] for b in names] for a in names]
    shown = [plot_text(n) for n in names]
    heat = go.Figure(go.Heatmap(z=z, x=shown, y=shown, zmin=0, zmax=1, colorscale="RdBu",
                                text=[[("" if v is None else f"{v:.2f}") for v in row] for row in z],
                                texttemplate="%{text}"))
    heat.update_layout(title="Win rate of row vs column (ties = ½)", height=380)
    return bt, heat


def explore_figures(res) -> tuple[go.Figure, go.Figure]:
    """Explore's Sweep: the copy-aware ROUGE-L (an old text handed back scores 0), raw ROUGE-L and output length
    against α, and the copy-aware score and length against K (cluster model and CARD)."""
    a = res.alpha
    fa = go.Figure()
    fa.add_scatter(x=[r.alpha for r in a], y=[r.copy_aware for r in a], name="ROUGE-L, copies count 0",
                   mode="lines+markers")
    fa.add_scatter(x=[r.alpha for r in a], y=[r.rougeL for r in a], name="ROUGE-L as it is", mode="lines+markers",
                   line={"dash": "dash"})
    fa.add_scatter(x=[r.alpha for r in a], y=[r.length for r in a], name="words", mode="lines+markers",
                   yaxis="y2")
    base = "your own adapter" if res.own else "the cluster model"  # a cluster of one decodes over their own at α = 0
    fa.update_layout(title=f"CARD vs steering strength α (α = 0: {base})", xaxis_title="α",
                     yaxis={"title": "ROUGE-L"}, yaxis2={"title": "words", "overlaying": "y", "side": "right"},
                     height=380)
    fk = go.Figure()
    for m in ("cluster", "card"):
        rows = [r for r in res.k if r.method == m]
        fk.add_scatter(x=[r.k for r in rows], y=[r.copy_aware for r in rows], name=f"{m} ROUGE-L (copies 0)",
                       mode="lines+markers")
        fk.add_scatter(x=[r.k for r in rows], y=[r.length for r in rows], name=f"{m} words",
                       mode="lines+markers", yaxis="y2", line={"dash": "dot"})
    own = " (card over your own adapter at every K: a cluster of one)" if res.own else ""
    fk.update_layout(title=f"Cluster count K{own}", xaxis_title="K", yaxis={"title": "ROUGE-L"},
                     yaxis2={"title": "words", "overlaying": "y", "side": "right"}, height=380)
    return fa, fk
