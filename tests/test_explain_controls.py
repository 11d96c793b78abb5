"""explain.controls: the random map's support, the pixel view of a control, and the stand-in
models of known synergy (what they read from the image and the question; their scores under the
synergy estimators: tests/test_global_synergy.py)."""

import jax
import jax.numpy as jnp
import numpy as np

from gridvqa_jax import metrics as MX
from gridvqa_jax.explain import attribution as AT
from gridvqa_jax.explain import controls as CT
from gridvqa_jax.world import generate as G
from gridvqa_jax.world import universe as U


def _scenes(n=64):
    spec, _ = U.Spec.feasible("pure", grid_size=5, density=0.7)
    return G.to_numpy(G.generate_chunk(spec, seed=5, start=0, n=n))


def test_random_textual_map_is_zero_exactly_on_pad():
    # (the oracle's and random's scores: tests/test_scorecard.py)
    sc = _scenes(16)
    rnd = CT.random_attribution(None, sc, jax.random.key(0))
    assert np.all(np.asarray(rnd.textual)[sc.tokens == U.PAD_ID] == 0)
    assert np.all(np.asarray(rnd.textual)[sc.tokens != U.PAD_ID] > 0)


def test_pixel_view_keeps_the_cell_mass():
    sc = _scenes(4)
    att = CT.random_attribution(None, sc, jax.random.key(1))
    pix = np.asarray(att.visual_pixels(8))
    assert pix.shape == (4, 40, 40)
    np.testing.assert_allclose(pix.reshape(4, 5, 8, 5, 8).sum((2, 4)), np.asarray(att.visual),
                               rtol=1e-5)
    both = AT.concat([att, att])
    assert both.batch_size == 8


def test_synergy_controls_read_red_objects_and_the_question():
    from gridvqa_jax.world import render as R

    red = U.COLORS.index("red")
    color = np.full((3, 5, 5), -1)
    shape = np.full((3, 5, 5), -1)
    color[0, 0, :3], shape[0, 0, :3] = red, [0, 1, 2]  # three red objects, different shapes
    color[0, 4, 4], shape[0, 4, 4] = red + 1, 0  # one object of another colour
    color[1, 2, 2], shape[1, 2, 2] = red, len(U.SHAPES) - 1
    images = jax.vmap(lambda c, s: R.render(c, s, 16))(jnp.asarray(color), jnp.asarray(shape))
    assert np.asarray(CT.red_objects(images)).tolist() == [3, 1, 0]
    tokens = np.zeros((3, U.MAX_TOKENS), np.int32)
    tokens[0, :3] = [U.WORD_ID["how"], U.WORD_ID["red"], 1]
    tokens[1, :2] = [U.WORD_ID["how"], 2]
    assert np.asarray(CT.names_red(tokens)).tolist() == [True, False, False]
    assert np.asarray(CT.n_words(tokens)).tolist() == [3, 2, 0]
    models = CT.synergy_control_models()
    assert set(models) == {"additive", "image_only", "text_only", "xor"}
    out = {k: np.asarray(f(None, images, tokens)["answer_logprobs"]) for k, f in models.items()}
    assert all(v.shape == (3, 2) for v in out.values())
    # additive = image-only + text-only, answer by answer
    np.testing.assert_allclose(out["additive"], out["image_only"] + out["text_only"], atol=1e-6)
    # xor: odd red count XOR names red -> +2 on answer 1
    np.testing.assert_allclose(out["xor"][:, 1], [-2.0, 2.0, -2.0])
    # each one-modality control reads its modality alone: answer 1 is -0.2 r (image) and
    # -0.4 [names red] (text), unchanged when the other modality is blanked
    np.testing.assert_allclose(out["image_only"][:, 1], [-0.6, -0.2, 0.0], atol=1e-6)
    np.testing.assert_allclose(out["text_only"][:, 1], [-0.4, 0.0, 0.0], atol=1e-6)
    pads = np.full_like(tokens, U.PAD_ID)
    blank = jnp.full_like(images, 255)
    np.testing.assert_array_equal(
        np.asarray(models["image_only"](None, images, pads)["answer_logprobs"]),
        out["image_only"])
    np.testing.assert_array_equal(
        np.asarray(models["text_only"](None, blank, tokens)["answer_logprobs"]),
        out["text_only"])


def test_objects_control_is_uniform_on_the_objects_and_scores_its_share():
    # The floor of a perturbation explainer: RMA = |G ∩ O| / |O| per sample (G ground-truth
    # cells, O occupied cells), textual RMA = |G_t ∩ T| / |T| (T non-PAD tokens), recomputed
    # here from the scenes with numpy; registered as the control "objects".
    from gridvqa_jax.explain import scoring

    sc = _scenes(48)
    assert "objects" in scoring.CONTROLS and scoring.EXPLAINERS["objects"] is \
        scoring.objects_explainer
    att = scoring.EXPLAINERS["objects"](None, None, sc, jax.random.key(0))
    occ = np.asarray(sc.color) >= 0
    vis = np.asarray(att.visual)
    n_occ = occ.reshape(48, -1).sum(1)
    np.testing.assert_allclose(vis.reshape(48, -1).sum(1), np.where(n_occ > 0, 1.0, 0.0),
                               rtol=1e-6)
    np.testing.assert_array_equal(vis == 0, ~occ)  # empty cells exactly 0, as a perturbation
    valid = np.asarray(sc.tokens) != U.PAD_ID
    np.testing.assert_allclose(np.asarray(att.textual), valid / valid.sum(1, keepdims=True),
                               rtol=1e-6)

    gt = np.asarray(sc.gt_cells, bool).reshape(48, -1)
    occ = occ.reshape(48, -1)
    want = np.where(gt.any(1), (gt & occ).sum(1) / np.maximum(occ.sum(1), 1), np.nan)
    tgt = np.asarray(sc.gt_tokens, bool) & valid
    twant = np.where(tgt.any(1), tgt.sum(1) / valid.sum(1), np.nan)
    got = scoring.per_sample_scores(att, sc)
    assert np.isfinite(want).sum() > 30
    for level in ("pixel", "cell"):
        np.testing.assert_allclose(got["visual"][level]["rma"], want, rtol=1e-5)
    np.testing.assert_allclose(got["textual"]["rma"], twant, rtol=1e-5)
    # the ground truth lies on objects, so the floor is above chance over all 25 cells
    ok = np.isfinite(want)
    assert np.all(want[ok] >= gt.mean(1)[ok]) and np.nanmean(want) > gt[ok].mean(1).mean() + 0.05
