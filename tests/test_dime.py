"""DIME and its LIME surrogate: weighted ridge against the normal equations of the augmented
problem (and sklearn when installed), LIME's sampling and kernel against their definitions,
UC/MI against a double loop, perturbed UC/MI against per-pair model calls, MI == 0 and exact
recovery of the weights on an additive model, 8 devices == 1, and maps that do not depend on
the width the batch is padded to."""

import functools
import importlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import RandomScenes, random_scenes
D = importlib.import_module("gridvqa_jax.explain.dime")  # the module; the package binds the function
from mmx_base import lime as LIME
from gridvqa_jax.world import universe as U

REPO = Path(__file__).resolve().parents[1]
S, L, PX = 5, U.MAX_TOKENS, 4


def make_scenes(n, seed=0):
    return random_scenes(n, seed, S, L)


W_CELL = np.linspace(-1.0, 1.5, S * S).astype(np.float32)
W_TOK = np.cos(np.arange(L)).astype(np.float32)


def occupancy(image):
    """float [B, S*S]: 1 where the cell is not the white empty tile."""
    img = jnp.asarray(image, jnp.float32)
    B = img.shape[0]
    dark = (255.0 - img).reshape(B, S, PX, S, PX, 3).sum((2, 4, 5))
    return (dark > 0).astype(jnp.float32).reshape(B, S * S)


def h_img(params, image):
    return occupancy(image) @ params["w_cell"]


def token_weights(tokens):
    """float [B, L]: the additive weight of each token (position and word), 0 at PAD."""
    tokens = jnp.asarray(tokens)
    return (jnp.where(tokens != U.PAD_ID, (1.0 + 0.1 * tokens), 0.0)
            * W_TOK[None, :tokens.shape[-1]])


def g_txt(params, tokens):
    return token_weights(tokens).sum(-1) * params["scale"]


def additive_apply(params, image, tokens):
    v = g_txt(params, tokens) + h_img(params, image)
    return {"answer_logprobs": jnp.stack([v, v - 1.0], -1)}


def product_apply(params, image, tokens):
    v = g_txt(params, tokens) * h_img(params, image) + 0.3 * h_img(params, image)
    return {"answer_logprobs": jnp.stack([v, -v], -1)}


PARAMS = {"w_cell": jnp.asarray(W_CELL), "scale": jnp.float32(1.0)}


# ------------------------------------------------------------------------------------------
# LIME surrogate
# ------------------------------------------------------------------------------------------
def ridge_reference(PT, y, w, alpha):
    """min sum w (y - c - X b)^2 + alpha |b|^2 via the augmented normal equations [X, 1]
    with penalty diag(alpha, ..., alpha, 0) (no centring), in float64."""
    X1 = np.concatenate([PT, np.ones((len(PT), 1))], 1).astype(np.float64)
    pen = np.diag(np.r_[np.full(PT.shape[1], alpha), 0.0])
    sol = np.linalg.solve(X1.T @ (w[:, None] * X1) + pen, X1.T @ (w * y))
    return sol[:-1], sol[-1]


@pytest.mark.parametrize("alpha", [1.0, 0.1])
def test_weighted_ridge_matches_augmented_normal_equations(alpha):
    rng = np.random.default_rng(1)
    for _ in range(5):
        n, d = 60, 7
        PT = rng.integers(0, 2, (n, d)).astype(np.float64)
        y, w = rng.normal(size=n), rng.random(n) + 0.05
        b, c = LIME.weighted_ridge(PT, y, w, alpha)
        rb, rc = ridge_reference(PT, y, w, alpha)
        np.testing.assert_allclose(b, rb, atol=2e-5)
        np.testing.assert_allclose(c, rc, atol=2e-5)


def test_weighted_ridge_matches_sklearn():
    lm = pytest.importorskip("sklearn.linear_model")
    rng = np.random.default_rng(2)
    PT = rng.integers(0, 2, (80, 9)).astype(np.float64)
    y, w = rng.normal(size=80), rng.random(80)
    ref = lm.Ridge(alpha=1.0, fit_intercept=True).fit(PT, y, sample_weight=w)
    b, c = LIME.weighted_ridge(PT, y, w, 1.0)
    np.testing.assert_allclose(b, ref.coef_, atol=2e-5)
    np.testing.assert_allclose(c, ref.intercept_, atol=2e-5)


