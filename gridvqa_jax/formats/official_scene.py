"""Rebuild full ``Scene`` pytrees from what the official files determine.

The official files store a scene (colour and shape per cell, from the sidecar or the decoded
PNG), a question (parsed to its ``Scene`` fields), the anchor cells and the answer label.
Everything else in a ``Scene`` follows: cell roles and clauses, regions, counts, the object
list, tokens and ground truth. Roles are inferred here from the scene; the rest is the
sampler's own ``sampler.expand`` fed with the inferred cells as bitboards, so read and
generated Scenes are assembled by one function.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from gridvqa_jax.world import bitboards as BB
from gridvqa_jax.world import regions as RG
from gridvqa_jax.world import sampler
from gridvqa_jax.world import universe as U
from gridvqa_jax.world.scene import Scene


def cell_roles(S: int, bucket, color, shape, tc, ts, active, axy, direction) -> dict:
    """Role and clause of every cell of one scene, inferred from its question.

    S: grid size; bucket int32 []; color/shape int32 [S, S] (-1 empty); tc/ts int32 [2]
    target colour/shape per clause (-1 unnamed); active bool [2, K]; axy int32 [2, K, 2] anchor
    cells (x, y); direction int32 [2, K]. With V_i the half-plane of anchor i
    (``regions.clause_regions``): anchors are the cells at ``axy``; a target of clause c is a
    non-anchor look-alike of c's target (``regions.matches``) inside V_target(c); a confuser is
    a look-alike outside it; any other object is a distractor. Clause 0 wins where both clauses'
    rules apply.

    This is the inverse of ``sampler.fill_cells``, which assigns colours to roles it placed;
    here roles are read off the colours, so a scene that breaks the generator's rules (an
    official one) still gets the roles its question implies.

    Returns a dict of flat [S*S] int32 ``cell_role``/``cell_clause``, bool [2, S*S]
    ``v_target`` (False for an absent clause), bool [2, K, S*S] ``conf_region`` (C_k),
    bool [S*S] ``anchor_cells`` and int32 [2] ``count`` (targets per clause).
    """
    C = S * S
    clause_ids = jnp.arange(U.MAX_CLAUSES)
    clause_on = clause_ids < jnp.asarray(U.BUCKET_N_CLAUSES)[bucket]
    col, shp = color.reshape(C), shape.reshape(C)
    v_target, conf = jax.vmap(lambda a, d, act: RG.clause_regions(a, d, act, S))(
        axy, direction, active)
    v_target = v_target & clause_on[:, None]
    cells = jnp.arange(C)
    at = (cells[None, None, :] == (axy[..., 1] * S + axy[..., 0])[..., None]) \
        & active[..., None]  # [2, K, C]
    anchor_cells = jnp.any(at, axis=(0, 1))
    anchor_clause = jnp.argmax(jnp.any(at, axis=1), axis=0)
    look = jax.vmap(lambda c, s: RG.matches(col, shp, c, s))(tc, ts)
    look = look & clause_on[:, None] & ~anchor_cells[None, :]
    counted = look & v_target
    is_t, is_l = counted[0] | counted[1], look[0] | look[1]
    role = jnp.select([anchor_cells, is_t, is_l, col >= 0],
                      [U.ANCHOR, U.TARGET, U.CONFUSER, U.DISTRACTOR], U.EMPTY).astype(jnp.int32)
    clause = jnp.select([anchor_cells, is_t, is_l],
                        [anchor_clause, jnp.where(counted[0], 0, 1), jnp.where(look[0], 0, 1)],
                        -1).astype(jnp.int32)
    mine = clause[None, :] == clause_ids[:, None]  # [2, C]
    count = jnp.sum((role == U.TARGET)[None] & mine, axis=-1).astype(jnp.int32)
    return dict(cell_role=role, cell_clause=clause, v_target=v_target, conf_region=conf,
                anchor_cells=anchor_cells, count=count)


def _scene_one(S, bucket, color, shape, tc, ts, active, ac, ash, axy, direction, answer):
    """One Scene: ``cell_roles`` packed as the sampler's boards, then ``sampler.expand``."""
    cells = cell_roles(S, bucket, color, shape, tc, ts, active, axy, direction)
    role, clause = cells["cell_role"], cells["cell_clause"]
    col = color.reshape(-1)
    per_clause = lambda r: jnp.stack([BB.from_mask((role == r) & (clause == c))  # noqa: E731
                                      for c in range(U.MAX_CLAUSES)])
    d = dict(
        bucket=bucket, valid=jnp.bool_(True), active=active, anchor_xy=axy, direction=direction,
        target_color=tc, target_shape=ts, anchor_color=ac, anchor_shape=ash,
        color=col, shape=shape.reshape(-1), cell_role=role, cell_clause=clause,
        targets=per_clause(U.TARGET), conf=per_clause(U.CONFUSER), count=cells["count"],
        occupied=BB.from_mask(col >= 0), anchors=BB.from_mask(cells["anchor_cells"]),
        v_target=BB.from_mask(cells["v_target"]), conf_region=BB.from_mask(cells["conf_region"]),
        # The object list holds every occupied cell: official scenes may hold fewer than
        # int(rho*S*S) objects, which the sampler's scenes always hold exactly.
        n_objects=jnp.sum(col >= 0).astype(jnp.int32),
        answer_yes=answer)
    # expand reads only the grid size from its spec (the object count comes from d).
    spec = U.Spec(grid_size=S, buckets=(0,))
    # The label is the file's answer, not the recount: verify's "answer" check compares them.
    return sampler.expand(d, spec).replace(answer=answer.astype(jnp.int32))


@functools.partial(jax.jit, static_argnums=0)
def _scenes(S, bucket, color, shape, tc, ts, active, ac, ash, axy, direction, answer):
    return jax.vmap(functools.partial(_scene_one, S))(bucket, color, shape, tc, ts, active, ac,
                                                      ash, axy, direction, answer)


def pad_len(n: int) -> int:
    """Next power of two >= max(n, 8): few distinct batch shapes, few compiles."""
    return max(8, 1 << (max(n, 1) - 1).bit_length())


def build_scenes(S: int, bucket, color, shape, question: dict, anchor_xy, answer) -> Scene:
    """A Scene batch (numpy, leading axis n) from per-sample scene, question, anchors and label.

    bucket int32 [n]; color/shape int32 [n, S, S]; question: ``parse_question`` fields stacked
    over samples (target_color/target_shape [n, 2], anchor_active/anchor_color/anchor_shape/
    direction [n, 2, K]); anchor_xy int32 [n, 2, K, 2] (question order); answer int32 [n]
    (count, or 1 = yes / 0 = no). ``valid`` is True. The batch is padded to ``pad_len(n)``
    (repeating sample 0) so directories of similar size share one compiled program.
    """
    n = len(bucket)
    idx = np.concatenate([np.arange(n), np.zeros(pad_len(n) - n, np.int64)])
    q = {k: np.asarray(v)[idx] for k, v in question.items()}
    out = _scenes(S, np.asarray(bucket, np.int32)[idx], np.asarray(color)[idx],
                  np.asarray(shape)[idx], q["target_color"], q["target_shape"],
                  q["anchor_active"], q["anchor_color"], q["anchor_shape"],
                  np.asarray(anchor_xy)[idx], q["direction"], np.asarray(answer, np.int32)[idx])
    return jax.tree.map(lambda a: np.asarray(a)[:n], out)


__all__ = ["cell_roles", "build_scenes", "pad_len"]
