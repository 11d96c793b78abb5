"""MultiViz: gradient x input and the second-order interaction matrix against closed forms
(bilinear model), zero interaction for additive models (embedded and pixel fallback), finite
differences on a tiny GridMDETR, PAD tokens 0, and 8 devices == 1."""

import importlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import random_scenes
MV = importlib.import_module("gridvqa_jax.explain.multiviz")  # the module; the package binds the function
from gridvqa_jax.world import render as R
from gridvqa_jax.world import universe as U

REPO = Path(__file__).resolve().parents[1]
S, L, PX, DM = 5, U.MAX_TOKENS, 4, 6


def make_scenes(n, seed=0):
    return random_scenes(n, seed, S, L)


rng = np.random.default_rng(1)
PARAMS = {"P": jnp.asarray(rng.normal(size=(PX * PX * 3, DM)) / 300, jnp.float32),
          "E": jnp.asarray(rng.normal(size=(32, DM)), jnp.float32),
          "M": jnp.asarray(rng.normal(size=(DM, DM)) / 3, jnp.float32),
          "a": jnp.asarray(rng.normal(size=DM), jnp.float32),
          "b": jnp.asarray(rng.normal(size=DM), jnp.float32),
          "k": jnp.float32(1.0)}


def embed(params, image, tokens):
    img = jnp.asarray(image, jnp.float32)
    B = img.shape[0]
    patches = img.reshape(B, S, PX, S, PX, 3).transpose(0, 1, 3, 2, 4, 5).reshape(B, S * S, -1)
    return patches @ params["P"], params["E"][tokens], tokens == U.PAD_ID


def apply_embedded(params, x, e, pad):
    """f = k * sum_{c,t} x_c M e_t + sum_c a.x_c + sum_t b.e_t over non-PAD t (k=0: additive)."""
    e = jnp.where(pad[..., None], 0.0, e)
    v = (params["k"] * jnp.einsum("bcd,de,bte->b", x, params["M"], e)
         + jnp.einsum("bcd,d->b", x, params["a"]) + jnp.einsum("btd,d->b", e, params["b"]))
    return {"answer_logprobs": jnp.stack([v, -v], -1)}


def apply(params, image, tokens):
    return apply_embedded(params, *embed(params, image, tokens))


def closed_form(params, sc):
    imgs = np.stack([np.asarray(R.render(c, s, PX)) for c, s in zip(sc.color, sc.shape)])
    x, e, pad = (np.asarray(a) for a in embed(params, imgs, sc.tokens))
    e = np.where(pad[..., None], 0.0, e).astype(np.float64)
    v = np.asarray(apply(params, imgs, sc.tokens)["answer_logprobs"][:, 0])
    sign = np.where(v >= -v, 1.0, -1.0)[:, None]
    M, a, b, k = (np.asarray(params[n], np.float64) for n in "Mabk")
    I = k * np.einsum("bcd,de,bte->bct", x, M, e) * sign[..., None]
    u_c = (k * np.einsum("bcd,de,bte->bc", x, M, e) + x @ a) * sign
    u_t = (k * np.einsum("bcd,de,bte->bt", x, M, e) + e @ b) * sign
    return I, u_c, u_t, ~pad


def test_matches_closed_form_of_a_bilinear_model():
    sc = make_scenes(3)
    out = MV.multiviz_maps(apply, PARAMS, sc, cell_px=PX, embed_fn=embed,
                           apply_embedded_fn=apply_embedded, chunk=4)
    I, u_c, u_t, valid = closed_form(PARAMS, sc)
    tol = 1e-4 * np.abs(I).max()
    np.testing.assert_allclose(out.matrix, I, atol=tol)
    np.testing.assert_allclose(out.unimodal.visual.reshape(3, -1), u_c, atol=1e-3 * np.abs(u_c).max())
    np.testing.assert_allclose(out.unimodal.textual, u_t, atol=1e-3 * np.abs(u_t).max())
    np.testing.assert_allclose(out.interaction.visual.reshape(3, -1), np.abs(I).sum(-1), atol=30 * tol)
    np.testing.assert_allclose(out.interaction.textual, np.abs(I).sum(-2), atol=30 * tol)
    assert np.all(np.asarray(out.interaction.textual)[~valid] == 0)
    att = MV.multiviz(apply, PARAMS, sc, None, cell_px=PX, embed_fn=embed,
                      apply_embedded_fn=apply_embedded)
    assert att.visual.shape == (3, S, S) and att.textual.shape == (3, L)


