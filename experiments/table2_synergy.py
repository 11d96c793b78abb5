"""GridVQA-X Table 2 (global synergy vs relational depth): EMAP, InterSHAP and PID in the three
regimes with set-level jackknife intervals and verdicts, the paper's numbers beside ours.

    python experiments/table2_synergy.py [--n 64] [--boot 200] [--out results/table2]

The same as ``gridvqa synergy --regimes``; see ``reproduction.table2`` for definitions.
"""

import argparse
import json

from reproduction import table2 as T2


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=64, help="samples per bucket (EMAP N-set)")
    ap.add_argument("--boot", type=int, default=200,
                    help="permutations of the answers for pid_null (the intervals are "
                         "set-level jackknife ones)")
    ap.add_argument("--out", help="write synergy_vs_depth.png and results.json here")
    args = ap.parse_args()
    res = T2.run_check(n=args.n, n_boot=args.boot)
    print(T2.format_table(res))
    if args.out:
        print(json.dumps(T2.write_results(res, args.out)))


if __name__ == "__main__":
    main()
