"""Quick end-to-end run on CPU: generate D_pure and D_spur, verify, print statistics, and score
the shipped reference models in the three evaluation regimes and the modality-bias detectors.

    python experiments/quickstart.py [--n N] [--eval-n M] [--out DIR]

Generates N samples per variant (both densities, every feasible bucket), checks them with the
independent verifier, prints the per-bucket table (answer balance, bag-of-words and
partial-logic shortcut accuracy, confuser coverage) beside the paper's numbers, exports a few
samples in the official GridVQA-X release layout, then evaluates ``checkpoints/m_pure`` and
``checkpoints/m_spur`` on M fresh held-out samples per density in the pure, spurious and cross
regimes (``gridvqa evaluate --regimes`` does the same at any size), and the shipped
modality-bias detectors of the basic world per bias type (``modality-bias detectors --world
basic --json``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from gridvqa_jax.training import export as EX
from gridvqa_jax.world import generate as G
from gridvqa_jax.formats import official
from gridvqa_jax.world import stats as St
from gridvqa_jax.world import universe as U
from gridvqa_jax.world import verify as V

PAPER_BOW = {"pure": 0.3607, "spur": 1.0}  # GridVQA-X: BoW shortcut predictive accuracy


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=3800, help="samples per variant")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-n", type=int, default=512,
                    help="held-out samples per density for each model-evaluation regime")
    ap.add_argument("--out", default=None, help="where to export official-format samples")
    args = ap.parse_args(argv)

    summary = {}
    for variant in ("pure", "spur"):
        acc, n_ok, n_all, t0 = St.StatsAccumulator(), 0, 0, time.perf_counter()
        for dkey in ("d03", "d07"):
            spec, dropped = U.Spec.feasible(variant, 5, U.DENSITIES[dkey])
            for why in dropped:
                print(f"[{variant}] left out: {why}")
            batch = G.to_numpy(G.generate_chunk(spec, args.seed, 0, args.n // 2))
            checks = V.verify(batch, spec)
            n_ok += int(np.sum(checks["ok"]))
            n_all += len(batch.bucket)
            acc.add(batch, spec, checks=checks)
        result = acc.result()
        print(f"\n== D_{variant}: {n_all} samples, {n_ok} pass verify "
              f"({time.perf_counter() - t0:.1f} s incl. compilation) ==")
        print(St.format_table(result))
        bow = result["_overall"]["bow_acc"]
        print(f"bag-of-words shortcut accuracy: ours {100 * bow:.2f}%  "
              f"paper {100 * PAPER_BOW[variant]:.2f}%")
        summary[variant] = {"n": n_all, "verify_pass": n_ok / n_all, "bow_acc": bow,
                            "paper_bow_acc": PAPER_BOW[variant]}

    out = Path(args.out) if args.out else Path(tempfile.mkdtemp()) / "official_sample"
    spec, _ = U.Spec.feasible("pure", 5, 0.7)
    batch = G.to_numpy(G.generate_chunk(spec, args.seed, 0, 2 * len(spec.buckets)))
    official.write_official(out, batch, spec)
    n_png = len(list(out.rglob("*.png")))
    print(f"\nexported {n_png} pure samples in the official release layout to {out}")
    summary["export"] = str(out)
    summary["devices"] = len(jax.devices())

    from gridvqa_jax import evaluate as E

    regimes = {}
    for name, model, data in E.REGIMES:
        apply_fn, params, _ = EX.load_reference_model(model)
        regimes[name] = E.evaluate_model(apply_fn, params, data, n=args.eval_n, progress=False)
    print(f"\n== reference models (checkpoints/m_pure, m_spur), {args.eval_n} held-out samples "
          "per density; pure = M_pure on D_pure, spurious = M_spur on D_spur, cross = M_spur "
          "on D_pure ==")
    print(E.format_table(regimes))
    summary["regimes"] = {k: v["overall"] for k, v in regimes.items()}

    from bias_jax import detectors as D
    from bias_jax import evaluate as BE

    print(f"\n== modality-bias detectors (checkpoints/bias_*), accuracy per bias type on "
          f"{args.eval_n} fresh closed-world samples ==")
    detectors = {}
    for name in ("image", "text", "joint", "lvlm"):
        apply_fn, params, cfg = D.load_detector(name)
        detectors[name] = BE.evaluate_detector(apply_fn, params, cfg, n=args.eval_n)
        print(f"{name:>6}: " + "  ".join(f"{k} {100 * v:5.1f}" for k, v in detectors[name].items()))
    summary["detectors"] = detectors
    print(json.dumps(summary))
    return 0 if all(summary[v]["verify_pass"] == 1.0 for v in ("pure", "spur")) else 1


if __name__ == "__main__":
    sys.exit(main())
