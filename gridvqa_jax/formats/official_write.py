"""Write ``Scene`` batches in the official GridVQA-X release layout (``official_layout``).

Same files, keys, dtypes and JSON fields as the official generators, with the official defects
fixed (``official_layout.FIXES``): ``pixel_mask`` at full resolution (the official one is 25x25
because it passes S as the cell size), ``text_mask`` marking the ground-truth words (target and
anchor attributes and relation words, both words of "left of"/"right of"; the official one
misses two-word relations and forces word 0), anchor phrases linked to their own anchor's box
(the official spans link the k-th anchor phrase to the k-th anchor in scene order) and populated
confuser regions for every anchor (our sampler's D_pure guarantee). A ``spec.json`` manifest in
the root records our spec and generator; official readers ignore it.

Conventions where FORMAT.md leaves a choice: ``objects``/``anchor_objects``/``target_objects``
and the annotations are in row-major cell order (official "scene order" is its generation
order); annotation ids run from 1 over the writer's lifetime; a depth>=2 CMP clause span with no
counted target is dropped like the relational core phrase, a depth-1 CMP target-phrase span is
kept empty like the A span (the official fixtures contain neither case).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import re
import weakref
import zipfile
from pathlib import Path
from typing import Callable

import jax
import numpy as np
from PIL import Image

from mmx_base import grid, staging
from mmx_base.errors import InputError
from gridvqa_jax.formats.official_layout import (FIXES, GENERATOR, MANIFEST, bucket_folder,
                                                 obj_array, obj_dict, token_spans)
from gridvqa_jax.world import render
from gridvqa_jax.world import universe as U

PNG_COMPRESS_LEVEL = 1  # zlib level of the PNGs (Pillow): 3.1 ms vs 8.9 ms at the default 6.
NPZ_COMPRESS_LEVEL = 1  # zlib level inside the npz: 1.3 ms vs 3.5 ms for np.savez_compressed.


# ----------------------------------------------------------------------------------------------
# One sample: question text, word view, spans, grounding line, npz arrays.
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Words:
    """Word-level view of a question (official ``sentence.words``, trailing "?" removed).

    words: the words; role/anchor/clause int32 [n_words]: token role, global anchor index
    (clause * K + i, -1 if none) and clause (CMP: 1 from "than" on) of each word.
    """

    words: list
    role: np.ndarray
    anchor: np.ndarray
    clause: np.ndarray
    qtype: str

    def target(self, c: int) -> tuple[int, int]:
        """(first, last) word of clause c's target phrase."""
        idx = np.nonzero((self.role == U.TARGET_ATTR) & (self.clause == c))[0]
        return int(idx[0]), int(idx[-1])

    def anchor_phrase(self, g: int) -> tuple[int, int]:
        """(first, last) word of global anchor g's phrase (CO: "red object", two words)."""
        idx = np.nonzero((self.role == U.ANCHOR_ATTR) & (self.anchor == g))[0]
        return int(idx[0]), int(idx[-1]) + (1 if self.qtype == "CO" else 0)


def _question_answer(s: dict) -> tuple[str, int | str]:
    """Official question text and answer (int count, or "yes"/"no") of one numpy Scene."""
    b = U.BUCKETS[int(s["bucket"])]
    question = U.format_question(b, s["target_color"], s["target_shape"], s["anchor_color"],
                                 s["anchor_shape"], s["direction"])
    answer = ("yes" if int(s["answer"]) else "no") if b.is_yesno else int(s["answer"])
    return question, answer


def _word_view(s: dict, question: str) -> _Words:
    """Words of ``question`` with the role of the token each holds (one alphabetic token each).

    Raises InputError when the Scene's tokens do not spell the question.
    """
    b = U.BUCKETS[int(s["bucket"])]
    n = int(s["n_tokens"])
    alpha = [j for j in range(n) if U.VOCAB[int(s["tokens"][j])] not in (",", "?")]
    words = question.split()
    words[-1] = words[-1][:-1]  # official sentence.words: the trailing "?" removed
    if len(words) != len(alpha):
        raise InputError(f"tokens {U.detokenize(U.VOCAB[int(t)] for t in s['tokens'][:n])!r} "
                         f"do not spell the question {question!r}")
    clause = np.zeros(len(words), np.int32)
    if b.qtype == "CMP":
        clause[words.index("than"):] = 1
    return _Words(words, np.array([int(s["token_role"][j]) for j in alpha], np.int32),
                  np.array([int(s["token_anchor"][j]) for j in alpha], np.int32), clause,
                  b.qtype)


