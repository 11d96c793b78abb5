"""Have Table 1's budgets converged? RMA / Otsu IoU of each Monte Carlo explainer over a sweep
of budgets, with the split-half reliability of each budget.

MultiSHAP's interaction estimates (coalitions per sample) and DIME's LIME fits (masks per
modality) are Monte Carlo estimates, and RMA and Otsu IoU score ``|a|``: estimator noise adds
mass on every cell and token and pulls a score toward the random floor. A mean that still moves
with the budget measures the budget, not the method. ``convergence(n, seed, budgets=...)`` runs
Table 1's protocol (``reproduction.table1.table1``: the same held-out samples, batches, models
and keys; MultiViz with its embed split) at every budget of every swept explainer and reports:

* per budget and regime: the Table 1 row (mean ± std over samples of visual RMA / IoU at pixel
  level and textual RMA / IoU, ``scoring.table_row``), the paired difference of each metric to
  the largest budget on the same samples (``stats.paired_ci``: mean, 95% interval), and the
  seconds the explainer took (``table1``'s ``wall_s``, compiles included);
* per budget and regime, on the first ``reliability_n`` samples, the split-half reliability:
  two further runs with independent keys (``fold_in(key, 1)`` and ``fold_in(key, 2)``), and for
  each metric ``r``, the Pearson correlation across samples of the two runs' per-sample scores
  (the test-retest reliability of one run at that budget: the share of the across-sample
  variance that is not Monte Carlo noise), ``spearman_brown = 2 r / (1 + r)`` (the
  Spearman-Brown prophecy, Spearman 1910 / Brown 1910: the reliability of the average of the
  two runs, i.e. of a run at twice the budget) and the mean ``|difference|`` of the two runs;
  ``r = 1`` when the two runs agree on every sample (a deterministic explainer, where the
  correlation itself is 0 / 0 if the scores are also constant), NaN with fewer than 3 finite
  pairs or when exactly one run is constant;
* per explainer, the *settled* budget: per regime and metric, the smallest budget from which
  every larger budget's mean is within ``tolerance`` (default 0.01, one point) of the largest
  budget's mean (``settled_budget``); the explainer's settled budget is the largest of these
  over regimes and metrics (NaN means at the largest budget are skipped; None if nothing is
  finite). When that is the largest budget itself the explainer has *not settled within the
  sweep* (``within_sweep`` False, printed so): the sweep shows that no smaller budget was
  enough, not that the largest is.

Cost: ``n + 2 * reliability_n`` samples per budget and regime. Table 1's defaults
(``table1.DEFAULT_BUDGETS``) are not changed here: choosing them needs a sweep at Table 1's n.
"""

from __future__ import annotations

from typing import Mapping

import jax
import numpy as np

from mmx_base.errors import InputError
from mmx_base.trees import jsonable
from gridvqa_jax.explain import scoring as SC
from reproduction import stats as STATS
from reproduction import table1 as T1
from reproduction import table1_parts as PARTS

SWEEP_BUDGETS = {"multishap": (8, 32, 128), "dime": (64, 256, 1024)}
SWEEP_KEYWORD = "n_samples"  # the budget keyword an integer of a sweep sets
TOLERANCE = 0.01  # one point of RMA / IoU
METRIC_KEYS = SC.ROW_METRICS
_NAMES = {"rma": "RMA", "iou": "IoU"}
_MODS = {"visual": "vis", "textual": "txt"}


def reliability(a, b) -> dict:
    """Split-half reliability of two runs' per-sample scores ``a``, ``b`` (float [n], NaN =
    not scored): ``{"r", "spearman_brown", "mean_abs_diff", "n"}`` over the n samples finite in
    both. ``r``: Pearson correlation; 1 when the runs agree on every sample (to 1e-9); NaN when
    n < 3 or exactly one run is constant. ``spearman_brown = 2 r / (1 + r)`` (NaN for r <= -1)."""
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    ok = np.isfinite(a) & np.isfinite(b)
    a, b = a[ok], b[ok]
    n = int(a.size)
    mad = float(np.mean(np.abs(a - b))) if n else float("nan")
    if n and np.all(np.abs(a - b) <= 1e-9):
        r = 1.0  # no Monte Carlo noise at all (the correlation may be 0 / 0)
    elif n < 3 or a.std() == 0 or b.std() == 0:
        r = float("nan")
    else:
        r = float(np.corrcoef(a, b)[0, 1])
    sb = 2 * r / (1 + r) if np.isfinite(r) and r > -1 else float("nan")
    return {"r": r, "spearman_brown": float(sb), "mean_abs_diff": mad, "n": n}