def test_invalid_features_get_zero_and_leave_the_rest_unchanged():
    rng = np.random.default_rng(3)
    PT = rng.integers(0, 2, (50, 6)).astype(np.float64)
    y, w = rng.normal(size=50), rng.random(50) + 0.1
    valid = np.array([1, 1, 0, 1, 0, 1], bool)
    b, c = LIME.weighted_ridge(PT, y, w, 1.0, valid)
    rb, rc = ridge_reference(PT[:, valid], y, w, 1.0)
    np.testing.assert_allclose(b[valid], rb, atol=2e-5)
    assert np.all(np.asarray(b)[~valid] == 0)
    np.testing.assert_allclose(c, rc, atol=2e-5)


def test_lime_recovers_a_linear_model():
    beta = np.array([0.5, -2.0, 0.0, 1.25, 3.0, -0.75], np.float32)
    z = LIME.image_masks(jax.random.key(0), 400, 6)
    y = 0.3 + np.asarray(z, np.float32) @ beta
    b, c = LIME.lime_fit(z, y, alpha=0.0)
    np.testing.assert_allclose(b, beta, atol=1e-4)
    np.testing.assert_allclose(c, 0.3, atol=1e-4)
    b1, _ = LIME.lime_fit(z, y)  # alpha = 1: shrinkage vanishes with many samples
    np.testing.assert_allclose(b1, beta, atol=0.05 * np.abs(beta).max())


def test_masks_follow_the_lime_package():
    z = np.asarray(LIME.image_masks(jax.random.key(1), 4000, 25))
    assert z[0].all() and abs(z[1:].mean() - 0.5) < 0.01
    valid = np.zeros(32, bool)
    valid[:10] = True
    t = np.asarray(LIME.text_masks(jax.random.key(2), 4000, valid))
    assert t[0].all() and t[:, ~valid].all()
    removed = (~t[1:, valid]).sum(1)
    assert removed.min() == 1 and removed.max() == 10
    counts = np.bincount(removed, minlength=11)[1:]  # uniform over 1..10
    assert np.all(np.abs(counts / counts.sum() - 0.1) < 0.02)
    # each valid position equally likely to be removed
    per_pos = (~t[1:, :10]).mean(0)
    assert np.ptp(per_pos) < 0.05


def test_masks_do_not_depend_on_the_padded_width_and_nest_over_budgets():
    """A feature's draws depend on the key alone: not on how many (invalid) features follow
    it, so a sample's masks are the same in any batch; and a smaller budget's masks are the
    first rows of a larger one's (the budget sweep's nesting)."""
    k = jax.random.key(7)
    z = np.asarray(LIME.image_masks(k, 256, 25))
    np.testing.assert_array_equal(np.asarray(LIME.image_masks(k, 256, 40))[:, :25], z)
    np.testing.assert_array_equal(np.asarray(LIME.image_masks(k, 64, 25)), z[:64])
    valid = np.arange(20) < 9
    t = np.asarray(LIME.text_masks(k, 256, valid))
    wide = np.asarray(LIME.text_masks(k, 256, np.concatenate([valid, np.zeros(12, bool)])))
    np.testing.assert_array_equal(wide[:, :20], t)
    assert wide[:, 20:].all()
    np.testing.assert_array_equal(np.asarray(LIME.text_masks(k, 64, valid)), t[:64])


def test_cosine_distance_and_kernel():
    rng = np.random.default_rng(4)
    z = rng.integers(0, 2, (30, 12)).astype(bool)
    z[0] = False
    ones = np.ones(12)
    ref = np.array([1.0 if not r.any() else
                    1 - r @ ones / (np.linalg.norm(r) * np.linalg.norm(ones)) for r in z])
    d = LIME.cosine_distance_to_ones(z)
    np.testing.assert_allclose(d, ref, atol=1e-6)
    # lime_text: width 25 on 100 x distance == width 0.25 on the distance
    np.testing.assert_allclose(LIME.exponential_kernel(d, 0.25),
                               np.sqrt(np.exp(-((100 * ref) ** 2) / 25 ** 2)), rtol=1e-5)


