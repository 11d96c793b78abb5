"""Model access for explainers: the embed / apply_embedded split of GridMDETR (exactness,
gradients and Hessian-vector products by finite differences) and the perturbation API of
gridvqa_jax.explain.perturb against rendering and plain loops."""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gridvqa_jax.explain import perturb as PT
from gridvqa_jax.models import mdetr as M
from gridvqa_jax.world import render as R
from gridvqa_jax.world import universe as U

TINY = M.ModelConfig(d_model=32, n_heads=2, mlp_dim=64, enc_layers=1, dec_layers=1)


QUESTIONS = [
    "How many red circles are left of blue square?",
    "Is there any green triangle that is above yellow pentagon and right of red circle?",
    "Are there more blue squares than red circles below green pentagon?",
    "How many yellow objects are right of green circle, below red square?",
]


class Scenes(NamedTuple):
    """The scene fields the perturbations read: color, shape int [B, S, S] (-1 = empty, indexed
    [y, x]), tokens int [B, L], n_tokens int [B]. Built here from random grids and questions in
    the universe's vocabulary (no sampler compile)."""

    color: np.ndarray
    shape: np.ndarray
    tokens: np.ndarray
    n_tokens: np.ndarray


@pytest.fixture(scope="module")
def scenes():
    rng = np.random.default_rng(0)
    S, L = TINY.grid_size, U.MAX_TOKENS
    occupied = rng.random((len(QUESTIONS), S, S)) < 0.6
    color = np.where(occupied, rng.integers(0, 4, occupied.shape), -1).astype(np.int32)
    shape = np.where(occupied, rng.integers(0, 4, occupied.shape), -1).astype(np.int32)
    tokens = np.zeros((len(QUESTIONS), L), np.int32)
    for b, q in enumerate(QUESTIONS):
        ids = [U.WORD_ID[w] for w in U.tokenize(q)]
        tokens[b, :len(ids)] = ids
    return Scenes(color, shape, tokens, (tokens != U.PAD_ID).sum(1).astype(np.int32))


@pytest.fixture(scope="module")
def tiny_random():
    """TINY with every parameter perturbed, so the zero-initialised blocks are active too."""
    @jax.jit  # one compiled init instead of an op-by-op trace of the model (~4x faster)
    def init():
        params = M.init_params(TINY, jax.random.key(0))
        leaves, tdef = jax.tree.flatten(params)
        keys = jax.random.split(jax.random.key(1), len(leaves))
        return jax.tree.unflatten(tdef, [p + 0.3 * jax.random.normal(k, p.shape)
                                         for p, k in zip(leaves, keys)])

    return init()


@pytest.fixture(scope="module")
def apply():
    """The tiny model's apply, jitted once for the module (one compiled shape per input size)."""
    return jax.jit(M.make_apply(TINY))


def _images(sc, cell_px=16):
    return np.asarray(jax.vmap(lambda c, s: R.render(c, s, cell_px))(sc.color, sc.shape))


# ------------------------------------------------------------------------------------------
# embed / apply_embedded
# ------------------------------------------------------------------------------------------
def test_apply_embedded_of_embed_is_apply_exactly(tiny_random, scenes, apply):
    params, img = tiny_random, _images(scenes)
    embed, rest = M.make_embed(TINY), M.make_apply_embedded(TINY)
    split = jax.jit(lambda p, i, t: rest(p, *embed(p, i, t)))
    a, b = apply(params, img, scenes.tokens), split(params, img, scenes.tokens)
    assert set(a) == set(b)
    for k in a:
        np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)


def test_embed_is_the_per_cell_patch_embedding_and_word_rows(tiny_random, scenes):
    """cell_features = W p_i + b of each cell's own 16x16x3 patch in [-0.5, 0.5] (cut here by
    slicing), token_embeddings = rows of the embedding table, pad_mask = (token == PAD)."""
    params, img = tiny_random, _images(scenes)
    cf, te, pad = M.make_embed(TINY)(params, img, scenes.tokens)
    S, P = TINY.grid_size, TINY.cell_px
    W = np.asarray(params["patch_embed"]["kernel"], np.float64)
    b = np.asarray(params["patch_embed"]["bias"], np.float64)
    x = img.astype(np.float64) / 255 - 0.5
    for n in range(2):
        for y in range(S):
            for xx in range(S):
                patch = x[n, y * P:(y + 1) * P, xx * P:(xx + 1) * P].reshape(-1)
                np.testing.assert_allclose(np.asarray(cf[n, y * S + xx]), patch @ W + b,
                                           rtol=1e-4, atol=1e-4)
    table = np.asarray(params["word_embed"]["embedding"])
    np.testing.assert_array_equal(np.asarray(te), table[scenes.tokens])
    np.testing.assert_array_equal(np.asarray(pad), scenes.tokens == U.PAD_ID)


