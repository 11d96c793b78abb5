"""GridVQA-X Table 2 (accuracy rows): the paper's numbers beside ours.

The paper reports accuracy on D_pure, Mixed (M) questions, form 0 (count), density d07, at
depths 1-3 for M_pure, M_spur and two foundation VLMs. We evaluate the shipped reference models
(``checkpoints/m_pure``, ``checkpoints/m_spur``) on held-out D_pure data; the VLM rows are the
paper's (score a VLM of your own with ``gridvqa_jax.evaluate.evaluate_callable``).

    python experiments/model_accuracy.py [--n 4096] [--cell-px 64] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys

from gridvqa_jax.training import export as EX
from gridvqa_jax import evaluate as E

PAPER = {  # accuracy (%) on D_pure, Mixed form 0 d07, depths 1 / 2 / 3
    "M_pure": (100, 100, 100),
    "M_spur": (6, 2, 0),
    "Qwen3-VL": (14, 10, 10),
    "LLaVA": (6, 28, 30),
}
KEYS = ("D1_M_F0_d07", "D2_M_F0_d07", "D3_M_F0_d07")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=4096, help="held-out D_pure d07 samples")
    p.add_argument("--cell-px", type=int, default=64, help="image resolution (official: 64)")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)

    ours = {}
    for row, name in (("M_pure", "pure"), ("M_spur", "spur")):
        apply_fn, params, _ = EX.load_reference_model(name)
        res = E.evaluate_model(apply_fn, params, "pure", n=args.n, densities=("d07",),
                               cell_px=args.cell_px, progress=sys.stderr.isatty())
        ours[row] = [100 * res["buckets"].get(k, float("nan")) for k in KEYS]
    print("Table 2 (accuracy, %): D_pure, Mixed, form 0 (count), d07")
    print(f"{'model':<10} {'source':<6} {'depth 1':>8} {'depth 2':>8} {'depth 3':>8}")
    for row, vals in PAPER.items():
        print(f"{row:<10} {'paper':<6} " + " ".join(f"{v:8.0f}" for v in vals))
        if row in ours:
            print(f"{row:<10} {'ours':<6} " + " ".join(f"{v:8.1f}" for v in ours[row]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"paper": PAPER, "ours": ours, "buckets": KEYS, "n": args.n}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
