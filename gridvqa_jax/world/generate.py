"""Batched, device-sharded generation of GridVQA-X datasets.

Sample i of a dataset with seed s is ``sample(fold_in(key(s), i), spec, spec.buckets[i % nb])``:
a function of (seed, i) alone, so any chunking, batch size or device count yields the same data.
Batches are laid out over a 1-D ``jax.sharding`` mesh (axis "data"); the vmapped sampler is
elementwise, so one global-view ``jit`` runs each device's share with no communication.
"""

from __future__ import annotations

import functools
from typing import Iterator

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from mmx_base.batching import chunked_vmap
from mmx_base.mesh import data_mesh, use_one_cpu_device_per_core  # noqa: F401  (re-exported)
from mmx_base.trees import to_numpy  # re-exported: generate.to_numpy
from gridvqa_jax.world import sampler as SA
from gridvqa_jax.world import universe as U
from gridvqa_jax.world.scene import Scene

CHUNK = 16384  # samples per step of the batched draw program (mmx_base.batching)
# lanes that the reproduction's small draws (Table 1's regimes, Table 2's buckets, the accuracy
# sets) round up to (``sample_lanes``, ``generate_chunk(lanes=)``): one compiled program per
# spec serves them all
DRAW_LANES = 256


def _draw_lanes(keys, spec: U.Spec, buckets, attempts):
    """vmapped ``_draw`` with a per-lane attempt number (int32 [B]), ``CHUNK`` lanes at a time."""
    return chunked_vmap(lambda k, b, a: SA.draw(SA.attempt_key(k, a), spec, b),
                        (keys, buckets, attempts), CHUNK)