# ------------------------------------------------------------------------------------------
# DIME
# ------------------------------------------------------------------------------------------
def test_uc_mi_matches_double_loop():
    F = np.random.default_rng(5).normal(size=(6, 6))
    uc, mi = D.uc_mi(F)
    N = len(F)
    for i in range(N):
        a = sum(F[i, k] for k in range(N)) / N
        b = sum(F[j, i] for j in range(N)) / N
        c = sum(F[j, k] for j in range(N) for k in range(N)) / N ** 2
        assert abs(uc[i] - (a + b - c)) < 1e-5 and abs(mi[i] - (F[i, i] - a - b + c)) < 1e-5
    # additive matrices have no interaction
    Fa = np.add.outer(np.arange(5.0), np.sin(np.arange(5.0)))
    assert np.abs(D.uc_mi(Fa)[1]).max() < 1e-5


@pytest.fixture(scope="module")
def scenes():
    return make_scenes(4)


def test_perturbed_targets_match_per_pair_model_calls(scenes):
    out = D.dime_maps(product_apply, PARAMS, scenes, jax.random.key(3), n_samples=6,
                      cell_px=PX, chunk=7)
    from gridvqa_jax.explain import perturb as PT
    from gridvqa_jax.world import render as R
    imgs = np.stack([np.asarray(R.render(c, s, PX)) for c, s in zip(scenes.color,
                                                                     scenes.shape)])
    N = len(imgs)

    def f(t, v, a):
        return float(product_apply(PARAMS, v[None], t[None])["answer_logprobs"][0, a])

    for i in (0, 2):
        a = int(out.answer[i])
        base = np.array([[f(scenes.tokens[j], imgs[k], a) for k in range(N)] for j in range(N)])
        for p in (0, 3, 5):
            z = np.asarray(out.visual_masks[i, p]).reshape(S, S)
            v2 = np.asarray(PT.mask_cells(imgs[i], ~z, PX))
            Fp = base.copy()
            Fp[:, i] = [f(scenes.tokens[j], v2, a) for j in range(N)]
            uc = Fp[i].mean() + Fp[:, i].mean() - Fp.mean()
            np.testing.assert_allclose(out.visual_targets[i, p], [uc, Fp[i, i] - uc], atol=1e-4)
            zt = np.asarray(out.textual_masks[i, p])
            t2 = np.where(zt, scenes.tokens[i], U.PAD_ID)
            Fp = base.copy()
            Fp[i, :] = [f(t2, imgs[k], a) for k in range(N)]
            uc = Fp[i].mean() + Fp[:, i].mean() - Fp.mean()
            np.testing.assert_allclose(out.textual_targets[i, p], [uc, Fp[i, i] - uc],
                                       atol=1e-4)
        # a product model does interact
        assert np.abs(out.visual_targets[i, :, 1]).max() > 1e-3


def test_additive_model_has_zero_mi_and_exact_uc_weights(scenes):
    out = D.dime_maps(additive_apply, PARAMS, scenes, jax.random.key(4), n_samples=40,
                      cell_px=PX, alpha=0.0)
    assert np.abs(out.visual_targets[..., 1]).max() < 1e-4
    assert np.abs(out.textual_targets[..., 1]).max() < 1e-4
    np.testing.assert_allclose(out.mi.visual, 0, atol=1e-3)
    np.testing.assert_allclose(out.mi.textual, 0, atol=1e-3)
    # UC of f = g(t) + h(v) is f itself, linear in the masks: LIME (alpha=0) is exact
    occ = (scenes.color >= 0).reshape(-1, S * S)
    valid = scenes.tokens != U.PAD_ID
    np.testing.assert_allclose(out.uc.visual.reshape(-1, S * S), occ * W_CELL, atol=2e-3)
    np.testing.assert_allclose(out.uc.textual, token_weights(scenes.tokens), atol=2e-3)
    assert np.all(np.asarray(out.uc.textual)[~valid] == 0)
    att = D.dime(additive_apply, PARAMS, scenes, jax.random.key(4), n_samples=40, cell_px=PX,
                 alpha=0.0)
    assert att.visual.shape == (4, S, S) and att.textual.shape == (4, L)


