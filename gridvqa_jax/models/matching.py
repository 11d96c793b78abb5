"""Set-prediction losses of DETR / MDETR: box geometry, Hungarian matching inside jit, losses.

Boxes are normalised ``(cx, cy, w, h)`` (the MDETR convention used by ``Scene.obj_box``).
Matching uses ``optax.assignment.hungarian_algorithm`` (pure JAX, so it runs under ``jit`` and
``vmap``); the matching cost is DETR's

    C[q, g] = -w_ce * p_q(grounded) + w_bbox * ||b_q - b_g||_1 - w_giou * GIoU(b_q, b_g),

and the loss on the matched pairs is ``w_bbox * L1 + w_giou * (1 - GIoU)`` plus a class
cross-entropy in which unmatched ("no object") queries are down-weighted by ``eos_coef``
(MDETR: ce 1, bbox 5, giou 2, no-object 0.1). Reference: Carion et al., "End-to-End Object
Detection with Transformers" (2020); Kamath et al., "MDETR" (2021).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax


@dataclasses.dataclass(frozen=True)
class MatchWeights:
    """MDETR / DETR set-loss weights, used both in the Hungarian matching cost and in the loss."""

    ce: float = 1.0  # weight of the "is grounded" class term (cost and loss)
    bbox: float = 5.0  # weight of the L1 box distance
    giou: float = 2.0  # weight of the generalised-IoU term
    eos_coef: float = 0.1  # class-loss weight of queries matched to no object


def box_cxcywh_to_xyxy(b):
    """[..., 4] (cx, cy, w, h) -> [..., 4] (x0, y0, x1, y1)."""
    cx, cy, w, h = b[..., 0], b[..., 1], b[..., 2], b[..., 3]
    return jnp.stack([cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h], axis=-1)


def pairwise_giou(a, b, eps: float = 1e-7):
    """Generalised IoU of every pair: a [N, 4], b [M, 4] in xyxy -> [N, M].

    GIoU = IoU - |E \\ (A ∪ B)| / |E| with E the smallest box enclosing A and B
    (Rezatofighi et al., 2019). Degenerate boxes are handled by ``eps``.
    """
    a, b = a[:, None, :], b[None, :, :]
    area_a = (a[..., 2] - a[..., 0]) * (a[..., 3] - a[..., 1])
    area_b = (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])
    iw = jnp.maximum(jnp.minimum(a[..., 2], b[..., 2]) - jnp.maximum(a[..., 0], b[..., 0]), 0.0)
    ih = jnp.maximum(jnp.minimum(a[..., 3], b[..., 3]) - jnp.maximum(a[..., 1], b[..., 1]), 0.0)
    inter = iw * ih
    union = area_a + area_b - inter
    iou = inter / (union + eps)
    ew = jnp.maximum(a[..., 2], b[..., 2]) - jnp.minimum(a[..., 0], b[..., 0])
    eh = jnp.maximum(a[..., 3], b[..., 3]) - jnp.minimum(a[..., 1], b[..., 1])
    enclose = ew * eh
    return iou - (enclose - union) / (enclose + eps)


def pairwise_l1(a, b):
    """Sum of absolute coordinate differences of every pair: a [N, 4], b [M, 4] -> [N, M]."""
    return jnp.sum(jnp.abs(a[:, None, :] - b[None, :, :]), axis=-1)


def match_cost(pred_boxes, pred_logits, gt_boxes, gt_mask, w: MatchWeights = MatchWeights()):
    """DETR matching cost for one sample: [Q, G].

    pred_boxes [Q, 4] cxcywh, pred_logits [Q, 2] (no-object, grounded), gt_boxes [G, 4] cxcywh,
    gt_mask bool [G]. Padding columns (``~gt_mask``) cost 0 for every query, so they absorb the
    spare queries without changing which queries take the real objects.
    """
    p_obj = jax.nn.softmax(pred_logits, axis=-1)[:, 1]
    giou = pairwise_giou(box_cxcywh_to_xyxy(pred_boxes), box_cxcywh_to_xyxy(gt_boxes))
    cost = (-w.ce * p_obj[:, None] + w.bbox * pairwise_l1(pred_boxes, gt_boxes)
            - w.giou * giou)
    return jnp.where(gt_mask[None, :], cost, 0.0)


def hungarian_match(cost):
    """Optimal assignment of a [Q, G] cost (Q >= G): ``col_of_row`` int32 [Q], -1 if unassigned.

    Wraps ``optax.assignment.hungarian_algorithm`` (jit/vmap-able); equals
    ``scipy.optimize.linear_sum_assignment`` up to ties.
    """
    rows, cols = optax.assignment.hungarian_algorithm(cost)
    out = jnp.full((cost.shape[0],), -1, jnp.int32)
    return out.at[rows].set(cols.astype(jnp.int32))


def detr_loss(pred_boxes, pred_logits, gt_boxes, gt_mask, w: MatchWeights = MatchWeights()):
    """Matched set loss of a batch; returns (loss [], parts dict of scalars).

    pred_boxes [B, Q, 4], pred_logits [B, Q, 2], gt_boxes [B, G, 4], gt_mask bool [B, G], Q >= G.
    Box terms are averaged over the number of real objects in the batch (DETR's ``num_boxes``),
    the class term is a weighted mean over queries.
    """
    cost = jax.vmap(lambda pb, pl, gb, gm: match_cost(pb, pl, gb, gm, w))(
        pred_boxes, pred_logits, gt_boxes, gt_mask)
    col = jax.vmap(hungarian_match)(jax.lax.stop_gradient(cost))  # [B, Q]
    safe = jnp.maximum(col, 0)
    matched_box = jnp.take_along_axis(gt_boxes, safe[..., None], axis=1)  # [B, Q, 4]
    is_obj = (col >= 0) & jnp.take_along_axis(gt_mask, safe, axis=1)  # [B, Q]
    n_obj = jnp.maximum(jnp.sum(gt_mask), 1).astype(jnp.float32)
    l1 = jnp.sum(jnp.abs(pred_boxes - matched_box), axis=-1)
    giou = jax.vmap(jax.vmap(
        lambda p, g: pairwise_giou(box_cxcywh_to_xyxy(p)[None], box_cxcywh_to_xyxy(g)[None])[0, 0]
    ))(pred_boxes, matched_box)
    loss_bbox = jnp.sum(jnp.where(is_obj, l1, 0.0)) / n_obj
    loss_giou = jnp.sum(jnp.where(is_obj, 1.0 - giou, 0.0)) / n_obj
    label = is_obj.astype(jnp.int32)
    ce = optax.softmax_cross_entropy_with_integer_labels(pred_logits, label)
    cw = jnp.where(is_obj, 1.0, w.eos_coef)
    loss_ce = jnp.sum(cw * ce) / jnp.sum(cw)
    loss = w.ce * loss_ce + w.bbox * loss_bbox + w.giou * loss_giou
    return loss, {"loss_ce": loss_ce, "loss_bbox": loss_bbox, "loss_giou": loss_giou}


__all__ = ["MatchWeights", "box_cxcywh_to_xyxy", "pairwise_giou", "pairwise_l1", "match_cost",
           "hungarian_match", "detr_loss"]
