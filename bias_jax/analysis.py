"""The modality-bias analysis pipeline: the three views, their ensembles and the robustness
experiments on one batch, scored against ``batch.bias`` (modality-bias paper, section 4.4 and
appendices 10-15).

:func:`analyze` runs the views (:mod:`bias_jax.views`) with the paper's options and with the
improved ones (``ensemble.VARIANTS``), every ensemble (:mod:`bias_jax.ensemble`), and scores
them (:mod:`bias_jax.scoring`); with ``tables=True`` also the robustness experiments: the flow
threshold sweep and K-means (:mod:`bias_jax.thresholds`), the flow view's aggregations and
saliencies, post-validation by masking (:mod:`bias_jax.masking`), detector swap (one of the
image / joint / text detectors replaced by a second one, ``SWAP_GROUPS``) and the
multi-detector ensemble (each of those kinds answers with the mean logit of its two detectors,
:func:`mean_detector`). :func:`headline` picks the summary line of a result, :func:`bench`
measures the views' throughput. :func:`analyze` takes one ``Batch`` or a stream of
them (``data.batch.iter_batches``: a real benchmark decoded a chunk at a time), keeping only
per-sample results between chunks (:func:`merge_views`). :func:`quality_sweep` scores the
views and the ensemble once per detector set on the same samples, against the sets' held-out
accuracy (issue 25: the paper's finding 2 with exact labels); :func:`tune_variant` re-chooses
the improved views' options and ensemble rule on samples of a tuning seed, which
:func:`score_options` then reports on others.

Closed-world analysis samples come from ``ANALYSIS_SEED`` of a world of
``data.worlds.WORLDS`` (:func:`closed_world_batch`; detectors: :func:`world_detectors`), a
key stream no training (``evaluate.TRAIN_SEED``) or detector evaluation
(``evaluate.EVAL_SEED``) uses.
"""

from __future__ import annotations

import functools
import time

import jax
import numpy as np

from bias_jax import detectors as D
from bias_jax import ensemble as EN
from bias_jax.data import worlds as WD
from bias_jax.data.batch import BIAS_TYPES, UNKNOWN_BIAS, Batch, concat, take
from bias_jax.masking import joint_accuracy, post_validation
from bias_jax.scoring import (agreement, confusion, identifiable_labels, score_labels,
                              truth_known, venn_counts)
from bias_jax.thresholds import kmeans_labels, threshold_sweep
from bias_jax.views import causal as CA
from bias_jax.views import ViewResult, run_views, view_fn
from mmx_base.errors import InputError

ANALYSIS_SEED = 2_000_029  # closed-world seed of analysis samples (not TRAIN_SEED / EVAL_SEED)
VIEWS = EN.VIEWS
SWAP_GROUPS = {"G1": None, "G2": "image", "G3": "joint", "G4": "text"}  # swapped kind per group
LIME_TABLE_N = 64  # samples the LIME flow view runs on (about 0.2 s each on 2 cores)
TABLES_STREAM_N = 2048  # samples analyze keeps from a stream for the tables (their pixels)


def mean_detector(dets) -> tuple:
    """One detector answering with the mean logit of several ``(apply_fn, params, cfg)`` of the
    same kind (Table 15): ``(apply, params_tuple, cfg_of_first)``."""
    fns = tuple(d[0] for d in dets)

    def apply(params, image, tokens):
        return sum(f(p, image, tokens) for f, p in zip(fns, params)) / len(fns)

    return jax.jit(apply), tuple(d[1] for d in dets), dets[0][2]


def closed_world_batch(cfg, n: int, seed: int = ANALYSIS_SEED, start: int = 0,
                       world: str | None = None) -> Batch:
    """Closed-world samples start..start+n-1 of ``seed`` of ``world`` (``data.worlds.WORLDS``;
    None: ``worlds.DEFAULT_WORLD``) at the detectors' grid / cell size and the world's default
    type mix (host ``Batch``), its claims tokenized as ``cfg``'s text encoder reads them
    (``detectors.closed_world_text``: MiniLM WordPiece ids for a ``minilm`` detector)."""
    world = WD.check_world(WD.DEFAULT_WORLD if world is None else world)
    # claims of the detectors' length (as evaluate.evaluate_world): a learned text encoder
    # reads exactly cfg.max_tokens positions (the samples do not depend on the padding)
    spec = WD.world_spec(world, grid_size=cfg.grid_size, cell_px=cfg.cell_px,
                         max_tokens=cfg.max_tokens)
    return D.closed_world_text(cfg, WD.load_world(spec, seed, n, start))


