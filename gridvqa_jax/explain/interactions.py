"""Pairwise Shapley interaction index (SII) of a batched coalition game, exact and Monte Carlo.

The game is ``value_fn(masks: bool[K, n_players]) -> float[K]`` as in
``gridvqa_jax.explain.shapley``. The SII (Grabisch & Roubens 1999) of players ``i != j``::

    Phi[i, j] = sum_{S ⊆ N \\ {i,j}} |S|! (n-|S|-2)! / (n-1)!  Δ_ij(S),
    Δ_ij(S) = v(S ∪ {i,j}) - v(S ∪ {i}) - v(S ∪ {j}) + v(S).

MultiSHAP (Wang & Wang 2025) explains a vision-language model by the matrix ``Phi[a, b]``
between a set A of image players (patches / grid cells) and a set B of text players (tokens);
its visual map is the sum over tokens, its textual map the sum over cells.

The weights sum to one over ``S ⊆ N\\{i,j}``, and the number of coalitions of size s times the
weight is ``C(n-2, s) s!(n-s-2)!/(n-1)! = 1/(n-1)``: under the SII weight the size of S is
uniform on ``{0, ..., n-2}`` and S is a uniform subset of that size. ``sii_matrix`` builds on
this to share each sampled coalition across every pair.
"""

from __future__ import annotations

import functools
import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from gridvqa_jax.explain.shapley import (ValueFn, _check_players, _time_per_call,
                                         all_coalition_values, evaluate_coalitions)


def _groups(n_players: int, groups_a, groups_b) -> tuple[np.ndarray, np.ndarray]:
    a = np.arange(n_players) if groups_a is None else np.asarray(groups_a, dtype=np.int64)
    b = np.arange(n_players) if groups_b is None else np.asarray(groups_b, dtype=np.int64)
    for name, g in (("groups_a", a), ("groups_b", b)):
        if g.ndim != 1 or g.size == 0:
            raise ValueError(f"{name} must be a non-empty 1-D sequence of player indices")
        if g.min() < 0 or g.max() >= n_players:
            raise ValueError(f"{name} holds player indices outside [0, {n_players}): {g.tolist()}")
        if len(set(g.tolist())) != g.size:
            raise ValueError(f"{name} repeats a player: {g.tolist()}")
    return a, b


@functools.partial(jax.jit, static_argnames=("value_fn", "n_players", "groups_a", "groups_b",
                                             "chunk"))
def _exact_sii(value_fn, n_players, groups_a, groups_b, chunk):
    n = n_players
    a, b = np.asarray(groups_a), np.asarray(groups_b)
    v = all_coalition_values(value_fn, n, chunk)
    codes = jnp.arange(2 ** n, dtype=jnp.int32)
    size = jax.lax.population_count(codes)
    weight = np.array([math.factorial(s) * math.factorial(n - s - 2) / math.factorial(n - 1)
                       if s <= n - 2 else 0.0 for s in range(n + 1)])
    w = jnp.asarray(weight, v.dtype)[size][None, None, :]
    bi = jnp.asarray(1 << a, jnp.int32)[:, None, None]  # [A, 1, 1]
    bj = jnp.asarray(1 << b, jnp.int32)[None, :, None]  # [1, B, 1]
    c = codes[None, None, :]
    outside = ((c & bi) == 0) & ((c & bj) == 0) & (bi != bj)
    delta = v[c | bi | bj] - v[c | bi] - v[c | bj] + v[c]  # [A, B, 2^n]
    return jnp.sum(jnp.where(outside, w * delta, 0), axis=-1)


