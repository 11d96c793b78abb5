"""Table 1's MultiSHAP rows run on batches of similar question length and report their scores
in sample order; DIME keeps its N-sets in sample order."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from gridvqa_jax.explain.multishap import multishap, multishap_evaluations
from gridvqa_jax.explain.scoring import per_sample_scores
from gridvqa_jax.world.scene import trim_tokens
from reproduction import table1 as T1


@pytest.fixture(scope="module")
def scenes(pure07):
    from conftest import subset

    n_tok = np.asarray(pure07[1].n_tokens)
    # four questions of distinct lengths, longest first: a sample order far from sorted
    lengths = sorted(set(n_tok.tolist()))
    pick = [int(np.flatnonzero(n_tok == k)[0]) for k in (lengths[-1], lengths[0], lengths[-2],
                                                          lengths[1])]
    return subset(pure07[1], np.asarray(pick))


def test_sample_order_is_a_stable_sort_by_length(scenes):
    n_tok = np.asarray(scenes.n_tokens)
    order = T1.sample_order(scenes, True)
    assert sorted(order.tolist()) == [0, 1, 2, 3]
    assert np.all(np.diff(n_tok[order]) >= 0) and order.tolist() == [1, 3, 2, 0]
    assert T1.sample_order(scenes, False).tolist() == [0, 1, 2, 3]
    # the point of it: fewer MultiSHAP evaluations in batches of two
    cost = lambda o: sum(multishap_evaluations(jax.tree.map(lambda a: a[o[i:i + 2]], scenes), 1)
                         for i in (0, 2))  # noqa: E731
    assert cost(order) < cost(np.arange(4))


def test_multishap_row_scores_each_sample_in_its_length_batch(scenes):
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent))
    from test_multiviz import tiny_mdetr

    model = tiny_mdetr()
    key = jax.random.key(3)
    res = T1.table1(4, explainers=("multishap",), regimes=("pure",), batch=4, key=key,
                    budgets={"multishap": {"n_samples": 1}}, models={"pure": model},
                    data={"pure": scenes, "spur": scenes})
    got = res["per_sample"]["multishap"]["pure"]["visual"]["pixel"]["rma"]
    # by hand: one batch [1, 3, 2, 0] (sorted by length; one compile), trimmed to its length,
    # key fold_in(fold_in(key, 0), 0); scores land on their own samples
    want = np.full(4, np.nan)
    for bi, idx in enumerate(([1, 3, 2, 0],)):
        chunk = trim_tokens(jax.tree.map(lambda a: a[np.asarray(idx)], scenes))
        attr = multishap(model.apply, model.params, chunk,
                         jax.random.fold_in(jax.random.fold_in(key, 0), bi), n_samples=1)
        want[idx] = per_sample_scores(attr, chunk)["visual"]["pixel"]["rma"]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_array_equal(res["per_sample"]["multishap"]["pure"]["form"],
                                  np.asarray(scenes.form))
