"""Cheap, reproducible randomness and selection primitives for vmapped samplers.

Threefry for every draw would cost hundreds of words per sample; ``Bits`` seeds once from a JAX
key and then hashes (seed, counter) with MurmurHash3's finaliser. Selections use comparison
ranks instead of ``jnp.sort``, which is far slower for the tiny per-sample vectors of a grid
universe under ``vmap`` on CPU. Shared by ``gridvqa_jax.world.sampler`` and ``bias_jax``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

NONE = np.uint32(0xFFFFFFFF)
_GOLDEN = np.uint32(0x9E3779B9)


def fmix(x):
    """MurmurHash3's 32-bit finaliser: a bijective avalanche mix of uint32 words."""
    x = x ^ (x >> 16)
    x = x * np.uint32(0x85EBCA6B)
    x = x ^ (x >> 13)
    x = x * np.uint32(0xC2B2AE35)
    return x ^ (x >> 16)


class Bits:
    """Random uint32 words of one sample: threefry seeds once, then a counter-based hash.

    Threefry for every draw would dominate the cost of a sample; hashing (seed, counter) with
    two MurmurHash3 finalisers is a handful of integer ops a word. Each call takes the next static counter range, so draws are reproducible and
    independent of batching (the counters are trace-time constants).
    """

    def __init__(self, key):
        self.seed = jax.random.bits(key, (2,), jnp.uint32)
        self.counter = 0

    @classmethod
    def from_key_data(cls, key):
        """Seed with the key's own two words instead of drawing from it.

        For a key made for this one use (``fold_in`` / ``split`` output, itself a threefry
        output): a second threefry pass would add cost and no randomness.
        """
        rng = cls.__new__(cls)
        rng.seed = jax.random.key_data(key).reshape(-1)[:2].astype(jnp.uint32)
        rng.counter = 0
        return rng

    def words(self, shape):
        """uint32 ``shape`` of random words: ``fmix(fmix(seed0 ^ ctr * golden) ^ seed1)`` over the
        next ``prod(shape)`` counters."""
        n = int(np.prod(shape))
        ctr = jnp.arange(self.counter, self.counter + n, dtype=jnp.uint32).reshape(shape)
        self.counter += n
        return self._hash(ctr)

    def stream(self, n):
        """Reserve the next ``n`` counters; returns ``at(i)``, the words of counters base + i.

        ``at`` takes traced indices (int [...]) and gives what ``words((n,))[i]`` would, so a
        loop can hash the words it needs inside its body: XLA then fuses the hash into their
        use instead of materialising and slicing a [B, n] array on every trip.
        """
        base = self.counter
        self.counter += n
        return lambda i: self._hash(jnp.uint32(base) + jnp.asarray(i).astype(jnp.uint32))

    def _hash(self, ctr):
        return fmix(fmix(self.seed[0] ^ (ctr * _GOLDEN)) ^ self.seed[1])

    def uniform(self, shape=()):
        """float32 ``shape`` uniform in [0, 1) on a 2**-24 grid (the top 24 bits of ``words``)."""
        return (self.words(shape) >> 8).astype(jnp.float32) * np.float32(2.0 ** -24)

    def randint(self, shape, lo, hi):
        """Uniform int32 in [lo, hi) with traced bounds."""
        span = jnp.maximum(hi - lo, 1)
        return lo + jnp.minimum((self.uniform(shape) * span).astype(jnp.int32), span - 1)


def onehot(idx, n):
    """bool [..., n] one-hot of int indices."""
    idx = jnp.asarray(idx)
    return idx[..., None] == jnp.arange(n, dtype=jnp.int32).reshape((1,) * idx.ndim + (n,))


def take(table, idx):
    """table[idx] along axis 0."""
    return jnp.asarray(table)[idx]


def rank(p):
    """Rank of each entry of a vector of distinct values (0 = smallest), by comparisons.

    An [n, n] comparison is much cheaper than ``jnp.sort`` for the tiny vmapped vectors used
    here (n <= S*S).
    """
    return jnp.sum(p[None, :] < p[:, None], axis=1).astype(jnp.int32)


def permutation(u):
    """The permutation that sorts ``u`` (distinct values): perm[rank[j]] = j, by a scatter."""
    n = u.shape[0]
    return jnp.zeros(n, jnp.int32).at[rank(u)].set(jnp.arange(n, dtype=jnp.int32))


def permutation_slots(u, slots):
    """Key at each of ``slots`` of the random permutation ranked by ``u`` (distinct values)."""
    return permutation(u)[jnp.asarray(slots)]


def priority(rng, n):
    """Distinct uint32 random priorities for n <= 128 cells (random high bits, index low bits)."""
    return priority_of_words(rng.words((n,)))


def priority_of_words(words):
    """Distinct uint32 priorities from random words [n], n <= 128: the top 24 random bits above
    the 7-bit index, so ties are impossible and the order is uniformly random."""
    n = words.shape[-1]
    if n > 128:
        raise ValueError(f"priorities pack the index in 7 bits; got {n} cells")
    return ((words >> 8) << 7) | jnp.arange(n, dtype=jnp.uint32)


def choose(prio, mask, k):
    """Choose k cells of ``mask`` uniformly at random.

    prio: uint32 [C] distinct; mask: bool [C]; k: int32 []. Returns bool [C] with
    min(k, |mask|) cells set.
    """
    p = jnp.where(mask, prio, NONE)
    return mask & (rank(p) < k)


def choose_one(prio, mask, on):
    """One uniformly random cell of ``mask`` when ``on``; bool [C]."""
    p = jnp.where(mask, prio, NONE)
    j = jnp.argmin(p)
    return (jnp.arange(p.shape[0]) == j) & mask & on


def randint_incl(rng, lo, hi):
    """Uniform int32 in [lo, hi] with traced bounds (returns lo when hi < lo)."""
    return rng.randint((), lo, hi + 1)
