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

# How this module's Monte Carlo masks are drawn from a sample's key (``mmx_base.lime``): saved
# parts of a DIME row carry it, so parts drawn another way are refused, not mixed.
MASK_DRAWS = LIME.MASK_DRAWS


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
    """All of DIME's output for a batch: the four maps and the regression data behind them
    (B rows, or E with ``dime_maps(positions=)``)."""

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


def _perturbed_targets(f_rows, F, pos, visual: bool, *, n_samples, chunk):
    """(UC, MI) of sample ``pos`` under each perturbation of one modality.

    f_rows(ids int32 [c]) -> float [c]: the explained output of rows ``ids``, row
    ``p * N + j`` = perturbation p of sample pos paired with the other modality of set sample
    j; ``F`` float [N, N]: the unperturbed matrix. A perturbed image replaces column ``pos`` of
    F (``visual``), a perturbed question row ``pos`` -> float32 [n_samples, 2]."""
    N = F.shape[0]
    vals = _chunked(f_rows, n_samples * N, chunk).reshape(n_samples, N)

    def one(v):
        Fp = F.at[:, pos].set(v) if visual else F.at[pos, :].set(v)
        return jnp.stack(uc_mi_at(Fp, pos))

    return jax.vmap(one)(vals)


def _explain_sample(apply_fn, params, set_images, set_tokens, G, pos, key, masked_image,
                    n_visual, valid_v=None, token_ids=None, *, n_samples, chunk, kernel_width,
                    alpha):
    """DIME for one explained sample (set index ``pos``), whatever its visual features are.

    masked_image(keep bool [n_visual]) -> float [1, H, W, 3]: the sample's image with the
    visual features not kept hidden; ``valid_v`` bool [n_visual]: the features this sample has
    (absent ones kept in every mask, coefficient 0), None: all; ``token_ids`` int [L]: compact
    token groups (``_compact``), None: one feature per non-PAD token.
    -> (visual coefficients [n_visual, 2], textual coefficients [L, 2] per token position, zv,
    yv, zt, yt, answer)."""
    N = set_images.shape[0]
    answer = jnp.argmax(G[pos, pos]).astype(jnp.int32)
    F = G[:, :, answer]  # [N, N]: f(t_j, v_k) for this sample's answer
    tokens = set_tokens[pos]
    valid = tokens != U.PAD_ID
    if token_ids is not None:
        # Token groups 0..L-1; a sample with fewer groups has invalid trailing columns (kept in
        # every mask, coefficient 0).
        L = tokens.shape[0]
        valid = jnp.zeros((L + 1,), bool).at[jnp.where(token_ids >= 0, token_ids, L)].set(True)
        valid = valid[:L]
    kv, kt = jax.random.split(key)
    zv = LIME.image_masks(kv, n_samples, n_visual)  # [n, n_visual]
    if valid_v is not None:
        zv = zv | ~valid_v[None, :]
    zt = LIME.text_masks(kt, n_samples, valid)  # [n, L]

    def visual_rows(ids):  # perturbed image of sample pos, question of sample j
        p, j = ids // N, ids % N
        lp = _logprobs(apply_fn, params, masked_image(zv[p]), set_tokens[j])
        return jnp.take(lp, answer, axis=-1)

    def textual_rows(ids):  # perturbed question of sample pos, image of sample j
        p, j = ids // N, ids % N
        keep = zt[p] if token_ids is None else _on_features(zt[p], token_ids)
        lp = _logprobs(apply_fn, params, set_images[j], PT.mask_tokens(tokens[None], ~keep))
        return jnp.take(lp, answer, axis=-1)

    budget = dict(n_samples=n_samples, chunk=chunk)
    yv = _perturbed_targets(visual_rows, F, pos, True, **budget)
    yt = _perturbed_targets(textual_rows, F, pos, False, **budget)
    cv, _ = LIME.lime_fit(zv, yv, valid_v, kernel_width=kernel_width, alpha=alpha)
    ct, _ = LIME.lime_fit(zt, yt, valid, kernel_width=kernel_width, alpha=alpha)  # [L, 2]
    if token_ids is not None:
        ct = _spread(ct, token_ids)
    return cv, ct, zv, yv, zt, yt, answer


