"""``gridvqa`` command line: generate, verify, stats, bench, train, evaluate, synergy, explain and reproduce (a thin shell over the library).

Each subcommand registers its arguments in ``add_<command>_parser`` beside its handler
``cmd_<command>``; ``COMMANDS`` lists them. ``bench`` has sub-subcommands: ``gridvqa bench
generate | synergy | explainers``.

Every subcommand prints a human summary and, with ``--json``, one JSON object as its last line;
``--quiet`` drops the summary and progress bars, ``--no-progress`` the progress bars only. Bad
input (an unknown name, a missing or malformed file, an impossible size) ends with one line
``gridvqa <command>: error: <message>`` on stderr and exit status 2 (``mmx_base.cli_support``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from mmx_base import cli_support as CS
from mmx_base.errors import InputError


def _progress(total, desc, enabled=True):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="sample", disable=not enabled, file=sys.stderr,
                dynamic_ncols=True)


_emit = CS.emit


# ----------------------------------------------------------------------------------------------
def add_generate_parser(p) -> None:
    """Arguments of `gridvqa generate`."""
    from gridvqa_jax.world import universe as U

    pos = CS.positive_int
    p.add_argument("--variant", choices=U.VARIANTS, required=True)
    p.add_argument("--n", type=pos, required=True, help="number of samples")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--density", nargs="+", choices=sorted(U.DENSITIES), default=["d07"],
                   help="one or more density keys; samples are split evenly")
    p.add_argument("--format", choices=("official", "native"), default="official")
    p.add_argument("--out", required=True)
    p.add_argument("--split", default="val", help="split name in official file names")
    p.add_argument("--depth", type=int, choices=(1, 2, 3))
    p.add_argument("--qtype", choices=U.QTYPES)
    p.add_argument("--form", type=int, choices=(0, 1))
    p.add_argument("--grid-size", type=pos, default=5)
    p.add_argument("--cell-px", type=pos, default=64)
    p.add_argument("--chunk", type=pos, default=16384, help="samples generated per device call")


def cmd_generate(args) -> int:
    """`gridvqa generate`: sample a dataset and write it (official or native layout)."""
    from gridvqa_jax.world import generate as G
    from gridvqa_jax.formats import native, official
    from gridvqa_jax.world import universe as U

    specs, dropped = [], []
    for dkey in args.density:
        spec, why = U.Spec.feasible(args.variant, args.grid_size, U.DENSITIES[dkey], args.cell_px,
                                    depth=args.depth, qtype=args.qtype, form=args.form)
        specs.append(spec)
        dropped += why
    if args.n < len(specs):
        raise InputError(f"--n {args.n} is less than the {len(specs)} densities it is split over")
    for why in dropped:
        print(f"note: bucket left out: {why}", file=sys.stderr)
    # Samples are split evenly over densities; sample ids stay distinct by offsetting the index.
    shares = [args.n // len(specs) + (i < args.n % len(specs)) for i in range(len(specs))]
    out = Path(args.out)
    bar = _progress(args.n, f"generate {args.variant}", CS.show_progress(args))
    if args.format == "native":
        parts = []
        # One native dataset per density; several densities go to subdirectories of a staged
        # parent that appears only when every part is complete.
        with native.staged_dir(out) as root:
            for i, (spec, n) in enumerate(zip(specs, shares)):
                target = root if len(specs) == 1 else root / spec.density_key
                w = native.NativeWriter(target, spec, args.seed,
                                        meta={"index_offset": sum(shares[:i])}, atomic=False)
                for _, chunk in G.iter_chunks(spec, args.seed, n, args.chunk,
                                              start=sum(shares[:i])):
                    w.add(G.to_numpy(chunk))
                    bar.update(len(chunk.bucket))
                w.close()
                parts.append(str(out if len(specs) == 1 else out / spec.density_key))
    else:
        with official.OfficialWriter(out, specs[0], split=args.split) as w:
            for i, (spec, n) in enumerate(zip(specs, shares)):
                for off, chunk in G.iter_chunks(spec, args.seed, n, args.chunk,
                                                start=sum(shares[:i])):
                    w.add(G.to_numpy(chunk), spec=spec)
                    bar.update(len(chunk.bucket))
        parts = [str(out)]
    bar.close()
    payload = {"out": str(out), "format": args.format, "variant": args.variant, "n": args.n,
               "seed": args.seed, "densities": args.density, "parts": parts,
               "buckets": [U.BUCKETS[b].name for b in sorted({b for s in specs for b in s.buckets})],
               "buckets_left_out": dropped}
    _emit(args, f"wrote {args.n} {args.variant} samples ({args.format}) to {out}", payload)
    return 0


# ----------------------------------------------------------------------------------------------
def add_dataset_parser(p) -> None:
    """Arguments of `gridvqa verify DIR` and `gridvqa stats DIR`."""
    from gridvqa_jax.world import universe as U

    p.add_argument("dir")
    p.add_argument("--variant", choices=U.VARIANTS,
                   help="override the variant recorded with the data (needed only when "
                        "nothing records it and the samples do not tell)")
    p.add_argument("--chunk", type=CS.positive_int, default=8192)


def cmd_verify(args) -> int:
    """`gridvqa verify DIR`: per-sample checks of a dataset; rc 1 if any sample fails."""
    from gridvqa_jax.formats.datasets import iter_batches
    from gridvqa_jax.world import verify as V

    parts = _dataset_with_variant(args)
    totals, failures, n = {}, [], 0
    for part in parts:
        base, spec, source = n, part.spec(), part.source
        for i, chunk in enumerate(iter_batches(part.batch, args.chunk)):
            res = {k: np.asarray(v) for k, v in V.verify(chunk, spec).items()}
            for k, v in res.items():
                totals[k] = totals.get(k, 0) + int(np.sum(v))
            for j in np.flatnonzero(~res["ok"])[: max(0, 20 - len(failures))]:
                failures.append({"index": int(base + i * args.chunk + j), "source": source,
                                 "failed": [k for k in V.CHECKS if not res[k][j]]})
            n += len(chunk.bucket)
    if n == 0:
        raise InputError(f"{args.dir} holds no samples")
    rates = {k: totals[k] / n for k in totals}
    human = "\n".join([f"verified {n} samples in {args.dir}"] +
                      [f"  {k:<18} {100 * r:8.4f}% pass" for k, r in rates.items()])
    payload = {"n": n, "pass": rates, "all_pass": totals["ok"] == n, "first_failures": failures,
               "variant": ",".join(sorted({p.variant for p in parts}))}
    _emit(args, human, payload)
    return 0 if totals["ok"] == n else 1


def cmd_stats(args) -> int:
    """`gridvqa stats DIR`: per-bucket answer, shortcut and confuser statistics."""
    from gridvqa_jax.formats.datasets import iter_batches
    from gridvqa_jax.world import stats as St

    acc = St.StatsAccumulator()
    for part in _dataset_with_variant(args):
        for chunk in iter_batches(part.batch, args.chunk):
            acc.add(chunk, part.spec())
    result = acc.result()
    if not result:
        raise InputError(f"{args.dir} holds no samples")
    _emit(args, St.format_table(result), result)
    return 0


def _dataset_with_variant(args):
    """``load_dataset(args.dir, args.variant)`` with an unrecorded variant inferred from the
    samples (``datasets.infer_variant``); a note on stderr says when it was inferred."""
    from gridvqa_jax.formats.datasets import infer_variant, load_dataset

    parts, how = infer_variant(load_dataset(args.dir, args.variant), args.chunk)
    if how != "recorded" and not args.quiet:
        print(f"note: variant {parts[0].variant} {how}", file=sys.stderr)
    return parts


# `gridvqa bench generate|synergy|explainers`. So that invocations written for the single
# `bench` parser these replace keep working, each sub-subcommand also accepts (hidden) every flag
# that parser took: its own prefixed ones (`--synergy-n`) alias its unprefixed ones, another
# bench's flags are accepted and ignored, as that parser ignored them.
_BENCH_LEGACY = (  # (flag, type, {sub-subcommand: dest it aliases})
    ("--variant", "variant", {"generate": "variant"}),
    ("--grid-size", "pos", {"generate": "grid_size"}),
    ("--batch", "pos", {"generate": "batch"}),
    ("--render-batch", "pos", {"generate": "render_batch"}),
    ("--render-chunk", "pos", {"generate": "render_chunk"}),
    ("--export-n", "pos", {"generate": "export_n"}),
    ("--synergy-n", "pos", {"synergy": "n"}),
    ("--synergy-chunk", "pos", {"synergy": "chunk"}),
    ("--explainers-batch", "pos", {"explainers": "batch"}),
    ("--explainers-budget", "pos", {"explainers": "budget"}),
    ("--mae-budget", "pos", {"explainers": "mae_budget"}),
)


def _add_bench_legacy_flags(p, what: str) -> None:
    """The old single-parser `bench` flags on sub-subcommand ``what`` (hidden, see above)."""
    from gridvqa_jax.world import universe as U

    kinds = {"pos": {"type": CS.positive_int}, "variant": {"choices": U.VARIANTS}}
    taken = {s for a in p._actions for s in a.option_strings}
    for flag, kind, aliases in _BENCH_LEGACY:
        if flag in taken:
            continue
        dest = aliases.get(what, "legacy_" + flag[2:].replace("-", "_"))
        p.add_argument(flag, dest=dest, default=argparse.SUPPRESS, help=argparse.SUPPRESS,
                       **kinds[kind])


def _add_data_flags(p, pure: str, which: str, spur: str) -> None:
    """``--pure-data DIR`` / ``--spur-data DIR``: a command's D_pure / D_spur from disk."""
    p.add_argument("--pure-data", metavar="DIR", default=None,
                   help=f"draw {pure} from this dataset (any layout `gridvqa verify` reads, "
                        f"e.g. the official release): {which} (default: generate them from "
                        "--seed)")
    p.add_argument("--spur-data", metavar="DIR", default=None,
                   help=f"draw {spur} from this dataset, as --pure-data")


