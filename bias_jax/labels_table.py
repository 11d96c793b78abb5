"""The per-sample table ``modality-bias analyze --out DIR`` writes as ``DIR/labels.csv``.

One row per analysed sample, in analysis order, columns ``COLUMNS``:

- ``id``: the sample's id (Fakeddit's ``id``, MMFakeBench's ``image_path`` as written in its
  JSON, the closed world's sample index), the id a ``--labels`` file names;
- ``benefit``, ``flow``, ``causal``: each view's label, ``ensemble``: the reported ensemble
  rule's label, as ``uni_image`` / ``balance`` / ``uni_text`` (``batch.BIAS_TYPES``);
- ``benefit_score``, ``flow_score``, ``causal_score``: each view's signed score
  (``views.common.ViewResult.score``: > 0 towards the image, < 0 towards the text, on the scale
  the view thresholds), printed with 9 significant digits (exact for float32).

The views are those of the reported variant (``analyze --views``), the ensemble that of its
rule (``--ensemble``): :func:`bias_jax.analysis.variant_views` and
:func:`bias_jax.analysis.ensemble_labels`.
"""

from __future__ import annotations

import csv
import io

import numpy as np

from bias_jax.data.batch import BIAS_TYPES
from bias_jax.ensemble import VIEWS

COLUMNS = ("id", *VIEWS, "ensemble", *(f"{v}_score" for v in VIEWS))


def _type_name(code) -> str:
    c = int(code)
    if not 0 <= c < len(BIAS_TYPES):
        raise ValueError(f"bias label {c} is not a type code 0..{len(BIAS_TYPES) - 1}")
    return BIAS_TYPES[c]


def labels_rows(ids, views: dict, ensemble) -> list[dict]:
    """The rows of ``labels.csv``: one dict per sample with the keys ``COLUMNS`` (all str).

    ids: [N] sample ids (any type; written with ``str``); views: ``{"benefit", "flow",
    "causal"} -> ViewResult`` (label int [N], score float [N]); ensemble: int [N] labels.
    ``ValueError`` when the lengths disagree or a label is not a type code."""
    ids = list(ids)
    n = len(ids)
    labels = {v: np.asarray(views[v].label) for v in VIEWS}
    scores = {v: np.asarray(views[v].score, np.float64) for v in VIEWS}
    ens = np.asarray(ensemble)
    sizes = {"ids": n, "ensemble": ens.shape[0],
             **{v: labels[v].shape[0] for v in VIEWS}, **{f"{v}_score": scores[v].shape[0]
                                                           for v in VIEWS}}
    if len(set(sizes.values())) > 1:
        raise ValueError(f"labels table: lengths disagree {sizes}")
    return [{"id": str(ids[i]), **{v: _type_name(labels[v][i]) for v in VIEWS},
             "ensemble": _type_name(ens[i]),
             **{f"{v}_score": format(float(scores[v][i]), ".9g") for v in VIEWS}}
            for i in range(n)]


def to_csv(rows: list[dict]) -> str:
    """CSV text (header ``COLUMNS``, ``\\n`` line ends, quoted where a value needs it) of
    :func:`labels_rows`' rows."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


__all__ = ["COLUMNS", "labels_rows", "to_csv"]
