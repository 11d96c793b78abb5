"""``sample(key, spec, bucket) -> Scene``: one GridVQA-X sample as a pytree of fixed-shape arrays.

A pure function of a PRNG key, so batches are ``jax.vmap`` over keys under ``jax.jit`` and the
same key gives the same sample whatever the batch size, chunking or device count.

Construction (GridVQA-X, "Adversarial confuser construction"), per sample:

1. Question attributes: a random permutation of the attribute keys (colour x shape for A/M/CMP,
   colour for CO, shape for SO). Targets and anchors take distinct keys, distractors the rest, so
   anchors are unique in their scene and distractors are never target look-alikes.
2. Geometry: anchors with pairwise distinct directions per clause, placed so that V_target is a
   non-empty rectangle; then every C_k = (∩_{i≠k} V_i) \\ V_k is non-empty too. Candidates are
   drawn in parallel and the first one whose regions have free cells is kept; the rare sample
   with no fitting candidate is re-drawn (``sample`` loops, ``sample_batch`` retries only the
   failed lanes), so every returned sample is valid.
3. D_pure: one target look-alike ("confuser") in every C_k, for every anchor of every clause
   (depth 1 and CMP included), plus extra look-alikes outside V_target drawn so that the total
   look-alike count does not reveal the answer. D_spur: no look-alike outside V_target.
4. Answers: yes/no balanced by a fair coin, counts uniform over what the geometry and the object
   budget allow; the scene always has exactly int(rho*S*S) objects.
"""

from __future__ import annotations

import functools

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from gridvqa_jax import regions as R
from gridvqa_jax.sampling import (Bits, choose, choose_one, onehot, permutation,
                                  permutation_slots, priority, randint_incl, take)
from gridvqa_jax import universe as U

N_CANDIDATES = 2  # geometry candidates drawn per attempt; see the module docstring.
@flax.struct.dataclass
class Scene:
    """One sample. Shapes for grid S (C = S*S cells, K = MAX_ANCHORS_PER_CLAUSE, L = MAX_TOKENS).

    Grids are indexed [y, x].
    """

    bucket: jax.Array  # int32 []: index into universe.BUCKETS
    depth: jax.Array  # int32 []: 1..3
    qtype: jax.Array  # int32 []: index into universe.QTYPES
    form: jax.Array  # int32 []: 0 count, 1 yes/no (CMP: 0, answered yes/no)
    valid: jax.Array  # bool []: the constructive sampler found a geometry (always, in practice)
    # Scene.
    color: jax.Array  # int32 [S, S]: colour id per cell, -1 empty
    shape: jax.Array  # int32 [S, S]: shape id per cell, -1 empty
    role: jax.Array  # int32 [S, S]: EMPTY/ANCHOR/TARGET/CONFUSER/DISTRACTOR
    clause: jax.Array  # int32 [S, S]: clause of an anchor/target/confuser, -1 otherwise
    # Object list (row-major cell order, padded to C entries).
    obj_valid: jax.Array  # bool [C]
    obj_xy: jax.Array  # int32 [C, 2]: (x, y) cell of each object
    obj_color: jax.Array  # int32 [C]
    obj_shape: jax.Array  # int32 [C]
    obj_role: jax.Array  # int32 [C]
    obj_box: jax.Array  # float32 [C, 4]: normalised (cx, cy, w, h), MDETR convention
    # Question structure (what the template names).
    target_color: jax.Array  # int32 [2]: per clause, -1 when the question does not name it
    target_shape: jax.Array  # int32 [2]
    anchor_active: jax.Array  # bool [2, K]
    anchor_color: jax.Array  # int32 [2, K]: -1 when unnamed (SO) or inactive
    anchor_shape: jax.Array  # int32 [2, K]
    anchor_xy: jax.Array  # int32 [2, K, 2]
    direction: jax.Array  # int32 [2, K]: index into universe.DIRECTIONS
    # Text.
    tokens: jax.Array  # int32 [L]: ids into universe.VOCAB, PAD_ID after the question
    token_role: jax.Array  # int32 [L]: FUNCTION/TARGET_ATTR/ANCHOR_ATTR/RELATION
    token_anchor: jax.Array  # int32 [L]: global anchor index clause*K + i of anchor words, else -1
    n_tokens: jax.Array  # int32 []
    # Answer.
    is_yesno: jax.Array  # bool []
    answer: jax.Array  # int32 []: the count (form 0), or 1 = yes / 0 = no
    count: jax.Array  # int32 [2]: targets counted per clause
    n_lookalike: jax.Array  # int32 [2]: target look-alikes per clause anywhere in the scene
    # Ground truth (the unique explanation A ∪ T) and regions.
    gt_cells: jax.Array  # bool [S, S]: anchor and counted-target cells
    gt_tokens: jax.Array  # bool [L]: target-attribute, anchor-attribute and relation tokens
    v_target: jax.Array  # bool [2, S, S]: V_target per clause (all False for an absent clause)
    confuser_region: jax.Array  # bool [2, K, S, S]: C_k per clause and anchor

    @property
    def gt_boxes(self):
        """float32 [C, 4] boxes of ground-truth objects (others zero) with mask bool [C]."""
        is_gt = self.obj_valid & ((self.obj_role == U.ANCHOR) | (self.obj_role == U.TARGET))
        return jnp.where(is_gt[..., None], self.obj_box, 0.0), is_gt