def world_detectors(world: str | None = None, *, steps: int | None = None,
                    second: bool = False) -> dict:
    """The shipped detector set of ``world`` (``detectors.shipped_set``: kind -> Model;
    ``steps`` a training length of ``detectors.TRAINING_LENGTHS``, None the longest;
    ``second``: the second set, for detector swap; ``InputError`` for what is not shipped)."""
    world = WD.check_world(WD.DEFAULT_WORLD if world is None else world)
    return D.shipped_set(world, steps, second)


def world_second_detectors(world: str | None = None) -> dict:
    """The second shipped detectors of ``world`` for :func:`analyze`'s ``second`` (detector
    swap, multi-detector ensemble): :func:`world_detectors` with ``second=True``, cut to the
    kinds of ``SWAP_GROUPS``; ``{}`` when that world ships no second set (those tables then
    hold the groups available)."""
    try:
        dets = world_detectors(world, second=True)
    except InputError:
        if WD.check_world(WD.DEFAULT_WORLD if world is None else world) == "basic":
            raise
        return {}
    return {k: m for k, m in dets.items() if k in SWAP_GROUPS.values()}


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


def _ensembles(labels: dict, key) -> tuple:
    """(class priority, ``ensemble.all_ensembles``) of the view labels ``labels`` (name ->
    int [N]) with ``analyze``'s PRNG key for the random rule."""
    priority = EN.class_priority(np.stack([labels[v] for v in VIEWS]))
    return priority, EN.all_ensembles(labels, priority=priority, key=jax.random.fold_in(key, 7))


def variant_views(view_results: dict, variant: str = EN.DEFAULT_VARIANT) -> dict:
    """``{"benefit", "flow", "causal"} -> ViewResult`` of ``variant`` (``ensemble.VARIANTS``)
    from :func:`analyze`'s ``view_results`` (the improved variant's benefit and causal views
    are its ``*_improved`` entries; the flow view is shared)."""
    if variant not in EN.VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; expected one of {tuple(EN.VARIANTS)}")
    suffix = "" if variant == "paper" else f"_{variant}"
    return {v: view_results[v if v == "flow" else v + suffix] for v in VIEWS}


def ensemble_labels(view_results: dict, variant: str = EN.DEFAULT_VARIANT,
                    rule: str | None = None, key=None) -> np.ndarray:
    """int32 [N]: the labels of ensemble ``rule`` (``ensemble.RULES``; default
    ``DEFAULT_RULE[variant]``) of ``variant``'s views, exactly those :func:`analyze` scored
    with the same ``key`` (same class priority, same random key)."""
    key = jax.random.key(0) if key is None else key
    labels = {v: np.asarray(r.label) for v, r in variant_views(view_results, variant).items()}
    return np.asarray(_ensembles(labels, key)[1][EN.rule_key(rule, variant)], np.int32)


def _trim(view: ViewResult, m: int) -> ViewResult:
    """The first ``m`` samples of ``view`` (a chunk's result, the chunk padded past ``m``):
    label, score and the per-sample extras (arrays with a leading sample axis); set-level
    extras (the causal view's ``scales``) are left out: :func:`merge_views` recomputes them."""
    size = np.asarray(view.label).shape[0]
    ex = {k: np.asarray(v)[:m] for k, v in view.extras.items()
          if isinstance(v, (np.ndarray, jax.Array)) and v.ndim and v.shape[0] == size}
    return ViewResult(np.asarray(view.label)[:m], np.asarray(view.score)[:m], ex)


def merge_views(name: str, parts, label, options: dict | None = None) -> ViewResult:
    """One ``ViewResult`` of view ``name`` (``views.VIEWS``) on the samples of consecutive
    chunks, from its per-chunk results ``parts`` (each cut to its own samples), as the view
    gives on all of them at once: label, score and extras concatenated; for the causal view
    the set-level step (its calibration over the analysed samples, e.g. the detector scales
    or the paths' z-scoring, and the decision) is redone on the concatenated branch outputs
    (``views.causal.causal_decision`` with ``options``, the view's keyword arguments;
    ``label`` int [N], the true labels). The benefit and flow views are per sample, and so is
    any view registered in place of the causal one whose extras lack the branch outputs."""
    parts = list(parts)
    ex = {k: np.concatenate([p.extras[k] for p in parts]) for k in parts[0].extras}
    merged = ViewResult(np.concatenate([p.label for p in parts]),
                        np.concatenate([p.score for p in parts]), ex)
    if name != "causal" or not all(b in ex for b in CA.BRANCH_KIND):
        return merged
    opts = {k: v for k, v in (options or {}).items() if k in CA.DECISION_OPTIONS}
    return CA.causal_decision({b: ex[b] for b in CA.BRANCH_KIND}, label, ex["core_cells"],
                              ex["core_tokens"], **opts)