def _explain_cells(apply_fn, params, set_images, set_tokens, G, pos, key, cell_ids=None,
                   token_ids=None, *, cell_px, **budget):
    """``_explain_sample`` over the cells of the grid (``cell_ids`` int [S*S]: compact cell
    groups, or None: one feature per cell); cells masked to the empty tile -> visual
    coefficients [S, S, 2]."""
    image = set_images[pos]
    S = image.shape[0] // cell_px
    C = S * S
    valid_v = None
    if cell_ids is not None:  # cell groups 0..C-1 this sample has
        valid_v = jnp.zeros((C + 1,), bool).at[jnp.where(cell_ids >= 0, cell_ids, C)].set(True)
        valid_v = valid_v[:C]

    def masked_image(keep):
        keep = keep if cell_ids is None else _on_features(keep, cell_ids)
        return PT.mask_cells(image[None], ~keep.reshape(-1, S, S), cell_px)

    cv, *rest = _explain_sample(apply_fn, params, set_images, set_tokens, G, pos, key,
                                masked_image, C, valid_v, token_ids, **budget)
    if cell_ids is not None:
        cv = _spread(cv, cell_ids)
    return (cv.reshape(S, S, 2), *rest)


def _explain_regions(apply_fn, params, set_images, set_tokens, G, pos, key, labels, fill, *,
                     n_regions, **budget):
    """``_explain_sample`` over the regions of a pixel label map (labels int32 [H, W], ids
    ``0..n_regions-1``, -1 never masked; a hidden region's pixels set to ``fill``) -> visual
    coefficients spread over their pixels [2, H, W]."""
    image = set_images[pos]
    # Regions this image has (a superpixel count below the batch's maximum leaves null columns).
    valid_v = RG.region_sizes(labels, n_regions) > 0
    masked_image = lambda keep: RG.mask_regions(image[None], labels, ~keep, fill)
    cv, *rest = _explain_sample(apply_fn, params, set_images, set_tokens, G, pos, key,
                                masked_image, n_regions, valid_v, **budget)
    return (RG.spread_regions(cv.T, labels), *rest)


@functools.partial(jax.jit, static_argnames=("apply_fn", "n_samples", "chunk", "pair_chunk",
                                             "cell_px", "n_regions", "kernel_width", "alpha"))
def _dime_jit(apply_fn, params, color, shape, tokens, fill, pos, keys, *features, n_samples,
              chunk, pair_chunk, cell_px, n_regions=None, kernel_width, alpha):
    """Both games in one jitted body: cells (``features`` = () or (cell_ids, token_ids),
    ``n_regions`` None) or regions (``features`` = (labels,), with ``fill``)."""
    images = jax.vmap(lambda c, s: R.render(c, s, cell_px))(color, shape)
    tokens = jnp.asarray(tokens, jnp.int32)
    G = _pair_tensor(apply_fn, params, images, tokens, pair_chunk)
    budget = dict(n_samples=n_samples, chunk=chunk, kernel_width=kernel_width, alpha=alpha)
    if n_regions is None:
        one = functools.partial(_explain_cells, apply_fn, params, images, tokens, G,
                                cell_px=cell_px, **budget)
    else:
        one = functools.partial(_explain_regions, apply_fn, params, images, tokens, G,
                                fill=fill, n_regions=n_regions, **budget)
    return jax.vmap(one)(pos, keys, *features)


