"""Evaluation of the bias views and their ensembles as the modality-bias paper reports it
(section 4.4, Tables 1, 2, 5, 6, 7, 14, 15, Figure 3), against exact labels where the paper
had 300 human labels per dataset.

Scores of a labelling ``pred`` int [N] against ``truth`` int [N] (classes UNI_IMAGE=0,
BALANCE=1, UNI_TEXT=2; truth -1 = unknown, as on real benchmarks):

- proportion of class c: ``share_c = #{pred == c} / N``; in-class accuracy
  ``acc_c = #{pred == c and truth == c} / #{pred == c}`` (NaN when nothing is predicted c),
  printed as the paper's ``"0.78[85.53]"`` (share with two decimals, acc_c in percent);
- accuracy ``mean(pred == truth)`` and macro-F1 ``sklearn.metrics.f1_score(truth, pred,
  labels=[0, 1, 2], average="macro", zero_division=0)``; both need known truth;
- agreement between views: Krippendorff's alpha, nominal level, on the [V, N] label table
  (the ``krippendorff`` package), for all views and per pair;
- Venn counts (Figure 3): for each class c, the sets ``{n : label_v[n] == c}`` of the three
  views and the sizes of the seven regions of their Venn diagram.

Robustness and ablations: the flow threshold sweep (Table 6: the flow view's eps from 0 to 0.4;
appendix 11.1 sets eps on the flow view), K-means instead of eps (Table 7: 3 clusters of the
1-d flow score, mapped to types by the order of their centres: lowest = Uni-text, middle =
Modality-balance, highest = Uni-image, the direction of the signed score), detector swap
(Table 2: one of the image / joint / text detectors replaced by a second one), the
multi-detector ensemble (Table 15: each of those kinds answers with the mean logit of its two
detectors), post-validation by masking (Table 14, appendix 15: a share r of the image cells or
of the words of each sample is replaced by the absent input, zero pixels / PAD, and the joint
detector's accuracy is measured on the samples the ensemble calls Uni-image and Uni-text; the
views are also rerun on the masked samples).

Closed-world analysis samples come from ``ANALYSIS_SEED``, a key stream no training
(``evaluate.TRAIN_SEED``) or detector evaluation (``evaluate.EVAL_SEED``) uses.
"""

from __future__ import annotations

import functools
import importlib
import math
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from bias_jax import ensemble as EN
from bias_jax.data.batch import BIAS_TYPES, REAL, UNKNOWN_BIAS, Batch
from bias_jax.data.text import PAD_ID
from mmx_base import staging
from mmx_base.errors import InputError

ANALYSIS_SEED = 2_000_029  # closed-world seed of analysis samples (not TRAIN_SEED / EVAL_SEED)
VIEWS = EN.VIEWS
LABELS = (0, 1, 2)
EPS_GRID = tuple(round(0.05 * i, 2) for i in range(9))  # Table 6: 0, 0.05, ..., 0.4
MASK_GRID = ((0.6, 0.0), (0.4, 0.0), (0.2, 0.0), (0.0, 0.0), (0.0, 0.2), (0.0, 0.4),
             (0.0, 0.6))  # Table 14: (image ratio, text ratio)
SWAP_GROUPS = {"G1": None, "G2": "image", "G3": "joint", "G4": "text"}  # Table 2: swapped kind
LIME_TABLE_N = 64  # Table 3: samples the LIME flow view runs on (about 0.2 s each on 2 cores)
SECOND_SUFFIX = "_b"  # second detector of kind k: checkpoints/bias_<k>_b
VENN_REGIONS = ("100", "010", "001", "110", "101", "011", "111")  # bits: in view 0 / 1 / 2


# ----------------------------------------------------------------------------------------------
# Scores against labels.
# ----------------------------------------------------------------------------------------------
def _known(truth) -> bool:
    t = np.asarray(truth)
    return t.size > 0 and bool((t != UNKNOWN_BIAS).all())


