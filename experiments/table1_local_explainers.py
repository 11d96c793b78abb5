"""GridVQA-X Table 1: local explainers (MultiSHAP, DIME, MultiViz) and the random / objects /
oracle controls, scored by Relevance Mass Accuracy and Otsu IoU in three regimes (pure = M_pure
on D_pure, spurious = M_spur on D_spur, cross = M_spur on D_pure), printed beside the paper's
numbers, with the paper's four findings checked on our models.

    python experiments/table1_local_explainers.py --n 64 --players both --out results/table1

The arguments are those of ``gridvqa explain --regimes`` (``reproduction.table1.table1``; its
budgets default to ``table1.DEFAULT_BUDGETS``); ``experiments/table1_full.sh`` runs the budget
sweep, the full table at both granularities and the explainer benchmark in one go.
"""

from __future__ import annotations

import sys

from reproduction.cli import gridvqa


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    return gridvqa.main(["explain", "--regimes", *argv])


if __name__ == "__main__":
    sys.exit(main())
