"""The input sequence of both LVLM architectures (``detectors.LVLMDetector``, the designed one,
and ``decoder_lvlm.DecoderLVLM``, the generic causal decoder)::

    x = [cells_i + type_0 ; words_l + type_1 ; out + type_2]        [B, N, d], N = C + L + 1

with ``cells_i = Mlp(cell_patches(image)_i) + row_y + col_x`` (cell i = y * S + x),
``words_l = Embed(tokens_l)`` (or ``MiniLMTokens`` of the frozen MiniLM states when
``cfg.text_encoder == "minilm"``) ``+ pos_l``, and ``out`` a learned constant (the output token
carries no input). ``key_mask`` [B, N] is False on PAD text positions only.

``lvlm_sequence`` is called inside a module's ``nn.compact`` ``__call__`` and creates its
parameters and submodules in that module (names ``patch_embed``, ``row``, ``col``,
``word_minilm`` / ``word_embed``, ``pos``, ``out_token``, ``type``), so both architectures keep
one parameter layout for their inputs.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from bias_jax.data.text import PAD_ID
from bias_jax.text_vectors import MiniLMTokens, text_states
from mmx_base.layers import Mlp, cell_patches


def lvlm_sequence(mod: nn.Module, cfg, image, tokens, embed_init=None):
    """``(x float32 [B, C + L + 1, d], key_mask bool [B, C + L + 1], cells float32 [B, C, d])``
    (``cells`` the image tokens before their type vector) of ``image`` uint8
    [B, H, W, 3] and ``tokens`` int32 [B, L] (module docstring), with ``mod``'s parameters;
    ``cfg`` a ``detectors.DetectorConfig``. ``embed_init``: the word embedding's initializer
    (None: ``nn.Embed``'s default)."""
    S, C, L, d = cfg.grid_size, cfg.n_cells, tokens.shape[1], cfg.d_model
    B = tokens.shape[0]
    init = nn.initializers.normal(0.02)
    cells = Mlp(cfg.mlp_dim, d, name="patch_embed")(cell_patches(image, S, cfg.cell_px))
    yx = np.divmod(np.arange(C), S)
    rows, cols = mod.param("row", init, (S, d)), mod.param("col", init, (S, d))
    cells = cells + (rows[yx[0]] + cols[yx[1]])[None]
    states = text_states(cfg, tokens)
    if states is not None:
        words = MiniLMTokens(d, name="word_minilm")(tokens, states)
    else:
        kw = {} if embed_init is None else {"embedding_init": embed_init}
        words = nn.Embed(cfg.vocab_size, d, name="word_embed", **kw)(tokens)
    words = words + mod.param("pos", init, (cfg.max_tokens, d))[None, :L]
    out = jnp.broadcast_to(mod.param("out_token", init, (1, 1, d)), (B, 1, d))
    types = mod.param("type", init, (3, d))
    x = jnp.concatenate([cells + types[None, None, 0], words + types[None, None, 1],
                         out + types[None, None, 2]], axis=1)
    key_mask = jnp.concatenate([jnp.ones((B, C), bool), tokens != PAD_ID,
                                jnp.ones((B, 1), bool)], axis=1)
    return x, key_mask, cells