def test_additive_models_have_no_interaction():
    sc = make_scenes(2, seed=3)
    add = {**PARAMS, "k": jnp.float32(0.0)}
    out = MV.multiviz_maps(apply, add, sc, cell_px=PX, embed_fn=embed,
                           apply_embedded_fn=apply_embedded)
    assert np.abs(out.matrix).max() == 0 and np.abs(out.unimodal.visual).max() > 0
    # pixel fallback: f linear in pixels plus token terms -> I = 0, u_c = sum_pixels w * pixel
    fb = MV.multiviz_maps(apply, add, sc, cell_px=PX)
    assert np.abs(fb.matrix).max() < 1e-4
    imgs = np.stack([np.asarray(R.render(c, s, PX)) for c, s in zip(sc.color, sc.shape)])
    x = np.asarray(embed(add, imgs, sc.tokens)[0], np.float64)  # = patches @ P
    sign = np.where(np.asarray(apply(add, imgs, sc.tokens)["answer_logprobs"][:, 0]) >= 0, 1, -1)
    np.testing.assert_allclose(fb.unimodal.visual.reshape(2, -1),
                               sign[:, None] * (x @ np.asarray(add["a"])), rtol=1e-3, atol=1e-3)
    # textual fallback = leave-one-out: b . e_t for an additive model
    e = np.asarray(embed(add, imgs, sc.tokens)[1], np.float64)
    ref = sign[:, None] * (e @ np.asarray(add["b"])) * (sc.tokens != U.PAD_ID)
    np.testing.assert_allclose(fb.unimodal.textual, ref, atol=1e-3)


@pytest.mark.slow
def test_tiny_mdetr_against_finite_differences():
    from gridvqa_jax.models import mdetr as M
    cfg = M.ModelConfig(d_model=32, n_heads=2, mlp_dim=64, enc_layers=1, dec_layers=1)
    params = M.init_params(cfg, jax.random.key(0))
    leaves, tdef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    params = jax.tree.unflatten(tdef, [p + 0.3 * jax.random.normal(k, p.shape)
                                       for p, k in zip(leaves, keys)])
    sc = make_scenes(1, seed=5)
    emb, rest = MV.embed_split(cfg)
    out = MV.multiviz_maps(M.make_apply(cfg), params, sc, cell_px=16, embed_fn=emb,
                           apply_embedded_fn=rest)
    img = np.asarray(R.render(sc.color[0], sc.shape[0], 16))[None]
    x, e, pad = emb(params, img, sc.tokens)
    a = int(out.answer[0])

    def g(al, be):
        o = rest(params, al[None, :, None] * x, be[None, :, None] * e, pad)
        return o["answer_logprobs"][0, a]

    one_c, one_t, h = jnp.ones(S * S), jnp.ones(L), 1e-2
    for c in (0, 7, 24):
        d = jnp.zeros(S * S).at[c].set(h)
        fd = (g(one_c + d, one_t) - g(one_c - d, one_t)) / (2 * h)
        assert abs(out.unimodal.visual.reshape(-1)[c] - fd) < 2e-2 * (1 + abs(fd))
        gb = jax.grad(g, argnums=1)
        fd_row = (gb(one_c + d, one_t) - gb(one_c - d, one_t)) / (2 * h)
        np.testing.assert_allclose(out.matrix[0, c], fd_row, atol=2e-2 * (1 + np.abs(fd_row).max()))
    assert np.all(np.asarray(out.matrix[0])[:, sc.tokens[0] == U.PAD_ID] == 0)


def test_eight_devices_give_the_same_maps_as_one():
    code = textwrap.dedent("""
        import sys, jax, numpy as np
        sys.path.insert(0, "tests")
        from test_multiviz import make_scenes, apply, embed, apply_embedded, PARAMS, PX
        import importlib; MV = importlib.import_module("gridvqa_jax.explain.multiviz")
        sc = make_scenes(5)
        kw = dict(cell_px=PX, embed_fn=embed, apply_embedded_fn=apply_embedded)
        one = MV.multiviz_maps(apply, PARAMS, sc, **kw)
        many = MV.multiviz_maps(apply, PARAMS, sc, mesh=jax.make_mesh((8,), ("data",)), **kw)
        for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(many)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
        print("ok")
    """)
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
           "JAX_PLATFORMS": "cpu"}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         cwd=REPO, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().endswith("ok")


def test_embed_split_of_a_loaded_model_reproduces_its_apply():
    """The split is a function of the Model's config: the shipped pure model, loaded by the
    caller, gives the same log-probabilities through embed + apply_embedded as through apply,
    and a non-GridMDETR config is refused."""
    from gridvqa_jax.training import export as EX
    model = EX.load_reference_model("pure")
    emb, rest = MV.embed_split(model)
    assert type(MV.embed_split(model.config)[0]) is type(emb)
    sc = random_scenes(3, 2, model.config.grid_size, L)
    imgs = jax.vmap(lambda c, s: R.render(c, s, 16))(sc.color, sc.shape)
    want = np.asarray(model.apply(model.params, imgs, sc.tokens)["answer_logprobs"])
    got = np.asarray(rest(model.params, *emb(model.params, imgs, sc.tokens))["answer_logprobs"])
    np.testing.assert_allclose(got, want, atol=1e-4)
    assert np.abs(want[:, None, :] - want[None, :, :]).max() > 1e-3  # inputs matter
    with pytest.raises(TypeError, match="ModelConfig"):
        MV.embed_split({"d_model": 32})
