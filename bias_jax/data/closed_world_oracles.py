"""Exact oracles of the closed-world misinformation benchmark (``bias_jax.data.closed_world``).

Independent checks of the generator, as ``gridvqa_jax.world.verify`` is of the GridVQA-X
sampler: they read only what a detector sees, the rendered pixels and/or the claim tokens, plus
the benchmark's public contract (``WorldSpec``, ``CLAIM_VOCAB``, the claim families), never the
generator's latents or its construction code.

- ``parse_claim`` / ``claim_text``: claim tokens -> ``Claim`` (template, keys, direction,
  number) by regular expressions over the decoded words;
- ``text_truth``: the claim's truth in *every* scene of the universe (Uni-text), or None;
  ``scene_truth``: its truth in one decoded scene;
- ``decode_cells``: rendered image -> object key per cell, by exact comparison with the 17 legal
  tiles of ``gridvqa_jax.world.render`` (manipulated cells decode to -2);
- ``image_oracle`` / ``text_oracle`` / ``joint_oracle``: the Bayes posteriors
  P(real | image), P(real | claim), P(real | image, claim), which are exact here.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import numpy as np

from bias_jax.data.batch import UNI_IMAGE, UNI_TEXT
from bias_jax.data.closed_world import (CLAIM_VOCAB, F_COMPARISON, F_COUNT, F_RELATION,
                                        F_SELF_COMPARISON, F_SELF_RELATION, WorldSpec)
from gridvqa_jax.world import render as R
from gridvqa_jax.world.universe import COLORS, DIRECTIONS, SHAPES


class Claim(NamedTuple):
    """A parsed claim. Keys are 4 * colour + shape; -1 where the template has none."""

    family: int  # index into FAMILIES
    x: int = -1
    y: int = -1
    direction: int = -1
    number: int = -1
    negated: bool = False  # "no X is d itself" / "as many Xs as Xs" (the certain forms)


_C, _S = "|".join(COLORS), "|".join(SHAPES)
_D = "|".join(DIRECTIONS)
_PATTERNS = [
    ("rel", re.compile(rf"the ({_C}) ({_S}) is ({_D}) the ({_C}) ({_S})")),
    ("more", re.compile(rf"there are more ({_C}) ({_S})s than ({_C}) ({_S})s")),
    ("count", re.compile(r"there are more than (\d+) objects")),
    ("none", re.compile(rf"no ({_C}) ({_S}) is ({_D}) itself")),
    ("asmany", re.compile(rf"there are as many ({_C}) ({_S})s as ({_C}) ({_S})s")),
]


def _k(c: str, s: str) -> int:
    return 4 * COLORS.index(c) + SHAPES.index(s)


def parse_claim(tokens) -> Claim:
    """Read a claim from its token ids (CLAIM_VOCAB); ValueError if it fits no template."""
    text = " ".join(CLAIM_VOCAB.decode(tokens))
    for name, pat in _PATTERNS:
        m = pat.fullmatch(text)
        if not m:
            continue
        g = m.groups()
        if name == "rel":
            x, y = _k(g[0], g[1]), _k(g[3], g[4])
            return Claim(F_SELF_RELATION if x == y else F_RELATION, x, y, DIRECTIONS.index(g[2]))
        if name == "more":
            x, y = _k(g[0], g[1]), _k(g[2], g[3])
            return Claim(F_SELF_COMPARISON if x == y else F_COMPARISON, x, y)
        if name == "count":
            return Claim(F_COUNT, number=int(g[0]))
        if name == "none":
            x = _k(g[0], g[1])
            return Claim(F_SELF_RELATION, x, x, DIRECTIONS.index(g[2]), negated=True)
        x, y = _k(g[0], g[1]), _k(g[2], g[3])
        return Claim(F_SELF_COMPARISON, x, y, negated=True)
    raise ValueError(f"not a claim of this universe: {text!r}")


def claim_text(tokens) -> str:
    """The claim as a sentence."""
    text = " ".join(CLAIM_VOCAB.decode(tokens))
    return text[:1].upper() + text[1:] + "."


def text_truth(claim: Claim, spec: WorldSpec) -> bool | None:
    """Truth of a claim in *every* scene of the universe, or None if it is contingent.

    Every scene has exactly N objects, and no object is in any direction of itself.
    """
    if claim.family == F_COUNT:
        return claim.number < spec.n_objects
    if claim.family == F_SELF_RELATION:
        return claim.negated  # "the X is d the X" never holds; "no X is d itself" always does
    if claim.family == F_SELF_COMPARISON and claim.x == claim.y:
        return claim.negated  # "more Xs than Xs" never; "as many Xs as Xs" always
    return None


_DIRS = {0: lambda p, q: p[0] < q[0], 1: lambda p, q: p[0] > q[0],
         2: lambda p, q: p[1] < q[1], 3: lambda p, q: p[1] > q[1]}


def scene_truth(claim: Claim, keys: np.ndarray, spec: WorldSpec) -> bool:
    """Truth of a claim in one scene, ``keys`` int [S, S] (4 * colour + shape, -1 empty).

    "the X" reads as Russell's definite description: exactly one X exists (and it satisfies
    the predicate).
    """
    t = text_truth(claim, spec)
    if claim.family == F_COUNT:
        return int((keys >= 0).sum()) > claim.number
    if t is not None:
        return t
    if claim.family == F_RELATION:
        xs, ys = np.argwhere(keys == claim.x), np.argwhere(keys == claim.y)
        if len(xs) != 1 or len(ys) != 1:
            return False
        (py, px), (qy, qx) = xs[0], ys[0]
        return bool(_DIRS[claim.direction]((px, py), (qx, qy)))
    n_x, n_y = int((keys == claim.x).sum()), int((keys == claim.y).sum())
    return n_x == n_y if claim.negated else n_x > n_y


def decode_cells(images, spec: WorldSpec) -> np.ndarray:
    """int32 [B, S, S]: object key per cell of rendered images, -1 empty, -2 not a legal tile.

    Exact: a cell is legal iff it equals one of the 17 tiles of ``gridvqa_jax.world.render`` pixel for
    pixel (hash lookup, then a full comparison with the matched tile).
    """
    images = np.asarray(images)
    S, P = spec.grid_size, spec.cell_px
    if images.ndim != 4 or images.shape[1:] != (S * P, S * P, 3):
        raise ValueError(f"expected images [B, {S * P}, {S * P}, 3], got {images.shape}")
    tiles = _padded_words(R.tile_table(P).reshape(R.NUM_TILES, -1))
    w = np.random.default_rng(0).integers(1, 2**62, tiles.shape[1], dtype=np.uint64)
    h_tiles = (tiles * w).sum(-1)
    out = []
    for i in range(0, images.shape[0], 256):  # chunks bound the memory
        chunk = images[i: i + 256]
        b = chunk.shape[0]
        cells = chunk.reshape(b, S, P, S, P, 3).transpose(0, 1, 3, 2, 4, 5).reshape(b * S * S, -1)
        words = _padded_words(cells)
        hit = (words * w).sum(-1)[:, None] == h_tiles[None]
        tile = np.where(hit.any(-1), hit.argmax(-1), -1)
        exact = (words == tiles[np.maximum(tile, 0)]).all(-1) & (tile >= 0)
        out.append(np.where(exact, tile - 1, -2).reshape(b, S, S))
    return np.concatenate(out).astype(np.int32)


def _padded_words(rows: np.ndarray) -> np.ndarray:
    """uint8 [n, D] -> uint64 [n, ceil(D / 8)]: the same bytes, zero-padded, as 64-bit words."""
    n, d = rows.shape
    buf = np.zeros((n, -(-d // 8) * 8), np.uint8)
    buf[:, :d] = rows
    return buf.view(np.uint64)


def _posteriors(spec: WorldSpec):
    """P(real | authentic image) and P(real | contingent claim) over the type mixture."""
    m, p = np.asarray(spec.type_mix), np.asarray(spec.p_real)
    clean = m[0] * p[0] + m[1] + m[2]  # every image but the Uni-image fakes
    img = (m * p).sum() / clean if clean > 0 else 0.5
    cont = m[0] + m[1]  # contingent claims occur in Uni-image and Modality-balance
    txt = (m[0] * p[0] + m[1] * p[1]) / cont if cont > 0 else 0.5
    return float(img), float(txt)


def image_oracle(images, spec: WorldSpec, bias=None) -> np.ndarray:
    """Bayes posterior P(real | image) (float [B]), from the pixels alone.

    A manipulated image (some cell is not a legal tile) is fake. Authentic images have one
    distribution in every type (``bias_jax.data.closed_world``, step 2), so P(real | authentic image) is the
    constant of the type mixture. With ``bias`` (int [B]) the posterior is conditioned on the
    type as well: Uni-image -> 1 if authentic else 0; otherwise P(real | type), since the image
    carries no information about the label there.
    """
    clean = (decode_cells(images, spec) >= -1).all(axis=(1, 2))
    img, _ = _posteriors(spec)
    if bias is None:
        return np.where(clean, img, 0.0)
    bias = np.asarray(bias)
    return np.where(bias == UNI_IMAGE, clean.astype(float), np.asarray(spec.p_real)[bias])


def text_oracle(tokens, spec: WorldSpec, bias=None) -> np.ndarray:
    """Bayes posterior P(real | claim) (float [B]), from the tokens alone.

    A claim true (false) in every scene of the universe is real (fake); a contingent claim has
    the same distribution under both labels and in Uni-image and Modality-balance, so its
    posterior is the mixture constant. With ``bias``: Uni-text -> the claim's truth; otherwise
    P(real | type).
    """
    truth = [text_truth(parse_claim(t), spec) for t in np.asarray(tokens)]
    _, txt = _posteriors(spec)
    decided = np.array([np.nan if t is None else float(t) for t in truth])
    if bias is None:
        return np.where(np.isnan(decided), txt, decided)
    bias = np.asarray(bias)
    return np.where(bias == UNI_TEXT, decided, np.asarray(spec.p_real)[bias])


def joint_oracle(images, tokens, spec: WorldSpec) -> np.ndarray:
    """P(real | image, claim) in {0., 1.}: authentic image and claim true of the decoded scene."""
    keys = decode_cells(images, spec)
    out = np.zeros(len(keys))
    for i, (k, t) in enumerate(zip(keys, np.asarray(tokens))):
        out[i] = float((k >= -1).all() and scene_truth(parse_claim(t), k, spec))
    return out


__all__ = ["Claim", "parse_claim", "claim_text", "text_truth", "scene_truth", "decode_cells",
           "image_oracle", "text_oracle", "joint_oracle"]