@pytest.fixture(scope="module")
def game(tiny_random, scenes):
    """f(cells, tokens, answer) = sum over samples of log P(answer) with pad_mask fixed, at the
    embedding of the 4 scenes; jitted f, its gradient in (cells, tokens) and the
    Hessian-vector product ``hvp(answer, vc, vt) = jvp(grad f, (cf, te), (vc, vt))``."""
    params = tiny_random
    embed, rest = M.make_embed(TINY), M.make_apply_embedded(TINY)
    cf, te, pad = jax.jit(embed)(params, _images(scenes), scenes.tokens)

    def f(c, t, a):
        lp = rest(params, c, t, pad)["answer_logprobs"]
        return jnp.take_along_axis(lp, a[:, None], 1).sum()

    ans = jnp.argmax(jax.jit(rest)(params, cf, te, pad)["answer_logprobs"], -1)
    grad = jax.jit(jax.grad(f, argnums=(0, 1)))
    hvp = jax.jit(lambda a, vc, vt: jax.jvp(lambda c, t: grad(c, t, a), (cf, te), (vc, vt))[1])
    return dict(f=jax.jit(f), grad=grad, hvp=hvp, cf=cf, te=te, pad=pad, ans=ans)


def test_pad_token_embeddings_are_never_read(game):
    f, cf, te, pad, ans = (game[k] for k in ("f", "cf", "te", "pad", "ans"))
    assert pad.any()
    _, gt = game["grad"](cf, te, ans)
    assert np.all(np.asarray(gt)[np.asarray(pad)] == 0.0)
    assert np.abs(np.asarray(gt)[~np.asarray(pad)]).max() > 0
    moved = te + 7.0 * pad[..., None]
    assert float(f(cf, moved, ans)) == float(f(cf, te, ans))


def test_gradient_and_hvp_wrt_cells_and_tokens_by_finite_differences(game):
    """Directional derivatives of f and of grad f along random directions (central
    differences, eps = 1e-3 on features of size ~0.3-4) against jax.grad and the
    Hessian-vector product jvp(grad f); the cross term d2f/(dcell dtoken) on its own too. The
    gradient of a different answer's log-probability fails the same check (the tolerance has
    teeth)."""
    f, grad, hvp, cf, te, ans = (game[k] for k in ("f", "grad", "hvp", "cf", "te", "ans"))
    other = (ans + 1) % TINY.n_answers
    gc, gt = grad(cf, te, ans)
    oc, ot = grad(cf, te, other)
    rng = np.random.default_rng(0)
    eps = 1e-3
    fd, an, wrong = [], [], []
    for _ in range(3):
        vc = jnp.asarray(rng.normal(size=cf.shape), jnp.float32)
        vt = jnp.asarray(rng.normal(size=te.shape), jnp.float32)
        fd.append((f(cf + eps * vc, te + eps * vt, ans)
                   - f(cf - eps * vc, te - eps * vt, ans)) / (2 * eps))
        an.append(jnp.vdot(gc, vc) + jnp.vdot(gt, vt))
        wrong.append(jnp.vdot(oc, vc) + jnp.vdot(ot, vt))
        # Hessian-vector product: central difference of the gradient.
        gp, gm = grad(cf + eps * vc, te + eps * vt, ans), grad(cf - eps * vc, te - eps * vt, ans)
        for g1, g0, h in zip(gp, gm, hvp(ans, vc, vt)):
            num = (np.asarray(g1) - np.asarray(g0)) / (2 * eps)
            assert np.linalg.norm(num - np.asarray(h)) < 1e-2 * np.linalg.norm(np.asarray(h))
        # Cross term: how the cell gradient moves along a token direction alone.
        gp, gm = grad(cf, te + eps * vt, ans), grad(cf, te - eps * vt, ans)
        cross = np.asarray(hvp(ans, jnp.zeros_like(cf), vt)[0])
        num = (np.asarray(gp[0]) - np.asarray(gm[0])) / (2 * eps)
        assert np.linalg.norm(cross) > 0
        assert np.linalg.norm(num - cross) < 1e-2 * np.linalg.norm(cross)
    fd, an, wrong = map(np.asarray, (fd, an, wrong))
    assert np.linalg.norm(fd - an) < 1e-2 * np.linalg.norm(fd)
    assert np.linalg.norm(fd - wrong) > 0.1 * np.linalg.norm(fd)


