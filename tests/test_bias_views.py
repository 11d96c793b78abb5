"""Modality benefit and modality causal effect views (bias_jax.views.benefit / causal)."""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bias_jax.data import closed_world as CW
from bias_jax.data import closed_world_oracles as O
from bias_jax.data.batch import BALANCE, UNI_IMAGE, UNI_TEXT, Batch
from bias_jax.data.text import PAD_ID
from bias_jax.views import benefit as BV
from bias_jax.views import causal as CV
from bias_jax.views.common import label_from_score

SPEC = CW.WorldSpec()


@pytest.fixture(scope="module")
def cw_batch():
    return CW.load_closed_world(SPEC, 4_242_001, 240)


# ----------------------------------------------------------------------------------------------
# Common.
# ----------------------------------------------------------------------------------------------
def test_label_from_score():
    s = np.array([0.3, -0.3, 0.1, -0.1, 0.0])
    np.testing.assert_array_equal(label_from_score(s, 0.25), [0, 2, 1, 1, 1])
    np.testing.assert_array_equal(label_from_score(s, 0.0), [0, 2, 0, 2, 1])


# ----------------------------------------------------------------------------------------------
# Shapley values.
# ----------------------------------------------------------------------------------------------
def brute_force_shapley(v, n):
    """Subset form: phi_i = sum_{S not i} |S|! (n-|S|-1)! / n! [v(S u i) - v(S)]."""
    phi = np.zeros(n)
    for i in range(n):
        others = [j for j in range(n) if j != i]
        for k in range(n):
            for S in itertools.combinations(others, k):
                m = sum(1 << j for j in S)
                w = math.factorial(k) * math.factorial(n - k - 1) / math.factorial(n)
                phi[i] += w * (v[m | (1 << i)] - v[m])
    return phi


def test_shapley_permutation_matches_subset_form_n3():
    rng = np.random.default_rng(0)
    vals = rng.normal(size=(5, 8))
    vals[:, 0] = 0.0
    phi = np.asarray(BV.shapley_permutation(jnp.asarray(vals)))
    for row, p in zip(vals, phi):
        np.testing.assert_allclose(p, brute_force_shapley(row, 3), atol=1e-6)
        assert abs(p.sum() - row[7]) < 1e-6  # efficiency: the phis sum to V(all)
    # The paper's toy: V = |M'| if "correct"; players 0 and 2 correct alone, all three together.
    v = np.array([0, 1, 0, 0, 0, 2, 0, 3], float)
    np.testing.assert_allclose(np.asarray(BV.shapley_permutation(v)), brute_force_shapley(v, 3))


def test_shapley_two_modalities_is_eq3():
    # eq. 3: phi_1 = 1/2 [V(1) - V(0) + V(12) - V(2)]
    v = np.array([[0.0, 1.0, 0.0, 2.0], [0.0, 0.0, 1.0, 0.0], [0.0, 1.0, 1.0, 2.0]])
    phi = np.asarray(BV.shapley_permutation(v))
    expect = np.stack([0.5 * (v[:, 1] + v[:, 3] - v[:, 2]), 0.5 * (v[:, 2] + v[:, 3] - v[:, 1])],
                      -1)
    np.testing.assert_allclose(phi, expect)


# ----------------------------------------------------------------------------------------------
# Benefit view.
# ----------------------------------------------------------------------------------------------
def _stand_in(fn):
    """A detector tuple whose apply runs host function ``fn(image, tokens) -> logits``."""
    def apply(params, image, tokens):
        out = jax.ShapeDtypeStruct((image.shape[0],), jnp.float32)
        return jax.pure_callback(lambda i, t: np.asarray(fn(i, t), np.float32), out, image,
                                 tokens)
    return (apply, {}, None)


def _logit(p):
    p = np.clip(np.asarray(p, float), 1e-6, 1 - 1e-6)
    return np.log(p) - np.log1p(-p)