def settled_budget(values, means, tolerance: float = TOLERANCE):
    """The smallest of ``values`` (budgets, in sweep order) from which every mean, up to the
    last, is finite and within ``tolerance`` of the last (the largest budget's) mean; None when
    the last mean is not finite."""
    means = np.asarray(means, np.float64)
    if not means.size or not np.isfinite(means[-1]):
        return None
    ok = np.isfinite(means) & (np.abs(means - means[-1]) <= tolerance + 1e-12)
    i = len(means) - 1
    while i > 0 and ok[i - 1]:
        i -= 1
    return values[i]


def settle(result: dict, tolerance: float | None = None) -> dict:
    """Fill in ``result["explainers"][e]["settled"]`` from the runs' Table 1 means (in place;
    returns ``result``): ``{"value": the explainer's settled budget, "by": {regime: {modality:
    {metric: settled budget}}}, "within_sweep": bool}``. ``within_sweep`` is False when the
    settled budget is the largest swept (or nothing is finite): every mean is within the band
    of itself, so the sweep then shows only that no smaller budget was enough, not that the
    largest is. ``tolerance``: default ``result["tolerance"]``."""
    tol = result.get("tolerance", TOLERANCE) if tolerance is None else tolerance
    result["tolerance"] = tol
    for e, ex in result["explainers"].items():
        values, runs = ex["values"], ex["runs"]
        by, order = {}, []
        for r in runs[-1]["table"]:
            by[r] = {}
            for mod, m in METRIC_KEYS:
                means = [run["table"][r][mod][m] for run in runs]
                means = [np.nan if x is None else x for x in means]
                v = settled_budget(list(range(len(values))), means, tol)
                by[r].setdefault(mod, {})[m] = None if v is None else values[v]
                if v is not None:
                    order.append(v)
        value = values[max(order)] if order else None
        # a mean is always within the band of itself: only a budget below the largest shows
        # that the mean has stopped moving
        ex["settled"] = {"value": value, "by": by,
                         "within_sweep": value is not None and value != values[-1]}
    return result


def budget_status(sweeps, budgets: Mapping) -> dict:
    """Has each row of a table settled at the budget it ran? ``budgets``: the table's budget per
    row (``{"multishap": {"n_samples": 128}, ...}``, ``table1``'s ``"budgets"``); ``sweeps``:
    finished ``convergence`` results (or their ``compact`` JSON) in any order. Rows without a
    sampling budget (no ``n_samples``: MultiViz, the controls) are left out.

    Per row and regime, from the sweep that ran the row's exact budget k (the same budget dict)
    and swept furthest above it (largest budget K):

    * ``status``: "settled" (every measured metric's mean from k on is within the sweep's
      tolerance of the mean at K: ``settle``), "not settled" (some metric's is not), "not
      swept above" (k = K: nothing shows whether k has settled), "not swept" (no sweep ran
      k; then the row holds only ``{"": {"budget": k, "status": "not swept"}}``);
    * ``pair``: the two budgets compared (``n_samples``), ``[k, K]``, or for "not swept
      above" the budget below k and k (None when the sweep has no other budget); ``delta``:
      {modality: {metric: {"d", "lo", "hi"}}}, the paired difference of the mean at the lower
      budget of ``pair`` to the higher on the sweep's samples (``stats.paired_ci``, as the
      sweep computed it);
    * ``settled_from``: {modality: {metric: n_samples}}, the smallest budget from which every
      budget up to K is within the tolerance (``settle``'s ``by``); ``budget`` k, ``largest``
      K, ``n`` samples, ``tolerance``."""
    out = {}
    for e, budget in budgets.items():
        if "n_samples" not in (budget or {}):
            continue
        k = budget["n_samples"]
        best = None
        for sw in sweeps:
            ex = sw.get("explainers", {}).get(e)
            if not ex:
                continue
            at = [i for i, run in enumerate(ex["runs"]) if dict(run["budget"]) == dict(budget)]
            top = ex["runs"][-1]["budget"].get("n_samples", 0)
            if at and (best is None or top > best[3]):
                best = (sw, ex, at[0], top)
        if best is None:
            out[e] = {"": {"budget": k, "status": "not swept"}}
            continue
        sw, ex, i, _ = best
        tol = sw.get("tolerance", TOLERANCE)
        if "settled" not in ex:  # a sweep built by hand: settle a copy
            ex = settle({"tolerance": tol, "explainers": {e: dict(ex)}})["explainers"][e]
        values, last = ex["values"], len(ex["values"]) - 1
        ns = [run["budget"].get("n_samples") for run in ex["runs"]]
        j = i if i < last else i - 1  # the lower budget of the pair compared
        out[e] = {}
        for r, by in ex["settled"]["by"].items():
            # a metric not measured at the largest budget (None) cannot tell, as in ``settle``
            ok = all(values.index(v) <= i for ms in by.values() for v in ms.values()
                     if v is not None)
            status = "not swept above" if i == last else "settled" if ok else "not settled"
            out[e][r] = {"budget": k, "largest": ns[last], "n": sw.get("n"),
                         "tolerance": tol, "status": status,
                         "pair": None if j < 0 else [ns[j], ns[last]],
                         "delta": {} if j < 0 else ex["runs"][j].get("delta", {}).get(r, {}),
                         "settled_from": {mod: {m: None if v is None else ns[values.index(v)]
                                                for m, v in ms.items()}
                                          for mod, ms in by.items()}}
    return out


