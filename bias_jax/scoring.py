"""Scores of a bias labelling against the exact (or human) labels, and agreement between views.

A labelling ``pred`` int [N] is scored against ``truth`` int [N] on the classes of
:mod:`bias_jax.data.batch` (UNI_IMAGE=0, BALANCE=1, UNI_TEXT=2; truth -1 = unknown, as on real
benchmarks without hand labels):

- proportion of class c: ``share_c = #{pred == c} / N``; in-class accuracy
  ``acc_c = #{pred == c and truth == c} / #{pred == c}`` (NaN when nothing is predicted c);
- accuracy ``mean(pred == truth)`` and macro-F1 ``sklearn.metrics.f1_score(truth, pred,
  labels=[0, 1, 2], average="macro", zero_division=0)``; both need known truth;
- the confusion counts ``[t][p] = #{truth == t and pred == p}``;
- agreement between views: Krippendorff's alpha, nominal level, on the [V, N] label table
  (the ``krippendorff`` package), for all views and per pair;
- Venn counts: for each class c, the sets ``{n : label_v[n] == c}`` of three views and the
  sizes of the seven regions of their Venn diagram (``VENN_REGIONS``).
"""

from __future__ import annotations

import math

import numpy as np

from bias_jax.data.batch import BIAS_TYPES, REAL, UNKNOWN_BIAS
from bias_jax.ensemble import VIEWS

LABELS = (0, 1, 2)
VENN_REGIONS = ("100", "010", "001", "110", "101", "011", "111")  # bits: in view 0 / 1 / 2


def truth_known(truth) -> bool:
    """True when ``truth`` int [N] is non-empty and holds no unknown (-1) entry."""
    t = np.asarray(truth)
    return t.size > 0 and bool((t != UNKNOWN_BIAS).all())


def proportions(pred, truth=None) -> dict:
    """``{"uni_image": (share, acc), "balance": ..., "uni_text": ...}``: the share of samples
    predicted as each class and the in-class accuracy (fraction of those whose truth is that
    class; NaN when none is predicted or truth is unknown). pred, truth: int [N]."""
    pred = np.asarray(pred)
    n = max(pred.size, 1)
    known = truth is not None and truth_known(truth)
    out = {}
    for c, name in enumerate(BIAS_TYPES):
        sel = pred == c
        share = float(sel.sum()) / n
        acc = float((np.asarray(truth)[sel] == c).mean()) if known and sel.any() else math.nan
        out[name] = (share, acc)
    return out


def macro_f1(pred, truth) -> float:
    """``sklearn.metrics.f1_score(truth, pred, labels=[0, 1, 2], average="macro",
    zero_division=0)``: the mean over the three classes of the per-class F1, a class never
    predicted nor present scoring 0."""
    from sklearn.metrics import f1_score

    return float(f1_score(np.asarray(truth), np.asarray(pred), labels=list(LABELS),
                          average="macro", zero_division=0))


def score_labels(pred, truth=None) -> dict:
    """``{"accuracy", "macro_f1", "proportions": {type: [share, acc]}}`` of ``pred`` [N];
    accuracy, macro-F1 and in-class accuracies are None when ``truth`` is unknown."""
    props = proportions(pred, truth)
    known = truth is not None and truth_known(truth)
    clean = lambda x: None if x is None or math.isnan(x) else x  # noqa: E731
    return {"accuracy": float((np.asarray(pred) == np.asarray(truth)).mean()) if known else None,
            "macro_f1": macro_f1(pred, truth) if known else None,
            "proportions": {k: [s, clean(a)] for k, (s, a) in props.items()}}


def confusion(pred, truth) -> list:
    """3 x 3 counts ``[t][p] = #{truth == t and pred == p}`` (classes UNI_IMAGE, BALANCE,
    UNI_TEXT); rows are the true types."""
    t, p = np.asarray(truth, np.int64), np.asarray(pred, np.int64)
    return np.bincount(3 * t + p, minlength=9).reshape(3, 3).tolist()


def identifiable_labels(truth, label) -> np.ndarray:
    """The exact types with every real Uni-image sample relabelled Modality-balance: in the
    closed world a real Uni-image sample (authentic scene, true contingent claim) has the
    distribution of a real balanced sample, so no labelling computed from the inputs and the
    label can tell them apart; this is the best any view or ensemble can answer (with
    detectors that miss nothing else). truth, label int [N]; int32 [N]."""
    truth = np.asarray(truth)
    real_ui = (truth == 0) & (np.asarray(label) == REAL)
    return np.where(real_ui, 1, truth).astype(np.int32)


def krippendorff_alpha(table) -> float:
    """Krippendorff's alpha, nominal level, of a label table int [V, N] (V raters = views):
    ``krippendorff.alpha(reliability_data=table, level_of_measurement="nominal")``; NaN when
    the table holds a single value (alpha undefined: no variation to agree on)."""
    import krippendorff

    table = np.asarray(table, np.float64)
    if np.unique(table).size < 2:
        return math.nan
    return float(krippendorff.alpha(reliability_data=table, level_of_measurement="nominal"))


def agreement(view_labels: dict, views=VIEWS) -> dict:
    """``{"all": alpha over the views, "<a>-<b>": alpha per pair}`` (Krippendorff, nominal)."""
    out = {"all": krippendorff_alpha(np.stack([view_labels[v] for v in views]))}
    for i, a in enumerate(views):
        for b in views[i + 1:]:
            out[f"{a}-{b}"] = krippendorff_alpha(np.stack([view_labels[a], view_labels[b]]))
    return out


def venn_counts(view_labels: dict, views=VIEWS) -> dict:
    """For each class name, the sizes of the seven regions of the three views' sets
    ``{n : label_v[n] == c}``; region ``"110"`` = in views 0 and 1, not in view 2 (order
    ``views``). Returns ``{type: {region: count}}``."""
    if len(views) != 3:
        raise ValueError(f"a Venn diagram needs three views, got {views}")
    out = {}
    for c, name in enumerate(BIAS_TYPES):
        sets = [np.asarray(view_labels[v]) == c for v in views]
        out[name] = {r: int(np.sum(np.logical_and.reduce(
            [s if bit == "1" else ~s for s, bit in zip(sets, r)]))) for r in VENN_REGIONS}
    return out


__all__ = ["LABELS", "VENN_REGIONS", "truth_known", "proportions", "macro_f1", "score_labels",
           "confusion", "identifiable_labels", "krippendorff_alpha", "agreement", "venn_counts"]
