"""The generic (label-only) detectors: the apply contract, which modality each one reads, no
grounding target in their training step, snapshot exports, and the shipped graded sets."""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
import pytest

from bias_jax import detectors as D
from bias_jax import generic_detectors as G
from bias_jax import train as BT
from bias_jax.data import closed_world as CW
from bias_jax.data.text import PAD_ID
from mmx_base.errors import InputError

TINY = dict(arch="generic", d_model=16, mlp_dim=32, n_layers=1, n_heads=2, cell_px=8)


def tiny(kind: str) -> D.DetectorConfig:
    return D.DetectorConfig(kind=kind, **TINY)


@pytest.fixture(scope="module")
def inputs():
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (4, 40, 40, 3), dtype=np.uint8)
    tokens = rng.integers(1, len(CW.CLAIM_VOCAB), (4, 12)).astype(np.int32)
    tokens[:, 9:] = PAD_ID
    return image, tokens


@pytest.fixture(scope="module")
def models():
    out = {}
    for kind in ("image", "text", "joint"):
        cfg = tiny(kind)
        out[kind] = (cfg, D.init_params(cfg, jax.random.key(1)))
    return out


def test_registered_and_shapes(models, inputs):
    assert set(G.MODULES) <= set(D.GENERIC_MODULES)
    image, tokens = inputs
    for kind, (cfg, params) in models.items():
        assert isinstance(D.module(cfg), G.MODULES[kind])
        logits = D.jitted_apply(cfg)(params, image, tokens)
        assert logits.shape == (4,) and logits.dtype == np.float32
        assert np.isfinite(np.asarray(logits)).all()


def test_each_reads_only_its_modalities(models, inputs):
    image, tokens = inputs
    other_image = np.roll(image, 7, axis=1)
    other_tokens = np.roll(tokens, 1, axis=0)
    f = {k: D.jitted_apply(c) for k, (c, _) in models.items()}
    p = {k: pr for k, (_, pr) in models.items()}

    def run(k, im, tk):
        return np.asarray(f[k](p[k], im, tk))

    base = {k: run(k, image, tokens) for k in f}
    np.testing.assert_array_equal(run("image", image, other_tokens), base["image"])
    np.testing.assert_array_equal(run("text", other_image, tokens), base["text"])
    assert np.abs(run("image", other_image, tokens) - base["image"]).max() > 1e-5
    assert np.abs(run("text", image, other_tokens) - base["text"]).max() > 1e-5
    assert np.abs(run("joint", other_image, tokens) - base["joint"]).max() > 1e-5
    assert np.abs(run("joint", image, other_tokens) - base["joint"]).max() > 1e-5


def test_pad_is_masked(models, inputs):
    """PAD keys are masked: no token attends to a PAD slot, so the CLS read-out (hence the
    logit) does not change when the learned position vectors of the PAD slots do."""
    image, tokens = inputs
    for kind in ("text", "joint"):
        cfg, params = models[kind]
        apply = D.jitted_apply(cfg)
        bumped = jax.tree_util.tree_map(lambda x: x, params)
        pos = np.array(bumped["text"]["pos"])
        pos[9:] += 3.0  # only the PAD positions of every claim
        bumped["text"]["pos"] = pos
        a = np.asarray(apply(params, image, tokens))
        b = np.asarray(apply(bumped, image, tokens))
        np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("kind", ["joint", "lvlm"])
def test_generic_step_uses_no_grounding_target(kind, inputs):
    """The training loss of a generic detector is the same whatever the grounding targets (the
    scene internals) say; the designed detector's loss on the same inputs reads them."""
    image, tokens = inputs
    label = np.array([1, 0, 1, 0], np.int32)
    ground = np.random.default_rng(1).random((4, 2, 25)) < 0.3  # [B, 2, C]
    loss_fn = jax.jit(BT.loss_fn, static_argnums=0)  # eager dispatch of the HF layers is slow
    cfg = BT.TrainConfig(detector=tiny(kind), aux_weight=0.5)
    assert not cfg.grounded
    params = D.init_params(cfg.detector, jax.random.key(0))
    a = loss_fn(cfg, params, image, tokens, label, ground)
    b = loss_fn(cfg, params, image, tokens, label, ~ground)
    assert float(a[0]) == float(b[0]) and float(a[1][2]) == 0.0
    if kind == "lvlm":
        return  # the designed lvlm's gates are as the joint's (checked below); its compile is slow
    designed = BT.TrainConfig(detector=dataclasses.replace(tiny(kind), arch="designed"),
                              aux_weight=0.5)
    assert designed.grounded
    pd = D.init_params(designed.detector, jax.random.key(0))
    assert float(loss_fn(designed, pd, image, tokens, label, ground)[0]) != \
        float(loss_fn(designed, pd, image, tokens, label, ~ground)[0])


