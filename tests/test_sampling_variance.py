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


def test_shipped_runs_give_the_reported_ratios(experiment, capsys):
    """--shipped reads steps 5 and 6's runs (no model call): an i.i.d. run at K has 2,048 / K
    times the variance of one at 2,048 (recomputed here from the parts), and on these runs the
    stratified sizes remove about half of it on the visual maps (docs/results.md: 2.1 and
    2.3 pooled at 32 and 128)."""
    from reproduction import table1_parts as PARTS

    mod = experiment("sampling_variance")
    assert mod.main(["--shipped"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [r["coalitions"] for r in res] == [32, 128]
    parts = mod.SHIPPED
    iid = np.stack([np.asarray(PARTS.read_part_maps(
        parts / f"multishap_2048_{t}" / "multishap__pure.npz")[0].visual)[:8]
        for t in ("main", "split1", "split2")]).astype(np.float64)
    np.testing.assert_allclose(res[1]["visual"]["iid"],
                               16 * iid.var(0, ddof=1).sum((1, 2)), rtol=1e-6)
    for r in res:
        assert 1.8 < r["visual"]["ratio"] < 2.6 and 1.2 < r["textual"]["ratio"] < 1.8
