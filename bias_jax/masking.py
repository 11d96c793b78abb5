"""Post-validation of bias labels by masking (the modality-bias paper's appendix 15, Table 14).

A share r of the image cells or of the words of each sample is replaced by the absent input
(zero pixels / the PAD token), and the joint detector's accuracy is measured on groups of
samples (e.g. those the ensemble calls Uni-image and Uni-text): masking the modality a sample
relies on should cost more accuracy than masking the other one. The views can be rerun on the
masked samples as well.

Players masked at ratio r out of n: ``jnp.round`` of the float32 product ``r * n`` (half to
even, as Python's ``round``; ``n_masked`` is the float64 count, which it equals for the paper's
ratios on 25 cells but not wherever float32 moves the product across .5, e.g. r = 0.3,
n = 95: 29 against 28), chosen uniformly without replacement per sample.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from bias_jax import ensemble as EN
from bias_jax.data.batch import REAL, Batch
from bias_jax.data.text import PAD_ID
from bias_jax.scoring import score_labels
from bias_jax.views import run_views
from mmx_base.grid import mask_cells

# (image ratio, text ratio) pairs of the paper's Table 14.
MASK_GRID = ((0.6, 0.0), (0.4, 0.0), (0.2, 0.0), (0.0, 0.0), (0.0, 0.2), (0.0, 0.4),
             (0.0, 0.6))
IMAGE_FILL = 0  # the absent image: zero pixels (bias_jax.detectors.zero_image)


def n_masked(ratio: float, n: int) -> int:
    """Players masked at ``ratio`` out of ``n``: Python ``round(ratio * n)`` in float64 (the
    masks round the float32 product: module docstring)."""
    return int(round(ratio * n))


def _rank_mask(u, k):
    """bool [..., P]: the ``k`` [...] positions with the smallest ``u`` [..., P] (u = inf never
    chosen)."""
    rank = jnp.argsort(jnp.argsort(u, axis=-1), axis=-1)
    return rank < k[..., None]


@jax.jit
def _mask_cells(key, image, ratio, grid_marker):
    b = image.shape[0]
    s = grid_marker.shape[0]
    c = s * s
    u = jax.random.uniform(key, (b, c))
    k = jnp.round(ratio * c).astype(jnp.int32) * jnp.ones(b, jnp.int32)
    cells = _rank_mask(u, k).reshape(b, s, s)  # [B, S, S]
    return mask_cells(image, cells, IMAGE_FILL)


@jax.jit
def _mask_tokens(key, tokens, ratio):
    words = tokens != PAD_ID
    u = jnp.where(words, jax.random.uniform(key, tokens.shape), jnp.inf)
    k = jnp.round(ratio * words.sum(-1)).astype(jnp.int32)
    return jnp.where(_rank_mask(u, k), PAD_ID, tokens)


def mask_batch(batch: Batch, key, *, image_ratio: float = 0.0, text_ratio: float = 0.0,
               grid_size: int = 5) -> Batch:
    """``batch`` with ``round(image_ratio * S*S)`` of its grid cells (S = ``grid_size``; cell
    (i, j) = the pixels with row * S // H == i, col * S // W == j) set to zero pixels and
    ``round(text_ratio * #words)`` of its non-PAD tokens set to PAD, per sample, chosen
    uniformly without replacement (independent keys for image and text). Host numpy out."""
    k_img, k_txt = jax.random.split(key)
    image, tokens = np.asarray(batch.image), np.asarray(batch.tokens)
    if image_ratio > 0:
        image = np.asarray(_mask_cells(k_img, image, jnp.float32(image_ratio),
                                       jnp.zeros(grid_size)))
    if text_ratio > 0:
        tokens = np.asarray(_mask_tokens(k_txt, tokens, jnp.float32(text_ratio)))
    return batch.replace(image=image, tokens=tokens)


def joint_accuracy(detectors: dict, batch: Batch, chunk: int = 512) -> np.ndarray:
    """bool [N]: the joint (image-text) detector is right on each sample (logit > 0 = real)."""
    f, p, _ = detectors["joint"]
    out = []
    for s in range(0, batch.size, chunk):
        out.append(np.asarray(f(p, jnp.asarray(batch.image[s:s + chunk]),
                                jnp.asarray(batch.tokens[s:s + chunk]))))
    logits = np.concatenate(out)
    return (logits > 0) == (np.asarray(batch.label) == REAL)


def post_validation(detectors: dict, batch: Batch, groups: dict, key, *, grid_size: int = 5,
                    grid=MASK_GRID, rerun_views: bool = False, view_options=None,
                    truth=None) -> list:
    """For each (image ratio, text ratio) of ``grid``, the joint detector's accuracy on each
    group of samples (``groups``: name -> bool [N], e.g. the samples the ensemble calls
    Uni-image / Uni-text) after masking (``mask_batch`` with ``fold_in(key, i)``), and its
    difference to no masking; with ``rerun_views`` also the views (``view_options``: their
    keyword arguments) and the prior-majority ensemble rerun on the masked samples
    (``score_labels`` of the ensemble against ``truth``).

    Returns ``[{"image_ratio", "text_ratio", "groups": {name: {"accuracy", "delta", "n"}}}]``
    (plus ``"ensemble"`` with ``rerun_views``)."""
    base = joint_accuracy(detectors, batch)
    rows = []
    for i, (ri, rt) in enumerate(grid):
        masked = mask_batch(batch, jax.random.fold_in(key, i), image_ratio=ri, text_ratio=rt,
                            grid_size=grid_size) if (ri or rt) else batch
        ok = base if not (ri or rt) else joint_accuracy(detectors, masked)
        row = {"image_ratio": ri, "text_ratio": rt, "groups": {}}
        for g, sel in groups.items():
            sel = np.asarray(sel, bool)
            a = float(ok[sel].mean()) if sel.any() else math.nan
            a0 = float(base[sel].mean()) if sel.any() else math.nan
            row["groups"][g] = {"accuracy": a, "delta": a - a0, "n": int(sel.sum())}
        if rerun_views:
            res = run_views(detectors, masked, key=jax.random.fold_in(key, 100 + i),
                            options=view_options)
            row["ensemble"] = score_labels(EN.combine({k: v.label for k, v in res.items()}),
                                           truth)
        rows.append(row)
    return rows


__all__ = ["MASK_GRID", "IMAGE_FILL", "n_masked", "mask_batch", "joint_accuracy",
           "post_validation"]
