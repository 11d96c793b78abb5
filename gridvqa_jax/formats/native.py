"""Native on-disk format for large GridVQA-X datasets: sharded .npz arrays + a JSON manifest.

Layout of a dataset directory::

    manifest.json          {"format": "gridvqa-native", "version": 1, "spec": {...}, "seed": s,
                            "n": n, "fields": {name: [dtype, shape]}, "shards": [{file, start, n}]}
    shard-000000.npz       every Scene field for samples [start, start+n), no pickled objects

Everything loads with ``allow_pickle=False``. Images are not stored: they are a deterministic
function of the scene (``render``), cheaper to recompute than to read at 300 KB each. A writer
builds the directory under a temporary name and renames it when complete, so an interrupted
write leaves nothing that looks like a dataset.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path

import numpy as np

from gridvqa_jax.world.scene import Scene
from mmx_base import staging
from gridvqa_jax.world import universe as U

FORMAT = "gridvqa-native"
VERSION = 1
MANIFEST = "manifest.json"


@contextlib.contextmanager
def staged_dir(out_dir):
    """Yield a temporary sibling directory that is renamed to ``out_dir`` on success and
    removed on an exception. ``out_dir`` must not exist or be empty."""
    tmp = staging.make_staging(out_dir)
    try:
        yield tmp
    except BaseException:
        staging.discard(tmp)
        raise
    staging.publish(tmp, out_dir)


class NativeWriter(staging.StagedWriter):
    """Incremental writer: ``add(batch)`` per chunk in sample order, then ``close()``.

    Use as a context manager; on an exception the temporary directory is removed. With
    ``atomic=False`` it writes straight into ``out_dir`` (for use inside ``staged_dir``).
    """

    def __init__(self, out_dir, spec: U.Spec, seed: int, meta: dict | None = None,
                 atomic: bool = True):
        self.out_dir, self.spec, self.seed = Path(out_dir), spec, int(seed)
        self.meta, self.atomic = dict(meta or {}), atomic
        if atomic:
            self.tmp = staging.make_staging(self.out_dir)
        else:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            if any(self.out_dir.iterdir()):
                raise ValueError(f"output directory {self.out_dir} is not empty")
            self.tmp = self.out_dir
        self.shards, self.fields, self.n = [], None, 0

    def add(self, batch: Scene):
        """Append a Scene batch (leading axis n) as the next shard; every batch must have the
        same fields, dtypes and per-sample shapes as the first (ValueError otherwise)."""
        arrays = {f.name: np.asarray(getattr(batch, f.name)) for f in dataclasses.fields(batch)}
        n = len(arrays["bucket"])
        fields = {k: [str(v.dtype), list(v.shape[1:])] for k, v in arrays.items()}
        if self.fields is None:
            self.fields = fields
        elif fields != self.fields:
            raise ValueError("all batches of a native dataset must have the same fields and shapes")
        name = f"shard-{len(self.shards):06d}.npz"
        np.savez(self.tmp / name, **arrays)
        self.shards.append({"file": name, "start": self.n, "n": n})
        self.n += n

    def close(self) -> Path:
        """Write the manifest, then (atomic mode) rename the staging directory to ``out_dir``;
        returns ``out_dir``."""
        if self.n == 0:
            raise ValueError("refusing to write an empty dataset")
        manifest = {"format": FORMAT, "version": VERSION, "spec": self.spec.to_json(),
                    "seed": self.seed, "n": self.n, "fields": self.fields, "shards": self.shards,
                    **self.meta}
        (self.tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
        if self.atomic:
            staging.publish(self.tmp, self.out_dir)
        return self.out_dir

    def abort(self):
        """Atomic mode: remove the staging directory, so ``out_dir`` never appears. Otherwise
        (inside ``staged_dir``) the enclosing stage cleans up."""
        if self.atomic:
            staging.discard(self.tmp)


def is_native(path) -> bool:
    """True if ``path`` is a directory holding a native manifest."""
    return (Path(path) / MANIFEST).is_file()


def read_manifest(path) -> dict:
    """Parsed, checked manifest of a native dataset; ValueError naming the problem otherwise."""
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"{path} is not a directory")
    mf = path / MANIFEST
    if not mf.is_file():
        raise ValueError(f"{path} is not a native GridVQA-X dataset: {MANIFEST} is missing")
    try:
        manifest = json.loads(mf.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{mf} is not valid JSON: {e}") from None
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{mf} has format {manifest.get('format')!r}, expected {FORMAT!r}")
    if manifest.get("version") != VERSION:
        raise ValueError(f"{mf} has version {manifest.get('version')!r}, expected {VERSION}")
    return manifest


def load_native(path) -> tuple[Scene, U.Spec, dict]:
    """Load a native dataset: (Scene batch of numpy arrays, Spec, manifest)."""
    path = Path(path)
    manifest = read_manifest(path)
    spec = U.Spec.from_json(manifest["spec"])
    names = [f.name for f in dataclasses.fields(Scene)]
    parts = {k: [] for k in names}
    for shard in manifest["shards"]:
        f = path / shard["file"]
        if not f.is_file():
            raise ValueError(f"{path}: shard {shard['file']} listed in the manifest is missing")
        try:
            with np.load(f, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        except Exception as e:  # BadZipFile, truncated data, pickled objects, ...
            raise ValueError(f"{f} is not a readable .npz shard: {e}") from None
        missing = set(names) - set(arrays)
        if missing:
            raise ValueError(f"{f} lacks fields {sorted(missing)}")
        for k in names:
            if len(arrays[k]) != shard["n"]:
                raise ValueError(f"{f}: field {k} has {len(arrays[k])} rows, manifest says "
                                 f"{shard['n']}")
            parts[k].append(arrays[k])
    batch = Scene(**{k: np.concatenate(v) for k, v in parts.items()})
    if len(batch.bucket) != manifest["n"]:
        raise ValueError(f"{path}: shards hold {len(batch.bucket)} samples, manifest says "
                         f"{manifest['n']}")
    return batch, spec, manifest
