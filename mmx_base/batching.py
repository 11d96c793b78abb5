"""``chunked_vmap``: ``jax.vmap`` over a large batch, run as a loop over cache-sized chunks;
``rows_per_call``: how many model rows one forward call should carry on a backend.

Why: XLA:CPU materialises the intermediates of a vmapped program as [B, ...] buffers. For the
generator's programs at B = 65,536 those are tens of MB per execution, freshly allocated each
call (page faults) and far larger than the L2 cache. Looping over chunks of a few thousand
samples keeps the intermediates small and reused; only the outputs are batch-sized.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def chunked_vmap(fn, args, chunk: int):
    """``jax.vmap(fn)(*args)`` computed ``chunk`` samples at a time (same result, shapes, dtypes).

    args: pytree of arrays with a common leading batch axis n. With n <= chunk this is one
    ``vmap``. Otherwise a ``fori_loop`` over ceil(n / chunk) windows, the last one moved back
    to end at n (it overlaps the previous window; the overlap is recomputed with the same
    inputs and written with the same values), so there is no padding and no remainder program.
    """
    n = jax.tree.leaves(args)[0].shape[0]
    vf = jax.vmap(fn)
    if n <= chunk:
        return vf(*args)
    out_shape = jax.eval_shape(vf, *jax.tree.map(lambda a: a[:chunk], args))
    out = jax.tree.map(lambda s: jnp.zeros((n,) + s.shape[1:], s.dtype), out_shape)

    def body(i, out):
        start = jnp.minimum(i * chunk, n - chunk)
        part = vf(*jax.tree.map(lambda a: jax.lax.dynamic_slice_in_dim(a, start, chunk), args))
        return jax.tree.map(lambda o, p: jax.lax.dynamic_update_slice_in_dim(o, p, start, 0),
                            out, part)

    return jax.lax.fori_loop(0, -(-n // chunk), body, out)


# Model rows per forward call that suit each backend. XLA:CPU runs GridMDETR fastest on small
# calls whose activations stay in cache: on 2 cores, 16-token rows at 64 rows per call are
# ~2x faster per row than at 1,024 (README "Numbers"). Accelerators want large calls.
ROWS_PER_CALL = {"cpu": 64}
ACCELERATOR_ROWS_PER_CALL = 2048


def rows_per_call(platform: str | None = None) -> int:
    """Model rows per forward call for ``platform`` (default: ``jax.default_backend()``):
    ``ROWS_PER_CALL`` (64 on CPU), else ``ACCELERATOR_ROWS_PER_CALL``."""
    platform = jax.default_backend() if platform is None else platform
    return ROWS_PER_CALL.get(platform, ACCELERATOR_ROWS_PER_CALL)


def per_sample_chunk(samples_per_call: int, platform: str | None = None) -> int:
    """Perturbations per sample per call when ``samples_per_call`` samples are vmapped into
    one forward: ``max(1, rows_per_call(platform) // samples_per_call)``."""
    return max(1, rows_per_call(platform) // max(1, int(samples_per_call)))


def check_chunk(chunk, name: str = "chunk") -> int:
    """``int(chunk)`` if it is an integer >= 1, else ValueError naming ``name``."""
    if isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or chunk < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {chunk!r}")
    return int(chunk)


__all__ = ["chunked_vmap", "rows_per_call", "per_sample_chunk", "check_chunk", "ROWS_PER_CALL",
           "ACCELERATOR_ROWS_PER_CALL"]
