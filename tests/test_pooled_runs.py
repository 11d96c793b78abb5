"""Independent MultiSHAP runs pool into one estimate at their summed budget
(reproduction.pooled_runs), checked against the exact SII, and Table 1 parts pool only when
they are draws of one estimator on the same samples."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from gridvqa_jax.explain.scoring import per_sample_scores
from mmx_base.errors import InputError
from reproduction import pooled_runs as PR
from reproduction import table1 as T1
from reproduction import table1_parts as PARTS
from test_multishap import APPLY_TANH, MS, PX, exact_cell_token_sii, toy_params, toy_scenes
from test_multiviz import tiny_mdetr


def test_pooled_runs_are_as_close_to_the_exact_sii_as_one_run_at_their_summed_budget():
    # 16 copies of one toy sample (4 cells + 6 tokens: exact SII by enumeration) in one batch:
    # 16 independent runs at K = 16 coalitions; pooled in fours, 4 estimates at 64; and 16
    # more runs at 64 drawn directly
    S, R = 2, 16
    params, base = toy_params(S, seed=1), toy_scenes(S, [6, 4], seed=1)
    scenes = jax.tree.map(lambda a: np.repeat(a[:1], R, 0), base)
    exact = exact_cell_token_sii(params, base, 0, S, lambda s: 2.0 * np.tanh(s))
    want = exact.sum(1).reshape(S, S)  # the visual map: signed sum over the tokens

    def runs(key, k):
        att = MS.multishap(APPLY_TANH, params, scenes, key, cell_px=PX, n_samples=k)
        return [jax.tree.map(lambda a: np.asarray(a)[i:i + 1] if a is not None else None, att)
                for i in range(R)]

    low, high = runs(jax.random.key(0), 16), runs(jax.random.key(1), 64)
    pooled = [PR.pool_maps(low[i:i + 4]) for i in range(0, R, 4)]
    np.testing.assert_allclose(pooled[0].visual,
                               np.mean([np.asarray(a.visual) for a in low[:4]], 0), rtol=1e-6)
    mse = {name: np.mean([(np.asarray(a.visual)[0] - want) ** 2 for a in maps])
           for name, maps in (("16", low), ("4 x 16", pooled), ("64", high))}
    # the Monte Carlo variance falls as 1/K: a quarter from 16 to 64, pooled or drawn at once
    assert mse["4 x 16"] < mse["16"] / 2, mse
    assert mse["64"] < mse["16"] / 2, mse
    assert 0.4 < mse["4 x 16"] / mse["64"] < 2.5, mse
    # summing the runs instead of averaging them would be 16x the mean map: far off
    summed = np.sum([np.asarray(a.visual)[0] for a in low[:4]], 0)
    assert np.mean((summed - want) ** 2) > 10 * mse["4 x 16"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three Table 1 MultiSHAP runs on its first 4 samples of D_pure with independent keys
    (parts keep every sample's maps), and the samples."""
    model = tiny_mdetr()
    root = tmp_path_factory.mktemp("pool")
    paths = []
    for i in range(3):
        T1.table1(4, explainers=("multishap",), regimes=("pure",), batch=4,
                  key=jax.random.key(10 + i), budgets={"multishap": {"n_samples": 2}},
                  models={"pure": model}, parts_dir=root / f"run{i}")
        paths.append(PARTS.part_path(root / f"run{i}", "multishap", "pure"))
    return paths, T1.regime_scenes("pure", 4)


def test_parts_keep_every_samples_maps_and_pool_at_the_summed_budget(runs):
    paths, scenes = runs
    maps = [PARTS.read_part_maps(p)[0] for p in paths]
    assert all(np.shape(m.visual) == (4, 5, 5) for m in maps)
    got = PR.pool_parts(paths, scenes)
    assert got["n"] == 4 and got["budget"] == {"n_samples": 6}
    want = per_sample_scores(PR.pool_maps(maps), scenes)
    np.testing.assert_allclose(got["pooled"]["visual"]["cell"]["rma"],
                               want["visual"]["cell"]["rma"], rtol=1e-6)
    for run, path in zip(got["runs"], paths):
        np.testing.assert_allclose(run["visual"]["pixel"]["rma"],
                                   PARTS.read_part(path)[0]["visual"]["pixel"]["rma"], atol=1e-5)
    # independent draws: the pooled map is none of the runs' maps
    assert not any(np.allclose(PR.pool_maps(maps).visual, m.visual) for m in maps)
    # the first m samples of every run
    two = PR.pool_parts(paths[:2], jax.tree.map(lambda a: a[:2], scenes))
    assert two["n"] == 2 and two["budget"] == {"n_samples": 4}


