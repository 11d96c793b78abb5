"""experiments/sampling_variance.py on a tiny random GridMDETR: the variances are of
independent runs (two runs at one key would give 0), and the ratios are the variances' ratios."""

import json

import numpy as np
import pytest

from test_multiviz import tiny_mdetr


@pytest.mark.parametrize("row", ["cells", pytest.param("patches", marks=pytest.mark.slow)])
def test_variance_ratio_of_independent_runs(row, experiment, monkeypatch, capsys):
    mod = experiment("sampling_variance")
    monkeypatch.setattr(mod, "load_reference_model", lambda name: tiny_mdetr(seed=4))
    assert mod.main(["--row", row, "--n", "2", "--runs", "2", "--coalitions", "2"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    res = json.loads(out[-1])
    assert out[0].startswith(f"MultiSHAP, {row}, pure, n = 2, 2 runs")
    for mod_name in ("visual", "textual"):
        iid, strat = np.array(res[mod_name]["iid"]), np.array(res[mod_name]["stratified"])
        assert iid.shape == strat.shape == (2,)
        assert np.all(iid > 0) and np.all(strat > 0)  # the runs differ: independent keys
        assert res[mod_name]["ratio"] == pytest.approx(iid.sum() / strat.sum())
        np.testing.assert_allclose(res[mod_name]["ratio_per_sample"], iid / strat)
        assert res[mod_name]["ratio_geomean"] == pytest.approx(np.exp(np.log(iid / strat).mean()))
    with pytest.raises(SystemExit):
        mod.main(["--runs", "1"])
