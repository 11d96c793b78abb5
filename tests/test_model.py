"""Model pieces against independent computations: matcher (scipy), GIoU (brute force),
Poisson-binomial counting (enumeration), and the pure apply function's contracts."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment

from gridvqa_jax.training.config import TrainConfig
from gridvqa_jax.world import render as R
from gridvqa_jax.world import universe as U
from gridvqa_jax.models import matching as Mt
from gridvqa_jax.models import mdetr as M

TINY = M.ModelConfig(d_model=32, n_heads=2, mlp_dim=64, enc_layers=1, dec_layers=1)


@pytest.mark.parametrize("shape", [(6, 6), (9, 5), (25, 25), (25, 7)])
def test_hungarian_matches_scipy(shape):
    rng = np.random.default_rng(sum(shape))
    match = jax.jit(jax.vmap(Mt.hungarian_match))
    costs = rng.normal(size=(8,) + shape).astype(np.float32)
    cols = np.asarray(match(jnp.asarray(costs)))
    for c, col in zip(costs, cols):
        r, s = linear_sum_assignment(c)
        assigned = np.flatnonzero(col >= 0)
        assert len(assigned) == shape[1]
        assert len(set(col[assigned])) == shape[1]  # a proper matching
        np.testing.assert_allclose(c[assigned, col[assigned]].sum(), c[r, s].sum(), rtol=1e-5)


def _giou_brute(a, b):
    """GIoU of two xyxy boxes by its definition, plain Python."""
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    area = lambda z: (z[2] - z[0]) * (z[3] - z[1])  # noqa: E731
    union = area(a) + area(b) - inter
    hull = (max(a[2], b[2]) - min(a[0], b[0])) * (max(a[3], b[3]) - min(a[1], b[1]))
    return inter / union - (hull - union) / hull


def test_giou_against_brute_force_and_raster():
    rng = np.random.default_rng(0)
    cxcywh = np.concatenate([rng.uniform(0.2, 0.8, (12, 2)), rng.uniform(0.05, 0.4, (12, 2))], 1)
    xyxy = np.asarray(Mt.box_cxcywh_to_xyxy(jnp.asarray(cxcywh, jnp.float32)), np.float64)
    got = np.asarray(Mt.pairwise_giou(jnp.asarray(xyxy[:6], jnp.float32),
                                      jnp.asarray(xyxy[6:], jnp.float32)))
    want = np.array([[_giou_brute(a, b) for b in xyxy[6:]] for a in xyxy[:6]])
    np.testing.assert_allclose(got, want, atol=1e-5)
    # IoU part against a pixel raster on a 400x400 grid (independent of the formula).
    g = (np.arange(400) + 0.5) / 400
    inside = lambda z: ((g[None, :] >= z[0]) & (g[None, :] < z[2])  # noqa: E731
                        & (g[:, None] >= z[1]) & (g[:, None] < z[3]))
    giou_identical = np.asarray(Mt.pairwise_giou(jnp.asarray(xyxy[:1]), jnp.asarray(xyxy[:1])))
    np.testing.assert_allclose(giou_identical, 1.0, atol=1e-5)
    # The code under test against pixel counts (no formula shared), over every pair: a
    # 400x400 raster measures areas to ~1/400 of a side (largest difference measured: 0.007;
    # 12 of the 36 pairs overlap).
    raster = np.empty((6, 6))
    for i, ya in enumerate(xyxy[:6]):
        for j, yb in enumerate(xyxy[6:]):
            a, b = inside(ya), inside(yb)
            hull = inside([min(ya[0], yb[0]), min(ya[1], yb[1]),
                           max(ya[2], yb[2]), max(ya[3], yb[3])])
            union = (a | b).sum()
            raster[i, j] = (a & b).sum() / union - (hull.sum() - union) / hull.sum()
    np.testing.assert_allclose(got, raster, atol=0.01)
    assert np.abs(raster).max() > 0.1 and np.ptp(raster) > 0.2  # the boxes are not degenerate


def test_detr_loss_zero_at_truth_and_query_permutation_invariant():
    rng = np.random.default_rng(1)
    B, Q = 3, 8
    gt = np.zeros((B, Q, 4), np.float32)
    mask = np.zeros((B, Q), bool)
    for b in range(B):
        k = b + 2
        gt[b, :k] = np.concatenate([rng.uniform(0.2, 0.8, (k, 2)), np.full((k, 2), 0.2)], 1)
        mask[b, :k] = True
    perm = rng.permutation(Q)
    pred = gt[:, perm]
    logits = np.where(mask[:, perm, None], [[-20.0, 20.0]], [[20.0, -20.0]]).astype(np.float32)
    loss, parts = Mt.detr_loss(jnp.asarray(pred), jnp.asarray(logits), jnp.asarray(gt),
                               jnp.asarray(mask))
    assert float(loss) < 1e-4 and float(parts["loss_bbox"]) < 1e-6
    noisy = pred + rng.normal(0, 0.02, pred.shape).astype(np.float32)
    l1, _ = Mt.detr_loss(jnp.asarray(noisy), jnp.asarray(logits), jnp.asarray(gt), jnp.asarray(mask))
    p2 = rng.permutation(Q)
    l2, _ = Mt.detr_loss(jnp.asarray(noisy[:, p2]), jnp.asarray(logits[:, p2]), jnp.asarray(gt),
                         jnp.asarray(mask))
    np.testing.assert_allclose(float(l1), float(l2), rtol=1e-5)
    assert float(l1) > 1e-3


def test_poisson_binomial_and_comparison_by_enumeration():
    rng = np.random.default_rng(2)
    N = 6
    p = rng.uniform(0.01, 0.99, (2, N))
    lp = jnp.asarray(np.log(p), jnp.float32)
    l1mp = jnp.asarray(np.log1p(-p), jnp.float32)
    got = np.exp(np.asarray(M.log_poisson_binomial(lp, l1mp)))
    want = np.zeros((2, N + 1))
    for bits in itertools.product([0, 1], repeat=N):
        bits = np.array(bits)
        want[:, bits.sum()] += np.prod(np.where(bits, p, 1 - p), axis=1)
    np.testing.assert_allclose(got, want, atol=1e-5)
    lpmf = jnp.asarray(np.log(want), jnp.float32)
    gt, le = M.log_greater(lpmf[:1], lpmf[1:])
    p_gt = sum(want[0, a] * want[1, b] for a in range(N + 1) for b in range(N + 1) if a > b)
    np.testing.assert_allclose(float(np.exp(gt[0])), p_gt, atol=1e-5)
    np.testing.assert_allclose(float(np.exp(le[0])), 1 - p_gt, atol=1e-5)


@pytest.fixture(scope="module")
def tiny():
    params = M.init_params(TINY, jax.random.key(0))
    return jax.jit(M.make_apply(TINY)), params


@pytest.fixture(scope="module")
def tiny_random():
    """TINY with every parameter perturbed, so zero-initialised blocks are active too."""
    params = M.init_params(TINY, jax.random.key(0))
    leaves, tdef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    params = jax.tree.unflatten(tdef, [p + 0.3 * jax.random.normal(k, p.shape)
                                       for p, k in zip(leaves, keys)])
    return jax.jit(M.make_apply(TINY)), params


def _inputs(n=4, cell_px=16, seed=0):
    from gridvqa_jax.world import generate as G

    spec = U.Spec.feasible("pure", 5, 0.7)[0]
    sc = G.to_numpy(G.generate_chunk(spec, seed, 0, n))
    img = jax.vmap(lambda c, s: R.render(c, s, cell_px))(sc.color, sc.shape)
    return sc, img


def test_apply_shapes_and_normalised_answer(tiny):
    apply_fn, params = tiny
    sc, img = _inputs()
    out = apply_fn(params, img, sc.tokens)
    C = TINY.n_cells
    assert out["answer_logprobs"].shape == (4, C + 3)
    assert out["cell_logits"].shape == (4, C, 4)
    assert out["pred_boxes"].shape == (4, C, 4)
    np.testing.assert_allclose(np.asarray(jax.nn.logsumexp(out["answer_logprobs"], -1)), 0,
                               atol=1e-4)
    np.testing.assert_allclose(np.asarray(jax.nn.logsumexp(out["yesno_logprobs"], -1)), 0,
                               atol=1e-4)
    assert np.all(np.isfinite(np.asarray(out["answer_logprobs"])))


def test_apply_resizes_official_images(tiny):
    """A 64-px image equals its 4x4 area average given at the model's 16 px; odd sizes work."""
    apply_fn, params = tiny
    sc, img64 = _inputs(cell_px=64)
    pooled = np.asarray(img64, np.float32).reshape(4, 80, 4, 80, 4, 3).mean(axis=(2, 4))
    a = apply_fn(params, img64, sc.tokens)["answer_logprobs"]
    b = apply_fn(params, jnp.asarray(pooled), sc.tokens)["answer_logprobs"]
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4)
    _, img10 = _inputs(cell_px=10)
    assert apply_fn(params, img10, sc.tokens)["answer_logprobs"].shape == (4, TINY.n_cells + 3)


