"""Layers and input helpers shared by the GridVQA-X models (``gridvqa_jax.models.mdetr``) and the
misinformation detectors of ``bias_jax.detectors``.

Both read an image as one token per grid cell: ``preprocess_image`` brings a uint8 image to the
model size ``S * cell_px`` in [-0.5, 0.5], ``cell_patches`` cuts it into the S*S row-major cell
patches (cell ``i = y * S + x``), and ``half_planes`` is the dense form of the universe's four
relations (left of, right of, above, below) between cells, used by the half-plane pooling blocks
of both. ``Mlp`` is the transformer feed-forward block.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np


class Mlp(nn.Module):
    """Transformer feed-forward block ``W_2 gelu(W_1 x)`` (Vaswani et al. 2017, with the GELU of
    BERT): [..., d] -> [..., out], hidden width ``dim``."""

    dim: int
    out: int

    @nn.compact
    def __call__(self, x):
        return nn.Dense(self.out)(nn.gelu(nn.Dense(self.dim)(x)))


def preprocess_image(image, grid_size: int, cell_px: int):
    """uint8/float image [B, H, W, 3] -> float32 [B, S*cell_px, S*cell_px, 3], ``x / 255 - 0.5``.

    A size that is an integer multiple of the model size is area-averaged (exact box filter);
    any other size is bilinearly resized (``jax.image.resize``).
    """
    x = jnp.asarray(image).astype(jnp.float32) / 255.0 - 0.5
    B, H, W, _ = x.shape
    n = grid_size * cell_px
    if (H, W) == (n, n):
        return x
    if H % n == 0 and W % n == 0:
        fh, fw = H // n, W // n
        return x.reshape(B, n, fh, n, fw, 3).mean(axis=(2, 4))
    return jax.image.resize(x, (B, n, n, 3), method="linear")


def cell_patches(image, grid_size: int, cell_px: int) -> jax.Array:
    """uint8 [B, H, W, 3] -> float32 [B, S*S, P*P*3] (P = ``cell_px``): ``preprocess_image``,
    then one row-major patch per grid cell, cell ``i = y * S + x`` (its P x P x 3 pixels
    flattened row by row)."""
    x = preprocess_image(image, grid_size, cell_px)  # [B, S*P, S*P, 3]
    B = x.shape[0]
    S, P = grid_size, cell_px
    x = x.reshape(B, S, P, S, P, 3).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(B, S * S, P * P * 3)


def half_planes(grid_size: int) -> np.ndarray:
    """float32 [4, C, C] (C = S*S): ``H[r, j, i] = 1`` iff cell j lies in half-plane r of cell i,
    r = 0..3 = left of, right of, above, below: ``x_j < x_i``, ``x_j > x_i``, ``y_j < y_i``,
    ``y_j > y_i`` (cell ``c = y * S + x``; y grows downwards), the GridVQA-X relations.

    So ``sum_i H[r, j, i] g_i`` is the gated mass of the cells i that have cell j in their
    half-plane r (e.g. r = 0: the cells strictly right of j). The bitboard form of the same
    regions, for the sampler, is ``gridvqa_jax.world.bitboards.half_planes``.
    """
    C = grid_size * grid_size
    y, x = np.divmod(np.arange(C), grid_size)
    planes = [x[:, None] < x[None, :], x[:, None] > x[None, :],
              y[:, None] < y[None, :], y[:, None] > y[None, :]]
    return np.stack(planes).astype(np.float32)


__all__ = ["Mlp", "preprocess_image", "cell_patches", "half_planes"]
