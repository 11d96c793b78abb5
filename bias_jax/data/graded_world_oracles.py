"""Exact oracles of the graded closed world (``bias_jax.data.graded_world``).

Independent checks of the generator: they read only what a detector sees, the rendered pixels
and/or the claim tokens, plus the world's public contract (``GradedSpec``, ``CASES``, the
statistic codes, ``CLAIM_VOCAB``, the mark colour), never the generator's latents, its case table
or its construction code. The claim parser and scene-truth rules are the basic world's oracles
(``bias_jax.data.closed_world_oracles``), which read tokens and decoded scenes only.

- ``decode_cells``: image -> (object key per cell: -1 empty, -2 no known tile; mark corner per
  cell: -1 none, 0-3), by exact comparison with the 17 legal tiles and their 64 marked variants
  (a magenta square of side max(2, P // 8) in one corner);
- ``image_statistic`` / ``text_statistic`` / ``decoded_truth``: the sufficient statistics;
- ``image_posterior`` / ``text_posterior`` / ``joint_posterior``: P(real | ...) by closed-form
  formulas written out per statistic from the case descriptions (module docstring of
  ``graded_world``), not by the generator's generic table;
- ``oracle_scores`` / ``oracle_types``: the annotation scores and their argmax (ties -> balance);
- ``core_entity`` / ``core_words``: the causal view's E (the claim's objects and the evidence
  cell) and W (content words and UNK words).
"""

from __future__ import annotations

import numpy as np

from bias_jax.data import closed_world_oracles as CWO
from bias_jax.data.graded_world import (CASES, CLAIM_VOCAB, I_CLEAN, I_FAINT0, I_OBVIOUS,
                                        I_SMUDGE, MARK_RGB, T_CERTAIN_FALSE, T_CERTAIN_TRUE,
                                        T_MARKED0, T_PLAIN, UNK_ID, GradedSpec)
from bias_jax.data.text import PAD_ID
from gridvqa_jax.world import render as R

_FAINT_CORNERS = (0, 1, 3)  # faint level l -> corner (contract: 0 tl, 1 tr, 2 bl smudge, 3 br)
_SMUDGE_CORNER = 2
_FUNCTION_WORDS = ("the", "is", "there", "are")


