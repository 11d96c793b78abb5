"""MDETR-style grid VQA model in Flax Linen, with a pure ``apply(params, image, tokens)``.

Architecture (``ModelConfig`` sizes; S = grid size, C = S*S cells, L = MAX_TOKENS, d = d_model):

* Image encoder: the image (uint8 ``[B, H, W, 3]``, any multiple of S pixels; resized to
  ``S * cell_px``) is cut into one patch per grid cell, ``[B, C, cell_px*cell_px*3]``, embedded by
  a linear map plus learned row and column embeddings (a 2-D position embedding).
* Text encoder: word embedding of the question tokens plus learned positions, then a residual
  phrase block (``PhraseConv``: a width-``phrase_width`` 1-D convolution over the tokens and an
  MLP), so each token carries the words of its own phrase. PAD tokens are masked out of every
  attention, so "masking a token" = setting it to PAD.
* Fusion encoder: ``enc_layers`` pre-LN transformer blocks over ``[C image tokens; L text
  tokens]``. Attention logits get a learned per-head bias indexed by the pair type: for two
  cells, the sign pattern ``(sign dx, sign dy)`` of their offset (9 classes: the universe's
  half-plane relations), plus one class each for cell->text, text->cell and text->text.
  Each block also adds a question-steered half-plane pooling to the cell tokens
  (``HalfPlanePool``: per-cell gates summed over the 4 half-planes seen from every cell, the
  direction per gate picked from the question), which makes the universe's half-plane
  relations one linear step.
* Decoder: ``dec_layers`` blocks (self-attention, cross-attention to the fused memory, MLP) over
  ``n_queries`` object queries + 1 QA query. Object queries predict a box (cxcywh, sigmoid) and
  an "is grounded" class (2 logits) and are trained with Hungarian matching
  (``gridvqa_jax.models.matching``);
  the QA query predicts the answer type (count / exists / compare).
* Grounding head on the fused cell tokens: 4-way logits per cell (other, anchor, target of
  clause 0, target of clause 1).
* Answer by counting detections: with ``p_i^c`` the probability that cell i is a counted target
  of clause c, the count of clause c is Poisson-binomial,
  ``P(n_c = k) = [prod_i (1 - p_i^c + p_i^c z)]_{z^k}`` (computed exactly in log space), so
  ``P(exists) = 1 - P(n_0 = 0)`` and ``P(more) = P(n_0 > n_1) = sum_k P(n_0 = k) P(n_1 < k)``.
  The answer distribution over the unified answer space ``0..C, no, yes`` (``C + 3`` classes)
  mixes these by the predicted answer type:
  ``log P(k) = log t_count + log P(n_0 = k)``,
  ``P(yes) = t_exists P(n_0 > 0) + t_compare P(n_0 > n_1)``, ``P(no) = 1 - P(yes) - t_count``.
  ``answer_logprobs`` are these normalised log-probabilities.
"""

from __future__ import annotations

import dataclasses
import json
from typing import TypedDict

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from mmx_base.configs import config_from_dict
from mmx_base.grid import SquareGrid
from mmx_base.trees import n_params  # noqa: F401  (re-exported: mdetr.n_params)
from mmx_base.layers import Mlp, cell_patches, half_planes
from gridvqa_jax.world import universe as U

NEG = -1e4  # finite "log 0", keeps gradients of logaddexp finite
ANSWER_TYPES = ("count", "exists", "compare")


class ModelOutput(TypedDict):
    """What ``apply(params, image, tokens)`` of a GridMDETR returns (a plain dict, so it is a
    pytree; explainers read ``answer_logprobs``). B = batch, C = S*S cells, Q = object queries.

    Answers index the unified answer space ``0..C, no, yes`` (``answer_index`` /
    ``answer_string``); every log-probability is normalised over its last axis.
    """

    answer_logprobs: jax.Array  # float32 [B, C+3] log P(answer): counts 0..C, no, yes
    count_logprobs: jax.Array  # float32 [B, C+1] log P(n_0 = k) of the counted clause
    yesno_logprobs: jax.Array  # float32 [B, 2] log P(no), log P(yes) renormalised
    type_logits: jax.Array  # float32 [B, 3] answer type: count / exists / compare
    cell_logits: jax.Array  # float32 [B, C, 4] per cell: other / anchor / target0 / target1
    pred_boxes: jax.Array  # float32 [B, Q, 4] cxcywh in [0, 1]
    pred_logits: jax.Array  # float32 [B, Q, 2] per object query: no-object / grounded