def test_pad_tokens_are_ignored(tiny_random):
    """PAD tokens are masked everywhere (attention, phrase convolution, pooling): the model never
    reads the PAD embedding."""
    apply_fn, params = tiny_random
    sc, img = _inputs()
    base = apply_fn(params, img, sc.tokens)["answer_logprobs"]
    # A PAD-masked key contributes nothing, so changing the embedding of PAD changes nothing.
    p2 = jax.tree.map(lambda x: x, params)
    p2["word_embed"]["embedding"] = params["word_embed"]["embedding"].at[U.PAD_ID].set(5.0)
    alt = apply_fn(p2, img, sc.tokens)["answer_logprobs"]
    np.testing.assert_allclose(np.asarray(base), np.asarray(alt), atol=1e-5)


def test_image_gradient_by_finite_differences(tiny_random):
    """d/d image of f = sum_b log P(predicted answer_b) (explainers differentiate this) along
    random per-pixel directions v ~ N(0, 1): central differences with eps = 1 grey level
    (1/255 at the model input) against jax.grad . v, in float32. Measured relative error
    ~1e-3; the gradient of a different answer's log-probability misses by > 30%."""
    apply_fn, params = tiny_random
    sc, img = _inputs()
    ans = jnp.argmax(apply_fn(params, img, sc.tokens)["answer_logprobs"], -1)
    img = jnp.asarray(img, jnp.float32)  # the model reads float images in 0..255 units

    @jax.jit
    def f(x, a):
        lp = apply_fn(params, x, sc.tokens)["answer_logprobs"]
        return jnp.take_along_axis(lp, a[:, None], 1).sum()

    grad = jax.jit(jax.grad(f))
    g, g_other = grad(img, ans), grad(img, (ans + 1) % TINY.n_answers)
    rng = np.random.default_rng(0)
    eps = 1.0
    fd, rev, other = [], [], []
    for _ in range(4):
        v = jnp.asarray(rng.normal(size=img.shape), jnp.float32)
        fd.append(float(f(img + eps * v, ans) - f(img - eps * v, ans)) / (2 * eps))
        rev.append(float(jnp.vdot(g, v)))
        other.append(float(jnp.vdot(g_other, v)))
    fd, rev, other = map(np.asarray, (fd, rev, other))
    assert np.linalg.norm(fd - rev) < 1e-2 * np.linalg.norm(fd)
    assert np.linalg.norm(fd - other) > 0.1 * np.linalg.norm(fd)


