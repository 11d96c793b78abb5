"""Generic detector architectures (``DetectorConfig.arch == "generic"``) for the image, text and
joint kinds: small pre-LN transformers that assume nothing about how the closed worlds make
their fakes, trained from the real / fake label only (``bias_jax.train``: no grounding loss).

Every module keeps the detectors' contract

    module(cfg).apply({"params": p}, image uint8 [B, H, W, 3], tokens int32 [B, L]) -> logits [B]

(``logit = log P(real) - log P(fake)``), ``cfg`` a ``bias_jax.detectors.DetectorConfig``
(``d_model`` d, ``mlp_dim``, ``n_layers``, ``n_heads``, ``grid_size`` S, ``cell_px`` P,
``max_tokens`` L, ``vocab_size``, ``text_encoder``). They import nothing from
``bias_jax.detectors`` (which registers them in ``GENERIC_MODULES``).

Tokens
------
* image token ``i`` (``i = y * S + x``): ``Dense(patch_i) + row_y + col_x``, ``patch_i`` the
  cell's ``P * P * 3`` pixels in [-0.5, 0.5] (``mmx_base.layers.cell_patches``: the ViT patching
  with the patch size set to one cell), ``row`` / ``col`` learned 2-D position vectors;
* text token ``l``: ``Embed(tokens_l) + pos_l`` (``learned``), or ``MiniLMTokens`` of the frozen
  MiniLM states (``minilm``, ``bias_jax.text_vectors``), plus a learned position;
* a learned CLS token first; the logit is ``Dense(LN(h_CLS))`` after the last block.

Architectures (``cfg.kind``)
----------------------------
* ``image`` (``GenericImageDetector``): a ViT over ``[CLS ; C image tokens]``; never reads
  ``tokens``.
* ``text`` (``GenericTextDetector``): a transformer encoder over ``[CLS ; L text tokens]``,
  PAD keys masked; never reads ``image``.
* ``joint`` (``GenericJointDetector``): a fusion transformer over ``[CLS ; C image tokens ;
  L text tokens]`` with a learned type vector per segment and PAD keys masked; every token
  attends to every unmasked token of both modalities.

Each block is ``x += MHA(LN(x), mask)``, ``x += MLP(LN(x))`` (``n_heads`` heads, GELU MLP of
width ``mlp_dim``), ``n_layers`` of them: no max pooling, no per-cell anomaly channel, no gates
or relations built for the generator (the designed architectures of ``bias_jax.detectors``).
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from bias_jax.data.text import PAD_ID
from bias_jax.text_vectors import MiniLMTokens, text_states
from mmx_base.layers import cell_patches

_INIT = nn.initializers.normal(0.02)


class Block(nn.Module):
    """Pre-LN transformer block: ``x [B, N, d]``, ``key_mask bool [B, N]`` (False = a key no
    query attends to) -> ``[B, N, d]``."""

    d_model: int
    mlp_dim: int
    n_heads: int

    @nn.compact
    def __call__(self, x, key_mask):
        mask = key_mask[:, None, None, :]  # [B, 1, 1, N]: broadcast over heads and queries
        h = nn.MultiHeadDotProductAttention(num_heads=self.n_heads, qkv_features=self.d_model,
                                            deterministic=True, name="attn")(
            nn.LayerNorm(name="ln1")(x), mask=mask)
        x = x + h
        h = nn.Dense(self.mlp_dim, name="fc1")(nn.LayerNorm(name="ln2")(x))
        return x + nn.Dense(self.d_model, name="fc2")(nn.gelu(h))


class Encoder(nn.Module):
    """``[CLS ; x]``, ``n_layers`` ``Block``s, then ``Dense(LN(h_CLS))``: ``x [B, N, d]``,
    ``key_mask bool [B, N]`` -> logits ``[B]``."""

    cfg: object  # DetectorConfig

    @nn.compact
    def __call__(self, x, key_mask):
        c = self.cfg
        B, _, d = x.shape
        cls = jnp.broadcast_to(self.param("cls", _INIT, (1, 1, d)), (B, 1, d))
        x = jnp.concatenate([cls, x], axis=1)
        key_mask = jnp.concatenate([jnp.ones((B, 1), bool), key_mask], axis=1)
        for i in range(c.n_layers):
            x = Block(c.d_model, c.mlp_dim, c.n_heads, name=f"block_{i}")(x, key_mask)
        return nn.Dense(1, name="head")(nn.LayerNorm(name="ln_out")(x[:, 0]))[:, 0]


class ImageTokens(nn.Module):
    """image uint8 [B, H, W, 3] -> image tokens [B, C, d]: ``Dense(patch_i) + row_y + col_x``
    (cell ``i = y * S + x``; factorised learned 2-D positions, as ViTs with 2-D embeddings)."""

    cfg: object

    @nn.compact
    def __call__(self, image):
        c = self.cfg
        S = c.grid_size
        patches = cell_patches(image, S, c.cell_px)  # [B, C, P*P*3]
        y, x = np.divmod(np.arange(S * S), S)
        row = self.param("row", _INIT, (S, c.d_model))
        col = self.param("col", _INIT, (S, c.d_model))
        return nn.Dense(c.d_model, name="patch")(patches) + (row[y] + col[x])[None]


class TextTokens(nn.Module):
    """tokens int32 [B, L] -> text tokens [B, L, d]: ``Embed(tokens)`` (or ``MiniLMTokens`` of
    the MiniLM states) ``+ pos``."""

    cfg: object

    @nn.compact
    def __call__(self, tokens):
        c = self.cfg
        if c.text_encoder == "minilm":
            x = MiniLMTokens(c.d_model, name="minilm")(tokens, text_states(c, tokens))
        else:
            x = nn.Embed(c.vocab_size, c.d_model, embedding_init=_INIT, name="embed")(tokens)
        pos = self.param("pos", _INIT, (c.max_tokens, c.d_model))
        return x + pos[None, : tokens.shape[1]]


class GenericImageDetector(nn.Module):
    """ViT over the image's cell patches with a CLS read-out; ``tokens`` unused (module doc)."""

    cfg: object

    @nn.compact
    def __call__(self, image, tokens):
        del tokens  # image-only: the claim never enters
        x = ImageTokens(self.cfg, name="image")(image)
        return Encoder(self.cfg, name="encoder")(x, jnp.ones(x.shape[:2], bool))


