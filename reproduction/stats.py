"""Intervals, differences and the verdict rule of every finding of both papers.

Every interval here is a 95% interval: normal ones use ``Z = 1.96`` standard errors.

* proportions: ``wilson`` (one proportion), ``diff_ci`` (two independent proportions);
* means: ``mean_ci`` (a mean from its population std), ``welch`` and ``contrast`` (independent
  samples), ``paired`` and ``paired_ci`` (the same samples scored twice);
* set-level statistics: ``independent_difference`` of two estimates with standard errors
  (e.g. jackknife ones);
* text: ``points(d, lo, hi)`` (a difference of fractions in points with its interval);
* verdicts: ``verdict(ci, claim)`` and ``all_of(verdicts)``; for a family of claims with
  minimum effects, ``holm_verdicts`` (one-sided ``claim_pvalues``, ``holm`` adjustment);
  ``finding(...)`` builds the record every finding check returns.

Verdict vocabulary (``VERDICTS``): a finding is a claim that a quantity lies on one side of a
threshold (or inside a band). With the 95% interval ``[lo, hi]`` of our estimate the claim is
*reproduced* when the whole interval satisfies it, *refuted* when the whole interval contradicts
it, and *inconclusive* when the interval straddles the boundary or is not finite (nothing
measured).
"""

from __future__ import annotations

import math

import numpy as np

Z = 1.96  # two-sided 95% normal quantile
VERDICTS = ("reproduced", "refuted", "inconclusive")


# ----------------------------------------------------------------------------------------------
# Proportions
# ----------------------------------------------------------------------------------------------
def wilson(k: int, n: int, z: float = Z) -> tuple[float, float]:
    """Wilson score interval of a proportion k / n: ``(lo, hi)``, NaN for n = 0.

    ``centre = (p + z²/2n) / (1 + z²/n)``, ``half = z sqrt(p(1-p)/n + z²/4n²) / (1 + z²/n)``
    (Wilson 1927); unlike the normal interval it stays inside [0, 1] at p = 0 or 1.
    """
    if n <= 0:
        return float("nan"), float("nan")
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, c - h), min(1.0, c + h)


def diff_ci(k1: int, n1: int, k2: int, n2: int, z: float = Z) -> tuple[float, float, float]:
    """Difference of two independent proportions ``d = k1/n1 - k2/n2`` with Newcombe's hybrid
    score interval (Newcombe 1998, Stat. Med. 17:873, method 10), built from the Wilson
    intervals ``(l1, u1)``, ``(l2, u2)`` of each: ``(d, d - sqrt((p1 - l1)^2 + (u2 - p2)^2),
    d + sqrt((u1 - p1)^2 + (p2 - l2)^2))`` (NaN when a group is empty). Unlike the normal
    interval it has no zero width when both groups are all 0 or all 1, and it keeps its
    coverage for small groups and proportions near 0 or 1."""
    if n1 <= 0 or n2 <= 0:
        return float("nan"), float("nan"), float("nan")
    p1, p2 = k1 / n1, k2 / n2
    (l1, u1), (l2, u2) = wilson(k1, n1, z), wilson(k2, n2, z)
    d = p1 - p2
    return (d, d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2),
            d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2))


# ----------------------------------------------------------------------------------------------
# Means
# ----------------------------------------------------------------------------------------------
def interval(estimate: float, se: float, z: float = Z) -> tuple[float, float]:
    """Normal interval ``estimate ± z se`` (NaN in, NaN out)."""
    return estimate - z * se, estimate + z * se


def mean_ci(mean: float, std: float, n: int, z: float = Z) -> tuple[float, float]:
    """Normal interval of a mean from its population std (ddof 0) and n:
    ``mean ± z std / sqrt(n - 1)`` (= ``z`` times the sample-std standard error); NaN when
    n < 2 or the mean is not finite."""
    if n is None or n < 2 or mean is None or std is None or not np.isfinite(mean):
        return float("nan"), float("nan")
    return interval(mean, std / math.sqrt(n - 1), z)


def _finite(x) -> np.ndarray:
    x = np.asarray(x, float).reshape(-1)
    return x[np.isfinite(x)]


def contrast(groups, weights) -> tuple[float, float]:
    """Linear contrast ``sum_k w_k mean(x_k)`` of independent samples and its standard error
    ``sqrt(sum_k w_k² var(x_k) / n_k)`` (sample variances, ddof 1; Welch's, unpooled). Non-finite
    values are excluded; ``(NaN, NaN)`` when a group keeps fewer than 2 values."""
    groups = [_finite(g) for g in groups]
    if len(groups) != len(weights):
        raise ValueError(f"{len(groups)} groups but {len(weights)} weights")
    if any(g.size < 2 for g in groups):
        return float("nan"), float("nan")
    est = sum(w * float(g.mean()) for g, w in zip(groups, weights))
    var = sum(w * w * float(g.var(ddof=1)) / g.size for g, w in zip(groups, weights))
    return float(est), float(math.sqrt(var))