@pytest.mark.slow
def test_reference_scenes_join_the_set(scenes):
    extra = make_scenes(3, seed=9)
    out = D.dime_maps(product_apply, PARAMS, RandomScenes(*(a[:2] for a in scenes)),
                      jax.random.key(5), n_samples=4, cell_px=PX, reference=extra)
    full = D.dime_maps(product_apply, PARAMS,
                       RandomScenes(*(np.concatenate([a[:2], b]) for a, b in zip(scenes, extra))),
                       jax.random.key(5), n_samples=4, cell_px=PX)
    np.testing.assert_allclose(out.visual_targets, full.visual_targets[:2], atol=1e-5)
    np.testing.assert_allclose(out.mi.visual, full.mi.visual[:2], atol=1e-4)


def test_eight_devices_give_the_same_maps_as_one():
    code = textwrap.dedent("""
        import sys, jax, numpy as np
        sys.path.insert(0, "tests")
        from test_dime import make_scenes, product_apply, PARAMS, PX
        import importlib; D = importlib.import_module("gridvqa_jax.explain.dime")
        assert len(jax.devices()) == 8
        sc = make_scenes(5)
        one = D.dime_maps(product_apply, PARAMS, sc, jax.random.key(7), n_samples=8,
                          cell_px=PX)
        mesh = jax.make_mesh((8,), ("data",))
        many = D.dime_maps(product_apply, PARAMS, sc, jax.random.key(7), n_samples=8,
                           cell_px=PX, mesh=mesh)
        for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(many)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
        print("ok")
    """)
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8 "
                 "--xla_cpu_collective_call_terminate_timeout_seconds=600",
           "JAX_PLATFORMS": "cpu"}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         cwd=REPO, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().endswith("ok")