def add_bench_generate_parser(p) -> None:
    """Arguments of `gridvqa bench generate`."""
    from gridvqa_jax.world import universe as U

    pos = CS.positive_int
    p.add_argument("--variant", choices=U.VARIANTS, default="pure")
    p.add_argument("--grid-size", type=pos, default=5)
    p.add_argument("--batch", type=pos, default=65536, help="scenes per symbolic timing")
    p.add_argument("--render-batch", type=pos, default=512, help="scenes rendered per timing")
    p.add_argument("--render-chunk", type=pos, default=64,
                   help="scenes per renderer call (render.iter_images)")
    p.add_argument("--export-n", type=pos, default=512, help="samples written per export timing")
    _add_bench_legacy_flags(p, "generate")


def add_bench_synergy_parser(p) -> None:
    """Arguments of `gridvqa bench synergy`."""
    p.add_argument("--n", type=CS.positive_int, default=32, help="N-set size")
    p.add_argument("--chunk", type=CS.positive_int, default=None,
                   help="pairs per call (default: 64 on CPU, 2048 on GPU/TPU)")
    _add_bench_legacy_flags(p, "synergy")


def add_bench_explainers_parser(p) -> None:
    """Arguments of `gridvqa bench explainers`."""
    pos = CS.positive_int
    p.add_argument("--batch", type=pos, default=8, help="samples per explainer call")
    p.add_argument("--budget", type=pos, default=2048,
                   help="coalition evaluations per estimator call")
    p.add_argument("--mae-budget", type=pos, default=1000,
                   help="evaluations per estimator on the 12-player game")
    _add_bench_legacy_flags(p, "explainers")


