"""One command reproduces both papers: ``gridvqa reproduce [--quick | --full] --out DIR``.

Starting from the shipped checkpoints, on fresh held-out data (seeds no training stream uses),
this regenerates

* ``regimes``: the accuracy of the three regimes (pure = M_pure on D_pure, spurious = M_spur on
  D_spur, cross = M_spur on D_pure) per bucket, and GridVQA-X Table 2's accuracy rows (M_pure and
  M_spur on D_pure, Mixed, form 0, d07, depths 1-3), each with a Wilson 95% interval;
* ``local_explainers``: GridVQA-X Table 1 (``reproduction.table1.table1``);
* ``synergy``: Table 2's synergy rows and the additive-fallacy verdicts
  (``reproduction.table2.run_check``);
* ``bias``: the modality-bias tables on the closed-world benchmark whose bias types are exact
  (``bias_jax.analysis.analyze(..., tables=True)``),

and writes ``DIR/report.md`` (every table with the paper's numbers beside ours, one verdict per
finding of both papers), ``DIR/results.json`` (top-level keys ``regimes``, ``local_explainers``,
``synergy``, ``bias``, ``findings``, ``meta``) and ``DIR/figures/*.png``. Everything is written
into a staging directory next to DIR and renamed to DIR when complete, so DIR holds a whole
report or nothing. A section whose module is not installed is reported as "not available"; any
other exception aborts the run and leaves DIR untouched.

``--quick`` and ``--full`` are the same code path with the sizes of ``SIZES``.

Verdicts (``verdict``): a finding is a claim that a quantity lies on one side of a threshold
(or inside a band); with the 95% interval ``[lo, hi]`` of our estimate the claim is
*reproduced* when the whole interval satisfies it, *refuted* when the whole interval
contradicts it, and *inconclusive* when the interval straddles the boundary (or nothing was
measured).

Multi-process (``jax.distributed.initialize()`` before the run, one process per host): the
accuracy section is sharded over the global mesh of all processes' devices (each process
renders and evaluates only the rows of its own devices; the predictions are all-gathered); the
other sections are split into independent units (Table 1 by regime, synergy, bias) assigned
round-robin to processes, each run on its process's local devices, and their results are
gathered on process 0, the only one that writes. The results equal a single-process run.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import os
import pickle
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from mmx_base import staging
from mmx_base.trees import jsonable

SECTIONS = ("regimes", "local_explainers", "synergy", "bias")

# Sample sizes. quick: <= 10 minutes on a 2-core CPU; full: the paper's sizes (a GPU).
SIZES = {
    "quick": {"acc_n": 256, "t2_n": 50, "t1_n": 8, "t1_batch": 8, "syn_n": 16, "syn_boot": 100,
              "bias_n": 256, "n_figures": 1},
    "full": {"acc_n": 4096, "t2_n": 500, "t1_n": 256, "t1_batch": 16, "syn_n": 64,
             "syn_boot": 1000, "bias_n": 2000, "n_figures": 2},
}
SIZE_DOC = {
    "acc_n": "regimes accuracy: held-out samples per density (d03, d07), every bucket",
    "t2_n": "Table 2 accuracy rows: D_pure samples per bucket D1/D2/D3 Mixed form 0 d07",
    "t1_n": "Table 1: d07 samples per regime (every bucket)",
    "t1_batch": "Table 1: samples per explainer call (DIME's N-set)",
    "syn_n": "Table 2 synergy: samples per bucket (the EMAP N-set)",
    "syn_boot": "Table 2 synergy: bootstrap resamples",
    "bias_n": "modality bias: closed-world samples",
    "n_figures": "heatmap figures per regime",
}
ACC_SEED = 777_000  # = gridvqa_jax.evaluate.EVAL_SEED (+ density index)
T2_SEED = 779_000  # Table 2 accuracy rows: seed T2_SEED + bucket id (no other stream uses it)
BIAS_KEY_SEED = 0
T2_BUCKETS = ("D1_M_F0", "D2_M_F0", "D3_M_F0")
# GridVQA-X Table 2, accuracy (%) on D_pure, Mixed, form 0, d07, depths 1-3.
PAPER_T2_ACC = {"M_pure": (100.0, 100.0, 100.0), "M_spur": (6.0, 2.0, 0.0),
                "Qwen3-VL-30B": (14.0, 10.0, 10.0), "LLaVA-1.5-7B": (6.0, 28.0, 30.0)}


# ----------------------------------------------------------------------------------------------
# Statistics and verdicts
# ----------------------------------------------------------------------------------------------
def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a proportion k / n: ``(lo, hi)``, NaN for n = 0.

    ``centre = (p + z²/2n) / (1 + z²/n)``, ``half = z sqrt(p(1-p)/n + z²/4n²) / (1 + z²/n)``
    (Wilson 1927); unlike the normal interval it stays inside [0, 1] at p = 0 or 1.
    """
    if n <= 0:
        return float("nan"), float("nan")
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, c - h), min(1.0, c + h)


