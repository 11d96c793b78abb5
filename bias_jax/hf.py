"""The one adapter between ``bias_jax`` and HuggingFace Transformers (Flax, transformers 4.57).

Everything HF-specific lives here: building a ``BertConfig``, a BERT encoder layer that
exposes its attention maps as differentiable quantities, and the ``FlaxBertModel`` used by the
optional pretrained text encoder (``bias_jax.minilm``). Nothing else in ``bias_jax`` imports
``transformers``.

Attention layer (``BertLayer``)
-------------------------------
``transformers``' ``FlaxBertLayer`` (self-attention -> add & LayerNorm -> MLP -> add &
LayerNorm), with its parameters laid out exactly as in HF, and one change to the
self-attention core (``_HookedSelfAttention``):

* the mask argument is an additive float bias ``[B, h or 1, N, N]`` instead of HF's boolean key
  mask, so callers can add a structural bias (the key mask is ``key_mask_bias``);
* the attention probabilities ``A = softmax(Q K^T / sqrt(d_h) + bias)`` (``[B, h, N, N]``) go
  through ``Module.perturb("attention", A)``: applying the model with a zero
  ``"perturbations"`` collection and differentiating with respect to it gives
  ``dy / dA`` for every layer, the quantity attention-saliency (gradient x attention) needs.
  Without that collection the layer is HF's computation, unchanged;
* an optional ``"attention_override"`` collection (``{"attention": [B|1, h|1, N, N]}`` per
  layer, NaN = keep) replaces chosen probabilities by fixed values after the perturbation, so
  a probe can pin, e.g., the output token's row to attend only to itself and check that the
  output no longer depends on the inputs (no route around attention).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax.linen.attention import dot_product_attention_weights
from transformers import BertConfig
from transformers.models.bert import modeling_flax_bert as _hf_bert

NEG_INF = -1e9  # additive bias of a masked key (finite: an all-masked row stays a softmax)


def bert_config(*, hidden_size: int, num_layers: int, num_heads: int, intermediate_size: int,
                vocab_size: int = 2, max_positions: int = 64, dropout: float = 0.0) -> BertConfig:
    """A ``BertConfig`` for a small encoder built from scratch (no pretrained weights)."""
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size {hidden_size} must be a multiple of num_heads {num_heads}")
    return BertConfig(vocab_size=vocab_size, hidden_size=hidden_size,
                      num_hidden_layers=num_layers, num_attention_heads=num_heads,
                      intermediate_size=intermediate_size, hidden_act="gelu",
                      hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
                      max_position_embeddings=max_positions, type_vocab_size=3)


def key_mask_bias(key_mask) -> jax.Array:
    """bool [B, N] (True = attend to this key) -> float32 additive bias [B, 1, 1, N]."""
    return jnp.where(jnp.asarray(key_mask), 0.0, NEG_INF)[:, None, None, :].astype(jnp.float32)


class _HookedSelfAttention(_hf_bert.FlaxBertSelfAttention):
    """HF's self-attention (same parameters) with an additive bias and a perturbation hook."""

    def __call__(self, hidden_states, attention_mask, layer_head_mask, key_value_states=None,
                 init_cache=False, deterministic=True, output_attentions=False):
        if key_value_states is not None or self.causal or init_cache:
            raise NotImplementedError("bias_jax.hf: only bidirectional self-attention")
        q = self._split_heads(self.query(hidden_states))  # [B, N, h, d_h]
        k = self._split_heads(self.key(hidden_states))
        v = self._split_heads(self.value(hidden_states))
        bias = None if attention_mask is None else attention_mask.astype(self.dtype)
        dropout_rng = None
        if not deterministic and self.config.attention_probs_dropout_prob > 0.0:
            dropout_rng = self.make_rng("dropout")
        w = dot_product_attention_weights(
            q, k, bias=bias, dropout_rng=dropout_rng,
            dropout_rate=self.config.attention_probs_dropout_prob, broadcast_dropout=True,
            deterministic=deterministic, dtype=self.dtype, precision=None)  # [B, h, N, N]
        w = self.perturb("attention", w)
        if self.has_variable("attention_override", "attention"):
            # Structural probes: fixed probabilities wherever the override is not NaN (jnp.where,
            # so no gradient reaches the replaced entries).
            fixed = self.get_variable("attention_override", "attention")
            w = jnp.where(jnp.isnan(fixed), w, jnp.nan_to_num(fixed).astype(w.dtype))
        if layer_head_mask is not None:
            w = jnp.einsum("...hqk,h->...hqk", w, layer_head_mask)
        out = jnp.einsum("...hqk,...khd->...qhd", w, v)
        out = out.reshape(out.shape[:2] + (-1,))
        return (out, w) if output_attentions else (out,)


class _HookedAttention(_hf_bert.FlaxBertAttention):
    def setup(self):
        self.self = _HookedSelfAttention(self.config, causal=self.causal, dtype=self.dtype)
        self.output = _hf_bert.FlaxBertSelfOutput(self.config, dtype=self.dtype)