def proportions(pred, truth=None) -> dict:
    """``{"uni_image": (share, acc), "balance": ..., "uni_text": ...}``: the share of samples
    predicted as each class and the in-class accuracy (fraction of those whose truth is that
    class; NaN when none is predicted or truth is unknown). pred, truth: int [N]."""
    pred = np.asarray(pred)
    n = max(pred.size, 1)
    known = truth is not None and _known(truth)
    out = {}
    for c, name in enumerate(BIAS_TYPES):
        sel = pred == c
        share = float(sel.sum()) / n
        acc = float((np.asarray(truth)[sel] == c).mean()) if known and sel.any() else math.nan
        out[name] = (share, acc)
    return out


def format_cell(share: float, acc: float) -> str:
    """The paper's ``"0.78[85.53]"``: share (2 decimals) and in-class accuracy in percent
    (2 decimals; an empty class prints ``[0.00]`` as in the paper, unknown truth ``[-]``)."""
    if acc is None or (isinstance(acc, float) and math.isnan(acc)):
        return f"{share:.2f}[{'0.00' if share == 0 else '-'}]"
    return f"{share:.2f}[{100 * acc:.2f}]"


def macro_f1(pred, truth) -> float:
    """``sklearn.metrics.f1_score(truth, pred, labels=[0, 1, 2], average="macro",
    zero_division=0)``: the mean over the three classes of the per-class F1, a class never
    predicted nor present scoring 0."""
    from sklearn.metrics import f1_score

    return float(f1_score(np.asarray(truth), np.asarray(pred), labels=list(LABELS),
                          average="macro", zero_division=0))


def score_labels(pred, truth=None) -> dict:
    """``{"accuracy", "macro_f1", "proportions": {type: [share, acc]}}`` of ``pred`` [N];
    accuracy, macro-F1 and in-class accuracies are None when ``truth`` is unknown."""
    props = proportions(pred, truth)
    known = truth is not None and _known(truth)
    clean = lambda x: None if x is None or math.isnan(x) else x  # noqa: E731
    return {"accuracy": float((np.asarray(pred) == np.asarray(truth)).mean()) if known else None,
            "macro_f1": macro_f1(pred, truth) if known else None,
            "proportions": {k: [s, clean(a)] for k, (s, a) in props.items()}}


def krippendorff_alpha(table) -> float:
    """Krippendorff's alpha, nominal level, of a label table int [V, N] (V raters = views):
    ``krippendorff.alpha(reliability_data=table, level_of_measurement="nominal")``; NaN when
    the table holds a single value (alpha undefined: no variation to agree on)."""
    import krippendorff

    table = np.asarray(table, np.float64)
    if np.unique(table).size < 2:
        return math.nan
    return float(krippendorff.alpha(reliability_data=table, level_of_measurement="nominal"))


def agreement(view_labels: dict, views=VIEWS) -> dict:
    """``{"all": alpha over the views, "<a>-<b>": alpha per pair}`` (Krippendorff, nominal)."""
    out = {"all": krippendorff_alpha(np.stack([view_labels[v] for v in views]))}
    for i, a in enumerate(views):
        for b in views[i + 1:]:
            out[f"{a}-{b}"] = krippendorff_alpha(np.stack([view_labels[a], view_labels[b]]))
    return out


def venn_counts(view_labels: dict, views=VIEWS) -> dict:
    """Figure 3: for each class name, the sizes of the seven regions of the three views' sets
    ``{n : label_v[n] == c}``; region ``"110"`` = in views 0 and 1, not in view 2 (order
    ``views``). Returns ``{type: {region: count}}``."""
    if len(views) != 3:
        raise ValueError(f"a Venn diagram needs three views, got {views}")
    out = {}
    for c, name in enumerate(BIAS_TYPES):
        sets = [np.asarray(view_labels[v]) == c for v in views]
        out[name] = {r: int(np.sum(np.logical_and.reduce(
            [s if bit == "1" else ~s for s, bit in zip(sets, r)]))) for r in VENN_REGIONS}
    return out


