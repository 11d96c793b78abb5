"""Localisation metrics for attribution maps against GridVQA-X's ground truth (Quantus style).

Every metric is ``metric(attribution, mask, *, sample_ndim=None) -> scores``: the last
``sample_ndim`` axes of ``attribution`` form one sample (a visual map ``[H, W]`` or ``[S, S]``, a
textual map ``[L]``) and the metric is vmapped over all leading axes, so a ``[B, H, W]`` batch
gives ``[B]`` scores and a ``[R, B, H, W]`` stack gives ``[R, B]``. ``sample_ndim=None`` follows
Quantus (``a_batch`` / ``s_batch``): axis 0 is the batch and the rest is one sample. ``mask`` is
boolean (nonzero = ground truth) and broadcasts against ``attribution`` (one mask for a whole
batch works). All metrics are pure jnp, jit- and vmap-friendly, with no data-dependent shapes.

Conventions of the GridVQA-X release (Table 1 of the paper): relevance is ``|a|``; RMA is the
share of ``|a|`` inside the mask; Otsu IoU binarises ``|a| >= t`` with ``t`` Otsu's threshold
(256 bins, ``skimage.filters.threshold_otsu``) of the strictly positive ``|a|``. Also Relevance
Rank Accuracy (Arras et al. 2022, CLEVR-XAI) and the pointing game (Zhang et al. 2018).

Where the release is wrong we do better: it scores a sample with an empty mask or an all-zero
map as 0, which is no measurement at all and drags the mean down. Here such samples score NaN,
and ``summarise`` excludes them and counts them (``n_excluded``).

Ground truth (``visual_ground_truth``, ``textual_ground_truth``) comes from the Scene: the cells
of the anchors and counted targets (A ∪ T), at pixel or cell level, and the tokens naming target
attributes, anchor attributes and relations.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from mmx_base import grid
from gridvqa_jax.world.render import pixel_mask

__all__ = [
    "OTSU_BINS",
    "otsu_threshold",
    "otsu_iou",
    "relevance_mass_accuracy",
    "relevance_rank_accuracy",
    "pointing_game",
    "summarise",
    "visual_ground_truth",
    "textual_ground_truth",
    "upsample_cells",
]

_STATIC = ("sample_ndim", "nbins")  # the static arguments of the jitted metrics
OTSU_BINS = 256  # skimage.filters.threshold_otsu's default nbins, used by the GridVQA-X release


# ---------------------------------------------------------------------------------------------
# Batching over leading axes.


def _per_sample(fn, sample_ndim, *arrays):
    """Apply ``fn`` (on flat 1-D samples ``[N]``) over the trailing ``sample_ndim`` axes.

    The arrays are broadcast to one shape, the trailing axes flattened to ``N`` (row-major, so
    flat index order is C order over the sample's axes) and ``fn`` vmapped over the leading axes.
    """
    arrays = jnp.broadcast_arrays(*(jnp.asarray(a) for a in arrays))
    shape = arrays[0].shape
    if sample_ndim is None:
        sample_ndim = max(len(shape) - 1, 0)
    if not 0 <= sample_ndim <= len(shape):
        raise ValueError(f"sample_ndim={sample_ndim} for arrays of shape {shape}")
    lead = shape[: len(shape) - sample_ndim]
    n = math.prod(shape[len(shape) - sample_ndim:])
    flat = [a.reshape(-1, n) for a in arrays]
    return jax.vmap(fn)(*flat).reshape(lead)


def _relevance(attribution):
    """``|a|`` as a floating array (float32 unless the input is already a wider float)."""
    a = jnp.asarray(attribution)
    return jnp.abs(a.astype(jnp.promote_types(a.dtype, jnp.float32)))


# ---------------------------------------------------------------------------------------------
# Otsu's threshold.


def _sequential_cumsum(xs):
    """Left-to-right cumulative sums of the columns of ``xs [N, k]``, one addition at a time.

    numpy's ``cumsum`` is a plain running sum; XLA's ``cumsum`` is a parallel prefix sum whose
    roundings differ. Otsu's argmax is decided among values that can tie exactly (equal-count
    symmetric histograms), so the running sums are reproduced addition by addition.
    """
    def step(carry, x):
        carry = carry + x
        return carry, carry

    _, out = jax.lax.scan(step, jnp.zeros_like(xs[0]), xs, unroll=8)
    return out


def _otsu_1d(x, valid, nbins):
    """Otsu threshold of the values ``x[valid]`` (1-D ``x``); NaN when none is valid."""
    dt = x.dtype
    valid = valid.astype(bool)
    n_valid = jnp.sum(valid)
    lo = jnp.min(jnp.where(valid, x, jnp.inf))
    hi = jnp.max(jnp.where(valid, x, -jnp.inf))
    degenerate = lo == hi  # skimage returns the value itself when all values are equal
    # With no value or a single distinct one the histogram is not used; bin over [0, 1] then.
    binned = (n_valid > 0) & ~degenerate
    lo_e, hi_e = jnp.where(binned, lo, 0).astype(dt), jnp.where(binned, hi, 1).astype(dt)

    # numpy.histogram's bins: edges = linspace(lo, hi, nbins + 1) in the input's dtype, i.e.
    # arange * step + lo with step = (hi - lo) / nbins and the last edge set to hi. The products
    # are formed inside a loop and the addition outside it: XLA would otherwise fuse the two
    # into a fused multiply-add (one rounding instead of numpy's two) and move edges by an ulp.
    step = (hi_e - lo_e) / nbins
    _, prod = jax.lax.scan(lambda c, k: (c, k * step), None, jnp.arange(nbins + 1, dtype=dt))
    edges = (prod + lo_e).at[nbins].set(hi_e)
    centers = (edges[:-1] + edges[1:]) / 2.0

    # numpy.histogram's bin of each value: truncate (x - lo) / (hi - lo) * nbins, then correct by
    # one against the edges (the last bin is closed on the right). The result is the bin whose
    # edges bracket the value, whatever the rounding of the division.
    xv = jnp.where(valid, x, lo_e)
    idx = jnp.clip(((xv - lo_e) / (hi_e - lo_e) * nbins).astype(jnp.int32), 0, nbins - 1)
    idx = jnp.where(xv < edges[idx], idx - 1, idx)
    idx = jnp.where((xv >= edges[idx + 1]) & (idx != nbins - 1), idx + 1, idx)
    counts = jnp.zeros(nbins, jnp.int32).at[idx].add(valid.astype(jnp.int32))

    # skimage.filters.threshold_otsu on (counts as float32, centers), same operation order.
    c32 = counts.astype(jnp.float32)
    cb = c32 * centers
    fwd = _sequential_cumsum(jnp.stack([c32, cb], axis=1))
    bwd = _sequential_cumsum(jnp.stack([c32[::-1], cb[::-1]], axis=1))
    weight1, mean1 = fwd[:, 0], fwd[:, 1] / fwd[:, 0]
    weight2, mean2 = bwd[::-1, 0], (bwd[:, 1] / bwd[:, 0])[::-1]
    variance12 = weight1[:-1] * weight2[1:] * (mean1[:-1] - mean2[1:]) ** 2
    # Splits after an empty bin equal the split after the last nonempty bin before it (the
    # running sums do not move), and the first maximum is taken, so only splits after nonempty
    # bins can win; masking the others keeps that tie rule whatever the arithmetic.
    variance12 = jnp.where(counts[:-1] > 0, variance12, -jnp.inf)
    t = centers[jnp.argmax(variance12)]
    t = jnp.where(degenerate, lo, t)
    return jnp.where(n_valid > 0, t, jnp.nan).astype(dt)


@functools.partial(jax.jit, static_argnames=_STATIC)
def otsu_threshold(values, valid=None, *, sample_ndim=None, nbins: int = OTSU_BINS):
    """Otsu's threshold of the valid values of each sample, as ``skimage.filters.threshold_otsu``.

    Shapes: ``values [..., *sample]`` (floating; integer input is cast to float32), ``valid``
    bool of the same shape (None: all valid); returns ``[...]`` in the floating dtype.

    Otsu (1979): histogram the values into ``nbins`` equal bins over ``[min, max]`` and return the
    centre ``c_k`` of the bin that maximises the between-class variance
    ``w1(k) w2(k+1) (m1(k) - m2(k+1))^2`` of the split after bin ``k`` (``w``: counts below/above,
    ``m``: their means of bin centres). Reproduced operation for operation from skimage 0.26 on
    floating input: numpy.histogram's edges (linspace in the input dtype) and bin assignment,
    counts as float32, running sums in order, the first maximum on ties, and, when every valid
    value is the same, that value. Deviations: no valid value gives NaN (skimage raises); on
    integer dtypes skimage uses one bin per integer instead of ``nbins`` (a data-dependent
    shape), here they are binned as floats; where skimage raises because ``max - min`` is too
    small to hold ``nbins`` distinct float edges, a threshold inside ``[min, max]`` is returned.
    """
    x = jnp.asarray(values)
    x = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    v = jnp.ones(x.shape, bool) if valid is None else jnp.asarray(valid, bool)
    return _per_sample(lambda a, m: _otsu_1d(a, m, nbins), sample_ndim, x, v)


# ---------------------------------------------------------------------------------------------
# Metrics.


@functools.partial(jax.jit, static_argnames="sample_ndim")
def relevance_mass_accuracy(attribution, mask, *, sample_ndim=None):
    """Relevance Mass Accuracy: the share of ``|a|`` inside the ground-truth mask.

    ``RMA = sum_{p in mask} |a_p| / sum_p |a_p|`` (Arras et al. 2022; GridVQA-X Table 1).
    Shapes: ``attribution [..., *sample]``, ``mask`` broadcastable bool; returns float ``[...]``
    in [0, 1]. NaN for an empty mask or an all-zero map (the release scores both 0).
    """
    def rma(a, m):
        total = jnp.sum(a)
        inside = jnp.sum(jnp.where(m, a, 0))
        ok = jnp.any(m) & (total > 0)
        return jnp.where(ok, inside / jnp.where(ok, total, 1), jnp.nan)

    return _per_sample(rma, sample_ndim, _relevance(attribution), jnp.asarray(mask) != 0)


@functools.partial(jax.jit, static_argnames=_STATIC)
def otsu_iou(attribution, mask, *, sample_ndim=None, nbins: int = OTSU_BINS):
    """IoU of the ground-truth mask with the Otsu-binarised map ``|a| >= t``.

    ``t = otsu_threshold(|a|, valid=|a| > 0)``: Otsu's threshold of the strictly positive
    values only (as the GridVQA-X release, so that the zeros of a sparse map do not take a class
    of their own); ``IoU = |mask ∧ P| / |mask ∨ P|`` with ``P = (|a| >= t)`` (so zeros are never
    in ``P``). Shapes as ``relevance_mass_accuracy``; returns float ``[...]`` in [0, 1]. NaN for
    an empty mask or an all-zero map (the release scores both 0).
    """
    def iou(a, m):
        t = _otsu_1d(a, a > 0, nbins)
        pred = a >= t  # False everywhere when t is NaN
        inter = jnp.sum(m & pred)
        union = jnp.sum(m | pred)
        ok = jnp.any(m) & jnp.any(a > 0)
        return jnp.where(ok, inter / jnp.maximum(union, 1), jnp.nan).astype(a.dtype)

    return _per_sample(iou, sample_ndim, _relevance(attribution), jnp.asarray(mask) != 0)


@functools.partial(jax.jit, static_argnames="sample_ndim")
def relevance_rank_accuracy(attribution, mask, *, sample_ndim=None):
    """Relevance Rank Accuracy: the share of the top-``K`` of ``|a|`` that lies in the mask.

    ``K = |mask|``; ``RRA = |top_K(|a|) ∩ mask| / K`` (Arras et al. 2022, CLEVR-XAI). Ties at
    the K-th value are averaged, not ordered: with ``v`` the K-th largest ``|a|``, the ``g``
    values above ``v`` are all in the top K and the ``K - g`` remaining places are shared
    evenly among the ``e`` values equal to ``v``, so
    ``RRA = (|mask ∩ {|a| > v}| + (K - g) |mask ∩ {|a| = v}| / e) / K``: the expectation over a
    uniformly random order of tied values. This is deterministic and does not depend on the
    position of features, so a constant map scores chance level ``K / N`` wherever the mask is,
    and an upsampled per-cell map scores the same at pixel and cell level (a positional rule
    would break pixel ties in raster order, which interleaves cells). Shapes as
    ``relevance_mass_accuracy``; returns float ``[...]`` in [0, 1]. NaN for an empty mask or an
    all-zero map.
    """
    def rra(a, m):
        k = jnp.sum(m)
        v = jnp.sort(a)[::-1][jnp.maximum(k, 1) - 1]  # K-th largest
        above, tied = a > v, a == v
        g, e = jnp.sum(above), jnp.sum(tied)
        # Counts in float: (K - g) * |mask ∩ tied| can pass int32's range on pixel maps.
        hits = jnp.sum(m & above) + (k - g).astype(a.dtype) * jnp.sum(m & tied) / e
        ok = (k > 0) & jnp.any(a > 0)
        return jnp.where(ok, hits / jnp.maximum(k, 1), jnp.nan).astype(a.dtype)

    return _per_sample(rra, sample_ndim, _relevance(attribution), jnp.asarray(mask) != 0)


@functools.partial(jax.jit, static_argnames="sample_ndim")
def pointing_game(attribution, mask, *, sample_ndim=None):
    """Pointing game: 1 if the maximum of ``|a|`` lies in the mask, else 0 (Zhang et al. 2018).

    When several features share the maximum the score is the share of them inside the mask
    (the expectation over a uniformly random pick among them, as in
    ``relevance_rank_accuracy``), so it is 0 or 1 for a map with a unique maximum and does not
    depend on the features' positions or on the resolution of a per-cell map. No tolerance
    margin around the mask (whole cells are the unit of ground truth here). Shapes as
    ``relevance_mass_accuracy``; returns float ``[...]`` in [0, 1]. NaN for an empty mask or an
    all-zero map.
    """
    def hit(a, m):
        top = a == jnp.max(a)
        ok = jnp.any(m) & jnp.any(a > 0)
        share = jnp.sum(m & top) / jnp.sum(top)
        return jnp.where(ok, share, jnp.nan).astype(a.dtype)

    return _per_sample(hit, sample_ndim, _relevance(attribution), jnp.asarray(mask) != 0)


def summarise(scores) -> dict:
    """Mean, standard deviation and count of the finite scores; NaN scores are excluded.

    ``scores``: any shape (host side, numpy). Returns ``{"mean", "std", "n", "n_excluded"}``:
    ``std`` is the population standard deviation (``ddof=0``, numpy's default, the "±" of the
    GridVQA-X tables); ``n`` the number of scores used and ``n_excluded`` the NaN ones (empty
    mask or all-zero map). With no score left, mean and std are NaN.
    """
    s = np.asarray(scores, dtype=np.float64).ravel()
    keep = ~np.isnan(s)
    kept = s[keep]
    n = int(kept.size)
    return {
        "mean": float(kept.mean()) if n else float("nan"),
        "std": float(kept.std()) if n else float("nan"),
        "n": n,
        "n_excluded": int(s.size - n),
    }


# ---------------------------------------------------------------------------------------------
# Ground truth and resolution.


def visual_ground_truth(scene, cell_px: int = 64, level: str = "pixel"):
    """Visual ground truth A ∪ T of a Scene (or a batch): whole cells of anchors and targets.

    ``level="pixel"``: bool ``[..., S*cell_px, S*cell_px]``, the mask at the rendered image's
    resolution (every pixel of a ground-truth cell, background included, as the release's
    ``pixel_obj_mask`` intends; the release itself passes S as the cell size and stores a
    25x25 mask). ``level="cell"``: bool ``[..., S, S]``, ``scene.gt_cells`` itself.
    """
    if level == "cell":
        return jnp.asarray(scene.gt_cells, bool)
    if level == "pixel":
        return pixel_mask(scene.gt_cells, cell_px).astype(bool)
    raise ValueError(f"level must be 'pixel' or 'cell', got {level!r}")


def textual_ground_truth(scene):
    """Textual ground truth of a Scene (or a batch) per model token: bool ``[..., L]``.

    ``scene.gt_tokens``: the tokens the sampler spells with role target attribute, anchor
    attribute or relation (both tokens of "left of" / "right of"); function words, punctuation
    and PAD are False. The release's word-level ``text_mask`` instead always marks word 0 and
    never marks the two-word relations "left of" / "right of".
    """
    return jnp.asarray(scene.gt_tokens, bool)


def upsample_cells(cell_map, cell_px: int):
    """Spread a per-cell map ``[..., S, S]`` over pixels: ``[..., S*cell_px, S*cell_px]``.

    Every pixel of a cell carries the cell's value divided by ``cell_px**2``, so the map's mass
    is preserved (the pixel map sums to the cell map; additive attributions such as Shapley
    values keep their efficiency sum). RMA and RRA of a per-cell map are the same at cell and
    pixel level against ``visual_ground_truth`` (a ratio of masses; cells are ranked as blocks),
    and so is the pointing game. Otsu IoU agrees too up to float rounding of the histogram sums
    (every cell weighs ``cell_px**2`` pixels, which leaves Otsu's argmax unchanged in exact
    arithmetic). jnp (``mmx_base.grid.upsample`` of the divided map).
    """
    m = jnp.asarray(cell_map)
    m = m.astype(jnp.promote_types(m.dtype, jnp.float32)) / (cell_px * cell_px)
    return grid.upsample(m, cell_px)
