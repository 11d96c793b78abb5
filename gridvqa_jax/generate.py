"""Batched, device-sharded generation of GridVQA-X datasets.

Sample i of a dataset with seed s is ``sample(fold_in(key(s), i), spec, spec.buckets[i % nb])``:
a function of (seed, i) alone, so any chunking, batch size or device count yields the same data.
Batches are laid out over a 1-D ``jax.sharding`` mesh (axis "data"); the vmapped sampler is
elementwise, so one global-view ``jit`` runs each device's share with no communication.
"""

from __future__ import annotations

import os
from typing import Iterator

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from gridvqa_jax import scenes
from gridvqa_jax import universe as U


def use_one_cpu_device_per_core() -> bool:
    """Ask JAX for one XLA:CPU device per available core; call before JAX's first operation.

    Generation is elementwise over samples, and XLA:CPU's own threading keeps only ~1.1 of two
    cores busy on the sampler's many small fusions (measured); with one device per core the
    ``data_mesh`` gives each core its shard. Has no effect (returns False) when JAX's backend
    is already running, or when the device count is already set by ``jax_num_cpu_devices`` or
    ``XLA_FLAGS=--xla_force_host_platform_device_count``. Samples do not depend on it.
    """
    if ("xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", "")
            or jax.config.jax_num_cpu_devices > 0):
        return False
    try:
        jax.config.update("jax_num_cpu_devices", len(os.sched_getaffinity(0)))
    except RuntimeError:  # the backend already exists; its device count is fixed
        return False
    return True


def data_mesh(devices=None) -> jax.sharding.Mesh:
    """A 1-D mesh named ('data',) over ``devices`` (default: all local devices)."""
    devices = jax.devices() if devices is None else devices
    return jax.sharding.Mesh(np.asarray(devices), ("data",))


def generate_chunk(spec: U.Spec, seed: int, start: int, n: int, mesh=None) -> scenes.Scene:
    """Samples start..start+n-1 of the dataset (spec, seed) as a Scene batch (leading axis n).

    With a mesh, the batch is padded to a multiple of the device count, sharded along 'data',
    generated, and trimmed back to n (on device, still sharded where n allows it).
    """
    if n <= 0:
        raise ValueError(f"number of samples must be positive, got {n}")
    mesh = data_mesh() if mesh is None else mesh
    n_dev = mesh.devices.size
    padded = -(-n // n_dev) * n_dev
    keys = scenes.sample_keys(seed, start, padded)
    buckets = scenes.bucket_ids(spec, start, padded)
    sharding = NamedSharding(mesh, P("data"))
    keys, buckets = jax.device_put((keys, buckets), sharding)
    out = scenes.sample_batch(keys, spec, buckets)
    return out if padded == n else jax.tree.map(lambda a: a[:n], out)


def iter_chunks(spec: U.Spec, seed: int, n: int, chunk: int = 8192, start: int = 0,
                mesh=None) -> Iterator[tuple[int, scenes.Scene]]:
    """Yield (offset, Scene batch) chunks covering samples start..start+n-1 in order."""
    if chunk <= 0:
        raise ValueError(f"chunk size must be positive, got {chunk}")
    for off in range(start, start + n, chunk):
        yield off, generate_chunk(spec, seed, off, min(chunk, start + n - off), mesh)


def to_numpy(batch):
    """Host copy of a (possibly sharded) pytree."""
    return jax.tree.map(np.asarray, jax.device_get(batch))


def concat(batches):
    """Concatenate Scene batches along the leading axis (host side)."""
    return jax.tree.map(lambda *xs: np.concatenate([np.asarray(x) for x in xs]), *batches)


def scene_digest(batch) -> str:
    """SHA-256 over every field of a Scene batch: a cheap identity check across runs/devices."""
    import hashlib

    h = hashlib.sha256()
    for leaf in jax.tree.leaves(to_numpy(batch)):
        h.update(np.ascontiguousarray(leaf).tobytes())
    return h.hexdigest()


__all__ = ["use_one_cpu_device_per_core", "data_mesh", "generate_chunk", "iter_chunks",
           "to_numpy", "concat", "scene_digest"]
