"""A benchmark cleaned by its per-sample bias labels (``modality-bias clean``): the paper's
application, "cleaning a biased MMB by retaining modality-balanced samples".

Input: a real benchmark in its released format (``fakeddit``: the TSV; ``mmfakebench``: the
dataset folder or its JSON, ``mmfakebench.locate``) and a labels CSV as ``modality-bias analyze
--out DIR`` writes it (``DIR/labels.csv``, ``bias_jax.labels_table``): a header row with the
columns ``id`` and the label column ``by`` (default ``ensemble``; any of ``BY_COLUMNS``) holding
``uni_image`` / ``balance`` / ``uni_text``; other columns are ignored.

Output: the benchmark in its own format with only the samples whose label is one of ``keep``,
in their original order:

- Fakeddit: the TSV's header line and each kept row's line(s) unchanged, byte for byte
  (line terminators included; a quoted field holding a tab or a newline stays as written);
  blank lines are dropped.
- MMFakeBench: a JSON list of the kept records, each unchanged as a JSON value (same keys in
  the same order, same values). JSON has several spellings of one value, so "byte for byte
  where the format allows" means: the file is re-serialised with ``json.dumps``, and when the
  whole input is exactly what ``json.dumps`` writes with some ``indent`` / ``ensure_ascii`` /
  ``separators`` (``JSON_STYLES``; the released files and anything written by Python's
  ``json``), those settings are used, so every kept record's bytes are those of the input;
  otherwise the indent of the input's first record is used if it can be read off the text,
  else none, with ``ensure_ascii=False``, and the records are equal as values, not as bytes.
  A final newline is kept if the input had one.

Which row is which sample: the readers' own logic (``fakeddit.read_fakeddit`` /
``mmfakebench.read_mmfakebench`` with ``images=False``), so an id names the row the analysis
read: Fakeddit's ``id`` column, MMFakeBench's ``image_path`` as written; a row the reader would
skip (malformed, a bad label, empty text, a repeated id) is no sample and never kept. The image
files are not looked at: in the rare case where an id repeats and its first row's image was
missing at analysis time, clean takes that first row, while the analysis read the later one.

Samples the labels do not name (e.g. the detectors' fine-tuning split, or samples beyond
``analyze --n``) are left out and counted; label ids that name no sample are reported (count and
first few) and are an error only when none matches. A malformed labels file raises
``InputError`` naming the file, the line and the column.
"""

from __future__ import annotations

import json
import os
from typing import Sequence

from mmx_base.errors import InputError

from bias_jax.data import fakeddit, human_labels, mmfakebench
from bias_jax.data.batch import BIAS_TYPES

SOURCES = ("fakeddit", "mmfakebench")
BY_COLUMNS = ("ensemble", "benefit", "flow", "causal")  # label columns of labels.csv
MAX_EXAMPLES = 5  # unknown ids listed in the summary
# Spellings json.dumps can give the released files (tried in order, the first that reproduces
# the whole input wins).
JSON_STYLES = tuple({"indent": indent, "ensure_ascii": ascii_, "separators": seps}
                    for indent in (None, 4, 2, 1, 3, "\t", 8)
                    for ascii_ in (False, True)
                    for seps in ((None, (",", ":")) if indent is None else (None,)))


def read_labels(path, by: str = "ensemble") -> dict[str, str]:
    """``{id: type}`` of a labels CSV (module docstring), in the file's order.

    ``by``: the label column (``BY_COLUMNS``). ``InputError`` naming the file (and the line and
    column) when it is missing, has no header, lacks ``id`` or ``by``, or a row has an empty
    id, an id given twice, or a type outside ``uni_image`` / ``balance`` / ``uni_text``. The
    rows are read by ``human_labels.read_csv_rows`` (blank lines left out; a row with more
    values than the header, a file that is not UTF-8 or not CSV is an error)."""
    if by not in BY_COLUMNS:
        raise InputError(f"label column {by!r} is not one of {', '.join(BY_COLUMNS)}")
    path = os.fspath(path)
    names, rows = human_labels.read_csv_rows(path)
    missing = [c for c in ("id", by) if c not in names]
    if missing:
        raise InputError(f"{path}: header lacks column(s) {', '.join(missing)} (found: "
                         f"{', '.join(names) or 'no header'}); expected labels.csv as "
                         f"'modality-bias analyze --out DIR' writes it")
    labels: dict[str, str] = {}
    first_line: dict[str, int] = {}
    for line, row in rows:
        uid, value = row["id"], row[by]
        if not uid:
            raise InputError(f"{path}:{line}: empty id")
        if value not in BIAS_TYPES:
            raise InputError(f"{path}:{line}: column {by!r} holds {value!r}, expected one "
                             f"of {', '.join(BIAS_TYPES)}")
        if uid in labels:
            raise InputError(f"{path}:{line}: id {uid!r} is labelled twice (first on line "
                             f"{first_line[uid]})")
        labels[uid], first_line[uid] = value, line
    if not labels:
        raise InputError(f"{path}: no labelled sample (a header and no rows)")
    return labels


