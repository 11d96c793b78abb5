"""``gridvqa bench explainers``: throughput and accuracy of the local explainers, in one run.

Four parts:

* **Shipped M_pure, one batch of samples** (their trailing all-PAD token positions dropped,
  ``world.scene.trim_tokens``, as Table 1 runs them). ``forward_evals_per_s`` is the raw jitted
  forward on a batch of ``chunk`` masked inputs (default ``mmx_base.batching.rows_per_call()``, the
  fastest call size on the backend: the physical limit); ``shapley_evals_per_s``
  (``shapley.permutation_shapley`` on one sample's cell + token game), ``multishap_evals_per_s``
  (``multishap`` on the batch; evaluations = ``multishap.multishap_evaluations``),
  ``dime_evals_per_s`` (``dime``; ``B * 2 * n_samples * N + N^2`` evaluations with N = B),
  ``multiviz_samples_per_s`` (the embedding-path HVP, as Table 1 runs it); the same at
  reference granularity (Table 1's ``*_ref`` rows): ``multishap_ref_evals_per_s``
  (``multishap_regions`` over ViLT's 12 x 12 patches with ``REFERENCE_OPTIONS``; B *
  ``sii_evaluations(144, n, n_samples)``), ``dime_ref_evals_per_s`` (``dime_regions`` over
  quickshift superpixels, segmented once outside the timing), ``multiviz_ref_samples_per_s``
  (per-pixel maps); ``<estimator>_vs_forward`` = its evaluations/s over the raw forward's, the two timed in
  alternating rounds (``mmx_base.timing.best_times``: a slow spell of a shared machine falls on
  both; ``shapley_vs_forward`` over ``forward_evals_per_s``); and
  the same game through ``shap.PermutationExplainer``
  (``shap_permutation_evals_per_s``) and ``shapiq.PermutationSamplingSII``
  (``shapiq_evals_per_s``), both calling the same jitted value function (rows padded to the
  chunk, so nothing retraces). Evaluations are counted as the rows the library actually asks
  for. ``forward_mflop_per_row``: XLA's count of the raw forward's floating-point operations
  per row (``mmx_base.timing.xla_flops``), and ``forward_gflop_per_s`` the arithmetic rate the
  forward reaches (to set against the machine's peak).
* **Call size** (``forward_sweep``): rows/s of the raw jitted forward on the batch's
  unperturbed inputs tiled to ``rows`` per call, with every question padded to ``MAX_TOKENS``
  and with the trailing PAD dropped: ``{"L=<positions>": {"<rows>": rows_per_s}}``. It is why
  ``mmx_base.batching.rows_per_call`` is 64 on CPU.
* **A cheap game** (a small tanh MLP over ``cheap_players`` players, microseconds per call),
  where the estimators' own overhead decides: ``cheap_shapley_evals_per_s``,
  ``cheap_shap_evals_per_s``, ``cheap_shapiq_evals_per_s``.
* **Error at equal budget** on a 12-player restriction of a real sample (8 cells and 4 tokens,
  ground truth first; the other players stay present): mean absolute error against exact
  enumeration of ``permutation_shapley`` (``shapley_mae``) and of shap's permutation explainer
  (``shap_mae``) against exact Shapley values, and of ``interactions.sii_matrix`` (the
  estimator MultiSHAP runs, ``multishap_mae``) and shapiq's permutation SII (``shapiq_mae``)
  against the exact cell x token SII. The model's 4,096 coalition values are computed once; the
  estimators then play the same game from that table. Beside them, the error of the all-zero
  estimate (``shapley_mae_of_zero``, ``multishap_mae_of_zero``: the floor an estimate must beat)
  and ``shapley_efficiency_gap`` = ``|sum(phi_hat) - (v(N) - v(empty))|``, which permutation
  Shapley makes 0 up to float error whatever the budget.

Figures of shap / shapiq are null when the packages are not installed
(``pip install -e ".[bench]"``). Rates are best-of-``repeats`` after a compiling call.
"""

from __future__ import annotations

import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from gridvqa_jax.explain import interactions as IN
from gridvqa_jax.explain.multiviz import embed_split, multiviz
from gridvqa_jax.explain import perturb as PT
from gridvqa_jax.explain import shapley as SH
from mmx_base.timing import best_time, best_times, xla_flops

BENCH_SEED = 913_100  # held-out samples of the benchmark (table1.EXPLAIN_SEED + 100)


