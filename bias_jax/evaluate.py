"""Per-bias-type accuracy of a detector on closed-world samples.

``accuracy_by_type`` returns ``{"uni_image": acc, "balance": acc, "uni_text": acc, "overall":
acc}`` where ``acc = mean_b [ (logit_b > 0) == (label_b == REAL) ]`` over the samples of that
type (``overall`` over all of them, so it follows the spec's type mix). Evaluation samples come
from ``EVAL_SEED``, a seed no training run uses (training draws from ``TRAIN_SEED``).
"""

from __future__ import annotations

import numpy as np

from bias_jax import detectors as D
from bias_jax.data import closed_world as CW
from bias_jax.data import worlds as WD
from bias_jax.data.batch import BIAS_TYPES, REAL

TRAIN_SEED = 0  # closed-world seed of every training run (sample i of step s: i = s * B + b)
EVAL_SEED = 1_000_003  # held-out seed: a different key stream, never used for training


def predict(apply_fn, params, kind: str, batch, chunk: int = 256) -> np.ndarray:
    """float32 [B] logits of a detector of ``kind`` on a host ``Batch``, in fixed-size chunks
    (the last chunk is padded, so ``apply_fn`` compiles once)."""
    out = []
    n = batch.size
    for s in range(0, n, chunk):
        idx = np.arange(s, s + chunk) % n
        sub = batch.replace(image=batch.image[idx], tokens=batch.tokens[idx])
        image, tokens = D.detector_inputs(kind, sub)
        out.append(np.asarray(apply_fn(params, image, tokens))[: min(chunk, n - s)])
    return np.concatenate(out)


def accuracy_by_type(logits, labels, bias) -> dict:
    """Accuracy of ``logits > 0`` (predict real) against ``labels`` per bias type and overall;
    NaN for a type with no samples."""
    correct = (np.asarray(logits) > 0) == (np.asarray(labels) == REAL)
    bias = np.asarray(bias)
    res = {}
    for t, name in enumerate(BIAS_TYPES):
        sel = bias == t
        res[name] = float(correct[sel].mean()) if sel.any() else float("nan")
    res["overall"] = float(correct.mean())
    return res


def evaluate_detector(apply_fn, params, cfg: D.DetectorConfig, *, n: int, seed: int = EVAL_SEED,
                      spec: CW.WorldSpec | None = None, chunk: int = 256) -> dict:
    """``accuracy_by_type`` of one detector on basic closed-world samples 0..n-1 of ``seed``
    (``spec`` None: ``WorldSpec`` at its defaults with the detector's grid size, cell px and
    claim length)."""
    if n <= 0:
        raise ValueError(f"n must be positive, got {n}")
    spec = CW.WorldSpec(grid_size=cfg.grid_size, cell_px=cfg.cell_px,
                        max_tokens=cfg.max_tokens) if spec is None else spec
    logits, labels, bias = [], [], []
    for s in range(0, n, 4096):  # bounded host memory
        batch = D.closed_world_text(cfg, CW.load_closed_world(spec, seed, min(4096, n - s),
                                                              start=s))  # MiniLM: pieces
        logits.append(predict(apply_fn, params, cfg.kind, batch, chunk))
        labels.append(batch.label)
        bias.append(batch.bias)
    return accuracy_by_type(np.concatenate(logits), np.concatenate(labels),
                            np.concatenate(bias))


def evaluate_world(apply_fn, params, cfg: D.DetectorConfig, *, world: str | None = None, n: int,
                   seed: int = EVAL_SEED, spec=None, chunk: int = 256) -> dict:
    """Held-out accuracy of one detector on samples 0..n-1 of ``seed`` of a closed ``world``
    (None: ``data.worlds.DEFAULT_WORLD``, as everywhere else).

    ``"basic"``: ``evaluate_detector`` (per bias type and overall). ``"graded"``
    (``data.graded_world``; ``spec`` None = ``GradedSpec`` at its defaults with the detector's
    grid size, cell px and claim length): the same per bias type (the type of the exact
    annotation scores) and overall, plus ``"case:<name>"`` for each of ``graded_world.CASES``
    (NaN for a case with no samples)."""
    world = WD.DEFAULT_WORLD if world is None else world
    if world == "basic":
        return evaluate_detector(apply_fn, params, cfg, n=n, seed=seed, spec=spec, chunk=chunk)
    if world != "graded":
        raise ValueError(f"unknown world {world!r}; expected 'graded' or 'basic'")
    if n <= 0:
        raise ValueError(f"n must be positive, got {n}")
    from bias_jax.data import batch as BA
    from bias_jax.data import graded_world as GW

    if spec is None:
        spec = GW.GradedSpec(grid_size=cfg.grid_size, cell_px=cfg.cell_px,
                             max_tokens=cfg.max_tokens)
    logits, labels, bias, case = [], [], [], []
    for s in range(0, n, 4096):  # bounded host memory
        samples = GW.generate(spec, seed, s, min(4096, n - s))
        batch = D.closed_world_text(cfg, BA.to_numpy(GW.to_batch(samples, spec)))
        logits.append(predict(apply_fn, params, cfg.kind, batch, chunk))
        labels.append(batch.label)
        bias.append(batch.bias)
        case.append(np.asarray(samples.case))
    logits, labels = np.concatenate(logits), np.concatenate(labels)
    res = accuracy_by_type(logits, labels, np.concatenate(bias))
    correct = (logits > 0) == (labels == REAL)
    case = np.concatenate(case)
    for i, name in enumerate(GW.CASES):
        sel = case == i
        res[f"case:{name}"] = float(correct[sel].mean()) if sel.any() else float("nan")
    return res


__all__ = ["TRAIN_SEED", "EVAL_SEED", "predict", "accuracy_by_type", "evaluate_detector",
           "evaluate_world"]
