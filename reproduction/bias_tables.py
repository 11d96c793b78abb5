"""The modality-bias paper's tables and Figure 3 as text and PNG, the paper's numbers beside
ours (``bias_jax.analysis.analyze`` results).

The paper scores its views against 300 human-labelled samples per dataset (Fakeddit,
MMFakeBench); ``PAPER_T*`` hold its reported numbers, per table. Ours are scored against
closed-world bias types that are exact by construction. Cells print as the paper's
``"0.78[85.53]"`` (:func:`format_cell`: share of the samples predicted as a type with two
decimals, in-class accuracy in percent).
"""

from __future__ import annotations

import math

import numpy as np

from bias_jax import ensemble as EN
from bias_jax.data.batch import BIAS_TYPES
from bias_jax.scoring import VENN_REGIONS
from mmx_base import staging


def format_cell(share: float, acc: float) -> str:
    """The paper's ``"0.78[85.53]"``: share (2 decimals) and in-class accuracy in percent
    (2 decimals; an empty class prints ``[0.00]`` as in the paper, unknown truth ``[-]``)."""
    if acc is None or (isinstance(acc, float) and math.isnan(acc)):
        return f"{share:.2f}[{'0.00' if share == 0 else '-'}]"
    return f"{share:.2f}[{100 * acc:.2f}]"


def venn_figure(counts: dict, path, views=EN.VIEWS, title: str = "") -> None:
    """Write Figure 3 as a PNG: one three-circle Venn diagram per class of ``counts``
    (``bias_jax.scoring.venn_counts``; circles drawn with matplotlib, region counts written in
    place). Written to a temporary name, then renamed."""

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Circle

    centres = [(-0.5, 0.35), (0.5, 0.35), (0.0, -0.45)]
    spots = {"100": (-0.95, 0.6), "010": (0.95, 0.6), "001": (0.0, -1.0), "110": (0.0, 0.75),
             "101": (-0.62, -0.3), "011": (0.62, -0.3), "111": (0.0, 0.08)}
    colours = ("tab:blue", "tab:orange", "tab:green")
    fig, axes = plt.subplots(1, len(counts), figsize=(4.2 * len(counts), 4.2))
    for ax, (name, regions) in zip(np.atleast_1d(axes), counts.items()):
        for (x, y), col, v in zip(centres, colours, views):
            ax.add_patch(Circle((x, y), 0.85, alpha=0.25, color=col))
            ax.text(x * 1.9, y * 1.9 + (0.25 if y > 0 else -0.2), v, ha="center", fontsize=10)
        for r, (x, y) in spots.items():
            ax.text(x, y, str(regions[r]), ha="center", va="center", fontsize=10)
        ax.set_xlim(-2, 2)
        ax.set_ylim(-2, 2)
        ax.set_aspect("equal")
        ax.axis("off")
        ax.set_title(name)
    if title:
        fig.suptitle(title)
    try:
        staging.write_atomic(path, lambda f: fig.savefig(f, format="png", dpi=100,
                                                         bbox_inches="tight"))
    finally:
        plt.close(fig)


