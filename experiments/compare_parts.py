"""Two Table 1 runs side by side, paired on the samples they share (e.g. two budgets).

Each run's ``--parts DIR`` holds one file per explainer x regime (``table1_parts``), or, for a
row stopped before it was whole (``--piece``), its folder of finished pieces, which counts with
the samples those pieces hold (``table1_parts.read_pieces``). A run may also be given as the
``per_sample.npz`` of a finished ``--out`` folder (``table1_parts.load_per_sample``, e.g. the
shipped ``docs/table1_default/per_sample.npz``): its rows hold samples 0..n-1, their budgets
from the ``results.json`` beside it, and no samples digest. Table 1's samples of a regime are
``regime_scenes(variant, n, seed)``, whose first ``m`` samples are the same for any ``n >= m``,
so a run at ``n = 32`` and one at ``n = 64`` (same seed) share their first 32. For every
explainer and regime in both folders this prints each run's mean over the samples both hold,
the paired difference A - B with its 95% interval (``stats.paired_ci``) and the per-sample
correlation, for visual (pixel level) and textual RMA / IoU, with each run's budget. The
samples are the same when the two rows' fingerprints carry the same samples digest (e.g. two
budgets of one ``--convergence`` sweep); otherwise both folders must hold the regime's
``objects`` row and its scores must agree on their first samples. ``--floor PART`` (a control's
part file, e.g. a sweep's ``objects__pure.npz``) adds that floor's mean on the same samples and
the paired difference A - floor; its fingerprint must name the row's regime and carry the
samples digest of each row that has one, and it stands in for the objects row of a folder that
has none (a sweep's run folders).

    python experiments/compare_parts.py A B [--rows ROW ...] [--regimes ...] [--floor PART]
    (A, B: a parts folder or a per_sample.npz)

Prints one text table and, last, a JSON line. docs/results.md reports its numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from gridvqa_jax.explain.scoring import ROW_METRICS, row_scores
from mmx_base.errors import InputError
from reproduction import stats as STATS
from reproduction import table1_parts as PARTS

CONTROLS = ("objects", "oracle", "random")


def _parts(d: Path) -> dict[tuple[str, str], Path | dict]:
    """Each explainer x regime of a run: in a parts folder its part file, else its pieces
    folder; in a ``per_sample.npz`` ``{"scores", "budget"}`` (budget from the ``results.json``
    beside it, else None)."""
    d = Path(d)
    if d.is_file():
        per_sample = PARTS.load_per_sample(d)
        meta = d.parent / "results.json"
        budgets = json.loads(meta.read_text()).get("budgets", {}) if meta.is_file() else {}
        return {(e, r): {"scores": s, "budget": budgets.get(e)}
                for e, rs in per_sample.items() for r, s in rs.items()}
    if not d.is_dir():
        raise InputError(f"{d}: neither a parts folder nor a per_sample.npz")
    out = {}
    for f in sorted(Path(d).glob("*__*.pieces")):
        if f.is_dir():
            out[tuple(f.name[:-len(".pieces")].split("__", 1))] = f
    for f in sorted(Path(d).glob("*__*.npz")):
        e, r = f.stem.split("__", 1)
        out[(e, r)] = f
    return out


def _row(path: Path | dict) -> tuple[dict, np.ndarray, dict]:
    """``(scores, sample indices, fingerprint)`` of a part file, a pieces folder or a
    ``per_sample.npz`` row (fingerprint: its budget only)."""
    if isinstance(path, dict):
        n = len(np.asarray(path["scores"]["form"]))
        return path["scores"], np.arange(n), {"budget": path["budget"]}
    if path.is_dir():
        return PARTS.read_pieces(path)
    scores, fingerprint, _ = PARTS.read_part(path)
    return scores, np.arange(len(np.asarray(scores["form"]))), fingerprint


def _objects(p: dict, regime: str, digest, floor) -> np.ndarray | None:
    """A run's objects floor on ``regime`` (visual RMA per sample): its own objects row, else
    the ``floor`` part ``(scores, fingerprint)`` when that is of the run's samples (``digest``)."""
    if ("objects", regime) in p:
        return row_scores(_row(p[("objects", regime)])[0], "visual", "rma")
    if floor is not None and digest is not None and floor[1].get("samples") == digest \
            and floor[1].get("regime") == regime:
        return row_scores(floor[0], "visual", "rma")
    return None


def _shared_samples(pa: dict, pb: dict, regime: str, digests=(None, None), floor=None) -> int:
    """How many first samples of ``regime`` the two runs share, checked on the objects floor
    (each run's objects row, or ``floor`` for a run of its samples digest: ``_objects``)."""
    oa, ob = (_objects(p, regime, dg, floor) for p, dg in zip((pa, pb), digests))
    if oa is None or ob is None:
        raise InputError(f"regime {regime}: both runs need an objects__{regime} row (or a "
                         "--floor part of their samples) to check that the samples are the same")
    n = min(len(oa), len(ob))
    if not np.allclose(oa[:n], ob[:n], equal_nan=True):
        raise InputError(f"regime {regime}: the objects floor differs on the first {n} samples: "
                         "the two runs do not share their samples (another seed or data?)")
    return n


