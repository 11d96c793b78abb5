"""Human bias labels of real benchmark samples, read from a CSV, and their alignment to the
analysed samples (``modality-bias analyze --labels FILE``).

The CSV (UTF-8, a BOM allowed, comma separated, a header row) has a column ``id``, the sample's
id in its dataset (Fakeddit: the ``id`` column; MMFakeBench: ``image_path`` as written in its
JSON; the closed world: the sample index), and one of two label forms:

- **types**: a column ``bias`` holding ``uni_image``, ``balance`` or ``uni_text``
  (``batch.BIAS_TYPES``), one row per sample; an id given twice is an error.
- **annotation scores**, the modality-bias paper's protocol (appendix 12.3): a column
  ``annotator`` and the three ratings ``q1_uni_image`` (the image alone lets you predict),
  ``q2_uni_text`` (the text alone does) and ``q3_balance`` (only both together do), each a
  number in [0, 5], one row per (annotator, sample); a pair given twice is an error. A
  sample's type is the argmax of its three ratings averaged over the annotators who rated it
  (the paper: "we first average the three scores of each annotator, respectively, and then
  select the type with the highest score"). **Tie rule**: when two or three types share the
  highest mean rating (within 1e-9), the sample is ``balance``, as the views answer an exact
  tie between the image's and the text's evidence (``views.common.label_from_score``).
  Inter-annotator agreement is reported as in the paper's Table 12: Krippendorff's alpha per
  question (``uni_image``, ``balance``, ``uni_text``) over the annotators' ratings of that
  question, a reliability table [annotators, samples] with a missing rating as NaN. The paper
  does not name the level of measurement; the ratings are numbers on a 0-5 scale, so the
  level here is ``interval`` (``ALPHA_LEVEL``: ``krippendorff.alpha(...,
  level_of_measurement="interval")``, the package's default), not the nominal alpha of
  the per-annotator argmax types. None with a single annotator; NaN when a question's
  ratings hold a single value (no variation to agree on).

Other columns (notes, the text, ...) are ignored. A malformed value raises
``InputError`` naming the file, the line and the column.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import os

import numpy as np

from bias_jax.data.batch import BALANCE, BIAS_TYPES, UNKNOWN_BIAS
from mmx_base.errors import InputError

SCORE_COLUMNS = ("q1_uni_image", "q3_balance", "q2_uni_text")  # in BIAS_TYPES order
SCORE_RANGE = (0.0, 5.0)
ALPHA_LEVEL = "interval"
TIE_TOL = 1e-9
MAX_EXAMPLES = 5  # unmatched ids listed in the report


@dataclasses.dataclass(frozen=True)
class HumanLabels:
    """Labels read from one CSV (``read_labels``).

    ids: tuple[str] [M], distinct, in the file's order of first appearance.
    bias: int32 [M], ``BIAS_TYPES`` codes (0 uni_image, 1 balance, 2 uni_text).
    form: ``"bias"`` (a type per row) or ``"scores"`` (annotation scores).
    n_annotators: distinct annotators (1 for the ``bias`` form).
    annotator_alpha: ``{type: alpha}`` (module docstring) or None (``bias`` form, or one
      annotator).
    mean_scores: float64 [M, 3], the ratings averaged over annotators (``BIAS_TYPES`` order),
      or None for the ``bias`` form.
    """

    path: str
    ids: tuple
    bias: np.ndarray
    form: str
    n_annotators: int
    annotator_alpha: dict | None
    mean_scores: np.ndarray | None = None


def argmax_type(mean_scores) -> np.ndarray:
    """int32 [M]: the type with the highest mean rating of ``mean_scores`` float [M, 3]
    (``BIAS_TYPES`` order); a tie for the highest (within ``TIE_TOL``) is BALANCE."""
    s = np.asarray(mean_scores, np.float64)
    best = s.max(axis=1, keepdims=True)
    top = s >= best - TIE_TOL
    return np.where(top.sum(axis=1) > 1, BALANCE, s.argmax(axis=1)).astype(np.int32)


def annotator_alpha(table) -> float:
    """Krippendorff's alpha at ``ALPHA_LEVEL`` of a rating table float [A, M] (annotators x
    samples, NaN = not rated); NaN when fewer than two distinct ratings occur."""
    import krippendorff

    t = np.asarray(table, np.float64)
    if np.unique(t[~np.isnan(t)]).size < 2:
        return math.nan
    return float(krippendorff.alpha(reliability_data=t, level_of_measurement=ALPHA_LEVEL))


def read_csv_rows(path: str):
    """(fieldnames, [(line, row dict)]) of the CSV at ``path``: header names and values
    stripped, blank lines left out; ``InputError`` naming the file when it is missing, not
    UTF-8, not CSV, or a row has more values than the header."""
    if not os.path.isfile(path):
        raise InputError(f"labels file not found: {path}")
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            fields = [c.strip() for c in (reader.fieldnames or [])]
            reader.fieldnames = fields
            rows = []
            for row in reader:
                if not any((v or "").strip() for k, v in row.items() if k is not None):
                    continue  # a blank line
                if None in row:
                    raise InputError(f"{path}: line {reader.line_num}: more values than the "
                                     f"{len(fields)} header columns")
                rows.append((reader.line_num, {k: (v or "").strip() for k, v in row.items()}))
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text ({e})") from None
    except csv.Error as e:
        raise InputError(f"{path}: not a CSV file ({e})") from None
    return fields, rows


def _need(path, fields, cols, what):
    missing = [c for c in cols if c not in fields]
    if missing:
        raise InputError(f"{path}: {what} needs column(s) {missing}; the header has {fields}")


def read_labels(path) -> HumanLabels:
    """Read the human labels CSV at ``path`` (module docstring: the two forms, the argmax and
    its tie rule, the annotator alpha). ``InputError`` naming the line and column for an empty
    id, an unknown type, a rating that is not a number in [0, 5], a missing annotator, an id
    (``bias`` form) or (annotator, id) pair (scores form) given twice; naming the columns when
    neither form's, or both forms', columns are present or no label row is left."""
    path = os.fspath(path)
    fields, rows = read_csv_rows(path)
    has_bias, has_scores = "bias" in fields, any(c in fields for c in SCORE_COLUMNS)
    if has_bias == has_scores:
        raise InputError(f"{path}: expected either a column 'bias' ({', '.join(BIAS_TYPES)}) "
                         f"or the annotation scores {list(SCORE_COLUMNS)} with 'annotator'; "
                         f"the header has {fields}")
    _need(path, fields, ("id",), "a labels file")
    if not rows:
        raise InputError(f"{path}: no label rows")
    for line, row in rows:
        if not row["id"]:
            raise InputError(f"{path}: line {line}, column 'id': empty id")
    if has_bias:
        return _read_types(path, rows)
    _need(path, fields, ("annotator",) + SCORE_COLUMNS, "the annotation-score form")
    return _read_scores(path, rows)


def _read_types(path, rows) -> HumanLabels:
    code = {t: i for i, t in enumerate(BIAS_TYPES)}
    seen: dict[str, int] = {}
    bias = []
    for line, row in rows:
        b = row["bias"]
        if b not in code:
            raise InputError(f"{path}: line {line}, column 'bias': {b!r} is not one of "
                             f"{', '.join(BIAS_TYPES)}")
        if row["id"] in seen:
            raise InputError(f"{path}: line {line}, column 'id': id {row['id']!r} is labelled "
                             f"twice (first on line {seen[row['id']]})")
        seen[row["id"]] = line
        bias.append(code[b])
    return HumanLabels(path, tuple(seen), np.asarray(bias, np.int32), "bias", 1, None)


def _rating(path, line, col, text) -> float:
    try:
        x = float(text)
    except ValueError:
        x = math.nan
    if not (SCORE_RANGE[0] <= x <= SCORE_RANGE[1]):  # NaN fails too
        raise InputError(f"{path}: line {line}, column {col!r}: {text!r} is not a rating in "
                         f"[{SCORE_RANGE[0]:g}, {SCORE_RANGE[1]:g}]")
    return x


def _read_scores(path, rows) -> HumanLabels:
    ids: dict[str, int] = {}
    annotators: dict[str, int] = {}
    seen: dict[tuple, int] = {}
    cells = []  # (annotator index, id index, [3] ratings)
    for line, row in rows:
        a = row["annotator"]
        if not a:
            raise InputError(f"{path}: line {line}, column 'annotator': empty annotator")
        pair = (a, row["id"])
        if pair in seen:
            raise InputError(f"{path}: line {line}: annotator {a!r} rated id {row['id']!r} "
                             f"twice (first on line {seen[pair]})")
        seen[pair] = line
        r = [_rating(path, line, c, row[c]) for c in SCORE_COLUMNS]
        cells.append((annotators.setdefault(a, len(annotators)),
                      ids.setdefault(row["id"], len(ids)), r))
    table = np.full((len(annotators), len(ids), 3), np.nan)
    for ai, ii, r in cells:
        table[ai, ii] = r
    mean = np.nanmean(table, axis=0)  # every id has at least one rating
    alpha = None
    if len(annotators) > 1:
        alpha = {t: annotator_alpha(table[:, :, k]) for k, t in enumerate(BIAS_TYPES)}
    return HumanLabels(path, tuple(ids), argmax_type(mean), "scores", len(annotators), alpha,
                       mean)


def align(labels: HumanLabels, sample_ids) -> tuple[np.ndarray, dict]:
    """The labels of the analysed samples ``sample_ids`` [N] (ids in batch order; compared as
    strings, so the closed world's int indices match ``"17"``).

    Returns ``(bias, report)``: ``bias`` int32 [N], the label's type code or -1
    (``UNKNOWN_BIAS``) where the file does not label the sample; ``report = {"n_labels",
    "n_labelled", "n_unmatched", "unmatched_examples"}``: ids in the file, analysed samples
    labelled, file ids not among the analysed samples (skipped) and the first
    ``MAX_EXAMPLES`` of those. ``InputError`` when no analysed sample is labelled."""
    ids = [str(i) for i in sample_ids]
    code = dict(zip(labels.ids, labels.bias.tolist()))
    bias = np.asarray([code.get(i, UNKNOWN_BIAS) for i in ids], np.int32)
    present = set(ids)
    unmatched = [i for i in labels.ids if i not in present]
    n_labelled = int((bias != UNKNOWN_BIAS).sum())
    if not n_labelled:
        raise InputError(
            f"{labels.path}: none of its {len(labels.ids)} ids is among the {len(ids)} "
            f"analysed samples (its first ids: {list(labels.ids[:3])}; analysed ids look like "
            f"{ids[:3]}); a sample's id is Fakeddit's 'id' column, MMFakeBench's 'image_path' "
            "as written in its JSON, the closed world's sample index")
    return bias, {"n_labels": len(labels.ids), "n_labelled": n_labelled,
                  "n_unmatched": len(unmatched), "unmatched_examples": unmatched[:MAX_EXAMPLES]}


def summary(labels: HumanLabels, report: dict) -> dict:
    """The results JSON's ``"human_labels"`` entry: ``{"file", "form", "n_annotators",
    "annotator_alpha" ({type: alpha, None where undefined} or None), "annotator_alpha_level",
    **report}`` (``report``: :func:`align`'s)."""
    alpha = None if labels.annotator_alpha is None else {
        t: (None if math.isnan(a) else a) for t, a in labels.annotator_alpha.items()}
    return {"file": labels.path, "form": labels.form, "n_annotators": labels.n_annotators,
            "annotator_alpha": alpha,
            "annotator_alpha_level": ALPHA_LEVEL if alpha is not None else None, **report}


__all__ = ["SCORE_COLUMNS", "SCORE_RANGE", "ALPHA_LEVEL", "TIE_TOL", "HumanLabels",
           "argmax_type", "annotator_alpha", "read_labels", "align", "summary"]
