"""Monte Carlo draws whose columns are keyed one by one, so padding does not move them.

A perturbation explainer draws a ``[n_samples, n_players]`` table of uniforms per explained
sample. Drawn in one call, every entry depends on the table's width, so a sample's draws would
change with the width its batch is padded to (the longest question, the most regions). Drawn
column by column from ``fold_in(key, i)``, column ``i`` depends on ``key`` and ``i`` alone: the
same law (independent U(0, 1) entries), but a player's draws are those of its own game, and the
first ``m`` rows are the ``m``-row table (nested budgets). Used by ``mmx_base.lime`` (LIME's
masks) and ``gridvqa_jax.explain.interactions`` (the SII's coalitions).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def column_uniforms(key, n_samples: int, n_columns: int) -> jax.Array:
    """float32 [n_samples, n_columns] of independent U(0, 1), column i drawn from
    ``jax.random.uniform(fold_in(key, i), (n_samples,))``: the first ``d`` columns are
    ``column_uniforms(key, n_samples, d)`` and the first ``m`` rows ``column_uniforms(key, m,
    n_columns)``."""
    def column(i):
        return jax.random.uniform(jax.random.fold_in(key, i), (n_samples,))

    return jax.vmap(column, out_axes=1)(jnp.arange(n_columns))