def _pad(batch: Batch, size: int) -> Batch:
    """``batch`` with its last sample repeated up to ``size`` samples (one compiled shape for
    every chunk of a stream; the copies' results are cut off)."""
    m = batch.size
    return batch if m >= size else take(batch, np.minimum(np.arange(size), m - 1))


def _sample_table(batch: Batch, causal: ViewResult) -> dict:
    """The small per-sample fields ``analyze`` scores with (host numpy): ``label``, ``bias``,
    ``has_gt`` [N] and, when every sample has the closed world's ground truth and the causal
    view's result ``causal`` has core cells, ``exact``: the exact core parts (cells bool
    [N, S, S], tokens bool [N, L]) at its grid, for the IoU diagnostic."""
    t = {"label": np.asarray(batch.label), "bias": np.asarray(batch.bias),
         "has_gt": np.asarray(batch.has_gt, bool)}
    if batch.size and np.all(t["has_gt"]) and "core_cells" in causal.extras:
        t["exact"] = CA.exact_core_parts(np.asarray(causal.extras["core_cells"]).shape[1])(batch)
    return t


def _concat_tables(tables: list) -> dict:
    """:func:`_sample_table` of consecutive chunks, concatenated (``exact`` only when every
    chunk has it)."""
    out = {k: np.concatenate([t[k] for t in tables]) for k in ("label", "bias", "has_gt")}
    if all("exact" in t for t in tables):
        out["exact"] = tuple(np.concatenate([t["exact"][i] for t in tables]) for i in (0, 1))
    return out


def _run(detectors, batch: Batch, key, runs, wall: dict, log=None) -> dict:
    """``{name + suffix: ViewResult}`` for each ``(suffix, views, options)`` of ``runs``, view
    i of ``views`` with ``fold_in(key, i)`` (``views.run_views``); each view's seconds are
    added to ``wall[name + suffix]``."""
    out = {}
    for suffix, views, options in runs:
        fns = [view_fn(v) for v in views]
        for i, (v, fn) in enumerate(zip(views, fns)):
            if log:
                log(f"view {v}{' (' + suffix.strip('_') + ')' if suffix else ''} ...")
            t = time.perf_counter()
            out[v + suffix] = fn(detectors, batch, key=jax.random.fold_in(key, i),
                                 **options.get(v, {}))
            wall[v + suffix] = wall.get(v + suffix, 0.0) + time.perf_counter() - t
    return out


def _stream_views(detectors, chunks, key, runs, wall: dict, keep: int, log) -> tuple:
    """The views of ``runs`` (:func:`_run`) on a stream of ``Batch`` chunks, one at a time:
    every chunk smaller than the first is padded to its size (:func:`_pad`), so each jitted
    step compiles for one shape; only the per-sample results (:func:`_trim`) and the small
    fields (:func:`_sample_table`) are kept, and merged at the end (:func:`merge_views`).
    Returns ``(view_results, samples, head)``: ``head`` the first ``keep`` samples as one
    ``Batch`` (None when ``keep`` is 0). ``wall["decode"]``: seconds spent waiting for the
    stream's chunks."""
    parts, tables, head, size, n = {}, [], [], None, 0
    it = iter(chunks)
    while True:
        t = time.perf_counter()
        chunk = next(it, None)
        wall["decode"] = wall.get("decode", 0.0) + time.perf_counter() - t
        if chunk is None:
            break
        m = chunk.size
        if not m:
            continue
        if size is None:
            size = m
            log(f"views on chunks of {size} samples ...")
        res = _run(detectors, _pad(chunk, size), key, runs, wall)
        for name, r in res.items():
            parts.setdefault(name, []).append(_trim(r, m))
        tables.append(_sample_table(chunk, res["causal"]))
        if n < keep:
            head.append(take(chunk, np.arange(min(m, keep - n))))
        n += m
    if size is None:
        raise ValueError("analyze: the stream holds no samples")
    samples = _concat_tables(tables)
    specs = {v + suffix: (v, opts.get(v, {})) for suffix, views, opts in runs for v in views}
    res = {name: merge_views(v, parts[name], samples["label"], o)
           for name, (v, o) in specs.items()}
    return res, samples, (concat(head) if head else None)