# ----------------------------------------------------------------------------------------------
# The paper's numbers.
# ----------------------------------------------------------------------------------------------
# (Fakeddit, MMFakeBench) each as (UI cell, MB cell, UT cell, Acc %, F1 %); human labels, 300
# samples per dataset.
PAPER_T1 = {
    "benefit": (("0.04[0.00]", "0.85[78.43]", "0.11[44.12]", 71.67, 43.40),
                ("0.42[11.02]", "0.42[80.95]", "0.16[63.83]", 48.67, 47.98)),
    "flow": (("0.13[42.50]", "0.52[96.15]", "0.35[28.85]", 65.67, 54.51),
             ("0.04[0.00]", "0.67[70.00]", "0.29[12.50]", 50.33, 27.85)),
    "causal": (("0.33[29.29]", "0.61[87.43]", "0.06[27.78]", 64.67, 46.51),
               ("0.08[37.50]", "0.65[82.47]", "0.27[43.90]", 68.33, 54.89)),
    "ensemble": (("0.10[56.67]", "0.78[85.53]", "0.12[57.14]", 79.33, 64.75),
                 ("0.04[69.23]", "0.80[85.77]", "0.16[75.00]", 83.33, 68.44)),
    "benefit_flow": (("0.04[0.00]", "0.88[79.09]", "0.08[57.69]", 74.33, 46.27),
                     ("0.14[0.00]", "0.84[72.91]", "0.02[0.00]", 61.00, 25.85)),
    "benefit_causal": (("0.05[0.00]", "0.92[76.09]", "0.03[0.00]", 70.00, 27.94),
                       ("0.15[20.45]", "0.71[84.11]", "0.14[71.43]", 73.00, 59.00)),
    "flow_causal": (("0.22[35.38]", "0.72[86.64]", "0.06[27.78]", 72.00, 49.24),
                    ("0.00[0.00]", "0.96[74.56]", "0.04[46.15]", 73.33, 35.49)),
}
PAPER_T5 = {"random": ((77.33, 63.49), (70.67, 57.68)), "ensemble": ((79.33, 64.75),
            (83.33, 68.44)), "weighted": ((76.33, 63.88), (75.00, 60.40))}
PAPER_T6 = {0.0: ((72.67, 58.72), (63.00, 54.78)), 0.05: ((72.67, 58.72), (65.67, 53.84)),
            0.1: ((76.67, 62.63), (65.67, 53.84)), 0.15: ((79.33, 64.75), (75.00, 61.57)),
            0.2: ((79.33, 64.75), (79.67, 65.45)), 0.25: ((79.33, 64.75), (83.33, 68.44)),
            0.3: ((79.33, 64.75), (83.33, 68.44)), 0.35: ((77.33, 58.91), (83.33, 68.44)),
            0.4: ((75.67, 54.69), (81.33, 65.19))}  # ensemble (Acc, F1)
PAPER_T7 = {"eps": ((79.33, 64.75), (83.33, 68.44)), "kmeans": ((65.33, 31.37), (66.67, 52.94))}
PAPER_T2 = {"benefit": ((71.67, 64.67, 68.67, 54.67), (48.67, 40.67, 48.67, 61.67)),
            "causal": ((64.67, 60.33, 61.67, 58.67), (68.33, 70.33, 44.00, 62.33)),
            "ensemble": ((79.33, 68.33, 76.67, 74.67), (83.33, 71.67, 60.00, 63.00))}
# Table 14: HAMMER accuracy on the samples called Uni-image / Uni-text, per (image, text) ratio.
PAPER_T14 = {(0.6, 0.0): ((77.00, 85.46), (69.92, 60.00)), (0.4, 0.0): ((79.39, 87.15),
             (72.41, 63.27)), (0.2, 0.0): ((81.22, 88.59), (72.99, 64.90)),
             (0.0, 0.0): ((82.22, 90.52), (73.56, 66.12)), (0.0, 0.2): ((81.88, 88.31),
             (73.18, 55.84)), (0.0, 0.4): ((81.38, 85.25), (72.80, 44.65)),
             (0.0, 0.6): ((80.40, 81.25), (72.41, 37.55))}
PAPER_T15 = {"ours": (71.67, 64.67, 79.33), "multi": (71.67, 62.00, 73.33)}  # Fakeddit only
# Table 3: multi-view analysis with the flow view's saliency (UI, MB, UT cells, Acc, F1; FPS).
PAPER_T3 = {"attention": ((("0.10[56.67]", "0.78[85.53]", "0.12[57.14]", 79.33, 64.75),
                           ("0.04[69.23]", "0.80[85.77]", "0.16[75.00]", 83.33, 68.44)), 0.4942),
            "lime": ((("0.05[60.00]", "0.92[76.09]", "0.03[0.00]", 73.00, 37.94),
                      ("0.04[69.23]", "0.82[83.67]", "0.14[71.43]", 81.33, 65.19)), 0.3489)}
