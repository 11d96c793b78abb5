"""experiments/sampling_variance.py on a tiny random GridMDETR: the variances are of
independent runs (two runs at one key would give 0), and the ratios are the variances' ratios."""

import json

import numpy as np
import pytest

from test_multiviz import tiny_mdetr


@pytest.mark.parametrize("row", ["cells", pytest.param("patches", marks=pytest.mark.slow)])
def test_variance_ratio_of_independent_runs(row, experiment, monkeypatch, capsys):
    """--start 1 --n 2 explains samples 1 and 2 of Table 1's pure draw."""
    from reproduction import table1 as T1

    mod = experiment("sampling_variance")
    monkeypatch.setattr(mod, "load_reference_model", lambda name: tiny_mdetr(seed=4))
    seen = []
    trim = mod.trim_tokens
    monkeypatch.setattr(mod, "trim_tokens", lambda s: seen.append(s) or trim(s))
    assert mod.main(["--row", row, "--n", "2", "--start", "1", "--runs", "2",
                     "--coalitions", "2"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    res = json.loads(out[-1])
    assert out[0].startswith(f"MultiSHAP, {row}, pure, n = 2 from sample 1, 2 runs")
    assert res["start"] == 1 and res["seed"] == T1.EXPLAIN_SEED
    draw = T1.regime_scenes("pure", 4)
    np.testing.assert_array_equal(seen[0].tokens, np.asarray(draw.tokens)[1:3])
    np.testing.assert_array_equal(seen[0].answer, np.asarray(draw.answer)[1:3])
    for mod_name in ("visual", "textual"):
        iid, strat = np.array(res[mod_name]["iid"]), np.array(res[mod_name]["stratified"])
        assert iid.shape == strat.shape == (2,)
        assert np.all(iid > 0) and np.all(strat > 0)  # the runs differ: independent keys
        assert res[mod_name]["ratio"] == pytest.approx(iid.sum() / strat.sum())
        np.testing.assert_allclose(res[mod_name]["ratio_per_sample"], iid / strat)
        assert res[mod_name]["ratio_geomean"] == pytest.approx(np.exp(np.log(iid / strat).mean()))
    if row == "cells":  # the variances of runs drawn here, each sampling as it is named
        import jax

        from gridvqa_jax.explain import multishap

        model, scenes = tiny_mdetr(seed=4), trim(seen[0])
        for s in ("iid", "stratified"):
            runs = [multishap(model[0], model[1], scenes,
                              jax.random.fold_in(jax.random.key(T1.EXPLAIN_SEED), r),
                              n_samples=2, sampling=s) for r in range(2)]
            vis = np.stack([np.asarray(a.visual).reshape(2, -1) for a in runs]).astype(float)
            txt = np.stack([np.asarray(a.textual) for a in runs]).astype(float)
            np.testing.assert_allclose(res["visual"][s], vis.var(0, ddof=1).sum(-1), rtol=1e-5)
            np.testing.assert_allclose(res["textual"][s], txt.var(0, ddof=1).sum(-1), rtol=1e-5)
        assert not np.allclose(res["visual"]["iid"], res["visual"]["stratified"])
    with pytest.raises(SystemExit):
        mod.main(["--runs", "1"])


def test_shipped_runs_give_the_reported_ratios(experiment, capsys):
    """--shipped reads steps 5 and 6's runs (no model call): an i.i.d. run at K has 2,048 / K
    times the variance of one at 2,048 (recomputed here from the parts), and on these runs the
    stratified sizes remove about half of it on the visual maps at every budget of step 6
    (docs/results.md: 2.13, 2.29, 1.99 and 2.44 pooled at 32, 128, 256 and 512), less of it
    on the textual maps (1.18-1.57)."""
    from reproduction import table1_parts as PARTS

    mod = experiment("sampling_variance")
    assert mod.main(["--shipped"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [r["coalitions"] for r in res] == [32, 128, 256, 512]
    parts = mod.SHIPPED
    iid = np.stack([np.asarray(PARTS.read_part_maps(
        parts / f"multishap_2048_{t}" / "multishap__pure.npz")[0].visual)[:8]
        for t in ("main", "split1", "split2")]).astype(np.float64)
    np.testing.assert_allclose(res[1]["visual"]["iid"],
                               16 * iid.var(0, ddof=1).sum((1, 2)), rtol=1e-6)
    for r in res:  # over cells the visual gain is resolved at every budget
        assert 1.8 < r["visual"]["ratio"] < 2.6 and r["visual"]["ratio_ci"][0] > 1.3
    for r in res[:2]:  # 32 and 128, as checked before 256 and 512 had their three runs
        assert 1.2 < r["textual"]["ratio"] < 1.8 and r["visual"]["ratio_ci"][0] > 1.5
    for r in res[2:]:  # 256 and 512: visual low end 1.42 at 256, textual 1.18 at 512
        assert 1.1 < r["textual"]["ratio"] < 1.8


def test_ratio_interval_is_a_paired_bootstrap_of_the_pooled_ratio(experiment):
    mod = experiment("sampling_variance")
    rng = np.random.default_rng(1)
    a = rng.gamma(2.0, 1.0, 12)
    assert mod.ratio_interval(a, a / 2) == pytest.approx([2.0, 2.0])  # every resample: 2
    b = a * rng.lognormal(0.0, 0.5, 12)
    lo, hi = mod.ratio_interval(a, b)
    assert lo < a.sum() / b.sum() < hi
    # against a bootstrap written here with numpy (pairs drawn together, percentiles)
    idx = rng.integers(0, 12, (40_000, 12))
    want = np.percentile(a[idx].sum(1) / b[idx].sum(1), [2.5, 97.5])
    np.testing.assert_allclose([lo, hi], want, rtol=0.03)
    # unpaired resampling would be wider here: a and b move together across samples
    unpaired = (a[idx].sum(1) / b[rng.integers(0, 12, (40_000, 12))].sum(1))
    assert np.ptp(np.percentile(unpaired, [2.5, 97.5])) > hi - lo


def test_saved_run_over_patches_is_summarised_again(experiment, capsys, tmp_path):
    """--saved reads the shipped patches run (8 samples, 3 runs per sampling, 32 coalitions)
    and recomputes its summary from the per-sample variances (docs/results.md: visual 1.13
    [0.88, 1.58], textual 1.52 [0.79, 2.51])."""
    mod = experiment("sampling_variance")
    shipped = mod.SHIPPED.parent / "sampling_variance_patches.txt"
    assert mod.main(["--saved", str(shipped)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    res = json.loads(out[-1])
    assert res["row"] == "patches" and res["n"] == 8 and res["runs"] == 3
    for m, want in (("visual", 1.13), ("textual", 1.52)):
        iid, strat = np.array(res[m]["iid"]), np.array(res[m]["stratified"])
        assert res[m]["ratio"] == pytest.approx(iid.sum() / strat.sum())
        assert round(res[m]["ratio"], 2) == want
        lo, hi = res[m]["ratio_ci"]
        assert lo < 1.0 < hi  # over patches at 32 coalitions the gain is not resolved
    # two runs on disjoint samples pool into the run on all of them
    halves = []
    for start in (0, 4):
        part = dict(res, n=4, start=start, seconds={"iid": 1.0, "stratified": 2.0})
        for m in ("visual", "textual"):
            part[m] = {k: res[m][k][start:start + 4] for k in ("iid", "stratified")}
        halves.append(tmp_path / f"half{start}.txt")
        halves[-1].write_text("printed text\n" + json.dumps(part) + "\n")
    assert mod.main(["--saved", *map(str, halves)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    both = json.loads(out[-1])
    assert "n = 8 (samples 0-3, 4-7)" in out[0]
    assert both["parts"] == [[0, 4], [4, 4]] and both["seconds"] == {"iid": 2.0,
                                                                      "stratified": 4.0}
    for m in ("visual", "textual"):
        assert both[m]["iid"] == res[m]["iid"] and both[m]["ratio_ci"] == res[m]["ratio_ci"]
    for clash, why in ((str(halves[0]), "overlap"), (str(shipped), "overlap")):
        with pytest.raises(SystemExit):
            mod.main(["--saved", str(halves[0]), clash])
        assert why in capsys.readouterr().err
    other = tmp_path / "other.txt"
    other.write_text(json.dumps(dict(json.loads(halves[1].read_text().splitlines()[-1]),
                                     coalitions=128)) + "\n")
    with pytest.raises(SystemExit):
        mod.main(["--saved", str(halves[0]), str(other)])
    assert "coalitions 128, not 32" in capsys.readouterr().err
    # samples are numbered within one draw: another seed's samples 4-7 are another draw
    other.write_text(json.dumps(dict(json.loads(halves[1].read_text().splitlines()[-1]),
                                     seed=1)) + "\n")
    with pytest.raises(SystemExit):
        mod.main(["--saved", str(halves[0]), str(other)])
    assert "seed 1, not 913000" in capsys.readouterr().err
    # the next 8 samples, pooled with the first: over patches the gain is at most about 1.2x
    # (docs/results.md: visual 1.06 [0.94, 1.20], textual 1.21 [0.84, 1.71])
    rest = shipped.with_name("sampling_variance_patches_8_15.txt")
    assert mod.main(["--saved", str(shipped), str(rest)]) == 0
    res16 = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res16["n"] == 16 and res16["parts"] == [[0, 8], [8, 8]]
    lo, hi = res16["visual"]["ratio_ci"]
    assert lo < 1.0 and hi < 1.25 and round(res16["visual"]["ratio"], 2) == 1.06
    assert round(res16["textual"]["ratio"], 2) == 1.21
    bad = tmp_path / "bad.txt"
    bad.write_text('{"row": "cells"}\n')
    with pytest.raises(SystemExit):
        mod.main(["--saved", str(bad)])
    assert "no visual variances" in capsys.readouterr().err
