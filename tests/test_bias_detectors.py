"""Detectors (bias_jax.detectors / hf / train / cli): shapes, absent modalities, the HF
attention adapter against HF itself and finite differences, exact resume, export round trip
and the CLI's JSON. The optional pretrained MiniLM encoder: tests/test_bias_minilm.py."""

from __future__ import annotations

import dataclasses
import io
import json
import contextlib
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from reproduction.cli import bias as bcli
from bias_jax import detectors as D
from bias_jax import evaluate as BE
from bias_jax import hf
from bias_jax import train as BT
from bias_jax.data import closed_world as CW
from bias_jax.data import closed_world_oracles as OR
from bias_jax.data.text import PAD_ID
from mmx_base.errors import ExportError, InputError
from mmx_base import layers

SPEC = CW.WorldSpec()


def tiny(kind: str) -> D.DetectorConfig:
    return D.DetectorConfig(kind=kind, d_model=16, mlp_dim=32, n_gates=4, n_layers=2,
                            n_heads=2)


@pytest.fixture(scope="module")
def batch():
    return CW.load_closed_world(SPEC, 7, 8)


@pytest.fixture(scope="module")
def tiny_params():
    return {k: D.init_params(tiny(k), jax.random.key(1)) for k in D.KINDS}


# ----------------------------------------------------------------------------------------------
# Inputs and shapes.
# ----------------------------------------------------------------------------------------------
def test_half_planes_brute_force():
    S = 4
    H = layers.half_planes(S)
    for j in range(S * S):
        for i in range(S * S):
            (yj, xj), (yi, xi) = divmod(j, S), divmod(i, S)
            assert H[:, j, i].tolist() == [xj < xi, xj > xi, yj < yi, yj > yi]


def test_cell_patches_are_the_grid_cells(batch):
    P, S = SPEC.cell_px, SPEC.grid_size
    patches = np.asarray(layers.cell_patches(batch.image, S, P))
    assert patches.shape == (8, S * S, P * P * 3)
    for c in (0, 7, 24):
        y, x = divmod(c, S)
        block = batch.image[3, y * P:(y + 1) * P, x * P:(x + 1) * P].astype(np.float32) / 255 - 0.5
        np.testing.assert_allclose(patches[3, c], block.reshape(-1), atol=1e-6)


@pytest.mark.parametrize("kind", D.KINDS)
def test_shapes_and_finite(kind, batch, tiny_params):
    logits = D.make_apply(tiny(kind))(tiny_params[kind], batch.image, batch.tokens)
    assert logits.shape == (8,) and logits.dtype == jnp.float32
    assert np.isfinite(np.asarray(logits)).all()


def test_config_validation():
    with pytest.raises(ValueError, match="unknown detector kind"):
        D.DetectorConfig(kind="audio")
    with pytest.raises(ValueError, match="multiple of n_heads"):
        D.DetectorConfig(kind="lvlm", d_model=10, n_heads=4)
    cfg = tiny("lvlm")
    assert D.DetectorConfig.from_json(json.loads(json.dumps(cfg.to_json()))) == cfg


# ----------------------------------------------------------------------------------------------
# Absent modalities.
# ----------------------------------------------------------------------------------------------
def test_absent_inputs(batch):
    b = D.absent_image(batch)
    assert b.image.shape == batch.image.shape and not np.asarray(b.image).any()
    np.testing.assert_array_equal(b.tokens, batch.tokens)
    b = D.absent_text(batch)
    assert (np.asarray(b.tokens) == PAD_ID).all() and b.tokens.shape == batch.tokens.shape
    np.testing.assert_array_equal(b.image, batch.image)
    img, tok = D.detector_inputs("image", batch)
    assert (np.asarray(tok) == PAD_ID).all() and np.array_equal(img, batch.image)
    img, tok = D.detector_inputs("text", batch)
    assert not np.asarray(img).any() and np.array_equal(tok, batch.tokens)
    img, tok = D.detector_inputs("joint", batch)
    assert np.array_equal(img, batch.image) and np.array_equal(tok, batch.tokens)


