"""The ``Scene`` pytree: one GridVQA-X sample as fixed-shape arrays (the data contract).

Every producer (the sampler, the official-format reader, the native reader) returns Scenes and
every consumer (renderer, verifier, models, explainers) reads them; batches carry a leading axis.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from gridvqa_jax.world import universe as U


@flax.struct.dataclass
class Scene:
    """One sample. Shapes for grid S (C = S*S cells, K = MAX_ANCHORS_PER_CLAUSE, L = MAX_TOKENS).

    Grids are indexed [y, x].
    """

    bucket: jax.Array  # int32 []: index into universe.BUCKETS
    depth: jax.Array  # int32 []: 1..3
    qtype: jax.Array  # int32 []: index into universe.QTYPES
    form: jax.Array  # int32 []: 0 count, 1 yes/no (CMP: 0, answered yes/no)
    valid: jax.Array  # bool []: the constructive sampler found a geometry (always, in practice)
    # Scene.
    color: jax.Array  # int32 [S, S]: colour id per cell, -1 empty
    shape: jax.Array  # int32 [S, S]: shape id per cell, -1 empty
    role: jax.Array  # int32 [S, S]: EMPTY/ANCHOR/TARGET/CONFUSER/DISTRACTOR
    clause: jax.Array  # int32 [S, S]: clause of an anchor/target/confuser, -1 otherwise
    # Object list (row-major cell order, padded to C entries).
    obj_valid: jax.Array  # bool [C]
    obj_xy: jax.Array  # int32 [C, 2]: (x, y) cell of each object
    obj_color: jax.Array  # int32 [C]
    obj_shape: jax.Array  # int32 [C]
    obj_role: jax.Array  # int32 [C]
    obj_box: jax.Array  # float32 [C, 4]: normalised (cx, cy, w, h), MDETR convention
    # Question structure (what the template names).
    target_color: jax.Array  # int32 [2]: per clause, -1 when the question does not name it
    target_shape: jax.Array  # int32 [2]
    anchor_active: jax.Array  # bool [2, K]
    anchor_color: jax.Array  # int32 [2, K]: -1 when unnamed (SO) or inactive
    anchor_shape: jax.Array  # int32 [2, K]
    anchor_xy: jax.Array  # int32 [2, K, 2]
    direction: jax.Array  # int32 [2, K]: index into universe.DIRECTIONS
    # Text.
    tokens: jax.Array  # int32 [L]: ids into universe.VOCAB, PAD_ID after the question
    token_role: jax.Array  # int32 [L]: FUNCTION/TARGET_ATTR/ANCHOR_ATTR/RELATION
    token_anchor: jax.Array  # int32 [L]: global anchor index clause*K + i of anchor words, else -1
    n_tokens: jax.Array  # int32 []
    # Answer.
    is_yesno: jax.Array  # bool []
    answer: jax.Array  # int32 []: the count (form 0), or 1 = yes / 0 = no
    count: jax.Array  # int32 [2]: targets counted per clause
    n_lookalike: jax.Array  # int32 [2]: target look-alikes per clause anywhere in the scene
    # Ground truth (the unique explanation A ∪ T) and regions.
    gt_cells: jax.Array  # bool [S, S]: anchor and counted-target cells
    gt_tokens: jax.Array  # bool [L]: target-attribute, anchor-attribute and relation tokens
    v_target: jax.Array  # bool [2, S, S]: V_target per clause (all False for an absent clause)
    confuser_region: jax.Array  # bool [2, K, S, S]: C_k per clause and anchor

    @property
    def gt_boxes(self):
        """float32 [C, 4] boxes of ground-truth objects (others zero) with mask bool [C]."""
        is_gt = self.obj_valid & ((self.obj_role == U.ANCHOR) | (self.obj_role == U.TARGET))
        return jnp.where(is_gt[..., None], self.obj_box, 0.0), is_gt


TOKEN_FIELDS = ("tokens", "token_role", "token_anchor", "gt_tokens")  # the per-token [L] fields


def trim_tokens(scenes: Scene, length: int | None = None, multiple: int = 4) -> Scene:
    """A Scene (batch) with its per-token fields (``TOKEN_FIELDS``) cut to the first
    ``length`` positions, [..., L] -> [..., length].

    ``length`` None: the longest question's ``n_tokens`` rounded up to a ``multiple`` (so
    batches of similar questions share one compiled shape). Questions are PAD only after their
    last word, so nothing but trailing PAD is dropped; models that ignore PAD (GridMDETR, which
    accepts any L <= ``max_tokens``) give the same outputs on fewer positions, at a cost that
    falls with the sequence length. ``ValueError`` if ``length`` would cut a word.
    """
    n = int(np.max(np.asarray(scenes.n_tokens))) if np.size(scenes.n_tokens) else 0
    L = int(np.shape(scenes.tokens)[-1])
    if length is None:
        length = min(L, max(multiple, -(-n // multiple) * multiple))
    if not n <= length <= L:
        raise ValueError(f"cannot trim questions of up to {n} tokens to {length} positions "
                         f"(they have {L})")
    return scenes.replace(**{f: getattr(scenes, f)[..., :length] for f in TOKEN_FIELDS})