def cmd_bench_generate(args) -> int:
    """`gridvqa bench generate`: symbolic, render and export throughput."""
    from reproduction import bench
    from gridvqa_jax.world import universe as U

    spec = U.Spec.feasible(args.variant, args.grid_size, 0.7)[0]
    res = bench.bench_generate(batch=args.batch, render_batch=args.render_batch,
                               export_n=args.export_n, spec=spec, render_chunk=args.render_chunk)
    human = "\n".join(f"  {k:<28} {v}" for k, v in res.items())
    _emit(args, "bench generate\n" + human, res)
    return 0


def cmd_bench_synergy(args) -> int:
    """`gridvqa bench synergy`: EMAP pairs/s against the raw forward, PID tables/s."""
    from reproduction import bench

    res = bench.bench_synergy(n=args.n, chunk=args.chunk)
    _emit(args, "bench synergy\n" + "\n".join(f"  {k:<28} {v}" for k, v in res.items()), res)
    return 0


def _bucket_factor(text: str) -> tuple[str, int]:
    """``"D3_CMP_F0=8"`` -> ("D3_CMP_F0", 8)."""
    name, sep, k = text.partition("=")
    if not sep or not k.strip().isdigit():
        raise InputError(f"--oversample expects BUCKET=K (e.g. D3_CMP_F0=8), got {text!r}")
    return name.strip(), int(k)