def test_unimodal_detectors_ignore_the_other_modality(batch, tiny_params):
    other = CW.load_closed_world(SPEC, 8, 8)  # different images and claims
    f_txt = D.make_apply(tiny("text"))
    p = tiny_params["text"]
    a = f_txt(p, batch.image, batch.tokens)
    np.testing.assert_array_equal(a, f_txt(p, other.image, batch.tokens))
    np.testing.assert_array_equal(a, f_txt(p, D.zero_image(batch.image), batch.tokens))
    assert not np.allclose(a, f_txt(p, batch.image, other.tokens))
    f_img = D.make_apply(tiny("image"))
    p = tiny_params["image"]
    a = f_img(p, batch.image, batch.tokens)
    np.testing.assert_array_equal(a, f_img(p, batch.image, other.tokens))
    np.testing.assert_array_equal(a, f_img(p, batch.image, D.placeholder_text(batch.tokens)))
    assert not np.allclose(a, f_img(p, other.image, batch.tokens))


@pytest.mark.parametrize("kind", ["joint", "lvlm"])
def test_multimodal_detectors_read_both(kind, batch, tiny_params):
    other = CW.load_closed_world(SPEC, 8, 8)
    f, p = D.make_apply(tiny(kind)), tiny_params[kind]
    a = np.asarray(f(p, batch.image, batch.tokens))
    b_img = np.asarray(f(p, other.image, batch.tokens))
    b_txt = np.asarray(f(p, batch.image, other.tokens))
    b_abs = np.asarray(f(p, batch.image, D.placeholder_text(batch.tokens)))
    for b in (b_img, b_txt, b_abs):
        assert np.abs(a - b).max() > 1e-5


# ----------------------------------------------------------------------------------------------
# HF adapter: equal to HF's own layer, attention rows sum to 1, gradients by finite differences.
# ----------------------------------------------------------------------------------------------
def test_bert_layer_equals_hf_layer():
    from transformers.models.bert.modeling_flax_bert import FlaxBertLayer

    config = hf.bert_config(hidden_size=16, num_layers=1, num_heads=4, intermediate_size=24)
    x = jax.random.normal(jax.random.key(0), (2, 7, 16))
    mask = np.array([[1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1]], np.int32)
    ours = hf.BertLayer(config)
    params = ours.init(jax.random.key(1), x, hf.key_mask_bias(mask))["params"]
    y, attn = ours.apply({"params": params}, x, hf.key_mask_bias(mask))
    ref = FlaxBertLayer(config).apply({"params": params["layer"]}, x, mask, None,
                                      output_attentions=True)
    np.testing.assert_allclose(y, ref[0], atol=1e-5)
    np.testing.assert_allclose(attn, ref[1], atol=1e-6)
    np.testing.assert_allclose(np.asarray(attn).sum(-1), 1.0, atol=1e-5)
    assert np.asarray(attn)[0, :, :, 5:].max() < 1e-6  # PAD keys get no attention


