"""Controls printed beside every explainer: the floor and the ceiling of each metric.

- ``random_attribution``: i.i.d. uniform [0, 1) values on every cell and every valid token, so
  its expected RMA is the ground truth's share of the players (the floor a useful explainer must
  beat).
- ``oracle_attribution``: the ground-truth mask itself (1 on A ∪ T cells and on target-attribute,
  anchor-attribute and relation tokens, 0 elsewhere): RMA = IoU = 1 wherever a ground truth
  exists (the ceiling).

Both follow the explainer signature ``explainer(fn, scenes, key, **budget) -> Attribution`` and
ignore ``fn``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from gridvqa_jax.explain.attribution import Attribution, from_maps
from gridvqa_jax.world import universe as U


def random_attribution(fn, scenes, key, **_) -> Attribution:
    """Uniform random maps: visual [B, S, S] and textual [B, L] ~ U[0, 1), PAD tokens 0."""
    kv, kt = jax.random.split(key)
    valid = jnp.asarray(scenes.tokens) != U.PAD_ID
    visual = jax.random.uniform(kv, jnp.shape(scenes.gt_cells), jnp.float32)
    textual = jax.random.uniform(kt, valid.shape, jnp.float32)
    return from_maps(visual, textual, valid)


def oracle_attribution(fn, scenes, key=None, **_) -> Attribution:
    """The ground truth as a map: ``gt_cells`` [B, S, S] and ``gt_tokens`` [B, L] as 0/1 floats."""
    valid = jnp.asarray(scenes.tokens) != U.PAD_ID
    return from_maps(jnp.asarray(scenes.gt_cells, jnp.float32),
                     jnp.asarray(scenes.gt_tokens, jnp.float32), valid)


__all__ = ["random_attribution", "oracle_attribution"]
