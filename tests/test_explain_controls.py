"""The controls bound every metric: the oracle scores 1, random scores the mask's share."""

import jax
import jax.numpy as jnp
import numpy as np

from gridvqa_jax import metrics as MT
from gridvqa_jax.explain import attribution as A
from gridvqa_jax.explain import controls as C
from gridvqa_jax.world import generate as G
from gridvqa_jax.world import universe as U


def _scenes(n=64):
    spec, _ = U.Spec.feasible("pure", grid_size=5, density=0.7)
    return G.to_numpy(G.generate_chunk(spec, seed=5, start=0, n=n))


def test_oracle_scores_one_and_random_scores_the_mask_share():
    sc = _scenes()
    key = jax.random.key(0)
    orc = C.oracle_attribution(None, sc, key)
    # An empty ground truth (e.g. an A-type count of 0: no anchor, no target) scores NaN.
    empty = ~sc.gt_cells.any(axis=(1, 2))
    assert 0 < empty.sum() < len(empty)
    for metric in (MT.relevance_mass_accuracy, MT.otsu_iou):
        score = np.asarray(metric(orc.visual, sc.gt_cells))
        assert np.all(np.isnan(score) == empty) and np.all(score[~empty] == 1.0)
    assert np.all(np.asarray(MT.relevance_mass_accuracy(orc.textual, sc.gt_tokens)) == 1.0)
    # Random maps: the mean RMA over many draws is the ground truth's share of the players.
    rma = np.stack([np.asarray(MT.relevance_mass_accuracy(
        C.random_attribution(None, sc, jax.random.key(i)).visual, sc.gt_cells)) for i in range(40)])
    share = sc.gt_cells.reshape(len(sc.gt_cells), -1).mean(1)
    np.testing.assert_allclose(rma.mean(0)[~empty].mean(), share[~empty].mean(), atol=0.02)
    # The random textual map never puts mass on PAD.
    rnd = C.random_attribution(None, sc, key)
    assert np.all(np.asarray(rnd.textual)[sc.tokens == U.PAD_ID] == 0)
    assert np.all(np.asarray(rnd.textual)[sc.tokens != U.PAD_ID] > 0)


def test_pixel_view_keeps_the_cell_mass():
    sc = _scenes(4)
    att = C.random_attribution(None, sc, jax.random.key(1))
    pix = np.asarray(att.visual_pixels(8))
    assert pix.shape == (4, 40, 40)
    np.testing.assert_allclose(pix.reshape(4, 5, 8, 5, 8).sum((2, 4)), np.asarray(att.visual),
                               rtol=1e-5)
    both = A.concat([att, att])
    assert both.batch_size == 8
