"""How much Monte Carlo variance MultiSHAP's stratified coalition sizes remove, per row.

For ``--n`` held-out pure d07 samples from the ``--start``-th on (Table 1's ``regime_scenes``,
questions trimmed to the batch's longest, M_pure), this runs MultiSHAP ``--runs`` times with
independent keys at ``--coalitions`` coalitions per sample, once with i.i.d. sizes and once
stratified (``interactions.sii_matrix``'s ``sampling``), and prints, per modality, the
across-run variance of the maps summed over cells (or pixels) and tokens, per sample and
pooled, and the ratio i.i.d. / stratified. Both estimators are unbiased for the same maps and
an i.i.d. run's variance falls as 1 / K, so the ratio is the factor by which the i.i.d. budget
would have to grow to match the stratified one: its effective budget multiplier. ``--row
cells`` is Table 1's ``multishap`` row (cells, its default options), ``--row patches`` its
``multishap_ref`` row (ViLT's 12 x 12 patches, ``multishap.REFERENCE_OPTIONS``; the visual map
per pixel).

    python experiments/sampling_variance.py [--row cells|patches] [--n 4] [--start 0]
        [--runs 3] [--coalitions 32]
    python experiments/sampling_variance.py --saved FILE [FILE ...]   # runs' JSON lines, again

``--saved`` with several files pools their samples (runs of one row, runs and coalitions on
disjoint samples, e.g. ``--start 0`` and ``--start 8``) into one summary.

``--shipped`` computes nothing: it reads the runs of docs/table1_default/convergence_parts
(MultiSHAP over cells, pure), the main run and split halves of step 6 (stratified, 32, 128, 256
and 512 coalitions) and of step 5 (i.i.d., 2,048), on their first 8 samples, whose maps every one of
them keeps; an i.i.d. run's variance at K coalitions is taken as 2,048 / K times that at
2,048 (a mean of K independent coalition terms), so the ratio needs no i.i.d. run at K.

Prints one text table and, last, a JSON line. docs/results.md reports its numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from pathlib import Path

import jax
import numpy as np

from gridvqa_jax.explain.multishap import REFERENCE_OPTIONS, multishap, multishap_regions
from gridvqa_jax.training.export import load_reference_model
from gridvqa_jax.world.scene import trim_tokens
from mmx_base.errors import InputError
from reproduction import convergence as CV
from reproduction import table1 as T1
from reproduction import table1_parts as PARTS


def run_maps(row: str, model, scenes, key, coalitions: int, sampling: str):
    """(visual [B, F], textual [B, L]) maps of one run: cells (F = 25) or pixels."""
    if row == "cells":
        att = multishap(model[0], model[1], scenes, key, n_samples=coalitions,
                        sampling=sampling)
        vis = np.asarray(att.visual)
    else:
        att = multishap_regions(model[0], model[1], scenes, key, n_samples=coalitions,
                                sampling=sampling, **REFERENCE_OPTIONS)
        vis = np.asarray(att.visual_px)
    return vis.reshape(vis.shape[0], -1), np.asarray(att.textual)


def variance_ratio(row: str = "cells", n: int = 4, runs: int = 3, coalitions: int = 32,
                   seed: int = T1.EXPLAIN_SEED, start: int = 0) -> dict:
    """On the pure samples ``start .. start + n - 1``: ``{"row", "n", "start", "seed", "runs",
    "coalitions", "seconds": {sampling: s}, "<modality>": {"iid",
    "stratified": [per-sample summed variance], "ratio": pooled iid / stratified (dominated by
    the samples of largest variance), "ratio_geomean": the geometric mean of the per-sample
    ratios (every sample alike, as RMA and IoU, which ignore a map's scale, weigh them),
    "ratio_per_sample": [...]}}``."""
    if runs < 2:
        raise ValueError(f"runs must be >= 2 to measure a variance, got {runs}")
    if start < 0 or n < 1:
        raise ValueError(f"need start >= 0 and n >= 1, got start {start}, n {n}")
    drawn = T1.regime_scenes("pure", start + n, seed)
    scenes = trim_tokens(jax.tree.map(lambda x: x[start:], drawn))
    model = load_reference_model("pure")
    out = {"row": row, "n": n, "start": start, "seed": seed, "runs": runs,
           "coalitions": coalitions, "seconds": {}}
    var = {}
    for sampling in ("iid", "stratified"):
        t = time.perf_counter()
        maps = [run_maps(row, model, scenes, jax.random.fold_in(jax.random.key(seed), r),
                         coalitions, sampling) for r in range(runs)]
        out["seconds"][sampling] = time.perf_counter() - t
        for i, mod in enumerate(("visual", "textual")):
            var[sampling, mod] = _summed_variance(maps, i)
    for mod in ("visual", "textual"):
        out[mod] = _ratios(var["iid", mod], var["stratified", mod])
    return out


SHIPPED = Path(__file__).resolve().parents[1] / "docs" / "table1_default" / "convergence_parts"


def _summed_variance(maps, i: int) -> np.ndarray:
    """float64 [B]: per sample, the across-run variance of modality ``i`` (0 visual, 1 textual)
    of the runs' ``(visual [B, F], textual [B, L])`` maps, summed over features."""
    return np.stack([m[i] for m in maps]).astype(np.float64).var(0, ddof=1).sum(-1)


def _runs(d: Path, budget, m: int) -> list[tuple[np.ndarray, np.ndarray]]:
    out = []
    for tag in ("main", "split1", "split2"):
        path = CV.run_dir(d, "multishap", budget, tag) / "multishap__pure.npz"
        maps = PARTS.read_part_maps(path)[0]
        held = 0 if maps is None else int(np.shape(maps.visual)[0])
        if held < m:
            raise InputError(f"{path}: holds the maps of {held} samples, fewer than {m}")
        out.append((np.asarray(maps.visual)[:m].reshape(m, -1),
                    np.asarray(maps.textual)[:m]))
    return out


def variance_ratio_from_parts(parts_dir=SHIPPED, coalitions=(32, 128, 256, 512),
                              iid_budget: int = 2048, m: int = 8) -> list[dict]:
    """``variance_ratio``'s entries from shipped runs (``--shipped``): per stratified budget K,
    the across-run variance of the three i.i.d. runs at ``iid_budget`` times ``iid_budget / K``
    against that of the three stratified runs at K, on their first ``m`` samples."""
    parts_dir = Path(parts_dir)
    ref = _runs(parts_dir, iid_budget, m)
    out = []
    for k in coalitions:
        # the budget as step 6 gives it (--multishap-sampling stratified), hence its folder
        strat = _runs(parts_dir, {"n_samples": k, "sampling": "stratified"}, m)
        res = {"row": "cells", "n": m, "runs": 3, "coalitions": k, "seconds": {},
               "iid_from": iid_budget}
        for i, mod in enumerate(("visual", "textual")):
            res[mod] = _ratios(iid_budget / k * _summed_variance(ref, i),
                               _summed_variance(strat, i))
        out.append(res)
    return out


def _ratios(a, b) -> dict:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    per = a / np.where(b > 0, b, np.nan)
    return {"iid": a.tolist(), "stratified": b.tolist(), "ratio": float(a.sum() / b.sum()),
            "ratio_ci": ratio_interval(a, b), "ratio_geomean": float(np.exp(np.nanmean(
                np.log(per)))), "ratio_per_sample": per.tolist()}


def ratio_interval(a, b, level: float = 0.95, n_resamples: int = 10_000) -> list[float]:
    """[lo, hi]: percentile bootstrap over the samples (pairs ``a[i], b[i]`` resampled
    together, ``scipy.stats.bootstrap``, a fixed seed) of the pooled ratio ``sum a / sum b``.
    With 3 runs each per-sample variance has 2 degrees of freedom, and resampling the samples
    carries that noise with their spread; on 8 samples the interval is a rough one."""
    from scipy import stats

    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if len(a) < 2:
        return [float("nan"), float("nan")]
    ci = stats.bootstrap((a, b), lambda x, y, axis=-1: x.sum(axis) / y.sum(axis), paired=True,
                         vectorized=True, confidence_level=level, n_resamples=n_resamples,
                         method="percentile", random_state=0).confidence_interval
    return [float(ci.low), float(ci.high)]


def _resummarised(path) -> dict | list:
    """A saved JSON line of this script (one result or a list), each modality's summary
    recomputed from its per-sample variances."""
    saved = json.loads(Path(path).read_text().strip().splitlines()[-1])
    items = saved if isinstance(saved, list) else [saved]
    for res in items:
        for mod in ("visual", "textual"):
            if mod not in res or "iid" not in res[mod] or "stratified" not in res[mod]:
                raise InputError(f"{path}: not a line of this script (no {mod} variances)")
            res[mod] = _ratios(res[mod]["iid"], res[mod]["stratified"])
    return saved


def pooled(results: list[dict], names=None) -> dict:
    """One result from ``variance_ratio`` results on disjoint samples of one draw (seed), row,
    runs and coalitions: their per-sample variances concatenated (in order) and summarised
    again, ``n`` and each sampling's seconds summed, ``"parts": [[start, n], ...]``.
    ``InputError`` if they differ in seed, row, runs or coalitions, or share a sample."""
    names = names or [f"result {i}" for i in range(len(results))]
    # lines written before --start recorded no start or seed: sample 0 of Table 1's draw
    results = [{"seed": T1.EXPLAIN_SEED, "start": 0, **res} for res in results]
    first = results[0]
    spans = []
    for res, name in zip(results, names):
        for k in ("seed", "row", "runs", "coalitions"):
            if res.get(k) != first.get(k):
                raise InputError(f"{name}: {k} {res.get(k)!r}, not {first.get(k)!r} as in "
                                 f"{names[0]}; only runs of one draw and protocol pool")
        start = int(res["start"])
        for s0, n0, other in spans:
            if start < s0 + n0 and s0 < start + res["n"]:
                raise InputError(f"{name}: samples {start}..{start + res['n'] - 1} overlap "
                                 f"those of {other} ({s0}..{s0 + n0 - 1})")
        spans.append((start, int(res["n"]), name))
    out = {k: first[k] for k in ("seed", "row", "runs", "coalitions")}
    out["n"] = sum(r["n"] for r in results)
    out["parts"] = [[s0, n0] for s0, n0, _ in spans]
    out["seconds"] = {k: sum(r["seconds"].get(k, 0.0) for r in results)
                      for k in first["seconds"]}
    for mod in ("visual", "textual"):
        out[mod] = _ratios(sum((r[mod]["iid"] for r in results), []),
                           sum((r[mod]["stratified"] for r in results), []))
    return out


def format_ratio(res: dict) -> str:
    span = (" (samples " + ", ".join(f"{a}-{a + b - 1}" for a, b in res["parts"]) + ")"
            if "parts" in res else f" from sample {res['start']}" if res.get("start") else "")
    lines = [f"MultiSHAP, {res['row']}, pure, n = {res['n']}{span}, {res['runs']} runs per "
             f"sampling at {res['coalitions']} coalitions: across-run map variance, "
             "i.i.d. / stratified"
             + (f" (i.i.d.: the runs at {res['iid_from']} scaled by {res['iid_from']} / "
                f"{res['coalitions']})" if "iid_from" in res else "")]
    for mod in ("visual", "textual"):
        per = " ".join(f"{r:5.2f}" for r in res[mod]["ratio_per_sample"])
        lo, hi = res[mod]["ratio_ci"]
        lines.append(f"  {mod:8s} pooled {res[mod]['ratio']:5.2f} [{lo:4.2f}, {hi:4.2f}]  "
                     f"geometric mean {res[mod]['ratio_geomean']:5.2f}   per sample {per}")
    if res["seconds"]:
        lines.append("  seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in res["seconds"].items()))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--row", choices=["cells", "patches"], default="cells")
    p.add_argument("--n", type=int, default=4, help="samples (default 4)")
    p.add_argument("--start", type=int, default=0, help="first sample (default 0)")
    p.add_argument("--runs", type=int, default=3, help="independent runs per sampling")
    p.add_argument("--coalitions", type=int, default=32, help="coalitions per sample")
    p.add_argument("--seed", type=int, default=T1.EXPLAIN_SEED)
    p.add_argument("--shipped", action="store_true", help="no run: the shipped runs of steps "
                   "5 and 6 (docs/table1_default/convergence_parts)")
    p.add_argument("--saved", metavar="FILE", nargs="+", help="no run: the JSON line a run "
                   "printed, summarised again (its per-sample variances); several: pooled")
    args = p.parse_args(argv)
    try:
        if args.saved and len(args.saved) > 1:
            saved = [_resummarised(f) for f in args.saved]
            if any(isinstance(r, list) for r in saved):
                raise InputError("--saved pools single runs only, not --shipped's list")
            res = pooled(saved, args.saved)
        elif args.saved:
            res = _resummarised(args.saved[0])
        else:
            res = (variance_ratio_from_parts() if args.shipped else
                   variance_ratio(args.row, args.n, args.runs, args.coalitions, args.seed,
                                  args.start))
    except (ValueError, InputError, OSError) as e:
        p.error(str(e))
    for r in (res if isinstance(res, list) else [res]):
        print(format_ratio(r))
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
