"""``load_dataset(path)``: one loader for every dataset layout (native shards, one native
directory per density, or the official release layout)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from gridvqa_jax.formats import native, official


def load_dataset(path, variant=None):
    """Load a dataset directory: native (one manifest, or one per density subdirectory) or
    official layout. Returns a list of (Scene batch, Spec, source description)."""
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"{path} is not a directory")
    if native.is_native(path):
        batch, spec, _ = native.load_native(path)
        if variant:
            spec = _with_variant(spec, variant)
        return [(batch, spec, f"native {path}")]
    subs = sorted(p for p in path.iterdir() if p.is_dir() and native.is_native(p))
    if subs:
        return [x for p in subs for x in load_dataset(p, variant)]
    batch, info, meta = official.read_official(path, variant=variant)
    dens = np.array([m["density_key"] for m in meta])
    out = []
    for dkey in info.densities:
        idx = np.flatnonzero(dens == dkey)
        sub = take_samples(batch, idx)
        out.append((sub, info.spec(dkey), f"official {path} ({dkey}, {info.generator})"))
    return out


def take_samples(batch, idx):
    """The samples ``idx`` (an index array or a slice) of a Scene batch, as host numpy arrays."""
    return type(batch)(**{f.name: np.asarray(getattr(batch, f.name))[idx]
                          for f in dataclasses.fields(batch)})


def iter_batches(batch, size: int):
    """Consecutive sub-batches of ``size`` samples (the last may be shorter)."""
    n = len(batch.bucket)
    for i in range(0, n, size):
        yield take_samples(batch, slice(i, i + size))


def _with_variant(spec, variant):
    return dataclasses.replace(spec, variant=variant)


__all__ = ["load_dataset", "take_samples", "iter_batches"]
