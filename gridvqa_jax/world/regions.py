"""Valid regions, confuser regions and the answer of a question, as pure jnp functions.

GridVQA-X (Theorem 1): anchor i with direction d_i defines the half-plane V_i; the target region is
V_target = ∩_i V_i and the confuser region of anchor k is C_k = (∩_{i≠k} V_i) \\ V_k. All maps here
are flat boolean vectors over the S*S cells in row-major order (cell = y*S + x), so that the
sampler and the verifier share one definition.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp



def cell_coords(grid_size: int):
    """(x, y) int32 vectors of length S*S for the cells in row-major order."""
    idx = jnp.arange(grid_size * grid_size, dtype=jnp.int32)
    return idx % grid_size, idx // grid_size


def relation_mask(direction, anchor_xy, grid_size: int):
    """Half-plane V of cells satisfying ``direction`` w.r.t. an anchor at ``anchor_xy``.

    direction: int32 [] in 0..3 (left of, right of, above, below); anchor_xy: int32 [2] = (x, y).
    Returns bool [S*S]: left ``x < a.x``, right ``x > a.x``, above ``y < a.y``, below ``y > a.y``.
    """
    x, y = cell_coords(grid_size)
    ax, ay = anchor_xy[0], anchor_xy[1]
    return jnp.select(
        [direction == 0, direction == 1, direction == 2], [x < ax, x > ax, y < ay], y > ay)


def clause_regions(anchor_xy, direction, active, grid_size: int):
    """V_target and C_k of one clause.

    anchor_xy: int32 [K, 2]; direction: int32 [K]; active: bool [K] (inactive anchors impose no
    constraint). Returns (v_target bool [S*S], confuser bool [K, S*S]) with
    v_target = ∩_{active i} V_i and confuser[k] = (∩_{active i≠k} V_i) \\ V_k (empty if k inactive).
    """
    v = jax.vmap(lambda d, a: relation_mask(d, a, grid_size))(direction, anchor_xy)
    v = v | ~active[:, None]
    v_target = jnp.all(v, axis=0)
    k = v.shape[0]
    others = ~jnp.eye(k, dtype=bool)  # [k, i]: i != k
    relaxed = jnp.all(v[None, :, :] | ~others[:, :, None], axis=1)  # ∩_{i≠k} V_i
    confuser = relaxed & ~v & active[:, None]
    return v_target, confuser


def matches(color, shape, spec_color, spec_shape):
    """Cells whose object matches an attribute spec; -1 in the spec means 'any value'.

    color, shape: int32 [...] per cell (-1 = empty); spec_*: int32 []. Empty cells never match.
    """
    ok_c = (spec_color < 0) | (color == spec_color)
    ok_s = (spec_shape < 0) | (shape == spec_shape)
    return (color >= 0) & ok_c & ok_s