def welch(a, b) -> tuple[float, float]:
    """``(mean(a) - mean(b), its Welch standard error)`` of independent samples, non-finite
    values excluded (``contrast`` with weights (1, -1))."""
    return contrast([a, b], [1.0, -1.0])


def paired(a, b) -> tuple[float, float]:
    """``(mean(a - b), sd(a - b) / sqrt(m))`` over the m pairs where both are finite (the same
    samples scored twice); ``(NaN, NaN)`` when m < 2."""
    d = _finite(np.asarray(a, float) - np.asarray(b, float))
    if d.size < 2:
        return float("nan"), float("nan")
    return float(d.mean()), float(d.std(ddof=1) / math.sqrt(d.size))


def t_interval(estimate: float, se: float, df: float, level: float = 0.95) -> tuple[float, float]:
    """Student-t interval ``estimate ± t_{(1 + level) / 2, df} se`` (NaN when df < 1 or an
    input is not finite): the interval of a mean or a difference of means from few samples,
    where the normal quantile 1.96 would cover less than ``level``."""
    from scipy import stats as sps

    if not (np.isfinite(estimate) and np.isfinite(se) and np.isfinite(df)) or df < 1:
        return float("nan"), float("nan")
    return interval(estimate, se, float(sps.t.ppf((1 + level) / 2, df)))


def contrast_t_ci(groups, weights) -> tuple[float, float, float]:
    """``(sum_k w_k mean(x_k), lo, hi)``: :func:`contrast` with the Student-t interval at the
    Welch-Satterthwaite degrees of freedom ``(sum_k q_k)^2 / sum_k q_k^2 / (n_k - 1)``,
    ``q_k = w_k^2 var(x_k) / n_k`` (non-finite values excluded)."""
    groups = [_finite(g) for g in groups]
    est, se = contrast(groups, weights)
    if not np.isfinite(se):
        return est, float("nan"), float("nan")
    q = [w * w * float(g.var(ddof=1)) / g.size for g, w in zip(groups, weights)]
    den = sum(qk * qk / (g.size - 1) for qk, g in zip(q, groups))
    df = sum(q) ** 2 / den if den > 0 else float(sum(g.size for g in groups) - len(groups))
    return (est, *t_interval(est, se, df))


def welch_t_ci(a, b) -> tuple[float, float, float]:
    """``(mean(a) - mean(b), lo, hi)``: :func:`welch` with the Student-t interval at the
    Welch-Satterthwaite degrees of freedom ``(va/na + vb/nb)^2 / ((va/na)^2/(na-1) +
    (vb/nb)^2/(nb-1))`` (sample variances; non-finite values excluded):
    ``contrast_t_ci([a, b], [1, -1])``."""
    return contrast_t_ci([a, b], [1.0, -1.0])


def paired_t_ci(a, b) -> tuple[float, float, float]:
    """``(mean(a - b), lo, hi)``: :func:`paired` with the Student-t interval at m - 1 degrees
    of freedom (m finite pairs; scipy's ``ttest_rel(...).confidence_interval()``)."""
    d, se = paired(a, b)
    m = int(np.isfinite(np.asarray(a, float) - np.asarray(b, float)).sum())
    return (d, *t_interval(d, se, m - 1))


def paired_ci(a, b, z: float = Z) -> tuple[float, float, float]:
    """Mean of the paired differences a - b (per-sample 0/1 or scores) with its normal
    interval: ``(d, lo, hi)`` (``paired`` ± z se)."""
    d, se = paired(a, b)
    return (d, *interval(d, se, z))


def paired_counts_ci(gained: int, lost: int, n: int, z: float = Z) -> tuple[float, float, float]:
    """The difference of two 0/1 outcomes a, b scored on the same n samples, from their
    discordant counts (``gained``: a = 1, b = 0; ``lost``: a = 0, b = 1): ``(d, lo, hi)``
    with ``d = (gained - lost) / n`` and the adjusted Wald interval of Agresti & Min (2005,
    Stat. Med. 24:729), which adds 1/2 to each of the four cells: ``g = gained + 1/2``,
    ``l = lost + 1/2``, ``m = n + 2``, ``(g - l) / m ± z sqrt(g + l - (g - l)^2 / m) / m``.
    The plain paired interval (``paired_ci`` of the outcomes) has zero width when the two
    agree on every sample; this one does not, and keeps its coverage with few discordant
    samples. The interval is widened to hold ``d`` where the adjustment moved it past ``d``
    (every sample discordant one way) and cut to [-1, 1]. NaN when n < 1."""
    if n < 1:
        return float("nan"), float("nan"), float("nan")
    g, l, m = gained + 0.5, lost + 0.5, n + 2.0
    centre = (g - l) / m
    se = math.sqrt(max(g + l - (g - l) ** 2 / m, 0.0)) / m
    lo, hi = interval(centre, se, z)
    d = (gained - lost) / n
    return d, max(min(lo, d), -1.0), min(max(hi, d), 1.0)