# ------------------------------------------------------------------------------------------
# feature_mask: LIME on groups of cells and tokens
# ------------------------------------------------------------------------------------------
def row_groups():
    """Cells grouped by row (id 10 + y), cell (x=2, y=1) never masked (-1); tokens in pairs
    (id 50 + t // 2)."""
    from gridvqa_jax.explain import perturb as PT
    cells = np.repeat(10 + np.arange(S), S).reshape(S, S).astype(np.int32)
    cells[1, 2] = -1
    return PT.FeatureMask(cells, (50 + np.arange(L) // 2).astype(np.int32))


def test_one_group_per_feature_reproduces_the_ungrouped_maps_bit_for_bit(scenes):
    from gridvqa_jax.explain import perturb as PT
    fm = jax.vmap(PT.players)(scenes)
    for fn in (product_apply, additive_apply):
        plain = D.dime_maps(fn, PARAMS, scenes, jax.random.key(3), n_samples=12, cell_px=PX)
        grouped = D.dime_maps(fn, PARAMS, scenes, jax.random.key(3), n_samples=12, cell_px=PX,
                              feature_mask=fm)
        for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(grouped)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_groups_on_an_additive_model_give_each_group_its_summed_weight(scenes):
    fm = row_groups()
    out = D.dime_maps(additive_apply, PARAMS, scenes, jax.random.key(4), n_samples=40,
                      cell_px=PX, alpha=0.0, feature_mask=fm)
    np.testing.assert_allclose(out.mi.visual, 0, atol=1e-3)
    np.testing.assert_allclose(out.mi.textual, 0, atol=1e-3)
    occ = (np.asarray(scenes.color) >= 0).reshape(-1, S, S) * W_CELL.reshape(S, S)
    member = np.asarray(fm.cells) >= 0
    row_sum = (occ * member).sum(-1)  # [B, S]: weight of group y (its masked cells only)
    want = np.where(member, row_sum[:, :, None], 0.0)
    np.testing.assert_allclose(out.uc.visual, want, atol=2e-3)
    tw = np.asarray(token_weights(scenes.tokens))
    pair = tw.reshape(-1, L // 2, 2).sum(-1)  # PAD weighs 0
    want_t = np.where(scenes.tokens != U.PAD_ID, np.repeat(pair, 2, axis=1), 0.0)
    np.testing.assert_allclose(out.uc.textual, want_t, atol=2e-3)
    # group masks: 5 row groups (the 20 other columns always kept), -1 cell never masked
    zv = np.asarray(out.visual_masks)
    assert zv[:, :, S:].all() and not zv[:, 1:, :S].all()


def test_groups_on_a_product_model_match_a_numpy_lime_fit(scenes):
    from gridvqa_jax.explain import perturb as PT
    from gridvqa_jax.world import render as R
    fm = row_groups()
    out = D.dime_maps(product_apply, PARAMS, scenes, jax.random.key(6), n_samples=24,
                      cell_px=PX, feature_mask=fm)
    imgs = np.stack([np.asarray(R.render(c, s, PX)) for c, s in zip(scenes.color,
                                                                     scenes.shape)])
    N, i = len(imgs), 1
    a = int(out.answer[i])

    def f(t, v):
        return float(product_apply(PARAMS, v[None], t[None])["answer_logprobs"][0, a])

    base = np.array([[f(scenes.tokens[j], imgs[k]) for k in range(N)] for j in range(N)])
    cells, tok_group = np.asarray(fm.cells), np.arange(L) // 2
    zv, zt = np.asarray(out.visual_masks[i]), np.asarray(out.textual_masks[i])
    for p in (0, 5, 11):  # targets: the group's features masked together, per-pair calls
        keep = np.where(cells >= 0, zv[p][cells - 10], True)
        Fp = base.copy()
        Fp[:, i] = [f(scenes.tokens[j], np.asarray(PT.mask_cells(imgs[i], ~keep, PX)))
                    for j in range(N)]
        uc = Fp[i].mean() + Fp[:, i].mean() - Fp.mean()
        np.testing.assert_allclose(out.visual_targets[i, p], [uc, Fp[i, i] - uc], atol=1e-4)
        t2 = np.where(zt[p][tok_group], scenes.tokens[i], U.PAD_ID)
        Fp = base.copy()
        Fp[i, :] = [f(t2, imgs[k]) for k in range(N)]
        uc = Fp[i].mean() + Fp[:, i].mean() - Fp.mean()
        np.testing.assert_allclose(out.textual_targets[i, p], [uc, Fp[i, i] - uc], atol=1e-4)
    # LIME on group indicators: kernel on the cosine distance over the groups, ridge alpha=1
    n_tok_groups = -(-int((scenes.tokens[i] != U.PAD_ID).sum()) // 2)
    for z, y, G, got, ids in (
            (zv[:, :S], out.visual_targets[i], S, out.mi.visual[i], cells - 10),
            (zt[:, :n_tok_groups], out.textual_targets[i], n_tok_groups,
             out.mi.textual[i], np.where(scenes.tokens[i] != U.PAD_ID, tok_group, -1))):
        zf = z.astype(np.float64)
        w = np.sqrt(np.exp(-(1 - np.sqrt(zf.sum(1) / G)) ** 2 / 0.25 ** 2))
        b, _ = ridge_reference(zf, np.asarray(y[:, 1], np.float64), w, 1.0)
        ids = np.where(np.asarray(ids) >= 0, ids, -1)
        want = np.where(ids >= 0, b[np.clip(ids, 0, None)], 0.0)
        np.testing.assert_allclose(np.asarray(got), want, atol=1e-3, rtol=1e-3)
    assert np.abs(np.asarray(out.mi.visual[i])).max() > 1e-3


def test_a_group_owning_cells_and_tokens_is_an_error(scenes):
    from gridvqa_jax.explain import perturb as PT
    fm = PT.FeatureMask(np.zeros((S, S), np.int32), np.zeros((L,), np.int32))
    with pytest.raises(ValueError, match="own both cells and"):
        D.dime(additive_apply, PARAMS, scenes, jax.random.key(0), n_samples=4, cell_px=PX,
               feature_mask=fm)


# ------------------------------------------------------------------------------------------
# positions: a few samples of the batch explained against the whole set
# ------------------------------------------------------------------------------------------
def test_positions_give_those_rows_of_the_whole_batch(scenes):
    """Samples 3 and 0 explained against the set of all four, in that order (their keys are
    their batch indices'; the set's UC / MI are the whole batch's)."""
    from gridvqa_jax.explain import perturb as PT
    fm = jax.vmap(PT.players)(scenes)
    runs = (lambda **kw: D.dime_maps(product_apply, PARAMS, scenes, jax.random.key(6),
                                     n_samples=8, cell_px=PX, feature_mask=fm, **kw),
            lambda **kw: D.dime_region_maps(product_apply, PARAMS, scenes, jax.random.key(6),
                                            image_players="patches", n_samples=8, cell_px=PX,
                                            **kw))
    for run in runs:
        whole, part = run(), run(positions=[3, 0])
        for a, b in zip(jax.tree.leaves(part), jax.tree.leaves(whole)):
            assert np.shape(a)[0] == 2
            np.testing.assert_allclose(np.asarray(a), np.asarray(b)[[3, 0]], atol=1e-5)
    for bad, why in (([], "non-empty"), ([0, 0], "distinct"), ([4], "distinct"),
                     ([0.5], "non-empty")):
        with pytest.raises(ValueError, match=why):
            D.dime_maps(product_apply, PARAMS, scenes, jax.random.key(6), n_samples=8,
                        cell_px=PX, positions=bad)


# ------------------------------------------------------------------------------------------
# a sample's maps do not depend on how the batch is padded
# ------------------------------------------------------------------------------------------
def test_maps_do_not_depend_on_the_padded_question_length_or_the_batch_region_count(scenes):
    """Questions padded to 32 instead of 14 tokens (a batch with a longer question) and
    another sample's finer label map (a batch with more superpixels) change neither the DIME
    set nor the other samples' masks, so they leave those samples' maps unchanged."""
    short = scenes._replace(tokens=np.asarray(scenes.tokens)[:, :14])
    a = D.dime_maps(product_apply, PARAMS, short, jax.random.key(8), n_samples=16, cell_px=PX)
    b = D.dime_maps(product_apply, PARAMS, scenes, jax.random.key(8), n_samples=16,
                    cell_px=PX)
    for m in ("uc", "mi"):
        ma, mb = getattr(a, m), getattr(b, m)
        assert np.abs(ma.textual).max() > 1e-3
        np.testing.assert_allclose(mb.textual[:, :14], ma.textual, atol=1e-5)
        assert np.all(np.asarray(mb.textual)[:, 14:] == 0)
        np.testing.assert_allclose(mb.visual, ma.visual, atol=1e-5)
    H = S * PX
    coarse = np.broadcast_to((np.arange(H)[:, None] >= H // 2) * 2
                             + (np.arange(H)[None, :] >= H // 2), (4, H, H)).copy()
    finer = coarse.copy()
    finer[3] = (np.arange(H)[:, None] * 3 // H) * 3 + np.arange(H)[None, :] * 3 // H
    run = functools.partial(D.dime_region_maps, product_apply, PARAMS, scenes,
                            jax.random.key(9), n_samples=16, cell_px=PX)
    a, b = run(image_players=coarse), run(image_players=finer)
    assert np.asarray(a.visual_masks).shape[-1] == 4 and np.asarray(b.visual_masks).shape[-1] == 9
    np.testing.assert_array_equal(np.asarray(b.visual_masks)[:3, :, :4],
                                  np.asarray(a.visual_masks)[:3])
    for m in ("uc", "mi"):
        np.testing.assert_allclose(getattr(b, m).visual_px[:3], getattr(a, m).visual_px[:3],
                                   atol=1e-5)
