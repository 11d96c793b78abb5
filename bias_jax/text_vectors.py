"""Per-token text vectors shared by every text-reading detector architecture (``detectors``
and the generic ones): the MiniLM route of ``DetectorConfig.text_encoder == "minilm"``.

``text_states(cfg, tokens)`` gives the frozen MiniLM's contextual states (None for the learned
encoder) and ``MiniLMTokens`` projects them to the detector width, PAD positions taking a learned
vector. ``cfg`` is any config with a ``text_encoder`` field (a ``detectors.DetectorConfig``).
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from bias_jax.data.text import PAD_ID


class MiniLMTokens(nn.Module):
    """MiniLM states -> per-token vectors: ``x_l = Dense(h_l)`` where ``tokens_l != PAD``, a
    learned ``pad`` vector elsewhere. ``tokens`` [B, L], ``states`` [B, L, 384]
    (``minilm.token_states``) -> [B, L, features]. PAD positions take no MiniLM state (theirs
    attend to the text), so a masked word leaves no trace at its position either."""

    features: int

    @nn.compact
    def __call__(self, tokens, states):
        pad = self.param("pad", nn.initializers.normal(0.02), (self.features,))
        x = nn.Dense(self.features, name="proj")(states)
        return jnp.where((tokens != PAD_ID)[..., None], x, pad[None, None])


def text_states(cfg, tokens):
    """``minilm.token_states(tokens)`` [B, L, 384] for a MiniLM detector, None otherwise."""
    if cfg.text_encoder != "minilm":
        return None
    from bias_jax import minilm  # optional dependency: loaded only by MiniLM detectors

    return minilm.token_states(tokens)
