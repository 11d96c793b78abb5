"""The scorecard of a local explainer, and GridVQA-X's Table 1 (explainers x regimes).

``score_explainer(explainer, apply_fn, params, scenes, key)`` runs the protocol of the
GridVQA-X paper's Table 1 on any function with the explainer signature
``explainer(apply_fn, params, scenes, key, *, cell_px=16, **budget) -> Attribution``:

* visual, at pixel level: the per-cell map spread over the pixels of the official 64-px
  rendering (``Attribution.visual_pixels(64)``) against ``metrics.visual_ground_truth(scene, 64)``
  (whole cells of A ∪ T), and at cell level against ``scene.gt_cells``;
* textual, per model token, against ``metrics.textual_ground_truth`` (target attributes,
  anchor attributes, relations);
* metrics: Relevance Mass Accuracy, Otsu IoU, Relevance Rank Accuracy, pointing game
  (``gridvqa_jax.metrics``); mean and population std over samples with NaN scores (empty ground
  truth or all-zero map) excluded and counted (``metrics.summarise``);
* a per-form breakdown (form 0 = count, form 1 = yes/no existence), and two measures of how
  spread the visual map is: the normalised entropy ``H(p) / log(S*S)`` of ``p = |a| / sum |a|``
  over cells (0 = one cell, 1 = uniform) and the share of cells needed to hold half of the mass.

``table1(n, seed)`` scores MultiSHAP, DIME, MultiViz and the random / oracle controls in the
three regimes (pure = M_pure on D_pure, spurious = M_spur on D_spur, cross = M_spur on D_pure;
density d07, every bucket) on fresh held-out samples (``EXPLAIN_SEED``: training uses seeds
1000 + i, evaluation ``evaluate.EVAL_SEED`` + i) and checks the paper's four findings.
Explainer modules are imported by name when they are used (``EXPLAINERS``), so the table runs
with whichever of them are installed and reports the others as missing.
"""

from __future__ import annotations

import inspect
import json
import math
from importlib import import_module
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from gridvqa_jax import metrics as Mx
from mmx_base import staging
from mmx_base.trees import jsonable
from gridvqa_jax.world.scene import trim_tokens

EXPLAIN_SEED = 913_000  # Table 1 held-out samples: no training (1000 + i) or evaluation stream uses it
GT_CELL_PX = 64  # official rendering resolution: the pixel-level ground truth of Table 1

# name -> (module, function); controls are adapted to the explainer signature (``_control``).
EXPLAINERS = {
    "multishap": ("gridvqa_jax.explain.multishap", "multishap"),
    "dime": ("gridvqa_jax.explain.dime", "dime"),
    "multiviz": ("gridvqa_jax.explain.multiviz", "multiviz"),
    "random": ("gridvqa_jax.explain.controls", "random_attribution"),
    "oracle": ("gridvqa_jax.explain.controls", "oracle_attribution"),
}
CONTROLS = ("random", "oracle")
REGIMES = (("pure", "pure", "pure"), ("spurious", "spur", "spur"), ("cross", "spur", "pure"))
METRICS = {
    "rma": Mx.relevance_mass_accuracy,
    "iou": Mx.otsu_iou,
    "rra": Mx.relevance_rank_accuracy,
    "pointing": Mx.pointing_game,
}

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
# Per-sample scores.


