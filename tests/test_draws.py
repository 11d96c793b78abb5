"""Keyed Monte Carlo draws (mmx_base.draws) against jax.random called column by column."""

import jax
import numpy as np
import pytest

from mmx_base.draws import column_uniforms, stream_uniforms


def _column(key, i, m):
    return np.asarray(jax.random.uniform(jax.random.fold_in(key, i), (m,)))


def test_column_uniforms_are_keyed_column_by_column_and_nest():
    key = jax.random.key(3)
    table = np.asarray(column_uniforms(key, 6, 5))
    for i in range(5):
        np.testing.assert_array_equal(table[:, i], _column(key, i, 6))
    np.testing.assert_array_equal(np.asarray(column_uniforms(key, 6, 3)), table[:, :3])
    np.testing.assert_array_equal(np.asarray(column_uniforms(key, 4, 5)), table[:4])
    assert len(np.unique(table)) == table.size and 0 <= table.min() and table.max() < 1


def test_stream_uniforms_key_each_player_by_its_side_and_place():
    key = jax.random.key(8)
    side, index = [0, 0, 1, 0, 1, 2], [0, 1, 0, 2, 1, 0]
    got = np.asarray(stream_uniforms(key, 5, side, index))
    for j, (s, i) in enumerate(zip(side, index)):
        np.testing.assert_array_equal(got[:, j], _column(jax.random.fold_in(key, s), i, 5))
    # a side that grows in front of another, or a player appended, moves no one's column
    grown = np.asarray(stream_uniforms(key, 5, [0, 0, 0, 0, 1, 1, 1], [0, 1, 2, 3, 0, 1, 2]))
    np.testing.assert_array_equal(grown[:, [0, 1, 4, 2, 5]], got[:, :5])
    with pytest.raises(ValueError, match="share"):
        stream_uniforms(key, 5, [0, 0], [1, 1])
    with pytest.raises(ValueError, match=">= 0"):
        stream_uniforms(key, 5, [0, 1], [-1, 0])
    with pytest.raises(ValueError, match="int \\[n\\]"):
        stream_uniforms(key, 5, [0, 0], [0])