def _draw_until_valid(keys, spec: U.Spec, buckets):
    """Every lane's first valid attempt (``sample``'s result), in one program.

    Attempt 0 runs for all lanes; then, while some lane is invalid and has attempts left, up to
    R of them (found with a fixed-size ``nonzero``) are re-drawn with their next attempt and
    written back; padding entries of the re-draw write nowhere (``mode='drop'``).
    R = min(B, max(64, B/64)): a few percent of attempts fail on a 5x5 grid, so a few rounds of R lanes
    re-draw them (a smaller R needs more rounds, a larger one leaves more lanes idle).
    Returns the draw dict plus ``attempt`` int32 [B]; lanes that used up ``sampler.MAX_ATTEMPTS`` stay
    ``valid`` False.
    """
    n = keys.shape[0]
    out = _draw_lanes(keys, spec, buckets, jnp.zeros(n, jnp.int32))
    r = min(n, max(64, n // 64))

    def pending(state):
        out, attempt = state
        return ~out["valid"] & (attempt < SA.MAX_ATTEMPTS - 1)

    def retry(state):
        out, attempt = state
        idx = jnp.nonzero(pending(state), size=r, fill_value=n)[0]
        src = jnp.minimum(idx, n - 1)
        nxt = attempt[src] + 1
        sub = _draw_lanes(keys[src], spec, buckets[src], nxt)
        out = jax.tree.map(lambda a, b: a.at[idx].set(b, mode="drop"), out, sub)
        return out, attempt.at[idx].set(nxt, mode="drop")

    out, attempt = jax.lax.while_loop(lambda st: jnp.any(pending(st)), retry,
                                      (out, jnp.zeros(n, jnp.int32)))
    return dict(out, attempt=attempt)


def _per_shard(fn, mesh, *args):
    """``fn(*args)`` on each device's shard of a 1-D data mesh (``shard_map``), or directly.

    The sampler's programs are independent per lane, so each device runs its own shard with no
    cross-device traffic (a re-draw's ``nonzero`` and the per-sample gathers stay local).
    """
    if mesh is None:
        return fn(*args)
    spec = P(mesh.axis_names[0])
    return jax.shard_map(fn, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)(*args)


@functools.partial(jax.jit, static_argnums=(1, 3))
def _draw_batch(keys, spec: U.Spec, buckets, mesh=None):
    """``_draw_until_valid`` per shard (see ``_per_shard``)."""
    return _per_shard(lambda k, b: _draw_until_valid(k, spec, b), mesh, keys, buckets)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _cells_batch(draws, spec: U.Spec, mesh=None):
    """vmapped ``_cells``: a program of its own on purpose (see ``sampler.fill_cells``)."""
    return _per_shard(jax.vmap(lambda d: SA.fill_cells(d, spec)), mesh, draws)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _expand_batch(cells, spec: U.Spec, mesh=None):
    """vmapped ``_expand``: a program of its own on purpose (see ``sampler.fill_cells``)."""
    return _per_shard(jax.vmap(lambda d: SA.expand(d, spec)), mesh, cells)


def _data_mesh_of(keys):
    """The 1-D mesh ``keys`` is sharded over (along its batch axis), or None."""
    sharding = getattr(keys, "sharding", None)
    if (isinstance(sharding, NamedSharding) and sharding.mesh.devices.ndim == 1
            and sharding.mesh.devices.size > 1 and len(sharding.spec) >= 1
            and sharding.spec[0] == sharding.mesh.axis_names[0]
            and keys.shape[0] % sharding.mesh.devices.size == 0):
        return sharding.mesh
    return None


def sample_batch(keys, spec: U.Spec, buckets) -> Scene:
    """``jax.vmap(sample)`` over keys [B] and bucket ids int32 [B], equal to it sample by sample.

    Three programs (draw with in-graph re-draws of failed lanes, cells, expand), dispatched
    without waiting on the host; keys sharded along a 1-D mesh draw shard by shard. Raises
    RuntimeError if some lane found no valid geometry in ``sampler.MAX_ATTEMPTS`` attempts.
    """
    buckets = jnp.asarray(buckets, jnp.int32)
    mesh = _data_mesh_of(keys)
    if mesh is not None:
        buckets = jax.device_put(buckets, keys.sharding)
    draws = _draw_batch(keys, spec, buckets, mesh)
    scene = _expand_batch(_cells_batch(draws, spec, mesh), spec, mesh)
    n_bad = int(jnp.sum(~draws["valid"]))
    if n_bad:
        raise RuntimeError(
            f"{n_bad} samples found no valid geometry in {SA.MAX_ATTEMPTS} attempts; "
            f"the spec {spec} is too tight to generate")
    return scene


def sample_lanes(keys, spec: U.Spec, buckets, lanes: int = 0, mesh=None) -> Scene:
    """``sample_batch(keys, spec, buckets)`` (keys [B], bucket ids [B]) drawn on at least
    ``lanes`` lanes, a multiple of the ``mesh``'s device count (the extra lanes repeat the first
    ones and are dropped; with a mesh the lanes are sharded along its 'data' axis). The samples
    are the same; the point is the shape: draws of different sizes padded to one ``lanes``
    share one compiled program (a compile of the draw costs ~5 s on a CPU, a small draw less
    than 0.1 s)."""
    n = int(np.shape(buckets)[0])
    n_dev = 1 if mesh is None else mesh.devices.size
    total = -(-max(n, int(lanes)) // n_dev) * n_dev
    idx = np.arange(total) % n
    keys, buckets = keys[idx], jnp.asarray(np.asarray(buckets, np.int32)[idx])
    if mesh is not None:
        keys, buckets = jax.device_put((keys, buckets), NamedSharding(mesh, P("data")))
    out = sample_batch(keys, spec, buckets)
    return out if total == n else jax.tree.map(lambda a: a[:n], out)


def sample_keys(seed: int, start: int, n: int):
    """Keys of samples start..start+n-1 of a dataset: ``fold_in(PRNGKey(seed), i)``.

    Folding in the global index (instead of splitting) is what makes sample i identical for any
    batch size, chunking or device count.
    """
    root = jax.random.key(seed)
    return jax.vmap(lambda i: jax.random.fold_in(root, i))(jnp.arange(start, start + n,
                                                                       dtype=jnp.uint32))


def bucket_ids(spec: U.Spec, start: int, n: int):
    """Bucket id of samples start..start+n-1: spec.buckets round-robin (even spread)."""
    table = np.asarray(spec.buckets, np.int32)
    return jnp.asarray(table[np.arange(start, start + n) % len(table)])


def generate_chunk(spec: U.Spec, seed: int, start: int, n: int, mesh=None,
                   lanes: int = 0) -> Scene:
    """Samples start..start+n-1 of the dataset (spec, seed) as a Scene batch (leading axis n).

    With a mesh, the batch is padded to a multiple of the device count, sharded along 'data',
    generated, and trimmed back to n (on device, still sharded where n allows it). ``lanes``:
    draw at least this many samples and keep the first n (``sample_lanes``: calls of different
    n share one compiled program).
    """
    if n <= 0:
        raise ValueError(f"number of samples must be positive, got {n}")
    return sample_lanes(sample_keys(seed, start, n), spec, bucket_ids(spec, start, n), lanes,
                        data_mesh() if mesh is None else mesh)


def iter_chunks(spec: U.Spec, seed: int, n: int, chunk: int = 8192, start: int = 0,
                mesh=None) -> Iterator[tuple[int, Scene]]:
    """Yield (offset, Scene batch) chunks covering samples start..start+n-1 in order."""
    if chunk <= 0:
        raise ValueError(f"chunk size must be positive, got {chunk}")
    for off in range(start, start + n, chunk):
        yield off, generate_chunk(spec, seed, off, min(chunk, start + n - off), mesh)


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


__all__ = ["sample_batch", "sample_keys", "bucket_ids", "use_one_cpu_device_per_core", "data_mesh", "generate_chunk", "iter_chunks",
           "to_numpy", "concat", "scene_digest"]
