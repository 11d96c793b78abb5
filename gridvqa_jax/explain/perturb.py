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
answer, or the probability instead of its log; ``quantity=`` the model's own logit or the exact
log-odds, ``QUANTITIES``).

Other absent states of a cell (``baseline=``, ``BASELINES``; ``baseline_fill``): ``"empty"`` (the
default, above), ``"gray"`` (uniform 128, mid-grey: MultiSHAP's reference fills masked ViLT
patches with 0.5 in [0, 1], WGLab/MultiSHAP ``MultiSHAP.py``, ``create_masked_image``) or
``"black"`` (0, e.g. ``lime_image``'s ``hide_color=0``). Neither is a scene of the universe.
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
    the batch, at least 1 (a sample with fewer groups has null players, which change no other
    player's value). ``ValueError`` for an id that owns both cells and tokens."""
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


BASELINES = ("empty", "gray", "black")  # the absent state of a cell (``baseline_fill``)
GRAY = 128  # uint8 mid-grey: 127.5 -> 0 under the models' x / 255 - 0.5 (rounded up)
QUANTITIES = ("logprob", "logit", "log_odds")  # the explained quantity (``answer_logprob``)


def baseline_fill(baseline: str, grid_size: int, cell_px: int, dtype=jnp.uint8):
    """The absent state of every cell of an S x S grid of P-px cells, ``[S*P, S*P, 3]`` of
    ``dtype`` (the ``fill`` of ``mmx_base.grid.mask_cells``): ``"empty"`` = the empty white tile
    ``render.tile_table(P)[0]`` tiled S x S (a masked scene is a scene of the universe);
    ``"gray"`` = ``GRAY`` (128) everywhere, the uint8 mid-grey (MultiSHAP's reference writes
    0.5 in [0, 1] and casts ``0.5 * 255`` to uint8, 127; both are within 0.004 of 0 after the
    models' ``x / 255 - 0.5``, as 0.5 is 0 after ViLT's mean-0.5 / std-0.5 normalisation);
    ``"black"`` = 0. ``ValueError`` for another name."""
    S, P = int(grid_size), int(cell_px)
    if baseline == "empty":
        return jnp.tile(jnp.asarray(R.tile_table(P)[0], dtype), (S, S, 1))
    if baseline == "gray":
        return jnp.full((S * P, S * P, 3), GRAY, dtype)
    if baseline == "black":
        return jnp.zeros((S * P, S * P, 3), dtype)
    raise ValueError(f"baseline must be one of {', '.join(BASELINES)}, got {baseline!r}")


def mask_cells(image, cell_mask, cell_px: int | None = None, *, baseline: str = "empty"):
    """Replace the masked cells of an image by the empty white tile (or ``baseline``).

    image [..., S*P, S*P, 3] (uint8, or float in the same 0..255 units), cell_mask bool
    [..., S, S] indexed [y, x] (True = mask; broadcast against the image's leading axes),
    ``cell_px`` = P (inferred from the image when None) -> image of the same shape and dtype,
    with every pixel of a masked cell equal to ``render.tile_table(P)[0]`` (white), the tile
    ``render.render`` draws for an empty cell. Masking the cells of some objects therefore gives
    exactly the render of the scene without them.

    Masking commutes with the models' area-average resize when P is a multiple of the model's
    cell size (a white block averages to white), so one may mask at the model resolution.

    ``baseline``: the absent state, ``"empty"`` (default, as above), ``"gray"`` (every pixel
    128) or ``"black"`` (0): ``baseline_fill``.
    """
    image = jnp.asarray(image)
    S = int(np.shape(cell_mask)[-1])
    P = _cell_px(image, S, cell_px)
    return grid.mask_cells(image, cell_mask, fill=baseline_fill(baseline, S, P, image.dtype))


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
                     cell_px: int | None = None, *, baseline: str = "empty"):
    """The K perturbed inputs of one sample, one per coalition.

    image [H, W, 3], tokens int [L], coalition bool [K, n_players] (True = player present),
    feature_mask: the sample's ``FeatureMask`` -> (images [K, H, W, 3], tokens [K, L]): row k is
    the input with every feature of every absent player masked (cells to the empty tile, or to
    ``baseline``'s fill, ``mask_cells``; tokens to PAD, ``mask_tokens``). Pure jnp: vmap over
    samples (image, tokens, coalitions and feature masks with a leading batch axis).
    """
    cell_mask, token_mask = feature_masks(coalition, feature_mask)
    images = mask_cells(jnp.asarray(image)[None], cell_mask, cell_px, baseline=baseline)
    return images, mask_tokens(jnp.asarray(tokens)[None], token_mask)


def answer_logprob(apply_fn: Callable, params, image, tokens, answer=None,
                   probability: bool = False, *, quantity: str = "logprob"):
    """The explained quantity: ``log P(answer | image, tokens)`` per sample, float [B].

    ``apply_fn(params, image [B, H, W, 3], tokens [B, L]) -> {"answer_logprobs": [B, A]}``
    (normalised log-probabilities over the unified answer space). ``answer`` int [B]: the
    answer classes to score; None = the model's predicted answer (argmax) on these same inputs,
    so for perturbed inputs pass the answer predicted on the unperturbed one
    (``predicted_answer``). ``probability=True`` returns ``P(answer)`` instead of its log.

    ``quantity`` (``QUANTITIES``): ``"logprob"`` (default) as above; ``"logit"``: the model's
    own logit ``outputs["answer_logits"][answer]``, for a model that returns one (``ValueError``
    otherwise: GridMDETR returns only normalised log-probabilities, and a softmax logit is
    ``z_a = log p_a + logsumexp(z)``, the log-probability up to a per-input constant that the
    log-probabilities do not determine, so it cannot be recovered from them);
    ``"log_odds"``: ``log p_a - log(1 - p_a)`` exactly, with ``log(1 - p_a) = logsumexp_{b != a}
    log p_b`` (finite even where ``p_a`` rounds to 1). The log-odds is the logit of the
    per-answer probability ``p_a = sigmoid(z_a)`` of a VQA head trained with per-answer binary
    cross-entropy, such as ViLT's (``ViltForQuestionAnswering``), whose logit MultiSHAP's
    reference explains. ``probability=True`` goes with ``"logprob"`` only.
    """
    if quantity not in QUANTITIES:
        raise ValueError(f"quantity must be one of {', '.join(QUANTITIES)}, got {quantity!r}")
    if probability and quantity != "logprob":
        raise ValueError(f"probability=True explains P(answer); it excludes quantity={quantity!r}")
    outputs = apply_fn(params, image, tokens)
    logprobs = outputs["answer_logprobs"]
    if answer is None:
        answer = jnp.argmax(logprobs, axis=-1)
    answer = jnp.asarray(answer, jnp.int32)
    value = jnp.take_along_axis(logprobs, answer[..., None], axis=-1)[..., 0]
    if quantity == "log_odds":
        is_a = jax.nn.one_hot(answer, logprobs.shape[-1], dtype=jnp.bool_)
        rest = jax.nn.logsumexp(jnp.where(is_a, -jnp.inf, logprobs), axis=-1)
        return value - rest
    if quantity == "logit":
        if "answer_logits" not in outputs:
            raise ValueError("quantity='logit' reads outputs['answer_logits'], which this model "
                             "does not return (it returns normalised log-probabilities): use "
                             "'log_odds' (exact) or 'logprob'")
        logits = outputs["answer_logits"]
        return jnp.take_along_axis(logits, answer[..., None], axis=-1)[..., 0]
    return jnp.exp(value) if probability else value


def predicted_answer(apply_fn: Callable, params, image, tokens):
    """int32 [B]: the model's answer class (argmax of ``answer_logprobs``)."""
    logprobs = apply_fn(params, image, tokens)["answer_logprobs"]
    return jnp.argmax(logprobs, axis=-1).astype(jnp.int32)


def make_value_fn(apply_fn: Callable, params, image, tokens, feature_mask: FeatureMask,
                  answer=None, probability: bool = False, cell_px: int | None = None, *,
                  baseline: str = "empty", quantity: str = "logprob"):
    """The coalition game of one sample: ``value_fn(coalition bool [K, n_players]) -> float[K]``,
    ``v(S) = answer_logprob`` of the input with every player outside S masked
    (``coalition_inputs``), for the answer predicted on the unperturbed input (or ``answer``,
    an int scalar). image [H, W, 3], tokens [L]. Pure: usable inside jit/vmap, and as the
    ``value_fn`` of ``gridvqa_jax.explain.shapley``'s estimators (which call it chunk by chunk).
    ``baseline``: the absent state of a cell (``mask_cells``); ``quantity``: what ``v`` reads
    (``answer_logprob``).
    """
    if answer is None:
        answer = predicted_answer(apply_fn, params, jnp.asarray(image)[None],
                                  jnp.asarray(tokens)[None])[0]
    answer = jnp.asarray(answer, jnp.int32)

    def value_fn(coalition):
        images, toks = coalition_inputs(image, tokens, coalition, feature_mask, cell_px,
                                        baseline=baseline)
        ans = jnp.broadcast_to(answer, (images.shape[0],))
        return answer_logprob(apply_fn, params, images, toks, ans, probability,
                              quantity=quantity)

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
           "compact_feature_mask", "BASELINES", "GRAY", "QUANTITIES", "baseline_fill"]
