"""Shared result type and thresholding of the bias views.

Every view returns a :class:`ViewResult`: a hard label per sample on the bias-type scale of
:mod:`bias_jax.data.batch` (UNI_IMAGE=0, BALANCE=1, UNI_TEXT=2), a signed score (> 0 towards
image, < 0 towards text, on the scale its own threshold applies to) and per-sample extras.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from bias_jax.data.batch import BALANCE, UNI_IMAGE, UNI_TEXT


class ViewResult(NamedTuple):
    """Output of one bias view on N samples.

    label: int32 [N], UNI_IMAGE=0 / BALANCE=1 / UNI_TEXT=2.
    score: float32 [N], signed evidence, > 0 towards image, < 0 towards text.
    extras: dict name -> array [N] (e.g. phi_image, phi_text, S_it, S_tt, path effects).
    """

    label: np.ndarray
    score: np.ndarray
    extras: dict


def label_from_score(score, eps) -> np.ndarray:
    """Bias label from a signed score: |score| < eps -> BALANCE, score > 0 -> UNI_IMAGE,
    score < 0 -> UNI_TEXT.  score: [N]; returns int32 [N].  With eps = 0 only exact ties
    (score == 0) are BALANCE."""
    s = np.asarray(score, dtype=np.float64)
    lab = np.where(s > 0, UNI_IMAGE, UNI_TEXT)
    tie = (s == 0) if eps <= 0 else (np.abs(s) < eps)
    return np.where(tie, BALANCE, lab).astype(np.int32)