@dataclasses.dataclass(frozen=True)
class ModelConfig(SquareGrid):
    """Architecture of the MDETR-style GridVQA model (hashable: a jit static argument).

    ``cell_px`` is the model's input resolution, independent of the rendering resolution
    ``universe.Spec.cell_px`` (images are brought to ``S * cell_px`` by
    ``layers.preprocess_image``).
    """

    grid_size: int = 5  # S: cells per side of the scene
    cell_px: int = 16  # model input pixels per cell (inputs are resized to S * cell_px)
    vocab_size: int = len(U.VOCAB)  # word vocabulary (universe.VOCAB)
    max_tokens: int = U.MAX_TOKENS  # L: question length (padded)
    d_model: int = 128  # width of every token
    n_heads: int = 8  # attention heads
    mlp_dim: int = 256  # hidden width of the transformer MLPs
    enc_layers: int = 5  # fusion-encoder blocks over [cells; tokens]
    dec_layers: int = 2  # decoder blocks over [object queries; QA query]
    n_queries: int = 0  # object queries; 0 = one per cell (S*S, always >= #grounded objects)
    pool_gates: int = 16  # gates per cell summed over each of the 4 half-planes; 0 = no pooling
    pool_select: bool = True  # also mix the 4 half-plane sums per gate with weights read from text
    phrase_width: int = 5  # window of the text phrase convolution (odd); 0 = no phrase block

    def __post_init__(self):
        if self.phrase_width < 0 or (self.phrase_width and self.phrase_width % 2 == 0):
            raise ValueError(f"phrase_width must be odd (or 0 for none), got {self.phrase_width}")
        if self.n_queries and self.n_queries < self.grid_size ** 2:
            # Hungarian matching pads the ground truth to one slot per cell: fewer queries than
            # slots could leave real objects unmatched
            raise ValueError(f"n_queries must be 0 (one per cell) or >= {self.grid_size ** 2} "
                             f"cells, got {self.n_queries}")

    @property
    def n_obj_queries(self) -> int:
        """Object queries of the decoder: ``n_queries``, or one per cell when 0."""
        return self.n_queries or self.n_cells

    @property
    def n_answers(self) -> int:
        """Unified answer space: counts 0..C, then "no", "yes"."""
        return self.n_cells + 3

    def to_json(self) -> str:
        """The config as canonical JSON (sorted keys)."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        return config_from_dict(cls, d, "model config")


def answer_index(answer, is_yesno, n_cells: int):
    """Scene answer -> unified answer class: the count, or C+1 for "no", C+2 for "yes"."""
    answer = jnp.asarray(answer, jnp.int32)
    return jnp.where(is_yesno, n_cells + 1 + answer, answer)


def answer_string(index: int, n_cells: int) -> str:
    """Unified answer class -> text ("3", "yes", "no")."""
    index = int(index)
    if index <= n_cells:
        return str(index)
    return "no" if index == n_cells + 1 else "yes"


def answer_type(qtype, is_yesno):
    """Answer type id (0 count, 1 exists, 2 compare) of scenes."""
    is_cmp = jnp.asarray(qtype) == U.QTYPES.index("CMP")
    return jnp.where(is_cmp, 2, jnp.where(is_yesno, 1, 0)).astype(jnp.int32)


def pair_types(grid_size: int, n_tokens: int) -> np.ndarray:
    """int32 [C+L, C+L] attention-bias class of each (query, key) pair (see module docstring)."""
    S, C = grid_size, grid_size * grid_size
    y, x = np.divmod(np.arange(C), S)
    sx = np.sign(x[None, :] - x[:, None]) + 1
    sy = np.sign(y[None, :] - y[:, None]) + 1
    t = np.full((C + n_tokens, C + n_tokens), 11, np.int32)
    t[:C, :C] = sx * 3 + sy
    t[:C, C:] = 9
    t[C:, :C] = 10
    return t


class Attention(nn.Module):
    """Multi-head attention ``softmax(q k^T / sqrt(d_h) + bias) v`` (Vaswani et al. 2017) with an
    additive logit bias, which carries both the key mask and the learned pair-type bias."""

    d_model: int
    n_heads: int

    @nn.compact
    def __call__(self, xq, xkv, bias):
        """xq [B, Nq, d], xkv [B, Nk, d], bias [B or 1, h or 1, Nq, Nk] (added to logits)."""
        h, dh = self.n_heads, self.d_model // self.n_heads
        q = nn.DenseGeneral((h, dh), name="q")(xq)
        k = nn.DenseGeneral((h, dh), name="k")(xkv)
        v = nn.DenseGeneral((h, dh), name="v")(xkv)
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(dh).astype(np.float32) + bias
        w = jax.nn.softmax(logits, axis=-1)
        out = jnp.einsum("bhqk,bkhd->bqhd", w, v)
        return nn.DenseGeneral(self.d_model, axis=(-2, -1), name="out")(out)


class HalfPlanePool(nn.Module):
    """Directional pooling over the grid cells, optionally steered by the question.

    ``g_i = sigmoid(W_g x_i)`` (``pool_gates`` = m gates per cell), ``m_{j,r} = sum_i H[r, j, i]
    g_i`` (how much of each gated property lies in half-plane r as seen from cell j,
    ``half_planes``). With ``pool_select``, the question picks a direction per gate,
    ``w = softmax_r(W_w mean_t(text_t))`` [m, 4], and ``s_{j,k} = sum_r w_{k,r} m_{j,r,k}``.
    Output ``W_o [m_{j,:}; s_j]`` (``d_model``), added to the cell tokens only.

    Why: the universe's relations are half-planes around an anchor. Attention with a learned
    relative-position bias expresses them only as a soft average that must first be sharpened,
    and the direction must then be multiplied in from the question; this block makes both one
    linear step.
    """

    cfg: ModelConfig

    @nn.compact
    def __call__(self, cells, text, text_mask):
        c = self.cfg
        m = c.pool_gates
        B, C = cells.shape[:2]
        # Gates start nearly closed and the output at zero, so the block starts as the identity
        # instead of adding sums of ~C/2 random gates to every cell.
        g = jax.nn.sigmoid(nn.Dense(m, bias_init=nn.initializers.constant(-3.0),
                                    name="gate")(cells))  # [B, C, m]
        H = jnp.asarray(half_planes(c.grid_size))
        pooled = jnp.einsum("rji,bim->bjrm", H, g)  # [B, C, 4, m]
        feats = [pooled.reshape(B, C, 4 * m)]
        if c.pool_select:
            tm = text_mask.astype(cells.dtype)[..., None]
            q = jnp.sum(text * tm, axis=1) / jnp.maximum(jnp.sum(tm, axis=1), 1.0)  # [B, d]
            w = jax.nn.softmax(nn.Dense(4 * m, name="select")(q).reshape(B, 4, m), axis=1)
            feats.append(jnp.sum(pooled * w[:, None], axis=2))  # [B, C, m]
        return nn.Dense(c.d_model, kernel_init=nn.initializers.zeros,
                        name="out")(jnp.concatenate(feats, axis=-1))


class PhraseConv(nn.Module):
    """Residual phrase block over the text tokens: ``t + W_o gelu(conv_w(m * LN(t)))``.

    text [B, L, d], mask [B, L] (False = PAD) -> [B, L, d]; ``conv_w`` is a 1-D convolution of
    width ``phrase_width`` with zero padding, so output t depends on the non-PAD tokens
    t-w//2 .. t+w//2 only; PAD tokens enter as zeros, so masking a word (setting it to PAD)
    removes it exactly, as in attention.

    Why: the pure universe's confusers share the colour of one anchor and the shape of another
    ("blue square" against "blue pentagon ... green square"), so a cell must match the
    *conjunction* of the words of one phrase. Attention from a cell to the text tokens sums
    per-word matches, which cannot tell the two apart, and the encoder has no relative text
    positions. With width 5, "left of green triangle" lies in one window: the gelu makes the
    conjunction of colour, shape and direction a feature of the phrase's tokens.
    """

    cfg: ModelConfig

    @nn.compact
    def __call__(self, text, mask):
        c = self.cfg
        x = nn.LayerNorm(name="norm")(text) * mask[..., None].astype(text.dtype)
        h = nn.Conv(c.mlp_dim, (c.phrase_width,), padding="SAME", name="conv")(x)
        # Zero output projection: the block starts as the identity.
        return text + nn.Dense(c.d_model, kernel_init=nn.initializers.zeros,
                               name="out")(nn.gelu(h))


class EncoderBlock(nn.Module):
    """Pre-LN fusion-encoder block over [cell tokens; text tokens] (MDETR's joint encoder):
    self-attention with a learned bias per pair class (``pair_types``: the relative position
    signs of two cells, cell-text, text-cell, text-text), then ``HalfPlanePool``
    added to the cell tokens, then an MLP. x [B, C+L, d], key_mask bool [B, C+L], types int
    [C+L, C+L] pair-type ids; returns [B, C+L, d]."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x, key_mask, types):
        c = self.cfg
        table = self.param("pair_bias", nn.initializers.zeros, (12, c.n_heads))
        bias = jnp.transpose(table[types], (2, 0, 1))[None]  # [1, h, N, N]
        bias = bias + jnp.where(key_mask, 0.0, NEG)[:, None, None, :]
        x = x + Attention(c.d_model, c.n_heads)(nn.LayerNorm()(x), nn.LayerNorm()(x), bias)
        if c.pool_gates:
            C = c.n_cells
            y = nn.LayerNorm(name="pool_norm")(x)
            pooled = HalfPlanePool(c, name="pool")(y[:, :C], y[:, C:], key_mask[:, C:])
            x = x.at[:, :C].add(pooled)
        return x + Mlp(c.mlp_dim, c.d_model)(nn.LayerNorm()(x))


class DecoderBlock(nn.Module):
    """Pre-LN DETR decoder block: self-attention over the queries, cross-attention to the
    encoder memory (masked keys excluded), MLP. q [B, Q, d], memory [B, N, d], mem_mask bool
    [B, N]; returns [B, Q, d]."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, q, memory, mem_mask):
        c = self.cfg
        y = nn.LayerNorm()(q)
        q = q + Attention(c.d_model, c.n_heads, name="self_attn")(y, y, jnp.zeros((1, 1, 1, 1)))
        bias = jnp.where(mem_mask, 0.0, NEG)[:, None, None, :]
        q = q + Attention(c.d_model, c.n_heads, name="cross_attn")(nn.LayerNorm()(q), memory, bias)
        return q + Mlp(c.mlp_dim, c.d_model)(nn.LayerNorm()(q))


def log_poisson_binomial(logp, log1mp):
    """log P(sum_i Bernoulli(p_i) = k) for k = 0..N: logp, log1mp [B, N] -> [B, N+1].

    The recurrence P_i(k) = P_{i-1}(k) (1 - p_i) + P_{i-1}(k-1) p_i in log space (exact).
    """
    B, N = logp.shape
    init = jnp.concatenate([jnp.zeros((B, 1)), jnp.full((B, N), NEG)], axis=1)

    def step(lp, inp):
        a, b = inp  # [B], [B]
        shifted = jnp.concatenate([jnp.full((B, 1), NEG), lp[:, :-1]], axis=1)
        new = jnp.logaddexp(lp + b[:, None], shifted + a[:, None])
        return jnp.maximum(new, NEG), None

    out, _ = jax.lax.scan(step, init, (logp.T, log1mp.T))
    return out


def log_greater(lp0, lp1):
    """(log P(n0 > n1), log P(n0 <= n1)) for independent counts with log-pmfs lp0, lp1 [B, K]."""
    B, K = lp1.shape
    cdf1 = jax.lax.cumlogsumexp(lp1, axis=1)  # log P(n1 <= k)
    lt = jnp.concatenate([jnp.full((B, 1), NEG), cdf1[:, :-1]], axis=1)  # log P(n1 < k)
    ge = jax.lax.cumlogsumexp(lp1, axis=1, reverse=True)  # log P(n1 >= k)
    return (jax.nn.logsumexp(lp0 + lt, axis=1), jax.nn.logsumexp(lp0 + ge, axis=1))


class GridMDETR(nn.Module):
    """The model: ``__call__(image, tokens) -> dict`` of outputs (see ``make_apply``), split into
    two stages that explainers can enter separately (``make_embed``, ``make_apply_embedded``):

    * ``embed(image, tokens) -> (cell_features, token_embeddings, pad_mask)``: the input layer,
      per cell and per token with no mixing. ``cell_features`` [B, C, d] = ``patch_embed`` of
      the cell's pixel patch (``W p_i + b``, after ``cell_patches``, before any position
      embedding); ``token_embeddings`` [B, L, d] = ``word_embed`` rows of the token ids (no
      position); ``pad_mask`` bool [B, L] is True where the token is PAD.
    * ``apply_embedded(cell_features, token_embeddings, pad_mask) -> outputs``: everything
      after, starting with the row/column and text position embeddings. Tokens where
      ``pad_mask`` is True are excluded from every attention, the phrase convolution and the
      pooling, so their embeddings are never read.

    ``__call__(image, tokens) = apply_embedded(*embed(image, tokens))``.
    """

    cfg: ModelConfig

    def setup(self):
        c = self.cfg
        S, d = c.grid_size, c.d_model
        # Parameter names and creation order are those of the checkpoints (and of the
        # initialisation: same key, same parameters).
        self.patch_embed = nn.Dense(d)
        self.row_embed = self.param("row_embed", nn.initializers.normal(0.02), (S, d))
        self.col_embed = self.param("col_embed", nn.initializers.normal(0.02), (S, d))
        self.word_embed = nn.Embed(c.vocab_size, d)
        self.text_pos = self.param("text_pos", nn.initializers.normal(0.02),
                                   (1, c.max_tokens, d))
        if c.phrase_width:
            self.phrase = PhraseConv(c)
        self.modality = self.param("modality", nn.initializers.normal(0.02), (2, d))
        for i in range(c.enc_layers):
            setattr(self, f"enc{i}", EncoderBlock(c))
        self.enc_norm = nn.LayerNorm()
        self.cell_head = Mlp(d, 4)
        self.queries = self.param("queries", nn.initializers.normal(0.02),
                                  (c.n_obj_queries + 1, d))
        for i in range(c.dec_layers):
            setattr(self, f"dec{i}", DecoderBlock(c))
        self.dec_norm = nn.LayerNorm()
        self.box_head = Mlp(d, 4)
        self.obj_head = nn.Dense(2)
        self.type_head = Mlp(d, 3)

    def embed(self, image, tokens):
        """image [B, H, W, 3], tokens int [B, L] -> (cell_features float32 [B, C, d],
        token_embeddings float32 [B, L, d], pad_mask bool [B, L]) (class docstring)."""
        c = self.cfg
        patches = cell_patches(image, c.grid_size, c.cell_px)  # [B, C, P*P*3]
        tokens = jnp.asarray(tokens, jnp.int32)
        return self.patch_embed(patches), self.word_embed(tokens), tokens == U.PAD_ID

    def apply_embedded(self, cell_features, token_embeddings, pad_mask):
        """cell_features [B, C, d], token_embeddings [B, L, d], pad_mask bool [B, L] ->
        ``ModelOutput``."""
        c = self.cfg
        S, C, d = c.grid_size, c.n_cells, c.d_model
        B, L = cell_features.shape[0], token_embeddings.shape[1]
        if L > c.max_tokens:
            raise ValueError(f"{L} token positions, the model has {c.max_tokens}")
        img = cell_features + (self.row_embed[:, None, :]
                               + self.col_embed[None, :, :]).reshape(1, C, d)
        txt = token_embeddings + self.text_pos[:, :L]
        text_mask = ~jnp.asarray(pad_mask, bool)
        if c.phrase_width:
            txt = self.phrase(txt, text_mask)
        mod = self.modality
        h = jnp.concatenate([img + mod[0][None, None], txt + mod[1][None, None]], axis=1)
        mask = jnp.concatenate([jnp.ones((B, C), bool), text_mask], axis=1)
        types = jnp.asarray(pair_types(S, L))
        for i in range(c.enc_layers):
            h = getattr(self, f"enc{i}")(h, mask, types)
        memory = self.enc_norm(h)

        cell_logits = self.cell_head(memory[:, :C])  # [B, C, 4]
        Q = c.n_obj_queries
        q = jnp.broadcast_to(self.queries[None], (B, Q + 1, d))
        for i in range(c.dec_layers):
            q = getattr(self, f"dec{i}")(q, memory, mask)
        q = self.dec_norm(q)
        obj, qa = q[:, :Q], q[:, Q]
        boxes = jax.nn.sigmoid(self.box_head(obj))
        obj_logits = self.obj_head(obj)
        type_logits = self.type_head(qa)

        # Answer by counting grounded targets (module docstring).
        ls = jax.nn.log_softmax(cell_logits, axis=-1)
        lp = ls[..., 2:]  # log p(target of clause c) [B, C, 2]
        others = jnp.stack([jnp.stack([ls[..., 0], ls[..., 1], ls[..., 3]], -1),
                            jnp.stack([ls[..., 0], ls[..., 1], ls[..., 2]], -1)], axis=-2)
        l1mp = jax.nn.logsumexp(others, axis=-1)  # log (1 - p) [B, C, 2]
        lp0 = log_poisson_binomial(lp[..., 0], l1mp[..., 0])
        lp1 = log_poisson_binomial(lp[..., 1], l1mp[..., 1])
        gt, le = log_greater(lp0, lp1)
        exists = jax.nn.logsumexp(lp0[:, 1:], axis=1)
        lt = jax.nn.log_softmax(type_logits, axis=-1)
        yes = jnp.logaddexp(lt[:, 1] + exists, lt[:, 2] + gt)
        no = jnp.logaddexp(lt[:, 1] + lp0[:, 0], lt[:, 2] + le)
        answer_logprobs = jnp.concatenate([lt[:, :1] + lp0, no[:, None], yes[:, None]], axis=1)
        return ModelOutput(**{
            "answer_logprobs": answer_logprobs,  # [B, C+3] log P(answer): counts 0..C, no, yes
            "count_logprobs": lp0,  # [B, C+1] log P(n_0 = k)
            "yesno_logprobs": jnp.stack([no, yes], 1) - jnp.logaddexp(no, yes)[:, None],  # [B, 2]
            "type_logits": type_logits,  # [B, 3] count / exists / compare
            "cell_logits": cell_logits,  # [B, C, 4] other / anchor / target0 / target1
            "pred_boxes": boxes,  # [B, Q, 4] cxcywh in [0, 1]
            "pred_logits": obj_logits,  # [B, Q, 2] no-object / grounded
        })

    def __call__(self, image, tokens):
        """image uint8 [B, H, W, 3], tokens int [B, L] -> outputs (``make_apply``)."""
        return self.apply_embedded(*self.embed(image, tokens))


def init_params(cfg: ModelConfig, key):
    """Parameters of a fresh model (float32 pytree)."""
    S = cfg.grid_size * cfg.cell_px
    image = jnp.zeros((1, S, S, 3), jnp.uint8)
    tokens = jnp.zeros((1, cfg.max_tokens), jnp.int32).at[:, 0].set(1)
    return GridMDETR(cfg).init(key, image, tokens)["params"]


def make_apply(cfg: ModelConfig):
    """The pure function ``apply(params, image, tokens) -> ModelOutput`` (not jitted; jit it at the
    call site). image uint8 [B, H, W, 3] (H, W multiples of S, or any size: resized), tokens
    int32 [B, L] (PAD = 0 is ignored)."""
    model = GridMDETR(cfg)

    def apply(params, image, tokens):
        return model.apply({"params": params}, image, tokens)

    return apply


def make_embed(cfg: ModelConfig):
    """The pure input layer ``embed(params, image, tokens) -> (cell_features [B, C, d],
    token_embeddings [B, L, d], pad_mask bool [B, L])`` (``GridMDETR``'s docstring): cell
    features are the patch embeddings ``W p_i + b`` of the S*S cell patches, token embeddings
    the word-embedding rows, pad_mask is True at PAD tokens. Not jitted."""
    model = GridMDETR(cfg)

    def embed(params, image, tokens):
        return model.apply({"params": params}, image, tokens, method=GridMDETR.embed)

    return embed


def make_apply_embedded(cfg: ModelConfig):
    """The pure rest of the model ``apply_embedded(params, cell_features, token_embeddings,
    pad_mask) -> outputs``, with ``apply_embedded(params, *embed(params, image, tokens)) ==
    apply(params, image, tokens)`` exactly. Differentiable in both feature arguments (gradients
    and Hessian-vector products for explainers). Not jitted."""
    model = GridMDETR(cfg)

    def apply_embedded(params, cell_features, token_embeddings, pad_mask):
        return model.apply({"params": params}, cell_features, token_embeddings, pad_mask,
                           method=GridMDETR.apply_embedded)

    return apply_embedded


__all__ = ["ModelConfig", "ModelOutput", "GridMDETR", "PhraseConv", "HalfPlanePool", "init_params", "make_apply",
           "make_embed", "make_apply_embedded",
           "answer_index", "answer_string", "answer_type", "ANSWER_TYPES", "log_poisson_binomial", "log_greater",
           "n_params"]
