"""Modality flow (modality-bias paper, section 3.2, eqs. 4-7; appendices 10.1-10.2, 11.1).

Where the vision-language detector's output token reads its evidence from, on the LAST
attention layer (the lvlm of ``bias_jax.detectors``: tokens ``[C image cells ; L words ; OT]``,
N = C + L + 1; before the last layer the output token sees only itself, so this layer's row of
OT carries every route from the inputs to the logit). On the generic lvlm
(``bias_jax.decoder_lvlm``, a causal decoder as MiniCPM-V's) the output token attends on every
layer, so the last layer's row is the paper's reading, not every route.

Attention saliency (eq. 4, following Wang et al. 2023, "Label words are anchors")::

    S = | sum_h A_h ⊙ dL/dA_h |                              [N, N] per sample

with ``A_h`` the last layer's attention probabilities of head h and ``L`` the detection loss
``BCE(sigmoid(logit), y)`` of the sample (``y`` its label, or the detector's own prediction
with ``target="prediction"``); ``dL/dA`` is ``jax.grad`` with respect to the attention
probabilities through the perturbation tap of ``bias_jax.hf``. Only the output token's row is
used: ``s_k = S(OT, k)``.

Aggregation (eqs. 5-6; Table 4): over the image tokens k < C and over the non-PAD text tokens
(PAD keys are masked, so their saliency is 0; OT's flow to itself counts for neither)::

    sum:  S_it = sum_k s_k            mean: S_it = S_it,sum / C   (S_tt / #words)
    max:  S_it = max_k s_k

Normalisation (eq. 7): ``S_it,norm = S_it / (S_it + S_tt)``, ``S_tt,norm = S_tt / (S_it +
S_tt)`` (both 0.5 when the two are 0). Score ``= S_it,norm - S_tt,norm`` in [-1, 1] (> 0 towards
the image); ``|score| < eps`` is Modality-balance (eps = 0.25, appendix 11.1), otherwise
Uni-image (> 0) or Uni-text (< 0).

LIME (Ribeiro et al. 2016; the paper's alternative saliency, Table 3): interpretable features
are the C image cells and the L token positions (PAD positions are no feature). Sample 0 keeps
everything; samples 1..n-1 switch every feature off with probability 1/2 (the lime package's
``randint(0, 2)``); a switched-off cell becomes zero pixels and a switched-off word the PAD
placeholder (the paper's absent inputs). Target: the detector's probability of the target class.
Weights are the lime package's exponential kernel on the cosine distance to the unperturbed
sample, ``pi(z) = sqrt(exp(-d(z, 1)^2 / width^2))`` with ``width = 0.25`` (``LimeImageExplainer``
defaults); the surrogate is the weighted ridge regression of ``sklearn.linear_model.Ridge(alpha=1,
fit_intercept=True)`` that lime fits, solved in closed form (``mmx_base.lime.lime_fit``). Saliency per
feature is ``|beta_k|``, aggregated and normalised as above.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from bias_jax import detectors as D
from bias_jax.data.batch import Batch
from bias_jax.data.text import PAD_ID
from bias_jax.views.common import ViewResult, label_from_score
from mmx_base import lime as LIME

AGGREGATIONS = ("sum", "mean", "max")
SALIENCIES = ("attention", "lime")
TARGETS = ("label", "prediction")
LIME_KERNEL_WIDTH = 0.25  # lime.lime_image.LimeImageExplainer default
LIME_ALPHA = 1.0  # sklearn Ridge(alpha=1.0), lime's default surrogate


# ----------------------------------------------------------------------------------------------
# Attention saliency (eq. 4).
# ----------------------------------------------------------------------------------------------
def _targets(logits, label, target: str):
    if target == "label":
        return (jnp.asarray(label) == 1).astype(jnp.float32)
    return (logits > 0).astype(jnp.float32)


def attention_saliency(cfg: D.DetectorConfig, params, image, tokens, label,
                       target: str = "label") -> jax.Array:
    """float32 [B, N]: ``S(OT, k) = |sum_h A_h(OT, k) dL/dA_h(OT, k)|`` on the last layer.

    ``L = sum_b BCE(sigmoid(logit_b), y_b)`` (samples are independent, so the gradient's row b
    is sample b's own); ``y`` = ``label == 1`` (real) or, with ``target="prediction"``, the
    detector's decision ``logit > 0``. Pure and jittable (``cfg`` static)."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; expected one of {TARGETS}")
    zeros = D.attention_perturbations(cfg, params, image, tokens)
    last = cfg.n_layers - 1  # D.attention_path: either lvlm architecture's layer names

    def loss(p_last):
        pert = D.with_layer_attention(cfg, zeros, last, p_last)
        logits, attn = D.apply_with_attentions(cfg, params, image, tokens, pert)
        y = _targets(jax.lax.stop_gradient(logits), label, target)
        bce = jnp.logaddexp(0.0, logits) - y * logits  # = -y log s - (1 - y) log(1 - s)
        return bce.sum(), attn[-1]

    grad, A = jax.grad(loss, has_aux=True)(D.layer_attention(cfg, zeros, last))  # [B, h, N, N]
    return jnp.abs((A * grad).sum(axis=1))[:, -1, :]


# ----------------------------------------------------------------------------------------------
# Aggregation and normalisation (eqs. 5-7; Table 4).
# ----------------------------------------------------------------------------------------------
def aggregate(s, n_cells: int, text_mask, how: str = "sum"):
    """Per-modality flow from per-key saliency.

    ``s`` float [B, K] with K >= C + L (image keys ``0..C-1``, text keys ``C..C+L-1``, any
    further keys, e.g. the output token, ignored); ``text_mask`` bool [B, L] (the non-PAD
    words). Returns ``(S_it [B], S_tt [B])``: sum, mean (over the C cells / the words; 0 with
    no word) or max (0 with no word) of the non-negative saliencies."""
    if how not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {how!r}; expected one of {AGGREGATIONS}")
    L = text_mask.shape[1]
    img = s[:, :n_cells]
    txt = jnp.where(text_mask, s[:, n_cells:n_cells + L], 0.0)
    if how == "sum":
        return img.sum(axis=1), txt.sum(axis=1)
    if how == "mean":
        n_words = text_mask.sum(axis=1)
        return img.mean(axis=1), txt.sum(axis=1) / jnp.maximum(n_words, 1)
    return img.max(axis=1), txt.max(axis=1)


def normalise(s_it, s_tt):
    """Eq. 7: ``(S_it / (S_it + S_tt), S_tt / (S_it + S_tt))``; (0.5, 0.5) where both are 0."""
    tot = s_it + s_tt
    safe = jnp.where(tot > 0, tot, 1.0)
    return jnp.where(tot > 0, s_it / safe, 0.5), jnp.where(tot > 0, s_tt / safe, 0.5)


# ----------------------------------------------------------------------------------------------
# LIME (Table 3).
# ----------------------------------------------------------------------------------------------
def lime_saliency(cfg: D.DetectorConfig, params, image, tokens, label, key, *,
                  n_samples: int = 256, target: str = "label") -> jax.Array:
    """float32 [B, C + L]: ``|beta|`` of LIME's weighted ridge surrogate (module doc) for each
    image cell and token position (0 on PAD positions). ``key`` draws the ``[B, n_samples,
    C + L]`` masks; ``n_samples`` forward passes per sample. Pixel ``(y, x)`` of an ``H x W``
    image belongs to cell ``(y S // H, x S // W)``."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; expected one of {TARGETS}")
    S, C = cfg.grid_size, cfg.n_cells
    B, L = tokens.shape
    H, W = image.shape[1:3]
    apply = D.make_apply(cfg)
    feat = jnp.concatenate([jnp.ones((B, C), bool), tokens != PAD_ID], axis=1)  # [B, F]
    z = jax.random.bernoulli(key, 0.5, (B, n_samples, C + L)).at[:, 0].set(True)
    z = z & feat[:, None]  # non-features stay constant (off), so the ridge gives them 0
    pixel_cell = ((np.arange(H)[:, None] * S // H) * S + np.arange(W)[None] * S // W)  # [H, W]

    def one(img, tok, zs, lab, ft):
        pix_on = zs[:, pixel_cell]  # [n, H, W]
        imgs = jnp.where(pix_on[..., None], img[None], jnp.zeros((), img.dtype))
        toks = jnp.where(zs[:, C:], tok[None], PAD_ID)
        logits = apply(params, imgs, toks)  # logits[0]: the unperturbed sample
        y = _targets(logits[0], lab, target)
        prob = jax.nn.sigmoid(jnp.where(y > 0.5, logits, -logits))  # P(target class)
        coef, _ = LIME.lime_fit(zs, prob, valid=ft, kernel_width=LIME_KERNEL_WIDTH,
                                alpha=LIME_ALPHA)
        return jnp.abs(coef) * ft

    return jax.vmap(one)(image, tokens, z, jnp.asarray(label), feat)


# ----------------------------------------------------------------------------------------------
# The view.
# ----------------------------------------------------------------------------------------------
@functools.partial(jax.jit, static_argnames=("cfg", "aggregation", "saliency", "n_lime",
                                             "target"))
def flow_scores(cfg: D.DetectorConfig, params, image, tokens, label, key, *,
                aggregation: str = "sum", saliency: str = "attention", n_lime: int = 256,
                target: str = "label"):
    """Jitted core of the view on one chunk: ``(score [B], S_it,norm [B], S_tt,norm [B],
    S_it [B], S_tt [B])`` (module doc; ``key`` is used by LIME only)."""
    if saliency == "attention":
        s = attention_saliency(cfg, params, image, tokens, label, target)
    elif saliency == "lime":
        s = lime_saliency(cfg, params, image, tokens, label, key, n_samples=n_lime,
                          target=target)
    else:
        raise ValueError(f"unknown saliency {saliency!r}; expected one of {SALIENCIES}")
    s_it, s_tt = aggregate(s, cfg.n_cells, tokens != PAD_ID, aggregation)
    it_n, tt_n = normalise(s_it, s_tt)
    return it_n - tt_n, it_n, tt_n, s_it, s_tt


def flow_view(detectors: dict, batch: Batch, *, eps: float = 0.25, aggregation: str = "sum",
              saliency: str = "attention", key=None, chunk: int = 256, n_lime: int = 256,
              target: str = "label") -> ViewResult:
    """The modality-flow view on ``batch`` with ``detectors["lvlm"]`` = (apply, params, cfg).

    ``score = S_it,norm - S_tt,norm`` [N] (module doc), ``label = label_from_score(score,
    eps)``; extras ``S_it``, ``S_tt`` (normalised, eq. 7) and ``S_it_raw``, ``S_tt_raw``
    (before eq. 7). Samples go through ``flow_scores`` in chunks of ``chunk`` (the last one
    padded, so nothing retraces); ``key`` (default ``jax.random.key(0)``) seeds LIME, chunk i
    with ``fold_in(key, i)``."""
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {aggregation!r}; expected one of {AGGREGATIONS}")
    if saliency not in SALIENCIES:
        raise ValueError(f"unknown saliency {saliency!r}; expected one of {SALIENCIES}")
    _, params, cfg = detectors["lvlm"]
    key = jax.random.key(0) if key is None else key
    n = batch.size
    image, tokens, label = (np.asarray(batch.image), np.asarray(batch.tokens),
                            np.asarray(batch.label))
    outs = []
    for i, start in enumerate(range(0, n, chunk)):
        idx = np.minimum(np.arange(start, start + chunk), n - 1)  # last chunk padded
        m = min(chunk, n - start)
        res = flow_scores(cfg, params, image[idx], tokens[idx], label[idx],
                          jax.random.fold_in(key, i), aggregation=aggregation,
                          saliency=saliency, n_lime=n_lime, target=target)
        outs.append([np.asarray(r)[:m] for r in res])
    cols = [np.concatenate(c).astype(np.float32) for c in zip(*outs)] if outs else \
        [np.zeros(0, np.float32)] * 5
    score, it_n, tt_n, s_it, s_tt = cols
    return ViewResult(label=np.asarray(label_from_score(score, eps), np.int32), score=score,
                      extras={"S_it": it_n, "S_tt": tt_n, "S_it_raw": s_it, "S_tt_raw": s_tt})


__all__ = ["AGGREGATIONS", "SALIENCIES", "TARGETS", "attention_saliency", "aggregate",
           "normalise", "lime_saliency", "flow_scores",
           "flow_view"]
