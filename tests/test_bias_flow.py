"""Modality flow (bias_jax.views.flow) and the lvlm's attention-only route to its output token.

Every expected value is computed independently: saliency by finite differences through the
attention tap, aggregations and normalisation in numpy loops, the LIME ridge by weighted least
squares (numpy lstsq on the sqrt-weighted, alpha-augmented system) and LIME itself by a numpy
re-assembly of the perturbed inputs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bias_jax import detectors as D
from bias_jax.data import closed_world as CW
from bias_jax.data.text import PAD_ID
from bias_jax.views import flow as FV
from mmx_base import lime as LIME

SPEC = CW.WorldSpec()


def tiny() -> D.DetectorConfig:
    return D.DetectorConfig(kind="lvlm", d_model=16, mlp_dim=32, n_gates=4, n_layers=2,
                            n_heads=2)


@pytest.fixture(scope="module")
def batch():
    return CW.load_closed_world(SPEC, 11, 8)


@pytest.fixture(scope="module")
def params():
    return D.init_params(tiny(), jax.random.key(3))


def _pin_output_row(cfg: D.DetectorConfig, layer: int) -> dict:
    """attention_override collection: the output token's row of ``layer`` attends only to
    itself (all heads); every other probability is left as computed (NaN)."""
    N = cfg.seq_len
    keep = np.full((1, 1, N, N), np.nan, np.float32)
    pinned = keep.copy()
    pinned[..., N - 1, :] = 0.0
    pinned[..., N - 1, N - 1] = 1.0
    return {f"bert_{i}": {"layer": {"attention": {"self": {"attention": jnp.asarray(
        pinned if i == layer else keep)}}}} for i in range(cfg.n_layers)}


def _check_no_bypass(cfg, p, batch, other):
    """One compiled probe: logits with the last layer's output row pinned to itself for four
    input pairs, d logit / d pixels pinned and free, and logits pinned on the first layer."""
    mod, last = D.module(cfg), cfg.n_layers - 1
    pinned = {"params": p, "attention_override": _pin_output_row(cfg, last)}
    early = {"params": p, "attention_override": _pin_output_row(cfg, 0)}
    image = jnp.asarray(batch.image, jnp.float32)
    images = jnp.concatenate([image, jnp.asarray(other.image, jnp.float32), image,
                              jnp.zeros_like(image)])
    tokens = jnp.concatenate([batch.tokens, batch.tokens, other.tokens,
                              D.placeholder_text(batch.tokens)])

    @jax.jit
    def probe(images, tokens, image):
        out = mod.apply(pinned, images, tokens)
        g_pin = jax.grad(lambda im: mod.apply(pinned, im, tokens[:8]).sum())(image)
        g_free = jax.grad(lambda im: mod.apply({"params": p}, im, tokens[:8]).sum())(image)
        return out, g_pin, g_free, mod.apply(early, image, tokens[:8])

    out, g_pin, g_free, out_early = (np.asarray(v) for v in probe(images, tokens, image))
    # Other images, other claims, absent inputs: the pinned output is one constant ...
    assert np.ptp(out) == 0.0, np.ptp(out)
    assert not g_pin.any()  # ... and d logit / d pixels is exactly 0.
    # Controls: unpinned, or pinned on an earlier layer, the output depends on the inputs.
    assert np.abs(g_free).max() > 0
    if cfg.n_layers > 1:
        assert np.ptp(out_early) > 0


def test_output_token_reads_inputs_only_through_last_attention(batch, params):
    _check_no_bypass(tiny(), params, batch, CW.load_closed_world(SPEC, 12, 8))


def test_shipped_lvlm_has_no_route_around_attention(batch):
    _, p, cfg = D.load_detector("lvlm")
    _check_no_bypass(cfg, p, batch, CW.load_closed_world(SPEC, 12, 8))


def test_isolation_bias():
    b = D.output_isolation_bias(5)
    assert (b[4, :4] < -1e8).all() and b[4, 4] == 0 and (b[:4, 4] < -1e8).all()
    assert (b[:4, :4] == 0).all()


# ----------------------------------------------------------------------------------------------
# Attention saliency (eq. 4) against finite differences.
# ----------------------------------------------------------------------------------------------
def test_attention_saliency_finite_differences(batch, params):
    cfg = tiny()
    image, tokens, label = batch.image[:2], batch.tokens[:2], batch.label[:2]
    s = np.asarray(jax.jit(FV.attention_saliency, static_argnums=(0,))(
        cfg, params, image, tokens, label))
    N, C = cfg.seq_len, cfg.n_cells
    assert s.shape == (2, N)
    _, attn = D.apply_with_attentions(cfg, params, image, tokens)
    A = np.asarray(attn[-1], np.float64)  # [B, h, N, N]
    zeros = D.attention_perturbations(cfg, params, image, tokens)
    last = f"bert_{cfg.n_layers - 1}"
    y = (np.asarray(label) == 1).astype(np.float64)

    @jax.jit
    def logits_at(delta):
        t = jax.tree.map(lambda z: z, zeros)
        t[last]["layer"]["attention"]["self"]["attention"] = delta
        return D.apply_with_attentions(cfg, params, image, tokens, t)[0]

    def loss(delta):  # per-sample BCE in numpy, float64
        z = np.asarray(logits_at(delta), np.float64)
        return np.log1p(np.exp(-z)) * y + np.log1p(np.exp(z)) * (1 - y)

    eps = 1e-2
    keys = [0, C // 2, C, N - 1]  # an image cell, another, the first word, OT itself
    for k in keys:
        manual = np.zeros(2)
        for h in range(cfg.n_heads):
            e = np.zeros((2, cfg.n_heads, N, N), np.float32)
            e[:, h, N - 1, k] = eps
            fd = (loss(jnp.asarray(e)) - loss(jnp.asarray(-e))) / (2 * eps)  # [B]
            manual += A[:, h, N - 1, k] * fd
        np.testing.assert_allclose(s[:, k], np.abs(manual), rtol=3e-2, atol=1e-6)
    # PAD keys get no attention, hence no saliency.
    pad = np.asarray(tokens) == PAD_ID
    assert (s[:, C:C + tokens.shape[1]][pad] < 1e-7).all()


# ----------------------------------------------------------------------------------------------
# Aggregation and normalisation against numpy loops.
# ----------------------------------------------------------------------------------------------
def test_aggregations_against_numpy():
    rng = np.random.default_rng(0)
    C, L, B = 6, 5, 7
    s = rng.uniform(0, 1, (B, C + L + 1)).astype(np.float32)
    mask = rng.uniform(size=(B, L)) < 0.6
    mask[0] = False  # a sample without words
    for how in FV.AGGREGATIONS:
        it, tt = (np.asarray(v) for v in FV.aggregate(jnp.asarray(s), C, jnp.asarray(mask), how))
        for b in range(B):
            img = list(s[b, :C])
            words = [s[b, C + j] for j in range(L) if mask[b, j]]
            exp_it = {"sum": sum(img), "mean": sum(img) / C, "max": max(img)}[how]
            exp_tt = ({"sum": sum(words), "mean": sum(words) / len(words), "max": max(words)}[how]
                      if words else 0.0)
            assert it[b] == pytest.approx(exp_it, rel=1e-5)
            assert tt[b] == pytest.approx(exp_tt, rel=1e-5, abs=1e-7)
    with pytest.raises(ValueError, match="aggregation"):
        FV.aggregate(jnp.asarray(s), C, jnp.asarray(mask), "median")


def test_normalise():
    it, tt = FV.normalise(jnp.array([3.0, 0.0, 0.0, 1.0]), jnp.array([1.0, 2.0, 0.0, 1.0]))
    np.testing.assert_allclose(np.asarray(it), [0.75, 0.0, 0.5, 0.5])
    np.testing.assert_allclose(np.asarray(tt), [0.25, 1.0, 0.5, 0.5])


# ----------------------------------------------------------------------------------------------
# LIME: kernel, ridge and the perturbation assembly.
# ----------------------------------------------------------------------------------------------
def _np_kernel(Z, ref, width=0.25):
    d = []
    for z in Z:
        nz = np.linalg.norm(z) * np.linalg.norm(ref)
        d.append(1.0 - (z @ ref) / nz if nz > 0 else 1.0)
    d = np.asarray(d)
    return np.sqrt(np.exp(-d ** 2 / width ** 2))


def _np_ridge(X, y, w, alpha=1.0):
    """argmin sum_i w_i (y_i - b - X_i beta)^2 + alpha |beta|^2 by lstsq (b unpenalised)."""
    n, f = X.shape
    sw = np.sqrt(w)
    A = np.vstack([np.hstack([sw[:, None], sw[:, None] * X]),
                   np.hstack([np.zeros((f, 1)), np.sqrt(alpha) * np.eye(f)])])
    rhs = np.concatenate([sw * y, np.zeros(f)])
    sol = np.linalg.lstsq(A, rhs, rcond=None)[0]
    return sol[1:], sol[0]


def test_weighted_ridge_against_lstsq():
    rng = np.random.default_rng(1)
    X = rng.integers(0, 2, (60, 9)).astype(np.float64)
    X[:, 4] = 0.0  # a constant column (a PAD position) gets coefficient 0
    y = X @ rng.normal(size=9) + 0.1 * rng.normal(size=60)
    w = rng.uniform(0.05, 1.0, 60)
    coef, b = LIME.weighted_ridge(*(jnp.asarray(a, jnp.float32) for a in (X, y, w)), 1.0)
    ec, eb = _np_ridge(X, y, w)
    np.testing.assert_allclose(np.asarray(coef), ec, rtol=1e-4, atol=1e-5)
    assert float(b) == pytest.approx(eb, rel=1e-4, abs=1e-5)
    assert abs(float(coef[4])) < 1e-6


def test_lime_kernel_against_numpy():
    rng = np.random.default_rng(2)
    Z = rng.integers(0, 2, (20, 7)).astype(np.float32)
    Z[0] = 0.0
    ref = np.array([1, 1, 1, 1, 1, 0, 0], np.float32)
    Z[:, ref == 0] = 0.0  # as in the view: non-features (PAD positions) are never on

    def kernel(z):
        d = LIME.cosine_distance_to_ones(jnp.asarray(z, bool), jnp.asarray(ref, bool))
        return np.asarray(LIME.exponential_kernel(d, FV.LIME_KERNEL_WIDTH))

    np.testing.assert_allclose(kernel(Z), _np_kernel(Z, ref), rtol=1e-5, atol=1e-6)
    assert float(kernel(ref[None])[0]) == pytest.approx(1.0)


def test_lime_saliency_against_numpy_reassembly(batch, params):
    cfg, n = tiny(), 24
    image, tokens, label = batch.image[:2], batch.tokens[:2], batch.label[:2]
    key = jax.random.key(5)
    lime = jax.jit(FV.lime_saliency, static_argnums=0, static_argnames="n_samples")
    got = np.asarray(lime(cfg, params, image, tokens, label, key, n_samples=n))
    S, P, C, L = cfg.grid_size, SPEC.cell_px, cfg.n_cells, tokens.shape[1]
    # The same masks (the module's documented draw), assembled and solved in numpy.
    z = np.asarray(jax.random.bernoulli(key, 0.5, (2, n, C + L)))
    apply = jax.jit(D.make_apply(cfg))
    for b in range(2):
        feat = np.concatenate([np.ones(C, bool), np.asarray(tokens[b]) != PAD_ID])
        zb = z[b].copy()
        zb[0] = True
        zb &= feat
        imgs = np.repeat(np.asarray(image[b])[None], n, 0)
        toks = np.repeat(np.asarray(tokens[b])[None], n, 0)
        for i in range(n):
            for c in range(C):
                if not zb[i, c]:
                    y0, x0 = divmod(c, S)
                    imgs[i, y0 * P:(y0 + 1) * P, x0 * P:(x0 + 1) * P] = 0
            toks[i, ~zb[i, C:]] = PAD_ID
        logit = np.asarray(apply(params, imgs, toks), np.float64)
        p_real = 1 / (1 + np.exp(-logit))
        prob = p_real if int(label[b]) == 1 else 1 - p_real
        w = _np_kernel(zb.astype(np.float64), feat.astype(np.float64))
        coef, _ = _np_ridge(zb.astype(np.float64), prob, w)
        np.testing.assert_allclose(got[b], np.abs(coef) * feat, rtol=2e-3, atol=2e-5)


# ----------------------------------------------------------------------------------------------
# The view.
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("saliency", FV.SALIENCIES)
def test_flow_view_small_batch(batch, params, saliency):
    dets = {"lvlm": (None, params, tiny())}
    res = FV.flow_view(dets, batch, saliency=saliency, chunk=3, n_lime=16)
    assert res.label.shape == (8,) and res.label.dtype == np.int32
    assert set(np.unique(res.label)) <= {0, 1, 2}
    np.testing.assert_allclose(res.score, res.extras["S_it"] - res.extras["S_tt"], atol=1e-6)
    np.testing.assert_allclose(res.extras["S_it"] + res.extras["S_tt"], 1.0, atol=1e-5)
    expect = np.where(np.abs(res.score) < 0.25, 1, np.where(res.score > 0, 0, 2))
    np.testing.assert_array_equal(res.label, expect)
    if saliency == "attention":  # chunking does not change a sample's result
        whole = FV.flow_view(dets, batch, chunk=8)
        np.testing.assert_allclose(whole.score, res.score, atol=1e-5)