def _toy_batch(n=6, hw=10, L=4):
    rng = np.random.default_rng(1)
    image = rng.integers(0, 256, (n, hw, hw, 3)).astype(np.uint8)
    tokens = rng.integers(1, 20, (n, L)).astype(np.int32)
    tokens[:, -1] = PAD_ID
    core_px = np.zeros((n, hw, hw), bool)
    return Batch(image=image, tokens=tokens, label=np.array([1, 0, 1, 0, 1, 0], np.int32)[:n],
                 bias=np.full(n, -1, np.int32), fine_label=np.full(n, -1, np.int32),
                 image_core=core_px, text_core=np.zeros((n, L), bool),
                 has_gt=np.zeros(n, bool), index=np.arange(n, dtype=np.int32))


def test_benefit_view_by_hand():
    b = _toy_batch()
    # Fixed logits per sample per detector; each must see its absent inputs.
    li = np.array([2.0, 2.0, -1.0, 0.0, 3.0, -3.0])
    lt = np.array([1.0, -1.0, 1.0, 1.0, -2.0, 0.5])
    lj = np.array([1.0, -1.0, -1.0, -1.0, 1.0, -1.0])

    def img(i, t):
        assert (t == PAD_ID).all()
        return li
    def txt(i, t):
        assert (i == 0).all()
        return lt
    def joint(i, t):
        assert (i != 0).any() and (t != PAD_ID).any()
        return lj
    dets = {"image": _stand_in(img), "text": _stand_in(txt), "joint": _stand_in(joint)}
    y = b.label
    r = BV.benefit_view(dets, b)
    for k in range(6):
        ok = lambda lg: float((lg > 0 and y[k] == 1) or (lg < 0 and y[k] == 0))  # noqa: E731
        vi, vt, vf = ok(li[k]), ok(lt[k]), 2 * ok(lj[k])
        assert r.extras["phi_image"][k] == pytest.approx(0.5 * (vi + vf - vt))
        assert r.extras["phi_text"][k] == pytest.approx(0.5 * (vt + vf - vi))
    # 0: both right -> tie; 1 (fake): text right only; 3: image abstains (0), text wrong -> tie
    np.testing.assert_array_equal(r.label, [BALANCE, UNI_TEXT, UNI_TEXT, BALANCE, UNI_IMAGE,
                                            UNI_IMAGE])
    g = BV.benefit_view(dets, b, value="logprob", eps=0.1)
    lp = lambda lg, yy: -np.log1p(np.exp(-lg if yy == 1 else lg))  # noqa: E731
    for k in range(6):
        vi, vt = lp(li[k], y[k]) + math.log(2), lp(lt[k], y[k]) + math.log(2)
        assert g.score[k] == pytest.approx(vi - vt, abs=1e-5)
    np.testing.assert_array_equal(g.label, label_from_score(g.score, 0.1))


def _oracle_detectors(with_type):
    """Perfect detectors from the closed-world Bayes oracles; with_type: each unimodal oracle is
    told the bias type, so it is certain where its modality decides and exactly at chance
    (logit 0) elsewhere."""
    bias_of = {}

    def img(i, t):
        key = np.asarray(i).tobytes()
        return _logit(O.image_oracle(i, SPEC, bias_of[key] if with_type else None))

    def txt(i, t):
        key = np.asarray(t).tobytes()
        return _logit(O.text_oracle(t, SPEC, bias_of[key] if with_type else None))

    def joint(i, t):
        return _logit(O.joint_oracle(i, t, SPEC))

    return bias_of, {"image": _stand_in(img), "text": _stand_in(txt), "joint": _stand_in(joint)}


def test_benefit_view_recovers_exact_types_with_perfect_detectors(cw_batch):
    b = cw_batch
    bias_of, dets = _oracle_detectors(with_type=True)
    bias_of[np.asarray(b.image).tobytes()] = b.bias
    bias_of[np.asarray(b.tokens).tobytes()] = b.bias
    for value in BV.VALUES:
        r = BV.benefit_view(dets, b, value=value)
        np.testing.assert_array_equal(r.label, b.bias)


