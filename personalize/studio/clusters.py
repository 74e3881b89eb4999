"""My cluster: the person's cluster at K and how near it is, the distances to every centre, texts of the cluster,
and the population map."""

from __future__ import annotations

from personalize.studio.histories import Histories
from personalize.studio.service import Service


class ClusterViews(Service):
    def __init__(self, rt, histories: Histories):
        super().__init__(rt)
        self.histories = histories

    def cluster_examples(self, k: int, cluster: int, n: int = 4) -> list[tuple[str, str]]:
        """(population user, one of their texts) for up to n users of the cluster."""
        users, labels = self.engine.clusters.users, self.engine.clusters.labels[k]
        out = []
        for u, c in zip(users, labels):
            if int(c) == cluster and self.rt.population.get(u):
                out.append((u, self.rt.population[u][0]))
            if len(out) >= n:
                break
        return out

    def population_map(self, name: str | None, k: int) -> dict:
        """2-D PCA of the population's user embeddings (and the user's), with cluster labels at K."""
        from sklearn.decomposition import PCA

        emb = self.engine.clusters.embeddings
        pca = PCA(n_components=min(2, *emb.shape)).fit(emb)
        xy = pca.transform(emb)
        out = {"users": list(self.engine.clusters.users), "xy": xy.tolist(),
               "labels": [int(c) for c in self.engine.clusters.labels[k]],
               "centroids": pca.transform(self.engine.clusters.centroids[k]).tolist(), "k": k}
        if name:
            mine = self.histories.embed_history(name)
            out["user"] = {"name": name, "xy": pca.transform(mine[None])[0].tolist()}
        return out

    def cluster_view(self, name: str | None, k: float | None, previous: int | None = None) -> dict:
        """My cluster: K snapped to a built one (onwards in the slider's direction from `previous`), the
        population map (with the user's star), and for a named user their state at K and texts from their
        cluster. Returns {"k", "map", "state": UserState | None (no name), "examples"}."""
        k = self.rt.snap_k(k, previous)
        name = (name or "").strip() or None
        m = self.population_map(name, k)
        if name is None:
            return {"k": k, "map": m, "state": None, "examples": []}
        st = self.histories.user_state(name, k)
        return {"k": k, "map": m, "state": st, "examples": self.cluster_examples(k, st.cluster)}
