"""First-order Shapley values of a batched coalition game, exact and by permutation sampling.

A game is a batched value function ``value_fn(masks: bool[K, n_players]) -> float[K]``: row k
of ``masks`` is a coalition (True = player present), and the function is always called with a
whole batch of coalitions. The estimators are model-agnostic pure functions of a PRNG key,
jit-compiled once per shape (``value_fn`` is a static argument: pass the same function object
to reuse the compiled code). Coalitions are evaluated in fixed-size chunks of ``chunk`` rows
through ``lax.map``, so the model's memory is that of one chunk whatever the budget; the
estimators keep one int row of ranks per sampled permutation, one bool row per sampled
coalition and one float per evaluated coalition. They nest inside a caller's ``jit`` and
``vmap`` (a ``value_fn`` closing over one sample's traced inputs, vmapped over samples).

Shapley value (Shapley 1953), with ``n = n_players`` and ``N = {0, ..., n-1}``::

    phi_i = sum_{S ⊆ N \\ {i}} |S|! (n - |S| - 1)! / n! * (v(S ∪ {i}) - v(S))

MM-SHAP modality shares (Parcalabescu & Frank, ACL 2023) are in ``modality_shares``; the
pairwise Shapley interaction index used by MultiSHAP is in ``gridvqa_jax.explain.interactions``.
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from mmx_base.draws import stream_uniforms
from mmx_base.timing import best_time

ValueFn = Callable[[jax.Array], jax.Array]

MAX_EXACT_PLAYERS = 14  # 2^14 = 16,384 coalitions; one more player doubles the cost


def evaluate_coalitions(value_fn: ValueFn, row_masks: Callable[[jax.Array], jax.Array],
                        n_rows: int, chunk: int) -> jax.Array:
    """Evaluate ``n_rows`` coalitions, ``chunk`` at a time: ``float[n_rows]``.

    ``row_masks(row_ids: int32[c]) -> bool[c, n_players]`` builds the coalitions of a chunk
    from their row numbers, so only one chunk of masks and of model activations exists at a
    time. Rows are padded up to a multiple of ``chunk`` with copies of row 0 (evaluated, then
    dropped). Row r's value does not depend on ``chunk`` when ``value_fn`` treats rows
    independently, so results are the same for any chunk size.
    """
    if n_rows < 1:
        raise ValueError(f"nothing to evaluate (n_rows={n_rows})")
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    chunk = min(chunk, n_rows)
    n_chunks = -(-n_rows // chunk)
    ids = jnp.arange(n_chunks * chunk, dtype=jnp.int32)
    ids = jnp.where(ids < n_rows, ids, 0).reshape(n_chunks, chunk)

    def one_chunk(row_ids):
        out = value_fn(row_masks(row_ids))
        if out.shape != (chunk,):
            raise ValueError(f"value_fn must map bool[K, n_players] to float[K]; for K={chunk} "
                             f"it returned shape {out.shape}")
        return out

    return jax.lax.map(one_chunk, ids).reshape(-1)[:n_rows]


def _bits(codes: jax.Array, n_players: int) -> jax.Array:
    """bool[..., n]: bit i of each integer code (player i present)."""
    return (codes[..., None] >> jnp.arange(n_players, dtype=codes.dtype)[None, :]) & 1 == 1


def _check_players(n_players: int, minimum: int = 1) -> None:
    if not isinstance(n_players, (int, np.integer)) or n_players < minimum:
        raise ValueError(f"n_players must be an integer >= {minimum}, got {n_players!r}")


def all_coalition_values(value_fn: ValueFn, n_players: int, chunk: int = 1024) -> jax.Array:
    """``float[2^n]``: v of every coalition, indexed by its bit code (bit i = player i present).

    Raises ``ValueError`` above ``MAX_EXACT_PLAYERS`` players.
    """
    _check_players(n_players)
    if n_players > MAX_EXACT_PLAYERS:
        raise ValueError(f"exact enumeration needs 2^n_players coalitions; n_players={n_players} "
                         f"exceeds the limit of {MAX_EXACT_PLAYERS} (2^{MAX_EXACT_PLAYERS} = "
                         f"{2 ** MAX_EXACT_PLAYERS} evaluations): use permutation_shapley / "
                         "sii_matrix instead")
    return evaluate_coalitions(value_fn, lambda ids: _bits(ids, n_players), 2 ** n_players, chunk)


@functools.partial(jax.jit, static_argnames=("value_fn", "n_players", "chunk"))
def exact_shapley(value_fn: ValueFn, n_players: int, *, chunk: int = 1024) -> jax.Array:
    """Exact Shapley values ``phi [n_players]`` by enumerating all ``2^n`` coalitions.

    ``phi_i = sum_{S ⊆ N\\{i}} |S|!(n-|S|-1)!/n! (v(S ∪ {i}) - v(S))`` (Shapley 1953).
    Costs ``2^n_players`` evaluations; ``n_players <= 14`` (``ValueError`` otherwise).
    """
    v = all_coalition_values(value_fn, n_players, chunk)
    n = n_players
    codes = jnp.arange(2 ** n, dtype=jnp.int32)
    size = jax.lax.population_count(codes)
    weight = np.array([math.factorial(s) * math.factorial(n - s - 1) / math.factorial(n)
                       if s < n else 0.0 for s in range(n + 1)])
    w = jnp.asarray(weight, v.dtype)[size]  # [2^n], weight of S = code when i is absent
    bit = (1 << jnp.arange(n, dtype=jnp.int32))[:, None]  # [n, 1]
    absent = (codes[None, :] & bit) == 0  # [n, 2^n]
    marginal = v[codes[None, :] | bit] - v[None, :]
    return jnp.sum(jnp.where(absent, w[None, :] * marginal, 0), axis=1)


def permutation_shapley_evaluations(n_players: int, n_permutations: int) -> int:
    """Coalition evaluations made by ``permutation_shapley``: ``n_permutations*(n-1) + 2``."""
    return n_permutations * (n_players - 1) + 2


# How ``permutation_shapley`` draws its orders; explainers that save their maps record it.
PERMUTATION_DRAWS = "order of the active players by stream_uniforms(key) per player; null last"


def active_ranks(x: jax.Array, active: jax.Array) -> jax.Array:
    """int [M, n]: row m ranks the active players by ``x[m]`` (uniforms, float [M, n] in
    [0, 1)), 0..n_active-1, and puts the others (``active`` bool [n] False) after them: a
    uniform order of the active players, used by the permutations here and by the SII's
    stratified subsets (``interactions``)."""
    return jnp.argsort(jnp.argsort(jnp.where(active[None, :], x, 2.0), axis=1), axis=1)


@functools.partial(jax.jit,
                   static_argnames=("value_fn", "n_players", "n_permutations", "antithetic",
                                    "chunk", "streams"))
def _permutation_shapley(value_fn, n_players, key, n_permutations, antithetic, chunk, active,
                         streams):
    n = n_players
    n_draw = n_permutations // 2 if antithetic else n_permutations
    side, index = (np.zeros(n, np.int64), np.arange(n)) if streams is None else streams
    x = stream_uniforms(key, n_draw, side, index)  # [P, n]
    n_active = jnp.sum(active)
    rank = active_ranks(x, active).astype(jnp.int32)  # rank[p, i]: player i's place in order p
    if antithetic:  # each order reversed among the active players
        rank = jnp.concatenate([rank, jnp.where(active[None, :], n_active - 1 - rank, rank)])

    def row_masks(ids):
        # row 0 = ∅, row 1 = N, row 2 + p*(n-1) + (k-1) = the first k players of order p
        r = jnp.maximum(ids - 2, 0)
        p, k = r // max(n - 1, 1), r % max(n - 1, 1) + 1
        masks = rank[p] < k[:, None]
        masks = jnp.where((ids == 0)[:, None], False, masks)
        return jnp.where((ids == 1)[:, None], True, masks) & active[None, :]

    vals = evaluate_coalitions(value_fn, row_masks,
                               permutation_shapley_evaluations(n, n_permutations), chunk)
    v_empty, v_full = vals[0], vals[1]
    prefix = jnp.concatenate([jnp.broadcast_to(v_empty, (n_permutations, 1)),
                              vals[2:].reshape(n_permutations, n - 1),
                              jnp.broadcast_to(v_full, (n_permutations, 1))], axis=1)  # [P, n+1]
    # a prefix that holds every active player is the full coalition: its evaluated row
    prefix = jnp.where(jnp.arange(n + 1)[None, :] >= n_active, v_full, prefix)
    contrib = (jnp.take_along_axis(prefix, rank + 1, axis=1)
               - jnp.take_along_axis(prefix, rank, axis=1))  # [P, n]
    return jnp.mean(contrib, axis=0)


def permutation_shapley(value_fn: ValueFn, n_players: int, key: jax.Array, n_permutations: int,
                        *, antithetic: bool = True, chunk: int = 256, active=None,
                        streams=None) -> jax.Array:
    """Monte Carlo Shapley values ``phi [n_players]`` by permutation sampling.

    For a uniformly random order ``pi`` of the players, player i's marginal contribution
    ``v(Pre_i ∪ {i}) - v(Pre_i)`` (``Pre_i`` = the players before i) has expectation ``phi_i``
    (Castro, Gómez & Tejada 2009); the estimate is its mean over ``n_permutations`` orders,
    unbiased. A permutation's ``n+1`` prefix coalitions give all n contributions, so each
    permutation satisfies efficiency exactly: ``sum_i phi_i = v(N) - v(∅)`` for any budget
    (with ``active``: ``v(active players) - v(∅)``).
    The empty and full coalitions are common to every permutation and evaluated once, so the
    cost is ``n_permutations * (n-1) + 2`` evaluations (``permutation_shapley_evaluations``).

    ``antithetic=True`` draws ``n_permutations/2`` orders and adds each one reversed (then
    ``n_permutations`` must be even): in the reversed order player i's predecessors are the
    complement of its predecessors in ``pi``, which cancels much of the variance (all of it
    when ``v`` is a quadratic function of an additive score, ``v(S) = g(sum_{i in S} w_i)``
    with ``g`` of degree <= 2). Still unbiased: each order on its own is uniform.

    ``active``: bool [n_players] (may be traced; default all), the players of the game; the
    others are null players, in no coalition, with ``phi = 0``. Order p ranks the active
    players by their uniforms, row p of ``mmx_base.draws.stream_uniforms(key, P, side,
    index)`` with ``streams = (side, index)`` (static tuples, int [n]; default: side 0, index
    j), so a player's draws depend on ``key`` and its stream alone: null players appended to
    a side, or a side grown in front of it, leave every other player's estimate unchanged,
    draw for draw (``PERMUTATION_DRAWS``). The result depends only on ``key``,
    ``n_permutations``, ``active`` and ``streams`` (not on ``chunk``). The orders are uniform
    up to float32 ties: two players share a uniform in about ``n^2 / 2^24`` of orders, and
    then the lower index goes first.
    """
    _check_players(n_players)
    n = n_players
    if n_permutations < 1 or (antithetic and n_permutations % 2):
        raise ValueError(f"n_permutations must be >= 1{' and even (antithetic pairs)' if antithetic else ''}, "
                         f"got {n_permutations}")
    active = jnp.ones(n, bool) if active is None else jnp.asarray(active, bool)
    if active.shape != (n,):
        raise ValueError(f"active must be bool [{n}], got shape {active.shape}")
    if streams is not None:
        streams = tuple(tuple(int(v) for v in np.asarray(s).reshape(-1)) for s in streams)
        if len(streams) != 2 or any(len(s) != n for s in streams):
            raise ValueError(f"streams must be (side, index), each int [{n}]")
    return _permutation_shapley(value_fn, n, key, n_permutations, antithetic, chunk, active,
                                streams)


def modality_shares(phi: jax.Array, is_text: jax.Array) -> tuple[jax.Array, jax.Array]:
    """MM-SHAP modality shares ``(t_shap, v_shap)`` over the trailing (player) axis.

    ``T-SHAP = sum_{i text} |phi_i| / sum_i |phi_i|`` and ``V-SHAP = 1 - T-SHAP``
    (Parcalabescu & Frank, "MM-SHAP", ACL 2023). ``phi``: ``float[..., n]``; ``is_text``:
    ``bool[..., n]`` (broadcast against ``phi``); results have shape ``phi.shape[:-1]``. A
    sample whose Shapley values are all zero has no defined share: NaN.
    """
    a = jnp.abs(phi)
    total = jnp.sum(a, axis=-1)
    text = jnp.sum(jnp.where(is_text, a, 0), axis=-1)
    t = jnp.where(total > 0, text / jnp.where(total > 0, total, 1), jnp.nan)
    return t, 1 - t


def shapley_evals_per_second(value_fn: ValueFn, n_players: int, budget: int, *,
                             key: jax.Array | None = None, chunk: int = 256,
                             repeats: int = 3) -> float:
    """Coalition evaluations per second of ``permutation_shapley`` (antithetic) on ``value_fn``.

    ``budget`` is the number of coalition evaluations to aim for; it is rounded to whole
    antithetic pairs of permutations (``permutation_shapley_evaluations`` gives the exact count,
    which is what the rate counts). Best of ``repeats`` timed calls after one compiling call,
    with ``block_until_ready``; a throughput probe, not a test.
    """
    _check_players(n_players, 2)
    key = jax.random.key(0) if key is None else key
    n_perm = max(2, 2 * round(budget / (n_players - 1) / 2))
    seconds = best_time(
        lambda: permutation_shapley(value_fn, n_players, key, n_perm, chunk=chunk), repeats)
    return permutation_shapley_evaluations(n_players, n_perm) / seconds
