"""Grid regions as bitboards: a set of cells packed into ``W = ceil(C / 32)`` uint32 words.

Cell ``i`` (row-major, ``i = y * S + x``) is bit ``i % 32`` of word ``i // 32``. Under ``vmap``
a region of a 5x5 grid is one uint32 per sample, so unions, intersections, complements and
counts are a handful of element-wise integer ops on [B] vectors — what XLA's CPU backend
vectorises best — instead of reductions, sorts and scatters over [B, C] boolean arrays. The
sampler (``gridvqa_jax.world.sampler``) keeps every region in this form and expands to boolean cell
masks only for its output.

Random selection follows Knuth's selection sampling (TAOCP vol. 2, 3.4.2, Algorithm S): visit
the cells in order and take cell ``i`` with probability ``need / remaining``, which gives every
k-subset of a region the same probability with one random word per cell and no sorting.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from gridvqa_jax.world import sampling

_U32 = jnp.uint32


def n_words(n_cells: int) -> int:
    """Words per board for ``n_cells`` cells: ceil(n_cells / 32)."""
    return -(-n_cells // 32)


def full(n_cells: int) -> np.ndarray:
    """uint32 [W]: the board holding all ``n_cells`` cells."""
    return from_mask_np(np.ones(n_cells, bool))


def from_mask_np(mask) -> np.ndarray:
    """Host-side packing of bool [..., C] into uint32 [..., W] (tests, static tables)."""
    mask = np.asarray(mask, bool)
    c = mask.shape[-1]
    words = np.zeros(mask.shape[:-1] + (n_words(c),), np.uint64)
    for i in range(c):
        words[..., i // 32] |= mask[..., i].astype(np.uint64) << np.uint64(i % 32)
    return words.astype(np.uint32)


def to_mask(board, n_cells: int):
    """bool [C] of a board uint32 [W]: cell i is set iff bit i % 32 of word i // 32 is."""
    idx = np.arange(n_cells)
    words = board[..., idx // 32]  # static index: a broadcast per word, not a gather
    shift = jnp.asarray(idx % 32, _U32).reshape((1,) * (words.ndim - 1) + (-1,))
    return ((words >> shift) & 1) == 1


def from_mask(mask):
    """uint32 [W] board of a bool [C] cell mask (jit-friendly inverse of ``to_mask``)."""
    c = mask.shape[-1]
    words = []
    for w in range(n_words(c)):
        part = mask[..., 32 * w: 32 * (w + 1)]
        bits = jnp.left_shift(_U32(1), jnp.arange(part.shape[-1], dtype=_U32))
        words.append(jnp.sum(jnp.where(part, bits, _U32(0)), axis=-1, dtype=_U32))
    return jnp.stack(words, axis=-1)


def count(board):
    """int32 []: number of cells in the board (a population count per word)."""
    return jnp.sum(jax.lax.population_count(board).astype(jnp.int32), axis=-1)


def nonempty(board):
    """bool []: the board holds at least one cell."""
    return jnp.any(board != 0, axis=-1)


def single(cell, n_cells: int, on=True):
    """uint32 [..., W]: the board holding only ``cell`` (int32 [...]) where ``on``, else empty."""
    cell = jnp.asarray(cell)
    on = jnp.broadcast_to(on, cell.shape)[..., None]
    cell = cell[..., None]
    w = jnp.arange(n_words(n_cells), dtype=jnp.int32).reshape((1,) * (cell.ndim - 1) + (-1,))
    bit = jnp.left_shift(_U32(1), (cell % 32).astype(_U32))
    return jnp.where((w == cell // 32) & on, bit, _U32(0))


def nth_in_word(word, r, bits: int = 32):
    """Position of the r-th (0-based) set bit of a uint32 ``word``, by binary search on counts.

    ``bits`` (a power of two) bounds the highest set bit. Undefined (but in range) when the word
    has r or fewer set bits.
    """
    pos = jnp.zeros(jnp.shape(r), jnp.int32)
    r = jnp.asarray(r, jnp.int32)
    h = bits // 2
    while h >= 1:
        low = jax.lax.population_count(word & _U32((1 << h) - 1)).astype(jnp.int32)
        go = r >= low
        r = jnp.where(go, r - low, r)
        word = jnp.where(go, word >> h, word)
        pos = jnp.where(go, pos + h, pos)
        h //= 2
    return pos


def nth(board, r):
    """Cell index (int32 []) of the r-th (0-based, row-major) cell of the board; -1 if none."""
    out = jnp.int32(-1)
    seen = jnp.int32(0)
    for w in range(board.shape[-1]):
        c = jax.lax.population_count(board[..., w]).astype(jnp.int32)
        hit = (r >= seen) & (r < seen + c)
        out = jnp.where(hit, 32 * w + nth_in_word(board[..., w], r - seen), out)
        seen = seen + c
    return out


def choose(words, board, k, n_cells: int):
    """Uniformly random ``min(k, |board|)`` cells of ``board``.

    words: uint32 [C] random; board: uint32 [W]; k: int32 []. Returns uint32 [W].

    Grids of up to 32 cells use selection sampling (Knuth, Algorithm S): cell i of the board is
    taken with probability need/remaining, decided by ``(words[i] >> 8) * remaining < need << 24``
    (24-bit uniforms), unrolled over the cells. Larger grids would make that unrolled chain slow
    to compile (minutes at 100 cells), so they take the k cells of smallest random priority
    (``sampling.choose``, comparison ranks): the same distribution by another route. (A
    preference, "these cells first", is two calls on disjoint boards: see ``sampler._place``.)
    """
    if n_cells > 32:
        return from_mask(sampling.choose(sampling.priority_of_words(words),
                                         to_mask(board, n_cells), jnp.asarray(k, jnp.int32)))
    # One word: n_cells <= 32 here.
    cells = board[..., 0]
    rem = count(board).astype(_U32)
    need = jnp.minimum(jnp.maximum(jnp.asarray(k, jnp.int32), 0).astype(_U32), rem)
    out = jnp.zeros_like(cells)
    u = words >> 8
    for i in range(n_cells):
        inside = ((cells >> i) & 1) == 1
        take = inside & (u[..., i] * rem < (need << 24))
        out = out | jnp.where(take, _U32(1 << i), _U32(0))
        need = need - take.astype(_U32)
        rem = rem - inside.astype(_U32)
    return out[..., None]


def choose_one(word, board, n_cells: int, prefer=None, on=True):
    """One uniformly random cell of ``board`` (of ``board & prefer`` when that is non-empty).

    word: uint32 [] random. Returns (board uint32 [W] with that cell, or empty when ``board`` is
    empty or not ``on``; cell int32 [], -1 when none).
    """
    pool = board if prefer is None else jnp.where(nonempty(board & prefer), board & prefer, board)
    n = count(pool)
    r = ((word >> 8).astype(jnp.int32) * n) >> 24  # uniform in [0, n) (n <= 100 < 2**7)
    cell = nth(pool, r)
    ok = (n > 0) & on
    return single(cell, n_cells, ok), jnp.where(ok, cell, -1)


@functools.lru_cache(maxsize=None)
def half_planes(grid_size: int) -> np.ndarray:
    """uint32 [4 * S, W]: row ``d * S + a`` is the half-plane of direction d at coordinate a.

    GridVQA-X directions: 0 "left of" x < a, 1 "right of" x > a, 2 "above" y < a, 3 "below"
    y > a (a = the anchor's x for d < 2, its y otherwise).
    """
    S = grid_size
    y, x = np.divmod(np.arange(S * S), S)
    rows = []
    for d in range(4):
        for a in range(S):
            rows.append([x < a, x > a, y < a, y > a][d])
    return from_mask_np(np.stack(rows))
