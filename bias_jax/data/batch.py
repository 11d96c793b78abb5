"""The one batch structure every data source produces, and the host-side record -> batch step.

Conventions (Fakeddit's 2-way label):

- ``label``: 1 = real (true), 0 = fake.
- ``bias``: 0 = Uni-image, 1 = Modality-balance, 2 = Uni-text (``BIAS_TYPES``), -1 = unknown
  (every real benchmark sample: the bias type is what the views estimate).
- ``fine_label``: the source's finer class, -1 unknown. Fakeddit: the 6-way (or 3-way) label;
  MMFakeBench: ``fake_cls`` in ``FINE_MMFAKEBENCH`` order; closed world: the same MMFakeBench
  coding (0 original/real, 1 textual distortion = false Uni-text claim, 2 visual distortion =
  manipulated Uni-image scene, 3 mismatch = claim false of this scene, Modality-balance).
- causal-view ground truth (the paper's E, C, W, R; closed world only, ``has_gt``):
  ``image_core`` = core entity E (pixels), irrelevant content C = the rest of the image;
  ``text_core`` = core words W, irrelevant words R = the other non-PAD tokens. For real data
  ``has_gt`` is False and the masks are all False.

Records (``Record``) are what the real-data readers return: paths and labels, no pixels, so a
600k-row benchmark can be split (``split.py``) before any image is decoded, and the chosen
records decoded a chunk at a time (``iter_batches``).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
from typing import Iterator, Sequence

import flax.struct
import jax
import numpy as np
from PIL import Image, UnidentifiedImageError

from bias_jax.data.text import PAD_ID, Vocab
from mmx_base.trees import to_numpy  # noqa: F401  (re-exported: batch.to_numpy)

BIAS_TYPES = ("uni_image", "balance", "uni_text")
UNI_IMAGE, BALANCE, UNI_TEXT, UNKNOWN_BIAS = 0, 1, 2, -1
REAL, FAKE = 1, 0
FINE_MMFAKEBENCH = ("original", "textual_veracity_distortion", "visual_veracity_distortion",
                    "mismatch")


@flax.struct.dataclass
class Batch:
    """B samples (numpy or jax arrays; a pytree, so it passes through jit/vmap/device_put)."""

    image: jax.Array  # uint8 [B, H, W, 3] RGB
    tokens: jax.Array  # int32 [B, L]: word ids, PAD_ID (0) after the text
    label: jax.Array  # int32 [B]: 1 real, 0 fake
    bias: jax.Array  # int32 [B]: 0 uni_image, 1 balance, 2 uni_text, -1 unknown
    fine_label: jax.Array  # int32 [B]: source-specific finer class (module docstring), -1 unknown
    image_core: jax.Array  # bool [B, H, W]: core entity E (all False when not has_gt)
    text_core: jax.Array  # bool [B, L]: core words W (all False when not has_gt)
    has_gt: jax.Array  # bool [B]: causal ground truth known (closed world)
    index: jax.Array  # int32 [B]: sample index in its source (row, list position, sample id)

    @property
    def size(self) -> int:
        """Number of samples B (leading axis of ``label``)."""
        return int(self.label.shape[0])

    @property
    def image_irrelevant(self):
        """bool [B, H, W]: irrelevant visual content C = the image outside E (where known)."""
        return self.has_gt[:, None, None] & ~self.image_core

    @property
    def text_irrelevant(self):
        """bool [B, L]: irrelevant words R = non-PAD tokens outside W (where known)."""
        return self.has_gt[:, None] & (self.tokens != PAD_ID) & ~self.text_core


# dtype and rank of every field; the leading axis is the batch.
FIELDS = {"image": (np.uint8, 4), "tokens": (np.int32, 2), "label": (np.int32, 1),
          "bias": (np.int32, 1), "fine_label": (np.int32, 1), "image_core": (np.bool_, 3),
          "text_core": (np.bool_, 2), "has_gt": (np.bool_, 1), "index": (np.int32, 1)}


def validate(batch: Batch) -> Batch:
    """Check dtypes, ranks and matching sizes; raises ValueError naming the field."""
    b = batch.label.shape[0]
    for name, (dtype, rank) in FIELDS.items():
        a = getattr(batch, name)
        if a.dtype != dtype or a.ndim != rank or a.shape[0] != b:
            raise ValueError(f"Batch.{name}: expected {np.dtype(dtype).name} rank {rank} with "
                             f"{b} rows, got {a.dtype} {tuple(a.shape)}")
    if batch.image.shape[-1] != 3 or batch.image.shape[1:3] != batch.image_core.shape[1:]:
        raise ValueError(f"Batch.image {tuple(batch.image.shape)} and image_core "
                         f"{tuple(batch.image_core.shape)} disagree")
    if batch.tokens.shape != batch.text_core.shape:
        raise ValueError(f"Batch.tokens {tuple(batch.tokens.shape)} and text_core "
                         f"{tuple(batch.text_core.shape)} disagree")
    return batch


def take(batch: Batch, idx) -> Batch:
    """Rows ``idx`` of a batch (host side)."""
    idx = np.asarray(idx)
    return jax.tree.map(lambda a: np.asarray(a)[idx], batch)


def concat(batches: Sequence[Batch]) -> Batch:
    """Concatenate batches along the leading axis (host side)."""
    if not batches:
        raise ValueError("concat needs at least one batch")
    return jax.tree.map(lambda *xs: np.concatenate([np.asarray(x) for x in xs]), *batches)


# ----------------------------------------------------------------------------------------------
# Real-data records.
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Record:
    """One real benchmark sample before decoding: text, image path and labels."""

    uid: str  # Fakeddit ``id``; MMFakeBench ``image_path`` as written in its JSON
    text: str
    image_path: str
    label: int  # 1 real, 0 fake
    fine_label: int  # source-specific (see the module docstring)
    row: int  # Fakeddit: line number in the TSV (header = 1); MMFakeBench: list index


@dataclasses.dataclass
class LoadReport:
    """What a reader kept and why it skipped the rest (per reason counts, first examples)."""

    path: str
    n_rows: int = 0  # data rows / entries seen
    n_kept: int = 0
    skipped: dict[str, int] = dataclasses.field(default_factory=dict)
    examples: list[str] = dataclasses.field(default_factory=list)  # first messages, for humans
    max_examples: int = 20

    def skip(self, reason: str, where: str, detail: str = "") -> None:
        """Count one skipped row under ``reason``; while fewer than ``max_examples`` are kept,
        also record ``"where: reason (detail)"`` in ``examples``."""
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        if len(self.examples) < self.max_examples:
            self.examples.append(f"{where}: {reason}" + (f" ({detail})" if detail else ""))

    @property
    def n_skipped(self) -> int:
        """Rows skipped, over all reasons."""
        return sum(self.skipped.values())

    def to_json(self) -> dict:
        """JSON-ready dict: path, counts, per-reason skips and examples (not ``max_examples``)."""
        return {"path": self.path, "n_rows": self.n_rows, "n_kept": self.n_kept,
                "skipped": dict(self.skipped), "examples": list(self.examples)}


def image_readable(path: str) -> str | None:
    """None when Pillow can identify the file as an image, else the reason (header only)."""
    try:
        with Image.open(path) as im:
            im.verify()
        return None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        return f"{type(e).__name__}: {e}"


def image_skip_reason(path: str, check_images: bool) -> tuple[str, str] | None:
    """Why a record's image must be skipped, as (reason, detail), or None when it is usable.

    The shared row check of every loader: the file must exist and, with ``check_images``,
    Pillow must identify it."""
    if not os.path.isfile(path):
        return "missing image", path
    if check_images:
        problem = image_readable(path)
        if problem:
            return "unreadable image", f"{path}: {problem}"
    return None


def load_image(path: str, image_size) -> np.ndarray:
    """uint8 [H, W, 3]: the file decoded to RGB and resized (bilinear, aspect not kept).

    ``image_size``: int (square) or (H, W). Raises ValueError naming the file when Pillow
    cannot decode it.
    """
    h, w = (image_size, image_size) if np.isscalar(image_size) else image_size
    try:
        with Image.open(path) as im:
            im = im.convert("RGB").resize((int(w), int(h)), Image.BILINEAR)
            return np.asarray(im, np.uint8)
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        raise ValueError(f"cannot decode image {path}: {e}") from None


def records_to_batch(records: Sequence[Record], vocab: Vocab, *, image_size=64,
                     max_len: int = 32) -> Batch:
    """Decode, resize and tokenize ``records`` into one ``Batch`` (numpy, host side).

    ``bias`` is -1 and ``has_gt`` False: real benchmarks carry no bias or causal ground truth.
    """
    if not records:
        raise ValueError("records_to_batch: no records (empty dataset)")
    images = np.stack([load_image(r.image_path, image_size) for r in records])
    b, h, w = images.shape[:3]
    return validate(Batch(
        image=images,
        tokens=vocab.encode_batch([r.text for r in records], max_len),
        label=np.asarray([r.label for r in records], np.int32),
        bias=np.full(b, UNKNOWN_BIAS, np.int32),
        fine_label=np.asarray([r.fine_label for r in records], np.int32),
        image_core=np.zeros((b, h, w), bool),
        text_core=np.zeros((b, max_len), bool),
        has_gt=np.zeros(b, bool),
        index=np.asarray([r.row for r in records], np.int32),
    ))


def iter_batches(records: Sequence[Record], vocab: Vocab, chunk: int = 256, *, image_size=64,
                 max_len: int = 32, bias=None, prefetch: bool = True) -> Iterator[Batch]:
    """``records_to_batch`` of ``records[s : s + chunk]`` for s = 0, chunk, 2 chunk, ...: the
    records decoded one chunk at a time, in order (every chunk holds ``chunk`` samples but the
    last, which holds the rest), so a consumer that keeps only per-sample results needs memory
    for about two chunks of pixels whatever ``len(records)`` is.

    ``bias``: optional int [len(records)] (e.g. human labels aligned to the records), each
    chunk's ``bias`` field (default -1, unknown). With ``prefetch`` the next chunk is decoded in
    a background thread while the consumer works on the current one (Pillow releases the GIL
    while decoding); a decoding error is raised when its chunk is reached. Stopping early
    (closing the generator) waits for the chunk in flight and decodes nothing further."""
    if chunk < 1:
        raise ValueError(f"iter_batches: chunk must be >= 1, got {chunk}")
    n = len(records)
    if bias is not None:
        bias = np.asarray(bias, np.int32)
        if bias.shape != (n,):
            raise ValueError(f"iter_batches: bias has shape {bias.shape}, expected ({n},)")

    def decode(s: int) -> Batch:
        b = records_to_batch(records[s:s + chunk], vocab, image_size=image_size, max_len=max_len)
        return b if bias is None else b.replace(bias=bias[s:s + chunk])

    starts = range(0, n, chunk)
    if not prefetch:
        for s in starts:
            yield decode(s)
        return
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        nxt = pool.submit(decode, starts[0]) if n else None
        for i in range(len(starts)):
            cur = nxt.result()
            nxt = pool.submit(decode, starts[i + 1]) if i + 1 < len(starts) else None
            try:
                yield cur
            except GeneratorExit:
                if nxt is not None:
                    nxt.cancel()
                raise


def resolve_dir(path, what: str) -> str:
    """``path`` as a str if it is an existing directory, else FileNotFoundError naming it."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{what} directory not found: {path}")
    return path
