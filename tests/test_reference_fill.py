"""experiments/reference_fill.py: its paired differences are the per-sample differences' mean
with a normal 95% interval, computed here from scratch with scipy."""

import numpy as np
from scipy import stats as sps


def _row(rng, n, shift):
    return {"visual": {"pixel": {"rma": rng.uniform(0, 1, n) + shift,
                                 "iou": rng.uniform(0, 1, n) - shift}}}


def test_summary_is_the_paired_difference_with_its_normal_interval(experiment):
    mod = experiment("reference_fill")
    rng = np.random.default_rng(0)
    n = 40
    rows = {"dime_ref, black": {"pure": _row(rng, n, 0.0)},
            "dime_ref, empty": {"pure": _row(rng, n, 0.2)},
            "objects floor": {"pure": _row(rng, n, 0.1)}}
    rows["dime_ref, empty"]["pure"]["visual"]["pixel"]["rma"][3] = np.nan  # a failed sample
    s = mod.summary(rows, ["pure"], "dime_ref, black")
    z = sps.norm.ppf(0.975)
    for name in rows:
        for m in ("rma", "iou"):
            x = rows[name]["pure"]["visual"]["pixel"][m]
            for ref, key in (("dime_ref, black", "minus_reference"),
                             ("objects floor", "minus_floor")):
                d = x - rows[ref]["pure"]["visual"]["pixel"][m]
                d = d[np.isfinite(d)]
                half = z * sps.sem(d)
                got = s[name]["pure"][m][key]
                np.testing.assert_allclose(got, (d.mean(), d.mean() - half, d.mean() + half),
                                           rtol=1e-3, atol=1e-12)
            np.testing.assert_allclose(s[name]["pure"][m]["mean"], np.nanmean(x))
    assert s["dime_ref, empty"]["pure"]["rma"]["minus_reference"][1] > 0  # +0.2 shift, 40 samples
    text = mod.format_summary(s, "dime", n, 64)
    assert "dime_ref, empty" in text and "objects floor" in text and "- black" in text


def test_the_reference_fill_runs_first(experiment):
    mod = experiment("reference_fill")
    assert mod.fills("dime") == ("black", "empty", "gray")
    assert mod.fills("multishap") == ("gray", "black", "empty")