def test_answer_index_roundtrip():
    C = 25
    idx = np.asarray(M.answer_index(np.array([0, 3, 0, 1]), np.array([False, False, True, True]),
                                    C))
    assert idx.tolist() == [0, 3, C + 1, C + 2]
    assert [M.answer_string(i, C) for i in idx] == ["0", "3", "no", "yes"]


@pytest.mark.parametrize("S", [4, 5, 7])
def test_half_planes_are_the_universe_relations(S):
    """H[r, :, i] is exactly the region V of relation r around an anchor in cell i."""
    from mmx_base import layers
    from gridvqa_jax.world import regions

    H = layers.half_planes(S)
    for i in range(S * S):
        anchor = jnp.array([i % S, i // S], jnp.int32)
        for r in range(4):
            want = np.asarray(regions.relation_mask(jnp.int32(r), anchor, S))
            np.testing.assert_array_equal(H[r, :, i].astype(bool), want)


def test_half_plane_pool_against_loops():
    """HalfPlanePool recomputed cell by cell with explicit coordinate comparisons."""
    cfg = M.ModelConfig(grid_size=4, d_model=8, pool_gates=3)
    B, C, L = 2, 16, 5
    rng = np.random.default_rng(0)
    cells = rng.normal(size=(B, C, 8)).astype(np.float32)
    text = rng.normal(size=(B, L, 8)).astype(np.float32)
    tmask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    pool = M.HalfPlanePool(cfg)
    params = pool.init(jax.random.key(0), cells, text, tmask)["params"]
    params = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)
    got = np.asarray(pool.apply({"params": params}, cells, text, tmask))

    p = jax.tree.map(np.asarray, params)
    g = 1 / (1 + np.exp(-(cells @ p["gate"]["kernel"] + p["gate"]["bias"])))  # [B, C, m]
    want = np.zeros_like(got)
    for b in range(B):
        q = text[b][tmask[b]].mean(0)
        z = (q @ p["select"]["kernel"] + p["select"]["bias"]).reshape(4, 3)
        w = np.exp(z) / np.exp(z).sum(0, keepdims=True)
        for j in range(C):
            xj, yj = j % 4, j // 4
            sums = np.zeros((4, 3))
            for i in range(C):
                xi, yi = i % 4, i // 4
                for r, inside in enumerate([xj < xi, xj > xi, yj < yi, yj > yi]):
                    sums[r] += inside * g[b, i]
            feat = np.concatenate([sums.reshape(-1), (w * sums).sum(0)])
            want[b, j] = feat @ p["out"]["kernel"] + p["out"]["bias"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_half_plane_pool_starts_as_identity(tiny):
    """The pooling output projection starts at zero, so a fresh model ignores the pooled sums."""
    apply_fn, params = tiny
    sc, img = _inputs()
    base = apply_fn(params, img, sc.tokens)["answer_logprobs"]
    p2 = jax.tree.map(lambda x: x, params)
    p2["enc0"]["pool"]["gate"]["bias"] = params["enc0"]["pool"]["gate"]["bias"] + 2.0
    alt = apply_fn(p2, img, sc.tokens)["answer_logprobs"]
    np.testing.assert_allclose(np.asarray(base), np.asarray(alt), atol=1e-6)


def test_phrase_conv_is_local_and_skips_pad():
    """Output token t moves only when a token within t +- w//2 changes; a PAD token enters as
    zero, exactly like the zero padding past the end of the question."""
    cfg = M.ModelConfig(d_model=8, mlp_dim=16, phrase_width=5)
    B, L = 1, 12
    rng = np.random.default_rng(0)
    text = jnp.asarray(rng.normal(size=(B, L, 8)), jnp.float32)
    mask = jnp.ones((B, L), bool)
    block = M.PhraseConv(cfg)
    params = block.init(jax.random.key(0), text, mask)["params"]
    params = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)
    f = lambda t, m: np.asarray(block.apply({"params": params}, t, m))
    base = f(text, mask)
    moved = f(text.at[:, 6].add(jnp.asarray(rng.normal(size=8), jnp.float32)), mask)
    changed = np.abs(moved - base).max(axis=-1)[0] > 1e-6
    assert changed.tolist() == [abs(t - 6) <= 2 for t in range(L)]
    # Masking token 6 = feeding zeros in its place (after the LayerNorm) to the other tokens.
    masked = f(text, mask.at[:, 6].set(False))
    p = jax.tree.map(np.asarray, params)
    t = np.asarray(text)
    x = t - t.mean(-1, keepdims=True)
    x = x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-6) * p["norm"]["scale"] + p["norm"]["bias"]
    x[:, 6] = 0.0
    xp = np.pad(x, ((0, 0), (2, 2), (0, 0)))
    h = sum(xp[:, i:i + L] @ p["conv"]["kernel"][i] for i in range(5)) + p["conv"]["bias"]
    want = t + np.asarray(jax.nn.gelu(jnp.asarray(h))) @ p["out"]["kernel"] + p["out"]["bias"]
    keep = np.arange(L) != 6
    np.testing.assert_allclose(masked[:, keep], want[:, keep], rtol=1e-4, atol=1e-4)