def analyze(detectors: dict, batch, *, key=None, flow_eps: float = 0.25,
            tables: bool = False, second=None, log=None,
            variant: str = EN.DEFAULT_VARIANT, rule: str | None = None,
            lime_n: int = LIME_TABLE_N, core_parts: str = "extracted",
            tables_n: int = TABLES_STREAM_N, world: str | None = None) -> tuple[dict, dict]:
    """Run the three views and every ensemble on ``batch`` and score them against
    ``batch.bias`` (unknown -> proportions and agreement only), for the paper's views and for
    the improved ones (``ensemble.VARIANTS``: graded benefit, probability-scale causal; the
    flow view is shared). When ``batch.bias`` is known for some samples only (human labels of
    a real benchmark, -1 elsewhere), ``scores``, ``scores_improved`` and ``confusion`` are
    over those ``n_scored`` samples (the proportions too: the paper's Table 1 form), the
    views, the ensembles (their class priority included), ``agreement`` and ``venn`` over all
    ``n``; the ``tables`` are scored only when every table sample is labelled.

    ``batch``: one ``Batch``, or a stream of them (any iterable of ``Batch`` chunks, e.g.
    ``data.batch.iter_batches`` of a real benchmark's records), analysed one chunk at a time
    with memory for about one chunk of pixels: each chunk goes through every view (chunks
    smaller than the first padded to its size, so each jitted step compiles once), only the
    per-sample results are kept (labels, scores, logits, path effects, core parts: some
    hundred bytes a sample), and the set-level steps (the causal view's calibration, the
    ensembles' class priority, the scores, agreement, Venn counts) run at the end on all of
    them: the results equal those on the chunks concatenated into one ``Batch``, to float
    tolerance. (The views with a PRNG key, the flow view's LIME saliency, would draw per
    chunk; ``analyze`` runs the flow view with attention saliency.) With a stream, the
    ``tables`` (robustness experiments that rerun views on changed inputs) run on the first
    ``tables_n`` samples only, kept from the stream (``results["tables_n"]``); on a ``Batch``
    on all of it.

    Returns ``(results, view_results)``: ``view_results`` the ``ViewResult`` per view
    (``benefit``, ``flow``, ``causal``: the paper's; ``benefit_improved``,
    ``causal_improved``), ``results = {"n", "priority", "scores": {name: score_labels},
    "agreement", "venn", "benefit_ties", "priority_improved", "scores_improved",
    "agreement_improved", "default": {"variant", "rule"}, "confusion", "views_wall_s",
    "view_wall_s"}`` (``view_wall_s``: seconds per view run, and with a stream ``"decode"``,
    the seconds spent waiting for its chunks; and ``"n_scored"`` and, on the closed world
    (``has_gt``) when ``world`` is ``"basic"`` (None: ``worlds.DEFAULT_WORLD``, the graded
    world), ``"identifiable"``, the scores of
    :func:`bias_jax.scoring.identifiable_labels`, when the truth is known: a basic-world
    notion; the graded world's types are argmaxes of exact annotation scores, so its inputs
    identify every type already) plus, with
    ``tables``, ``"tables_n"``, ``"sweep"`` (the paper's Table 6), ``"kmeans"`` (Table 7),
    ``"aggregation"`` (Table 4: the flow view with sum / mean / max, and the ensemble with
    each), ``"saliency"`` (Table 3: :func:`saliency_table` on the first ``lime_n`` samples),
    ``"masking"`` (Table 14), ``"swap"`` (Table 2; a swapped group g also holds ``"vs_G1":
    {"gained", "lost", "n"}``, the samples its ensemble gets right and G1's wrong and the
    reverse, for a paired comparison) and ``"multi"`` (Table 15; the last two
    need ``second`` = :func:`bias_jax.detectors.second_detectors`, else they hold the groups
    available); the tables use the paper's views. ``scores``
    (paper's views) and ``scores_improved`` each cover benefit, flow, causal, ensemble (prior
    majority), random, weighted and the three two-view ablations; ``variant`` / ``rule`` name
    the answer :func:`headline` reports (default: the improved views,
    ``ensemble.DEFAULT_RULE``). ``confusion``: :func:`bias_jax.scoring.confusion` of each view
    and of the headline ensemble, per variant. ``core_parts`` (``views.causal.CORE_PARTS``:
    ``"extracted"``, the offline extractor, ``"occlusion"``, ``"saliency"``, or ``"exact"``,
    the closed world's ground truth)
    feeds every causal view run here; recorded as ``results["core_parts"]``, and on the
    closed world with other than exact parts ``results["core_parts_iou"]``
    (``causal.core_parts_iou`` of the paper's causal view's parts against the exact ones)."""
    key = jax.random.key(0) if key is None else key
    log = log or (lambda *a: None)
    rule = EN.DEFAULT_RULE[variant] if rule is None else rule
    EN.rule_key(rule, variant)  # validates both
    # Extracted parts are the causal view's own default: named only when others are asked for.
    parts_opt = {} if core_parts == "extracted" else {"core_parts": core_parts}
    opts = EN.view_options("paper", flow_eps)
    opts["causal"].update(parts_opt)
    iopts = EN.view_options("improved", flow_eps)
    iopts["causal"].update(parts_opt)
    runs = (("", VIEWS, opts), ("_improved", ("benefit", "causal"), iopts))
    wall = {}
    t0 = time.perf_counter()
    if isinstance(batch, Batch):
        res = _run(detectors, batch, key, runs, wall, log)
        samples, head = _sample_table(batch, res["causal"]), batch
    else:
        res, samples, head = _stream_views(detectors, batch, key, runs, wall,
                                           tables_n if tables else 0, log)
    n = int(samples["label"].shape[0])
    truth_all = samples["bias"]
    # Human labels cover a subset: the main scores are on the labelled samples (sub), the
    # views, agreement and Venn counts on all of them.
    sub = np.flatnonzero(truth_all != UNKNOWN_BIAS)
    truth = truth_all[sub] if sub.size else None
    partial = 0 < sub.size < truth_all.size
    R = (lambda x: np.asarray(x)[sub]) if partial else np.asarray  # noqa: E731
    labels = {k: np.asarray(res[k].label) for k in VIEWS}
    priority, ens = _ensembles(labels, key)
    out = {"n": n, "priority": [BIAS_TYPES[c] for c in priority],
           "scores": {**{v: score_labels(R(labels[v]), truth) for v in VIEWS},
                      **{k: score_labels(R(p), truth) for k, p in ens.items()}},
           "agreement": agreement(labels), "venn": venn_counts(labels)}
    if "phi_image" in res["benefit"].extras:
        ex = res["benefit"].extras
        out["benefit_ties"] = float(np.mean(np.asarray(ex["phi_image"]) ==
                                            np.asarray(ex["phi_text"])))
    ilabels = dict(labels, **{k: np.asarray(res[k + "_improved"].label)
                              for k in ("benefit", "causal")})
    ipriority, iens = _ensembles(ilabels, key)
    out.update({"priority_improved": [BIAS_TYPES[c] for c in ipriority],
                "scores_improved": {**{v: score_labels(R(ilabels[v]), truth) for v in VIEWS},
                                    **{k: score_labels(R(p), truth) for k, p in iens.items()}},
                "agreement_improved": agreement(ilabels),
                "default": {"variant": variant, "rule": rule}, "core_parts": core_parts})
    ex = res["causal"].extras
    if core_parts != "exact" and "core_cells" in ex and "exact" in samples:
        out["core_parts_iou"] = CA.core_parts_iou(ex["core_cells"], ex["core_tokens"],
                                                  *samples["exact"])
    if truth is not None:
        conf = {}
        for name, lab, en in (("paper", labels, ens), ("improved", ilabels, iens)):
            r = rule if name == variant else EN.DEFAULT_RULE[name]
            conf[name] = {**{v: confusion(R(lab[v]), truth) for v in VIEWS},
                          f"ensemble ({r})": confusion(R(en[EN.rule_key(r, name)]), truth)}
        out["confusion"] = conf
        basic = WD.check_world(WD.DEFAULT_WORLD if world is None else world) == "basic"
        if np.all(samples["has_gt"]) and basic:  # a basic-world notion
            out["identifiable"] = score_labels(
                identifiable_labels(truth, R(samples["label"])), truth)
        out["n_scored"] = int(sub.size)
    out["views_wall_s"] = time.perf_counter() - t0
    out["view_wall_s"] = wall
    if not tables:
        return out, res
    # The tables rerun views on changed inputs, so they need the pixels: the whole batch, or
    # the head kept from a stream; every per-sample array is cut to those samples.
    batch, m = head, head.size
    cut = lambda a: np.asarray(a)[:m]  # noqa: E731
    labels = {k: cut(v) for k, v in labels.items()}
    truth = cut(truth_all) if truth_known(cut(truth_all)) else None  # all table samples or none
    out["tables_n"] = m
    log(f"tables on {m} samples: threshold sweep, K-means ...")
    flow_score = cut(res["flow"].score)
    out["sweep"] = threshold_sweep(labels, flow_score, truth=truth)
    km = kmeans_labels(flow_score)
    ens_km = np.asarray(EN.combine(dict(labels, flow=km)))
    out["kmeans"] = {"flow": score_labels(km, truth), "ensemble": score_labels(ens_km, truth)}
    if truth is not None:  # the eps ensemble against K-means' on the same samples, as counts
        ok_eps, ok_km = cut(ens["ensemble"]) == truth, ens_km == truth
        out["kmeans"]["eps_vs_kmeans"] = {"gained": int((ok_eps & ~ok_km).sum()),
                                          "lost": int((~ok_eps & ok_km).sum()), "n": int(m)}
    log("tables: flow aggregations (Table 4) ...")
    out["aggregation"] = {}
    for agg in ("sum", "mean", "max"):
        fl = labels["flow"] if agg == opts["flow"].get("aggregation", "sum") else np.asarray(
            run_views(detectors, batch, key=key, views=("flow",), options={
                "flow": dict(opts["flow"], aggregation=agg)})["flow"].label)
        out["aggregation"][agg] = {"flow": score_labels(fl, truth), "ensemble": score_labels(
            EN.combine(dict(labels, flow=fl), priority=priority), truth)}
    log(f"tables: LIME saliency on {min(lime_n, m)} samples (Table 3) ...")
    out["saliency"] = saliency_table(detectors, batch, labels, opts["flow"], truth=truth,
                                     n=lime_n, key=jax.random.fold_in(key, 13))
    log("tables: post-validation masking ...")
    pred = cut(ens["ensemble"])
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
    base = np.asarray(EN.combine(labels))
    for g, kind in SWAP_GROUPS.items():
        if kind is not None and kind not in second:
            continue
        log(f"tables: detector swap {g} ...")
        lab = labels
        if kind is not None:
            r = run_views(dict(detectors, **{kind: second[kind]}), batch, key=key,
                          views=("benefit", "causal"), options={"causal": parts_opt})
            lab = dict(labels, **{k: np.asarray(v.label) for k, v in r.items()})
        ens_g = np.asarray(EN.combine(lab))
        swap[g] = {"swapped": kind, "benefit": score_labels(lab["benefit"], truth),
                   "causal": score_labels(lab["causal"], truth),
                   "ensemble": score_labels(ens_g, truth)}
        if kind is not None and truth is not None:
            # the paired comparison with G1 on the same samples, as two counts
            ok, ok1 = ens_g == truth, base == truth
            swap[g]["vs_G1"] = {"gained": int((ok & ~ok1).sum()),
                                "lost": int((~ok & ok1).sum()), "n": int(truth.size)}
    out["swap"] = swap
    if second:
        log("tables: multi-detector ensemble ...")
        dets = dict(detectors, **{k: mean_detector([detectors[k], second[k]]) for k in second})
        r = run_views(dets, batch, key=key, views=("benefit", "causal"),
                      options={"causal": parts_opt})
        lab = dict(labels, **{k: np.asarray(v.label) for k, v in r.items()})
        out["multi"] = {"kinds": sorted(second), "benefit": score_labels(lab["benefit"], truth),
                        "causal": score_labels(lab["causal"], truth),
                        "ensemble": score_labels(EN.combine(lab), truth)}
    return out, res