def json_style(text: str, data) -> dict:
    """The ``json.dumps`` keyword arguments that write ``data`` as ``text`` (module docstring),
    plus ``"newline"``: whether ``text`` ends with a newline."""
    body = text.rstrip()
    newline = text.endswith("\n")
    for style in JSON_STYLES:
        if json.dumps(data, **style) == body:
            return {**style, "newline": newline}
    indent = None
    head = body.lstrip("\ufeff").lstrip()[1:]  # after the list's "["
    if head.startswith(("\n", "\r")):
        first = head.lstrip("\r\n")
        pad = first[: len(first) - len(first.lstrip(" \t"))]
        if pad and first.lstrip(" \t")[:1] in "{[\"-0123456789tfn" and len(set(pad)) == 1:
            indent = "\t" if pad[0] == "\t" else len(pad)
    return {"indent": indent, "ensure_ascii": False, "separators": None, "newline": newline}


def _samples(source: str, root):
    """``(path, report, positions, rows, head)`` of a dataset: the data file, the reader's
    ``LoadReport``, ``{id: position}`` of its samples (Fakeddit: the row's last line number;
    MMFakeBench: the list index), the raw rows as ``(position, raw)`` in file order (Fakeddit:
    the row's text; MMFakeBench: the record as loaded), and the part before them (Fakeddit:
    the header's text; MMFakeBench: the JSON's text, for ``json_style``)."""
    if source == "fakeddit":
        records, report = fakeddit.read_fakeddit(root, images=False, check_images=False)
        path = report.path
        with open(path, newline="", encoding="utf-8") as f:
            raw = fakeddit.iter_rows(f)
            head = next(raw)[2]
            rows = [(line, text) for line, fields, text in raw if not fakeddit.is_blank(fields)]
    elif source == "mmfakebench":
        records, report = mmfakebench.read_mmfakebench(root, images=False, check_images=False)
        path = report.path
        with open(path, encoding="utf-8") as f:
            head = f.read()
        rows = list(enumerate(json.loads(head)))
    else:
        raise InputError(f"unknown data source {source!r}; available: {', '.join(SOURCES)}")
    return path, report, {r.uid: r.row for r in records}, rows, head


def clean(source: str, root, labels: dict[str, str], keep: Sequence[str]) -> tuple[str, dict]:
    """The cleaned benchmark's text and a summary.

    Args:
      source: ``"fakeddit"`` or ``"mmfakebench"``.
      root: the dataset (Fakeddit TSV; MMFakeBench folder or JSON).
      labels: ``{id: type}`` (``read_labels``).
      keep: the types to keep (a subset of ``BIAS_TYPES``, e.g. ``["balance"]``).
    Returns:
      ``(text, summary)``: ``text`` the output file's content (module docstring; write it as
      UTF-8), ``summary`` a JSON-ready dict: ``data`` (the data file), ``rows_in`` (data rows
      / entries), ``samples`` (rows the reader reads as samples), ``labelled`` (samples the
      labels name), ``kept`` (``{type: n}`` per kept type), ``n_kept``, ``dropped`` (labelled
      samples of the other types, per type), ``left_out_unlabelled`` (rows without a label:
      ``rows_in - labelled``, the reader's skipped rows included), ``not_samples`` (the
      reader's skip reason -> count), ``unknown_ids`` and ``unknown_examples`` (label ids
      that name no sample, the first ``MAX_EXAMPLES``), ``keep``.
    Raises:
      InputError: an unknown type in ``keep``, or no label id names a sample of the dataset
      (the message shows ids from both sides).
    """
    keep = list(dict.fromkeys(keep))
    bad = [t for t in keep if t not in BIAS_TYPES]
    if bad or not keep:
        raise InputError(f"--keep {', '.join(bad) or '(none)'}: expected one or more of "
                         f"{', '.join(BIAS_TYPES)}")
    path, report, positions, rows, head = _samples(source, root)
    label_at = {positions[uid]: t for uid, t in labels.items() if uid in positions}
    unknown = [uid for uid in labels if uid not in positions]
    if not label_at:
        raise InputError(f"none of the {len(labels)} labelled ids names a sample of {path} "
                         f"(labels: {', '.join(map(repr, list(labels)[:3]))}; the dataset's: "
                         f"{', '.join(map(repr, list(positions)[:3])) or 'no usable sample'}); "
                         "a sample's id is Fakeddit's 'id' column, MMFakeBench's 'image_path'")
    kept = [raw for pos, raw in rows if label_at.get(pos) in keep]
    if source == "fakeddit":
        text = head + "".join(kept)
    else:
        style = json_style(head, [raw for _, raw in rows])
        newline = style.pop("newline")
        text = json.dumps(kept, **style) + ("\n" if newline else "")
    counts = {t: sum(1 for v in label_at.values() if v == t) for t in BIAS_TYPES}
    summary = {
        "data": path, "rows_in": report.n_rows, "samples": report.n_kept,
        "labelled": len(label_at), "kept": {t: counts[t] for t in BIAS_TYPES if t in keep},
        "n_kept": len(kept), "dropped": {t: counts[t] for t in BIAS_TYPES if t not in keep},
        "left_out_unlabelled": report.n_rows - len(label_at),
        "not_samples": dict(report.skipped), "unknown_ids": len(unknown),
        "unknown_examples": unknown[:MAX_EXAMPLES], "keep": keep}
    return text, summary


__all__ = ["SOURCES", "BY_COLUMNS", "JSON_STYLES", "read_labels", "json_style", "clean"]