def test_benefit_view_real_uni_image_unidentifiable_from_pixels(cw_batch):
    """Without the type, P(real | authentic image) is one constant: a real Uni-image sample
    looks like any authentic scene; the graded view still gets every fake Uni-image sample and
    every Uni-text sample."""
    b = cw_batch
    _, dets = _oracle_detectors(with_type=False)
    r = BV.benefit_view(dets, b, value="logprob")
    fake_ui = (b.bias == UNI_IMAGE) & (b.label == 0)
    assert fake_ui.any() and (r.label[fake_ui] == UNI_IMAGE).all()
    assert (r.label[b.bias == UNI_TEXT] == UNI_TEXT).all()
    assert (r.label[b.bias == BALANCE] == BALANCE).all()


# ----------------------------------------------------------------------------------------------
# Causal view.
# ----------------------------------------------------------------------------------------------
def _linear_detectors(hw, L, S):
    """Image: a . pixels (red channel / 255); text: sum of per-id weights; joint: bilinear."""
    rng = np.random.default_rng(2)
    a = rng.normal(size=(hw, hw)) * 0.05
    v = rng.normal(size=32)
    v[PAD_ID] = 0.3  # the placeholder is not neutral: references matter
    u = rng.normal(size=(hw, hw)) * 0.05
    c0 = 0.2

    def img_np(i, t):
        return (np.asarray(i)[..., 0] / 255.0 * a).sum((1, 2)) - 0.1

    def txt_np(i, t):
        return v[np.asarray(t)].sum(-1)

    def joint_np(i, t):
        return (np.asarray(i)[..., 0] / 255.0 * u).sum((1, 2)) * v[np.asarray(t)].sum(-1) + c0

    return (img_np, txt_np, joint_np), {"image": _stand_in(img_np), "text": _stand_in(txt_np),
                                        "joint": _stand_in(joint_np)}


def test_causal_effects_by_hand():
    hw, L, S = 10, 4, 5
    b = _toy_batch(hw=hw, L=L)
    (img_np, txt_np, joint_np), dets = _linear_detectors(hw, L, S)
    rng = np.random.default_rng(3)
    core_cells = rng.random((6, S, S)) < 0.3
    core_tokens = rng.random((6, L)) < 0.5
    r = CV.causal_view(dets, b, core_parts=lambda bb: (core_cells, core_tokens))
    r_both = CV.causal_view(dets, b, core_parts=lambda bb: (core_cells, core_tokens),
                            mediator="both")
    cell = hw // S
    for k in range(6):
        im, tok = b.image[k:k + 1].astype(float), b.tokens[k:k + 1]
        e_px = np.kron(core_cells[k], np.ones((cell, cell)))[None, :, :, None] > 0
        img_e, img_c, zero = im * e_px, im * ~e_px, im * 0
        words = tok != PAD_ID
        tok_w = np.where(words & core_tokens[k], tok, PAD_ID)
        tok_r = np.where(words & ~core_tokens[k], tok, PAD_ID)
        pad = np.full_like(tok, PAD_ID)
        th = np.tanh
        nde = {"C": th(img_np(img_c, pad)) - th(img_np(zero, pad)),
               "E": th(img_np(img_e, pad)) - th(img_np(zero, pad)),
               "W": th(txt_np(zero, tok_w)) - th(txt_np(zero, pad)),
               "R": th(txt_np(zero, tok_r)) - th(txt_np(zero, pad))}
        f = joint_np(img_e, tok_w)
        tie_e, tie_w = f - joint_np(zero, tok_w), f - joint_np(img_e, pad)
        for x in "CEWR":
            assert r.extras[f"NDE_{x}"][k] == pytest.approx(float(nde[x][0]), abs=1e-5)
        assert r.extras["TIE_E"][k] == pytest.approx(float(tie_e[0]), abs=1e-5)
        assert r.extras["TIE_W"][k] == pytest.approx(float(tie_w[0]), abs=1e-5)
        assert r.extras["TIE_C"][k] == 0 and r.extras["TIE_R"][k] == 0
        assert r_both.extras["TIE_W"][k] == pytest.approx(float((f - joint_np(zero, pad))[0]),
                                                          abs=1e-5)
        # TE(W) = O_{w,f} - O_{w*,f*} with the other variables held fixed (eq. 8)
        o = lambda t_w, i_f: th(txt_np(zero, t_w)) + joint_np(i_f, t_w)  # noqa: E731
        assert r.extras["TE_W"][k] == pytest.approx(float((o(tok_w, img_e) - o(pad, img_e))[0]),
                                                    abs=1e-5)
        # decision: the path of largest |effect|, by the documented path-to-type map
        effs = {"NDE_C": nde["C"], "NDE_E": nde["E"], "NDE_R": nde["R"], "NDE_W": nde["W"],
                "TIE_E": tie_e, "TIE_W": tie_w}
        best = max(effs, key=lambda p: abs(float(effs[p][0])))
        want = {"C": UNI_IMAGE, "E": UNI_IMAGE, "R": UNI_TEXT, "W": UNI_TEXT}.get(
            best[-1], BALANCE) if best.startswith("NDE") else BALANCE
        assert r.label[k] == want
        assert CV.PATHS[r.extras["path"][k]] == best


