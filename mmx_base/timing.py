"""Wall-clock timing of jitted calls for throughput probes (benchmarks, not tests), and XLA's
count of a compiled call's floating-point operations (what a rate means in arithmetic)."""

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


def xla_flops(jitted, *args) -> float:
    """Floating-point operations of one call ``jitted(*args)`` as XLA counts them in the
    compiled program (``Compiled.cost_analysis()["flops"]``: a matrix product [m, k] x [k, n]
    counts ``2 m k n``); NaN when the backend gives no count. Compiles the call (once more if
    ``jitted`` has not seen these shapes), runs nothing."""
    cost = jitted.lower(*args).compile().cost_analysis()
    if isinstance(cost, (list, tuple)):  # older jax: one dict per program
        cost = cost[0] if cost else None
    return float((cost or {}).get("flops", math.nan))


__all__ = ["best_time", "best_times", "xla_flops"]