def _known_tiles(cell_px: int) -> dict:
    """{tile bytes: (key, corner)} for the legal tiles (corner -1) and their marked variants."""
    tiles = R.tile_table(cell_px)
    P, m = cell_px, max(2, cell_px // 8)
    out = {tiles[0].tobytes(): (-1, -1)}
    for key in range(len(tiles) - 1):
        out[tiles[1 + key].tobytes()] = (key, -1)
        for c in range(4):
            t = tiles[1 + key].copy()
            r0, c0 = (0 if c < 2 else P - m), (0 if c % 2 == 0 else P - m)
            t[r0:r0 + m, c0:c0 + m] = MARK_RGB
            out[t.tobytes()] = (key, c)
    return out


def decode_cells(images, spec: GradedSpec):
    """(keys int32 [B, S, S], corners int32 [B, S, S]) of images uint8 [B, S*P, S*P, 3].

    keys: 4 * colour + shape of the object in the cell, -1 empty, -2 when the cell is neither a
    legal tile nor a marked one (an obvious manipulation); corners: the corner of the cell's
    magenta mark, -1 unmarked.
    """
    images = np.asarray(images)
    S, P = spec.grid_size, spec.cell_px
    if images.ndim != 4 or images.shape[1:] != (S * P, S * P, 3):
        raise ValueError(f"expected images [B, {S * P}, {S * P}, 3], got {images.shape}")
    b = images.shape[0]
    known = _known_tiles(P)
    cells = np.ascontiguousarray(
        images.reshape(b, S, P, S, P, 3).transpose(0, 1, 3, 2, 4, 5)).reshape(b * S * S, -1)
    found = [known.get(c.tobytes(), (-2, -1)) for c in cells]
    arr = np.asarray(found, np.int32).reshape(b, S, S, 2)
    return arr[..., 0], arr[..., 1]


def image_statistic(images, spec: GradedSpec) -> np.ndarray:
    """int32 [B]: 1 obvious (some cell unknown), 2 smudge (a mark in corner 2), 3 + l faint
    level l (a mark in corner 0, 1, 3 for l = 0, 1, 2), 0 clean; ValueError if an image shows
    more than one mark."""
    keys, corners = decode_cells(images, spec)
    n_marks = (corners >= 0).sum(axis=(1, 2))
    if (n_marks > 1).any():
        raise ValueError("an image with more than one marked cell is not of this world")
    corner = corners.max(axis=(1, 2))
    faint = np.array([_FAINT_CORNERS.index(c) if c in _FAINT_CORNERS else -1 for c in corner])
    out = np.where(corner == _SMUDGE_CORNER, I_SMUDGE,
                   np.where(faint >= 0, I_FAINT0 + faint, I_CLEAN))
    return np.where((keys == -2).any(axis=(1, 2)), I_OBVIOUS, out).astype(np.int32)


def split_claim(tokens):
    """(claim token ids without trailing UNK words, number of trailing UNK words) of int [L]."""
    t = [int(x) for x in np.asarray(tokens) if int(x) != PAD_ID]
    n = 0
    while t and t[-1] == UNK_ID:
        t.pop()
        n += 1
    return np.asarray(t, np.int32), n


def text_statistic(tokens, spec: GradedSpec) -> np.ndarray:
    """int32 [B]: 1 / 2 a claim true / false in every scene, 3 + l a contingent claim with
    l + 1 trailing UNK words, 0 a plain contingent claim (basic-world parser and rules)."""
    wspec = spec.world_spec
    out = []
    for row in np.asarray(tokens):
        claim, n_unk = split_claim(row)
        truth = CWO.text_truth(CWO.parse_claim(claim), wspec)
        if n_unk and truth is not None:
            raise ValueError("UNK words follow only contingent claims in this world")
        out.append(T_MARKED0 + n_unk - 1 if n_unk else
                   T_PLAIN if truth is None else T_CERTAIN_TRUE if truth else T_CERTAIN_FALSE)
    return np.asarray(out, np.int32)


def decoded_truth(images, tokens, spec: GradedSpec) -> np.ndarray:
    """bool [B]: the claim's truth in the decoded scene (a marked cell decodes to its object;
    an unknown cell counts as empty, which only occurs where the sample is fake anyway)."""
    keys, _ = decode_cells(images, spec)
    keys = np.where(keys == -2, -1, keys)
    wspec = spec.world_spec
    return np.array([CWO.scene_truth(CWO.parse_claim(split_claim(t)[0]), k, wspec)
                     for k, t in zip(keys, np.asarray(tokens))])


def _mix(spec):
    return dict(zip(CASES, spec.case_mix))


def image_posterior(stat, spec: GradedSpec) -> np.ndarray:
    """float64 [B]: P(real | image statistic).

    clean: the clean images are those of balance, uni_text and graded_text, real at their
    rates; obvious: fake; smudge: p_real_undecidable; faint level l: graded_image's (authentic
    w.p. r_l = image_cue_real[l], claim true) and mixed's (authentic w.p. r_l, claim true w.p.
    the mean of text_cue_real, levels uniform and independent) mixed by their shares.
    """
    m = _mix(spec)
    w = m["balance"] + m["uni_text"] + m["graded_text"]
    clean = (m["balance"] * spec.p_real_balance + m["uni_text"] * spec.p_real_uni_text
             + m["graded_text"] * np.mean(spec.text_cue_real)) / w if w else np.nan
    wf = m["graded_image"] + m["mixed"]
    faint = [r * (m["graded_image"] + m["mixed"] * np.mean(spec.text_cue_real)) / wf
             if wf else np.nan for r in spec.image_cue_real]
    table = [clean, 0.0, spec.p_real_undecidable, *faint]
    return np.asarray(table, np.float64)[np.asarray(stat)]


def text_posterior(stat, spec: GradedSpec) -> np.ndarray:
    """float64 [B]: P(real | text statistic).

    plain: the plain contingent claims are those of uni_image (fake), balance, graded_image and
    undecidable; certain true: real; certain false: fake; l + 1 UNK words: graded_text's (true
    w.p. g_l = text_cue_real[l], authentic image) and mixed's (true w.p. g_l, authentic w.p. the
    mean of image_cue_real) mixed by their shares.
    """
    m = _mix(spec)
    w = m["uni_image"] + m["balance"] + m["graded_image"] + m["undecidable"]
    plain = (m["balance"] * spec.p_real_balance + m["graded_image"] * np.mean(spec.image_cue_real)
             + m["undecidable"] * spec.p_real_undecidable) / w if w else np.nan
    wu = m["graded_text"] + m["mixed"]
    unk = [g * (m["graded_text"] + m["mixed"] * np.mean(spec.image_cue_real)) / wu
           if wu else np.nan for g in spec.text_cue_real]
    table = [plain, 1.0, 0.0, *unk]
    return np.asarray(table, np.float64)[np.asarray(stat)]


def joint_posterior(image_stat, text_stat, truth, spec: GradedSpec) -> np.ndarray:
    """float64 [B]: P(real | image, text): 0 for an obvious manipulation or a false claim; for
    a true claim on a clean image 1; on a faint / smudged one the mark's authentic rate
    (image_cue_real[l] in graded_image and mixed alike, p_real_undecidable)."""
    si = np.asarray(image_stat)
    rate = np.asarray([1.0, 0.0, spec.p_real_undecidable, *spec.image_cue_real])[si]
    return np.where(np.asarray(truth, bool) & (si != I_OBVIOUS), rate, 0.0)


def oracle_scores(images, tokens, spec: GradedSpec) -> np.ndarray:
    """float64 [B, 3]: (q1, q2, q3) from the pixels and tokens alone, q = 5 (2 max(p, 1-p) - 1),
    q3 = max(0, q_joint - max(q1, q2))."""
    si, st = image_statistic(images, spec), text_statistic(tokens, spec)
    tr = decoded_truth(images, tokens, spec)

    def q(p):
        return 5.0 * (2.0 * np.maximum(p, 1.0 - p) - 1.0)

    q1, q2 = q(image_posterior(si, spec)), q(text_posterior(st, spec))
    q3 = np.maximum(0.0, q(joint_posterior(si, st, tr, spec)) - np.maximum(q1, q2))
    return np.stack([q1, q2, q3], axis=1)


def oracle_types(scores, tol: float = 1e-6) -> np.ndarray:
    """int32 [B]: 0 uni_image (q1 highest), 2 uni_text (q2), 1 balance (q3, or any tie for the
    highest within ``tol``) of scores [B, 3] (q1, q2, q3)."""
    s = np.asarray(scores, np.float64)
    top = s >= s.max(axis=1, keepdims=True) - tol
    single = np.array([0, 2, 1])[s.argmax(axis=1)]
    return np.where(top.sum(axis=1) > 1, 1, single).astype(np.int32)


def core_entity(images, tokens, spec: GradedSpec) -> np.ndarray:
    """bool [B, S, S]: E = the cells of the objects the claim refers to (both named keys of a
    contingent claim, every object for "more than k objects", the named key's objects for the
    self claims) plus the evidence cell (unknown tile or mark), from the pixels and tokens."""
    keys, corners = decode_cells(images, spec)
    out = []
    for k, c, t in zip(keys, corners, np.asarray(tokens)):
        cl = CWO.parse_claim(split_claim(t)[0])
        if cl.family == CWO.F_COUNT:
            ref = k != -1
        else:
            ref = (k == cl.x) | (k == cl.y)
        out.append(ref | (k == -2) | (c >= 0))
    return np.asarray(out, bool)


def core_words(tokens) -> np.ndarray:
    """bool [B, L]: W = the non-PAD tokens other than the function words the, is, there, are
    (every attribute, relation, quantifier, number and UNK word)."""
    t = np.asarray(tokens)
    func = np.isin(t, [CLAIM_VOCAB.index[w] for w in _FUNCTION_WORDS])
    return (t != PAD_ID) & ~func


__all__ = ["decode_cells", "image_statistic", "split_claim", "text_statistic", "decoded_truth",
           "image_posterior", "text_posterior", "joint_posterior", "oracle_scores",
           "oracle_types", "core_entity", "core_words"]
