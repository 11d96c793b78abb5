"""The modality-bias paper's Tables 1, 2, 5, 6, 7, 14, 15 and Figure 3 on the closed world,
each printed with the paper's numbers beside ours.

The paper scores its views against 300 human-labelled samples per dataset (Fakeddit,
MMFakeBench); ours are scored against closed-world bias types that are exact by construction
(``bias_jax.data.closed_world``), on fresh samples of ``bias_jax.analysis.ANALYSIS_SEED``.

    python experiments/bias_tables.py [--n 2000] [--seed S] [--out DIR]

``--out`` writes ``results.json`` and ``venn.png`` (Figure 3). Same as ``modality-bias analyze
--world basic --tables`` (the basic world and its shipped detectors).
"""

from __future__ import annotations

import argparse
import json
import sys

import jax

from bias_jax import analysis as AN
from bias_jax import detectors as D
from reproduction import bias_tables


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=2000, help="closed-world analysis samples")
    p.add_argument("--seed", type=int, default=AN.ANALYSIS_SEED)
    p.add_argument("--out", default=None, help="directory for results.json and venn.png")
    args = p.parse_args(argv)
    dets = D.load_detectors()
    batch = AN.closed_world_batch(dets["joint"][2], args.n, args.seed, world="basic")
    res, _ = AN.analyze(dets, batch, key=jax.random.key(args.seed), tables=True,
                       second=D.second_detectors(), world="basic",
                       log=lambda m: print(m, file=sys.stderr))
    print(bias_tables.tables_text(res, f"bias tables, closed world, n={args.n}, seed={args.seed}"))
    if args.out:
        from pathlib import Path

        from mmx_base import staging

        out = Path(args.out)
        staging.write_atomic(out / "results.json", json.dumps(res, indent=1, default=float))
        bias_tables.venn_figure(res["venn"], out / "venn.png", title=f"closed world, n={args.n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