def add_train_parser(p) -> None:
    """Arguments of `gridvqa train`."""
    from gridvqa_jax.world import universe as U

    pos, nonneg, posf = CS.positive_int, CS.nonnegative_int, CS.positive_float
    p.add_argument("--variant", choices=U.VARIANTS, required=True)
    p.add_argument("--out", required=True, help="run directory (checkpoints, metrics.jsonl)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    p.add_argument("--export", help="write the final params + config.json here when done")
    p.add_argument("--overwrite", action="store_true",
                   help="let --export replace an existing export (refused otherwise)")
    p.add_argument("--density", nargs="+", choices=sorted(U.DENSITIES), default=["d03", "d07"])
    p.add_argument("--steps", type=pos)
    p.add_argument("--phase1-steps", type=nonneg)
    p.add_argument("--qa-ramp-steps", type=nonneg, help="phase-2 steps over which the QA loss "
                   "weight rises from 0 to 1")
    p.add_argument("--batch-size", type=pos)
    p.add_argument("--lr", type=posf)
    p.add_argument("--warmup-steps", type=nonneg)
    p.add_argument("--oversample", action="append", metavar="BUCKET=K",
                   help="draw BUCKET (e.g. D3_CMP_F0) K times as often; repeatable")
    p.add_argument("--init-from", metavar="DIR",
                   help="start from an exported model (same architecture), fresh optimiser")
    p.add_argument("--save-every", type=pos)
    p.add_argument("--eval-every", type=nonneg, help="0 = never")
    p.add_argument("--eval-n", type=nonneg)
    p.add_argument("--data-seed", type=int)
    p.add_argument("--init-seed", type=int)
    p.add_argument("--grid-size", type=pos, default=5)
    p.add_argument("--model-cell-px", type=pos, default=16, help="model input pixels per cell")
    p.add_argument("--d-model", type=pos, default=128)
    p.add_argument("--heads", type=pos, default=8)
    p.add_argument("--mlp-dim", type=pos, default=256)
    p.add_argument("--enc-layers", type=pos, default=5)
    p.add_argument("--dec-layers", type=pos, default=2)
    p.add_argument("--phrase-width", type=nonneg, default=5,
                   help="text phrase-convolution window (odd; 0 = none)")


def cmd_train(args) -> int:
    """`gridvqa train`: train (or resume, or fine-tune) a reference model."""
    import dataclasses

    from gridvqa_jax.training import train as T
    from gridvqa_jax.training.config import TrainConfig
    from gridvqa_jax.models import mdetr as M

    model = M.ModelConfig(grid_size=args.grid_size, cell_px=args.model_cell_px,
                          d_model=args.d_model, n_heads=args.heads, mlp_dim=args.mlp_dim,
                          enc_layers=args.enc_layers, dec_layers=args.dec_layers,
                          phrase_width=args.phrase_width)
    over = {k: getattr(args, k) for k in ("steps", "phase1_steps", "qa_ramp_steps",
                                          "batch_size", "lr", "warmup_steps", "init_from",
                                          "save_every", "eval_every", "eval_n", "data_seed",
                                          "init_seed") if getattr(args, k) is not None}
    if args.oversample:
        over["oversample"] = tuple(_bucket_factor(x) for x in args.oversample)
    cfg = dataclasses.replace(TrainConfig(variant=args.variant, densities=tuple(args.density),
                                            model=model), **over)
    log = (lambda *a: None) if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    res = T.train(cfg, args.out, resume=args.resume, progress=CS.show_progress(args),
                  export=args.export, overwrite=args.overwrite, log=log)
    res.pop("state")
    _emit(args, f"trained {cfg.variant} for {res['steps_done']} steps in {res['wall_s']:.0f} s; "
          f"checkpoints in {args.out}/ckpt", res)
    return 0


def add_evaluate_parser(p) -> None:
    """Arguments of `gridvqa evaluate`."""
    from gridvqa_jax.world import universe as U

    p.add_argument("--model", default="pure", help="pure, spur (shipped checkpoints) or a path")
    p.add_argument("--data", default="pure", help="pure, spur (held-out generated) or a directory")
    p.add_argument("--regimes", action="store_true",
                   help="the three regimes (pure, spurious, cross) as one table")
    p.add_argument("--n", type=CS.nonnegative_int, default=1024,
                   help="samples per density (0 = all in DIR)")
    p.add_argument("--density", nargs="+", choices=sorted(U.DENSITIES), default=["d03", "d07"])
    p.add_argument("--cell-px", type=CS.positive_int, default=64,
                   help="rendering resolution of the images")
    p.add_argument("--batch", type=CS.positive_int, default=256)
    p.add_argument("--seed", type=int, default=777_000, help="held-out data seed")


def cmd_evaluate(args) -> int:
    """`gridvqa evaluate`: per-bucket accuracy of a model, or the three regimes."""
    from gridvqa_jax import evaluate as E
    from gridvqa_jax.training import export as EX
    from gridvqa_jax.world import universe as U

    results = {}
    runs = ([(name, m, d) for name, m, d in E.REGIMES] if args.regimes
            else [(f"{args.model} on {Path(args.data).name if Path(args.data).is_dir() else args.data}",
                   args.model, args.data)])
    for _, model, data in runs:
        _check_model_name(model)
        if data in U.VARIANTS and args.n == 0:
            raise InputError("--n 0 (every sample) needs a dataset directory as --data; "
                             f"give the number of {data} samples to generate per density")
    for name, model, data in runs:
        apply_fn, params, spec = EX.load_reference_model(model)
        results[name] = E.evaluate_model(apply_fn, params, data, n=args.n,
                                         densities=tuple(args.density),
                                         grid_size=spec.grid_size, cell_px=args.cell_px,
                                         batch=args.batch, seed=args.seed,
                                         progress=CS.show_progress(args))
    last = results[runs[-1][0]]
    payload = {"overall": last["overall"], "n": last["n"], "buckets": last["buckets"]}
    if len(results) > 1:
        payload = {**payload, "regimes": results}
    _emit(args, E.format_table(results), payload)
    return 0


def add_synergy_parser(p) -> None:
    """Arguments of `gridvqa synergy`."""
    from gridvqa_jax.world import universe as U

    pos = CS.positive_int
    p.add_argument("--regimes", action="store_true",
                   help="the three regimes (pure, spurious, cross)")
    p.add_argument("--model", default="pure", help="pure, spur or a path (without --regimes)")
    p.add_argument("--data", choices=U.VARIANTS, default="pure",
                   help="held-out data variant (without --regimes)")
    p.add_argument("--n", type=pos, default=64, help="samples per bucket (the EMAP N-set)")
    p.add_argument("--boot", type=pos, default=200,
                   help="permutations of the answers for pid_null (the intervals are "
                        "set-level jackknife ones)")
    p.add_argument("--chunk", type=pos, default=None,
                   help="pairs per forward call (default: 64 per device on CPU, 2048 on GPU/TPU)")
    p.add_argument("--seed", type=int, default=888_000, help="held-out data seed (+ bucket id)")
    p.add_argument("--no-controls", action="store_true", help="skip the control models")
    p.add_argument("--pid-codes", choices=("marginal", "kmeans", "empty", "reference"),
                   default="marginal",
                   help="PID's unimodal codes (also of pid_null): answers of EMAP's unimodal "
                        "projections (marginal), k-means on per-cell colours and one-hot words "
                        "(kmeans), answers on the image-only / text-only inputs (empty), or "
                        "the InterSHAP authors' clustering of the same inputs (reference: "
                        "normalise, PCA to 2, k-means with 20 clusters)")
    _add_data_flags(p, "the D_pure buckets (D1/D2/D3 Mixed and D1 attribute, form 0, d07)",
                    "the first --n samples of each bucket in file order",
                    "the D_spur buckets")
    p.add_argument("--out", help="write synergy_vs_depth.png and results.json here")


def cmd_synergy(args) -> int:
    """`gridvqa synergy`: EMAP, InterSHAP and PID by depth, the additive-fallacy check."""
    from reproduction import table2 as T2

    if args.regimes:
        regimes = T2.REGIMES
    else:
        _check_model_name(args.model)
        regimes = ((f"{args.model} on {args.data}", args.model, args.data),)
    res = T2.run_check(n=args.n, n_boot=args.boot, seed=args.seed, regimes=regimes,
                       chunk=args.chunk, progress=CS.show_progress(args),
                       controls=not args.no_controls, pid_discretise=args.pid_codes,
                       data={k: v for k, v in (("pure", args.pure_data),
                                               ("spur", args.spur_data)) if v} or None)
    human = T2.format_table(res)
    if args.out:
        paths = T2.write_results(res, args.out)
        res["files"] = paths
        human += f"\nwrote {paths['figure']} and {paths['results']}"
    _emit(args, human, T2.payload(res))
    return 0


def cmd_bench_explainers(args) -> int:
    """`gridvqa bench explainers`: explainer throughput and error at equal budget."""
    from reproduction import bench_explainers as BX

    log = (lambda *a: None) if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    res = BX.bench_explainers(batch=args.batch, budget=args.budget,
                              mae_budget=args.mae_budget, log=log)
    _emit(args, "bench explainers\n" + "\n".join(f"  {k:<30} {v}" for k, v in res.items()),
          res)
    return 0


def add_explain_parser(p) -> None:
    """Arguments of `gridvqa explain`."""
    pos = CS.positive_int
    p.add_argument("--regimes", action="store_true",
                   help="the three regimes (pure, spurious, cross); the only mode")
    p.add_argument("--n", type=pos, default=16, help="held-out d07 samples per regime")
    p.add_argument("--seed", type=int, default=913_000, help="held-out data seed (spur: +1)")
    p.add_argument("--batch", type=pos, default=16, help="samples per explainer call (DIME's set)")
    p.add_argument("--explainers", nargs="+", default=None,
                   choices=["multishap", "dime", "multiviz", "random", "objects", "oracle"],
                   help="shipped explainers and controls to score (default: all six; with "
                   "--explainer: the controls random, objects and oracle)")
    p.add_argument("--explainer", action="append", default=[], metavar="MODULE:FUNCTION",
                   help="also score your explainer package.module:function (repeatable)")
    p.add_argument("--model", action="append", default=[], metavar="[pure=|spur=]PATH",
                   help="an export directory replacing the shipped model(s): PATH replaces "
                   "both, pure=PATH / spur=PATH one (repeatable)")
    p.add_argument("--multishap-samples", type=pos, default=None,
                   help="MultiSHAP Monte Carlo coalitions per sample (default: "
                   "reproduction.table1.DEFAULT_BUDGETS)")
    p.add_argument("--multishap-sampling", choices=["iid", "stratified"], default="iid",
                   help="how MultiSHAP draws its coalitions' sizes: i.i.d. (default) or "
                   "stratified by size as its reference's stratified_sampling=True "
                   "(gridvqa_jax.explain.interactions.sii_matrix); for the MultiSHAP rows, "
                   "their --convergence sweeps and --sensitivity")
    p.add_argument("--sensitivity", nargs="?", const="pure", default=None,
                   choices=["pure", "all"],
                   help="also score MultiSHAP under each of its open choices (target, "
                   "quantity, baseline, aggregation; one at a time and the reference's; "
                   "reproduction.table1_sensitivity) on the pure regime (or all), for the "
                   "cell row (with --players reference: the reference row): printed and "
                   'added to the JSON line under "sensitivity"')
    p.add_argument("--dime-samples", type=pos, default=None,
                   help="DIME LIME masks per modality (default: reproduction.table1."
                   "DEFAULT_BUDGETS)")
    p.add_argument("--players", choices=["cells", "reference", "both"], default="cells",
                   help="image players of MultiSHAP, DIME and MultiViz: the grid cells (the "
                   "units of the ground truth; default), each method's reference granularity "
                   "(rows multishap_ref: ViLT-size 12 x 12 patches with the reference's "
                   "options, dime_ref: quickshift superpixels hidden black, multiviz_ref: "
                   "per-pixel second-order gradient x input from mid-gray; per-pixel maps), "
                   "or both")
    p.add_argument("--figures", type=CS.nonnegative_int, default=2,
                   help="heatmap PNGs per regime (--out)")
    p.add_argument("--out", help="write results.json, per_sample.npz and heatmap PNGs here "
                   "(new/empty directory)")
    p.add_argument("--parts", metavar="DIR", default=None,
                   help="save each finished explainer x regime's per-sample scores and maps "
                   "here and reuse those an earlier run with the same settings saved: a stopped "
                   "run resumes (reproduction.table1_parts); with --convergence the sweep's runs "
                   "too, under DIR/convergence, with --sensitivity each choice's, under "
                   "DIR/sensitivity")
    p.add_argument("--piece", type=pos, default=None, metavar="K",
                   help="with --parts: the MultiSHAP and DIME rows run and save K samples of "
                   "a batch at a time (MultiSHAP each sample with its own key, fold_in(row "
                   "key, j), at its own game size; DIME with the whole batch as its set; so "
                   "the same maps to float32 rounding): "
                   "a run stopped inside a batch resumes at its first missing piece (a CPU's "
                   "long rows; a GPU runs whole batches fastest)")
    _add_data_flags(p, "D_pure (pure and cross regimes)",
                    "--n of its d07 samples, in file order cycled through the buckets",
                    "D_spur (spurious regime)")
    p.add_argument("--convergence", action="store_true",
                   help="also sweep the budgets (reproduction.convergence): RMA / IoU and "
                   "split-half reliability per budget and the budget where each settles; "
                   'printed and added to the JSON line under "convergence"')
    p.add_argument("--convergence-budgets", nargs="+", default=None,
                   metavar="NAME=INT[,INT...]",
                   help="budgets of the sweep, increasing (default multishap=8,32,128 "
                   "dime=64,256,1024: coalitions / masks per sample)")
    p.add_argument("--convergence-regimes", nargs="+", default=["pure"],
                   choices=["pure", "spurious", "cross"], help="regimes of the sweep")
    p.add_argument("--convergence-n", type=pos, default=None,
                   help="samples per regime of the sweep (default --n)")
    p.add_argument("--reliability-n", type=CS.nonnegative_int, default=None,
                   help="samples of the split-half runs (default min(n, 16); 0: none)")


def cmd_explain(args) -> int:
    """`gridvqa explain --regimes`: Table 1 (explainers x regimes, RMA / Otsu IoU)."""
    from reproduction import table1 as T1

    from gridvqa_jax.explain import scoring

    n_samples = {"multishap": args.multishap_samples, "dime": args.dime_samples}
    n_samples = {e: T1.DEFAULT_BUDGETS[e]["n_samples"] if v is None else v
                 for e, v in n_samples.items()}
    # the reference rows: the same budgets with the reference's options
    budgets = T1.sample_budgets(n_samples, args.players, args.multishap_sampling)
    shipped = args.explainers or (list(scoring.CONTROLS) if args.explainer else
                                  ["multishap", "dime", "multiviz", *scoring.CONTROLS])
    explainers = [*(scoring.explainer_from_spec(s) for s in args.explainer), *shipped]
    models = {}
    for spec in args.model:
        name, sep, path = spec.partition("=")
        if not sep:
            name, path = None, spec
        elif name not in ("pure", "spur"):
            raise InputError(f"--model {spec!r}: expected PATH, pure=PATH or spur=PATH")
        for m in ((name,) if name else ("pure", "spur")):
            models[m] = path
    data = {k: v for k, v in (("pure", args.pure_data), ("spur", args.spur_data)) if v}
    log = (lambda *a: None) if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    if args.piece is not None and args.parts is None:
        raise InputError("--piece saves pieces of a row under --parts DIR; give --parts")
    table1_kw = {**({"data": data} if data else {}),
                 **({"piece": args.piece} if args.piece is not None else {})} or None

    def run(fig_dir=None):
        return T1.table1(n=args.n, seed=args.seed, budgets=budgets, batch=args.batch,
                         explainers=explainers, progress=CS.show_progress(args),
                         figures_dir=fig_dir, n_figures=args.figures, log=log, models=models,
                         data=data, players=args.players, parts_dir=args.parts,
                         piece=args.piece)

    res = T1.write_results(args.out, run) if args.out else run()
    human = T1.format_table(res) + (f"\nwrote {args.out}/results.json and "
                                    f"{len(res['figures'])} PNGs" if args.out else "")
    payload = T1.compact(res)
    if args.convergence:
        from reproduction import convergence as CV

        n_conv = args.convergence_n or args.n
        sweep = (CV.parse_budgets(args.convergence_budgets) if args.convergence_budgets
                 else dict(CV.SWEEP_BUDGETS))
        conv = CV.convergence(
            n_conv, args.seed, budgets=T1.with_multishap_sampling(sweep, args.multishap_sampling),
            regimes=args.convergence_regimes, reliability_n=(
                None if args.reliability_n is None else min(args.reliability_n, n_conv)),
            models=models, batch=args.batch, log=log,
            table1_kw=table1_kw,
            parts_dir=None if args.parts is None else Path(args.parts) / "convergence")
        human += "\n\n" + CV.format_convergence(conv)
        payload["convergence"] = CV.compact(conv)
    if args.sensitivity:
        from reproduction import table1_sensitivity as T1S

        sens = T1S.sensitivity(args.n, args.seed, budget=budgets["multishap"],
                               regimes=args.sensitivity, batch=args.batch, models=models,
                               players="reference" if args.players == "reference" else "cells",
                               log=log, table1_kw=table1_kw,
                               parts_dir=None if args.parts is None
                               else Path(args.parts) / "sensitivity")
        human += "\n\n" + T1S.format_sensitivity(sens)
        payload["sensitivity"] = T1S.compact(sens)
    _emit(args, human, payload)
    return 0


def add_reproduce_parser(p) -> None:
    """Arguments of `gridvqa reproduce`."""
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="small samples, under 10 min on a "
                      "2-core CPU (the default)")
    size.add_argument("--full", action="store_true", help="the paper's sample sizes (a GPU)")
    p.add_argument("--out", required=True, help="report directory (new or empty)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    p.add_argument("--only", nargs="+", default=["regimes", "local_explainers", "synergy",
                                                  "bias"],
                   choices=["regimes", "local_explainers", "synergy", "bias"],
                   help="run only these sections")
    p.add_argument("--distributed", action="store_true", help="call "
                   "jax.distributed.initialize() first (one process per host; on SLURM / TPU "
                   "pods the arguments are detected)")
    p.add_argument("--coordinator", help="with --distributed: coordinator host:port")
    p.add_argument("--num-processes", type=CS.positive_int, help="with --distributed")
    p.add_argument("--process-id", type=CS.nonnegative_int, help="with --distributed")


