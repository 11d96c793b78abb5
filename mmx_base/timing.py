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


def best_times(fns, repeats: int) -> list[float]:
    """Seconds of the fastest call of each zero-argument function in ``fns``, timed in
    ``repeats`` alternating rounds (each function once per round, after one untimed warm-up
    call of each), so that a slow spell of a shared machine falls on all of them alike: the
    ratio of two of these times is measured in one run, side by side."""
    for fn in fns:
        jax.block_until_ready(fn())
    best = [math.inf] * len(fns)
    for _ in range(max(int(repeats), 1)):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            jax.block_until_ready(fn())
            best[i] = min(best[i], time.perf_counter() - t0)
    return best


__all__ = ["best_time", "best_times"]