class _Counted:
    """A host-side game for shap / shapiq: bool/float rows [K, n] -> float [K], evaluated by a
    jitted ``value_fn`` in chunks of at most ``chunk`` rows, padded to a power of two (so it
    compiles for a few shapes only); counts the rows asked for."""

    def __init__(self, value_fn, chunk):
        self.fn = jax.jit(value_fn)
        self.chunk = chunk
        self.rows = 0

    def __call__(self, masks):
        m = np.atleast_2d(np.asarray(masks)) > 0.5
        k = m.shape[0]
        self.rows += k
        size = min(self.chunk, 1 << max(0, (k - 1).bit_length()))  # powers of two: few shapes
        pad = -k % size
        m = np.concatenate([m, np.repeat(m[:1], pad, 0)]) if pad else m
        out = [np.asarray(self.fn(jnp.asarray(m[i:i + size]))) for i in range(0, len(m), size)]
        return np.concatenate(out)[:k].astype(np.float64)


def _shap_run(game: _Counted, n: int, budget: int):
    """shap.PermutationExplainer on ``game`` with all players present in the explained point and
    absent in the background: returns phi [n]."""
    import shap

    ex = shap.PermutationExplainer(game, shap.maskers.Independent(np.zeros((1, n)), 1))
    return np.asarray(ex(np.ones((1, n)), max_evals=budget, silent=True).values[0])