# ----------------------------------------------------------------------------------------------
# Detector quality sweep (issue 25: the paper's finding 2 measured with exact labels) and the
# re-choice of the improved variant on a tuning seed.
# ----------------------------------------------------------------------------------------------
def detector_accuracy(detectors: dict, batch: Batch) -> tuple[float, dict]:
    """``(mean, {kind: accuracy})``: each detector's accuracy on ``batch``, ``mean_b
    [(logit_b > 0) == (label_b == REAL)]`` (``evaluate.predict``: each fed only the modalities
    of its kind), and their unweighted mean over the kinds of ``detectors``. On analysis
    samples (``ANALYSIS_SEED``, a seed no training or detector evaluation draws from) it is
    held-out accuracy, over the world's type mix."""
    from bias_jax import evaluate as BE

    label = np.asarray(batch.label)
    acc = {k: BE.accuracy_by_type(BE.predict(m[0], m[1], k, batch), label,
                                  np.asarray(batch.bias))["overall"]
           for k, m in sorted(detectors.items())}
    return float(np.mean(list(acc.values()))), acc


def score_options(detectors: dict, batch: Batch, options: dict, rule: str = "prior", *,
                  key=None) -> tuple[dict, dict]:
    """The three views run with ``options`` (view -> keyword arguments, e.g.
    ``ensemble.view_options(variant, eps)``; view i with ``fold_in(key, i)`` as in
    :func:`analyze`) and the ensemble ``rule`` (``ensemble.RULES``; class priority from the
    pooled view labels, as :func:`analyze`), scored against ``batch.bias``. Returns
    ``(scores, labels)``: ``{"benefit", "flow", "causal", "ensemble"} -> score_labels`` and
    the same names -> int32 [N]."""
    key = jax.random.key(0) if key is None else key
    rk = EN.rule_key(rule)
    res = _run(detectors, batch, key, (("", VIEWS, options),), {})
    labels = {v: np.asarray(res[v].label, np.int32) for v in VIEWS}
    labels["ensemble"] = np.asarray(_ensembles(labels, key)[1][rk], np.int32)
    truth = np.asarray(batch.bias)
    truth = truth if truth_known(truth) else None
    return {k: score_labels(v, truth) for k, v in labels.items()}, labels


