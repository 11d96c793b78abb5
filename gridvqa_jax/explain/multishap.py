"""MultiSHAP: cell x token Shapley interactions of any ``apply(params, image, tokens)`` model.

For one sample, the coalition game has as players the ``S*S`` grid cells and the question's
``n`` non-PAD tokens (``gridvqa_jax.explain.perturb.players``): ``v(S)`` is the log-probability
of the answer the model predicts on the unperturbed input, when every cell outside S is the
empty white tile and every token outside S is PAD (``perturb.make_value_fn``). MultiSHAP
(Wang & Wang 2025) explains the sample by the pairwise Shapley interaction index (SII,
Grabisch & Roubens 1999) between every cell c and every token t::

    Phi[c, t] = sum_{T ⊆ N \\ {c,t}} |T|! (|N|-|T|-2)! / (|N|-1)!
                (v(T ∪ {c,t}) - v(T ∪ {c}) - v(T ∪ {t}) + v(T))

over the game on all ``|N| = S*S + n`` players (the cell-cell and token-token blocks are not
computed), estimated by ``interactions.sii_matrix``: one Monte Carlo coalition serves every
pair, ``n_samples * (1 + S*S + n + S*S*n)`` evaluations (``multishap_evaluations``). The
visual map is ``sum_t Phi[c, t]`` per cell, the textual map ``sum_c Phi[c, t]`` per token.

Options (keyword-only; defaults in ``DEFAULT_OPTIONS``, the reference's choices in
``REFERENCE_OPTIONS``):

* ``target``: ``"predicted"`` (default) explains the answer the model predicts on the
  unperturbed input; ``"label"`` the scene's ground-truth answer (``scene.answer`` /
  ``scene.is_yesno`` in GridMDETR's unified answer space, ``models.mdetr.answer_index``).
* ``quantity``: ``v`` reads the log-probability (``"logprob"``, default), the model's own logit
  (``"logit"``, a model that returns ``answer_logits``) or the exact log-odds
  ``log p - log(1 - p)`` (``"log_odds"``); ``perturb.answer_logprob``.
* ``baseline``: an absent cell is the empty white tile (``"empty"``, default), uniform gray 128
  (``"gray"``) or black 0 (``"black"``); ``perturb.baseline_fill``.
* ``text_aggregate`` / ``visual_aggregate``: the maps from ``Phi`` as signed sums (``"signed"``,
  default: ``sum_c Phi[c, t]``, ``sum_t Phi[c, t]``) or sums of magnitudes (``"abs"``:
  ``sum_c |Phi[c, t]|``, ``sum_t |Phi[c, t]|``).
* ``sampling``: the Monte Carlo coalitions' sizes drawn i.i.d. (``"iid"``, default) or
  stratified by size (``"stratified"``, the shared-coalition form of the reference's
  ``stratified_sampling=True``); ``interactions.sii_matrix``. Both are unbiased for ``Phi``;
  it is an estimator choice, not a choice of the game, so ``REFERENCE_OPTIONS`` leaves it out
  (Table 1's shipped rows are i.i.d.; ``gridvqa explain --multishap-sampling``).

MultiSHAP's reference (WGLab/MultiSHAP, ``MultiSHAP.py``) explains ViLT's logit of the dataset's
answer (``compute_vqa_logits`` with the id of ``multiple_choice_answer``; ViLT's VQA head is
per-answer sigmoid, so its logit is the log-odds of that answer), masks image patches with 0.5
(``create_masked_image``, ``mask_value=0.5``), ranks tokens by ``np.abs(iccs_matrix).sum(axis=0)``
(``analyze_vilt_vqa_iccs_dataset``) and draws the visual map as the signed mean over tokens
``iccs_matrix[:, :n_tokens].mean(axis=1)`` (``visualize_question_token_heatmaps``; the sum over
tokens up to the per-sample factor 1/n, which RMA and Otsu IoU ignore):
``REFERENCE_OPTIONS = {target: label, quantity: log_odds, baseline: gray, text_aggregate: abs,
visual_aggregate: signed}``.

``order=1`` (and ``shapley_attribution``) explains by first-order Shapley values of the same
game instead: ``shapley.exact_shapley`` when ``S*S + n <= 14`` players, else
``shapley.permutation_shapley`` with ``n_samples`` antithetic permutations. The MM-SHAP
modality shares ``T-SHAP = sum_t |phi_t| / sum_i |phi_i|`` and ``V-SHAP = 1 - T-SHAP``
(Parcalabescu & Frank 2023; ``shapley.modality_shares``) come from those first-order values
(``multishap_with_shares``).

Reference granularity. The reference masks ViLT's image patches (32 px on 384 px, a 12 x 12
grid that does not line up with the scene's cells), not cells: ``multishap_regions`` plays the
same game with the regions of a pixel label map as the image players (``explain.regions``;
default ViLT's 12 x 12 patches over the rendering) and returns a per-pixel visual map
(``Attribution.visual_px``) besides its cell map.

Batching. All samples of a batch share one static game size: cells plus the longest
question's tokens ``n_max`` (host side, or ``n_tokens=``). PAD positions are null players and
are not players of the game at all, so they cost no evaluation; a shorter question's positions
``n .. n_max-1`` are null players of its game (adding null players changes neither the SII nor
the Shapley values of the others) and their columns, rows and maps are set to 0. They join no
coalition, and every player's draws are keyed by its place among the cells or the tokens
(``interactions.COALITION_DRAWS``, ``MASK_DRAWS``), so a sample's SII maps, given its key, do
not depend on ``n_max`` (nor, in ``multishap_regions``, on the batch's region count). Those
rows are evaluated (static shapes), so batches of similar question lengths waste least: on 8 random
d07 samples (5..12 tokens) 75% of the evaluations are of real players. Everything
for a batch is one ``jax.jit`` (compiled once per batch size, ``n_max`` and budget), vmapped
over samples (each sample's value function is built inside the vmapped function), with the
coalitions of every sample evaluated ``perturbations_per_eval`` at a time (``lax.map``; the
model sees ``B * perturbations_per_eval`` rows per call, whatever the budget; by default
``mmx_base.batching.per_sample_chunk``: 64 rows per call on CPU, where small calls are fastest),
and the sample axis sharded over a ``('data',)`` mesh (params replicated). Sample i uses key
``jax.random.split(key, B)[i]``, so results do not depend on the device count or the chunk
size; ``key`` may also be the B per-sample keys themselves (``sample_keys``), so any subset of a
batch, given its keys, gets the batch's maps of those samples (to float32 rounding: the model
sees fewer rows per call). The same holds for the first-order permutation draws
(``shapley.PERMUTATION_DRAWS``: null players in no coalition, each player's order keyed by its
place among the cells or the tokens), except where padding crosses ``MAX_EXACT_PLAYERS``: a
game of at most 14 players is computed exactly, so a small game padded past 14 is sampled.
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from mmx_base.batching import check_chunk, per_sample_chunk
from gridvqa_jax.explain import interactions as IN
from gridvqa_jax.explain import perturb as PT
from gridvqa_jax.explain import shapley as SH
from gridvqa_jax.explain import regions as RG
from gridvqa_jax.explain.attribution import Attribution, from_maps, from_pixel_maps
from gridvqa_jax.models import mdetr as M
from gridvqa_jax.world import render as R
from gridvqa_jax.world import universe as U


# How this module's coalitions are drawn from a sample's key (``interactions.COALITION_DRAWS``):
# saved parts of a MultiSHAP row carry it, so parts drawn another way are refused, not mixed.
MASK_DRAWS = IN.COALITION_DRAWS
# order=1: the permutations' law and the streams ``_explain`` keys them by
PERMUTATION_DRAWS = SH.PERMUTATION_DRAWS + "; streams: cell i (0, i), token t (1, t)"
TARGETS = ("predicted", "label")  # which answer the game explains
AGGREGATES = ("signed", "abs")  # how a map sums the interaction matrix
DEFAULT_OPTIONS = {"target": "predicted", "quantity": "logprob", "baseline": "empty",
                   "text_aggregate": "signed", "visual_aggregate": "signed"}
# The choices of MultiSHAP's reference code (WGLab/MultiSHAP, MultiSHAP.py; module docstring).
REFERENCE_OPTIONS = {"target": "label", "quantity": "log_odds", "baseline": "gray",
                     "text_aggregate": "abs", "visual_aggregate": "signed"}


def sample_keys(key, B: int) -> jax.Array:
    """The per-sample keys of a batch of B samples: ``jax.random.split(key, B)`` for one key
    (a typed key of shape ``()`` or a raw uint32 ``[2]``), or ``key`` itself when it already
    holds B keys (typed ``[B]`` or raw ``[B, 2]``). ``ValueError`` for any other shape."""
    typed = jax.dtypes.issubdtype(jnp.asarray(key).dtype, jax.dtypes.prng_key)
    shape = tuple(np.shape(key))
    if shape == (() if typed else (2,)):
        return jax.random.split(key, B)
    if shape == ((B,) if typed else (B, 2)):
        return key
    raise ValueError(f"key: one PRNG key or one per sample ({B}) expected, got shape {shape}")


def _check_option(name, value, choices):
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, got {value!r}")


def label_answer(scenes) -> np.ndarray:
    """int32 [B]: the ground-truth answer class of each scene in GridMDETR's unified answer space
    ``0..C, no, yes`` (``models.mdetr.answer_index`` of ``scene.answer``, ``scene.is_yesno``)."""
    if not (hasattr(scenes, "answer") and hasattr(scenes, "is_yesno")):
        raise ValueError("target='label' reads the scenes' answer and is_yesno fields, which "
                         f"this {type(scenes).__name__} lacks")
    S = int(np.shape(scenes.color)[-1])
    return np.asarray(M.answer_index(np.asarray(scenes.answer), np.asarray(scenes.is_yesno),
                                     S * S), np.int32)


class _Grid(NamedTuple):
    color: jax.Array  # int32 [S, S]
    tokens: jax.Array  # int32 [L]


def _token_counts(tokens) -> np.ndarray:
    return np.sum(np.asarray(tokens) != U.PAD_ID, axis=-1)


def _budget_chunk(chunk, perturbations_per_eval) -> int | None:
    if chunk is not None and perturbations_per_eval is not None and chunk != perturbations_per_eval:
        raise ValueError(f"chunk={chunk} and perturbations_per_eval={perturbations_per_eval} "
                         "name the same budget; give one")
    c = chunk if chunk is not None else perturbations_per_eval
    if c is None:
        return None  # _run: mmx_base.batching.per_sample_chunk of the samples per device
    return check_chunk(c, "perturbations_per_eval")


def game_size(scenes, n_tokens: int | None = None) -> tuple[int, int]:
    """``(S*S, n_max)``: the cell players and the token players of a batch's games. ``n_max``
    is the longest question's non-PAD token count (at least 1), or ``n_tokens`` when given
    (which must cover every question of the batch)."""
    S = int(np.shape(scenes.color)[-1])
    L = int(np.shape(scenes.tokens)[-1])
    longest = int(np.max(_token_counts(scenes.tokens), initial=0))
    if n_tokens is None:
        n_tokens = max(1, longest)
    elif not (longest <= n_tokens <= L):
        raise ValueError(f"n_tokens={n_tokens} must lie in [{longest}, {L}] (the longest "
                         f"question of the batch has {longest} tokens, L = {L})")
    return S * S, int(n_tokens)


def multishap_evaluations(scenes, n_samples: int, n_tokens: int | None = None) -> int:
    """Model evaluations (perturbed inputs) of ``multishap`` on a batch: ``B * n_samples *
    (1 + C + n + C*n)`` with ``C = S*S`` cells and ``n = n_max`` token players (plus one
    unperturbed forward per sample for the predicted answer, not counted)."""
    c, n = game_size(scenes, n_tokens)
    return int(np.shape(scenes.tokens)[0]) * IN.sii_evaluations(c, n, n_samples)


def shapley_evaluations(scenes, n_samples: int, n_tokens: int | None = None) -> int:
    """Model evaluations of ``shapley_attribution`` on a batch: ``B * 2^(C+n)`` when exact
    (``C + n <= 14``), else ``B * (n_samples * (C+n-1) + 2)``."""
    c, n = game_size(scenes, n_tokens)
    m = c + n
    per = 2 ** m if m <= SH.MAX_EXACT_PLAYERS else SH.permutation_shapley_evaluations(m, n_samples)
    return int(np.shape(scenes.tokens)[0]) * per


@functools.partial(jax.jit, static_argnames=("apply_fn", "cell_px", "n_tokens", "n_samples",
                                             "chunk", "order", "n_permutations", "probability",
                                             "n_cell_groups", "baseline", "quantity",
                                             "sampling"))
def _explain(apply_fn, params, color, shape, tokens, keys, answer, groups=None, *, cell_px,
             n_tokens, n_samples, chunk, order, n_permutations, probability, n_cell_groups=None,
             baseline="empty", quantity="logprob", sampling="iid"):
    """Per-sample estimates, vmapped: dict of phi2 [B, C, n], phi1 [B, C+n] (either may be
    absent), valid [B, n]. ``answer`` int [B] or None (the predicted answer). ``groups``: a
    batched ``FeatureMask`` of compact ids (cells ``0..n_cell_groups-1``, tokens from
    ``n_cell_groups`` on, ``n_tokens`` token groups; ``perturb.compact_feature_mask``), or None (one player
    per cell and per token)."""
    S = color.shape[-1]
    C, L, n = S * S, tokens.shape[-1], n_tokens
    if groups is not None:
        C = n_cell_groups
    cells, toks = tuple(range(C)), tuple(range(C, C + n))

    def one(color, shape, tokens, key, answer, group):
        image = R.render(color, shape, cell_px)
        if group is None:
            fmask = PT.players(_Grid(color, tokens))
            full = PT.make_value_fn(apply_fn, params, image, tokens, fmask, answer, probability,
                                    baseline=baseline, quantity=quantity)

            def value_fn(coalition):  # [K, C+n] -> players C+n .. C+L-1 are PAD for every sample
                absent = jnp.zeros(coalition.shape[:-1] + (L - n,), bool)
                return full(jnp.concatenate([coalition, absent], axis=-1))

            valid = tokens[:n] != U.PAD_ID
            active = jnp.concatenate([jnp.ones((C,), bool), valid])
        else:  # ids are compact: every player is one of the C + n of the game
            value_fn = PT.make_value_fn(apply_fn, params, image, tokens, group, answer,
                                       probability, baseline=baseline, quantity=quantity)
            active = PT.active_players(group, C + n)
            valid = active[C:]
        k2, k1 = jax.random.split(key)
        out = {"valid": valid}
        if order == 2:  # the null players (PAD, empty groups) join no coalition
            phi2 = IN.sii_matrix(value_fn, C + n, cells, toks, k2, n_samples, chunk=chunk,
                                 sampling=sampling, active=active)
            out["phi2"] = jnp.where(valid[None, :], phi2, 0.0)
        if n_permutations:
            if C + n <= SH.MAX_EXACT_PLAYERS:
                phi1 = SH.exact_shapley(value_fn, C + n, chunk=chunk)
            else:
                # the SII's streams: a cell keyed by its place among the cells, a token by
                # its place among the tokens, so null tokens padded in change no other player's
                streams = IN._streams(C + n, np.asarray(cells, int), np.asarray(toks, int))
                phi1 = SH.permutation_shapley(value_fn, C + n, k1, n_permutations,
                                              antithetic=True, chunk=chunk, active=active,
                                              streams=streams)
            out["phi1"] = jnp.where(jnp.concatenate([jnp.ones((C,), bool), valid]), phi1, 0.0)
        return out

    if answer is None:
        return jax.vmap(lambda c, s, t, k, g: one(c, s, t, k, None, g))(color, shape, tokens,
                                                                        keys, groups)
    return jax.vmap(one)(color, shape, tokens, keys, answer, groups)


def _spread(phi_cells, phi_tokens, groups: PT.FeatureMask, n_cell_groups: int):
    """Group values -> per-feature maps: every feature of a group carries the group's value
    (captum's convention), features of id -1 carry 0. phi_cells [B, Gc], phi_tokens [B, Gt] ->
    (visual [B, S, S], textual [B, L])."""
    B = phi_cells.shape[0]
    cid = jnp.asarray(groups.cells).reshape(B, -1)
    tid = jnp.asarray(groups.tokens) - n_cell_groups
    visual = jnp.where(cid >= 0, jnp.take_along_axis(phi_cells, jnp.clip(cid, 0), 1), 0.0)
    textual = jnp.where(tid >= 0, jnp.take_along_axis(phi_tokens, jnp.clip(tid, 0), 1), 0.0)
    S = int(np.sqrt(cid.shape[1]))
    return visual.reshape(B, S, S), textual


def _run(apply_fn, params, scenes, key, *, cell_px, n_samples, chunk, order, n_permutations,
         n_tokens, answer, probability, mesh, feature_mask=None, target="predicted",
         baseline="empty", quantity="logprob", sampling="iid"):
    """Host wrapper: pad the batch to the mesh, shard, call ``_explain``, trim."""
    if order not in (1, 2):
        raise ValueError(f"order must be 1 (Shapley values) or 2 (cell x token SII), got {order!r}")
    answer = _explained_answer(scenes, target=target, baseline=baseline, quantity=quantity,
                               probability=probability, answer=answer, n_samples=n_samples,
                               sampling=sampling)
    color = np.asarray(scenes.color, np.int32)
    shape = np.asarray(scenes.shape, np.int32)
    tokens = np.asarray(scenes.tokens, np.int32)
    B = tokens.shape[0]
    if B < 1:
        raise ValueError("no samples to explain (empty batch)")
    groups, n_cell_groups = None, None
    if feature_mask is None:
        _, n = game_size(scenes, n_tokens)
    else:
        if n_tokens is not None:
            raise ValueError("n_tokens sizes the one-player-per-token game; with feature_mask "
                             "the game's players are the mask's groups")
        groups, n_cell_groups, n = PT.compact_feature_mask(feature_mask, tokens, color.shape[-1])
    keys = sample_keys(key, B)
    if answer is not None:
        answer = np.broadcast_to(np.asarray(answer, np.int32), (B,))
    # An Auto-axes mesh over the same devices: the estimators' gathers need no explicit
    # output shardings (``jax.make_mesh`` builds Explicit axes by default).
    per_sample = [color, shape, tokens, keys, groups] + ([] if answer is None else [answer])
    per_sample, params, chunk = _shard_samples(per_sample, params, mesh, chunk)
    color, shape, tokens, keys, groups, *rest = per_sample
    extra = {} if groups is None else {"groups": groups, "n_cell_groups": n_cell_groups}
    out = _explain(apply_fn, params, color, shape, tokens, keys, rest[0] if rest else None,
                   cell_px=int(cell_px), n_tokens=n, n_samples=int(n_samples), chunk=chunk,
                   order=order, n_permutations=n_permutations, probability=probability,
                   baseline=baseline, quantity=quantity, sampling=sampling, **extra)
    out = jax.tree.map(lambda a: a[:B], out)  # drop the padding samples
    if groups is not None:
        out["groups"] = jax.tree.map(lambda a: a[:B], groups)
        out["n_cell_groups"] = n_cell_groups
    return out


def _aggregate(phi2, axis, how):
    """``sum Phi`` (signed) or ``sum |Phi|`` (abs) over ``axis`` of the interaction matrix."""
    return jnp.sum(jnp.abs(phi2) if how == "abs" else phi2, axis=axis)


def _maps_from_phi2(phi2, valid, S, L, text_aggregate="signed", visual_aggregate="signed"):
    B, C, n = phi2.shape
    visual = _aggregate(phi2, 2, visual_aggregate).reshape(B, S, S)
    textual = jnp.pad(_aggregate(phi2, 1, text_aggregate), ((0, 0), (0, L - n)))
    return visual, textual


def _maps_from_phi1(phi1, S, L):
    B = phi1.shape[0]
    C = S * S
    return phi1[:, :C].reshape(B, S, S), jnp.pad(phi1[:, C:], ((0, 0), (0, L - phi1.shape[1] + C)))


def _shard_samples(per_sample, params, mesh, chunk):
    """Per-sample arrays (leading axis B) padded to a multiple of the devices of ``mesh`` (all
    devices when None) by repeating the last sample (its results are dropped), sharded along a
    1-D ``('data',)`` mesh, with ``params`` replicated; ``chunk`` defaults to
    ``per_sample_chunk`` of the samples per device. Returns ``(per_sample, params, chunk)``."""
    devices = np.asarray(jax.devices()) if mesh is None else mesh.devices
    mesh = jax.sharding.Mesh(devices.reshape(-1), ("data",))
    n_dev = mesh.devices.size
    B = int(jax.tree.leaves(per_sample)[0].shape[0])
    pad = -B % n_dev
    if pad:  # repeat the last sample; its results are dropped
        per_sample = jax.tree.map(lambda a: jnp.concatenate([a, jnp.repeat(a[-1:], pad, axis=0)],
                                                            axis=0), per_sample)
    if chunk is None:
        chunk = per_sample_chunk((B + pad) // n_dev)
    per_sample = jax.device_put(per_sample, NamedSharding(mesh, P("data")))
    params = jax.device_put(params, NamedSharding(mesh, P()))
    return per_sample, params, chunk


def _explained_answer(scenes, *, target, baseline, quantity, probability, answer, n_samples,
                      sampling="iid"):
    """Checks the game's options and returns the answer explained per sample (``answer``, the
    scenes' label answers for ``target="label"``, or None: the predicted answer)."""
    _check_option("target", target, TARGETS)
    _check_option("sampling", sampling, IN.SAMPLINGS)
    _check_option("baseline", baseline, PT.BASELINES)
    _check_option("quantity", quantity, PT.QUANTITIES)
    if probability and quantity != "logprob":
        raise ValueError(f"probability=True explains P(answer); it excludes quantity={quantity!r}")
    if target == "label":
        if answer is not None:
            raise ValueError("target='label' explains the scenes' answers; give answer= or "
                             "target='label', not both")
        answer = label_answer(scenes)
    if not isinstance(n_samples, (int, np.integer)) or n_samples < 1:
        raise ValueError(f"n_samples must be an integer >= 1, got {n_samples!r}")
    return answer


def interaction_matrix(apply_fn: Callable, params, scenes, key, *, cell_px: int = 16,
                       n_samples: int = 64, perturbations_per_eval: int | None = None,
                       chunk: int | None = None, n_tokens: int | None = None, answer=None,
                       probability: bool = False, mesh=None, target: str = "predicted",
                       quantity: str = "logprob", baseline: str = "empty",
                       sampling: str = "iid") -> jax.Array:
    """The MultiSHAP matrix ``Phi`` float32 ``[B, S, S, L]``: ``Phi[b, y, x, t]`` = SII of cell
    (x, y) and token position t in sample b's game (module docstring), 0 at PAD positions.

    ``apply_fn(params, image [K, H, W, 3], tokens [K, L]) -> {"answer_logprobs": [K, A]}``;
    ``scenes``: a ``Scene`` batch (only ``color``, ``shape`` and ``tokens`` are read), rendered at
    ``cell_px``; ``key``: one PRNG key or the B per-sample keys (``sample_keys``);
    ``n_samples``: Monte Carlo coalitions per sample (``multishap_evaluations`` gives the
    cost); ``perturbations_per_eval`` (alias ``chunk``): coalitions per sample per model call
    (default: ``mmx_base.batching.per_sample_chunk`` of the samples per device);
    ``answer`` int [B]: explain these answers instead of the predicted ones; ``probability``:
    explain P(answer) instead of its log; ``mesh``: a mesh whose devices take the sample axis (default: all
    devices; e.g. ``jax.make_mesh((n,), ('data',))``).

    ``target`` (``"predicted"`` | ``"label"``: the scenes' answers, which then need ``answer``
    and ``is_yesno`` fields), ``quantity`` (``"logprob"`` | ``"logit"`` | ``"log_odds"``),
    ``baseline`` (``"empty"`` | ``"gray"`` | ``"black"``): the game (module docstring).
    ``sampling`` (``"iid"`` | ``"stratified"``): how the coalitions' sizes are drawn
    (``interactions.sii_matrix``).
    """
    out = _run(apply_fn, params, scenes, key, cell_px=cell_px, n_samples=n_samples,
               chunk=_budget_chunk(chunk, perturbations_per_eval), order=2, n_permutations=0,
               n_tokens=n_tokens, answer=answer, probability=probability, mesh=mesh,
               target=target, baseline=baseline, quantity=quantity, sampling=sampling)
    phi2 = out["phi2"]
    B, C, n = phi2.shape
    S, L = int(np.shape(scenes.color)[-1]), int(np.shape(scenes.tokens)[-1])
    return jnp.pad(phi2, ((0, 0), (0, 0), (0, L - n))).reshape(B, S, S, L)


def multishap(apply_fn: Callable, params, scenes, key, *, cell_px: int = 16,
              n_samples: int = 64, perturbations_per_eval: int | None = None,
              chunk: int | None = None, order: int = 2, n_tokens: int | None = None,
              answer=None, probability: bool = False, mesh=None,
              feature_mask: PT.FeatureMask | None = None, target: str = "predicted",
              quantity: str = "logprob", baseline: str = "empty",
              text_aggregate: str = "signed", visual_aggregate: str = "signed",
              sampling: str = "iid") -> Attribution:
    """MultiSHAP attribution of a batch: visual ``[B, S, S]`` = ``sum_t Phi[c, t]``, textual
    ``[B, L]`` = ``sum_c Phi[c, t]`` (0 at PAD), with ``Phi`` the cell x token SII matrix
    (``interaction_matrix``; Wang & Wang 2025). ``order=1``: first-order Shapley values of the
    same game instead (``shapley_attribution``; ``n_samples`` = antithetic permutations, exact
    enumeration at <= 14 players). Arguments as ``interaction_matrix``.

    ``feature_mask``: players as groups of features (captum's ``feature_mask``): a
    ``perturb.FeatureMask`` with cells int ``[B, S, S]`` (or ``[S, S]`` for every sample) and
    tokens int ``[B, L]`` (or ``[L]``); features with one id are masked together, id -1 is never
    masked, an id may not own both cells and tokens, PAD positions are never players. The game
    is then over the groups (``Phi[g_c, g_t]`` between cell groups and token groups), and every
    feature of a group carries its group's value in the maps (captum's convention), id -1
    features carry 0. None (default): one player per cell and per token, as above.

    ``target``, ``quantity``, ``baseline``: the game, ``sampling``: the coalitions' draw
    (``interaction_matrix``);
    ``text_aggregate`` / ``visual_aggregate``: ``"signed"`` (default) as above, or ``"abs"``:
    textual ``sum_c |Phi[c, t]|`` (the reference's token importance), visual ``sum_t |Phi[c,
    t]|`` (order 2 only). ``REFERENCE_OPTIONS`` holds the reference's choices:
    ``multishap(..., **REFERENCE_OPTIONS)``.
    """
    _, attribution = _attribution(apply_fn, params, scenes, key, cell_px=cell_px,
                                  n_samples=n_samples, chunk=_budget_chunk(chunk,
                                                                           perturbations_per_eval),
                                  order=order, n_permutations=0, n_tokens=n_tokens,
                                  answer=answer, probability=probability, mesh=mesh,
                                  feature_mask=feature_mask, target=target, quantity=quantity,
                                  baseline=baseline, text_aggregate=text_aggregate,
                                  visual_aggregate=visual_aggregate, sampling=sampling)
    return attribution


def shapley_attribution(apply_fn: Callable, params, scenes, key, **kwargs) -> Attribution:
    """First-order Shapley values of every cell and token as the maps (``multishap(...,
    order=1)``): ``phi_i`` of the module's game, exact at <= 14 players, else permutation
    sampling with ``n_samples`` antithetic permutations (``shapley.permutation_shapley``)."""
    return multishap(apply_fn, params, scenes, key, order=1, **kwargs)


def _attribution(apply_fn, params, scenes, key, *, cell_px, n_samples, chunk, order,
                 n_permutations, n_tokens, answer, probability, mesh, feature_mask=None,
                 target="predicted", quantity="logprob", baseline="empty",
                 text_aggregate="signed", visual_aggregate="signed", sampling="iid"):
    _check_option("text_aggregate", text_aggregate, AGGREGATES)
    _check_option("visual_aggregate", visual_aggregate, AGGREGATES)
    if order == 1 and "abs" in (text_aggregate, visual_aggregate):
        raise ValueError("text_aggregate / visual_aggregate sum the order-2 interaction matrix; "
                         "order=1 maps are the Shapley values themselves")
    if order == 1 and sampling != "iid":
        raise ValueError(f"sampling={sampling!r} draws the order-2 estimator's coalitions; "
                         "order=1 samples permutations")
    if order == 1:
        if n_samples % 2:
            raise ValueError(f"order=1 draws antithetic pairs of permutations: n_samples must be "
                             f"even, got {n_samples}")
        n_permutations = n_samples
    out = _run(apply_fn, params, scenes, key, cell_px=cell_px, n_samples=n_samples, chunk=chunk,
               order=order, n_permutations=n_permutations, n_tokens=n_tokens, answer=answer,
               probability=probability, mesh=mesh, feature_mask=feature_mask, target=target,
               baseline=baseline, quantity=quantity, sampling=sampling)
    S, L = int(np.shape(scenes.color)[-1]), int(np.shape(scenes.tokens)[-1])
    if feature_mask is not None:
        gc = out["n_cell_groups"]
        if order == 2:
            phi_c = _aggregate(out["phi2"], 2, visual_aggregate)
            phi_t = _aggregate(out["phi2"], 1, text_aggregate)
        else:
            phi_c, phi_t = out["phi1"][:, :gc], out["phi1"][:, gc:]
        visual, textual = _spread(phi_c, phi_t, out["groups"], gc)
    elif order == 2:
        visual, textual = _maps_from_phi2(out["phi2"], out["valid"], S, L, text_aggregate,
                                          visual_aggregate)
    else:
        visual, textual = _maps_from_phi1(out["phi1"], S, L)
    token_valid = np.asarray(scenes.tokens) != U.PAD_ID
    return out, from_maps(visual, textual, token_valid)


def multishap_with_shares(apply_fn: Callable, params, scenes, key, *, cell_px: int = 16,
                          n_samples: int = 64, n_permutations: int | None = None,
                          perturbations_per_eval: int | None = None, chunk: int | None = None,
                          order: int = 2, n_tokens: int | None = None, answer=None,
                          probability: bool = False, mesh=None,
                          feature_mask: PT.FeatureMask | None = None, target: str = "predicted",
                          quantity: str = "logprob", baseline: str = "empty",
                          text_aggregate: str = "signed", visual_aggregate: str = "signed",
                          sampling: str = "iid"):
    """``(Attribution, shares)``: the ``multishap`` attribution and the MM-SHAP modality shares
    per sample, ``shares = {"t_shap": float32 [B], "v_shap": float32 [B]}`` (T-SHAP + V-SHAP = 1;
    NaN where every Shapley value is 0), from first-order Shapley values of the same game
    (``n_permutations`` antithetic permutations, default ``n_samples`` rounded up to even; at
    ``order=1`` the attribution's own ``n_samples`` permutations, any ``n_permutations``
    ignored; exact at <= 14 players), computed in the same jitted call. The options (``target``,
    ``quantity``, ``baseline``, ``text_aggregate``, ``visual_aggregate``, ``sampling``) are
    ``multishap``'s;
    the shares are of the same game.
    """
    if n_permutations is None:
        n_permutations = n_samples + n_samples % 2
    if n_permutations < 2 or n_permutations % 2:
        raise ValueError(f"n_permutations must be even and >= 2, got {n_permutations}")
    out, attribution = _attribution(apply_fn, params, scenes, key, cell_px=cell_px,
                                    n_samples=n_samples,
                                    chunk=_budget_chunk(chunk, perturbations_per_eval),
                                    order=order, n_permutations=n_permutations,
                                    n_tokens=n_tokens, answer=answer, probability=probability,
                                    mesh=mesh, feature_mask=feature_mask, target=target,
                                    quantity=quantity, baseline=baseline,
                                    text_aggregate=text_aggregate,
                                    visual_aggregate=visual_aggregate, sampling=sampling)
    phi1, valid = out["phi1"], out["valid"]
    C = phi1.shape[1] - valid.shape[1]
    is_text = jnp.concatenate([jnp.zeros((C,), bool), jnp.ones((valid.shape[1],), bool)])
    t, v = SH.modality_shares(phi1, jnp.broadcast_to(is_text, phi1.shape))
    return attribution, {"t_shap": t, "v_shap": v}


# ---------------------------------------------------------------------------------------------
# Region players: MultiSHAP at its reference granularity (image patches, or any label map).


def multishap_region_evaluations(scenes, n_regions: int, n_samples: int,
                                 n_tokens: int | None = None) -> int:
    """Model evaluations of ``multishap_regions`` on a batch: ``B * n_samples * (1 + R + n +
    R*n)`` with ``R`` image regions (144 for ViLT's 12 x 12 patches) and ``n = n_max`` token
    players (plus one unperturbed forward per sample, not counted)."""
    _, n = game_size(scenes, n_tokens)
    return int(np.shape(scenes.tokens)[0]) * IN.sii_evaluations(int(n_regions), n, n_samples)


@functools.partial(jax.jit, static_argnames=("apply_fn", "cell_px", "n_regions", "n_tokens",
                                             "n_samples", "chunk", "probability",
                                             "quantity", "sampling"))
def _explain_regions(apply_fn, params, color, shape, tokens, keys, labels, answer, fill, *,
                     cell_px, n_regions, n_tokens, n_samples, chunk, probability, quantity,
                     sampling="iid"):
    """Per-sample region x token SII, vmapped: phi2 float32 [B, R, n] (0 at PAD columns).
    labels int32 [B, H, W] (region ids, -1 never masked), answer int32 [B] (-1 = predicted),
    fill: the absent state broadcast against [H, W, 3]."""
    L, Rn, n = tokens.shape[-1], n_regions, n_tokens

    def one(color, shape, tokens, key, labels, answer):
        image = R.render(color, shape, cell_px)
        predicted = PT.predicted_answer(apply_fn, params, image[None], tokens[None])[0]
        answer = jnp.where(answer < 0, predicted, answer)

        def value_fn(coalition):  # [K, R+n], True = present; positions n..L-1 stay PAD
            K = coalition.shape[0]
            images = RG.mask_regions(image[None], labels, ~coalition[:, :Rn], fill)
            tmask = jnp.concatenate([~coalition[:, Rn:], jnp.ones((K, L - n), bool)], axis=-1)
            return PT.answer_logprob(apply_fn, params, images, PT.mask_tokens(tokens[None], tmask),
                                     jnp.broadcast_to(answer, (K,)), probability,
                                     quantity=quantity)

        k2, _ = jax.random.split(key)  # the key use of the cell game (``_explain``)
        valid = tokens[:n] != U.PAD_ID
        present = RG.region_sizes(labels, Rn) > 0  # a region without pixels is a null player
        phi2 = IN.sii_matrix(value_fn, Rn + n, tuple(range(Rn)), tuple(range(Rn, Rn + n)), k2,
                             n_samples, chunk=chunk, sampling=sampling,
                             active=jnp.concatenate([present[:Rn], valid]))
        return jnp.where(valid[None, :], phi2, 0.0)

    return jax.vmap(one)(color, shape, tokens, keys, labels, answer)


def multishap_regions(apply_fn: Callable, params, scenes, key, *, image_players="patches",
                      cell_px: int = 16, n_samples: int = 64,
                      perturbations_per_eval: int | None = None, chunk: int | None = None,
                      n_tokens: int | None = None, answer=None, probability: bool = False,
                      target: str = "predicted", quantity: str = "logprob",
                      baseline: str = "empty", text_aggregate: str = "signed",
                      visual_aggregate: str = "signed", mesh=None,
                      sampling: str = "iid") -> Attribution:
    """MultiSHAP over image regions instead of cells: the region x token SII of the game whose
    players are the regions of a pixel label map and the question's tokens.

    The game is the module's, with the image players replaced: ``v(S)`` is the explained
    quantity (``quantity``: log-probability, logit or log-odds of the ``target`` answer, as in
    ``multishap``) when every pixel of every region outside S is ``baseline``'s absent state
    (``perturb.baseline_fill``: ``"empty"`` white tile, ``"gray"``, ``"black"``;
    ``regions.mask_regions``) and every token outside S is PAD. ``Phi[r, t]`` (SII,
    ``interactions.sii_matrix``, ``multishap_region_evaluations`` model calls) gives the visual
    value of region r, ``sum_t Phi[r, t]`` (``visual_aggregate="signed"``) or ``sum_t |Phi[r,
    t]|`` (``"abs"``), spread by mass over its pixels (``regions.spread_regions``) into
    ``visual_px`` [B, S*cell_px, S*cell_px]; the cell map is that map's mass per cell
    (``attribution.from_pixel_maps``), the textual map ``sum_r Phi[r, t]``
    (``text_aggregate="signed"``) or ``sum_r |Phi[r, t]|`` (``"abs"``, the reference's textual
    importance). The reference's game: ``multishap_regions(..., **REFERENCE_OPTIONS)`` with the
    default patches.

    ``image_players``: ``"patches"`` (default: 12 x 12 patches over the image, ViLT's 32 px on
    384 px, MultiSHAP's reference players; ``regions.patch_players``), ``"superpixels"``
    (``regions.superpixel_players`` of each rendered image, host side) or an int label map
    ``[B, H, W]`` / ``[H, W]`` at ``H = S * cell_px`` (-1 = never masked; regions
    ``0..max``, a sample without some region has a null player there). With
    ``patch_players(H, H, S)`` and ``baseline="empty"`` the game is the cell game of
    ``multishap`` and, for the same key, the maps are the same. Other arguments as
    ``interaction_matrix``; samples use key ``sample_keys(key, B)[i]``.
    """
    _check_option("text_aggregate", text_aggregate, AGGREGATES)
    _check_option("visual_aggregate", visual_aggregate, AGGREGATES)
    answer = _explained_answer(scenes, target=target, baseline=baseline, quantity=quantity,
                               probability=probability, answer=answer, n_samples=n_samples,
                               sampling=sampling)
    chunk = _budget_chunk(chunk, perturbations_per_eval)
    color = np.asarray(scenes.color, np.int32)
    shape = np.asarray(scenes.shape, np.int32)
    tokens = np.asarray(scenes.tokens, np.int32)
    B, S, L = tokens.shape[0], color.shape[-1], tokens.shape[-1]
    if B < 1:
        raise ValueError("no samples to explain (empty batch)")
    labels = RG.resolve_image_players(image_players, scenes, cell_px)
    n_reg = RG.n_regions(labels)
    _, n = game_size(scenes, n_tokens)
    fill = PT.baseline_fill(baseline, S, int(cell_px))
    answer = np.broadcast_to(np.asarray(-1 if answer is None else answer, np.int32), (B,))
    per_sample = [color, shape, tokens, sample_keys(key, B), labels, answer]
    per_sample, params, chunk = _shard_samples(per_sample, params, mesh, chunk)
    phi2 = _explain_regions(apply_fn, params, *per_sample, fill, cell_px=int(cell_px),
                            n_regions=n_reg, n_tokens=n, n_samples=int(n_samples), chunk=chunk,
                            probability=probability, quantity=quantity,
                            sampling=sampling)[:B]  # [B, R, n]
    visual_px = RG.spread_regions(_aggregate(phi2, 2, visual_aggregate), jnp.asarray(labels))
    textual = jnp.pad(_aggregate(phi2, 1, text_aggregate), ((0, 0), (0, L - n)))
    return from_pixel_maps(visual_px, textual, tokens != U.PAD_ID, S)


__all__ = ["MASK_DRAWS", "PERMUTATION_DRAWS", "multishap", "shapley_attribution",
           "multishap_with_shares", "interaction_matrix", "label_answer", "TARGETS",
           "AGGREGATES", "DEFAULT_OPTIONS", "REFERENCE_OPTIONS", "game_size", "sample_keys",
           "multishap_evaluations", "shapley_evaluations", "multishap_regions",
           "multishap_region_evaluations"]