def paired_binary_ci(a, b, z: float = Z) -> tuple[float, float, float]:
    """:func:`paired_counts_ci` of two bool / 0-1 arrays [n] of outcomes on the same
    samples (e.g. two classifiers right or wrong per sample)."""
    a, b = np.asarray(a, bool), np.asarray(b, bool)
    return paired_counts_ci(int((a & ~b).sum()), int((~a & b).sum()), int(a.size), z)


def points(d, lo=None, hi=None, *, unit: str = "", compact: bool = False) -> str:
    """A difference of fractions as text in points (x 100, one decimal, signed) with its
    interval: ``"+3.2 [+0.6, +5.9]"``; ``unit`` follows the difference (``" pts"``);
    ``compact`` drops the space after the comma (for table columns). ``"n/a"`` when ``d`` is
    not finite, the bare difference when the interval is missing or not finite."""
    if d is None or not np.isfinite(d):
        return "n/a"
    text = f"{100 * float(d):+.1f}{unit}"
    if lo is None or hi is None or not (np.isfinite(lo) and np.isfinite(hi)):
        return text
    sep = "," if compact else ", "
    return f"{text} [{100 * float(lo):+.1f}{sep}{100 * float(hi):+.1f}]"


def mean_pct(x) -> str:
    """The mean of the finite entries of ``x`` (fractions, or booleans for a share) in percent,
    one decimal: ``"33.5%"``; ``"n/a"`` when there is none (an empty group)."""
    x = np.asarray(x, float)
    x = x[np.isfinite(x)]
    return f"{100 * x.mean():.1f}%" if x.size else "n/a"


# ----------------------------------------------------------------------------------------------
# Verdicts
# ----------------------------------------------------------------------------------------------
def verdict(ci, claim) -> str:
    """Verdict of a finding from the 95% interval ``ci = (lo, hi)`` of our estimate.

    ``claim``: ``(">", t)`` (the quantity exceeds t), ``("<", t)``, or ``("in", a, b)`` (it lies
    in [a, b]). Reproduced: the whole interval satisfies the claim; refuted: the whole interval
    contradicts it (for a band: lies outside it); inconclusive: it straddles a boundary, or the
    interval is not finite (nothing measured).
    """
    lo, hi = (float("nan"), float("nan")) if ci is None else (float(ci[0]), float(ci[1]))
    op = claim[0]
    if op not in (">", "<", "in"):
        raise ValueError(f"unknown claim {claim!r}: expected ('>', t), ('<', t) or ('in', a, b)")
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return "inconclusive"
    if op == ">":
        t = claim[1]
        return "reproduced" if lo > t else "refuted" if hi <= t else "inconclusive"
    if op == "<":
        t = claim[1]
        return "reproduced" if hi < t else "refuted" if lo >= t else "inconclusive"
    a, b = claim[1], claim[2]
    if a <= lo and hi <= b:
        return "reproduced"
    return "refuted" if hi < a or lo > b else "inconclusive"


def holm(pvalues) -> np.ndarray:
    """Holm's step-down adjusted p-values (Holm 1979) of m tests: with ``p_(1) <= ... <=
    p_(m)``, ``p_adj_(k) = max_{j <= k} min(1, (m - j + 1) p_(j))``, in the input order (NaN
    stays NaN and does not count in m). Rejecting where ``p_adj < alpha`` controls the
    family-wise error rate at alpha."""
    p = np.asarray(pvalues, np.float64)
    out = np.full(p.shape, np.nan)
    ok = np.flatnonzero(np.isfinite(p))
    m = len(ok)
    order = ok[np.argsort(p[ok], kind="stable")]
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out


def claim_pvalues(estimate: float, se: float, claim, df=None) -> tuple[float, float]:
    """One-sided p-values of a claim with a threshold, ``(p_claim, p_contrary)``: for
    ``(">", t)`` ``p_claim = 1 - Phi((estimate - t) / se)`` (small when the estimate lies well
    above t) and ``p_contrary = Phi((estimate - t) / se)``; ``("<", t)`` the mirror; with
    ``df``, Student's t with ``df`` degrees of freedom in place of the normal Phi. NaN when
    the estimate or its standard error is not finite or the standard error is 0 (a statistic
    that did not vary over the resamples, e.g. a jackknife of 64 / 64 right: no evidence of
    how precise it is, not infinite precision)."""
    op, t = claim[0], float(claim[1])
    if op not in (">", "<"):
        raise ValueError(f"claim_pvalues takes ('>', t) or ('<', t), got {claim!r}")
    est, se = float(estimate), float(se)
    if not (np.isfinite(est) and np.isfinite(se)) or se <= 0:
        return float("nan"), float("nan")
    z = (est - t) / se
    if op == "<":
        z = -z
    if df is not None and np.isfinite(df) and df >= 1:
        from scipy import stats as sps

        upper = float(sps.t.sf(z, df))
    else:
        upper = 0.5 * math.erfc(z / math.sqrt(2))  # 1 - Phi(z)
    return upper, 1.0 - upper


