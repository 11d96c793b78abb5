"""experiments/permutation_error.py on a tiny random GridMDETR: its exact values are the
brute-force Shapley values of the bench's 12-player game (itertools, float64), its MAE is
that of the estimates it reports, and the estimator's mean over keys sits on the exact
values."""

import itertools
import json
import math

import numpy as np
import pytest

from test_multiviz import tiny_mdetr


def test_errors_are_against_the_brute_force_shapley_values(experiment, monkeypatch, capsys):
    mod = experiment("permutation_error")
    monkeypatch.setattr(mod, "load_reference_model", lambda name: tiny_mdetr(seed=5))
    built = mod.bench_game()
    monkeypatch.setattr(mod, "bench_game", lambda: built)  # main's game: built once
    game, m, phi = built
    assert m == 12
    masks = np.array(list(itertools.product([False, True], repeat=m)))
    v = dict(zip(map(tuple, masks), np.asarray(game(masks), np.float64)))
    brute = np.zeros(m)
    for s in masks:
        for i in np.flatnonzero(~s):
            k = int(s.sum())
            w = math.factorial(k) * math.factorial(m - k - 1) / math.factorial(m)
            t = s.copy()
            t[i] = True
            brute[i] += w * (v[tuple(t)] - v[tuple(s)])
    np.testing.assert_allclose(phi, brute, rtol=1e-4, atol=1e-5)
    assert np.abs(brute).max() > 1e-3  # the tiny model's game is not flat

    res = mod.main(["--keys", "64", "--budget", "200"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out == res and res["players"] == 12 and res["keys"] == 64
    # the budget spent: 18 antithetic permutations, 18 * 11 + 2 = 200 evaluations
    assert res["permutations"] == 18 and res["evaluations"] == 200
    assert res["mae_of_zero"] == pytest.approx(np.abs(brute).mean(), rel=1e-4)
    # the statistics of the estimates, against the brute-force values (numpy); the estimates
    # are drawn again with the script's keys
    import jax

    from gridvqa_jax.explain import shapley as SH

    one = jax.jit(lambda k: SH.permutation_shapley(game, m, k, 18))  # one key at a time
    est = np.stack([np.asarray(one(k), np.float64)
                    for k in jax.random.split(jax.random.key(0), 64)])
    mae = np.abs(est - brute).mean(axis=1)
    assert res["mae_mean"] == pytest.approx(mae.mean(), rel=1e-3)
    assert res["mae_sd"] == pytest.approx(mae.std(ddof=1), rel=1e-3)
    bench = np.asarray(one(jax.random.key(2)), np.float64)
    assert res["mae_bench_key"] == pytest.approx(np.abs(bench - brute).mean(), rel=1e-3)
    in_se = np.abs(est.mean(0) - brute) / (est.std(0, ddof=1) / np.sqrt(64))
    assert res["max_bias_in_se"] == pytest.approx(in_se.max(), rel=1e-2)
    assert 0 < res["mae_mean"] < res["mae_of_zero"]
    assert res["max_bias_in_se"] < 4.5  # unbiased: 12 players, 4.5 standard errors
    with pytest.raises(SystemExit):
        mod.main(["--keys", "1"])