# ------------------------------------------------------------------------------------------
# Perturbations against rendering and loops
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cell_px", [16, 64])
def test_masking_object_cells_is_rendering_without_them(scenes, cell_px):
    img = _images(scenes, cell_px)
    occupied = scenes.color >= 0
    empty = np.full_like(scenes.color, -1)
    want = _images(Scenes(empty, empty, None, None), cell_px)
    got = np.asarray(PT.mask_cells(img, occupied))  # batched: [B, H, W, 3] with [B, S, S]
    np.testing.assert_array_equal(got, want)
    # A subset: every other object removed = the scene rendered without those objects.
    rng = np.random.default_rng(cell_px)
    drop = occupied & (rng.random(occupied.shape) < 0.5)
    color = np.where(drop, -1, scenes.color)
    shape = np.where(drop, -1, scenes.shape)
    want = _images(Scenes(color, shape, None, None), cell_px)
    for n in range(len(img)):  # one sample at a time, cell_px given
        got = np.asarray(PT.mask_cells(img[n], drop[n], cell_px))
        np.testing.assert_array_equal(got, want[n])
    assert got.dtype == np.uint8


def test_mask_cells_rejects_a_mismatched_cell_size(scenes):
    img = _images(scenes)[0]
    with pytest.raises(ValueError, match="cell_px"):
        PT.mask_cells(img, np.zeros((5, 5), bool), cell_px=20)


def test_mask_tokens_sets_pad(scenes):
    rng = np.random.default_rng(0)
    m = rng.random(scenes.tokens.shape) < 0.4
    got = np.asarray(PT.mask_tokens(scenes.tokens, m))
    assert np.all(got[m] == U.PAD_ID) and U.PAD_ID == 0
    np.testing.assert_array_equal(got[~m], scenes.tokens[~m])


def test_players_and_active_players(scenes):
    fm = jax.vmap(PT.players)(scenes)
    S, L = 5, U.MAX_TOKENS
    n = PT.n_players(S)
    assert n == S * S + L
    for b in range(len(scenes.tokens)):
        nt = int(scenes.n_tokens[b])
        assert np.all(scenes.tokens[b, :nt] != U.PAD_ID) and np.all(scenes.tokens[b, nt:] == 0)
        np.testing.assert_array_equal(np.asarray(fm.cells[b]), np.arange(S * S).reshape(S, S))
        want = [S * S + t if t < nt else -1 for t in range(L)]
        assert np.asarray(fm.tokens[b]).tolist() == want
        active = np.asarray(PT.active_players(jax.tree.map(lambda a: a[b], fm), n))
        assert active.tolist() == [i < S * S + nt for i in range(n)]
    mod = PT.modality_players(jax.tree.map(lambda a: a[0], scenes))
    assert np.all(np.asarray(mod.cells) == 0)
    assert np.asarray(PT.active_players(mod, 2)).tolist() == [True, True]


def _loop_inputs(img, tokens, coalition, cells_fm, tokens_fm, P):
    """Independent reference: paint absent players' cells white and their tokens PAD."""
    S = cells_fm.shape[0]
    out_i, out_t = [], []
    for row in coalition:
        im, tk = img.copy(), tokens.copy()
        for y in range(S):
            for x in range(S):
                pid = cells_fm[y, x]
                if pid >= 0 and not row[pid]:
                    im[y * P:(y + 1) * P, x * P:(x + 1) * P] = 255
        for t, pid in enumerate(tokens_fm):
            if pid >= 0 and not row[pid]:
                tk[t] = 0
        out_i.append(im)
        out_t.append(tk)
    return np.stack(out_i), np.stack(out_t)


