"""Question spelling: a bucket's official template laid out as token ids with a role per token."""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np

from gridvqa_jax.world import universe as U
from gridvqa_jax.world.sampling import take


_N_SOURCES = 30  # per-sample token values a template can read; see _token_layouts


@functools.lru_cache(maxsize=None)
def _token_layouts() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every question layout, compiled on the host from ``universe.SLOT_TABLE``.

    A bucket's template fixes the token sequence up to one thing: "left of" / "right of" take
    two words where "above" / "below" take one, which shifts every later token. So the layout
    is a table over (bucket, h), h = bit j set when anchor j = clause * K + i has a horizontal
    direction. Row entries of ``source`` [n_buckets * 2**(2K), L] index a per-sample value
    vector (0-1 target colour, 2-3 target shape, 4-5 plural target shape, 6-11 anchor colour,
    12-17 anchor shape, 18-23 first direction word, 24-29 second direction word) or, from
    _N_SOURCES on, name a fixed word id. Returns (source, role, anchor ref, n_tokens).
    """
    K, L, A = U.MAX_ANCHORS_PER_CLAUSE, U.MAX_TOKENS, U.MAX_ANCHORS
    n_rows = len(U.BUCKETS) << A
    source = np.full((n_rows, L), _N_SOURCES + U.PAD_ID, np.int32)
    role = np.full((n_rows, L), U.FUNCTION, np.int32)
    ref = np.full((n_rows, L), -1, np.int32)
    n_tokens = np.zeros(n_rows, np.int32)
    for b in range(len(U.BUCKETS)):
        for h in range(1 << A):
            row, out = (b << A) | h, []
            for kind, word, c, i in U.SLOT_TABLE[b]:
                ci = c * K + i
                if kind == U.S_WORD:
                    if word != U.PAD_ID:
                        out.append((_N_SOURCES + word, U.FUNCTION, -1))
                elif kind in (U.S_TCOLOR, U.S_TSHAPE, U.S_TSHAPES):
                    base = {U.S_TCOLOR: 0, U.S_TSHAPE: 2, U.S_TSHAPES: 4}[kind]
                    out.append((base + c, U.TARGET_ATTR, -1))
                elif kind in (U.S_ACOLOR, U.S_ASHAPE):
                    out.append(((6 if kind == U.S_ACOLOR else 12) + ci, U.ANCHOR_ATTR, ci))
                else:  # S_DIR: "left of" / "right of" (horizontal) are two words
                    out.append((18 + ci, U.RELATION, ci))
                    if h >> ci & 1:
                        out.append((24 + ci, U.RELATION, ci))
            source[row, :len(out)], role[row, :len(out)], ref[row, :len(out)] = zip(*out)
            n_tokens[row] = len(out)
    return source, role, ref, n_tokens


def build_tokens(bucket, target_color, target_shape, anchor_color, anchor_shape, direction):
    """Spell the question of ``bucket`` as token ids with a role per token (jit-friendly).

    The bucket's template (universe.SLOT_TABLE, official wording) is laid out on the host for
    every combination of one- and two-word directions (``_token_layouts``); here one row of that
    table is picked and its sources filled in. Shapes: target_* int32 [2], anchor_* and
    direction int32 [2, K]. Returns tokens, roles, anchor refs (int32 [L], PAD_ID / FUNCTION /
    -1 after the question) and the token count.
    """
    A = U.MAX_ANCHORS
    source, role, ref, n_tokens = (jnp.asarray(t) for t in _token_layouts())
    d = direction.reshape(A)
    horizontal = jnp.sum(jnp.where(d < 2, 1 << jnp.arange(A), 0))
    row = (bucket << A) | horizontal
    dir_tok = take(jnp.asarray(U.DIRECTION_TOKENS), d)  # [A, 2]
    values = jnp.concatenate([
        U.COLOR_TOKEN0 + target_color, U.SHAPE_TOKEN0 + target_shape,
        U.SHAPE_PLURAL_TOKEN0 + target_shape, U.COLOR_TOKEN0 + anchor_color.reshape(A),
        U.SHAPE_TOKEN0 + anchor_shape.reshape(A), dir_tok[:, 0], dir_tok[:, 1]])
    src = source[row]
    tokens = jnp.where(src < _N_SOURCES, take(values, jnp.minimum(src, _N_SOURCES - 1)),
                       src - _N_SOURCES)
    return tokens.astype(jnp.int32), role[row], ref[row], n_tokens[row]
