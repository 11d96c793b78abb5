"""GridVQA-X's Table 1: local explainers x regimes, with the paper's numbers and findings.

The per-sample protocol (RMA, Otsu IoU, RRA and pointing game at pixel and cell level, the
per-form breakdown and the spread of the maps) is ``gridvqa_jax.explain.scoring``
(``score_explainer``), re-exported here.

``table1(n, seed)`` scores MultiSHAP, DIME, MultiViz and the random / objects / oracle controls
(chance over all cells, the floor: uniform over the objects, the ceiling) in the three regimes
(pure = M_pure on D_pure, spurious = M_spur on D_spur, cross = M_spur on D_pure; density d07,
every bucket) on fresh held-out samples (``EXPLAIN_SEED``: training uses seeds 1000 + i,
evaluation ``evaluate.EVAL_SEED`` + i), or on a dataset on disk (``data=``, e.g. the official
release: ``dataset_scenes``), and checks the paper's four findings against the ``objects``
floor. Every row carries its protocol (``explainer_protocol``: players, baseline, explained
quantity, budget). Explainers are names in ``scoring.EXPLAINERS`` or any callable with the
explainer signature.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from gridvqa_jax.explain.scoring import (CONTROLS, EXPLAINERS, GT_CELL_PX, METRICS,
                                         call_explainer, check_budget, concat_scores, map_spread,
                                         per_sample_scores, resolve_explainer,
                                         resolve_explainers, score_explainer,
                                         signature_parameters, summarise_scores, table_row)
from mmx_base import staging
from mmx_base.errors import InputError
from mmx_base.trees import jsonable
from reproduction import stats as STATS
from reproduction import table1_parts as PARTS
from gridvqa_jax.world.scene import trim_tokens

# Table 1 held-out samples: no training (1000 + i) or evaluation stream uses it
EXPLAIN_SEED = 913_000
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
    # drawn on generate.DRAW_LANES lanes: the reproduction's other draws of this spec share
    # the compiled generator (the samples do not depend on the lane count)
    return G.to_numpy(G.generate_chunk(spec, seed + offset, 0, n, lanes=G.DRAW_LANES))


def bucket_round_robin(bucket) -> np.ndarray:
    """The sample order that cycles through the buckets: ``bucket`` int [N] (file order) ->
    indices int [N]: the first sample of every bucket, then the second of every bucket, ...;
    buckets in order of first appearance, each bucket's samples in file order. A file that
    already cycles (``generate``'s round-robin, the official fixture's one sample per bucket)
    keeps its order; one written bucket by bucket (the official generator's many samples per
    bucket) is interleaved, so its first n samples still span every bucket, as
    ``regime_scenes``' do. E.g. ``[3, 3, 3, 1, 1, 2] -> [0, 3, 5, 1, 4, 2]``."""
    bucket = np.asarray(bucket).reshape(-1)
    _, first, inverse = np.unique(bucket, return_index=True, return_inverse=True)
    rank_of_bucket = np.argsort(np.argsort(first))[inverse]  # order of first appearance
    by_bucket = np.argsort(inverse, kind="stable")  # file order within each bucket
    counts = np.bincount(inverse)
    rank_in_bucket = np.empty(len(bucket), np.int64)
    rank_in_bucket[by_bucket] = np.arange(len(bucket)) - np.repeat(np.cumsum(counts) - counts,
                                                                   counts)
    return np.lexsort((rank_of_bucket, rank_in_bucket))


def dataset_scenes(path, variant: str, n: int, *, density_key: str = "d07",
                   grid_size: int = 5):
    """``n`` ``density_key`` samples of the dataset at ``path``, every bucket (numpy Scene
    batch): the regime data of Table 1 drawn from disk instead of generated.

    ``path``: any layout ``formats.datasets.load_dataset`` reads (native shards, one native
    directory per density, the official release layout); its ``density_key`` part(s) are taken
    in load order (native: the directory's sample order; official: ``qa_<split>.jsonl`` line
    order restricted to that density) and concatenated; the first ``n`` samples of that file
    order cycled through the buckets (``bucket_round_robin``: file order itself for a file that
    already cycles, as ours and the official fixture) are returned. ``variant``
    ("pure" / "spur"): what the regime needs; a dataset that records another variant is refused.
    Raises ``InputError`` (also a ``ValueError``) naming the path when the dataset holds no
    ``density_key`` samples, fewer than ``n``, another variant or another grid size, and
    ``DatasetError`` for a malformed dataset.
    """
    from gridvqa_jax.formats import datasets as DS

    batch = DS.load_density(path, variant, density_key, grid_size)
    have_n = len(np.asarray(batch.bucket))
    if have_n < n:
        raise InputError(f"{path}: {have_n} {density_key} samples, fewer than the n = {n} asked "
                         "(lower --n)")
    return DS.take_samples(batch, bucket_round_robin(batch.bucket)[:n])


def _pts(d, ci) -> str:
    return STATS.points(d, *ci, unit=" pts")


def _t1_finding(claim: str, verdict: str, evidence: str, n=None, cis=()) -> dict:
    # n: samples per regime; cis: the intervals (fractions) behind the verdict -> width in pts
    width = STATS.widest(cis) * 100 if cis else None
    return STATS.finding("GridVQA-X", f"Table 1: {claim}", claim, verdict, evidence,
                         n=None if n is None else f"{n} per regime", width=width)


def _not_scored(claim: str, what: str) -> dict:
    return _t1_finding(claim, "inconclusive", f"not measured: {what} not scored in this run")


def _floor_text(per_sample: dict, e: str, regimes, m: str = "rma") -> str:
    """The ``objects`` floor of visual ``m`` per regime and ``e``'s paired excess over it (the
    same scenes), for a finding's evidence."""
    fl = per_sample.get("objects", {})
    regimes = [r for r in regimes if r in fl and r in per_sample.get(e, {})]
    if not regimes:
        return "objects floor not scored"
    name = {"rma": "RMA", "iou": "IoU"}[m]
    v = lambda x, r: x[r]["visual"]["pixel"][m]  # noqa: E731
    floor = ", ".join(f"{r} {STATS.mean_pct(v(fl, r))}" for r in regimes)
    excess = []
    for r in regimes:
        d, *ci = STATS.paired_t_ci(v(per_sample[e], r), v(fl, r))
        excess.append(f"{r} {_pts(d, ci)}")
    return f"objects floor {name} {floor}; {e} - objects: " + "; ".join(excess)


# Rows whose samples are batched by question length (``sample_order``): MultiSHAP evaluates
# (1 + C)(1 + n_max) coalitions per sample and coalition draw, n_max the longest question of the
# batch (a shorter question's missing tokens are null players, evaluated and worth nothing), so
# batches of similar lengths cost fewer evaluations, on shorter rows. Its maps of a sample depend
# on no other sample (DIME's do: its N-set is the batch, so DIME keeps the sample order).
BY_LENGTH = ("multishap", "multishap_ref")


def _batches_by_length(name: str, fn) -> bool:
    """Whether row ``name`` (explainer ``fn``) runs on length-sorted batches: a shipped
    MultiSHAP row (``BY_LENGTH``), not a user's function of the same name."""
    shipped = {**EXPLAINERS, **reference_explainers()}
    return name in BY_LENGTH and fn is shipped.get(name)


def takes_pieces(fn, by_length: bool) -> bool:
    """Whether ``explain_row`` can run explainer ``fn``'s batches a few samples at a time
    (``piece``): a MultiSHAP row on length-sorted batches, or an explainer that takes
    ``positions`` (the batch samples to explain, ``dime.dime_maps``)."""
    params = signature_parameters(fn)
    return by_length or (params is not None and "positions" in params)


