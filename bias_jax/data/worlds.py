"""The closed worlds the bias commands can run on, by name (``modality-bias ... --world``).

- ``"graded"``: :mod:`bias_jax.data.graded_world` (``GradedSpec``): every sample carries the
  exact answers to the paper's three annotation questions (appendix 12.3) as scores, its type
  their argmax; it adds redundant samples (either modality alone suffices), cues of graded
  strength and samples neither modality decides (issue 25);
- ``"basic"``: :mod:`bias_jax.data.closed_world` (``WorldSpec``), the three clean cases
  (Uni-image / Modality-balance / Uni-text), the world the first shipped detectors were
  trained on.

Each need has one function: :func:`world_spec` (a world's spec at a grid / cell size),
:func:`load_world` (samples ``start..start+n-1`` of a seed as a host ``Batch``, drawn in chunks
so host memory stays bounded), :func:`sample_batch` (the jitted sampler of keys, for training),
:func:`world_of` (a spec's world name), :func:`check_world` (a name, or an ``InputError``
naming the choices). The graded world's module is imported only when it is asked for.

``DEFAULT_WORLD`` is the world every closed-world command uses when none is named: the graded
world (issue 25, point 5), whose label-only detectors ship as ``detectors.shipped_set("graded",
steps)``; ``"basic"`` and its shipped designed detectors stay selectable (``--world basic``).
Setting it back to ``"basic"`` restores the earlier defaults everywhere.
"""

from __future__ import annotations

from bias_jax.data import closed_world as CW
from bias_jax.data.batch import Batch, concat
from mmx_base.errors import InputError

WORLDS = ("graded", "basic")
# The one switch of every closed-world command's default (module docstring).
DEFAULT_WORLD = "graded"
LOAD_CHUNK = 4096  # samples generated at a time by load_world (bounded host memory)


def check_world(world: str) -> str:
    """``world`` if it names a world of ``WORLDS``, else an ``InputError`` naming them."""
    if world not in WORLDS:
        raise InputError(f"unknown world {world!r}; expected one of {', '.join(WORLDS)}")
    return world


def _graded():
    """The graded world's module (imported on first use)."""
    try:
        from bias_jax.data import graded_world
    except ImportError as e:  # pragma: no cover - only before the module is committed
        raise InputError(f"the graded world is not available ({e}); use --world basic") \
            from None
    return graded_world


def world_spec(world: str | None = None, *, grid_size: int = 5, cell_px: int = 16, **fields):
    """The spec of ``world`` (``WORLDS``; None: ``DEFAULT_WORLD``) with its default type mix
    at ``grid_size`` x ``grid_size`` cells of ``cell_px`` pixels: ``closed_world.WorldSpec``
    for ``"basic"``, ``graded_world.GradedSpec`` for ``"graded"``; ``fields``: any other
    field of that spec (e.g. ``max_tokens``, ``type_mix`` / ``case_mix``). Both are frozen,
    hashable dataclasses (jit-static)."""
    world = check_world(DEFAULT_WORLD if world is None else world)
    cls = CW.WorldSpec if world == "basic" else _graded().GradedSpec
    return cls(grid_size=grid_size, cell_px=cell_px, **fields)


def world_of(spec) -> str:
    """The name (``WORLDS``) of the world ``spec`` belongs to; ``TypeError`` for another
    object."""
    if isinstance(spec, CW.WorldSpec):
        return "basic"
    if type(spec).__name__ == "GradedSpec" and isinstance(spec, _graded().GradedSpec):
        return "graded"
    raise TypeError(f"not a closed-world spec: {type(spec).__name__}")


def load_world(spec, seed: int, n: int, start: int = 0, *, chunk: int = LOAD_CHUNK) -> Batch:
    """Samples ``start..start+n-1`` of ``(spec, seed)`` as one host ``Batch`` (``index`` = the
    global sample index), generated ``chunk`` at a time and concatenated: the same samples as
    ``closed_world.load_closed_world`` / ``graded_world.load_graded_world`` in one call,
    since a sample depends on its key only. ``spec``: a spec of :func:`world_spec`."""
    if n <= 0:
        raise ValueError(f"number of samples must be positive, got {n}")
    load = CW.load_closed_world if world_of(spec) == "basic" else _graded().load_graded_world
    parts = [load(spec, seed, min(chunk, n - s), start=start + s) for s in range(0, n, chunk)]
    return parts[0] if len(parts) == 1 else concat(parts)


def sample_batch(keys, spec):
    """The world's jitted sampler: ``sample_batch(keys [B], spec)`` of
    ``closed_world`` / ``graded_world`` (a batched sample pytree, one sample per key)."""
    mod = CW if world_of(spec) == "basic" else _graded()
    return mod.sample_batch(keys, spec)


__all__ = ["WORLDS", "DEFAULT_WORLD", "LOAD_CHUNK", "check_world", "world_spec", "world_of",
           "load_world", "sample_batch"]
