"""A generic vision-language detector shaped like MiniCPM-V's language model: a causal
(decoder) transformer over ``[C image tokens ; L text tokens ; 1 output token]``
(``DetectorConfig(kind="lvlm", arch="generic")``; the designed lvlm is
``bias_jax.detectors.LVLMDetector``).

    DecoderLVLM(cfg).apply({"params": p}, image uint8 [B, H, W, 3], tokens int32 [B, L])
        -> logits float32 [B]          (logit = log P(real) - log P(fake))

Why this shape
--------------
MiniCPM-V (Yao et al. 2024) feeds the image's visual tokens first, then the prompt and claim,
to a Qwen2 decoder, and the answer is read from the last position. Here likewise:

* Tokens (N = C + L + 1, the layout ``bias_jax.views.flow`` reads). Image token ``i`` (cell
  ``i = y * S + x``): ``Mlp(patch_i) + row_y + col_x + type_0``, a generic patch embedding
  (``mmx_base.layers.cell_patches``; no feature made for the generator's manipulations, no
  vision encoder). Text token ``l``: ``Embed(tokens_l)`` (or ``MiniLMTokens`` of the frozen
  MiniLM states, as ``cfg.text_encoder`` says; ``bias_jax.text_vectors``) ``+ pos_l + type_1``.
  Output token: a learned constant ``out + type_2``; it carries no input.
  MiniCPM-V's image tokens come from a bidirectional ViT (SigLIP) and a resampler; here there
  is none, so image token ``i`` sees only cells ``<= i`` (the text and output tokens see them
  all): the image side is weaker than MiniCPM-V's, and every image-text comparison happens in
  the text and output tokens, as in the decoder.
* Attention mask: causal (query ``q`` attends to keys ``k <= q``) and PAD keys masked. So image
  tokens see only earlier image tokens, never the text (MiniCPM-V's decoder is causal over
  the whole sequence); text tokens see the image and earlier words; the output token (last)
  sees everything and nothing sees it.
* Nothing is added to any token after the embedding (unlike the designed lvlm, whose image
  tokens receive text-conditioned gate and relation features): the only cross-token operation
  is attention, and the logit ``Dense(RMSNorm(x_OT))`` is read from the output token's final
  state (one Dense = the difference of the "real" and "fake" rows of an LM head). Since the
  output token's input is a constant, every route from the inputs to the logit passes through
  the output token's attention rows (of any layer, not only the last: the flow view's
  last-layer saliency no longer sees every route, as in a real decoder).
* Blocks are pre-norm, as Qwen2's (not BERT's post-norm): ``x += Attn(RMSNorm(x))``,
  ``x += SwiGLU(RMSNorm(x))`` with ``SwiGLU(x) = W_d (silu(W_g x) * W_u x)`` (hidden width
  ``cfg.mlp_dim``), ``cfg.n_heads`` heads of ``d / h``. Positions are learned absolute
  embeddings, not Qwen2's rotary ones (N is fixed and small); no dropout.

Why own blocks rather than ``bias_jax.hf.BertLayer`` with a causal bias: that layer is HF's
post-norm BERT layer (add & LayerNorm after attention and MLP), further from the Qwen2 decoder
the issue asks to mimic, and its HF self-attention refuses ``causal``. The blocks here keep
the same two hooks as ``bias_jax.hf``'s attention, so every consumer of the designed lvlm's
attention works unchanged:

* the probabilities ``A = softmax(Q K^T / sqrt(d_h) + bias)`` ``[B, h, N, N]`` of layer ``i``
  go through ``Module.perturb("attention", A)`` in the submodule ``block_{i}/attn``: applying
  the model with a zero ``"perturbations"`` collection and differentiating with respect to it
  gives ``d logit / d A`` (``attention_path(i)`` is the leaf's key path in that tree);
* an ``"attention_override"`` collection (same paths, ``[B|1, h|1, N, N]``, NaN = keep)
  replaces chosen probabilities by fixed values after the perturbation (``jnp.where``: no
  gradient through replaced entries), e.g. to pin the output token's rows to itself.

Every layer's ``A`` is sown as ``intermediates/attentions`` ``[n_layers, B, h, N, N]``, as the
designed lvlm does (``detectors.apply_with_attentions``). ``cfg.n_gates`` is unused (no gates:
this detector trains from labels only, without the grounding loss).
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from bias_jax import hf
from bias_jax.lvlm_sequence import lvlm_sequence


def attention_path(layer: int) -> tuple[str, ...]:
    """Key path of layer ``layer``'s attention probabilities in the ``"perturbations"`` and
    ``"attention_override"`` trees of ``DecoderLVLM``."""
    return (f"block_{layer}", "attn", "attention")


def causal_bias(n_tokens: int) -> np.ndarray:
    """float32 [N, N] additive bias: 0 where key ``k <= q`` (query row ``q``), ``hf.NEG_INF``
    above the diagonal."""
    return np.triu(np.full((n_tokens, n_tokens), hf.NEG_INF, np.float32), k=1)


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention with the perturbation / override hooks (module doc):
    ``(x [B, N, d], bias [B, 1|h, N, N]) -> (out [B, N, d], A [B, h, N, N])``."""

    n_heads: int

    @nn.compact
    def __call__(self, x, bias):
        B, N, d = x.shape
        h = self.n_heads
        q = nn.Dense(d, name="query")(x).reshape(B, N, h, d // h)
        k = nn.Dense(d, name="key")(x).reshape(B, N, h, d // h)
        v = nn.Dense(d, name="value")(x).reshape(B, N, h, d // h)
        w = nn.dot_product_attention_weights(q, k, bias=bias.astype(q.dtype))  # [B, h, N, N]
        w = self.perturb("attention", w)
        if self.has_variable("attention_override", "attention"):
            fixed = self.get_variable("attention_override", "attention")
            w = jnp.where(jnp.isnan(fixed), w, jnp.nan_to_num(fixed).astype(w.dtype))
        out = jnp.einsum("bhqk,bkhd->bqhd", w, v).reshape(B, N, d)
        return nn.Dense(d, use_bias=False, name="out")(out), w


class SwiGLU(nn.Module):
    """Qwen2's MLP: ``W_d (silu(W_g x) * W_u x)``, [..., d] -> [..., d], hidden ``dim``."""

    dim: int

    @nn.compact
    def __call__(self, x):
        g = nn.Dense(self.dim, use_bias=False, name="gate")(x)
        u = nn.Dense(self.dim, use_bias=False, name="up")(x)
        return nn.Dense(x.shape[-1], use_bias=False, name="down")(nn.silu(g) * u)


class DecoderBlock(nn.Module):
    """Pre-norm decoder block: ``x += Attn(RMSNorm(x)); x += SwiGLU(RMSNorm(x))``;
    ``(x [B, N, d], bias) -> (x', A [B, h, N, N])``."""

    n_heads: int
    mlp_dim: int

    @nn.compact
    def __call__(self, x, bias):
        a, w = CausalSelfAttention(self.n_heads, name="attn")(
            nn.RMSNorm(epsilon=1e-6, name="attn_norm")(x), bias)
        x = x + a
        x = x + SwiGLU(self.mlp_dim, name="mlp")(nn.RMSNorm(epsilon=1e-6, name="mlp_norm")(x))
        return x, w


class DecoderLVLM(nn.Module):
    """The generic (causal decoder) lvlm; ``cfg`` a ``detectors.DetectorConfig`` (module doc).
    ``(image uint8 [B, H, W, 3], tokens int32 [B, L]) -> logits float32 [B]``."""

    cfg: object

    # Where the flow view / attention_grads find layer i's attention in the perturbation tree.
    attention_path = staticmethod(attention_path)

    @nn.compact
    def __call__(self, image, tokens):
        c = self.cfg
        C, L = c.n_cells, tokens.shape[1]
        x, key_mask, _ = lvlm_sequence(self, c, image, tokens,
                                       embed_init=nn.initializers.normal(0.02))  # [B, N, d]
        bias = hf.key_mask_bias(key_mask) + jnp.asarray(causal_bias(C + L + 1))[None, None]
        attns = []
        for layer in range(c.n_layers):
            x, a = DecoderBlock(c.n_heads, c.mlp_dim, name=f"block_{layer}")(x, bias)
            attns.append(a)
        o = nn.RMSNorm(epsilon=1e-6, name="final_norm")(x[:, -1])
        logits = nn.Dense(1, name="head")(o)[:, 0]
        self.sow("intermediates", "attentions", jnp.stack(attns), reduce_fn=lambda _, v: v)
        return logits


__all__ = ["DecoderLVLM", "DecoderBlock", "CausalSelfAttention", "SwiGLU", "attention_path",
           "causal_bias"]
