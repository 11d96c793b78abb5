"""Independent runs of a MultiSHAP row of Table 1, pooled into one estimate at their summed budget.

MultiSHAP's interaction matrix of a sample is the mean of ``n_samples`` i.i.d. per-coalition
terms, each coalition drawn from the sample's own key (``gridvqa_jax.explain.interactions.
sii_matrix``: ``Phi_hat = 1/M sum_m Delta(S_m)``), and with signed aggregates (``multishap``'s
defaults: ``sum_t Phi[c, t]``, ``sum_c Phi[c, t]``; over regions the per-pixel map spreads the
region sums, also linear) both maps are linear in it. So for R runs on the same samples at K
coalitions each, with independent keys, the mean of their maps is distributed exactly as the
maps of one run at R*K coalitions (for i.i.d. coalitions; a stratified run stratifies its own
K, so stratified runs are refused)::

    map_pooled = 1/R sum_r map_r  ~  map at R*K coalitions.

A budget sweep can so go a step further from runs it already made: the main run of a
``--convergence`` budget and its two split halves share their first ``reliability_n``
samples, which gives 3K coalitions on those. Maps read with ``"abs"`` (the reference's textual
map, ``sum_c |Phi[c, t]|``) are not linear in ``Phi`` and are refused, and so are DIME (its maps
are a regression over each N-set's masks, not a mean of draws) and MultiViz (deterministic).

The runs are Table 1 parts (``reproduction.table1_parts``) that keep every sample's maps
(saved since 2026-12-05). Each run's maps, scored again on the given samples, must give the
scores the run saved, which checks both that the samples are the run's and that the maps are
whole.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import jax
import numpy as np

from gridvqa_jax.explain.attribution import Attribution
from gridvqa_jax.explain.scoring import per_sample_scores
from mmx_base.errors import InputError
from reproduction import table1_parts as PARTS

# The Table 1 rows whose maps are means of i.i.d. coalition draws (``_function_name``).
POOLABLE = ("gridvqa_jax.explain.multishap.multishap",
            "gridvqa_jax.explain.multishap.multishap_regions")
# The fingerprint fields that must agree for maps to be draws of one estimator on one model.
SAME = ("explainer", "function", "budget", "regime", "model", "model_access", "cell_px")
ATOL = 1e-4  # a run's saved scores against its maps scored again (float32 maps, Otsu IoU)


def _nonlinear(budget: dict) -> list[str]:
    return [k for k in ("text_aggregate", "visual_aggregate") if budget.get(k) == "abs"]


def pool_maps(maps: Sequence[Attribution]) -> Attribution:
    """The mean of R runs' maps of the same B samples: visual [B, S, S], textual [B, L] and
    ``visual_px`` [B, H, W] (when the runs have it) averaged over the runs; ``token_valid``
    must agree (``ValueError`` otherwise). Module docstring: why this is one run at R*K."""
    if not maps:
        raise ValueError("pool_maps: no runs")
    first = maps[0]
    for m in maps[1:]:
        if not np.array_equal(np.asarray(m.token_valid), np.asarray(first.token_valid)):
            raise ValueError("pool_maps: the runs' token players differ (not the same samples)")

    def mean(field):
        got = [getattr(m, field) for m in maps]
        return None if got[0] is None else np.mean(np.stack([np.asarray(g) for g in got]), 0)

    return Attribution(visual=mean("visual"), textual=mean("textual"),
                       token_valid=np.asarray(first.token_valid), visual_px=mean("visual_px"))


def _rows(maps: Attribution, m: int) -> Attribution:
    return jax.tree.map(lambda a: np.asarray(a)[:m], maps)


def read_parts(paths: Sequence) -> list[tuple]:
    """The parts at ``paths`` as ``table1_parts.read_part_maps`` reads them: one ``(maps,
    saved scores, fingerprint)`` per path, in order, for ``pool_read``."""
    return [PARTS.read_part_maps(p) for p in paths]


def pool_parts(paths: Sequence, scenes) -> dict:
    """``pool_read(paths, read_parts(paths), scenes)``."""
    return pool_read(paths, read_parts(paths), scenes)


def pool_read(paths: Sequence, parts: Sequence[tuple], scenes) -> dict:
    """Per-sample scores of R independent runs of one MultiSHAP row and of their pooled maps.

    ``paths``: R >= 2 part files (``table1_parts``) of one explainer, regime, model and
    budget with different keys (``key`` or ``position`` of the fingerprint differ), each
    holding the maps of at least ``m`` samples; ``parts``: ``read_parts(paths)``;
    ``scenes``: the m samples (a Scene batch, e.g. ``table1.regime_scenes(variant, m,
    seed)``), the first m of every run. Returns
    ``{"n": m, "budget": the runs' budget with n_samples R*K, "runs": [scores of each run on
    the m samples], "pooled": scores of ``pool_maps`` (``scoring.per_sample_scores``),
    "files": [the paths]}``. Only i.i.d. runs pool (``sampling="stratified"`` is refused).
    ``InputError`` (naming the file) for a part that is not poolable (a function or an
    ``"abs"`` aggregate outside the module's argument), whose settings differ from the first
    run's, which repeats another run's key, holds fewer maps, or whose maps scored on
    ``scenes`` do not give its saved scores."""
    if len(paths) < 2:
        raise InputError(f"pooling needs at least two runs, got {len(paths)}")
    m = int(np.shape(scenes.form)[0])
    if len(parts) != len(paths):
        raise ValueError(f"pool_read: {len(parts)} parts read for {len(paths)} paths")
    runs, fps, keys = [], [], {}
    for path, (maps, saved, fp) in zip(paths, parts):
        if fp.get("function") not in POOLABLE:
            raise InputError(f"{path}: {fp.get('explainer')} ({fp.get('function')}) is not a "
                             "mean of coalition draws; only MultiSHAP's rows pool")
        if fp.get("budget", {}).get("sampling", "iid") != "iid":
            raise InputError(f"{path}: coalition sizes drawn {fp['budget']['sampling']}; R such "
                             "runs at K coalitions are not one run at R*K (each stratifies its "
                             "own K), so only i.i.d. runs pool")
        nonlinear = _nonlinear(fp.get("budget", {}))
        if nonlinear:
            raise InputError(f"{path}: {', '.join(nonlinear)} = 'abs' is not "
                             "linear in the interaction matrix; its maps do not pool")
        if fps:
            diff = [k for k in SAME if fp.get(k) != fps[0].get(k)]
            if diff:
                raise InputError(f"{path}: other settings than {paths[0]} ({', '.join(diff)} "
                                 "differ); runs pool only on one row, regime, model and budget")
        seen = keys.get((fp.get("key"), fp.get("position")))
        if seen is not None:
            raise InputError(f"{path}: the same key as {seen}; pooled runs must be independent")
        keys[fp.get("key"), fp.get("position")] = path
        k = 0 if maps is None else int(np.shape(maps.visual)[0])
        if k < m:
            raise InputError(f"{path}: holds the maps of {k} samples, fewer than the {m} to "
                             "pool (parts saved before 2026-12-05 keep the first two only)")
        maps = _rows(maps, m)
        again = per_sample_scores(maps, scenes)
        ok = jax.tree.map(lambda a, b: bool(np.allclose(np.asarray(a)[:m], b, atol=ATOL,
                                                        equal_nan=True)), saved, again)
        if not all(jax.tree.leaves(ok)):
            raise InputError(f"{path}: its maps scored on these {m} samples do not give its "
                             "saved scores (other samples, or not this run's maps)")
        runs.append((maps, again))
        fps.append(fp)
    budget = dict(fps[0]["budget"])
    budget["n_samples"] = int(budget["n_samples"]) * len(runs)
    pooled = pool_maps([a for a, _ in runs])
    return {"n": m, "budget": budget, "runs": [s for _, s in runs],
            "pooled": per_sample_scores(pooled, scenes),
            "files": [str(Path(p)) for p in paths]}
