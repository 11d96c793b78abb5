"""Fakeddit (Nakamura et al., 2020) multimodal TSV reader.

Format: tab-separated, a header row naming (at least) the columns ``COLUMNS``; pandas-written
files may start with an unnamed index column, and extra columns are ignored. Text is
``clean_title``; the image of row ``id`` is ``<image_dir>/<id>.jpg`` (default image_dir:
``images/`` next to the TSV, as the release's ``image_downloader.py`` writes them). A sample's
id (``Record.uid``) is its ``id`` field (``ID_COLUMN``, stripped), the id human labels and
``labels.csv`` use; ``Record.row`` the TSV line number. The released files are written by
pandas: a first column with an empty name (the index) and a header line starting with a tab.
Labels: ``2_way_label`` 1 = true, 0 = fake (our ``label``);
``3_way_label`` 0 true, 1 fake with true text, 2 fake with false text; ``6_way_label`` 0 true,
1 satire, 2 false connection, 3 imposter, 4 manipulated, 5 misleading.

Error policy (tests check each case):

- raised: the TSV or the image directory does not exist (FileNotFoundError naming it); the file
  is empty or its header lacks a required column (ValueError naming the file and columns);
- skipped and counted in the ``LoadReport`` (reason -> count, first examples with the line
  number): a row with the wrong number of fields (``malformed row``), a label that is not an
  integer in range or labels that disagree across the 2/3/6-way columns (``bad label``),
  ``hasImage`` false (``no image``), an empty ``clean_title`` (``empty text``), a repeated
  ``id`` (``duplicate id``), a missing image file (``missing image``), a file Pillow cannot
  identify (``unreadable image``, only with ``check_images``).
"""

from __future__ import annotations

import csv
import os
import sys
from typing import Iterator

from bias_jax.data import real
from bias_jax.data.batch import Batch, LoadReport, Record, image_skip_reason, resolve_dir
from bias_jax.data.text import Vocab

COLUMNS = ("author", "clean_title", "created_utc", "domain", "hasImage", "id", "image_url",
           "linked_submission_id", "num_comments", "score", "subreddit", "title",
           "upvote_ratio", "2_way_label", "3_way_label", "6_way_label")
LABELS_2 = ("fake", "true")  # index = 2_way_label
LABELS_3 = ("true", "fake_with_true_text", "fake_with_false_text")
LABELS_6 = ("true", "satire", "false_connection", "imposter", "manipulated", "misleading")
FINE = {"6_way": LABELS_6, "3_way": LABELS_3}
ID_COLUMN = "id"  # a sample's id


def _int_label(s: str, n: int) -> int | None:
    """The integer in ``s`` ("3" or "3.0") if it lies in [0, n), else None."""
    try:
        v = float(s)
    except ValueError:
        return None
    if not v.is_integer() or not 0 <= v < n:
        return None
    return int(v)


def _truthy(s: str) -> bool | None:
    v = s.strip().lower()
    if v in ("true", "1", "1.0", "yes"):
        return True
    if v in ("false", "0", "0.0", "no", ""):
        return False
    return None


