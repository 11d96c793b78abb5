"""MMFakeBench (Liu et al., 2024) reader, in the released layout.

Layout: the dataset folder (``MMFakeBench_val/`` or ``MMFakeBench_test/``) holds
``source/MMFakeBench_val.json`` (or ``..._test.json``) and the images under ``real/`` and
``fake/``::

    MMFakeBench_val/
      source/MMFakeBench_val.json
      real/...jpg
      fake/fever_AI_val_100/fever_dalle_val_1.jpg

The JSON is a list of objects ``{"image_path", "text", "gt_answers", "fake_cls"}`` (extra
keys ignored). ``image_path`` (e.g. ``"/fake/fever_AI_val_100/fever_dalle_val_1.jpg"``) is
relative to the dataset folder, the folder above ``source/``, as the release's own loader reads
it (``f"{root}/{image_path}"``); the leading "/" is read as relative too. ``gt_answers`` is a
one-element list, ``["True"]`` (real, label 1) or ``["Fake"]`` (label 0), read as the release
does (``gt_answers[0]``); a plain string is accepted as well; case-insensitive, "Real" /
"False" too; it must agree with ``fake_cls`` (only "original" is real). ``fake_cls`` is one of
``FAKE_CLASSES`` (our ``fine_label`` is its index, the coding of ``batch.FINE_MMFAKEBENCH``).

A sample's id (``Record.uid``) is its ``image_path`` exactly as written in the JSON (no
stripping), the id human labels and ``labels.csv`` use; ``Record.row`` is its list index.

``locate(root)`` finds the files: ``root`` is the dataset folder (its ``source/*.json``, exactly
one) or the JSON file itself; images resolve against the folder above ``source/`` when the JSON
sits in a folder named ``source``, else against the JSON's own folder; an explicit
``image_root`` overrides both.

Error policy (tests check each case):

- raised: ``root`` does not exist (FileNotFoundError naming it); a dataset folder without
  exactly one ``source/*.json`` (``DatasetError`` naming the folder and the JSON files or the
  entries it found); the image root does not exist (FileNotFoundError naming it); the file is
  not JSON or its top level is not a list (ValueError naming the file);
- skipped and counted in the ``LoadReport`` (reason -> count, first examples with the list
  index): an entry that is not an object, lacks a key, has a non-string ``image_path`` /
  ``text`` / ``fake_cls`` or a ``gt_answers`` that is neither a string nor a one-element list
  of one (``malformed row``), an unknown ``fake_cls`` or ``gt_answers`` or the two
  disagreeing (``bad label``), empty text (``empty text``), an ``image_path`` already taken by
  an earlier kept entry (``duplicate id``), a missing image file (``missing image``), a file
  Pillow cannot identify (``unreadable image``, only with ``check_images``).
"""

from __future__ import annotations

import glob
import json
import os

from mmx_base.errors import DatasetError

from bias_jax.data import real
from bias_jax.data.batch import (FINE_MMFAKEBENCH, Batch, LoadReport, Record, image_skip_reason,
                                 resolve_dir)
from bias_jax.data.text import Vocab

FAKE_CLASSES = FINE_MMFAKEBENCH
KEYS = ("image_path", "text", "fake_cls", "gt_answers")
ID_KEY = "image_path"  # a sample's id, as written in the JSON
SOURCE_DIR = "source"  # the released folder holding the JSON, one level below the images' root
_ANSWERS = {"true": 1, "real": 1, "fake": 0, "false": 0}


def locate(root) -> tuple[str, str]:
    """``(json_path, image_root)`` of an MMFakeBench dataset.

    ``root``: the dataset folder (``MMFakeBench_val/``, holding exactly one ``source/*.json``)
    or the JSON file. ``image_root``: the folder above ``source/`` when the JSON's folder is
    named ``source``, else the JSON's folder (not checked here)."""
    root = os.fspath(root)
    if os.path.isdir(root):
        found = sorted(glob.glob(os.path.join(glob.escape(root), SOURCE_DIR, "*.json")))
        if len(found) != 1:
            if found:
                what = f"several: {', '.join(os.path.basename(f) for f in found)}"
            else:
                entries = sorted(os.listdir(root))
                what = ("it holds " + ", ".join(entries[:10]) + (", ..." if len(entries) > 10
                                                                 else "")) if entries else \
                    "it is empty"
            raise DatasetError(f"{root}: expected an MMFakeBench dataset folder with one "
                               f"{SOURCE_DIR}/*.json, found {len(found)} ({what}); pass the "
                               f"JSON file itself as the root to choose one")
        json_path = found[0]
    else:
        json_path = real.require_file(root, "MMFakeBench JSON")
    folder = os.path.dirname(os.path.abspath(json_path))
    if os.path.basename(folder) == SOURCE_DIR:
        folder = os.path.dirname(folder)
    return json_path, folder


