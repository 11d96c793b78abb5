"""MultiSHAP (cell x token SII), first-order Shapley maps and MM-SHAP shares of
gridvqa_jax.explain.multishap, against brute-force enumeration written here in numpy on a
hand-written model whose value of every coalition is known in closed form."""

import functools
import importlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

MS = importlib.import_module("gridvqa_jax.explain.multishap")  # the module; the package binds the function
PT = importlib.import_module("gridvqa_jax.explain.perturb")
from gridvqa_jax.explain import shapley as SH
from gridvqa_jax.world import universe as U

REPO = Path(__file__).resolve().parents[1]
PX = 4  # render cells at 4 px: every non-empty tile still has a non-white pixel
L = 8  # token slots of the toy questions
V = 12  # token ids 1..V-1 (0 = PAD)


# ----------------------------------------------------------------------------- a toy model
def _presence(image, tokens, S):
    """x [K, S*S] (cell non-white), y [K, L] (token not PAD), ids [K, L]."""
    K, H = image.shape[0], image.shape[1]
    p = H // S
    cells = jnp.asarray(image).reshape(K, S, p, S, p, 3)
    x = jnp.any(cells != 255, axis=(2, 4, 5)).reshape(K, S * S).astype(jnp.float32)
    y = (tokens != U.PAD_ID).astype(jnp.float32)
    return x, y


def _score(params, x, y, tokens):
    """sum_c wc x_c + sum_t wt[id_t] y_t + sum_{c,t} W[c, id_t] x_c y_t."""
    wt = params["wt"][tokens] * y  # [K, L]
    pair = params["W"][:, tokens]  # [C, K, L]
    return (x @ params["wc"] + jnp.sum(wt, axis=1)
            + jnp.einsum("kc,ckl,kl->k", x, pair, y))


def _toy(g):
    def apply_fn(params, image, tokens):
        S = params["wc"].shape[0]
        S = int(round(S ** 0.5))
        x, y = _presence(image, tokens, S)
        v = g(_score(params, x, y, tokens))
        # Answer 0 always wins, and its "log-prob" is exactly v.
        return {"answer_logprobs": jnp.stack([v, v - 1.0], axis=-1)}
    return apply_fn


def _tanh2(s):
    return 2.0 * jnp.tanh(s)


APPLY_TANH = _toy(_tanh2)
APPLY_LINEAR = _toy(lambda s: s)
APPLY_TANH.__name__ = "apply_tanh"


def _additive_apply(params, image, tokens):
    S = int(round(params["wc"].shape[0] ** 0.5))
    x, y = _presence(image, tokens, S)
    v = x @ params["wc"] + jnp.sum(params["wt"][tokens] * y, axis=1)
    return {"answer_logprobs": jnp.stack([v, v - 1.0], axis=-1)}


def toy_params(S, seed=0, pair_scale=0.6):
    r = np.random.default_rng(seed)
    return {"wc": jnp.asarray(r.normal(0, 0.5, S * S), jnp.float32),
            "wt": jnp.asarray(r.normal(0, 0.5, V), jnp.float32),
            "W": jnp.asarray(r.normal(0, pair_scale, (S * S, V)), jnp.float32)}


class ToyScenes(NamedTuple):
    """The three Scene fields an explainer reads (a pytree, like a Scene batch)."""

    color: np.ndarray
    shape: np.ndarray
    tokens: np.ndarray


def toy_scenes(S, n_tokens, seed=0):
    """Every cell filled (so every cell is a real player); question b has n_tokens[b] words."""
    r = np.random.default_rng(seed)
    B = len(n_tokens)
    tokens = np.zeros((B, L), np.int32)
    for b, n in enumerate(n_tokens):
        tokens[b, :n] = r.integers(1, V, n)
    return ToyScenes(color=r.integers(0, 4, (B, S, S)).astype(np.int32),
                           shape=r.integers(0, 4, (B, S, S)).astype(np.int32), tokens=tokens)


