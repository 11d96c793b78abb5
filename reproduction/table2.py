"""The additive-fallacy check (GridVQA-X, Table 2): do global synergy estimators grow with
relational depth on a model that reasons (M_pure) and stay flat on a shortcut model (M_spur)?

Per regime (pure = M_pure on D_pure, spurious = M_spur on D_spur, cross = M_spur on D_pure) and
estimator (EMAP, InterSHAP, PID; ``gridvqa_jax.explain.global_synergy``) the score is computed on
N held-out samples of each of the buckets D1/D2/D3 Mixed, form 0 (count), density d07, generated
with seed ``SEED + bucket id`` (no training or evaluation stream uses these seeds), rendered at
the models' 16 px per cell. Within a bucket the N samples form the EMAP N-set.

Units (the paper's): EMAP and PID in percent (100 x the mean per-sample share; 100 x the PID
synergy share S / I(X1, X2; Y)), InterSHAP as a fraction in [0, 1]. ``std`` is the spread over
samples (EMAP, InterSHAP; the paper's +-) or the bootstrap std (PID, a set-level score); ``ci`` the
bootstrap 95% percentile interval (resampling the samples: per-sample scores for EMAP and
InterSHAP, the joint for PID; ``global_synergy.bootstrap_scores``).

Verdict (``verdict``): the bootstrap 95% interval of ``score(depth 3) - score(depth 1)``
(independent resamples of the two buckets, replicate by replicate): "increasing" if it lies above
0, "decreasing" if below, "flat" if it contains 0.

Attribute matching vs relational synergy: the same estimators on D1 attribute-only questions
(A: "How many red circles are there?", no relation) beside D1 Mixed (M: one relation), both
form 0, d07, with the interval of M - A. An estimator that separates relational synergy from
attribute matching must score M above A on M_pure, and not on M_spur.

Controls (``control_models``): stand-in apply functions on the same inputs with known synergy:
additive ``g(t) + h(v)`` and one-modality models (EMAP and InterSHAP exactly 0), and an XOR of one
bit per modality (EMAP ~1 for balanced bits).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from mmx_base import staging
from gridvqa_jax.explain import global_synergy as GS
from gridvqa_jax.models import mdetr as M
from gridvqa_jax.world import generate as G
from gridvqa_jax.world import render as R
from gridvqa_jax.world.scene import trim_tokens
from gridvqa_jax.world import universe as U

SEED = 888_000  # held-out synergy data: seed SEED + bucket id (training: 1000 + i, eval: 777_000 + i)
REGIMES = (("pure", "pure", "pure"), ("spurious", "spur", "spur"), ("cross", "spur", "pure"))
DEPTH_BUCKETS = ("D1_M_F0", "D2_M_F0", "D3_M_F0")
ATTRIBUTE_BUCKET = "D1_A_F0"
SCALE = {"emap": 100.0, "intershap": 1.0, "pid": 100.0}
UNITS = {"emap": "%", "intershap": "fraction", "pid": "%"}

# GridVQA-X Table 2 and Key Findings (mean +- std; InterSHAP's regime and depth 2 not given).
PAPER = {
    "emap": {"pure": [(78.6, 16.7), (74.7, 23.8), (64.1, 28.2)],
             "spurious": [(69.2, 23.9), (65.7, 24.4), (68.8, 18.9)],
             "cross": [(59.4, 27.3), (54.0, 26.2), (65.0, 17.6)]},
    "intershap": {"pure": [(0.921, None), (None, None), (0.629, None)]},
    "accuracy": {"pure": [100.0, 100.0, 100.0], "cross": [6.0, 2.0, 0.0]},
}


def _bucket(name: str) -> int:
    d, q, f = name.split("_")
    return U.bucket_id(int(d[1:]), q, int(f[1:]))


def bucket_samples(variant: str, bucket: str, n: int, seed: int = SEED, grid_size: int = 5,
                   cell_px: int = 16, density: float = 0.7):
    """N held-out samples of one bucket: ``(images uint8 [N, S*P, S*P, 3], tokens [N, L'],
    truth [N] unified answer class)``, seed ``seed + bucket id``, images at ``cell_px``; the
    tokens keep the longest question's positions rounded up to 4 (``scene.trim_tokens``:
    only trailing PAD is dropped, and the models' cost falls with the length)."""
    bid = _bucket(bucket)
    spec = U.Spec(variant, grid_size, density, 64, buckets=(bid,))
    sc = G.to_numpy(G.generate_chunk(spec, seed + bid, 0, n))
    images = jax.jit(jax.vmap(lambda c, s: R.render(c, s, cell_px)))(
        jnp.asarray(sc.color), jnp.asarray(sc.shape))
    truth = np.asarray(M.answer_index(sc.answer, sc.is_yesno, grid_size * grid_size))
    return images, jnp.asarray(trim_tokens(sc).tokens), truth


def verdict(diff_ci) -> str:
    """Trend of a score over depth from the 95% interval ``[lo, hi]`` of depth 3 - depth 1:
    "increasing" (lo > 0), "decreasing" (hi < 0) or "flat" (the interval contains 0)."""
    lo, hi = float(diff_ci[0]), float(diff_ci[1])
    if lo > 0:
        return "increasing"
    if hi < 0:
        return "decreasing"
    return "flat"


def _diff(b_hi, b_lo, scale):
    d = (np.asarray(b_hi) - np.asarray(b_lo)) * scale
    lo, hi = np.percentile(d, [2.5, 97.5])
    return {"mean": float(np.mean(d)), "ci": [float(lo), float(hi)]}


def _summary(res, scale):
    return {"mean": res["mean"] * scale, "std": res["std"] * scale,
            "ci": [res["ci"][0] * scale, res["ci"][1] * scale]}


def score_table(F_ext, key, n_boot: int = 200, estimators=GS.ESTIMATORS,
                pid_discretise: str = "marginal", pid_features=None) -> dict:
    """Every estimator on one extended table: ``{est: bootstrap_scores(...)}`` plus diagnostics
    (the empty-baseline global InterSHAP, the mutual information seen by the "empty" PID codes).
    ``pid_discretise`` / ``pid_features``: the PID codes (``global_synergy.pid_codes``)."""
    out = {}
    for k, est in enumerate(estimators):
        kw = ({"pid_discretise": pid_discretise, "pid_features": pid_features}
              if est == "pid" else {})
        out[est] = GS.bootstrap_scores(F_ext, est, jax.random.fold_in(key, k), n_boot, **kw)
    out["intershap_global_empty"] = float(
        GS.SY.intershap_global(GS.modality_games(F_ext, "empty")))
    (x1, x2, y), sizes = GS.dense_codes(*GS.pid_codes(F_ext, "empty"))
    out["pid_empty_total_bits"] = float(GS.pid_share(jnp.asarray(x1), jnp.asarray(x2),
                                                     jnp.asarray(y), tuple(sizes))["total"])
    return out


def input_features(images, tokens, grid_size: int = 5):
    """Per-sample unimodal features for PID's k-means codes: ``(image [N, S*S*3], text
    [N, L*V])``: the mean RGB of every cell (0..1) and the one-hot word at every token position
    (PAD = all zeros), flattened. Each holds its own input exactly at the closed world's
    resolution (which colour/shape lies where; which words in which order) and nothing of the
    other modality; they do not depend on the model, so the codes are the same for every
    regime on the same data."""
    x = jnp.asarray(images, jnp.float32) / 255.0
    N, H = x.shape[0], x.shape[1]
    P = H // grid_size
    cells = x.reshape(N, grid_size, P, grid_size, P, 3).mean(axis=(2, 4))
    words = jax.nn.one_hot(jnp.asarray(tokens), len(U.VOCAB))
    words = jnp.where((jnp.asarray(tokens) == U.PAD_ID)[..., None], 0.0, words)
    return cells.reshape(N, -1), words.reshape(N, -1)


def run_check(n: int = 64, n_boot: int = 200, seed: int = SEED, key=None, regimes=REGIMES,
              chunk: int | None = None, mesh=None, progress: bool = True, models=None,
              controls: bool = True, pid_discretise: str = "marginal") -> dict:
    """The additive-fallacy check; returns the JSON-able results (module docstring).

    ``regimes``: (name, model, data variant) triples; ``models``: optional ``{model name:
    (apply_fn, params)}`` (default: ``training.export.load_reference_model``).
    ``pid_discretise``: PID's unimodal codes (``global_synergy.pid_codes``): "marginal"
    (default), "empty", or "kmeans" on the inputs (``input_features``).
    """
    if pid_discretise not in ("marginal", "empty", "kmeans"):
        raise ValueError(f"unknown pid_discretise {pid_discretise!r}; expected marginal, empty "
                         "or kmeans")
    from tqdm.auto import tqdm

    from gridvqa_jax.training.export import load_reference_model

    key = jax.random.key(seed) if key is None else key
    buckets = DEPTH_BUCKETS + (ATTRIBUTE_BUCKET,)
    models = dict(models or {})
    for _, m, _ in regimes:
        if m not in models:
            apply_fn, params, _ = load_reference_model(m)
            models[m] = (apply_fn, params)
    data = {}
    raw, acc, diag = {}, {}, {}
    bar = tqdm(total=len(regimes) * len(buckets), desc="synergy", disable=not progress,
               file=sys.stderr, unit="table", dynamic_ncols=True)
    for r, (name, model, variant) in enumerate(regimes):
        apply_fn, params = models[model]
        for b, bucket in enumerate(buckets):
            if (variant, bucket) not in data:
                data[variant, bucket] = bucket_samples(variant, bucket, n, seed)
            images, tokens, truth = data[variant, bucket]
            F = GS.cross_table(apply_fn, params, images, tokens, chunk=chunk, mesh=mesh,
                               grid_size=5)
            kb = jax.random.fold_in(jax.random.fold_in(key, r), b)
            feats = input_features(images, tokens) if pid_discretise == "kmeans" else None
            raw[name, bucket] = score_table(F, kb, n_boot, pid_discretise=pid_discretise,
                                            pid_features=feats)
            pred = np.asarray(jnp.argmax(F[np.arange(n), np.arange(n)], -1))
            acc[name, bucket] = float(np.mean(pred == truth)) * 100
            bar.update(1)
    bar.close()

    res: dict = {est: {} for est in GS.ESTIMATORS}
    res["verdict"] = {est: {} for est in GS.ESTIMATORS}
    res["trend"] = {est: {} for est in GS.ESTIMATORS}
    res["attribute_vs_relational"] = {est: {} for est in GS.ESTIMATORS}
    for name, _, _ in regimes:
        for est in GS.ESTIMATORS:
            s = SCALE[est]
            res[est][name] = {f"depth{d + 1}": _summary(raw[name, bk][est], s)
                              for d, bk in enumerate(DEPTH_BUCKETS)}
            diff = _diff(raw[name, DEPTH_BUCKETS[2]][est]["boot"],
                         raw[name, DEPTH_BUCKETS[0]][est]["boot"], s)
            res["trend"][est][name] = {"depth3_minus_depth1": diff}
            res["verdict"][est][name] = verdict(diff["ci"])
            a, m = raw[name, ATTRIBUTE_BUCKET][est], raw[name, DEPTH_BUCKETS[0]][est]
            res["attribute_vs_relational"][est][name] = {
                "A": _summary(a, s), "M": _summary(m, s),
                "M_minus_A": _diff(m["boot"], a["boot"], s)}
        diag[name] = {bk: {"accuracy": acc[name, bk],
                           "intershap_global_empty": raw[name, bk]["intershap_global_empty"],
                           "pid_empty_total_bits": raw[name, bk]["pid_empty_total_bits"]}
                      for bk in buckets}
    res["diagnostics"] = diag
    res["paper"] = PAPER
    res["units"] = UNITS
    res["settings"] = {"n": n, "n_boot": n_boot, "seed": seed, "buckets": list(buckets),
                       "density": "d07", "cell_px": 16, "intershap_baseline": "empty",
                       "pid_discretise": pid_discretise, "verdict_test":
                       "95% bootstrap interval of depth3 - depth1: above 0 increasing, "
                       "below 0 decreasing, else flat"}
    if controls:
        images, tokens, _ = data[regimes[0][2], DEPTH_BUCKETS[0]]
        res["controls"] = run_controls(images, tokens, jax.random.fold_in(key, 999), n_boot)
    return res


# ----------------------------------------------------------------------------------------------
# Controls: stand-in models with known synergy
# ----------------------------------------------------------------------------------------------
def _red_cells(image, grid_size: int = 5):
    """Number of red objects per image ``[B]``: the colour of each cell's centre pixel."""
    image = jnp.asarray(image)
    P = image.shape[1] // grid_size
    c = image[:, P // 2::P, P // 2::P, :].astype(jnp.int32)
    return jnp.sum((c[..., 0] > 200) & (c[..., 1] < 100) & (c[..., 2] < 100), axis=(1, 2))


def _names_red(tokens):
    return jnp.any(jnp.asarray(tokens) == U.WORD_ID["red"], axis=1)


def _n_words(tokens):
    return jnp.sum(jnp.asarray(tokens) != U.PAD_ID, axis=1)


def _two(a, b):
    return {"answer_logprobs": jnp.stack([a, b], axis=-1).astype(jnp.float32)}


def additive_control(params, image, tokens):
    """Per answer ``g_c(t) + h_c(v)``: red-object count plus question terms; no interaction."""
    r, t, w = _red_cells(image), _names_red(tokens), _n_words(tokens)
    return _two(0.3 * r + 0.7 * t + 0.05 * w, -0.2 * r - 0.4 * t)


def image_only_control(params, image, tokens):
    """Reads the image only (red-object count)."""
    r = _red_cells(image)
    return _two(0.3 * r, -0.2 * r)


def text_only_control(params, image, tokens):
    """Reads the question only (names red, word count)."""
    t, w = _names_red(tokens), _n_words(tokens)
    return _two(0.7 * t + 0.05 * w, -0.4 * t)


def xor_control(params, image, tokens):
    """+-2 on (odd number of red objects) XOR (question names red): pure interaction."""
    s = 2.0 * ((_red_cells(image) % 2 == 1) ^ _names_red(tokens)) - 1.0
    return _two(-2.0 * s, 2.0 * s)


def control_models() -> dict:
    """``{name: apply_fn}`` of the stand-in controls (params unused, pass None). Outputs are
    per-answer scores, not normalised log-probabilities: the estimators need no normalisation,
    and normalising would couple the answers (a log-softmax of an additive score is not
    additive)."""
    return {"additive": additive_control, "image_only": image_only_control,
            "text_only": text_only_control, "xor": xor_control}


CONTROL_EXPECTED = {"additive": "emap = intershap = 0", "image_only": "all 0",
                    "text_only": "all 0", "xor": "emap ~ 100%"}


def run_controls(images, tokens, key, n_boot: int = 200) -> dict:
    """Every estimator on every control over the given inputs: ``{control: {est: summary}}``."""
    out = {}
    for c, (name, fn) in enumerate(control_models().items()):
        F = GS.cross_table(fn, None, images, tokens, grid_size=5)
        raw = score_table(F, jax.random.fold_in(key, c), n_boot)
        out[name] = {est: _summary(raw[est], SCALE[est]) for est in GS.ESTIMATORS}
        out[name]["expected"] = CONTROL_EXPECTED[name]
    return out


# ----------------------------------------------------------------------------------------------
# Output
# ----------------------------------------------------------------------------------------------
def _fmt(s, est):
    if s is None:
        return "-"
    p = 3 if est == "intershap" else 1
    return f"{s['mean']:.{p}f}±{s['std']:.{p}f} [{s['ci'][0]:.{p}f},{s['ci'][1]:.{p}f}]"


def _paper(est, regime, d):
    rows = PAPER.get(est, {}).get(regime)
    if not rows or rows[d][0] is None:
        return "-"
    m, s = rows[d]
    return f"{m}" + (f"±{s}" if s is not None else "")


def format_table(res: dict) -> str:
    """The human tables: scores by depth with the paper's numbers, verdicts, A vs M, controls."""
    lines = ["Additive-fallacy check (Mixed, form 0, d07): mean±std [bootstrap 95% CI]; "
             "EMAP and PID in %, InterSHAP as a fraction",
             f"{'estimator':<10}{'regime':<10}{'depth 1':>28}{'depth 2':>28}{'depth 3':>28}"
             f"  {'paper d1 / d2 / d3':<26}{'d3-d1 CI':>18}  verdict"]
    for est in GS.ESTIMATORS:
        for regime, row in res[est].items():
            cells = "".join(f"{_fmt(row[f'depth{d}'], est):>28}" for d in (1, 2, 3))
            paper = " / ".join(_paper(est, regime, d) for d in range(3))
            ci = res["trend"][est][regime]["depth3_minus_depth1"]["ci"]
            lines.append(f"{est:<10}{regime:<10}{cells}  {paper:<26}"
                         f"{f'[{ci[0]:.2f},{ci[1]:.2f}]':>18}  {res['verdict'][est][regime]}")
    lines.append("verdict: " + res["settings"]["verdict_test"])
    lines.append("")
    lines.append("Attribute matching vs relational (depth 1, form 0, d07): A = attribute only, "
                 "M = one relation; M-A: bootstrap 95% CI")
    for est in GS.ESTIMATORS:
        for regime, row in res["attribute_vs_relational"][est].items():
            ci = row["M_minus_A"]["ci"]
            lines.append(f"{est:<10}{regime:<10}  A {_fmt(row['A'], est):>28}  "
                         f"M {_fmt(row['M'], est):>28}  M-A [{ci[0]:.2f},{ci[1]:.2f}]")
    lines.append("")
    lines.append("Model accuracy (%) per bucket (paper: M_pure 100/100/100, M_spur cross "
                 "6/2/0); InterSHAP global (empty baseline); PID bits seen by the "
                 "image-only/text-only answer codes")
    for regime, d in res["diagnostics"].items():
        lines.append(f"  {regime:<10}" + "  ".join(
            f"{bk}: acc {v['accuracy']:.0f} ISg {v['intershap_global_empty']:.3f} "
            f"I_empty {v['pid_empty_total_bits']:.3f}" for bk, v in d.items()))
    if "controls" in res:
        lines.append("")
        lines.append("Controls (stand-in models on the pure D1_M_F0 inputs; known synergy)")
        for name, row in res["controls"].items():
            lines.append(f"  {name:<11}" + "  ".join(
                f"{est} {_fmt(row[est], est)}" for est in GS.ESTIMATORS)
                + f"   expected: {row['expected']}")
    return "\n".join(lines)


def payload(res: dict) -> dict:
    """The JSON object of ``gridvqa synergy``: ``{est: {regime: {depthK: {mean, std, ci}}},
    "verdict": {est: {regime: ...}}}`` first, then the extra tables."""
    return res


def plot(res: dict, path) -> Path:
    """Synergy vs depth (one panel per estimator, one line per regime with its 95% CI; the
    paper's EMAP numbers dashed), written as a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    colors = {"pure": "tab:blue", "spurious": "tab:red", "cross": "tab:green"}
    for ax, est in zip(axes, GS.ESTIMATORS):
        for regime, row in res[est].items():
            m = [row[f"depth{d}"]["mean"] for d in (1, 2, 3)]
            lo = [row[f"depth{d}"]["ci"][0] for d in (1, 2, 3)]
            hi = [row[f"depth{d}"]["ci"][1] for d in (1, 2, 3)]
            c = colors.get(regime)
            ax.plot([1, 2, 3], m, "o-", color=c,
                    label=f"{regime} ({res['verdict'][est][regime]})")
            ax.fill_between([1, 2, 3], lo, hi, color=c, alpha=0.15)
            paper = PAPER.get(est, {}).get(regime)
            if paper:
                xs = [d + 1 for d in range(3) if paper[d][0] is not None]
                ax.plot(xs, [paper[d - 1][0] for d in xs], "x--", color=c, alpha=0.6)
        ax.set_title(f"{est} ({UNITS[est]}); dashed x = paper")
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


__all__ = ["SEED", "REGIMES", "DEPTH_BUCKETS", "ATTRIBUTE_BUCKET", "PAPER", "bucket_samples",
           "verdict", "score_table", "input_features", "run_check", "control_models",
           "run_controls",
           "format_table", "payload", "plot", "write_results"]
