"""reproduction.stats: the intervals against scipy.stats and exact enumeration, the bootstrap
helpers, and the verdict rule on constructed intervals."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from reproduction import stats as STATS


# ---------------------------------------------------------------------------------------------
# Proportions
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k,n", [(0, 50), (7, 40), (33, 40), (20, 20), (1, 3), (150, 400)])
def test_wilson_equals_scipy(k, n):
    ref = sps.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    lo, hi = STATS.wilson(k, n, z=float(sps.norm.ppf(0.975)))
    assert lo == pytest.approx(ref.low, abs=1e-12) and hi == pytest.approx(ref.high, abs=1e-12)
    # with z = 1.96 (the module's Z) the bounds move by less than 1e-4
    lo2, hi2 = STATS.wilson(k, n)
    assert abs(lo2 - ref.low) < 1e-4 and abs(hi2 - ref.high) < 1e-4


def test_wilson_exact_coverage_and_edges():
    # exact coverage at p = 0.3, n = 60: the binomial mass of the k whose interval holds p
    n, p = 60, 0.3
    cover = sum(sps.binom.pmf(k, n, p) for k in range(n + 1)
                if STATS.wilson(k, n)[0] <= p <= STATS.wilson(k, n)[1])
    assert 0.93 < cover < 0.97
    lo, hi = STATS.wilson(0, 50)
    assert lo == 0.0 and hi == pytest.approx(STATS.Z ** 2 / (50 + STATS.Z ** 2))
    assert all(math.isnan(x) for x in STATS.wilson(0, 0))


def test_diff_ci_is_newcombes_hybrid_score_interval():
    # Newcombe (1998), Table II, example (a): 56/70 - 48/80, method 10: 0.0524 to 0.3339
    d, lo, hi = STATS.diff_ci(56, 70, 48, 80)
    assert d == pytest.approx(0.2) and (lo, hi) == pytest.approx((0.0524, 0.3339), abs=5e-5)
    assert all(math.isnan(x) for x in STATS.diff_ci(1, 0, 1, 4))
    # two groups all right: not a zero-width interval (the normal one is [0, 0])
    d, lo, hi = STATS.diff_ci(5, 5, 7, 7)
    assert d == 0 and lo < -0.3 and hi > 0.3
    # coverage over simulated pairs of small groups near 1, where the normal interval fails
    rng = np.random.default_rng(0)
    k1, k2 = rng.binomial(8, 0.95, 4000), rng.binomial(30, 0.7, 4000)
    cover = np.mean([lo <= 0.25 <= hi for _, lo, hi in
                     (STATS.diff_ci(a, 8, b, 30) for a, b in zip(k1, k2))])
    assert cover > 0.93, cover


# ---------------------------------------------------------------------------------------------
# Means
# ---------------------------------------------------------------------------------------------
def test_welch_equals_scipy_and_drops_nan():
    rng = np.random.default_rng(0)
    a, b = rng.normal(0.3, 1.0, 25), rng.normal(0.0, 2.0, 40)
    d, se = STATS.welch(a, b)
    t = sps.ttest_ind(a, b, equal_var=False).statistic
    assert d == pytest.approx(a.mean() - b.mean()) and d / se == pytest.approx(t)
    with_nan = np.concatenate([a, [np.nan, np.inf]])
    assert STATS.welch(with_nan, b) == pytest.approx((d, se))
    assert all(math.isnan(x) for x in STATS.welch([1.0], b))


def test_contrast_is_the_weighted_sum_of_means():
    rng = np.random.default_rng(1)
    g = [rng.normal(m, s, n) for m, s, n in ((1, 1, 30), (2, 0.5, 20), (0, 3, 50))]
    w = [1.0, -0.5, -0.5]
    est, se = STATS.contrast(g, w)
    assert est == pytest.approx(g[0].mean() - 0.5 * g[1].mean() - 0.5 * g[2].mean())
    assert se == pytest.approx(math.sqrt(sum(wi ** 2 * sps.sem(x) ** 2 for wi, x in zip(w, g))))
    with pytest.raises(ValueError):
        STATS.contrast(g, [1.0, -1.0])


def test_paired_equals_scipy_sem_and_the_paired_t():
    a = np.array([1, 1, 1, 0, 1, 1, 0, 1], float)
    b = np.array([0, 1, 0, 0, 1, 0, 0, 1], float)
    d, se = STATS.paired(a, b)
    assert d == pytest.approx(0.375) and se == pytest.approx(sps.sem(a - b))
    assert d / se == pytest.approx(sps.ttest_rel(a, b).statistic)
    m, lo, hi = STATS.paired_ci(a, b)
    assert (m, lo, hi) == pytest.approx((d, d - 1.96 * se, d + 1.96 * se))
    # a pair with a NaN on either side is dropped
    a2, b2 = np.append(a, np.nan), np.append(b, 1.0)
    assert STATS.paired(a2, b2) == pytest.approx((d, se))


def test_paired_counts_ci_is_agresti_mins_interval_and_keeps_its_coverage():
    # by hand: gained 3, lost 1 of 20 -> cells + 1/2: p_b = 3.5 / 22, p_c = 1.5 / 22, and the
    # matched-pairs Wald variance (p_b + p_c - (p_b - p_c)^2) / 22
    pb, pc = 3.5 / 22, 1.5 / 22
    se = math.sqrt((pb + pc - (pb - pc) ** 2) / 22)
    d, lo, hi = STATS.paired_counts_ci(3, 1, 20)
    assert d == pytest.approx(0.1)
    assert (lo, hi) == pytest.approx((pb - pc - 1.96 * se, pb - pc + 1.96 * se))
    a = np.array([1] * 3 + [0] * 1 + [1] * 6 + [0] * 10, bool)
    b = np.array([0] * 3 + [1] * 1 + [1] * 6 + [0] * 10, bool)
    assert STATS.paired_binary_ci(a, b) == (d, lo, hi)
    # two raters that agree on all 128 samples: not a zero-width interval
    d0, lo0, hi0 = STATS.paired_counts_ci(0, 0, 128)
    assert d0 == 0 and lo0 < 0 < hi0 and hi0 - lo0 > 0.02
    assert STATS.paired_ci(np.ones(128), np.ones(128))[1:] == (0.0, 0.0)  # the plain one
    # every sample discordant one way: the interval holds d = -1 and stays inside [-1, 1]
    assert STATS.paired_counts_ci(0, 300, 300) == (-1.0, -1.0, pytest.approx(-0.9822, abs=1e-4))
    # coverage of the true difference over simulated tables, where discordance is rare
    rng = np.random.default_rng(0)
    for p_b, p_c, n in ((0.01, 0.01, 100), (0.02, 0.005, 60), (0.08, 0.02, 80)):
        cells = rng.multinomial(n, [p_b, p_c, 1 - p_b - p_c], size=4000)
        cover = np.mean([lo <= p_b - p_c <= hi for _, lo, hi in
                         (STATS.paired_counts_ci(g, l, n) for g, l, _ in cells)])
        assert cover > 0.93, (p_b, p_c, cover)
        if n == 60:  # the plain paired interval misses the truth whenever few are discordant
            plain = np.mean([abs((g - l) / n - (p_b - p_c)) <= 1.96 * math.sqrt(
                max(g + l - (g - l) ** 2 / n, 0) / (n - 1) / n) for g, l, _ in cells])
            assert plain < 0.85, plain


def test_mean_ci_from_the_population_std():
    x = np.array([0.2, 0.5, 0.9, 0.4, 0.7])
    lo, hi = STATS.mean_ci(x.mean(), x.std(), len(x))
    assert hi - x.mean() == pytest.approx(1.96 * sps.sem(x))
    assert all(math.isnan(v) for v in STATS.mean_ci(0.5, 0.1, 1))


# ---------------------------------------------------------------------------------------------
# Verdicts
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ci, claim, want", [
    ((0.1, 0.3), (">", 0.0), "reproduced"),
    ((-0.3, -0.1), (">", 0.0), "refuted"),
    ((-0.1, 0.2), (">", 0.0), "inconclusive"),
    ((0.0, 0.2), (">", 0.0), "inconclusive"),  # touching the threshold is not above it
    ((-0.3, 0.0), (">", 0.0), "refuted"),
    ((-0.3, -0.1), ("<", 0.0), "reproduced"),
    ((0.1, 0.3), ("<", 0.0), "refuted"),
    ((92.0, 100.0), ("in", 90.0, 100.0), "reproduced"),
    ((40.0, 60.0), ("in", 90.0, 100.0), "refuted"),
    ((85.0, 95.0), ("in", 90.0, 100.0), "inconclusive"),
    ((float("nan"), 1.0), (">", 0.0), "inconclusive"),
    (None, (">", 0.0), "inconclusive"),
])
def test_verdict(ci, claim, want):
    assert STATS.verdict(ci, claim) == want


def test_verdict_from_a_normal_interval_uses_1_96():
    # d = 1.97 se is reproduced, d = 1.95 se is not (the rule is z = 1.96, not 2 SE)
    assert STATS.verdict(STATS.interval(1.97, 1.0), (">", 0.0)) == "reproduced"
    assert STATS.verdict(STATS.interval(1.95, 1.0), (">", 0.0)) == "inconclusive"
    assert STATS.verdict(STATS.interval(-1.97, 1.0), (">", 0.0)) == "refuted"


def test_verdict_unknown_claim():
    with pytest.raises(ValueError):
        STATS.verdict((0, 1), ("~", 0))
    with pytest.raises(ValueError):
        STATS.verdict(None, ("~", 0))


@pytest.mark.parametrize("parts, want", [
    (["reproduced", "reproduced"], "reproduced"),
    (["reproduced", "inconclusive"], "inconclusive"),
    (["reproduced", "refuted", "inconclusive"], "refuted"),
    ([], "inconclusive"),
])
def test_all_of(parts, want):
    assert STATS.all_of(parts) == want


def test_finding_rejects_another_vocabulary():
    f = STATS.finding("P", "name", "claim", "reproduced", "ev")
    assert f == {"paper": "P", "finding": "name", "claim": "claim", "verdict": "reproduced",
                 "evidence": "ev", "n": None, "width": None}
    assert STATS.finding("P", "name", "claim", "refuted", "ev", n="8 per regime",
                         width=12.5)["width"] == 12.5
    for v in ("holds", "not significant", "increasing"):
        with pytest.raises(ValueError):
            STATS.finding("P", "name", "claim", v, "ev")


def test_holm_is_the_step_down_rule():
    """Holm's adjusted p-values reject exactly what the step-down procedure rejects at every
    alpha (the procedure run directly: compare p_(k) with alpha / (m - k + 1) until the first
    failure), on random families with ties and NaN."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        m = int(rng.integers(1, 9))
        p = np.round(rng.random(m) ** 2, 2)
        if m > 2:
            p[rng.integers(0, m)] = np.nan
        adj = STATS.holm(p)
        ok = [i for i in range(m) if np.isfinite(p[i])]
        assert all(np.isnan(adj[i]) for i in range(m) if i not in ok)
        for alpha in (0.01, 0.05, 0.2, 0.5):
            rejected, mm = set(), len(ok)
            for k, i in enumerate(sorted(ok, key=lambda i: p[i])):
                if p[i] <= alpha / (mm - k):
                    rejected.add(i)
                else:
                    break
            assert {i for i in ok if adj[i] <= alpha} == rejected