def sample_order(scenes, by_length: bool) -> np.ndarray:
    """int [B]: the order in which Table 1 batches the samples: the sample order, or with
    ``by_length`` a stable sort by question length (``n_tokens``), so a batch holds questions
    of similar length."""
    n_tokens = np.asarray(scenes.n_tokens)
    return np.argsort(n_tokens, kind="stable") if by_length else np.arange(n_tokens.shape[0])


def _named(fn):
    """An explainer as named in fingerprints: itself, or the type of a callable object."""
    return fn if hasattr(fn, "__qualname__") else type(fn)


def _function_name(fn) -> str:
    """``module.qualname`` of an explainer (a callable object: of its type), for fingerprints."""
    named = _named(fn)
    return f"{getattr(named, '__module__', '?')}.{named.__qualname__}"


def _mask_draws(fn, budget: dict) -> dict:
    """``{"mask_draws": ...}`` for an explainer whose module declares ``MASK_DRAWS`` (how its
    Monte Carlo masks are drawn from its key: a part drawn another way is another protocol, so
    it belongs in the fingerprint; ``PERMUTATION_DRAWS`` instead where it declares one and the
    ``budget`` asks for first-order values, ``order=1``), else ``{}`` (the other rows'
    fingerprints unchanged)."""
    module = sys.modules.get(getattr(_named(fn), "__module__", ""))
    draws = getattr(module, "MASK_DRAWS", None)
    if budget.get("order") == 1:
        draws = getattr(module, "PERMUTATION_DRAWS", draws)
    return {} if draws is None else {"mask_draws": draws}


def sample_index_keys(key, index) -> jax.Array:
    """The per-sample keys of a MultiSHAP row: ``fold_in(key, j)`` for each sample index ``j``
    of ``index`` int [k] (typed keys [k] for a typed ``key``, raw uint32 [k, 2] for a raw one;
    ``multishap.sample_keys`` takes either as they are)."""
    return jax.vmap(lambda j: jax.random.fold_in(key, j))(jnp.asarray(index, jnp.uint32))


def explain_row(fn, apply_fn, params, scenes, key, *, budget: dict, batch: int = 16,
                cell_px: int = 16, length: int | None = None, by_length: bool = False,
                keep: int = 0, done=None, piece: int | None = None, pieces=None
                ) -> tuple[dict, object, float]:
    """One Table 1 row in one regime: explainer ``fn`` on every sample of ``scenes`` (B
    samples), ``batch`` at a time in ``sample_order(scenes, by_length)``, batch ``i`` with key
    ``fold_in(key, i)`` and ``budget``'s keywords, each batch's tokens trimmed to ``length``
    positions (``world.scene.trim_tokens``; None: to the batch's own longest question). A
    MultiSHAP row (``by_length``) gets per-sample keys instead, sample ``j``'s
    ``fold_in(key, j)`` (``sample_index_keys``): its SII maps of a sample (``order=2``, Table
    1's) depend on the sample's own key and game alone (``multishap``, ``MASK_DRAWS``), so they
    are the same, to float32 rounding, in any batch and in any run whose row ``key`` is this
    one (the same seed, the row at the same position) and that holds sample ``j``, whatever its
    ``n``; so are its first-order values (``order=1``; ``PERMUTATION_DRAWS``) where padding
    does not take a game of at most 14 players (computed exactly) past 14 (sampled).

    ``piece``: call the explainer on ``piece`` samples of a batch at a time, so that their
    maps are the whole batch's (to float32 rounding). A MultiSHAP row gets those samples alone,
    with their keys, at their own game size (each distinct game size its own compile); an
    explainer that takes ``positions`` (DIME: the batch is its set, so a
    sample's maps depend on the others) gets the whole batch, its key and ``positions=`` those
    samples (``dime.dime_maps``). ``ValueError`` for another explainer.
    ``pieces(batch index, start, stop)`` -> ``(load, save)``: ``load()``
    returns a saved piece ``(scores, figure, figure_index, wall_s)`` or None, ``save(scores,
    figure, figure_index, wall_s)`` stores a computed one (``table1_parts.save_piece``), so a
    row stopped inside a batch resumes at its first missing piece.

    Returns ``(per_sample, maps, wall_s)``: the per-sample scores (``scoring.per_sample_scores``,
    arrays [B] in sample order), the ``Attribution`` of the first ``keep`` samples (stacked in
    sample order, tokens padded back to ``scenes``' length; None when ``keep`` is 0; from
    reused pieces, only as far as they hold the maps of samples 0, 1, ...) and the
    seconds the row took (compiles included; a reused piece counts as it was saved).
    ``done(k)`` is called after each batch or piece with its size (a progress bar)."""
    if piece is not None and (not takes_pieces(fn, by_length) or piece < 1):
        raise ValueError(f"piece={piece!r}: pieces split the batches of a MultiSHAP row "
                         "(by_length) or of an explainer that takes positions (DIME) into "
                         ">= 1 samples")
    B = int(np.shape(scenes.form)[0])
    order = sample_order(scenes, by_length)
    parts, attrs, wall = [], [], 0.0
    L = np.shape(scenes.tokens)[-1]

    def kept(idx, attr):
        """(maps of the kept samples among ``idx``, tokens padded to L; their sample indices),
        also added to the figure rows; (None, None) when none is kept."""
        shown = np.flatnonzero(idx < keep)
        if not shown.size:
            return None, None
        fig = jax.tree.map(lambda a: np.asarray(a)[shown], attr.pad_tokens(L))
        add(idx[shown], fig)
        return fig, idx[shown]

    def add(index, fig):
        attrs.extend((int(i), jax.tree.map(lambda a: a[j], fig)) for j, i in enumerate(index))

    for bi, lo in enumerate(range(0, B, batch)):
        idx = order[lo:lo + batch]
        # trailing PAD off: our models cost less on fewer token positions, same outputs
        chunk = trim_tokens(jax.tree.map(lambda a: a[idx], scenes), length)
        bkey = sample_index_keys(key, idx) if by_length else jax.random.fold_in(key, bi)
        if piece is None:
            t0 = time.perf_counter()
            attr = call_explainer(fn, apply_fn, params, chunk, bkey, cell_px=cell_px, **budget)
            parts.append(per_sample_scores(attr, chunk))
            kept(idx, attr)
            wall += time.perf_counter() - t0
            if done is not None:
                done(len(idx))
            continue
        if by_length:  # the piece's samples alone, with their own keys

            def explain(sub, a, z, keys=bkey):
                return call_explainer(fn, apply_fn, params, sub, keys[a:z], cell_px=cell_px,
                                      **budget)
        else:  # the whole batch is the explainer's set, the piece's samples its positions

            def explain(sub, a, z, chunk=chunk, bkey=bkey):
                return call_explainer(fn, apply_fn, params, chunk, bkey, cell_px=cell_px,
                                      positions=np.arange(a, z), **budget)
        for a in range(0, len(idx), piece):
            z = min(a + piece, len(idx))
            load, save = pieces(bi, a, z) if pieces is not None else (lambda: None, None)
            got = load()
            if got is not None:
                scores, fig, fig_index, w = got
                if fig is not None:
                    add(np.asarray(fig_index), fig)
            else:
                t0 = time.perf_counter()
                sub = jax.tree.map(lambda x: x[a:z], chunk)
                attr = explain(sub, a, z)
                scores = per_sample_scores(attr, sub)
                fig, fig_index = kept(idx[a:z], attr)
                w = time.perf_counter() - t0
                if save is not None:
                    save(scores, fig, fig_index, w)
            parts.append(scores)
            wall += w
            if done is not None:
                done(z - a)
    inverse = np.argsort(order)  # back to sample order
    per_sample = jax.tree.map(lambda a: a[inverse], concat_scores(parts))
    # the maps of samples 0..k-1 (pieces saved before every sample's maps were kept hold the
    # first two only): row i is sample i
    attrs = sorted(attrs, key=lambda t: t[0])
    prefix = next((j for j, (i, _) in enumerate(attrs) if i != j), len(attrs))
    maps = (jax.tree.map(lambda *xs: np.stack(xs), *(a for _, a in attrs[:prefix]))
            if prefix else None)
    return per_sample, maps, wall


