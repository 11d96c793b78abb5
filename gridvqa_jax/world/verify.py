"""Independent checks of GridVQA-X samples: the answer, the ground truth and the shortcut guarantees.

Everything is recomputed from the scene (colour and shape per cell) and the question (what it
names, its directions); the generator's own bookkeeping (cell roles, counts, anchor positions) is
only compared against, never trusted. The checks are those of the GridVQA-X paper: a unique
ground truth A ∪ T (do(distractor) leaves the answer unchanged), Theorem 1's populated confuser
regions in D_pure, and an exact bag-of-words shortcut in D_spur.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from gridvqa_jax.world import regions as RG
from gridvqa_jax.world import universe as U

CHECKS = ("sampler_valid", "object_count", "anchors_unique", "answer", "ground_truth",
          "confusers", "bow_exact", "distractors_inert")


def _question_answer(color, shape, q, grid_size, drop_anchor=None):
    """Answer a question on a scene by the closed-world semantics.

    color/shape: int32 [C]; q: dict with target_color/shape [2], anchor_active/color/shape [2, K],
    direction [2, K], n_clauses, is_cmp, is_yesno. Anchors are located by searching the scene for
    the unique object matching each anchor's named attributes. ``drop_anchor`` (global index or
    None) ignores one anchor (partial logic). Returns a dict of per-sample results.
    """
    K = U.MAX_ANCHORS_PER_CLAUSE
    xs, ys = RG.cell_coords(grid_size)
    match = jax.vmap(jax.vmap(lambda c, s: RG.matches(color, shape, c, s)))(
        q["anchor_color"], q["anchor_shape"])  # [2, K, C]
    n_match = jnp.sum(match, axis=-1)
    where = jnp.argmax(match, axis=-1)
    found_xy = jnp.stack([xs[where], ys[where]], -1)
    active = q["anchor_active"]
    if drop_anchor is not None:
        active = active & (jnp.arange(2 * K).reshape(2, K) != drop_anchor)
    v_target, conf = jax.vmap(lambda a, d, act: RG.clause_regions(a, d, act, grid_size))(
        found_xy, q["direction"], active)
    clause_on = jnp.arange(U.MAX_CLAUSES) < q["n_clauses"]
    lookalike = jax.vmap(lambda c, s: RG.matches(color, shape, c, s))(
        q["target_color"], q["target_shape"]) & clause_on[:, None]  # [2, C]
    counted = lookalike & v_target
    count = jnp.sum(counted, axis=-1)
    bow = jnp.sum(lookalike, axis=-1)

    def to_answer(n):
        return jnp.where(q["is_cmp"], (n[0] > n[1]).astype(jnp.int32),
                         jnp.where(q["is_yesno"], (n[0] > 0).astype(jnp.int32), n[0]))

    anchor_cells = jnp.any(match & active[..., None], axis=(0, 1))
    return dict(
        answer=to_answer(count), bow_answer=to_answer(bow), count=count,
        anchors_unique=jnp.all((n_match == 1) | ~active),
        anchors_not_lookalike=~jnp.any(anchor_cells & jnp.any(lookalike, 0)),
        gt=anchor_cells | jnp.any(counted, axis=0),
        confuser_populated=jnp.any(conf & lookalike[:, None, :], axis=-1) | ~active,
        found_xy=found_xy,
    )


def _question(scene):
    is_cmp = scene.qtype == U.QTYPES.index("CMP")
    return dict(
        target_color=scene.target_color, target_shape=scene.target_shape,
        anchor_active=scene.anchor_active, anchor_color=scene.anchor_color,
        anchor_shape=scene.anchor_shape, direction=scene.direction,
        n_clauses=jnp.where(is_cmp, 2, 1), is_cmp=is_cmp, is_yesno=scene.is_yesno)


def analyse(scene, spec: U.Spec):
    """Per-sample diagnostics of one Scene (vmap for batches). See ``verify`` for the checks.

    Returns a dict of scalars: every check in CHECKS (bool), plus bow_correct, partial_correct
    [2*K] (answer when anchor k is dropped equals the label), partial_applies [2*K],
    confuser_coverage (fraction of anchors whose C_k holds a look-alike) and n_anchors.
    """
    S, C, K = spec.grid_size, spec.n_cells, U.MAX_ANCHORS_PER_CLAUSE
    color, shape = scene.color.reshape(C), scene.shape.reshape(C)
    q = _question(scene)
    res = _question_answer(color, shape, q, S)
    answer_ok = res["answer"] == scene.answer
    active = scene.anchor_active
    n_anchors = jnp.sum(active)

    # do(remove o) for every object o outside the ground truth must leave the answer unchanged.
    def removed(j):
        c2, s2 = color.at[j].set(-1), shape.at[j].set(-1)
        return _question_answer(c2, s2, q, S)["answer"]

    non_gt = (color >= 0) & ~res["gt"]
    after = jax.vmap(removed)(jnp.arange(C))
    inert = jnp.all((after == res["answer"]) | ~non_gt)

    partial = jax.vmap(lambda k: _question_answer(color, shape, q, S, drop_anchor=k)["answer"])(
        jnp.arange(2 * K))
    pure = spec.variant == "pure"
    coverage = jnp.sum(res["confuser_populated"] & active) / jnp.maximum(n_anchors, 1)
    return dict(
        sampler_valid=scene.valid,
        object_count=jnp.sum(color >= 0) == spec.n_objects,
        anchors_unique=res["anchors_unique"] & res["anchors_not_lookalike"],
        answer=answer_ok,
        ground_truth=jnp.all(res["gt"] == scene.gt_cells.reshape(C)),
        confusers=jnp.all(res["confuser_populated"]) if pure else jnp.bool_(True),
        bow_exact=(res["bow_answer"] == scene.answer) if not pure else jnp.bool_(True),
        distractors_inert=inert,
        bow_correct=res["bow_answer"] == scene.answer,
        partial_correct=partial == scene.answer,
        partial_applies=active.reshape(-1),
        confuser_coverage=coverage,
        n_anchors=n_anchors,
    )


@functools.partial(jax.jit, static_argnums=1)
def verify(batch, spec: U.Spec):
    """Per-sample booleans for a batch of Scenes (leading axis B).

    Checks (GridVQA-X): the sampler succeeded; exactly int(rho*S*S) objects; every anchor is the
    only object matching what the question names for it, and is no target look-alike; the answer
    recomputed from the scene equals the label; the ground-truth cells equal anchors ∪ counted
    targets; D_pure: every C_k holds a target look-alike; D_spur: the bag-of-words answer (count
    every look-alike, ignore relations) equals the label; removing any object outside the ground
    truth leaves the answer unchanged. Returns {check: bool [B]} plus "ok" = all of them.
    """
    out = jax.vmap(lambda s: analyse(s, spec))(batch)
    checks = {k: out[k] for k in CHECKS}
    ok = functools.reduce(jnp.logical_and, checks.values())
    return {**checks, "ok": ok}


analyse_batch = jax.jit(jax.vmap(analyse, in_axes=(0, None)), static_argnums=1)