def exact_sii(value_fn: ValueFn, n_players: int, groups_a: Sequence[int] | None = None,
              groups_b: Sequence[int] | None = None, *, chunk: int = 1024) -> jax.Array:
    """Exact SII matrix ``Phi [|A|, |B|]`` between players ``groups_a`` and ``groups_b``.

    By enumeration of all ``2^n_players`` coalitions (``n_players <= 14``). ``None`` means all
    players, so ``exact_sii(v, n)`` is the full ``[n, n]`` matrix; entries with ``a == b``
    (not an interaction) are 0. Formula and reference in the module docstring.
    """
    _check_players(n_players, 2)
    a, b = _groups(n_players, groups_a, groups_b)
    return _exact_sii(value_fn, n_players, tuple(a.tolist()), tuple(b.tolist()), chunk)


def sii_size_distribution(n_players: int) -> np.ndarray:
    """Proposal ``q(s)`` over the size ``s = 0..n-2`` of the coalitions ``sii_matrix`` samples.

    ``q(s) ∝ 1 / sqrt((n-s)(n-s-1))``. A uniform coalition of size s leaves a given pair outside
    it with probability ``pi(s) = (n-s)(n-s-1) / (n(n-1))``, and the SII wants size s with
    probability ``p(s) = 1/(n-1)``; the importance-weighted estimator's variance for one pair,
    ``sum_s p(s)^2 Var(Δ | s) / (q(s) pi(s))`` at a fixed cost per sample, is smallest for
    ``q ∝ p / sqrt(pi)`` when ``Var(Δ | s)`` does not depend on s (Lagrange / Cauchy-Schwarz).
    """
    n = n_players
    s = np.arange(n - 1, dtype=np.float64)
    q = 1.0 / np.sqrt((n - s) * (n - s - 1))
    return q / q.sum()


def sii_evaluations(n_a: int, n_b: int, n_samples: int) -> int:
    """Coalition evaluations made by ``sii_matrix``: ``n_samples * (1 + |A| + |B| + |A||B|)``."""
    return n_samples * (1 + n_a + n_b + n_a * n_b)


@functools.partial(jax.jit, static_argnames=("value_fn", "n_players", "groups_a", "groups_b",
                                             "n_samples", "chunk"))
def _sii_matrix(value_fn, n_players, groups_a, groups_b, key, n_samples, chunk):
    n = n_players
    a, b = np.asarray(groups_a), np.asarray(groups_b)
    na, nb = a.size, b.size
    q = sii_size_distribution(n)
    s_range = np.arange(n - 1)
    pi = (n - s_range) * (n - s_range - 1) / (n * (n - 1))
    weight = (1.0 / (n - 1)) / (q * pi)  # p(s) / (q(s) pi(s)), importance weight of size s

    k_size, k_perm = jax.random.split(key)
    size = jax.random.choice(k_size, n - 1, (n_samples,), p=jnp.asarray(q, jnp.float32))
    perms = jax.vmap(lambda k: jax.random.permutation(k, n))(jax.random.split(k_perm, n_samples))
    coalition = jnp.argsort(perms, axis=1) < size[:, None]  # [M, n], uniform subset of size s

    # Slot k of a sample adds players add1[k], add2[k] to S (index n = nobody):
    # slot 0: S; 1..|A|: S ∪ {a}; then S ∪ {b}; then S ∪ {a, b} in row-major (a, b) order.
    none = np.full(1, n)
    add1 = np.concatenate([none, a, np.full(nb, n), np.repeat(a, nb)])
    add2 = np.concatenate([none, np.full(na, n), b, np.tile(b, na)])
    add1, add2 = jnp.asarray(add1, jnp.int32), jnp.asarray(add2, jnp.int32)
    per_sample = add1.shape[0]

    def row_masks(ids):
        m, k = ids // per_sample, ids % per_sample
        extra = (jax.nn.one_hot(add1[k], n, dtype=jnp.bool_)
                 | jax.nn.one_hot(add2[k], n, dtype=jnp.bool_))
        return coalition[m] | extra

    vals = evaluate_coalitions(value_fn, row_masks, n_samples * per_sample, chunk)
    vals = vals.reshape(n_samples, per_sample)
    v0 = vals[:, 0][:, None, None]
    va = vals[:, 1:1 + na][:, :, None]
    vb = vals[:, 1 + na:1 + na + nb][:, None, :]
    vab = vals[:, 1 + na + nb:].reshape(n_samples, na, nb)
    delta = vab - va - vb + v0
    outside = (~coalition[:, a][:, :, None]) & (~coalition[:, b][:, None, :])
    outside = outside & jnp.asarray(a[:, None] != b[None, :])[None]
    w = jnp.asarray(weight, vals.dtype)[size][:, None, None]
    return jnp.mean(jnp.where(outside, w * delta, 0), axis=0)


