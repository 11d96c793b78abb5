"""GridVQA-X Table 2 and its additive-fallacy check: do global synergy estimators grow with
relational depth on a model that reasons (M_pure) and stay flat on a shortcut model (M_spur)?

Per regime (pure = M_pure on D_pure, spurious = M_spur on D_spur, cross = M_spur on D_pure) and
estimator (EMAP, InterSHAP, PID; ``gridvqa_jax.explain.global_synergy``) the score is computed on
N held-out samples of each of the buckets D1/D2/D3 Mixed, form 0 (count), density d07, generated
with seed ``SEED + bucket id`` for D_pure and ``SEED + 1000 + bucket id`` for D_spur
(``synergy_check.bucket_seed``: independent samples of the two variants; no training or
evaluation stream uses these seeds), rendered at
the models' 16 px per cell (``explain.synergy_check.bucket_samples``). Within a bucket the N
samples form the EMAP N-set.

Units (the paper's, ``SCALE``): EMAP and PID in percent (100 x the mean per-sample share; 100 x
the PID synergy share S / I(X1, X2; Y)), emap_gap in accuracy points, InterSHAP as a fraction in
[0, 1]. ``std`` is the spread over samples (per-sample scores; the paper's +-) or the jackknife
standard error (PID, a set-level score); ``se`` the jackknife standard error and ``ci`` the
set-level 95% interval ``mean ± 1.96 se``, clipped to the score's range
(``global_synergy.jackknife_scores``: every score depends on the whole N-set, so the set is
resampled by deleting one sample at a time and recomputing the score, never by treating the
samples as independent); ``pid_null`` is PID's chance level (answers permuted) with its
permutation interval.

Direction over depth (``direction``, a description): from the 95% interval of ``score(depth 3)
- score(depth 1)`` (two independent buckets: ``stats.independent_difference`` of the jackknife
estimates) against the estimator's minimum effect ``MIN_EFFECT``: "increasing" if it lies above
+effect, "decreasing" if below -effect, "flat" if within [-effect, +effect], "unclear"
otherwise. The paper's findings (``check_findings``) get verdicts of the one vocabulary of
``reproduction.stats``, each a claim with the minimum effect, the whole family controlled for
multiplicity by Holm's method (``stats.holm_verdicts``).

Attribute matching vs relational synergy: the same estimators on D1 attribute-only questions
(A: "How many red circles are there?", no relation) beside D1 Mixed (M: one relation), both
form 0, d07, with the interval of M - A. An estimator that separates relational synergy from
attribute matching must score M above A on M_pure, and not on M_spur.

Controls (``explain.controls.synergy_control_models``): stand-in apply functions on the same
inputs with known synergy: additive ``g(t) + h(v)`` and one-modality models (EMAP and InterSHAP
exactly 0), and an XOR of one bit per modality (EMAP ~1 for balanced bits). ``emap_gap`` is
scored against each control's own answers (``synergy_check.run_controls``), so the XOR's
additive projection loses about half of them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from mmx_base import staging
from mmx_base.errors import InputError
from gridvqa_jax.explain import global_synergy as GS
from gridvqa_jax.explain.synergy_check import (VARIANT_STRIDE, bucket_samples,
                                               dataset_bucket_samples, input_features,
                                               run_controls, score_table)
from gridvqa_jax.formats.datasets import load_density
from gridvqa_jax.training import export as EX
from gridvqa_jax.world import universe as U
from reproduction import stats as STATS

# held-out synergy data: SEED (+ 1000 for D_spur) + bucket id (training: 1000 + i, eval: 777_000 + i)
SEED = 888_000
REGIMES = (("pure", "pure", "pure"), ("spurious", "spur", "spur"), ("cross", "spur", "pure"))
DEPTH_BUCKETS = ("D1_M_F0", "D2_M_F0", "D3_M_F0")
ATTRIBUTE_BUCKET = "D1_A_F0"
ESTIMATORS = GS.ESTIMATORS + GS.REFERENCE_ESTIMATORS  # ours, then the references'
SCALE = {"emap": 100.0, "intershap": 1.0, "pid": 100.0, "emap_gap": 100.0, "intershap_ref": 1.0,
         "pid_null": 100.0}
UNITS = {"emap": "%", "intershap": "fraction", "pid": "%", "emap_gap": "points",
         "intershap_ref": "fraction", "pid_null": "%"}
# What each estimator is: the reference's statistic, or a definition of ours
DEFINITIONS = {
    "emap": "ours: 100 x mean_i |r_i| / (|r_i| + |text effect_i| + |image effect_i|) of EMAP's "
            "residual r (= InterSHAP with the averaging baseline)",
    "intershap": "ours: InterSHAP of log P(a_i), absent modality = empty grid / all-PAD question",
    "pid": "PID synergy share S / I(X1, X2; Y) (Liang et al. 2023), codes: {codes}",
    "emap_gap": "reference (Hessel & Lee 2020; InterSHAP authors' EMAP.py): model accuracy minus "
                "the accuracy of its additive projection, points",
    "intershap_ref": "reference (Wenderoth et al. 2025): softmax P(a_i), absent modality filled "
                     "from the data, v(empty) = mean prediction",
    "pid_null": "chance level of pid: the same share with the answers permuted",
}
PID_CODES = {"marginal": "the answers of EMAP's unimodal projections (ours)",
             "empty": "the answers on image-only / text-only inputs (ours)",
             "kmeans": "k-means (k = 6) of per-cell colours / one-hot words (ours)",
             "reference": "normalise, PCA to 2, k-means with 20 clusters of per-cell colours / "
                          "one-hot words (the InterSHAP authors' PID.py)"}
CONTROL_EXPECTED = {"additive": "emap = intershap = emap_gap = 0", "image_only": "all 0",
                    "text_only": "all 0",
                    "xor": "emap ~ 100%, emap_gap ~ 50 points (scored against its own answers)"}
# The smallest change over depth a reader would call a trend, per estimator, in its units
MIN_EFFECT = {"emap": 5.0, "intershap": 0.05, "pid": 5.0, "emap_gap": 2.0, "intershap_ref": 0.05,
              "pid_null": 5.0}
DIRECTION_TEST = ("95% set-level (jackknife) interval of depth3 - depth1 against the minimum "
                  "effect e (MIN_EFFECT): above +e increasing, below -e decreasing, within "
                  "[-e, +e] flat, else unclear")

# GridVQA-X Table 2 and Key Findings (mean +- std; InterSHAP's regime and depth 2 not given).
PAPER = {
    "emap": {"pure": [(78.6, 16.7), (74.7, 23.8), (64.1, 28.2)],
             "spurious": [(69.2, 23.9), (65.7, 24.4), (68.8, 18.9)],
             "cross": [(59.4, 27.3), (54.0, 26.2), (65.0, 17.6)]},
    "intershap": {"pure": [(0.921, None), (None, None), (0.629, None)]},
    "accuracy": {"pure": [100.0, 100.0, 100.0], "cross": [6.0, 2.0, 0.0]},
}


DIRECTIONS = ("increasing", "decreasing", "flat", "unclear")


def direction(diff_ci, min_effect: float = 0.0) -> str:
    """Direction of a score over depth from the 95% interval ``[lo, hi]`` of depth 3 - depth 1
    and the minimum effect e >= 0: "increasing" (lo > e), "decreasing" (hi < -e), "flat" (the
    interval lies within [-e, e]; with e = 0: it contains 0), "unclear" otherwise."""
    lo, hi, e = float(diff_ci[0]), float(diff_ci[1]), float(min_effect)
    if lo > e:
        return "increasing"
    if hi < -e:
        return "decreasing"
    if (e == 0 and lo <= 0 <= hi) or (e > 0 and -e <= lo and hi <= e):
        return "flat"
    return "unclear"


def _summary(res, scale):
    return {"mean": res["mean"] * scale, "std": res["std"] * scale, "se": res["se"] * scale,
            "ci": [res["ci"][0] * scale, res["ci"][1] * scale], "df": res.get("df")}


def _difference(a, b, scale):
    return STATS.independent_difference(a["mean"], a["se"], b["mean"], b["se"], scale,
                                        df_a=a.get("df"), df_b=b.get("df"))


def run_check(n: int = 64, n_boot: int = 200, seed: int = SEED, key=None, regimes=REGIMES,
              chunk: int | None = None, mesh=None, progress: bool = True, models=None,
              controls: bool = True, pid_discretise: str = "marginal", data=None) -> dict:
    """The additive-fallacy check; returns the JSON-able results (module docstring).

    ``regimes``: (name, model, data variant) triples; ``models``: optional ``{model name:
    (apply_fn, params)}`` (default: ``training.export.load_reference_model``). Keys: ``{est:
    {regime: {depthK: {mean, std, se, ci}}}}`` for est in ``ESTIMATORS``, ``"trend"``
    (``{est: {regime: {"depth3_minus_depth1": {mean, se, ci}, "direction"}}}``),
    ``"attribute_vs_relational"``, ``"diagnostics"``, ``"controls"``, ``"findings"``
    (``check_findings``), ``"paper"``, ``"units"``, ``"settings"``, ``"definitions"``,
    ``"min_effect"``.
    ``pid_discretise``: PID's unimodal codes (``global_synergy.pid_codes``): "marginal"
    (default), "empty", "kmeans" on the inputs (``input_features``), or "reference" (the
    InterSHAP authors' clustering of the same inputs, ``global_synergy.reference_pid_codes``).
    Every estimator of ``ESTIMATORS`` (ours and the references', ``DEFINITIONS``) is scored.
    ``data``: ``{"pure"|"spur": DIR}`` draws that variant's buckets from a dataset on disk (any
    layout ``load_dataset`` reads, the official release included: the first ``n`` d07 samples of
    each bucket in file order, ``synergy_check.dataset_bucket_samples``) instead of generating
    them; read (and refused, ``InputError`` naming the folder) before any model runs.
    """
    if pid_discretise not in PID_CODES:
        raise ValueError(f"unknown pid_discretise {pid_discretise!r}; expected "
                         f"{', '.join(PID_CODES)}")
    unknown = sorted(set(data or {}) - {"pure", "spur"})
    if unknown:
        raise InputError(f"data: unknown dataset name(s) {', '.join(unknown)}; expected pure, "
                         "spur")
    on_disk = {}
    for variant, where in (data or {}).items():
        batch = load_density(where, variant)
        for bucket in DEPTH_BUCKETS + (ATTRIBUTE_BUCKET,):
            on_disk[variant, bucket] = dataset_bucket_samples(batch, bucket, n, str(where))
    from tqdm.auto import tqdm

    key = jax.random.key(seed) if key is None else key
    buckets = DEPTH_BUCKETS + (ATTRIBUTE_BUCKET,)
    models = dict(models or {})
    for _, m, _ in regimes:
        if m not in models:
            apply_fn, params, _ = EX.load_reference_model(m)
            models[m] = (apply_fn, params)
    samples = {}
    raw, acc, diag = {}, {}, {}
    bar = tqdm(total=len(regimes) * len(buckets), desc="synergy", disable=not progress,
               file=sys.stderr, unit="table", dynamic_ncols=True)
    for _, _, variant in regimes:
        for bucket in buckets:
            if (variant, bucket) not in samples:
                samples[variant, bucket] = (on_disk.get((variant, bucket))
                                            or bucket_samples(variant, bucket, n, seed))
    # one token length for every bucket (trailing PAD, which the models do not read): the
    # cross tables compile once, not once per bucket length (~2 s each on a CPU)
    length = max(np.shape(t)[-1] for _, t, _ in samples.values())
    samples = {k: (im, jnp.pad(jnp.asarray(t), ((0, 0), (0, length - np.shape(t)[-1])),
                               constant_values=U.PAD_ID), y)
               for k, (im, t, y) in samples.items()}
    for r, (name, model, variant) in enumerate(regimes):
        apply_fn, params = models[model]
        for b, bucket in enumerate(buckets):
            images, tokens, truth = samples[variant, bucket]
            F = GS.cross_table(apply_fn, params, images, tokens, chunk=chunk, mesh=mesh,
                               grid_size=5)
            kb = jax.random.fold_in(jax.random.fold_in(key, r), b)
            feats = (input_features(images, tokens)
                     if pid_discretise in ("kmeans", "reference") else None)
            raw[name, bucket] = score_table(F, kb, n_boot, pid_discretise=pid_discretise,
                                            pid_features=feats, labels=truth)
            pred = np.asarray(jnp.argmax(F[np.arange(n), np.arange(n)], -1))
            acc[name, bucket] = float(np.mean(pred == truth)) * 100
            bar.update(1)
    bar.close()

    res: dict = {est: {} for est in ESTIMATORS}
    res["trend"] = {est: {} for est in ESTIMATORS}
    res["attribute_vs_relational"] = {est: {} for est in ESTIMATORS}
    for name, _, _ in regimes:
        for est in ESTIMATORS:
            s = SCALE[est]
            res[est][name] = {f"depth{d + 1}": _summary(raw[name, bk][est], s)
                              for d, bk in enumerate(DEPTH_BUCKETS)}
            diff = _difference(raw[name, DEPTH_BUCKETS[2]][est],
                               raw[name, DEPTH_BUCKETS[0]][est], s)
            res["trend"][est][name] = {"depth3_minus_depth1": diff,
                                       "direction": direction(diff["ci"], MIN_EFFECT[est])}
            a, m = raw[name, ATTRIBUTE_BUCKET][est], raw[name, DEPTH_BUCKETS[0]][est]
            res["attribute_vs_relational"][est][name] = {
                "A": _summary(a, s), "M": _summary(m, s), "M_minus_A": _difference(m, a, s)}
        diag[name] = {bk: {"accuracy": acc[name, bk],
                           "intershap_global_empty": raw[name, bk]["intershap_global_empty"],
                           "pid_empty_total_bits": raw[name, bk]["pid_empty_total_bits"]}
                      for bk in buckets}
    res["diagnostics"] = diag
    res["paper"] = PAPER
    res["units"] = UNITS
    res["definitions"] = {e: d.format(codes=PID_CODES[pid_discretise])
                          for e, d in DEFINITIONS.items()}
    res["min_effect"] = MIN_EFFECT
    res["settings"] = {"n": n, "n_boot": n_boot, "seed": seed, "buckets": list(buckets),
                       "density": "d07", "cell_px": 16, "intershap_baseline": "empty",
                       "pid_discretise": pid_discretise, "direction_test": DIRECTION_TEST,
                       "data": {v: str(data[v]) if v in (data or {}) else
                                f"generated (seed {seed + VARIANT_STRIDE * U.VARIANTS.index(v)}"
                                " + bucket id)" for v in ("pure", "spur")}}
    if controls:
        images, tokens, _ = samples[regimes[0][2], DEPTH_BUCKETS[0]]
        res["settings"]["controls_variant"] = regimes[0][2]  # the first regime's data
        raw_c = run_controls(images, tokens, jax.random.fold_in(key, 999), n_boot)
        res["controls"] = {c: {**{est: _summary(r[est], SCALE[est]) for est in ESTIMATORS},
                               "expected": CONTROL_EXPECTED[c]} for c, r in raw_c.items()}
    res["findings"] = check_findings(res)
    return res


def _paper_depths(est, regime, depths=(1, 2, 3), sep=" / "):
    return sep.join(f"{PAPER[est][regime][d - 1][0]}" for d in depths)


def check_findings(res: dict, alpha: float = 0.025) -> list[dict]:
    """GridVQA-X's additive-fallacy findings checked on ``run_check``'s results (the regimes
    "pure" and "spurious"; a finding whose regime was not run is left out), ours and on the
    reference statistics:

    * EMAP / InterSHAP synergy on M_pure falls from depth 1 to depth 3, by at least the
      estimator's ``MIN_EFFECT``: the claim ``depth3 - depth1 < -effect``;
    * EMAP reports > 50% synergy on M_spur at every depth (our EMAP %; each depth's claim
      ``> 50 + effect``), and on the reference statistic M_spur's accuracy falls when projected
      (``emap_gap > effect`` at every depth).

    Every part is a one-sided test of its claim on the set-level estimate and its standard
    error; the family of all parts is controlled by Holm's method at ``alpha`` per side
    (``stats.holm_verdicts``; 0.025, as a two-sided 95% interval), and a finding of several
    parts is ``stats.all_of`` its parts.
    Each finding's evidence states the estimate, its interval, the minimum effect and the size
    of the family. Returns ``stats.finding`` records.
    """
    specs = []  # (finding, claim, [(estimate, se, claim)], evidence, [ci of each part])
    for est, name, paper_est in (("emap", "EMAP", "emap"), ("intershap", "InterSHAP", "intershap"),
                                 ("emap_gap", "EMAP (reference: accuracy gap)", "emap"),
                                 ("intershap_ref", "InterSHAP (reference)", "intershap")):
        if "pure" not in res.get("trend", {}).get(est, {}):
            continue
        t = res["trend"][est]["pure"]
        d, e = t["depth3_minus_depth1"], MIN_EFFECT[est]
        paper = _paper_depths(paper_est, "pure", (1, 3), " -> ")
        specs.append((
            f"Table 2: {name} synergy on M_pure falls with depth",
            f"{name}'s synergy on M_pure decreases from depth 1 to depth 3 by at least {e:g} "
            f"{UNITS[est]} (the additive-fallacy check fails)",
            [(d["mean"], d["se"], ("<", -e), d.get("df"))],
            f"depth3 - depth1 = {d['mean']:.3f} [{d['ci'][0]:.3f}, {d['ci'][1]:.3f}] "
            f"{UNITS[est]} (direction: {t['direction']}; minimum effect {e:g}; paper, our EMAP "
            f"% / InterSHAP: {paper})", [d["ci"]]))
    for est, name, claim_text, t0, unit_text in (
            ("emap", "Table 2: EMAP reports high synergy on the shortcut model",
             "EMAP reports > 50% synergy on M_spur (D_spur) at every depth, though the model uses "
             "no relation", 50.0, "%"),
            ("emap_gap", "Table 2: EMAP (reference: accuracy gap) finds cross-modal "
             "interaction on the shortcut model",
             "M_spur's accuracy on D_spur falls when it is projected onto additive functions, at "
             "every depth (the reference statistic behind the paper's 'high EMAP synergy')",
             0.0, " points")):
        if "spurious" not in res.get(est, {}):
            continue
        rows, e = res[est]["spurious"], MIN_EFFECT[est]
        rs = [rows[f"depth{d}"] for d in (1, 2, 3)]
        paper = f" (paper {_paper_depths('emap', 'spurious')})" if est == "emap" else ""
        specs.append((name, claim_text + f", by at least {e:g}{unit_text}",
                      [(r["mean"], r["se"], (">", t0 + e), r.get("df")) for r in rs],
                      "; ".join(f"depth {d + 1}: {r['mean']:.1f}{unit_text} "
                                f"[{r['ci'][0]:.1f}, {r['ci'][1]:.1f}]" for d, r in enumerate(rs))
                      + paper, [r["ci"] for r in rs]))
    tests = [t for _, _, ts, _, _ in specs for t in ts]
    verdicts = iter(STATS.holm_verdicts(tests, alpha))
    n = res.get("settings", {}).get("n")
    out = []
    for name, claim, ts, evidence, cis in specs:
        v = STATS.all_of([next(verdicts) for _ in ts])
        out.append(STATS.finding("GridVQA-X", name, claim, v,
                                 evidence + f"; Holm over {len(tests)} tests at {alpha:g} a side",
                                 n=None if n is None else f"{n} per bucket",
                                 width=STATS.widest(cis)))
    return out


# ----------------------------------------------------------------------------------------------
# Output
# ----------------------------------------------------------------------------------------------
def _fmt(s, est):
    if s is None:
        return "-"
    p = 3 if est.startswith("intershap") else 1
    return f"{s['mean']:.{p}f}±{s['std']:.{p}f} [{s['ci'][0]:.{p}f},{s['ci'][1]:.{p}f}]"


def _paper(est, regime, d):
    rows = PAPER.get(est, {}).get(regime)
    if not rows or rows[d][0] is None:
        return "-"
    m, s = rows[d]
    return f"{m}" + (f"±{s}" if s is not None else "")


def format_table(res: dict) -> str:
    """The human tables: scores by depth with the paper's numbers and the direction, A vs M,
    diagnostics, controls, then the findings with their verdicts."""
    lines = ["Additive-fallacy check (Mixed, form 0, d07): mean±std [set-level 95% CI: "
             "jackknife; pid_null: permutations]; EMAP and PID in %, emap_gap in accuracy "
             "points, InterSHAP as a fraction",
             f"{'estimator':<14}{'regime':<10}{'depth 1':>28}{'depth 2':>28}{'depth 3':>28}"
             f"  {'paper d1 / d2 / d3':<26}{'d3-d1 CI':>18}  direction"]
    for est in ESTIMATORS:
        for regime, row in res.get(est, {}).items():
            cells = "".join(f"{_fmt(row[f'depth{d}'], est):>28}" for d in (1, 2, 3))
            paper = " / ".join(_paper(est, regime, d) for d in range(3))
            t = res["trend"][est][regime]
            ci = t["depth3_minus_depth1"]["ci"]
            lines.append(f"{est:<14}{regime:<10}{cells}  {paper:<26}"
                         f"{f'[{ci[0]:.2f},{ci[1]:.2f}]':>18}  {t['direction']}")
    lines.append("direction: " + res["settings"]["direction_test"])
    for est, text in res.get("definitions", {}).items():
        lines.append(f"  {est:<14}{text} [{UNITS[est]}]")
    lines.append("")
    lines.append("Attribute matching vs relational (depth 1, form 0, d07): A = attribute only, "
                 "M = one relation; M-A: set-level 95% CI")
    for est in ESTIMATORS:
        for regime, row in res["attribute_vs_relational"].get(est, {}).items():
            ci = row["M_minus_A"]["ci"]
            lines.append(f"{est:<14}{regime:<10}  A {_fmt(row['A'], est):>28}  "
                         f"M {_fmt(row['M'], est):>28}  M-A [{ci[0]:.2f},{ci[1]:.2f}]")
    lines.append("")
    acc = {r: "/".join(f"{a:g}" for a in PAPER["accuracy"][r]) for r in ("pure", "cross")}
    lines.append(f"Model accuracy (%) per bucket (paper: M_pure {acc['pure']}, M_spur cross "
                 f"{acc['cross']}); InterSHAP global (empty baseline); PID bits seen by the "
                 "image-only/text-only answer codes")
    for regime, d in res["diagnostics"].items():
        lines.append(f"  {regime:<10}" + "  ".join(
            f"{bk}: acc {v['accuracy']:.0f} ISg {v['intershap_global_empty']:.3f} "
            f"I_empty {v['pid_empty_total_bits']:.3f}" for bk, v in d.items()))
    if "controls" in res:
        lines.append("")
        variant = res.get("settings", {}).get("controls_variant", "pure")
        lines.append(f"Controls (stand-in models on the {variant} D1_M_F0 inputs; known synergy)")
        for name, row in res["controls"].items():
            lines.append(f"  {name:<11}" + "  ".join(
                f"{est} {_fmt(row[est], est)}" for est in ESTIMATORS if est in row)
                + f"   expected: {row['expected']}")
    if res.get("findings"):
        lines.append("")
        lines.append("Findings of the paper, checked on our models:")
        lines += [f"  [{f['verdict']}] {f['claim']}: {f['evidence']}" for f in res["findings"]]
    return "\n".join(lines)


def payload(res: dict) -> dict:
    """The JSON object of ``gridvqa synergy``: ``run_check``'s results (``{est: {regime:
    {depthK: {mean, std, ci}}}}``, ``"trend"``, ``"findings"`` and the extra tables)."""
    return res


def plot(res: dict, path) -> Path:
    """Synergy vs depth (one panel per estimator, one line per regime with its 95% CI; the
    paper's EMAP numbers dashed), written as a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [e for e in ESTIMATORS if res.get(e)]
    fig, axes = plt.subplots(-(-len(shown) // 3), 3, figsize=(13, 3.8 * -(-len(shown) // 3)),
                             squeeze=False)
    colors = {"pure": "tab:blue", "spurious": "tab:red", "cross": "tab:green"}
    for ax in axes.flat[len(shown):]:
        ax.set_visible(False)
    for ax, est in zip(axes.flat, shown):
        for regime, row in res[est].items():
            m = [row[f"depth{d}"]["mean"] for d in (1, 2, 3)]
            lo = [row[f"depth{d}"]["ci"][0] for d in (1, 2, 3)]
            hi = [row[f"depth{d}"]["ci"][1] for d in (1, 2, 3)]
            c = colors.get(regime)
            ax.plot([1, 2, 3], m, "o-", color=c,
                    label=f"{regime} ({res['trend'][est][regime]['direction']})")
            ax.fill_between([1, 2, 3], lo, hi, color=c, alpha=0.15)
            paper = PAPER.get(est, {}).get(regime)
            if paper:
                xs = [d + 1 for d in range(3) if paper[d][0] is not None]
                ax.plot(xs, [paper[d - 1][0] for d in xs], "x--", color=c, alpha=0.6)
        kind = "reference" if est in GS.REFERENCE_ESTIMATORS else "ours"
        ax.set_title(f"{est} ({UNITS[est]}, {kind}); dashed x = paper", fontsize=9)
        ax.set_xticks([1, 2, 3])
        ax.set_xlabel("relational depth")
        ax.legend(fontsize=7)
    fig.tight_layout()
    try:
        return staging.write_atomic(path, lambda f: fig.savefig(f, dpi=110, format="png"))
    finally:
        plt.close(fig)


def write_results(res: dict, out_dir) -> dict:
    """Write ``synergy_vs_depth.png`` and ``results.json`` into ``out_dir``, each atomically
    (temporary file + rename); returns their paths."""
    out_dir = Path(out_dir)
    fig = plot(res, out_dir / "synergy_vs_depth.png")
    staging.write_atomic(out_dir / "results.json", json.dumps(res, indent=1))
    return {"figure": str(fig), "results": str(out_dir / "results.json")}


__all__ = ["SEED", "REGIMES", "DEPTH_BUCKETS", "ATTRIBUTE_BUCKET", "ESTIMATORS", "SCALE", "UNITS",
           "MIN_EFFECT",
           "DEFINITIONS", "PID_CODES", "PAPER",
           "CONTROL_EXPECTED", "direction", "run_check", "check_findings", "format_table",
           "payload", "plot", "write_results"]