def check_findings(per_sample: dict) -> list[dict]:
    """The paper's four Table 1 findings checked on ``per_sample[explainer][regime]`` scores.

    Differences are in visual RMA (or IoU, entropy) points with their 95% Student-t interval
    (``reproduction.stats``; a few samples per regime in the quick run): Welch
    (``stats.welch_t_ci``, Welch-Satterthwaite degrees of freedom) between different samples
    (pure vs spurious; form 1 vs form 0), paired (``stats.paired_t_ci``) on the same samples
    (cross vs pure; explainers on the same scenes; DIME's entropy differences averaged per
    scene over the regimes that share it, pure and cross); the verdict is ``stats.verdict`` of
    that interval against
    the claim (``stats.all_of`` for a claim about several differences). The floor is the
    ``objects`` control (uniform on the occupied cells: a perturbation explainer gives empty
    cells exactly 0, so this is the trivial map to beat, not ``random``'s uniform over all
    cells): every finding's evidence states the floor's value and the explainer's paired excess
    over it, and DIME's diffuseness is judged between the floor and the oracle. A finding whose
    explainer (or control) was not scored is inconclusive. Returns ``stats.finding`` records.
    """
    out = []
    v = lambda e, r, m="rma": per_sample[e][r]["visual"]["pixel"][m]  # noqa: E731
    have = lambda e, *rs: e in per_sample and all(r in per_sample[e] for r in rs)  # noqa: E731

    claim = "MultiSHAP's RMA is higher on M_spur than on M_pure"
    if have("multishap", "pure", "spurious"):
        d, *ci = STATS.welch_t_ci(v("multishap", "spurious"), v("multishap", "pure"))
        ev = f"visual RMA spurious - pure = {_pts(d, ci)} (paper +8.5)"
        if have("multishap", "cross"):
            dc, *cic = STATS.paired_t_ci(v("multishap", "cross"), v("multishap", "pure"))
            ev += f"; same D_pure samples, M_spur - M_pure = {_pts(dc, cic)}"
        ev += "; " + _floor_text(per_sample, "multishap", per_sample["multishap"])
        out.append(_t1_finding(claim, STATS.verdict(ci, (">", 0.0)), ev,
                               len(v("multishap", "pure")), [ci]))
    else:
        out.append(_not_scored(claim, "multishap"))

    claim = "MultiViz is near-identical across models (|Δ| <= 5 pts)"
    if have("multiviz", "pure", "spurious"):
        diffs = {"RMA": STATS.welch_t_ci(v("multiviz", "spurious"), v("multiviz", "pure")),
                 "IoU": STATS.welch_t_ci(v("multiviz", "spurious", "iou"),
                                         v("multiviz", "pure", "iou"))}
        if have("multiviz", "cross"):
            diffs["same D_pure samples, M_spur - M_pure RMA"] = STATS.paired_t_ci(
                v("multiviz", "cross"), v("multiviz", "pure"))
        cis = {k: (lo, hi) for k, (_, lo, hi) in diffs.items()}
        ev = "spurious - pure: " + "; ".join(f"{k} {_pts(diffs[k][0], cis[k])}" for k in cis)
        ev += " (paper -1.8 / +2.0); " + _floor_text(per_sample, "multiviz",
                                                     per_sample["multiviz"])
        out.append(_t1_finding(claim, STATS.all_of(STATS.verdict(ci, ("in", -0.05, 0.05))
                                                for ci in cis.values()), ev,
                               len(v("multiviz", "pure")), list(cis.values())))
    else:
        out.append(_not_scored(claim, "multiviz"))

    claim = ("DIME's maps are diffuse (entropy nearer the objects floor than the oracle, and "
             "above the other explainers)")
    # the regimes where DIME, the floor, the oracle and the other explainers were all scored
    common = [r for r in per_sample.get("dime", {})
              if all(r in per_sample.get(e, {}) for e in ("objects", "oracle", "multishap",
                                                          "multiviz") if e in per_sample)]
    if have("dime") and have("objects") and have("oracle") and common:
        def spread(e, k="entropy", regimes=None):
            regimes = per_sample[e] if regimes is None else regimes
            return np.concatenate([per_sample[e][r]["spread"][k] for r in regimes])

        ent = {e: float(np.nanmean(spread(e))) for e in per_sample}
        c50 = {e: float(np.nanmean(spread(e, "cells_50"))) for e in per_sample}
        others = [e for e in ("multishap", "multiviz") if e in per_sample]
        # every explainer scores the same scenes in the same order: differences are paired;
        # regimes on the same data (pure and cross: D_pure) score the same scenes, so their
        # rows are not independent: the mean over all rows is a weighted mean of per-scene
        # means (a D_pure scene's pure and cross rows averaged), its error clustered by scene
        regs = common
        data_of = {name: data for name, _, data in REGIMES}

        def over_scenes(ref):
            groups = {}
            for r in regs:
                diff = per_sample["dime"][r]["spread"]["entropy"] - ref(r)
                groups.setdefault(data_of.get(r, r), []).append(diff)
            units = [np.mean(np.stack(g), axis=0) for g in groups.values()]
            return STATS.contrast_t_ci(units, [len(g) / len(regs) for g in groups.values()])

        one = lambda e: lambda r: per_sample[e][r]["spread"]["entropy"]  # noqa: E731
        parts = {"DIME - (oracle + objects) / 2": over_scenes(
            lambda r: (one("oracle")(r) + one("objects")(r)) / 2)}
        parts.update({f"DIME - {e}": over_scenes(one(e)) for e in others})
        cis = {k: (lo, hi) for k, (_, lo, hi) in parts.items()}
        ev = ("normalised entropy of the cell map (all regimes): " +
              ", ".join(f"{e} {ent[e]:.2f}" for e in ent) + "; paired differences: " +
              "; ".join(f"{k} {d:+.3f} [{cis[k][0]:+.3f}, {cis[k][1]:+.3f}]"
                        for k, (d, _, _) in parts.items()) +
              "; share of cells holding 50% of the mass: " +
              ", ".join(f"{e} {c50[e]:.2f}" for e in c50) +
              f"; objects floor entropy {ent['objects']:.2f}; " +
              _floor_text(per_sample, "dime", regs))
        out.append(_t1_finding(claim, STATS.all_of(STATS.verdict(ci, (">", 0.0))
                                                for ci in cis.values()), ev,
                               len(per_sample["dime"][regs[0]]["form"]) if regs else None,
                               list(cis.values())))
    else:
        out.append(_not_scored(claim, "dime, objects or oracle in one regime"))

    claim = ("MultiSHAP's RMA is lower on existence (form 1) questions (its excess over the "
             "objects floor)")
    if have("multishap", "pure"):
        ev, verdicts, ci_of = [], {}, {}
        for r in per_sample["multishap"]:
            s = per_sample["multishap"][r]
            rma, form = s["visual"]["pixel"]["rma"], s["form"]
            d, *ci = STATS.welch_t_ci(rma[form == 1], rma[form == 0])
            verdicts[r], ci_of[r] = STATS.verdict(ci, ("<", 0.0)), ci
            ev.append(f"{r}: form 1 - form 0 = {_pts(d, ci)} "
                      f"(n = {int(np.sum(form == 1))} / {int(np.sum(form == 0))})")
            if r in per_sample.get("objects", {}):  # the floor moves with the questions too
                fl = per_sample["objects"][r]["visual"]["pixel"]["rma"]
                ex = rma - fl
                de, *ci = STATS.welch_t_ci(ex[form == 1], ex[form == 0])
                # Judged against the floor: an existence question's ground truth covers fewer of
                # the occupied cells, so the raw difference alone would credit the questions,
                # not the explainer.
                verdicts[r], ci_of[r] = STATS.verdict(ci, ("<", 0.0)), ci
                ev[-1] += (f", objects floor form 1 / form 0 {STATS.mean_pct(fl[form == 1])}"
                           f" / {STATS.mean_pct(fl[form == 0])}, excess over the floor form 1 -"
                           f" form 0 = {_pts(de, ci)} (decides)")
            else:
                ev[-1] += ", objects floor not scored (the raw difference decides)"
        # the pure regime decides; the others are shown as evidence
        out.append(_t1_finding(claim, verdicts["pure"], "; ".join(ev),
                               len(per_sample["multishap"]["pure"]["form"]), [ci_of["pure"]]))
    else:
        out.append(_not_scored(claim, "multishap"))
    return out


