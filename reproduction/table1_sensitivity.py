"""How much do MultiSHAP's open choices move its Table 1 row? RMA / Otsu IoU of each choice on
the same samples, models and keys.

MultiSHAP's row rests on choices the paper leaves open and its reference code
(WGLab/MultiSHAP, ``MultiSHAP.py``) makes one way and ``gridvqa_jax.explain.multishap`` by
default another (``multishap.DEFAULT_OPTIONS`` / ``multishap.REFERENCE_OPTIONS``):

* ``target``: the answer the game explains, the model's prediction (ours) or the ground-truth
  label (the reference);
* ``quantity``: its log-probability (ours) or its logit (the reference's ViLT logit, a
  per-answer sigmoid logit; on our models the exact log-odds, ``"log_odds"``);
* ``baseline``: an absent cell is the empty white tile (ours), gray 128 (the reference's 0.5)
  or black 0;
* ``text_aggregate``: textual importance ``sum_c Phi[c, t]`` (ours) or ``sum_c |Phi[c, t]|``
  (the reference); ``visual_aggregate``: ``sum_t Phi`` (ours and the reference) or
  ``sum_t |Phi|``.

``sensitivity(n, seed, budget=...)`` scores MultiSHAP once per choice with Table 1's protocol
(``reproduction.table1.table1`` with ``explainers=("multishap",)`` and the choice's options as
MultiSHAP keywords): the same held-out samples, batches, models and keys (sample j's
``fold_in(fold_in(key, 0), j)``: MultiSHAP is Table 1's first explainer), so every choice sees
the same Monte Carlo coalitions and its differences to the default are paired, and the
``"default"`` row is Table 1's MultiSHAP row. ``players="reference"`` measures the
reference-granularity row ``multishap_ref`` instead (``table1(players="reference")``: ViLT's
image patches; its ``"reference"`` choice is that row of Table 1, its ``"default"`` the same
players with our options). Designs
(``choices``): ``"one_at_a_time"`` (default) varies each option alone from the default and adds
the reference's full combination (``"reference"``); ``"full"`` is every combination of target x
quantity (logprob, log_odds) x baseline x text_aggregate (24 runs; the visual aggregate stays
signed, as in the reference); a mapping ``name -> options`` is used as given (a ``"default"``
row is added when absent).

Per choice and regime: the Table 1 row (``scoring.table_row``: visual RMA / IoU at pixel level,
textual RMA / IoU, mean and std over samples) and, against the default on the same samples, the
paired difference of each of the four means with its 95% interval (``stats.paired_ci``); and
the ``objects`` floor (Table 1's control: uniform mass on the occupied cells) on the same
samples, with each choice's paired difference to it.
Cost: one Table 1 MultiSHAP run per choice (8 for ``"one_at_a_time"``); with ``parts_dir`` a
stopped run resumes from the choices it finished.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Mapping

import numpy as np

from gridvqa_jax.explain.multishap import (AGGREGATES, DEFAULT_OPTIONS, REFERENCE_OPTIONS,
                                           TARGETS)
from gridvqa_jax.explain import perturb as PT
from gridvqa_jax.explain import scoring as SC
from mmx_base.errors import InputError
from mmx_base.trees import jsonable
from reproduction import stats as STATS
from reproduction import table1 as T1
from reproduction import table1_parts as PARTS

FLOOR = "objects"  # the control every choice is compared with (scoring.CONTROLS)
OPTION_NAMES = tuple(DEFAULT_OPTIONS)  # target, quantity, baseline, text_/visual_aggregate
_VALUES = {"target": TARGETS, "quantity": PT.QUANTITIES, "baseline": PT.BASELINES,
           "text_aggregate": AGGREGATES, "visual_aggregate": AGGREGATES}
# (modality, metric) of the Table 1 row; visual at pixel level
METRICS = SC.ROW_METRICS
_NAMES = {"rma": "RMA", "iou": "IoU"}
_W = 25  # width of a metric column of the text table: "55.0 +12.8 [-10.1,+27.4]"


def choices(design: str = "one_at_a_time") -> dict[str, dict]:
    """``{name: options}`` of a design (module docstring); options hold only what differs from
    ``multishap.DEFAULT_OPTIONS`` (``{}`` = the default)."""
    if design == "one_at_a_time":
        out = {"default": {}}
        for k, default in DEFAULT_OPTIONS.items():
            for v in _VALUES[k]:
                if v != default and v != "logit":  # "logit": only models returning answer_logits
                    out[f"{k}={v}"] = {k: v}
        out["reference"] = dict(REFERENCE_OPTIONS)
        return out
    if design == "full":
        out = {}
        for t, q, b, a in itertools.product(TARGETS, ("logprob", "log_odds"), PT.BASELINES,
                                            AGGREGATES):
            opts = {"target": t, "quantity": q, "baseline": b, "text_aggregate": a}
            diff = {k: v for k, v in opts.items() if DEFAULT_OPTIONS[k] != v}
            out["default" if not diff else ", ".join(f"{k}={v}" for k, v in opts.items())] = diff
        return out
    raise InputError(f"design must be 'one_at_a_time', 'full' or a mapping name -> options, "
                     f"got {design!r}")


def _check(rows: Mapping) -> dict[str, dict]:
    out = {}
    for name, opts in rows.items():
        opts = dict(opts)
        for k, v in opts.items():
            if k not in _VALUES:
                raise InputError(f"choice {name!r}: unknown option {k!r}; options are "
                                 f"{', '.join(OPTION_NAMES)}")
            if v not in _VALUES[k]:
                raise InputError(f"choice {name!r}: {k} must be one of "
                                 f"{', '.join(_VALUES[k])}, got {v!r}")
        out[str(name)] = {k: v for k, v in opts.items() if DEFAULT_OPTIONS[k] != v}
    if "default" not in out:
        out = {"default": {}, **out}
    elif out["default"]:
        raise InputError(f"the 'default' choice must be multishap.DEFAULT_OPTIONS, got "
                         f"{rows['default']}")
    return out


def sensitivity(n: int = 16, seed: int = T1.EXPLAIN_SEED, *, budget=None,
                regimes=("pure",), design="one_at_a_time", players: str = "cells",
                batch: int = 16, cell_px: int = 16, key=None, models=None, log=None,
                table1_kw: dict | None = None, parts_dir=None) -> dict:
    """MultiSHAP's Table 1 row under each choice of its open options (module docstring).

    Args:
      n, seed: held-out d07 samples per regime, as ``table1.table1``.
      budget: MultiSHAP's budget: an int (``n_samples``, coalitions per sample) or a dict of
        MultiSHAP budget keywords; default ``table1.DEFAULT_BUDGETS["multishap"]``.
      regimes: Table 1 regime names (``"pure"``, ``"spurious"``, ``"cross"``; one name or a
        sequence), or ``"all"``.
      design: ``"one_at_a_time"``, ``"full"`` or a mapping ``name -> options`` (``choices``).
      players: ``"cells"`` (default: Table 1's ``multishap`` row, one player per grid cell) or
        ``"reference"`` (its ``multishap_ref`` row, ``table1(players="reference")``: ViLT's
        patches, ``multishap.multishap_regions``).
      batch, cell_px, key: as ``table1.table1``.
      models: ``{"pure"|"spur": model}`` as ``table1.table1`` (paths are loaded once here);
        the shipped reference models otherwise (loaded once).
      log: ``log(str)`` per finished choice and regime.
      table1_kw: further keywords of ``table1.table1`` (e.g. ``data``).
      parts_dir: resume a stopped run: each choice's Table 1 run saves and reuses its parts
        (``table1_parts``: refused when its settings differ) in ``parts_dir/<choice>`` (the
        choice's name, characters other than letters, digits and ``_.=,-`` as ``_``).

    Returns ``{"n", "seed", "budget", "regimes", "row" (the Table 1 row: ``"multishap"`` or
    ``"multishap_ref"``), "design", "options": {name: full options},
    "reference_options": multishap.REFERENCE_OPTIONS, "table": {name: {regime: table_row}},
    "delta": {name: {regime: {"visual_rma"|"visual_iou"|"textual_rma"|"textual_iou": (d, lo,
    hi)}}} (paired difference of the choice's mean to the default's, fractions; not for the
    default), "floor": {regime: table_row} (the ``objects`` control on the same samples),
    "vs_floor": {name: {regime: {...: (d, lo, hi)}}} (each choice's paired difference to that
    floor), "per_sample": {name: {regime: per-sample scores}}, "floor_per_sample": {regime:
    per-sample scores}}``. With ``parts_dir`` the floor's parts go in
    ``parts_dir/objects_floor``.
    """
    from gridvqa_jax.training.export import load_model, load_reference_model

    rows = _check(design if isinstance(design, Mapping) else choices(design))
    if regimes == "all":
        regimes = tuple(r for r, _, _ in T1.REGIMES)
    regimes = (regimes,) if isinstance(regimes, str) else tuple(regimes)
    regime_def = {r: (m, d) for r, m, d in T1.REGIMES}
    bad = [r for r in regimes if r not in regime_def]
    if bad or not regimes:
        raise InputError(f"regimes: unknown {', '.join(map(str, bad)) or '(none given)'}; "
                         f"expected some of {', '.join(regime_def)} or 'all'")
    if players not in ("cells", "reference"):
        raise InputError(f"players must be 'cells' or 'reference', got {players!r}")
    # the row of Table 1 this measures, and how table1 is asked for it
    row, how = (("multishap", {}) if players == "cells" else
                ("multishap" + T1.REFERENCE_SUFFIX, {"players": "reference"}))
    if budget is None:
        budget = dict(T1.DEFAULT_BUDGETS["multishap"])
    elif not isinstance(budget, Mapping):
        budget = {"n_samples": budget}
    budget = dict(budget)
    clash = sorted(set(budget) & set(OPTION_NAMES))
    if clash:
        raise InputError(f"budget sets {', '.join(clash)}: the choices set the options")
    log = log or (lambda *_: None)
    # one load per model for all choices (table1 would load the shipped ones on every call)
    models = {m: load_model(v) if isinstance(v, (str, Path)) else v
              for m, v in dict(models or {}).items()}
    for r in regimes:
        m = regime_def[r][0]
        if m not in models:
            models[m] = load_reference_model(m)

    table, per_sample = {}, {}
    for name, opts in rows.items():
        where = {} if parts_dir is None else {"parts_dir": PARTS.run_parts_dir(parts_dir, name)}
        # budgets[row] replaces table1's own entry for the row (the reference rows' options)
        res = T1.table1(n, seed, explainers=("multishap",), regimes=regimes,
                        budgets={row: {**budget, **opts}}, batch=batch, cell_px=cell_px,
                        key=key, models=models, **how, **where, **(table1_kw or {}))
        table[name] = res["table"][row]
        per_sample[name] = res["per_sample"][row]
        for r in regimes:
            got = table[name][r]
            log(f"sensitivity {r:9s} {name:24s} " + " ".join(
                f"{mod} {_NAMES[m]} {_pct(got[mod][m])}" for mod, m in METRICS))
    # the objects floor on the same samples: the trivial map a choice has to beat
    where = {} if parts_dir is None else {
        "parts_dir": PARTS.run_parts_dir(parts_dir, FLOOR + "_floor")}
    res = T1.table1(n, seed, explainers=(FLOOR,), regimes=regimes, batch=batch,
                    cell_px=cell_px, key=key, models=models, **how, **where,
                    **(table1_kw or {}))
    floor, floor_scores = res["table"][FLOOR], res["per_sample"][FLOOR]

    def paired(a, b, r):
        return {f"{mod}_{m}": STATS.paired_ci(SC.row_scores(a[r], mod, m),
                                              SC.row_scores(b[r], mod, m))
                for mod, m in METRICS}

    delta = {name: {r: paired(per_sample[name], per_sample["default"], r) for r in regimes}
             for name in rows if name != "default"}
    vs_floor = {name: {r: paired(per_sample[name], floor_scores, r) for r in regimes}
                for name in rows}
    return {"n": n, "seed": seed, "budget": budget, "regimes": list(regimes), "row": row,
            "design": design if isinstance(design, str) else "given",
            "options": {k: {**DEFAULT_OPTIONS, **v} for k, v in rows.items()},
            "reference_options": dict(REFERENCE_OPTIONS), "table": table, "delta": delta,
            "floor": floor, "vs_floor": vs_floor,
            "per_sample": per_sample, "floor_per_sample": floor_scores}


def _pct(x) -> str:
    return "  n/a" if x is None or not np.isfinite(x) else f"{100 * x:5.1f}"


def _budget_text(budget: dict) -> str:
    return ", ".join(f"{k} = {v}" for k, v in budget.items()) or "default budget"


def _cell(row, d, mod, m) -> str:
    ours = _pct(row[mod][m] if row else None)
    if d is None:
        return f"{ours:>{_W}s}"
    dm, lo, hi = d[f"{mod}_{m}"]
    if not np.isfinite(dm):
        return f"{ours + ' (Δ n/a)':>{_W}s}"
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return f"{ours} ({STATS.points(dm)})".rjust(_W)
    return f"{ours} {STATS.points(dm, lo, hi, compact=True)}".rjust(_W)


def format_sensitivity(result: dict) -> str:
    """The sensitivity table as text: per regime, one line per choice with visual RMA / IoU and
    textual RMA / IoU (mean, %) and, beside each, the paired difference to the default in
    points with its 95% interval, then the choice's visual RMA minus the ``objects`` floor
    (points [95% interval]) and a line with the floor's means; then each choice's options."""
    # every choice is MultiSHAP, which draws i.i.d. coalition sizes unless told to stratify
    sampling = result["budget"].get("sampling", "iid")
    budget = _budget_text({**result["budget"], "sampling": sampling})
    lines = [f"MultiSHAP sensitivity ({result.get('row', 'multishap')} row): n = "
             f"{result['n']} d07 samples per regime (seed "
             f"{result['seed']}), {budget}; every choice on the same samples, models and keys; "
             "mean in %, then the paired difference to the default in points [95% interval]",
             "reference (WGLab/MultiSHAP): " + ", ".join(
                 f"{k}={v}" for k, v in result["reference_options"].items())
             + "; it stratifies coalition sizes" + (
                 ", as here" if sampling == "stratified" else
                 f", which no choice here does (sampling = {sampling})")]
    head = (f"{'choice':28s} " + " ".join(f"{mod + ' ' + _NAMES[m]:>{_W}s}"
                                          for mod, m in METRICS)
            + f" {'visual RMA - floor':>22s}")
    floor = result.get("floor") or {}
    for r in result["regimes"]:
        lines += ["", f"regime {r}", head]
        for name, rows in result["table"].items():
            d = result["delta"].get(name, {}).get(r)
            f = result.get("vs_floor", {}).get(name, {}).get(r)
            vf = "" if f is None else STATS.points(*f["visual_rma"], compact=True)
            lines.append(f"{name:28s} " + " ".join(_cell(rows.get(r), d, mod, m)
                                                    for mod, m in METRICS) + f" {vf:>22s}")
        if r in floor:
            lines.append(f"{FLOOR + ' floor':28s} " + " ".join(
                _cell(floor[r], None, mod, m) for mod, m in METRICS))
    lines += ["", "options of each choice (target, quantity, baseline, text_aggregate, "
              "visual_aggregate):"]
    lines += [f"  {name:28s} " + ", ".join(str(o[k]) for k in OPTION_NAMES)
              for name, o in result["options"].items()]
    return "\n".join(lines)


def compact(result: dict) -> dict:
    """The ``"sensitivity"`` entry of ``gridvqa explain --regimes --sensitivity``'s JSON line:
    the result without per-sample scores (NaN -> null; deltas as ``[d, lo, hi]``)."""
    return jsonable({k: v for k, v in result.items()
                     if k not in ("per_sample", "floor_per_sample")})


__all__ = ["OPTION_NAMES", "METRICS", "choices", "sensitivity", "format_sensitivity", "compact"]
