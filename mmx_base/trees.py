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


def jsonable(x):
    """``x`` as plain JSON values: dicts (keys as str), lists (from tuples and arrays), bool, int,
    float (NaN / inf -> None), str, None; any other object as ``str(x)``."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return jsonable(x.tolist())
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x) if np.isfinite(x) else None
    if x is None or isinstance(x, str):
        return x
    return str(x)


__all__ = ["to_numpy", "n_params", "jsonable"]
