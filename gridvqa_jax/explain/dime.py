"""DIME (Lyu, Liang, Deng, Salakhutdinov & Morency, AIES 2022): disentangled local explanations
of a two-modality model, as one batched JAX estimator.

Over a set of N samples (t_j, v_j) (question tokens, image), let ``F[j, k] = f(t_j, v_k)`` be
the model's explained output on the question of sample j paired with the image of sample k.
DIME splits ``f(t_i, v_i) = UC_i + MI_i`` into

    UC_i = mean_k F[i, k] + mean_j F[j, i] - mean_{j,k} F[j, k]     (unimodal contributions)
    MI_i = F[i, i] - UC_i                                            (multimodal interaction)

(EMAP's projection of f onto additive functions, evaluated on the data). Both are functions of
the inputs of sample i: replacing its image v_i by a perturbed v' replaces column i of F by
``f(t_j, v')`` for every j (N model evaluations), and UC_i, MI_i are recomputed from that
matrix; a perturbed question t' replaces row i by ``f(t', v_k)``. LIME (``mmx_base.lime``) of
UC_i and of MI_i over masks of the cells of v_i gives the visual maps, over masks of the tokens
of t_i the textual maps: four maps (UC-visual, UC-textual, MI-visual, MI-textual), as the
authors' code (lvyiwei1/DIME, MultiViz ``analysis/dime.py``: row/column of the sample matrix
replaced per perturbation, ``lime_image`` / ``lime_text`` on the result).

Conventions here:

* f = ``log P(a_i | t, v)``, the log-probability of the answer ``a_i`` the model predicts for
  sample i on its own unperturbed input, for every entry of sample i's matrix (the authors
  explain one label's logit across the whole matrix too).
* The set is the explained batch itself (sample i sits at row/column i), plus the optional
  ``reference`` scenes appended after it; N = B + N_ref. The unperturbed N x N x A tensor of
  log-probabilities is computed once and shared by all samples.
* Interpretable features: one per cell and per non-PAD token, or groups of them
  (``feature_mask``, captum's convention): LIME then fits on group indicators (a group's
  features kept or masked together) and every feature of a group carries its group's
  coefficient.
* Perturbations: a cell is masked to the empty white tile, a token to PAD
  (``explain.perturb``); masks are sampled as ``LimeImageExplainer`` (each cell kept with
  probability 1/2) for cells and as ``LimeTextExplainer`` (a uniform number of tokens removed)
  for tokens, with the lime package's kernel and ``Ridge(alpha=1)`` (``mmx_base.lime``).
* ``dime`` returns the **MI** maps: the multimodal-interaction part is DIME's contribution
  (what distinguishes it from plain LIME, whose UC part is an additive unimodal explanation),
  and the GridVQA-X ground truth (anchors, targets and the relation words that bind them) is
  by construction about the interaction of question and scene. The GridVQA-X paper does not
  say which DIME map its Table 1 scores; ``dime_maps`` returns all four.

Reference granularity: ``lime_image`` perturbs quickshift superpixels, hidden with
``hide_color=0`` in DIME's call, not cells; ``dime_region_maps`` / ``dime_regions`` fit LIME over
the regions of a pixel label map (``explain.regions``; default the superpixels of each rendered
image, hidden black) and return per-pixel visual maps (``Attribution.visual_px``).

Cost per explained sample: ``2 * n_samples * N`` model evaluations (both modalities), chunked
(``chunk`` rows per forward), plus ``N^2`` once per batch for the shared matrix.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from mmx_base.batching import check_chunk, per_sample_chunk, rows_per_call
from mmx_base import lime as LIME
from gridvqa_jax.explain import perturb as PT
from gridvqa_jax.explain import regions as RG
from gridvqa_jax.explain.attribution import Attribution, from_maps, from_pixel_maps
from gridvqa_jax.world import render as R
from gridvqa_jax.world import universe as U


def uc_mi(F):
    """DIME's decomposition of a whole matrix: F float [..., N, N] (``F[j, k] = f(t_j, v_k)``)
    -> (UC [..., N], MI [..., N]) with ``UC_i = mean_k F[i,k] + mean_j F[j,i] - mean F`` and
    ``MI_i = F[i,i] - UC_i``."""
    F = jnp.asarray(F)
    uc = F.mean(-1) + F.mean(-2) - F.mean((-2, -1))[..., None]
    return uc, jnp.diagonal(F, axis1=-2, axis2=-1) - uc


def uc_mi_at(F, pos):
    """(UC, MI) of the single sample at index ``pos`` of the matrix F [N, N] (scalars)."""
    uc = F[pos].mean() + F[:, pos].mean() - F.mean()
    return uc, F[pos, pos] - uc


class DimeMaps(NamedTuple):
    """All of DIME's output for a batch: the four maps and the regression data behind them."""

    uc: Attribution  # LIME of UC_i: visual [B, S, S] over cells, textual [B, L] over tokens
    mi: Attribution  # LIME of MI_i: same shapes
    visual_masks: jax.Array  # bool [B, n_samples, S*S]: sampled cell masks (True = kept)
    visual_targets: jax.Array  # float32 [B, n_samples, 2]: (UC, MI) under each cell mask
    textual_masks: jax.Array  # bool [B, n_samples, L]: sampled token masks (True = kept)
    textual_targets: jax.Array  # float32 [B, n_samples, 2]: (UC, MI) under each token mask
    answer: jax.Array  # int32 [B]: the explained answer a_i


