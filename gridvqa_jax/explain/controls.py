"""Controls printed beside every explainer: the floor and the ceiling of each metric.

- ``random_attribution``: i.i.d. uniform [0, 1) values on every cell and every valid token, so
  its expected RMA is the ground truth's share of the players (chance over all cells).
- ``objects_attribution``: uniform mass ``1 / |O|`` on the occupied cells O and ``1 / |T|`` on the
  valid (non-PAD) tokens T, so its RMA is ``|G ∩ O| / |O|`` (G the ground-truth cells). A
  perturbation explainer (masking a cell to the empty tile) gives every empty cell exactly 0, so
  uniform mass over the objects, not over all cells, is the trivial baseline it must beat (about
  a third at d07, against ``random``'s ~23%): the honest floor of Table 1.
- ``oracle_attribution``: the ground-truth mask itself (1 on A ∪ T cells and on target-attribute,
  anchor-attribute and relation tokens, 0 elsewhere): RMA = IoU = 1 wherever a ground truth
  exists (the ceiling).

All three follow the signature ``control(fn, scenes, key, **_) -> Attribution`` and ignore
``fn`` (``scoring`` adapts them to the explainer signature).

Stand-in models of known synergy for the global synergy estimators (``synergy_control_models``;
apply functions ``apply(params, image [B, H, W, 3], tokens [B, L]) -> {"answer_logprobs":
[B, 2]}`` on the closed world's 5x5 renderings, params unused):

- ``additive_control``: ``g_c(t) + h_c(v)`` per answer c, no interaction (EMAP = InterSHAP = 0);
- ``image_only_control`` / ``text_only_control``: one modality only (every estimator 0);
- ``xor_control``: (odd number of red objects) XOR (the question names red), pure interaction
  (EMAP near 1 for balanced bits).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from gridvqa_jax.explain.attribution import Attribution, from_maps
from gridvqa_jax.world import universe as U


def random_attribution(fn, scenes, key, **_) -> Attribution:
    """Uniform random maps: visual [B, S, S] and textual [B, L] ~ U[0, 1), PAD tokens 0."""
    kv, kt = jax.random.split(key)
    valid = jnp.asarray(scenes.tokens) != U.PAD_ID
    visual = jax.random.uniform(kv, jnp.shape(scenes.gt_cells), jnp.float32)
    textual = jax.random.uniform(kt, valid.shape, jnp.float32)
    return from_maps(visual, textual, valid)


def objects_attribution(fn, scenes, key=None, **_) -> Attribution:
    """Uniform mass over the objects: visual [B, S, S] = ``1 / |O|`` on the occupied cells O
    (``scenes.color >= 0``), 0 on empty cells; textual [B, L] = ``1 / |T|`` on the non-PAD tokens
    T, 0 at PAD. RMA = ``|G ∩ O| / |O|`` with G the ground-truth cells, Otsu IoU
    ``|G ∩ O| / |G ∪ O|``. An image without objects gets an all-zero map (scored NaN)."""
    valid = jnp.asarray(scenes.tokens) != U.PAD_ID
    occupied = (jnp.asarray(scenes.color) >= 0).astype(jnp.float32)
    n_occ = jnp.sum(occupied, axis=(-2, -1), keepdims=True)
    n_tok = jnp.sum(valid, axis=-1, keepdims=True)
    return from_maps(occupied / jnp.maximum(n_occ, 1.0),
                     valid.astype(jnp.float32) / jnp.maximum(n_tok, 1), valid)


def oracle_attribution(fn, scenes, key=None, **_) -> Attribution:
    """The ground truth as a map: ``gt_cells`` [B, S, S] and ``gt_tokens`` [B, L] as 0/1 floats."""
    valid = jnp.asarray(scenes.tokens) != U.PAD_ID
    return from_maps(jnp.asarray(scenes.gt_cells, jnp.float32),
                     jnp.asarray(scenes.gt_tokens, jnp.float32), valid)


# ----------------------------------------------------------------------------------------------
# Stand-in models of known synergy
# ----------------------------------------------------------------------------------------------
def red_objects(image, grid_size: int = 5) -> jax.Array:
    """Number of red objects per image ``int [B]``: cells whose centre pixel has R > 200 and
    G, B < 100."""
    image = jnp.asarray(image)
    P = image.shape[1] // grid_size
    c = image[:, P // 2::P, P // 2::P, :].astype(jnp.int32)
    return jnp.sum((c[..., 0] > 200) & (c[..., 1] < 100) & (c[..., 2] < 100), axis=(1, 2))


def names_red(tokens) -> jax.Array:
    """Whether each question names the colour red: bool ``[B]``."""
    return jnp.any(jnp.asarray(tokens) == U.WORD_ID["red"], axis=1)


def n_words(tokens) -> jax.Array:
    """Number of non-PAD tokens per question: int ``[B]``."""
    return jnp.sum(jnp.asarray(tokens) != U.PAD_ID, axis=1)


def _two(a, b):
    return {"answer_logprobs": jnp.stack([a, b], axis=-1).astype(jnp.float32)}


# An offset that keeps the two answers' scores apart on every input (the score difference
# 0.5 r + 1.1 t + 0.05 w - 0.125 of integer r, t, w is never 0): on a tie the answer is
# undefined, and an emap_gap scored against the controls' own answers would count round-off in
# the projection as a lost answer.
_NO_TIE = 0.125


def additive_control(params, image, tokens):
    """Per answer ``g_c(t) + h_c(v)``: red-object count plus question terms; no interaction
    (``image_only_control + text_only_control``)."""
    r, t, w = red_objects(image), names_red(tokens), n_words(tokens)
    return _two(0.3 * r - _NO_TIE + 0.7 * t + 0.05 * w, -0.2 * r - 0.4 * t)


def image_only_control(params, image, tokens):
    """Reads the image only (red-object count)."""
    r = red_objects(image)
    return _two(0.3 * r - _NO_TIE, -0.2 * r)


def text_only_control(params, image, tokens):
    """Reads the question only (names red, word count)."""
    t, w = names_red(tokens), n_words(tokens)
    return _two(0.7 * t + 0.05 * w, -0.4 * t)


def xor_control(params, image, tokens):
    """+-2 on (odd number of red objects) XOR (question names red): pure interaction."""
    s = 2.0 * ((red_objects(image) % 2 == 1) ^ names_red(tokens)) - 1.0
    return _two(-2.0 * s, 2.0 * s)


def synergy_control_models() -> dict:
    """``{name: apply_fn}`` of the stand-in models (params unused, pass None). Outputs are
    per-answer scores, not normalised log-probabilities: the estimators need no normalisation,
    and normalising would couple the answers (a log-softmax of an additive score is not
    additive)."""
    return {"additive": additive_control, "image_only": image_only_control,
            "text_only": text_only_control, "xor": xor_control}


__all__ = ["random_attribution", "objects_attribution", "oracle_attribution", "red_objects",
           "names_red", "n_words", "additive_control", "image_only_control", "text_only_control",
           "xor_control", "synergy_control_models"]