# ----------------------------------------------------------------------------- brute force
def brute_game(params, tokens, S, g):
    """The game of one sample on its C + n real players, evaluated in numpy float64 for every
    coalition code (bit i = player i present; cells first, then tokens)."""
    wc, wt, W = (np.asarray(params[k], np.float64) for k in ("wc", "wt", "W"))
    ids = np.asarray(tokens)[np.asarray(tokens) != U.PAD_ID]
    C, n = S * S, ids.size
    m = C + n
    codes = np.arange(2 ** m)
    bits = (codes[:, None] >> np.arange(m)[None, :]) & 1
    x, y = bits[:, :C].astype(float), bits[:, C:].astype(float)
    s = x @ wc + y @ wt[ids] + np.einsum("kc,ct,kt->k", x, W[:, ids], y)
    return g(s), C, n


def brute_sii(v, m, pairs):
    """SII of each (i, j) in pairs by the definition, over all coalitions without i and j."""
    import math
    codes = np.arange(2 ** m)
    size = np.array([bin(c).count("1") for c in codes])
    weight = np.array([math.factorial(k) * math.factorial(m - k - 2) / math.factorial(m - 1)
                       for k in range(m - 1)])
    out = []
    for i, j in pairs:
        bi, bj = 1 << i, 1 << j
        T = codes[(codes & bi == 0) & (codes & bj == 0)]
        w = weight[size[T]]
        out.append(np.sum(w * (v[T | bi | bj] - v[T | bi] - v[T | bj] + v[T])))
    return np.array(out)


def brute_shapley(v, m):
    import math
    codes = np.arange(2 ** m)
    size = np.array([bin(c).count("1") for c in codes])
    weight = np.array([math.factorial(k) * math.factorial(m - k - 1) / math.factorial(m)
                       for k in range(m)])
    phi = np.zeros(m)
    for i in range(m):
        T = codes[codes & (1 << i) == 0]
        w = weight[size[T]]
        phi[i] = np.sum(w * (v[T | (1 << i)] - v[T]))
    return phi


def exact_cell_token_sii(params, scenes, b, S, g):
    v, C, n = brute_game(params, scenes.tokens[b], S, g)
    pairs = [(c, C + t) for c in range(C) for t in range(n)]
    return brute_sii(v, C + n, pairs).reshape(C, n)


# ----------------------------------------------------------------------------- tests
def test_pairwise_game_gives_its_coefficients_exactly_and_pad_is_zero():
    # v = a multilinear function with pairwise cell-token terms: every Δ_ct(T) = W[c, id_t], so
    # the SII is W exactly for any budget and any sampled coalition.
    S = 3
    params, scenes = toy_params(S), toy_scenes(S, [5, 3])
    key = jax.random.key(0)
    phi = MS.interaction_matrix(APPLY_LINEAR, params, scenes, key, cell_px=PX, n_samples=3)
    assert phi.shape == (2, S, S, L)
    W = np.asarray(params["W"])
    for b, n in enumerate([5, 3]):
        ids = scenes.tokens[b, :n]
        np.testing.assert_allclose(np.asarray(phi[b]).reshape(S * S, L)[:, :n], W[:, ids],
                                   atol=2e-5)
        assert np.all(np.asarray(phi[b])[..., n:] == 0)
    att = MS.multishap(APPLY_LINEAR, params, scenes, key, cell_px=PX, n_samples=3)
    np.testing.assert_allclose(att.visual, np.asarray(phi).sum(-1), atol=1e-5)
    np.testing.assert_allclose(att.textual, np.asarray(phi).sum((1, 2)), atol=1e-5)
    assert np.all(np.asarray(att.textual)[1, 3:] == 0)
    np.testing.assert_array_equal(att.token_valid, scenes.tokens != U.PAD_ID)