def test_lvlm_attentions_and_fd_gradients(batch, tiny_params):
    cfg, p = tiny("lvlm"), tiny_params["lvlm"]
    image, tokens = batch.image[:2], batch.tokens[:2]
    logits, attn = D.apply_with_attentions(cfg, p, image, tokens)
    N = cfg.seq_len
    assert attn.shape == (cfg.n_layers, 2, cfg.n_heads, N, N)
    np.testing.assert_allclose(np.asarray(attn).sum(-1), 1.0, atol=1e-5)
    pad = np.asarray(tokens[0]) == PAD_ID
    keys = np.concatenate([np.zeros(cfg.n_cells, bool), pad, [False]])
    assert np.asarray(attn)[:, 0][..., keys].max() < 1e-6
    np.testing.assert_allclose(logits, D.make_apply(cfg)(p, image, tokens), atol=1e-6)

    logits2, attn2, grads = D.attention_grads(cfg, p, image, tokens)
    np.testing.assert_allclose(attn2, attn, rtol=1e-5, atol=1e-6)
    assert grads.shape == attn.shape and np.abs(np.asarray(grads)).max() > 0
    zeros = D.attention_perturbations(cfg, p, image, tokens)

    f_jit = jax.jit(lambda pert: D.apply_with_attentions(cfg, p, image, tokens, pert)[0].sum())

    def f(pert):
        return float(f_jit(pert))

    rng = np.random.default_rng(0)
    for layer in range(cfg.n_layers):
        v = rng.normal(size=attn.shape[1:]).astype(np.float32)
        eps = 1e-2

        def shifted(s):
            t = jax.tree.map(lambda z: z, zeros)
            t[f"bert_{layer}"]["layer"]["attention"]["self"]["attention"] = jnp.asarray(s * v)
            return t

        fd = (f(shifted(eps)) - f(shifted(-eps))) / (2 * eps)
        an = float((np.asarray(grads[layer]) * v).sum())
        # relative: layer 0's derivative is about 3e-3, so an absolute floor of 2e-2 would
        # pass a zero or sign-flipped gradient (float32 differences agree to about 1%)
        assert abs(an) > 1e-3 and abs(fd - an) <= 2e-2 * abs(an) + 1e-5, (layer, fd, an)
    # A single entry: one head, the output token's query, one image key.
    i = (1, 0, 1, N - 1, 3)
    t = jax.tree.map(lambda z: z, zeros)
    e = np.zeros(attn.shape[1:], np.float32)
    e[i[1:]] = 1.0
    key_ = f"bert_{i[0]}"
    t[key_]["layer"]["attention"]["self"]["attention"] = jnp.asarray(0.05 * e)
    up = f(t)
    t[key_]["layer"]["attention"]["self"]["attention"] = jnp.asarray(-0.05 * e)
    fd = (up - f(t)) / 0.1
    assert abs(fd) > 1e-3 and abs(fd - float(grads[i])) <= 2e-2 * abs(fd) + 1e-5


def test_lvlm_gradient_wrt_image(batch, tiny_params):
    cfg, p = tiny("lvlm"), tiny_params["lvlm"]
    image = jnp.asarray(batch.image[:1], jnp.float32)
    tokens = batch.tokens[:1]
    f = jax.jit(lambda im: D.make_apply(cfg)(p, im, tokens).sum())
    g = jax.jit(jax.grad(f))(image)
    v = np.random.default_rng(1).normal(size=image.shape).astype(np.float32)
    eps = 2.0  # pixels are in [0, 255]
    fd = (float(f(image + eps * v)) - float(f(image - eps * v))) / (2 * eps)
    an = float((np.asarray(g) * v).sum())
    assert abs(fd - an) <= 3e-2 * max(abs(an), 1e-3), (fd, an)


def test_attention_maps_only_for_lvlm(batch, tiny_params):
    with pytest.raises(ValueError, match="only for the lvlm"):
        D.apply_with_attentions(tiny("joint"), tiny_params["joint"], batch.image, batch.tokens)


# ----------------------------------------------------------------------------------------------
# Training: resume equals uninterrupted; config mismatch; NaN.
# ----------------------------------------------------------------------------------------------
def _cfg(kind="joint", **kw):
    base = dict(detector=tiny(kind), steps=6, batch_size=8, warmup=2, save_every=3,
                log_every=2, eval_n=0)
    base.update(kw)
    return BT.TrainConfig(**base)


