"""Users and clusters (CARD §1.1): user embeddings, k-means for several K, nearest-centroid assignment."""

from __future__ import annotations

from typing import Sequence

import numpy as np


def user_embeddings(encoder, histories: Sequence[Sequence[str]], batch_size: int = 64) -> np.ndarray:
    """e_u = normalize(mean_i Enc(y_i)) for each user, all texts encoded in one call."""
    flat = [t for texts in histories for t in texts]
    if any(len(texts) == 0 for texts in histories):
        raise ValueError("every user needs at least one text to be embedded")
    emb = encoder.encode(flat, batch_size=batch_size, convert_to_numpy=True, normalize_embeddings=True)
    out, i = [], 0
    for texts in histories:
        e = emb[i: i + len(texts)].mean(0)
        out.append(e / (np.linalg.norm(e) + 1e-12))
        i += len(texts)
    return np.stack(out).astype(np.float32)


def fit_clusters(embeddings: np.ndarray, ks: Sequence[int], seed: int = 0) -> dict[int, np.ndarray]:
    """Centroids for each K; K must not exceed the number of users."""
    n = len(embeddings)
    bad = [k for k in ks if k < 1 or k > n]
    if bad:
        raise ValueError(f"cluster counts {bad} are not possible with {n} users (each K must be 1..{n})")
    from sklearn.cluster import KMeans  # the build's only: the app and onboarding assign with numpy

    return {int(k): KMeans(n_clusters=k, n_init=10, random_state=seed).fit(embeddings).cluster_centers_.astype(np.float32)
            for k in ks}


def assign(embedding: np.ndarray, centroids: np.ndarray) -> tuple[int, list[float]]:
    """c(u) = argmin_c ||e_u − μ_c||, with the distance to every centroid."""
    d = np.linalg.norm(centroids - embedding[None, :], axis=1)
    return int(d.argmin()), [float(x) for x in d]