def test_coalition_inputs_agree_with_a_loop_and_vmap_over_samples(scenes):
    """Default players and a captum-style grouping (cells grouped 2x2 + a never-masked cell,
    tokens grouped in pairs), vmapped over samples."""
    img = _images(scenes)
    B, K, S, P = 2, 6, 5, 16
    rng = np.random.default_rng(1)
    default = jax.vmap(PT.players)(jax.tree.map(lambda a: a[:B], scenes))
    y, x = np.divmod(np.arange(S * S), S)
    g_cells = ((y // 2) * 3 + x // 2).reshape(S, S).astype(np.int32)
    g_cells[0, 0] = -1
    g_tok = np.where(scenes.tokens[:B] != 0, 9 + np.arange(U.MAX_TOKENS) // 2, -1).astype(np.int32)
    grouped = PT.FeatureMask(np.broadcast_to(g_cells, (B, S, S)), g_tok)
    for fm, n in ((default, PT.n_players(S)), (grouped, 9 + U.MAX_TOKENS // 2)):
        coal = rng.random((B, K, n)) < 0.5
        coal[:, 0] = True  # everyone present = the input itself
        fn = jax.jit(jax.vmap(PT.coalition_inputs))
        gi, gt = map(np.asarray, fn(img[:B], scenes.tokens[:B], coal, fm))
        assert gi.shape == (B, K) + img.shape[1:] and gt.shape == (B, K, U.MAX_TOKENS)
        for b in range(B):
            wi, wt = _loop_inputs(img[b], scenes.tokens[b], coal[b], np.asarray(fm.cells[b]),
                                  np.asarray(fm.tokens[b]), P)
            np.testing.assert_array_equal(gi[b], wi)
            np.testing.assert_array_equal(gt[b], wt)
            np.testing.assert_array_equal(gi[b, 0], img[b])
    # Masking every cell player gives the empty scene's render.
    none = np.zeros((1, PT.n_players(S)), bool)
    gi, gt = PT.coalition_inputs(img[0], scenes.tokens[0], none,
                                jax.tree.map(lambda a: a[0], default))
    empty = -np.ones((1, S, S), np.int32)
    np.testing.assert_array_equal(np.asarray(gi), _images(Scenes(empty, empty, None, None)))
    assert np.all(np.asarray(gt) == U.PAD_ID)


def test_answer_logprob_and_value_fn_against_a_loop(tiny_random, scenes, apply):
    params, img = tiny_random, _images(scenes)
    lp = np.asarray(apply(params, img, scenes.tokens)["answer_logprobs"])
    got = np.asarray(PT.answer_logprob(apply, params, img, scenes.tokens))
    np.testing.assert_allclose(got, lp.max(-1), rtol=1e-6)
    given = np.array([0, 3, 26, 27])
    got = np.asarray(PT.answer_logprob(apply, params, img, scenes.tokens, given, probability=True))
    np.testing.assert_allclose(got, np.exp(lp[np.arange(4), given]), rtol=1e-5)
    assert np.asarray(PT.predicted_answer(apply, params, img, scenes.tokens)).tolist() == \
        lp.argmax(-1).tolist()

    fm = PT.players(jax.tree.map(lambda a: a[1], scenes))
    value_fn = jax.jit(PT.make_value_fn(apply, params, img[1], scenes.tokens[1], fm))
    rng = np.random.default_rng(2)
    coal = rng.random((4, PT.n_players(5))) < 0.6
    coal[0] = True
    got = np.asarray(value_fn(coal))
    a = int(lp[1].argmax())
    wi, wt = _loop_inputs(img[1], scenes.tokens[1], coal, np.asarray(fm.cells),
                          np.asarray(fm.tokens), 16)
    want = np.asarray(apply(params, wi, wt)["answer_logprobs"])[:, a]  # rows are independent
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert got[0] == pytest.approx(lp[1].max(), rel=1e-5)


def test_pixel_grads_to_cells(tiny_random, scenes):
    """Against a loop over cells; and the signed sum is the derivative of the output along
    brightening the whole cell (central difference through the tiny model)."""
    rng = np.random.default_rng(3)
    g = rng.normal(size=(2, 80, 80, 3)).astype(np.float32)
    got_abs = np.asarray(PT.pixel_grads_to_cells(g, 5))
    got_sum = np.asarray(PT.pixel_grads_to_cells(g, 5, absolute=False))
    for b in range(2):
        for y in range(5):
            for x in range(5):
                blk = g[b, y * 16:(y + 1) * 16, x * 16:(x + 1) * 16]
                assert got_abs[b, y, x] == pytest.approx(np.abs(blk).sum(), rel=1e-5)
                assert got_sum[b, y, x] == pytest.approx(blk.sum(), rel=1e-4, abs=1e-4)
    params = tiny_random
    apply = M.make_apply(TINY)
    img = _images(scenes).astype(np.float32)[:1]
    f = jax.jit(lambda im: PT.answer_logprob(apply, params, im, scenes.tokens[:1], jnp.array([5]))[0])
    cells = np.asarray(PT.pixel_grads_to_cells(jax.jit(jax.grad(f))(img), 5, absolute=False))[0]
    eps = 1.0
    for (y, x) in [(0, 0), (2, 3), (4, 1)]:
        d = np.zeros_like(img)
        d[0, y * 16:(y + 1) * 16, x * 16:(x + 1) * 16] = 1.0
        fd = (float(f(img + eps * d)) - float(f(img - eps * d))) / (2 * eps)
        assert fd == pytest.approx(cells[y, x], rel=2e-2, abs=1e-5)


def test_fewer_token_positions_give_the_same_outputs(tiny_random, scenes, apply):
    """Positions that are PAD in every question can be dropped (``scene.trim_tokens``): the
    model reads positions 0..L-1 of its position table and never reads PAD."""
    img = _images(scenes)
    L = int(scenes.n_tokens.max())
    full, short = apply(tiny_random, img, scenes.tokens), apply(tiny_random, img,
                                                                scenes.tokens[:, :L])
    for k in full:
        np.testing.assert_allclose(np.asarray(short[k]), np.asarray(full[k]), rtol=1e-5,
                                   atol=1e-5, err_msg=k)
    with pytest.raises(ValueError, match="token positions"):
        apply(tiny_random, img, np.zeros((len(img), TINY.max_tokens + 1), np.int32))
