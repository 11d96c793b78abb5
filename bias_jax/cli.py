"""``modality-bias`` command line: train detectors, evaluate the shipped ones.

    modality-bias train --detector {image,text,joint,lvlm} --data closed_world --out DIR
                        [--resume] [--steps N] [--export DIR [--overwrite]]
    modality-bias detectors --n N [--json] [--root DIR]

Output flags as in ``gridvqa`` (``gridvqa_jax.core.cli_support``): ``--json`` prints one JSON
object as the last line of stdout, ``--quiet`` drops the human output and progress bars,
``--no-progress`` the progress bars only. Bad input ends with one line
``modality-bias <command>: error: <message>`` on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys

from gridvqa_jax.core import cli_support as C
from gridvqa_jax.core.errors import InputError

# Per-detector training defaults (steps, batch size, peak learning rate): the settings the
# shipped checkpoints/bias_* were trained with.
TRAIN_DEFAULTS = {"image": (4000, 64, 2e-3), "text": (1200, 64, 2e-3),
                  "joint": (3000, 64, 2e-3), "lvlm": (4000, 64, 1e-3)}


def _cmd_train(args) -> int:
    from bias_jax import detectors as D
    from bias_jax import train as T

    steps, batch, lr = TRAIN_DEFAULTS[args.detector]
    det = D.DetectorConfig(kind=args.detector)
    given = lambda value, default: default if value is None else value  # noqa: E731
    cfg = T.TrainConfig(detector=det, data=args.data, steps=given(args.steps, steps),
                        batch_size=given(args.batch_size, batch), lr=given(args.lr, lr),
                        init_seed=args.seed, save_every=args.save_every,
                        eval_every=args.eval_every, eval_n=args.eval_n)
    if args.quiet:
        log = lambda *a, **k: None  # noqa: E731
    else:
        log = (lambda *a, **k: print(*a, file=sys.stderr, **k)) if args.json else print
    res = T.train(cfg, args.out, resume=args.resume, export=args.export,
                  overwrite=args.overwrite, progress=C.show_progress(args), log=log)
    res.pop("params")
    if args.json:
        print(json.dumps(res, default=str))
    elif not args.quiet:
        print(f"done: {res['steps_done']} steps in {res['wall_s']:.0f} s; eval {res['eval']}")
    return 0


def _cmd_detectors(args) -> int:
    from pathlib import Path

    from bias_jax import detectors as D
    from bias_jax import evaluate as E

    if args.root and not Path(args.root).is_dir():
        raise InputError(f"--root {args.root} is not a directory (expected a directory "
                         f"holding {', '.join(D.SHIPPED[k] + '/' for k in args.detectors)})")
    table = {}
    for name in args.detectors:
        path = Path(args.root) / D.SHIPPED[name] if args.root else name
        apply_fn, params, cfg = D.load_detector(path)
        if cfg.kind != name:
            raise InputError(f"{path} holds a {cfg.kind!r} detector, expected {name!r}")
        table[name] = E.evaluate_detector(apply_fn, params, cfg, n=args.n, seed=args.seed)
        if not (args.json or args.quiet):
            print(f"{name:>6}: " + "  ".join(f"{k} {v:.4f}" for k, v in table[name].items()))
    if args.json:
        print(json.dumps(table))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``modality-bias`` parser: subcommands ``train`` and ``detectors``, each setting
    ``fn``. ``--steps`` / ``--batch-size`` / ``--lr`` default to None, filled per detector
    from ``TRAIN_DEFAULTS``."""
    from bias_jax import detectors as D
    from bias_jax import evaluate as E
    from bias_jax import train as T

    p = C.Parser(prog="modality-bias", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    t = sub.add_parser("train", help="train a detector (Orbax checkpoints, metrics.jsonl)")
    t.add_argument("--detector", required=True, choices=D.KINDS)
    t.add_argument("--data", default="closed_world", choices=T.DATA_SOURCES)
    t.add_argument("--out", required=True, help="run directory (checkpoints, metrics)")
    t.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    t.add_argument("--steps", type=C.positive_int, default=None, help="default: per detector")
    t.add_argument("--batch-size", type=C.positive_int, default=None)
    t.add_argument("--lr", type=C.positive_float, default=None)
    t.add_argument("--seed", type=int, default=0, help="parameter initialisation seed")
    t.add_argument("--save-every", type=C.positive_int, default=250)
    t.add_argument("--eval-every", type=C.nonnegative_int, default=0)
    t.add_argument("--eval-n", type=C.nonnegative_int, default=1000,
                   help="held-out samples at each eval (0 = none)")
    t.add_argument("--export", default=None, help="write params.msgpack + config.json here")
    t.add_argument("--overwrite", action="store_true",
                   help="let --export replace an existing export (refused otherwise)")
    C.add_output_flags(t)
    t.set_defaults(fn=_cmd_train)

    d = sub.add_parser("detectors", help="per-bias-type accuracy of the shipped detectors on "
                                         "fresh held-out closed-world samples")
    d.add_argument("--n", type=C.positive_int, default=2000)
    d.add_argument("--seed", type=int, default=E.EVAL_SEED, help="held-out data seed")
    d.add_argument("--root", default=None, help="directory holding bias_<name>/ exports "
                                                "(default: the shipped checkpoints/)")
    d.add_argument("--detectors", nargs="+", default=list(D.KINDS), choices=D.KINDS)
    C.add_output_flags(d)
    d.set_defaults(fn=_cmd_detectors)
    return p


def main(argv=None) -> int:
    """Run the command line on ``argv`` (default ``sys.argv[1:]``); returns the exit status.

    An expected failure (bad input, a missing or corrupt file, a non-finite loss) prints
    ``modality-bias <command>: error: <message>`` on stderr and returns 2 instead of a
    traceback (``cli_support.main``)."""
    return C.main(build_parser(), argv, lambda a: f"modality-bias {a.cmd}")


if __name__ == "__main__":
    sys.exit(main())
