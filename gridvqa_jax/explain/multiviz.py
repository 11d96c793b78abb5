"""MultiViz's local analysis (Liang, Lyu, Chhablani, Jain, Deng, Wang, Morency &
Salakhutdinov, ICLR 2023) as one batched JAX estimator: unimodal importance by gradient x input
and cross-modal interactions by second-order gradients.

Explained quantity: ``f = log P(a | cells, tokens)``, the log-probability of the answer ``a``
the model predicts on the unperturbed input. With the model split into
``embed(params, image, tokens) -> (x [C, d] cell features, e [L, d] token embeddings, pad)``
and ``apply_embedded(params, x, e, pad)`` (``gridvqa_jax.models.mdetr.make_embed`` /
``make_apply_embedded``), scale every cell feature and token embedding by a scalar,
``g(alpha, beta) = f(alpha_c x_c, beta_t e_t)``, at ``alpha = beta = 1``:

* unimodal importance (gradient x input, summed over the feature dimension):
  ``u_c = dg/dalpha_c = sum_k x_ck df/dx_ck`` per cell, ``u_t = dg/dbeta_t = e_t . df/de_t``
  per token;
* interaction matrix (second-order gradient x input, MultiViz's ``get_double_grad``
  contracted with both inputs):
  ``I[c, t] = d2g / dalpha_c dbeta_t = x_c^T (d2f / dx_c de_t) e_t``,
  computed as C Hessian-vector products, ``jax.jvp`` of ``jax.grad_beta g`` along each cell
  direction ``alpha = 1 + s e_c`` (forward-over-reverse, exact, no finite differences);
* aggregation to maps: ``visual_c = sum_t |I[c, t]|``, ``textual_t = sum_c |I[c, t]|``
  (each cell's total absolute interaction with the question, and each token's with the image;
  absolute values so opposite-signed interactions do not cancel).

``multiviz`` returns the interaction maps by default (the cross-modal part is what MultiViz adds
over unimodal saliency; ``kind="unimodal"`` gives ``u``). PAD tokens are never read by the
model, so their rows are 0.

This embedding path is MultiViz's method: ``get_double_grad`` in the reference
(pliang279/MultiViz, ``analysis/gradientbased.py``) takes ``torch.autograd.grad`` of the target
with respect to one input with ``create_graph=True`` and differentiates the chosen entries
(``atargets``) again with respect to the other input, i.e. rows of ``d2f / dx de``; here every
cell's row is taken and contracted with both inputs (as ``get_saliency_map(...,
multiplyorig=True)`` multiplies the first-order gradient by the input), computed as exact
Hessian-vector products. Its baseline is the zero embedding (``alpha_c = 0``), as for any
gradient x input on features. ``reproduction.table1`` runs this path: it passes the embed split
of each regime's model (``embed_split``).

Reference granularity (``granularity="pixels"``): the reference's saliency is per pixel of the
image it is given; the same second-order gradient x input taken at each pixel instead of each
cell feature, ``I[p, t] = (image - b)_p . d u_t / d image_p`` (``multiviz_maps``), scored at
pixel level without aggregation (Table 1's ``multiviz_ref`` row, measured from mid-gray).

Without the embed split (only ``apply_fn``, the *pixel fallback*): the unimodal visual part is
pixel gradient x (input - baseline) aggregated to cells
(``perturb.pixel_grads_to_cells(g * (image - baseline), absolute=False)``, the first-order
change from the baseline image to the input, cell by cell); ``pixel_baseline="empty"``
(default) is the grid of empty white tiles (``render.tile_table(cell_px)[0]``, what the closed
world renders for an absent object and what ``perturb.mask_cells`` masks with), so an empty cell
gets exactly 0; ``"black"`` is the zero image (plain gradient x input, as the reference's
``multiplyorig`` on raw pixels; empty white cells then get attribution). Tokens are discrete, so
the textual part and the interaction use a token's presence instead of its embedding scale:
``u_t = f(x) - f(x without t)`` (PAD), ``I[c, t] = u_c(x) - u_c(x without t)`` (the finite
difference of the cell's gradient x (input - baseline) between the token present and absent).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from gridvqa_jax.explain import perturb as PT
from gridvqa_jax.explain.attribution import Attribution, from_maps, from_pixel_maps
from gridvqa_jax.models import mdetr as M
from gridvqa_jax.world import render as R
from gridvqa_jax.world import universe as U


class MultiVizMaps(NamedTuple):
    """MultiViz's output for a batch of B samples."""

    unimodal: Attribution  # gradient x input: visual [B, S, S], textual [B, L] (+ visual_px)
    interaction: Attribution  # sum |I| per cell [B, S, S] and per token [B, L] (+ visual_px)
    matrix: jax.Array  # float32 [B, S*S, L]: I[c, t] (cells row-major, y*S + x); pixels:
    # [B, H*W, L]
    answer: jax.Array  # int32 [B]: the explained answer