def _budget(e: str, v, keyword: str) -> dict:
    # a reference row (``multishap_ref``, ...) starts from its reference options
    base = {**T1.DEFAULT_BUDGETS, **T1.reference_budgets()}.get(e, {})
    if isinstance(v, Mapping):
        return {**base, **v}
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v > 0:
        return {**base, keyword: int(v)}
    raise InputError(f"convergence budgets: {e} budget {v!r} is neither a positive integer nor "
                     "a mapping of budget keywords")


def convergence(n: int = 16, seed: int = T1.EXPLAIN_SEED, *, budgets: Mapping | None = None,
                regimes=("pure",), reliability_n: int | None = None,
                tolerance: float = TOLERANCE, keywords: Mapping | None = None,
                explainers: Mapping | None = None, models=None, batch: int = 16,
                cell_px: int = 16, key=None, log=None, table1_kw: Mapping | None = None,
                parts_dir=None) -> dict:
    """RMA / IoU and split-half reliability of each explainer at each budget (module docstring).

    Args:
      n: held-out d07 samples per regime (``table1.regime_scenes``; the same for every budget).
      seed: their seed; ``key`` (default ``jax.random.key(seed)``) is Table 1's explainer key
        of the main runs (a run at Table 1's budget reproduces Table 1's scores for the row at
        position 0 of Table 1, MultiSHAP; a sweep runs each row at position 0, so another row's
        key differs from its key in Table 1).
      budgets: ``{explainer: (budget, ...)}`` in increasing order, each budget a positive
        integer (sets ``keywords[explainer]``, default ``"n_samples"``, over
        ``table1.DEFAULT_BUDGETS[explainer]``, or for a reference row such as
        ``"multishap_ref"`` over ``table1.reference_budgets()``) or a mapping of budget
        keywords; default
        ``SWEEP_BUDGETS`` (MultiSHAP 8, 32, 128 coalitions; DIME 64, 256, 1024 masks).
      regimes: Table 1 regimes to sweep (default the pure one).
      reliability_n: samples of the split-half runs (the first ones; default ``min(n, 16)``;
        0 skips them).
      tolerance: the settling band (default one point, 0.01).
      explainers: ``{name: explainer}`` for names outside ``scoring.EXPLAINERS``.
      models, batch, cell_px: as ``table1.table1``; ``table1_kw``: further ``table1``
        keywords.
      log: ``log(str)`` progress lines.
      parts_dir: resume a stopped sweep: every Table 1 run of the sweep saves and reuses its
        parts (``table1_parts``) in ``parts_dir/<explainer>_<budget>_<run>`` (run ``main``,
        ``split1``, ``split2``); ``wall_s`` is then the time the parts took when computed.

    Returns ``{"n", "seed", "regimes", "reliability_n", "tolerance", "explainers": {e:
    {"values": [budget as given], "budgets": [full budget dicts], "runs": [{"value",
    "budget", "table": {regime: table_row}, "delta": {regime: {modality: {metric: {"d", "lo",
    "hi"}}}}, "reliability": {regime: {modality: {metric: reliability(...)}}} (absent when
    reliability_n = 0), "wall_s", "reliability_wall_s"}], "settled": {"value", "by",
    "within_sweep"}}},
    "per_sample": {e: [{regime: per-sample scores}, one per budget]}}``.
    """
    from gridvqa_jax.training.export import load_model, load_reference_model
    from pathlib import Path

    budgets = dict(SWEEP_BUDGETS if budgets is None else budgets)
    keywords = dict(keywords or {})
    if not budgets:
        raise InputError("convergence: no explainer to sweep")
    m_rel = min(n, 16) if reliability_n is None else int(reliability_n)
    if not 0 <= m_rel <= n:
        raise InputError(f"reliability_n must be in [0, n = {n}], got {reliability_n}")
    regimes = tuple(regimes)
    key = jax.random.key(seed) if key is None else key
    log = log or (lambda *_: None)
    reference = T1.reference_explainers()  # the reference rows sweep as well (multishap_ref)
    fns = {e: (explainers or {}).get(e) or reference.get(e) or SC.resolve_explainer(e)
           for e in budgets}
    sweeps = {e: [_budget(e, v, keywords.get(e, SWEEP_KEYWORD)) for v in vs]
              for e, vs in budgets.items()}
    for e, vs in budgets.items():
        if not len(vs):
            raise InputError(f"convergence budgets: {e} has no budget")
        for budget in sweeps[e]:
            SC.check_budget(fns[e], budget)  # a bad keyword fails before any model runs
    # every model loaded once, shared by every run (a Model keeps its config: the embed split)
    regime_def = {r: m for r, m, _ in T1.REGIMES}
    unknown = sorted(set(regimes) - set(regime_def))
    if unknown:
        raise InputError(f"convergence: unknown regime(s) {', '.join(unknown)}")
    given = dict(models or {})
    loaded = {m: (load_model(v) if isinstance(v, (str, Path)) else v) for m, v in given.items()}
    for r in regimes:
        if regime_def[r] not in loaded:
            loaded[regime_def[r]] = load_reference_model(regime_def[r])
    common = dict(regimes=regimes, batch=batch, cell_px=cell_px, models=loaded,
                  **dict(table1_kw or {}))

    def run(e, v, budget, m, k, tag):
        where = {} if parts_dir is None else {"parts_dir": run_dir(parts_dir, e, v, tag)}
        res = T1.table1(m, seed, explainers={e: fns[e]}, budgets={e: budget}, key=k, **common,
                        **where)
        return res["per_sample"][e], res["table"][e], sum(res["wall_s"][e].values())

    out = {"n": n, "seed": seed, "regimes": list(regimes), "reliability_n": m_rel,
           "tolerance": tolerance, "explainers": {}, "per_sample": {}}
    for e, sweep in sweeps.items():
        runs, scores = [], []
        for v, budget in zip(budgets[e], sweep):
            ps, table, wall = run(e, v, budget, n, key, "main")
            entry = {"value": v, "budget": budget, "table": table, "wall_s": wall}
            if m_rel:
                (pa, _, wa), (pb, _, wb) = (run(e, v, budget, m_rel, jax.random.fold_in(key, i),
                                                f"split{i}") for i in (1, 2))
                entry["reliability"] = {r: {mod: {m: reliability(SC.row_scores(pa[r], mod, m),
                                                                 SC.row_scores(pb[r], mod, m))
                                                  for mm, m in METRIC_KEYS if mm == mod}
                                            for mod in ("visual", "textual")} for r in regimes}
                entry["reliability_wall_s"] = wa + wb
            runs.append(entry)
            scores.append(ps)
            log(f"convergence {e} {_label(v)}: " + "; ".join(
                f"{r} {T1._row_text(table[r])}" for r in regimes) + f" ({wall:.1f} s)")
        for entry, ps in zip(runs, scores):
            entry["delta"] = {r: {mod: {m: dict(zip(("d", "lo", "hi"), STATS.paired_ci(
                SC.row_scores(ps[r], mod, m), SC.row_scores(scores[-1][r], mod, m))))
                for mm, m in METRIC_KEYS if mm == mod} for mod in ("visual", "textual")}
                for r in regimes}
        out["explainers"][e] = {"values": list(budgets[e]), "budgets": sweep, "runs": runs}
        out["per_sample"][e] = scores
    return settle(out)