# Per explainer, passed through (keywords an explainer lacks are dropped). The references' own
# budgets (MultiSHAP's 128 samples per pair, lime_image's ~1000 perturbations), not budgets where
# the means have settled: in the budget sweeps (``gridvqa explain --regimes --convergence``,
# n = 16 pure, docs/table1_default/convergence*.json, docs/results.md) no row's means settle at
# its budget within one point of the largest budget swept: MultiSHAP moves from 128 to 2,048
# coalitions over cells (visual RMA +4.1 points; its RMAs are within a point from 512 on, and
# 2,048 within a point of the pooled 6,144, its visual IoU is not) and from 128 to 512 over
# patches (+2.6), DIME over cells from 1,024 to 16,384 masks (+2.0; its RMAs are within a
# point from 4,096 on, its Otsu IoUs are not);
# MultiSHAP's split-half reliability of visual RMA over cells is 0.01 at 8 coalitions, 0.81 at
# 128 and 0.98 at 2,048. The report prints each row's status (``convergence.budget_status``).
DEFAULT_BUDGETS = {
    "multishap": {"n_samples": 128},
    "dime": {"n_samples": 1024},
    "multiviz": {},
}

# Players at each method's reference granularity (``table1(players=...)``): the row
# ``<name>_ref`` is explainer ``<name>`` with the image players its reference perturbs.
PLAYERS = ("cells", "reference", "both")
REFERENCE_SUFFIX = "_ref"


# MultiViz at its reference granularity: per-pixel maps measured from mid-gray (the zero of the
# reference's ``grad * sample`` on ViLT's mean-0.5 / std-0.5 pixels)
MULTIVIZ_REFERENCE_OPTIONS = {"granularity": "pixels", "pixel_baseline": "gray"}


def reference_budgets() -> dict:
    """``DEFAULT_BUDGETS`` of the reference rows: the cell rows' sample budgets, MultiSHAP's
    reference options (``multishap.REFERENCE_OPTIONS``: label target, log-odds, gray, |Phi|) and
    MultiViz's (``MULTIVIZ_REFERENCE_OPTIONS``: per pixel, from mid-gray)."""
    from gridvqa_jax.explain.multishap import REFERENCE_OPTIONS

    return {"multishap_ref": {"n_samples": DEFAULT_BUDGETS["multishap"]["n_samples"],
                              **REFERENCE_OPTIONS},
            "dime_ref": {"n_samples": DEFAULT_BUDGETS["dime"]["n_samples"]},
            "multiviz_ref": dict(MULTIVIZ_REFERENCE_OPTIONS)}


def sample_budgets(n_samples: dict, players: str = "cells",
                   multishap_sampling: str = "iid") -> dict:
    """Table 1 budgets from samples per explainer, ``{"multishap": 32, "dime": 256}`` ->
    ``{"multishap": {"n_samples": 32}, ...}``, and for ``players`` other than "cells" the same
    sample budgets for the reference rows (``<explainer>_ref``, with their reference options,
    ``reference_budgets``). Explainers not named keep ``DEFAULT_BUDGETS``.
    ``multishap_sampling``: ``"stratified"`` adds ``sampling="stratified"`` to the MultiSHAP rows
    (coalition sizes stratified, ``interactions.sii_matrix``); ``"iid"`` (default) adds
    nothing."""
    out = {e: {"n_samples": int(v)} for e, v in n_samples.items()}
    if players != "cells":
        ref = reference_budgets()
        out.update({e + REFERENCE_SUFFIX: {**ref[e + REFERENCE_SUFFIX], "n_samples": int(v)}
                    for e, v in n_samples.items() if e + REFERENCE_SUFFIX in ref})
    return with_multishap_sampling(out, multishap_sampling)


MULTISHAP_ROWS = ("multishap", "multishap" + REFERENCE_SUFFIX)


def with_multishap_sampling(budgets: dict, sampling: str = "iid") -> dict:
    """``budgets`` (``{row: budget}``; a budget a dict of keywords, an int ``n_samples`` or a
    sequence of those: a sweep) with ``sampling`` set in the MultiSHAP rows' budgets, ints made
    ``{"n_samples": int}``. ``"iid"`` (the estimator's default) returns ``budgets`` as given, so
    the parts of earlier runs keep their fingerprints. ``ValueError`` for another value."""
    from gridvqa_jax.explain.interactions import SAMPLINGS

    if sampling not in SAMPLINGS:
        raise ValueError(f"sampling must be one of {', '.join(SAMPLINGS)}, got {sampling!r}")
    if sampling == "iid":
        return budgets

    def one(b):
        return {**(b if isinstance(b, dict) else {"n_samples": int(b)}), "sampling": sampling}

    return {e: (b if e not in MULTISHAP_ROWS else one(b) if isinstance(b, (dict, int, np.integer))
                else type(b)(one(x) for x in b)) for e, b in budgets.items()}


def reference_explainers() -> dict:
    """``{row name: explainer}`` of the reference-granularity rows: ``multishap_ref`` =
    ``multishap.multishap_regions`` (ViLT's 12 x 12 patches over the rendering; budget: the
    reference's options ``multishap.REFERENCE_OPTIONS``), ``dime_ref`` = ``dime.dime_regions``
    (``lime_image``'s quickshift superpixels of each rendering, hidden black), ``multiviz_ref``
    = ``multiviz.multiviz`` per pixel (``MULTIVIZ_REFERENCE_OPTIONS``; needs the model's embed
    split); each gives a per-pixel visual map, scored at pixel level without aggregation."""
    from gridvqa_jax.explain.dime import dime_regions
    from gridvqa_jax.explain.multishap import multishap_regions

    return {"multishap_ref": multishap_regions, "dime_ref": dime_regions,
            "multiviz_ref": EXPLAINERS["multiviz"]}


def select_players(fns: dict, players: str = "cells") -> dict:
    """The rows of ``table1`` for ``players``: ``"cells"`` = ``fns`` as given (every image
    player a grid cell, the units of the ground truth: an upper bound for the method's idea);
    ``"reference"`` = each shipped explainer that has a reference-granularity variant
    (``reference_explainers``) replaced by it, at its place (the rows comparable with the
    paper); ``"both"`` = ``fns`` followed by those variants. Other rows are kept."""
    if players not in PLAYERS:
        raise InputError(f"players must be one of {', '.join(PLAYERS)}, got {players!r}")
    if players == "cells":
        return dict(fns)
    ref = reference_explainers()
    has = {e: e + REFERENCE_SUFFIX for e, fn in fns.items()
           if e + REFERENCE_SUFFIX in ref and fn is EXPLAINERS.get(e)}
    if players == "reference":
        return {has.get(e, e): ref[has[e]] if e in has else fn for e, fn in fns.items()}
    return {**fns, **{r: ref[r] for r in has.values()}}