def test_sii_matches_brute_force_within_mc_error_and_converges():
    # 16 copies of one sample (4 cells + 6 tokens; a 4-token question beside it in the batch
    # game): each copy draws its own coalitions, so one call gives 16 independent estimates at
    # M = 64 and their mean, an estimate at M = 1024.
    S, R = 2, 16
    params, base = toy_params(S, seed=1), toy_scenes(S, [6, 4], seed=1)
    scenes = jax.tree.map(lambda a: np.concatenate([np.repeat(a[:1], R, 0), a[1:]]), base)
    g = lambda s: 2.0 * np.tanh(s)  # noqa: E731
    phi = np.asarray(MS.interaction_matrix(APPLY_TANH, params, scenes, jax.random.key(3),
                                           cell_px=PX, n_samples=64)).reshape(R + 1, S * S, L)
    exact = exact_cell_token_sii(params, base, 0, S, g)
    est = phi[:R, :, :6]
    assert np.all(phi[:, :, 6:] == 0) and np.all(phi[R, :, 4:] == 0)
    np.testing.assert_allclose(phi[R, :, :4], exact_cell_token_sii(params, base, 1, S, g),
                               atol=0.5)
    # Unbiased: the mean of the 16 estimates is within 4 standard errors of the exact SII.
    se = est.std(axis=0, ddof=1) / np.sqrt(R)
    assert np.all(np.abs(est.mean(0) - exact) <= 4 * se + 1e-4), (est.mean(0) - exact, se)
    # Converges: 16x the samples cuts the error by ~4 (allow 2.5).
    mae_64 = np.mean(np.abs(est - exact))
    mae_1024 = np.mean(np.abs(est.mean(0) - exact))
    assert mae_1024 < mae_64 / 2.5, (mae_64, mae_1024)
    assert mae_64 < 0.5 * np.mean(np.abs(exact)), (mae_64, np.mean(np.abs(exact)))


def test_additive_model_has_no_interactions_and_shapley_is_its_weights():
    S = 2
    params, scenes = toy_params(S, seed=2), toy_scenes(S, [5, 2], seed=2)
    key = jax.random.key(1)
    att = MS.multishap(_additive_apply, params, scenes, key, cell_px=PX, n_samples=8)
    assert np.max(np.abs(att.visual)) < 1e-5 and np.max(np.abs(att.textual)) < 1e-5
    # First order: 4 cells + 5 tokens = 9 players -> exact enumeration; phi_i = weight_i.
    att1 = MS.shapley_attribution(_additive_apply, params, scenes, key, cell_px=PX,
                                  n_samples=2)
    wc, wt = np.asarray(params["wc"]), np.asarray(params["wt"])
    for b, n in enumerate([5, 2]):
        np.testing.assert_allclose(np.asarray(att1.visual[b]).ravel(), wc, atol=1e-5)
        np.testing.assert_allclose(att1.textual[b, :n], wt[scenes.tokens[b, :n]], atol=1e-5)
        assert np.all(np.asarray(att1.textual)[b, n:] == 0)


@pytest.mark.parametrize("S,ntoks,n_perm", [(2, [6, 3], 2), (3, [7, 4], 400)])
def test_first_order_maps_and_shares_against_brute_force(S, ntoks, n_perm):
    # S=2: 4 + 6 = 10 players, exact enumeration; S=3: 9 + 7 = 16 players, antithetic
    # permutations (sample 1 has 4 real tokens and 3 null token players in the batch's game).
    params, scenes = toy_params(S, seed=4, pair_scale=0.3), toy_scenes(S, ntoks, seed=4)
    g = lambda s: 2.0 * np.tanh(s)  # noqa: E731
    att, shares = MS.multishap_with_shares(APPLY_TANH, params, scenes, jax.random.key(2),
                                           cell_px=PX, n_samples=n_perm, order=1)
    exact = S == 2
    for b, n in enumerate(ntoks):
        v, C, _ = brute_game(params, scenes.tokens[b], S, g)
        phi = brute_shapley(v, C + n)
        got = np.concatenate([np.asarray(att.visual[b]).ravel(), att.textual[b, :n]])
        assert np.all(np.asarray(att.textual)[b, n:] == 0)
        t_ref = np.abs(phi[C:]).sum() / np.abs(phi).sum()
        if exact:
            np.testing.assert_allclose(got, phi, atol=1e-4)
            assert abs(float(shares["t_shap"][b]) - t_ref) < 1e-4
        else:
            assert np.mean(np.abs(got - phi)) < 0.05 * np.mean(np.abs(phi)) + 0.01
            assert abs(float(shares["t_shap"][b]) - t_ref) < 0.05
            # Every permutation is efficient: sum phi = v(N) - v(empty) exactly.
            np.testing.assert_allclose(got.sum(), v[-1] - v[0], atol=1e-4)
    np.testing.assert_allclose(shares["t_shap"] + shares["v_shap"], 1.0, atol=1e-6)


