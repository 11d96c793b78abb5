"""Read and write the official GridVQA-X release layout, so data and models interoperate with it.

The official generators (``dataset_generation/pure`` and ``/spurious`` of the public release) write,
per split (``shared/fixtures/official_gridvqa/FORMAT.md`` documents every field)::

    qa_{split}.jsonl                                          {"image_id", "question", "answer"}
    grounding_{split}.jsonl                                   MDETR-style boxes and phrase spans
    images/{split}/depth{D}/{QT}/form{F}/g{S}_d{XX}/{i:06d}.png
    {split}/depth{D}/{QT}/form{F}/g{S}_d{XX}/{i:06d}.npz       per-sample arrays

``write_official`` / ``OfficialWriter`` produce exactly that layout from our ``Scene`` batches
(same keys, dtypes and JSON fields), with the official defects fixed: ``pixel_mask`` at full
resolution (the official one is 25x25 because it passes S as the cell size), ``text_mask`` marking
the ground-truth words (target and anchor attributes and relation words, both words of
"left of"/"right of"; the official one misses two-word relations and forces word 0), anchor
phrases linked to their own anchor's box (the official spans link the k-th anchor phrase to the
k-th anchor in scene order, i.e. to the wrong anchor whenever the orders differ) and populated
confuser regions for every anchor (our sampler's D_pure guarantee). A ``spec.json`` manifest in
the root records our spec and generator; official readers ignore it.

Conventions where FORMAT.md leaves a choice: ``objects``/``anchor_objects``/``target_objects``
and the annotations are in row-major cell order (official "scene order" is its generation
order); annotation ids run from 1 over the writer's lifetime; a depth>=2 CMP clause span with no
counted target is dropped like the relational core phrase, a depth-1 CMP target-phrase span is
kept empty like the A span (the fixtures contain neither case).

``read_official`` reads such a directory (official or ours) back into a ``Scene`` batch by
parsing the questions with regular expressions over the official templates, so that
``verify`` and our models run on official data.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import json
import os
import re
import weakref
import zipfile
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from PIL import Image

from gridvqa_jax.world import regions as R
from gridvqa_jax.world.questions import build_tokens
from gridvqa_jax.world.scene import Scene
from gridvqa_jax.core import staging
from gridvqa_jax.world import universe as U

NPZ_KEYS = ("image", "question", "answer", "objects", "anchor_objects", "target_objects",
            "cell_mask", "pixel_mask", "text_mask", "pos_mask")
MANIFEST = "spec.json"
GENERATOR = "gridvqa_jax"
SIDECAR = "sidecar_scene.jsonl"
PNG_COMPRESS_LEVEL = 1  # zlib level of the PNGs (Pillow): 3.1 ms vs 8.9 ms at the default 6.
NPZ_COMPRESS_LEVEL = 1  # zlib level inside the npz: 1.3 ms vs 3.5 ms for np.savez_compressed.
FIXES = (
    "pixel_mask is cell_mask upsampled to the full image (official: 25x25 for S=5)",
    "text_mask marks target/anchor attribute and relation words (incl. both words of "
    "'left of'/'right of'), word 0 is not forced",
    "anchor phrase spans link their own anchor (official: k-th anchor in scene order)",
    "D_pure: every confuser region C_k holds a target look-alike (depth 1 and CMP included)",
)

_FILE_RE = re.compile(
    r"^images/(?P<split>[^/]+)/depth(?P<depth>\d+)/(?P<qtype>[A-Za-z]+)/form(?P<form>\d+)/"
    r"g(?P<grid>\d+)_(?P<density>d\d+)/(?P<index>\d+)\.png$")
_WORD_TOKENS_RE = re.compile(r"\w+|[^\w\s]")  # the stub tokenizer: words and punctuation marks


# ----------------------------------------------------------------------------------------------
# Question parsing: one regular expression per bucket, built from the official templates.
# ----------------------------------------------------------------------------------------------
def _alt(names) -> str:
    return "|".join(sorted(names, key=len, reverse=True))


def _np_pattern(qtype: str, plural: bool, cname: str, sname: str) -> str:
    """Regex of ``universe.noun_phrase`` with named groups for the named attributes."""
    s = "s" if plural else ""
    color = f"(?P<{cname}>{_alt(U.COLORS)})"
    shape = f"(?P<{sname}>{_alt(U.SHAPES)})"
    if qtype == "CO":
        return f"{color} object{s}"
    if qtype == "SO":
        return f"{shape}{s}"
    return f"{color} {shape}{s}"


def _relations_pattern(qtype: str, clause: int, m: int, oxford: bool) -> str:
    rels = [f"(?P<d{clause}_{i}>{_alt(U.DIRECTIONS)}) "
            + _np_pattern(qtype, False, f"ac{clause}_{i}", f"as{clause}_{i}") for i in range(m)]
    return U._relations(rels, oxford)


def _question_pattern(bucket: U.Bucket) -> str:
    """Regex mirroring ``universe.format_question`` for one bucket (same wording, same joins)."""
    q, m = bucket.qtype, bucket.anchors_per_clause
    if q == "CMP":
        parts = []
        for c in range(2):
            t = _np_pattern("M", True, f"tc{c}", f"ts{c}")
            parts.append(t + (" " + _relations_pattern("M", c, m, oxford=False) if m else ""))
        return rf"Are there more {parts[0]} than {parts[1]}\?"
    single = _np_pattern(q, False, "tc0", "ts0")
    plural = _np_pattern(q, True, "tc0", "ts0")
    if q == "A":
        return rf"How many {plural}\?" if bucket.form == 0 else rf"Is there any {single}\?"
    r = _relations_pattern(q, 0, m, oxford=True)
    if bucket.form == 1:
        return rf"Is there any {single} that is {r}\?"
    return rf"How many {plural} that are {r}\?" if m == 3 else rf"How many {plural} are {r}\?"


_QUESTION_RES = tuple(re.compile(_question_pattern(b)) for b in U.BUCKETS)


def parse_question(text: str, bucket: int | None = None) -> dict:
    """Parse an official question back into our question structure.

    text: the question as in ``qa_{split}.jsonl``; bucket: expected bucket id (None: infer it;
    the templates are unambiguous). Returns a dict of numpy arrays in ``Scene`` conventions:
    bucket int, target_color/target_shape int32 [2] (-1 unnamed or absent clause),
    anchor_active bool [2, K], anchor_color/anchor_shape/direction int32 [2, K] (anchors in
    question order; -1 / 0 when inactive or unnamed). Raises ValueError if no template matches.
    """
    K = U.MAX_ANCHORS_PER_CLAUSE
    ids = range(len(U.BUCKETS)) if bucket is None else (int(bucket),)
    for bid in ids:
        mt = _QUESTION_RES[bid].fullmatch(text)
        if mt is not None:
            break
    else:
        if bucket is not None:
            other = [U.BUCKETS[i].name for i, rx in enumerate(_QUESTION_RES) if rx.fullmatch(text)]
            hint = f" (it is a {other[0]} question)" if other else ""
            raise ValueError(f"question {text!r} does not match the official "
                             f"{U.BUCKETS[int(bucket)].name} template{hint}")
        raise ValueError(f"question {text!r} matches no official GridVQA-X template")
    b = U.BUCKETS[bid]
    g = mt.groupdict()
    col = lambda k: U.COLORS.index(g[k]) if g.get(k) else -1  # noqa: E731
    shp = lambda k: U.SHAPES.index(g[k]) if g.get(k) else -1  # noqa: E731
    out = dict(bucket=bid,
               target_color=np.full(2, -1, np.int32), target_shape=np.full(2, -1, np.int32),
               anchor_active=np.zeros((2, K), bool), anchor_color=np.full((2, K), -1, np.int32),
               anchor_shape=np.full((2, K), -1, np.int32), direction=np.zeros((2, K), np.int32))
    for c in range(b.n_clauses):
        out["target_color"][c], out["target_shape"][c] = col(f"tc{c}"), shp(f"ts{c}")
        for i in range(b.anchors_per_clause):
            out["anchor_active"][c, i] = True
            out["anchor_color"][c, i] = col(f"ac{c}_{i}")
            out["anchor_shape"][c, i] = shp(f"as{c}_{i}")
            out["direction"][c, i] = U.DIRECTIONS.index(g[f"d{c}_{i}"])
    return out


# ----------------------------------------------------------------------------------------------
# Per-sample records in the official format.
# ----------------------------------------------------------------------------------------------
def _obj_dict(x, y, c, s) -> dict:
    return {"x": int(x), "y": int(y), "color": U.COLORS[int(c)], "shape": U.SHAPES[int(s)]}


def _obj_array(dicts: list) -> np.ndarray:
    """What the official ``np.array(list_of_dicts)`` gives: object array, or float64 (0,)."""
    if not dicts:
        return np.zeros((0,), np.float64)
    arr = np.empty(len(dicts), object)
    arr[:] = dicts
    return arr


def _token_starts(words: list[str]) -> list[tuple[int, int]]:
    """(first, last) stub-tokenizer index of each word in ' '.join(words), ``<s>`` = 0."""
    out, pos = [], 1
    for w in words:
        n = max(1, len(_WORD_TOKENS_RE.findall(w)))
        out.append((pos, pos + n - 1))
        pos += n
    return out


def bucket_folder(bucket: U.Bucket, grid_size: int, density_key: str) -> str:
    """Official bucket folder ``depth{D}/{QT}/form{F}/g{S}_d{XX}`` (relative)."""
    return f"depth{bucket.depth}/{bucket.qtype}/form{bucket.form}/g{grid_size}_{density_key}"


def _sample_record(s: dict):
    """Official text, answer, object lists, masks and spans of one numpy-converted Scene.

    Returns (question, answer, words (official ``sentence.words``), objs [(x, y, c, s, role,
    clause)] of anchors and counted targets in row-major order, text_mask uint8 [n_words],
    pos_mask bool [S, S], spans [(first_word, last_word, kind, ref)]) where kind is "targets"
    (ref = clause) or "anchor" (ref = the anchor's (x, y)).

    Span rules (FORMAT.md): every anchor phrase -> its anchor; A -> the target phrase, kept
    when empty; depth-1 CMP -> each target phrase, kept when empty; other CMP -> each clause
    from its target to its last anchor, dropped when empty; SO/CO/M -> the core phrase from
    the target word to the end, dropped when empty. Ordered by first word.
    """
    K = U.MAX_ANCHORS_PER_CLAUSE
    b = U.BUCKETS[int(s["bucket"])]
    question = U.format_question(b, s["target_color"], s["target_shape"], s["anchor_color"],
                                 s["anchor_shape"], s["direction"])
    answer = ("yes" if int(s["answer"]) else "no") if b.is_yesno else int(s["answer"])
    role, clause = s["role"], s["clause"]
    ys, xs = np.nonzero((role == U.ANCHOR) | (role == U.TARGET))  # row-major order
    objs = [(int(x), int(y), int(s["color"][y, x]), int(s["shape"][y, x]), int(role[y, x]),
             int(clause[y, x])) for y, x in zip(ys, xs)]

    # Word-level view of the tokens: every whitespace word holds exactly one alphabetic token.
    n = int(s["n_tokens"])
    alpha = [j for j in range(n) if U.VOCAB[int(s["tokens"][j])] not in (",", "?")]
    words = question.split()
    words[-1] = words[-1][:-1]  # official sentence.words: the trailing "?" removed
    if len(words) != len(alpha):
        raise ValueError(f"tokens {U.detokenize(U.VOCAB[int(t)] for t in s['tokens'][:n])!r} "
                         f"do not spell the question {question!r}")
    w_role = np.array([int(s["token_role"][j]) for j in alpha], np.int32)
    w_anchor = np.array([int(s["token_anchor"][j]) for j in alpha], np.int32)
    text_mask = (w_role > U.FUNCTION).astype(np.uint8)
    w_clause = np.zeros(len(words), np.int32)
    if b.qtype == "CMP":
        w_clause[words.index("than"):] = 1

    def target_words(c):
        idx = np.nonzero((w_role == U.TARGET_ATTR) & (w_clause == c))[0]
        return int(idx[0]), int(idx[-1])

    def anchor_words(g):
        idx = np.nonzero((w_role == U.ANCHOR_ATTR) & (w_anchor == g))[0]
        last = int(idx[-1]) + (1 if b.qtype == "CO" else 0)  # CO: "red object"
        return int(idx[0]), last

    spans = []
    m = b.anchors_per_clause
    for c in range(b.n_clauses):
        for i in range(m):
            a0, a1 = anchor_words(c * K + i)
            spans.append((a0, a1, "anchor", (int(s["anchor_xy"][c, i, 0]),
                                             int(s["anchor_xy"][c, i, 1]))))
    n_targets = [sum(1 for o in objs if o[4] == U.TARGET and o[5] == c) for c in range(2)]
    if b.qtype == "A":
        spans.append((*target_words(0), "targets", 0))  # kept even when empty ("no")
    elif b.qtype == "CMP" and m == 0:
        for c in range(2):
            spans.append((*target_words(c), "targets", c))
    elif b.qtype == "CMP":
        for c in range(2):
            if n_targets[c]:
                last = anchor_words(c * K + m - 1)[1]
                spans.append((target_words(c)[0], last, "targets", c))
    elif n_targets[0]:  # relational core phrase: target word to the end; dropped if empty
        spans.append((target_words(0)[0], len(words) - 1, "targets", 0))
    spans.sort(key=lambda t: (t[0], -t[1]))

    v = s["v_target"]
    anchor_cells = role == U.ANCHOR
    pos_mask = (v[0] | v[1]) & ~anchor_cells
    return question, answer, words, objs, text_mask, pos_mask, spans


def _grounding_line(image_id, file_name, question, words, objs, spans, ann_id0, cell_px):
    ann_of = {}
    annotations = []
    for k, (x, y, c, s, _, _) in enumerate(objs):
        aid = ann_id0 + k
        ann_of[(x, y)] = aid
        annotations.append({
            "id": aid, "image_id": image_id, "bbox": [x * cell_px, y * cell_px, cell_px, cell_px],
            "category_id": 1 + 4 * c + s, "category_name": f"{U.COLORS[c]} {U.SHAPES[s]}",
            "color": U.COLORS[c], "shape": U.SHAPES[s]})
    tok = _token_starts(words)
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


def _pad_len(n: int) -> int:
    """Next power of two >= max(n, 8): few distinct shapes, few compiles."""
    return max(8, 1 << (max(n, 1) - 1).bit_length())


def _pad_rows(a: np.ndarray, m: int) -> np.ndarray:
    return a if a.shape[0] == m else np.concatenate([a, np.repeat(a[:1], m - a.shape[0], 0)])


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
            raise ValueError(f"split must be a simple name such as 'val', got {split!r}")
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
            raise ValueError(
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
            raise ValueError("this OfficialWriter is closed")
        try:
            return self._add(batch, images, spec or self.spec)
        except BaseException:
            self.abort()
            raise

    def _add(self, batch, images, spec: U.Spec) -> list[dict]:
        self._check_spec(spec)
        S, px = spec.grid_size, spec.cell_px
        nb = jax.tree.map(np.asarray, batch)
        n = int(nb.bucket.shape[0])
        if nb.color.shape[1:] != (S, S):
            raise ValueError(f"batch grids are {nb.color.shape[1:]} but the spec says "
                             f"{S}x{S}")
        if not np.all(nb.valid):
            bad = np.nonzero(~nb.valid)[0]
            raise ValueError(f"{bad.size} sample(s) of the batch are not valid (first: {bad[0]}); "
                             "the sampler found no geometry for them")
        if images is None:
            from gridvqa_jax.world import render

            images = render.render_images(nb.color, nb.shape, px)
        images = np.asarray(images)
        if images.shape != (n, S * px, S * px, 3) or images.dtype != np.uint8:
            raise ValueError(f"images must be uint8 {(n, S * px, S * px, 3)}, got "
                             f"{images.dtype} {images.shape}")
        pixel_masks = np.repeat(np.repeat(nb.gt_cells, px, axis=1), px, axis=2).astype(np.uint8)
        fields = {f.name: getattr(nb, f.name) for f in dataclasses.fields(nb)}
        metas, futures = [], []
        expected = self.n_written + n
        with concurrent.futures.ThreadPoolExecutor(self.workers) as pool:
            for i in range(n):
                s = {k: v[i] for k, v in fields.items()}
                b = U.BUCKETS[int(s["bucket"])]
                folder = bucket_folder(b, S, spec.density_key)
                idx = self.counters.get(folder, 0)
                self.counters[folder] = idx + 1
                png_rel = f"images/{self.split}/{folder}/{idx:06d}.png"
                npz_rel = f"{self.split}/{folder}/{idx:06d}.npz"
                for rel in (png_rel, npz_rel):
                    d = rel.rsplit("/", 1)[0]
                    if d not in self._dirs:
                        (self.tmp / d).mkdir(parents=True, exist_ok=True)
                        self._dirs.add(d)
                question, answer, words, objs, text_mask, pos_mask, spans = _sample_record(s)
                image_id = self.next_image_id
                line, n_ann = _grounding_line(image_id, png_rel, question, words, objs, spans,
                                              self.next_ann_id, px)
                self.next_image_id += 1
                self.next_ann_id += n_ann
                arrays = {
                    "image": images[i],
                    "question": np.array(question),
                    "answer": np.array(answer, np.int64) if isinstance(answer, int)
                    else np.array(answer),
                    "objects": _obj_array([_obj_dict(*o[:4]) for o in objs]),
                    "anchor_objects": _obj_array([_obj_dict(*o[:4]) for o in objs
                                                  if o[4] == U.ANCHOR]),
                    "target_objects": _obj_array([_obj_dict(*o[:4]) for o in objs
                                                  if o[4] == U.TARGET]),
                    "cell_mask": s["gt_cells"].astype(np.int64),
                    "pixel_mask": pixel_masks[i],
                    "text_mask": text_mask,
                    "pos_mask": pos_mask.astype(np.int64),
                }
                self._qa.write(json.dumps({"image_id": image_id, "question": question,
                                           "answer": answer}) + "\n")
                self._gr.write(json.dumps(line) + "\n")
                futures.append(pool.submit(self._write_files, png_rel, npz_rel, arrays))
                metas.append({"image_id": image_id, "file_name": png_rel, "npz": npz_rel,
                              "density_key": spec.density_key, "bucket": b.name})
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

    def close(self) -> Path:
        """Write the ``spec.json`` manifest and rename the temporary directory to ``out_dir``.

        Raises ValueError (and removes the temporary directory) if ``out_dir`` has become a
        non-empty directory meanwhile. Returns ``out_dir``.
        """
        if self.closed:
            raise ValueError("this OfficialWriter is closed")
        try:
            self._qa.close()
            self._gr.close()
            manifest = {
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
            (self.tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
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


# ----------------------------------------------------------------------------------------------
# Reader.
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class OfficialInfo:
    """What a directory says about its dataset (the spec-like part of ``read_official``).

    grid_size/cell_px: S and pixels per cell; variant: "pure"/"spur" from our manifest, the
    official report files (the direction-shortcut reports exist only for D_pure) or the
    caller; densities: density keys present ("d07", ...); generator: "gridvqa_jax" (manifest
    present) or "official"; scene_sources: how scenes were obtained ("sidecar"/"image").
    """

    root: str
    split: str
    grid_size: int
    cell_px: int
    variant: str | None
    densities: tuple[str, ...]
    generator: str
    manifest: dict | None
    scene_sources: tuple[str, ...]

    def spec(self, density_key: str | None = None, variant: str | None = None) -> U.Spec:
        """A ``Spec`` for ``verify`` on the samples of one density (default: the only one).

        Its buckets are (0,) whatever the directory holds: verify does not read them, and a
        canonical spec shares compiled code across directories.
        """
        if density_key is None:
            if len(self.densities) != 1:
                raise ValueError(f"{self.root} mixes densities {self.densities}; name one")
            density_key = self.densities[0]
        variant = variant or self.variant
        if variant is None:
            raise ValueError(f"{self.root}: variant unknown (no manifest, no report files); "
                             "pass variant='pure' or 'spur'")
        return U.Spec(variant, self.grid_size, _density_of(density_key), self.cell_px,
                      buckets=(0,))


def _density_of(key: str) -> float:
    if key in U.DENSITIES:
        return U.DENSITIES[key]
    return int(key[1:]) / 10.0


def _read_jsonl(path: Path) -> list[dict]:
    out = []
    with open(path) as f:
        for k, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{k}: not valid JSON ({e.msg})") from None
    return out


def _locate(scene_color, scene_shape, npz_anchors, used, color, shape, where):
    """Cell (x, y) of an anchor naming (color, shape) (-1 = unnamed).

    Prefers the npz ``anchor_objects`` (what the generator declared), consuming each once, and
    falls back to the unique matching object of the scene.
    """
    for k, o in enumerate(npz_anchors):
        if k in used:
            continue
        if (color < 0 or o[2] == color) and (shape < 0 or o[3] == shape):
            used.add(k)
            return o[0], o[1]
    m = (scene_color >= 0) & ((scene_color == color) | (color < 0)) & \
        ((scene_shape == shape) | (shape < 0))
    ys, xs = np.nonzero(m)
    name = " ".join(n for n in (U.COLORS[color] if color >= 0 else "",
                                U.SHAPES[shape] if shape >= 0 else "object") if n)
    if len(xs) != 1:
        raise ValueError(f"{where}: cannot locate the anchor '{name}': {len(xs)} matching "
                         "objects in the scene and none left in the npz anchor_objects")
    return int(xs[0]), int(ys[0])


def _objects_of(arr, where, S) -> list[tuple[int, int, int, int]]:
    if arr.dtype != object:
        if arr.size:
            raise ValueError(f"{where}: expected an object array of dicts, got {arr.dtype}")
        return []
    out = []
    for o in arr:
        try:
            t = (int(o["x"]), int(o["y"]), U.color_id(o["color"]), U.shape_id(o["shape"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{where}: bad object {o!r} ({e})") from None
        if not (0 <= t[0] < S and 0 <= t[1] < S):
            raise ValueError(f"{where}: object {o!r} lies outside the {S}x{S} grid named by "
                             "the folder (grid size does not match)")
        out.append(t)
    return out


@functools.partial(jax.jit, static_argnums=0)
def _derive(S, bucket, color, shape, tc, ts, active, ac, ash, axy, direction, answer):
    """Scene fields implied by scene + question, batched (leading axis B)."""
    return jax.vmap(functools.partial(_derive_one, S))(bucket, color, shape, tc, ts, active, ac,
                                                       ash, axy, direction, answer)


def _derive_one(S, bucket, color, shape, tc, ts, active, ac, ash, axy, direction, answer):
    C = S * S
    take = lambda t: jnp.asarray(t)[bucket]  # noqa: E731
    clause_ids = jnp.arange(U.MAX_CLAUSES)
    clause_on = clause_ids < take(U.BUCKET_N_CLAUSES)
    col, shp = color.reshape(C), shape.reshape(C)
    v_target, conf = jax.vmap(lambda a, d, act: R.clause_regions(a, d, act, S))(
        axy, direction, active)
    v_target = v_target & clause_on[:, None]
    cells = jnp.arange(C)
    at = (cells[None, None, :] == (axy[..., 1] * S + axy[..., 0])[..., None]) \
        & active[..., None]  # [2, K, C]
    anchor_cells = jnp.any(at, axis=(0, 1))
    anchor_clause = jnp.argmax(jnp.any(at, axis=1), axis=0)
    look = jax.vmap(lambda c, s: R.matches(col, shp, c, s))(tc, ts)
    look = look & clause_on[:, None] & ~anchor_cells[None, :]
    counted = look & v_target
    is_t, is_l = counted[0] | counted[1], look[0] | look[1]
    occupied = col >= 0
    role = jnp.select([anchor_cells, is_t, is_l, occupied],
                      [U.ANCHOR, U.TARGET, U.CONFUSER, U.DISTRACTOR], U.EMPTY).astype(jnp.int32)
    clause = jnp.select([anchor_cells, is_t, is_l],
                        [anchor_clause, jnp.where(counted[0], 0, 1), jnp.where(look[0], 0, 1)],
                        -1).astype(jnp.int32)
    mine = clause[None, :] == clause_ids[:, None]  # [2, C]
    count = jnp.sum((role == U.TARGET)[None] & mine, axis=-1).astype(jnp.int32)
    lookalike = (role == U.TARGET) | (role == U.CONFUSER)
    n_lookalike = jnp.sum(lookalike[None] & mine, axis=-1).astype(jnp.int32)
    n_obj = jnp.sum(occupied)
    order = jnp.argsort(jnp.where(occupied, 0, 1) * C + cells)
    obj_valid = cells < n_obj
    xs, ys = R.cell_coords(S)
    obj_xy = jnp.stack([xs[order], ys[order]], -1).astype(jnp.int32)
    obj_box = jnp.concatenate([(obj_xy.astype(jnp.float32) + 0.5) / S,
                               jnp.full((C, 2), 1.0 / S, jnp.float32)], -1)
    obj_box = jnp.where(obj_valid[:, None], obj_box, 0.0)
    tokens, token_role, token_anchor, n_tokens = build_tokens(bucket, tc, ts, ac, ash,
                                                                 direction)
    grid = lambda a: a.reshape(a.shape[:-1] + (S, S))  # noqa: E731
    return Scene(
        bucket=bucket, depth=take(U.BUCKET_DEPTH), qtype=take(U.BUCKET_QTYPE),
        form=take(U.BUCKET_FORM), valid=jnp.bool_(True),
        color=color, shape=shape, role=grid(role), clause=grid(clause),
        obj_valid=obj_valid, obj_xy=obj_xy,
        obj_color=jnp.where(obj_valid, col[order], -1),
        obj_shape=jnp.where(obj_valid, shp[order], -1),
        obj_role=jnp.where(obj_valid, role[order], U.EMPTY), obj_box=obj_box,
        target_color=tc, target_shape=ts, anchor_active=active, anchor_color=ac,
        anchor_shape=ash, anchor_xy=jnp.where(active[..., None], axy, 0),
        direction=jnp.where(active, direction, 0),
        tokens=tokens, token_role=token_role, token_anchor=token_anchor, n_tokens=n_tokens,
        is_yesno=take(U.BUCKET_IS_YESNO), answer=answer, count=count, n_lookalike=n_lookalike,
        gt_cells=grid(anchor_cells | is_t), gt_tokens=token_role > U.FUNCTION,
        v_target=grid(v_target), confuser_region=grid(conf),
    )


def _infer_variant(root: Path, manifest: dict | None) -> str | None:
    if manifest and manifest.get("variant") in U.VARIANTS:
        return manifest["variant"]
    if (root / "direction_shortcut_report_ignore_dir.csv").exists():
        return "pure"  # the official pure generator alone writes the direction reports
    if (root / "spurious_correlation_report.csv").exists():
        return "spur"
    return None


def read_official(root, split: str = "val", scene_source: str = "auto",
                  variant: str | None = None):
    """Read a directory in the official layout (official generator output or ours).

    root: the output root holding ``qa_{split}.jsonl`` and ``grounding_{split}.jsonl``.
    scene_source: "auto" (``sidecar_scene.jsonl`` when present, else decode the PNG),
    "sidecar" or "image" (``render.decode_image``). The official files store only anchors and
    counted targets, so the full scene must come from one of these. variant: override the
    inferred variant.

    Each question is parsed with the official templates (bucket from the folder name, which
    must agree), anchors are located via the npz ``anchor_objects`` (falling back to the unique
    matching object in the scene), and roles, gt_cells, V_target, C_k, tokens and token roles
    are recomputed with ``regions.clause_regions`` and ``questions.build_tokens``; ``answer`` comes
    from the qa file and ``valid`` is True. Both the official 25x25 and our full-resolution
    ``pixel_mask`` are accepted.

    Returns (batch, info, meta): batch a ``Scene`` of numpy arrays with leading axis n (qa
    order), grids S x S with S from the ``g{S}_dXX`` folders (densities may be mixed);
    info an ``OfficialInfo``; meta one dict per sample (image_id, file_name, npz,
    density_key, bucket name, question, scene_source). Raises ValueError naming the file and
    the problem for anything not in the format.
    """
    if scene_source not in ("auto", "sidecar", "image"):
        raise ValueError(f"scene_source must be 'auto', 'sidecar' or 'image', got {scene_source!r}")
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"{root}: not a directory (expected an official GridVQA-X output root)")
    qa_path, gr_path = root / f"qa_{split}.jsonl", root / f"grounding_{split}.jsonl"
    for p in (qa_path, gr_path):
        if not p.is_file():
            have = sorted(x.name for x in root.glob("qa_*.jsonl"))
            raise ValueError(f"{root} is not in the official format: missing {p.name}"
                             + (f" (found {', '.join(have)})" if have else ""))
    manifest = None
    if (root / MANIFEST).is_file():
        try:
            manifest = json.loads((root / MANIFEST).read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{root / MANIFEST}: not valid JSON ({e.msg})") from None
        if not isinstance(manifest, dict) or manifest.get("generator") != GENERATOR:
            manifest = None  # someone else's spec.json: ignore it
    qa = _read_jsonl(qa_path)
    grounding = {}
    for k, g in enumerate(_read_jsonl(gr_path), 1):
        try:
            grounding[int(g["image"]["id"])] = g
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{gr_path}:{k}: no image.id") from None
    if not qa:
        raise ValueError(f"{qa_path}: no samples")
    sidecar = {}
    if scene_source != "image" and (root / SIDECAR).is_file():
        for d in _read_jsonl(root / SIDECAR):
            sidecar[int(d["image_id"])] = d
    if scene_source == "sidecar" and not sidecar:
        raise ValueError(f"{root}: scene_source='sidecar' but {SIDECAR} is missing")

    K = U.MAX_ANCHORS_PER_CLAUSE
    rows, metas, seen, grid_sizes = [], [], set(), {}
    cell_px = None
    for k, q in enumerate(qa, 1):
        where_qa = f"{qa_path}:{k}"
        try:
            image_id, question, answer = int(q["image_id"]), q["question"], q["answer"]
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{where_qa}: a qa line needs image_id, question and answer") from None
        if image_id in seen:
            raise ValueError(f"{where_qa}: duplicate image_id {image_id}")
        seen.add(image_id)
        g = grounding.get(image_id)
        if g is None:
            raise ValueError(f"{where_qa}: image_id {image_id} has no line in {gr_path.name}")
        file_name = str(g["image"].get("file_name", ""))
        fm = _FILE_RE.match(file_name)
        if fm is None:
            raise ValueError(f"{gr_path.name} image {image_id}: file_name {file_name!r} is not "
                             "images/{split}/depth{D}/{QT}/form{F}/g{S}_dXX/{i:06d}.png")
        if fm["split"] != split:
            raise ValueError(f"{gr_path.name} image {image_id}: file_name {file_name!r} is not "
                             f"in split {split!r}")
        where = f"{root / file_name}"
        try:
            bid = U.bucket_id(int(fm["depth"]), fm["qtype"], int(fm["form"]))
        except ValueError as e:
            raise ValueError(f"{where}: bad bucket folder ({e})") from None
        b = U.BUCKETS[bid]
        S = int(fm["grid"])
        grid_sizes.setdefault(S, file_name)
        if len(grid_sizes) > 1:
            raise ValueError(f"{root}: mixed grid sizes: {file_name} vs "
                             f"{grid_sizes[min(grid_sizes)]}; read one grid size at a time")
        try:
            parsed = parse_question(question, bid)
        except ValueError as e:
            raise ValueError(f"{where_qa} (image {image_id}): unparseable question: {e}") from None
        # Answer.
        if b.is_yesno:
            if answer not in ("yes", "no"):
                raise ValueError(f"{where_qa}: {b.name} answers are 'yes'/'no', got {answer!r}")
            ans = 1 if answer == "yes" else 0
        else:
            if isinstance(answer, bool) or not isinstance(answer, int) or answer < 0:
                raise ValueError(f"{where_qa}: {b.name} answers are counts, got {answer!r}")
            ans = answer
        # npz.
        npz_rel = file_name[len("images/"):-len(".png")] + ".npz"
        npz_path = root / npz_rel
        if not npz_path.is_file():
            raise ValueError(f"{npz_path}: npz file missing (image {image_id})")
        try:
            with np.load(npz_path, allow_pickle=True) as z:
                npz = {key: z[key] for key in z.files}
        except Exception as e:  # noqa: BLE001
            raise ValueError(f"{npz_path}: unreadable npz ({e})") from None
        missing = [key for key in NPZ_KEYS if key not in npz]
        if missing:
            raise ValueError(f"{npz_path}: missing keys {missing}")
        cm = npz["cell_mask"]
        if cm.shape != (S, S):
            raise ValueError(f"{npz_path}: cell_mask is {cm.shape} but the folder says "
                             f"g{S} (grid size does not match)")
        pm = npz["pixel_mask"]
        f = pm.shape[0] // S if pm.ndim == 2 else 0
        if (pm.ndim != 2 or pm.shape[0] != pm.shape[1] or f < 1 or pm.shape[0] != f * S
                or not np.array_equal(pm[::f, ::f] != 0, cm != 0)
                or not np.array_equal(pm != 0, np.kron(cm != 0, np.ones((f, f), bool)))):
            raise ValueError(f"{npz_path}: pixel_mask {pm.shape} is not cell_mask upsampled "
                             f"(official 25x25 or full resolution)")
        if str(npz["question"]) != question:
            raise ValueError(f"{npz_path}: npz question {str(npz['question'])!r} differs from "
                             f"the qa line {question!r}")
        anchors_npz = _objects_of(npz["anchor_objects"], f"{npz_path} anchor_objects", S)
        objects_npz = _objects_of(npz["objects"], f"{npz_path} objects", S)
        # Full scene.
        color = np.full((S, S), -1, np.int32)
        shape = np.full((S, S), -1, np.int32)
        side = sidecar.get(image_id)
        if scene_source == "sidecar" and side is None:
            raise ValueError(f"{root / SIDECAR}: no line for image {image_id}")
        png_path = root / file_name
        if side is not None:
            source = "sidecar"
            objs = _objects_of(_obj_array(list(side.get("all_scene_objects") or [])),
                               f"{root / SIDECAR} image {image_id}", S)
            for x, y, c, s_ in objs:
                if color[y, x] >= 0:
                    raise ValueError(f"{root / SIDECAR} image {image_id}: two objects in "
                                     f"cell ({x}, {y})")
                color[y, x], shape[y, x] = c, s_
        else:
            source = "image"
            if not png_path.is_file():
                raise ValueError(f"{png_path}: image missing (image {image_id})")
            from gridvqa_jax.world import render
            img = np.asarray(Image.open(png_path).convert("RGB"))
            if img.shape[0] != img.shape[1] or img.shape[0] % S:
                raise ValueError(f"{png_path}: image {img.shape[1]}x{img.shape[0]} is not a "
                                 f"{S}x{S} grid of square cells (grid size does not match)")
            c_, s_ = render.decode_image(img, S)
            color[:], shape[:] = np.asarray(c_), np.asarray(s_)
        img_px = None
        if png_path.is_file():
            with Image.open(png_path) as im:
                w, h = im.size
            if w != h or w % S:
                raise ValueError(f"{png_path}: image {w}x{h} is not a {S}x{S} grid of square "
                                 "cells (grid size does not match)")
            img_px = w // S
        elif "image" in npz and npz["image"].ndim == 3:
            img_px = npz["image"].shape[0] // S
        if img_px is None:
            raise ValueError(f"{png_path}: image missing (image {image_id})")
        if cell_px is None:
            cell_px = img_px
        elif img_px != cell_px:
            raise ValueError(f"{png_path}: {img_px}-px cells, earlier images had {cell_px}")
        for x, y, c, s_ in objects_npz:
            if (color[y, x], shape[y, x]) != (c, s_):
                raise ValueError(
                    f"{npz_path}: npz object {U.COLORS[c]} {U.SHAPES[s_]} at ({x}, {y}) is not "
                    f"in the scene read from the {source}")
        # Anchors in question order.
        axy = np.zeros((2, K, 2), np.int32)
        used: set[int] = set()
        for c in range(2):
            for i in range(K):
                if parsed["anchor_active"][c, i]:
                    axy[c, i] = _locate(color, shape, anchors_npz, used,
                                        int(parsed["anchor_color"][c, i]),
                                        int(parsed["anchor_shape"][c, i]), str(npz_path))
        rows.append((bid, color, shape, parsed, axy, ans))
        dens = fm["density"]
        metas.append({"image_id": image_id, "file_name": file_name, "npz": npz_rel,
                      "density_key": dens, "density": _density_of(dens), "bucket": b.name,
                      "question": question, "scene_source": source})

    S = next(iter(grid_sizes))
    n = len(rows)
    # Pad to a power of two (repeating sample 0) so that directories of similar size share
    # one compiled _derive; the padding is sliced off again.
    padded = rows + rows[:1] * (_pad_len(n) - n)
    stack = lambda key: np.stack([r[3][key] for r in padded])  # noqa: E731
    out = _derive(
        S, np.array([r[0] for r in padded], np.int32), np.stack([r[1] for r in padded]),
        np.stack([r[2] for r in padded]), stack("target_color"), stack("target_shape"),
        stack("anchor_active"), stack("anchor_color"), stack("anchor_shape"),
        np.stack([r[4] for r in padded]), stack("direction"),
        np.array([r[5] for r in padded], np.int32))
    batch = jax.tree.map(lambda a: np.asarray(a)[:n], out)
    info = OfficialInfo(
        root=str(root), split=split, grid_size=S, cell_px=int(cell_px),
        variant=variant or _infer_variant(root, manifest),
        densities=tuple(sorted({m["density_key"] for m in metas})),
        generator=GENERATOR if manifest else "official", manifest=manifest,
        scene_sources=tuple(sorted({m["scene_source"] for m in metas})))
    return batch, info, metas


def read_official_images(root, meta) -> np.ndarray:
    """The PNGs of samples read by ``read_official`` as uint8 [n, H, W, 3], in meta order."""
    root = Path(root)
    out = []
    for m in meta:
        p = root / m["file_name"]
        if not p.is_file():
            raise ValueError(f"{p}: image missing (image {m['image_id']})")
        out.append(np.asarray(Image.open(p).convert("RGB")))
    return np.stack(out)


def verify_official(batch, info: OfficialInfo, meta, variant: str | None = None) -> dict:
    """``verify.verify`` on a batch from ``read_official``, one spec per density key.

    Returns {check: bool [n]} in batch order (the checks of ``verify.CHECKS`` plus "ok").
    """
    from gridvqa_jax.world import verify as V

    keys = np.array([m["density_key"] for m in meta])
    out = None
    for dk in sorted(set(keys)):
        idx = np.nonzero(keys == dk)[0]
        m = _pad_len(idx.size)  # padded with copies of the first sample: few compiled shapes
        part = jax.tree.map(lambda a: _pad_rows(np.asarray(a)[idx], m), batch)
        res = {k: np.asarray(v)[: idx.size]
               for k, v in V.verify(part, info.spec(dk, variant)).items()}
        if out is None:
            out = {k: np.zeros(len(keys), bool) for k in res}
        for k, v in res.items():
            out[k][idx] = v
    return out