def _shapiq_run(game: _Counted, n: int, budget: int, seed: int = 0):
    """shapiq's permutation-sampling SII (orders 1 and 2) on ``game``: InteractionValues."""
    import shapiq

    approx = shapiq.PermutationSamplingSII(n=n, max_order=2, index="SII", random_state=seed)
    return approx.approximate(budget, game, batch_size=max(1, game.chunk // (n * 2)))


def _have(module: str) -> bool:
    """Whether the optional peer ``module`` (the ``bench`` extra) is installed; a peer that is
    installed but fails to import raises (only a missing package is reported as absent)."""
    try:
        __import__(module)
        return True
    except ModuleNotFoundError as e:
        if e.name != module:
            raise
        return False


def _game_rate(run, game: _Counted, repeats: int) -> float:
    run()  # compile / warm up
    best = math.inf
    for _ in range(repeats):
        game.rows = 0
        t0 = time.perf_counter()
        run()
        best = min(best, (time.perf_counter() - t0) / max(game.rows, 1))
    return 1.0 / best


def _restriction(value_fn, scene, S: int, n_cells: int = 8, n_tokens: int = 4):
    """A 12-player game of one sample: ``n_cells`` cells and ``n_tokens`` tokens (ground truth
    first, then row-major / left to right), every other player present."""
    gt = np.asarray(scene.gt_cells, bool).ravel()
    cells = np.concatenate([np.flatnonzero(gt), np.flatnonzero(~gt)])[:n_cells]
    tok = np.asarray(scene.tokens)
    valid = tok != 0
    gtt = np.asarray(scene.gt_tokens, bool) & valid
    toks = np.concatenate([np.flatnonzero(gtt), np.flatnonzero(valid & ~gtt)])[:n_tokens]
    idx = jnp.asarray(np.concatenate([cells, S * S + toks]), jnp.int32)
    n_full = S * S + tok.shape[0]

    def v12(masks):
        full = jnp.ones((masks.shape[0], n_full), bool).at[:, idx].set(masks)
        return value_fn(full)

    return v12, len(cells), len(toks)


def _table_game(table, n):
    weights = jnp.asarray(1 << np.arange(n), jnp.int32)

    def v(masks):
        return table[jnp.sum(jnp.where(masks, weights, 0), axis=-1)]

    return v


def forward_sweep(apply_fn, params, images, token_sets, repeats: int = 2,
                  rows=(16, 64, 128, 1024)) -> dict:
    """Rows/s of ``jit(apply_fn)`` on ``images`` [B, H, W, 3] with each token array [B, L] of
    ``token_sets``, tiled to each call size in ``rows``: ``{"L=<L>": {"<rows>": rate}}``."""
    fwd = jax.jit(lambda p, i, t: apply_fn(p, i, t)["answer_logprobs"])
    out = {}
    for tokens in token_sets:
        tokens = jnp.asarray(tokens)
        rates = {}
        for r in rows:
            idx = jnp.arange(r) % images.shape[0]
            im, tk = images[idx], tokens[idx]
            rates[str(r)] = r / best_time(lambda: fwd(params, im, tk), repeats)
        out[f"L={tokens.shape[-1]}"] = rates
    return out


def bench_explainers(batch: int = 8, budget: int = 2048, chunk: int | None = None,
                     multishap_samples=2,
                     dime_samples: int = 16, mae_budget: int = 1000, cheap_players: int = 12,
                     cheap_budget: int = 20000, repeats: int = 2, seed: int = BENCH_SEED,
                     log=None) -> dict:
    """Run the benchmark (module docstring); returns the flat dict printed as JSON."""
    from reproduction import table1 as T1
    from gridvqa_jax.explain.scoring import EXPLAINERS
    from gridvqa_jax.training.export import load_reference_model
    from gridvqa_jax.world import render as R

    log = log or (lambda *_: None)
    from mmx_base.batching import rows_per_call
    from gridvqa_jax.world.scene import trim_tokens

    model = load_reference_model("pure")
    apply_fn, params = model.apply, model.params
    full_scenes = T1.regime_scenes("pure", batch, seed)
    scenes = trim_tokens(full_scenes)
    chunk = rows_per_call() if chunk is None else chunk
    S = int(scenes.color.shape[-1])
    key = jax.random.key(seed)
    res = {"batch": batch, "budget": budget, "chunk": chunk}
    have_shap, have_shapiq = _have("shap"), _have("shapiq")

    # --- raw forward on chunk masked inputs of sample 0
    images = jax.vmap(lambda c, s: R.render(c, s, 16))(jnp.asarray(scenes.color),
                                                       jnp.asarray(scenes.shape))
    fm = PT.players(jax.tree.map(lambda a: a[0], scenes))
    n_players = PT.n_players(S, int(scenes.tokens.shape[-1]))
    value_fn = PT.make_value_fn(apply_fn, params, images[0], jnp.asarray(scenes.tokens[0]), fm,
                               cell_px=16)
    masks = jax.random.bernoulli(key, 0.5, (chunk, n_players))
    fwd = jax.jit(value_fn)
    res["forward_evals_per_s"] = chunk / best_time(lambda: fwd(masks), repeats)
    res["forward_mflop_per_row"] = xla_flops(fwd, masks) / chunk / 1e6
    res["forward_gflop_per_s"] = res["forward_mflop_per_row"] * res["forward_evals_per_s"] / 1e3
    log(f"forward {res['forward_evals_per_s']:.0f} evals/s, {res['forward_mflop_per_row']:.1f} "
        f"MFLOP per row (XLA's count): {res['forward_gflop_per_s']:.1f} GFLOP/s")

    res["forward_sweep"] = forward_sweep(apply_fn, params, images, (full_scenes.tokens,
                                                                     scenes.tokens), repeats)
    log(f"forward sweep {res['forward_sweep']}")

    res["shapley_evals_per_s"] = SH.shapley_evals_per_second(value_fn, n_players, budget,
                                                             key=key, chunk=chunk,
                                                             repeats=repeats)
    log(f"shapley {res['shapley_evals_per_s']:.0f} evals/s")
    from gridvqa_jax.explain.multishap import multishap_evaluations

    fn = EXPLAINERS["multishap"]
    fwd_call = lambda: fwd(masks)  # noqa: E731

    def versus_forward(name, call, evals):
        # the estimator and the raw forward timed in alternating rounds: their ratio
        t_fwd, t = best_times([fwd_call, call], repeats)
        res[f"{name}_vs_forward"] = (evals / t) / (chunk / t_fwd)
        return t

    t = versus_forward("multishap", lambda: fn(apply_fn, params, scenes, key,
                                               n_samples=multishap_samples).visual,
                       multishap_evaluations(scenes, multishap_samples))
    res["multishap_evals_per_s"] = multishap_evaluations(scenes, multishap_samples) / t
    log(f"multishap {res['multishap_evals_per_s']:.0f} evals/s")
    fn = EXPLAINERS["dime"]
    dime_evals = batch * 2 * dime_samples * batch + batch * batch  # the N-set is the batch
    t = versus_forward("dime", lambda: fn(apply_fn, params, scenes, key,
                                          n_samples=dime_samples).visual, dime_evals)
    res["dime_evals_per_s"] = dime_evals / t
    log(f"dime {res['dime_evals_per_s']:.0f} evals/s")
    split = dict(zip(("embed_fn", "apply_embedded_fn"), embed_split(model)))
    t = best_time(lambda: multiviz(apply_fn, params, scenes, key, **split).visual, repeats)
    res["multiviz_samples_per_s"] = batch / t
    log(f"multiviz {res['multiviz_samples_per_s']:.2f} samples/s")

    # --- the same estimators at their reference granularity (Table 1's *_ref rows)
    from gridvqa_jax.explain import regions as RG
    from gridvqa_jax.explain.dime import dime_regions
    from gridvqa_jax.explain.multishap import REFERENCE_OPTIONS, game_size, multishap_regions

    n_patches = RG.n_regions(RG.patch_players(16 * S, 16 * S))
    ref_evals = batch * IN.sii_evaluations(n_patches, game_size(scenes)[1], multishap_samples)
    t = versus_forward("multishap_ref", lambda: multishap_regions(
        apply_fn, params, scenes, key, n_samples=multishap_samples, **REFERENCE_OPTIONS).visual,
        ref_evals)
    res["multishap_ref_evals_per_s"] = ref_evals / t
    log(f"multishap_ref {res['multishap_ref_evals_per_s']:.0f} evals/s")
    labels = RG.resolve_image_players("superpixels", scenes, 16)  # host side, once
    t = versus_forward("dime_ref", lambda: dime_regions(
        apply_fn, params, scenes, key, image_players=labels, n_samples=dime_samples).visual,
        dime_evals)
    res["dime_ref_evals_per_s"] = dime_evals / t
    log(f"dime_ref {res['dime_ref_evals_per_s']:.0f} evals/s")
    t = best_time(lambda: multiviz(apply_fn, params, scenes, key, granularity="pixels",
                                      pixel_baseline="gray", **split).visual, repeats)
    res["multiviz_ref_samples_per_s"] = batch / t
    log(f"multiviz_ref {res['multiviz_ref_samples_per_s']:.2f} samples/s")

    game = _Counted(value_fn, chunk)
    res["shap_permutation_evals_per_s"] = (
        _game_rate(lambda: _shap_run(game, n_players, budget), game, 1) if have_shap else None)
    res["shapiq_evals_per_s"] = (
        _game_rate(lambda: _shapiq_run(game, n_players, budget), game, 1)
        if have_shapiq else None)
    log(f"shap {res['shap_permutation_evals_per_s']}, shapiq {res['shapiq_evals_per_s']}")

    # --- cheap game: a small MLP over the players
    n = cheap_players
    k1, k2 = jax.random.split(jax.random.key(1))
    w1 = jax.random.normal(k1, (n, 32)) / math.sqrt(n)
    w2 = jax.random.normal(k2, (32,)) / math.sqrt(32)

    def cheap(masks):
        return jnp.tanh(masks.astype(jnp.float32) @ w1) @ w2

    res["cheap_shapley_evals_per_s"] = SH.shapley_evals_per_second(
        cheap, n, cheap_budget, key=key, chunk=1024, repeats=repeats)
    cgame = _Counted(cheap, 1024)
    res["cheap_shap_evals_per_s"] = (
        _game_rate(lambda: _shap_run(cgame, n, cheap_budget), cgame, repeats)
        if have_shap else None)
    res["cheap_shapiq_evals_per_s"] = (
        _game_rate(lambda: _shapiq_run(cgame, n, cheap_budget), cgame, repeats)
        if have_shapiq else None)

    # --- error at equal budget on a 12-player restriction of sample 0
    v12, na, nb = _restriction(value_fn, jax.tree.map(lambda a: np.asarray(a)[0], scenes), S)
    m = na + nb
    table = SH.all_coalition_values(v12, m, chunk=chunk)
    vt = _table_game(table, m)
    phi = np.asarray(SH.exact_shapley(vt, m))
    A, B = list(range(na)), list(range(na, m))
    sii = np.asarray(IN.exact_sii(vt, m, A, B))
    n_perm = max(2, 2 * round((mae_budget - 2) / (m - 1) / 2))
    est = np.asarray(SH.permutation_shapley(vt, m, jax.random.key(2), n_perm))
    res["shapley_mae"] = float(np.mean(np.abs(est - phi)))
    # floors: the all-zero estimate's error; efficiency holds exactly for every permutation
    res["shapley_mae_of_zero"] = float(np.mean(np.abs(phi)))
    res["shapley_efficiency_gap"] = float(abs(est.sum() - (table[-1] - table[0])))
    n_smp = max(1, round(mae_budget / IN.sii_evaluations(na, nb, 1)))
    est2 = np.asarray(IN.sii_matrix(vt, m, A, B, jax.random.key(3), n_smp))
    res["multishap_mae"] = float(np.mean(np.abs(est2 - sii)))
    res["multishap_mae_of_zero"] = float(np.mean(np.abs(sii)))
    tgame = _Counted(vt, 64)
    res["shap_mae"] = (float(np.mean(np.abs(_shap_run(tgame, m, mae_budget) - phi)))
                       if have_shap else None)
    if have_shapiq:
        iv = _shapiq_run(tgame, m, mae_budget, seed=3)
        est3 = np.array([[iv[(a, b)] for b in B] for a in A])
        res["shapiq_mae"] = float(np.mean(np.abs(est3 - sii)))
    else:
        res["shapiq_mae"] = None
    res["mae_budget"] = mae_budget
    res["shapley_vs_forward"] = res["shapley_evals_per_s"] / res["forward_evals_per_s"]
    if res["cheap_shap_evals_per_s"]:
        res["cheap_shapley_vs_shap"] = (res["cheap_shapley_evals_per_s"]
                                        / res["cheap_shap_evals_per_s"])
    if res["cheap_shapiq_evals_per_s"]:
        res["cheap_shapley_vs_shapiq"] = (res["cheap_shapley_evals_per_s"]
                                          / res["cheap_shapiq_evals_per_s"])
    return res


__all__ = ["bench_explainers", "BENCH_SEED"]
