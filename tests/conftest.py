"""Shared fixtures: small generated batches, made once per session; each module's compiled
programs are freed when it ends."""

import gc
import importlib.util
import os
import tempfile
from pathlib import Path
from typing import NamedTuple

# Strict numerics as in equinox's test-suite: implicit rank promotion is a bug here.
os.environ.setdefault("JAX_NUMPY_RANK_PROMOTION", "raise")
# Many tests build the same programs afresh (a train step per run, the CLI in subprocesses):
# XLA's persistent cache compiles each once per machine, shared by the xdist workers and the
# subprocesses (measured: 77 s -> 64 s cold, 36 s warm on the two slowest tests).
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                      os.path.join(tempfile.gettempdir(), "gridvqa_jax_test_xla_cache"))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from gridvqa_jax.world import generate as G  # noqa: E402
from gridvqa_jax.world import universe as U  # noqa: E402


def _memory_mappings() -> tuple[int, int] | None:
    """(this process's memory-mapping count, the kernel's ``vm.max_map_count``) on Linux, or
    None where /proc does not tell."""
    try:
        with open("/proc/self/maps") as f:
            count = sum(1 for _ in f)
        with open("/proc/sys/vm/max_map_count") as f:
            return count, int(f.read())
    except (OSError, ValueError):
        return None


@pytest.fixture(autouse=True, scope="module")
def release_compiled_programs():
    """Free each test module's compiled programs when it ends.

    XLA:CPU maps every jitted kernel into memory, and JAX keeps compiled executables alive in
    its caches. Over a whole xdist worker that exceeded Linux's ``vm.max_map_count`` (65,530):
    a mapping failed, XLA raised "Failed to materialize symbols", and the worker died with a
    segfault while unwinding that error (measured: 64,441 mappings in the crashed worker's
    core; three test modules take one process to 20,027 mappings, 1,352 with this fixture).
    """
    yield
    jax.clear_caches()
    gc.collect()
    mappings = _memory_mappings()
    if mappings is None:
        return
    count, limit = mappings
    if count > limit // 2:
        raise RuntimeError(f"{count:,} memory mappings are still held after this module's "
                           f"compiled programs were freed (vm.max_map_count is {limit:,}); XLA "
                           "crashes once they run out: something keeps executables alive")


def make(variant, density=0.7, n_per_bucket=40, seed=0, grid_size=5):
    spec, _ = U.Spec.feasible(variant, grid_size, density)
    n = n_per_bucket * len(spec.buckets)
    return spec, G.to_numpy(G.generate_chunk(spec, seed, 0, n))


@pytest.fixture(scope="session")
def pure07():
    return make("pure", 0.7)


@pytest.fixture(scope="session")
def spur07():
    return make("spur", 0.7)


@pytest.fixture(scope="session")
def pure03():
    return make("pure", 0.3)


@pytest.fixture(scope="session")
def spur03():
    return make("spur", 0.3)


def subset(batch, idx):
    """Rows ``idx`` of a numpy Scene batch."""
    return jax.tree.map(lambda a: np.asarray(a)[idx], batch)


class RandomScenes(NamedTuple):
    """The scene fields explainers read (color, shape int [B, S, S], -1 = empty, indexed
    [y, x]; tokens int [B, L], PAD after 4..11 random words), without the sampler's compile."""

    color: np.ndarray
    shape: np.ndarray
    tokens: np.ndarray


def random_scenes(n, seed=0, grid_size=5, max_tokens=U.MAX_TOKENS) -> RandomScenes:
    """n random grids (each cell occupied with probability 0.6) and random questions."""
    rng = np.random.default_rng(seed)
    S = grid_size
    occ = rng.random((n, S, S)) < 0.6
    color = np.where(occ, rng.integers(0, 4, occ.shape), -1).astype(np.int32)
    shape = np.where(occ, rng.integers(0, 4, occ.shape), -1).astype(np.int32)
    tokens = np.zeros((n, max_tokens), np.int32)
    for b in range(n):
        k = int(rng.integers(4, 12))
        tokens[b, :k] = rng.integers(1, 30, k)
    return RandomScenes(color, shape, tokens)


@pytest.fixture(scope="session")
def experiment():
    """``experiment(name)``: the script ``experiments/<name>.py`` loaded as a module (the
    scripts are not a package, so they are not importable from every working directory)."""
    root = Path(__file__).resolve().parents[1] / "experiments"

    def load(name):
        spec = importlib.util.spec_from_file_location(f"experiments_{name}", root / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    return load
