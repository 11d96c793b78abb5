"""GridVQA-X's Table 1: local explainers x regimes, with the paper's numbers and findings.

The per-sample protocol (RMA, Otsu IoU, RRA and pointing game at pixel and cell level, the
per-form breakdown and the spread of the maps) is ``gridvqa_jax.explain.scoring``
(``score_explainer``), re-exported here.

``table1(n, seed)`` scores MultiSHAP, DIME, MultiViz and the random / oracle controls in the
three regimes (pure = M_pure on D_pure, spurious = M_spur on D_spur, cross = M_spur on D_pure;
density d07, every bucket) on fresh held-out samples (``EXPLAIN_SEED``: training uses seeds
1000 + i, evaluation ``evaluate.EVAL_SEED`` + i) and checks the paper's four findings.
Explainers are names in ``scoring.EXPLAINERS`` or any callable with the explainer signature.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from gridvqa_jax.explain.scoring import (CONTROLS, EXPLAINERS, GT_CELL_PX, METRICS,
                                         call_explainer, check_budget, concat_scores, map_spread,
                                         per_sample_scores, resolve_explainer,
                                         resolve_explainers, score_explainer,
                                         summarise_scores, table_row)
from mmx_base import staging
from mmx_base.errors import InputError
from mmx_base.trees import jsonable
from reproduction import stats as STATS
from gridvqa_jax.world.scene import trim_tokens

EXPLAIN_SEED = 913_000  # Table 1 held-out samples: no training (1000 + i) or evaluation stream uses it
REGIMES = (("pure", "pure", "pure"), ("spurious", "spur", "spur"), ("cross", "spur", "pure"))

# GridVQA-X Table 1 (M_pure on D_pure, M_spur on D_spur), in percent: (mean, std).
PAPER_TABLE1 = {
    "dime": {"visual": {"pure": {"rma": (28.0, 13.9), "iou": (20.5, 10.2)},
                        "spurious": {"rma": (27.2, 14.5), "iou": (18.2, 10.0)}},
             "textual": {"pure": {"rma": (43.0, 26.8), "iou": (12.3, 12.5)},
                         "spurious": {"rma": (37.5, 25.9), "iou": (10.3, 11.5)}}},
    "multishap": {"visual": {"pure": {"rma": (56.0, 22.7), "iou": (50.0, 22.6)},
                             "spurious": {"rma": (64.5, 21.8), "iou": (46.2, 23.1)}},
                  "textual": {"pure": {"rma": (66.8, 17.3), "iou": (46.7, 18.9)},
                              "spurious": {"rma": (67.5, 16.1), "iou": (40.2, 19.9)}}},
    "multiviz": {"visual": {"pure": {"rma": (44.0, 16.3), "iou": (4.7, 3.3)},
                            "spurious": {"rma": (42.2, 20.0), "iou": (6.7, 4.5)}}},
}


# ---------------------------------------------------------------------------------------------
# Table 1.


def regime_scenes(variant: str, n: int, seed: int = EXPLAIN_SEED, grid_size: int = 5):
    """n held-out d07 samples (every bucket) of ``variant`` (numpy Scene batch): D_pure from
    ``seed``, D_spur from ``seed + 1`` (the constructive sampler places anchors and targets
    alike for both variants from one key, so one seed would give D_spur the same ground truth
    as D_pure; the regimes are meant to be independent samples)."""
    from gridvqa_jax.world import generate as G
    from gridvqa_jax.world import universe as U

    spec = U.Spec.feasible(variant, grid_size, U.DENSITIES["d07"])[0]
    offset = U.VARIANTS.index(variant)
    return G.to_numpy(G.generate_chunk(spec, seed + offset, 0, n))


def _pts(d, ci) -> str:
    return f"{100 * d:+.1f} pts [{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]"


def _t1_finding(claim: str, verdict: str, evidence: str) -> dict:
    return STATS.finding("GridVQA-X", f"Table 1: {claim}", claim, verdict, evidence)


def _not_scored(claim: str, what: str) -> dict:
    return _t1_finding(claim, "inconclusive", f"not measured: {what} not scored in this run")


def check_findings(per_sample: dict) -> list[dict]:
    """The paper's four Table 1 findings checked on ``per_sample[explainer][regime]`` scores.

    Differences are in visual RMA (or IoU, entropy) points with their 95% interval
    (``reproduction.stats``): Welch (``stats.welch``) between different samples (pure vs
    spurious; form 1 vs form 0), paired (``stats.paired``) on the same samples (cross vs pure;
    explainers on the same scenes); the verdict is ``stats.verdict`` of that interval against
    the claim (``stats.all_of`` for a claim about several differences). A finding whose
    explainer was not scored is inconclusive. Returns ``stats.finding`` records.
    """
    out = []
    v = lambda e, r, m="rma": per_sample[e][r]["visual"]["pixel"][m]  # noqa: E731
    have = lambda e, *rs: e in per_sample and all(r in per_sample[e] for r in rs)  # noqa: E731

    claim = "MultiSHAP's RMA is higher on M_spur than on M_pure"
    if have("multishap", "pure", "spurious"):
        d, se = STATS.welch(v("multishap", "spurious"), v("multishap", "pure"))
        ci = STATS.interval(d, se)
        ev = f"visual RMA spurious - pure = {_pts(d, ci)} (paper +8.5)"
        if have("multishap", "cross"):
            dc, sec = STATS.paired(v("multishap", "cross"), v("multishap", "pure"))
            ev += f"; same D_pure samples, M_spur - M_pure = {_pts(dc, STATS.interval(dc, sec))}"
        out.append(_t1_finding(claim, STATS.verdict(ci, (">", 0.0)), ev))
    else:
        out.append(_not_scored(claim, "multishap"))

    claim = "MultiViz is near-identical across models (|Δ| <= 5 pts)"
    if have("multiviz", "pure", "spurious"):
        diffs = {"RMA": STATS.welch(v("multiviz", "spurious"), v("multiviz", "pure")),
                 "IoU": STATS.welch(v("multiviz", "spurious", "iou"), v("multiviz", "pure", "iou"))}
        if have("multiviz", "cross"):
            diffs["same D_pure samples, M_spur - M_pure RMA"] = STATS.paired(
                v("multiviz", "cross"), v("multiviz", "pure"))
        cis = {k: STATS.interval(d, se) for k, (d, se) in diffs.items()}
        ev = "spurious - pure: " + "; ".join(f"{k} {_pts(diffs[k][0], cis[k])}" for k in cis)
        out.append(_t1_finding(claim, STATS.all_of(STATS.verdict(ci, ("in", -0.05, 0.05))
                                                for ci in cis.values()),
                               ev + " (paper -1.8 / +2.0)"))
    else:
        out.append(_not_scored(claim, "multiviz"))

    claim = ("DIME's maps are diffuse (entropy nearer random than oracle, and above the other "
             "explainers)")
    if have("dime") and have("random") and have("oracle"):
        def spread(e, k="entropy", regimes=None):
            return np.concatenate([per_sample[e][r]["spread"][k] for r in regimes or per_sample[e]])

        ent = {e: float(np.nanmean(spread(e))) for e in per_sample}
        c50 = {e: float(np.nanmean(spread(e, "cells_50"))) for e in per_sample}
        others = [e for e in ("multishap", "multiviz") if e in per_sample]
        # every explainer scores the same scenes in the same order: differences are paired
        regs = [r for r in per_sample["dime"]
                if all(r in per_sample[e] for e in ["random", "oracle"] + others)]
        dime = spread("dime", regimes=regs)
        parts = {"DIME - (oracle + random) / 2": STATS.paired(
            dime, (spread("oracle", regimes=regs) + spread("random", regimes=regs)) / 2)}
        parts.update({f"DIME - {e}": STATS.paired(dime, spread(e, regimes=regs)) for e in others})
        cis = {k: STATS.interval(d, se) for k, (d, se) in parts.items()}
        ev = ("normalised entropy of the cell map (all regimes): " +
              ", ".join(f"{e} {ent[e]:.2f}" for e in ent) + "; paired differences: " +
              "; ".join(f"{k} {d:+.3f} [{cis[k][0]:+.3f}, {cis[k][1]:+.3f}]"
                        for k, (d, _) in parts.items()) +
              "; share of cells holding 50% of the mass: " +
              ", ".join(f"{e} {c50[e]:.2f}" for e in c50))
        out.append(_t1_finding(claim, STATS.all_of(STATS.verdict(ci, (">", 0.0))
                                                for ci in cis.values()), ev))
    else:
        out.append(_not_scored(claim, "dime, random or oracle"))

    claim = "MultiSHAP's RMA is lower on existence (form 1) questions"
    if have("multishap", "pure"):
        ev, verdicts = [], {}
        for r in per_sample["multishap"]:
            s = per_sample["multishap"][r]
            rma, form = s["visual"]["pixel"]["rma"], s["form"]
            d, se = STATS.welch(rma[form == 1], rma[form == 0])
            ci = STATS.interval(d, se)
            verdicts[r] = STATS.verdict(ci, ("<", 0.0))
            ev.append(f"{r}: form 1 - form 0 = {_pts(d, ci)} "
                      f"(n = {int(np.sum(form == 1))} / {int(np.sum(form == 0))})")
        # the pure regime decides; the others are shown as evidence
        out.append(_t1_finding(claim, verdicts["pure"], "; ".join(ev)))
    else:
        out.append(_not_scored(claim, "multishap"))
    return out


DEFAULT_BUDGETS = {  # per explainer, passed through (keywords an explainer lacks are dropped)
    "multishap": {"n_samples": 8},
    "dime": {"n_samples": 256},
    "multiviz": {},
}


def table1(n: int = 16, seed: int = EXPLAIN_SEED, *, explainers=tuple(EXPLAINERS),
           regimes=tuple(r for r, _, _ in REGIMES), budgets: dict | None = None,
           batch: int = 16, cell_px: int = 16, key=None, progress: bool = False,
           figures_dir=None, n_figures: int = 2, log=None, models=None) -> dict:
    """Table 1: every explainer and control in every regime, on ``n`` held-out d07 samples.

    Samples: ``regime_scenes(variant, n, seed)``; pure and cross share the same D_pure samples.
    Each explainer sees the samples ``batch`` at a time (DIME's N x N cross-sample matrix is
    over one batch), without the positions that are PAD in every question of the batch
    (``world.scene.trim_tokens``; the models ignore PAD), with key ``fold_in(fold_in(key, explainer), batch index)``; ``budgets``
    updates ``DEFAULT_BUDGETS`` (keyed by explainer name; a keyword an explainer does not
    accept raises ``scoring.BudgetError``). ``explainers``: names in ``scoring.EXPLAINERS``
    and / or explainer callables (named by ``__name__``), or a mapping name -> name or callable
    (``scoring.resolve_explainers``). ``models``: ``{"pure"|"spur": model}`` replacing the
    shipped reference model of that name, a model being a ``Model`` / ``(apply_fn, params,
    ...)`` or the path of an export directory (``training.export.load_model``).
    ``figures_dir``: heatmap PNGs for the first ``n_figures`` samples of each regime
    (``figures.save_heatmap``).

    Returns ``{"table": {explainer: {regime: table_row}}, "scores": {explainer: {regime:
    summary}}, "findings": [...], "n": n, "seed": seed, "budgets": ..., "per_sample":
    {explainer: {regime: per-sample scores}}}``.
    """
    from gridvqa_jax.training.export import load_model, load_reference_model

    budgets = {**{k: dict(v) for k, v in DEFAULT_BUDGETS.items()}, **(budgets or {})}
    key = jax.random.key(seed) if key is None else key
    log = log or (lambda *_: None)
    fns = resolve_explainers(explainers)
    for e, fn in fns.items():
        check_budget(fn, budgets.get(e, {}))  # a bad keyword fails before any model runs
    regime_def = {r: (m, d) for r, m, d in REGIMES}
    given = dict(models or {})
    unknown = sorted(set(given) - {m for _, m, _ in REGIMES})
    if unknown:
        raise InputError(f"models: unknown model name(s) {', '.join(unknown)}; expected pure, spur")
    models = {m: (load_model(v) if isinstance(v, (str, Path)) else v)[:2]
              for m, v in given.items()}
    data = {}
    per_sample = {e: {} for e in fns}
    figures = []
    from tqdm.auto import tqdm
    import sys

    bar = tqdm(total=len(fns) * len(regimes) * n, desc="table1", unit="sample",
               disable=not progress, file=sys.stderr, dynamic_ncols=True)
    for r in regimes:
        m_name, d_name = regime_def[r]
        if m_name not in models:
            models[m_name] = load_reference_model(m_name)[:2]
        if d_name not in data:
            data[d_name] = regime_scenes(d_name, n, seed)
        apply_fn, params = models[m_name]
        scenes = data[d_name]
        fig_maps = {}
        for ei, (e, fn) in enumerate(fns.items()):
            parts, attrs = [], []
            ekey = jax.random.fold_in(key, ei)
            for bi, lo in enumerate(range(0, n, batch)):
                # trailing PAD off: our models cost less on fewer token positions, same outputs
                chunk = trim_tokens(jax.tree.map(lambda a: a[lo:lo + batch], scenes))
                attr = call_explainer(fn, apply_fn, params, chunk, jax.random.fold_in(ekey, bi),
                                      cell_px=cell_px, **budgets.get(e, {}))
                parts.append(per_sample_scores(attr, chunk))
                if figures_dir is not None and lo < n_figures:
                    attr = attr.pad_tokens(np.shape(scenes.tokens)[-1])
                    attrs.append(jax.tree.map(lambda a: np.asarray(a)[:n_figures - lo], attr))
                bar.update(len(chunk.form))
            per_sample[e][r] = concat_scores(parts)
            if attrs:
                fig_maps[e] = jax.tree.map(lambda *xs: np.concatenate(xs), *attrs)
            log(f"{r:9s} {e:10s} " + _row_text(table_row(summarise_scores(per_sample[e][r]))))
        if figures_dir is not None and fig_maps:
            from reproduction import figures as FG

            for i in range(min(n_figures, n)):
                sc = jax.tree.map(lambda a: np.asarray(a)[i], scenes)
                path = Path(figures_dir) / f"{r}_{i:02d}.png"
                FG.save_heatmap(path, sc, {e: (a.visual[i], a.textual[i])
                                          for e, a in fig_maps.items()},
                               title=f"{r}: {m_name} model on {d_name} data, sample {i}")
                figures.append(str(path))
    bar.close()
    scores = {e: {r: summarise_scores(per_sample[e][r]) for r in per_sample[e]}
              for e in per_sample}
    return {"table": {e: {r: table_row(s) for r, s in rs.items()} for e, rs in scores.items()},
            "scores": scores, "findings": check_findings(per_sample),
            "n": n, "seed": seed, "budgets": {e: budgets.get(e, {}) for e in fns},
            "figures": figures, "per_sample": per_sample}


def _pct(x):
    return "  n/a " if x is None or not np.isfinite(x) else f"{100 * x:5.1f}"


def _row_text(row):
    v, t = row["visual"], row["textual"]
    return (f"visual RMA {_pct(v['rma'])} ± {_pct(v['rma_std'])} IoU {_pct(v['iou'])} ± "
            f"{_pct(v['iou_std'])} | textual RMA {_pct(t['rma'])} IoU {_pct(t['iou'])}")


def format_table(result: dict) -> str:
    """Table 1 as text: ours (mean ± std, %) beside the paper's for every modality, explainer
    and regime, then the findings with their verdicts."""
    regimes = [r for r, _, _ in REGIMES]
    head = (f"{'modality':8s} {'method':10s} " + " ".join(
        f"{r + ' RMA':>15s} {r + ' IoU':>15s}" for r in regimes))
    lines = [f"GridVQA-X Table 1: n = {result['n']} d07 samples per regime (seed "
             f"{result['seed']}); ours / [paper], mean ± std in %", head]
    for mod in ("visual", "textual"):
        for e, rs in result["table"].items():
            ours = [f"{mod:8s} {e:10s}"]
            paper = [f"{'':8s} {'  [paper]':10s}"]
            has_paper = False
            for r in regimes:
                row = rs.get(r, {}).get(mod)
                for m in ("rma", "iou"):
                    ours.append(f"{_pct(row[m]) + ' ± ' + _pct(row[m + '_std']):>15s}"
                                if row else f"{'':>15s}")
                    p = PAPER_TABLE1.get(e, {}).get(mod, {}).get(r, {}).get(m)
                    has_paper |= p is not None
                    paper.append(f"{f'{p[0]:5.1f} ± {p[1]:4.1f}' if p else '':>15s}")
            lines.append(" ".join(ours))
            if has_paper:
                lines.append(" ".join(paper))
    lines.append("")
    lines.append("Findings of the paper, checked on our models:")
    for f in result["findings"]:
        lines.append(f"  [{f['verdict']}] {f['claim']}: {f['evidence']}")
    return "\n".join(lines)


def write_results(out_dir, run: Callable[[Path], dict]) -> dict:
    """Run ``run(stage) -> result`` (the Table 1 run, writing its heatmap PNGs into ``stage``),
    write ``results.json`` (everything but per-sample scores) beside them and publish the
    directory as ``out_dir`` atomically (``mmx_base.staging``: ``out_dir`` must be absent
    or empty, checked before the run; nothing is left at ``out_dir`` on failure). Returns the
    result."""
    stage = staging.make_staging(out_dir)
    try:
        result = run(stage)
        body = {k: v for k, v in result.items() if k != "per_sample"}
        body["figures"] = [Path(p).name for p in body.get("figures", [])]
        (stage / "results.json").write_text(json.dumps(jsonable(body), indent=1))
        staging.publish(stage, out_dir)
    except BaseException:
        staging.discard(stage)
        raise
    return result


def compact(result: dict) -> dict:
    """The JSON line of ``gridvqa explain --regimes``: ``{explainer: {regime: {"visual": {rma,
    rma_std, iou, iou_std}, "textual": {...}}}}`` (NaN -> null)."""
    return jsonable(result["table"])


__all__ = ["EXPLAIN_SEED", "EXPLAINERS", "REGIMES", "PAPER_TABLE1", "DEFAULT_BUDGETS",
           "score_explainer", "per_sample_scores", "summarise_scores", "concat_scores",
           "table_row", "map_spread", "resolve_explainer", "regime_scenes", "table1",
           "check_findings", "format_table", "write_results", "compact"]