def embed_split(config):
    """``(embed_fn, apply_embedded_fn)`` of a GridMDETR: ``config`` is its
    ``gridvqa_jax.models.mdetr.ModelConfig``, or a ``mmx_base.model.Model`` whose ``.config``
    is one (e.g. what ``training.export.load_model`` / ``load_reference_model`` return).
    ``apply_embedded_fn(params, *embed_fn(params, image, tokens))`` equals the model's
    ``apply(params, image, tokens)``."""
    cfg = getattr(config, "config", config)
    if not isinstance(cfg, M.ModelConfig):
        raise TypeError(f"embed_split needs a GridMDETR ModelConfig (or a Model holding one), "
                        f"got {type(cfg).__name__}")
    return _embed_split(cfg)


@functools.lru_cache(maxsize=None)
def _embed_split(cfg):
    # one pair of function objects per architecture: they are static arguments of the jitted
    # estimator, so repeated calls (Table 1 batches, budget sweeps) reuse one compilation
    return M.make_embed(cfg), M.make_apply_embedded(cfg)


def _logprob(out, answer):
    return jnp.take(out["answer_logprobs"][0], answer)


def _embedded_one(embed_fn, apply_embedded_fn, params, image, tokens, chunk):
    x, e, pad = embed_fn(params, image[None], tokens[None])
    x, e, pad = x[0], e[0], pad[0]
    answer = jnp.argmax(apply_embedded_fn(params, x[None], e[None], pad[None])
                        ["answer_logprobs"][0]).astype(jnp.int32)
    C, L = x.shape[0], e.shape[0]

    def g(alpha, beta):
        out = apply_embedded_fn(params, (alpha[:, None] * x)[None], (beta[:, None] * e)[None],
                                pad[None])
        return _logprob(out, answer)

    ones_c, ones_l = jnp.ones(C, x.dtype), jnp.ones(L, e.dtype)
    u_c, u_t = jax.grad(g, argnums=(0, 1))(ones_c, ones_l)
    grad_beta = lambda a: jax.grad(g, argnums=1)(a, ones_l)

    def hvp(c_ids):  # rows I[c, :] for a chunk of cells
        tangents = jax.nn.one_hot(c_ids, C, dtype=x.dtype)
        return jax.vmap(lambda v: jax.jvp(grad_beta, (ones_c,), (v,))[1])(tangents)

    n_chunks = -(-C // chunk)
    ids = jnp.minimum(jnp.arange(n_chunks * chunk), C - 1).reshape(n_chunks, chunk)
    I = jax.lax.map(hvp, ids).reshape(n_chunks * chunk, L)[:C]
    return u_c, u_t, I, answer


def _pixel_one(apply_fn, params, image, tokens, baseline, S, chunk):
    image = jnp.asarray(image, jnp.float32)
    delta = image - baseline  # the input measured from the baseline image
    L = tokens.shape[0]
    f0 = apply_fn(params, image[None], tokens[None])["answer_logprobs"][0]
    answer = jnp.argmax(f0).astype(jnp.int32)

    def f(img, toks):
        return _logprob(apply_fn(params, img[None], toks[None]), answer)

    def cell_gxi(toks):
        g = jax.grad(f)(image, toks)
        return PT.pixel_grads_to_cells(g * delta, S, absolute=False).reshape(-1)

    def without(t_ids):  # (f, u_c) with token t masked, for a chunk of positions
        toks = PT.mask_tokens(tokens[None], jax.nn.one_hot(t_ids, L, dtype=bool))
        return jax.vmap(lambda tk: (f(image, tk), cell_gxi(tk)))(toks)

    n_chunks = -(-L // chunk)
    ids = jnp.minimum(jnp.arange(n_chunks * chunk), L - 1).reshape(n_chunks, chunk)
    f_wo, u_wo = jax.lax.map(without, ids)
    f_wo, u_wo = f_wo.reshape(-1)[:L], u_wo.reshape(n_chunks * chunk, -1)[:L]
    u_c = cell_gxi(tokens)
    valid = tokens != U.PAD_ID
    u_t = jnp.where(valid, f0[answer] - f_wo, 0.0)
    I = jnp.where(valid[None, :], u_c[:, None] - u_wo.T, 0.0)
    return u_c, u_t, I, answer


def _embedded_pixel_one(embed_fn, apply_embedded_fn, params, image, tokens, baseline, chunk):
    """Per-pixel maps on the embedding path: ``u_t(img) = e_t . df/de_t`` at the image ``img``,
    ``I[t, p] = sum_ch (img - baseline)[p, ch] d u_t / d img[p, ch]`` (one reverse pass of
    ``u`` per token, chunked), ``u_p = sum_ch (img - baseline)[p, ch] df / d img[p, ch]``."""
    image = jnp.asarray(image, jnp.float32)
    delta = image - baseline  # the input measured from the baseline image
    L = tokens.shape[0]
    x0, e0, pad = embed_fn(params, image[None], tokens[None])
    answer = jnp.argmax(apply_embedded_fn(params, x0, e0, pad)["answer_logprobs"][0]
                        ).astype(jnp.int32)

    def g(img, beta):
        x, e, pad_ = embed_fn(params, img[None], tokens[None])
        return _logprob(apply_embedded_fn(params, x, beta[None, :, None] * e, pad_), answer)

    ones_l = jnp.ones(L, e0.dtype)
    g_img, u_t = jax.grad(g, argnums=(0, 1))(image, ones_l)
    _, vjp = jax.vjp(lambda img: jax.grad(g, argnums=1)(img, ones_l), image)

    def rows(t_ids):  # d u_t / d img for a chunk of token positions
        return jax.vmap(lambda v: vjp(v)[0])(jax.nn.one_hot(t_ids, L, dtype=u_t.dtype))

    n_chunks = -(-L // chunk)
    ids = jnp.minimum(jnp.arange(n_chunks * chunk), L - 1).reshape(n_chunks, chunk)
    J = jax.lax.map(rows, ids).reshape((n_chunks * chunk,) + image.shape)[:L]
    I = (J * delta[None]).sum(-1)  # [L, H, W]
    return (g_img * delta).sum(-1), u_t, I.reshape(L, -1).T, answer


GRANULARITIES = ("cells", "pixels")
PIXEL_BASELINES = ("empty", "gray", "black")


def _baseline_image(pixel_baseline: str, S: int, cell_px: int):
    return PT.baseline_fill(pixel_baseline, S, cell_px, jnp.float32)


@functools.partial(jax.jit, static_argnames=("apply_fn", "embed_fn", "apply_embedded_fn",
                                             "cell_px", "chunk", "pixel_baseline",
                                             "granularity"))
def _multiviz_jit(apply_fn, embed_fn, apply_embedded_fn, params, color, shape, tokens, *,
                  cell_px, chunk, pixel_baseline="empty", granularity="cells"):
    images = jax.vmap(lambda c, s: R.render(c, s, cell_px))(color, shape)
    tokens = jnp.asarray(tokens, jnp.int32)
    S = color.shape[-1]
    if granularity == "pixels":
        one = functools.partial(_embedded_pixel_one, embed_fn, apply_embedded_fn, params,
                                baseline=_baseline_image(pixel_baseline, S, cell_px),
                                chunk=min(chunk, tokens.shape[-1]))
    elif embed_fn is not None:
        one = functools.partial(_embedded_one, embed_fn, apply_embedded_fn, params,
                                chunk=min(chunk, S * S))
    else:
        one = functools.partial(_pixel_one, apply_fn, params,
                                baseline=_baseline_image(pixel_baseline, S, cell_px), S=S,
                                chunk=min(chunk, tokens.shape[-1]))
    return jax.vmap(one)(images, tokens)


def multiviz_maps(apply_fn, params, scenes, key=None, *, cell_px: int = 16, embed_fn=None,
                  apply_embedded_fn=None, chunk: int = 8, mesh=None,
                  pixel_baseline: str = "empty", granularity: str = "cells") -> MultiVizMaps:
    """MultiViz's unimodal and interaction maps for a batch (module docstring).

    apply_fn(params, image, tokens) -> {"answer_logprobs": [B, A]} (used for the answer and
    the fallback); ``embed_fn`` / ``apply_embedded_fn``: the model's embed split (e.g.
    ``embed_split(model.config)``), both or neither: with them the embedding-path HVP
    (MultiViz's method, what Table 1 runs), without them the pixel fallback; scenes: a
    ``Scene`` batch rendered at ``cell_px``; ``chunk``: Hessian-vector products (or masked
    tokens in the fallback) per vmapped step; ``mesh``: a ``('data',)`` mesh over samples;
    ``pixel_baseline``: the fallback's reference image, ``"empty"`` (default: the empty white
    tiles), ``"gray"`` (128) or ``"black"`` (zeros); unused on the embedding path at cells.

    ``granularity="pixels"`` (embedding path only; ``ValueError`` without the split): the maps
    per pixel, as the reference's image saliency (``grad * sample`` on the model's pixel input):
    ``u_t`` as above, ``I[p, t] = sum_ch (image - b)[p, ch] d u_t / d image[p, ch]`` with ``b``
    the ``pixel_baseline`` image (``"gray"`` is where ViLT's mean-0.5 / std-0.5 pixels are 0,
    the zero of the reference's ``grad * sample``), ``u_p`` the pixel gradient x (image - b);
    ``interaction.visual_px[b, y, x] = sum_t |I[p, t]|``, ``textual_t = sum_p |I[p, t]|``,
    cell maps = pixel mass per cell (``from_pixel_maps``), ``matrix`` float32 [B, H*W, L]
    (pixels row-major). One reverse pass per token position (``chunk`` per step).
    Deterministic (``key`` is accepted for the common signature and unused).
    """
    if (embed_fn is None) != (apply_embedded_fn is None):
        raise ValueError("pass both embed_fn and apply_embedded_fn, or neither")
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {', '.join(GRANULARITIES)}, got "
                         f"{granularity!r}")
    if granularity == "pixels" and embed_fn is None:
        raise ValueError("granularity='pixels' needs the model's embed split (embed_fn, "
                         "apply_embedded_fn): per-pixel maps are the embedding-path HVP")
    if pixel_baseline not in PIXEL_BASELINES:
        raise ValueError(f"pixel_baseline must be one of {', '.join(PIXEL_BASELINES)}, got "
                         f"{pixel_baseline!r}")
    color, shape = np.asarray(scenes.color), np.asarray(scenes.shape)
    tokens = np.asarray(scenes.tokens, np.int32)
    B = color.shape[0]
    n_dev = 1 if mesh is None else mesh.devices.size
    Bp = -(-B // n_dev) * n_dev
    idx = np.arange(Bp) % B
    args = (color[idx], shape[idx], tokens[idx])
    if mesh is not None:
        # Auto (propagated) sharding: the per-sample gathers need no sharding annotations.
        mesh = jax.sharding.Mesh(mesh.devices, mesh.axis_names)
        params = jax.device_put(params, NamedSharding(mesh, P()))
        args = jax.device_put(args, NamedSharding(mesh, P("data")))
    u_c, u_t, I, answer = _multiviz_jit(apply_fn, embed_fn, apply_embedded_fn, params, *args,
                                        cell_px=int(cell_px), chunk=int(chunk),
                                        pixel_baseline=pixel_baseline,
                                        granularity=granularity)
    u_c, u_t, I, answer = (a[:B] for a in (u_c, u_t, I, answer))
    S = color.shape[-1]
    valid = jnp.asarray(tokens != U.PAD_ID)
    I = jnp.where(valid[:, None, :], I, 0.0)
    absI = jnp.abs(I)
    if granularity == "pixels":
        H = S * int(cell_px)
        return MultiVizMaps(
            unimodal=from_pixel_maps(u_c, u_t, valid, S),
            interaction=from_pixel_maps(absI.sum(-1).reshape(B, H, H), absI.sum(-2), valid, S),
            matrix=I, answer=answer)
    return MultiVizMaps(
        unimodal=from_maps(u_c.reshape(B, S, S), u_t, valid),
        interaction=from_maps(absI.sum(-1).reshape(B, S, S), absI.sum(-2), valid),
        matrix=I, answer=answer)


def multiviz(apply_fn, params, scenes, key=None, *, cell_px: int = 16, embed_fn=None,
             apply_embedded_fn=None, kind: str = "interaction", chunk: int = 8,
             mesh=None, pixel_baseline: str = "empty", granularity: str = "cells") -> Attribution:
    """MultiViz's attribution: ``kind="interaction"`` (default) the aggregated second-order
    interaction maps, or ``"unimodal"`` gradient x input. Arguments as ``multiviz_maps``:
    Table 1 passes the embed split (the embedding-path HVP); without it the pixel fallback
    runs, measured from ``pixel_baseline`` (default the empty tiles); ``granularity="pixels"``:
    per-pixel maps (``visual_px``), Table 1's ``multiviz_ref`` row (with ``"gray"``)."""
    if kind not in ("interaction", "unimodal"):
        raise ValueError(f"kind must be 'interaction' or 'unimodal', got {kind!r}")
    out = multiviz_maps(apply_fn, params, scenes, key, cell_px=cell_px, embed_fn=embed_fn,
                        apply_embedded_fn=apply_embedded_fn, chunk=chunk, mesh=mesh,
                        pixel_baseline=pixel_baseline, granularity=granularity)
    return out.interaction if kind == "interaction" else out.unimodal


__all__ = ["MultiVizMaps", "GRANULARITIES", "PIXEL_BASELINES", "embed_split", "multiviz_maps", "multiviz"]
