"""Grid primitives: cells <-> pixels and masking the cells of an image.

An image of an S x S grid of square cells is ``[..., H, W]`` (or ``[..., H, W, C]``) with
``H = S * P_y`` and ``W = S * P_x`` pixels (``P`` = pixels per cell side); a cell map is
``[..., S, S]`` indexed ``[y, x]``. Pixel ``(h, w)`` belongs to cell ``(h // P_y, w // P_x)``.

Every function works on numpy and on jax arrays: a ``jax.Array`` (also a tracer under ``jit``)
gives a ``jax.Array`` computed with ``jax.numpy``, anything else a numpy array. Shapes and the
cell size are static (Python ints), so the functions trace under ``jit``.

* ``upsample(cells, cell_px)``: every cell becomes a ``P x P`` block of its value.
* ``upsample_to(cells, height, width)``: nearest-cell resize to any pixel size, pixel ``(h, w)``
  takes cell ``(h * S // H, w * S // W)``; equal to ``upsample`` when ``H = W = S * P``.
* ``pool(pixels, grid_size, reduce)``: the reverse, one value per cell from its pixels (sum,
  mean, max, any).
* ``mask_cells(image, cell_mask, fill)``: the pixels of the masked cells replaced by ``fill``.
  The fill has no default: it is the absent state of the caller's world (the white empty tile of
  GridVQA-X, zeros for a zero reference, a gray, a background image).
* ``SquareGrid``: the config mixin defining ``n_cells`` from ``grid_size``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

REDUCTIONS = ("sum", "mean", "max", "any")


class SquareGrid:
    """Mixin of a config (a dataclass) with a ``grid_size`` field S: the sizes derived from it.

    ``n_cells`` = C = S * S, the number of cells (image tokens of the models, bits of a
    bitboard). The one definition the dataset, model and detector configs share.
    """

    __slots__ = ()

    @property
    def n_cells(self) -> int:
        """Grid cells C = S * S."""
        return self.grid_size * self.grid_size


def _xp(x):
    """``jax.numpy`` for a jax array (or tracer), else ``numpy``."""
    return jnp if isinstance(x, jax.Array) else np


def _as_array(x):
    return x if isinstance(x, (jax.Array, np.ndarray)) else np.asarray(x)


def upsample(cells, cell_px: int):
    """Cell map ``[..., S_y, S_x]`` -> pixel map ``[..., S_y * P, S_x * P]`` (``P = cell_px``).

    ``out[..., h, w] = cells[..., h // P, w // P]``: every cell a ``P x P`` block of its value,
    dtype kept (``np.kron(cells, np.ones((P, P)))`` for 2-D numpy input, without the product).

    Args:
      cells: numpy or jax array with at least two axes.
      cell_px: pixels per cell side, a positive Python int (static under ``jit``).
    Returns:
      an array of the same kind and dtype as ``cells``.
    """
    cells = _as_array(cells)
    xp = _xp(cells)
    p = int(cell_px)
    if p < 1:
        raise ValueError(f"cell_px must be >= 1, got {cell_px}")
    *lead, s_y, s_x = cells.shape
    blocks = xp.broadcast_to(cells[..., :, None, :, None], (*lead, s_y, p, s_x, p))
    return blocks.reshape(*lead, s_y * p, s_x * p)


def upsample_to(cells, height: int, width: int):
    """Cell map ``[..., S_y, S_x]`` -> pixel map ``[..., H, W]`` by nearest cell.

    ``out[..., h, w] = cells[..., h * S_y // H, w * S_x // W]``; when ``H`` and ``W`` are
    multiples of ``S_y`` and ``S_x`` with one cell size ``P`` this is ``upsample(cells, P)``
    (and is computed so), otherwise cells cover ``floor`` / ``ceil`` pixel counts.

    Args:
      cells: numpy or jax array with at least two axes.
      height, width: output pixel size (Python ints).
    Returns:
      an array of the same kind and dtype as ``cells``.
    """
    cells = _as_array(cells)
    s_y, s_x = cells.shape[-2:]
    height, width = int(height), int(width)
    if height % s_y == 0 and width % s_x == 0 and height // s_y == width // s_x:
        return upsample(cells, height // s_y)
    rows = (np.arange(height) * s_y) // height
    cols = (np.arange(width) * s_x) // width
    return cells[..., rows, :][..., cols]


def pool(pixels, grid_size: int, reduce: str, *, channels: bool = False):
    """Pixel map ``[..., H, W]`` -> cell map ``[..., S, S]`` (``S = grid_size``).

    ``out[..., y, x] = reduce over pixels[..., y*P_y:(y+1)*P_y, x*P_x:(x+1)*P_x]`` with
    ``P_y = H // S``, ``P_x = W // S``.

    Args:
      pixels: numpy or jax array ``[..., H, W]``, or ``[..., H, W, C]`` with ``channels=True``
        (then the channel axis is reduced together with the cell's pixels, in one reduction).
      grid_size: cells per side S; ``H`` and ``W`` must be multiples of it.
      reduce: ``"sum"``, ``"mean"``, ``"max"`` or ``"any"`` (bool: some pixel is nonzero).
      channels: whether ``pixels`` has a trailing channel axis.
    Returns:
      an array of the same kind as ``pixels`` (dtype of the reduction).
    """
    if reduce not in REDUCTIONS:
        raise ValueError(f"reduce must be one of {REDUCTIONS}, got {reduce!r}")
    pixels = _as_array(pixels)
    xp = _xp(pixels)
    s = int(grid_size)
    shape = pixels.shape[:-1] if channels else pixels.shape
    *lead, h, w = shape
    if h % s or w % s:
        raise ValueError(f"pixel map {h}x{w} is not a {s}x{s} grid of whole cells")
    blocks = (*lead, s, h // s, s, w // s) + ((pixels.shape[-1],) if channels else ())
    axes = (-4, -2, -1) if channels else (-3, -1)
    return getattr(xp, reduce)(pixels.reshape(blocks), axis=axes)


def mask_cells(image, cell_mask, fill):
    """The image with the pixels of every masked cell replaced by ``fill``.

    Args:
      image: ``[..., H, W, C]`` numpy or jax array, H and W pixels of an S x S grid.
      cell_mask: bool ``[..., S, S]`` indexed ``[y, x]``, True = mask; its leading axes broadcast
        against the image's.
      fill: the absent state, broadcast against ``[..., H, W, C]`` and cast to the image dtype: a
        scalar, a colour ``[C]``, or an image ``[H, W, C]`` (e.g. the empty tile tiled S x S).
    Returns:
      ``where(upsample_to(cell_mask, H, W)[..., None], fill, image)``, of the broadcast shape of
      image, mask and fill, the image's dtype; a jax array when any input is one.
    """
    jax_in = any(isinstance(a, jax.Array) for a in (image, cell_mask, fill))
    xp = jnp if jax_in else np
    image = xp.asarray(image)
    fill = xp.asarray(fill, image.dtype)
    h, w = image.shape[-3:-1]
    pixels = upsample_to(xp.asarray(cell_mask, bool), h, w)[..., None]  # [..., H, W, 1]
    # Explicit broadcasting: the operands' ranks differ (no implicit rank promotion).
    shape = np.broadcast_shapes(pixels.shape[:-1] + image.shape[-1:], image.shape, fill.shape)
    return xp.where(xp.broadcast_to(pixels, shape), xp.broadcast_to(fill, shape),
                    xp.broadcast_to(image, shape))


__all__ = ["REDUCTIONS", "SquareGrid", "upsample", "upsample_to", "pool", "mask_cells"]