# Table 4: the flow view's predicted proportions (UI, MB, UT) per aggregation.
PAPER_T4 = {"sum": ((0.13, 0.52, 0.35), (0.04, 0.67, 0.29)),
            "mean": ((0.00, 0.01, 0.99), (0.00, 0.00, 1.00)),
            "max": ((0.09, 0.23, 0.68), (0.03, 0.33, 0.64))}
TABLE_HEADER = ("Paper: 300 human-labelled samples per dataset (Fakeddit | MMFakeBench). "
                "Ours: {n} closed-world samples whose bias type is exact by construction.")


def _pct(x) -> str:
    return "   -  " if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:6.2f}"


def _row(s: dict) -> str:
    p = s["proportions"]
    cells = " ".join(f"{format_cell(*p[t]):>12}" for t in BIAS_TYPES)
    return f"{cells} {_pct(s['accuracy'])} {_pct(s['macro_f1'])}"


IMPROVED_ROWS = (("benefit", "benefit, graded"), ("flow", "flow (as above)"),
                 ("causal", "causal, probability scale"), ("ensemble", "prior majority"),
                 ("random", "random majority"), ("weighted", "weighted 0.3/0.2/0.5"),
                 ("benefit_flow", "benefit_flow"), ("benefit_causal", "benefit_causal"),
                 ("flow_causal", "flow_causal"))


def improved_text(res: dict) -> list:
    """Lines of the improved views' block of :func:`tables_text` (``ensemble.VARIANTS``):
    their rows with the same columns as Table 1, the headline ensemble marked ``*``, the
    per-type confusion of the views and ensembles, and the identifiable bound."""
    if "scores_improved" not in res:
        return []
    d = res["default"]
    marked = {v: EN.rule_key(d["rule"] if v == d["variant"] else None, v)
              for v in ("paper", "improved")}
    L = ["", "Improved views (not in the paper): graded benefit, causal on the probability "
             "scale (ensemble.VARIANTS); * = the answer of each variant "
             f"(headline: {d['variant']}, rule {d['rule']})",
         f"{'':22}{'UI':>12} {'MB':>12} {'UT':>12} {'Acc':>6} {'F1':>6}"]
    for k, name in IMPROVED_ROWS:
        star = "*" if k == marked["improved"] else " "
        L.append(f"{star}{name:21}{_row(res['scores_improved'][k])}")
    L.append(f"paper's views, answer: {marked['paper']:10}{_row(res['scores'][marked['paper']])}")
    L.append("Krippendorff alpha between improved views: " + ", ".join(
        f"{k} {v:.3f}" for k, v in res["agreement_improved"].items()))
    if "identifiable" in res:
        L.append(f"{'identifiable bound':22}{_row(res['identifiable'])} (exact types, real "
                 "Uni-image -> balance: the same inputs as real balanced samples; none by "
                 "default)")
    if "confusion" in res:
        L.append("Confusion [true UI, MB, UT] x [predicted UI, MB, UT]:")
        for var, conf in res["confusion"].items():
            for name, m in conf.items():
                L.append(f"  {var:8} {name:26} " + "  ".join(
                    " ".join(f"{x:5d}" for x in row) for row in m))
    return L


CORE_PARTS_NAMES = {"extracted": "extracted (offline model-based extractor: joint detector's "
                                 "grounding gates where it has them, else occlusion; occlusion "
                                 "of the text / joint detectors for the words)",
                    "occlusion": "occlusion (cells and words occluded one at a time: joint / "
                                 "image and text / joint detectors)",
                    "exact": "exact (the closed world's ground truth, which real data lacks)"}


