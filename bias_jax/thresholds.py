"""The flow view's balance threshold: a sweep over eps, and K-means in place of eps.

- ``threshold_sweep``: the flow view relabelled at each eps of a grid (``EPS_GRID``: 0, 0.05,
  ..., 0.4, the range of the modality-bias paper's Table 6; appendix 11.1 sets eps = 0.25) and
  the prior-majority ensemble with it;
- ``kmeans_labels``: 3 clusters of the 1-d signed score (``sklearn.cluster.KMeans``), mapped to
  types by the order of their centres: lowest = Uni-text, middle = Modality-balance, highest =
  Uni-image, the direction of the signed score (> 0 towards the image).
"""

from __future__ import annotations

import warnings

import numpy as np

from bias_jax import ensemble as EN
from bias_jax.scoring import score_labels
from bias_jax.views.common import label_from_score

EPS_GRID = tuple(round(0.05 * i, 2) for i in range(9))  # 0, 0.05, ..., 0.4


def threshold_sweep(view_labels: dict, flow_score, eps_grid=EPS_GRID, truth=None) -> list:
    """For each eps, the flow view relabelled ``label_from_score(flow_score, eps)`` and the
    prior-majority ensemble with it (the other views' ``view_labels``: name -> int [N]).
    Returns ``[{"eps", "flow": score_labels, "ensemble": score_labels}]``."""
    rows = []
    for eps in eps_grid:
        labels = dict(view_labels, flow=label_from_score(flow_score, eps))
        rows.append({"eps": float(eps), "flow": score_labels(labels["flow"], truth),
                     "ensemble": score_labels(EN.combine(labels), truth)})
    return rows


def kmeans_labels(score, seed: int = 0) -> np.ndarray:
    """int32 [N] from ``sklearn.cluster.KMeans(3, n_init=10, random_state=seed)`` on the 1-d
    score; clusters mapped by centre order (lowest -> UNI_TEXT, middle -> BALANCE, highest ->
    UNI_IMAGE: the score is > 0 towards the image). Fewer than 3 distinct scores: the distinct
    values are the clusters (lowest -> UNI_TEXT, highest -> UNI_IMAGE when 2)."""
    from sklearn.cluster import KMeans

    s = np.asarray(score, np.float64).reshape(-1, 1)
    distinct = np.unique(s)
    if distinct.size < 3:
        order = {1: [1], 2: [2, 0]}[max(distinct.size, 1)] if distinct.size else []
        out = np.ones(s.shape[0], np.int32)
        for v, lab in zip(distinct, order):
            out[s[:, 0] == v] = lab
        return out
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        km = KMeans(n_clusters=3, n_init=10, random_state=seed).fit(s)
    rank = np.argsort(np.argsort(km.cluster_centers_[:, 0]))  # 0 lowest .. 2 highest
    to_type = np.array([2, 1, 0], np.int32)  # lowest centre = uni_text
    return to_type[rank[km.labels_]]


__all__ = ["EPS_GRID", "threshold_sweep", "kmeans_labels"]
