"""Modality benefit (modality-bias paper, section 3.1, eqs. 1-3): the Shapley value of each
modality in the cooperative game "predict the label".

Value of a modality subset M' of sample x with label y (eq. 1)::

    V(x^{M'}) = |M'|  if the prediction from x^{M'} is correct,  0 otherwise;   V(empty) = 0.

A prediction is ``real`` if the logit (log P(real) - log P(fake)) is > 0, ``fake`` if < 0; a
logit of exactly 0 is an abstention and counts as not correct (a detector with no evidence
earns no benefit). Graded variant (``value="logprob"``)::

    V(x^{M'}) = |M'| * (log p(y | x^{M'}) - log 1/2)

the log-likelihood gain (nats) of the true label over a chance guess, so that V(empty) = 0 is
the value of predicting from nothing.

Shapley value by the permutation form (eq. 2), for n players (``shapley_permutation``)::

    phi_i = 1/n! * sum_{pi in Perm(M)} [V(pred_pi(i) + {i}) - V(pred_pi(i))]

with pred_pi(i) the players before i in pi. For the two modalities (eq. 3)::

    phi_image = 1/2 [V(I) - V(0) + V(I, T) - V(T)],  phi_text = 1/2 [V(T) - V(0) + V(I, T) - V(I)]

so ``phi_image - phi_text = V(I) - V(T)``: the joint detector's answer cancels from the
decision, and with the 0/1 value the two phis tie whenever both unimodal predictions are right
or both wrong (e.g. a Uni-image sample whose text-only detector is right by chance on the binary
label is called Modality-balance).

Which detector answers on each subset (paper, end of section 3.1: "leverage Image-only,
Image-text, and Text-only models to compute V(x^image, 0^text), V(x^text, x^image) and
V(x^text, 0^image)"): {image} -> the image-only detector, {text} -> the text-only detector,
{image, text} -> the joint (image-text) detector, each fed the absent input for the missing
modality (``bias_jax.detectors.detector_inputs``: zero image, PAD placeholder text).
``subsets="joint"`` instead asks the joint detector on all three subsets with the missing
modality absent (an alternative the paper does not use).

Decision: Uni-image if phi_image > phi_text, Modality-balance if equal, Uni-text otherwise;
``score = phi_image - phi_text`` and ``label = label_from_score(score, eps)`` with ``eps = 0``
(the paper's exact equality) for the 0/1 value; the graded value needs a margin (default
``eps = log(2) / 2``, half the gain of a certain prediction over chance).
"""

from __future__ import annotations

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np

from bias_jax import detectors as D
from bias_jax.data.batch import Batch
from bias_jax.views.common import ViewResult, label_from_score

VALUES = ("binary", "logprob")
SUBSETS = ("unimodal", "joint")
GRADED_EPS = 0.5 * math.log(2.0)


def shapley_permutation(values) -> jax.Array:
    """Shapley values by the permutation form (eq. 2).

    values: [..., 2**n], ``values[..., m]`` = V of the coalition whose members are the set bits
    of ``m`` (player i = bit i; ``values[..., 0]`` = V(empty)). Returns phi [..., n]:
    ``phi_i = 1/n! sum_pi V(pred_pi(i) | {i}) - V(pred_pi(i))``. The n! permutations are
    unrolled at trace time (n is small: 2 modalities here).
    """
    values = jnp.asarray(values)
    n = int(round(math.log2(values.shape[-1])))
    if 2 ** n != values.shape[-1]:
        raise ValueError(f"values must have 2**n entries on the last axis, got {values.shape}")
    phi = [jnp.zeros(values.shape[:-1], values.dtype) for _ in range(n)]
    for perm in itertools.permutations(range(n)):
        mask = 0
        for i in perm:
            phi[i] = phi[i] + values[..., mask | (1 << i)] - values[..., mask]
            mask |= 1 << i
    return jnp.stack(phi, axis=-1) / math.factorial(n)


def _true_logprob(logit, label):
    """log p(label | input) from logit = log P(real) - log P(fake); label 1 real, 0 fake."""
    return jnp.where(label == 1, jax.nn.log_sigmoid(logit), jax.nn.log_sigmoid(-logit))


def _correct(logit, label):
    """Strictly correct prediction (a zero logit is an abstention, never correct)."""
    return jnp.where(label == 1, logit > 0, logit < 0)