def _label(v) -> str:
    if isinstance(v, Mapping):
        return ",".join(f"{k}={x}" for k, x in v.items()) or "default"
    return str(v)


def run_dir(parts_dir, explainer: str, value, run: str):
    """The parts folder of one run of a sweep saved under ``parts_dir`` (``convergence(...,
    parts_dir=)``): ``<explainer>_<budget>_<run>``, the budget ``value`` as given (an int, or a
    mapping written ``k=v,k=v``), ``run`` one of ``main``, ``split1``, ``split2``."""
    return PARTS.run_parts_dir(parts_dir, f"{explainer}_{_label(value)}_{run}")


def _num(x, scale=100.0, fmt="5.1f") -> str:
    return "  n/a" if x is None or not np.isfinite(x) else format(scale * x, fmt)


def _delta(run: dict, regime: str) -> str:
    # the paired difference of visual RMA to the largest budget, in points [95% interval]
    d = run.get("delta", {}).get(regime, {}).get("visual", {}).get("rma")
    if not d or d.get("d") is None or not np.isfinite(d["d"]):
        return "-"
    if d["d"] == 0 and d["lo"] == 0 and d["hi"] == 0:
        return "0"
    return STATS.points(d["d"], d["lo"], d["hi"], compact=True)


def format_convergence(result: dict) -> str:
    """The convergence table as text: per explainer, budget and regime the mean visual and
    textual RMA / IoU (%), the paired difference of visual RMA to the largest budget (points,
    95% interval), the split-half reliability r of each metric (when measured) and the wall
    time; then each explainer's settled budget per metric."""
    tol = result.get("tolerance", TOLERANCE)
    rel_n = result.get("reliability_n", 0)
    rel = f"split-half r on {rel_n} samples" if rel_n else "no split-half r (reliability_n 0)"
    w = max([10, *map(len, result["explainers"])])  # multishap_ref's rows stay aligned
    lines = [f"Budget convergence: n = {result['n']} d07 samples per regime (seed "
             f"{result['seed']}); mean in %, {rel}; settled = the "
             f"smallest budget below the largest from which every mean is within "
             f"{100 * tol:.1f} pt of the largest budget's",
             f"{'explainer':{w}s} {'budget':>8s} {'regime':9s} "
             + " ".join(f"{_MODS[mod] + ' ' + _NAMES[m]:>8s}" for mod, m in METRIC_KEYS)
             + f" {'vis RMA - largest':>20s} | "
             + " ".join(f"{'r ' + _MODS[mod] + ' ' + _NAMES[m]:>10s}" for mod, m in METRIC_KEYS)
             + f" {'wall s':>7s}"]
    for e, ex in result["explainers"].items():
        for run in ex["runs"]:
            for r, row in run["table"].items():
                rel = run.get("reliability", {}).get(r)
                rs = [_num(rel[mod][m]["r"], 1.0, "5.2f") if rel else "    -"
                      for mod, m in METRIC_KEYS]
                wall = run.get("wall_s")
                lines.append(f"{e:{w}s} {_label(run['value']):>8s} {r:9s} "
                             + " ".join(f"{_num(row[mod][m]):>8s}" for mod, m in METRIC_KEYS)
                             + f" {_delta(run, r):>20s}"
                             + " | " + " ".join(f"{x:>10s}" for x in rs)
                             + f" {'' if wall is None else f'{wall:7.1f}'}")
    lines.append("")
    for e, ex in result["explainers"].items():
        st = ex.get("settled") or {}
        last = ex["values"][-1]

        def settled(v):
            return ("n/a" if v is None else "not settled" if v == last else _label(v))

        parts = [f"{r} {mod} {_NAMES[m]} {settled(v)}"
                 for r, mods in st.get("by", {}).items() for mod, ms in mods.items()
                 for m, v in ms.items()]
        val = st.get("value")
        if val is not None and val == last:
            head = (f"{e}: not settled within the sweep (no budget below the largest, "
                    f"{_label(last)}, is within {100 * tol:.1f} pt on every metric: "
                    "a larger budget must show where it settles; ")
        else:
            head = (f"{e}: settled at {_label(val) if val is not None else 'n/a'} "
                    f"(largest budget {_label(last)}; ")
        lines.append(head + ", ".join(parts) + ")")
    return "\n".join(lines)


