"""One command reproduces both papers: ``gridvqa reproduce [--quick | --full] --out DIR``.

Starting from the shipped checkpoints, on fresh held-out data (seeds no training stream uses),
this regenerates the sections (``SECTIONS``)

* ``regimes``: the accuracy of the three regimes per bucket and GridVQA-X Table 2's accuracy
  rows, each with a Wilson 95% interval (``reproduction.regimes``);
* ``local_explainers``: GridVQA-X Table 1 (``reproduction.table1.table1``);
* ``synergy``: Table 2's synergy rows and the additive-fallacy check
  (``reproduction.table2.run_check``);
* ``bias``: the modality-bias tables on the closed-world benchmark whose bias types are exact
  (``reproduction.modality_bias``),

and writes ``DIR/report.md`` (``reproduction.report``: every table with the paper's numbers
beside ours, one verdict per finding of both papers, ``reproduction.stats``),
``DIR/results.json`` (top-level keys: the sections run, ``findings``, ``meta``) and
``DIR/figures/*.png``. Everything is written into a staging directory next to DIR and renamed to
DIR when complete, so DIR holds a whole report or nothing: a section that raises aborts the run
with its error and leaves DIR untouched.

``--quick`` and ``--full`` are the same code path with the sizes of ``SIZES``.

Multi-process (``jax.distributed.initialize()`` before the run, one process per host): the
accuracy section is sharded over the global mesh of all processes' devices (each process
renders and evaluates only the rows of its own devices; the predictions are all-gathered); the
other sections are split into independent units (Table 1 by regime, synergy, bias) assigned
round-robin to processes, each run on its process's local devices, and their results are
gathered on process 0, the only one that writes. The results equal a single-process run.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import platform
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

import flax
import jax
import numpy as np
from jax.experimental import multihost_utils as MU

import gridvqa_jax
from bias_jax import analysis as AN
from mmx_base import staging
from mmx_base.trees import jsonable
from reproduction import bias_tables as BTAB
from reproduction import convergence as CV
from reproduction import modality_bias as MB
from reproduction import quality_sweep as QS
from reproduction import regimes as REG
from reproduction import report as RE
from reproduction import table1 as T1
from reproduction import table2 as T2
from reproduction.modality_bias import run_bias
from reproduction.regimes import run_regimes

SECTIONS = ("regimes", "local_explainers", "synergy", "bias")
# Table 1 at the default budgets, measured once (a GPU run; 25-39 h on a 2-core CPU): the
# report prints it beside the run's own smaller Table 1 when the checkout holds it
SHIPPED_TABLE1 = Path(__file__).resolve().parents[1] / "docs" / "table1_default" / "results.json"

# Sample sizes. quick: 510 s measured on an idle 2-core CPU (budget 10 minutes; the time
# left after compilation goes to Table 1, whose intervals are widest: docs/results.md); full:
# the paper's sizes (a GPU).
SIZES = {
    "quick": {"acc_n": 256, "t2_n": 50, "t1_n": 6, "t1_batch": 6, "t1_players": "cells",
              "t1_budgets": {"multishap": 16, "dime": 128}, "syn_n": 16, "syn_boot": 100,
              "bias_n": 128, "n_figures": 1},
    "full": {"acc_n": 4096, "t2_n": 500, "t1_n": 256, "t1_batch": 16, "t1_players": "both",
             "t1_budgets": None, "syn_n": 64, "syn_boot": 1000, "bias_n": 2000, "n_figures": 2},
}
SIZE_DOC = {
    "acc_n": "regimes accuracy: held-out samples per density (d03, d07), every bucket",
    "t2_n": "Table 2 accuracy rows: D_pure samples per bucket D1/D2/D3 Mixed form 0 d07",
    "t1_n": "Table 1: d07 samples per regime (every bucket)",
    "t1_batch": "Table 1: samples per explainer call (DIME's N-set)",
    "t1_players": "Table 1: image players (cells; both = cells and each method's reference "
                  "granularity, ~6x the cost: a GPU)",
    "t1_budgets": "Table 1: samples per explainer (None: table1.DEFAULT_BUDGETS, 128 MultiSHAP "
                  "coalitions / 1024 DIME masks; quick runs below them, so its Table 1 means "
                  "carry Monte Carlo noise: docs/results.md, budget sweep)",
    "syn_n": "Table 2 synergy: samples per bucket (the EMAP N-set)",
    "syn_boot": "Table 2 synergy: permutations of the PID null (intervals: jackknife)",
    "bias_n": "modality bias: closed-world samples",
    "n_figures": "heatmap figures per regime",
}


# ----------------------------------------------------------------------------------------------
# Processes
# ----------------------------------------------------------------------------------------------
def process_info() -> tuple[int, int]:
    """``(process_index, process_count)`` of this JAX process (``(0, 1)`` without
    ``jax.distributed.initialize()``)."""
    import jax

    return jax.process_index(), jax.process_count()


def gather_objects(obj) -> list:
    """Every process's ``obj`` (any picklable value), in process order, on every process.

    Pickled to bytes, padded to the longest, and all-gathered with
    ``jax.experimental.multihost_utils.process_allgather``; one process: ``[obj]``.
    """
    if jax.process_count() == 1:
        return [obj]
    raw = np.frombuffer(pickle.dumps(obj), np.uint8)
    sizes = np.asarray(MU.process_allgather(np.asarray([raw.size], np.int64))).reshape(-1)
    buf = np.zeros(int(sizes.max()), np.uint8)
    buf[:raw.size] = raw
    allb = np.asarray(MU.process_allgather(buf)).reshape(len(sizes), -1)
    return [pickle.loads(allb[i, :int(s)].tobytes()) for i, s in enumerate(sizes)]


@contextlib.contextmanager
def process_local():
    """Within the block, ``jax.devices()`` lists this process's devices only.

    Library functions default their mesh to ``jax.devices()``; under multi-process JAX that is
    the global device list, and a computation over it needs every process. A work unit that one
    process runs alone must see only its own devices. No-op with one process.
    """
    import jax

    if jax.process_count() == 1:
        yield
        return
    saved = jax.devices
    jax.devices = lambda *a, **k: jax.local_devices(*a, **k)  # noqa: E731
    try:
        yield
    finally:
        jax.devices = saved


# ----------------------------------------------------------------------------------------------
# Work units
# ----------------------------------------------------------------------------------------------
def run_table1_regime(sizes: dict, regime: str, fig_dir, progress=False) -> dict:
    """Table 1 for one regime (``table1.table1(regimes=(regime,))``); the figures it draws
    come back as PNG bytes (so a unit run on another process can hand them to process 0)."""
    with tempfile.TemporaryDirectory() as tmp:
        players = sizes.get("t1_players", "cells")
        budgets = T1.sample_budgets(sizes.get("t1_budgets") or {}, players)
        res = T1.table1(n=sizes["t1_n"], batch=sizes["t1_batch"], regimes=(regime,),
                        progress=progress, figures_dir=tmp, n_figures=sizes["n_figures"],
                        players=players, budgets=budgets or None)
        pngs = {f"heatmap_{Path(p).stem}.png": Path(p).read_bytes() for p in res["figures"]}
    res["figures"] = pngs
    return res


def merge_table1(parts: list[dict]) -> dict:
    """One Table 1 from per-regime results, with the paper's findings re-checked on the union
    of the per-sample scores (``table1.cell_findings``, ``table1.reference_findings``)."""
    out = {"table": {}, "scores": {}, "per_sample": {}, "figures": {}}
    for p in parts:
        for key in ("table", "scores", "per_sample"):
            for e, rs in p[key].items():
                out[key].setdefault(e, {}).update(rs)
        out["figures"].update(p["figures"])
        out["n"], out["seed"], out["budgets"] = p["n"], p["seed"], p["budgets"]
        for key in ("protocol", "data", "model_access"):
            out.setdefault(key, {}).update(p.get(key, {}))
    order = [r for r, _, _ in T1.REGIMES]
    for key in ("table", "scores", "per_sample"):
        out[key] = {e: {r: rs[r] for r in order if r in rs} for e, rs in out[key].items()}
    out["findings"] = T1.cell_findings(out["per_sample"])
    out["findings_reference"] = T1.reference_findings(out["per_sample"])
    return out


def run_synergy(sizes: dict, progress=False) -> dict:
    """``table2.run_check`` at the given sizes (EMAP, InterSHAP, PID by depth, directions,
    findings, attribute vs relational, controls)."""
    return T2.payload(T2.run_check(n=sizes["syn_n"], n_boot=sizes["syn_boot"],
                                   progress=progress))


def _versions() -> dict:
    v = {"python": platform.python_version(), "jax": jax.__version__, "flax": flax.__version__,
         "numpy": np.__version__}
    try:
        v["gridvqa-jax"] = metadata.version("gridvqa-jax")
    except metadata.PackageNotFoundError:  # not installed as a distribution (source checkout)
        v["gridvqa-jax"] = getattr(gridvqa_jax, "__version__", "unknown")
    return v


def _device() -> dict:
    d = jax.devices()
    return {"platform": d[0].platform, "kind": d[0].device_kind, "devices": len(d),
            "processes": jax.process_count(), "cpu_count": os.cpu_count()}


def check_out(out) -> Path:
    """``out`` as a Path, refusing an existing non-empty path (``FileExistsError``)."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(17, "exists and is not empty (use --overwrite to replace it)",
                              str(out))
    return out


