"""Perturbations on the sample structure: masking grid cells and question tokens, players,
coalitions, and the explained quantity.

GridVQA-X has two natural kinds of input feature (players), both with an exact "absent" state:

* a **cell** of the S x S grid: absent = the empty white tile, which is exactly what the closed
  world draws for "no object" (``gridvqa_jax.world.render.tile_table(cell_px)[0]``), so a
  masked scene is again a scene of the universe;
* a **token** of the question: absent = PAD (``universe.PAD_ID``), which the models exclude from
  every attention (``gridvqa_jax.models.mdetr``), so a masked question is the question without
  that word.

Players are groups of features, as captum's ``feature_mask``: a ``FeatureMask`` gives each cell
and each token position a player id (-1 = never masked). The default ``players(scene)`` has
``n_players = S*S + L`` (L = ``universe.MAX_TOKENS``): player ``y*S + x`` is cell (x, y), player
``S*S + t`` is token position t. PAD positions own no feature (id -1), so players
``S*S + n_tokens .. S*S + L - 1`` are null players (questions are PAD only after their last
word); ``active_players`` says which ids own a feature. A coalition is a bool row over players
(True = present, False = masked), the convention of ``gridvqa_jax.explain.shapley``.

The explained quantity (``answer_logprob``) is the log-probability of the model's predicted
answer on the unperturbed input, read from ``outputs["answer_logprobs"]`` (options: a given
answer, or the probability instead of its log).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from mmx_base import grid
from gridvqa_jax.world import render as R
from gridvqa_jax.world import universe as U


class FeatureMask(NamedTuple):
    """Player id of every feature of one sample (captum's ``feature_mask``), -1 = not a player
    (never masked). Several features with one id form one player and are masked together."""

    cells: jax.Array  # int32 [S, S]: player id of cell (x, y) at [y, x]
    tokens: jax.Array  # int32 [L]: player id of token position t



def compact_feature_mask(feature_mask, tokens, S: int):
    """A user ``FeatureMask`` (cells int [B, S, S] or [S, S], tokens int [B, L] or [L]; -1 =
    never masked) -> (compact ``FeatureMask`` int32 [B, S, S] / [B, L], n_cell_groups,
    n_token_groups): each sample's distinct cell ids renumbered ``0..`` in increasing order,
    its distinct token ids ``n_cell_groups..`` (PAD positions -1); the counts are maxima over
    the batch (a sample with fewer groups has null players, which change no other player's
    value). ``ValueError`` for an id that owns both cells and tokens."""
    B, L = tokens.shape
    cells = np.broadcast_to(np.asarray(feature_mask.cells), (B, S, S)).reshape(B, -1)
    toks = np.where(tokens != U.PAD_ID, np.broadcast_to(np.asarray(feature_mask.tokens),
                                                        (B, L)), -1)
    cc, tt, nc, nt = [], [], 1, 1
    for b in range(B):
        uc, ut = np.unique(cells[b][cells[b] >= 0]), np.unique(toks[b][toks[b] >= 0])
        both = np.intersect1d(uc, ut)
        if both.size:
            raise ValueError(f"feature_mask: player id(s) {both.tolist()} own both cells and "
                             f"tokens (sample {b}); a cell x token game needs separate ids")
        cc.append(np.where(cells[b] >= 0, np.searchsorted(uc, cells[b]), -1))
        tt.append(np.where(toks[b] >= 0, np.searchsorted(ut, toks[b]), -1))
        nc, nt = max(nc, uc.size), max(nt, ut.size)
    cells_c = np.stack(cc).reshape(B, S, S).astype(np.int32)
    toks_c = np.where(np.stack(tt) >= 0, np.stack(tt) + nc, -1).astype(np.int32)
    return FeatureMask(cells_c, toks_c), int(nc), int(nt)

def _cell_px(image, grid_size: int, cell_px: int | None) -> int:
    h, w = np.shape(image)[-3:-1]
    if h != w or h % grid_size:
        raise ValueError(f"image {h}x{w} is not a {grid_size}x{grid_size} grid of square cells")
    if cell_px is None:
        return h // grid_size
    if cell_px * grid_size != h:
        raise ValueError(f"cell_px={cell_px} does not match a {h}-px image of {grid_size}x"
                         f"{grid_size} cells")
    return int(cell_px)


def mask_cells(image, cell_mask, cell_px: int | None = None):
    """Replace the masked cells of an image by the empty white tile.

    image [..., S*P, S*P, 3] (uint8, or float in the same 0..255 units), cell_mask bool
    [..., S, S] indexed [y, x] (True = mask; broadcast against the image's leading axes),
    ``cell_px`` = P (inferred from the image when None) -> image of the same shape and dtype,
    with every pixel of a masked cell equal to ``render.tile_table(P)[0]`` (white), the tile
    ``render.render`` draws for an empty cell. Masking the cells of some objects therefore gives
    exactly the render of the scene without them.

    Masking commutes with the models' area-average resize when P is a multiple of the model's
    cell size (a white block averages to white), so one may mask at the model resolution.
    """
    image = jnp.asarray(image)
    S = int(np.shape(cell_mask)[-1])
    P = _cell_px(image, S, cell_px)
    empty = jnp.asarray(R.tile_table(P)[0], image.dtype)  # [P, P, 3]
    return grid.mask_cells(image, cell_mask, fill=jnp.tile(empty, (S, S, 1)))  # the empty grid


def mask_tokens(tokens, token_mask):
    """tokens int [..., L], token_mask bool [..., L] (True = mask) -> tokens with the masked
    positions set to ``universe.PAD_ID`` (which the models never read)."""
    tokens = jnp.asarray(tokens)
    return jnp.where(jnp.asarray(token_mask, bool), jnp.asarray(U.PAD_ID, tokens.dtype), tokens)


def n_players(grid_size: int, max_tokens: int = U.MAX_TOKENS) -> int:
    """Number of players of the default feature mask: ``S*S + L``."""
    return int(grid_size) ** 2 + int(max_tokens)


def players(scene) -> FeatureMask:
    """Default players of one sample (a ``Scene``, or anything with ``.color [S, S]`` and
    ``.tokens [L]``): each cell is a player (id ``y*S + x``) and each non-PAD token is a player
    (id ``S*S + t`` for position t); PAD positions are no player (-1). ``n_players(S, L)`` ids in
    all. vmap over a batch of scenes for a batch of feature masks."""
    tokens = jnp.asarray(scene.tokens, jnp.int32)
    S = int(np.shape(scene.color)[-1])
    L = tokens.shape[-1]
    cells = jnp.arange(S * S, dtype=jnp.int32).reshape(S, S)
    tok = jnp.where(tokens != U.PAD_ID, S * S + jnp.arange(L, dtype=jnp.int32), -1)
    return FeatureMask(cells, tok)


def modality_players(scene) -> FeatureMask:
    """Two players: 0 = the whole image (every cell), 1 = the whole question (every non-PAD
    token). The game of modality-level explainers (e.g. T-SHAP / V-SHAP of MM-SHAP)."""
    tokens = jnp.asarray(scene.tokens, jnp.int32)
    S = int(np.shape(scene.color)[-1])
    return FeatureMask(jnp.zeros((S, S), jnp.int32),
                       jnp.where(tokens != U.PAD_ID, 1, -1).astype(jnp.int32))


def active_players(feature_mask: FeatureMask, n: int):
    """bool [n]: which of the player ids 0..n-1 own at least one feature (the others are null
    players: masking them changes nothing)."""
    ids = jnp.concatenate([feature_mask.cells.reshape(-1), feature_mask.tokens.reshape(-1)])
    hit = jnp.zeros((n + 1,), bool).at[jnp.where(ids >= 0, ids, n)].set(True)
    return hit[:n]


def feature_masks(coalition, feature_mask: FeatureMask):
    """Which features a coalition masks: coalition bool [..., n_players] (True = present) ->
    (cell_mask bool [..., S, S], token_mask bool [..., L]), True = mask. A feature is masked iff
    its player is absent; features of player -1 are never masked."""
    coalition = jnp.asarray(coalition, bool)

    def absent(ids):
        present = jnp.take(coalition, jnp.clip(ids, 0, None).reshape(-1), axis=-1)
        present = present.reshape(coalition.shape[:-1] + ids.shape)
        return jnp.broadcast_to(ids >= 0, present.shape) & ~present

    return absent(feature_mask.cells), absent(feature_mask.tokens)


def coalition_inputs(image, tokens, coalition, feature_mask: FeatureMask,
                     cell_px: int | None = None):
    """The K perturbed inputs of one sample, one per coalition.

    image [H, W, 3], tokens int [L], coalition bool [K, n_players] (True = player present),
    feature_mask: the sample's ``FeatureMask`` -> (images [K, H, W, 3], tokens [K, L]): row k is
    the input with every feature of every absent player masked (cells to the empty tile,
    ``mask_cells``; tokens to PAD, ``mask_tokens``). Pure jnp: vmap over samples (image, tokens,
    coalitions and feature masks with a leading batch axis).
    """
    cell_mask, token_mask = feature_masks(coalition, feature_mask)
    images = mask_cells(jnp.asarray(image)[None], cell_mask, cell_px)
    return images, mask_tokens(jnp.asarray(tokens)[None], token_mask)


def answer_logprob(apply_fn: Callable, params, image, tokens, answer=None,
                   probability: bool = False):
    """The explained quantity: ``log P(answer | image, tokens)`` per sample, float [B].

    ``apply_fn(params, image [B, H, W, 3], tokens [B, L]) -> {"answer_logprobs": [B, A]}``
    (normalised log-probabilities over the unified answer space). ``answer`` int [B]: the
    answer classes to score; None = the model's predicted answer (argmax) on these same inputs,
    so for perturbed inputs pass the answer predicted on the unperturbed one
    (``predicted_answer``). ``probability=True`` returns ``P(answer)`` instead of its log.
    """
    logprobs = apply_fn(params, image, tokens)["answer_logprobs"]
    if answer is None:
        answer = jnp.argmax(logprobs, axis=-1)
    answer = jnp.asarray(answer, jnp.int32)
    value = jnp.take_along_axis(logprobs, answer[..., None], axis=-1)[..., 0]
    return jnp.exp(value) if probability else value


def predicted_answer(apply_fn: Callable, params, image, tokens):
    """int32 [B]: the model's answer class (argmax of ``answer_logprobs``)."""
    logprobs = apply_fn(params, image, tokens)["answer_logprobs"]
    return jnp.argmax(logprobs, axis=-1).astype(jnp.int32)


def make_value_fn(apply_fn: Callable, params, image, tokens, feature_mask: FeatureMask,
                  answer=None, probability: bool = False, cell_px: int | None = None):
    """The coalition game of one sample: ``value_fn(coalition bool [K, n_players]) -> float[K]``,
    ``v(S) = answer_logprob`` of the input with every player outside S masked
    (``coalition_inputs``), for the answer predicted on the unperturbed input (or ``answer``,
    an int scalar). image [H, W, 3], tokens [L]. Pure: usable inside jit/vmap, and as the
    ``value_fn`` of ``gridvqa_jax.explain.shapley``'s estimators (which call it chunk by chunk).
    """
    if answer is None:
        answer = predicted_answer(apply_fn, params, jnp.asarray(image)[None],
                                  jnp.asarray(tokens)[None])[0]
    answer = jnp.asarray(answer, jnp.int32)

    def value_fn(coalition):
        images, toks = coalition_inputs(image, tokens, coalition, feature_mask, cell_px)
        ans = jnp.broadcast_to(answer, (images.shape[0],))
        return answer_logprob(apply_fn, params, images, toks, ans, probability)

    return value_fn


def pixel_grads_to_cells(grad, grid_size: int, absolute: bool = True):
    """Aggregate a pixel gradient to the grid cells: grad [..., S*P, S*P, Ch] -> [..., S, S].

    ``absolute=True`` (default): ``sum |g|`` over the cell's P*P pixels and channels, the
    saliency magnitude of the cell (no cancellation between pixels). ``absolute=False``:
    ``sum g``, the exact derivative of the output along raising every value of the cell by one
    unit (signed; e.g. for gradient x input with a uniform cell).
    """
    g = jnp.asarray(grad)
    H, W = g.shape[-3:-1]
    S = int(grid_size)
    if H != W or H % S:
        raise ValueError(f"gradient {H}x{W} is not a {S}x{S} grid of square cells")
    return grid.pool(jnp.abs(g) if absolute else g, S, "sum", channels=True)


__all__ = ["FeatureMask", "mask_cells", "mask_tokens", "n_players", "players",
           "modality_players", "active_players", "feature_masks", "coalition_inputs",
           "answer_logprob", "predicted_answer", "make_value_fn", "pixel_grads_to_cells",
           "compact_feature_mask"]