def test_decide_margin_score():
    eff = {p: jnp.zeros(3) for p in CV.PATHS}
    eff["NDE_E"] = jnp.array([1.0, 0.1, -0.2])
    eff["NDE_W"] = jnp.array([-0.5, 0.9, 0.1])
    eff["TIE_W"] = jnp.array([0.2, 0.3, 0.6])
    score, path = CV.decide(eff)
    np.testing.assert_allclose(np.asarray(score), [0.5, -0.6, 0.0], atol=1e-6)
    assert [CV.PATHS[i] for i in np.asarray(path)] == ["NDE_E", "NDE_W", "TIE_W"]
    np.testing.assert_array_equal(label_from_score(score, 0.0), [UNI_IMAGE, UNI_TEXT, BALANCE])
    score, _ = CV.decide(eff, label=jnp.array([0, 1, 1]), effect="label")
    # sample 0 (fake): towards the label NDE_W = +0.5 beats NDE_E = -1 and TIE_W = -0.2
    np.testing.assert_allclose(np.asarray(score), [-0.5, -0.6, 0.0], atol=1e-6)


def test_exact_core_parts_are_the_world_sample_masks():
    s = CW.generate(SPEC, 77, 0, 16)
    b = CW.to_batch(s, SPEC)
    cells, toks = CV.exact_core_parts(SPEC.grid_size)(b)
    np.testing.assert_array_equal(cells, np.asarray(s.core_cells))
    np.testing.assert_array_equal(toks, np.asarray(s.core_tokens))
    np.testing.assert_array_equal(np.asarray(CV.cells_to_pixels(cells, 80, 80)),
                                  np.asarray(b.image_core))


# ----------------------------------------------------------------------------------------------
# Shipped detectors on a small closed-world batch (printed, not asserted beyond sanity).
# ----------------------------------------------------------------------------------------------
def test_views_with_shipped_detectors(cw_batch):
    from sklearn.metrics import f1_score

    from bias_jax import detectors as D
    dets = {k: D.load_detector(k) for k in ("image", "text", "joint")}
    b = cw_batch
    res = {"benefit": BV.benefit_view(dets, b), "benefit_graded":
           BV.benefit_view(dets, b, value="logprob"), "causal": CV.causal_view(dets, b),
           "causal_saliency": CV.causal_view(
               dets, b, core_parts=CV.saliency_core_parts(dets["joint"]))}
    for name, r in res.items():
        assert r.label.shape == r.score.shape == (b.size,)
        assert set(np.unique(r.label)) <= {0, 1, 2}
        acc = float((r.label == b.bias).mean())
        f1 = f1_score(b.bias, r.label, labels=[0, 1, 2], average="macro")
        print(f"{name}: accuracy {acc:.3f} macro-F1 {f1:.3f}")
    # phi_image - phi_text = V(image) - V(text): the joint detector cancels from the decision
    r = res["benefit"]
    y = b.label
    ok = lambda lg: ((lg > 0) & (y == 1)) | ((lg < 0) & (y == 0))  # noqa: E731
    np.testing.assert_allclose(r.score, ok(r.extras["logit_image"]).astype(float)
                               - ok(r.extras["logit_text"]), atol=1e-6)