def core_parts_text(res: dict) -> list:
    """Lines naming the core parts the causal rows used (``res["core_parts"]``), their IoU
    with the exact parts (``res["core_parts_iou"]``) and, when ``res["exact_parts"]`` holds
    the rows with exact parts (``{variant: {"causal", "ensemble"}}`` score dicts of the same
    samples, ``reproduction.modality_bias.exact_parts_bound``: the reference the extracted
    parts approximate), those rows beside the extracted ones. Empty for results that do not
    say (older results files)."""
    parts = res.get("core_parts")
    if parts is None:
        return []
    L = [f"causal rows: core parts {CORE_PARTS_NAMES.get(parts, parts)}"]
    iou = res.get("core_parts_iou")
    if iou:
        L[0] += (f"; IoU with the exact parts: cells {iou['cells']:.3f}, "
                 f"tokens {iou['tokens']:.3f}")
    ex = res.get("exact_parts")
    if ex:
        L += [f"{'views / core parts':30}{'UI':>12} {'MB':>12} {'UT':>12} {'Acc':>6} {'F1':>6}"]
        by = {"paper": res.get("scores", {}), "improved": res.get("scores_improved", {})}
        for var, rows in ex.items():
            for k in ("causal", "ensemble"):
                if k in by.get(var, {}):
                    L.append(f"{f'{var} {k}, {parts}':30}{_row(by[var][k])}")
                L.append(f"{f'{var} {k}, exact':30}{_row(rows[k])}")
    return L