def _rewrite(path, out, fingerprint=None, keep=None):
    """A copy of a part with another fingerprint, or with the maps of its first ``keep``
    samples only."""
    maps, scores, fp = PARTS.read_part_maps(path)
    if keep is not None:
        maps = jax.tree.map(lambda a: np.asarray(a)[:keep], maps)
    out.mkdir(parents=True, exist_ok=True)
    return PARTS.save_part(out, "multishap", "pure", scores, fingerprint or fp, maps)


def test_pooling_refuses_what_is_not_draws_of_one_estimator_on_these_samples(runs, tmp_path):
    paths, scenes = runs
    fp = PARTS.read_part(paths[1])[1]
    with pytest.raises(InputError, match="at least two"):
        PR.pool_parts(paths[:1], scenes)
    with pytest.raises(InputError, match="same key"):
        PR.pool_parts([paths[0], paths[0]], scenes)
    dime = _rewrite(paths[1], tmp_path / "dime",
                    {**fp, "function": "gridvqa_jax.explain.dime.dime"})
    with pytest.raises(InputError, match="not a mean of coalition draws"):
        PR.pool_parts([paths[0], dime], scenes)
    ref = _rewrite(paths[1], tmp_path / "abs", {**fp, "budget": {"n_samples": 2,
                                                                 "text_aggregate": "abs"}})
    with pytest.raises(InputError, match="text_aggregate = 'abs'"):
        PR.pool_parts([paths[0], ref], scenes)
    strat = _rewrite(paths[1], tmp_path / "strat",
                     {**fp, "budget": {**fp["budget"], "sampling": "stratified"}})
    with pytest.raises(InputError, match="stratified; R such runs"):
        PR.pool_parts([paths[0], strat], scenes)
    other = _rewrite(paths[1], tmp_path / "budget", {**fp, "budget": {"n_samples": 8}})
    with pytest.raises(InputError, match="budget differ"):
        PR.pool_parts([paths[0], other], scenes)
    old = _rewrite(paths[1], tmp_path / "old", keep=2)
    with pytest.raises(InputError, match="maps of 2 samples, fewer than the 4"):
        PR.pool_parts([paths[0], old], scenes)
    # the samples in another order are not the runs' samples
    shuffled = jax.tree.map(lambda a: np.asarray(a)[[1, 0, 3, 2]], scenes)
    with pytest.raises(InputError, match="do not give its saved scores"):
        PR.pool_parts(paths[:2], shuffled)


def test_pool_runs_script_regenerates_the_samples_and_prints_the_pooled_row(runs, capsys,
                                                                           tmp_path, experiment):
    import json

    main = experiment("pool_runs").main
    paths, scenes = runs
    reads = []
    read = PARTS.read_part_maps
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(PARTS, "read_part_maps", lambda p: reads.append(str(p)) or read(p))
        assert main([str(p) for p in paths]) == 0
    assert sorted(reads) == sorted(map(str, paths))  # each part read once
    out = capsys.readouterr().out.splitlines()
    res = json.loads(out[-1])
    assert out[0].startswith("3 runs pooled into one at {'n_samples': 6} (pure, n = 4)")
    want = PR.pool_parts(paths, scenes)
    rma = lambda s: np.nanmean(s["visual"]["pixel"]["rma"])  # noqa: E731
    assert res["visual_rma"]["pooled"] == pytest.approx(rma(want["pooled"]), abs=1e-6)
    assert res["visual_rma"]["runs"] == pytest.approx([rma(s) for s in want["runs"]], abs=1e-6)
    # a part of another regime is refused before anything is scored
    fp = PARTS.read_part(paths[1])[1]
    spur = _rewrite(paths[1], tmp_path / "spur", {**fp, "regime": "spurious"})
    with pytest.raises(SystemExit):
        main([str(paths[0]), str(spur)])
    assert "regimes ['pure', 'spurious']" in capsys.readouterr().err
