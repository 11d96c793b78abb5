"""Monte Carlo draws whose columns are keyed one by one, so padding does not move them.

A perturbation explainer draws a ``[n_samples, n_players]`` table of uniforms per explained
sample. Drawn in one call, every entry depends on the table's width, so a sample's draws would
change with the width its batch is padded to (the longest question, the most regions). Drawn
column by column from ``fold_in(key, i)``, column ``i`` depends on ``key`` and ``i`` alone: the
same law (independent U(0, 1) entries), but a player's draws are those of its own game, and the
first ``m`` rows are the ``m``-row table (nested budgets). ``stream_uniforms`` keys the columns
of each group of players (a modality) apart, so appending players to one group moves no
other group's draws. Used by ``mmx_base.lime`` (LIME's masks),
``gridvqa_jax.explain.interactions`` (the SII's coalitions) and ``gridvqa_jax.explain.shapley``
(the permutations).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def column_uniforms(key, n_samples: int, n_columns: int) -> jax.Array:
    """float32 [n_samples, n_columns] of independent U(0, 1), column i drawn from
    ``jax.random.uniform(fold_in(key, i), (n_samples,))``: the first ``d`` columns are
    ``column_uniforms(key, n_samples, d)`` and the first ``m`` rows ``column_uniforms(key, m,
    n_columns)``."""
    def column(i):
        return jax.random.uniform(jax.random.fold_in(key, i), (n_samples,))

    return jax.vmap(column, out_axes=1)(jnp.arange(n_columns))


def stream_uniforms(key, n_samples: int, side, index) -> jax.Array:
    """float32 [n_samples, n] of independent U(0, 1) for ``n`` players in streams: column j
    is column ``index[j]`` of ``column_uniforms(fold_in(key, side[j]), n_samples, ...)``.
    ``side``, ``index``: int [n] >= 0 (numpy, static; no two players with the same pair). A
    player's column depends on ``key``, its side and its place in it alone, so players
    appended to a side, or a side that grows in front of it, leave it unchanged."""
    side, index = np.asarray(side, np.int64), np.asarray(index, np.int64)
    if side.shape != index.shape or side.ndim != 1:
        raise ValueError(f"side and index must be int [n], got {side.shape} and {index.shape}")
    if (side < 0).any() or (index < 0).any():
        raise ValueError("side and index must be >= 0 (a negative index would alias a column)")
    if len(set(zip(side.tolist(), index.tolist()))) != side.size:
        raise ValueError("two players share a (side, index) stream: their draws would be equal")
    if not side.size:
        return jnp.zeros((n_samples, 0), jnp.float32)
    # each side's columns, 0 .. its largest index, side after side in one table
    width = {int(s): int(index[side == s].max()) + 1 for s in np.unique(side)}
    offset = dict(zip(width, np.concatenate([[0], np.cumsum(list(width.values()))[:-1]])))
    table = jnp.concatenate([column_uniforms(jax.random.fold_in(key, s), n_samples, w)
                             for s, w in width.items()], axis=1)
    return table[:, np.asarray([offset[int(s)] for s in side], np.int64) + index]
