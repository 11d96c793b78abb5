"""Image players as regions of pixels: patches and superpixels, masking by region, and the maps
they give.

Every explainer of the closed world can play its game over the S x S grid cells (the units of
the ground truth A ∪ T, ``explain.perturb``), but none of the reference explainers does: the
players of the papers' explainers are units that do not line up with the scene:

* **patches** (MultiSHAP, Wang & Wang 2025, on ViLT): ViLT cuts its 384-px input into 32-px
  patches, a 12 x 12 grid over the image; ``patch_players(H, W, 12)`` is the same relative
  patch size over our rendering (patch ``(i, j)`` covers the pixels ``h * n // H == i``,
  ``w * n // W == j``, so on an 80-px image patches are 6 or 7 px and straddle cells);
* **superpixels** (DIME, Lyu et al. 2022, through ``lime_image``): ``LimeImageExplainer``
  segments the image with ``skimage.segmentation.quickshift(image, kernel_size=4,
  max_dist=200, ratio=0.2, random_seed=...)`` (lime's ``SegmentationAlgorithm`` defaults in
  ``lime_image.LimeImageExplainer.explain_instance``) and hides a superpixel with
  ``hide_color`` (0 in DIME's call: black); ``superpixel_players``.

Representation: a **label map** int32 ``[..., H, W]`` of player ids ``0..R-1`` per pixel, -1 =
never masked (captum's ``feature_mask`` at pixel level). A region mask is bool ``[..., R]``,
True = the region is masked (the convention of ``mmx_base.grid.mask_cells``); a coalition row
of ``explain.shapley`` (True = present) is its negation. Every function but
``superpixel_players`` (which runs scikit-image on the host) is pure numpy / jax.numpy with
static shapes, so it traces under ``jit`` and ``vmap`` (numpy in, numpy out; jax in, jax out).

``resolve_image_players(image_players, scenes, cell_px)`` turns ``"patches"`` /
``"superpixels"`` / a given label map into the label maps of a batch's renderings; the explainers
at reference granularity take it as ``image_players=``: ``multishap.multishap_regions`` (default
patches) and ``dime.dime_regions`` / ``dime.dime_region_maps`` (default superpixels, black).

Maps: a region's value is spread over its pixels by mass (``spread_regions``: each pixel
carries ``value / |region|``), so the pixel map's sum over any set of whole regions is the sum
of their values (Shapley efficiency is kept), and the cell map of an ``Attribution`` is that
pixel map's mass pooled per cell (``mmx_base.grid.pool(..., "sum")``).
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np

from mmx_base import grid
from gridvqa_jax.world import render as R

# ViLT (dandelin/ViLT, vilt/modules/vision_transformer.py: patch_size=32 at 384 px): 12 x 12.
VILT_PATCHES_PER_SIDE = 12
# lime_image.LimeImageExplainer.explain_instance: SegmentationAlgorithm('quickshift', ...).
QUICKSHIFT_KERNEL_SIZE = 4
QUICKSHIFT_MAX_DIST = 200
QUICKSHIFT_RATIO = 0.2


def _xp(*xs):
    return jnp if any(isinstance(x, jax.Array) for x in xs) else np


def patch_players(height: int, width: int, n_per_side: int = VILT_PATCHES_PER_SIDE):
    """Square-grid patches as players: int32 ``[H, W]`` with pixel ``(h, w)`` in patch
    ``(h * n // H) * n + (w * n // W)`` (``n = n_per_side``; ``mmx_base.grid.upsample_to`` of the
    patch ids, so patches cover ``floor`` / ``ceil`` pixel counts when ``n`` does not divide the
    side). The default 12 is ViLT's 32-px patches on its 384-px side, the players of
    MultiSHAP's reference. numpy; broadcast it over a batch (every image has the same patches).
    """
    n, height, width = int(n_per_side), int(height), int(width)
    if not 1 <= n <= min(height, width):
        raise ValueError(f"n_per_side must lie in [1, {min(height, width)}] for a {height}x"
                         f"{width} image, got {n_per_side}")
    ids = np.arange(n * n, dtype=np.int32).reshape(n, n)
    return np.ascontiguousarray(grid.upsample_to(ids, height, width))


def _as_uint8(images) -> np.ndarray:
    x = np.asarray(images)
    if x.dtype == np.uint8:
        return x
    return np.clip(np.rint(x.astype(np.float64)), 0, 255).astype(np.uint8)


def superpixel_players(images, kernel_size: float = QUICKSHIFT_KERNEL_SIZE,
                       max_dist: float = QUICKSHIFT_MAX_DIST, ratio: float = QUICKSHIFT_RATIO,
                       random_seed: int = 42):
    """Quickshift superpixels as players, as ``lime_image`` segments an image (host side).

    ``skimage.segmentation.quickshift(image, kernel_size, max_dist, ratio, seed)`` per
    image (lime's ``SegmentationAlgorithm('quickshift', kernel_size=4, max_dist=200,
    ratio=0.2)`` with its defaults; skimage converts the RGB image to float in [0, 1] and then to
    CIELAB). Runs scikit-image on the host, one image at a time: call it outside ``jit`` and pass
    the labels in.

    Args:
      images: ``[B, H, W, 3]`` or ``[H, W, 3]`` RGB, uint8 (or float in the same 0..255 units,
        rounded to uint8 first: skimage reads a float image as [0, 1]).
      kernel_size, max_dist, ratio: quickshift's parameters; random_seed: its tie-breaking seed
        (skimage's default 42; lime draws one from its ``random_state``).
    Returns:
      int32 ``[B, H, W]`` (or ``[H, W]``): each image's superpixel ids ``0..R_b-1``
      (quickshift's labels, which are consecutive from 0).
    """
    from skimage.segmentation import quickshift

    x = _as_uint8(images)
    single = x.ndim == 3
    x = x[None] if single else x
    if x.ndim != 4 or x.shape[-1] != 3:
        raise ValueError(f"images must be [B, H, W, 3] or [H, W, 3] RGB, got {np.shape(images)}")
    # the tie-breaking seed: ``random_seed`` up to scikit-image 0.22, ``rng`` from 0.23 on
    seed = ("rng" if "rng" in inspect.signature(quickshift).parameters else "random_seed")
    labels = np.stack([quickshift(im, ratio=float(ratio), kernel_size=float(kernel_size),
                                  max_dist=float(max_dist), **{seed: int(random_seed)})
                       for im in x]).astype(np.int32)
    return labels[0] if single else labels


def n_regions(labels) -> int:
    """R: one more than the largest player id of a label map (host side; at least 1)."""
    return max(1, int(np.max(np.asarray(labels), initial=-1)) + 1)


def region_pixel_mask(labels, region_mask):
    """Which pixels a region mask masks: labels int ``[..., H, W]`` (-1 = never masked),
    region_mask bool ``[..., R]`` (True = masked; leading axes broadcast against the labels')
    -> bool ``[..., H, W]`` with ``out[..., h, w] = labels[h, w] >= 0 and
    region_mask[labels[h, w]]``."""
    xp = _xp(labels, region_mask)
    labels = xp.asarray(labels)
    region_mask = xp.asarray(region_mask, bool)
    h, w = labels.shape[-2:]
    lead = np.broadcast_shapes(labels.shape[:-2], region_mask.shape[:-1])
    ids = xp.broadcast_to(labels.reshape(labels.shape[:-2] + (h * w,)), lead + (h * w,))
    m = xp.broadcast_to(region_mask, lead + region_mask.shape[-1:])
    hit = xp.take_along_axis(m, xp.clip(ids, 0, None), axis=-1) & (ids >= 0)
    return hit.reshape(lead + (h, w))


def mask_regions(image, labels, region_mask, fill):
    """The image with every pixel of every masked region replaced by ``fill``.

    Args:
      image: ``[..., H, W, C]`` numpy or jax array.
      labels: int ``[..., H, W]`` label map (-1 = never masked).
      region_mask: bool ``[..., R]``, True = masked; leading axes of image, labels and mask
        broadcast.
      fill: the absent state, broadcast against ``[..., H, W, C]`` and cast to the image dtype:
        a scalar (0 = black, lime's ``hide_color=0``), a colour ``[C]`` or an image ``[H, W, C]``
        (e.g. ``explain.perturb.baseline_fill("empty", S, P)``, the empty grid). No default: it
        is the caller's choice.
    Returns:
      ``where(region_pixel_mask(labels, region_mask)[..., None], fill, image)``, of the
      broadcast shape, the image's dtype; a jax array when any input is one.
    """
    xp = _xp(image, labels, region_mask, fill)
    image = xp.asarray(image)
    fill = xp.asarray(fill, image.dtype)
    pixels = region_pixel_mask(labels, region_mask)[..., None]  # [..., H, W, 1]
    shape = np.broadcast_shapes(pixels.shape[:-1] + image.shape[-1:], image.shape, fill.shape)
    return xp.where(xp.broadcast_to(pixels, shape), xp.broadcast_to(fill, shape),
                    xp.broadcast_to(image, shape))


def _ids(xp, n: int, labels):
    # 0..n-1 on a trailing axis of labels' rank + 1 (no implicit rank promotion under jax)
    return xp.arange(int(n), dtype=labels.dtype).reshape((1,) * labels.ndim + (int(n),))


def region_sizes(labels, n: int):
    """int32 ``[..., n]``: the number of pixels of each of the regions ``0..n-1`` in each label
    map ``[..., H, W]`` (pixels of id -1 and ids >= n are not counted)."""
    xp = _xp(labels)
    labels = xp.asarray(labels)
    onehot = labels[..., None] == _ids(xp, n, labels)  # [..., H, W, n]
    return xp.sum(onehot, axis=(-3, -2)).astype(np.int32)


def spread_regions(values, labels):
    """Region values -> pixel map, by mass: values float ``[..., R]``, labels int ``[..., H, W]``
    (leading axes broadcast) -> float32 ``[..., H, W]`` with pixel ``(h, w)`` of region ``r``
    carrying ``values[r] / |r|`` (``|r|`` its pixel count in that label map) and pixels of id -1
    carrying 0. The sum of the map over a region is its value; regions that own no pixel lose
    theirs (a null player's value is 0 anyway)."""
    xp = _xp(values, labels)
    values = xp.asarray(values, np.float32)
    labels = xp.asarray(labels)
    n = values.shape[-1]
    h, w = labels.shape[-2:]
    lead = np.broadcast_shapes(labels.shape[:-2], values.shape[:-1])
    sizes = xp.maximum(region_sizes(labels, n), 1).astype(np.float32)
    v = xp.broadcast_to(values, lead + (n,)) / xp.broadcast_to(sizes, lead + (n,))
    ids = xp.broadcast_to(labels.reshape(labels.shape[:-2] + (h * w,)), lead + (h * w,))
    out = xp.where(ids >= 0, xp.take_along_axis(v, xp.clip(ids, 0, n - 1), axis=-1), 0.0)
    return out.reshape(lead + (h, w)).astype(np.float32)


def pool_regions(pixel_map, labels, n: int):
    """The reverse of ``spread_regions``: float ``[..., H, W]`` -> float32 ``[..., n]``, the sum
    of the map over each region ``0..n-1`` of ``labels`` ``[..., H, W]``."""
    xp = _xp(pixel_map, labels)
    pixel_map = xp.asarray(pixel_map, np.float32)
    labels = xp.asarray(labels)
    onehot = labels[..., None] == _ids(xp, n, labels)
    return xp.sum(xp.where(onehot, pixel_map[..., None], 0.0), axis=(-3, -2))


def resolve_image_players(image_players, scenes, cell_px: int) -> np.ndarray:
    """The label maps int32 [B, H, W] of a ``Scene`` batch's renderings at ``H = S * cell_px``
    (host side): ``"patches"`` = ``patch_players(H, H)`` (ViLT's 12 x 12), ``"superpixels"`` =
    ``superpixel_players`` of each image ``render.render(color, shape, cell_px)``, or a given
    label map [B, H, W] / [H, W] (checked and broadcast). ``ValueError`` otherwise."""
    color = np.asarray(scenes.color)
    B, S = color.shape[0], color.shape[-1]
    H = S * int(cell_px)
    if isinstance(image_players, str):
        if image_players == "patches":
            labels = patch_players(H, H)
        elif image_players == "superpixels":
            images = np.asarray(jax.vmap(lambda c, s: R.render(c, s, int(cell_px)))(
                jnp.asarray(color), jnp.asarray(scenes.shape)))
            labels = superpixel_players(images)
        else:
            raise ValueError(f"image_players must be 'patches', 'superpixels' or a label map, "
                             f"got {image_players!r}")
    else:
        labels = np.asarray(image_players)
    if labels.shape[-2:] != (H, H) or labels.ndim not in (2, 3):
        raise ValueError(f"image_players label map {labels.shape} is not [B, {H}, {H}] or "
                         f"[{H}, {H}] (S * cell_px = {H})")
    return np.broadcast_to(labels, (B, H, H)).astype(np.int32)


__all__ = ["VILT_PATCHES_PER_SIDE", "QUICKSHIFT_KERNEL_SIZE", "QUICKSHIFT_MAX_DIST",
           "QUICKSHIFT_RATIO", "patch_players", "superpixel_players", "n_regions",
           "region_pixel_mask", "mask_regions", "region_sizes", "spread_regions",
           "pool_regions", "resolve_image_players"]