def read_fakeddit(tsv_path, image_dir=None, *, fine: str = "6_way", check_images: bool = True,
                  images: bool = True) -> tuple[list[Record], LoadReport]:
    """Records of a Fakeddit TSV and a report of the skipped rows (see the module docstring).

    ``fine`` picks the column stored as ``Record.fine_label`` ("6_way" or "3_way"; both are
    validated either way). ``check_images`` opens every image header with Pillow.
    ``images=False`` looks at no image (nor the image directory): a row is a record on its
    fields alone (``clean`` copies rows, not images).
    """
    if fine not in FINE:
        raise ValueError(f"fine must be one of {sorted(FINE)}, got {fine!r}")
    tsv_path = real.require_file(tsv_path, "Fakeddit TSV")
    image_dir = os.path.join(os.path.dirname(tsv_path), "images") if image_dir is None \
        else os.fspath(image_dir)
    if images:
        resolve_dir(image_dir, "Fakeddit image")
    seen: set[str] = set()

    def parse(where, row):
        line, row = row
        if len(row) != len(header):
            return real.Skip("malformed row", f"{len(row)} fields, header has {len(header)}")
        get = {c: row[col[c]].strip() for c in COLUMNS}.__getitem__
        l2, l3, l6 = (_int_label(get(f"{k}_label"), n)
                      for k, n in (("2_way", 2), ("3_way", 3), ("6_way", 6)))
        if l2 is None or l3 is None or l6 is None:
            return real.Skip("bad label", f"2/3/6-way = {get('2_way_label')!r}, "
                             f"{get('3_way_label')!r}, {get('6_way_label')!r}")
        if not (l2 == 1) == (l3 == 0) == (l6 == 0):
            return real.Skip("bad label", f"inconsistent 2/3/6-way = {l2}, {l3}, {l6}")
        has_image = _truthy(get("hasImage"))
        if not has_image:
            return real.Skip("no image", f"hasImage = {get('hasImage')!r}")
        text, uid = get("clean_title"), sample_id(row, col)
        if not uid:
            return real.Skip("malformed row", "empty id")
        if not text:
            return real.Skip("empty text", f"id {uid}")
        if uid in seen:
            return real.Skip("duplicate id", f"id {uid}")
        path = os.path.join(image_dir, f"{uid}.jpg")
        skip = image_skip_reason(path, check_images) if images else None
        if skip:
            return real.Skip(*skip)
        seen.add(uid)  # only a kept row claims its id
        return Record(uid=uid, text=text, image_path=path, label=l2,
                      fine_label=l6 if fine == "6_way" else l3, row=line)

    with open(tsv_path, newline="", encoding="utf-8") as f:
        rows = iter_rows(f)
        header = next(rows, None)
        col = header_columns(tsv_path, None if header is None else header[1])
        header = header[1]
        data = ((f"{tsv_path}:{line}", (line, row)) for line, row, _ in rows
                if not is_blank(row))
        return real.collect(tsv_path, data, parse)


def iter_rows(f) -> Iterator[tuple[int, list[str], str]]:
    """``(line, fields, raw)`` per row of the TSV open as text ``f`` (opened with
    ``newline=""``): ``line`` the number of its last physical line (header = 1), ``fields`` as
    ``csv.reader`` splits them (a quoted field may hold tabs, quotes and newlines), ``raw`` the
    row's exact text, line terminator included (several physical lines for a quoted newline),
    so that the rows' ``raw`` concatenate to the file. Blank lines come as rows too
    (``is_blank``)."""
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
    taken: list[str] = []

    def lines():
        for physical in f:
            taken.append(physical)
            yield physical

    reader = csv.reader(lines(), delimiter="\t")  # reads no line ahead of the row it returns
    for fields in reader:
        raw = "".join(taken)
        taken.clear()
        yield reader.line_num, fields, raw


def is_blank(fields: list[str]) -> bool:
    """A row with no field or one empty one: a blank line, not a sample."""
    return not fields or (len(fields) == 1 and not fields[0].strip())


def header_columns(tsv_path, header: list[str] | None) -> dict[str, int]:
    """Column name -> position for ``COLUMNS`` in the header row (names stripped; pandas'
    unnamed index column, an empty first name, and extra columns are fine). ``ValueError``
    naming the file for a missing header or column."""
    if not header:
        raise ValueError(f"{tsv_path}: empty file, expected a header with columns "
                         f"{', '.join(COLUMNS)}")
    header = [h.strip() for h in header]
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise ValueError(f"{tsv_path}: header lacks column(s) {', '.join(missing)} "
                         f"(found: {', '.join(h or '<unnamed>' for h in header)})")
    return {c: header.index(c) for c in COLUMNS}


def sample_id(fields: list[str], col: dict[str, int]) -> str | None:
    """The id of a data row (its ``id`` field, stripped), or None when the row is too short or
    the id is empty."""
    i = col[ID_COLUMN]
    uid = fields[i].strip() if i < len(fields) else ""
    return uid or None


def load_fakeddit(tsv_path, image_dir=None, *, vocab: Vocab | None = None, image_size=64,
                  max_len: int = 32, fine: str = "6_way",
                  check_images: bool = True) -> tuple[Batch, Vocab, LoadReport]:
    """``read_fakeddit`` then ``records_to_batch`` (vocabulary built from these texts if None).

    For the paper's protocol build the vocabulary from the Finetune texts only:
    ``read_fakeddit`` -> ``split.paper_splits`` -> ``Vocab.build`` -> ``records_to_batch``.
    """
    records, report = read_fakeddit(tsv_path, image_dir, fine=fine, check_images=check_images)
    return real.to_batch(records, report, vocab=vocab, image_size=image_size, max_len=max_len,
                         what="rows")
