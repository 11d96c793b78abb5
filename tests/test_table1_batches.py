"""Table 1's MultiSHAP rows run on batches of similar question length and report their scores
in sample order; DIME keeps its N-sets in sample order."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from gridvqa_jax.explain.multishap import multishap, multishap_evaluations
from gridvqa_jax.explain.scoring import per_sample_scores
from gridvqa_jax.world.scene import trim_tokens
from mmx_base.errors import InputError
from reproduction import table1 as T1
from test_multiviz import tiny_mdetr


@pytest.fixture(scope="module")
def scenes(pure07):
    from conftest import subset

    n_tok = np.asarray(pure07[1].n_tokens)
    # four questions of distinct lengths, longest first: a sample order far from sorted
    lengths = sorted(set(n_tok.tolist()))
    pick = [int(np.flatnonzero(n_tok == k)[0]) for k in (lengths[-1], lengths[0], lengths[-2],
                                                          lengths[1])]
    return subset(pure07[1], np.asarray(pick))


_CALL_EXPLAINER = T1.call_explainer  # the real one, before any test patches it


def stopping_explainer(calls: list, k: int, record):
    """A stand-in for ``table1.call_explainer`` that appends ``record(args, kwargs)`` to
    ``calls`` and raises KeyboardInterrupt when ``calls`` holds ``k`` (a run stopped midway)."""
    def call(*a, **kk):
        if len(calls) == k:
            raise KeyboardInterrupt("stopped")
        calls.append(record(a, kk))
        return _CALL_EXPLAINER(*a, **kk)
    return call


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
    model = tiny_mdetr()
    key = jax.random.key(3)
    res = T1.table1(4, explainers=("multishap",), regimes=("pure",), batch=4, key=key,
                    budgets={"multishap": {"n_samples": 1}}, models={"pure": model},
                    data={"pure": scenes, "spur": scenes})
    got = res["per_sample"]["multishap"]["pure"]["visual"]["pixel"]["rma"]
    # by hand: one batch [1, 3, 2, 0] (sorted by length; one compile), trimmed to its length,
    # sample j with key fold_in(fold_in(key, 0), j); scores land on their own samples
    idx = np.asarray([1, 3, 2, 0])
    chunk = trim_tokens(jax.tree.map(lambda a: a[idx], scenes))
    keys = jax.random.fold_in(key, 0)
    attr = multishap(model.apply, model.params, chunk,
                     jax.numpy.stack([jax.random.fold_in(keys, j) for j in idx]), n_samples=1)
    want = np.full(4, np.nan)
    want[idx] = per_sample_scores(attr, chunk)["visual"]["pixel"]["rma"]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_array_equal(res["per_sample"]["multishap"]["pure"]["form"],
                                  np.asarray(scenes.form))
    # a sample's maps depend on its own key and game alone: batches of two (other partners,
    # other padded lengths) and a run of the first three samples score each sample the same,
    # to float32 rounding of the model's rows (9e-6 seen; another draw moves a score by ~0.1)
    for n, size in ((4, 2), (3, 4)):
        again = T1.table1(n, explainers=("multishap",), regimes=("pure",), batch=size,
                          key=key, budgets={"multishap": {"n_samples": 1}},
                          models={"pure": model}, data={"pure": scenes, "spur": scenes})
        np.testing.assert_allclose(
            again["per_sample"]["multishap"]["pure"]["visual"]["pixel"]["rma"], got[:n],
            atol=1e-4)


@pytest.mark.parametrize("players", ["cells", "patches"])
def test_a_subset_with_its_batch_keys_gets_the_batch_maps(scenes, players):
    from gridvqa_jax.explain.multishap import multishap_regions, sample_keys

    model = tiny_mdetr()
    key = jax.random.key(5)
    batch = trim_tokens(scenes)
    if players == "cells":
        fn = lambda s, k, **kw: multishap(model.apply, model.params, s, k, n_samples=2, **kw)  # noqa
    else:
        fn = lambda s, k, **kw: multishap_regions(  # noqa: E731
            model.apply, model.params, s, k, n_samples=2, target="label", quantity="log_odds",
            baseline="gray", text_aggregate="abs", **kw)
    whole = fn(batch, key)
    sub = jax.tree.map(lambda a: a[1:3], batch)
    part = fn(sub, sample_keys(key, 4)[1:3])  # its own game size: null players move no draw
    np.testing.assert_allclose(part.visual, np.asarray(whole.visual)[1:3], atol=1e-5)
    np.testing.assert_allclose(part.textual, np.asarray(whole.textual)[1:3], atol=1e-5)
    # without the batch's keys the subset is another draw (the test can tell them apart)
    other = fn(sub, key)
    assert not np.allclose(other.visual, np.asarray(whole.visual)[1:3], atol=1e-5)
    with pytest.raises(ValueError, match="one per sample"):
        fn(sub, sample_keys(key, 3))


def test_a_multishap_row_in_pieces_is_the_whole_batch_and_resumes_inside_it(tmp_path, scenes,
                                                                           monkeypatch):
    from reproduction import table1_parts as PARTS

    model = tiny_mdetr()
    kw = dict(explainers=("multishap",), regimes=("pure",), batch=4, key=jax.random.key(3),
              budgets=T1.sample_budgets({"multishap": 1}, "reference"), players="reference",
              models={"pure": model}, data={"pure": scenes, "spur": scenes})
    whole = T1.table1(4, parts_dir=tmp_path / "whole", **kw)
    calls = []

    def stop_after(k):  # records each call's number of samples
        return stopping_explainer(calls, k, lambda a, kk: int(np.shape(a[3].form)[0]))

    parts = tmp_path / "pieces"
    monkeypatch.setattr(T1, "call_explainer", stop_after(2))
    with pytest.raises(KeyboardInterrupt):
        T1.table1(4, parts_dir=parts, piece=1, **kw)
    saved = sorted(p.name for p in PARTS.pieces_dir(parts, "multishap_ref", "pure").iterdir())
    assert saved == ["b0000_s0000.npz", "b0000_s0001.npz"] and calls == [1, 1]
    assert not PARTS.part_path(parts, "multishap_ref", "pure").exists()
    # resumed: only the two missing samples run; the part equals the whole batch's
    calls.clear()
    monkeypatch.setattr(T1, "call_explainer", stop_after(99))
    again = T1.table1(4, parts_dir=parts, piece=1, **kw)
    assert calls == [1, 1]
    # float32 rounding of the batch's reductions differs with the batch size and the CPU's
    # vector width: up to 1.8e-5 on the spread's entropy (its log near nearly empty cells);
    # another key moves every score by 0.025 (entropy) to 1 (pointing)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-4),
                 again["per_sample"], whole["per_sample"])
    assert not PARTS.pieces_dir(parts, "multishap_ref", "pure").exists()
    # the same fingerprint (a part made in pieces serves a whole-batch run), and every sample's
    # maps come back from the pieces (log-odds: float32 rounding of p near 1)
    paths = [PARTS.part_path(d, "multishap_ref", "pure") for d in (parts, tmp_path / "whole")]
    fps = [PARTS.read_part(p)[1] for p in paths]
    assert fps[0] == fps[1]
    figs = [PARTS.load_part(p.parent, "multishap_ref", "pure", fps[0])[1] for p in paths]
    assert np.shape(figs[0].visual)[0] == np.shape(figs[1].visual)[0] == 4
    for a, b in ((figs[0].visual, figs[1].visual), (figs[0].textual, figs[1].textual)):
        np.testing.assert_allclose(a, b, atol=1e-4 * np.abs(b).max())  # another draw: O(1)
    # a piece of another run's settings is refused, naming the field
    calls.clear()
    monkeypatch.setattr(T1, "call_explainer", stop_after(1))
    with pytest.raises(KeyboardInterrupt):
        T1.table1(4, parts_dir=tmp_path / "p2", piece=2, **kw)
    with pytest.raises(InputError, match="key"):
        T1.table1(4, parts_dir=tmp_path / "p2", piece=2, **{**kw, "key": jax.random.key(4)})
    with pytest.raises(InputError, match="piece"):
        T1.table1(4, piece=0, **kw)


def test_maps_from_pieces_without_some_samples_maps_stop_before_the_first_missing(scenes):
    """Pieces saved before parts kept every sample's maps hold the first two samples' only: a
    row resumed from them returns the maps of samples 0..k-1 (row i = sample i), k the first
    sample whose maps are missing, never a stack that skips one."""
    model = tiny_mdetr()
    saved = {}

    def pieces(bi, a, z):
        return (lambda: saved.get((bi, a)),
                lambda *got: saved.__setitem__((bi, a), got))

    kw = dict(budget={"n_samples": 1}, batch=4, by_length=True, keep=4, piece=1, pieces=pieces)
    args = (multishap, model.apply, model.params, scenes, jax.random.key(2))
    _, maps, _ = T1.explain_row(*args, **kw)
    assert np.shape(maps.visual)[0] == 4
    order = T1.sample_order(scenes, True).tolist()  # [1, 3, 2, 0]: piece j holds sample order[j]
    # drop sample 2's maps (the piece at order position 2), as an old piece would have none
    j = order.index(2)
    scores, _, _, wall = saved[(0, j)]
    saved[(0, j)] = (scores, None, None, wall)
    per_sample, again, _ = T1.explain_row(*args, **kw)
    assert np.shape(again.visual)[0] == 2
    np.testing.assert_array_equal(again.visual, np.asarray(maps.visual)[:2])
    assert per_sample["form"].tolist() == np.asarray(scenes.form).tolist()


def test_a_dime_row_in_pieces_is_the_whole_batch_and_resumes_inside_it(tmp_path, scenes,
                                                                       monkeypatch):
    """DIME's set is the batch: a piece explains some samples (``positions``) against all of
    it, so the part equals the whole batch's; a stopped row resumes at its missing piece."""
    from gridvqa_jax.explain.multiviz import multiviz
    from reproduction import table1_parts as PARTS

    model = tiny_mdetr()
    kw = dict(explainers=("dime",), regimes=("pure",), batch=4, key=jax.random.key(8),
              budgets={"dime": {"n_samples": 8}}, models={"pure": model},
              data={"pure": scenes, "spur": scenes})
    whole = T1.table1(4, parts_dir=tmp_path / "whole", **kw)
    calls = []

    def stop_after(k):  # records each call's batch size and the samples it explains
        return stopping_explainer(
            calls, k, lambda a, kk: (int(np.shape(a[3].form)[0]), list(kk["positions"])))

    parts = tmp_path / "pieces"
    monkeypatch.setattr(T1, "call_explainer", stop_after(1))
    with pytest.raises(KeyboardInterrupt):
        T1.table1(4, parts_dir=parts, piece=3, **kw)
    assert calls == [(4, [0, 1, 2])]  # the whole batch, three samples explained
    assert [p.name for p in PARTS.pieces_dir(parts, "dime", "pure").iterdir()] == [
        "b0000_s0000.npz"]
    calls.clear()
    monkeypatch.setattr(T1, "call_explainer", stop_after(99))
    again = T1.table1(4, parts_dir=parts, piece=3, **kw)
    assert calls == [(4, [3])]
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-4),
                 again["per_sample"], whole["per_sample"])
    paths = [PARTS.part_path(d, "dime", "pure") for d in (parts, tmp_path / "whole")]
    assert PARTS.read_part(paths[0])[1] == PARTS.read_part(paths[1])[1]
    # an explainer with neither length batches nor positions cannot run in pieces
    assert T1.takes_pieces(T1.EXPLAINERS["dime"], False)
    assert not T1.takes_pieces(multiviz, False)
    with pytest.raises(ValueError, match="positions"):
        T1.explain_row(multiviz, model.apply, model.params, scenes, jax.random.key(1),
                       budget={}, batch=4, piece=1)