def model_parts(model) -> tuple:
    """``(apply_fn, params, split)`` of a regime's model: ``split`` is its embed split
    ``(embed_fn, apply_embedded_fn)`` for MultiViz's embedding-path HVP, or None when the model
    offers none. ``model``: a ``Model`` (``training.export.load_model``) or ``(apply_fn, params,
    config)`` whose config is a GridMDETR ``ModelConfig`` (split =
    ``explain.multiviz.embed_split(config)``), ``(apply_fn, params, embed_fn,
    apply_embedded_fn)``, or ``(apply_fn, params)`` (no split)."""
    from gridvqa_jax.explain.multiviz import embed_split

    apply_fn, params, *rest = model
    if len(rest) >= 2 and callable(rest[0]) and callable(rest[1]):
        return apply_fn, params, (rest[0], rest[1])
    try:
        return apply_fn, params, embed_split(rest[0]) if rest else None
    except TypeError:  # not a GridMDETR config: no embedding path
        return apply_fn, params, None


def _takes_split(fn) -> bool:
    # an explainer that names both keywords (MultiViz): it gets the model's embed split
    names = signature_parameters(fn) or {}
    return "embed_fn" in names and "apply_embedded_fn" in names


def model_access(fn, split, budget) -> tuple[dict, str | None]:
    """The model-access keywords ``table1`` passes to explainer ``fn`` and what they select:
    ``({"embed_fn", "apply_embedded_fn"}, "embedding")`` for an explainer whose signature names
    both (MultiViz) when the model has an embed ``split``; ``({}, "pixel")`` for such an
    explainer on a model without one (MultiViz's pixel fallback) or when ``budget`` sets the
    keywords itself (then as the budget says); ``({}, None)`` for any other explainer."""
    if not _takes_split(fn):
        return {}, None
    if "embed_fn" in budget or "apply_embedded_fn" in budget:
        return {}, "embedding" if budget.get("embed_fn") is not None else "pixel"
    if split is None:
        return {}, "pixel"
    return {"embed_fn": split[0], "apply_embedded_fn": split[1]}, "embedding"


# ---------------------------------------------------------------------------------------------
# The protocol of each row: what is a player, what replaces an absent one, what is explained,
# at what budget.

_CONTROL = "none (control)"
# name -> players, baseline, target of the shipped explainers and controls (budget: derived)
PROTOCOLS = {
    "multishap": {"players": "cells x tokens (SII)", "baseline": "empty tile / PAD",
                  "target": "log-probability of the predicted answer"},
    "dime": {"players": "cells, tokens (LIME of DIME's MI)", "baseline": "empty tile / PAD",
             "target": "log-probability of the predicted answer"},
    "multiviz": {"players": "cells x tokens (second-order gradient x input)",
                 "baseline": "none (derivatives at the input embedding)",
                 "target": "log-probability of the predicted answer"},
    "random": {"players": _CONTROL, "baseline": "none",
               "target": "none: i.i.d. U[0, 1) on every cell and non-PAD token"},
    "objects": {"players": _CONTROL, "baseline": "none",
                "target": "none: uniform on the occupied cells and the non-PAD tokens"},
    "oracle": {"players": _CONTROL, "baseline": "none",
               "target": "none: the ground-truth cells and tokens"},
    "multishap_ref": {"players": "12 x 12 image patches (ViLT's 32 px of 384) x tokens (SII), "
                                 "per-pixel map",
                      "baseline": "empty tile / PAD",
                      "target": "log-probability of the predicted answer"},
    "dime_ref": {"players": "quickshift superpixels (lime_image defaults), tokens (LIME of "
                            "DIME's MI), per-pixel map",
                 "baseline": "black 0 / PAD", "target": "log-probability of the predicted answer"},
    "multiviz_ref": {"players": "pixels x tokens (second-order gradient x input per pixel), "
                                "per-pixel map",
                     "baseline": "mid-gray 128 pixels, zero token scale",
                     "target": "log-probability of the predicted answer"},
}
_MULTIVIZ_PIXEL = ("no embed split: pixel gradient x (input - empty tiles) on 0-255 pixels, "
                   "token presence vs PAD")
_QUANTITIES = {"logprob": "log-probability", "logit": "logit", "log_odds": "log-odds"}
_ANSWERS = {"predicted": "the predicted answer", "label": "the ground-truth answer"}
_BASELINES = {"empty": "empty tile / PAD", "gray": "mid-gray 128 / PAD", "black": "black 0 / PAD"}


def _numeric(v) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)


def _defaults(fn) -> dict:
    """``{keyword: default}`` of ``fn``'s signature; ``{}`` when it has none to read (None, a
    builtin)."""
    params = (signature_parameters(fn) or {}).values()
    return {p.name: p.default for p in params if p.default is not p.empty}


def explainer_budget(fn, budget: dict) -> dict:
    """The sample budget ``fn`` runs at: every ``n_*`` keyword (``n_samples``, ...) with a
    number, as passed in ``budget`` or else the default of ``fn``'s signature; other keywords
    (``chunk``, options) are not budget. ``{}`` for a deterministic explainer (MultiViz) or a
    control."""
    out = {k: v for k, v in _defaults(fn).items() if k.startswith("n_") and _numeric(v)}
    out.update({k: v for k, v in budget.items() if k.startswith("n_") and _numeric(v)})
    return {k: int(v) if float(v).is_integer() else float(v) for k, v in sorted(out.items())}


def explainer_protocol(name: str, fn=None, budget: dict | None = None, access=None) -> dict:
    """``{"players", "baseline", "target", "budget"}`` of one Table 1 row.

    ``name``: the row's name; its entry of ``PROTOCOLS`` (or, for a callable registered under
    another name, that name's entry; or ``fn.protocol``, a dict a user explainer may carry) gives
    players, baseline and target, and the keywords of ``budget`` that change them are applied:
    ``order=1`` (first-order Shapley), ``probability=True``, ``answer``, ``maps="uc"``,
    ``kind="unimodal"``, ``feature_mask``, ``target`` ("predicted" / "label"), ``quantity``
    ("logprob" / "logit" / "log_odds"), ``baseline`` ("empty" / "gray" / "black"),
    ``text_aggregate`` / ``visual_aggregate`` ("abs": ``sum |Phi|``; MultiSHAP's options,
    ``multishap.REFERENCE_OPTIONS``). ``access``: MultiViz's model access per regime
    (``{"pure": "embedding"|"pixel", ...}`` or one string, ``table1``'s ``"model_access"``); the
    pixel fallback states its baseline. ``budget``: ``explainer_budget(fn, budget)``, with
    ``"sampling"`` (how MultiSHAP draws its coalition sizes: ``"iid"`` / ``"stratified"``, as
    passed or ``fn``'s default) for an explainer that takes that keyword, except at ``order=1``.
    Unknown explainers say "not stated".
    """
    budget = dict(budget or {})
    base = PROTOCOLS.get(name)
    if base is None and fn is not None:
        base = next((PROTOCOLS[k] for k, f in EXPLAINERS.items() if f is fn and k in PROTOCOLS),
                    None)
        if base is None and isinstance(getattr(fn, "protocol", None), dict):
            base = fn.protocol
    out = {"players": "not stated (user explainer)", "baseline": "not stated",
           "target": "not stated", **{k: str(v) for k, v in (base or {}).items()
                                      if k in ("players", "baseline", "target")}}
    if budget.get("order") == 1:
        out["players"] = "cells + tokens (Shapley values)"
    if budget.get("maps") == "uc":
        out["players"] = "cells, tokens (LIME of DIME's UC)"
    if budget.get("kind") == "unimodal":
        out["players"] = "cells, tokens (gradient x input)"
    if budget.get("feature_mask") is not None:
        out["players"] += ", grouped by feature_mask"
    if budget.get("text_aggregate") == "abs":
        out["players"] += "; textual map sum_c |Phi[c, t]|"
    if budget.get("visual_aggregate") == "abs":
        out["players"] += "; visual map sum_t |Phi[c, t]|"
    if {"target", "quantity", "answer"} & set(budget) or budget.get("probability"):
        q, t = budget.get("quantity", "logprob"), budget.get("target", "predicted")
        q = "probability" if budget.get("probability") else _QUANTITIES.get(q, f"quantity={q!r}")
        t = ("a given answer" if budget.get("answer") is not None else
             _ANSWERS.get(t, f"target={t!r}"))
        out["target"] = f"{q} of {t}"
    if "baseline" in budget:
        out["baseline"] = _BASELINES.get(budget["baseline"], f"baseline={budget['baseline']!r}")
    modes = set(access.values()) if isinstance(access, dict) else {access} - {None}
    if "pixel" in modes:
        out["baseline"] = _MULTIVIZ_PIXEL if modes == {"pixel"} else (
            "embedding path where the model has an embed split, else " + _MULTIVIZ_PIXEL)
    out["budget"] = {} if fn is None and base is None else (
        explainer_budget(fn, budget) if fn is not None else
        {k: v for k, v in budget.items() if k.startswith("n_") and _numeric(v)})
    sampling = budget.get("sampling", _defaults(fn).get("sampling"))
    if sampling is not None and budget.get("order") != 1:  # order 1 samples permutations
        out["budget"]["sampling"] = str(sampling)
    return out


