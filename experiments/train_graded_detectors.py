"""Train, ship and tabulate the label-only generic detectors of the graded world (issue 25,
point 2: "detectors like the paper's").

    python experiments/train_graded_detectors.py train [--runs DIR] [--kinds K ...] [--sets a b]
                                                       [--steps N]
    python experiments/train_graded_detectors.py ship  [--runs DIR] [--lengths N ...]
    python experiments/train_graded_detectors.py table [--n 2000] [--seed S] [--json]

``train``: one run per kind (image, text, joint, lvlm; ``DetectorConfig(arch="generic")``,
``ARCH`` sizes) on the graded world at its default case mix, labels only (no grounding loss:
``TrainConfig.grounded`` is False for arch generic and for the graded world), ``STEPS`` steps of
batch ``BATCH[kind]`` at peak rate ``LR[kind]``, with snapshots at ``snapshot_steps(steps)``
(``SNAPSHOT_GRID`` below the run's length, and its last step: ``ship`` reads ``steps_3000``)
exported under ``DIR/<set>/<kind>/snapshots/steps_<s>/`` (each with its held-out evaluation on
500 samples of ``EVAL_SEED``). Set ``a``: init seed 0; set ``b``: init seed 1, the same
config, for the paper's detector-induced fluctuation. A run is resumed
from its Orbax checkpoint when its directory exists (``train.train(resume=True)``), so the
command can be re-run after a kill.

``ship``: copies the snapshots at ``detectors.TRAINING_LENGTHS`` (or ``--lengths``) of set ``a``
to ``checkpoints/graded/steps_<N>/bias_<kind>/`` and set ``b``'s last one to
``checkpoints/graded/steps_<N>_b/bias_<kind>/`` (what ``detectors.shipped_set("graded", N,
second)`` loads), re-evaluated on ``TABLE_N`` held-out samples of ``EVAL_SEED`` (per type and
per graded case, ``evaluate.evaluate_world``) and that table stored in the export's
``config.json`` under ``"heldout"``.

``table``: the per-type / per-case accuracy of every shipped graded detector on ``--n``
held-out samples of ``--seed`` (default ``EVAL_SEED``, no training run draws from it).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

KINDS = ("image", "text", "joint", "lvlm")
# generic architecture sizes (every kind): small enough for CPU training and < 1 MB exports
ARCH = dict(d_model=64, mlp_dim=128, n_layers=2, n_heads=4)
STEPS = 3000  # training length of every run (the cosine schedule's end)
SNAPSHOTS = (25, 50, 100, 150, 200, 300, 400, 600, 800, 1000)
# snapshot steps of a longer run (``train --steps N``): these below N, and N
SNAPSHOT_GRID = SNAPSHOTS + (1500, 2000, 3000, 4000, 6000, 8000, 12000, 16000)
TRAIN_ORDER = ("joint", "lvlm", "image", "text")  # the slowest and most informative first
LR = {"image": 1e-3, "text": 1e-3, "joint": 3e-4, "lvlm": 3e-4}
# batch per kind: the cross-modal kinds learn the balance case only with larger batches and a
# lower peak rate (docs/results.md: 53% of it at batch 64 / lr 1e-3, 73% at 256 / 3e-4)
BATCH = {"image": 64, "text": 64, "joint": 256, "lvlm": 256}
SEEDS = {"a": 0, "b": 1}  # init seed of each set
TABLE_N = 2000  # held-out samples of the shipped table


def snapshot_steps(steps: int) -> tuple:
    """The snapshot steps of a ``steps``-step run: ``SNAPSHOT_GRID`` below ``steps``, then
    ``steps``."""
    return tuple(s for s in SNAPSHOT_GRID if s < steps) + (int(steps),)


def train_config(kind: str, init_seed: int, steps: int = STEPS):
    """The ``TrainConfig`` of one run (graded world, arch generic, labels only; a cosine
    schedule ending at ``steps``)."""
    from bias_jax import detectors as D
    from bias_jax import train as BT

    det = D.DetectorConfig(kind=kind, arch="generic", **ARCH)
    return BT.TrainConfig(detector=det, world="graded", steps=steps, batch_size=BATCH[kind],
                          lr=LR[kind], warmup=100, init_seed=init_seed, save_every=250,
                          log_every=50, eval_n=500, snapshot_steps=snapshot_steps(steps))


def cmd_train(args) -> int:
    from bias_jax import train as BT

    for set_name in args.sets:
        for kind in args.kinds:
            cfg = train_config(kind, SEEDS[set_name], args.steps)
            out = Path(args.runs) / set_name / kind
            snaps = out / "snapshots"
            if set_name == "b":  # the second set is shipped at the longest length only
                cfg = dataclasses.replace(cfg, snapshot_steps=(args.steps,))
            res = BT.train(cfg, out, resume=(out / "train_config.json").is_file(),
                           snapshot_dir=snaps, progress=False,
                           log=lambda *a, **k: print(*a, **k, flush=True))
            print(f"[{set_name}/{kind}] done: {res['steps_done']} steps in {res['wall_s']:.0f} s;"
                  f" eval {res['eval']}", flush=True)
    return 0


def cmd_ship(args) -> int:
    import jax

    from bias_jax import detectors as D
    from bias_jax import evaluate as BE

    lengths = tuple(args.lengths or D.TRAINING_LENGTHS)
    jobs = [("a", n, D.graded_set_dir(n, False)) for n in lengths]
    jobs.append(("b", max(lengths), D.graded_set_dir(max(lengths), True)))
    for set_name, n, dest_root in jobs:
        for kind in KINDS:
            src = Path(args.runs) / set_name / kind / "snapshots" / f"steps_{n}"
            apply_fn, params, cfg = D.load_detector(src)
            doc = json.loads((src / "config.json").read_text())
            res = BE.evaluate_world(apply_fn, params, cfg, world="graded", n=TABLE_N,
                                    seed=BE.EVAL_SEED)
            meta = {"train": doc["train"], "snapshot": doc["snapshot"],
                    "heldout": {"world": "graded", "n": TABLE_N, "seed": BE.EVAL_SEED, **res}}
            D.export_detector(dest_root / D.SHIPPED[kind], jax.device_get(params), cfg, meta,
                              overwrite=True)
            print(f"{dest_root.name}/{kind}: " + "  ".join(f"{k} {v:.3f}" for k, v in res.items()),
                  flush=True)
    return 0


def shipped_table(n: int, seed: int) -> list[dict]:
    """One row per shipped graded detector: ``{"set", "steps", "second", "kind", **acc}``
    with ``acc = evaluate.evaluate_world(..., world="graded", n=n, seed=seed)`` (per type,
    overall, per case)."""
    from bias_jax import detectors as D
    from bias_jax import evaluate as BE

    rows = []
    sets = [(s, False) for s in D.TRAINING_LENGTHS] + [(max(D.TRAINING_LENGTHS), True)]
    for steps, second in sets:
        for kind, (apply_fn, params, cfg) in D.shipped_set("graded", steps, second).items():
            acc = BE.evaluate_world(apply_fn, params, cfg, world="graded", n=n, seed=seed)
            rows.append({"set": D.graded_set_dir(steps, second).name, "steps": steps,
                         "second": second, "kind": kind, **acc})
    return rows


def bayes_rows(n: int, seed: int) -> list[dict]:
    """The Bayes ceiling of each kind on the same held-out samples: the expected accuracy
    ``max(p, 1 - p)`` of the exact posterior of what the kind reads (``GradedSample.posteriors``:
    P(real | image) for image, P(real | text) for text, P(real | image, text) for joint and
    lvlm), averaged per type, overall and per case as ``evaluate.evaluate_world`` does."""
    import numpy as np

    from bias_jax.data import graded_world as GW
    from bias_jax.data.batch import BIAS_TYPES

    spec = GW.GradedSpec()
    s = GW.generate(spec, seed, 0, n)
    post, bias, case = (np.asarray(x) for x in (s.posteriors, s.bias, s.case))
    rows = []
    for kind, col in (("image", 0), ("text", 1), ("joint / lvlm", 2)):
        acc = np.maximum(post[:, col], 1.0 - post[:, col])
        row = {"set": "Bayes", "steps": None, "second": False, "kind": kind}
        row.update({t: float(acc[bias == i].mean()) for i, t in enumerate(BIAS_TYPES)})
        row["overall"] = float(acc.mean())
        row.update({f"case:{c}": float(acc[case == i].mean()) if (case == i).any()
                    else float("nan") for i, c in enumerate(GW.CASES)})
        rows.append(row)
    return rows


def format_table(rows: list[dict]) -> str:
    """Markdown table of ``shipped_table`` rows (accuracies in %)."""
    keys = [k for k in rows[0] if k not in ("set", "steps", "second", "kind")]
    head = "| set | kind | " + " | ".join(keys) + " |"
    lines = [head, "|" + "---|" * (len(keys) + 2)]
    for r in rows:
        lines.append(f"| {r['set']} | {r['kind']} | "
                     + " | ".join(f"{100 * r[k]:.1f}" for k in keys) + " |")
    return "\n".join(lines)


def cmd_table(args) -> int:
    from bias_jax import evaluate as BE

    seed = BE.EVAL_SEED if args.seed is None else args.seed
    rows = shipped_table(args.n, seed) + bayes_rows(args.n, seed)
    print(json.dumps(rows) if args.json else format_table(rows))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--runs", default=str(ROOT / "runs" / "graded_detectors"))
    t.add_argument("--kinds", nargs="+", default=list(TRAIN_ORDER), choices=KINDS)
    t.add_argument("--sets", nargs="+", default=["a", "b"], choices=sorted(SEEDS))
    t.add_argument("--steps", type=int, default=STEPS,
                   help=f"training length of every run (default {STEPS}; snapshots: "
                   "SNAPSHOT_GRID below it, and it)")
    s = sub.add_parser("ship")
    s.add_argument("--runs", default=str(ROOT / "runs" / "graded_detectors"))
    s.add_argument("--lengths", nargs="+", type=int, default=None)
    tb = sub.add_parser("table")
    tb.add_argument("--n", type=int, default=TABLE_N)
    tb.add_argument("--seed", type=int, default=None)
    tb.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    return {"train": cmd_train, "ship": cmd_ship, "table": cmd_table}[args.cmd](args)


if __name__ == "__main__":
    raise SystemExit(main())
