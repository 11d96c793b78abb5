"""The report of the reproduction: ``report.md`` (settings, one verdict per finding of both
papers, every section's tables with the paper's numbers beside ours, the figures) and the
verdicts as plain text lines for the command line.

Markdown of each section: ``regimes_markdown`` (accuracy), ``table1_markdown`` (Table 1),
``synergy_markdown`` (Table 2's synergy rows); the bias section brings its own text
(``reproduction.bias_tables.tables_text``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from reproduction import regimes as REG
from reproduction import stats as STATS
from reproduction import table1 as T1

SECTION_TITLES = {"regimes": "Accuracy: the three regimes and Table 2's accuracy rows",
                  "local_explainers": "Table 1: local explainers (RMA / Otsu IoU, %)",
                  "synergy": "Table 2: global synergy and the additive-fallacy check",
                  "bias": "Modality bias: views, ensembles, thresholds, K-means, robustness"}


def _cell(c):
    return f"{c['acc']:.1f} [{c['ci'][0]:.1f}, {c['ci'][1]:.1f}]" if c and c["n"] else "-"


def regimes_markdown(res: dict) -> str:
    """The accuracy tables of ``run_regimes`` as markdown."""
    L = [f"Table 2, accuracy rows (% with Wilson 95% CI; D_pure, Mixed, form 0, d07; "
         f"{res['n_per_bucket_table2']} samples per cell):", "",
         "| model | source | depth 1 | depth 2 | depth 3 |", "|---|---|---|---|---|"]
    for row, vals in REG.PAPER_T2_ACC.items():
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
    p = 3 if est.startswith("intershap") else 1
    return f"{s['mean']:.{p}f} ± {s['std']:.{p}f} [{s['ci'][0]:.{p}f}, {s['ci'][1]:.{p}f}]"


def synergy_markdown(res: dict) -> str:
    """Table 2's synergy rows as markdown (mean ± std [set-level 95% CI]) with the paper's,
    ours and the references' statistics (``table2.ESTIMATORS``), then what each one is
    (``res["definitions"]``)."""
    from reproduction import table2 as T2

    L = [f"EMAP % and PID in %, emap_gap in accuracy points, InterSHAP as a fraction; mean ± "
         f"std [set-level 95% CI: jackknife]; {res['settings']['n']} samples per bucket; "
         f"pid_null from {res['settings']['n_boot']} permutations of the answers.", "",
         "| estimator | regime | depth 1 | depth 2 | depth 3 | paper d1 / d2 / d3 | "
         "d3 - d1 [95% CI] | direction |", "|---|---|---|---|---|---|---|---|"]
    paper = res.get("paper", {})
    for est in T2.ESTIMATORS:
        for regime, row in res.get(est, {}).items():
            pr = paper.get(est, {}).get(regime)
            ptxt = " / ".join("-" if m is None else f"{m}" + (f" ± {s}" if s else "")
                              for m, s in pr) if pr else "-"
            tr = res["trend"][est][regime]
            t = tr["depth3_minus_depth1"]
            L.append(f"| {est} | {regime} | " + " | ".join(
                _fmt_syn(row[f"depth{d}"], est) for d in (1, 2, 3)) + f" | {ptxt} | "
                f"{t['mean']:.3f} [{t['ci'][0]:.3f}, {t['ci'][1]:.3f}] | "
                f"{tr['direction']} |")
    if res.get("definitions"):
        L += ["", "What each estimator is:", ""]
        L += [f"- `{e}` ({T2.UNITS[e]}): {d}" for e, d in res["definitions"].items()]
    return "\n".join(L)


def table1_markdown(res: dict) -> str:
    """Table 1 as markdown: mean ± std (95% CI of the mean) per regime, the paper beside
    (every explainer and control of ``res``, the ``objects`` floor included; a reference row
    ``<explainer>_ref`` beside the paper's ``<explainer>``), then the protocol
    of each row (players, baseline, explained quantity, budget: ``table1.table_protocol``)."""
    regimes = [r for r, _, _ in T1.REGIMES]
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
                    lo, hi = STATS.mean_ci(d["mean"], d["std"], d["n"])
                    txt = (f"{100 * d['mean']:.1f} ± {100 * d['std']:.1f} "
                           f"[{100 * lo:.1f}, {100 * hi:.1f}]" if np.isfinite(d["mean"]) else "n/a")
                    paper = T1.PAPER_TABLE1.get(e.removesuffix(T1.REFERENCE_SUFFIX), {})
                    p = paper.get(mod, {}).get(r, {}).get(m)
                    cells.append(txt + (f" (paper {p[0]} ± {p[1]})" if p else ""))
            lines.append(f"| {mod} | {e} | " + " | ".join(cells) + " |")
    protocol = T1.table_protocol(res)
    if protocol:
        lines += ["", "Protocol of each row:", "",
                  "| method | players | baseline (absent player) | explained quantity | budget |",
                  "|---|---|---|---|---|"]
        lines += [f"| {e} | {p['players']} | {p['baseline']} | {p['target']} | "
                  f"{T1.budget_text(p['budget'])} |" for e, p in protocol.items()]
        note = T1.sampling_note(protocol)
        lines += ["", note + "."] if note else []
    return "\n".join(lines)


def shipped_table1_markdown(res: dict, source: str) -> str:
    """Table 1 measured once and shipped (not recomputed by the run that prints it): a heading
    naming ``source``, its sample size and budgets, ``table1_markdown``, then its findings on
    the cell and the reference rows (``res``: a ``gridvqa explain --regimes --out`` results.json)."""
    findings = list(res.get("findings", [])) + list(res.get("findings_reference", []))
    lines = [f"### Table 1 at the default budgets (shipped: `{source}`, measured once, not "
             "recomputed by this run)", "",
             f"{res['n']} d07 samples per regime (seed {res['seed']}); budgets {res['budgets']}; "
             "mean ± std [95% CI of the mean] at pixel level.", "", table1_markdown(res)]
    if findings:
        lines += ["", "Its findings, each against the `objects` floor:", ""]
        lines += [f"- {VERDICT_MARK[f['verdict']]}: {f['claim']}: {f['evidence']}"
                  for f in findings]
    return "\n".join(lines)


VERDICT_MARK = {"reproduced": "✅ reproduced", "refuted": "❌ refuted",
                "inconclusive": "❔ inconclusive"}


def report_markdown(results: dict, texts: dict) -> str:
    """``report.md``: settings, the verdict table, then the tables of every section that ran
    (``results["meta"]["sections"]``; ``texts``: section -> markdown), then the figures."""
    meta = results["meta"]
    L = ["# Reproduction report: GridVQA-X and sample-level modality bias", "",
         f"Mode `{meta['mode']}`; {meta['device']['devices']} {meta['device']['platform']} "
         f"device(s) in {meta['device']['processes']} process(es); wall time "
         f"{meta['wall_s']:.0f} s ({', '.join(f'{k} {v:.0f} s' for k, v in meta['section_wall_s'].items())}). "
         f"Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()) + ".", "",
         "Sample sizes: " + "; ".join(f"{meta['size_doc'].get(k) or k} = {v}"
                                      for k, v in meta["sizes"].items()) + ".", "",
         "## Verdicts", "",
         "A finding is *reproduced* when the 95% interval of our estimate lies wholly on the "
         "paper's side of the claim, *refuted* when it lies wholly on the other side, "
         "*inconclusive* otherwise (small samples give wide intervals; `reproduction.stats`). "
         "Table 2's synergy findings are judged on Holm-adjusted one-sided p-values over their "
         "family instead, at 0.025 a side (`stats.holm_verdicts`). The width column is that "
         "of the widest interval behind a verdict, in points: 95% unless the evidence names "
         "another level (a Bonferroni-corrected one).",
         "",
         "| paper | finding | verdict | n | interval width | evidence |",
         "|---|---|---|---|---|---|"]
    for f in results["findings"]:
        ev = str(f["evidence"]).replace("|", "\\|")
        claim = str(f["claim"]).replace("|", "\\|")  # "|Δ|" would split the table row
        w = f.get("width")
        width = "-" if w is None or not np.isfinite(w) else f"{w:.3g}"
        L.append(f"| {f['paper']} | {claim} | {VERDICT_MARK[f['verdict']]} | "
                 f"{f.get('n') or '-'} | {width} | {ev} |")
    for s in meta["sections"]:
        L += ["", f"## {SECTION_TITLES[s]}", ""]
        L.append(texts[s])
    figs = meta.get("figures", [])
    if figs:
        L += ["", "## Figures", ""] + [f"![{Path(f).stem}](figures/{f})" for f in figs]
    return "\n".join(L) + "\n"


def verdict_table(results: dict) -> str:
    """The verdicts as plain text lines (the CLI's human summary)."""
    return "\n".join(f"[{f['verdict']:>12}] {f['paper']}: {f['claim']}"
                     for f in results.get("findings", []))


__all__ = ["SECTION_TITLES", "VERDICT_MARK", "regimes_markdown", "table1_markdown",
           "shipped_table1_markdown",
           "synergy_markdown", "report_markdown", "verdict_table"]
