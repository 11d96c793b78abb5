"""LIME's local surrogate in closed form: perturbation masks, the exponential kernel and a
weighted ridge regression, as pure JAX functions (jit / vmap over samples).

LIME (Ribeiro, Singh & Guestrin, KDD 2016) explains a value ``y(z)`` of binary interpretable
features ``z in {0, 1}^d`` (1 = feature kept, 0 = feature removed) by the weighted linear fit

    min_{b, c}  sum_k w_k (y_k - c - z_k . b)^2 + alpha |b|^2,    w_k = kernel(D(z_k, 1))

over sampled masks ``z_k``; the explanation is ``b``. This module follows the reference
implementation (the ``lime`` package, 0.2.0.1):

* Sampling. ``image_masks`` as ``LimeImageExplainer.data_labels``: every feature kept
  independently with probability 1/2; ``text_masks`` as ``LimeTextExplainer``'s
  ``__data_labels_distances``: a number of removed features drawn uniformly in ``1..d``, then
  that many distinct features removed. In both, row 0 is the unperturbed input (all ones),
  and a feature's draws do not depend on the width the masks are padded to: an image mask's
  column i is drawn from ``fold_in(key, i)`` (``MASK_DRAWS``); a text mask's removal counts
  from ``split(key)[0]`` and its column i from ``fold_in(split(key)[1], i)``.
* Distance and kernel: ``D`` = cosine distance to the all-ones row (``sklearn``'s
  ``pairwise_distances(metric="cosine")``; for a binary row with ``k`` of ``d`` features kept
  ``D = 1 - sqrt(k / d)``, and ``D = 1`` for the empty row, as sklearn does for a zero
  vector); ``kernel(D) = sqrt(exp(-D^2 / width^2))``. The image explainer uses ``width =
  0.25`` on ``D``, the text explainer ``width = 25`` on ``100 D``: the same weights, so one
  ``kernel_width=0.25`` serves both.
* Regression: ``sklearn.linear_model.Ridge(alpha=1, fit_intercept=True)`` with
  ``sample_weight=w`` (LimeBase's default; with the default ``num_features=100000`` its
  feature selection keeps every feature). Closed form: with weighted means
  ``z_bar = sum_k w_k z_k / sum_k w_k`` and ``y_bar`` likewise, the intercept is unpenalised
  (sklearn centres the data) and

      b = (Zc^T W Zc + alpha I)^-1 Zc^T W yc,   c = y_bar - z_bar . b,

  ``Zc = Z - z_bar``, ``yc = y - y_bar``, ``W = diag(w)``.

Features marked invalid (e.g. PAD token slots, which own nothing) get coefficient exactly 0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mmx_base.draws import column_uniforms

IMAGE_KERNEL_WIDTH = 0.25  # LimeImageExplainer(kernel_width=.25) on the cosine distance
TEXT_KERNEL_WIDTH = 0.25  # LimeTextExplainer(kernel_width=25) on 100 x the cosine distance
RIDGE_ALPHA = 1.0  # LimeBase's Ridge(alpha=1)
# How the masks are drawn from a key (same law, other draws before 2026-12-07: one draw over
# the padded width); in the fingerprint of every saved LIME-based row (reproduction.table1).
MASK_DRAWS = "column i from fold_in(key, i)"


def image_masks(key, n_samples: int, n_features: int):
    """bool [n_samples, n_features], True = feature kept: row 0 all True, every other entry
    an independent fair coin (``LimeImageExplainer``'s sampling). The first ``d`` columns equal
    ``image_masks(key, n_samples, d)`` and the first ``m`` rows ``image_masks(key, m,
    n_features)``, so a sample's masks do not depend on the feature count it is padded to."""
    z = column_uniforms(key, n_samples, n_features) < 0.5
    return z.at[0].set(True)


def text_masks(key, n_samples: int, valid):
    """bool [n_samples, d], True = feature kept, for ``valid`` bool [d] (the features that exist;
    invalid ones are always True): row 0 all True; row k >= 1 removes ``r_k ~ U{1..n}`` distinct
    valid features chosen uniformly, ``n = sum(valid)`` (``LimeTextExplainer``'s sampling).
    The masks of the valid features do not depend on how many invalid ones follow them (a
    question's masks are the same at every padded length), and the first ``m`` rows equal
    ``text_masks(key, m, valid)``."""
    valid = jnp.asarray(valid, bool)
    d = valid.shape[-1]
    n = jnp.sum(valid)
    k_count, k_perm = jax.random.split(key)
    removed = jax.random.randint(k_count, (n_samples, 1), 1, jnp.maximum(n, 1) + 1)
    # A uniformly random order of the valid features per row (invalid ones last): removing the
    # first r of that order removes a uniform r-subset.
    scores = jnp.where(valid[None, :], column_uniforms(k_perm, n_samples, d), 2.0)
    rank = jnp.argsort(jnp.argsort(scores, axis=-1), axis=-1)
    z = ~((rank < removed) & valid[None, :])
    return z.at[0].set(True)


def cosine_distance_to_ones(z, valid=None):
    """float32 [...]: cosine distance between each binary row ``z`` [..., d] and the all-ones
    row, over the ``valid`` features (default all): ``1 - sqrt(k / n)`` with ``k`` kept of ``n``;
    1 for a row with nothing kept (sklearn's convention for a zero vector)."""
    z = jnp.asarray(z, bool)
    valid = jnp.ones(z.shape[-1], bool) if valid is None else jnp.asarray(valid, bool)
    valid = jnp.broadcast_to(valid, z.shape)
    k = jnp.sum(z & valid, axis=-1).astype(jnp.float32)
    n = jnp.maximum(jnp.sum(valid, axis=-1).astype(jnp.float32), 1.0)
    return jnp.where(k > 0, 1.0 - jnp.sqrt(k / n), 1.0)


def exponential_kernel(distance, kernel_width: float = IMAGE_KERNEL_WIDTH):
    """LIME's kernel ``sqrt(exp(-d^2 / width^2))`` (float32, same shape as ``distance``)."""
    d = jnp.asarray(distance, jnp.float32)
    return jnp.sqrt(jnp.exp(-(d ** 2) / kernel_width ** 2))


def weighted_ridge(X, y, w, alpha: float = RIDGE_ALPHA, valid=None):
    """Weighted ridge regression with an unpenalised intercept, in closed form.

    X float [n, d], y float [n] or [n, m], w float [n] (>= 0, not all 0), ``valid`` bool [d]
    (default all; invalid features are left out and get coefficient 0) -> (coef [d] or [d, m],
    intercept [] or [m]) minimising ``sum_k w_k (y_k - c - X_k . b)^2 + alpha |b|^2``, i.e.
    ``sklearn.linear_model.Ridge(alpha, fit_intercept=True).fit(X, y, sample_weight=w)``
    (module docstring). Solved by ``jnp.linalg.solve`` on the d x d normal equations.
    """
    X = jnp.asarray(X, jnp.float32)
    y = jnp.asarray(y, jnp.float32)
    w = jnp.asarray(w, jnp.float32)
    d = X.shape[-1]
    valid = jnp.ones(d, bool) if valid is None else jnp.asarray(valid, bool)
    p = w / jnp.sum(w)
    ycol = y.reshape(y.shape[0], -1)  # [n, m]
    x_bar = p @ X  # [d]
    y_bar = p @ ycol  # [m]
    Xc = jnp.where(valid[None, :], X - x_bar[None, :], 0.0)
    yc = ycol - y_bar[None, :]
    A = Xc.T @ (w[:, None] * Xc)
    # Invalid features: their (zero) rows and columns get a unit diagonal, so they solve to 0
    # whatever alpha (also alpha = 0) and never touch the valid ones.
    A = A + jnp.diag(jnp.where(valid, jnp.float32(alpha), 1.0))
    coef = jnp.linalg.solve(A, Xc.T @ (w[:, None] * yc))  # [d, m]
    intercept = y_bar - x_bar @ coef
    if y.ndim == 1:
        coef, intercept = coef[:, 0], intercept[0]
    return coef, intercept


def lime_fit(masks, values, valid=None, *, kernel_width: float = IMAGE_KERNEL_WIDTH,
             alpha: float = RIDGE_ALPHA):
    """The LIME explanation of sampled values: masks bool [n, d] (True = kept; row 0 the
    unperturbed input), values float [n] or [n, m], ``valid`` bool [d] -> (coef [d] or [d, m],
    intercept). Weights ``exponential_kernel(cosine_distance_to_ones(masks, valid))``,
    then ``weighted_ridge``."""
    w = exponential_kernel(cosine_distance_to_ones(masks, valid), kernel_width)
    return weighted_ridge(jnp.asarray(masks, jnp.float32), values, w, alpha, valid)


__all__ = ["MASK_DRAWS", "image_masks", "text_masks", "cosine_distance_to_ones",
           "exponential_kernel", "weighted_ridge", "lime_fit", "IMAGE_KERNEL_WIDTH",
           "TEXT_KERNEL_WIDTH", "RIDGE_ALPHA"]