def _chunked(fn, n_rows: int, chunk: int):
    """``fn(row_ids int32 [c]) -> float [c, ...]`` over rows 0..n_rows-1, ``chunk`` at a time
    (``lax.map``; the last chunk padded with row 0) -> float [n_rows, ...]."""
    chunk = max(1, min(chunk, n_rows))
    n_chunks = -(-n_rows // chunk)
    ids = jnp.arange(n_chunks * chunk, dtype=jnp.int32)
    ids = jnp.where(ids < n_rows, ids, 0).reshape(n_chunks, chunk)
    out = jax.lax.map(fn, ids)
    return out.reshape((n_chunks * chunk,) + out.shape[2:])[:n_rows]


def _logprobs(apply_fn, params, images, tokens):
    return apply_fn(params, images, tokens)["answer_logprobs"]


def _pair_tensor(apply_fn, params, images, tokens, chunk):
    """float32 [N, N, A]: log-probabilities of question j with image k, chunked over pairs."""
    N = images.shape[0]

    def rows(ids):
        return _logprobs(apply_fn, params, images[ids % N], tokens[ids // N])

    return _chunked(rows, N * N, chunk).reshape(N, N, -1)


def _on_features(z, ids):
    """Group masks -> feature masks: z bool [..., G] (True = group kept), ids int [F] (group of
    each feature, -1 = none) -> bool [..., F] (True = feature kept; id -1 always kept)."""
    return jnp.where(ids >= 0, jnp.take(z, jnp.clip(ids, 0), axis=-1), True)


def _spread(coef, ids):
    """Group coefficients -> feature maps: coef [G, m], ids int [F] -> [F, m] (every feature
    carries its group's coefficient, id -1 carries 0)."""
    return jnp.where((ids >= 0)[:, None], jnp.take(coef, jnp.clip(ids, 0), axis=0), 0.0)


def _explain_one(apply_fn, params, set_images, set_tokens, G, pos, key, cell_ids=None,
                 token_ids=None, *, n_samples, chunk, cell_px, kernel_width, alpha):
    """One explained sample (set index ``pos``): masks, (UC, MI) targets and LIME fits.
    ``cell_ids`` int [S*S] / ``token_ids`` int [L]: compact group ids (``_compact``), or None
    (one interpretable feature per cell and per token)."""
    N = set_images.shape[0]
    S = set_images.shape[1] // cell_px
    C = S * S
    answer = jnp.argmax(G[pos, pos]).astype(jnp.int32)
    F = G[:, :, answer]  # [N, N]: f(t_j, v_k) for this sample's answer
    image, tokens = set_images[pos], set_tokens[pos]
    valid = tokens != U.PAD_ID
    kv, kt = jax.random.split(key)
    grouped = cell_ids is not None
    if grouped:
        # Groups are interpretable features 0..C-1 (cells) and 0..L-1 (tokens); a sample with
        # fewer groups has invalid trailing columns (kept in every mask, coefficient 0).
        L = tokens.shape[0]
        valid_v = jnp.zeros((C + 1,), bool).at[jnp.where(cell_ids >= 0, cell_ids, C)].set(True)
        valid_v = valid_v[:C]  # cell groups this sample has
        valid = jnp.zeros((L + 1,), bool).at[jnp.where(token_ids >= 0, token_ids, L)].set(True)
        valid = valid[:L]  # token groups this sample has
        zv = LIME.image_masks(kv, n_samples, C) | ~valid_v[None, :]  # [n, C] over cell groups
    else:
        valid_v = None
        zv = LIME.image_masks(kv, n_samples, C)  # [n, C]
    zt = LIME.text_masks(kt, n_samples, valid)  # [n, L]

    def f_rows(ids, visual: bool):
        p, j = ids // N, ids % N
        if visual:  # perturbed image of sample pos, question of sample j
            keep = _on_features(zv[p], cell_ids) if grouped else zv[p]
            imgs = PT.mask_cells(image[None], ~keep.reshape(-1, S, S), cell_px)
            toks = set_tokens[j]
        else:  # perturbed question of sample pos, image of sample j
            imgs = set_images[j]
            keep = _on_features(zt[p], token_ids) if grouped else zt[p]
            toks = PT.mask_tokens(tokens[None], ~keep)
        lp = _logprobs(apply_fn, params, imgs, toks)
        return jnp.take(lp, answer, axis=-1)

    def targets(visual: bool):
        vals = _chunked(functools.partial(f_rows, visual=visual), n_samples * N, chunk)
        vals = vals.reshape(n_samples, N)

        def one(v):
            Fp = F.at[:, pos].set(v) if visual else F.at[pos, :].set(v)
            return jnp.stack(uc_mi_at(Fp, pos))

        return jax.vmap(one)(vals)  # [n, 2]

    yv, yt = targets(True), targets(False)
    cv, _ = LIME.lime_fit(zv, yv, valid_v, kernel_width=kernel_width, alpha=alpha)  # [C, 2]
    ct, _ = LIME.lime_fit(zt, yt, valid, kernel_width=kernel_width, alpha=alpha)  # [L, 2]
    if grouped:
        cv, ct = _spread(cv, cell_ids), _spread(ct, token_ids)
    return cv.reshape(S, S, 2), ct, zv, yv, zt, yt, answer


@functools.partial(jax.jit, static_argnames=("apply_fn", "n_samples", "chunk", "pair_chunk",
                                             "cell_px", "kernel_width", "alpha"))
def _dime_jit(apply_fn, params, color, shape, tokens, pos, keys, cell_ids=None, token_ids=None,
              *, n_samples, chunk, pair_chunk, cell_px, kernel_width, alpha):
    images = jax.vmap(lambda c, s: R.render(c, s, cell_px))(color, shape)
    tokens = jnp.asarray(tokens, jnp.int32)
    G = _pair_tensor(apply_fn, params, images, tokens, pair_chunk)
    one = functools.partial(_explain_one, apply_fn, params, images, tokens, G,
                            n_samples=n_samples, chunk=chunk, cell_px=cell_px,
                            kernel_width=kernel_width, alpha=alpha)
    if cell_ids is None:
        return jax.vmap(one)(pos, keys)
    return jax.vmap(one)(pos, keys, cell_ids, token_ids)


def _compact(feature_mask, tokens, S: int):
    """A ``perturb.FeatureMask`` of the B explained samples (cells int [B, S, S] or [S, S],
    tokens int [B, L] or [L]; -1 = never masked) -> (cell_ids int32 [B, S*S], token_ids int32
    [B, L]): each sample's distinct cell ids renumbered ``0..`` and its distinct token ids
    ``0..`` in increasing order, -1 kept (and set at PAD positions). ``ValueError`` for an id
    that owns both cells and tokens (``multishap``'s convention)."""
    compact, n_cell_groups, _ = PT.compact_feature_mask(feature_mask, tokens, S)
    cells = np.asarray(compact.cells).reshape(tokens.shape[0], S * S)
    toks = np.asarray(compact.tokens)
    return cells, np.where(toks >= 0, toks - n_cell_groups, -1).astype(np.int32)


def dime_maps(apply_fn, params, scenes, key, *, n_samples: int = 256, cell_px: int = 16,
              chunk: int | None = None, reference=None, kernel_width: float = LIME.IMAGE_KERNEL_WIDTH,
              alpha: float = LIME.RIDGE_ALPHA, mesh=None,
              feature_mask: PT.FeatureMask | None = None) -> DimeMaps:
    """All four DIME maps for a batch (module docstring).

    apply_fn(params, image [B, H, W, 3], tokens [B, L]) -> {"answer_logprobs": [B, A]};
    scenes: a ``Scene`` batch (B), rendered at ``cell_px``; ``reference``: optional extra
    scenes for the DIME set (appended after the batch); ``n_samples``: LIME perturbations per
    modality and sample (row 0 = unperturbed); ``chunk``: perturbed rows per explained sample
    per forward (the samples on a device are vmapped, so a forward carries ``chunk`` times
    their number; default ``mmx_base.batching.per_sample_chunk``: 64 rows per call on CPU);
    ``mesh``: a
    ``('data',)`` mesh to shard the explained samples over (the set is replicated). Sample i's
    masks depend only on ``fold_in(key, i)``, so results do not depend on the mesh.

    ``feature_mask``: interpretable features as groups (captum's ``feature_mask``): a
    ``perturb.FeatureMask`` of the explained samples, cells int ``[B, S, S]`` (or ``[S, S]``)
    and tokens int ``[B, L]`` (or ``[L]``). Features with one id are kept or masked together,
    id -1 is never masked, an id may not own both cells and tokens (``ValueError``), PAD
    positions are no feature. LIME then fits on group indicators: ``visual_masks[b, k, g]`` /
    ``textual_masks[b, k, g]`` is group g of sample b kept in perturbation k (groups numbered
    ``0..`` in increasing id order per modality; columns past a sample's group count are
    always True and get coefficient 0), and every feature of a group carries its group's
    coefficient in the maps, id -1 features 0. None (default): one feature per cell and per
    non-PAD token.
    Returns ``DimeMaps`` (UC and MI ``Attribution``s, masks, targets, answers).
    """
    color, shape = np.asarray(scenes.color), np.asarray(scenes.shape)
    tokens = np.asarray(scenes.tokens, np.int32)
    B = color.shape[0]
    if reference is not None:
        color = np.concatenate([color, np.asarray(reference.color)])
        shape = np.concatenate([shape, np.asarray(reference.shape)])
        tokens = np.concatenate([tokens, np.asarray(reference.tokens, np.int32)])
    if n_samples < 2:
        raise ValueError(f"n_samples must be >= 2 (row 0 is the unperturbed input), got "
                         f"{n_samples}")
    n_dev = 1 if mesh is None else mesh.devices.size
    Bp = -(-B // n_dev) * n_dev  # explained rows padded to a multiple of the devices
    pos = jnp.asarray(np.arange(Bp) % B, jnp.int32)  # explained sample = set index
    keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(pos)
    if chunk is None:
        chunk = per_sample_chunk(Bp // n_dev)
    chunk = check_chunk(chunk)
    args, per_sample = (params, color, shape, tokens), (pos, keys)
    if feature_mask is not None:
        cell_ids, token_ids = _compact(feature_mask, tokens[:B], color.shape[-1])
        per_sample += (jnp.asarray(cell_ids[np.asarray(pos)]),
                       jnp.asarray(token_ids[np.asarray(pos)]))
    if mesh is not None:
        # Auto (propagated) sharding: the per-sample gathers need no sharding annotations.
        mesh = jax.sharding.Mesh(mesh.devices, mesh.axis_names)
        args = jax.device_put(args, NamedSharding(mesh, P()))
        per_sample = jax.device_put(per_sample, NamedSharding(mesh, P("data")))
    cv, ct, zv, yv, zt, yt, answer = _dime_jit(
        apply_fn, *args, *per_sample, n_samples=int(n_samples), chunk=int(chunk),
        pair_chunk=rows_per_call(), cell_px=int(cell_px), kernel_width=float(kernel_width), alpha=float(alpha))
    cv, ct, zv, yv, zt, yt, answer = (a[:B] for a in (cv, ct, zv, yv, zt, yt, answer))
    valid = jnp.asarray(tokens[:B] != U.PAD_ID)
    return DimeMaps(uc=from_maps(cv[..., 0], ct[..., 0], valid),
                    mi=from_maps(cv[..., 1], ct[..., 1], valid),
                    visual_masks=zv, visual_targets=yv, textual_masks=zt, textual_targets=yt,
                    answer=answer)


def dime(apply_fn, params, scenes, key, *, n_samples: int = 256, cell_px: int = 16,
         chunk: int | None = None, reference=None, maps: str = "mi", mesh=None,
         feature_mask: PT.FeatureMask | None = None, **kwargs) -> Attribution:
    """DIME's attribution for Table 1: the ``maps="mi"`` (default) multimodal-interaction maps,
    or ``"uc"`` the unimodal-contribution maps (module docstring for why MI). Arguments as
    ``dime_maps``; visual [B, S, S], textual [B, L] (0 at PAD)."""
    if maps not in ("mi", "uc"):
        raise ValueError(f"maps must be 'mi' or 'uc', got {maps!r}")
    out = dime_maps(apply_fn, params, scenes, key, n_samples=n_samples, cell_px=cell_px,
                    chunk=chunk, reference=reference, mesh=mesh, feature_mask=feature_mask,
                    **kwargs)
    return out.mi if maps == "mi" else out.uc


# ---------------------------------------------------------------------------------------------
# Region players: DIME at its reference granularity (lime_image's quickshift superpixels).


def _explain_one_regions(apply_fn, params, set_images, set_tokens, G, pos, key, labels, fill, *,
                         n_regions, n_samples, chunk, kernel_width, alpha):
    """``_explain_one`` with image regions as the visual features: labels int32 [H, W] (region
    ids ``0..n_regions-1``, -1 never masked), a masked region's pixels set to ``fill``."""
    N = set_images.shape[0]
    answer = jnp.argmax(G[pos, pos]).astype(jnp.int32)
    F = G[:, :, answer]  # [N, N]: f(t_j, v_k) for this sample's answer
    image, tokens = set_images[pos], set_tokens[pos]
    valid = tokens != U.PAD_ID
    kv, kt = jax.random.split(key)
    # Regions this image has (a superpixel count below the batch's maximum leaves null columns:
    # kept in every mask, coefficient 0).
    valid_v = RG.region_sizes(labels, n_regions) > 0
    zv = LIME.image_masks(kv, n_samples, n_regions) | ~valid_v[None, :]  # [n, R]
    zt = LIME.text_masks(kt, n_samples, valid)  # [n, L]

    def f_rows(ids, visual: bool):
        p, j = ids // N, ids % N
        if visual:  # perturbed image of sample pos, question of sample j
            imgs = RG.mask_regions(image[None], labels, ~zv[p], fill)
            toks = set_tokens[j]
        else:  # perturbed question of sample pos, image of sample j
            imgs = set_images[j]
            toks = PT.mask_tokens(tokens[None], ~zt[p])
        return jnp.take(_logprobs(apply_fn, params, imgs, toks), answer, axis=-1)

    def targets(visual: bool):
        vals = _chunked(functools.partial(f_rows, visual=visual), n_samples * N, chunk)
        vals = vals.reshape(n_samples, N)

        def one(v):
            Fp = F.at[:, pos].set(v) if visual else F.at[pos, :].set(v)
            return jnp.stack(uc_mi_at(Fp, pos))

        return jax.vmap(one)(vals)  # [n, 2]

    yv, yt = targets(True), targets(False)
    cv, _ = LIME.lime_fit(zv, yv, valid_v, kernel_width=kernel_width, alpha=alpha)  # [R, 2]
    ct, _ = LIME.lime_fit(zt, yt, valid, kernel_width=kernel_width, alpha=alpha)  # [L, 2]
    px = RG.spread_regions(cv.T, labels)  # [2, H, W]: each coefficient spread over its region
    return px, ct, zv, yv, zt, yt, answer


@functools.partial(jax.jit, static_argnames=("apply_fn", "n_samples", "chunk", "pair_chunk",
                                             "cell_px", "n_regions", "kernel_width", "alpha"))
def _dime_regions_jit(apply_fn, params, color, shape, tokens, fill, pos, keys, labels, *,
                      n_samples, chunk, pair_chunk, cell_px, n_regions, kernel_width, alpha):
    images = jax.vmap(lambda c, s: R.render(c, s, cell_px))(color, shape)
    tokens = jnp.asarray(tokens, jnp.int32)
    G = _pair_tensor(apply_fn, params, images, tokens, pair_chunk)
    one = functools.partial(_explain_one_regions, apply_fn, params, images, tokens, G,
                            fill=fill, n_regions=n_regions, n_samples=n_samples, chunk=chunk,
                            kernel_width=kernel_width, alpha=alpha)
    return jax.vmap(one)(pos, keys, labels)


def dime_region_maps(apply_fn, params, scenes, key, *, image_players="superpixels",
                     n_samples: int = 256, cell_px: int = 16, chunk: int | None = None,
                     reference=None, baseline: str = "black",
                     kernel_width: float = LIME.IMAGE_KERNEL_WIDTH,
                     alpha: float = LIME.RIDGE_ALPHA, mesh=None) -> DimeMaps:
    """All four DIME maps with image regions as LIME's visual features, as ``lime_image``
    explains an image: its quickshift superpixels (``image_players="superpixels"``, default;
    ``regions.superpixel_players`` of each rendered image, host side), each kept with
    probability 1/2, a hidden superpixel's pixels set to ``baseline``'s absent state
    (``perturb.baseline_fill``; default ``"black"``, DIME's ``hide_color=0``). Also
    ``"patches"`` (``regions.patch_players``) or an int label map ``[B, H, W]`` / ``[H, W]`` at
    ``H = S * cell_px`` (-1 = never masked).

    The UC / MI maps carry ``visual_px`` [B, H, W]: each region's LIME coefficient spread by
    mass over its pixels (``regions.spread_regions``), and the cell map is its mass per cell;
    ``visual_masks`` is bool [B, n_samples, R] over regions (columns of regions a sample lacks
    are always True and get coefficient 0). Textual features, the DIME set and the other
    arguments as ``dime_maps`` (with ``image_players=patch_players(H, H, S)`` and
    ``baseline="empty"`` the maps equal ``dime_maps``' for the same key).
    """
    color, shape = np.asarray(scenes.color), np.asarray(scenes.shape)
    tokens = np.asarray(scenes.tokens, np.int32)
    B, S = color.shape[0], color.shape[-1]
    labels = RG.resolve_image_players(image_players, scenes, cell_px)
    n_reg = RG.n_regions(labels)
    if reference is not None:
        color = np.concatenate([color, np.asarray(reference.color)])
        shape = np.concatenate([shape, np.asarray(reference.shape)])
        tokens = np.concatenate([tokens, np.asarray(reference.tokens, np.int32)])
    if n_samples < 2:
        raise ValueError(f"n_samples must be >= 2 (row 0 is the unperturbed input), got "
                         f"{n_samples}")
    n_dev = 1 if mesh is None else mesh.devices.size
    Bp = -(-B // n_dev) * n_dev  # explained rows padded to a multiple of the devices
    pos_np = np.arange(Bp) % B
    pos = jnp.asarray(pos_np, jnp.int32)  # explained sample = set index
    keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(pos)
    chunk = check_chunk(per_sample_chunk(Bp // n_dev) if chunk is None else chunk)
    fill = PT.baseline_fill(baseline, S, int(cell_px))
    args, per_sample = (params, color, shape, tokens, fill), (pos, keys, jnp.asarray(labels[pos_np]))
    if mesh is not None:
        mesh = jax.sharding.Mesh(mesh.devices, mesh.axis_names)
        args = jax.device_put(args, NamedSharding(mesh, P()))
        per_sample = jax.device_put(per_sample, NamedSharding(mesh, P("data")))
    px, ct, zv, yv, zt, yt, answer = _dime_regions_jit(
        apply_fn, *args, *per_sample, n_samples=int(n_samples), chunk=int(chunk),
        pair_chunk=rows_per_call(), cell_px=int(cell_px), n_regions=n_reg,
        kernel_width=float(kernel_width), alpha=float(alpha))
    px, ct, zv, yv, zt, yt, answer = (a[:B] for a in (px, ct, zv, yv, zt, yt, answer))
    valid = jnp.asarray(tokens[:B] != U.PAD_ID)
    return DimeMaps(uc=from_pixel_maps(px[:, 0], ct[..., 0], valid, S),
                    mi=from_pixel_maps(px[:, 1], ct[..., 1], valid, S),
                    visual_masks=zv, visual_targets=yv, textual_masks=zt, textual_targets=yt,
                    answer=answer)


def dime_regions(apply_fn, params, scenes, key, *, image_players="superpixels",
                 n_samples: int = 256, cell_px: int = 16, chunk: int | None = None,
                 reference=None, baseline: str = "black", maps: str = "mi", mesh=None,
                 **kwargs) -> Attribution:
    """DIME's ``maps`` ("mi" default, or "uc") at region granularity (``dime_region_maps``):
    visual_px [B, H, W] and its cell map [B, S, S], textual [B, L] (0 at PAD)."""
    if maps not in ("mi", "uc"):
        raise ValueError(f"maps must be 'mi' or 'uc', got {maps!r}")
    out = dime_region_maps(apply_fn, params, scenes, key, image_players=image_players,
                           n_samples=n_samples, cell_px=cell_px, chunk=chunk,
                           reference=reference, baseline=baseline, mesh=mesh, **kwargs)
    return out.mi if maps == "mi" else out.uc


__all__ = ["uc_mi", "uc_mi_at", "DimeMaps", "dime_maps", "dime", "dime_region_maps",
           "dime_regions"]
