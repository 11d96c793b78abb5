"""``load_dataset(path)``: one loader for every dataset layout (native shards, one native
directory per density, or the official release layout)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import NamedTuple

import jax
import numpy as np

from mmx_base.errors import DatasetError, InputError
from gridvqa_jax.formats import native, official
from gridvqa_jax.world import universe as U

LAYOUTS = (f"a native dataset ({native.MANIFEST}), native datasets in subdirectories, or the "
           "official layout (qa_<split>.jsonl + grounding_<split>.jsonl)")


class DatasetPart(NamedTuple):
    """The samples of one density of a dataset.

    batch: a ``Scene`` of host numpy arrays (leading axis n); density_key: "d03", "d07", ...;
    variant: "pure" / "spur", or None when nothing records it (an official-generator folder
    without its report files); source: where the samples came from, for messages; layout: the
    grid size, density and render cell size of the samples as a ``Spec`` whose variant is not
    meaningful (use ``spec()``).
    """

    batch: object
    density_key: str
    variant: str | None
    source: str
    layout: U.Spec

    @property
    def grid_size(self) -> int:
        return self.layout.grid_size

    def spec(self, variant: str | None = None) -> U.Spec:
        """The ``Spec`` of these samples for ``verify`` and ``stats``, for ``variant``
        (default: the recorded one; DatasetError when neither is known)."""
        variant = variant or self.variant
        if variant is None:
            raise DatasetError(f"{self.source}: variant unknown (no manifest, no report files); "
                               "pass --variant pure or --variant spur")
        return dataclasses.replace(self.layout, variant=variant)


def load_dataset(path, variant: str | None = None) -> list[DatasetPart]:
    """Load a dataset directory: native (one manifest, or one per density subdirectory) or the
    official layout. ``variant`` overrides the recorded variant.

    Returns one ``DatasetPart`` per density (native: per directory). Raises ``DatasetError``
    naming the path and the problem when ``path`` is missing, not a directory, empty, in no
    known layout, or malformed.
    """
    path = Path(path)
    if variant is not None and variant not in U.VARIANTS:
        raise DatasetError(f"unknown variant {variant!r}; known: {', '.join(U.VARIANTS)}")
    if not path.exists():
        raise DatasetError(f"{path} is not a directory (it does not exist); expected {LAYOUTS}")
    if not path.is_dir():
        raise DatasetError(f"{path} is a file, not a dataset directory; expected {LAYOUTS}")
    if not any(path.iterdir()):
        raise DatasetError(f"{path} is empty; expected {LAYOUTS}")
    if native.is_native(path):
        return [_native_part(path, variant)]
    subs = sorted(p for p in path.iterdir() if p.is_dir() and native.is_native(p))
    if subs:
        return [_native_part(p, variant) for p in subs]
    if not any(path.glob("qa_*.jsonl")):
        raise DatasetError(f"{path} holds no dataset; expected {LAYOUTS}")
    try:
        batch, info, meta = official.read_official(path, variant=variant)
    except DatasetError:
        raise
    except (ValueError, KeyError, TypeError, OSError) as e:
        raise DatasetError(_named(path, e, "a line")) from None
    dens = np.array([m["density_key"] for m in meta])
    # The variant is not known for every folder; the layout spec takes a placeholder.
    return [DatasetPart(take_samples(batch, np.flatnonzero(dens == dk)), dk, info.variant,
                        f"official {path} ({dk}, {info.generator})",
                        info.spec(dk, info.variant or U.VARIANTS[0]))
            for dk in info.densities]


def infer_variant(parts: list[DatasetPart], chunk: int = 8192) -> tuple[list[DatasetPart], str]:
    """``parts`` with every unknown variant filled in from the samples, and how it was found.

    The variants differ in one condition each (GridVQA-X): D_pure puts a target look-alike in
    every confuser region C_k, D_spur makes the bag-of-words answer (count every look-alike,
    ignore relations) exact. One ``verify.analyse_batch`` pass measures both on every sample.
    If all samples meet exactly one condition, that is the variant; if they meet both, the
    verdicts of ``verify`` are the same under either and "pure" is used; if they meet neither,
    the variant cannot be told and DatasetError asks for it. Returns (parts, how): how is
    "recorded" when nothing was unknown, else a sentence for the user.
    """
    from gridvqa_jax.world import verify as V

    unknown = [p for p in parts if p.variant is None]
    if not unknown:
        return parts, "recorded"
    n = pure_fail = spur_fail = 0
    for part in unknown:
        spec = part.spec(U.VARIANTS[0])
        for chunk_ in iter_batches(part.batch, chunk):
            a = V.analyse_batch(chunk_, spec)
            pure_fail += int(np.sum(~np.asarray(a["confusers"])))
            spur_fail += int(np.sum(~np.asarray(a["bow_correct"])))
            n += len(chunk_.bucket)
    if pure_fail and spur_fail:
        raise DatasetError(
            f"{unknown[0].source}: variant unknown (no manifest, no report files) and the "
            f"samples fit neither: {pure_fail} of {n} lack a confuser look-alike (D_pure), "
            f"{spur_fail} of {n} are not answered by bag-of-words (D_spur); pass --variant "
            "pure or --variant spur")
    variant = "spur" if pure_fail else "pure"
    if pure_fail:
        how = "inferred from the samples: bag-of-words answers every one (D_spur)"
    elif spur_fail:
        how = "inferred from the samples: every confuser region holds a target look-alike (D_pure)"
    else:
        how = ("inferred from the samples: they meet both the D_pure and the D_spur condition, "
               "so the checks agree under either")
    return [p._replace(variant=p.variant or variant) for p in parts], how


def _native_part(path: Path, variant: str | None) -> DatasetPart:
    try:
        batch, spec, _ = native.load_native(path)
    except DatasetError:
        raise
    # A manifest with a missing or mistyped key fails as KeyError / TypeError.
    except (ValueError, KeyError, TypeError, OSError) as e:
        raise DatasetError(_named(path, e, native.MANIFEST)) from None
    return DatasetPart(batch, spec.density_key, variant or spec.variant, f"native {path}", spec)


def _named(path: Path, e: BaseException, holder: str) -> str:
    """The message of a reader's exception, prefixed with ``path`` unless it names it;
    ``holder`` names what a missing key was missing from."""
    if isinstance(e, KeyError):
        text = f"{holder} lacks the key {e}"
    elif isinstance(e, OSError) and e.strerror:
        text = f"{e.filename}: {e.strerror}"
    else:
        text = str(e) or type(e).__name__
    return text if str(path) in text else f"{path}: {text}"


def load_density(path, variant: str, density_key: str = "d07", grid_size: int = 5):
    """The ``density_key`` samples of the dataset at ``path`` as one numpy ``Scene`` batch: any
    layout ``load_dataset`` reads (native shards, one native directory per density, the official
    release), its parts of that density concatenated in load order (native: the directory's
    sample order; official: ``qa_<split>.jsonl`` line order restricted to that density).
    ``variant`` ("pure" / "spur"): what the caller needs; a dataset that records another variant
    is refused. Raises ``InputError`` naming the path when the dataset holds no ``density_key``
    samples, another variant or another grid size, ``DatasetError`` for a malformed one."""
    parts = load_dataset(path)
    have = sorted({p.density_key for p in parts})
    parts = [p for p in parts if p.density_key == density_key]
    if not parts:
        raise InputError(f"{path}: no {density_key} samples (densities: {', '.join(have)})")
    recorded = sorted({p.variant for p in parts} - {None})
    if recorded and recorded != [variant]:
        raise InputError(f"{path}: a D_{'/'.join(recorded)} dataset, but this regime needs "
                         f"D_{variant}")
    sizes = sorted({p.grid_size for p in parts})
    if sizes != [grid_size]:
        raise InputError(f"{path}: {'/'.join(map(str, sizes))}x grids; the models read "
                         f"{grid_size}x{grid_size}")
    return jax.tree.map(lambda *xs: np.concatenate(xs), *[p.batch for p in parts])


def take_samples(batch, idx):
    """The samples ``idx`` (an index array or a slice) of a Scene batch, as host numpy arrays."""
    return type(batch)(**{f.name: np.asarray(getattr(batch, f.name))[idx]
                          for f in dataclasses.fields(batch)})


def iter_batches(batch, size: int):
    """Consecutive sub-batches of ``size`` samples (the last may be shorter)."""
    n = len(batch.bucket)
    for i in range(0, n, size):
        yield take_samples(batch, slice(i, i + size))


__all__ = ["DatasetPart", "load_dataset", "infer_variant", "load_density", "take_samples",
           "iter_batches",
           "LAYOUTS"]
