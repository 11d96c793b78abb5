"""``chunked_vmap``: ``jax.vmap`` over a large batch, run as a loop over cache-sized chunks.

Why: XLA:CPU materialises the intermediates of a vmapped program as [B, ...] buffers. For the
generator's programs at B = 65,536 those are tens of MB per execution, freshly allocated each
call (page faults) and far larger than the L2 cache. Looping over chunks of a few thousand
samples keeps the intermediates small and reused; only the outputs are batch-sized.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


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


__all__ = ["chunked_vmap"]
