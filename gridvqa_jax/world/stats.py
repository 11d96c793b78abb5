"""Per-bucket dataset statistics: answer balance, shortcut accuracies, confuser coverage.

The shortcut numbers are those the GridVQA-X paper uses to argue D_pure defeats shortcuts:
bag-of-words accuracy (count every target look-alike, ignore relations; paper: 100% on D_spur,
36.07% on D_pure) and partial-logic accuracy (answer after dropping one anchor, i.e. with
V_{-k} instead of V_target). Host-side aggregation over ``verify.analyse_batch`` outputs.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from gridvqa_jax.world import universe as U
from gridvqa_jax.world import verify as V


class StatsAccumulator:
    """Accumulates per-bucket statistics over chunks of one spec (call ``add`` per chunk)."""

    def __init__(self):
        self.rows = defaultdict(lambda: defaultdict(list))

    def add(self, batch, spec: U.Spec, analysis=None, checks=None):
        """Add a Scene batch (numpy or jax) of ``spec``; analysis/checks are computed if absent."""
        analysis = V.analyse_batch(batch, spec) if analysis is None else analysis
        checks = V.verify(batch, spec) if checks is None else checks
        a = {k: np.asarray(v) for k, v in analysis.items()}
        bucket = np.asarray(batch.bucket)
        answer = np.asarray(batch.answer)
        ok = np.asarray(checks["ok"])
        n_obj = np.sum(np.asarray(batch.color) >= 0, axis=(1, 2))
        for b in np.unique(bucket):
            m = bucket == b
            key = f"{U.BUCKETS[b].name}_{spec.density_key}"
            r = self.rows[key]
            r["answer"].append(answer[m])
            r["ok"].append(ok[m])
            r["bow"].append(a["bow_correct"][m])
            r["n_objects"].append(n_obj[m])
            applies = a["partial_applies"][m]
            r["partial_hits"].append(np.sum(a["partial_correct"][m] & applies))
            r["partial_n"].append(np.sum(applies))
            r["coverage"].append(a["confuser_coverage"][m][a["n_anchors"][m] > 0])
        return self

    def result(self) -> dict:
        """{bucket_key: stats} plus an "_overall" entry; JSON-able."""
        out, tot = {}, defaultdict(float)
        for key in sorted(self.rows, key=_bucket_order):
            r = {k: (np.concatenate(v) if np.ndim(v[0]) else np.asarray(v))
                 for k, v in self.rows[key].items()}
            bucket = U.BUCKETS[U.BUCKET_INDEX[_parse_bucket(key)]]
            ans, n = r["answer"], len(r["answer"])
            values, counts = np.unique(ans, return_counts=True)
            s = {
                "n": n,
                "verify_pass": float(np.mean(r["ok"])),
                "answer_hist": {("yes" if v else "no") if bucket.is_yesno else str(int(v)): int(c)
                                for v, c in zip(values, counts)},
                "yes_rate": float(np.mean(ans)) if bucket.is_yesno else None,
                "answer_mean": None if bucket.is_yesno else float(np.mean(ans)),
                "answer_range": None if bucket.is_yesno else [int(ans.min()), int(ans.max())],
                "bow_acc": float(np.mean(r["bow"])),
                "partial_logic_acc": (float(r["partial_hits"].sum() / r["partial_n"].sum())
                                      if r["partial_n"].sum() else None),
                "confuser_coverage": float(np.mean(r["coverage"])) if r["coverage"].size else None,
                "n_objects": sorted(int(v) for v in np.unique(r["n_objects"])),
            }
            out[key] = s
            tot["n"] += n
            tot["ok"] += np.sum(r["ok"])
            tot["bow"] += np.sum(r["bow"])
            tot["ph"] += r["partial_hits"].sum()
            tot["pn"] += r["partial_n"].sum()
        if tot["n"]:
            out["_overall"] = {
                "n": int(tot["n"]), "verify_pass": tot["ok"] / tot["n"],
                "bow_acc": tot["bow"] / tot["n"],
                "partial_logic_acc": tot["ph"] / tot["pn"] if tot["pn"] else None,
            }
        return out


def _parse_bucket(key: str) -> U.Bucket:
    d, q, f = key.split("_")[:3]
    return U.Bucket(int(d[1:]), q, int(f[1:]))


def _bucket_order(key: str):
    b = _parse_bucket(key)
    return (U.BUCKET_INDEX[b], key)


def format_table(stats: dict) -> str:
    """Plain-text table of ``StatsAccumulator.result()``."""
    head = (f"{'bucket':<16}{'n':>7}{'verify':>8}{'answers':>16}{'BoW':>7}{'partial':>9}"
            f"{'C_k cov':>9}{'objs':>7}")
    lines = [head, "-" * len(head)]
    pct = lambda v: "   -" if v is None else f"{100 * v:5.1f}"  # noqa: E731
    for key, s in stats.items():
        if key.startswith("_"):
            continue
        ans = (f"yes {100 * s['yes_rate']:.1f}%" if s["yes_rate"] is not None
               else f"{s['answer_range'][0]}-{s['answer_range'][1]} m{s['answer_mean']:.1f}")
        objs = ",".join(map(str, s["n_objects"]))
        lines.append(f"{key:<16}{s['n']:>7}{pct(s['verify_pass']):>8}{ans:>16}"
                     f"{pct(s['bow_acc']):>7}{pct(s['partial_logic_acc']):>9}"
                     f"{pct(s['confuser_coverage']):>9}{objs:>7}")
    if "_overall" in stats:
        o = stats["_overall"]
        lines.append("-" * len(head))
        lines.append(f"{'overall':<16}{o['n']:>7}{pct(o['verify_pass']):>8}{'':>16}"
                     f"{pct(o['bow_acc']):>7}{pct(o['partial_logic_acc']):>9}")
    return "\n".join(lines)