def table_protocol(result: dict, explainers=None) -> dict:
    """``{explainer: explainer_protocol(...)}`` of a Table 1 result: its ``"protocol"`` when it
    has one, else derived, for every row of its ``"table"``, from its ``"budgets"``
    (``DEFAULT_BUDGETS`` when it records none) and ``"model_access"`` (e.g. a result merged
    from per-regime runs); ``explainers``: ``{name: fn}`` when known (else the registered
    function of that name)."""
    if result.get("protocol"):
        return result["protocol"]
    fns = explainers or {}
    names = list(result.get("table") or result.get("budgets") or {})
    budgets = result.get("budgets") or DEFAULT_BUDGETS  # no budgets recorded: table1's
    return {e: explainer_protocol(e, fns.get(e, EXPLAINERS.get(e)), budgets.get(e, {}),
                                  (result.get("model_access") or {}).get(e))
            for e in names}


def table1(n: int = 16, seed: int = EXPLAIN_SEED, *, explainers=tuple(EXPLAINERS),
           regimes=tuple(r for r, _, _ in REGIMES), budgets: dict | None = None,
           batch: int = 16, cell_px: int = 16, key=None, progress: bool = False,
           figures_dir=None, n_figures: int = 2, log=None, models=None,
           data=None, players: str = "cells", parts_dir=None, piece: int | None = None) -> dict:
    """Table 1: every explainer and control in every regime, on ``n`` held-out d07 samples.

    Samples: ``regime_scenes(variant, n, seed)``, or with ``data={"pure"|"spur": DIR}`` the
    first ``n`` d07 samples of that dataset on disk (``dataset_scenes``: any layout
    ``formats.datasets.load_dataset`` reads, e.g. the official release; file order cycled
    through the buckets; refused before any model runs when it has fewer); a value may be a Scene
    batch (its first ``n`` samples). Pure and cross share the same D_pure samples.
    Each explainer sees the samples ``batch`` at a time (DIME's N x N cross-sample matrix is
    over one batch), without the positions that are PAD in every question of the batch
    (``world.scene.trim_tokens``, to one length for every regime and batch; the models ignore
    PAD), with key ``fold_in(fold_in(key, row position), batch index)``; the MultiSHAP rows
    (``BY_LENGTH``) batch the samples sorted by question length instead (``sample_order``),
    each batch trimmed to its own longest question rounded up to 4 positions, with sample
    ``j``'s key ``fold_in(fold_in(key, row position), j)`` (``explain_row``), and their
    scores are put back in sample order; ``budgets``
    replaces a row's entry of ``DEFAULT_BUDGETS`` whole (keyed by explainer name; a keyword an
    explainer does not
    accept raises ``scoring.BudgetError``). ``explainers``: names in ``scoring.EXPLAINERS``
    and / or explainer callables (named by ``__name__``), or a mapping name -> name or callable
    (``scoring.resolve_explainers``). ``models``: ``{"pure"|"spur": model}`` replacing the
    shipped reference model of that name, a model being a ``Model`` / ``(apply_fn, params,
    ...)`` or the path of an export directory (``training.export.load_model``).
    MultiViz (any explainer naming ``embed_fn`` and ``apply_embedded_fn``) gets each regime's
    model's embed split (``model_parts``, ``model_access``), so its row is the embedding-path
    HVP of the reference; only a model without one (a bare ``(apply_fn, params)``) runs its
    pixel fallback, recorded in ``"model_access"`` and logged.
    ``players``: ``"cells"`` (default: every image player a grid cell), ``"reference"``
    (MultiSHAP, DIME and MultiViz at their reference granularity, rows ``multishap_ref`` /
    ``dime_ref`` / ``multiviz_ref``: patches, superpixels, pixels; ``select_players``) or
    ``"both"`` (the cell rows, then the reference rows).
    ``figures_dir``: heatmap PNGs for the first ``n_figures`` samples of each regime
    (``figures.save_heatmap``).
    ``parts_dir``: save each finished explainer x regime's per-sample scores and maps there
    (``table1_parts``, one file each, written atomically) and reuse the parts of an earlier run
    whose fingerprint (explainer, key, budget, model access, batch, rendering, token length,
    digests of the samples and of the model parameters, and the explainer module's
    ``MASK_DRAWS`` where it declares one) is equal, so a run stopped midway
    resumes; a part saved with other settings is refused (``InputError``). ``piece``: the
    MultiSHAP and DIME rows (``takes_pieces``) run ``piece`` samples of a batch at a time
    (``explain_row``; the same maps to float32 rounding, so the part's fingerprint does not
    name it), and with ``parts_dir``
    each piece is saved (``table1_parts.save_piece``, removed once its part is written), so a
    row stopped inside a batch resumes at its first missing piece.

    Returns ``{"table": {explainer: {regime: table_row}}, "scores": {explainer: {regime:
    summary}}, "findings": cell_findings(...) (tagged "[cell players]"), "findings_reference":
    reference_findings(...), "figures": [paths], "n": n, "seed": seed, "budgets": ...,
    "model_access":
    {explainer: {regime: "embedding"|"pixel"}} (explainers taking the embed split only),
    "wall_s": {explainer: {regime: seconds it took, compiles included; a reused part's as saved}},
    "per_sample": {explainer: {regime: per-sample scores}}, "protocol": {explainer:
    explainer_protocol(...)} (players, baseline, target, budget of every row), "data":
    {"pure"|"spur": where its samples came from}}``.
    """
    from gridvqa_jax.training.export import load_model, load_reference_model
    from gridvqa_jax.world import universe as U

    budgets = {**{k: dict(v) for k, v in {**DEFAULT_BUDGETS, **reference_budgets()}.items()},
               **(budgets or {})}
    key = jax.random.key(seed) if key is None else key
    log = log or (lambda *_: None)
    fns = select_players(resolve_explainers(explainers), players)
    if "protocol" in fns:  # the JSON line (``compact``) holds the protocol under that key
        raise InputError("an explainer may not be named 'protocol': pass a mapping name -> "
                         "explainer to rename it")
    for e, fn in fns.items():
        check_budget(fn, budgets.get(e, {}))  # a bad keyword fails before any model runs
    if piece is not None and (isinstance(piece, bool) or not isinstance(piece, (int, np.integer))
                              or piece < 1):
        raise InputError(f"piece must be a positive number of samples, got {piece!r}")
    regime_def = {r: (m, d) for r, m, d in REGIMES}
    given = dict(models or {})
    unknown = sorted(set(given) - {m for _, m, _ in REGIMES})
    if unknown:
        raise InputError(f"models: unknown model name(s) {', '.join(unknown)}; expected pure, spur")
    models = {m: model_parts(load_model(v) if isinstance(v, (str, Path)) else v)
              for m, v in given.items()}
    access = {}
    unknown = sorted(set(data or {}) - {d for _, _, d in REGIMES})
    if unknown:
        raise InputError(f"data: unknown dataset name(s) {', '.join(unknown)}; expected pure, "
                         "spur")
    samples, source = {}, {}
    for d_name, where in (data or {}).items():  # read (and refused) before any model runs
        if isinstance(where, (str, Path)):
            samples[d_name], source[d_name] = dataset_scenes(where, d_name, n), str(where)
        else:
            samples[d_name] = jax.tree.map(lambda a: np.asarray(a)[:n], where)
            if len(samples[d_name].form) < n:
                raise InputError(f"data[{d_name!r}]: {len(samples[d_name].form)} samples, "
                                 f"fewer than n = {n}")
            source[d_name] = "given Scene batch"
    per_sample = {e: {} for e in fns}
    wall = {e: {} for e in fns}  # seconds per explainer and regime (compiles included)
    figures = []
    from tqdm.auto import tqdm
    import sys

    bar = tqdm(total=len(fns) * len(regimes) * n, desc="table1", unit="sample",
               disable=not progress, file=sys.stderr, dynamic_ncols=True)
    for d_name in dict.fromkeys(d for _, _, d in REGIMES):
        if d_name not in samples:
            samples[d_name] = regime_scenes(d_name, n, seed)
            source[d_name] = f"generated (seed {seed + U.VARIANTS.index(d_name)})"
    # one token length for every regime and batch, also when the regimes run as separate calls
    # (reproduce): each explainer compiles once (a compile costs 30-60 s on a CPU, more than
    # the positions it saves on shorter questions)
    length = max(np.shape(trim_tokens(v).tokens)[-1] for v in samples.values())
    digests = {}  # of each dataset's samples and each model's parameters (parts' fingerprints)
    for r in regimes:
        m_name, d_name = regime_def[r]
        if m_name not in models:
            models[m_name] = model_parts(load_reference_model(m_name))
        apply_fn, params, split = models[m_name]
        scenes = samples[d_name]
        fig_maps = {}
        for ei, (e, fn) in enumerate(fns.items()):
            ekey = jax.random.fold_in(key, ei)
            # MultiViz: the embedding-path HVP wherever the model has an embed split
            extra, path = model_access(fn, split, budgets.get(e, {}))
            if path is not None:
                access.setdefault(e, {})[r] = path
                if path == "pixel" and budgets.get(e, {}).get("granularity") == "pixels":
                    raise InputError(f"{e}: per-pixel MultiViz needs the embed split of the "
                                     f"{m_name} model, which it does not offer (pass a "
                                     "GridMDETR export or (apply, params, embed_fn, "
                                     "apply_embedded_fn))")
                if path == "pixel":
                    log(f"{r:9s} {e:10s} model {m_name} has no embed split: pixel fallback")
            by_length = _batches_by_length(e, fn)
            if parts_dir is not None:
                for name, tree in (("samples_" + d_name, scenes), ("model_" + m_name, params)):
                    if name not in digests:
                        digests[name] = PARTS.digest(tree)
                # everything the part's numbers depend on (table1_parts)
                fingerprint = {
                    "explainer": e, "function": _function_name(fn), "position": ei,
                    "key": PARTS.digest(key), "budget": budgets.get(e, {}), "model_access": path,
                    "regime": r, "n": n, "batch": batch, "cell_px": cell_px,
                    "token_length": length, "batches_by_length": by_length,
                    "samples": digests["samples_" + d_name], "model": digests["model_" + m_name],
                    **_mask_draws(fn, budgets.get(e, {}))}
                saved = PARTS.load_part(parts_dir, e, r, fingerprint)
                if saved is not None:
                    per_sample[e][r], fig, wall[e][r] = saved
                    if figures_dir is not None and fig is not None:
                        fig_maps[e] = fig
                    bar.update(n)
                    log(f"{r:9s} {e:10s} " + _row_text(table_row(summarise_scores(
                        per_sample[e][r]))) + f" (saved part, {PARTS.part_path(parts_dir, e, r)})")
                    continue
            # a part keeps every sample's maps (independent runs of a Monte Carlo row pool
            # into a larger budget: table1_parts); the figures draw the first n_figures
            keep = n if parts_dir is not None else n_figures if figures_dir is not None else 0
            pieces = None
            in_pieces = piece is not None and takes_pieces(fn, by_length)
            if parts_dir is not None and in_pieces:
                def pieces(bi, a, z, e=e, r=r, fingerprint=fingerprint):
                    path = PARTS.piece_path(parts_dir, e, r, bi, a)
                    fp = {**fingerprint, "piece": [bi, a, z]}
                    return (lambda: PARTS.load_piece(path, fp),
                            lambda *got: PARTS.save_piece(path, got[0], fp, *got[1:]))
            per_sample[e][r], fig, wall[e][r] = explain_row(
                fn, apply_fn, params, scenes, ekey, budget={**budgets.get(e, {}), **extra},
                batch=batch, cell_px=cell_px, length=None if by_length else length,
                by_length=by_length, keep=keep, done=bar.update,
                piece=piece if in_pieces else None, pieces=pieces)
            if fig is not None:
                fig_maps[e] = fig
            if parts_dir is not None:
                PARTS.save_part(parts_dir, e, r, per_sample[e][r], fingerprint, fig_maps.get(e),
                                wall[e][r])
                shutil.rmtree(PARTS.pieces_dir(parts_dir, e, r), ignore_errors=True)
            log(f"{r:9s} {e:10s} " + _row_text(table_row(summarise_scores(per_sample[e][r]))))
        if figures_dir is not None and fig_maps:
            from reproduction import figures as FG

            for i in range(min(n_figures, n)):
                sc = jax.tree.map(lambda a: np.asarray(a)[i], scenes)
                path = Path(figures_dir) / f"{r}_{i:02d}.png"
                FG.save_heatmap(path, sc, {e: (a.visual[i], a.textual[i])
                                          for e, a in fig_maps.items() if i < len(a.visual)},
                               title=f"{r}: {m_name} model on {d_name} data, sample {i}")
                figures.append(str(path))
    bar.close()
    scores = {e: {r: summarise_scores(per_sample[e][r]) for r in per_sample[e]}
              for e in per_sample}
    return {"table": {e: {r: table_row(s) for r, s in rs.items()} for e, rs in scores.items()},
            "scores": scores, "findings": cell_findings(per_sample),
            "findings_reference": reference_findings(per_sample), "wall_s": wall,
            "n": n, "seed": seed, "budgets": {e: budgets.get(e, {}) for e in fns},
            "figures": figures, "model_access": access, "per_sample": per_sample,
            "protocol": {e: explainer_protocol(e, fn, budgets.get(e, {}), access.get(e))
                         for e, fn in fns.items()},
            "data": {d: w for d, w in source.items() if d in {regime_def[r][1] for r in regimes}}}