@functools.lru_cache(maxsize=None)
def _gap_pairs(grid_size: int) -> np.ndarray:
    """All (lo, hi) coordinate pairs with hi - lo >= 2: a 'right of lo' + 'left of hi' strip."""
    return np.array([(a, b) for a in range(grid_size) for b in range(grid_size) if b - a >= 2],
                    np.int32)


def _clause_geometry(rng, lane, m, grid_size: int):
    """Anchors of one clause: m pairwise-distinct directions and coordinates giving V_target ≠ ∅.

    Returns anchor_xy int32 [K, 2], direction int32 [K], active bool [K].
    """
    S, K = grid_size, U.MAX_ANCHORS_PER_CLAUSE
    u_dir = priority(rng, 4, lane)
    direction = permutation_slots(u_dir, np.arange(K))
    active = jnp.arange(K) < m
    has = jnp.any(onehot(direction, 4) & active[:, None], axis=0)
    pairs = jnp.asarray(_gap_pairs(S))
    pair_idx = rng.randint((2,), 0, pairs.shape[0], lane)
    xpair, ypair = take(pairs, pair_idx[0]), take(pairs, pair_idx[1])
    single = rng.randint((4,), 0, S - 1, lane)  # [0, S-2]
    # Anchor coordinate of each direction: left-of needs a.x >= 1, right-of a.x <= S-2, and with
    # both present the strip between them must hold a column (right.x + 2 <= left.x).
    x_left = jnp.where(has[1], xpair[1], single[0] + 1)
    x_right = jnp.where(has[0], xpair[0], single[1])
    y_above = jnp.where(has[3], ypair[1], single[2] + 1)
    y_below = jnp.where(has[2], ypair[0], single[3])
    fixed = take(jnp.stack([x_left, x_right, y_above, y_below]), direction)
    free = rng.randint((K,), 0, S, lane)
    horizontal = direction < 2
    anchor_xy = jnp.stack([jnp.where(horizontal, fixed, free), jnp.where(horizontal, free, fixed)],
                          axis=-1)
    return anchor_xy.astype(jnp.int32), direction, active


