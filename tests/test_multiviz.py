"""MultiViz: gradient x input and the second-order interaction matrix against closed forms
(bilinear model), zero interaction for additive models (embedded and pixel fallback, the
fallback measured from the empty tiles or black), the full Hessian and finite differences on a
tiny GridMDETR, Table 1 running the embedding path, PAD tokens 0, and 8 devices == 1."""

import functools
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
    # pixel fallback: f linear in pixels plus token terms -> I = 0, u_c = sum_pixels w * (pixel
    # - baseline pixel), the baseline being the empty tiles (default) or black
    fb = MV.multiviz_maps(apply, add, sc, cell_px=PX)
    assert np.abs(fb.matrix).max() < 1e-4
    imgs = np.stack([np.asarray(R.render(c, s, PX)) for c, s in zip(sc.color, sc.shape)])
    x = np.asarray(embed(add, imgs, sc.tokens)[0], np.float64)  # = patches @ P
    blank = np.asarray(R.render(np.full((S, S), -1), np.full((S, S), -1), PX))[None]
    x0 = np.asarray(embed(add, blank, sc.tokens[:1])[0], np.float64)  # the empty grid's
    sign = np.where(np.asarray(apply(add, imgs, sc.tokens)["answer_logprobs"][:, 0]) >= 0, 1, -1)
    a = np.asarray(add["a"], np.float64)
    np.testing.assert_allclose(fb.unimodal.visual.reshape(2, -1),
                               sign[:, None] * ((x - x0) @ a), rtol=1e-3, atol=1e-3)
    empty = sc.color.reshape(2, -1) < 0
    assert empty.any() and np.all(np.asarray(fb.unimodal.visual).reshape(2, -1)[empty] == 0)
    black = MV.multiviz_maps(apply, add, sc, cell_px=PX, pixel_baseline="black")
    np.testing.assert_allclose(black.unimodal.visual.reshape(2, -1),
                               sign[:, None] * (x @ a), rtol=1e-3, atol=1e-3)
    assert np.abs(np.asarray(black.unimodal.visual).reshape(2, -1)[empty]).min() > 0
    with pytest.raises(ValueError, match="pixel_baseline"):
        MV.multiviz_maps(apply, add, sc, cell_px=PX, pixel_baseline="white")
    # textual fallback = leave-one-out: b . e_t for an additive model
    e = np.asarray(embed(add, imgs, sc.tokens)[1], np.float64)
    ref = sign[:, None] * (e @ np.asarray(add["b"])) * (sc.tokens != U.PAD_ID)
    np.testing.assert_allclose(fb.unimodal.textual, ref, atol=1e-3)