def subset_logits(detectors, image, tokens, subsets: str = "unimodal"):
    """Logits on the coalitions {image}, {text}, {image, text} of every sample.

    detectors: kind -> (apply_fn, params, cfg); image uint8 [N, H, W, 3]; tokens int32 [N, L].
    Returns float32 [N, 3] in the order (image, text, both), each from the detector named in the
    module docstring with the absent inputs for the missing modality.
    """
    zimg, ptok = D.zero_image(image), D.placeholder_text(tokens)
    f_joint, p_joint, _ = detectors["joint"]
    if subsets == "unimodal":
        f_img, p_img, _ = detectors["image"]
        f_txt, p_txt, _ = detectors["text"]
        l_i = f_img(p_img, image, ptok)
        l_t = f_txt(p_txt, zimg, tokens)
    elif subsets == "joint":
        l_i = f_joint(p_joint, image, ptok)
        l_t = f_joint(p_joint, zimg, tokens)
    else:
        raise ValueError(f"subsets must be one of {SUBSETS}, got {subsets!r}")
    l_f = f_joint(p_joint, image, tokens)
    return jnp.stack([l_i, l_t, l_f], axis=-1).astype(jnp.float32)


def coalition_values(logits, label, value: str = "binary"):
    """V of the four coalitions as [N, 4], indexed by bitmask (bit 0 = image, bit 1 = text):
    [V(empty) = 0, V(image), V(text), V(image, text)] (eq. 1 or its graded form).

    logits: [N, 3] from ``subset_logits``; label int [N] (1 real, 0 fake).
    """
    label = jnp.asarray(label)[:, None]
    if value == "binary":
        v = _correct(logits, label).astype(jnp.float32)
    elif value == "logprob":
        v = _true_logprob(logits, label) + math.log(2.0)
    else:
        raise ValueError(f"value must be one of {VALUES}, got {value!r}")
    size = jnp.asarray([[1.0, 1.0, 2.0]])  # |M'| of image, text, both
    v = v * size
    return jnp.concatenate([jnp.zeros_like(v[:, :1]), v], axis=-1)


@functools.partial(jax.jit, static_argnames=("fns", "subsets", "value"))
def _benefit_chunk(fns, params, image, tokens, label, subsets, value):
    dets = {k: (f, p, None) for (k, f), p in zip(fns, params)}
    logits = subset_logits(dets, image, tokens, subsets)
    phi = shapley_permutation(coalition_values(logits, label, value))
    return phi, logits


def benefit_view(detectors, batch: Batch, *, key=None, value: str = "binary",
                 subsets: str = "unimodal", eps: float | None = None,
                 chunk: int = 1024) -> ViewResult:
    """The modality-benefit view on a batch of N samples (module docstring).

    detectors: kind -> (apply_fn, params, cfg) with kinds "image", "text", "joint"
    (``subsets="joint"`` needs only "joint"); batch: ``Batch`` with ``label`` (the true label,
    which V needs). ``key`` is unused (the view is deterministic). ``eps``: balance threshold on
    ``score = phi_image - phi_text`` (default 0 for ``value="binary"``, log(2)/2 for
    ``"logprob"``). Jitted per chunk of ``chunk`` samples.

    Returns ``ViewResult(label [N], score [N], extras)`` with extras ``phi_image``, ``phi_text``,
    ``logit_image``, ``logit_text``, ``logit_joint`` (the three coalition logits), all [N].
    """
    del key
    if value not in VALUES:
        raise ValueError(f"value must be one of {VALUES}, got {value!r}")
    if eps is None:
        eps = 0.0 if value == "binary" else GRADED_EPS
    kinds = ("joint",) if subsets == "joint" else ("image", "text", "joint")
    fns = tuple((k, detectors[k][0]) for k in kinds)
    params = tuple(detectors[k][1] for k in kinds)
    n = batch.size
    phis, logits = [], []
    for s in range(0, n, chunk):
        sl = slice(s, s + chunk)
        phi, lg = _benefit_chunk(fns, params, jnp.asarray(batch.image[sl]),
                                 jnp.asarray(batch.tokens[sl]), jnp.asarray(batch.label[sl]),
                                 subsets, value)
        phis.append(np.asarray(phi))
        logits.append(np.asarray(lg))
    phi = np.concatenate(phis)
    lg = np.concatenate(logits)
    score = (phi[:, 0] - phi[:, 1]).astype(np.float32)
    extras = {"phi_image": phi[:, 0], "phi_text": phi[:, 1], "logit_image": lg[:, 0],
              "logit_text": lg[:, 1], "logit_joint": lg[:, 2]}
    return ViewResult(label_from_score(score, eps), score, extras)


__all__ = ["VALUES", "SUBSETS", "GRADED_EPS", "shapley_permutation", "subset_logits",
           "coalition_values", "benefit_view"]
