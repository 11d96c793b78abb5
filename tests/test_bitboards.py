"""Bitboard regions against numpy boolean masks, and selection sampling against enumeration."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gridvqa_jax.world import bitboards as BB
from gridvqa_jax.world import regions as RG


@pytest.mark.parametrize("n_cells", [16, 25, 100])
def test_pack_count_and_nth_agree_with_numpy(n_cells):
    rng = np.random.default_rng(n_cells)
    masks = rng.random((64, n_cells)) < rng.random((64, 1))
    boards = jnp.asarray(BB.from_mask_np(masks))
    assert boards.shape == (64, BB.n_words(n_cells))
    np.testing.assert_array_equal(jax.vmap(lambda b: BB.to_mask(b, n_cells))(boards), masks)
    np.testing.assert_array_equal(jax.vmap(BB.count)(boards), masks.sum(1))
    r = jnp.asarray(rng.integers(0, n_cells + 1, 64), jnp.int32)
    want = [np.flatnonzero(m)[k] if k < m.sum() else -1 for m, k in zip(masks, np.asarray(r))]
    np.testing.assert_array_equal(jax.vmap(BB.nth)(boards, r), want)
    np.testing.assert_array_equal(jax.vmap(BB.from_mask)(jnp.asarray(masks)), boards)
    cells = jnp.asarray(rng.integers(0, n_cells, 64), jnp.int32)
    one = jax.vmap(lambda c: BB.single(c, n_cells))(cells)
    np.testing.assert_array_equal(jax.vmap(lambda b: BB.to_mask(b, n_cells))(one),
                                  np.eye(n_cells, dtype=bool)[np.asarray(cells)])


@pytest.mark.parametrize("grid_size", [4, 5, 10])
def test_half_planes_are_the_relation_masks(grid_size):
    S = grid_size
    table = BB.half_planes(S)
    for d in range(4):
        for a in range(S):
            xy = jnp.asarray([a, a], jnp.int32)
            want = np.asarray(RG.relation_mask(jnp.int32(d), xy, S))
            got = np.asarray(BB.to_mask(jnp.asarray(table[d * S + a]), S * S))
            np.testing.assert_array_equal(got, want, err_msg=f"direction {d}, coordinate {a}")


def _subset_frequencies(board_mask, k, n=200_000, n_cells=25):
    board = jnp.asarray(BB.from_mask_np(board_mask))
    words = jax.random.bits(jax.random.key(1), (n, n_cells), jnp.uint32)
    out = jax.jit(jax.vmap(lambda w: BB.to_mask(BB.choose(w, board, k, n_cells),
                                                n_cells)))(words)
    out = np.asarray(out)
    assert not (out & ~board_mask).any(), "chose a cell outside the board"
    picked, counts = np.unique(out, axis=0, return_counts=True)
    return {tuple(np.flatnonzero(p)): c / n for p, c in zip(picked, counts)}


def test_choose_is_uniform_over_k_subsets():
    board = np.zeros(25, bool)
    board[[1, 6, 12, 13, 24]] = True
    freq = _subset_frequencies(board, 2)
    subsets = set(itertools.combinations([1, 6, 12, 13, 24], 2))
    assert set(freq) == subsets  # every 2-subset, nothing else
    # 10 outcomes with p = 0.1 each; 200k draws: the standard error is 0.00067.
    assert max(abs(f - 0.1) for f in freq.values()) < 0.004


def test_choose_caps_k_at_the_board_size_and_handles_empty_boards():
    board = np.zeros(100, bool)
    board[[5, 40, 77, 99]] = True  # spans three of the four words
    freq = _subset_frequencies(board, 9, n=1000, n_cells=100)
    assert freq == {(5, 40, 77, 99): 1.0}
    empty = _subset_frequencies(np.zeros(100, bool), 3, n=100, n_cells=100)
    assert empty == {(): 1.0}


def test_choose_one_is_uniform_with_preference_fallback():
    n = 100_000
    words = jax.random.bits(jax.random.key(2), (n,), jnp.uint32)
    board = np.zeros(25, bool)
    board[[2, 11, 17, 23]] = True
    bd = jnp.asarray(BB.from_mask_np(board))

    def cells(prefer, on=True):
        _, c = jax.jit(jax.vmap(lambda w: BB.choose_one(w, bd, 25, prefer, on)))(words)
        return np.bincount(np.asarray(c) + 1, minlength=26)[1:] / n

    f = cells(None)
    assert set(np.flatnonzero(f)) == {2, 11, 17, 23} and np.abs(f[f > 0] - 0.25).max() < 0.006
    pref = np.zeros(25, bool)
    pref[[11, 23]] = True
    f = cells(jnp.asarray(BB.from_mask_np(pref)))
    assert set(np.flatnonzero(f)) == {11, 23} and abs(f[11] - 0.5) < 0.006
    # A preference disjoint from the board falls back to the whole board.
    f = cells(jnp.asarray(BB.from_mask_np(~board)))
    assert set(np.flatnonzero(f)) == {2, 11, 17, 23}
    _, c = BB.choose_one(words[0], bd, 25, on=False)
    assert int(c) == -1


def test_stream_gives_the_words_of_its_counters():
    # Bits.stream(n)(i) must be words((n,))[i] of the same counter range, for traced indices,
    # and must advance the counter like words() so later draws are unchanged.
    from gridvqa_jax.world.sampling import Bits

    key = jax.random.fold_in(jax.random.key(3), 7)
    a, b = Bits.from_key_data(key), Bits.from_key_data(key)
    a.words((5,))
    b.words((5,))
    want = a.words((40,))
    at = b.stream(40)
    idx = jnp.asarray([[3, 0], [39, 17]])
    np.testing.assert_array_equal(np.asarray(jax.jit(at)(idx)), np.asarray(want)[np.asarray(idx)])
    np.testing.assert_array_equal(np.asarray(a.words((4,))), np.asarray(b.words((4,))))
    # Seeds from the key's own bits: distinct keys, distinct streams.
    other = Bits.from_key_data(jax.random.fold_in(jax.random.key(3), 8))
    assert not np.array_equal(np.asarray(other.words((8,))), np.asarray(Bits.from_key_data(key).words((8,))))