def _tagged(findings: list[dict], tag: str) -> list[dict]:
    return [{**f, "finding": f"{f['finding']} [{tag}]", "claim": f"{f['claim']} [{tag}]"}
            for f in findings]


def cell_findings(per_sample: dict) -> list[dict]:
    """The paper's findings judged on the cell-player rows (``check_findings`` of the rows
    without ``REFERENCE_SUFFIX``), each name and claim tagged "[cell players]": the players are
    the ground truth's own units, which no explainer has in the papers, so these verdicts are
    about each method's idea at its best, not about the papers' measurements
    (``reference_findings``). A finding whose explainer has no cell row is inconclusive, as in
    ``check_findings``."""
    return _tagged(check_findings({e: s for e, s in per_sample.items()
                                   if not e.endswith(REFERENCE_SUFFIX)}), "cell players")


def reference_findings(per_sample: dict) -> list[dict]:
    """The paper's findings re-judged on the reference-granularity rows: ``check_findings`` with
    each ``<explainer>_ref`` row (``REFERENCE_SUFFIX``) in place of ``<explainer>``'s cell-player
    row; each finding's name says "[reference players]". Empty when no reference row was
    scored."""
    refs = {e.removesuffix(REFERENCE_SUFFIX): e for e in per_sample if e.endswith(REFERENCE_SUFFIX)}
    if not refs:
        return []
    view = {e: s for e, s in per_sample.items()
            if not e.endswith(REFERENCE_SUFFIX) and e not in refs}
    view.update({base: per_sample[row] for base, row in refs.items()})
    return _tagged(check_findings(view), "reference players")