def compute(sizes: dict, *, sections=SECTIONS, progress: bool = True, log=None) -> dict:
    """Run the sections on every process; returns ``{"parts": {section: result}, "wall":
    {section: s}}`` (complete on process 0; other processes return their own units only). The
    first exception of a unit propagates."""
    log = log or (lambda *_: None)
    rank, size = process_info()
    parts, wall = {}, {}
    if "regimes" in sections:  # collective: every process takes part
        t0 = time.perf_counter()
        parts["regimes"] = run_regimes(sizes, log)
        wall["regimes"] = time.perf_counter() - t0
    units = []
    if "local_explainers" in sections:
        units += [("local_explainers", r) for r, _, _ in T1.REGIMES]
    if "synergy" in sections:
        units.append(("synergy", None))
    if "bias" in sections:
        units.append(("bias", None))
    mine = {}
    for i, (sec, arg) in enumerate(units):
        if i % size != rank:
            continue
        t0 = time.perf_counter()
        log(f"{sec}{'' if arg is None else ' ' + arg} ...")
        with process_local():
            if sec == "local_explainers":
                val = run_table1_regime(sizes, arg, None, progress=progress)
            elif sec == "synergy":
                val = run_synergy(sizes, progress=progress)
            else:
                val = run_bias(sizes, log)
        mine[i] = (val, time.perf_counter() - t0)
    gathered = {}
    for d in gather_objects(mine):
        gathered.update(d)
    t1 = [gathered[i] for i, (s, _) in enumerate(units) if s == "local_explainers"]
    if t1:
        wall["local_explainers"] = sum(w for _, w in t1)
        parts["local_explainers"] = merge_table1([v for v, _ in t1])
    for i, (sec, _) in enumerate(units):
        if sec in ("synergy", "bias"):
            parts[sec], wall[sec] = gathered[i]
    return {"parts": parts, "wall": wall}