def test_pixel_granularity_matches_closed_form_of_a_bilinear_model():
    """Per-pixel maps: I[p, t] = (image - b)_p . d u_t / d image_p, in closed form for the
    bilinear model (d u_t / d patch = k P M e_t), measured from gray; from black their mass per
    cell is the cell path's matrix (the embedding has no bias); no embed split: ValueError."""
    sc = make_scenes(3, seed=2)
    kw = dict(cell_px=PX, embed_fn=embed, apply_embedded_fn=apply_embedded, chunk=4,
              granularity="pixels")
    out = MV.multiviz_maps(apply, PARAMS, sc, pixel_baseline="gray", **kw)
    imgs = np.stack([np.asarray(R.render(c, s, PX)) for c, s in zip(sc.color, sc.shape)])
    _, e, pad = (np.asarray(a, np.float64) for a in embed(PARAMS, imgs, sc.tokens))
    e = np.where(pad[..., None] > 0, 0.0, e)
    v = np.asarray(apply(PARAMS, imgs, sc.tokens)["answer_logprobs"][:, 0])
    sign = np.where(v >= -v, 1.0, -1.0)
    P, M, k = (np.asarray(PARAMS[n], np.float64) for n in "PMk")
    w = k * np.einsum("jd,de,bte->btj", P, M, e).reshape(3, L, PX, PX, 3)  # d u_t / d patch
    delta = (imgs.astype(np.float64) - 128.0).reshape(3, S, PX, S, PX, 3)
    I = np.einsum("bYyXxh,btyxh->bYyXxt", delta, w)  # pixel (Y*PX + y, X*PX + x)
    I = I.reshape(3, S * PX * S * PX, L) * sign[:, None, None]
    tol = 1e-4 * np.abs(I).max()
    np.testing.assert_allclose(out.matrix, I, atol=tol)
    H = S * PX
    np.testing.assert_allclose(out.interaction.visual_px, np.abs(I).sum(-1).reshape(3, H, H),
                               atol=30 * tol)
    np.testing.assert_allclose(out.interaction.textual, np.abs(I).sum(-2), atol=300 * tol)
    np.testing.assert_allclose(out.interaction.visual,  # cell map = pixel mass per cell
                               out.interaction.visual_px.reshape(3, S, PX, S, PX).sum((2, 4)),
                               rtol=1e-5, atol=1e-5)
    black = MV.multiviz_maps(apply, PARAMS, sc, pixel_baseline="black", **kw)
    cells = MV.multiviz_maps(apply, PARAMS, sc, cell_px=PX, embed_fn=embed,
                             apply_embedded_fn=apply_embedded)
    per_cell = np.asarray(black.matrix).reshape(3, S, PX, S, PX, L).sum((2, 4)).reshape(3, -1, L)
    np.testing.assert_allclose(per_cell, cells.matrix, atol=1e-4 * np.abs(cells.matrix).max())
    np.testing.assert_allclose(np.asarray(black.unimodal.visual), cells.unimodal.visual,
                               rtol=1e-3, atol=1e-3 * np.abs(cells.unimodal.visual).max())
    with pytest.raises(ValueError, match="embed split"):
        MV.multiviz_maps(apply, PARAMS, sc, cell_px=PX, granularity="pixels")


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


@functools.lru_cache(maxsize=None)
def tiny_mdetr(seed=0):
    """A 1-layer GridMDETR with perturbed random weights (inputs matter) as a ``Model``
    (made once per seed and process: its initialisation costs seconds, and a Model is
    immutable)."""
    from gridvqa_jax.models import mdetr as M
    from mmx_base.model import Model
    cfg = M.ModelConfig(d_model=32, n_heads=2, mlp_dim=64, enc_layers=1, dec_layers=1)

    @jax.jit  # one compile (cached across runs) instead of hundreds of eager ops
    def make(seed):
        params = M.init_params(cfg, jax.random.key(seed))
        leaves, tdef = jax.tree.flatten(params)
        keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
        return jax.tree.unflatten(tdef, [p + 0.3 * jax.random.normal(k, p.shape)
                                         for p, k in zip(leaves, keys)])
    return Model(M.make_apply(cfg), make(seed), cfg)