def _pct(x):
    return "  n/a " if x is None or not np.isfinite(x) else f"{100 * x:5.1f}"


def _row_text(row):
    v, t = row["visual"], row["textual"]
    return (f"visual RMA {_pct(v['rma'])} ± {_pct(v['rma_std'])} IoU {_pct(v['iou'])} ± "
            f"{_pct(v['iou_std'])} | textual RMA {_pct(t['rma'])} IoU {_pct(t['iou'])}")


def budget_text(budget: dict) -> str:
    """A protocol's budget as text: ``"n_samples = 8"``, or ``"no sampling"`` for ``{}``."""
    return ", ".join(f"{k} = {v}" for k, v in budget.items()) or "no sampling"


def sampling_note(protocol: dict) -> str | None:
    """A note under a protocol whose SII rows draw coalition sizes i.i.d. (``"sampling":
    "iid"``): the reference (WGLab/MultiSHAP, ``stratified_sampling=True``) stratifies them,
    which has the same expectation and, over cells, less variance at the same cost (over
    patches, measured on 16 samples, at most about 1.2x less). None otherwise."""
    rows = [e for e, p in protocol.items() if p.get("budget", {}).get("sampling") == "iid"]
    if not rows:
        return None
    return (f"{', '.join(rows)}: coalition sizes drawn i.i.d.; MultiSHAP's reference stratifies "
            "them (same expectation and cost; over cells about half the visual map's "
            "variance, over patches little or none, 1.06 [0.94, 1.20]; docs/results.md "
            "Step 6): "
            "--multishap-sampling stratified")


def format_table(result: dict) -> str:
    """Table 1 as text: ours (mean ± std, %) beside the paper's for every modality, explainer
    and regime, the protocol of every row (players, baseline, explained quantity, budget:
    ``table_protocol``), then the findings with their verdicts."""
    regimes = [r for r, _, _ in REGIMES]
    w = max([10, *map(len, result["table"])])  # the method column (e.g. multishap_ref)
    head = (f"{'modality':8s} {'method':{w}s} " + " ".join(
        f"{r + ' RMA':>15s} {r + ' IoU':>15s}" for r in regimes))
    src = result.get("data") or {}  # a dataset on disk is named; generated data by its seed
    where = (f"seed {result['seed']}" if all(v.startswith("generated") for v in src.values())
             else "; ".join(f"D_{k}: {v}" for k, v in src.items()))
    lines = [f"GridVQA-X Table 1: n = {result['n']} d07 samples per regime ({where}); "
             "ours / [paper], mean ± std in %", head]
    for mod in ("visual", "textual"):
        for e, rs in result["table"].items():
            ours = [f"{mod:8s} {e:{w}s}"]
            paper = [f"{'':8s} {'  [paper]':{w}s}"]
            has_paper = False
            for r in regimes:
                row = rs.get(r, {}).get(mod)
                for m in ("rma", "iou"):
                    ours.append(f"{_pct(row[m]) + ' ± ' + _pct(row[m + '_std']):>15s}"
                                if row else f"{'':>15s}")
                    p = PAPER_TABLE1.get(e.removesuffix(REFERENCE_SUFFIX), {}).get(
                        mod, {}).get(r, {}).get(m)
                    has_paper |= p is not None
                    paper.append(f"{f'{p[0]:5.1f} ± {p[1]:4.1f}' if p else '':>15s}")
            lines.append(" ".join(ours))
            if has_paper:
                lines.append(" ".join(paper))
    protocol = table_protocol(result)
    if protocol:
        lines += ["", "Protocol of each row (players; absent player's baseline; explained "
                  "quantity; budget):"]
        lines += [f"  {e:{w}s} {p['players']}; {p['baseline']}; {p['target']}; "
                  f"{budget_text(p['budget'])}" for e, p in protocol.items()]
        note = sampling_note(protocol)
        lines += [f"  ({note})"] if note else []
    lines.append("")
    lines.append("Findings of the paper, checked on our models:")
    for f in result["findings"] + result.get("findings_reference", []):
        lines.append(f"  [{f['verdict']}] {f['claim']}: {f['evidence']}")
    return "\n".join(lines)


def write_results(out_dir, run: Callable[[Path], dict]) -> dict:
    """Run ``run(stage) -> result`` (the Table 1 run, writing its heatmap PNGs into ``stage``),
    write ``results.json`` (everything but per-sample scores) and ``per_sample.npz`` (the
    per-sample scores, ``table1_parts.save_per_sample``) beside them and publish the
    directory as ``out_dir`` atomically (``mmx_base.staging``: ``out_dir`` must be absent
    or empty, checked before the run; nothing is left at ``out_dir`` on failure). Returns the
    result."""
    stage = staging.make_staging(out_dir)
    try:
        result = run(stage)
        body = {k: v for k, v in result.items() if k != "per_sample"}
        body["figures"] = [Path(p).name for p in body.get("figures", [])]
        (stage / "results.json").write_text(json.dumps(jsonable(body), indent=1))
        PARTS.save_per_sample(stage / "per_sample.npz", result["per_sample"])
        staging.publish(stage, out_dir)
    except BaseException:
        staging.discard(stage)
        raise
    return result


def compact(result: dict) -> dict:
    """The JSON line of ``gridvqa explain --regimes``: ``{explainer: {regime: {"visual": {rma,
    rma_std, iou, iou_std}, "textual": {...}}}, "protocol": {explainer: {"players", "baseline",
    "target", "budget"}}}`` (NaN -> null; ``table_protocol``)."""
    return jsonable({**result["table"], "protocol": table_protocol(result)})


__all__ = ["EXPLAIN_SEED", "EXPLAINERS", "REGIMES", "PAPER_TABLE1", "DEFAULT_BUDGETS", "PLAYERS",
           "REFERENCE_SUFFIX", "reference_explainers", "reference_budgets", "select_players",
           "score_explainer", "per_sample_scores", "summarise_scores", "concat_scores", "table_row",
           "map_spread", "resolve_explainer", "regime_scenes", "table1", "explain_row",
           "takes_pieces", "check_findings", "cell_findings", "reference_findings", "format_table",
           "write_results", "compact", "dataset_scenes", "bucket_round_robin", "PROTOCOLS",
           "explainer_budget", "explainer_protocol", "table_protocol", "sample_budgets",
           "budget_text", "sampling_note", "model_parts", "model_access"]
