"""MMFakeBench (Liu et al., 2024) JSON reader.

Format: a JSON list of objects ``{"image_path", "text", "fake_cls", "gt_answers"}`` (extra keys
ignored). ``fake_cls`` is one of ``FAKE_CLASSES`` (our ``fine_label`` is its index, the coding
of ``batch.FINE_MMFAKEBENCH``); ``gt_answers`` is "True" (real, label 1) or "Fake" (label 0),
case-insensitive, "Real"/"False" accepted too, and must agree with ``fake_cls`` (only
"original" is real). ``image_path`` is relative to ``image_root`` (default: the JSON's
directory); a leading "/" (as in the released files, "/real/...", "/fake/...") is read as
relative to the root as well.

Error policy (tests check each case):

- raised: the JSON file or image root does not exist (FileNotFoundError naming it); the file is
  not JSON or its top level is not a list (ValueError naming the file);
- skipped and counted in the ``LoadReport`` (reason -> count, first examples with the list
  index): an entry that is not an object or lacks a key / has a non-string value
  (``malformed row``), an unknown ``fake_cls`` or ``gt_answers`` or the two disagreeing
  (``bad label``), empty text (``empty text``), a missing image file (``missing image``), a file
  Pillow cannot identify (``unreadable image``, only with ``check_images``).
"""

from __future__ import annotations

import json
import os

from bias_jax.data import real
from bias_jax.data.batch import (FINE_MMFAKEBENCH, Batch, LoadReport, Record, image_skip_reason,
                                 resolve_dir)
from bias_jax.data.text import Vocab

FAKE_CLASSES = FINE_MMFAKEBENCH
KEYS = ("image_path", "text", "fake_cls", "gt_answers")
_ANSWERS = {"true": 1, "real": 1, "fake": 0, "false": 0}


def read_mmfakebench(json_path, image_root=None, *,
                     check_images: bool = True) -> tuple[list[Record], LoadReport]:
    """Records of an MMFakeBench JSON file and a report of the skipped entries."""
    json_path = real.require_file(json_path, "MMFakeBench JSON")
    root = resolve_dir(os.path.dirname(os.path.abspath(json_path)) if image_root is None
                       else image_root, "MMFakeBench image root")
    try:
        with open(json_path, encoding="utf-8") as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{json_path}: not valid JSON ({e})") from None
    if not isinstance(data, list):
        raise ValueError(f"{json_path}: expected a JSON list of samples, got "
                         f"{type(data).__name__}")

    def parse(where, item):
        i, entry = item
        if not isinstance(entry, dict):
            return real.Skip("malformed row", f"entry is a {type(entry).__name__}")
        bad = [k for k in KEYS if not isinstance(entry.get(k), str)]
        if bad:
            return real.Skip("malformed row", f"missing or non-string {', '.join(bad)}")
        cls, answer = entry["fake_cls"].strip(), entry["gt_answers"].strip().lower()
        if cls not in FAKE_CLASSES or answer not in _ANSWERS:
            return real.Skip("bad label", f"fake_cls={cls!r}, gt_answers={answer!r}")
        label = _ANSWERS[answer]
        if (label == 1) != (cls == "original"):
            return real.Skip("bad label", f"fake_cls={cls!r} disagrees with "
                             f"gt_answers={entry['gt_answers']!r}")
        text = entry["text"].strip()
        if not text:
            return real.Skip("empty text")
        path = os.path.join(root, entry["image_path"].strip().lstrip("/\\"))
        skip = image_skip_reason(path, check_images)
        if skip:
            return real.Skip(*skip)
        return Record(uid=str(i), text=text, image_path=path, label=label,
                      fine_label=FAKE_CLASSES.index(cls), row=i)

    return real.collect(json_path, ((f"{json_path}[{i}]", (i, e)) for i, e in enumerate(data)),
                        parse)


def load_mmfakebench(json_path, image_root=None, *, vocab: Vocab | None = None, image_size=64,
                     max_len: int = 32,
                     check_images: bool = True) -> tuple[Batch, Vocab, LoadReport]:
    """``read_mmfakebench`` then ``records_to_batch`` (vocabulary built from these texts if
    None; for the paper's protocol build it from the Finetune texts, see ``split``)."""
    records, report = read_mmfakebench(json_path, image_root, check_images=check_images)
    return real.to_batch(records, report, vocab=vocab, image_size=image_size, max_len=max_len,
                         what="entries")
