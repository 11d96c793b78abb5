"""Shapley values and Shapley interaction indices against a brute force written here.

The references enumerate subsets with itertools and use math.factorial on plain Python floats
(float64), independent of the estimators' bit-code enumeration in JAX.
"""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gridvqa_jax.explain import interactions as IN
from gridvqa_jax.explain import shapley as SH


# ----------------------------------------------------------------------------- games
class TableGame:
    """v(S) = table[S] for a set function given as a dict frozenset -> float."""

    def __init__(self, n, fn):
        self.n = n
        self.subsets = [frozenset(c) for r in range(n + 1)
                        for c in itertools.combinations(range(n), r)]
        self.v = {s: float(fn(s)) for s in self.subsets}
        code = np.zeros(2 ** n, np.float32)
        for s, val in self.v.items():
            code[sum(1 << i for i in s)] = val
        table, powers = jnp.asarray(code), jnp.asarray(1 << np.arange(n), jnp.int32)

        def value_fn(masks):
            return table[jnp.sum(masks.astype(jnp.int32) * powers[None, :], axis=1)]

        self.value_fn = value_fn


def brute_shapley(g):
    n = g.n
    phi = np.zeros(n)
    for i in range(n):
        for s in g.subsets:
            if i not in s:
                w = math.factorial(len(s)) * math.factorial(n - len(s) - 1) / math.factorial(n)
                phi[i] += w * (g.v[s | {i}] - g.v[s])
    return phi


def brute_sii(g, i, j):
    n = g.n
    total = 0.0
    for s in g.subsets:
        if i not in s and j not in s:
            w = math.factorial(len(s)) * math.factorial(n - len(s) - 2) / math.factorial(n - 1)
            total += w * (g.v[s | {i, j}] - g.v[s | {i}] - g.v[s | {j}] + g.v[s])
    return total


def random_game(n, seed):
    rng = np.random.default_rng(seed)
    vals = rng.normal(size=2 ** n)
    index = {}
    return TableGame(n, lambda s: vals[index.setdefault(s, len(index))])


def additive_game(w):
    return TableGame(len(w), lambda s: sum(w[i] for i in s))


def pairwise_game(W):
    n = W.shape[0]
    return TableGame(n, lambda s: sum(W[i, j] for i in s for j in s if i < j))


def unanimity_game(n, T):
    return TableGame(n, lambda s: float(set(T) <= s))


# ----------------------------------------------------------------------------- exact
@pytest.mark.parametrize("n,seed", [(1, 0), (2, 1), (5, 2), (7, 3)])
def test_exact_shapley_random_game(n, seed):
    g = random_game(n, seed)
    np.testing.assert_allclose(SH.exact_shapley(g.value_fn, n), brute_shapley(g), atol=2e-6)


def test_exact_shapley_closed_forms():
    w = np.array([0.5, -1.0, 2.0, 0.0, 3.0])
    np.testing.assert_allclose(SH.exact_shapley(additive_game(w).value_fn, 5), w, atol=1e-6)
    rng = np.random.default_rng(0)
    W = np.triu(rng.normal(size=(6, 6)), 1)
    # pairwise game: each pair's weight splits equally between its two players
    np.testing.assert_allclose(SH.exact_shapley(pairwise_game(W).value_fn, 6),
                               (W.sum(0) + W.sum(1)) / 2, atol=1e-5)
    T = [1, 3, 4]
    expect = np.array([1 / 3 if i in T else 0.0 for i in range(6)])
    np.testing.assert_allclose(SH.exact_shapley(unanimity_game(6, T).value_fn, 6), expect,
                               atol=1e-6)


def test_exact_guard():
    with pytest.raises(ValueError, match="exceeds the limit of 14"):
        SH.exact_shapley(lambda m: jnp.zeros(m.shape[0]), 15)
    with pytest.raises(ValueError, match="exceeds the limit of 14"):
        IN.exact_sii(lambda m: jnp.zeros(m.shape[0]), 15)


