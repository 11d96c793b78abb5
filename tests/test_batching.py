"""chunked_vmap against plain vmap, and the CLI's one-CPU-device-per-core switch."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mmx_base.batching import chunked_vmap


def _fn(x, y):
    # Per-sample work with a pytree output of mixed dtypes and ranks.
    return {"s": jnp.sum(x * y["w"]), "v": jnp.cumsum(x) ^ y["k"], "b": x > y["k"][0]}


@pytest.mark.parametrize("n,chunk", [(5, 8), (8, 8), (32, 8), (37, 8), (9, 8), (64, 7)])
def test_chunked_vmap_equals_vmap(n, chunk):
    rng = np.random.default_rng(n * 100 + chunk)
    x = jnp.asarray(rng.integers(0, 1000, (n, 6)), jnp.int32)
    y = {"w": jnp.asarray(rng.integers(-5, 5, (n, 6)), jnp.int32),
         "k": jnp.asarray(rng.integers(0, 1000, (n, 6)), jnp.int32)}
    want = jax.vmap(_fn)(x, y)
    got = jax.jit(lambda x, y: chunked_vmap(_fn, (x, y), chunk))(x, y)
    for key in want:
        assert got[key].shape == want[key].shape and got[key].dtype == want[key].dtype
        np.testing.assert_array_equal(np.asarray(got[key]), np.asarray(want[key]))


def test_chunked_vmap_runs_each_window_on_its_own_lanes():
    # A lane's output must come from that lane's input even in the overlapping last window.
    n, chunk = 23, 8
    out = jax.jit(lambda a: chunked_vmap(lambda v: v * 2 + 1, (a,), chunk))(jnp.arange(n))
    np.testing.assert_array_equal(np.asarray(out), np.arange(n) * 2 + 1)


def _run(code, **env):
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(code)],
                         env={**os.environ, "JAX_PLATFORMS": "cpu", **env},
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout.split()


def test_one_cpu_device_per_core_before_and_after_backend_start():
    cores = len(os.sched_getaffinity(0))
    env = {"XLA_FLAGS": ""}
    changed, n = _run("""
        from gridvqa_jax.world import generate as G
        import jax
        print(G.use_one_cpu_device_per_core(), len(jax.devices()))
    """, **env)
    assert changed == "True" and int(n) == cores
    changed, n = _run("""
        import jax
        from gridvqa_jax.world import generate as G
        jax.devices()
        print(G.use_one_cpu_device_per_core(), len(jax.devices()))
    """, **env)
    assert changed == "False" and int(n) == 1


def test_one_cpu_device_per_core_respects_an_explicit_device_count():
    changed, n = _run("""
        from gridvqa_jax.world import generate as G
        import jax
        print(G.use_one_cpu_device_per_core(), len(jax.devices()))
    """, XLA_FLAGS="--xla_force_host_platform_device_count=3")
    assert changed == "False" and int(n) == 3


def test_rows_per_call_per_backend():
    from mmx_base.batching import (ACCELERATOR_ROWS_PER_CALL, ROWS_PER_CALL,
                                           per_sample_chunk, rows_per_call)

    assert rows_per_call("cpu") == ROWS_PER_CALL["cpu"]
    assert rows_per_call("gpu") == rows_per_call("tpu") == ACCELERATOR_ROWS_PER_CALL
    assert per_sample_chunk(8, "cpu") == ROWS_PER_CALL["cpu"] // 8
    assert per_sample_chunk(10 ** 6, "cpu") == 1  # never 0


@pytest.mark.parametrize("bad", [0, -3, 1.5, True, "4", None])
def test_check_chunk_rejects_what_is_not_a_positive_integer(bad):
    from mmx_base.batching import check_chunk

    with pytest.raises(ValueError, match="perturbations_per_eval must be an integer >= 1"):
        check_chunk(bad, "perturbations_per_eval")


def test_check_chunk_accepts_numpy_integers_and_the_explainers_use_it():
    from mmx_base.batching import check_chunk
    from gridvqa_jax.explain import global_synergy as GS

    assert check_chunk(np.int64(3)) == 3 and type(check_chunk(np.int64(3))) is int
    with pytest.raises(ValueError, match="chunk must be an integer >= 1, got 0"):
        GS.forward_pairs(None, None, np.zeros((1, 4, 4, 3)), np.zeros((1, 3), np.int32),
                         [0], [0], chunk=0)