def test_resume_equals_uninterrupted(tmp_path):
    cfg = _cfg()
    full = BT.train(cfg, tmp_path / "full", progress=False, log=lambda *a: None)
    part = BT.train(cfg, tmp_path / "part", progress=False, stop_after=3, log=lambda *a: None)
    assert part["steps_done"] == 3
    assert not jax.tree.all(jax.tree.map(np.array_equal, part["params"], full["params"]))
    # As if killed while writing step 4's record, after the first part ran 500 s.
    mpath = tmp_path / "part" / "metrics.jsonl"
    recs = [json.loads(s) for s in mpath.read_text().splitlines()]
    recs[-1]["elapsed_s"] = 500.0
    mpath.write_text("".join(json.dumps(r) + "\n" for r in recs) + '{"step": 4, "loss": 0.')
    t_resume = time.time()
    res = BT.train(cfg, tmp_path / "part", resume=True, progress=False, log=lambda *a: None)
    assert res["steps_done"] == 6
    assert 500.0 < res["wall_s"] < 500.0 + (time.time() - t_resume)
    for a, b in zip(jax.tree.leaves(res["params"]), jax.tree.leaves(full["params"])):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    lines = [json.loads(s) for s in mpath.read_text().splitlines()]  # the cut line is gone
    assert [r["step"] for r in lines] == [2, 3, 4, 6]
    assert lines[2]["elapsed_s"] > 500.0
    assert all(np.isfinite(r["loss"]) for r in lines)
    with pytest.raises(ValueError, match="different from"):
        BT.train(_cfg(lr=1e-4), tmp_path / "part", resume=True, progress=False,
                log=lambda *a: None)
    with pytest.raises(ValueError, match="already holds checkpoints"):
        BT.train(cfg, tmp_path / "part", progress=False, log=lambda *a: None)


@pytest.mark.parametrize("field, value", [("steps", 0), ("steps", -1), ("batch_size", 0),
                                          ("log_every", 0), ("warmup", -1), ("lr", 0.0),
                                          ("clip", float("inf")), ("type_mix", (1, 2, 1)),
                                          ("type_mix", (0.5, 0.6, -0.1))])
def test_train_config_rejects_bad_sizes(field, value):
    """Zero / negative sizes and non-positive rates are refused, naming the field."""
    with pytest.raises(InputError, match=rf"TrainConfig\.{field} must"):
        _cfg(**{field: value})


def test_cli_train_rejects_zero_steps(tmp_path):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc, _ = _run_cli(["train", "--detector", "text", "--out", str(tmp_path / "run"),
                          "--steps", "0", "--no-progress"])
    msg = err.getvalue()
    assert rc == 2 and "steps" in msg and ">= 1, got 0" in msg
    assert not (tmp_path / "run").exists()


def test_training_batches_depend_on_step_only():
    cfg = _cfg("text")
    a = BT.make_batch(cfg, 5)
    b = CW.load_closed_world(cfg.world_spec(), BE.TRAIN_SEED, 8, start=40)
    np.testing.assert_array_equal(a[1], b.tokens)
    assert not np.asarray(a[0]).any()  # the text detector is fed the absent image
    np.testing.assert_array_equal(a[2], b.label)


def test_grounding_targets_from_the_claim():
    """Gate targets = cells of the keys the claim names, read back from the claim's tokens."""
    spec = CW.WorldSpec(type_mix=(0.3, 0.4, 0.3))
    smp = jax.device_get(CW.generate(spec, 3, 0, 64))
    tgt = BT.grounding_targets(smp)
    assert tgt.shape == (64, 2, spec.n_cells)
    keys = np.where(smp.color >= 0, 4 * smp.color + smp.shape, -1).reshape(64, -1)
    n_count = 0
    for b in range(64):
        claim = OR.parse_claim(smp.tokens[b])
        if claim.family == CW.F_COUNT:
            assert not tgt[b].any()
            n_count += 1
            continue
        x, y = claim.x, claim.y
        np.testing.assert_array_equal(tgt[b, 0], keys[b] == x)
        np.testing.assert_array_equal(tgt[b, 1], keys[b] == y)
        if claim.family == CW.F_RELATION:  # relation scenes: X and Y are unique
            assert tgt[b, 0].sum() == 1 and tgt[b, 1].sum() == 1
    assert 0 < n_count < 64


