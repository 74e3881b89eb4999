"""Users and clusters (CARD §1.1): user embeddings, k-means for several K, nearest-centroid assignment."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass
class Clusters:
    """The population's embeddings and k-means centroids for every built K."""

    users: list[str]
    embeddings: np.ndarray  # [N, E]
    centroids: dict[int, np.ndarray]  # K -> [K, E]
    labels: dict[int, np.ndarray]  # K -> [N]


def item_embeddings(encoder, histories: Sequence[Sequence[str]], batch_size: int = 64) -> list[np.ndarray]:
    """Enc(y_i) of every text, normalised, one array per user; all texts encoded in one call."""
    emb = encoder.encode([t for texts in histories for t in texts], batch_size=batch_size, convert_to_numpy=True,
                         normalize_embeddings=True)
    ends = np.cumsum([len(texts) for texts in histories])
    return [emb[end - len(texts): end] for end, texts in zip(ends, histories)]


def user_embeddings(encoder, histories: Sequence[Sequence[str]], batch_size: int = 64) -> np.ndarray:
    """e_u = normalize(mean_i Enc(y_i)) for each user, all texts encoded in one call."""
    if any(len(texts) == 0 for texts in histories):
        raise ValueError("every user needs at least one text to be embedded")
    means = [e.mean(0) for e in item_embeddings(encoder, histories, batch_size)]
    return np.stack([m / (np.linalg.norm(m) + 1e-12) for m in means]).astype(np.float32)


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


def member_distances(embeddings: np.ndarray, centroids: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Each of the build's people's distance to the nearest centre had they been left out of the build (their own
    cluster's centre recomputed without them; a cluster of one is gone). Why: k-means placed every centre among
    its members, so their own distances are small by construction (0 for a cluster of one), and a newcomer
    compared with them looked further out than everyone."""
    counts = np.bincount(labels, minlength=len(centroids))
    out = []
    for e, c in zip(embeddings, labels):
        cents = centroids.astype(np.float64)
        if counts[c] > 1:
            cents[c] = (counts[c] * cents[c] - e) / (counts[c] - 1)
        else:
            cents = np.delete(cents, c, axis=0)
        out.append(float(np.linalg.norm(cents - e[None], axis=1).min()) if len(cents) else np.inf)
    return np.asarray(out)


def is_member(embeddings: np.ndarray, centroids: np.ndarray, distances: Sequence[float], tol: float = 1e-4) -> bool:
    """Whether distances to every centre are those of one of the build's own people (the same writing)."""
    theirs = np.linalg.norm(embeddings[:, None] - centroids[None], axis=-1)
    return bool((np.abs(theirs - np.asarray(distances)[None]).max(axis=1) <= tol).any()) if len(theirs) else False


def closeness(embeddings: np.ndarray, centroids: np.ndarray, labels: np.ndarray, distance: float,
              member: bool = False, edge: float = 0.1) -> tuple[str, float]:
    """How near a person's nearest centroid is, against the build's own people: (plain words, the share of the
    population that is further from its nearest centre, each measured as if left out of the build:
    member_distances). A raw distance (1.04 or 1.25) says nothing by itself; a person further out than every
    member of the build is one the build does not describe. `member`: the person is one of the build's people
    (is_member), and is told so. `edge`: the share below which a person is "at its edge" (the build's
    StyleSettings.far_share, so the words and the far person's memory follow one rule)."""
    own = member_distances(embeddings, centroids, labels)
    further = float((own > distance).mean()) if len(own) else 0.0
    if member:
        words = "one of this build's own people: its clusters were fitted with your writing among them"
    elif further >= 0.5:
        words = "close to its centre: nearer than most of its own members"
    elif further >= max(edge, 1e-9):
        words = "within its usual range"
    elif further > 0:
        words = f"at its edge: further out than {100 * (1 - edge):g} % of the build's people are from their own cluster"
    else:
        words = ("far from every cluster of this build: further from the nearest one than any of the build's "
                 f"{len(own)} people would be had they not been in it, so this build's population may not write "
                 "like you")
    return words, further
