"""``modality-bias`` command line: train detectors, evaluate the shipped ones.

    modality-bias train --detector {image,text,joint,lvlm} --data closed_world --out DIR
                        [--resume] [--steps N] [--export DIR]
    modality-bias detectors --n N [--json] [--root DIR]

``--json`` prints one JSON object as the last line of stdout.
"""

from __future__ import annotations

import argparse
import json
import sys

# Per-detector training defaults (steps, batch size, peak learning rate): the settings the
# shipped checkpoints/bias_* were trained with.
TRAIN_DEFAULTS = {"image": (4000, 64, 2e-3), "text": (1200, 64, 2e-3),
                  "joint": (3000, 64, 2e-3), "lvlm": (4000, 64, 1e-3)}


def _cmd_train(args) -> int:
    from bias_jax import detectors as D
    from bias_jax import train as T

    steps, batch, lr = TRAIN_DEFAULTS[args.detector]
    det = D.DetectorConfig(kind=args.detector)
    cfg = T.TrainConfig(detector=det, data=args.data, steps=args.steps or steps,
                        batch_size=args.batch_size or batch, lr=args.lr or lr,
                        init_seed=args.seed, save_every=args.save_every,
                        eval_every=args.eval_every, eval_n=args.eval_n)
    log = (lambda *a, **k: print(*a, file=sys.stderr, **k)) if args.json else print
    res = T.train(cfg, args.out, resume=args.resume, export=args.export,
                  progress=not args.no_progress, log=log)
    res.pop("params")
    if args.json:
        print(json.dumps(res, default=str))
    else:
        print(f"done: {res['steps_done']} steps in {res['wall_s']:.0f} s; eval {res['eval']}")
    return 0


def _cmd_detectors(args) -> int:
    from pathlib import Path

    from bias_jax import detectors as D
    from bias_jax import evaluate as E

    table = {}
    for name in args.detectors:
        path = Path(args.root) / D.SHIPPED[name] if args.root else name
        apply_fn, params, cfg = D.load_detector(path)
        if cfg.kind != name:
            raise SystemExit(f"error: {path} holds a {cfg.kind!r} detector, expected {name!r}")
        table[name] = E.evaluate_detector(apply_fn, params, cfg, n=args.n, seed=args.seed)
        if not args.json:
            print(f"{name:>6}: " + "  ".join(f"{k} {v:.4f}" for k, v in table[name].items()))
    if args.json:
        print(json.dumps(table))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``modality-bias`` parser: subcommands ``train`` and ``detectors``, each setting
    ``func``. ``--steps`` / ``--batch-size`` / ``--lr`` default to None, filled per detector
    from ``TRAIN_DEFAULTS``."""
    from bias_jax import detectors as D
    from bias_jax import evaluate as E
    from bias_jax import train as T

    p = argparse.ArgumentParser(prog="modality-bias", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    t = sub.add_parser("train", help="train a detector (Orbax checkpoints, metrics.jsonl)")
    t.add_argument("--detector", required=True, choices=D.KINDS)
    t.add_argument("--data", default="closed_world", choices=T.DATA_SOURCES)
    t.add_argument("--out", required=True, help="run directory (checkpoints, metrics)")
    t.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    t.add_argument("--steps", type=int, default=None, help="default: per detector")
    t.add_argument("--batch-size", type=int, default=None)
    t.add_argument("--lr", type=float, default=None)
    t.add_argument("--seed", type=int, default=0, help="parameter initialisation seed")
    t.add_argument("--save-every", type=int, default=250)
    t.add_argument("--eval-every", type=int, default=0)
    t.add_argument("--eval-n", type=int, default=1000, help="held-out samples at each eval")
    t.add_argument("--export", default=None, help="write params.msgpack + config.json here")
    t.add_argument("--no-progress", action="store_true")
    t.add_argument("--json", action="store_true")
    t.set_defaults(func=_cmd_train)

    d = sub.add_parser("detectors", help="per-bias-type accuracy of the shipped detectors on "
                                         "fresh held-out closed-world samples")
    d.add_argument("--n", type=int, default=2000)
    d.add_argument("--seed", type=int, default=E.EVAL_SEED, help="held-out data seed")
    d.add_argument("--root", default=None, help="directory holding bias_<name>/ exports "
                                                "(default: the shipped checkpoints/)")
    d.add_argument("--detectors", nargs="+", default=list(D.KINDS), choices=D.KINDS)
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=_cmd_detectors)
    return p


def main(argv=None) -> int:
    """Run the command line on ``argv`` (default ``sys.argv[1:]``); returns the exit status.

    ValueError, FileNotFoundError and FloatingPointError (non-finite loss) are printed as
    ``error: ...`` on stderr and give status 2 instead of a traceback."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, FloatingPointError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