def venn_figure(counts: dict, path, views=VIEWS, title: str = "") -> None:
    """Write Figure 3 as a PNG: one three-circle Venn diagram per class (circles drawn with
    matplotlib, region counts written in place). Written to a temporary name, then renamed."""

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
# Threshold sweep and K-means (Tables 6, 7).
# ----------------------------------------------------------------------------------------------
def threshold_sweep(view_labels: dict, flow_score, eps_grid=EPS_GRID, truth=None) -> list:
    """Table 6: for each eps, the flow view relabelled ``label_from_score(flow_score, eps)``
    and the prior-majority ensemble with it. Returns ``[{"eps", "flow": score_labels,
    "ensemble": score_labels}]``."""
    from bias_jax.views.common import label_from_score

    rows = []
    for eps in eps_grid:
        labels = dict(view_labels, flow=label_from_score(flow_score, eps))
        rows.append({"eps": float(eps), "flow": score_labels(labels["flow"], truth),
                     "ensemble": score_labels(EN.combine(labels), truth)})
    return rows


def kmeans_labels(score, seed: int = 0) -> np.ndarray:
    """Table 7: int32 [N] from ``sklearn.cluster.KMeans(3, n_init=10, random_state=seed)`` on
    the 1-d score; clusters mapped by centre order (lowest -> UNI_TEXT, middle -> BALANCE,
    highest -> UNI_IMAGE: the score is > 0 towards the image). Fewer than 3 distinct scores:
    the distinct values are the clusters (lowest -> UNI_TEXT, highest -> UNI_IMAGE when 2)."""
    from sklearn.cluster import KMeans

    s = np.asarray(score, np.float64).reshape(-1, 1)
    distinct = np.unique(s)
    if distinct.size < 3:
        order = {1: [1], 2: [2, 0]}[max(distinct.size, 1)] if distinct.size else []
        out = np.ones(s.shape[0], np.int32)
        for v, lab in zip(distinct, order):
            out[s[:, 0] == v] = lab
        return out
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        km = KMeans(n_clusters=3, n_init=10, random_state=seed).fit(s)
    rank = np.argsort(np.argsort(km.cluster_centers_[:, 0]))  # 0 lowest .. 2 highest
    to_type = np.array([2, 1, 0], np.int32)  # lowest centre = uni_text
    return to_type[rank[km.labels_]]


# ----------------------------------------------------------------------------------------------
# Masking (Table 14).
# ----------------------------------------------------------------------------------------------
def n_masked(ratio: float, n: int) -> int:
    """Players masked at ``ratio`` out of ``n``: Python ``round(ratio * n)``."""
    return int(round(ratio * n))


def _rank_mask(u, k):
    """bool [..., P]: the ``k`` [...] positions with the smallest ``u`` [..., P] (u = inf never
    chosen)."""
    rank = jnp.argsort(jnp.argsort(u, axis=-1), axis=-1)
    return rank < k[..., None]


@jax.jit
def _mask_cells(key, image, ratio, grid):
    b, h, w, _ = image.shape
    c = grid.shape[0] ** 2
    u = jax.random.uniform(key, (b, c))
    k = jnp.round(ratio * c).astype(jnp.int32) * jnp.ones(b, jnp.int32)
    cells = _rank_mask(u, k)  # [B, C]
    row = (jnp.arange(h) * grid.shape[0]) // h
    col = (jnp.arange(w) * grid.shape[0]) // w
    pix = cells.reshape(b, grid.shape[0], grid.shape[0])[:, row][:, :, col]  # [B, H, W]
    return jnp.where(pix[..., None], jnp.zeros_like(image), image)


@jax.jit
def _mask_tokens(key, tokens, ratio):
    words = tokens != PAD_ID
    u = jnp.where(words, jax.random.uniform(key, tokens.shape), jnp.inf)
    k = jnp.round(ratio * words.sum(-1)).astype(jnp.int32)
    return jnp.where(_rank_mask(u, k), PAD_ID, tokens)


def mask_batch(batch: Batch, key, *, image_ratio: float = 0.0, text_ratio: float = 0.0,
               grid_size: int = 5) -> Batch:
    """``batch`` with ``round(image_ratio * S*S)`` of its grid cells (S = ``grid_size``; cell
    (i, j) = the pixels with row * S // H == i, col * S // W == j) set to zero pixels and
    ``round(text_ratio * #words)`` of its non-PAD tokens set to PAD, per sample, chosen
    uniformly without replacement (independent keys for image and text). Host numpy out.

    Rounding is half-to-even as Python's ``round``; note that jnp.round is the same rule."""
    k_img, k_txt = jax.random.split(key)
    image, tokens = np.asarray(batch.image), np.asarray(batch.tokens)
    if image_ratio > 0:
        image = np.asarray(_mask_cells(k_img, image, jnp.float32(image_ratio),
                                       jnp.zeros(grid_size)))
    if text_ratio > 0:
        tokens = np.asarray(_mask_tokens(k_txt, tokens, jnp.float32(text_ratio)))
    return batch.replace(image=image, tokens=tokens)