class _HookedLayer(_hf_bert.FlaxBertLayer):
    def setup(self):
        self.attention = _HookedAttention(self.config, causal=False, dtype=self.dtype)
        self.intermediate = _hf_bert.FlaxBertIntermediate(self.config, dtype=self.dtype)
        self.output = _hf_bert.FlaxBertOutput(self.config, dtype=self.dtype)


class BertLayer(nn.Module):
    """One HF BERT encoder layer: ``(x [B, N, d], bias [B, h|1, N, N]) -> (x', A [B, h, N, N])``.

    ``A`` are the attention probabilities (rows sum to 1 over the keys); gradients with
    respect to them are available through the ``"perturbations"`` collection (module doc).
    """

    config: BertConfig

    @nn.compact
    def __call__(self, x, bias, deterministic: bool = True):
        out = _HookedLayer(self.config, name="layer")(
            x, bias, layer_head_mask=None, deterministic=deterministic, output_attentions=True)
        return out[0], out[1]


# ----------------------------------------------------------------------------------------------
# Pretrained BERT-family text encoders (FlaxBertModel).
# ----------------------------------------------------------------------------------------------
def bert_config_from_json(doc: dict) -> BertConfig:
    """``BertConfig`` from the dict of a ``config.json``."""
    return BertConfig(**doc)


def flax_bert_model(config: BertConfig):
    """A ``FlaxBertModel`` (no pooling layer) for ``config``, created without parameters:
    they are passed to every call (``bert_hidden_states``), as a pure function."""
    return _hf_bert.FlaxBertModel(config, add_pooling_layer=False, _do_init=False)


def flax_bert_param_shapes(config: BertConfig) -> dict:
    """Shapes of a ``FlaxBertModel``'s parameters, as a nested dict of ShapeDtypeStruct."""
    module = _hf_bert.FlaxBertModule(config, add_pooling_layer=False)
    ids = jnp.zeros((1, 4), jnp.int32)
    shapes = jax.eval_shape(lambda: module.init(jax.random.key(0), ids, ids, ids, ids, None))
    return shapes["params"]


def bert_hidden_states(model, params, input_ids, attention_mask) -> jax.Array:
    """float32 [B, L, d]: ``model``'s last hidden state (token_type_ids all 0, no dropout)."""
    input_ids = jnp.asarray(input_ids, jnp.int32)
    mask = jnp.asarray(attention_mask, jnp.int32)
    out = model(input_ids, attention_mask=mask, token_type_ids=jnp.zeros_like(input_ids),
                params=params, train=False)
    return out.last_hidden_state


def bert_params_from_state_dict(state: dict, config: BertConfig) -> dict:
    """Flax ``FlaxBertModel`` parameters (no pooler) from a PyTorch-named BERT state dict of
    numpy arrays (e.g. ``safetensors.numpy.load_file``), without torch.

    Names map as HF's own PyTorch -> Flax conversion does: ``a.b.weight`` of a Linear ->
    ``a/b/kernel`` transposed; of an Embedding -> ``embedding``; LayerNorm ``weight`` ->
    ``scale``; ``encoder.layer.i`` -> ``encoder/layer/i``; an optional ``bert.`` prefix is
    dropped; ``position_ids`` buffers and the pooler are skipped. Raises ValueError naming any
    missing, unexpected or mis-shaped tensor.
    """
    shapes = flax_bert_param_shapes(config)
    flat_shapes = {tuple(k.key for k in path): leaf.shape
                   for path, leaf in jax.tree_util.tree_flatten_with_path(shapes)[0]}
    out, unexpected = {}, []
    for name, value in state.items():
        name = name.removeprefix("bert.")
        parts = name.split(".")
        if parts[-1] == "position_ids" or parts[0] == "pooler":
            continue
        *mod, leaf = parts
        if "LayerNorm" in mod[-1:]:
            key = (*mod, {"weight": "scale", "bias": "bias"}.get(leaf, leaf))
        elif mod[-1].endswith("embeddings") and leaf == "weight":
            key = (*mod, "embedding")
        elif leaf == "weight":
            key, value = (*mod, "kernel"), value.T
        else:
            key = (*mod, leaf)
        if key not in flat_shapes:
            unexpected.append(name)
            continue
        if tuple(value.shape) != tuple(flat_shapes[key]):
            raise ValueError(f"tensor {name}: shape {tuple(value.shape)} does not fit the config "
                             f"({tuple(flat_shapes[key])})")
        out[key] = np.asarray(value, np.float32)
    missing = sorted("/".join(k) for k in flat_shapes if k not in out)
    if missing or unexpected:
        raise ValueError(f"BERT state dict does not match the config: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    params: dict = {}
    for key, value in out.items():
        node = params
        for k in key[:-1]:
            node = node.setdefault(k, {})
        node[key[-1]] = jnp.asarray(value)
    return params


def load_tokenizer(directory: str):
    """HF fast tokenizer (``tokenizer.json``) from a local directory, no network."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory, local_files_only=True)


__all__ = ["bert_config", "key_mask_bias", "BertLayer", "NEG_INF", "bert_config_from_json",
           "flax_bert_model", "flax_bert_param_shapes", "bert_hidden_states",
           "bert_params_from_state_dict", "load_tokenizer"]
