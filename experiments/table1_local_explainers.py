"""GridVQA-X Table 1: local explainers (MultiSHAP, DIME, MultiViz) and the random / oracle
controls, scored by Relevance Mass Accuracy and Otsu IoU in three regimes (pure = M_pure on
D_pure, spurious = M_spur on D_spur, cross = M_spur on D_pure), printed beside the paper's
numbers, with the paper's four findings checked on our models.

    python experiments/table1_local_explainers.py --n 64 --out results/table1

Same protocol as ``gridvqa explain --regimes`` (``reproduction.table1.table1``).
"""

from __future__ import annotations

import argparse
import json
import sys

from reproduction import table1 as T1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=16, help="held-out d07 samples per regime")
    p.add_argument("--seed", type=int, default=T1.EXPLAIN_SEED)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--multishap-samples", type=int, default=8)
    p.add_argument("--dime-samples", type=int, default=64)
    p.add_argument("--out", help="results.json and heatmap PNGs (new or empty directory)")
    args = p.parse_args(argv)
    budgets = {"multishap": {"n_samples": args.multishap_samples},
               "dime": {"n_samples": args.dime_samples}}
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731

    def run(fig_dir=None):
        return T1.table1(n=args.n, seed=args.seed, budgets=budgets, batch=args.batch,
                         progress=True, figures_dir=fig_dir, log=log)

    res = T1.write_results(args.out, run) if args.out else run()
    print(T1.format_table(res))
    print(json.dumps(T1.compact(res)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