def cmd_reproduce(args) -> int:
    """`gridvqa reproduce`: every table of both papers with verdicts (``reproduction.reproduce``)."""
    from reproduction import reproduce as RP

    if args.distributed:
        import jax

        kw = {k: v for k, v in (("coordinator_address", args.coordinator),
                                ("num_processes", args.num_processes),
                                ("process_id", args.process_id)) if v is not None}
        jax.distributed.initialize(**kw)
    log = (lambda *a: None) if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    res = RP.reproduce(args.out, "full" if args.full else "quick", sections=tuple(args.only),
                       overwrite=args.overwrite, progress=CS.show_progress(args), log=log)
    if not res:  # a process other than 0 under jax.distributed: nothing to print
        return 0
    _emit(args, f"{RP.verdict_table(res)}\nwrote {args.out}/report.md, results.json and "
          f"{len(res['meta']['figures'])} figures in {res['meta']['wall_s']:.0f} s", res)
    return 0


def _check_model_name(model: str) -> None:
    """A --model is a shipped name or an existing directory; InputError listing both otherwise."""
    from gridvqa_jax.training import export as EX

    if model in EX.REFERENCE:
        return
    p = Path(model)
    if not p.exists():
        raise InputError(f"unknown model {model!r}: expected {' or '.join(EX.REFERENCE)} (the "
                         "shipped checkpoints), an exported model directory (params.msgpack + "
                         "config.json) or a training run directory (train_config.json + ckpt/)")
    if not p.is_dir():
        raise InputError(f"--model {model} is a file; expected {' or '.join(EX.REFERENCE)}, an "
                         "exported model directory or a training run directory")


