"""``Attribution``: what every local explainer returns, for a batch of samples.

A visual map per grid cell and a textual map per model token. Players of the closed world are
the ``S x S`` cells (a cell is the unit the ground truth A ∪ T is made of) and the question's
non-PAD tokens; PAD positions carry 0 and are marked invalid. Pixel maps are derived on demand
(``visual_pixels``), each pixel carrying its cell's value / cell_px**2, so relevance mass is
the same at cell and pixel level (``gridvqa_jax.metrics.upsample_cells``).

An explainer whose image players are not the cells (patches, superpixels: ``explain.regions``)
or whose map is per pixel also gives ``visual_px`` float32 ``[B, H, W]``, its map at the
resolution it explained (``H = W = S * cell_px``); the cell map is then that map's mass pooled
per cell (``mmx_base.grid.pool(visual_px, S, "sum")``, ``from_pixel_maps``), and pixel-level
scores read ``visual_px`` itself (``explain.scoring``). ``visual_px`` is None for cell maps.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from gridvqa_jax.metrics import upsample_cells
from mmx_base import grid


@flax.struct.dataclass
class Attribution:
    """Local attributions for a batch of B samples on an S x S grid with L token slots."""

    visual: jax.Array  # float32 [B, S, S]: attribution of each grid cell
    textual: jax.Array  # float32 [B, L]: attribution of each token, 0 at PAD
    token_valid: jax.Array  # bool [B, L]: the question's non-PAD tokens (the textual players)
    # float32 [B, H, W] or None: the per-pixel map of an explainer that has one (module doc)
    visual_px: jax.Array | None = None

    def visual_pixels(self, cell_px: int) -> jax.Array:
        """float32 [B, S*cell_px, S*cell_px]: the cell map spread evenly over each cell's pixels,
        or, with a per-pixel map ``visual_px`` [B, H, W], that map at this resolution: itself
        when ``H = S * cell_px``, else each pixel spread by mass over a ``k x k`` block
        (``k = S * cell_px / H``, an integer) or ``k x k`` pixels summed (``H / (S * cell_px)``)."""
        if self.visual_px is None:
            return upsample_cells(self.visual, cell_px)
        S, H = self.visual.shape[-1], self.visual_px.shape[-1]
        out = S * int(cell_px)
        if out == H:
            return self.visual_px
        if out % H == 0:
            return upsample_cells(self.visual_px, out // H)
        if H % out == 0:
            return grid.pool(self.visual_px, out, "sum")
        raise ValueError(f"a {H}-px pixel map cannot be resampled to {out} px by whole pixels")

    def pad_tokens(self, length: int) -> "Attribution":
        """The same attribution over ``length`` >= L token slots: textual [B, length], the new
        slots PAD (0, invalid); undoes ``world.scene.trim_tokens`` on the explained scenes."""
        extra = length - self.textual.shape[-1]
        if extra < 0:
            raise ValueError(f"cannot pad {self.textual.shape[-1]} token slots to {length}")
        return Attribution(visual=self.visual,
                           textual=jnp.pad(self.textual, ((0, 0), (0, extra))),
                           token_valid=jnp.pad(self.token_valid, ((0, 0), (0, extra))),
                           visual_px=self.visual_px)

    @property
    def batch_size(self) -> int:
        """B, the number of explained samples."""
        return self.visual.shape[0]


def from_maps(visual, textual, token_valid) -> Attribution:
    """Build an ``Attribution`` from a cell map [B, S, S] and a token map [B, L]; the token map is
    zeroed outside ``token_valid`` [B, L] so PAD never carries mass."""
    token_valid = jnp.asarray(token_valid, bool)
    textual = jnp.where(token_valid, jnp.asarray(textual, jnp.float32), 0.0)
    return Attribution(visual=jnp.asarray(visual, jnp.float32), textual=textual,
                       token_valid=token_valid)


def from_pixel_maps(visual_px, textual, token_valid, grid_size: int) -> Attribution:
    """Build an ``Attribution`` from a per-pixel map ``visual_px`` [B, H, W] (H, W multiples of
    ``grid_size`` S) and a token map [B, L]: the cell map [B, S, S] is the pixel map's mass per
    cell, ``mmx_base.grid.pool(visual_px, S, "sum")``; the token map is zeroed outside
    ``token_valid`` as in ``from_maps``."""
    visual_px = jnp.asarray(visual_px, jnp.float32)
    out = from_maps(grid.pool(visual_px, int(grid_size), "sum"), textual, token_valid)
    return out.replace(visual_px=visual_px)


def concat(parts) -> Attribution:
    """Concatenate Attributions along the batch axis."""
    return jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=0), *parts)


__all__ = ["Attribution", "from_maps", "from_pixel_maps", "concat"]