def shipped_table1_text(path: Path = SHIPPED_TABLE1) -> str:
    """The shipped Table 1 (``path``: a ``gridvqa explain --regimes --out`` results.json) as
    markdown (``report.shipped_table1_markdown``), then whether its budgets settled in the
    budget sweeps shipped beside it (``convergence*.json``: ``convergence.budget_status``,
    ``convergence.budget_status_markdown``)."""
    shipped = json.loads(path.read_text())
    where = f"{path.parent.parent.name}/{path.parent.name}"
    text = RE.shipped_table1_markdown(shipped, f"{where}/{path.name}")
    sweeps = sorted(path.parent.glob("convergence*.json"))
    if sweeps:
        status = CV.budget_status([json.loads(f.read_text()) for f in sweeps],
                                  shipped["budgets"])
        text += "\n\n" + CV.budget_status_markdown(status, [f"{where}/{f.name}" for f in sweeps])
    return text


def build(parts: dict, fig_dir: Path) -> tuple[dict, dict]:
    """``(results, extra)`` from the sections' results (``parts``: the sections run): the
    findings of every section, its figures written into ``fig_dir`` and its markdown; ``extra``
    = ``{"texts": {section: markdown}, "findings": [...], "figures": [file names]}``."""
    results, texts, findings, figures = dict(parts), {}, [], []
    if "regimes" in results:
        r = results["regimes"]
        findings += REG.check_findings(r)
        texts["regimes"] = RE.regimes_markdown(r)
        REG.accuracy_figure(r["table2_accuracy"], fig_dir / "table2_accuracy.png")
        figures.append("table2_accuracy.png")
    if "local_explainers" in results:
        r = results["local_explainers"]
        findings += r["findings"] + r.get("findings_reference", [])
        texts["local_explainers"] = (
            f"{r['n']} d07 samples per regime (seed {r['seed']}); mean ± std [95% CI of the "
            f"mean] at pixel level; budgets {r['budgets']}.\n\n" + RE.table1_markdown(r)
            + "\n\nTable 1 as text:\n\n```\n" + T1.format_table(r) + "\n```")
        if SHIPPED_TABLE1.is_file():
            texts["local_explainers"] += "\n\n" + shipped_table1_text()
        for name, data in sorted(r.pop("figures").items()):
            (fig_dir / name).write_bytes(data)
            figures.append(name)
        r.pop("per_sample", None)
    if "synergy" in results:
        r = results["synergy"]
        findings += r["findings"]
        T2.plot(r, fig_dir / "synergy_vs_depth.png")
        figures.append("synergy_vs_depth.png")
        texts["synergy"] = (RE.synergy_markdown(r) + "\n\nThe Table 2 module's text tables "
                            "(attribute vs relational, accuracy, controls):\n\n```\n"
                            + T2.format_table(r) + "\n```")
    if "bias" in results:
        r = results["bias"]
        findings += MB.check_findings(r)
        BTAB.venn_figure(r["venn"], fig_dir / "bias_venn.png", title=f"closed world, n={r['n']}")
        figures.append("bias_venn.png")
        MB.threshold_figure(r["sweep"], fig_dir / "bias_threshold_sweep.png")
        figures.append("bias_threshold_sweep.png")
        texts["bias"] = (f"Accuracy and macro-F1 against exact labels of the {r.get('world')} "
                         "closed world; cells are share[in-class accuracy %].\n\n```\n"
                         + r.pop("text") + "\n```")
        if r.get("world_summary"):
            texts["bias"] = MB.floors_text(r["world_summary"]) + "\n\n" + texts["bias"]
        if r.get("quality_sweep"):
            QS.quality_sweep_figure(r["quality_sweep"], fig_dir / "bias_quality_sweep.png",
                                    title=f"{r.get('world')} world, n={r['n']}")
            figures.append("bias_quality_sweep.png")
            texts["bias"] += ("\n\nDetector-quality sweep (the same samples, each shipped "
                              "detector set; improved views, default ensemble):\n\n"
                              + QS.sweep_markdown(r["quality_sweep"]))
        r.pop("per_sample", None)
    return results, {"texts": texts, "findings": findings, "figures": figures}


