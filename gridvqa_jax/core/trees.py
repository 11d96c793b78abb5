"""Host-side helpers on pytrees of arrays, shared by every package."""

from __future__ import annotations

import jax
import numpy as np


def to_numpy(tree):
    """Host copy of a (possibly sharded) pytree: every leaf a numpy array
    (``jax.device_get``), shapes and dtypes unchanged, the tree structure kept."""
    return jax.tree.map(np.asarray, jax.device_get(tree))


def n_params(params) -> int:
    """Number of scalar parameters: ``sum_leaf prod(leaf.shape)`` over the pytree ``params``
    (arrays or ``jax.ShapeDtypeStruct``s)."""
    return int(sum(np.prod(p.shape, dtype=np.int64) for p in jax.tree.leaves(params)))


__all__ = ["to_numpy", "n_params"]