def tables_text(res: dict, title: str = "") -> str:
    """Every table of ``analyze(..., tables=True)`` as text, the paper's numbers beside ours
    (ours: UI / MB / UT cells, Acc %, F1 %; paper: Acc, F1 on Fakeddit | MMFakeBench)."""
    L = [title] if title else []
    L.append(TABLE_HEADER.format(n=res["n"]))
    sc = res["scores"]
    L += core_parts_text(res)
    L += ["", "Table 1 (+ ablations): views and multi-view analysis",
          f"{'':16}{'UI':>12} {'MB':>12} {'UT':>12} {'Acc':>6} {'F1':>6} | paper Acc/F1 "
          "Fakeddit | MMFakeBench"]
    for k in ("benefit", "flow", "causal", "ensemble", "benefit_flow", "benefit_causal",
              "flow_causal"):
        f, m = PAPER_T1[k]
        L.append(f"{k:16}{_row(sc[k])} | {f[3]:6.2f} {f[4]:6.2f} | {m[3]:6.2f} {m[4]:6.2f}")
    L += ["", "Table 5: ensemble strategies"]
    for k, name in (("random", "random majority"), ("ensemble", "prior majority"),
                    ("weighted", "weighted 0.3/0.2/0.5")):
        f, m = PAPER_T5[k]
        L.append(f"{name:22}{_row(sc[k])} | {f[0]:6.2f} {f[1]:6.2f} | {m[0]:6.2f} {m[1]:6.2f}")
    L.append("Krippendorff alpha between views: " + ", ".join(
        f"{k} {v:.3f}" for k, v in res["agreement"].items()))
    L += improved_text(res)
    L += ["", "Figure 3: Venn counts (regions benefit/flow/causal: 100 010 001 110 101 011 111)"]
    for t, reg in res["venn"].items():
        L.append(f"{t:10} " + " ".join(f"{reg[r]:6d}" for r in VENN_REGIONS))
    if "sweep" in res:
        L += ["", "Table 6: flow threshold eps (flow view; ensemble)"]
        for r in res["sweep"]:
            f, m = PAPER_T6[round(r["eps"], 2)]
            L.append(f"eps {r['eps']:.2f} flow {_pct(r['flow']['accuracy'])} "
                     f"{_pct(r['flow']['macro_f1'])} ens {_row(r['ensemble'])} | "
                     f"{f[0]:6.2f} {f[1]:6.2f} | {m[0]:6.2f} {m[1]:6.2f}")
    if "kmeans" in res:
        L += ["", "Table 7: K-means on the flow score instead of eps (ensemble)"]
        for k, s in (("eps", sc["ensemble"]), ("kmeans", res["kmeans"]["ensemble"])):
            f, m = PAPER_T7[k]
            L.append(f"{k:8}{_row(s)} | {f[0]:6.2f} {f[1]:6.2f} | {m[0]:6.2f} {m[1]:6.2f}")
    if "aggregation" in res:
        L += ["", "Table 4: the flow view's predicted proportion [in-class accuracy] per "
                  "aggregation; flow Acc F1; ensemble Acc F1 | paper proportions Fakeddit | "
                  "MMFakeBench"]
        for agg, r in res["aggregation"].items():
            f, m = PAPER_T4[agg]
            L.append(f"{agg:5}{_row(r['flow'])} ens {_pct(r['ensemble']['accuracy'])} "
                     f"{_pct(r['ensemble']['macro_f1'])} | "
                     + " ".join(f"{x:.2f}" for x in f) + " | " + " ".join(f"{x:.2f}" for x in m))
    if "saliency" in res:
        sa = res["saliency"]
        L += ["", f"Table 3: flow saliency, multi-view analysis on the first {sa['n']} samples "
                  "(ensemble UI MB UT Acc F1; flow samples/s) | paper Acc F1 Fakeddit | "
                  "MMFakeBench, FPS"]
        for sal in ("attention", "lime"):
            (f, m), fps = PAPER_T3[sal]
            r = sa[sal]
            L.append(f"{sal:10}{_row(r['ensemble'])} {r['samples_per_s']:8.1f}/s | "
                     f"{f[3]:6.2f} {f[4]:6.2f} | {m[3]:6.2f} {m[4]:6.2f}, {fps}")
    if "swap" in res:
        L += ["", "Table 2: detector swap (accuracy %; G2 image, G3 joint, G4 text swapped)",
              f"{'':10}" + "".join(f"{g:>8}" for g in res["swap"]) + " | paper Fakeddit G1-G4"]
        for v in ("benefit", "causal", "ensemble"):
            L.append(f"{v:10}" + "".join(f"{_pct(s[v]['accuracy']):>8}" for s in
                                           res["swap"].values()) + " | " +
                     " ".join(f"{x:6.2f}" for x in PAPER_T2[v][0]))
        if len(res["swap"]) < 4:
            L.append(f"(second detectors present: {res.get('second_detectors')})")
    if "multi" in res:
        mu = res["multi"]
        L += ["", f"Table 15: multi-detector ensemble per kind ({', '.join(mu['kinds'])}), "
                  "accuracy %: benefit causal multi-view | paper Fakeddit ours -> multi"]
        L.append(f"single {_pct(sc['benefit']['accuracy'])} {_pct(sc['causal']['accuracy'])} "
                 f"{_pct(sc['ensemble']['accuracy'])} | " + " ".join(
                     f"{x:6.2f}" for x in PAPER_T15["ours"]))
        L.append(f"multi  {_pct(mu['benefit']['accuracy'])} {_pct(mu['causal']['accuracy'])} "
                 f"{_pct(mu['ensemble']['accuracy'])} | " + " ".join(
                     f"{x:6.2f}" for x in PAPER_T15["multi"]))
    if "masking" in res:
        L += ["", "Table 14: joint detector accuracy % [change] after masking (image, text); "
                  "groups = predicted (and true) Uni-image / Uni-text; paper UI UT "
                  "Fakeddit | MMFakeBench"]
        for r in res["masking"]:
            g = r["groups"]
            cells = " ".join(f"{k}={_pct(v['accuracy'])}[{100 * v['delta']:+.2f}]"
                             for k, v in g.items())
            f, m = PAPER_T14[(r["image_ratio"], r["text_ratio"])]
            ens = (f" ens acc {_pct(r['ensemble']['accuracy'])}" if "ensemble" in r else "")
            L.append(f"({r['image_ratio']:.1f},{r['text_ratio']:.1f}) {cells}{ens} | "
                     f"{f[0]:.2f} {f[1]:.2f} | {m[0]:.2f} {m[1]:.2f}")
    return "\n".join(L)


__all__ = ["PAPER_T1", "PAPER_T2", "PAPER_T3", "PAPER_T4", "PAPER_T5", "PAPER_T6", "PAPER_T7",
           "PAPER_T14", "PAPER_T15", "TABLE_HEADER", "IMPROVED_ROWS", "CORE_PARTS_NAMES",
           "format_cell", "venn_figure", "improved_text", "core_parts_text", "tables_text"]