def _ground_truth_objects(s: dict) -> list[tuple[int, int, int, int, int, int]]:
    """(x, y, color, shape, role, clause) of the anchors and counted targets, row-major."""
    role, clause = s["role"], s["clause"]
    ys, xs = np.nonzero((role == U.ANCHOR) | (role == U.TARGET))
    return [(int(x), int(y), int(s["color"][y, x]), int(s["shape"][y, x]), int(role[y, x]),
             int(clause[y, x])) for y, x in zip(ys, xs)]


def _spans(s: dict, w: _Words, objs: list) -> list[tuple[int, int, str, object]]:
    """Grounded phrases [(first_word, last_word, kind, ref)], ordered by first word.

    kind "anchor": ref = the anchor's (x, y); kind "targets": ref = the clause. Rules
    (FORMAT.md): every anchor phrase -> its anchor; A -> the target phrase, kept when empty;
    depth-1 CMP -> each target phrase, kept when empty; other CMP -> each clause from its target
    to its last anchor, dropped when empty; SO/CO/M -> the core phrase from the target word to
    the end, dropped when empty.
    """
    K = U.MAX_ANCHORS_PER_CLAUSE
    b = U.BUCKETS[int(s["bucket"])]
    m = b.anchors_per_clause
    spans = []
    for c in range(b.n_clauses):
        for i in range(m):
            xy = (int(s["anchor_xy"][c, i, 0]), int(s["anchor_xy"][c, i, 1]))
            spans.append((*w.anchor_phrase(c * K + i), "anchor", xy))
    n_targets = [sum(1 for o in objs if o[4] == U.TARGET and o[5] == c) for c in range(2)]
    if b.qtype == "A":
        spans.append((*w.target(0), "targets", 0))  # kept even when empty ("no")
    elif b.qtype == "CMP" and m == 0:
        spans.extend((*w.target(c), "targets", c) for c in range(2))
    elif b.qtype == "CMP":
        spans.extend((w.target(c)[0], w.anchor_phrase(c * K + m - 1)[1], "targets", c)
                     for c in range(2) if n_targets[c])
    elif n_targets[0]:  # relational core phrase: target word to the end; dropped if empty
        spans.append((w.target(0)[0], len(w.words) - 1, "targets", 0))
    spans.sort(key=lambda t: (t[0], -t[1]))
    return spans


def _grounding_line(image_id, file_name, question, words, objs, spans, ann_id0, cell_px):
    """One ``grounding_{split}.jsonl`` record and the number of annotation ids it used.

    Annotations: the ground-truth objects ``objs`` with ids from ``ann_id0``, pixel boxes
    [x0, y0, w, h] of whole cells, category_id = 1 + 4 * color + shape.
    """
    ann_of = {}
    annotations = []
    for k, (x, y, c, s, _, _) in enumerate(objs):
        aid = ann_id0 + k
        ann_of[(x, y)] = aid
        annotations.append({
            "id": aid, "image_id": image_id, "bbox": [x * cell_px, y * cell_px, cell_px, cell_px],
            "category_id": 1 + 4 * c + s, "category_name": f"{U.COLORS[c]} {U.SHAPES[s]}",
            "color": U.COLORS[c], "shape": U.SHAPES[s]})
    tok = token_spans(words)
    out_spans = []
    for w0, w1, kind, ref in spans:
        if kind == "anchor":
            box_ids = [ann_of[ref]]
        else:
            box_ids = [ann_of[(o[0], o[1])] for o in objs
                       if o[4] == U.TARGET and o[5] == ref]
        out_spans.append({"span": [w0, w1], "token_span": [tok[w0][0], tok[w1][1]],
                          "box_ids": box_ids})
    return {"image": {"id": image_id, "file_name": file_name},
            "annotations": annotations,
            "sentence": {"text": question, "words": list(words), "spans": out_spans}}, len(objs)