def test_exact_sii_random_game_full_matrix():
    g = random_game(5, 7)
    got = np.asarray(IN.exact_sii(g.value_fn, 5))
    expect = np.array([[brute_sii(g, i, j) if i != j else 0.0 for j in range(5)]
                       for i in range(5)])
    np.testing.assert_allclose(got, expect, atol=2e-6)
    np.testing.assert_allclose(got, got.T, atol=1e-6)
    sub = IN.exact_sii(g.value_fn, 5, [4, 0], [2, 1, 3])
    np.testing.assert_allclose(sub, expect[np.ix_([4, 0], [2, 1, 3])], atol=2e-6)


def test_exact_sii_closed_forms():
    w = np.array([0.5, -1.0, 2.0, 1.0, 3.0])
    np.testing.assert_allclose(IN.exact_sii(additive_game(w).value_fn, 5), np.zeros((5, 5)),
                               atol=1e-6)
    rng = np.random.default_rng(1)
    W = np.triu(rng.normal(size=(6, 6)), 1)
    np.testing.assert_allclose(IN.exact_sii(pairwise_game(W).value_fn, 6), W + W.T, atol=1e-5)
    T = [0, 2, 3, 5]
    expect = np.array([[1 / 3 if (i in T and j in T and i != j) else 0.0 for j in range(7)]
                       for i in range(7)])
    np.testing.assert_allclose(IN.exact_sii(unanimity_game(7, T).value_fn, 7), expect, atol=1e-6)


# ----------------------------------------------------------------------------- permutations
def test_permutation_efficiency_per_permutation():
    g = random_game(6, 11)
    gap = g.v[frozenset(range(6))] - g.v[frozenset()]
    for anti, n_perm in ((True, 2), (False, 1), (False, 3)):
        for seed in range(3):
            phi = SH.permutation_shapley(g.value_fn, 6, jax.random.key(seed), n_perm,
                                         antithetic=anti)
            assert abs(float(jnp.sum(phi)) - gap) < 1e-5


def test_permutation_exact_on_additive_and_single_player():
    w = np.array([0.5, -1.0, 2.0, 1.0])
    phi = SH.permutation_shapley(additive_game(w).value_fn, 4, jax.random.key(0), 2)
    np.testing.assert_allclose(phi, w, atol=1e-6)
    g = random_game(1, 0)
    phi = SH.permutation_shapley(g.value_fn, 1, jax.random.key(0), 2)
    np.testing.assert_allclose(phi, [g.v[frozenset({0})] - g.v[frozenset()]], atol=1e-6)
    with pytest.raises(ValueError, match="even"):
        SH.permutation_shapley(g.value_fn, 1, jax.random.key(0), 3)


def _runs(g, n, n_perm, n_runs, antithetic, seed=0):
    keys = jax.random.split(jax.random.key(seed), n_runs)
    f = jax.vmap(lambda k: SH.permutation_shapley(g.value_fn, n, k, n_perm,
                                                  antithetic=antithetic))
    return np.asarray(f(keys), np.float64)


@pytest.mark.parametrize("antithetic", [True, False])
def test_permutation_unbiased(antithetic):
    n = 5
    g = random_game(n, 5)
    exact = brute_shapley(g)
    runs = _runs(g, n, 2, 4000, antithetic)
    se = runs.std(0, ddof=1) / np.sqrt(len(runs))
    assert np.all(np.abs(runs.mean(0) - exact) < 4.5 * se + 1e-5), (runs.mean(0), exact, se)


def test_permutation_converges():
    n = 8
    g = random_game(n, 6)
    exact = brute_shapley(g)
    err = {p: np.abs(_runs(g, n, p, 20, True) - exact).mean() for p in (8, 512)}
    # error ~ 1/sqrt(budget): a 64x budget should cut it ~8x; ask for 4x
    assert err[512] < err[8] / 4, err


def test_antithetic_reduces_variance():
    n = 8
    rng = np.random.default_rng(3)
    w = rng.uniform(0.5, 1.5, n)
    noise = rng.normal(size=2 ** n)
    index = {}
    # a convex function of an additive score plus a little unstructured noise
    g = TableGame(n, lambda s: sum(w[i] for i in s) ** 2
                  + 0.3 * noise[index.setdefault(s, len(index))])
    var_anti = _runs(g, n, 4, 400, True).var(0).mean()
    var_plain = _runs(g, n, 4, 400, False).var(0).mean()
    assert var_anti < 0.3 * var_plain, (var_anti, var_plain)


