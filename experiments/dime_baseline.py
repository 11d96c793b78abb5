"""Does DIME's reference row sit below the floor because of its black baseline?

DIME's reference hides a superpixel black (``lime_image``'s ``hide_color=0``); in the closed world
an absent object is the empty white tile. This runs Table 1's ``dime_ref`` row (quickshift
superpixels, LIME of DIME's MI) once per baseline (``black`` = the reference, ``empty``,
``gray``) with the same samples, batches, keys and masks (the row is Table 1's first explainer
each time, so its key is the same and only the fill of a hidden superpixel changes), and the
``objects`` floor beside it; per regime, each baseline's visual RMA / IoU (pixel level) and the
paired difference to ``black`` and to the floor with its 95% interval (``stats.paired_ci``).

    python experiments/dime_baseline.py [--n 64] [--masks 64] [--parts DIR] [--regimes ...]

``--parts DIR`` saves each finished baseline x regime (``table1_parts``) and a rerun resumes.
Prints one text table and, last, a JSON line. docs/results.md reports its numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from reproduction import stats as STATS
from reproduction import table1 as T1

BASELINES = ("black", "empty", "gray")
METRICS = ("rma", "iou")


def visual(per_sample_regime, metric: str) -> np.ndarray:
    """Per-sample visual score at pixel level, float [n]."""
    return np.asarray(per_sample_regime["visual"]["pixel"][metric], float)


def run(n: int, masks: int, regimes, parts=None, log=None) -> dict:
    """``{"rows": {row: {regime: per-sample scores}}, "wall_s": ...}`` for every baseline's
    ``dime_ref`` row and the ``objects`` control."""
    rows, wall = {}, {}
    for b in BASELINES:
        t0 = time.perf_counter()
        res = T1.table1(n, explainers=("dime",), players="reference", regimes=tuple(regimes),
                        budgets={"dime_ref": {"n_samples": masks, "baseline": b}}, log=log,
                        parts_dir=None if parts is None else Path(parts) / b)
        rows[f"dime_ref, {b}"] = res["per_sample"]["dime_ref"]
        wall[b] = time.perf_counter() - t0
    res = T1.table1(n, explainers=("objects",), regimes=tuple(regimes))
    rows["objects floor"] = res["per_sample"]["objects"]
    return {"rows": rows, "wall_s": wall}


def summary(rows: dict, regimes) -> dict:
    """Per row, regime and metric: mean and the paired differences (d, lo, hi) to the black
    row and to the floor."""
    out = {}
    for name, by_r in rows.items():
        for r in regimes:
            for m in METRICS:
                x = visual(by_r[r], m)
                out.setdefault(name, {}).setdefault(r, {})[m] = {
                    "mean": float(np.nanmean(x)),
                    "minus_black": STATS.paired_ci(x, visual(rows["dime_ref, black"][r], m)),
                    "minus_floor": STATS.paired_ci(x, visual(rows["objects floor"][r], m))}
    return out


def _ci(d) -> str:
    return f"{100 * d[0]:+.1f} [{100 * d[1]:+.1f}, {100 * d[2]:+.1f}]"


def format_summary(s: dict, n: int, masks: int) -> str:
    """The table as text: one line per row and regime."""
    lines = [f"DIME over quickshift superpixels by baseline: n = {n} d07 samples per regime, "
             f"{masks} masks per modality; visual scores at pixel level, %; paired "
             "differences in points [95% interval]",
             f"{'row':16s} {'regime':9s} {'vis RMA':>7s} {'- black':>21s} {'- floor':>21s} "
             f"{'vis IoU':>7s} {'- black':>21s} {'- floor':>21s}"]
    for name, by_r in s.items():
        for r, ms in by_r.items():
            lines.append(f"{name:16s} {r:9s} " + " ".join(
                f"{100 * ms[m]['mean']:7.1f} {_ci(ms[m]['minus_black']):>21s} "
                f"{_ci(ms[m]['minus_floor']):>21s}" for m in METRICS))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=64, help="held-out d07 samples per regime")
    p.add_argument("--masks", type=int, default=64, help="LIME masks per modality")
    p.add_argument("--regimes", nargs="+", default=["pure", "spurious", "cross"],
                   choices=["pure", "spurious", "cross"])
    p.add_argument("--parts", default=None, help="resumable parts folder")
    args = p.parse_args(argv)
    res = run(args.n, args.masks, args.regimes, args.parts,
              log=lambda m: print(m, file=sys.stderr, flush=True))
    s = summary(res["rows"], args.regimes)
    print(format_summary(s, args.n, args.masks))
    print(json.dumps({"n": args.n, "masks": args.masks, "summary": s, "wall_s": res["wall_s"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