def _check_floor(floor, fp: dict, regime: str, fa: dict, fb: dict, key: str) -> None:
    """``InputError`` unless the control part ``floor`` (fingerprint ``fp``) is of the row's
    samples: its fingerprint names ``regime`` and carries the samples digest of each row that
    has one (a ``per_sample.npz`` row has none; at least one row must)."""
    digest = fp.get("samples")
    if fp.get("regime") != regime or digest is None \
            or {fa.get("samples"), fb.get("samples")} - {None} != {digest}:
        raise InputError(f"{key}: the floor {floor} is of regime {fp.get('regime')} with "
                         f"samples digest {digest}, the rows of {regime} with "
                         f"{fa.get('samples')} / {fb.get('samples')}: not the same samples")


def compare(a_dir, b_dir, rows=None, regimes=None, floor=None) -> dict:
    """``{"<row>/<regime>": {"n", "budget_a", "budget_b", "pieces", "samples",
    "<modality>_<metric>": {"a", "b", "diff": (d, lo, hi), "r"[, "floor", "a_floor"]}}}``
    over the explainers and regimes both folders hold (``rows`` / ``regimes`` keep only those
    named; the controls are left out unless named); ``pieces``: the runs (``"a"``, ``"b"``)
    whose row is a pieces folder, ``samples``: the indices of the n paired samples. With
    ``floor`` (a control's part file of the same samples, ``_check_floor``): ``floor``, its
    mean on those samples, and ``a_floor``, the paired difference A - floor ``(d, lo, hi)``."""
    pa, pb = _parts(a_dir), _parts(b_dir)
    sf, ffp, _ = (None, None, None) if floor is None else PARTS.read_part(floor)
    both = sorted(set(pa) & set(pb))
    keep = [(e, r) for e, r in both
            if (e in rows if rows else e not in CONTROLS) and (not regimes or r in regimes)]
    if not keep:
        raise InputError(f"{a_dir} and {b_dir} share no explainer x regime part"
                         + (f" among {', '.join(rows)}" if rows else ""))
    shared, out = {}, {}
    for e, r in keep:
        sa, ia, fa = _row(pa[(e, r)])
        sb, ib, fb = _row(pb[(e, r)])
        common = np.intersect1d(ia, ib)
        if fa.get("samples") is None or fa.get("samples") != fb.get("samples"):
            if r not in shared:
                shared[r] = _shared_samples(pa, pb, r, (fa.get("samples"), fb.get("samples")),
                                            None if sf is None else (sf, ffp))
            common = common[common < shared[r]]
        if len(common) < 2:
            raise InputError(f"{e}/{r}: the two runs share {len(common)} finished samples; "
                             "a paired difference needs two")
        pa_i, pb_i = np.searchsorted(ia, common), np.searchsorted(ib, common)
        if sf is not None:
            _check_floor(floor, ffp, r, fa, fb, f"{e}/{r}")
        row = {"n": int(len(common)), "budget_a": fa.get("budget"), "budget_b": fb.get("budget"),
               "pieces": [k for k, p in (("a", pa), ("b", pb))
                          if isinstance(p[(e, r)], Path) and p[(e, r)].is_dir()],
               "samples": common.tolist()}
        for mod, m in ROW_METRICS:
            x, y = row_scores(sa, mod, m)[pa_i], row_scores(sb, mod, m)[pb_i]
            ok = np.isfinite(x) & np.isfinite(y)
            row[f"{mod}_{m}"] = {"a": float(np.mean(x[ok])), "b": float(np.mean(y[ok])),
                                 "diff": STATS.paired_ci(x, y),
                                 "r": float(np.corrcoef(x[ok], y[ok])[0, 1])}
            if sf is not None:
                f = row_scores(sf, mod, m)[common]
                row[f"{mod}_{m}"].update(floor=float(np.nanmean(f)),
                                         a_floor=STATS.paired_ci(x, f))
        out[f"{e}/{r}"] = row
    return out


def format_compare(res: dict, a_name: str, b_name: str) -> str:
    """The comparison as text: one line per row, regime and metric."""
    lines = [f"A = {a_name}, B = {b_name}: means over the shared samples in %, A - B in points "
             "[95% interval], per-sample r"]
    for key, row in res.items():
        partial = (f"; unfinished, pieces of {' and '.join(x.upper() for x in row['pieces'])}: "
                   f"samples {row['samples']}" if row.get("pieces") else "")
        lines.append(f"{key} (n = {row['n']}; budget A {row['budget_a']}, B {row['budget_b']}"
                     f"{partial})")
        for mod, m in ROW_METRICS:
            c = row[f"{mod}_{m}"]
            d = c["diff"]
            floor = (f"  floor {100 * c['floor']:5.1f}  A - floor "
                     f"{STATS.points(*c['a_floor']):>21s}" if "floor" in c else "")
            lines.append(f"  {mod:8s} {m.upper():4s} A {100 * c['a']:5.1f}  B {100 * c['b']:5.1f}"
                         f"  A - B {STATS.points(*d):>21s}"
                         f"  r {c['r']:.2f}{floor}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a", help="run A: a parts folder or a finished run's per_sample.npz")
    p.add_argument("b", help="run B: a parts folder or a finished run's per_sample.npz")
    p.add_argument("--rows", nargs="+", default=None, help="explainers (default: all but controls)")
    p.add_argument("--regimes", nargs="+", default=None, choices=["pure", "spurious", "cross"])
    p.add_argument("--floor", default=None,
                   help="a control's part file of the same samples (e.g. objects__pure.npz): "
                        "its mean and A - floor beside each metric")
    args = p.parse_args(argv)
    try:
        res = compare(args.a, args.b, args.rows, args.regimes, args.floor)
    except InputError as e:
        p.error(str(e))
    print(format_compare(res, args.a, args.b))
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
