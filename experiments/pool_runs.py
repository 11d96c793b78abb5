"""Independent runs of a MultiSHAP row pooled into one at their summed budget, beside each run.

The parts (``table1_parts`` files, e.g. a ``--convergence`` budget's main run and its two split
halves: ``DIR/multishap_2048_{main,split1,split2}/multishap__pure.npz``) must keep every
sample's maps (parts saved since 2026-12-05) and share their first N samples, Table 1's
``regime_scenes`` of the parts' regime (seed ``--seed``); ``reproduction.pooled_runs`` says
why their mean map is one run at the summed budget and refuses parts for which it is not.
For visual (pixel level) and textual RMA / IoU this prints each run's mean, the pooled maps'
mean and the paired difference pooled - runs' mean [95% interval] (``stats.paired_ci``).

    python experiments/pool_runs.py PART PART [PART ...] [--n N] [--seed SEED]

Prints one text table and, last, a JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from gridvqa_jax.explain.scoring import ROW_METRICS, row_scores
from mmx_base.errors import InputError
from reproduction import pooled_runs as PR
from reproduction import stats as STATS
from reproduction import table1 as T1


def pool(paths, n=None, seed: int = T1.EXPLAIN_SEED) -> dict:
    """``pooled_runs.pool_read`` (each part read once) on the first ``n`` samples (default: as
    many as every part holds maps of) of the parts' regime, summarised: ``{"n", "budget",
    "regime", "files", "<modality>_<metric>": {"runs": [mean of each run], "pooled": mean,
    "diff": (d, lo, hi)}}``."""
    parts = PR.read_parts(paths)
    held = [(0 if maps is None else int(np.shape(maps.visual)[0]), fp.get("regime"))
            for maps, _, fp in parts]
    regimes = {r for _, r in held}
    if len(regimes) != 1 or None in regimes:
        raise InputError(f"the parts are of regimes {sorted(map(str, regimes))}; pool one")
    regime = regimes.pop()
    variant = {r: d for r, _, d in T1.REGIMES}[regime]
    n = min(k for k, _ in held) if n is None else n
    if n < 2:
        raise InputError(f"{n} samples to pool: a part without every sample's maps (saved "
                         "before 2026-12-05) cannot pool")
    got = PR.pool_read(paths, parts, T1.regime_scenes(variant, n, seed))
    out = {"n": n, "budget": got["budget"], "regime": regime, "files": got["files"]}
    for mod, m in ROW_METRICS:
        runs = [row_scores(s, mod, m) for s in got["runs"]]
        pooled = row_scores(got["pooled"], mod, m)
        out[f"{mod}_{m}"] = {"runs": [float(np.nanmean(x)) for x in runs],
                             "pooled": float(np.nanmean(pooled)),
                             "diff": STATS.paired_ci(pooled, np.mean(runs, axis=0))}
    return out


def format_pool(res: dict) -> str:
    """The pooled row as text: one line per metric."""
    k = len(res["files"])
    lines = [f"{k} runs pooled into one at {res['budget']} ({res['regime']}, n = {res['n']}): "
             "means in %, pooled - runs' mean in points [95% interval]"]
    for mod, m in ROW_METRICS:
        c = res[f"{mod}_{m}"]
        runs = " ".join(f"{100 * x:5.1f}" for x in c["runs"])
        lines.append(f"  {mod:8s} {m.upper():4s} runs {runs}  pooled {100 * c['pooled']:5.1f}"
                     f"  pooled - runs {STATS.points(*c['diff']):>21s}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("parts", nargs="+", help="part files (.npz) of independent runs")
    p.add_argument("--n", type=int, default=None, help="samples (default: all that every "
                   "part holds maps of)")
    p.add_argument("--seed", type=int, default=T1.EXPLAIN_SEED)
    args = p.parse_args(argv)
    try:
        res = pool(args.parts, args.n, args.seed)
    except InputError as e:
        p.error(str(e))
    print(format_pool(res))
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