def _metric_label(mod: str, m: str) -> str:
    return f"{_MODS[mod]} {_NAMES[m]}"


def _status_text(st: dict) -> str:
    tol = f"{100 * st.get('tolerance', TOLERANCE):.1f} pt"
    frm = {_metric_label(mod, m): st["settled_from"].get(mod, {}).get(m)
           for mod, m in METRIC_KEYS}
    moving = [name for name, v in frm.items() if v is not None and v > st["budget"]]
    if st["status"] == "settled":
        return f"settled: every mean within {tol} of {st['largest']:,}'s from {st['budget']:,} on"
    if st["status"] == "not settled":
        return (f"**not settled**: {', '.join(moving)} still move by more than {tol} up to "
                f"{st['largest']:,}")
    early = [f"{name} from {v:,}" for name, v in frm.items()
             if v is not None and v < st["budget"]]
    return (f"**not swept above {st['budget']:,}**; within {tol} of its mean: "
            + (", ".join(early) if early else "no metric at a smaller budget"))


def budget_status_markdown(status: dict, sources) -> str:
    """``budget_status`` as markdown: per row and regime the budget, the sweep's samples, the
    two budgets compared, the paired difference of every metric's mean at the lower to the
    higher (points [95% interval]) and the status in words; ``sources`` name the sweeps."""
    names = [_metric_label(mod, m) for mod, m in METRIC_KEYS]
    lines = ["Have these budgets settled? From the budget sweeps " + ", ".join(
             f"`{s}`" for s in sources) + ": the paired difference of each mean at the lower "
             "budget to the higher, in points [95% interval], on the sweep's samples (a "
             "negative difference: the mean still rises with the budget). A row that has not "
             "settled measures the method at its budget, not the method's limit: Monte Carlo "
             "noise spreads |attribution| over every player and pulls RMA and IoU toward the "
             "random floor.", "",
             "| row | budget | regime (n) | lower - higher | " + " | ".join(names) + " | status |",
             "|---|---|---|---|" + "---|" * len(names) + "---|"]
    for e, by_regime in status.items():
        for r, st in by_regime.items():
            if st["status"] == "not swept":
                lines.append(f"| {e} | {st['budget']:,} | - | - |" + " - |" * len(names)
                             + " not swept |")
                continue
            pair = "-" if st["pair"] is None else " - ".join(f"{v:,}" for v in st["pair"])
            ds = [st["delta"].get(mod, {}).get(m) for mod, m in METRIC_KEYS]
            cells = [STATS.points(d["d"], d["lo"], d["hi"]) if d else "-" for d in ds]
            lines.append(f"| {e} | {st['budget']:,} | {r} ({st['n']}) | {pair} | "
                         + " | ".join(cells) + f" | {_status_text(st)} |")
    return "\n".join(lines)