def quality_sweep(detector_sets, batch: Batch, *, key=None, flow_eps: float = 0.25,
                  variant: str = EN.DEFAULT_VARIANT, rule: str | None = None,
                  options: dict | None = None, core_parts: str = "extracted",
                  names=None, return_labels: bool = False):
    """Views and ensemble against the detectors' quality (issue 25; the paper's finding 2):
    for each detector set of ``detector_sets`` (a sequence of kind -> Model, e.g. the shipped
    sets at each of ``detectors.TRAINING_LENGTHS``), on the same samples ``batch`` (tokenized
    as the sets' detectors read them), one entry ``{"detector_accuracy", "detector_accuracies",
    "benefit", "flow", "causal", "ensemble"}``: :func:`detector_accuracy` (the mean held-out
    accuracy of the set's detectors on ``batch``) and :func:`score_options` of ``variant``'s
    views (``options``: view -> keyword arguments, default ``ensemble.view_options(variant,
    flow_eps)``, e.g. those of :func:`tune_variant`) with ensemble ``rule`` (default
    ``ensemble.DEFAULT_RULE[variant]``), each ``score_labels`` (``accuracy``, ``macro_f1``,
    ``proportions``) against ``batch.bias``; ``"set"``: ``names[i]`` when given. The views'
    key is the same for every set, so entries differ only by the detectors. With
    ``return_labels``: ``(entries, labels)``, ``labels[i]`` set i's ``{"benefit", "flow",
    "causal", "ensemble"} -> int32 [N]`` (for paired comparisons of the sets)."""
    rule = EN.DEFAULT_RULE[variant] if rule is None else rule
    opts = EN.view_options(variant, flow_eps) if options is None else \
        {v: dict(o) for v, o in options.items()}
    if core_parts != "extracted":
        opts["causal"]["core_parts"] = core_parts
    out, all_labels = [], []
    for i, dets in enumerate(detector_sets):
        mean, per = detector_accuracy(dets, batch)
        scores, labels = score_options(dets, batch, opts, rule, key=key)
        entry = {"detector_accuracy": mean, "detector_accuracies": per, **scores}
        if names is not None:
            entry["set"] = names[i]
        out.append(entry)
        all_labels.append(labels)
    return (out, all_labels) if return_labels else out