def test_claim_pvalues_are_one_sided_normal_tails():
    p, q = STATS.claim_pvalues(-0.10, 0.02, ("<", -0.05))
    assert p == pytest.approx(sps.norm.cdf((-0.10 + 0.05) / 0.02))
    assert p + q == pytest.approx(1.0)
    p, _ = STATS.claim_pvalues(3.0, 1.0, (">", 1.0))
    assert p == pytest.approx(sps.norm.sf(2.0))
    assert np.isnan(STATS.claim_pvalues(float("nan"), 1.0, (">", 0))[0])


def test_claim_pvalues_with_degrees_of_freedom_are_students():
    p, q = STATS.claim_pvalues(-0.10, 0.02, ("<", -0.05), df=7)
    assert p == pytest.approx(sps.t.cdf((-0.10 + 0.05) / 0.02, 7)) and p + q == pytest.approx(1)
    assert p > STATS.claim_pvalues(-0.10, 0.02, ("<", -0.05))[0]  # heavier tails than normal
    # holm_verdicts takes the degrees of freedom as a fourth element: at 3 degrees of freedom
    # a z of 2.5 is not enough (t p = 0.044), at the normal it is (p = 0.006)
    assert STATS.holm_verdicts([(2.5, 1.0, (">", 0.0), 3)]) == ["inconclusive"]
    assert STATS.holm_verdicts([(2.5, 1.0, (">", 0.0))]) == ["reproduced"]
    d = STATS.independent_difference(0.5, 0.03, 0.2, 0.04, df_a=8, df_b=12)
    df = (0.03 ** 2 + 0.04 ** 2) ** 2 / (0.03 ** 4 / 8 + 0.04 ** 4 / 12)
    assert d["df"] == pytest.approx(df)
    assert d["ci"] == pytest.approx([0.3 - sps.t.ppf(0.975, df) * 0.05,
                                     0.3 + sps.t.ppf(0.975, df) * 0.05])