def compact(result: dict) -> dict:
    """The ``"convergence"`` entry of ``gridvqa explain --regimes --json``: the result without
    per-sample scores, JSON-ready (NaN -> null)."""
    return jsonable({k: v for k, v in result.items() if k != "per_sample"})


def parse_budgets(specs) -> dict:
    """``["multishap=8,32,128", "dime=64,256,1024"]`` -> ``{"multishap": (8, 32, 128), "dime":
    (64, 256, 1024)}`` (the ``--convergence-budgets`` of ``gridvqa explain``). ``InputError``
    for a spec that is not ``NAME=INT[,INT...]`` of positive integers, or a name given twice."""
    out = {}
    for spec in specs:
        name, sep, vals = str(spec).partition("=")
        try:
            values = tuple(int(v) for v in vals.split(","))
        except ValueError:
            values = ()
        if not sep or not name or not values or min(values) <= 0:
            raise InputError(f"--convergence-budgets {spec!r}: expected NAME=INT[,INT...] of "
                             "positive integers, e.g. multishap=8,32,128")
        if name in out:
            raise InputError(f"--convergence-budgets: {name} given twice")
        out[name] = values
    return out


__all__ = ["SWEEP_BUDGETS", "SWEEP_KEYWORD", "TOLERANCE", "METRIC_KEYS", "reliability",
           "settled_budget", "settle", "budget_status", "budget_status_markdown", "convergence",
           "format_convergence", "compact", "parse_budgets", "run_dir"]
