"""Names, paths and field encodings of the official GridVQA-X release layout.

Per split, the official generators (``dataset_generation/pure`` and ``/spurious`` of the public
release) write under one output root (``tests/fixtures/official_gridvqa/FORMAT.md`` documents
every field)::

    qa_{split}.jsonl                                          {"image_id", "question", "answer"}
    grounding_{split}.jsonl                                   MDETR-style boxes and phrase spans
    images/{split}/depth{D}/{QT}/form{F}/g{S}_d{XX}/{i:06d}.png
    {split}/depth{D}/{QT}/form{F}/g{S}_d{XX}/{i:06d}.npz       per-sample arrays (NPZ_KEYS)

Object lists (npz ``objects``/``anchor_objects``/``target_objects``, sidecar
``all_scene_objects``) are ``np.array`` of ``{"x", "y", "color", "shape"}`` dicts: an object
array, or float64 of shape (0,) when empty. ``x`` is the column, ``y`` the row (0 = top).
"""

from __future__ import annotations

import re

import numpy as np

from mmx_base.errors import DatasetError
from gridvqa_jax.world import universe as U

NPZ_KEYS = ("image", "question", "answer", "objects", "anchor_objects", "target_objects",
            "cell_mask", "pixel_mask", "text_mask", "pos_mask")
MANIFEST = "spec.json"  # our manifest in the output root; official readers ignore it
GENERATOR = "gridvqa_jax"  # the manifest's "generator" value
SIDECAR = "sidecar_scene.jsonl"  # full scenes per image (not official: the fixtures add it)
# Files only the official generators write: the direction-shortcut reports exist for D_pure
# only, the spurious-correlation report for both.
PURE_REPORT = "direction_shortcut_report_ignore_dir.csv"
ANY_REPORT = "spurious_correlation_report.csv"
FIXES = (
    "pixel_mask is cell_mask upsampled to the full image (official: 25x25 for S=5)",
    "text_mask marks target/anchor attribute and relation words (incl. both words of "
    "'left of'/'right of'), word 0 is not forced",
    "anchor phrase spans link their own anchor (official: k-th anchor in scene order)",
    "D_pure: every confuser region C_k holds a target look-alike (depth 1 and CMP included)",
)

FILE_RE = re.compile(
    r"^images/(?P<split>[^/]+)/depth(?P<depth>\d+)/(?P<qtype>[A-Za-z]+)/form(?P<form>\d+)/"
    r"g(?P<grid>\d+)_(?P<density>d\d+)/(?P<index>\d+)\.png$")
FILE_PATTERN = "images/{split}/depth{D}/{QT}/form{F}/g{S}_dXX/{i:06d}.png"
_WORD_TOKENS_RE = re.compile(r"\w+|[^\w\s]")  # the stub tokenizer: words and punctuation marks


def bucket_folder(bucket: U.Bucket, grid_size: int, density_key: str) -> str:
    """Official bucket folder ``depth{D}/{QT}/form{F}/g{S}_d{XX}`` (relative)."""
    return f"depth{bucket.depth}/{bucket.qtype}/form{bucket.form}/g{grid_size}_{density_key}"


def npz_of_png(file_name: str) -> str:
    """The npz path of an image path: ``images/{split}/.../{i}.png`` -> ``{split}/.../{i}.npz``."""
    return file_name[len("images/"):-len(".png")] + ".npz"


def density_of(key: str) -> float:
    """Density rho of a density key: "d07" -> 0.7 (``universe.DENSITIES``, else digits / 10)."""
    if key in U.DENSITIES:
        return U.DENSITIES[key]
    return int(key[1:]) / 10.0


def obj_dict(x, y, c, s) -> dict:
    """One official object record ``{"x", "y", "color", "shape"}`` from ids."""
    return {"x": int(x), "y": int(y), "color": U.COLORS[int(c)], "shape": U.SHAPES[int(s)]}


def obj_array(dicts: list) -> np.ndarray:
    """What the official ``np.array(list_of_dicts)`` gives: object array, or float64 (0,)."""
    if not dicts:
        return np.zeros((0,), np.float64)
    arr = np.empty(len(dicts), object)
    arr[:] = dicts
    return arr


def objects_of(arr, where: str, grid_size: int) -> list[tuple[int, int, int, int]]:
    """Decode an official object list into (x, y, color id, shape id) tuples.

    arr: object array of dicts or an empty array; where: file (and field) named in errors.
    Raises DatasetError for a non-dict entry, an unknown colour/shape or a cell outside the
    ``grid_size`` x ``grid_size`` grid.
    """
    if arr.dtype != object:
        if arr.size:
            raise DatasetError(f"{where}: expected an object array of dicts, got {arr.dtype}")
        return []
    out = []
    for o in arr:
        try:
            t = (int(o["x"]), int(o["y"]), U.color_id(o["color"]), U.shape_id(o["shape"]))
        except (KeyError, TypeError, ValueError) as e:
            raise DatasetError(f"{where}: bad object {o!r} ({e})") from None
        if not (0 <= t[0] < grid_size and 0 <= t[1] < grid_size):
            raise DatasetError(f"{where}: object {o!r} lies outside the {grid_size}x{grid_size} "
                               "grid named by the folder (grid size does not match)")
        out.append(t)
    return out


def token_spans(words: list[str]) -> list[tuple[int, int]]:
    """(first, last) stub-tokenizer index of each word of ``' '.join(words)``, ``<s>`` = 0.

    The stub tokenizer of the fixtures gives one token per run of word characters and one per
    punctuation mark (FORMAT.md, ``token_span``).
    """
    out, pos = [], 1
    for w in words:
        n = max(1, len(_WORD_TOKENS_RE.findall(w)))
        out.append((pos, pos + n - 1))
        pos += n
    return out


__all__ = ["NPZ_KEYS", "MANIFEST", "GENERATOR", "SIDECAR", "PURE_REPORT", "ANY_REPORT", "FIXES",
           "FILE_RE", "FILE_PATTERN", "bucket_folder",
           "npz_of_png", "density_of", "obj_dict", "obj_array", "objects_of", "token_spans"]