# ----------------------------------------------------------------------------------------------
# Running the views.
# ----------------------------------------------------------------------------------------------
def view_fn(name: str):
    """The view function ``bias_jax.views.<name>.<name>_view`` (imported on first use)."""
    if name not in VIEWS:
        raise ValueError(f"unknown view {name!r}; expected one of {VIEWS}")
    try:
        mod = importlib.import_module(f"bias_jax.views.{name}")
    except ModuleNotFoundError as e:
        raise InputError(f"the {name} view (bias_jax/views/{name}.py) is not available: {e}")
    return getattr(mod, f"{name}_view")


def run_views(detectors: dict, batch: Batch, *, key=None, views=VIEWS, options=None,
              progress=None) -> dict:
    """``{name: ViewResult}`` of each view on ``batch``; ``options[name]`` are keyword
    arguments of that view (e.g. ``{"flow": {"eps": 0.25}}``); ``progress(name)`` is called
    before each view."""
    key = jax.random.key(0) if key is None else key
    options = options or {}
    out = {}
    for i, name in enumerate(views):
        if progress:
            progress(name)
        out[name] = view_fn(name)(detectors, batch, key=jax.random.fold_in(key, i),
                                  **options.get(name, {}))
    return out


def mean_detector(dets) -> tuple:
    """One detector answering with the mean logit of several ``(apply_fn, params, cfg)`` of the
    same kind (Table 15): ``(apply, params_tuple, cfg_of_first)``."""
    fns = tuple(d[0] for d in dets)

    def apply(params, image, tokens):
        return sum(f(p, image, tokens) for f, p in zip(fns, params)) / len(fns)

    return jax.jit(apply), tuple(d[1] for d in dets), dets[0][2]


def joint_accuracy(detectors: dict, batch: Batch, chunk: int = 512) -> np.ndarray:
    """bool [N]: the joint (image-text) detector is right on each sample (logit > 0 = real)."""
    f, p, _ = detectors["joint"]
    out = []
    for s in range(0, batch.size, chunk):
        out.append(np.asarray(f(p, jnp.asarray(batch.image[s:s + chunk]),
                                jnp.asarray(batch.tokens[s:s + chunk]))))
    logits = np.concatenate(out)
    return (logits > 0) == (np.asarray(batch.label) == REAL)


def post_validation(detectors: dict, batch: Batch, groups: dict, key, *, grid_size: int = 5,
                    grid=MASK_GRID, rerun_views: bool = False, view_options=None,
                    truth=None) -> list:
    """Table 14: for each (image ratio, text ratio), the joint detector's accuracy on each
    group of samples (``groups``: name -> bool [N], e.g. the samples the ensemble calls
    Uni-image / Uni-text) after masking (``mask_batch``), and its difference to no masking;
    with ``rerun_views`` also the views and the ensemble rerun on the masked samples
    (``score_labels`` of the ensemble against ``truth``)."""
    base = joint_accuracy(detectors, batch)
    rows = []
    for i, (ri, rt) in enumerate(grid):
        masked = mask_batch(batch, jax.random.fold_in(key, i), image_ratio=ri, text_ratio=rt,
                            grid_size=grid_size) if (ri or rt) else batch
        ok = base if not (ri or rt) else joint_accuracy(detectors, masked)
        row = {"image_ratio": ri, "text_ratio": rt, "groups": {}}
        for g, sel in groups.items():
            sel = np.asarray(sel, bool)
            a = float(ok[sel].mean()) if sel.any() else math.nan
            a0 = float(base[sel].mean()) if sel.any() else math.nan
            row["groups"][g] = {"accuracy": a, "delta": a - a0, "n": int(sel.sum())}
        if rerun_views:
            res = run_views(detectors, masked, key=jax.random.fold_in(key, 100 + i),
                            options=view_options)
            row["ensemble"] = score_labels(EN.combine({k: v.label for k, v in res.items()}),
                                           truth)
        rows.append(row)
    return rows


