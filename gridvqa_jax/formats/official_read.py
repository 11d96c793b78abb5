"""Read a directory in the official GridVQA-X release layout (``official_layout``) into Scenes.

Works on the official generators' output and on ours. Reading is three steps, one function
each: read and validate the files of one split (``_SplitReader``: qa/grounding lines, npz,
sidecar or PNG, every problem reported as a ``DatasetError`` naming the file and line), decode
each sample (question parsed with ``official_questions.parse_question``, anchors located, label
decoded), and rebuild full Scenes (``official_scene.build_scenes``).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import numpy as np
from PIL import Image

from mmx_base import grid
from mmx_base.errors import DatasetError, InputError
from gridvqa_jax.formats.official_layout import (ANY_REPORT, FILE_PATTERN, FILE_RE, GENERATOR,
                                                 MANIFEST, NPZ_KEYS, PURE_REPORT, SIDECAR,
                                                 density_of, npz_of_png, obj_array, objects_of)
from gridvqa_jax.formats.official_questions import parse_question
from gridvqa_jax.formats.official_scene import build_scenes, pad_len
from gridvqa_jax.world import render
from gridvqa_jax.world import universe as U
from gridvqa_jax.world import verify as V

SCENE_SOURCES = ("auto", "sidecar", "image")


@dataclasses.dataclass(frozen=True)
class OfficialInfo:
    """What a directory says about its dataset (the spec-like part of ``read_official``).

    grid_size/cell_px: S and pixels per cell; variant: "pure"/"spur" from the caller, our
    manifest or the official report files (the direction-shortcut reports exist only for
    D_pure), None when none of them tells; densities: density keys present ("d07", ...);
    generator: "gridvqa_jax" (manifest present) or "official"; manifest: our ``spec.json`` or
    None; scene_sources: how scenes were obtained ("sidecar"/"image").
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

        variant overrides ``self.variant``; when neither is known, raises DatasetError asking
        for one (verify's confuser and bag-of-words checks depend on it). Its buckets are (0,)
        whatever the directory holds: verify does not read them, and a canonical spec shares
        compiled code across directories.
        """
        if density_key is None:
            if len(self.densities) != 1:
                raise InputError(f"{self.root} mixes densities {self.densities}; name one")
            density_key = self.densities[0]
        variant = variant or self.variant
        if variant is None:
            raise DatasetError(
                f"{self.root}: the dataset variant cannot be told (no {MANIFEST}, no official "
                "report CSVs); pass --variant pure or spur (variant='pure'/'spur')")
        return U.Spec(variant, self.grid_size, density_of(density_key), self.cell_px,
                      buckets=(0,))


# ----------------------------------------------------------------------------------------------
# Files of one split.
# ----------------------------------------------------------------------------------------------
def _read_jsonl(path: Path) -> list[dict]:
    """The JSON objects of a JSON-lines file (blank lines skipped)."""
    out = []
    with open(path) as f:
        for k, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise DatasetError(f"{path}:{k}: not valid JSON ({e.msg})") from None
    return out


def _read_manifest(root: Path) -> dict | None:
    """Our ``spec.json`` manifest, or None when absent or written by another generator."""
    if not (root / MANIFEST).is_file():
        return None
    try:
        manifest = json.loads((root / MANIFEST).read_text())
    except json.JSONDecodeError as e:
        raise DatasetError(f"{root / MANIFEST}: not valid JSON ({e.msg})") from None
    if not isinstance(manifest, dict) or manifest.get("generator") != GENERATOR:
        return None  # someone else's spec.json: ignore it
    return manifest


def _infer_variant(root: Path, manifest: dict | None) -> str | None:
    """The variant our manifest records, else the one the official report files imply."""
    if manifest and manifest.get("variant") in U.VARIANTS:
        return manifest["variant"]
    if (root / PURE_REPORT).exists():
        return "pure"  # the official pure generator alone writes the direction reports
    if (root / ANY_REPORT).exists():
        return "spur"
    return None


def _index_grounding(path: Path) -> dict[int, dict]:
    """Grounding lines by ``image.id``."""
    out = {}
    for k, g in enumerate(_read_jsonl(path), 1):
        try:
            out[int(g["image"]["id"])] = g
        except (KeyError, TypeError, ValueError):
            raise DatasetError(f"{path}:{k}: no image.id") from None
    return out


def _load_npz(path: Path, image_id: int) -> dict:
    """All members of an npz file (object arrays allowed), with the official keys present."""
    if not path.is_file():
        raise DatasetError(f"{path}: npz file missing (image {image_id})")
    try:
        with np.load(path, allow_pickle=True) as z:
            npz = {key: z[key] for key in z.files}
    except Exception as e:  # noqa: BLE001
        raise DatasetError(f"{path}: unreadable npz ({e})") from None
    missing = [key for key in NPZ_KEYS if key not in npz]
    if missing:
        raise DatasetError(f"{path}: missing keys {missing}")
    return npz


def _check_masks(npz: dict, S: int, where: Path):
    """cell_mask is S x S; pixel_mask is cell_mask upsampled (official 25x25 or full size)."""
    cm = npz["cell_mask"]
    if cm.shape != (S, S):
        raise DatasetError(f"{where}: cell_mask is {cm.shape} but the folder says "
                           f"g{S} (grid size does not match)")
    pm = npz["pixel_mask"]
    f = pm.shape[0] // S if pm.ndim == 2 else 0
    if (pm.ndim != 2 or pm.shape[0] != pm.shape[1] or f < 1 or pm.shape[0] != f * S
            or not np.array_equal(pm != 0, grid.upsample(cm != 0, f))):
        raise DatasetError(f"{where}: pixel_mask {pm.shape} is not cell_mask upsampled "
                           f"(official 25x25 or full resolution)")


def _png_cell_px(path: Path, S: int) -> int:
    """Pixels per cell of a PNG holding an S x S grid of square cells."""
    with Image.open(path) as im:
        w, h = im.size
    if w != h or w % S:
        raise DatasetError(f"{path}: image {w}x{h} is not a {S}x{S} grid of square "
                           "cells (grid size does not match)")
    return w // S


def _scene_from_sidecar(side: dict, S: int, where: str) -> tuple[np.ndarray, np.ndarray]:
    """color/shape int32 [S, S] (-1 empty) from a sidecar line's ``all_scene_objects``."""
    color = np.full((S, S), -1, np.int32)
    shape = np.full((S, S), -1, np.int32)
    for x, y, c, s in objects_of(obj_array(list(side.get("all_scene_objects") or [])), where, S):
        if color[y, x] >= 0:
            raise DatasetError(f"{where}: two objects in cell ({x}, {y})")
        color[y, x], shape[y, x] = c, s
    return color, shape


def _scene_from_png(path: Path, S: int, image_id: int) -> tuple[np.ndarray, np.ndarray]:
    """color/shape int32 [S, S] (-1 empty) decoded from the PNG (``render.decode_image``)."""
    if not path.is_file():
        raise DatasetError(f"{path}: image missing (image {image_id})")
    img = np.asarray(Image.open(path).convert("RGB"))
    if img.shape[0] != img.shape[1] or img.shape[0] % S:
        raise DatasetError(f"{path}: image {img.shape[1]}x{img.shape[0]} is not a "
                           f"{S}x{S} grid of square cells (grid size does not match)")
    try:
        c, s = render.decode_image(img, S)
    except ValueError as e:
        raise DatasetError(f"{path}: {e}") from None
    return np.asarray(c, np.int32).reshape(S, S), np.asarray(s, np.int32).reshape(S, S)


def _decode_answer(answer, bucket: U.Bucket, where: str) -> int:
    """The label as in a Scene: the count, or 1 = "yes" / 0 = "no"."""
    if bucket.is_yesno:
        if answer not in ("yes", "no"):
            raise DatasetError(f"{where}: {bucket.name} answers are 'yes'/'no', got {answer!r}")
        return 1 if answer == "yes" else 0
    if isinstance(answer, bool) or not isinstance(answer, int) or answer < 0:
        raise DatasetError(f"{where}: {bucket.name} answers are counts, got {answer!r}")
    return answer


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
        raise DatasetError(f"{where}: cannot locate the anchor '{name}': {len(xs)} matching "
                           "objects in the scene and none left in the npz anchor_objects")
    return int(xs[0]), int(ys[0])


def _anchor_cells(parsed: dict, color, shape, npz_anchors, where: str) -> np.ndarray:
    """int32 [2, K, 2] cells (x, y) of the question's anchors, in question order."""
    K = U.MAX_ANCHORS_PER_CLAUSE
    axy = np.zeros((2, K, 2), np.int32)
    used: set[int] = set()
    for c in range(2):
        for i in range(K):
            if parsed["anchor_active"][c, i]:
                axy[c, i] = _locate(color, shape, npz_anchors, used,
                                    int(parsed["anchor_color"][c, i]),
                                    int(parsed["anchor_shape"][c, i]), where)
    return axy


@dataclasses.dataclass
class _Sample:
    """One decoded sample: what ``build_scenes`` needs, plus its meta dict."""

    bucket: int
    color: np.ndarray  # int32 [S, S]
    shape: np.ndarray  # int32 [S, S]
    question: dict  # parse_question fields
    anchor_xy: np.ndarray  # int32 [2, K, 2]
    answer: int
    meta: dict


class _SplitReader:
    """The files of one split, read and checked sample by sample in qa order.

    Holds what must agree across samples: image ids (unique), the grid size (one per read) and
    the cell size in pixels.
    """

    def __init__(self, root: Path, split: str, scene_source: str):
        if not root.is_dir():
            raise DatasetError(f"{root}: not a directory (expected an official GridVQA-X "
                               "output root)")
        self.root, self.split, self.scene_source = root, split, scene_source
        self.qa_path, self.gr_path = root / f"qa_{split}.jsonl", root / f"grounding_{split}.jsonl"
        for p in (self.qa_path, self.gr_path):
            if not p.is_file():
                have = sorted(x.name for x in root.glob("qa_*.jsonl"))
                raise DatasetError(f"{root} is not in the official format: missing {p.name}"
                                   + (f" (found {', '.join(have)})" if have else ""))
        self.manifest = _read_manifest(root)
        self.qa = _read_jsonl(self.qa_path)
        self.grounding = _index_grounding(self.gr_path)
        if not self.qa:
            raise DatasetError(f"{self.qa_path}: no samples")
        self.sidecar = self._read_sidecar()
        self.seen: set[int] = set()
        self.first_of_grid: dict[int, str] = {}
        self.cell_px: int | None = None

    def _read_sidecar(self) -> dict[int, dict]:
        sidecar = {}
        if self.scene_source != "image" and (self.root / SIDECAR).is_file():
            for d in _read_jsonl(self.root / SIDECAR):
                sidecar[int(d["image_id"])] = d
        if self.scene_source == "sidecar" and not sidecar:
            raise DatasetError(f"{self.root}: scene_source='sidecar' but {SIDECAR} is missing")
        return sidecar

    def _qa_fields(self, q: dict, where: str) -> tuple[int, str, object]:
        """(image_id, question, answer) of a qa line; image ids must be unique."""
        try:
            image_id, question, answer = int(q["image_id"]), q["question"], q["answer"]
        except (KeyError, TypeError, ValueError):
            raise DatasetError(f"{where}: a qa line needs image_id, question and answer") from None
        if image_id in self.seen:
            raise DatasetError(f"{where}: duplicate image_id {image_id}")
        self.seen.add(image_id)
        return image_id, question, answer

    def _image_entry(self, image_id: int, where: str) -> tuple[str, int, int, str]:
        """(file_name, bucket id, grid size, density key) from the image's grounding line."""
        g = self.grounding.get(image_id)
        if g is None:
            raise DatasetError(f"{where}: image_id {image_id} has no line in {self.gr_path.name}")
        file_name = str(g["image"].get("file_name", ""))
        fm = FILE_RE.match(file_name)
        if fm is None:
            raise DatasetError(f"{self.gr_path.name} image {image_id}: file_name {file_name!r} "
                               f"is not {FILE_PATTERN}")
        if fm["split"] != self.split:
            raise DatasetError(f"{self.gr_path.name} image {image_id}: file_name {file_name!r} "
                               f"is not in split {self.split!r}")
        try:
            bid = U.bucket_id(int(fm["depth"]), fm["qtype"], int(fm["form"]))
        except ValueError as e:
            raise DatasetError(f"{self.root / file_name}: bad bucket folder ({e})") from None
        S = int(fm["grid"])
        if S not in self.first_of_grid:
            try:
                U.Spec(grid_size=S, buckets=(0,))  # the grid sizes our Scenes support
            except ValueError as e:
                raise DatasetError(f"{self.root / file_name}: {e}") from None
        self.first_of_grid.setdefault(S, file_name)
        if len(self.first_of_grid) > 1:
            raise DatasetError(f"{self.root}: mixed grid sizes: {file_name} vs "
                               f"{self.first_of_grid[min(self.first_of_grid)]}; read one grid "
                               "size at a time")
        return file_name, bid, S, fm["density"]

    def _npz(self, file_name: str, image_id: int, S: int, question: str):
        """(npz members, declared anchors, declared objects) of a sample, checked."""
        path = self.root / npz_of_png(file_name)
        npz = _load_npz(path, image_id)
        _check_masks(npz, S, path)
        if str(npz["question"]) != question:
            raise DatasetError(f"{path}: npz question {str(npz['question'])!r} differs from "
                               f"the qa line {question!r}")
        return (npz, objects_of(npz["anchor_objects"], f"{path} anchor_objects", S),
                objects_of(npz["objects"], f"{path} objects", S))

    def _scene(self, image_id: int, file_name: str, S: int):
        """(color, shape, source): the full scene from the sidecar, else from the PNG."""
        side = self.sidecar.get(image_id)
        if self.scene_source == "sidecar" and side is None:
            raise DatasetError(f"{self.root / SIDECAR}: no line for image {image_id}")
        if side is not None:
            where = f"{self.root / SIDECAR} image {image_id}"
            return (*_scene_from_sidecar(side, S, where), "sidecar")
        return (*_scene_from_png(self.root / file_name, S, image_id), "image")

    def _check_cell_px(self, file_name: str, npz: dict, S: int, image_id: int):
        """Pixels per cell from the PNG (else the npz image); one value per read."""
        png = self.root / file_name
        if png.is_file():
            px = _png_cell_px(png, S)
        elif "image" in npz and npz["image"].ndim == 3:
            px = npz["image"].shape[0] // S
        else:
            raise DatasetError(f"{png}: image missing (image {image_id})")
        if self.cell_px is None:
            self.cell_px = px
        elif px != self.cell_px:
            raise DatasetError(f"{png}: {px}-px cells, earlier images had {self.cell_px}")

    def sample(self, k: int, q: dict) -> _Sample:
        """Read, check and decode the k-th (1-based) qa line and the files it names."""
        where_qa = f"{self.qa_path}:{k}"
        image_id, question, answer = self._qa_fields(q, where_qa)
        file_name, bid, S, density_key = self._image_entry(image_id, where_qa)
        b = U.BUCKETS[bid]
        try:
            parsed = parse_question(question, bid)
        except ValueError as e:
            raise DatasetError(f"{where_qa} (image {image_id}): unparseable question: "
                               f"{e}") from None
        label = _decode_answer(answer, b, where_qa)
        npz, npz_anchors, npz_objects = self._npz(file_name, image_id, S, question)
        color, shape, source = self._scene(image_id, file_name, S)
        self._check_cell_px(file_name, npz, S, image_id)
        npz_path = self.root / npz_of_png(file_name)
        for x, y, c, s in npz_objects:
            if (color[y, x], shape[y, x]) != (c, s):
                raise DatasetError(
                    f"{npz_path}: npz object {U.COLORS[c]} {U.SHAPES[s]} at ({x}, {y}) is not "
                    f"in the scene read from the {source}")
        axy = _anchor_cells(parsed, color, shape, npz_anchors, str(npz_path))
        meta = {"image_id": image_id, "file_name": file_name, "npz": npz_of_png(file_name),
                "density_key": density_key, "density": density_of(density_key),
                "bucket": b.name, "question": question, "scene_source": source}
        return _Sample(bid, color, shape, parsed, axy, label, meta)


# ----------------------------------------------------------------------------------------------
# Public API.
# ----------------------------------------------------------------------------------------------
def _stack_samples(samples: list[_Sample], S: int):
    """A Scene batch (numpy) of decoded samples, in order."""
    question = {key: np.stack([s.question[key] for s in samples])
                for key in ("target_color", "target_shape", "anchor_active", "anchor_color",
                            "anchor_shape", "direction")}
    return build_scenes(S, np.array([s.bucket for s in samples], np.int32),
                        np.stack([s.color for s in samples]),
                        np.stack([s.shape for s in samples]), question,
                        np.stack([s.anchor_xy for s in samples]),
                        np.array([s.answer for s in samples], np.int32))


def read_official(root, split: str = "val", scene_source: str = "auto",
                  variant: str | None = None):
    """Read a directory in the official layout (official generator output or ours).

    root: the output root holding ``qa_{split}.jsonl`` and ``grounding_{split}.jsonl``.
    scene_source: "auto" (``sidecar_scene.jsonl`` when present, else decode the PNG),
    "sidecar" or "image" (``render.decode_image``). The official files store only anchors and
    counted targets, so the full scene must come from one of these. variant: "pure"/"spur"
    overrides what the directory tells; the data are read the same without it.

    Each question is parsed with the official templates (bucket from the folder name, which
    must agree), anchors are located via the npz ``anchor_objects`` (falling back to the unique
    matching object in the scene), and roles, gt_cells, V_target, C_k, tokens and token roles
    follow from scene and question (``official_scene.build_scenes``); ``answer`` comes from the
    qa file and ``valid`` is True. Both the official 25x25 and our full-resolution
    ``pixel_mask`` are accepted.

    Returns (batch, info, meta): batch a ``Scene`` of numpy arrays with leading axis n (qa
    order), grids S x S with S from the ``g{S}_dXX`` folders (densities may be mixed);
    info an ``OfficialInfo`` (``info.variant`` None when neither the caller, our manifest nor
    the official report files tell it); meta one dict per sample (image_id, file_name, npz,
    density_key, density, bucket name, question, scene_source). Raises DatasetError (a
    ValueError) naming the file, line and problem for anything not in the format.
    """
    if scene_source not in SCENE_SOURCES:
        raise InputError(f"scene_source must be 'auto', 'sidecar' or 'image', got "
                         f"{scene_source!r}")
    if variant is not None and variant not in U.VARIANTS:
        raise InputError(f"unknown variant {variant!r}; known: {', '.join(U.VARIANTS)}")
    root = Path(root)
    reader = _SplitReader(root, split, scene_source)
    samples = [reader.sample(k, q) for k, q in enumerate(reader.qa, 1)]
    metas = [s.meta for s in samples]
    S = next(iter(reader.first_of_grid))
    info = OfficialInfo(
        root=str(root), split=split, grid_size=S, cell_px=int(reader.cell_px),
        variant=variant or _infer_variant(root, reader.manifest),
        densities=tuple(sorted({m["density_key"] for m in metas})),
        generator=GENERATOR if reader.manifest else "official", manifest=reader.manifest,
        scene_sources=tuple(sorted({m["scene_source"] for m in metas})))
    return _stack_samples(samples, S), info, metas


def read_official_images(root, meta) -> np.ndarray:
    """The PNGs of samples read by ``read_official`` as uint8 [n, H, W, 3], in meta order."""
    root = Path(root)
    out = []
    for m in meta:
        p = root / m["file_name"]
        if not p.is_file():
            raise DatasetError(f"{p}: image missing (image {m['image_id']})")
        out.append(np.asarray(Image.open(p).convert("RGB")))
    return np.stack(out)


def _pad_rows(a: np.ndarray, m: int) -> np.ndarray:
    return a if a.shape[0] == m else np.concatenate([a, np.repeat(a[:1], m - a.shape[0], 0)])


def verify_official(batch, info: OfficialInfo, meta, variant: str | None = None) -> dict:
    """``verify.verify`` on a batch from ``read_official``, one spec per density key.

    variant overrides ``info.variant``; one of them must be known (the confuser and
    bag-of-words checks depend on it), else DatasetError. Returns {check: bool [n]} in batch
    order (the checks of ``verify.CHECKS`` plus "ok").
    """
    keys = np.array([m["density_key"] for m in meta])
    out = None
    for dk in sorted(set(keys)):
        idx = np.nonzero(keys == dk)[0]
        m = pad_len(idx.size)  # padded with copies of the first sample: few compiled shapes
        part = jax.tree.map(lambda a: _pad_rows(np.asarray(a)[idx], m), batch)
        res = {k: np.asarray(v)[: idx.size]
               for k, v in V.verify(part, info.spec(dk, variant)).items()}
        if out is None:
            out = {k: np.zeros(len(keys), bool) for k in res}
        for k, v in res.items():
            out[k][idx] = v
    return out


__all__ = ["OfficialInfo", "read_official", "read_official_images", "verify_official",
           "SCENE_SOURCES"]
