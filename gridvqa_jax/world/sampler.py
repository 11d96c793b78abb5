"""``sample(key, spec, bucket) -> Scene``: one GridVQA-X sample as a pytree of fixed-shape arrays.

A pure function of a PRNG key, so batches are ``jax.vmap`` over keys under ``jax.jit`` and the
same key gives the same sample whatever the batch size, chunking or device count.

Construction (GridVQA-X, "Adversarial confuser construction"), per sample:

1. Question attributes: distinct random attribute keys (colour x shape for A/M/CMP, colour for
   CO, shape for SO) for the targets and anchors; each distractor takes a uniformly random key
   no slot names, so anchors are unique in their scene and distractors never look like targets.
2. Geometry: anchors with pairwise distinct directions per clause, placed so that V_target is a
   non-empty rectangle; then every C_k = (∩_{i≠k} V_i) \\ V_k is non-empty too. An attempt
   whose regions have no free cell (or cannot hold the drawn counts, step 4) is re-drawn with
   the next attempt key (``sample`` loops, ``sample_batch`` re-draws only the failed lanes;
   ~5% of attempts on a 5x5 grid), so every returned sample is valid.
3. D_pure: one target look-alike ("confuser") in every C_k, for every anchor of every clause
   (depth 1 and CMP included), plus extra look-alikes outside V_target drawn so that the total
   look-alike count does not reveal the answer. D_spur: no look-alike outside V_target.
4. Answers: yes/no balanced by a fair coin, counts uniform over what the geometry and the object
   budget allow; the scene always has exactly int(rho*S*S) objects. Cells are drawn uniformly
   from their region (selection sampling, ``bitboards.choose``).

Every region is a bitboard (``gridvqa_jax.world.bitboards``: one uint32 per sample on a 5x5 grid), so
the per-sample work is a few thousand element-wise integer ops that XLA vectorises across the
batch. The sample is built in three programs: ``draw`` (regions, answer and cell choices as
boards and scalars), ``fill_cells`` (per-cell role, clause, colour, shape) and ``expand`` (object
list, question tokens, masks). ``sample_batch`` compiles them separately because XLA, given the
whole chain in one program, fuses each stage into every element of the next stage's wider
outputs and recomputes it there; ``sample`` (one sample, any transform) chains them directly.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from gridvqa_jax.world import bitboards as BB
from gridvqa_jax.world import universe as U
from gridvqa_jax.world.questions import build_tokens
from gridvqa_jax.world.sampling import Bits, onehot, permutation_slots, priority, randint_incl, take
from gridvqa_jax.world.scene import Scene


@functools.lru_cache(maxsize=None)
def _gap_pairs(grid_size: int) -> np.ndarray:
    """All (lo, hi) coordinate pairs with hi - lo >= 2: a 'right of lo' + 'left of hi' strip."""
    return np.array([(a, b) for a in range(grid_size) for b in range(grid_size) if b - a >= 2],
                    np.int32)


def _clause_geometry(rng, m, grid_size: int):
    """Anchors of one clause: m pairwise-distinct directions and coordinates giving V_target ≠ ∅.

    Returns anchor_xy int32 [K, 2], direction int32 [K], active bool [K].
    """
    S, K = grid_size, U.MAX_ANCHORS_PER_CLAUSE
    u_dir = priority(rng, 4)
    direction = permutation_slots(u_dir, np.arange(K))
    active = jnp.arange(K) < m
    has = jnp.any(onehot(direction, 4) & active[:, None], axis=0)
    pairs = jnp.asarray(_gap_pairs(S))
    pair_idx = rng.randint((2,), 0, pairs.shape[0])
    xpair, ypair = take(pairs, pair_idx[0]), take(pairs, pair_idx[1])
    single = rng.randint((4,), 0, S - 1)  # [0, S-2]
    # Anchor coordinate of each direction: left-of needs a.x >= 1, right-of a.x <= S-2, and with
    # both present the strip between them must hold a column (right.x + 2 <= left.x).
    x_left = jnp.where(has[1], xpair[1], single[0] + 1)
    x_right = jnp.where(has[0], xpair[0], single[1])
    y_above = jnp.where(has[3], ypair[1], single[2] + 1)
    y_below = jnp.where(has[2], ypair[0], single[3])
    fixed = take(jnp.stack([x_left, x_right, y_above, y_below]), direction)
    free = rng.randint((K,), 0, S)
    horizontal = direction < 2
    anchor_xy = jnp.stack([jnp.where(horizontal, fixed, free), jnp.where(horizontal, free, fixed)],
                          axis=-1)
    return anchor_xy.astype(jnp.int32), direction, active


def _geometry(rng, n_clauses, m, grid_size: int):
    """The geometry of both clauses plus one confuser cell per anchor, as bitboards.

    Returns (anchor_xy [2,K,2], direction [2,K], active [2,K], v_target [2,W], conf_region
    [2,K,W], anchor_bd [2,K,W], conf_bd [2,K,W], ok bool []); boards are uint32 (see bitboards).
    """
    S, K, C = grid_size, U.MAX_ANCHORS_PER_CLAUSE, grid_size * grid_size
    full = jnp.asarray(BB.full(C))
    clause_on = jnp.arange(U.MAX_CLAUSES) < n_clauses
    geoms = [_clause_geometry(rng, m, grid_size) for _ in range(U.MAX_CLAUSES)]
    anchor_xy, direction, active = (jnp.stack(g) for g in zip(*geoms))
    active = active & clause_on[:, None]
    # V_i of every anchor (all cells for an inactive one), V_target = ∩ V_i, C_k = ∩_{i≠k} V_i \ V_k.
    coord = jnp.where(direction < 2, anchor_xy[..., 0], anchor_xy[..., 1])
    half = jnp.asarray(BB.half_planes(S))[direction * S + coord]  # [2, K, W]
    half = jnp.where(active[..., None], half, full[None, None])
    v_target = jnp.where(clause_on[:, None], half[:, 0] & half[:, 1] & half[:, 2], 0)
    others = [half[:, 1] & half[:, 2], half[:, 0] & half[:, 2], half[:, 0] & half[:, 1]]
    conf_region = jnp.stack([o & ~half[:, k] for k, o in enumerate(others)], axis=1)
    conf_region = jnp.where(active[..., None], conf_region & full[None, None], 0)
    cell = anchor_xy[..., 1] * S + anchor_xy[..., 0]  # [2, K]
    anchor_bd = BB.single(cell, C, active)
    occupied = anchor_bd[0, 0] | anchor_bd[0, 1] | anchor_bd[0, 2]
    occupied |= anchor_bd[1, 0] | anchor_bd[1, 1] | anchor_bd[1, 2]
    distinct = BB.count(occupied) == jnp.sum(active)
    free = full & ~occupied
    ok = distinct & jnp.all(BB.nonempty(v_target & free[None]) | ~clause_on)
    # One confuser per anchor, preferring cells outside the other clause's V_target so that the
    # look-alikes of one clause do not use up the target room of the other.
    words = rng.words((U.MAX_CLAUSES, K))
    conf_bd = []
    for c in range(U.MAX_CLAUSES):
        for k in range(K):
            chosen, _ = BB.choose_one(words[c, k], conf_region[c, k] & free, C,
                                      prefer=~v_target[1 - c], on=active[c, k])
            ok &= BB.nonempty(chosen) | ~active[c, k]
            conf_bd.append(chosen)
            free &= ~chosen
    conf_bd = jnp.stack(conf_bd).reshape(U.MAX_CLAUSES, K, -1)
    return anchor_xy, direction, active, v_target, conf_region, anchor_bd, conf_bd, ok


def _answer_counts(rng, spec: U.Spec, form, is_cmp, m, F, O, union, budget):
    """Targets and extra look-alikes per clause for a balanced, leak-free answer.

    F, O: int32 [2] free cells inside / outside each V_target (after anchors and mandatory
    confusers); union: free cells in either V_target; budget: objects left.
    Returns (count int32 [2], extra int32 [2], answer_yes bool []).
    """
    pure = spec.variant == "pure"
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


def _cmp_bow_extras(want_more, count, room, budget):
    """D_pure CMP: extra look-alikes that make the look-alike comparison a coin flip.

    Bag-of-words compares count_c + m + extra_c; a fair coin picks which way that comparison
    should go and the deficit is filled with look-alikes outside that clause's V_target (room:
    int32 [2] free cells there), when the room and budget allow. want_more: bool [], the coin.
    Returns extra int32 [2].
    """
    need0 = jnp.where(want_more & (count[0] <= count[1]), count[1] - count[0] + 1, 0)
    need1 = jnp.where(~want_more & (count[0] > count[1]), count[0] - count[1], 0)
    e0 = jnp.where((need0 <= room[0]) & (need0 <= budget), need0, 0)
    e1 = jnp.where((need1 <= room[1]) & (need1 <= budget), need1, 0)
    return jnp.stack([e0, e1]).astype(jnp.int32)


def _place(rng, spec: U.Spec, v_target, free, count, extra, cmp_relational, clause_on, budget):
    """Targets, extra look-alikes and distractors, drawn uniformly from their regions.

    Phases in this order, each taking cells from what the earlier ones left free: targets of
    clause 0 (cells outside clause 1's V_target first, so clause 1 keeps room: a uniform subset
    of V_0 \\ V_1 if the count fits there, else all of it plus a uniform subset of V_0 ∩ V_1),
    targets of clause 1, D_pure extra look-alikes of clause 0 and of clause 1 (outside their
    V_target; for relational CMP the count set by ``_cmp_bow_extras`` once the targets are
    placed), then distractors until the scene holds N objects. The two steps of clause 0 see
    disjoint cells, so they share one random word per cell. A loop, not six unrolled
    selections: XLA would inline each unrolled selection into every later one and recompute it.
    v_target: uint32 [2, W]; free: uint32 [W]; count, extra: int32 [2].
    Returns (targets [2, W], extras [2, W], distractors [W]).
    """
    C, N = spec.n_cells, spec.n_objects
    full = jnp.asarray(BB.full(C))
    words = rng.stream(5 * C)  # per output slot, one word per cell
    want_more = rng.uniform() < 0.5
    pure = spec.variant == "pure"
    slot = jnp.asarray([0, 0, 1, 2, 3, 4])  # step -> output slot and random words

    def step(j, state):
        free, placed, extra = state
        if pure:  # the CMP bag-of-words extras, decided when the extras of clause 0 start
            room = jnp.stack([BB.count(~v_target[c] & free) for c in range(U.MAX_CLAUSES)])
            bow = _cmp_bow_extras(want_more, count, room, budget - count[0] - count[1])
            extra = jnp.where((j == 3) & cmp_relational, bow, extra)
        outside = [jnp.where(clause_on[c], ~v_target[c] & free, 0) for c in range(2)]
        regions = jnp.stack([v_target[0] & ~v_target[1] & free, v_target[0] & v_target[1] & free,
                             v_target[1] & free, *outside, free])
        wants = jnp.stack([count[0], count[0] - BB.count(placed[0]), count[1], extra[0],
                           extra[1], N - BB.count(full & ~free)])
        chosen = BB.choose(words(slot[j] * C + jnp.arange(C)), regions[j], wants[j], C)
        return free & ~chosen, placed.at[slot[j]].set(placed[slot[j]] | chosen), extra

    placed = jnp.zeros((5,) + free.shape, jnp.uint32)
    _, placed, _ = jax.lax.fori_loop(0, 6, step, (free, placed, extra))
    return placed[:2], placed[2:4], placed[4]


MAX_NAMED = U.MAX_CLAUSES * (1 + U.MAX_ANCHORS_PER_CLAUSE)  # targets + anchors a question names


def _draw_keys(rng, n_keys):
    """The first MAX_NAMED keys of a uniformly random ordering of ``n_keys`` (4 or 16) keys.

    Sequential draws without replacement from a 16-bit board of unused keys. Returns int32
    [MAX_NAMED]; entries past ``n_keys`` are meaningless (no question names that many).
    """
    words = rng.stream(MAX_NAMED)

    def step(t, state):  # a loop, not unrolled: XLA would recompute the chain for every key
        unused, keys = state
        avail = jax.lax.population_count(unused).astype(jnp.int32)
        k = BB.nth_in_word(unused, ((words(t) >> 8).astype(jnp.int32) * avail) >> 24, 16)
        return unused & ~jnp.left_shift(jnp.uint32(1), k.astype(jnp.uint32)), keys.at[t].set(k)

    return jax.lax.fori_loop(0, MAX_NAMED, step,
                             (_key_space(n_keys), jnp.zeros(MAX_NAMED, jnp.int32)))[1]


def _key_space(n_keys):
    """16-bit board of the attribute keys of a question type: 16 (colour x shape) or 4."""
    return jnp.where(n_keys == 16, jnp.uint32(0xFFFF), jnp.uint32(0xF))


def _key_attrs(k, is_co, is_so):
    """(colour, shape) of attribute key k; -1 where the question type does not name it."""
    color = jnp.where(is_so, -1, jnp.where(is_co, k, k // 4))
    shape = jnp.where(is_co, -1, jnp.where(is_so, k, k % 4))
    return color, shape


def _or(boards):
    out = boards[0]
    for b in boards[1:]:
        out = out | b
    return out


def draw(key, spec: U.Spec, bucket) -> dict:
    """One attempt at a sample as bitboards and scalars (``valid`` False if no geometry fitted)."""
    S, C, N = spec.grid_size, spec.n_cells, spec.n_objects
    K, NC = U.MAX_ANCHORS_PER_CLAUSE, U.MAX_CLAUSES
    full = jnp.asarray(BB.full(C))
    bucket = jnp.asarray(bucket, jnp.int32)
    of_bucket = lambda table: take(table, bucket)  # noqa: E731
    qtype, form = of_bucket(U.BUCKET_QTYPE), of_bucket(U.BUCKET_FORM)
    n_clauses, m = of_bucket(U.BUCKET_N_CLAUSES), of_bucket(U.BUCKET_ANCHORS_PER_CLAUSE)
    is_cmp = qtype == U.QTYPES.index("CMP")
    is_co, is_so = qtype == U.QTYPES.index("CO"), qtype == U.QTYPES.index("SO")
    pure = spec.variant == "pure"

    rng = Bits.from_key_data(key)

    # 1. Attribute keys (colour x shape for A/M/CMP, colour for CO, shape for SO): slots 0/1 =
    # clause targets, then the anchors; distractors take the keys no slot names.
    keys = _draw_keys(rng, jnp.where(is_co | is_so, 4, 16))

    attrs = functools.partial(_key_attrs, is_co=is_co, is_so=is_so)

    clause_ids = jnp.arange(NC)
    anchor_slot = n_clauses + clause_ids[:, None] * m + jnp.arange(K)[None, :]  # [2, K]
    target_color, target_shape = attrs(keys[:NC])
    anchor_color, anchor_shape = attrs(take(keys, jnp.minimum(anchor_slot, MAX_NAMED - 1)))

    # 2. Geometry (the attempt is invalid, and re-drawn, when its regions have no free cells).
    (anchor_xy, direction, active, v_target, conf_region, anchor_bd, conf_bd,
     valid) = _geometry(rng, n_clauses, m, S)
    anchor_color = jnp.where(active, anchor_color, -1)
    anchor_shape = jnp.where(active, anchor_shape, -1)
    clause_on = clause_ids < n_clauses
    target_color = jnp.where(clause_on, target_color, -1)
    target_shape = jnp.where(clause_on, target_shape, -1)

    anchors = _or([anchor_bd[c, k] for c in range(NC) for k in range(K)])
    conf = [_or([conf_bd[c, k] for k in range(K)]) if pure else jnp.zeros_like(full)
            for c in range(NC)]
    free = full & ~anchors & ~conf[0] & ~conf[1]
    n_mandatory = jnp.sum(active) * (2 if pure else 1)
    budget = N - n_mandatory

    # 3-4. Targets and extra look-alikes.
    F = jnp.stack([BB.count(v_target[c] & free) for c in range(NC)])
    O = jnp.stack([BB.count(~v_target[c] & free) for c in range(NC)])
    union = BB.count((v_target[0] | v_target[1]) & free)
    count, extra, answer_yes = _answer_counts(rng, spec, form, is_cmp, m, F, O, union, budget)
    # Counts the geometry cannot hold (randint_incl falls back to its lower bound on an empty
    # range, e.g. a CMP "yes" with clause 0's region already full) make the attempt invalid, so
    # it is re-drawn. Clause 0 takes cells of V_0 \ V_1 first, then eats into V_1.
    first_only = BB.count(v_target[0] & ~v_target[1] & free)
    valid &= (count[0] <= F[0]) & (count[1] <= F[1] - jnp.maximum(0, count[0] - first_only))
    targets, extras, distractors = _place(rng, spec, v_target, free, count, extra,
                                          is_cmp & (m > 0), clause_on, budget)
    conf = [conf[c] | extras[c] for c in range(NC)]

    word = rng.words((C,))  # per cell: distractor key (high bits), unnamed colour/shape (low)
    return dict(bucket=bucket, valid=valid, keys=keys, word=word, anchor_xy=anchor_xy,
                direction=direction, active=active, v_target=v_target, conf_region=conf_region,
                anchor_bd=anchor_bd, targets=targets, conf=jnp.stack(conf),
                distractors=distractors, count=count, answer_yes=answer_yes,
                anchor_color=anchor_color, anchor_shape=anchor_shape,
                target_color=target_color, target_shape=target_shape)


def fill_cells(d, spec: U.Spec) -> dict:
    """Per-cell role, clause, colour and shape of a drawn sample, expanded from its boards.

    ``draw``, ``fill_cells`` and ``expand`` are compiled as separate programs by ``sample_batch``:
    fused, XLA inlines each stage's per-sample chains into every cell of the next stage's
    [C]-wide outputs and recomputes them per cell.
    """
    C, K, NC = spec.n_cells, U.MAX_ANCHORS_PER_CLAUSE, U.MAX_CLAUSES
    bucket, keys, word = d["bucket"], d["keys"], d["word"]
    targets, conf, anchor_bd = d["targets"], d["conf"], d["anchor_bd"]
    target_color, target_shape = d["target_color"], d["target_shape"]
    anchor_color, anchor_shape = d["anchor_color"], d["anchor_shape"]
    of_bucket = lambda table: take(table, bucket)  # noqa: E731
    qtype, n_clauses, m = (of_bucket(U.BUCKET_QTYPE), of_bucket(U.BUCKET_N_CLAUSES),
                           of_bucket(U.BUCKET_ANCHORS_PER_CLAUSE))
    is_co, is_so = qtype == U.QTYPES.index("CO"), qtype == U.QTYPES.index("SO")
    n_keys = jnp.where(is_co | is_so, 4, 16)
    n_named = n_clauses * (1 + m)
    attrs = functools.partial(_key_attrs, is_co=is_co, is_so=is_so)
    distractors = d["distractors"]
    anchors = _or([anchor_bd[c, k] for c in range(NC) for k in range(K)])
    occupied = anchors | targets[0] | targets[1] | conf[0] | conf[1] | distractors
    # Invariants of the construction (``draw`` already rejects counts that do not fit);
    # checked again on the stored boards, so that a broken invariant shows up in ``valid``
    # (verify's sampler_valid) instead of passing silently. Checking them in draw would make
    # XLA recompute every selection there.
    n_anchors = jnp.sum(d["active"], axis=1)
    valid = d["valid"] & (BB.count(occupied) == spec.n_objects)
    valid &= BB.count(targets[0]) + BB.count(targets[1]) == jnp.sum(d["count"])
    if spec.variant == "pure":
        valid &= (BB.count(conf[0]) >= n_anchors[0]) & (BB.count(conf[1]) >= n_anchors[1])

    # Cells: role, clause, colour and shape.
    mask = lambda board: BB.to_mask(board, C)  # noqa: E731
    cell_role = jnp.where(mask(distractors), U.DISTRACTOR, U.EMPTY)
    cell_clause = jnp.full(C, -1, jnp.int32)
    named = _or([jnp.left_shift(jnp.uint32(1), keys[t].astype(jnp.uint32))
                 & jnp.where(t < n_named, jnp.uint32(0xFFFF), 0) for t in range(MAX_NAMED)])
    unnamed = _key_space(n_keys) & ~named
    n_free_keys = n_keys - n_named
    dist_key = BB.nth_in_word(unnamed, ((word >> 8).astype(jnp.int32) * n_free_keys) >> 24, 16)
    cell_c, cell_s = attrs(dist_key)
    for c in range(NC):
        for role, board in ((U.CONFUSER, conf[c]), (U.TARGET, targets[c])):
            at = mask(board)
            cell_role = jnp.where(at, role, cell_role)
            cell_clause = jnp.where(at, c, cell_clause)
            cell_c = jnp.where(at, target_color[c], cell_c)
            cell_s = jnp.where(at, target_shape[c], cell_s)
        for k in range(K):
            at = mask(anchor_bd[c, k])
            cell_role = jnp.where(at, U.ANCHOR, cell_role)
            cell_clause = jnp.where(at, c, cell_clause)
            cell_c = jnp.where(at, anchor_color[c, k], cell_c)
            cell_s = jnp.where(at, anchor_shape[c, k], cell_s)
    is_occ = mask(occupied)
    free_c, free_s = (word & 3).astype(jnp.int32), ((word >> 2) & 3).astype(jnp.int32)
    color = jnp.where(is_occ, jnp.where(cell_c < 0, free_c, cell_c), -1).astype(jnp.int32)
    shape = jnp.where(is_occ, jnp.where(cell_s < 0, free_s, cell_s), -1).astype(jnp.int32)

    return dict(d, valid=valid, color=color, shape=shape, cell_role=cell_role,
                cell_clause=cell_clause,
                occupied=occupied, anchors=anchors)


def expand(d, spec: U.Spec) -> Scene:
    """The Scene of a sample from ``fill_cells``: object list, text and region masks.

    The object list holds ``spec.n_objects`` objects, or ``d["n_objects"]`` (int32 []) when
    present (scenes rebuilt from dataset files may hold fewer).
    """
    S, C = spec.grid_size, spec.n_cells
    N = d.get("n_objects", spec.n_objects)
    NC = U.MAX_CLAUSES
    full = jnp.asarray(BB.full(C))
    bucket, active, targets, conf, count = (d["bucket"], d["active"], d["targets"], d["conf"],
                                            d["count"])
    color, shape, cell_role, cell_clause = d["color"], d["shape"], d["cell_role"], d["cell_clause"]
    occupied, anchors, direction = d["occupied"], d["anchors"], d["direction"]
    target_color, target_shape = d["target_color"], d["target_shape"]
    anchor_color, anchor_shape = d["anchor_color"], d["anchor_shape"]
    of_bucket = lambda table: take(table, bucket)  # noqa: E731
    mask = lambda board: BB.to_mask(board, C)  # noqa: E731

    # Object list: the occupied cells in row-major order, then the empty ones as padding.
    empty = full & ~occupied
    rank = jnp.arange(C)  # one vectorised n-th-cell search, not C stacked scalar ones
    order = jnp.where(rank < N, BB.nth(occupied, rank), BB.nth(empty, rank - N))
    obj_valid = jnp.arange(C) < N
    gather = lambda a: take(a, order)  # noqa: E731
    obj_xy = jnp.stack([order % S, order // S], -1)
    obj_box = jnp.concatenate([(obj_xy.astype(jnp.float32) + 0.5) / S,
                               jnp.full((C, 2), 1.0 / S, jnp.float32)], -1)
    obj_box = jnp.where(obj_valid[:, None], obj_box, 0.0)

    tokens, token_role, token_anchor, n_tokens = build_tokens(
        bucket, target_color, target_shape, anchor_color, anchor_shape, direction)

    is_yesno = of_bucket(U.BUCKET_IS_YESNO)
    answer = jnp.where(is_yesno, d["answer_yes"].astype(jnp.int32), count[0])
    n_lookalike = jnp.stack([BB.count(targets[c] | conf[c]) for c in range(NC)])
    grid = lambda a: a.reshape(a.shape[:-1] + (S, S))  # noqa: E731
    return Scene(
        bucket=bucket, depth=of_bucket(U.BUCKET_DEPTH), qtype=of_bucket(U.BUCKET_QTYPE),
        form=of_bucket(U.BUCKET_FORM), valid=d["valid"],
        color=grid(color), shape=grid(shape), role=grid(cell_role), clause=grid(cell_clause),
        obj_valid=obj_valid, obj_xy=obj_xy.astype(jnp.int32),
        obj_color=jnp.where(obj_valid, gather(color), -1),
        obj_shape=jnp.where(obj_valid, gather(shape), -1),
        obj_role=jnp.where(obj_valid, gather(cell_role), U.EMPTY), obj_box=obj_box,
        target_color=target_color.astype(jnp.int32), target_shape=target_shape.astype(jnp.int32),
        anchor_active=active, anchor_color=anchor_color.astype(jnp.int32),
        anchor_shape=anchor_shape.astype(jnp.int32),
        anchor_xy=jnp.where(active[..., None], d["anchor_xy"], 0),
        direction=jnp.where(active, direction, 0),
        tokens=tokens, token_role=token_role, token_anchor=token_anchor, n_tokens=n_tokens,
        is_yesno=is_yesno, answer=answer.astype(jnp.int32), count=count,
        n_lookalike=n_lookalike.astype(jnp.int32),
        gt_cells=grid(mask(anchors | targets[0] | targets[1])),
        gt_tokens=token_role > U.FUNCTION,
        v_target=grid(mask(d["v_target"])), confuser_region=grid(mask(d["conf_region"])),
    )


MAX_ATTEMPTS = 64  # a sample whose 64 attempts all fail means the spec cannot be generated


def attempt_key(key, attempt):
    return jax.random.fold_in(key, attempt)


def sample(key, spec: U.Spec, bucket=None) -> Scene:
    """Draw one GridVQA-X sample of bucket ``bucket`` (int32 [], index into ``BUCKETS``).

    Pure in (key, bucket); ``spec`` is static. With ``bucket=None`` the bucket is drawn
    uniformly from ``spec.buckets`` with the key (datasets instead cycle through the buckets,
    see ``bucket_ids``). The sample is the first valid attempt ``a = 0, 1, ...`` of the
    construction in the module docstring, attempt a drawing its random words from
    ``fold_in(key, a)``. ``sample_batch`` gives the same samples faster by re-drawing only the
    failed lanes.
    """
    if bucket is None:
        table = jnp.asarray(spec.buckets, jnp.int32)
        bucket = table[jax.random.randint(jax.random.fold_in(key, 0xFFFFFFFF), (), 0,
                                                len(spec.buckets))]
    first = draw(attempt_key(key, 0), spec, bucket)

    def retry(state):
        attempt, _ = state
        return attempt + 1, draw(attempt_key(key, attempt + 1), spec, bucket)

    _, out = jax.lax.while_loop(
        lambda st: ~st[1]["valid"] & (st[0] < MAX_ATTEMPTS - 1), retry, (jnp.int32(0), first))
    return expand(fill_cells(out, spec), spec)