def test_holm_verdicts_need_the_minimum_effect_and_survive_multiplicity():
    # a precisely measured fall of 0.014 is not a fall of at least 0.05: refuted, not "decreasing"
    tests = [(-0.014, 0.003, ("<", -0.05)), (-0.20, 0.02, ("<", -0.05)),
             (-0.06, 0.05, ("<", -0.05))]
    assert STATS.holm_verdicts(tests) == ["refuted", "reproduced", "inconclusive"]
    # one test at p = 0.02 is reproduced alone, not in a family of nine equal ones
    z = sps.norm.isf(0.02)
    one = (z * 1.0 + 0.0, 1.0, (">", 0.0))
    assert STATS.holm_verdicts([one]) == ["reproduced"]
    assert STATS.holm_verdicts([one] * 9) == ["inconclusive"] * 9
    # alpha is per side, as the two-sided 95% intervals of every other verdict: p = 0.03 is
    # not enough (a 95% interval would reach the threshold)
    three = (sps.norm.isf(0.03), 1.0, (">", 0.0))
    assert STATS.holm_verdicts([three]) == ["inconclusive"]
    assert STATS.holm_verdicts([three], alpha=0.05) == ["reproduced"]
    # a statistic that did not vary (se 0) is no evidence either way
    assert STATS.holm_verdicts([(0.5, 0.0, (">", 0.0)), (-0.5, 0.0, (">", 0.0))]) == \
        ["inconclusive", "inconclusive"]