def _geometry_candidate(rng, lane, n_clauses, m, grid_size: int):
    """One geometry candidate for both clauses plus one confuser cell per anchor.

    Returns (anchor_xy [2,K,2], direction [2,K], active [2,K], v_target [2,C], conf_region
    [2,K,C], conf_cells bool [2,K,C], ok bool []).
    """
    K, C = U.MAX_ANCHORS_PER_CLAUSE, grid_size * grid_size
    clause_on = jnp.arange(U.MAX_CLAUSES) < n_clauses
    geoms = [_clause_geometry(rng, lane, m, grid_size) for _ in range(U.MAX_CLAUSES)]
    anchor_xy, direction, active = (jnp.stack(g) for g in zip(*geoms))
    active = active & clause_on[:, None]
    v_target, conf_region = jax.vmap(
        lambda a, d, act: R.clause_regions(a, d, act, grid_size))(anchor_xy, direction, active)
    v_target = v_target & clause_on[:, None]
    cell = anchor_xy[..., 1] * grid_size + anchor_xy[..., 0]  # [2, K]
    flat_cell, flat_act = cell.reshape(-1), active.reshape(-1)
    occupied = jnp.sum(onehot(flat_cell, C) & flat_act[:, None], axis=0)
    distinct = jnp.all(occupied <= 1)
    free = occupied == 0
    ok = distinct & jnp.all(jnp.any(v_target & free[None], axis=-1) | ~clause_on)
    # One confuser per anchor, preferring cells outside the other clause's V_target so that the
    # look-alikes of one clause do not use up the target room of the other.
    prio = priority(rng, C, lane)
    conf_cells = []
    for c in range(U.MAX_CLAUSES):
        for k in range(K):
            allowed = conf_region[c, k] & free
            chosen = choose_one(prio, allowed, active[c, k], prefer=~v_target[1 - c])
            ok &= jnp.any(chosen) | ~active[c, k]
            conf_cells.append(chosen)
            free &= ~chosen
    conf_cells = jnp.stack(conf_cells).reshape(U.MAX_CLAUSES, K, C)
    return anchor_xy, direction, active, v_target, conf_region, conf_cells, ok


