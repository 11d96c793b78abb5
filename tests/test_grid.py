"""Tests of mmx_base.grid (cells <-> pixels, masking cells) and of its callers.

Each primitive is checked against an independent computation (np.kron, explicit loops) and
against the formula each caller used before it shared the module, bit for bit.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mmx_base import grid


def _cells(shape, seed=0, dtype=bool):
    rng = np.random.default_rng(seed)
    return (rng.random(shape) > 0.5).astype(dtype)


# ----------------------------------------------------------------------------------------------
# The formulas the callers held before (copied as they were), the reference for equality.
# ----------------------------------------------------------------------------------------------
def old_pixel_mask(cell_mask, cell_px):  # world/render.pixel_mask
    m = (jnp.asarray(cell_mask) != 0).astype(jnp.uint8)
    *lead, s_y, s_x = m.shape
    blocks = jnp.broadcast_to(m[..., :, None, :, None], (*lead, s_y, cell_px, s_x, cell_px))
    return blocks.reshape(*lead, s_y * cell_px, s_x * cell_px)


def old_upsample_cells(cell_map, cell_px):  # metrics.upsample_cells
    m = jnp.asarray(cell_map)
    m = m.astype(jnp.promote_types(m.dtype, jnp.float32)) / (cell_px * cell_px)
    *lead, s_y, s_x = m.shape
    blocks = jnp.broadcast_to(m[..., :, None, :, None], (*lead, s_y, cell_px, s_x, cell_px))
    return blocks.reshape(*lead, s_y * cell_px, s_x * cell_px)


def old_cells_to_pixels(cells, height, width):  # bias_jax.views.causal
    s = cells.shape[-1]
    rows = (np.arange(height) * s) // height
    cols = (np.arange(width) * s) // width
    return jnp.asarray(cells)[:, rows][:, :, cols]


def old_pixels_to_cells(mask, grid_size):  # bias_jax.views.causal
    m = np.asarray(mask)
    n, h, w = m.shape
    return m.reshape(n, grid_size, h // grid_size, grid_size, w // grid_size).any(axis=(2, 4))


def old_mask_cells_white(image, cell_mask, P):  # explain/perturb.mask_cells
    from gridvqa_jax.world import render as R

    image = jnp.asarray(image)
    S = int(np.shape(cell_mask)[-1])
    empty = jnp.asarray(R.tile_table(P)[0], image.dtype)
    pixels = old_pixel_mask(cell_mask, P).astype(bool)[..., None]
    shape = jnp.broadcast_shapes(pixels.shape[:-1] + (3,), image.shape)
    blank = jnp.broadcast_to(jnp.tile(empty, (S, S, 1)), shape)
    return jnp.where(jnp.broadcast_to(pixels, shape), blank, jnp.broadcast_to(image, shape))


def old_pixel_grads_to_cells(grad, S, absolute=True):  # explain/perturb.pixel_grads_to_cells
    g = jnp.asarray(grad)
    *lead, H, W, ch = g.shape
    P = H // S
    g = jnp.abs(g) if absolute else g
    return g.reshape(*lead, S, P, S, P, ch).sum(axis=(-4, -2, -1))


# ----------------------------------------------------------------------------------------------
# upsample / upsample_to
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("s,p", [(5, 1), (4, 3), (5, 16), (3, 7)])
def test_upsample_is_kron(s, p):
    cells = np.random.default_rng(s * p).integers(-3, 9, (s, s)).astype(np.int32)
    want = np.kron(cells, np.ones((p, p), np.int32))
    got = grid.upsample(cells, p)
    assert isinstance(got, np.ndarray) and got.dtype == np.int32
    np.testing.assert_array_equal(got, want)
    got_j = jax.jit(grid.upsample, static_argnums=1)(jnp.asarray(cells), p)
    assert isinstance(got_j, jax.Array) and got_j.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(got_j), want)
    batch = grid.upsample(np.stack([cells, -cells]), p)
    assert batch.shape == (2, s * p, s * p)
    np.testing.assert_array_equal(batch[1], -want)


def test_upsample_non_square_grid():
    cells = np.arange(6).reshape(2, 3)
    np.testing.assert_array_equal(grid.upsample(cells, 2), np.kron(cells, np.ones((2, 2), int)))
    with pytest.raises(ValueError, match="cell_px"):
        grid.upsample(cells, 0)


@pytest.mark.parametrize("h,w", [(80, 80), (13, 11), (5, 5), (7, 20)])
def test_upsample_to_matches_nearest_index(h, w):
    cells = _cells((3, 5, 5), seed=h + w)
    got = grid.upsample_to(jnp.asarray(cells), h, w)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(old_cells_to_pixels(cells, h, w)))
    loop = np.array([[[c[y * 5 // h, x * 5 // w] for x in range(w)] for y in range(h)]
                     for c in cells])
    np.testing.assert_array_equal(np.asarray(got), loop)
    if h == w and h % 5 == 0:
        np.testing.assert_array_equal(np.asarray(got), grid.upsample(cells, h // 5))


# ----------------------------------------------------------------------------------------------
# pool
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("reduce", grid.REDUCTIONS)
def test_pool_matches_loop(reduce):
    rng = np.random.default_rng(1)
    pix = rng.normal(size=(2, 12, 8)).astype(np.float32)
    if reduce == "any":
        pix = pix > 1.5
    fn = {"sum": np.sum, "mean": np.mean, "max": np.max, "any": np.any}[reduce]
    want = np.array([[[fn(p[y * 3:(y + 1) * 3, x * 2:(x + 1) * 2]) for x in range(4)]
                      for y in range(4)] for p in pix])
    got = grid.pool(pix, 4, reduce)
    assert isinstance(got, np.ndarray) and got.shape == (2, 4, 4)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(grid.pool(jnp.asarray(pix), 4, reduce)), want,
                               rtol=1e-6)


def test_pool_inverts_upsample():
    cells = np.random.default_rng(2).normal(size=(3, 5, 5))
    for reduce in ("mean", "max"):
        np.testing.assert_allclose(grid.pool(grid.upsample(cells, 4), 5, reduce), cells)
    np.testing.assert_allclose(grid.pool(grid.upsample(cells, 4), 5, "sum"), 16 * cells)


def test_pool_errors():
    with pytest.raises(ValueError, match="whole cells"):
        grid.pool(np.zeros((10, 11)), 5, "sum")
    with pytest.raises(ValueError, match="reduce"):
        grid.pool(np.zeros((10, 10)), 5, "median")


# ----------------------------------------------------------------------------------------------
# mask_cells
# ----------------------------------------------------------------------------------------------
def _loop_mask(image, cells, fill):
    out = image.copy()
    n, H, W, _ = image.shape
    S = cells.shape[-1]
    for i in range(n):
        for y in range(S):
            for x in range(S):
                if cells[i, y, x]:
                    ys = slice(y * H // S, (y + 1) * H // S)
                    xs = slice(x * W // S, (x + 1) * W // S)
                    out[i, ys, xs] = fill if np.ndim(fill) < 3 else fill[ys, xs]
    return out


@pytest.mark.parametrize("fill", [0, 255, (128, 64, 32)])
def test_mask_cells_constant_fill(fill):
    rng = np.random.default_rng(3)
    image = rng.integers(0, 256, (2, 20, 20, 3), dtype=np.uint8)
    cells = _cells((2, 4, 4), seed=4)
    want = _loop_mask(image, cells, np.asarray(fill, np.uint8))
    got = grid.mask_cells(image, cells, fill)
    assert isinstance(got, np.ndarray) and got.dtype == np.uint8
    np.testing.assert_array_equal(got, want)
    got_j = jax.jit(lambda i, c: grid.mask_cells(i, c, jnp.asarray(fill)))(jnp.asarray(image),
                                                                        jnp.asarray(cells))
    assert got_j.dtype == jnp.uint8
    np.testing.assert_array_equal(np.asarray(got_j), want)


def test_mask_cells_image_fill_and_broadcast():
    rng = np.random.default_rng(5)
    image = rng.normal(size=(3, 15, 15, 3)).astype(np.float32)
    background = rng.normal(size=(15, 15, 3)).astype(np.float32)
    cells = _cells((5, 5), seed=6)  # one mask for every image of the batch
    got = grid.mask_cells(jnp.asarray(image), cells, background)
    assert isinstance(got, jax.Array) and got.shape == image.shape
    want = _loop_mask(image, np.broadcast_to(cells, (3, 5, 5)), background)
    np.testing.assert_array_equal(np.asarray(got), want)
    # One image, a batch of masks: broadcast the other way.
    many = _cells((4, 5, 5), seed=7)
    got = grid.mask_cells(image[0], many, 0.0)
    assert got.shape == (4, 15, 15, 3)
    np.testing.assert_array_equal(got, _loop_mask(np.broadcast_to(image[:1], (4, 15, 15, 3))
                                                  .copy(), many, 0.0))


def test_mask_cells_non_multiple_size_uses_nearest_cell():
    image = np.arange(2 * 13 * 11 * 3, dtype=np.int32).reshape(2, 13, 11, 3)
    cells = _cells((2, 5, 5), seed=8)
    pix = np.asarray(old_cells_to_pixels(cells, 13, 11))
    want = np.where(pix[..., None], -1, image)  # bias_jax.analysis masks with zeros this way
    np.testing.assert_array_equal(grid.mask_cells(image, cells, -1), want)


# ----------------------------------------------------------------------------------------------
# The callers, against their former formulas.
# ----------------------------------------------------------------------------------------------
def test_render_pixel_mask_unchanged():
    from gridvqa_jax.world import render as R

    cells = np.random.default_rng(9).integers(0, 3, (2, 5, 5))
    for p in (5, 16):
        got, want = R.pixel_mask(cells, p), old_pixel_mask(cells, p)
        assert got.dtype == want.dtype == jnp.uint8
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_metrics_upsample_cells_unchanged():
    from gridvqa_jax import metrics as MX

    m = np.random.default_rng(10).normal(size=(2, 5, 5)).astype(np.float32)
    for x in (m, m.astype(np.int32)):
        got, want = MX.upsample_cells(x, 8), old_upsample_cells(x, 8)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_causal_cells_pixels_unchanged():
    from bias_jax.views import causal as CV

    cells = _cells((2, 5, 5), seed=12)
    for h, w in ((80, 80), (13, 11)):
        np.testing.assert_array_equal(np.asarray(CV.cells_to_pixels(cells, h, w)),
                                      np.asarray(old_cells_to_pixels(cells, h, w)))
    pix = np.random.default_rng(13).random((2, 80, 40)) > 0.99
    got = CV.pixels_to_cells(pix, 5)
    assert isinstance(got, np.ndarray) and got.dtype == bool
    np.testing.assert_array_equal(got, old_pixels_to_cells(pix, 5))


def test_perturb_mask_and_grads_unchanged():
    from gridvqa_jax.explain import perturb as PT

    rng = np.random.default_rng(14)
    image = jnp.asarray(rng.integers(0, 256, (2, 40, 40, 3), dtype=np.uint8))
    cells = _cells((2, 5, 5), seed=15)
    for im in (image, image.astype(jnp.float32)):
        got, want = PT.mask_cells(im, cells), old_mask_cells_white(im, cells, 8)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    one = _cells((5, 5), seed=16)  # one mask broadcast over the batch
    np.testing.assert_array_equal(np.asarray(PT.mask_cells(image, one)),
                                  np.asarray(old_mask_cells_white(image, one, 8)))
    g = jnp.asarray(rng.normal(size=(2, 40, 40, 3)).astype(np.float32))
    for absolute in (True, False):
        np.testing.assert_array_equal(np.asarray(PT.pixel_grads_to_cells(g, 5, absolute)),
                                      np.asarray(old_pixel_grads_to_cells(g, 5, absolute)))


def test_square_grid_configs():
    """n_cells (one definition, grid.SquareGrid) on every config, and not a stored field."""
    from bias_jax import detectors as D
    from bias_jax.data import closed_world as CW
    from gridvqa_jax.models import mdetr as M
    from gridvqa_jax.world import universe as U

    configs = (U.Spec.feasible("pure", 4, 0.7)[0], M.ModelConfig(grid_size=3),
               D.DetectorConfig(), CW.WorldSpec())
    for cfg in configs:
        assert isinstance(cfg, grid.SquareGrid)
        assert cfg.n_cells == cfg.grid_size ** 2
        assert "n_cells" not in {f.name for f in dataclasses.fields(cfg)}