def test_graded_world_is_never_grounded():
    cfg = BT.TrainConfig(detector=D.DetectorConfig(kind="joint"), world="graded")
    assert not cfg.grounded
    with pytest.raises(InputError, match="unknown --world"):
        BT.TrainConfig(world="nope")
    with pytest.raises(InputError, match="snapshot_steps"):
        BT.TrainConfig(steps=10, snapshot_steps=(11,))


@pytest.mark.slow  # trains (closed-world generation and two compiles)
def test_snapshots_are_detector_exports(tmp_path):
    det = D.DetectorConfig(kind="text", **{**TINY, "cell_px": 16})
    cfg = BT.TrainConfig(detector=det, steps=3, batch_size=8, save_every=2,
                         log_every=1, eval_n=64, snapshot_steps=(1, 3))
    res = BT.train(cfg, tmp_path / "run", export=tmp_path / "final", progress=False,
                   log=lambda *a, **k: None, snapshot_dir=tmp_path / "snaps")
    assert sorted(p.name for p in (tmp_path / "snaps").iterdir()) == ["steps_1", "steps_3"]
    last = D.load_detector(tmp_path / "snaps" / "steps_3")
    first = D.load_detector(tmp_path / "snaps" / "steps_1")
    final = D.load_detector(tmp_path / "final")
    assert last[2] == cfg.detector
    for x, y in zip(jax.tree.leaves(last[1]), jax.tree.leaves(final[1])):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert any(not np.array_equal(np.asarray(x), np.asarray(y))
               for x, y in zip(jax.tree.leaves(first[1]), jax.tree.leaves(final[1])))
    meta = json.loads((tmp_path / "snaps" / "steps_3" / "config.json").read_text())
    assert meta["snapshot"]["steps"] == 3
    assert meta["snapshot"]["eval"] == pytest.approx(res["eval"], nan_ok=True)
    assert meta["train"]["snapshot_steps"] == [1, 3]


def test_shipped_set_errors():
    with pytest.raises(InputError, match="unknown world"):
        D.shipped_set("nope")
    with pytest.raises(InputError, match="steps must be None"):
        D.shipped_set("basic", steps=10)
    if D.TRAINING_LENGTHS:
        with pytest.raises(InputError, match="no graded detectors shipped at"):
            D.shipped_set("graded", steps=max(D.TRAINING_LENGTHS) + 1)
        if len(D.TRAINING_LENGTHS) > 1:
            with pytest.raises(InputError, match="longest length only"):
                D.shipped_set("graded", steps=min(D.TRAINING_LENGTHS), second=True)
    else:
        with pytest.raises(InputError, match="not shipped yet"):
            D.shipped_set("graded")


def test_shipped_graded_sets_load_and_are_generic():
    if not D.TRAINING_LENGTHS:
        pytest.skip("no graded detectors shipped")
    sets = [(n, False) for n in D.TRAINING_LENGTHS] + [(max(D.TRAINING_LENGTHS), True)]
    total = 0
    for steps, second in sets:
        models = D.shipped_set("graded", steps, second)
        assert sorted(models) == sorted(D.KINDS)
        for kind, (_, params, cfg) in models.items():
            assert cfg.kind == kind and cfg.arch == "generic"
            root = D.graded_set_dir(steps, second) / D.SHIPPED[kind]
            doc = json.loads((root / "config.json").read_text())
            assert doc["train"]["world"] == "graded"
            assert doc["snapshot"]["steps"] == steps
            assert doc["train"]["init_seed"] == (1 if second else 0)
            for k in ("uni_image", "balance", "uni_text", "overall"):
                assert 0.0 <= doc["heldout"][k] <= 1.0
            size = (root / "params.msgpack").stat().st_size
            assert size < 1 << 20
            total += size
    assert total < 15 << 20


@pytest.mark.slow  # generates graded-world samples
def test_graded_training_batches_are_the_worlds_samples():
    from bias_jax.data import graded_world as GW

    cfg = BT.TrainConfig(detector=D.DetectorConfig(kind="image", **{**TINY, "cell_px": 16}),
                         world="graded", batch_size=8)
    image, tokens, label, ground = BT.make_batch(cfg, 3)
    ref = GW.load_graded_world(cfg.world_spec(), BT.BE.TRAIN_SEED, 8, start=24)
    np.testing.assert_array_equal(label, ref.label)
    np.testing.assert_array_equal(image, ref.image)
    assert (np.asarray(tokens) == PAD_ID).all()  # the image detector never sees the claim
    assert not np.asarray(ground).any()