def map_spread(visual) -> dict:
    """How diffuse a visual map is, per sample: visual float [B, S, S] -> dict of float [B].

    ``entropy``: ``-sum p log p / log(S*S)`` with ``p = |a| / sum |a|`` over cells (0 = all mass
    on one cell, 1 = uniform); ``cells_50``: the smallest share of cells (largest first) whose
    ``|a|`` reaches half of the total. NaN for an all-zero map.
    """
    a = np.abs(np.asarray(visual, np.float64)).reshape(np.shape(visual)[0], -1)
    total = a.sum(1, keepdims=True)
    ok = total[:, 0] > 0
    p = a / np.where(total > 0, total, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ent = -np.sum(np.where(p > 0, p * np.log(p), 0), 1) / math.log(a.shape[1])
    cum = np.cumsum(-np.sort(-p, axis=1), axis=1)
    k = (np.sum(cum < 0.5 - 1e-12, axis=1) + 1) / a.shape[1]
    return {"entropy": np.where(ok, ent, np.nan), "cells_50": np.where(ok, k, np.nan)}


def per_sample_scores(attribution, scenes, *, levels=("pixel", "cell"),
                      gt_cell_px: int = GT_CELL_PX) -> dict:
    """Every metric of every sample: ``{"visual": {level: {metric: float [B]}}, "textual":
    {metric: float [B]}, "spread": {"entropy", "cells_50"}, "form": int [B]}`` (numpy).

    ``attribution``: an ``Attribution`` for the B ``scenes``. Pixel level compares
    ``attribution.visual_pixels(gt_cell_px)`` with ``visual_ground_truth(scenes, gt_cell_px)``
    (64 = the official resolution); cell level compares the cell map with ``scenes.gt_cells``.
    NaN where the ground truth is empty or the map all zero.
    """
    out = {"visual": {}, "textual": {}}
    for level in levels:
        if level == "pixel":
            amap = attribution.visual_pixels(gt_cell_px)
            mask = Mx.visual_ground_truth(scenes, gt_cell_px, "pixel")
        elif level == "cell":
            amap, mask = attribution.visual, Mx.visual_ground_truth(scenes, level="cell")
        else:
            raise ValueError(f"level must be 'pixel' or 'cell', got {level!r}")
        out["visual"][level] = {k: np.asarray(f(amap, mask)) for k, f in METRICS.items()}
    tmask = Mx.textual_ground_truth(scenes) & jnp.asarray(attribution.token_valid)
    out["textual"] = {k: np.asarray(f(attribution.textual, tmask)) for k, f in METRICS.items()}
    out["spread"] = map_spread(attribution.visual)
    out["form"] = np.asarray(scenes.form)
    return out


def concat_scores(parts: list[dict]) -> dict:
    """Concatenate ``per_sample_scores`` dicts along the sample axis."""
    return jax.tree.map(lambda *xs: np.concatenate(xs), *parts)


def _select(scores: dict, keep) -> dict:
    return jax.tree.map(lambda x: x[keep], scores)


def summarise_scores(scores: dict, by_form: bool = True) -> dict:
    """``per_sample_scores`` -> the same tree with every array replaced by
    ``metrics.summarise`` (mean, std, n, n_excluded); ``by_form`` adds ``"by_form": {"0": ...,
    "1": ...}`` (the same summary over form-0 / form-1 samples)."""
    body = {k: v for k, v in scores.items() if k != "form"}
    out = jax.tree.map(Mx.summarise, body)
    out["n"] = int(len(scores["form"]))
    if by_form:
        out["by_form"] = {str(f): summarise_scores(_select(scores, scores["form"] == f), False)
                          for f in (0, 1) if np.any(scores["form"] == f)}
    return out


def table_row(summary: dict, level: str = "pixel") -> dict:
    """The Table 1 view of a summary: ``{"visual": {"rma", "rma_std", "iou", "iou_std"},
    "textual": {...}}`` (fractions in [0, 1]; visual at ``level``)."""
    def row(d):
        return {"rma": d["rma"]["mean"], "rma_std": d["rma"]["std"],
                "iou": d["iou"]["mean"], "iou_std": d["iou"]["std"]}

    return {"visual": row(summary["visual"][level]), "textual": row(summary["textual"])}


def _call(explainer: Callable, apply_fn, params, scenes, key, cell_px, budget):
    """Call ``explainer`` with only the budget keywords it accepts (all if it takes **kw)."""
    try:
        sig = inspect.signature(explainer)
        if not any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
            budget = {k: v for k, v in budget.items() if k in sig.parameters}
        if "cell_px" in sig.parameters or any(p.kind is p.VAR_KEYWORD
                                               for p in sig.parameters.values()):
            budget = {"cell_px": cell_px, **budget}
    except (TypeError, ValueError):  # builtins / C callables: pass everything
        budget = {"cell_px": cell_px, **budget}
    return explainer(apply_fn, params, scenes, key, **budget)


def score_explainer(explainer: Callable, apply_fn, params, scenes, key, *, cell_px: int = 16,
                    levels=("pixel", "cell"), gt_cell_px: int = GT_CELL_PX,
                    return_per_sample: bool = False, **budget) -> dict:
    """Score a local explainer on a batch of scenes with the Table 1 protocol.

    ``explainer(apply_fn, params, scenes, key, *, cell_px, **budget) -> Attribution`` (visual
    [B, S, S], textual [B, L]); ``scenes``: a ``Scene`` batch of B samples; ``budget`` is passed
    through (keywords the explainer does not accept are dropped). Returns::

        {"visual": {level: {metric: summary}}, "textual": {metric: summary},
         "spread": {"entropy": summary, "cells_50": summary}, "n": B,
         "by_form": {"0": {...same...}, "1": {...}}, "table": table_row(...)}

    with ``summary = {"mean", "std", "n", "n_excluded"}`` (``metrics.summarise``: NaN scores of
    samples with an empty ground truth or an all-zero map are excluded and counted) and metrics
    ``rma``, ``iou`` (Otsu), ``rra``, ``pointing``. ``return_per_sample=True`` adds the raw
    per-sample scores under ``"per_sample"``.
    """
    attribution = _call(explainer, apply_fn, params, scenes, key, cell_px, budget)
    scores = per_sample_scores(attribution, scenes, levels=levels, gt_cell_px=gt_cell_px)
    out = summarise_scores(scores)
    out["table"] = table_row(out, levels[0])
    if return_per_sample:
        out["per_sample"] = scores
    return out


# ---------------------------------------------------------------------------------------------
# Table 1.


def _control(fn):
    def explainer(apply_fn, params, scenes, key, **_):
        return fn(apply_fn, scenes, key)

    explainer.__name__ = fn.__name__
    return explainer


def resolve_explainer(name: str):
    """The explainer function called ``name`` (``EXPLAINERS``), or None when its module is not
    installed yet. Controls come adapted to the explainer signature."""
    module, attr = EXPLAINERS[name]
    try:
        fn = getattr(import_module(module), attr)
    except (ImportError, AttributeError):
        return None
    return _control(fn) if name in CONTROLS else fn


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


def _welch(a, b):
    """(mean(a) - mean(b), its standard error), NaN excluded."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    a, b = a[~np.isnan(a)], b[~np.isnan(b)]
    if len(a) < 2 or len(b) < 2:
        return float("nan"), float("nan")
    return float(a.mean() - b.mean()), float(math.sqrt(a.var(ddof=1) / len(a)
                                                       + b.var(ddof=1) / len(b)))


def _paired(a, b):
    d = np.asarray(a, float) - np.asarray(b, float)
    d = d[~np.isnan(d)]
    if len(d) < 2:
        return float("nan"), float("nan")
    return float(d.mean()), float(d.std(ddof=1) / math.sqrt(len(d)))


def _signed_verdict(diff, se, expect_positive=True):
    if not np.isfinite(diff) or not np.isfinite(se):
        return "not measured"
    d = diff if expect_positive else -diff
    if d > 2 * se:
        return "holds"
    if d < -2 * se:
        return "reversed"
    return "not significant"


def check_findings(per_sample: dict) -> list[dict]:
    """The paper's four findings checked on ``per_sample[explainer][regime]`` scores.

    Each finding: ``{"finding", "verdict", "evidence"}``; differences are in RMA points with a
    standard error (Welch for different samples, paired for the same samples), a difference
    counts when it exceeds two standard errors.
    """
    out = []
    v = lambda e, r, m="rma": per_sample[e][r]["visual"]["pixel"][m]  # noqa: E731
    have = lambda e, *rs: e in per_sample and all(r in per_sample[e] for r in rs)  # noqa: E731

    if have("multishap", "pure", "spurious"):
        d, se = _welch(v("multishap", "spurious"), v("multishap", "pure"))
        ev = f"visual RMA spurious - pure = {100 * d:+.1f} ± {100 * se:.1f} pts (paper +8.5)"
        if have("multishap", "cross"):
            dc, sec = _paired(v("multishap", "cross"), v("multishap", "pure"))
            ev += f"; same D_pure samples, M_spur - M_pure = {100 * dc:+.1f} ± {100 * sec:.1f} pts"
        out.append({"finding": "MultiSHAP's RMA is higher on M_spur than on M_pure",
                    "verdict": _signed_verdict(d, se), "evidence": ev})
    else:
        out.append({"finding": "MultiSHAP's RMA is higher on M_spur than on M_pure",
                    "verdict": "not measured", "evidence": "multishap not available"})

    if have("multiviz", "pure", "spurious"):
        d, se = _welch(v("multiviz", "spurious"), v("multiviz", "pure"))
        di, sei = _welch(v("multiviz", "spurious", "iou"), v("multiviz", "pure", "iou"))
        ev = (f"visual RMA spurious - pure = {100 * d:+.1f} ± {100 * se:.1f} pts, IoU "
              f"{100 * di:+.1f} ± {100 * sei:.1f} pts (paper -1.8 / +2.0)")
        paired = None
        if have("multiviz", "cross"):
            paired = _paired(v("multiviz", "cross"), v("multiviz", "pure"))
            ev += (f"; same D_pure samples, M_spur - M_pure = {100 * paired[0]:+.1f} ± "
                   f"{100 * paired[1]:.1f} pts")
        # near-identical = every measured difference within 5 points and none significant
        diffs = [(d, se), (di, sei)] + ([paired] if paired else [])
        if not all(np.isfinite(x) for p in diffs for x in p):
            verdict = "not measured"
        elif all(abs(x) <= 0.05 for x, _ in diffs):
            verdict = "holds"
        elif any(abs(x) > 0.05 and abs(x) > 2 * s for x, s in diffs):
            verdict = "does not hold"
        else:
            verdict = "not significant"
        out.append({"finding": "MultiViz is near-identical across models (|Δ| <= 5 pts)",
                    "verdict": verdict, "evidence": ev})
    else:
        out.append({"finding": "MultiViz is near-identical across models (|Δ| <= 5 pts)",
                    "verdict": "not measured", "evidence": "multiviz not available"})

    if have("dime", "pure") and have("random", "pure") and have("oracle", "pure"):
        def spread(e, k="entropy"):
            return np.concatenate([per_sample[e][r]["spread"][k] for r in per_sample[e]])

        ent = {e: float(np.nanmean(spread(e))) for e in per_sample}
        c50 = {e: float(np.nanmean(spread(e, "cells_50"))) for e in per_sample}
        mid = (ent["oracle"] + ent["random"]) / 2
        others = [ent[e] for e in ("multishap", "multiviz") if e in ent]
        verdict = "holds" if ent["dime"] >= mid and all(ent["dime"] >= o for o in others) else (
            "partly" if ent["dime"] >= mid else "does not hold")
        ev = ("normalised entropy of the cell map (all regimes): " +
              ", ".join(f"{e} {ent[e]:.2f}" for e in ent) + "; share of cells holding 50% of "
              "the mass: " + ", ".join(f"{e} {c50[e]:.2f}" for e in c50))
        out.append({"finding": "DIME's maps are diffuse (entropy nearer random than oracle, "
                               "and above the other explainers)", "verdict": verdict,
                    "evidence": ev})
    else:
        out.append({"finding": "DIME's maps are diffuse", "verdict": "not measured",
                    "evidence": "dime or a control not available"})

    if have("multishap", "pure"):
        ev, verdicts = [], []
        for r in per_sample["multishap"]:
            s = per_sample["multishap"][r]
            rma, form = s["visual"]["pixel"]["rma"], s["form"]
            d, se = _welch(rma[form == 1], rma[form == 0])
            verdicts.append(_signed_verdict(d, se, expect_positive=False))
            ev.append(f"{r}: form 1 - form 0 = {100 * d:+.1f} ± {100 * se:.1f} pts "
                      f"(n = {int(np.sum(form == 1))} / {int(np.sum(form == 0))})")
        verdict = verdicts[0]  # the pure regime decides; the others are shown as evidence
        out.append({"finding": "MultiSHAP's RMA is lower on existence (form 1) questions",
                    "verdict": verdict, "evidence": "; ".join(ev)})
    else:
        out.append({"finding": "MultiSHAP's RMA is lower on existence (form 1) questions",
                    "verdict": "not measured", "evidence": "multishap not available"})
    return out


DEFAULT_BUDGETS = {  # per explainer, passed through (keywords an explainer lacks are dropped)
    "multishap": {"n_samples": 8},
    "dime": {"n_samples": 256},
    "multiviz": {},
}


def table1(n: int = 16, seed: int = EXPLAIN_SEED, *, explainers=tuple(EXPLAINERS),
           regimes=tuple(r for r, _, _ in REGIMES), budgets: dict | None = None,
           batch: int = 16, cell_px: int = 16, key=None, progress: bool = False,
           figures_dir=None, n_figures: int = 2, log=None) -> dict:
    """Table 1: every explainer and control in every regime, on ``n`` held-out d07 samples.

    Samples: ``regime_scenes(variant, n, seed)``; pure and cross share the same D_pure samples.
    Each explainer sees the samples ``batch`` at a time (DIME's N x N cross-sample matrix is
    over one batch), without the positions that are PAD in every question of the batch
    (``world.scene.trim_tokens``; the models ignore PAD), with key ``fold_in(fold_in(key, explainer), batch index)``; ``budgets``
    updates ``DEFAULT_BUDGETS``. Explainers whose module is not installed are listed under
    ``"missing"``. ``figures_dir``: heatmap PNGs for the first ``n_figures`` samples of each
    regime (``figures.save_heatmap``).

    Returns ``{"table": {explainer: {regime: table_row}}, "scores": {explainer: {regime:
    summary}}, "findings": [...], "missing": [...], "n": n, "seed": seed, "budgets": ...,
    "per_sample": {explainer: {regime: per-sample scores}}}``.
    """
    from gridvqa_jax.training.export import load_reference_model

    budgets = {**{k: dict(v) for k, v in DEFAULT_BUDGETS.items()}, **(budgets or {})}
    key = jax.random.key(seed) if key is None else key
    log = log or (lambda *_: None)
    fns = {e: resolve_explainer(e) for e in explainers}
    missing = [e for e, f in fns.items() if f is None]
    fns = {e: f for e, f in fns.items() if f is not None}
    regime_def = {r: (m, d) for r, m, d in REGIMES}
    models, data = {}, {}
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
                attr = _call(fn, apply_fn, params, chunk, jax.random.fold_in(ekey, bi),
                             cell_px, budgets.get(e, {}))
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
            from reproduction import figures as F

            for i in range(min(n_figures, n)):
                sc = jax.tree.map(lambda a: np.asarray(a)[i], scenes)
                path = Path(figures_dir) / f"{r}_{i:02d}.png"
                F.save_heatmap(path, sc, {e: (a.visual[i], a.textual[i])
                                          for e, a in fig_maps.items()},
                               title=f"{r}: {m_name} model on {d_name} data, sample {i}")
                figures.append(str(path))
    bar.close()
    scores = {e: {r: summarise_scores(per_sample[e][r]) for r in per_sample[e]}
              for e in per_sample}
    return {"table": {e: {r: table_row(s) for r, s in rs.items()} for e, rs in scores.items()},
            "scores": scores, "findings": check_findings(per_sample), "missing": missing,
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
    if result.get("missing"):
        lines.append("not available (module not installed yet): " + ", ".join(result["missing"]))
    lines.append("")
    lines.append("Findings of the paper, checked on our models:")
    for f in result["findings"]:
        lines.append(f"  [{f['verdict']}] {f['finding']}: {f['evidence']}")
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