def sii_matrix(value_fn: ValueFn, n_players: int, groups_a: Sequence[int],
               groups_b: Sequence[int], key: jax.Array, n_samples: int, *,
               chunk: int = 256) -> jax.Array:
    """Monte Carlo SII matrix ``Phi [|A|, |B|]``, each sampled coalition shared by all pairs.

    Each of the ``n_samples`` samples draws a size ``s`` from ``q`` (``sii_size_distribution``)
    and a uniform coalition ``S ⊆ N`` of that size, then evaluates ``v(S)``, ``v(S ∪ {a})`` for
    every a in A, ``v(S ∪ {b})`` for every b in B and ``v(S ∪ {a, b})`` for every pair: exactly
    ``1 + |A| + |B| + |A||B|`` evaluations per sample (``sii_evaluations``), whatever S is (rows
    that add a player already in S are evaluated and unused: the price of static shapes). The
    one coalition serves every pair ``(a, b)`` with ``a, b ∉ S``::

        Phi_hat[a, b] = 1/M sum_m 1[a, b ∉ S_m] * w(|S_m|) * Δ_ab(S_m),
        w(s) = p(s) / (q(s) pi(s)),  p(s) = 1/(n-1),  pi(s) = (n-s)(n-s-1)/(n(n-1)).

    Unbiased: ``P(|S| = s, a, b ∉ S) = q(s) pi(s)``, and given that event S is a uniform
    s-subset of ``N\\{a,b}``, so the expectation is ``sum_s p(s) E[Δ_ab | s] = Phi[a, b]``. The
    sharing saves the three lower-order terms of every pair (a separate stream per pair pays
    4 evaluations per pair per sample; this pays ``1 + 1/|B| + 1/|A|``).

    ``groups_a``/``groups_b``: player indices (concrete, e.g. cells and tokens); a pair with
    ``a == b`` gets 0. The result depends only on ``key`` and ``n_samples`` (not on ``chunk``).
    Reference: MultiSHAP (Wang & Wang 2025), SII (Grabisch & Roubens 1999).
    """
    _check_players(n_players, 2)
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    a, b = _groups(n_players, groups_a, groups_b)
    return _sii_matrix(value_fn, n_players, tuple(a.tolist()), tuple(b.tolist()), key,
                       n_samples, chunk)


def sii_evals_per_second(value_fn: ValueFn, n_players: int, groups_a: Sequence[int],
                         groups_b: Sequence[int], budget: int, *, key: jax.Array | None = None,
                         chunk: int = 256, repeats: int = 3) -> float:
    """Coalition evaluations per second of ``sii_matrix`` on ``value_fn``.

    ``budget`` (coalition evaluations) is rounded to whole samples (at least one); the rate
    counts ``sii_evaluations``. Best of ``repeats`` timed calls after a compiling call.
    """
    key = jax.random.key(0) if key is None else key
    na, nb = len(groups_a), len(groups_b)
    n_samples = max(1, round(budget / sii_evaluations(na, nb, 1)))
    seconds = _time_per_call(
        lambda: sii_matrix(value_fn, n_players, groups_a, groups_b, key, n_samples, chunk=chunk),
        repeats)
    return sii_evaluations(na, nb, n_samples) / seconds