def holm_verdicts(tests, alpha: float = 0.025) -> list[str]:
    """Verdicts of a family of claims with minimum effects, controlled for multiplicity.

    ``tests``: ``[(estimate, se, claim)]`` or ``[(estimate, se, claim, df)]`` with ``claim =
    (">", t)`` or ``("<", t)`` where t includes the minimum effect (e.g. "falls by at least
    0.05": ``("<", -0.05)``) and ``df`` the estimate's degrees of freedom (Student's t; None:
    normal). A claim is
    *reproduced* when its Holm-adjusted one-sided p-value (``claim_pvalues``, ``holm`` over the
    family) is below ``alpha``, *refuted* when the contrary's is (the estimate lies
    significantly on the other side of the threshold, e.g. a fall smaller than the minimum
    effect), *inconclusive* otherwise (also when nothing was measured). ``alpha`` is per side:
    0.025, the level of every other verdict's two-sided 95% interval."""
    ps = [claim_pvalues(*t) for t in tests]
    adj_claim = holm([p for p, _ in ps])
    adj_contra = holm([q for _, q in ps])
    return ["reproduced" if a < alpha else "refuted" if b < alpha else "inconclusive"
            for a, b in zip(adj_claim, adj_contra)]


def independent_difference(a: float, se_a: float, b: float, se_b: float,
                           scale: float = 1.0, z: float = Z, df_a=None, df_b=None) -> dict:
    """``scale (a - b)`` of two independent estimates with standard errors: ``{"mean", "se",
    "ci", "df"}`` with ``se = scale sqrt(se_a^2 + se_b^2)``; the normal interval, or with the
    estimates' degrees of freedom ``df_a``, ``df_b`` the Student-t one at the
    Welch-Satterthwaite ``df = (se_a^2 + se_b^2)^2 / (se_a^4 / df_a + se_b^4 / df_b)``
    (``"df"`` None without them)."""
    d = scale * (float(a) - float(b))
    se = abs(scale) * math.hypot(float(se_a), float(se_b))
    df = None
    if df_a is not None and df_b is not None:
        den = float(se_a) ** 4 / df_a + float(se_b) ** 4 / df_b
        df = (float(se_a) ** 2 + float(se_b) ** 2) ** 2 / den if den > 0 else float(df_a + df_b)
        return {"mean": d, "se": se, "ci": list(t_interval(d, se, df)), "df": df}
    return {"mean": d, "se": se, "ci": list(interval(d, se, z)), "df": df}


def all_of(verdicts) -> str:
    """Verdict of a conjunction of claims: reproduced when every part is, refuted when any part
    is, inconclusive otherwise (also for no parts)."""
    vs = list(verdicts)
    if vs and all(v == "reproduced" for v in vs):
        return "reproduced"
    return "refuted" if "refuted" in vs else "inconclusive"


def finding(paper: str, name: str, claim: str, verdict: str, evidence: str, *, n=None,
            width=None) -> dict:
    """The record of one checked finding: ``{"paper", "finding", "claim", "verdict",
    "evidence", "n", "width"}``; ``verdict`` must be one of ``VERDICTS``; ``n``: the samples
    behind the verdict (e.g. "64 per regime"), ``width``: the width of the 95% interval that
    decided it (the widest one for a claim of several parts), in the evidence's units (None:
    not stated)."""
    if verdict not in VERDICTS:
        raise ValueError(f"verdict {verdict!r} is not one of {VERDICTS}")
    return {"paper": paper, "finding": name, "claim": claim, "verdict": verdict,
            "evidence": evidence, "n": n, "width": width}


def widest(cis) -> float:
    """The largest width ``hi - lo`` of some intervals (NaN for none)."""
    ws = [float(c[1]) - float(c[0]) for c in cis]
    return max(ws) if ws else float("nan")


__all__ = ["Z", "VERDICTS", "wilson", "diff_ci", "interval", "mean_ci", "contrast", "welch",
           "paired", "paired_ci", "t_interval", "contrast_t_ci", "welch_t_ci", "paired_t_ci",
           "paired_counts_ci", "paired_binary_ci", "points", "verdict",
           "holm", "claim_pvalues", "holm_verdicts", "independent_difference", "all_of",
           "finding", "widest"]