def reproduce(out, mode: str = "quick", *, sizes: dict | None = None, sections=SECTIONS,
              overwrite: bool = False, progress: bool = True, log=None) -> dict:
    """Run every section and write ``out/report.md``, ``out/results.json`` and
    ``out/figures/*.png`` (module docstring); returns the results.

    ``mode``: "quick" or "full" (``SIZES``); ``sizes`` overrides entries. ``out`` must be
    absent or empty unless ``overwrite``. Files are staged in a temporary sibling directory and
    renamed to ``out`` when complete; under multi-process JAX only process 0 writes (the
    others return ``{}``). ``sections``: a subset of ``SECTIONS`` (the results and the report
    hold those only). Raises the first exception of a section, leaving ``out`` as it was.
    """
    if mode not in SIZES:
        raise ValueError(f"mode must be one of {tuple(SIZES)}, got {mode!r}")
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        raise ValueError(f"unknown sections {sorted(unknown)}: expected some of {SECTIONS}")
    sz = {**SIZES[mode], **(sizes or {})}
    rank, _ = process_info()
    out = Path(out)
    if rank == 0 and not overwrite:
        check_out(out)
    t0 = time.perf_counter()
    comp = compute(sz, sections=tuple(sections), progress=progress, log=log)
    wall = time.perf_counter() - t0
    if rank != 0:
        return {}
    stage = staging.make_staging(out, overwrite=True)  # checked before the run
    try:
        (stage / "figures").mkdir()
        results, extra = build(comp["parts"], stage / "figures")
        results["findings"] = extra["findings"]
        results["meta"] = {
            "mode": mode, "sizes": sz, "size_doc": {k: SIZE_DOC.get(k, "") for k in sz},
            "sections": [s for s in SECTIONS if s in sections], "versions": _versions(),
            "device": _device(),
            "seeds": {"regimes": REG.ACC_SEED, "table2_accuracy": REG.T2_SEED,
                      "local_explainers": T1.EXPLAIN_SEED, "synergy": T2.SEED,
                      "bias": AN.ANALYSIS_SEED, "bias_key": MB.BIAS_KEY_SEED},
            "wall_s": wall, "section_wall_s": comp["wall"], "figures": extra["figures"],
            "command": " ".join(sys.argv) if sys.argv else ""}
        results = jsonable(results)
        (stage / "results.json").write_text(json.dumps(results, indent=1))
        (stage / "report.md").write_text(RE.report_markdown(results, extra["texts"]))
        staging.publish(stage, out, overwrite=overwrite)
    except BaseException:
        staging.discard(stage)
        raise
    return results


verdict_table = RE.verdict_table  # the CLI's human summary

__all__ = ["SECTIONS", "SIZES", "SIZE_DOC", "process_info", "gather_objects", "process_local",
           "run_regimes", "run_table1_regime", "merge_table1", "run_synergy", "run_bias",
           "compute", "build", "check_out", "reproduce", "verdict_table"]