def load_json(json_path) -> list:
    """The JSON list of ``json_path`` (ValueError naming the file when it is not JSON or not a
    list)."""
    try:
        with open(json_path, encoding="utf-8") as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{json_path}: not valid JSON ({e})") from None
    if not isinstance(data, list):
        raise ValueError(f"{json_path}: expected a JSON list of samples, got "
                         f"{type(data).__name__}")
    return data


def sample_id(entry) -> str | None:
    """The id of one JSON entry: its ``image_path`` as written, or None when it has none (not an
    object, or no string ``image_path``)."""
    if isinstance(entry, dict) and isinstance(entry.get(ID_KEY), str):
        return entry[ID_KEY]
    return None


def _answer(value) -> str | None:
    """``gt_answers`` as one string: the element of a one-element list (the released form) or
    the string itself; None for any other shape."""
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    return value if isinstance(value, str) else None


def read_mmfakebench(root, image_root=None, *, check_images: bool = True,
                     images: bool = True) -> tuple[list[Record], LoadReport]:
    """Records of an MMFakeBench dataset and a report of the skipped entries.

    ``root``: the dataset folder or its JSON (``locate``); ``image_root``: where ``image_path``
    points into (default: ``locate``'s). ``check_images`` opens every image header with
    Pillow. ``images=False`` looks at no image (nor the image root): an entry is a record on
    its fields alone (``clean`` copies records, not images)."""
    json_path, default_root = locate(root)
    image_root = default_root if image_root is None else os.fspath(image_root)
    if images:
        resolve_dir(image_root, "MMFakeBench image root")
    data = load_json(json_path)
    seen: set[str] = set()

    def parse(where, item):
        i, entry = item
        if not isinstance(entry, dict):
            return real.Skip("malformed row", f"entry is a {type(entry).__name__}")
        bad = [k for k in KEYS if k != "gt_answers" and not isinstance(entry.get(k), str)]
        answer = _answer(entry.get("gt_answers"))
        if answer is None:
            bad.append("gt_answers")
        if bad:
            return real.Skip("malformed row", f"missing or non-string {', '.join(bad)} "
                             "(gt_answers: a string or a one-element list of one)")
        cls, answer = entry["fake_cls"].strip(), answer.strip().lower()
        if cls not in FAKE_CLASSES or answer not in _ANSWERS:
            return real.Skip("bad label", f"fake_cls={cls!r}, gt_answers={answer!r}")
        label = _ANSWERS[answer]
        if (label == 1) != (cls == "original"):
            return real.Skip("bad label", f"fake_cls={cls!r} disagrees with "
                             f"gt_answers={entry['gt_answers']!r}")
        text = entry["text"].strip()
        if not text:
            return real.Skip("empty text")
        uid = entry[ID_KEY]
        if uid in seen:
            return real.Skip("duplicate id", f"image_path {uid!r}")
        path = os.path.join(image_root, uid.strip().lstrip("/\\"))
        skip = image_skip_reason(path, check_images) if images else None
        if skip:
            return real.Skip(*skip)
        seen.add(uid)  # only a kept entry claims its id
        return Record(uid=uid, text=text, image_path=path, label=label,
                      fine_label=FAKE_CLASSES.index(cls), row=i)

    return real.collect(json_path, ((f"{json_path}[{i}]", (i, e)) for i, e in enumerate(data)),
                        parse)


def load_mmfakebench(root, image_root=None, *, vocab: Vocab | None = None, image_size=64,
                     max_len: int = 32,
                     check_images: bool = True) -> tuple[Batch, Vocab, LoadReport]:
    """``read_mmfakebench`` then ``records_to_batch`` (vocabulary built from these texts if
    None; for the paper's protocol build it from the Finetune texts, see ``split``)."""
    records, report = read_mmfakebench(root, image_root, check_images=check_images)
    return real.to_batch(records, report, vocab=vocab, image_size=image_size, max_len=max_len,
                         what="entries")


__all__ = ["FAKE_CLASSES", "KEYS", "ID_KEY", "SOURCE_DIR", "locate", "load_json", "sample_id",
           "read_mmfakebench", "load_mmfakebench"]