def _explained_set(scenes, reference, key, n_samples, chunk, mesh, positions=None):
    """Host-side set-up shared by ``dime_maps`` and ``dime_region_maps``: the DIME set (the
    batch, then ``reference``) as numpy (color, shape, tokens), the number E of explained
    samples, their set indices padded to a multiple of the devices (numpy and jax), their keys
    ``fold_in(key, i)`` and the checked chunk. ``positions``: the explained batch samples
    (``_check_positions``; None: all B)."""
    color, shape = np.asarray(scenes.color), np.asarray(scenes.shape)
    tokens = np.asarray(scenes.tokens, np.int32)
    B = color.shape[0]
    explained = np.arange(B) if positions is None else _check_positions(positions, B)
    if reference is not None:
        color = np.concatenate([color, np.asarray(reference.color)])
        shape = np.concatenate([shape, np.asarray(reference.shape)])
        tokens = np.concatenate([tokens, np.asarray(reference.tokens, np.int32)])
    if n_samples < 2:
        raise ValueError(f"n_samples must be >= 2 (row 0 is the unperturbed input), got "
                         f"{n_samples}")
    E = explained.size
    n_dev = 1 if mesh is None else mesh.devices.size
    Ep = -(-E // n_dev) * n_dev  # explained rows padded to a multiple of the devices
    pos_np = explained[np.arange(Ep) % E]
    pos = jnp.asarray(pos_np, jnp.int32)  # explained sample = set index
    keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(pos)
    chunk = check_chunk(per_sample_chunk(Ep // n_dev) if chunk is None else chunk)
    return (color, shape, tokens), E, pos_np, pos, keys, chunk


def _check_positions(positions, B: int) -> np.ndarray:
    """int [E]: ``positions`` as distinct batch indices in ``0..B-1`` (at least one);
    ``ValueError`` naming the problem otherwise."""
    p = np.asarray(positions)
    if p.ndim != 1 or p.size == 0 or not np.issubdtype(p.dtype, np.integer):
        raise ValueError(f"positions must be a non-empty 1-d sequence of batch indices, got "
                         f"{positions!r}")
    if p.min() < 0 or p.max() >= B or np.unique(p).size != p.size:
        raise ValueError(f"positions must be distinct indices of the batch's {B} samples "
                         f"(0..{B - 1}), got {p.tolist()}")
    return p.astype(np.int64)


def _on_mesh(mesh, shared, per_sample):
    """Replicate ``shared`` and shard ``per_sample`` over a ``('data',)`` mesh (None: as is).
    Auto (propagated) sharding: the per-sample gathers need no sharding annotations."""
    if mesh is None:
        return shared, per_sample
    mesh = jax.sharding.Mesh(mesh.devices, mesh.axis_names)
    return (jax.device_put(shared, NamedSharding(mesh, P())),
            jax.device_put(per_sample, NamedSharding(mesh, P("data"))))


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
              feature_mask: PT.FeatureMask | None = None, positions=None) -> DimeMaps:
    """All four DIME maps for a batch (module docstring).

    apply_fn(params, image [B, H, W, 3], tokens [B, L]) -> {"answer_logprobs": [B, A]};
    scenes: a ``Scene`` batch (B), rendered at ``cell_px``; ``reference``: optional extra
    scenes for the DIME set (appended after the batch); ``n_samples``: LIME perturbations per
    modality and sample (row 0 = unperturbed); ``chunk``: perturbed rows per explained sample
    per forward (the samples on a device are vmapped, so a forward carries ``chunk`` times
    their number; default ``mmx_base.batching.per_sample_chunk``: 64 rows per call on CPU);
    ``mesh``: a
    ``('data',)`` mesh to shard the explained samples over (the set is replicated). Sample i's
    masks depend only on ``fold_in(key, i)`` (``mmx_base.lime``: not on the token length the
    batch is padded to), so results do not depend on the mesh or the padding.
    ``positions``: int [E], the batch samples to explain (distinct indices; None: all B): the
    DIME set stays the whole batch (and ``reference``), so their maps are the whole batch's
    rows ``positions`` (to float32 rounding) and every output has E rows in that order (a
    long batch computed a few samples at a time: ``reproduction.table1``'s ``--piece``).

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
    (color, shape, tokens), E, pos_np, pos, keys, chunk = _explained_set(
        scenes, reference, key, n_samples, chunk, mesh, positions)
    per_sample = (pos, keys)
    if feature_mask is not None:
        B = np.shape(scenes.tokens)[0]
        cell_ids, token_ids = _compact(feature_mask, tokens[:B], color.shape[-1])
        per_sample += (jnp.asarray(cell_ids[pos_np]), jnp.asarray(token_ids[pos_np]))
    shared, per_sample = _on_mesh(mesh, (params, color, shape, tokens, None), per_sample)
    cv, ct, zv, yv, zt, yt, answer = _dime_jit(
        apply_fn, *shared, *per_sample, n_samples=int(n_samples), chunk=int(chunk),
        pair_chunk=rows_per_call(), cell_px=int(cell_px), kernel_width=float(kernel_width),
        alpha=float(alpha))
    cv, ct, zv, yv, zt, yt, answer = (a[:E] for a in (cv, ct, zv, yv, zt, yt, answer))
    valid = jnp.asarray(tokens[pos_np[:E]] != U.PAD_ID)
    return DimeMaps(uc=from_maps(cv[..., 0], ct[..., 0], valid),
                    mi=from_maps(cv[..., 1], ct[..., 1], valid),
                    visual_masks=zv, visual_targets=yv, textual_masks=zt, textual_targets=yt,
                    answer=answer)


def dime(apply_fn, params, scenes, key, *, n_samples: int = 256, cell_px: int = 16,
         chunk: int | None = None, reference=None, maps: str = "mi", mesh=None,
         feature_mask: PT.FeatureMask | None = None, positions=None, **kwargs) -> Attribution:
    """DIME's attribution for Table 1: the ``maps="mi"`` (default) multimodal-interaction maps,
    or ``"uc"`` the unimodal-contribution maps (module docstring for why MI). Arguments as
    ``dime_maps``; visual [E, S, S], textual [E, L] (0 at PAD), E = B without ``positions``."""
    if maps not in ("mi", "uc"):
        raise ValueError(f"maps must be 'mi' or 'uc', got {maps!r}")
    out = dime_maps(apply_fn, params, scenes, key, n_samples=n_samples, cell_px=cell_px,
                    chunk=chunk, reference=reference, mesh=mesh, feature_mask=feature_mask,
                    positions=positions, **kwargs)
    return out.mi if maps == "mi" else out.uc


# ---------------------------------------------------------------------------------------------
# Region players: DIME at its reference granularity (lime_image's quickshift superpixels).


def dime_region_maps(apply_fn, params, scenes, key, *, image_players="superpixels",
                     n_samples: int = 256, cell_px: int = 16, chunk: int | None = None,
                     reference=None, baseline: str = "black",
                     kernel_width: float = LIME.IMAGE_KERNEL_WIDTH,
                     alpha: float = LIME.RIDGE_ALPHA, mesh=None, positions=None) -> DimeMaps:
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
    are always True and get coefficient 0). Textual features, the DIME set, ``positions`` and
    the other arguments as ``dime_maps`` (with ``image_players=patch_players(H, H, S)`` and
    ``baseline="empty"`` the maps equal ``dime_maps``' for the same key).
    """
    S = np.asarray(scenes.color).shape[-1]
    labels = RG.resolve_image_players(image_players, scenes, cell_px)
    (color, shape, tokens), E, pos_np, pos, keys, chunk = _explained_set(
        scenes, reference, key, n_samples, chunk, mesh, positions)
    fill = PT.baseline_fill(baseline, S, int(cell_px))
    shared, per_sample = _on_mesh(mesh, (params, color, shape, tokens, fill),
                                  (pos, keys, jnp.asarray(labels[pos_np])))
    px, ct, zv, yv, zt, yt, answer = _dime_jit(
        apply_fn, *shared, *per_sample, n_samples=int(n_samples), chunk=int(chunk),
        pair_chunk=rows_per_call(), cell_px=int(cell_px), n_regions=RG.n_regions(labels),
        kernel_width=float(kernel_width), alpha=float(alpha))
    px, ct, zv, yv, zt, yt, answer = (a[:E] for a in (px, ct, zv, yv, zt, yt, answer))
    valid = jnp.asarray(tokens[pos_np[:E]] != U.PAD_ID)
    return DimeMaps(uc=from_pixel_maps(px[:, 0], ct[..., 0], valid, S),
                    mi=from_pixel_maps(px[:, 1], ct[..., 1], valid, S),
                    visual_masks=zv, visual_targets=yv, textual_masks=zt, textual_targets=yt,
                    answer=answer)


def dime_regions(apply_fn, params, scenes, key, *, image_players="superpixels",
                 n_samples: int = 256, cell_px: int = 16, chunk: int | None = None,
                 reference=None, baseline: str = "black", maps: str = "mi", mesh=None,
                 positions=None, **kwargs) -> Attribution:
    """DIME's ``maps`` ("mi" default, or "uc") at region granularity (``dime_region_maps``):
    visual_px [E, H, W] and its cell map [E, S, S], textual [E, L] (0 at PAD), E = B without
    ``positions``."""
    if maps not in ("mi", "uc"):
        raise ValueError(f"maps must be 'mi' or 'uc', got {maps!r}")
    out = dime_region_maps(apply_fn, params, scenes, key, image_players=image_players,
                           n_samples=n_samples, cell_px=cell_px, chunk=chunk,
                           reference=reference, baseline=baseline, mesh=mesh,
                           positions=positions, **kwargs)
    return out.mi if maps == "mi" else out.uc


__all__ = ["uc_mi", "uc_mi_at", "DimeMaps", "dime_maps", "dime", "dime_region_maps",
           "dime_regions"]
