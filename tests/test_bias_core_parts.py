"""The causal view's gate-free core-part extractor (``views.causal.occlusion_core_parts``) and
how ``"extracted"`` picks between it and the grounding gates: importances recomputed by a plain
Python loop over cells and words, the gate path on a designed joint detector, errors."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from bias_jax import detectors as D
from bias_jax.data import closed_world as CW
from bias_jax.data.batch import Batch
from bias_jax.data.text import PAD_ID
from bias_jax.views import causal as CV

S, P, L, N = 5, 8, 12, 4
TINY = dict(d_model=16, mlp_dim=32, n_layers=1, n_heads=2, cell_px=P, max_tokens=L)


def tiny(kind: str, arch: str = "generic", seed: int = 1):
    cfg = D.DetectorConfig(kind=kind, arch=arch, **TINY)
    return D.jitted_apply(cfg), D.init_params(cfg, jax.random.key(seed)), cfg


@pytest.fixture(scope="module")
def generic():
    return {k: tiny(k) for k in ("image", "text", "joint")}


@pytest.fixture(scope="module")
def batch():
    """N white images (as the closed worlds' background) with a few random coloured cells (the
    last one all white: nothing to occlude), and claims of 5-12 words."""
    rng = np.random.default_rng(0)
    image = np.full((N, S * P, S * P, 3), 255, np.uint8)
    for n in range(N - 1):
        for c in rng.choice(S * S, 3 + n, replace=False):
            y, x = divmod(int(c), S)
            image[n, y * P:(y + 1) * P, x * P:(x + 1) * P] = rng.integers(0, 256, (P, P, 3))
    tokens = rng.integers(1, len(CW.CLAIM_VOCAB), (N, L)).astype(np.int32)
    for n, k in enumerate((5, 8, 12, 7)):
        tokens[n, k:] = PAD_ID
    z = np.zeros((N,), np.int32)
    return Batch(image=image, tokens=tokens, label=z, bias=z - 1, fine_label=z,
                 image_core=np.zeros(image.shape[:3], bool), text_core=np.zeros((N, L), bool),
                 has_gt=np.zeros((N,), bool), index=np.arange(N))


def _unit(v, valid):
    v = np.where(valid, v, 0.0)
    mx = v.max(-1, keepdims=True)
    return np.where(mx > 0, v / np.where(mx > 0, mx, 1.0), 0.0)


def loop_importances(dets, image, tokens, cell_kinds, word_kinds):
    """The occlusion importances by a Python loop over cells and words (numpy fill)."""
    fill = np.round(np.median(image.reshape(len(image), -1, 3).astype(np.float64), axis=1))
    imp_c = np.zeros((len(image), S * S))
    for k in cell_kinds:
        fn, p, _ = dets[k]
        base = np.asarray(fn(p, image, tokens))
        d = np.zeros((len(image), S * S))
        for c in range(S * S):
            y, x = divmod(c, S)
            occ = image.copy()
            occ[:, y * P:(y + 1) * P, x * P:(x + 1) * P] = fill[:, None, None, :].astype(np.uint8)
            d[:, c] = np.abs(base - np.asarray(fn(p, occ, tokens)))
        imp_c = np.maximum(imp_c, _unit(d, np.ones_like(d, bool)))
    word = tokens != PAD_ID
    imp_w = np.zeros(tokens.shape)
    for k in word_kinds:
        fn, p, _ = dets[k]
        base = np.asarray(fn(p, image, tokens))
        d = np.zeros(tokens.shape)
        for i in range(L):
            t = tokens.copy()
            t[:, i] = PAD_ID
            d[:, i] = np.abs(base - np.asarray(fn(p, image, t)))
        imp_w = np.maximum(imp_w, _unit(d, word))
    return imp_c.reshape(-1, S, S), imp_w


def test_occlusion_importances_match_a_loop_over_cells_and_words(generic, batch):
    image, tokens = np.asarray(batch.image), np.asarray(batch.tokens)
    ref_c, ref_w = loop_importances(generic, image, tokens, CV.OCCLUSION_CELL_KINDS,
                                    CV.OCCLUSION_WORD_KINDS)
    rc, rw = 0.3, 0.4
    cells, words, imp_c, imp_w = CV.occlusion_importances(generic, image, tokens,
                                                          rel_cells=rc, rel_words=rw)
    np.testing.assert_allclose(np.asarray(imp_c), ref_c, rtol=2e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(imp_w), ref_w, rtol=2e-4, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(cells), ref_c >= rc)
    word = tokens != PAD_ID
    np.testing.assert_array_equal(np.asarray(words), word & (ref_w >= rw))
    # Background cells (white = the median fill) never move anything; the all-white image has
    # no core cell at all ("none when nothing moves") while its claim keeps its words.
    bg = (image == 255).all(-1).reshape(N, S, P, S, P).all((2, 4))
    assert not np.asarray(cells)[bg].any() and np.asarray(cells)[:-1].any(axis=(1, 2)).all()
    assert not np.asarray(cells)[-1].any() and np.asarray(words).any(-1).all()
    assert not (np.asarray(words) & ~word).any()
    # The CoreParts over chunks gives the same parts; "extracted" on generic detectors is it.
    parts = CV.occlusion_core_parts(generic, rel_cells=rc, rel_words=rw, chunk=3)(batch)
    np.testing.assert_array_equal(parts[0], np.asarray(cells))
    np.testing.assert_array_equal(parts[1], np.asarray(words))
    ext = CV.extracted_core_parts(generic, rel_cells=rc, rel_words=rw)(batch)
    np.testing.assert_array_equal(ext[0], parts[0])
    np.testing.assert_array_equal(ext[1], parts[1])
    # The causal view's default runs on generic detectors, with the occlusion parts.
    r = CV.causal_view(generic, batch, fusion="prob")
    default = CV.core_parts_fn("occlusion", generic)(batch)
    np.testing.assert_array_equal(r.extras["core_cells"], default[0])
    np.testing.assert_array_equal(r.extras["core_tokens"], default[1])


def test_zero_fill_and_kind_choice_match_the_loop(generic, batch):
    """fill="zero" (the absent image's pixels) and other kinds follow the same formula."""
    image, tokens = np.asarray(batch.image), np.asarray(batch.tokens)
    _, _, imp_c, imp_w = CV.occlusion_importances(generic, image, tokens, cell_kinds=("image",),
                                                  word_kinds=("text",), fill="zero")
    fn, p, _ = generic["image"]
    base = np.asarray(fn(p, image, tokens))
    d = np.stack([np.abs(base - np.asarray(fn(p, np.asarray(CV.keep_image(
        image, ~np.eye(S * S, dtype=bool)[c].reshape(1, S, S).repeat(N, 0))), tokens)))
        for c in range(S * S)], -1)
    np.testing.assert_allclose(np.asarray(imp_c).reshape(N, -1), _unit(d, d >= 0),
                               rtol=2e-4, atol=1e-5)
    _, ref_w = loop_importances(generic, image, tokens, (), ("text",))
    np.testing.assert_allclose(np.asarray(imp_w), ref_w, rtol=2e-4, atol=1e-5)


def test_extracted_picks_the_gates_by_architecture(generic, monkeypatch):
    """``extracted`` dispatches on the joint detector's architecture (no compilation here)."""
    designed = D.DetectorConfig(kind="joint", arch="designed", **TINY)
    assert CV.has_cell_gates(designed) and CV.has_cell_gates(
        D.DetectorConfig(kind="lvlm", **TINY))
    assert not any(CV.has_cell_gates(generic[k][2]) for k in generic)
    calls = []
    monkeypatch.setattr(CV, "occlusion_core_parts", lambda d, **kw: calls.append(kw) or "occ")
    assert CV.extracted_core_parts(generic, rel_cells=0.3) == "occ"
    assert calls == [{"rel_cells": 0.3, "rel_words": None, "chunk": 256}]
    gated = dict(generic, joint=(generic["joint"][0], None, designed))
    assert callable(CV.extracted_core_parts(gated)) and len(calls) == 1


@pytest.mark.slow
def test_gate_path_on_designed_joint_detector(batch):
    """A designed joint detector keeps today's extractor: E = the cells gate 0 or 1 opens on."""
    dets = {"text": tiny("text", "designed"), "joint": tiny("joint", "designed")}
    cells, words = CV.extracted_core_parts(dets)(batch)
    _, p, cfg = dets["joint"]
    _, z = D.apply_with_gates(cfg, p, batch.image, batch.tokens)
    opened = (np.asarray(z)[..., :2] > 0).any(-1).reshape(N, S, S)
    np.testing.assert_array_equal(cells, opened)
    assert opened.any() and not opened.all()
    assert not (words & (np.asarray(batch.tokens) == PAD_ID)).any()


def test_missing_kinds_and_bad_options_are_clear_errors(generic, batch):
    no_image = {k: generic[k] for k in ("text", "joint")}
    with pytest.raises(ValueError, match="missing image"):
        CV.occlusion_core_parts(no_image)
    with pytest.raises(ValueError, match="missing image"):
        CV.extracted_core_parts(no_image)  # generic joint -> occlusion -> needs the image one
    with pytest.raises(ValueError, match="missing text"):
        CV.extracted_core_parts({k: generic[k] for k in ("image", "joint")})
    with pytest.raises(ValueError, match="rel_cells"):
        CV.occlusion_importances(generic, batch.image, batch.tokens, rel_cells=0.0)
    with pytest.raises(ValueError, match="fill"):
        CV.occlusion_fill(batch.image, "mean")
    assert "occlusion" in CV.CORE_PARTS
