"""Does a reference row sit where it does because of how it fills a hidden player?

The references fill what they hide with something the closed world does not call "absent":
DIME's LIME hides a superpixel black (``lime_image``'s ``hide_color=0``), MultiSHAP's reference
masks a patch gray 0.5; here an absent object is the empty white tile. This runs one Table 1
reference row (``dime_ref``: quickshift superpixels, LIME of DIME's MI; ``multishap_ref``: ViLT's
patches with ``multishap.REFERENCE_OPTIONS``) once per fill (the reference's own first, then the
others of ``black``, ``empty``, ``gray``) with the same samples, batches, keys and masks or
coalitions (the row is Table 1's only explainer each time, so its key is the same and only the
fill changes), and the ``objects`` floor beside it; per regime, each fill's visual RMA / IoU
(pixel level) and the paired difference to the reference's fill and to the floor with its 95%
interval (``stats.paired_ci``).

    python experiments/reference_fill.py [--row dime|multishap] [--n 64] [--budget K]
                                         [--parts DIR] [--regimes ...]

``--budget``: masks per modality (DIME, default 64) or coalitions per sample (MultiSHAP, default
16). ``--parts DIR`` saves each finished fill x regime (``table1_parts``: refused when its
settings differ) under ``DIR/<fill>``, and a rerun resumes. Prints one text table and, last, a
JSON line. docs/results.md reports its numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from gridvqa_jax.explain.scoring import row_scores
from reproduction import stats as STATS
from reproduction import table1 as T1

FILLS = ("black", "empty", "gray")
METRICS = ("rma", "iou")
# row -> (Table 1 explainer, the reference's fill, default budget, what the budget counts)
ROWS = {"dime": ("dime", "black", 64, "masks per modality"),
        "multishap": ("multishap", "gray", 16, "coalitions per sample")}
_PLAYERS = {"dime": "quickshift superpixels", "multishap": "ViLT's 12 x 12 patches"}


def fills(row: str) -> tuple[str, ...]:
    """The fills in the order they run and print: the reference's own first."""
    ref = ROWS[row][1]
    return (ref,) + tuple(f for f in FILLS if f != ref)


def run(row: str, n: int, budget: int, regimes, parts=None, log=None) -> dict:
    """``{"rows": {name: {regime: per-sample scores}}, "reference": name, "wall_s": {fill: s}}``
    for the ``<row>_ref`` Table 1 row under every fill and the ``objects`` control; the row's
    other options are the reference's (``table1.reference_budgets``)."""
    explainer = ROWS[row][0]
    name = explainer + T1.REFERENCE_SUFFIX
    rows, wall = {}, {}
    for f in fills(row):
        t0 = time.perf_counter()
        opts = {**T1.reference_budgets()[name], "n_samples": budget, "baseline": f}
        res = T1.table1(n, explainers=(explainer,), players="reference", regimes=tuple(regimes),
                        budgets={name: opts}, log=log,
                        parts_dir=None if parts is None else Path(parts) / f)
        rows[f"{name}, {f}"] = res["per_sample"][name]
        wall[f] = time.perf_counter() - t0
    res = T1.table1(n, explainers=("objects",), regimes=tuple(regimes))
    rows["objects floor"] = res["per_sample"]["objects"]
    return {"rows": rows, "reference": f"{name}, {fills(row)[0]}", "wall_s": wall}


def summary(rows: dict, regimes, reference: str) -> dict:
    """Per row, regime and metric: mean and the paired differences (d, lo, hi) to the
    ``reference`` row (the reference's fill) and to the floor."""
    def vis(name, r, m):
        return row_scores(rows[name][r], "visual", m)

    out = {}
    for name in rows:
        for r in regimes:
            for m in METRICS:
                x = vis(name, r, m)
                out.setdefault(name, {}).setdefault(r, {})[m] = {
                    "mean": float(np.nanmean(x)),
                    "minus_reference": STATS.paired_ci(x, vis(reference, r, m)),
                    "minus_floor": STATS.paired_ci(x, vis("objects floor", r, m))}
    return out


def format_summary(s: dict, row: str, n: int, budget: int) -> str:
    """The table as text: one line per row and regime."""
    _, ref, _, unit = ROWS[row]
    lines = [f"{row} over {_PLAYERS[row]} by fill: n = {n} d07 samples per regime, {budget} "
             f"{unit}; visual scores at pixel level, %; paired differences in points [95% "
             f"interval] to the reference's fill ({ref}) and to the objects floor",
             f"{'row':22s} {'regime':9s} {'vis RMA':>7s} {'- ' + ref:>21s} {'- floor':>21s} "
             f"{'vis IoU':>7s} {'- ' + ref:>21s} {'- floor':>21s}"]
    for name, by_r in s.items():
        for r, ms in by_r.items():
            lines.append(f"{name:22s} {r:9s} " + " ".join(
                f"{100 * ms[m]['mean']:7.1f} {STATS.points(*ms[m]['minus_reference']):>21s} "
                f"{STATS.points(*ms[m]['minus_floor']):>21s}" for m in METRICS))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--row", choices=sorted(ROWS), default="dime",
                   help="the reference row: dime_ref or multishap_ref")
    p.add_argument("--n", type=int, default=64, help="held-out d07 samples per regime")
    p.add_argument("--budget", type=int, default=None,
                   help="DIME: masks per modality (64); MultiSHAP: coalitions per sample (16)")
    p.add_argument("--regimes", nargs="+", default=["pure", "spurious", "cross"],
                   choices=["pure", "spurious", "cross"])
    p.add_argument("--parts", default=None, help="resumable parts folder")
    args = p.parse_args(argv)
    budget = ROWS[args.row][2] if args.budget is None else args.budget
    if budget < 1 or args.n < 1:
        p.error(f"--n and --budget must be positive, got {args.n} and {budget}")
    res = run(args.row, args.n, budget, args.regimes, args.parts,
              log=lambda m: print(m, file=sys.stderr, flush=True))
    s = summary(res["rows"], args.regimes, res["reference"])
    print(format_summary(s, args.row, args.n, budget))
    print(json.dumps({"row": args.row, "n": args.n, "budget": budget, "summary": s,
                      "wall_s": res["wall_s"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