# ----------------------------------------------------------------------------------------------
# The whole analysis.
# ----------------------------------------------------------------------------------------------
def second_detectors(root=None) -> dict:
    """``{kind: (apply, params, cfg)}`` of the second detectors ``bias_<kind>_b`` (Table 2,
    15) found under ``root`` (default: the shipped checkpoints/) for kinds image, joint,
    text; kinds without one are left out."""
    from pathlib import Path

    from bias_jax import detectors as D

    root = D.shipped_dir("image").parent if root is None else Path(root)
    out = {}
    for kind in ("image", "joint", "text"):
        path = root / f"{D.SHIPPED[kind]}{SECOND_SUFFIX}"
        if (path / "config.json").is_file():
            out[kind] = D.load_detector(path)
    return out


def load_detectors(root=None, kinds=("image", "text", "joint", "lvlm")) -> dict:
    """``{kind: (apply, params, cfg)}`` from ``root/bias_<kind>/`` (default: shipped)."""
    from pathlib import Path

    from bias_jax import detectors as D

    return {k: D.load_detector(k if root is None else Path(root) / D.SHIPPED[k]) for k in kinds}


def closed_world_batch(cfg, n: int, seed: int = ANALYSIS_SEED, start: int = 0) -> Batch:
    """Closed-world samples start..start+n-1 of ``seed`` at the detectors' grid / cell size and
    the default type mix (host ``Batch``)."""
    from bias_jax.data import closed_world as CW

    spec = CW.WorldSpec(grid_size=cfg.grid_size, cell_px=cfg.cell_px)
    parts = [CW.load_closed_world(spec, seed, min(4096, n - s), start=start + s)
             for s in range(0, n, 4096)]
    from bias_jax.data.batch import concat

    return parts[0] if len(parts) == 1 else concat(parts)


def confusion(pred, truth) -> list:
    """3 x 3 counts ``[t][p] = #{truth == t and pred == p}`` (classes UNI_IMAGE, BALANCE,
    UNI_TEXT); rows are the true types."""
    t, p = np.asarray(truth, np.int64), np.asarray(pred, np.int64)
    return np.bincount(3 * t + p, minlength=9).reshape(3, 3).tolist()


def identifiable_labels(truth, label) -> np.ndarray:
    """The exact types with every real Uni-image sample relabelled Modality-balance: in the
    closed world a real Uni-image sample (authentic scene, true contingent claim) has the
    distribution of a real balanced sample, so no labelling computed from the inputs and the
    label can tell them apart; this is the best any view or ensemble can answer (with
    detectors that miss nothing else). truth, label int [N]; int32 [N]."""
    truth = np.asarray(truth)
    real_ui = (truth == 0) & (np.asarray(label) == REAL)
    return np.where(real_ui, 1, truth).astype(np.int32)


def headline(res: dict, variant: str | None = None, rule: str | None = None) -> dict:
    """The ``--json`` line of ``modality-bias analyze``: ``{"benefit", "flow", "causal",
    "ensemble"}`` scored for ``variant`` (``ensemble.VARIANTS``; default: the one ``analyze``
    recorded in ``res["default"]``), ``ensemble`` = its rule ``rule`` (``ensemble.RULES``;
    default: ``ensemble.DEFAULT_RULE[variant]``), plus ``"benefit_<o>"``, ``"causal_<o>"``,
    ``"ensemble_<o>"`` for the other variant ``o`` with its default rule. Every entry is a
    ``score_labels`` dict."""
    variant = res["default"]["variant"] if variant is None else variant
    if rule is None and variant == res["default"]["variant"]:
        rule = res["default"]["rule"]
    by = {"paper": res["scores"], "improved": res["scores_improved"]}
    if variant not in by:
        raise ValueError(f"unknown variant {variant!r}; expected one of {tuple(by)}")
    sc = by[variant]
    line = {"benefit": sc["benefit"], "flow": sc["flow"], "causal": sc["causal"],
            "ensemble": sc[EN.rule_key(rule, variant)]}
    for other in by:
        if other != variant:
            o = by[other]
            line.update({f"benefit_{other}": o["benefit"], f"causal_{other}": o["causal"],
                         f"ensemble_{other}": o[EN.rule_key(None, other)]})
    return line