def _npz_arrays(s: dict, image, pixel_mask, question, answer, objs, text_mask) -> dict:
    """The npz members of one sample, in ``NPZ_KEYS`` order with the official dtypes.

    pos_mask = (V_target of either clause) minus the anchor cells.
    """
    v = s["v_target"]
    pos_mask = (v[0] | v[1]) & ~(s["role"] == U.ANCHOR)
    return {
        "image": image,
        "question": np.array(question),
        "answer": np.array(answer, np.int64) if isinstance(answer, int) else np.array(answer),
        "objects": obj_array([obj_dict(*o[:4]) for o in objs]),
        "anchor_objects": obj_array([obj_dict(*o[:4]) for o in objs if o[4] == U.ANCHOR]),
        "target_objects": obj_array([obj_dict(*o[:4]) for o in objs if o[4] == U.TARGET]),
        "cell_mask": s["gt_cells"].astype(np.int64),
        "pixel_mask": pixel_mask,
        "text_mask": text_mask,
        "pos_mask": pos_mask.astype(np.int64),
    }


def _savez_deflated(path, arrays: dict, level: int):
    """``np.savez_compressed`` with a chosen zlib level (same archive layout, same np.load)."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=level,
                         allowZip64=True) as zf:
        for key, val in arrays.items():
            with zf.open(key + ".npy", "w", force_zip64=True) as fh:
                np.lib.format.write_array(fh, np.asanyarray(val), allow_pickle=True)


def _version() -> str:
    try:
        from gridvqa_jax import __version__
        return __version__
    except Exception:  # noqa: BLE001
        return "unknown"


# ----------------------------------------------------------------------------------------------
# Writer.
# ----------------------------------------------------------------------------------------------
class OfficialWriter(staging.StagedWriter):
    """Incremental writer of the official layout into ``out_dir`` (host side).

    Everything goes to a temporary sibling ``out_dir + '.tmp-XXXX'`` that ``close()`` renames to
    ``out_dir`` atomically; an exception in ``add``/``close`` (or ``abort()``, or leaving a
    ``with`` block by an exception) removes it, so a reader never sees a half-written dataset.
    State carried between ``add`` calls: the next image id (from ``start_id``, in generation
    order), the next annotation id (from ``start_ann_id``) and the next file index of every
    bucket folder (from 0), so writing chunk by chunk gives the same files as one big batch.

    spec: the ``universe.Spec`` the batches were sampled with (grid size, density and cell_px
    name the folders and boxes). ``add(..., spec=other)`` may switch density (mixed ``g{S}_dXX``
    folders in one split) but not grid size, cell size or variant. progress: optional callable
    ``progress(n_written, n_expected)`` called as samples reach the disk (n_expected counts
    samples written so far plus those still pending in the current ``add``). compress_level /
    npz_compress_level: zlib levels of the PNGs and of the npz members (the npz files are the
    deflated zip archives ``np.savez_compressed`` writes, only faster to make; ``np.load``
    reads them the same). workers: threads writing PNG/npz files (zlib releases the GIL).
    """

    def __init__(self, out_dir, spec: U.Spec, split: str = "val", start_id: int = 1,
                 progress: Callable[[int, int], None] | None = None, start_ann_id: int = 1,
                 compress_level: int = PNG_COMPRESS_LEVEL,
                 npz_compress_level: int = NPZ_COMPRESS_LEVEL, workers: int | None = None):
        if not re.fullmatch(r"[A-Za-z0-9_\-]+", split):
            raise InputError(f"split must be a simple name such as 'val', got {split!r}")
        self.out_dir = Path(out_dir).absolute()
        self.spec, self.split = spec, split
        self.progress, self.compress_level = progress, int(compress_level)
        self.npz_compress_level = int(npz_compress_level)
        self.workers = workers or min(4, os.cpu_count() or 1)
        self.next_image_id, self.next_ann_id = int(start_id), int(start_ann_id)
        self.first_image_id = self.next_image_id
        self.n_written = 0
        self.counters: dict[str, int] = {}
        self.specs: dict[str, U.Spec] = {spec.density_key: spec}
        self.tmp = staging.make_staging(self.out_dir)
        self._cleanup = weakref.finalize(self, staging.discard, str(self.tmp))
        self._qa = open(self.tmp / f"qa_{split}.jsonl", "w")
        self._gr = open(self.tmp / f"grounding_{split}.jsonl", "w")
        self._dirs: set[str] = set()
        self.closed = False

    def _check_spec(self, spec: U.Spec):
        s0 = self.spec
        if (spec.grid_size, spec.cell_px, spec.variant) != (s0.grid_size, s0.cell_px, s0.variant):
            raise InputError(
                f"all batches of one directory need the same grid size, cell size and variant; "
                f"got {spec.grid_size}/{spec.cell_px}px/{spec.variant} after "
                f"{s0.grid_size}/{s0.cell_px}px/{s0.variant}")
        self.specs.setdefault(spec.density_key, spec)

    def add(self, batch, images=None, spec: U.Spec | None = None) -> list[dict]:
        """Append a batch of Scenes (leading axis B, jax or numpy) in generation order.

        images: uint8 [B, S*cell_px, S*cell_px, 3] or None to render them with
        ``render.render`` (jit+vmap). Returns one meta dict per sample (image_id, file_name,
        npz, density_key, bucket). On any error the temporary directory is removed and the
        writer is closed.
        """
        if self.closed:
            raise InputError("this OfficialWriter is closed")
        try:
            return self._add(batch, images, spec or self.spec)
        except BaseException:
            self.abort()
            raise

    def _checked_inputs(self, batch, images, spec: U.Spec):
        """(numpy batch, uint8 images) after checking grid size, validity and image shape."""
        self._check_spec(spec)
        S, px = spec.grid_size, spec.cell_px
        nb = jax.tree.map(np.asarray, batch)
        n = int(nb.bucket.shape[0])
        if nb.color.shape[1:] != (S, S):
            raise InputError(f"batch grids are {nb.color.shape[1:]} but the spec says "
                             f"{S}x{S}")
        if not np.all(nb.valid):
            bad = np.nonzero(~nb.valid)[0]
            raise InputError(f"{bad.size} sample(s) of the batch are not valid (first: "
                             f"{bad[0]}); the sampler found no geometry for them")
        if images is None:
            images = render.render_images(nb.color, nb.shape, px)
        images = np.asarray(images)
        if images.shape != (n, S * px, S * px, 3) or images.dtype != np.uint8:
            raise InputError(f"images must be uint8 {(n, S * px, S * px, 3)}, got "
                             f"{images.dtype} {images.shape}")
        return nb, images

    def _next_paths(self, bucket: U.Bucket, spec: U.Spec) -> tuple[str, str]:
        """(png, npz) relative paths of the next file of a bucket folder (folders created)."""
        folder = bucket_folder(bucket, spec.grid_size, spec.density_key)
        idx = self.counters.get(folder, 0)
        self.counters[folder] = idx + 1
        png_rel = f"images/{self.split}/{folder}/{idx:06d}.png"
        npz_rel = f"{self.split}/{folder}/{idx:06d}.npz"
        for rel in (png_rel, npz_rel):
            d = rel.rsplit("/", 1)[0]
            if d not in self._dirs:
                (self.tmp / d).mkdir(parents=True, exist_ok=True)
                self._dirs.add(d)
        return png_rel, npz_rel

    def _add_sample(self, s: dict, image, pixel_mask, spec: U.Spec, pool) -> tuple[dict, object]:
        """Write one sample's qa and grounding lines; queue its PNG and npz on ``pool``."""
        b = U.BUCKETS[int(s["bucket"])]
        png_rel, npz_rel = self._next_paths(b, spec)
        question, answer = _question_answer(s)
        words = _word_view(s, question)
        objs = _ground_truth_objects(s)
        text_mask = (words.role > U.FUNCTION).astype(np.uint8)
        image_id = self.next_image_id
        line, n_ann = _grounding_line(image_id, png_rel, question, words.words, objs,
                                      _spans(s, words, objs), self.next_ann_id,
                                      spec.cell_px)
        self.next_image_id += 1
        self.next_ann_id += n_ann
        arrays = _npz_arrays(s, image, pixel_mask, question, answer, objs, text_mask)
        self._qa.write(json.dumps({"image_id": image_id, "question": question,
                                   "answer": answer}) + "\n")
        self._gr.write(json.dumps(line) + "\n")
        future = pool.submit(self._write_files, png_rel, npz_rel, arrays)
        meta = {"image_id": image_id, "file_name": png_rel, "npz": npz_rel,
                "density_key": spec.density_key, "bucket": b.name}
        return meta, future

    def _add(self, batch, images, spec: U.Spec) -> list[dict]:
        nb, images = self._checked_inputs(batch, images, spec)
        px, n = spec.cell_px, int(nb.bucket.shape[0])
        pixel_masks = grid.upsample(np.asarray(nb.gt_cells), px).astype(np.uint8)
        fields = {f.name: getattr(nb, f.name) for f in dataclasses.fields(nb)}
        metas, futures = [], []
        expected = self.n_written + n
        with concurrent.futures.ThreadPoolExecutor(self.workers) as pool:
            for i in range(n):
                meta, fut = self._add_sample({k: v[i] for k, v in fields.items()}, images[i],
                                             pixel_masks[i], spec, pool)
                metas.append(meta)
                futures.append(fut)
            step = max(1, n // 100)
            for k, fut in enumerate(futures):
                fut.result()
                self.n_written += 1
                if self.progress is not None and ((k + 1) % step == 0 or k + 1 == n):
                    self.progress(self.n_written, expected)
        return metas

    def _write_files(self, png_rel: str, npz_rel: str, arrays: dict):
        Image.fromarray(arrays["image"], "RGB").save(
            self.tmp / png_rel, format="PNG", compress_level=self.compress_level)
        _savez_deflated(self.tmp / npz_rel, arrays, self.npz_compress_level)

    def _manifest(self) -> dict:
        return {
            "format": "GridVQA-X official release layout",
            "generator": GENERATOR,
            "generator_version": _version(),
            "split": self.split,
            "n_samples": self.n_written,
            "image_ids": [self.first_image_id, self.next_image_id - 1],
            "variant": self.spec.variant,
            "grid_size": self.spec.grid_size,
            "cell_px": self.spec.cell_px,
            "specs": {k: v.to_json() for k, v in sorted(self.specs.items())},
            "fixes": list(FIXES),
        }

    def close(self) -> Path:
        """Write the ``spec.json`` manifest and rename the temporary directory to ``out_dir``.

        Raises ValueError (and removes the temporary directory) if ``out_dir`` has become a
        non-empty directory meanwhile. Returns ``out_dir``.
        """
        if self.closed:
            raise InputError("this OfficialWriter is closed")
        try:
            self._qa.close()
            self._gr.close()
            (self.tmp / MANIFEST).write_text(json.dumps(self._manifest(), indent=1) + "\n")
            staging.publish(self.tmp, self.out_dir)
        except BaseException:
            self.abort()
            raise
        self.closed = True
        self._cleanup.detach()
        return self.out_dir

    def abort(self):
        """Discard everything written so far (removes the temporary directory)."""
        for f in (self._qa, self._gr):
            try:
                f.close()
            except Exception:  # noqa: BLE001
                pass
        self.closed = True
        self._cleanup()


def write_official(out_dir, batch, spec: U.Spec, images=None, split: str = "val",
                   start_id: int = 1, progress=None, **writer_kwargs) -> list[dict]:
    """Write one batch of Scenes (leading axis B) as an official GridVQA-X directory.

    Thin wrapper over ``OfficialWriter(out_dir, spec, split, start_id, progress).add(batch,
    images)`` + ``close()``: ``qa_{split}.jsonl``, ``grounding_{split}.jsonl``, the PNGs
    (rendered with ``render.render`` at ``spec.cell_px`` when ``images`` is None), the npz files
    (official keys and dtypes, defects fixed) and ``spec.json``. ``out_dir`` must not exist or
    be empty; it appears atomically, or not at all on error. Returns per-sample meta dicts.
    """
    with OfficialWriter(out_dir, spec, split=split, start_id=start_id, progress=progress,
                        **writer_kwargs) as w:
        return w.add(batch, images)


__all__ = ["OfficialWriter", "write_official", "PNG_COMPRESS_LEVEL", "NPZ_COMPRESS_LEVEL"]