class GenericTextDetector(nn.Module):
    """Transformer encoder over the words with a CLS read-out; ``image`` unused (module doc)."""

    cfg: object

    @nn.compact
    def __call__(self, image, tokens):
        del image  # text-only: the pixels never enter
        x = TextTokens(self.cfg, name="text")(tokens)
        return Encoder(self.cfg, name="encoder")(x, tokens != PAD_ID)


class GenericJointDetector(nn.Module):
    """Fusion transformer over ``[CLS ; image tokens ; text tokens]`` (module doc)."""

    cfg: object

    @nn.compact
    def __call__(self, image, tokens):
        c = self.cfg
        types = self.param("type", _INIT, (2, c.d_model))
        img = ImageTokens(c, name="image")(image) + types[None, None, 0]
        txt = TextTokens(c, name="text")(tokens) + types[None, None, 1]
        x = jnp.concatenate([img, txt], axis=1)
        mask = jnp.concatenate([jnp.ones(img.shape[:2], bool), tokens != PAD_ID], axis=1)
        return Encoder(c, name="encoder")(x, mask)


MODULES = {"image": GenericImageDetector, "text": GenericTextDetector,
           "joint": GenericJointDetector}

__all__ = ["Block", "Encoder", "ImageTokens", "TextTokens", "GenericImageDetector",
           "GenericTextDetector", "GenericJointDetector", "MODULES"]
