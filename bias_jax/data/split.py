"""The modality-bias paper's data protocol (Appendix 12.1, Table 9).

"For a benchmark with a predefined Train / Valid / Test partition, we first randomly select 40%
of the samples from the Train set to fine-tune the models, and then perform sample-specific
modality bias analysis on the remaining 60% of the Train set, the Valid set and the Test set."
The fine-tuning part is itself split into ``Finetune_train`` / ``Finetune_valid``; Table 9's
counts give 10% for ``Finetune_valid`` on both benchmarks (Fakeddit 22,639 of 226,385;
MMFakeBench 400 of 4,000), which is our default.

Splits are index arrays (sorted, int64) into the source's record list or batch. They are a
function of (n, seed, labels) only, drawn with numpy's PCG64 (``default_rng([seed, stage])``),
so they are reproducible across machines and numpy versions that keep PCG64's stream.

Stratification: with ``labels`` the selection is stratified, so every class gets its share
(per-class quotas by largest remainder, summing exactly to ``round(frac * n)``); without, it is
a plain random subset. The paper says "randomly"; its Table 9 class ratios (e.g. Fakeddit
real share 39.5% in Finetune_train vs 39.4% in Analysis_train) are what either gives at that
scale. Stratified is the default in ``paper_splits`` whenever labels are passed.
"""

from __future__ import annotations

import numpy as np

FINETUNE_FRAC = 0.4
FINETUNE_VALID_FRAC = 0.1
SPLIT_NAMES = ("Finetune_train", "Finetune_valid", "Analysis_train", "Analysis_valid",
               "Analysis_test")


def _round(x: float) -> int:
    return int(np.floor(x + 0.5))


def select(n: int, frac: float, *, seed: int, labels=None, stage: int = 0):
    """Split range(n) into (chosen, rest): ``round(frac * n)`` chosen at random.

    ``labels`` (int [n]) stratifies the choice. Returns two sorted, disjoint int64 arrays whose
    union is range(n).
    """
    if not (isinstance(n, (int, np.integer)) and n >= 0):
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    if not 0.0 <= frac <= 1.0:
        raise ValueError(f"fraction must lie in [0, 1], got {frac!r}")
    rng = np.random.default_rng([int(seed), int(stage)])
    target = _round(frac * n)
    if labels is None:
        chosen = rng.permutation(n)[:target]
    else:
        labels = np.asarray(labels)
        if labels.shape != (n,):
            raise ValueError(f"labels must have shape ({n},), got {labels.shape}")
        classes, inverse = np.unique(labels, return_inverse=True)
        sizes = np.bincount(inverse, minlength=len(classes))
        exact = frac * sizes
        quota = np.floor(exact).astype(int)
        order = np.argsort(-(exact - quota), kind="stable")  # largest remainders first
        quota[order[: target - quota.sum()]] += 1
        chosen = np.concatenate([rng.permutation(np.flatnonzero(inverse == c))[:q]
                                 for c, q in enumerate(quota)] or [np.zeros(0, int)])
    mask = np.zeros(n, bool)
    mask[chosen] = True
    return np.flatnonzero(mask), np.flatnonzero(~mask)


def finetune_analysis_split(n: int, *, seed: int, labels=None, frac: float = FINETUNE_FRAC):
    """(finetune, analysis) indices of a Train set of n samples: 40% / 60% by default."""
    return select(n, frac, seed=seed, labels=labels, stage=0)


def paper_splits(n_train: int, n_valid: int = 0, n_test: int = 0, *, seed: int,
                 labels=None, finetune_frac: float = FINETUNE_FRAC,
                 finetune_valid_frac: float = FINETUNE_VALID_FRAC) -> dict[str, np.ndarray]:
    """The five subsets of Table 9 as index arrays.

    ``Finetune_train`` / ``Finetune_valid`` / ``Analysis_train`` index the Train set (n_train
    samples; ``labels`` [n_train] stratifies both draws); ``Analysis_valid`` and
    ``Analysis_test`` are the whole Valid and Test sets (``arange``; empty when absent).
    """
    if n_train <= 0:
        raise ValueError(f"the Train set is empty (n_train={n_train})")
    finetune, analysis = finetune_analysis_split(n_train, seed=seed, labels=labels,
                                                 frac=finetune_frac)
    sub = None if labels is None else np.asarray(labels)[finetune]
    valid_pos, train_pos = select(len(finetune), finetune_valid_frac, seed=seed, labels=sub,
                                  stage=1)
    return {"Finetune_train": finetune[train_pos], "Finetune_valid": finetune[valid_pos],
            "Analysis_train": analysis, "Analysis_valid": np.arange(n_valid),
            "Analysis_test": np.arange(n_test)}