@pytest.mark.slow  # ~30 s: the full Hessian of a tiny GridMDETR by jax.hessian
def test_tiny_mdetr_hvp_equals_the_full_hessian():
    """The embedding path's interaction matrix is the cross block d2g / dalpha dbeta of the full
    Hessian of g(alpha, beta) = f(alpha_c x_c, beta_t e_t) at 1 (jax.hessian = jacfwd of jacrev
    over all C + L scales at once, not the chunked jvp-of-grad rows), and its unimodal maps
    are jax.grad of g; PAD columns are 0."""
    model = tiny_mdetr()
    sc = make_scenes(2, seed=7)
    emb, rest = MV.embed_split(model)
    out = MV.multiviz_maps(model.apply, model.params, sc, cell_px=16, embed_fn=emb,
                           apply_embedded_fn=rest, chunk=4)
    def g(al, be, x, e, pad, a):
        o = rest(model.params, al[None, :, None] * x, be[None, :, None] * e, pad)
        return o["answer_logprobs"][0, a]

    @jax.jit
    def hessian_and_grad(x, e, pad, a):
        ones = (jnp.ones(S * S), jnp.ones(L))
        H = jax.hessian(g, argnums=(0, 1))(*ones, x, e, pad, a)
        return H[0][1], jax.grad(g, argnums=(0, 1))(*ones, x, e, pad, a)

    for b in range(2):
        img = np.asarray(R.render(sc.color[b], sc.shape[b], 16))[None]
        x, e, pad = emb(model.params, img, sc.tokens[b:b + 1])
        a = int(np.argmax(model.apply(model.params, img, sc.tokens[b:b + 1])
                          ["answer_logprobs"][0]))
        assert a == int(out.answer[b])
        H01, (u_c, u_t) = hessian_and_grad(x, e, pad, a)
        valid = sc.tokens[b] != U.PAD_ID
        want = np.where(valid[None, :], np.asarray(H01), 0.0)
        assert np.abs(want).max() > 1e-3  # the model has cross-modal interactions
        np.testing.assert_allclose(out.matrix[b], want, atol=1e-4 * (1 + np.abs(want).max()))
        np.testing.assert_allclose(out.unimodal.visual[b].reshape(-1), u_c, rtol=1e-4,
                                   atol=1e-5)
        np.testing.assert_allclose(out.unimodal.textual[b], np.where(valid, u_t, 0.0),
                                   rtol=1e-4, atol=1e-5)


def test_table1_runs_the_embedding_path_for_shipped_and_given_models():
    """Table 1's MultiViz row is multiviz(..., embed_fn, apply_embedded_fn) with the regime
    model's embed split: for a given Model (its config) the per-sample scores equal those of
    that call on the same (PAD-trimmed) samples and differ from the pixel fallback's, which a
    bare (apply_fn, params) gets; the shipped models get their split through
    ``model_parts``."""
    from gridvqa_jax.explain.scoring import per_sample_scores
    from gridvqa_jax.training import export as EX
    from gridvqa_jax.world.scene import trim_tokens
    from reproduction import table1 as T1

    model = tiny_mdetr()
    kw = dict(explainers=("multiviz",), regimes=("pure",), figures_dir=None)
    res = T1.table1(2, models={"pure": model}, **kw)
    assert res["model_access"] == {"multiviz": {"pure": "embedding"}}
    sc = trim_tokens(T1.regime_scenes("pure", 2, T1.EXPLAIN_SEED))
    emb, rest = MV.embed_split(model.config)
    want = per_sample_scores(MV.multiviz(model.apply, model.params, sc, cell_px=16,
                                         embed_fn=emb, apply_embedded_fn=rest), sc)
    pixel = per_sample_scores(MV.multiviz(model.apply, model.params, sc, cell_px=16), sc)
    got = res["per_sample"]["multiviz"]["pure"]
    for k in ("rma", "iou"):
        np.testing.assert_allclose(got["visual"]["pixel"][k], want["visual"]["pixel"][k],
                                   rtol=1e-5)
        np.testing.assert_allclose(got["textual"][k], want["textual"][k], rtol=1e-5)
    assert not np.allclose(got["visual"]["pixel"]["rma"], pixel["visual"]["pixel"]["rma"])
    bare = T1.table1(2, models={"pure": (model.apply, model.params)}, **kw)
    assert bare["model_access"] == {"multiviz": {"pure": "pixel"}}
    np.testing.assert_allclose(bare["per_sample"]["multiviz"]["pure"]["visual"]["pixel"]["rma"],
                               pixel["visual"]["pixel"]["rma"], rtol=1e-5)
    # the shipped checkpoints and a split given explicitly
    shipped = T1.model_parts(EX.load_reference_model("pure"))
    assert shipped[2] == MV.embed_split(EX.load_reference_model("pure").config)
    assert T1.model_parts((model.apply, model.params, emb, rest))[2] == (emb, rest)
    assert T1.model_access(MV.multiviz, shipped[2], {})[1] == "embedding"
    assert T1.model_access(T1.EXPLAINERS["dime"], shipped[2], {}) == ({}, None)


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
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8 "
                 "--xla_cpu_collective_call_terminate_timeout_seconds=600",
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