def _causal_candidates(calibrations=CA.CALIBRATIONS) -> list:
    """The causal view's decision options tried by :func:`tune_variant`: the improved
    variant's first (kept on ties), then every other fusion x calibration x effect x mediator
    of ``views.causal`` (calibrations restricted to ``calibrations``)."""
    import itertools

    first = {k: v for k, v in EN.VARIANTS["improved"]["causal"].items()}
    first.setdefault("mediator", "each")
    cands = [first]
    for f, c, e, m in itertools.product(CA.FUSIONS, calibrations, CA.EFFECTS, CA.MEDIATORS):
        d = {"fusion": f, "calibration": c, "effect": e, "mediator": m}
        if d != first:
            cands.append(d)
    return cands


TUNE_RULES = tuple(r for r in EN.RULES if r != "random")  # a coin's tie-break is no choice


def _best(cands: list, criterion: str) -> int:
    """Index of the candidate (``{"scores": score_labels}``) with the largest ``criterion``,
    accuracy breaking ties, the first among equals."""
    val = lambda c: tuple(-1.0 if c["scores"][k] is None else c["scores"][k]  # noqa: E731
                          for k in (criterion, "accuracy"))
    return max(range(len(cands)), key=lambda i: (val(cands[i]), -i))


def tune_variant(detectors: dict, batch: Batch, *, key=None, flow_eps: float = 0.25,
                 core_parts: str = "extracted", criterion: str = "macro_f1",
                 calibrations=CA.CALIBRATIONS) -> dict:
    """Re-choose the improved variant (``ensemble.VARIANTS["improved"]``, ``DEFAULT_RULE``)
    on ``batch``, samples of a tuning seed with exact types (never the reported ones), as it
    was first chosen (docs/results.md: each view's options by its own ``criterion`` against
    the exact types, then the ensemble rule by the ensemble's with the chosen views):

    - benefit: ``value`` in ``views.benefit.VALUES`` (each with its default threshold);
    - causal: every fusion x calibration x effect x mediator (:func:`_causal_candidates`; the
      detectors run once, each option only redoes the decision, ``causal.causal_decision``);
      ``calibrations=("none",)`` keeps to the options under which a sample's label does not
      depend on the other analysed samples;
    - flow: unchanged (``view_options("improved", flow_eps)``; its threshold is Table 6's);
    - the rule: ``TUNE_RULES`` (every rule but the random one) on the chosen views' labels.

    Ties keep the current choice (it comes first). Returns ``{"criterion", "options": {view:
    keyword arguments}, "rule", "scores": {"benefit", "flow", "causal", "ensemble"} on
    ``batch``, "candidates": {"benefit" | "causal" | "rule": [{"options" or "rule",
    "scores"}]}}``; report ``options`` / ``rule`` on other samples with
    :func:`score_options`."""
    from bias_jax.views import benefit as BV

    if criterion not in ("macro_f1", "accuracy"):
        raise ValueError(f"criterion must be macro_f1 or accuracy, got {criterion!r}")
    key = jax.random.key(0) if key is None else key
    truth = np.asarray(batch.bias)
    if not truth_known(truth):
        raise ValueError("tune_variant needs the exact type of every sample (a closed world)")
    base = EN.view_options("improved", flow_eps)
    parts = {} if core_parts == "extracted" else {"core_parts": core_parts}
    k = {v: jax.random.fold_in(key, i) for i, v in enumerate(VIEWS)}
    flow = np.asarray(view_fn("flow")(detectors, batch, key=k["flow"], **base["flow"]).label)
    cands = {"benefit": [], "causal": []}
    values = [base["benefit"]["value"]] + [v for v in BV.VALUES if v != base["benefit"]["value"]]
    bres = []
    for value in values:
        opts = dict(base["benefit"], value=value)
        r = view_fn("benefit")(detectors, batch, key=k["benefit"], **opts)
        bres.append(np.asarray(r.label))
        cands["benefit"].append({"options": opts, "scores": score_labels(bres[-1], truth)})
    cres = view_fn("causal")(detectors, batch, key=k["causal"], **base["causal"], **parts)
    ex = cres.extras
    clabels = []
    for opts in _causal_candidates(calibrations):
        r = CA.causal_decision({b: ex[b] for b in CA.BRANCH_KIND}, batch.label,
                               ex["core_cells"], ex["core_tokens"], **opts)
        clabels.append(np.asarray(r.label))
        cands["causal"].append({"options": opts, "scores": score_labels(clabels[-1], truth)})
    ib, ic = _best(cands["benefit"], criterion), _best(cands["causal"], criterion)
    labels = {"benefit": bres[ib], "flow": flow, "causal": clabels[ic]}
    ens = _ensembles(labels, key)[1]
    cands["rule"] = [{"rule": r, "scores": score_labels(ens[EN.RULES[r]], truth)}
                     for r in TUNE_RULES]
    ir = _best(cands["rule"], criterion)
    options = {"benefit": cands["benefit"][ib]["options"], "flow": base["flow"],
               "causal": dict(cands["causal"][ic]["options"], **parts)}
    scores = {v: score_labels(labels[v], truth) for v in VIEWS}
    scores["ensemble"] = cands["rule"][ir]["scores"]
    return {"criterion": criterion, "options": options, "rule": cands["rule"][ir]["rule"],
            "scores": scores, "candidates": cands}


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


__all__ = ["ANALYSIS_SEED", "VIEWS", "SWAP_GROUPS", "LIME_TABLE_N", "TABLES_STREAM_N",
           "mean_detector", "closed_world_batch", "headline", "saliency_table", "variant_views",
           "ensemble_labels", "merge_views", "analyze", "bench", "world_detectors",
           "world_second_detectors",
           "detector_accuracy", "score_options", "quality_sweep", "TUNE_RULES", "tune_variant"]