def test_permutation_null_players_padded_into_either_side_leave_the_others_estimates():
    """A game padded to its batch's size, as MultiSHAP's first-order values are: a null
    player appended to the cells' side (which moves every token's index by one) and one to
    the tokens'. Each real player's order is keyed by its side and its place in it, and the
    null players join no coalition, so every real player's value is the unpadded game's,
    draw for draw, and the null ones get 0."""
    n = 5
    g = random_game(n, 29)
    real = np.array([0, 1, 2, 4, 5])  # the padded game's players 3 and 6 are null
    active = np.isin(np.arange(n + 2), real)

    def padded(masks):  # a coalition holding a null player would be worth 100 more
        return g.value_fn(masks[:, real]) + 100.0 * jnp.any(masks[:, ~active], axis=1)

    for seed, P in ((0, 2), (1, 8)):
        key = jax.random.key(seed)
        want = np.asarray(SH.permutation_shapley(g.value_fn, n, key, P,
                                                 streams=((0, 0, 0, 1, 1), (0, 1, 2, 0, 1))))
        got = np.asarray(SH.permutation_shapley(
            padded, n + 2, key, P, active=active,
            streams=((0, 0, 0, 0, 1, 1, 1), (0, 1, 2, 3, 0, 1, 2))))
        assert np.abs(want - brute_shapley(g)).max() > 1e-3  # a Monte Carlo estimate
        np.testing.assert_allclose(got[real], want, rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(got[~active], 0.0)
    with pytest.raises(ValueError, match="active must be bool"):
        SH.permutation_shapley(padded, n + 2, key, 2, active=active[:-1])
    with pytest.raises(ValueError, match="streams"):
        SH.permutation_shapley(padded, n + 2, key, 2, streams=((0,) * 7, (0,) * 6))


@pytest.mark.parametrize("antithetic", [True, False])
def test_permutation_with_no_or_one_active_player(antithetic):
    """No active player: every value 0. One: it gets v({i}) - v(∅), the others 0, for any key
    (the prefixes past the last active player are the full coalition's value)."""
    n = 5
    g = random_game(n, 31)
    for seed in range(3):
        key = jax.random.key(seed)
        none = SH.permutation_shapley(g.value_fn, n, key, 4, antithetic=antithetic,
                                      active=np.zeros(n, bool))
        np.testing.assert_array_equal(none, 0.0)
        one = np.asarray(SH.permutation_shapley(g.value_fn, n, key, 4, antithetic=antithetic,
                                                active=np.arange(n) == 2))
        want = g.v[frozenset({2})] - g.v[frozenset()]
        np.testing.assert_allclose(one, np.where(np.arange(n) == 2, want, 0.0), atol=1e-6)


def test_chunk_size_does_not_change_results():
    n = 6
    g = random_game(n, 9)
    key = jax.random.key(4)
    # 6 permutations x 5 interior prefixes + 2 = 32 rows: chunk 7 pads the last chunk
    np.testing.assert_array_equal(SH.permutation_shapley(g.value_fn, n, key, 6, chunk=7),
                                  SH.permutation_shapley(g.value_fn, n, key, 6, chunk=256))
    np.testing.assert_array_equal(SH.exact_shapley(g.value_fn, n, chunk=5),
                                  SH.exact_shapley(g.value_fn, n))
    np.testing.assert_array_equal(
        IN.sii_matrix(g.value_fn, n, [0, 1], [2, 3, 4], key, 5, chunk=4),
        IN.sii_matrix(g.value_fn, n, [0, 1], [2, 3, 4], key, 5, chunk=1000))


def test_compiles_once_per_shape():
    traces = []
    table = jnp.asarray(np.random.default_rng(0).normal(size=64), jnp.float32)

    def value_fn(masks):
        traces.append(masks.shape)
        return table[jnp.sum(masks.astype(jnp.int32) * (1 << jnp.arange(6))[None, :], axis=1)]

    for seed in range(3):
        SH.permutation_shapley(value_fn, 6, jax.random.key(seed), 8, chunk=16)
    assert len(traces) == 1
    for seed in range(3):
        IN.sii_matrix(value_fn, 6, [0, 1], [2, 3], jax.random.key(seed), 4, chunk=16)
    assert len(traces) == 2
    SH.permutation_shapley(value_fn, 6, jax.random.key(0), 16, chunk=16)  # new budget: new shape
    assert len(traces) == 3


def test_nests_in_jit_and_vmap():
    """A value_fn closing over one sample's traced inputs, vmapped over samples."""
    n = 5
    weights = jnp.asarray(np.random.default_rng(2).normal(size=(3, n)), jnp.float32)

    def explain(w):
        def value_fn(masks):  # a non-additive game built from traced w
            return jnp.tanh(masks.astype(jnp.float32) @ w)
        return (SH.permutation_shapley(value_fn, n, jax.random.key(0), 4),
                IN.sii_matrix(value_fn, n, [0, 1], [2, 3, 4], jax.random.key(1), 3),
                SH.exact_shapley(value_fn, n))

    batched = jax.jit(jax.vmap(explain))(weights)
    one_sample = jax.jit(explain)
    for b in range(3):
        for got, one in zip(batched, one_sample(weights[b])):
            np.testing.assert_allclose(got[b], one, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- SII sampling
def test_sii_weight_is_the_beta_integral():
    """The sampler's premise: P(T) under p ~ U(0,1), Bernoulli(p) players = the SII weight."""
    from scipy.integrate import quad

    n = 7
    for t in range(n - 1):
        integral = quad(lambda p: p ** t * (1 - p) ** (n - 2 - t), 0, 1)[0]
        sii_w = math.factorial(t) * math.factorial(n - t - 2) / math.factorial(n - 1)
        assert abs(integral - sii_w) < 1e-10


def test_sii_matrix_unbiased():
    n = 5
    g = random_game(n, 21)
    A, B = [0, 3], [1, 2, 4]
    exact = np.array([[brute_sii(g, i, j) for j in B] for i in A])
    keys = jax.random.split(jax.random.key(0), 6000)
    runs = np.asarray(jax.vmap(lambda k: IN.sii_matrix(g.value_fn, n, A, B, k, 1))(keys),
                      np.float64)
    se = runs.std(0, ddof=1) / np.sqrt(len(runs))
    assert np.all(np.abs(runs.mean(0) - exact) < 4.5 * se + 1e-5), (runs.mean(0), exact, se)
    # and one long run converges
    long = IN.sii_matrix(g.value_fn, n, A, B, jax.random.key(1), 20000)
    assert np.abs(np.asarray(long) - exact).max() < 0.1


def test_stratified_sizes_cover_every_slice():
    """With M = n + 1 coalitions, stratified draw m has exactly m players; with any M, draw m's
    size is the floor of a point of its slice [m (n+1) / M, (m+1) (n+1) / M), and the members
    are a uniform subset."""
    n = 6
    keys = jax.random.split(jax.random.key(0), 2000)
    sizes = np.asarray(jax.vmap(lambda k: IN._coalitions(k, n, n + 1, "stratified"))(keys)
                       ).sum(-1)
    np.testing.assert_array_equal(sizes, np.broadcast_to(np.arange(n + 1), sizes.shape))
    M = 3
    draws = np.asarray(jax.vmap(lambda k: IN._coalitions(k, n, M, "stratified"))(keys))
    size = draws.sum(-1)  # [K, M]
    m = np.arange(M)[None]
    assert np.all((size >= np.floor(m * (n + 1) / M)) & (size < (m + 1) * (n + 1) / M))
    # pooled over the slices, every size 0..n is equally likely, as for the i.i.d. law
    counts = np.bincount(size.ravel(), minlength=n + 1) / size.size
    np.testing.assert_allclose(counts, np.full(n + 1, 1 / (n + 1)), atol=0.02)
    # given its size, every player is equally likely to be in the coalition
    np.testing.assert_allclose(draws.mean((0, 1)), np.full(n, draws.sum(-1).mean() / n),
                               atol=0.02)


def test_stratified_sizes_never_exceed_the_active_players():
    """The last slice's size stays n_active when u is as close to 1 as float32 allows below 1
    (the product (M - 1 + u) (n_active + 1) / M then rounds up to n_active + 1 in float32),
    and is the exact floor (float64 reference) wherever the product is not at an integer."""
    M, n_active = 512, 5
    for u1 in (np.float32(1 - 2 ** -24), np.float32(1 - 2 ** -16), np.float32(0.5)):
        u = jnp.full((M, 1), u1, jnp.float32)
        sizes = np.asarray(IN.stratified_sizes(u, jnp.int32(n_active), M))[:, 0]
        product = (np.arange(M) + np.float64(u1)) * (n_active + 1) / M
        assert sizes.max() <= n_active, u1
        # away from a slice's upper end (where float32 may round up) the floor is exact
        clear = np.abs(product - np.round(product)) > 1e-4
        np.testing.assert_array_equal(sizes[clear], np.floor(product)[clear])
    # so no inactive player joins the last coalition
    x = jax.random.uniform(jax.random.key(3), (M, 7))
    active = jnp.array([1, 1, 1, 1, 1, 0, 0], bool)
    size = IN.stratified_sizes(jnp.full((M, 1), 1 - 2 ** -16, jnp.float32), jnp.sum(active), M)
    assert not np.asarray(SH.active_ranks(x, active) < size)[:, 5:].any()


@pytest.mark.parametrize("M", [1, 4])
def test_stratified_sii_matrix_unbiased(M):
    n = 5
    g = random_game(n, 22)
    A, B = [0, 3], [1, 2, 4]
    exact = np.array([[brute_sii(g, i, j) for j in B] for i in A])
    keys = jax.random.split(jax.random.key(1), 4000)
    runs = np.asarray(jax.vmap(lambda k: IN.sii_matrix(g.value_fn, n, A, B, k, M,
                                                       sampling="stratified"))(keys), np.float64)
    se = runs.std(0, ddof=1) / np.sqrt(len(runs))
    assert np.all(np.abs(runs.mean(0) - exact) < 4.5 * se + 1e-5), (runs.mean(0), exact, se)


@pytest.mark.parametrize("sampling", ["iid", "stratified"])
def test_null_players_padded_into_either_side_leave_the_other_pairs_estimates(sampling):
    """A sample's game padded to its batch's size: a null player appended to A (which moves
    every B player's index by one) and one to B, both inactive. Each real player's draws are
    keyed by its side and its place in it, and sizes are drawn over the active players, so
    every real pair's estimate is the unpadded game's, draw for draw."""
    n = 5
    g = random_game(n, 23)
    A, B = [0, 1, 2], [3, 4]
    real = np.array([0, 1, 2, 4, 5])  # the padded game's players 3 (in A) and 6 (in B) are null

    def padded(masks):
        return g.value_fn(masks[:, real])

    active = np.isin(np.arange(n + 2), real)
    for seed, M in ((0, 6), (1, 16)):
        key = jax.random.key(seed)
        want = np.asarray(IN.sii_matrix(g.value_fn, n, A, B, key, M, sampling=sampling))
        got = np.asarray(IN.sii_matrix(padded, n + 2, [0, 1, 2, 3], [4, 5, 6], key, M,
                                       sampling=sampling, active=active))
        assert np.abs(want).max() > 1e-3
        np.testing.assert_allclose(got[:3, :2], want, rtol=1e-6, atol=1e-7)
        drawn = IN._coalitions(jax.random.split(key)[0], n + 2, M, sampling, active,
                               IN._streams(n + 2, np.arange(4), np.arange(4, 7)))
        assert not np.asarray(drawn)[:, ~active].any()  # null players join no coalition
    with pytest.raises(ValueError, match="active must be bool"):
        IN.sii_matrix(padded, n + 2, [0], [4], key, 2, active=active[:-1])


def test_stratified_sii_matrix_has_less_variance_when_the_interaction_grows_with_size():
    """A pair whose interaction is carried by the other players' count: v(S) = 1[i, j in S] *
    |S|^2. The stratified draw removes the variance between coalition sizes."""
    n = 9
    g = TableGame(n, lambda s: float({0, 5} <= s) * len(s) ** 2)
    exact = brute_sii(g, 0, 5)
    keys = jax.random.split(jax.random.key(2), 500)

    def mse(sampling):
        est = jax.vmap(lambda k: IN.sii_matrix(g.value_fn, n, [0], [5], k, 8,
                                               sampling=sampling))(keys)
        return float(np.mean((np.asarray(est, np.float64)[:, 0, 0] - exact) ** 2))

    iid, stratified = mse("iid"), mse("stratified")
    assert stratified < 0.5 * iid, (stratified, iid)


def test_sii_matrix_closed_forms():
    n = 6
    A, B = [0, 1, 2], [3, 4, 5]
    w = np.arange(1.0, 7.0)
    # additive: every Δ is 0, so every sample's estimate is exactly 0
    got = IN.sii_matrix(additive_game(w).value_fn, n, A, B, jax.random.key(0), 8)
    np.testing.assert_allclose(got, np.zeros((3, 3)), atol=1e-5)
    # unanimity on T = {1, 2, 4}: SII 1/2 on the pairs inside T, 0 elsewhere
    T = [1, 2, 4]
    got = IN.sii_matrix(unanimity_game(n, T).value_fn, n, A, B, jax.random.key(0), 20000)
    expect = np.array([[0.5 if (i in T and j in T) else 0.0 for j in B] for i in A])
    np.testing.assert_allclose(got, expect, atol=0.05)


def test_sii_input_errors():
    f = random_game(4, 0).value_fn
    with pytest.raises(ValueError, match="outside"):
        IN.sii_matrix(f, 4, [0, 4], [1], jax.random.key(0), 2)
    with pytest.raises(ValueError, match="repeats"):
        IN.sii_matrix(f, 4, [0, 0], [1], jax.random.key(0), 2)
    with pytest.raises(ValueError, match="sampling must be one of iid, stratified"):
        IN.sii_matrix(f, 4, [0], [1], jax.random.key(0), 2, sampling="sobol")
    with pytest.raises(ValueError, match="float\\[K\\]"):
        SH.permutation_shapley(lambda m: jnp.zeros((m.shape[0], 2)), 4, jax.random.key(0), 2)


# ----------------------------------------------------------------------------- shares, probes
def test_modality_shares():
    rng = np.random.default_rng(0)
    phi = rng.normal(size=(4, 7)).astype(np.float32)
    phi[3] = 0
    is_text = np.array([[False] * 4 + [True] * 3] * 4)
    t, v = SH.modality_shares(jnp.asarray(phi), jnp.asarray(is_text))
    expect = np.abs(phi[:3, 4:]).sum(1) / np.abs(phi[:3]).sum(1)
    np.testing.assert_allclose(t[:3], expect, rtol=1e-6)
    np.testing.assert_allclose(v[:3], 1 - expect, rtol=1e-6)
    assert np.isnan(t[3]) and np.isnan(v[3])


def test_throughput_probes_run():
    f = random_game(6, 0).value_fn
    assert 0 < SH.shapley_evals_per_second(f, 6, 500, repeats=1) < float("inf")
    assert 0 < IN.sii_evals_per_second(f, 6, [0, 1], [2, 3], 500, repeats=1) < float("inf")
    assert SH.permutation_shapley_evaluations(6, 4) == 22
    assert IN.sii_evaluations(2, 3, 10) == 10 * 12


def test_evaluation_counts_are_the_rows_the_estimators_evaluate():
    """The budgets the throughput probes and Table 1 count are the coalitions the estimators
    pass to the game (one chunk holding every row, so nothing is padded)."""
    rows = []
    game = random_game(6, 0).value_fn

    def counted(masks):
        jax.debug.callback(lambda m: rows.append(np.asarray(m).shape[0]), masks)
        return game(masks)

    jax.block_until_ready(IN.sii_matrix(counted, 6, [0, 1], [2, 3, 4], jax.random.key(0), 10,
                                        chunk=10_000))
    assert sum(rows) == IN.sii_evaluations(2, 3, 10) == 120
    rows.clear()
    jax.block_until_ready(SH.permutation_shapley(counted, 6, jax.random.key(0), 4,
                                                 chunk=10_000))
    assert sum(rows) == SH.permutation_shapley_evaluations(6, 4) == 22
