"""Wall-clock timing of jitted calls for throughput probes (benchmarks, not tests)."""

from __future__ import annotations

import math
import time

import jax


def best_time(fn, repeats: int) -> float:
    """Seconds of the fastest of ``repeats`` calls of ``fn()`` (a zero-argument function returning
    arrays), after one untimed call that compiles and warms up; every call is waited for with
    ``jax.block_until_ready``, so asynchronous dispatch is not mistaken for speed."""
    jax.block_until_ready(fn())
    best = math.inf
    for _ in range(max(int(repeats), 1)):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - t0)
    return best


__all__ = ["best_time"]