def _answer_counts(rng, spec: U.Spec, form, is_cmp, m, free, v_target, budget):
    """Targets and extra look-alikes per clause for a balanced, leak-free answer.

    free: bool [C] cells left after anchors and mandatory confusers; v_target: bool [2, C];
    budget: objects left. Returns (count int32 [2], extra int32 [2], answer_yes bool []).
    """
    pure = spec.variant == "pure"
    F = jnp.sum(v_target & free[None], axis=-1)  # free cells inside each V_target
    O = jnp.sum(~v_target & free[None], axis=-1)  # free cells outside
    union = jnp.sum((v_target[0] | v_target[1]) & free)
    yes = rng.uniform() < 0.5
    relational = m > 0
    confusable = pure & relational

    # Single clause, form 0: count uniform over its range; D_pure adds extra confusers so that the
    # look-alike total minus the number of anchors does not give the count away.
    c_f0 = randint_incl(rng, 1, jnp.minimum(F[0], budget))
    e_f0 = jnp.where(confusable, randint_incl(rng, 0, jnp.minimum(O[0], budget - c_f0)), 0)
    # Single clause, form 1: in D_pure draw the extra look-alike total first, the same way for
    # both answers, so that it carries no information about yes/no.
    lprime = randint_incl(rng, 1, jnp.maximum(1, jnp.minimum(budget, O[0])))
    c_yes_pure = randint_incl(rng, jnp.maximum(1, lprime - O[0]), jnp.minimum(F[0], lprime))
    c_yes = jnp.where(confusable, c_yes_pure, randint_incl(rng, 1, jnp.minimum(F[0], budget)))
    c_f1 = jnp.where(yes, c_yes, 0)
    e_f1 = jnp.where(confusable, jnp.where(yes, lprime - c_yes_pure, jnp.minimum(lprime, O[0])), 0)
    # CMP: yes iff count0 > count1, with a fair coin on the answer. In D_pure each count stays
    # <= (budget-1)/2, so that the extra look-alikes which make the bag-of-words comparison a
    # coin flip (_cmp_bow_extras: up to |count0 - count1| + 1 of them) always fit the budget.
    cap = jnp.minimum(budget, union)
    Fc = jnp.where(confusable, jnp.minimum(F, (budget - 1) // 2), F)
    c1_yes = randint_incl(rng, 0, jnp.minimum(jnp.minimum(Fc[1], Fc[0] - 1), (cap - 1) // 2))
    c0_yes = randint_incl(rng, c1_yes + 1, jnp.minimum(Fc[0], cap - c1_yes))
    c0_no = randint_incl(rng, 0, jnp.minimum(jnp.minimum(Fc[0], Fc[1]), cap // 2))
    c1_no = randint_incl(rng, c0_no, jnp.minimum(Fc[1], cap - c0_no))
    c_cmp = jnp.where(yes, jnp.stack([c0_yes, c1_yes]), jnp.stack([c0_no, c1_no]))

    single = jnp.where(form == 0, jnp.stack([c_f0, 0]), jnp.stack([c_f1, 0]))
    count = jnp.where(is_cmp, c_cmp, single)
    extra = jnp.where(is_cmp, 0, jnp.stack([jnp.where(form == 0, e_f0, e_f1), 0]))
    answer_yes = jnp.where(is_cmp, count[0] > count[1], count[0] > 0)
    return count.astype(jnp.int32), extra.astype(jnp.int32), answer_yes


def _cmp_bow_extras(rng, count, m, free_after, v_target, budget):
    """D_pure CMP: extra look-alikes that make the look-alike comparison a coin flip.

    Bag-of-words compares count_c + m + extra_c; a fair coin picks which way that comparison
    should go and the deficit is filled with look-alikes outside that clause's V_target, when the
    room and budget allow. Returns extra int32 [2].
    """
    want_more = rng.uniform() < 0.5
    need0 = jnp.where(want_more & (count[0] <= count[1]), count[1] - count[0] + 1, 0)
    need1 = jnp.where(~want_more & (count[0] > count[1]), count[0] - count[1], 0)
    room = jnp.sum(~v_target & free_after[None], axis=-1)
    e0 = jnp.where((need0 <= room[0]) & (need0 <= budget), need0, 0)
    e1 = jnp.where((need1 <= room[1]) & (need1 <= budget), need1, 0)
    return jnp.stack([e0, e1]).astype(jnp.int32)


def _sample_attempt(key, spec: U.Spec, bucket) -> Scene:
    """One attempt at a sample (``valid`` False if no geometry candidate fitted)."""
    S, C, N = spec.grid_size, spec.n_cells, spec.n_objects
    K = U.MAX_ANCHORS_PER_CLAUSE
    bucket = jnp.asarray(bucket, jnp.int32)
    of_bucket = lambda table: take(table, bucket)  # noqa: E731
    depth, qtype = of_bucket(U.BUCKET_DEPTH), of_bucket(U.BUCKET_QTYPE)
    form = of_bucket(U.BUCKET_FORM)
    n_clauses, m = of_bucket(U.BUCKET_N_CLAUSES), of_bucket(U.BUCKET_ANCHORS_PER_CLAUSE)
    is_cmp = qtype == U.QTYPES.index("CMP")
    is_co, is_so = qtype == U.QTYPES.index("CO"), qtype == U.QTYPES.index("SO")
    pure = spec.variant == "pure"

    rng = Bits(key)

    # 1. Attribute keys: slot 0/1 = clause targets, then the anchors, then distractor keys.
    perm16 = permutation(priority(rng, 16))
    perm_c, perm_s = permutation(priority(rng, 4)), permutation(priority(rng, 4))
    n_keys = jnp.where(is_co | is_so, 4, 16)
    n_named = n_clauses * (1 + m)

    def key_of(slot):  # attribute (color, shape) of a named key slot; -1 = unnamed
        k16, kc, ks = perm16[slot], perm_c[slot % 4], perm_s[slot % 4]
        color = jnp.where(is_so, -1, jnp.where(is_co, kc, k16 // 4))
        shape = jnp.where(is_co, -1, jnp.where(is_so, ks, k16 % 4))
        return color, shape

    clause_ids = jnp.arange(U.MAX_CLAUSES)
    anchor_slot = n_clauses + clause_ids[:, None] * m + jnp.arange(K)[None, :]  # [2, K]
    target_color, target_shape = key_of(clause_ids)
    anchor_color, anchor_shape = key_of(anchor_slot)

    # 2. Geometry: the first valid of N_CANDIDATES candidates.
    cands = jax.vmap(lambda lane: _geometry_candidate(rng, lane, n_clauses, m, S))(
        jnp.arange(N_CANDIDATES))
    ok = cands[-1]
    pick = jnp.argmax(ok)
    anchor_xy, direction, active, v_target, conf_region, conf_cells, _ = jax.tree.map(
        lambda a: a[pick], cands)
    valid = ok[pick]
    anchor_color = jnp.where(active, anchor_color, -1)
    anchor_shape = jnp.where(active, anchor_shape, -1)
    clause_on = clause_ids < n_clauses
    target_color = jnp.where(clause_on, target_color, -1)
    target_shape = jnp.where(clause_on, target_shape, -1)

    # Cell bookkeeping: cell_slot = named key slot (anchors, look-alikes), cell_role, cell_clause.
    cell_role = jnp.zeros(C, jnp.int32)
    cell_slot = jnp.full(C, -1, jnp.int32)
    cell_clause = jnp.full(C, -1, jnp.int32)
    anchor_cell = anchor_xy[..., 1] * S + anchor_xy[..., 0]
    at_anchor = onehot(anchor_cell, C) & active[..., None]  # [2, K, C]
    is_anchor = jnp.any(at_anchor, axis=(0, 1))
    cell_role = jnp.where(is_anchor, U.ANCHOR, cell_role)
    cell_slot = jnp.where(is_anchor, jnp.sum(jnp.where(at_anchor, anchor_slot[..., None], 0),
                                             axis=(0, 1)), cell_slot)
    cell_clause = jnp.where(is_anchor, jnp.sum(jnp.where(at_anchor, clause_ids[:, None, None], 0),
                                               axis=(0, 1)), cell_clause)

    def put(role, slot, clause, chosen):
        nonlocal cell_role, cell_slot, cell_clause
        cell_role = jnp.where(chosen, role, cell_role)
        cell_slot = jnp.where(chosen, slot, cell_slot)
        cell_clause = jnp.where(chosen, clause, cell_clause)

    if pure:
        for c in range(U.MAX_CLAUSES):
            put(U.CONFUSER, c, c, jnp.any(conf_cells[c], axis=0))
    free = cell_role == U.EMPTY
    n_mandatory = jnp.sum(active) * (2 if pure else 1)
    budget = N - n_mandatory

    # 3-4. Targets and extra look-alikes.
    count, extra, answer_yes = _answer_counts(
        rng, spec, form, is_cmp, m, free, v_target, budget)
    for c in range(U.MAX_CLAUSES):
        # Clause 0 targets use cells outside clause 1's region first, so clause 1 keeps room.
        chosen = choose(priority(rng, C), v_target[c] & free, count[c],
                         prefer=~v_target[1 - c] if c == 0 else None)
        put(U.TARGET, c, c, chosen)
        free &= ~chosen
    if pure:
        extra = jnp.where(is_cmp & (m > 0),
                          _cmp_bow_extras(rng, count, m, free, v_target,
                                          budget - count[0] - count[1]), extra)
        for c in range(U.MAX_CLAUSES):
            chosen = choose(priority(rng, C), ~v_target[c] & free & clause_on[c], extra[c])
            put(U.CONFUSER, c, c, chosen)
            free &= ~chosen
    n_placed = jnp.sum(cell_role != U.EMPTY)
    chosen = choose(priority(rng, C), free, N - n_placed)
    put(U.DISTRACTOR, -1, -1, chosen)
    valid &= jnp.sum(cell_role != U.EMPTY) == N
    valid &= jnp.sum(cell_role == U.TARGET) == jnp.sum(count)
    conf_per_clause = jnp.sum((cell_role == U.CONFUSER)[None] & (cell_clause[None] == clause_ids[:, None]),
                              axis=-1)
    valid &= jnp.all(conf_per_clause >= (jnp.sum(active, axis=1) if pure else 0))

    # Colours and shapes per cell.
    u_dist = rng.uniform((C,))
    dist_slot = n_named + jnp.minimum((u_dist * (n_keys - n_named)).astype(jnp.int32),
                                      n_keys - n_named - 1)
    slot = jnp.where(cell_role == U.DISTRACTOR, dist_slot, jnp.maximum(cell_slot, 0))
    named_c, named_s = key_of(slot)
    free_c = rng.randint((C,), 0, 4)
    free_s = rng.randint((C,), 0, 4)
    occupied = cell_role != U.EMPTY
    color = jnp.where(occupied, jnp.where(named_c < 0, free_c, named_c), -1).astype(jnp.int32)
    shape = jnp.where(occupied, jnp.where(named_s < 0, free_s, named_s), -1).astype(jnp.int32)

    # Object list in row-major cell order.
    # Row-major compaction of the occupied cells (a scatter; padding points at empty cells).
    slot_of = jnp.where(occupied, jnp.cumsum(occupied) - 1, N + jnp.cumsum(~occupied) - 1)
    order = jnp.zeros(C, jnp.int32).at[slot_of].set(jnp.arange(C, dtype=jnp.int32))
    obj_valid = jnp.arange(C) < N
    xs, ys = R.cell_coords(S)
    gather = lambda a: take(a, order)  # noqa: E731
    obj_xy = jnp.stack([gather(xs), gather(ys)], -1)
    obj_box = jnp.concatenate([(obj_xy.astype(jnp.float32) + 0.5) / S,
                               jnp.full((C, 2), 1.0 / S, jnp.float32)], -1)
    obj_box = jnp.where(obj_valid[:, None], obj_box, 0.0)

    tokens, token_role, token_anchor, n_tokens = build_tokens(
        bucket, target_color, target_shape, anchor_color, anchor_shape, direction)

    is_yesno = of_bucket(U.BUCKET_IS_YESNO)
    answer = jnp.where(is_yesno, answer_yes.astype(jnp.int32), count[0])
    lookalike = (cell_role == U.TARGET) | (cell_role == U.CONFUSER)
    n_lookalike = jnp.sum(lookalike[None] & (cell_clause[None] == clause_ids[:, None]), axis=-1)
    grid = lambda a: a.reshape(a.shape[:-1] + (S, S))  # noqa: E731
    return Scene(
        bucket=bucket, depth=depth, qtype=qtype, form=form, valid=valid,
        color=grid(color), shape=grid(shape), role=grid(cell_role), clause=grid(cell_clause),
        obj_valid=obj_valid, obj_xy=obj_xy.astype(jnp.int32),
        obj_color=jnp.where(obj_valid, gather(color), -1),
        obj_shape=jnp.where(obj_valid, gather(shape), -1),
        obj_role=jnp.where(obj_valid, gather(cell_role), U.EMPTY), obj_box=obj_box,
        target_color=target_color.astype(jnp.int32), target_shape=target_shape.astype(jnp.int32),
        anchor_active=active, anchor_color=anchor_color.astype(jnp.int32),
        anchor_shape=anchor_shape.astype(jnp.int32), anchor_xy=jnp.where(active[..., None],
                                                                          anchor_xy, 0),
        direction=jnp.where(active, direction, 0),
        tokens=tokens, token_role=token_role, token_anchor=token_anchor, n_tokens=n_tokens,
        is_yesno=is_yesno, answer=answer.astype(jnp.int32), count=count,
        n_lookalike=n_lookalike.astype(jnp.int32),
        gt_cells=grid((cell_role == U.ANCHOR) | (cell_role == U.TARGET)),
        gt_tokens=token_role > U.FUNCTION,
        v_target=grid(v_target), confuser_region=grid(conf_region),
    )


def build_tokens(bucket, target_color, target_shape, anchor_color, anchor_shape, direction):
    """Spell the question of ``bucket`` as token ids with a role per token (jit-friendly).

    Runs the bucket's slot program (universe.SLOT_TABLE), each slot emitting up to two tokens,
    then packs the emitted tokens to the left. Returns tokens, roles, anchor refs (int32 [L]) and
    the token count.
    """
    K, L = U.MAX_ANCHORS_PER_CLAUSE, U.MAX_TOKENS
    prog = take(jnp.asarray(U.SLOT_TABLE), bucket)  # [n_slots, 4]
    kind, word, c, i = prog[:, 0], prog[:, 1], prog[:, 2], prog[:, 3]
    tc, ts = take(target_color, c), take(target_shape, c)
    ci = c * K + i
    ac, ash = take(anchor_color.reshape(-1), ci), take(anchor_shape.reshape(-1), ci)
    d = take(direction.reshape(-1), ci)
    dir_tok = take(jnp.asarray(U.DIRECTION_TOKENS), d)
    first = jnp.select(
        [kind == U.S_WORD, kind == U.S_TCOLOR, kind == U.S_TSHAPE, kind == U.S_TSHAPES,
         kind == U.S_ACOLOR, kind == U.S_ASHAPE],
        [word, U.COLOR_TOKEN0 + tc, U.SHAPE_TOKEN0 + ts, U.SHAPE_PLURAL_TOKEN0 + ts,
         U.COLOR_TOKEN0 + ac, U.SHAPE_TOKEN0 + ash], dir_tok[:, 0])
    second = jnp.where(kind == U.S_DIR, dir_tok[:, 1], U.PAD_ID)
    role = jnp.select(
        [kind == U.S_WORD, (kind >= U.S_TCOLOR) & (kind <= U.S_TSHAPES),
         (kind == U.S_ACOLOR) | (kind == U.S_ASHAPE)],
        [U.FUNCTION, U.TARGET_ATTR, U.ANCHOR_ATTR], U.RELATION)
    ref = jnp.where(kind >= U.S_ACOLOR, c * K + i, -1)
    toks = jnp.stack([first, second], -1).reshape(-1)
    roles = jnp.repeat(role, 2)
    refs = jnp.repeat(ref, 2)
    keep = toks != U.PAD_ID
    pos = jnp.where(keep, jnp.cumsum(keep) - 1, L)
    # A scatter: XLA's CPU reductions over a leading [n_emitted] axis are ~10x slower here.
    pack = lambda v, fill: jnp.full(L, fill, jnp.int32).at[pos].set(  # noqa: E731
        v.astype(jnp.int32), mode="drop")
    return (pack(toks, U.PAD_ID), pack(roles, U.FUNCTION), pack(refs, -1),
            jnp.sum(keep).astype(jnp.int32))


MAX_ATTEMPTS = 64  # a sample whose 64 attempts all fail means the spec cannot be generated


def _attempt_key(key, attempt):
    return jax.random.fold_in(key, attempt)


def sample(key, spec: U.Spec, bucket=None) -> Scene:
    """Draw one GridVQA-X sample of bucket ``bucket`` (int32 [], index into ``BUCKETS``).

    Pure in (key, bucket); ``spec`` is static. With ``bucket=None`` the bucket is drawn
    uniformly from ``spec.buckets`` with the key (datasets instead cycle through the buckets,
    see ``bucket_ids``). The sample is the first valid attempt
    ``a = 0, 1, ...`` of the construction in the module docstring, each attempt drawing
    N_CANDIDATES geometries from ``fold_in(key, a)``. ``sample_batch`` gives the same samples
    faster by retrying only the rare failed lanes.
    """
    if bucket is None:
        table = jnp.asarray(spec.buckets, jnp.int32)
        bucket = table[jax.random.randint(jax.random.fold_in(key, 0xFFFFFFFF), (), 0,
                                                len(spec.buckets))]
    first = _sample_attempt(_attempt_key(key, 0), spec, bucket)

    def retry(state):
        attempt, _ = state
        return attempt + 1, _sample_attempt(_attempt_key(key, attempt + 1), spec, bucket)

    _, out = jax.lax.while_loop(
        lambda st: ~st[1].valid & (st[0] < MAX_ATTEMPTS - 1), retry, (jnp.int32(0), first))
    return out


@functools.partial(jax.jit, static_argnums=(1,))
def _attempt_batch(keys, spec: U.Spec, buckets, attempts):
    """vmapped ``_sample_attempt`` with a per-lane attempt number (int32 [B])."""
    return jax.vmap(lambda k, b, a: _sample_attempt(_attempt_key(k, a), spec, b))(
        keys, buckets, attempts)


@functools.partial(jax.jit, donate_argnums=(0,))
def _merge(out, sub, idx):
    """out[idx] = sub for every field, in place (the batch buffer is donated).

    Padding entries of idx repeat a failed lane whose padded rows were drawn from the same key
    and attempt, so the duplicate writes agree."""
    return jax.tree.map(lambda a, b: a.at[idx].set(b), out, sub)


def sample_batch(keys, spec: U.Spec, buckets) -> Scene:
    """``jax.vmap(sample)`` over keys [B] and bucket ids int32 [B], equal to it sample by sample.

    Attempt 0 runs for the whole batch under jit; the few lanes whose geometry candidates all
    failed (well under 1% on a 5x5 grid) are re-drawn with the next attempt in a small padded
    batch, so the common case pays for one attempt only.
    """
    buckets = jnp.asarray(buckets, jnp.int32)
    out = _attempt_batch(keys, spec, buckets, jnp.zeros(len(buckets), jnp.int32))
    bad = np.flatnonzero(~np.asarray(out.valid))
    tried = np.ones(bad.size, np.int32)  # next attempt number of each failed lane
    # One retry shape per batch size (each new shape would cost a compilation).
    size = min(len(buckets), max(64, 1 << (len(buckets) // 64).bit_length()))
    while bad.size and tried.min() < MAX_ATTEMPTS:
        todo, att = bad[:size], tried[:size]
        pad = size - todo.size
        idx = np.concatenate([todo, np.full(pad, todo[0])])
        sub = _attempt_batch(keys[idx], spec, buckets[idx],
                             jnp.asarray(np.concatenate([att, np.full(pad, att[0])])))
        out = _merge(out, sub, jnp.asarray(idx))
        failed = ~np.asarray(sub.valid[: todo.size])
        bad = np.concatenate([bad[size:], todo[failed]])
        tried = np.concatenate([tried[size:], att[failed] + 1])
    if bad.size:
        raise RuntimeError(
            f"{bad.size} samples found no valid geometry in {MAX_ATTEMPTS} attempts; "
            f"the spec {spec} is too tight to generate")
    return out


def sample_keys(seed: int, start: int, n: int):
    """Keys of samples start..start+n-1 of a dataset: ``fold_in(PRNGKey(seed), i)``.

    Folding in the global index (instead of splitting) is what makes sample i identical for any
    batch size, chunking or device count.
    """
    root = jax.random.key(seed)
    return jax.vmap(lambda i: jax.random.fold_in(root, i))(jnp.arange(start, start + n,
                                                                       dtype=jnp.uint32))


def bucket_ids(spec: U.Spec, start: int, n: int):
    """Bucket id of samples start..start+n-1: spec.buckets round-robin (even spread)."""
    table = np.asarray(spec.buckets, np.int32)
    return jnp.asarray(table[np.arange(start, start + n) % len(table)])