def test_nan_loss_stops_with_a_clear_error(tmp_path):
    cfg = _cfg("text", lr=1e38, warmup=1, clip=1e38)
    with pytest.raises(FloatingPointError, match="non-finite loss"):
        BT.train(cfg, tmp_path / "nan", progress=False, log=lambda *a: None)


def test_training_learns_the_text_rule(tmp_path):
    """A short run of the text-only detector must beat chance on Uni-text claims."""
    cfg = BT.TrainConfig(detector=D.DetectorConfig(kind="text", d_model=32, mlp_dim=64),
                        steps=150, batch_size=64, warmup=10, save_every=150, log_every=50,
                        eval_n=400, type_mix=(0.0, 0.0, 1.0), lr=3e-3)
    res = BT.train(cfg, tmp_path / "t", progress=False, log=lambda *a: None)
    assert res["eval"]["uni_text"] > 0.9


# ----------------------------------------------------------------------------------------------
# Export / load and evaluation.
# ----------------------------------------------------------------------------------------------
def test_load_detector_round_trip(tmp_path, batch, tiny_params):
    for kind in ("image", "lvlm"):
        cfg = tiny(kind)
        D.export_detector(tmp_path / kind, tiny_params[kind], cfg, {"note": "test"})
        apply_fn, params, cfg2 = D.load_detector(tmp_path / kind)
        assert cfg2 == cfg
        np.testing.assert_allclose(apply_fn(params, batch.image, batch.tokens),
                                   D.make_apply(cfg)(tiny_params[kind], batch.image,
                                                     batch.tokens), atol=1e-6)
    with pytest.raises(ExportError, match="not an exported detector"):
        D.load_detector(tmp_path / "missing")
    # The one export format: never silently over an existing export.
    other = D.init_params(tiny("image"), jax.random.key(9))
    with pytest.raises(ExportError, match="refusing to overwrite"):
        D.export_detector(tmp_path / "image", other, tiny("image"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["image", "lvlm"]
    D.export_detector(tmp_path / "image", other, tiny("image"), overwrite=True)
    for a, b in zip(jax.tree.leaves(D.load_detector(tmp_path / "image")[1]),
                    jax.tree.leaves(other)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # Damaged exports: one error type, naming the problem.
    raw = (tmp_path / "image" / "params.msgpack").read_bytes()
    (tmp_path / "image" / "params.msgpack").write_bytes(raw[: len(raw) // 3])
    with pytest.raises(ExportError, match="corrupt or truncated"):
        D.load_detector(tmp_path / "image")
    (tmp_path / "image" / "params.msgpack").write_bytes(raw)
    doc = json.loads((tmp_path / "image" / "config.json").read_text())
    doc["detector"]["d_model"] = 24  # the stored parameters are 16 wide
    (tmp_path / "image" / "config.json").write_text(json.dumps(doc))
    with pytest.raises(ExportError, match="shapes do not match"):
        D.load_detector(tmp_path / "image")
    doc["detector"]["kind"] = "lvlm"  # same sizes, another architecture: other parameter keys
    doc["detector"]["d_model"] = 16
    (tmp_path / "image" / "config.json").write_text(json.dumps(doc))
    with pytest.raises(ExportError, match="do not match the detector"):
        D.load_detector(tmp_path / "image")
    doc["detector"]["kind"] = "audio"
    (tmp_path / "image" / "config.json").write_text(json.dumps(doc))
    with pytest.raises(ExportError, match="corrupt detector config .*unknown detector kind"):
        D.load_detector(tmp_path / "image")


def test_accuracy_by_type_by_hand():
    logits = np.array([1.0, -1.0, 2.0, -0.5, 0.3, -2.0])
    labels = np.array([1, 1, 1, 0, 0, 0])
    bias = np.array([0, 0, 1, 1, 2, 2])
    res = BE.accuracy_by_type(logits, labels, bias)
    assert res == {"uni_image": 0.5, "balance": 1.0, "uni_text": 0.5, "overall": 4 / 6}


def _run_cli(argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = bcli.main(argv)
    return rc, out.getvalue()


def test_cli_detectors_json(tmp_path, tiny_params):
    for kind in D.KINDS:
        D.export_detector(tmp_path / f"bias_{kind}", tiny_params[kind], tiny(kind))
    rc, out = _run_cli(["detectors", "--world", "basic", "--n", "40", "--json", "--root",
                        str(tmp_path), "--seed", "5"])
    assert rc == 0
    table = json.loads(out.strip().splitlines()[-1])
    assert set(table) == set(D.KINDS)
    for row in table.values():
        assert set(row) == {"uni_image", "balance", "uni_text", "overall"}
    # Independent recomputation for the text detector.
    b = CW.load_closed_world(SPEC, 5, 40)
    logits = np.asarray(D.make_apply(tiny("text"))(tiny_params["text"],
                                                    np.zeros_like(b.image), b.tokens))
    correct = (logits > 0) == (b.label == 1)
    assert table["text"]["overall"] == pytest.approx(correct.mean())
    sel = b.bias == 1
    assert table["text"]["balance"] == pytest.approx(correct[sel].mean())


def test_cli_train_json_and_errors(tmp_path):
    rc, out = _run_cli(["train", "--detector", "text", "--data", "closed_world", "--out",
                        str(tmp_path / "run"), "--steps", "3", "--batch-size", "8",
                        "--eval-n", "0", "--export", str(tmp_path / "exp"), "--no-progress",
                        "--json"])
    assert rc == 0
    res = json.loads(out.strip().splitlines()[-1])
    assert res["steps_done"] == 3
    assert D.load_detector(tmp_path / "exp")[2].kind == "text"
    rc, _ = _run_cli(["train", "--detector", "text", "--out", str(tmp_path / "run"),
                      "--steps", "3", "--batch-size", "8", "--eval-n", "0", "--no-progress"])
    assert rc == 2  # existing checkpoints without --resume: a clean error
    # An existing export is replaced only with --overwrite; refused before anything is written.
    argv = ["train", "--detector", "text", "--out", str(tmp_path / "run2"), "--steps", "2",
            "--batch-size", "8", "--eval-n", "0", "--export", str(tmp_path / "exp"),
            "--no-progress"]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc, _ = _run_cli(argv)
    assert rc == 2 and "refusing to overwrite" in err.getvalue()
    assert not (tmp_path / "run2").exists()
    rc, _ = _run_cli(argv + ["--overwrite"])
    assert rc == 0
    assert json.loads((tmp_path / "exp" / "config.json").read_text())["train"]["steps"] == 2
    with pytest.raises(SystemExit):
        bcli.build_parser().parse_args(["train", "--detector", "audio", "--out", "x"])


# ----------------------------------------------------------------------------------------------
# Shipped detectors.
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", D.KINDS)
def test_shipped_detector_loads_and_is_small(kind, batch):
    d = D.shipped_dir(kind)
    if not (d / "params.msgpack").is_file():
        pytest.skip(f"{d} not shipped")
    size = sum(f.stat().st_size for f in d.iterdir())
    assert size < 5 * 2**20
    apply_fn, params, cfg = D.load_detector(kind)
    assert cfg.kind == kind
    img, tok = D.detector_inputs(kind, batch)
    assert np.isfinite(np.asarray(apply_fn(params, img, tok))).all()


@pytest.mark.slow
def test_shipped_detectors_per_type_accuracy():
    rc, out = _run_cli(["detectors", "--world", "basic", "--n", "2000", "--json"])
    assert rc == 0
    t = json.loads(out.strip().splitlines()[-1])
    assert t["image"]["uni_image"] > 0.97 and abs(t["image"]["balance"] - 0.5) < 0.05
    assert t["text"]["uni_text"] > 0.97 and abs(t["text"]["balance"] - 0.5) < 0.05
    assert abs(t["image"]["uni_text"] - 0.5) < 0.1
    assert t["joint"]["overall"] >= 0.95 and t["lvlm"]["overall"] >= 0.95
    # Every default Uni-image sample is fake, so the text detector's accuracy there is only the
    # share of its near-zero logits below zero; that it reads nothing from a contingent claim
    # shows on Uni-image samples that are real half the time (the training mixture).
    apply_fn, params, cfg = D.load_detector("text")
    spec = CW.WorldSpec(grid_size=cfg.grid_size, cell_px=cfg.cell_px, type_mix=(1.0, 0.0, 0.0),
                        p_real=0.5)
    assert abs(BE.evaluate_detector(apply_fn, params, cfg, n=2000, spec=spec)["uni_image"]
               - 0.5) < 0.05


# ----------------------------------------------------------------------------------------------
# Pretrained MiniLM (optional extra).
# ----------------------------------------------------------------------------------------------
def test_bert_state_dict_mapping_round_trip():
    """Flax params -> PyTorch names (written here independently) -> back: identical."""
    config = hf.bert_config(hidden_size=8, num_layers=2, num_heads=2, intermediate_size=12,
                            vocab_size=11)
    module = hf._hf_bert.FlaxBertModule(config, add_pooling_layer=False)
    ids = jnp.ones((1, 3), jnp.int32)
    params = module.init(jax.random.key(0), ids, ids, ids * 0, ids, None)["params"]
    state = {"embeddings.position_ids": np.arange(64)[None], "pooler.dense.weight": np.zeros((8, 8))}
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        names = [k.key for k in path]
        leaf = np.asarray(leaf)
        last = names[-1]
        if last == "kernel":
            names[-1], leaf = "weight", leaf.T
        elif last in ("embedding", "scale"):
            names[-1] = "weight"
        state[".".join(names)] = leaf
    back = hf.bert_params_from_state_dict(state, config)
    assert jax.tree.structure(back) == jax.tree.structure(params)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(params)):
        np.testing.assert_array_equal(a, b)
    del state["encoder.layer.1.output.dense.bias"]
    with pytest.raises(ValueError, match="missing"):
        hf.bert_params_from_state_dict(state, config)


def test_cli_train_default_arch_follows_the_world(tmp_path):
    """Without --arch, the graded world trains the label-only generic detector (as shipped),
    the basic world the designed one; --arch overrides."""
    for world, arch, want in (("graded", None, "generic"), ("basic", None, "designed"),
                              ("graded", "designed", "designed")):
        exp = tmp_path / f"exp_{world}_{arch}"
        argv = ["train", "--detector", "text", "--world", world, "--out",
                str(tmp_path / f"run_{world}_{arch}"), "--steps", "1", "--batch-size", "4",
                "--eval-n", "0", "--export", str(exp), "--no-progress"]
        rc, _ = _run_cli(argv + (["--arch", arch] if arch else []))
        assert rc == 0
        assert D.load_detector(exp)[2].arch == want


def test_basic_world_claims_have_the_detectors_length():
    """A detector whose learned text encoder reads 16 positions is evaluated and analysed on
    basic-world claims of 16 positions (the world's default is 12): ``evaluate_detector`` and
    ``analysis.closed_world_batch`` pad the claims to ``cfg.max_tokens``, and the samples are
    the default length's, padded."""
    from bias_jax import analysis as AN

    cfg = dataclasses.replace(tiny("text"), max_tokens=16)
    params = D.init_params(cfg, jax.random.key(0))
    acc = BE.evaluate_detector(D.make_apply(cfg), params, cfg, n=4)
    assert set(acc) >= {"uni_image", "balance", "uni_text"}
    long = AN.closed_world_batch(cfg, 4, world="basic")
    short = AN.closed_world_batch(tiny("text"), 4, world="basic")
    assert long.tokens.shape[1] == 16 and short.tokens.shape[1] == 12
    np.testing.assert_array_equal(long.tokens[:, :12], short.tokens)
    assert np.all(long.tokens[:, 12:] == PAD_ID)
    np.testing.assert_array_equal(long.image, short.image)