def saliency_table(detectors: dict, batch: Batch, labels: dict, flow_options: dict, *,
                   truth=None, n: int = LIME_TABLE_N, key=None) -> dict:
    """Table 3 (appendix 10.1): the flow view with attention saliency and with LIME on the
    first ``n`` samples of ``batch``, and the prior-majority ensemble of each with the other
    views' ``labels`` (name -> int [N], the whole batch; restricted to the same samples).

    Returns ``{"n", "attention": {...}, "lime": {...}}``, each ``{"flow", "ensemble"}``
    (``score_labels``) and ``"samples_per_s"`` (the flow view's throughput, measured after a
    compiling call on the same shapes)."""
    from bias_jax.data.batch import take

    flow_view = view_fn("flow")
    key = jax.random.key(0) if key is None else key
    m = min(n, batch.size)
    sub = take(batch, np.arange(m))
    t_sub = None if truth is None else np.asarray(truth)[:m]
    rest = {v: np.asarray(lab)[:m] for v, lab in labels.items()}
    out = {"n": m}
    for sal in ("attention", "lime"):
        opts = dict(flow_options, saliency=sal)
        opts.setdefault("chunk", 64)
        flow_view(detectors, take(sub, np.arange(1)), key=key, **opts)  # compile
        t0 = time.perf_counter()
        fl = flow_view(detectors, sub, key=key, **opts)
        wall = time.perf_counter() - t0
        lab = dict(rest, flow=np.asarray(fl.label))
        out[sal] = {"flow": score_labels(lab["flow"], t_sub),
                    "ensemble": score_labels(EN.combine(lab), t_sub),
                    "samples_per_s": m / wall if wall > 0 else float("nan")}
    return out


