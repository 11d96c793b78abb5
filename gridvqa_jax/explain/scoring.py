"""The scorecard of a local explainer: localisation of its maps against GridVQA-X's ground truth.

``score_explainer(explainer, apply_fn, params, scenes, key, **budget)`` runs the protocol of the
GridVQA-X paper's Table 1 on any function with the explainer signature
``explainer(apply_fn, params, scenes, key, *, cell_px=16, **budget) -> Attribution``:

* visual, at pixel level: the per-cell map spread over the pixels of the official 64-px
  rendering (``Attribution.visual_pixels(64)``) against ``metrics.visual_ground_truth(scene, 64)``
  (whole cells of A ∪ T), or a per-pixel map (``Attribution.visual_px`` [B, H, W]: region
  players, gradient maps) at its own resolution against ``visual_ground_truth(scene, H // S)``;
  at cell level against ``scene.gt_cells``;
* textual, per model token, against ``metrics.textual_ground_truth`` (target attributes,
  anchor attributes, relations);
* metrics: Relevance Mass Accuracy, Otsu IoU, Relevance Rank Accuracy, pointing game
  (``gridvqa_jax.metrics``); mean and population std over samples with NaN scores (empty ground
  truth or all-zero map) excluded and counted (``metrics.summarise``);
* a per-form breakdown (form 0 = count or comparison, form 1 = yes/no existence), and two
  measures of how spread the visual map is: the normalised entropy ``H(p) / log(S*S)`` of
  ``p = |a| / sum |a|`` over cells (0 = one cell, 1 = uniform) and the share of cells needed
  to hold half of the mass.

Budget keywords are strict: a keyword the explainer does not accept raises ``BudgetError``
naming it (an explainer with ``**kwargs`` accepts every keyword). ``EXPLAINERS`` maps the
names of the shipped explainers and the three controls (``CONTROLS``: random, objects, oracle;
``explain.controls``) to their functions.
"""

from __future__ import annotations

import inspect
import math
from typing import Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from gridvqa_jax import metrics as MX
from gridvqa_jax.explain import controls
from gridvqa_jax.explain.dime import dime
from gridvqa_jax.explain.multishap import multishap
from gridvqa_jax.explain.multiviz import multiviz
from mmx_base.errors import InputError

GT_CELL_PX = 64  # official rendering resolution: the pixel-level ground truth of Table 1

METRICS = {
    "rma": MX.relevance_mass_accuracy,
    "iou": MX.otsu_iou,
    "rra": MX.relevance_rank_accuracy,
    "pointing": MX.pointing_game,
}


class BudgetError(InputError, TypeError):
    """A budget keyword that the explainer does not accept (also a ``TypeError``, as Python
    raises for an unexpected keyword argument)."""


def _control(fn):
    """A control ``fn(apply_fn, scenes, key)`` adapted to the explainer signature."""
    def explainer(apply_fn, params, scenes, key, **_):
        return fn(apply_fn, scenes, key)

    explainer.__name__ = fn.__name__
    explainer.__doc__ = fn.__doc__
    return explainer


random_explainer = _control(controls.random_attribution)
objects_explainer = _control(controls.objects_attribution)
oracle_explainer = _control(controls.oracle_attribution)

# name -> explainer(apply_fn, params, scenes, key, *, cell_px, **budget) -> Attribution
EXPLAINERS: dict[str, Callable] = {
    "multishap": multishap,
    "dime": dime,
    "multiviz": multiviz,
    "random": random_explainer,
    "objects": objects_explainer,
    "oracle": oracle_explainer,
}
# chance over all cells; the floor of a perturbation explainer (uniform on the objects); the
# ceiling (the ground truth)
CONTROLS = ("random", "objects", "oracle")


def resolve_explainer(explainer) -> Callable:
    """The explainer function for ``explainer``: a name in ``EXPLAINERS`` or a callable
    (returned as is). Raises ``InputError`` naming the known explainers for an unknown name."""
    if callable(explainer):
        return explainer
    try:
        return EXPLAINERS[explainer]
    except (KeyError, TypeError):
        raise InputError(f"unknown explainer {explainer!r}: expected a callable or one of "
                         f"{', '.join(EXPLAINERS)}") from None