# ----------------------------------------------------------------------------------------------
# The subcommands: (name, help, add its arguments, handler); `bench` has sub-subcommands.
COMMANDS = (
    CS.Command("generate", "generate a dataset (official layout or native shards)",
              add_generate_parser, cmd_generate),
    CS.Command("verify", "check every sample of a dataset", add_dataset_parser, cmd_verify),
    CS.Command("stats", "per-bucket statistics of a dataset", add_dataset_parser, cmd_stats),
    CS.Command("bench", "throughput benchmarks", subcommands=(
        CS.Command("generate", "symbolic, render and export throughput",
                  add_bench_generate_parser, cmd_bench_generate),
        CS.Command("synergy", "EMAP / InterSHAP / PID throughput", add_bench_synergy_parser,
                  cmd_bench_synergy),
        CS.Command("explainers", "explainer throughput and error at equal budget",
                  add_bench_explainers_parser, cmd_bench_explainers))),
    CS.Command("train", "train a reference model (M_pure / M_spur)", add_train_parser, cmd_train),
    CS.Command("evaluate", "accuracy per bucket of a model on a dataset", add_evaluate_parser,
              cmd_evaluate),
    CS.Command("synergy", "global synergy by depth: the additive-fallacy check",
              add_synergy_parser, cmd_synergy),
    CS.Command("explain", "local explainers scored by RMA / Otsu IoU (Table 1)",
              add_explain_parser, cmd_explain),
    CS.Command("reproduce", "regenerate every table and figure of both papers, with verdicts "
              "(report.md, results.json, figures/)", add_reproduce_parser, cmd_reproduce),
)


def build_parser() -> argparse.ArgumentParser:
    """The `gridvqa` argument parser: one subcommand per entry of ``COMMANDS``, each with --help
    and the output flags; ``args.command`` names it (``args.what`` the bench), ``args.fn`` runs
    it."""
    return CS.build_parser("gridvqa", __doc__.splitlines()[0], COMMANDS, dest="command")


def _before(args) -> None:
    if args.command in ("generate", "bench"):
        from gridvqa_jax.world import generate as G

        G.use_one_cpu_device_per_core()


def main(argv=None) -> int:
    """Entry point of `gridvqa`: runs the subcommand and returns its exit status; an expected
    failure prints ``gridvqa <command>: error: <message>`` and returns 2 (``cli_support.main``)."""
    return CS.main(build_parser(), argv, lambda a: f"gridvqa {a.command}", _before)


if __name__ == "__main__":
    sys.exit(main())