def test_budget_chunk_and_pad_invariance():
    S = 2
    params, scenes = toy_params(S, seed=5), toy_scenes(S, [4, 2, 3], seed=5)
    key = jax.random.key(7)
    a = MS.interaction_matrix(APPLY_TANH, params, scenes, key, cell_px=PX, n_samples=16,
                              chunk=5)
    b = MS.interaction_matrix(APPLY_TANH, params, scenes, key, cell_px=PX, n_samples=16,
                              perturbations_per_eval=64)
    np.testing.assert_allclose(a, b, atol=1e-6)
    # Cost follows the longest question (4 tokens), not the L = 8 slots.
    assert MS.multishap_evaluations(scenes, 16) == 3 * 16 * (1 + 4 + 4 + 16)
    with pytest.raises(ValueError, match="name the same budget"):
        MS.multishap(APPLY_TANH, params, scenes, key, chunk=4, perturbations_per_eval=8)
    with pytest.raises(ValueError, match="n_tokens"):
        MS.multishap(APPLY_TANH, params, scenes, key, cell_px=PX, n_tokens=3)


@pytest.mark.parametrize("sampling", ["iid", "stratified"])
def test_a_samples_maps_do_not_depend_on_its_batchs_game_size(sampling):
    """Sample 1 (2 tokens) explained in a batch whose longest question has 4 tokens, and alone
    with the same per-sample key: in the batch its game is padded with two null token players,
    which join no coalition and move no other player's draws, so its maps are the same."""
    S = 2
    params, scenes = toy_params(S, seed=6), toy_scenes(S, [4, 2, 3], seed=6)
    keys = MS.sample_keys(jax.random.key(9), 3)
    run = functools.partial(MS.multishap, APPLY_TANH, params, cell_px=PX, n_samples=8,
                            sampling=sampling)
    batch = run(scenes, keys)
    alone = run(jax.tree.map(lambda x: x[1:2], scenes), keys[1:2])
    assert MS.game_size(scenes)[1] == 4 and np.abs(np.asarray(alone.visual)).max() > 1e-3
    np.testing.assert_allclose(batch.visual[1:2], alone.visual, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(batch.textual[1:2], alone.textual, rtol=1e-5, atol=1e-6)


def test_a_samples_first_order_values_do_not_depend_on_its_batchs_game_size():
    """The same for ``order=1`` past the exact limit (permutation sampling), with grouped
    players: sample 1 has 14 cell groups and 2 tokens (16 players), sample 0 16 cell groups
    and 4 tokens, so in the batch sample 1's game has 2 null cell groups in front of its
    tokens and 2 null tokens after them. The null players are in no coalition and every
    player's order is keyed by its place among the cells or the tokens."""
    S = 4
    params, scenes = toy_params(S, seed=7), toy_scenes(S, [4, 2], seed=7)
    cells = np.stack([np.arange(S * S), np.minimum(np.arange(S * S), 13)]).reshape(2, S, S)
    fm = PT.FeatureMask(cells, np.broadcast_to(100 + np.arange(L), (2, L)))
    keys = MS.sample_keys(jax.random.key(3), 2)
    run = functools.partial(MS.shapley_attribution, APPLY_TANH, params, cell_px=PX,
                            n_samples=4)
    batch = run(scenes, keys, feature_mask=fm)
    one = jax.tree.map(lambda x: x[1:2], (scenes, fm))
    alone = run(one[0], keys[1:2], feature_mask=one[1])
    assert 14 + 2 > SH.MAX_EXACT_PLAYERS and np.abs(np.asarray(alone.visual)).max() > 1e-3
    np.testing.assert_allclose(batch.visual[1:2], alone.visual, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(batch.textual[1:2], alone.textual, rtol=1e-5, atol=1e-6)


def _question_tokens(text):
    ids = [U.WORD_ID[w] for w in U.tokenize(text) if w in U.WORD_ID]
    return np.pad(np.asarray(ids, np.int32), (0, U.MAX_TOKENS - len(ids)))


def real_scenes():
    """Two hand-made 5x5 scenes with questions of the universe's vocabulary (no generator, so
    no sampler compilation): 17 objects each, as d07."""
    r = np.random.default_rng(0)
    color = np.full((2, 5, 5), -1, np.int32)
    shape = np.full((2, 5, 5), -1, np.int32)
    for b in range(2):
        cells = r.choice(25, 17, replace=False)
        color[b].flat[cells] = r.integers(0, 4, 17)
        shape[b].flat[cells] = r.integers(0, 4, 17)
    tokens = np.stack([_question_tokens("How many red circles are left of blue square?"),
                       _question_tokens("Is there any green triangle below yellow object?")])
    return ToyScenes(color, shape, tokens)


MESH_CODE = """
import jax, numpy as np
assert len(jax.devices()) == 8, jax.devices()
import tests.test_multishap as T
print(*T.mesh_case(None).tolist())
"""


def mesh_case(mesh):
    """5 samples (padded to 8 on an 8-device mesh), SII maps and permutation-Shapley shares
    (3x3 cells + 7 tokens = 16 players) in one call: a flat vector of every output."""
    S = 3
    params, scenes = toy_params(S, seed=6), toy_scenes(S, [7, 3, 5, 6, 2], seed=6)
    att, shares = MS.multishap_with_shares(APPLY_TANH, params, scenes, jax.random.key(0),
                                           cell_px=PX, n_samples=8, n_permutations=4, chunk=16,
                                           mesh=mesh)
    return np.concatenate([np.asarray(att.visual).ravel(), np.asarray(att.textual).ravel(),
                           np.asarray(shares["t_shap"])])


def test_eight_devices_give_the_same_maps_as_one():
    one = mesh_case(jax.make_mesh((1,), ("data",), devices=jax.devices()[:1]))
    assert np.all(np.isfinite(one)) and np.abs(one).max() > 0
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8 "
                 "--xla_cpu_collective_call_terminate_timeout_seconds=600",
           "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(MESH_CODE)], env=env,
                         capture_output=True, text=True, cwd=REPO, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    eight = np.array(res.stdout.split(), np.float64)
    np.testing.assert_allclose(eight, one, rtol=1e-6, atol=1e-6)


@pytest.mark.slow  # loads and compiles the shipped model: ~20-70 s on a shared 2-core CPU
def test_shipped_m_pure_two_samples():
    from gridvqa_jax.training.export import load_reference_model
    apply_fn, params, _ = load_reference_model("pure")
    scenes = real_scenes()
    att, shares = MS.multishap_with_shares(apply_fn, params, scenes, jax.random.key(0),
                                           n_samples=1, n_permutations=2)
    S, Lm = 5, U.MAX_TOKENS
    assert att.visual.shape == (2, S, S) and att.textual.shape == (2, Lm)
    assert np.all(np.isfinite(att.visual)) and np.all(np.isfinite(att.textual))
    valid = scenes.tokens != U.PAD_ID
    assert np.all(np.asarray(att.textual)[~valid] == 0)
    assert np.abs(att.visual).max() > 0 and np.abs(att.textual).max() > 0
    np.testing.assert_allclose(shares["t_shap"] + shares["v_shap"], 1.0, atol=1e-6)
    assert np.all((np.asarray(shares["t_shap"]) >= 0) & (np.asarray(shares["t_shap"]) <= 1))


# ----------------------------------------------------------------------------- options
# target / quantity / baseline / text_aggregate / visual_aggregate, each against a game whose SII
# is known exactly: on a game that is multilinear in the cell and token indicators with pairwise
# terms W, every Δ_ct(T) is W[c, id_t], so the SII (and the estimator, for any budget) is W.


def _toy_answers(score_to_logprobs, presence=None):
    """A toy model with the linear pairwise score s (``_score``) mapped to the answer outputs
    by ``score_to_logprobs(s) -> dict``; ``presence(image, tokens, S)`` reads the cells."""
    def apply_fn(params, image, tokens):
        S = int(round(params["wc"].shape[0] ** 0.5))
        x, y = (presence or _presence)(image, tokens, S)
        return score_to_logprobs(_score(params, x, y, tokens))
    return apply_fn


def _presence_not(value):
    """Cell present iff some pixel differs from ``value`` (a model that sees the fill)."""
    def presence(image, tokens, S):
        K, H = image.shape[0], image.shape[1]
        p = H // S
        cells = jnp.asarray(image).reshape(K, S, p, S, p, 3)
        x = jnp.any(cells != value, axis=(2, 4, 5)).reshape(K, S * S).astype(jnp.float32)
        return x, (tokens != U.PAD_ID).astype(jnp.float32)
    return presence


def _w_block(params, scenes, b, S):
    n = int(np.sum(scenes.tokens[b] != U.PAD_ID))
    return np.asarray(params["W"])[:, scenes.tokens[b, :n]], n


def test_spelled_out_defaults_are_bit_identical_to_no_options():
    S = 2
    params, scenes = toy_params(S, seed=8), toy_scenes(S, [5, 3], seed=8)
    key = jax.random.key(4)
    kw = dict(cell_px=PX, n_samples=4)
    plain = MS.multishap(APPLY_TANH, params, scenes, key, **kw)
    spelled = MS.multishap(APPLY_TANH, params, scenes, key, **kw, **MS.DEFAULT_OPTIONS)
    np.testing.assert_array_equal(plain.visual, spelled.visual)
    np.testing.assert_array_equal(plain.textual, spelled.textual)
    phi = MS.interaction_matrix(APPLY_TANH, params, scenes, key, **kw)
    game = {k: MS.DEFAULT_OPTIONS[k] for k in ("target", "quantity", "baseline")}
    np.testing.assert_array_equal(phi, MS.interaction_matrix(APPLY_TANH, params, scenes, key,
                                                             **kw, **game))
    # the default maps are the signed sums of the matrix (today's definition)
    np.testing.assert_allclose(plain.visual, np.asarray(phi).sum(-1), atol=1e-6)
    np.testing.assert_allclose(plain.textual, np.asarray(phi).sum((1, 2)), atol=1e-6)
    assert MS.REFERENCE_OPTIONS == {"target": "label", "quantity": "log_odds",
                                    "baseline": "gray", "text_aggregate": "abs",
                                    "visual_aggregate": "signed"}
    assert set(MS.REFERENCE_OPTIONS) == set(MS.DEFAULT_OPTIONS)


def test_abs_aggregates_are_sums_of_magnitudes_of_the_exact_matrix():
    S = 3
    params, scenes = toy_params(S, seed=9), toy_scenes(S, [6, 4], seed=9)
    key = jax.random.key(5)
    kw = dict(cell_px=PX, n_samples=2)
    signed = MS.multishap(APPLY_LINEAR, params, scenes, key, **kw)
    text_abs = MS.multishap(APPLY_LINEAR, params, scenes, key, **kw, text_aggregate="abs")
    vis_abs = MS.multishap(APPLY_LINEAR, params, scenes, key, **kw, visual_aggregate="abs")
    for b in range(2):
        W, n = _w_block(params, scenes, b, S)
        np.testing.assert_allclose(text_abs.textual[b, :n], np.abs(W).sum(0), atol=1e-4)
        np.testing.assert_allclose(signed.textual[b, :n], W.sum(0), atol=1e-4)
        np.testing.assert_allclose(np.asarray(vis_abs.visual[b]).ravel(), np.abs(W).sum(1),
                                   atol=1e-4)
        np.testing.assert_allclose(np.asarray(signed.visual[b]).ravel(), W.sum(1), atol=1e-4)
        assert np.all(np.asarray(text_abs.textual)[b, n:] == 0)
        # W has both signs, so the two readings differ
        assert np.max(np.abs(np.abs(W).sum(0) - W.sum(0))) > 0.1
    # the aggregate changes one map only
    np.testing.assert_array_equal(text_abs.visual, signed.visual)
    np.testing.assert_array_equal(vis_abs.textual, signed.textual)
    # grouped players: one group per cell and per token is the same game
    fm = PT.FeatureMask(np.arange(S * S).reshape(S, S), S * S + np.arange(L))
    grouped = MS.multishap(APPLY_LINEAR, params, scenes, key, **kw, feature_mask=fm,
                           text_aggregate="abs", visual_aggregate="abs")
    for b in range(2):
        W, n = _w_block(params, scenes, b, S)
        np.testing.assert_allclose(grouped.textual[b, :n], np.abs(W).sum(0), atol=1e-4)
        np.testing.assert_allclose(np.asarray(grouped.visual[b]).ravel(), np.abs(W).sum(1),
                                   atol=1e-4)
    with pytest.raises(ValueError, match="order=1"):
        MS.multishap(APPLY_LINEAR, params, scenes, key, **kw, order=1, text_aggregate="abs")
    with pytest.raises(ValueError, match="order=1 samples permutations"):  # not ignored
        MS.multishap(APPLY_LINEAR, params, scenes, key, **kw, order=1, sampling="stratified")
    with pytest.raises(ValueError, match="text_aggregate"):
        MS.multishap(APPLY_LINEAR, params, scenes, key, **kw, text_aggregate="mean")


@pytest.mark.parametrize("baseline,value", [("gray", 128), ("black", 0)])
def test_baseline_fills_masked_cells_with_its_value(baseline, value):
    from gridvqa_jax.world import render as R

    S = 3
    scenes = toy_scenes(S, [4], seed=10)
    image = np.asarray(R.render(scenes.color[0], scenes.shape[0], PX))
    mask = np.zeros((S, S), bool)
    mask[0, 1] = mask[2, 2] = True
    got = np.asarray(PT.mask_cells(image, mask, baseline=baseline))
    pix = np.kron(mask, np.ones((PX, PX))).astype(bool)
    assert got.dtype == np.uint8
    assert np.all(got[pix] == value) and np.array_equal(got[~pix], image[~pix])
    empty = np.asarray(PT.mask_cells(image, mask))
    assert np.all(empty[pix] == 255) and np.array_equal(empty[~pix], image[~pix])
    # what the model sees: a model for which a cell is present iff it is not all `value` plays
    # the pairwise game (SII = W) under this baseline, and no game at all (every cell always
    # present: SII = 0) under the empty tile
    # (8-px cells: at 4 px one shape's tile is all outline, i.e. all black)
    params, scenes = toy_params(S, seed=11), toy_scenes(S, [5, 3], seed=11)
    apply_fn = _toy_answers(lambda s: {"answer_logprobs": jnp.stack([s, s - 1.0], -1)},
                            _presence_not(value))
    key = jax.random.key(6)
    phi = np.asarray(MS.interaction_matrix(apply_fn, params, scenes, key, cell_px=8,
                                           n_samples=2, baseline=baseline))
    phi_empty = np.asarray(MS.interaction_matrix(apply_fn, params, scenes, key, cell_px=8,
                                                 n_samples=2))
    for b in range(2):
        W, n = _w_block(params, scenes, b, S)
        np.testing.assert_allclose(phi[b].reshape(S * S, L)[:, :n], W, atol=2e-5)
    assert np.max(np.abs(phi_empty)) < 1e-5
    with pytest.raises(ValueError, match="baseline"):
        PT.mask_cells(image, mask, baseline="white")


class LabelledScenes(NamedTuple):
    color: np.ndarray
    shape: np.ndarray
    tokens: np.ndarray
    answer: np.ndarray
    is_yesno: np.ndarray


def test_target_label_explains_the_ground_truth_answer():
    # Class a of the unified space 0..C, no, yes scores scale[a] * s (+100 for class 0, which
    # the model therefore always predicts): its SII is scale[a] * W.
    S = 2
    C, A = S * S, S * S + 3
    scale = jnp.asarray(1.0 + 0.5 * np.arange(A), jnp.float32)
    offset = jnp.zeros(A).at[0].set(100.0)
    apply_fn = _toy_answers(lambda s: {"answer_logprobs": s[:, None] * scale[None, :]
                                       + offset[None, :]})
    params, base = toy_params(S, seed=12), toy_scenes(S, [5, 4, 3], seed=12)
    # a count answer 2, a "yes" and a "no"
    scenes = LabelledScenes(*base, answer=np.array([2, 1, 0]),
                            is_yesno=np.array([False, True, True]))
    want = np.array([2, C + 2, C + 1])
    np.testing.assert_array_equal(MS.label_answer(scenes), want)
    key = jax.random.key(7)
    kw = dict(cell_px=PX, n_samples=2)
    label = np.asarray(MS.interaction_matrix(apply_fn, params, scenes, key, **kw,
                                             target="label"))
    pred = np.asarray(MS.interaction_matrix(apply_fn, params, scenes, key, **kw))
    for b in range(3):
        W, n = _w_block(params, scenes, b, S)
        np.testing.assert_allclose(label[b].reshape(C, L)[:, :n], float(scale[want[b]]) * W,
                                   rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(pred[b].reshape(C, L)[:, :n], float(scale[0]) * W,
                                   rtol=1e-4, atol=1e-4)
    given = MS.interaction_matrix(apply_fn, params, scenes, key, **kw, answer=want)
    np.testing.assert_array_equal(label, given)
    with pytest.raises(ValueError, match="not both"):
        MS.multishap(apply_fn, params, scenes, key, **kw, target="label", answer=want)
    with pytest.raises(ValueError, match="answer and is_yesno"):
        MS.multishap(apply_fn, params, base, key, **kw, target="label")


def test_log_odds_and_logit_quantities():
    S = 2
    params, scenes = toy_params(S, seed=13), toy_scenes(S, [5, 3], seed=13)
    key = jax.random.key(8)
    kw = dict(cell_px=PX, n_samples=2)
    # two answers, logits (s + 100, 0): P(answer 0) rounds to 1 in float32, its log-odds is
    # s + 100 exactly (SII = W), its log-probability ~0 (SII ~ 0)
    two = _toy_answers(lambda s: {"answer_logprobs": jax.nn.log_softmax(
        jnp.stack([s + 100.0, jnp.zeros_like(s)], -1))})
    # logits (s + 100, -s) returned: the logit of answer 0 is s + 100 (SII = W), its
    # log-odds 2 s + 100 (SII = 2 W)
    logits = _toy_answers(lambda s: {
        "answer_logits": jnp.stack([s + 100.0, -s], -1),
        "answer_logprobs": jax.nn.log_softmax(jnp.stack([s + 100.0, -s], -1))})
    odds = np.asarray(MS.interaction_matrix(two, params, scenes, key, **kw, quantity="log_odds"))
    logp = np.asarray(MS.interaction_matrix(two, params, scenes, key, **kw))
    lg = np.asarray(MS.interaction_matrix(logits, params, scenes, key, **kw, quantity="logit"))
    lo = np.asarray(MS.interaction_matrix(logits, params, scenes, key, **kw,
                                          quantity="log_odds"))
    assert np.all(np.isfinite(odds))
    for b in range(2):
        W, n = _w_block(params, scenes, b, S)
        np.testing.assert_allclose(odds[b].reshape(S * S, L)[:, :n], W, atol=2e-4)
        np.testing.assert_allclose(lg[b].reshape(S * S, L)[:, :n], W, atol=2e-4)
        np.testing.assert_allclose(lo[b].reshape(S * S, L)[:, :n], 2 * W, atol=4e-4)
        assert np.max(np.abs(logp[b])) < 1e-4
    # the quantity on one batch of inputs, against its definition
    img = np.full((3, S * PX, S * PX, 3), 255, np.uint8)
    toks = scenes.tokens[:1].repeat(3, 0)
    lp = np.asarray(jax.nn.log_softmax(jnp.asarray([[0.3, -1.0, 2.0]] * 3), -1))
    three = lambda p, i, t: {"answer_logprobs": jnp.asarray(lp)}  # noqa: E731
    got = np.asarray(PT.answer_logprob(three, None, img, toks, np.array([0, 1, 2]),
                                       quantity="log_odds"))
    p = np.exp(lp[0])
    np.testing.assert_allclose(got, np.log(p / (1 - p)), rtol=1e-5)
    with pytest.raises(ValueError, match="answer_logits"):
        MS.multishap(two, params, scenes, key, **kw, quantity="logit")
    with pytest.raises(ValueError, match="probability"):
        MS.multishap(two, params, scenes, key, **kw, quantity="log_odds", probability=True)
    with pytest.raises(ValueError, match="quantity"):
        MS.multishap(two, params, scenes, key, **kw, quantity="prob")


def test_options_reach_the_shares_game():
    # MM-SHAP shares of the first-order game follow baseline: under the empty tile the
    # value-reads-128 model has no cell player, so T-SHAP = 1.
    S = 2
    params, scenes = toy_params(S, seed=14), toy_scenes(S, [4, 3], seed=14)
    apply_fn = _toy_answers(lambda s: {"answer_logprobs": jnp.stack([s, s - 1.0], -1)},
                            _presence_not(128))
    key = jax.random.key(9)
    _, empty = MS.multishap_with_shares(apply_fn, params, scenes, key, cell_px=PX,
                                        n_samples=2, order=1)
    _, gray = MS.multishap_with_shares(apply_fn, params, scenes, key, cell_px=PX,
                                       n_samples=2, order=1, baseline="gray")
    np.testing.assert_allclose(empty["t_shap"], 1.0, atol=1e-6)
    assert np.all(np.asarray(gray["t_shap"]) < 0.99)