def test_phrase_width_must_be_odd():
    with pytest.raises(ValueError, match="phrase_width"):
        M.ModelConfig(phrase_width=4)


def test_configs_refuse_what_training_or_the_format_cannot_hold():
    """Fewer object queries than the ground truth's one slot per cell, a cell size that the
    64-px area-averaging of ``hires_frac`` cannot reach, and a density without an official
    name are refused with the field named; their valid neighbours pass."""
    from mmx_base.errors import InputError

    with pytest.raises(ValueError, match="n_queries must be 0"):
        M.ModelConfig(n_queries=10)
    assert M.ModelConfig(n_queries=25).n_obj_queries == 25
    with pytest.raises(InputError, match="must divide 64"):
        TrainConfig(model=M.ModelConfig(cell_px=24))
    assert TrainConfig(model=M.ModelConfig(cell_px=24), hires_frac=0.0).hires_frac == 0.0
    with pytest.raises(ValueError, match="multiple of 0.1"):
        U.Spec("pure", 5, 0.72, 16)
    assert U.Spec("pure", 5, 0.7, 16).density_key == "d07"


def test_configs_reject_unknown_fields():
    """Saved configs with a stale or misspelt key fail with the key named, for every config."""
    from bias_jax.detectors import DetectorConfig
    from gridvqa_jax.training import train as T

    with pytest.raises(ValueError, match=r"model config fields: \['d_modle'\]"):
        M.ModelConfig.from_dict({"d_modle": 64})
    with pytest.raises(ValueError, match=r"train config fields: \['stepz'\]"):
        TrainConfig.from_dict({"stepz": 3})
    with pytest.raises(ValueError, match=r"DetectorConfig fields: \['kindd'\]"):
        DetectorConfig.from_json({"kindd": "image"})
    assert M.ModelConfig.from_dict({"d_model": 64}).d_model == 64