def analyze(detectors: dict, batch: Batch, *, key=None, flow_eps: float = 0.25,
            tables: bool = False, second=None, log=None,
            variant: str = EN.DEFAULT_VARIANT, rule: str | None = None,
            lime_n: int = LIME_TABLE_N) -> dict:
    """Run the three views and every ensemble on ``batch`` and score them against
    ``batch.bias`` (unknown -> proportions and agreement only), for the paper's views and for
    the improved ones (``ensemble.VARIANTS``: graded benefit, probability-scale causal; the flow view
    is shared).

    Returns ``(results, view_results)``: ``view_results`` the ``ViewResult`` per view
    (``benefit``, ``flow``, ``causal``: the paper's; ``benefit_improved``,
    ``causal_improved``), ``results = {"n", "priority", "scores": {name: score_labels},
    "agreement", "venn", "benefit_ties", "priority_improved", "scores_improved",
    "agreement_improved", "default": {"variant", "rule"}, "confusion"}`` (and
    ``"identifiable"``, the scores of :func:`identifiable_labels`, when the truth is known)
    plus, with ``tables``, ``"sweep"`` (Table 6), ``"kmeans"`` (Table 7), ``"aggregation"``
    (Table 4: the flow view with sum / mean / max, and the ensemble with each), ``"saliency"``
    (Table 3: :func:`saliency_table` on the first ``lime_n`` samples), ``"masking"``
    (Table 14), ``"swap"`` (Table 2) and ``"multi"`` (Table 15; the last two need ``second`` =
    :func:`second_detectors`, else they hold the groups available); the tables use the
    paper's views. ``scores`` (paper's views) and ``scores_improved`` each cover benefit,
    flow, causal, ensemble (prior majority), random, weighted and the three two-view
    ablations; ``variant`` / ``rule`` name the answer :func:`headline` reports (default: the
    improved views, ``ensemble.DEFAULT_RULE``). ``confusion``: :func:`confusion` of each
    view and of the headline ensemble, per variant."""
    key = jax.random.key(0) if key is None else key
    log = log or (lambda *a: None)
    rule = EN.DEFAULT_RULE[variant] if rule is None else rule
    EN.rule_key(rule, variant)  # validates both
    truth = np.asarray(batch.bias)
    truth = truth if _known(truth) else None
    opts = EN.view_options("paper", flow_eps)
    t0 = time.perf_counter()
    res = run_views(detectors, batch, key=key, options=opts,
                    progress=lambda v: log(f"view {v} ..."))
    labels = {k: np.asarray(v.label) for k, v in res.items()}
    priority = EN.class_priority(np.stack([labels[v] for v in VIEWS]))
    ens = EN.all_ensembles(labels, priority=priority, key=jax.random.fold_in(key, 7))
    out = {"n": batch.size, "priority": [BIAS_TYPES[c] for c in priority],
           "scores": {**{v: score_labels(labels[v], truth) for v in VIEWS},
                      **{k: score_labels(p, truth) for k, p in ens.items()}},
           "agreement": agreement(labels), "venn": venn_counts(labels)}
    if "phi_image" in res["benefit"].extras:
        ex = res["benefit"].extras
        out["benefit_ties"] = float(np.mean(np.asarray(ex["phi_image"]) ==
                                            np.asarray(ex["phi_text"])))
    imp = run_views(detectors, batch, key=key, views=("benefit", "causal"),
                    options=EN.view_options("improved", flow_eps),
                    progress=lambda v: log(f"view {v} (improved) ..."))
    ilabels = dict(labels, **{k: np.asarray(v.label) for k, v in imp.items()})
    ipriority = EN.class_priority(np.stack([ilabels[v] for v in VIEWS]))
    iens = EN.all_ensembles(ilabels, priority=ipriority, key=jax.random.fold_in(key, 7))
    out.update({"priority_improved": [BIAS_TYPES[c] for c in ipriority],
                "scores_improved": {**{v: score_labels(ilabels[v], truth) for v in VIEWS},
                                    **{k: score_labels(p, truth) for k, p in iens.items()}},
                "agreement_improved": agreement(ilabels),
                "default": {"variant": variant, "rule": rule}})
    res.update({f"{k}_improved": v for k, v in imp.items()})
    if truth is not None:
        conf = {}
        for name, lab, en in (("paper", labels, ens), ("improved", ilabels, iens)):
            r = rule if name == variant else EN.DEFAULT_RULE[name]
            conf[name] = {**{v: confusion(lab[v], truth) for v in VIEWS},
                          f"ensemble ({r})": confusion(en[EN.rule_key(r, name)], truth)}
        out["confusion"] = conf
        out["identifiable"] = score_labels(identifiable_labels(truth, batch.label), truth)
    out["views_wall_s"] = time.perf_counter() - t0
    if not tables:
        return out, res
    log("tables: threshold sweep, K-means ...")
    flow_score = np.asarray(res["flow"].score)
    out["sweep"] = threshold_sweep(labels, flow_score, truth=truth)
    km = kmeans_labels(flow_score)
    out["kmeans"] = {"flow": score_labels(km, truth),
                     "ensemble": score_labels(EN.combine(dict(labels, flow=km)), truth)}
    log("tables: flow aggregations (Table 4) ...")
    out["aggregation"] = {}
    for agg in ("sum", "mean", "max"):
        fl = labels["flow"] if agg == opts["flow"].get("aggregation", "sum") else np.asarray(
            run_views(detectors, batch, key=key, views=("flow",), options={
                "flow": dict(opts["flow"], aggregation=agg)})["flow"].label)
        out["aggregation"][agg] = {"flow": score_labels(fl, truth), "ensemble": score_labels(
            EN.combine(dict(labels, flow=fl), priority=priority), truth)}
    log(f"tables: LIME saliency on {min(lime_n, batch.size)} samples (Table 3) ...")
    out["saliency"] = saliency_table(detectors, batch, labels, opts["flow"], truth=truth,
                                     n=lime_n, key=jax.random.fold_in(key, 13))
    log("tables: post-validation masking ...")
    pred = ens["ensemble"]
    groups = {"pred_uni_image": pred == 0, "pred_uni_text": pred == 2}
    if truth is not None:
        groups.update({"true_uni_image": truth == 0, "true_uni_text": truth == 2})
    grid = detectors["joint"][2].grid_size
    out["masking"] = post_validation(detectors, batch, groups, jax.random.fold_in(key, 11),
                                     grid_size=grid, rerun_views=True, view_options=opts,
                                     truth=truth)
    second = second or {}
    out["second_detectors"] = sorted(second)
    swap = {}
    for g, kind in SWAP_GROUPS.items():
        if kind is not None and kind not in second:
            continue
        log(f"tables: detector swap {g} ...")
        dets = dict(detectors) if kind is None else dict(detectors, **{kind: second[kind]})
        r = res if kind is None else run_views(dets, batch, key=key, views=("benefit", "causal"))
        lab = dict(labels, **{k: np.asarray(v.label) for k, v in r.items()})
        swap[g] = {"swapped": kind, "benefit": score_labels(lab["benefit"], truth),
                   "causal": score_labels(lab["causal"], truth),
                   "ensemble": score_labels(EN.combine(lab), truth)}
    out["swap"] = swap
    if second:
        log("tables: multi-detector ensemble ...")
        dets = dict(detectors, **{k: mean_detector([detectors[k], second[k]]) for k in second})
        r = run_views(dets, batch, key=key, views=("benefit", "causal"))
        lab = dict(labels, **{k: np.asarray(v.label) for k, v in r.items()})
        out["multi"] = {"kinds": sorted(second), "benefit": score_labels(lab["benefit"], truth),
                        "causal": score_labels(lab["causal"], truth),
                        "ensemble": score_labels(EN.combine(lab), truth)}
    return out, res


