"""Table 1's MultiSHAP cell row with its samples in sample order and batched by question length
(``reproduction.table1.BY_LENGTH``), alternated in one process: evaluations and wall time.

    python experiments/multishap_batches_by_length.py [--n 64] [--coalitions 2]

Prints one line per run and a JSON list at the end; the second pair runs on compiled programs.
docs/results.md ("MultiSHAP on batches of similar question length") reports its numbers.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import numpy as np

from gridvqa_jax.explain.multishap import multishap_evaluations
from gridvqa_jax.world.scene import trim_tokens
from reproduction import table1 as T1


def evaluations(scenes, by_length: bool, batch: int, coalitions: int, length: int) -> int:
    """Model evaluations of the row over all batches (``multishap.multishap_evaluations``)."""
    order = T1.sample_order(scenes, by_length)
    n = len(order)
    return sum(multishap_evaluations(trim_tokens(jax.tree.map(lambda a: a[order[lo:lo + batch]],
                                                              scenes),
                                                 None if by_length else length), coalitions)
               for lo in range(0, n, batch))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--coalitions", type=int, default=2)
    p.add_argument("--batch", type=int, default=16)
    args = p.parse_args()
    samples = {v: T1.regime_scenes(v, args.n) for v in ("pure", "spur")}
    length = max(np.shape(trim_tokens(v).tokens)[-1] for v in samples.values())
    shipped = T1.BY_LENGTH
    rows = []
    for rep in range(2):
        for by_length in (False, True):
            T1.BY_LENGTH = shipped if by_length else ()
            t0 = time.perf_counter()
            res = T1.table1(args.n, explainers=("multishap",), regimes=("pure",),
                            batch=args.batch, data=samples,
                            budgets={"multishap": {"n_samples": args.coalitions}})
            rma = res["per_sample"]["multishap"]["pure"]["visual"]["pixel"]["rma"]
            rows.append({"run": rep, "by_length": by_length,
                         "wall_s": time.perf_counter() - t0,
                         "evaluations": evaluations(samples["pure"], by_length, args.batch,
                                                    args.coalitions, length),
                         "visual_rma": float(np.nanmean(rma))})
            print(rows[-1], flush=True)
    T1.BY_LENGTH = shipped
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
