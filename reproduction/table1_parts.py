"""Table 1's per-sample scores on disk: one file per finished explainer x regime, so that a run
stopped midway resumes where it stopped, and a finished run's findings can be judged again.

A *part* is the per-sample scores (``gridvqa_jax.explain.scoring.per_sample_scores``, nested
dicts of numpy arrays) of one explainer on one regime, plus the attribution maps of its samples
(``figure``: every sample's since 2026-12-05, the first two before; the heatmap figures draw
the first ones, and the maps of independent runs of a Monte Carlo row pool into a larger
budget), saved as ``<explainer>__<regime>.npz`` in a parts
directory (``gridvqa explain --regimes --parts DIR``; ``table1(..., parts_dir=DIR)``). Each part
carries the *fingerprint* of everything its numbers depend on: the explainer (its name, its
function, its position in the run, which derives its key, and how its masks are drawn from
that key where its module says: ``MASK_DRAWS``), the run's PRNG key, its budget and model
access, the batch size, the rendering and token length, and content digests (SHA-256) of the
samples and of the model's parameters. A later run with the same parts directory reuses a
part only when its fingerprint is equal, and refuses a part whose fingerprint differs (naming
the fields), instead of mixing two protocols in one table. Parts are written atomically
(``mmx_base.staging.write_atomic``), so a run killed while writing leaves no part behind.

``save_per_sample`` / ``load_per_sample``: all per-sample scores of a run in one ``.npz``
(``per_sample.npz`` beside ``results.json``), keys ``explainer/regime/visual/pixel/rma`` etc.;
``reproduction.table1.cell_findings`` / ``reference_findings`` of ``load_per_sample(path)``
judge the findings again.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import zipfile
from pathlib import Path

import jax
import numpy as np

from mmx_base.errors import InputError
from mmx_base.staging import write_atomic
from mmx_base.trees import jsonable

FINGERPRINT_KEY = "__fingerprint__"
WALL_KEY = "__wall_s__"
SCORES = "scores"
FIGURE = "figure"
SEP = "/"


def digest(tree) -> str:
    """SHA-256 (hex) of a pytree of arrays: every leaf's dtype, shape and bytes, in tree order
    (typed PRNG keys by their key data)."""
    h = hashlib.sha256()
    for leaf in jax.tree.leaves(tree):
        if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype,
                                                                 jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        a = np.ascontiguousarray(np.asarray(leaf))
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in tree.items():
        if SEP in str(k):
            raise ValueError(f"key {k!r} holds {SEP!r}")
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, name + SEP))
        elif v is not None:
            out[name] = np.asarray(v)
    return out


def _unflatten(flat: dict) -> dict:
    out: dict = {}
    for name, v in flat.items():
        *path, leaf = name.split(SEP)
        node = out
        for p in path:
            node = node.setdefault(p, {})
        node[leaf] = v
    return out


def _write_npz(path: Path, flat: dict) -> None:
    buf = io.BytesIO()
    np.savez(buf, **flat)
    write_atomic(path, buf.getvalue())


def _read_npz(path: Path) -> dict:
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as e:  # truncated,
        # not a zip, or holding pickled objects
        raise InputError(f"{path}: not a readable .npz of Table 1 scores ({e})") from None


def part_path(parts_dir, explainer: str, regime: str) -> Path:
    """The file of one part: ``parts_dir / "<explainer>__<regime>.npz"``."""
    return Path(parts_dir) / f"{explainer}__{regime}.npz"


def run_parts_dir(parts_dir, label: str) -> Path:
    """The parts folder of one Table 1 run among several (a budget of a sweep, a choice of the
    sensitivity table): ``parts_dir / label``, with every character other than letters,
    digits and ``_.=,-`` written ``_``."""
    return Path(parts_dir) / re.sub(r"[^A-Za-z0-9_.=,-]", "_", label)


def _save(path: Path, scores: dict, fingerprint: dict, figure=None, wall_s: float = float("nan"),
          figure_index=None) -> Path:
    flat = {f"{SCORES}{SEP}{k}": v for k, v in _flatten(scores).items()}
    flat[WALL_KEY] = np.asarray(wall_s, np.float64)
    if figure is not None:
        fields = {"visual": figure.visual, "textual": figure.textual,
                  "token_valid": figure.token_valid, "visual_px": figure.visual_px,
                  "index": figure_index}
        flat.update({f"{FIGURE}{SEP}{k}": v for k, v in _flatten(fields).items()})
    flat[FINGERPRINT_KEY] = np.asarray(json.dumps(jsonable(fingerprint), sort_keys=True))
    _write_npz(path, flat)
    return path


def save_part(parts_dir, explainer: str, regime: str, scores: dict, fingerprint: dict,
              figure=None, wall_s: float = float("nan")) -> Path:
    """Write one part atomically: ``scores`` (per-sample scores of one explainer on one regime),
    ``fingerprint`` (a JSON-able dict), ``figure`` (an ``Attribution`` of samples 0..k-1,
    every sample's in Table 1, or None) and ``wall_s`` (the seconds the part took to compute)."""
    return _save(part_path(parts_dir, explainer, regime), scores, fingerprint, figure, wall_s)


def _read_part(path: Path) -> tuple[dict, dict, float]:
    """A part file as ``(tree, fingerprint, wall_s)``; ``tree`` holds ``SCORES`` (and
    ``FIGURE`` when saved). ``InputError`` when it is unreadable or not a Table 1 part."""
    flat = _read_npz(path)
    if FINGERPRINT_KEY not in flat or not any(k.startswith(SCORES + SEP) for k in flat):
        raise InputError(f"{path}: no fingerprint or scores; not a part written by Table 1")
    fingerprint = json.loads(str(flat.pop(FINGERPRINT_KEY)))
    wall_s = float(flat.pop(WALL_KEY, np.nan))
    return _unflatten(flat), fingerprint, wall_s


def _differing(a: dict, b: dict) -> list[str]:
    """The fields on which two fingerprints differ, sorted (either may lack a field)."""
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def _load(path: Path, fingerprint: dict):
    """``(scores, figure, figure_index, wall_s)`` of a part or piece file whose fingerprint
    equals ``fingerprint``; None when there is no such file; ``InputError`` otherwise."""
    if not path.exists():
        return None
    tree, saved, wall_s = _read_part(path)
    want = json.loads(json.dumps(jsonable(fingerprint), sort_keys=True))
    if saved != want:
        diff = ", ".join(_differing(saved, want))
        raise InputError(f"{path}: saved by a run with other settings ({diff} differ); use a "
                         "new parts directory or remove this file")
    fig = tree.get(FIGURE)
    return tree[SCORES], _maps(tree), None if fig is None else fig.get("index"), wall_s


def _maps(tree: dict):
    from gridvqa_jax.explain.attribution import Attribution

    fig = tree.get(FIGURE)
    return None if fig is None else Attribution(
        visual=fig["visual"], textual=fig["textual"], token_valid=fig["token_valid"],
        visual_px=fig.get("visual_px"))


def load_part(parts_dir, explainer: str, regime: str, fingerprint: dict):
    """The saved part of ``explainer`` on ``regime`` if it exists: ``(scores, figure, wall_s)``
    with ``figure`` an ``Attribution`` or None and ``wall_s`` the seconds it took when it was
    computed; None when there is no such file. ``InputError`` when
    the file is unreadable or its fingerprint differs from ``fingerprint`` (the differing
    fields are named: the part belongs to another run's protocol)."""
    got = _load(part_path(parts_dir, explainer, regime), fingerprint)
    return None if got is None else (got[0], got[1], got[3])


def pieces_dir(parts_dir, explainer: str, regime: str) -> Path:
    """The folder of a part's pieces: ``parts_dir / "<explainer>__<regime>.pieces"``."""
    return Path(parts_dir) / f"{explainer}__{regime}.pieces"


def piece_path(parts_dir, explainer: str, regime: str, batch_index: int, start: int) -> Path:
    """The file of one piece of a part (samples ``start..`` of batch ``batch_index``, in the
    batch's order): ``pieces_dir(...) / "b<batch_index>_s<start>.npz"``."""
    return pieces_dir(parts_dir, explainer, regime) / f"b{batch_index:04d}_s{start:04d}.npz"


def save_piece(path, scores: dict, fingerprint: dict, figure=None, figure_index=None,
               wall_s: float = float("nan")) -> Path:
    """Write one piece atomically: the per-sample scores of some samples of one batch of a part
    (a row stopped inside a batch resumes from its pieces), ``fingerprint`` (the part's, with
    the piece's place), ``figure`` (an ``Attribution`` of its samples that the figures draw,
    ``figure_index`` int [k] their sample indices) and ``wall_s``."""
    return _save(Path(path), scores, fingerprint, figure, wall_s, figure_index)


def load_piece(path, fingerprint: dict):
    """A saved piece: ``(scores, figure, figure_index, wall_s)``, None when there is no such
    file; ``InputError`` when it is unreadable or its fingerprint differs (fields named)."""
    return _load(Path(path), fingerprint)


def read_part(path) -> tuple[dict, dict, float]:
    """One part file read without a fingerprint to check: ``(scores, fingerprint, wall_s)``
    (per-sample scores of one explainer on one regime, the settings it was computed with, the
    seconds it took). ``InputError`` when the file is unreadable or not a Table 1 part."""
    tree, fingerprint, wall_s = _read_part(Path(path))
    return tree[SCORES], fingerprint, wall_s


def read_part_maps(path):
    """One part file's maps read without a fingerprint to check: ``(maps, scores,
    fingerprint)`` with ``maps`` an ``Attribution`` of samples 0..k-1 (every sample of a part
    saved since 2026-12-05, the first two before) or None, ``scores`` its per-sample scores.
    ``InputError`` when the file is unreadable or not a Table 1 part."""
    tree, fingerprint, _ = _read_part(Path(path))
    return _maps(tree), tree[SCORES], fingerprint


def read_pieces(path) -> tuple[dict, np.ndarray, dict]:
    """The finished pieces of an unfinished part (a ``pieces_dir`` folder) read without a
    fingerprint to check: ``(scores, index, fingerprint)`` with ``scores`` the per-sample
    scores of the k samples its pieces hold, ordered by sample, ``index`` int [k] their sample
    indices (each piece's ``figure`` index) and ``fingerprint`` the part's (the pieces' own
    without their ``piece`` place). ``InputError`` when the folder holds no piece, two pieces
    were saved with other settings, or a piece lacks the maps of some of its samples (pieces
    saved before 2026-12-05 keep the first two samples' only, so their indices are unknown)."""
    from gridvqa_jax.explain.scoring import concat_scores

    files = sorted(Path(path).glob("b*_s*.npz"))
    if not files:
        raise InputError(f"{path}: no pieces (b<batch>_s<start>.npz) in it")
    scores, index, fingerprint = [], [], None
    for f in files:
        tree, fp, _ = _read_part(f)
        fp = {k: v for k, v in fp.items() if k != "piece"}
        if fingerprint is None:
            fingerprint = fp
        elif fp != fingerprint:
            diff = ", ".join(_differing(fp, fingerprint))
            raise InputError(f"{f}: saved with other settings than {files[0].name} ({diff} "
                             "differ); the pieces are not of one part")
        k = len(np.asarray(tree[SCORES]["form"]))
        idx = tree.get(FIGURE, {}).get("index")
        if idx is None or len(np.asarray(idx)) != k:
            raise InputError(f"{f}: holds the maps of {0 if idx is None else len(idx)} of its {k} "
                             "samples, so which samples it holds is not known")
        scores.append(tree[SCORES])
        index.append(np.asarray(idx, np.int64))
    index = np.concatenate(index)
    if len(set(index.tolist())) != len(index):
        raise InputError(f"{path}: two pieces hold the same sample")
    order = np.argsort(index)
    return jax.tree.map(lambda a: a[order], concat_scores(scores)), index[order], fingerprint


def save_per_sample(path, per_sample: dict) -> Path:
    """Write ``{explainer: {regime: per-sample scores}}`` (``table1``'s ``"per_sample"``) to one
    ``.npz`` atomically (keys ``explainer/regime/visual/pixel/rma``, ...)."""
    for e in per_sample:
        if SEP in e:
            raise ValueError(f"explainer name {e!r} holds {SEP!r}")
    _write_npz(Path(path), _flatten(per_sample))
    return Path(path)


def load_per_sample(path) -> dict:
    """The ``{explainer: {regime: per-sample scores}}`` of ``save_per_sample`` (numpy arrays)."""
    return _unflatten(_read_npz(Path(path)))


__all__ = ["digest", "part_path", "run_parts_dir", "save_part", "load_part", "read_part",
           "pieces_dir", "piece_path", "save_piece", "load_piece", "read_pieces",
           "save_per_sample", "load_per_sample"]
