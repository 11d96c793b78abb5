"""Localisation metrics against independent references: skimage's Otsu, plain numpy RMA / IoU /
RRA / pointing game, and the ground-truth views against the question's words."""

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.stats import rankdata
from skimage.filters import threshold_otsu

from gridvqa_jax import metrics as MX
from gridvqa_jax.world import universe as U


def _random_values(rng, kind, n):
    """One of a spread of distributions: continuous, heavy-tailed, bimodal, sparse, tied."""
    if kind == 0:
        return rng.random(n)
    if kind == 1:
        return np.abs(rng.standard_normal(n))
    if kind == 2:
        return rng.exponential(size=n) ** 3
    if kind == 3:
        return np.concatenate([rng.normal(1, 0.1, n // 2), rng.normal(5, 0.5, n - n // 2)])
    if kind == 4:  # integer-valued: a handful of distinct values, many ties
        return rng.integers(0, rng.integers(2, 20), n).astype(float)
    if kind == 5:  # sparse: ~90% exact zeros
        return rng.random(n) * (rng.random(n) < 0.1)
    if kind == 6:  # three distinct values only
        return rng.choice(rng.random(3), n)
    if kind == 7:  # lognormal over 40 decades (skimage's variance overflows to inf on some)
        return rng.lognormal(0, 3, n) * 10 ** rng.uniform(-20, 20)
    if kind == 8:  # one distinct positive value (skimage returns it)
        return np.where(rng.random(n) < 0.5, 0.0, rng.random())
    return np.zeros(n)  # all zero: no positive value


def _skimage_threshold(x):
    x = x[x > 0]
    return np.float32(threshold_otsu(x)) if x.size else np.float32(np.nan)


def test_otsu_threshold_matches_skimage_on_1000_maps():
    """Bit-exact against skimage on 1000 maps of 2..4096 values padded into one [1000, 4096]
    array; the padding holds NaN and must be ignored through ``valid``."""
    rng = np.random.default_rng(0)
    n_max, n_maps = 4096, 1000
    maps = np.full((n_maps, n_max), np.nan, np.float32)
    in_map = np.zeros((n_maps, n_max), bool)
    for i in range(n_maps):
        n = int(rng.integers(2, n_max)) if i % 3 else int(rng.integers(2, 64))
        maps[i, :n] = _random_values(rng, i % 10, n)
        in_map[i, :n] = True
    valid = in_map & (maps > 0)

    f = jax.jit(MX.otsu_threshold)
    t0 = time.perf_counter()
    ours = np.asarray(f(maps, valid))
    t1 = time.perf_counter()
    ours = np.asarray(f(maps, valid))
    t2 = time.perf_counter()
    with np.errstate(over="ignore"):
        ref = np.array([_skimage_threshold(m[k]) for m, k in zip(maps, in_map)])
    t3 = time.perf_counter()
    print(f"otsu 1000 maps: jax compile+run {t1 - t0:.2f}s, run {t2 - t1:.3f}s, "
          f"skimage {t3 - t2:.3f}s, max |t_ours - t_skimage| "
          f"{np.nanmax(np.abs(ours.astype(np.float64) - ref)):.3g}")

    assert ours.dtype == np.float32 and ours.shape == (n_maps,)
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(ref))
    np.testing.assert_array_equal(ours, ref)  # bit for bit, NaN where there is no positive value
    # Every all-zero map (plus a few short sparse ones) has no threshold; the rest all do.
    assert n_maps // 10 <= np.isnan(ref).sum() < n_maps // 8


def test_otsu_threshold_signed_values_and_no_mask():
    """Generic Otsu (no positivity filter): signed values, ``valid=None``, 2-D samples."""
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((20, 9, 7)) * rng.uniform(0.1, 100, (20, 1, 1))).astype(np.float32)
    ours = np.asarray(MX.otsu_threshold(x))
    ref = np.array([threshold_otsu(m) for m in x], np.float32)
    np.testing.assert_array_equal(ours, ref)
    # All values equal: skimage's degenerate case returns the value itself.
    assert MX.otsu_threshold(np.full((1, 5), -2.5, np.float32)).item() == -2.5


def _numpy_metrics(a, m):
    """Plain-numpy RMA, Otsu IoU, RRA and pointing game of one flattened sample.

    Ties in RRA and the pointing game count fractionally (the expectation over a random order
    among tied values): a feature whose descending rank spans [lo, hi] (scipy's "min" / "max"
    ranks) lies in the top K with probability clip(K - lo + 1, 0, hi - lo + 1) / (hi - lo + 1).
    """
    r, m = np.abs(a).ravel().astype(np.float64), m.ravel().astype(bool)
    if not m.any() or not (r > 0).any():
        return dict(rma=np.nan, iou=np.nan, rra=np.nan, pg=np.nan)
    t = threshold_otsu(np.abs(a).ravel()[r > 0])
    pred = np.abs(a).ravel() >= t
    k = int(m.sum())
    lo, hi = rankdata(-r, method="min"), rankdata(-r, method="max")
    p_top = np.clip(k - lo + 1, 0, hi - lo + 1) / (hi - lo + 1)
    p_max = np.clip(1 - lo + 1, 0, hi - lo + 1) / (hi - lo + 1)
    return dict(
        rma=r[m].sum() / r.sum(),
        iou=(m & pred).sum() / (m | pred).sum(),
        rra=p_top[m].sum() / k,
        pg=p_max[m].sum(),
    )


def _random_maps_and_masks(rng, b, shape):
    a = rng.standard_normal((b, *shape)).astype(np.float32)
    a[::4] *= rng.random((len(a[::4]), *shape)) < 0.2  # sparse maps
    a[1::4] = np.round(a[1::4] * 2) / 2  # many ties
    mask = rng.random((b, *shape)) < rng.uniform(0.05, 0.6, (b,) + (1,) * len(shape))
    a[6], mask[7] = 0.0, False  # an all-zero map and an empty mask
    return a, mask


@pytest.mark.parametrize("shape", [(12, 12), (32,)])
def test_metrics_match_numpy(shape):
    rng = np.random.default_rng(2)
    a, mask = _random_maps_and_masks(rng, 64, shape)
    ref = [_numpy_metrics(x, m) for x, m in zip(a, mask)]
    for name, fn in [("rma", MX.relevance_mass_accuracy), ("iou", MX.otsu_iou),
                     ("rra", MX.relevance_rank_accuracy), ("pg", MX.pointing_game)]:
        ours = np.asarray(fn(a, mask))
        assert ours.shape == (64,)
        np.testing.assert_allclose(ours, [r[name] for r in ref], rtol=1e-6, atol=0, err_msg=name)
    # The samples are informative: hits and misses, ties shared fractionally, NaN samples.
    pg = np.array([r["pg"] for r in ref])
    assert (pg == 0).any() and (pg == 1).any() and ((pg > 0) & (pg < 1)).any()
    assert np.isnan(pg).any()


def test_rra_and_pointing_without_ties_are_plain_top_k():
    """On tie-free maps: the K largest by a plain sort, the pointing game by a plain argmax."""
    rng = np.random.default_rng(6)
    a = rng.permutation(np.arange(1, 20 * 49 + 1, dtype=np.float32)).reshape(20, 7, 7)
    a *= rng.choice([-1, 1], a.shape)
    mask = rng.random((20, 7, 7)) < 0.3
    flat_a, flat_m = np.abs(a).reshape(20, -1), mask.reshape(20, -1)
    k = flat_m.sum(1)
    rra = [m[np.argsort(-x)[:n]].sum() / n for x, m, n in zip(flat_a, flat_m, k)]
    pg = [m[np.argmax(x)] for x, m in zip(flat_a, flat_m)]
    np.testing.assert_allclose(MX.relevance_rank_accuracy(a, mask), rra, rtol=1e-6)
    np.testing.assert_array_equal(MX.pointing_game(a, mask), pg)


def test_rra_and_pointing_tie_rule():
    """Tied values share their places: a constant map scores chance wherever the mask is."""
    a = np.array([[3.0, 1.0, 1.0, 1.0, 0.0]], np.float32)
    # K = 2: 3.0 is in, one place left for three tied 1.0s -> each counts 1/3.
    assert MX.relevance_rank_accuracy(a, np.array([[False, True, False, False, True]])).item() \
        == pytest.approx(1 / 6)
    const = np.ones((5, 10), np.float32)
    masks = np.zeros((5, 10), bool)
    for i in range(5):
        masks[i, i:i + 4] = True  # 4 of 10, at different positions
    np.testing.assert_allclose(MX.relevance_rank_accuracy(const, masks), 0.4, rtol=1e-6)
    np.testing.assert_allclose(MX.pointing_game(const, masks), 0.4, rtol=1e-6)


def test_empty_mask_and_zero_map_give_nan():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((4, 6, 6)).astype(np.float32)
    a[1] = 0.0
    a[2, ...] = -0.0
    mask = np.ones((4, 6, 6), bool)
    mask[3] = False
    for fn in (MX.relevance_mass_accuracy, MX.otsu_iou, MX.relevance_rank_accuracy,
               MX.pointing_game):
        s = np.asarray(fn(a, mask))
        assert np.isfinite(s[0]) and np.isnan(s[1:]).all(), fn.__name__
    assert np.isnan(MX.otsu_threshold(np.zeros((1, 3)), np.zeros((1, 3), bool))).all()


def test_summarise_excludes_and_counts_nan():
    s = np.array([[0.2, np.nan], [0.6, np.nan], [1.0, 0.4]])
    out = MX.summarise(s)
    assert out == {"mean": pytest.approx(0.55), "std": pytest.approx(np.std([0.2, 0.6, 1.0, 0.4])),
                   "n": 4, "n_excluded": 2}
    empty = MX.summarise(jnp.full((3,), jnp.nan))
    assert np.isnan(empty["mean"]) and np.isnan(empty["std"]) and empty["n"] == 0
    assert empty["n_excluded"] == 3


@pytest.mark.parametrize("fn", [MX.relevance_mass_accuracy, MX.otsu_iou,
                                MX.relevance_rank_accuracy, MX.pointing_game])
def test_leading_axes_and_jit_equal_per_sample_loop(fn):
    rng = np.random.default_rng(4)
    a, mask = _random_maps_and_masks(rng, 15, (8, 8))
    a, mask = a.reshape(3, 5, 8, 8), mask.reshape(3, 5, 8, 8)
    batched = np.asarray(jax.jit(functools.partial(fn, sample_ndim=2))(a, mask))
    loop = np.array([[fn(a[i, j], mask[i, j], sample_ndim=2).item() for j in range(5)]
                     for i in range(3)])
    assert batched.shape == (3, 5)
    # Equal up to the summation order XLA picks for a batch.
    np.testing.assert_allclose(batched, loop, rtol=1e-6)
    # Quantus default: axis 0 is the batch; one mask broadcast over the batch.
    np.testing.assert_allclose(fn(a[0], mask[0, 0]), [fn(x, mask[0, 0], sample_ndim=2)
                                                     for x in a[0]], rtol=1e-6)


def test_ground_truth_views(pure07):
    _, batch = pure07
    cell_px = 8
    cells = np.asarray(MX.visual_ground_truth(batch, cell_px, level="cell"))
    pix = np.asarray(MX.visual_ground_truth(batch, cell_px, level="pixel"))
    np.testing.assert_array_equal(cells, batch.gt_cells)
    assert pix.dtype == bool and pix.shape == (len(cells), 5 * cell_px, 5 * cell_px)
    np.testing.assert_array_equal(pix, np.kron(cells, np.ones((1, cell_px, cell_px))) > 0)
    # Ground-truth tokens are exactly the attribute and direction words of the question
    # ("objects", "of" outside relations etc. do not occur as attributes; "of" only in "left of").
    words = np.array(U.VOCAB)[np.asarray(batch.tokens)]
    named = set(U.COLORS) | set(U.SHAPES) | {s + "s" for s in U.SHAPES}
    named |= {"left", "right", "of", "above", "below"}
    text = np.asarray(MX.textual_ground_truth(batch))
    np.testing.assert_array_equal(text, np.isin(words, sorted(named)))
    with pytest.raises(ValueError, match="level"):
        MX.visual_ground_truth(batch, cell_px, level="box")


def test_cell_and_pixel_level_agree_for_per_cell_maps():
    rng = np.random.default_rng(5)
    cell_px, s = 4, 5
    cell_map = rng.standard_normal((32, s, s)).astype(np.float32)
    cell_map[::3] *= rng.random((11, s, s)) < 0.3
    gt = rng.random((32, s, s)) < 0.3

    class _Scene:  # visual_ground_truth only reads gt_cells
        gt_cells = gt

    pix_map = MX.upsample_cells(cell_map, cell_px)
    assert pix_map.shape == (32, s * cell_px, s * cell_px)
    np.testing.assert_allclose(pix_map.sum((1, 2)), cell_map.sum((1, 2)), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(pix_map[:, :cell_px, :cell_px],
                                  np.broadcast_to(cell_map[:, :1, :1] / cell_px**2,
                                                  (32, cell_px, cell_px)))
    cell_gt = MX.visual_ground_truth(_Scene, cell_px, "cell")
    pix_gt = MX.visual_ground_truth(_Scene, cell_px, "pixel")
    for fn in (MX.relevance_mass_accuracy, MX.relevance_rank_accuracy, MX.pointing_game,
               MX.otsu_iou):
        np.testing.assert_allclose(fn(pix_map, pix_gt), fn(cell_map, cell_gt), rtol=1e-6,
                                   err_msg=fn.__name__)
