"""My cluster: the person's cluster at K and how near it is, the distances to every centre, texts of the cluster,
and the population map."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice

from personalize.studio.histories import Histories, UserState
from personalize.studio.service import Service


@dataclass(frozen=True)
class PopulationMap:
    """The population's user embeddings in 2-D (PCA) with their clusters at K, the centroids, and the person's own
    point (their name and xy) when one is named."""
    users: list[str]
    xy: list[list[float]]
    labels: list[int]
    centroids: list[list[float]]
    k: int
    user: tuple[str, list[float]] | None = None


@dataclass(frozen=True)
class ClusterView:
    """My cluster: K as snapped to a built one, the map, the person's state at K (None: no name, or no history under
    it) and texts from their cluster; `message`: where a name without a history stands (Histories.standing)."""
    k: int
    map: PopulationMap
    state: UserState | None
    examples: list[tuple[str, str]]
    message: str = ""


class ClusterViews(Service):
    def __init__(self, rt, histories: Histories):
        super().__init__(rt)
        self.histories = histories

    def cluster_examples(self, k: int, cluster: int, n: int = 4) -> list[tuple[str, str]]:
        """(population user, one of their texts) for up to n users of the cluster."""
        users, labels, texts = self.engine.clusters.users, self.engine.clusters.labels[k], self.rt.population
        return list(islice(((u, texts[u][0]) for u, c in zip(users, labels) if int(c) == cluster and texts.get(u)), n))

    def population_map(self, name: str | None, k: int) -> PopulationMap:
        """2-D PCA of the population's user embeddings (and the user's), with cluster labels at K."""
        from sklearn.decomposition import PCA

        emb = self.engine.clusters.embeddings
        pca = PCA(n_components=min(2, *emb.shape)).fit(emb)
        xy = pca.transform(emb)
        user = (name, pca.transform(self.histories.embed_history(name)[None])[0].tolist()) if name else None
        return PopulationMap(list(self.engine.clusters.users), xy.tolist(),
                             [int(c) for c in self.engine.clusters.labels[k]],
                             pca.transform(self.engine.clusters.centroids[k]).tolist(), k, user)

    def cluster_view(self, name: str | None, k: float | None, previous: int | None = None) -> ClusterView:
        """My cluster: K snapped to a built one (onwards in the slider's direction from `previous`), the
        population map (with the user's star), and for a named user their state at K and texts from their
        cluster."""
        k = self.rt.snap_k(k, previous)
        name = (name or "").strip() or None
        if name is None or not self.histories.item_rows(name):  # nobody, or a name with no history (new, forgotten)
            return ClusterView(k, self.population_map(None, k), None, [], self.histories.standing(name, 0))
        m = self.population_map(name, k)
        st = self.histories.user_state(name, k)
        return ClusterView(k, m, st, self.cluster_examples(k, st.cluster))
