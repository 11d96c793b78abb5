"""mmx_base.timing: best-of-n timings, and alternating rounds for ratios measured side by side."""

import time

import numpy as np

import jax
import jax.numpy as jnp

from mmx_base.timing import best_time, best_times, xla_flops


def test_best_times_alternate_and_keep_the_fastest_of_each():
    calls = []

    def fn(name, seconds):
        """Sleeps seconds[k] on its k-th call (call 0: the untimed warm-up)."""
        it = iter(seconds)

        def call():
            calls.append(name)
            time.sleep(next(it))
            return np.zeros(1)
        return call

    # the fastest timed call is neither the first, the last, nor the warm-up
    ta, tb = best_times([fn("a", [0.001, 0.2, 0.01, 0.15]), fn("b", [0.001, 0.25, 0.12, 0.3])],
                        repeats=3)
    # one warm-up call of each, then three rounds that alternate
    assert calls == ["a", "b"] + ["a", "b"] * 3
    assert 0.01 <= ta < 0.1 and 0.12 <= tb < 0.2
    assert 0.01 <= best_time(fn("c", [0.001, 0.2, 0.01, 0.15]), repeats=3) < 0.1
    assert calls[-4:] == ["c"] * 4


def test_xla_flops_counts_a_matrix_product_and_a_chain():
    a, b, c = jnp.ones((64, 128)), jnp.ones((128, 256)), jnp.ones((256, 8))
    assert xla_flops(jax.jit(lambda x, y: x @ y), a, b) == 2 * 64 * 128 * 256
    # two products, and the count grows with the batch the way the arithmetic does
    two = xla_flops(jax.jit(lambda x, y, z: (x @ y) @ z), a, b, c)
    assert two == 2 * 64 * 128 * 256 + 2 * 64 * 256 * 8
    assert xla_flops(jax.jit(lambda x, y: x @ y), jnp.ones((32, 128)), b) == 2 * 32 * 128 * 256