def mean_ci(mean: float, std: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """Normal 95% interval of a mean from its population std and n: ``mean ± z std/sqrt(n-1)``
    (NaN when n < 2)."""
    if n is None or n < 2 or mean is None or std is None or not np.isfinite(mean):
        return float("nan"), float("nan")
    h = z * std / math.sqrt(n - 1)
    return mean - h, mean + h


def verdict(ci, claim) -> str:
    """Verdict of a finding from the 95% interval ``ci = (lo, hi)`` of our estimate.

    ``claim``: ``(">", t)`` (the quantity exceeds t), ``("<", t)``, or ``("in", a, b)`` (it lies
    in [a, b]). Reproduced: the whole interval satisfies the claim; refuted: the whole interval
    contradicts it (for a band: lies outside it); inconclusive: it straddles a boundary, or the
    interval is not finite (nothing measured).
    """
    lo, hi = (float("nan"), float("nan")) if ci is None else (float(ci[0]), float(ci[1]))
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return "inconclusive"
    op = claim[0]
    if op == ">":
        t = claim[1]
        return "reproduced" if lo > t else "refuted" if hi <= t else "inconclusive"
    if op == "<":
        t = claim[1]
        return "reproduced" if hi < t else "refuted" if lo >= t else "inconclusive"
    if op == "in":
        a, b = claim[1], claim[2]
        if a <= lo and hi <= b:
            return "reproduced"
        return "refuted" if hi < a or lo > b else "inconclusive"
    raise ValueError(f"unknown claim {claim!r}: expected ('>', t), ('<', t) or ('in', a, b)")


def diff_ci(k1: int, n1: int, k2: int, n2: int, z: float = 1.96) -> tuple[float, float, float]:
    """Difference of two independent proportions k1/n1 - k2/n2 with its normal 95% interval:
    ``(d, lo, hi)`` (NaN when a count is 0)."""
    if n1 <= 0 or n2 <= 0:
        return float("nan"), float("nan"), float("nan")
    p1, p2 = k1 / n1, k2 / n2
    d = p1 - p2
    h = z * math.sqrt(p1 * (1 - p1) / n1 + p2 * (1 - p2) / n2)
    return d, d - h, d + h


def paired_ci(a, b, z: float = 1.96) -> tuple[float, float, float]:
    """Mean of the paired differences a - b (per-sample 0/1 or scores) with its normal 95%
    interval: ``(d, lo, hi)``."""
    d = np.asarray(a, float) - np.asarray(b, float)
    d = d[np.isfinite(d)]
    if d.size < 2:
        return float("nan"), float("nan"), float("nan")
    m, se = float(d.mean()), float(d.std(ddof=1) / math.sqrt(d.size))
    return m, m - z * se, m + z * se


def _finding(paper, name, claim_text, v, evidence):
    return {"paper": paper, "finding": name, "claim": claim_text, "verdict": v,
            "evidence": evidence}


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
    import jax

    if jax.process_count() == 1:
        return [obj]
    from jax.experimental import multihost_utils as MU

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
# Section 1: accuracy (sharded over the global mesh)
# ----------------------------------------------------------------------------------------------
def sharded_predictions(apply_fn, params, color, shape, tokens, *, cell_px: int = 16,
                        batch: int = 256) -> np.ndarray:
    """Predicted answer class int [N] of a model on N scenes, sharded over every device of
    every process: each chunk of ``batch`` rows (padded to a multiple of the global device
    count) is laid out along a 1-d mesh ``("data",)`` over ``jax.devices()``; a process renders
    only the rows of its addressable devices; the predictions are all-gathered, so every
    process returns all N. ``color``, ``shape`` int [N, S, S] and ``tokens`` int [N, L] must be
    the same on every process (generate them from the same seed)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from gridvqa_jax.evaluate import _render

    mesh = Mesh(np.asarray(jax.devices()), ("data",))
    rows, rep = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
    n_dev = mesh.devices.size
    G = -(-batch // n_dev) * n_dev
    params_g = jax.device_put(params, rep)

    def fwd(p, img, tok):
        return jnp.argmax(apply_fn(p, img, tok)["answer_logprobs"], -1).astype(jnp.int32)

    fwd = jax.jit(fwd, in_shardings=(rep, rows, rows), out_shardings=rows)
    N = len(tokens)
    out = []
    for a in range(0, N, G):
        idx = np.arange(a, a + G).clip(max=N - 1)  # pad with the last row: one compile
        shards_img, shards_tok = [], []
        dmap = rows.addressable_devices_indices_map((G,))
        for dev, (sl,) in dmap.items():
            r = idx[sl]
            img = _render(jnp.asarray(color[r]), jnp.asarray(shape[r]), cell_px)
            shards_img.append(jax.device_put(img, dev))
            shards_tok.append(jax.device_put(jnp.asarray(tokens[r]), dev))
        H = shards_img[0].shape[1:]
        img_g = jax.make_array_from_single_device_arrays((G,) + H, rows, shards_img)
        tok_g = jax.make_array_from_single_device_arrays((G, tokens.shape[1]), rows, shards_tok)
        pred = fwd(params_g, img_g, tok_g)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils as MU

            pred = MU.process_allgather(pred, tiled=True)
        out.append(np.asarray(pred)[: min(G, N - a)])
    return np.concatenate(out) if out else np.zeros((0,), np.int32)


def _local_scenes(spec, seed, n):
    import jax

    from gridvqa_jax.world import generate as G

    return G.to_numpy(G.generate_chunk(spec, seed, 0, n, G.data_mesh(jax.local_devices())))


def _correct_by_bucket(model, scenes, dk, cell_px, batch, into):
    from gridvqa_jax.evaluate import bucket_key
    from gridvqa_jax.models import mdetr as M

    apply_fn, params = model
    pred = sharded_predictions(apply_fn, params, scenes.color, scenes.shape, scenes.tokens,
                               cell_px=cell_px, batch=batch)
    C = scenes.color.shape[1] * scenes.color.shape[2]
    truth = np.asarray(M.answer_index(scenes.answer, scenes.is_yesno, C))
    for bid, ok in zip(scenes.bucket, pred == truth):
        k, c = into.setdefault(bucket_key(bid, dk), [0, 0])
        into[bucket_key(bid, dk)] = [k + int(ok), c + 1]


def _acc_row(k, n):
    lo, hi = wilson(k, n)
    return {"acc": 100 * k / n if n else None, "k": k, "n": n, "ci": [100 * lo, 100 * hi]}


def run_regimes(sizes: dict, progress=lambda *_: None) -> dict:
    """Accuracy of the three regimes per bucket (``acc_n`` held-out samples per density, seed
    ``ACC_SEED`` + density index, as ``gridvqa evaluate``) and Table 2's accuracy rows
    (``t2_n`` D_pure samples per bucket D{1,2,3}_M_F0 at d07, seed ``T2_SEED`` + bucket id).
    Every process calls this together (collective). Accuracies in %, with Wilson 95% CIs."""
    from gridvqa_jax.evaluate import REGIMES
    from gridvqa_jax.training.export import load_reference_model
    from gridvqa_jax.world import universe as U

    models = {}
    for _, m, _ in REGIMES:
        if m not in models:
            fn, params, spec = load_reference_model(m)
            models[m] = (fn, params)
    grid = 5
    regimes = {}
    for name, m, d in REGIMES:
        counts: dict = {}
        for i, dk in enumerate(("d03", "d07")):
            spec = U.Spec.feasible(d, grid, U.DENSITIES[dk])[0]
            sc = _local_scenes(spec, ACC_SEED + i, sizes["acc_n"])
            _correct_by_bucket(models[m], sc, dk, 16, 256, counts)
            progress(f"regimes: {name} {dk}")
        K = sum(k for k, _ in counts.values())
        N = sum(c for _, c in counts.values())
        regimes[name] = {"model": m, "data": d, "overall": _acc_row(K, N),
                         "buckets": {b: _acc_row(*kc) for b, kc in sorted(counts.items())}}
    t2 = {}
    for row, m in (("M_pure", "pure"), ("M_spur", "spur")):
        t2[row] = {}
        for bname in T2_BUCKETS:
            dd, q, f = bname.split("_")
            bid = U.bucket_id(int(dd[1:]), q, int(f[1:]))
            spec = U.Spec("pure", grid, U.DENSITIES["d07"], 64, buckets=(bid,))
            sc = _local_scenes(spec, T2_SEED + bid, sizes["t2_n"])
            counts = {}
            _correct_by_bucket(models[m], sc, "d07", 16, 256, counts)
            (k, n), = counts.values()
            t2[row][f"{bname}_d07"] = _acc_row(k, n)
        progress(f"regimes: Table 2 accuracy {row}")
    return {"regimes": regimes, "table2_accuracy": t2, "paper_table2_accuracy": PAPER_T2_ACC,
            "n_per_density": sizes["acc_n"], "n_per_bucket_table2": sizes["t2_n"],
            "seeds": {"regimes": ACC_SEED, "table2": T2_SEED}, "cell_px": 16}


def regimes_findings(res: dict) -> list[dict]:
    """GridVQA-X's behavioural claims about the reference models, checked on ``run_regimes``."""
    out = []
    t2 = res["table2_accuracy"]
    for row, claim, text, paper in (
            ("M_pure", (">", 90.0), "M_pure answers D_pure Mixed count questions at depths 1-3 "
             "(accuracy > 90% at every depth)", "100 / 100 / 100"),
            ("M_spur", ("<", 20.0), "M_spur collapses on D_pure Mixed count questions at depths "
             "1-3 (accuracy < 20% at every depth)", "6 / 2 / 0")):
        cells = list(t2[row].values())
        vs = [verdict(c["ci"], claim) for c in cells]
        v = ("reproduced" if all(x == "reproduced" for x in vs) else
             "refuted" if any(x == "refuted" for x in vs) else "inconclusive")
        ev = "; ".join(f"{b}: {c['acc']:.1f}% [{c['ci'][0]:.1f}, {c['ci'][1]:.1f}] (n={c['n']})"
                       for b, c in t2[row].items()) + f" (paper {paper})"
        out.append(_finding("GridVQA-X", f"Table 2 accuracy: {row}", text, v, ev))
    cross = res["regimes"]["cross"]["buckets"]
    att = [(b, c) for b, c in cross.items() if b.startswith("D1_A_")]
    if att:
        k, n = sum(c["k"] for _, c in att), sum(c["n"] for _, c in att)
        row = _acc_row(k, n)
        out.append(_finding(
            "GridVQA-X", "M_spur keeps attribute-only questions on D_pure",
            "M_spur stays near 100% on attribute-only (D1 A) questions of D_pure (> 90%)",
            verdict(row["ci"], (">", 90.0)),
            f"cross regime, D1_A buckets pooled: {row['acc']:.1f}% [{row['ci'][0]:.1f}, "
            f"{row['ci'][1]:.1f}] (n={n}) (paper: 100%)"))
    return out


# ----------------------------------------------------------------------------------------------
# Section 2: Table 1 (local explainers), one unit per regime
# ----------------------------------------------------------------------------------------------
def run_table1_regime(sizes: dict, regime: str, fig_dir, progress=False) -> dict:
    """Table 1 for one regime (``scorecard.table1(regimes=(regime,))``); the figures it draws
    come back as PNG bytes (so a unit run on another process can hand them to process 0)."""
    SC = importlib.import_module("reproduction.table1")
    with tempfile.TemporaryDirectory() as tmp:
        res = SC.table1(n=sizes["t1_n"], batch=sizes["t1_batch"], regimes=(regime,),
                        progress=progress, figures_dir=tmp, n_figures=sizes["n_figures"])
        pngs = {f"heatmap_{Path(p).stem}.png": Path(p).read_bytes() for p in res["figures"]}
    res["figures"] = pngs
    return res


def merge_table1(parts: list[dict]) -> dict:
    """One Table 1 from per-regime results, with the paper's findings re-checked on the union
    of the per-sample scores (``scorecard.check_findings``)."""
    SC = importlib.import_module("reproduction.table1")
    out = {"table": {}, "scores": {}, "per_sample": {}, "missing": [], "figures": {}}
    for p in parts:
        for key in ("table", "scores", "per_sample"):
            for e, rs in p[key].items():
                out[key].setdefault(e, {}).update(rs)
        out["missing"] = sorted(set(out["missing"]) | set(p["missing"]))
        out["figures"].update(p["figures"])
        out["n"], out["seed"], out["budgets"] = p["n"], p["seed"], p["budgets"]
    order = [r for r, _, _ in SC.REGIMES]
    for key in ("table", "scores", "per_sample"):
        out[key] = {e: {r: rs[r] for r in order if r in rs} for e, rs in out[key].items()}
    out["findings"] = SC.check_findings(out["per_sample"])
    return out


_T1_MAP = {"holds": "reproduced", "reversed": "refuted", "does not hold": "refuted",
           "not significant": "inconclusive", "partly": "inconclusive",
           "not measured": "inconclusive"}


def table1_findings(res: dict) -> list[dict]:
    """The scorecard's four findings as verdicts (holds -> reproduced, reversed / does not hold
    -> refuted, anything else -> inconclusive); the scorecard's own test is kept as evidence."""
    return [_finding("GridVQA-X", f"Table 1: {f['finding']}", f["finding"],
                     _T1_MAP.get(f["verdict"], "inconclusive"),
                     f"[scorecard: {f['verdict']}] {f['evidence']}") for f in res["findings"]]


def table1_markdown(res: dict) -> str:
    """Table 1 as markdown: mean ± std (95% CI of the mean) per regime, the paper beside."""
    SC = importlib.import_module("reproduction.table1")
    regimes = [r for r, _, _ in SC.REGIMES]
    lines = ["| modality | method | " + " | ".join(f"{r} RMA | {r} IoU" for r in regimes) + " |",
             "|---|---|" + "---|---|" * len(regimes)]
    for mod in ("visual", "textual"):
        for e, rs in res["scores"].items():
            cells = []
            for r in regimes:
                s = rs.get(r)
                for m in ("rma", "iou"):
                    if s is None:
                        cells.append("")
                        continue
                    d = s[mod]["pixel"][m] if mod == "visual" else s[mod][m]
                    lo, hi = mean_ci(d["mean"], d["std"], d["n"])
                    txt = (f"{100 * d['mean']:.1f} ± {100 * d['std']:.1f} "
                           f"[{100 * lo:.1f}, {100 * hi:.1f}]" if np.isfinite(d["mean"]) else "n/a")
                    p = SC.PAPER_TABLE1.get(e, {}).get(mod, {}).get(r, {}).get(m)
                    cells.append(txt + (f" (paper {p[0]} ± {p[1]})" if p else ""))
            lines.append(f"| {mod} | {e} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Section 3: Table 2 synergy
# ----------------------------------------------------------------------------------------------
def run_synergy(sizes: dict, progress=False) -> dict:
    """``fallacy.run_check`` at the given sizes (EMAP, InterSHAP, PID by depth, verdicts,
    attribute vs relational, controls)."""
    FA = importlib.import_module("reproduction.table2")
    res = FA.run_check(n=sizes["syn_n"], n_boot=sizes["syn_boot"], progress=progress)
    return FA.payload(res)


def synergy_findings(res: dict) -> list[dict]:
    """GridVQA-X's additive-fallacy findings, from the bootstrap 95% interval of depth 3 -
    depth 1 (``fallacy.run_check``'s ``trend``) and the per-depth intervals."""
    out = []
    for est, name, paper in (("emap", "EMAP", "78.6 -> 64.1 %"),
                             ("intershap", "InterSHAP", "0.921 -> 0.629")):
        if est not in res.get("trend", {}) or "pure" not in res["trend"][est]:
            continue
        t = res["trend"][est]["pure"]["depth3_minus_depth1"]
        out.append(_finding(
            "GridVQA-X", f"Table 2: {name} synergy on M_pure falls with depth",
            f"{name}'s synergy on M_pure decreases from depth 1 to depth 3 (the additive-"
            "fallacy check fails)", verdict(t["ci"], ("<", 0.0)),
            f"depth3 - depth1 = {t['mean']:.3f} [{t['ci'][0]:.3f}, {t['ci'][1]:.3f}] "
            f"(fallacy verdict: {res['verdict'][est]['pure']}; paper {paper})"))
    if "emap" in res and "spurious" in res["emap"]:
        rows = res["emap"]["spurious"]
        vs = [verdict(rows[f"depth{d}"]["ci"], (">", 50.0)) for d in (1, 2, 3)]
        v = ("reproduced" if all(x == "reproduced" for x in vs) else
             "refuted" if all(x == "refuted" for x in vs) else "inconclusive")
        out.append(_finding(
            "GridVQA-X", "Table 2: EMAP reports high synergy on the shortcut model",
            "EMAP reports > 50% synergy on M_spur (D_spur) at every depth, though the model "
            "uses no relation", v, "; ".join(
                f"depth {d}: {rows[f'depth{d}']['mean']:.1f}% [{rows[f'depth{d}']['ci'][0]:.1f},"
                f" {rows[f'depth{d}']['ci'][1]:.1f}]" for d in (1, 2, 3))
            + " (paper 69.2 / 65.7 / 68.8)"))
    return out


# ----------------------------------------------------------------------------------------------
# Section 4: modality bias
# ----------------------------------------------------------------------------------------------
def run_bias(sizes: dict, log=lambda *_: None) -> dict:
    """``bias_jax.analysis.analyze(..., tables=True)`` on ``bias_n`` fresh closed-world
    samples (``analysis.ANALYSIS_SEED``) with the shipped detectors (and the second detectors
    when shipped), plus what the findings need (view agreement by true type)."""
    import jax

    A = importlib.import_module("bias_jax.analysis")
    EN = importlib.import_module("bias_jax.ensemble")
    dets = A.load_detectors()
    batch = A.closed_world_batch(dets["joint"][2], sizes["bias_n"], A.ANALYSIS_SEED)
    second = A.second_detectors()
    res, views = A.analyze(dets, batch, key=jax.random.key(BIAS_KEY_SEED), tables=True,
                           second=second, log=log)
    truth = np.asarray(batch.bias)
    labels = {v: np.asarray(views[v].label) for v in A.VIEWS}
    ens = np.asarray(EN.combine(labels))
    improved = dict(labels, **{v: np.asarray(views[f"{v}_improved"].label)
                               for v in ("benefit", "causal")})
    res["text"] = A.tables_text(res, f"closed-world benchmark, n={res['n']}")
    res["per_sample"] = {"truth": truth, "labels": labels, "ensemble": ens,
                         "labels_improved": improved,
                         "ensemble_improved": np.asarray(EN.combine(improved))}
    res["seed"] = A.ANALYSIS_SEED
    return res


def bias_findings(res: dict) -> list[dict]:
    """The modality-bias paper's findings (abstract and sections 4-5, appendix Table 7)
    checked against exact labels."""
    P = "modality bias"
    ps = res["per_sample"]
    truth, labels, ens = ps["truth"], ps["labels"], ps["ensemble"]
    out = []
    if np.all(truth >= 0):
        def versus_best(lab, en):
            ok = {v: lab[v] == truth for v in lab}
            best = max(ok, key=lambda v: ok[v].mean())
            return best, 100 * np.mean(en == truth), 100 * ok[best].mean(), \
                paired_ci(en == truth, ok[best])

        best, a_ens, a_best, (d, lo, hi) = versus_best(labels, ens)
        extra = ""
        if "labels_improved" in ps:
            ib, ia, ibest, (idd, ilo, ihi) = versus_best(ps["labels_improved"],
                                                         ps["ensemble_improved"])
            extra = (f"; improved views (graded benefit, probability-scale causal): ensemble "
                     f"{ia:.1f}% vs {ib} {ibest:.1f}%, {100 * idd:+.1f} pts "
                     f"[{100 * ilo:+.1f}, {100 * ihi:+.1f}]")
        out.append(_finding(
            P, "Finding 1: ensembling views beats every single view",
            "the prior-majority ensemble is more accurate than the best single view",
            verdict((lo, hi), (">", 0.0)),
            f"ensemble {a_ens:.1f}% vs best view {best} {a_best:.1f}%: paired difference "
            f"{100 * d:+.1f} pts [{100 * lo:+.1f}, {100 * hi:+.1f}] (n={truth.size}; paper "
            f"+7.7 / +15.0 pts){extra}"))
        agree = (labels["benefit"] == labels["flow"]) & (labels["flow"] == labels["causal"])
        bal, biased = truth == 1, truth != 1
        d, lo, hi = diff_ci(int(agree[bal].sum()), int(bal.sum()),
                            int(agree[biased].sum()), int(biased.sum()))
        out.append(_finding(
            P, "Finding 3: views agree more on balanced than on biased samples",
            "the three views agree (same label) more often on modality-balanced samples",
            verdict((lo, hi), (">", 0.0)),
            f"all three agree on {100 * agree[bal].mean():.1f}% of balanced (n={int(bal.sum())})"
            f" vs {100 * agree[biased].mean() if biased.any() else float('nan'):.1f}% of biased "
            f"(n={int(biased.sum())}) samples: {100 * d:+.1f} pts [{100 * lo:+.1f}, "
            f"{100 * hi:+.1f}]"))
        pb, pu = ens == 1, ens != 1
        d, lo, hi = diff_ci(int((ens == truth)[pb].sum()), int(pb.sum()),
                            int((ens == truth)[pu].sum()), int(pu.sum()))
        out.append(_finding(
            P, "Ensemble is more accurate on balanced than on biased calls",
            "in-class accuracy of the ensemble is higher for Modality-balance than for the "
            "biased classes", verdict((lo, hi), (">", 0.0)),
            f"{100 * d:+.1f} pts [{100 * lo:+.1f}, {100 * hi:+.1f}] (n = {int(pb.sum())} / "
            f"{int(pu.sum())}; paper Fakeddit 85.5 vs 56.7 / 57.1)"))
    swap = res.get("swap", {})
    accs = {g: s["ensemble"]["accuracy"] for g, s in swap.items()
            if s["ensemble"]["accuracy"] is not None}
    if len(accs) >= 2:
        n = res["n"]
        spread = max(accs.values()) - min(accs.values())
        p = float(np.mean(list(accs.values())))
        se = math.sqrt(2 * p * (1 - p) / n)
        ci = (spread - 1.96 * se, spread + 1.96 * se)
        out.append(_finding(
            P, "Finding 2: analysis fluctuates with the detectors",
            "swapping one detector changes the ensemble's accuracy by more than 2 points",
            verdict(ci, (">", 0.02)),
            "ensemble accuracy by detector group: " + ", ".join(
                f"{g} {100 * a:.1f}%" for g, a in accs.items())
            + f"; range {100 * spread:.1f} pts ± {196 * se:.1f} (paper Fakeddit 68.3-79.3)"))
    else:
        out.append(_finding(P, "Finding 2: analysis fluctuates with the detectors",
                            "swapping one detector changes the ensemble's accuracy",
                            "inconclusive", "no second detector shipped (Table 2 needs "
                            "checkpoints/bias_<kind>_b)"))
    km = res.get("kmeans")
    if km and km["ensemble"]["accuracy"] is not None and np.all(truth >= 0):
        a_eps, a_km = res["scores"]["ensemble"]["accuracy"], km["ensemble"]["accuracy"]
        d, lo, hi = diff_ci(int(round(a_eps * res["n"])), res["n"],
                            int(round(a_km * res["n"])), res["n"])
        out.append(_finding(
            P, "Table 7: a fixed flow threshold beats K-means",
            "the ensemble with the eps = 0.25 flow threshold is more accurate than with K-means",
            verdict((lo, hi), (">", 0.0)),
            f"{100 * a_eps:.1f}% vs {100 * a_km:.1f}%: {100 * d:+.1f} pts [{100 * lo:+.1f}, "
            f"{100 * hi:+.1f}] (paper 79.3 vs 65.3 / 83.3 vs 66.7)"))
    return out


# ----------------------------------------------------------------------------------------------
# Figures
# ----------------------------------------------------------------------------------------------
def _save_fig(fig, path):
    fig.savefig(path, dpi=110, format="png")
    import matplotlib.pyplot as plt

    plt.close(fig)


def threshold_figure(sweep: list, path) -> None:
    """Accuracy of the flow view and of the ensemble against the flow threshold eps (Table 6),
    the paper's ensemble accuracy (Fakeddit, MMFakeBench) dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    A = importlib.import_module("bias_jax.analysis")
    eps = [r["eps"] for r in sweep]
    fig, ax = plt.subplots(figsize=(5, 3.4))
    for k, lab in (("flow", "flow view (ours)"), ("ensemble", "ensemble (ours)")):
        ax.plot(eps, [100 * (r[k]["accuracy"] or float("nan")) for r in sweep], "o-", label=lab)
    for j, ds in enumerate(("Fakeddit", "MMFakeBench")):
        ax.plot(eps, [A.PAPER_T6[round(e, 2)][j][0] for e in eps], "x--", alpha=0.6,
                label=f"ensemble, paper {ds}")
    ax.set_xlabel("flow threshold eps")
    ax.set_ylabel("accuracy (%)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    _save_fig(fig, path)


def accuracy_figure(t2: dict, path) -> None:
    """Table 2's accuracy rows: ours (Wilson 95% CI) and the paper's, by depth."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.4))
    for row, c in (("M_pure", "tab:blue"), ("M_spur", "tab:red")):
        cells = list(t2[row].values())
        m = [x["acc"] for x in cells]
        err = [[x["acc"] - x["ci"][0] for x in cells], [x["ci"][1] - x["acc"] for x in cells]]
        ax.errorbar([1, 2, 3], m, yerr=err, fmt="o-", color=c, label=f"{row} (ours)")
        ax.plot([1, 2, 3], PAPER_T2_ACC[row], "x--", color=c, alpha=0.6, label=f"{row} (paper)")
    ax.set_xticks([1, 2, 3])
    ax.set_xlabel("relational depth (D_pure, Mixed, form 0, d07)")
    ax.set_ylabel("accuracy (%)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    _save_fig(fig, path)


# ----------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------
def _cell(c):
    return f"{c['acc']:.1f} [{c['ci'][0]:.1f}, {c['ci'][1]:.1f}]" if c and c["n"] else "-"


def regimes_markdown(res: dict) -> str:
    """The accuracy tables of ``run_regimes`` as markdown."""
    L = [f"Table 2, accuracy rows (% with Wilson 95% CI; D_pure, Mixed, form 0, d07; "
         f"{res['n_per_bucket_table2']} samples per cell):", "",
         "| model | source | depth 1 | depth 2 | depth 3 |", "|---|---|---|---|---|"]
    for row, vals in PAPER_T2_ACC.items():
        L.append(f"| {row} | paper | " + " | ".join(f"{v:.1f}" for v in vals) + " |")
        if row in res["table2_accuracy"]:
            L.append(f"| {row} | ours | " + " | ".join(
                _cell(c) for c in res["table2_accuracy"][row].values()) + " |")
    names = list(res["regimes"])
    L += ["", f"Accuracy of the three regimes (% with Wilson 95% CI; {res['n_per_density']} "
          "held-out samples per density, every bucket):", "",
          "| bucket | " + " | ".join(f"{n} ({res['regimes'][n]['model']} on "
                                     f"{res['regimes'][n]['data']})" for n in names) + " |",
          "|---|" + "---|" * len(names)]
    keys = sorted({k for r in res["regimes"].values() for k in r["buckets"]},
                  key=lambda k: (k[-3:], k))
    for k in keys:
        L.append(f"| {k} | " + " | ".join(_cell(res["regimes"][n]["buckets"].get(k))
                                          for n in names) + " |")
    L.append("| overall | " + " | ".join(_cell(res["regimes"][n]["overall"]) for n in names)
             + " |")
    L.append("| n | " + " | ".join(str(res["regimes"][n]["overall"]["n"]) for n in names) + " |")
    return "\n".join(L)


def _fmt_syn(s, est):
    p = 3 if est == "intershap" else 1
    return f"{s['mean']:.{p}f} ± {s['std']:.{p}f} [{s['ci'][0]:.{p}f}, {s['ci'][1]:.{p}f}]"


def synergy_markdown(res: dict) -> str:
    """Table 2's synergy rows as markdown (mean ± std [bootstrap 95% CI]) with the paper's."""
    L = [f"EMAP and PID in %, InterSHAP as a fraction; mean ± std [bootstrap 95% CI]; "
         f"{res['settings']['n']} samples per bucket, {res['settings']['n_boot']} resamples.", "",
         "| estimator | regime | depth 1 | depth 2 | depth 3 | paper d1 / d2 / d3 | "
         "d3 - d1 [95% CI] | trend |", "|---|---|---|---|---|---|---|---|"]
    paper = res.get("paper", {})
    for est in ("emap", "intershap", "pid"):
        for regime, row in res.get(est, {}).items():
            pr = paper.get(est, {}).get(regime)
            ptxt = " / ".join("-" if m is None else f"{m}" + (f" ± {s}" if s else "")
                              for m, s in pr) if pr else "-"
            t = res["trend"][est][regime]["depth3_minus_depth1"]
            L.append(f"| {est} | {regime} | " + " | ".join(
                _fmt_syn(row[f"depth{d}"], est) for d in (1, 2, 3)) + f" | {ptxt} | "
                f"{t['mean']:.3f} [{t['ci'][0]:.3f}, {t['ci'][1]:.3f}] | "
                f"{res['verdict'][est][regime]} |")
    return "\n".join(L)


def _versions() -> dict:
    import flax
    import jax

    v = {"python": platform.python_version(), "jax": jax.__version__, "flax": flax.__version__,
         "numpy": np.__version__}
    try:
        from importlib.metadata import version

        v["gridvqa-jax"] = version("gridvqa-jax")
    except Exception:  # not installed as a distribution (source checkout)
        import gridvqa_jax

        v["gridvqa-jax"] = getattr(gridvqa_jax, "__version__", "unknown")
    return v


def _device() -> dict:
    import jax

    d = jax.devices()
    return {"platform": d[0].platform, "kind": d[0].device_kind, "devices": len(d),
            "processes": jax.process_count(), "cpu_count": os.cpu_count()}


VERDICT_MARK = {"reproduced": "✅ reproduced", "refuted": "❌ refuted",
                "inconclusive": "❔ inconclusive"}


def report_markdown(results: dict, texts: dict) -> str:
    """``report.md``: settings, the verdict table, then every section's tables."""
    meta = results["meta"]
    L = ["# Reproduction report: GridVQA-X and sample-level modality bias", "",
         f"Mode `{meta['mode']}`; {meta['device']['devices']} {meta['device']['platform']} "
         f"device(s) in {meta['device']['processes']} process(es); wall time "
         f"{meta['wall_s']:.0f} s ({', '.join(f'{k} {v:.0f} s' for k, v in meta['section_wall_s'].items())}). "
         f"Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()) + ".", "",
         "Sample sizes: " + "; ".join(f"{SIZE_DOC.get(k, k)} = {v}"
                                      for k, v in meta["sizes"].items()) + ".", "",
         "## Verdicts", "",
         "A finding is *reproduced* when the 95% interval of our estimate lies wholly on the "
         "paper's side of the claim, *refuted* when it lies wholly on the other side, "
         "*inconclusive* otherwise (small samples give wide intervals).", "",
         "| paper | finding | verdict | evidence |", "|---|---|---|---|"]
    for f in results["findings"]:
        ev = str(f["evidence"]).replace("|", "\\|")
        claim = str(f["claim"]).replace("|", "\\|")  # "|Δ|" would split the table row
        L.append(f"| {f['paper']} | {claim} | {VERDICT_MARK.get(f['verdict'], f['verdict'])}"
                 f" | {ev} |")
    titles = {"regimes": "Accuracy: the three regimes and Table 2's accuracy rows",
              "local_explainers": "Table 1: local explainers (RMA / Otsu IoU, %)",
              "synergy": "Table 2: global synergy and the additive-fallacy check",
              "bias": "Modality bias: views, ensembles, thresholds, K-means, robustness"}
    for s in SECTIONS:
        L += ["", f"## {titles[s]}", ""]
        r = results[s]
        if r.get("available") is False:
            L.append(f"not available: {r['reason']}")
            continue
        L.append(texts.get(s, ""))
    figs = meta.get("figures", [])
    if figs:
        L += ["", "## Figures", ""] + [f"![{Path(f).stem}](figures/{f})" for f in figs]
    return "\n".join(L) + "\n"


def _not_available(exc) -> dict:
    return {"available": False, "reason": f"{type(exc).__name__}: {exc}"}


def _is_missing(exc) -> bool:
    """An ImportError or a missing attribute on an imported module: a section whose code has
    not landed (or lacks a function), reported as not available."""
    return isinstance(exc, (ImportError, AttributeError))


def compute(sizes: dict, *, sections=SECTIONS, progress: bool = True, log=None) -> dict:
    """Run the sections on every process; returns ``{"parts": {section: result or
    not-available}, "wall": {section: s}}`` (complete on process 0; other processes return
    their own units only)."""
    log = log or (lambda *_: None)
    rank, size = process_info()
    parts, wall = {}, {}
    if "regimes" in sections:  # collective: every process takes part
        t0 = time.perf_counter()
        try:
            parts["regimes"] = run_regimes(sizes, log)
        except Exception as e:
            if not _is_missing(e):
                raise
            parts["regimes"] = _not_available(e)
        wall["regimes"] = time.perf_counter() - t0
    units = []
    if "local_explainers" in sections:
        units += [("local_explainers", r) for r in ("pure", "spurious", "cross")]
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
        try:
            with process_local():
                if sec == "local_explainers":
                    val = run_table1_regime(sizes, arg, None, progress=progress)
                elif sec == "synergy":
                    val = run_synergy(sizes, progress=progress)
                else:
                    val = run_bias(sizes, log)
        except Exception as e:
            if not _is_missing(e):
                raise
            val = _not_available(e)
        mine[i] = (val, time.perf_counter() - t0)
    gathered = {}
    for d in gather_objects(mine):
        gathered.update(d)
    t1 = [gathered[i] for i, (s, _) in enumerate(units) if s == "local_explainers"]
    if t1:
        wall["local_explainers"] = sum(w for _, w in t1)
        bad = [v for v, _ in t1 if v.get("available") is False]
        if bad:
            parts["local_explainers"] = bad[0]
        else:
            try:
                parts["local_explainers"] = merge_table1([v for v, _ in t1])
            except Exception as e:
                if not _is_missing(e):
                    raise
                parts["local_explainers"] = _not_available(e)
    for i, (sec, _) in enumerate(units):
        if sec in ("synergy", "bias"):
            parts[sec], wall[sec] = gathered[i]
    return {"parts": parts, "wall": wall}


def build(parts: dict, fig_dir: Path) -> tuple[dict, dict]:
    """``(results, texts)`` from the sections' results: the findings, figures written into
    ``fig_dir``, the markdown of each section."""
    results, texts, findings, figures = {}, {}, [], []
    for s in SECTIONS:
        results[s] = parts.get(s, {"available": False, "reason": "not requested"})
    r = results["regimes"]
    if r.get("available") is not False:
        findings += regimes_findings(r)
        texts["regimes"] = regimes_markdown(r)
        accuracy_figure(r["table2_accuracy"], fig_dir / "table2_accuracy.png")
        figures.append("table2_accuracy.png")
    r = results["local_explainers"]
    if r.get("available") is not False:
        findings += table1_findings(r)
        SC = importlib.import_module("reproduction.table1")
        texts["local_explainers"] = (
            f"{r['n']} d07 samples per regime (seed {r['seed']}); mean ± std [95% CI of the "
            f"mean] at pixel level; budgets {r['budgets']}."
            + (f" Not available: {', '.join(r['missing'])}." if r.get("missing") else "")
            + "\n\n" + table1_markdown(r) + "\n\nThe scorecard's own text table:\n\n```\n"
            + SC.format_table(r) + "\n```")
        for name, data in sorted(r.pop("figures").items()):
            (fig_dir / name).write_bytes(data)
            figures.append(name)
        r.pop("per_sample", None)
    r = results["synergy"]
    if r.get("available") is not False:
        findings += synergy_findings(r)
        FA = importlib.import_module("reproduction.table2")
        FA.plot(r, fig_dir / "synergy_vs_depth.png")
        figures.append("synergy_vs_depth.png")
        texts["synergy"] = (synergy_markdown(r) + "\n\nThe fallacy module's text tables "
                            "(attribute vs relational, accuracy, controls):\n\n```\n"
                            + FA.format_table(r) + "\n```")
    r = results["bias"]
    if r.get("available") is not False:
        findings += bias_findings(r)
        A = importlib.import_module("bias_jax.analysis")
        A.venn_figure(r["venn"], fig_dir / "bias_venn.png", title=f"closed world, n={r['n']}")
        figures.append("bias_venn.png")
        if r.get("sweep"):
            threshold_figure(r["sweep"], fig_dir / "bias_threshold_sweep.png")
            figures.append("bias_threshold_sweep.png")
        texts["bias"] = ("Accuracy and macro-F1 against exact closed-world labels; cells are "
                         "share[in-class accuracy %].\n\n```\n" + r.pop("text") + "\n```")
        r.pop("per_sample", None)
    return results, {"texts": texts, "findings": findings, "figures": figures}


def check_out(out) -> Path:
    """``out`` as a Path, refusing an existing non-empty path (``FileExistsError``)."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(17, "exists and is not empty (use --overwrite to replace it)",
                              str(out))
    return out


def reproduce(out, mode: str = "quick", *, sizes: dict | None = None, sections=SECTIONS,
              overwrite: bool = False, progress: bool = True, log=None) -> dict:
    """Run every section and write ``out/report.md``, ``out/results.json`` and
    ``out/figures/*.png`` (module docstring); returns the results.

    ``mode``: "quick" or "full" (``SIZES``); ``sizes`` overrides entries. ``out`` must be
    absent or empty unless ``overwrite``. Files are staged in a temporary sibling directory and
    renamed to ``out`` when complete; under multi-process JAX only process 0 writes (the
    others return the same results). Raises the first unexpected exception of a section,
    leaving ``out`` as it was.
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
            "sections": list(sections), "versions": _versions(), "device": _device(),
            "seeds": {"regimes": ACC_SEED, "table2_accuracy": T2_SEED,
                      "local_explainers": _seed_of("reproduction.table1",
                                                   "EXPLAIN_SEED"),
                      "synergy": _seed_of("reproduction.table2", "SEED"),
                      "bias": _seed_of("bias_jax.analysis", "ANALYSIS_SEED"),
                      "bias_key": BIAS_KEY_SEED},
            "wall_s": wall, "section_wall_s": comp["wall"], "figures": extra["figures"],
            "command": " ".join(sys.argv) if sys.argv else ""}
        results = jsonable(results)
        (stage / "results.json").write_text(json.dumps(results, indent=1))
        (stage / "report.md").write_text(report_markdown(results, extra["texts"]))
        staging.publish(stage, out, overwrite=overwrite)
    except BaseException:
        staging.discard(stage)
        raise
    return results


def _seed_of(module, name):
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


def verdict_table(results: dict) -> str:
    """The verdicts as plain text lines (the CLI's human summary)."""
    return "\n".join(f"[{f['verdict']:>12}] {f['paper']}: {f['claim']}"
                     for f in results.get("findings", []))


__all__ = ["SECTIONS", "SIZES", "SIZE_DOC", "PAPER_T2_ACC", "wilson", "mean_ci", "verdict",
           "diff_ci", "paired_ci", "process_info", "gather_objects", "process_local",
           "sharded_predictions", "run_regimes", "regimes_findings", "run_table1_regime",
           "merge_table1", "table1_findings", "run_synergy", "synergy_findings", "run_bias",
           "bias_findings", "compute", "build", "reproduce", "check_out", "verdict_table",
           "jsonable", "report_markdown"]