def bench(detectors: dict, batch: Batch, *, views=VIEWS, key=None, repeats: int = 1,
          options=None) -> dict:
    """Throughput of each view on ``batch`` (``options[view]``: its keyword arguments, e.g.
    ``ensemble.view_options("improved")``): a first call compiles (``<view>_compile_s``), then
    ``repeats`` timed calls give ``<view>_samples_per_s`` = N / mean wall time and
    ``<view>_minutes_per_60k`` = 60000 / that / 60. ``forward_samples_per_s``: the joint
    detector's plain batched forward on the same samples, the unit the views' costs compare to
    (``<view>_forwards`` = forward rate / view rate)."""
    key = jax.random.key(0) if key is None else key
    out = {"n": batch.size}
    f, p, _ = detectors["joint"]
    joint_accuracy(detectors, batch)
    t = time.perf_counter()
    joint_accuracy(detectors, batch)
    fwd = batch.size / (time.perf_counter() - t)
    out["forward_samples_per_s"] = fwd
    options = options or {}
    for name in views:
        fn = functools.partial(view_fn(name), **options.get(name, {}))
        t = time.perf_counter()
        fn(detectors, batch, key=key)
        out[f"{name}_compile_s"] = time.perf_counter() - t
        t = time.perf_counter()
        for _ in range(repeats):
            fn(detectors, batch, key=key)
        sps = batch.size * repeats / (time.perf_counter() - t)
        out[f"{name}_samples_per_s"] = sps
        out[f"{name}_minutes_per_60k"] = 60000 / sps / 60
        out[f"{name}_forwards"] = fwd / sps
    return out


__all__ = ["ANALYSIS_SEED", "EPS_GRID", "MASK_GRID", "SWAP_GROUPS", "proportions",
           "format_cell", "macro_f1", "score_labels", "krippendorff_alpha", "agreement",
           "venn_counts", "venn_figure", "tables_text", "improved_text", "threshold_sweep",
           "kmeans_labels", "n_masked", "mask_batch", "view_fn", "run_views", "mean_detector",
           "joint_accuracy", "post_validation", "second_detectors", "load_detectors",
           "closed_world_batch", "confusion", "identifiable_labels", "headline",
           "saliency_table", "analyze",
           "bench"]


# ----------------------------------------------------------------------------------------------
# The paper's numbers and the tables printed beside ours.
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


def tables_text(res: dict, title: str = "") -> str:
    """Every table of ``analyze(..., tables=True)`` as text, the paper's numbers beside ours
    (ours: UI / MB / UT cells, Acc %, F1 %; paper: Acc, F1 on Fakeddit | MMFakeBench)."""
    L = [title] if title else []
    L.append(TABLE_HEADER.format(n=res["n"]))
    sc = res["scores"]
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
