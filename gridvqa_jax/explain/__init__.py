"""Multimodal explainers of a model ``apply(params, image, tokens) -> outputs``, and their scores.

Local explainers, all ``explainer(apply_fn, params, scenes, key, *, cell_px=16, **budget) ->
Attribution`` (visual ``[B, S, S]`` per cell, textual ``[B, L]`` per token):

- ``multishap``: cell x token Shapley interaction index (MultiSHAP), or first-order Shapley
  values with ``order=1``; ``multishap_with_shares`` adds the MM-SHAP modality shares;
- ``dime``: DIME's unimodal-contribution / multimodal-interaction maps (LIME on a cross-sample
  tensor);
- ``multiviz``: MultiViz's gradient x input and second-order interaction maps.

Reference granularity: ``multishap_regions`` / ``dime_regions`` play image regions
(``patch_players``: ViLT's 12 x 12 patches; ``superpixel_players``: quickshift) and return
per-pixel maps (``Attribution.visual_px``). Controls: ``random_attribution``,
``objects_attribution`` (the floor), ``oracle_attribution`` (the ceiling).

``FeatureMask`` groups the players of a game (captum's ``feature_mask``); ``score_explainer``
scores any local explainer with GridVQA-X's Table 1 protocol (``scoring``). Global synergy:
``emap`` (EMAP), ``intershap`` (InterSHAP), ``pid`` (partial information decomposition) and
``cross_table`` (the model's answers on every image x question pair of a set). Game-theory
primitives: ``exact_shapley``, ``permutation_shapley``, ``exact_sii``, ``sii_matrix``.
"""

from gridvqa_jax.explain.attribution import Attribution, concat, from_maps, from_pixel_maps
from gridvqa_jax.explain.controls import (objects_attribution, oracle_attribution,
                                          random_attribution)
from gridvqa_jax.explain.dime import DimeMaps, dime, dime_maps, dime_regions
from gridvqa_jax.explain.global_synergy import (bootstrap_scores, cross_table, emap_scores,
                                                intershap_scores, set_statistic)
from gridvqa_jax.explain.interactions import exact_sii, sii_matrix
from gridvqa_jax.explain.multishap import (interaction_matrix, multishap, multishap_regions,
                                           multishap_with_shares, shapley_attribution)
from gridvqa_jax.explain.multiviz import MultiVizMaps, multiviz, multiviz_maps
from gridvqa_jax.explain.perturb import (FeatureMask, answer_logprob, make_value_fn,
                                         mask_cells, mask_tokens, modality_players, players)
from gridvqa_jax.explain.pid import pid
from gridvqa_jax.explain.regions import mask_regions, patch_players, superpixel_players
from gridvqa_jax.explain.scoring import (EXPLAINERS, BudgetError, per_sample_scores,
                                         resolve_explainer, score_explainer, summarise_scores)
from gridvqa_jax.explain.shapley import exact_shapley, modality_shares, permutation_shapley
from gridvqa_jax.explain.synergy import emap, intershap, intershap_global

__all__ = [
    "Attribution", "from_maps", "from_pixel_maps", "concat",
    "multishap", "multishap_with_shares", "shapley_attribution", "interaction_matrix",
    "multishap_regions", "dime", "dime_maps", "dime_regions", "DimeMaps", "multiviz", "multiviz_maps", "MultiVizMaps",
    "random_attribution", "objects_attribution", "oracle_attribution",
    "patch_players", "superpixel_players", "mask_regions",
    "FeatureMask", "players", "modality_players", "mask_cells", "mask_tokens", "answer_logprob",
    "make_value_fn",
    "score_explainer", "per_sample_scores", "summarise_scores", "resolve_explainer",
    "EXPLAINERS", "BudgetError",
    "emap", "intershap", "intershap_global", "pid", "cross_table", "emap_scores",
    "intershap_scores", "set_statistic", "bootstrap_scores",
    "exact_shapley", "permutation_shapley", "modality_shares", "exact_sii", "sii_matrix",
]