def explainer_from_spec(spec: str) -> Callable:
    """The explainer named by ``"package.module:function"`` (imported with ``importlib``; the
    function may be a dotted attribute path). Raises ``InputError`` naming the problem: no
    ``:``, a module that fails to import, a missing attribute, or one that is not callable."""
    import importlib

    module, sep, attr = str(spec).partition(":")
    if not sep or not module or not attr:
        raise InputError(f"explainer {spec!r}: expected package.module:function")
    try:
        obj = importlib.import_module(module)
    except Exception as e:  # any failure of the user's module is reported as its spec's
        raise InputError(f"explainer {spec!r}: cannot import module {module!r} "
                         f"({type(e).__name__}: {e})") from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise InputError(f"explainer {spec!r}: module {module!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise InputError(f"explainer {spec!r}: {attr!r} is a {type(obj).__name__}, not a "
                         "callable")
    return obj


def explainer_name(explainer) -> str:
    """A display name: the string itself, or a callable's ``__name__``."""
    return explainer if isinstance(explainer, str) else getattr(explainer, "__name__",
                                                                 type(explainer).__name__)


def resolve_explainers(explainers) -> dict[str, Callable]:
    """``{name: explainer}`` from a mapping name -> name-or-callable, or a sequence of names
    and callables (callables are named by ``__name__``). Raises ``InputError`` for an unknown
    name or two explainers with one name."""
    if isinstance(explainers, (str, bytes)) or callable(explainers):
        explainers = (explainers,)
    if isinstance(explainers, Mapping):
        return {str(k): resolve_explainer(v) for k, v in explainers.items()}
    out = {}
    for e in explainers:
        name = explainer_name(e)
        if name in out:
            raise InputError(f"two explainers are called {name!r}: pass a mapping name -> "
                             "explainer to name them")
        out[name] = resolve_explainer(e)
    return out


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
    (64 = the official resolution), or, when the attribution has a per-pixel map
    ``visual_px`` [B, H, W] (region players, gradient maps), that map without aggregation with
    ``visual_ground_truth(scenes, H // S)``; cell level compares the cell map with
    ``scenes.gt_cells``.
    NaN where the ground truth is empty or the map all zero.
    """
    out = {"visual": {}, "textual": {}}
    for level in levels:
        if level == "pixel" and getattr(attribution, "visual_px", None) is not None:
            # A per-pixel map is scored as it is, against the ground truth rendered at its
            # resolution (whole cells, so this equals scoring its nearest upsampling to
            # gt_cell_px: RMA, RRA and the pointing game exactly, Otsu IoU up to rounding).
            amap = attribution.visual_px
            side = amap.shape[-1] // int(np.shape(scenes.gt_cells)[-1])
            mask = MX.visual_ground_truth(scenes, side, "pixel")
        elif level == "pixel":
            amap = attribution.visual_pixels(gt_cell_px)
            mask = MX.visual_ground_truth(scenes, gt_cell_px, "pixel")
        elif level == "cell":
            amap, mask = attribution.visual, MX.visual_ground_truth(scenes, level="cell")
        else:
            raise ValueError(f"level must be 'pixel' or 'cell', got {level!r}")
        out["visual"][level] = {k: np.asarray(f(amap, mask)) for k, f in METRICS.items()}
    tmask = MX.textual_ground_truth(scenes) & jnp.asarray(attribution.token_valid)
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
    out = jax.tree.map(MX.summarise, body)
    out["n"] = int(len(scores["form"]))
    if by_form:
        out["by_form"] = {str(f): summarise_scores(_select(scores, scores["form"] == f), False)
                          for f in (0, 1) if np.any(scores["form"] == f)}
    return out


# The (modality, metric) columns of a Table 1 row, in the order the tables print them.
ROW_METRICS = (("visual", "rma"), ("visual", "iou"), ("textual", "rma"), ("textual", "iou"))


def row_scores(scores: dict, modality: str, metric: str, level: str = "pixel") -> np.ndarray:
    """The per-sample scores behind one column of ``table_row``: ``scores`` as
    ``per_sample_scores`` returns them (one explainer, one regime), visual at ``level``,
    textual as is; float64 ``[n]``."""
    s = scores[modality]
    return np.asarray(s[level][metric] if modality == "visual" else s[metric], np.float64)


def table_row(summary: dict, level: str = "pixel") -> dict:
    """The Table 1 view of a summary: ``{"visual": {"rma", "rma_std", "iou", "iou_std"},
    "textual": {...}}`` (fractions in [0, 1]; visual at ``level``)."""
    def row(d):
        return {"rma": d["rma"]["mean"], "rma_std": d["rma"]["std"],
                "iou": d["iou"]["mean"], "iou_std": d["iou"]["std"]}

    return {"visual": row(summary["visual"][level]), "textual": row(summary["textual"])}


def signature_parameters(fn) -> Mapping[str, inspect.Parameter] | None:
    """``inspect.signature(fn).parameters`` (name -> ``inspect.Parameter``), or None where
    ``fn`` has no signature to read (a builtin or C callable, None): the one reader of an
    explainer's keywords, its defaults and whether it takes ``**kwargs``."""
    try:
        return inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None


def check_budget(explainer: Callable, budget: Mapping) -> None:
    """Raise ``BudgetError`` naming the keywords of ``budget`` that ``explainer`` does not
    accept (none for an explainer with ``**kwargs`` or one whose signature is unreadable)."""
    params = signature_parameters(explainer)
    if params is None or any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return  # unreadable (the call itself will tell) or open to any keyword
    accepted = {k for k, p in params.items()
                if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    unknown = sorted(set(budget) - accepted)
    if unknown:
        name = getattr(explainer, "__name__", repr(explainer))
        offered = sorted(accepted - {"apply_fn", "params", "scenes", "key"})
        raise BudgetError(f"explainer {name} does not accept budget keyword(s) "
                          f"{', '.join(unknown)}; it accepts {', '.join(offered) or 'none'}")


def _takes_cell_px(explainer: Callable) -> bool:
    params = signature_parameters(explainer)
    return (params is None or "cell_px" in params
            or any(p.kind is p.VAR_KEYWORD for p in params.values()))


def call_explainer(explainer: Callable, apply_fn, params, scenes, key, *, cell_px: int = 16,
                   **budget):
    """``explainer(apply_fn, params, scenes, key, cell_px=cell_px, **budget)``: ``cell_px`` is
    passed only to explainers that accept it; a budget keyword the explainer does not accept
    raises ``BudgetError`` (``check_budget``)."""
    check_budget(explainer, budget)
    if _takes_cell_px(explainer):
        budget = {"cell_px": cell_px, **budget}
    return explainer(apply_fn, params, scenes, key, **budget)


def score_explainer(explainer: Callable, apply_fn, params, scenes, key, *, cell_px: int = 16,
                    levels=("pixel", "cell"), gt_cell_px: int = GT_CELL_PX,
                    return_per_sample: bool = False, **budget) -> dict:
    """Score a local explainer on a batch of scenes with the Table 1 protocol.

    ``explainer(apply_fn, params, scenes, key, *, cell_px, **budget) -> Attribution`` (visual
    [B, S, S], textual [B, L]), or the name of one in ``EXPLAINERS``; ``scenes``: a ``Scene``
    batch of B samples; ``budget`` is passed through, and a keyword the explainer does not
    accept raises ``BudgetError``. Returns::

        {"visual": {level: {metric: summary}}, "textual": {metric: summary},
         "spread": {"entropy": summary, "cells_50": summary}, "n": B,
         "by_form": {"0": {...same...}, "1": {...}}, "table": table_row(...)}

    with ``summary = {"mean", "std", "n", "n_excluded"}`` (``metrics.summarise``: NaN scores of
    samples with an empty ground truth or an all-zero map are excluded and counted) and metrics
    ``rma``, ``iou`` (Otsu), ``rra``, ``pointing``. ``return_per_sample=True`` adds the raw
    per-sample scores under ``"per_sample"``.
    """
    attribution = call_explainer(resolve_explainer(explainer), apply_fn, params, scenes, key,
                                 cell_px=cell_px, **budget)
    scores = per_sample_scores(attribution, scenes, levels=levels, gt_cell_px=gt_cell_px)
    out = summarise_scores(scores)
    out["table"] = table_row(out, levels[0])
    if return_per_sample:
        out["per_sample"] = scores
    return out


__all__ = ["GT_CELL_PX", "METRICS", "EXPLAINERS", "CONTROLS", "BudgetError",
           "random_explainer", "objects_explainer", "oracle_explainer", "resolve_explainer",
           "resolve_explainers", "explainer_from_spec",
           "explainer_name", "map_spread", "per_sample_scores", "concat_scores",
           "summarise_scores", "ROW_METRICS", "row_scores", "table_row", "check_budget",
           "call_explainer", "score_explainer"]
