"""``Attribution``: what every local explainer returns, for a batch of samples.

A visual map per grid cell and a textual map per model token. Players of the closed world are
the ``S x S`` cells (a cell is the unit the ground truth A ∪ T is made of) and the question's
non-PAD tokens; PAD positions carry 0 and are marked invalid. Pixel maps are derived on demand
(``visual_pixels``), each pixel carrying its cell's value / cell_px**2, so relevance mass is
the same at cell and pixel level (``gridvqa_jax.metrics.upsample_cells``).
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from gridvqa_jax.metrics import upsample_cells


@flax.struct.dataclass
class Attribution:
    """Local attributions for a batch of B samples on an S x S grid with L token slots."""

    visual: jax.Array  # float32 [B, S, S]: attribution of each grid cell
    textual: jax.Array  # float32 [B, L]: attribution of each token, 0 at PAD
    token_valid: jax.Array  # bool [B, L]: the question's non-PAD tokens (the textual players)

    def visual_pixels(self, cell_px: int) -> jax.Array:
        """float32 [B, S*cell_px, S*cell_px]: the cell map spread evenly over each cell's pixels."""
        return upsample_cells(self.visual, cell_px)

    def pad_tokens(self, length: int) -> "Attribution":
        """The same attribution over ``length`` >= L token slots: textual [B, length], the new
        slots PAD (0, invalid); undoes ``world.scene.trim_tokens`` on the explained scenes."""
        extra = length - self.textual.shape[-1]
        if extra < 0:
            raise ValueError(f"cannot pad {self.textual.shape[-1]} token slots to {length}")
        return Attribution(visual=self.visual,
                           textual=jnp.pad(self.textual, ((0, 0), (0, extra))),
                           token_valid=jnp.pad(self.token_valid, ((0, 0), (0, extra))))

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


def concat(parts) -> Attribution:
    """Concatenate Attributions along the batch axis."""
    return jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=0), *parts)


__all__ = ["Attribution", "from_maps", "concat"]
