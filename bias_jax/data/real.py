"""What the readers of real benchmarks (``fakeddit``, ``mmfakebench``) share: the checks of the
input paths, the row loop that keeps records and counts the skipped rows in a ``LoadReport``,
and records -> ``Batch`` with a vocabulary.

A reader turns its file into ``(where, row)`` pairs (``where``: ``"<file>:<line>"`` or
``"<file>[<index>]"``, the location its report names) and a function ``parse(where, row)`` that
returns a ``Record`` or a :class:`Skip` naming the reason (one of the readers' documented
reasons, e.g. ``"bad label"``).
"""

from __future__ import annotations

import os
from typing import Callable, Iterable, NamedTuple

from bias_jax.data.batch import Batch, LoadReport, Record, records_to_batch
from bias_jax.data.text import Vocab


class Skip(NamedTuple):
    """A row left out: ``reason`` (the report's key) and a human ``detail``."""

    reason: str
    detail: str = ""


def require_file(path, what: str) -> str:
    """``path`` as a string; ``FileNotFoundError("<what> not found: <path>")`` when it is not a
    file."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{what} not found: {path}")
    return path


def collect(path: str, rows: Iterable, parse: Callable) -> tuple[list[Record], LoadReport]:
    """Records of ``rows`` and the report of those skipped.

    Args:
      path: the file the rows come from (``LoadReport.path``).
      rows: ``(where, row)`` pairs, one per data row (blank lines left out).
      parse: ``(where, row) -> Record | Skip``.
    Returns:
      ``(records, report)`` with ``report.n_rows`` = rows seen, ``report.n_kept`` = records.
    """
    report = LoadReport(path=path)
    records: list[Record] = []
    for where, row in rows:
        report.n_rows += 1
        out = parse(where, row)
        if isinstance(out, Skip):
            report.skip(out.reason, where, out.detail)
        else:
            records.append(out)
    report.n_kept = len(records)
    return records, report


def to_batch(records: list[Record], report: LoadReport, *, vocab: Vocab | None, image_size,
             max_len: int, what: str = "rows") -> tuple[Batch, Vocab, LoadReport]:
    """``records_to_batch`` of ``records`` with ``vocab`` (built from their texts if None).

    ``ValueError("<report.path>: no usable <what> (<skipped counts>)")`` when none is left."""
    if not records:
        raise ValueError(f"{report.path}: no usable {what} ({report.skipped})")
    vocab = Vocab.build(r.text for r in records) if vocab is None else vocab
    return records_to_batch(records, vocab, image_size=image_size, max_len=max_len), vocab, report


__all__ = ["Skip", "require_file", "collect", "to_batch"]