def test_independent_difference_adds_variances():
    d = STATS.independent_difference(0.5, 0.03, 0.2, 0.04, scale=100)
    assert d["mean"] == pytest.approx(30.0) and d["se"] == pytest.approx(5.0)
    assert d["ci"] == pytest.approx([30 - 1.96 * 5, 30 + 1.96 * 5])


def test_points_formats_a_difference_of_fractions_in_points():
    assert STATS.points(0.0324, 0.006, 0.0588) == "+3.2 [+0.6, +5.9]"
    assert STATS.points(-0.068, -0.132, -0.005, compact=True) == "-6.8 [-13.2,-0.5]"
    assert STATS.points(0.2, 0.134, 0.266, unit=" pts") == "+20.0 pts [+13.4, +26.6]"
    # a missing or non-finite interval leaves the bare difference; no difference: n/a
    assert STATS.points(0.05) == "+5.0"
    assert STATS.points(0.05, float("nan"), 0.1) == "+5.0"
    assert STATS.points(float("nan"), 0.0, 0.1) == "n/a"
    assert STATS.points(None) == "n/a"


def test_mean_pct_is_the_finite_mean_in_percent():
    assert STATS.mean_pct([0.25, 0.5, float("nan")]) == "37.5%"  # NaN entries are not counted
    assert STATS.mean_pct(np.array([True, False, False, False])) == "25.0%"  # a share
    assert STATS.mean_pct([]) == "n/a" and STATS.mean_pct([float("nan")]) == "n/a"


def test_t_intervals_are_scipys():
    rng = np.random.default_rng(2)
    a, b = rng.normal(0.3, 1.0, 6), rng.normal(0.0, 2.0, 9)
    d, lo, hi = STATS.welch_t_ci(a, b)
    res = sps.ttest_ind(a, b, equal_var=False)
    assert d == pytest.approx(a.mean() - b.mean())
    assert (lo, hi) == pytest.approx(tuple(res.confidence_interval(0.95)))
    c = rng.normal(0.2, 1.0, 6)
    d, lo, hi = STATS.paired_t_ci(a, c)
    assert (lo, hi) == pytest.approx(tuple(sps.ttest_rel(a, c).confidence_interval(0.95)))
    # wider than the normal interval at 5 degrees of freedom (2.571 against 1.96)
    _, nlo, nhi = STATS.paired_ci(a, c)
    assert (hi - lo) / (nhi - nlo) == pytest.approx(sps.t.ppf(0.975, 5) / 1.96)
    assert all(math.isnan(x) for x in STATS.welch_t_ci([1.0], [2.0, 3.0])[1:])


def test_contrast_t_ci_weights_groups_and_uses_satterthwaite():
    rng = np.random.default_rng(3)
    a, b = rng.normal(1.0, 1.0, 12), rng.normal(0.0, 3.0, 7)
    est, lo, hi = STATS.contrast_t_ci([a, b], [2 / 3, 1 / 3])
    assert est == pytest.approx(2 / 3 * a.mean() + 1 / 3 * b.mean())
    qa, qb = (2 / 3) ** 2 * a.var(ddof=1) / 12, (1 / 3) ** 2 * b.var(ddof=1) / 7
    df = (qa + qb) ** 2 / (qa ** 2 / 11 + qb ** 2 / 6)
    half = sps.t.ppf(0.975, df) * math.sqrt(qa + qb)
    assert (lo, hi) == pytest.approx((est - half, est + half))
