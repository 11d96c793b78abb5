"""Reference-model training (gridvqa_jax.training): resume equals an uninterrupted run, with
the clock and metrics.jsonl carried over; 8 devices equal 1; NaN stops clearly; bad configs are
refused; the one export format (atomic, no silent overwrite, ExportError on damage)."""

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import time

import jax
import numpy as np
import pytest

from mmx_base.errors import ExportError, InputError
from gridvqa_jax.training import export as EX
from gridvqa_jax.training.config import TrainConfig
from gridvqa_jax.world import generate as G
from gridvqa_jax.training import train as T
from gridvqa_jax.models import mdetr as M

TINY = M.ModelConfig(d_model=32, n_heads=2, mlp_dim=64, enc_layers=1, dec_layers=1)
CFG = TrainConfig(batch_size=8, steps=6, phase1_steps=3, warmup_steps=2, save_every=3,
                    log_every=2, eval_every=0, freq_samples=256, hires_frac=0.25, model=TINY)


def _leaves(state):
    return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(state["params"]))]


def test_resume_after_kill_equals_uninterrupted(tmp_path):
    full = T.train(CFG, tmp_path / "a", progress=False, log=lambda *_: None)
    T.train(CFG, tmp_path / "b", progress=False, stop_after=3, log=lambda *_: None)
    assert sorted(os.listdir(tmp_path / "b" / "ckpt")) == ["3"]
    # Pretend the first part ran 1000 s: the resumed run's clock continues from there.
    mpath = tmp_path / "b" / "metrics.jsonl"
    lines = [json.loads(line) for line in open(mpath)]
    lines[-1]["elapsed_s"] = 1000.0
    mpath.write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"step": 4, "elap')
    t_resume = time.time()
    resumed = T.train(CFG, tmp_path / "b", resume=True, progress=False, log=lambda *_: None)
    assert resumed["steps_done"] == 6
    # 1000 s carried over plus this run's own time (bounded by the time since the resume).
    assert 1000.0 < resumed["wall_s"] < 1000.0 + (time.time() - t_resume)
    for a, b in zip(_leaves(full["state"]), _leaves(resumed["state"])):
        np.testing.assert_array_equal(a, b)
    # The run directory loads for evaluation (latest checkpoint = the final parameters).
    _, params, cfg_b = EX.load_model(tmp_path / "b")
    assert EX.load_meta(tmp_path / "b")["step"] == 6
    for a, b in zip(_leaves(full["state"]), jax.tree.leaves(params)):
        np.testing.assert_array_equal(a, np.asarray(b))
    # The line cut short by the kill is gone: every line is a complete record.
    recs = [json.loads(line) for line in open(mpath)]
    assert [r["step"] for r in recs] == [2, 3, 4, 6]
    assert recs[2]["elapsed_s"] > 1000.0
    assert {r["phase"] for r in recs} == {1, 2}
    # Fine-tuning from the run directory records what the parent cost (steps, logged wall time).
    _, parent = T.load_init_params(dataclasses.replace(CFG, init_from=str(tmp_path / "b")))
    assert parent["steps"] == 6 and parent["wall_s"] == max(r["elapsed_s"] for r in recs)
    # A second fresh run into a used directory is refused, as is resuming with other flags.
    with pytest.raises(ValueError, match="already holds checkpoints"):
        T.train(CFG, tmp_path / "b", progress=False, log=lambda *_: None)
    with pytest.raises(ValueError, match=r"config different from .* \(fields \['lr'\]\)"):
        T.train(dataclasses.replace(CFG, lr=1e-2), tmp_path / "b", resume=True, progress=False,
                log=lambda *_: None)


def test_nan_loss_stops_with_clear_message(tmp_path):
    # lr 1e38 at step 0 (no warm-up, no effective clip): the parameters overflow, so the loss
    # of step 1 is the first non-finite one.
    cfg = dataclasses.replace(CFG, lr=1e38, clip_norm=1e38, warmup_steps=0, steps=4)
    with pytest.raises(FloatingPointError, match=r"non-finite loss .* at step 1"):
        T.train(cfg, tmp_path / "nan", progress=False, log=lambda *_: None)


def test_batches_are_deterministic_and_answer_weights_have_mean_one():
    mesh = G.data_mesh()
    specs = T.train_specs(CFG)
    a, b = T.make_batch(CFG, specs, 5, mesh), T.make_batch(CFG, specs, 5, mesh)
    for k in a:
        np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]))
    c = T.make_batch(CFG, specs, 6, mesh)
    assert not np.array_equal(np.asarray(a["tokens"]), np.asarray(c["tokens"]))
    assert a["image"].shape == (8, 80, 80, 3)
    w = T.answer_weights(CFG, specs, mesh)
    # Independent closed form: with K seen classes of frequencies f_c, the inverse frequencies
    # normalised to mean 1 over the stream are 1 / (K f_c); then the clip, and the clip value
    # for unseen classes. Counted here from the answer strings of the scenes.
    counts = np.zeros(TINY.n_answers)
    for i, s in enumerate(specs):
        sc = G.to_numpy(G.generate_chunk(s, CFG.data_seed + i, 0, CFG.freq_samples // 2, mesh))
        for ans, yn in zip(sc.answer, sc.is_yesno):
            counts[(26 + int(ans)) if yn else int(ans)] += 1
    seen = counts > 0
    f = counts / counts.sum()
    want = np.full(TINY.n_answers, CFG.max_answer_weight)
    want[seen] = np.minimum(1.0 / (seen.sum() * f[seen]), CFG.max_answer_weight)
    assert 3 <= seen.sum() < TINY.n_answers  # some classes seen, some never
    np.testing.assert_allclose(w, want, rtol=1e-5)


_MULTI = textwrap.dedent("""
    import dataclasses, jax, jax.numpy as jnp, numpy as np
    from gridvqa_jax.world import generate as G
    from gridvqa_jax.training import train as T
    from gridvqa_jax.models import mdetr as M
    from gridvqa_jax.training.config import TrainConfig
    assert jax.device_count() == 8, jax.devices()
    tiny = M.ModelConfig(d_model=32, n_heads=2, mlp_dim=64, enc_layers=1, dec_layers=1)
    cfg = TrainConfig(batch_size=16, steps=3, phase1_steps=1, warmup_steps=1, model=tiny,
                        freq_samples=256)
    specs = T.train_specs(cfg)
    out, losses = [], []
    for devs in (jax.devices()[:1], jax.devices()):
        mesh = G.data_mesh(devs)
        state = T.init_state(cfg, mesh)
        step = T.make_step(cfg, mesh)
        w = jnp.asarray(T.answer_weights(cfg, specs, mesh))
        for i in range(3):
            batch = T.make_batch(cfg, specs, i, mesh)
            if len(devs) == 8:
                assert len(batch["image"].sharding.device_set) == 8
            qa, g = T.phase_weights(cfg, i)
            state, m = step(state, batch, jnp.float32(qa), jnp.float32(g), w)
            losses.append(float(m["loss"]))
        out.append([np.asarray(x) for x in jax.tree.leaves(jax.device_get(state["params"]))])
    # Same losses step by step; parameters equal up to reduction order. Adam turns float noise
    # in near-zero gradients into steps of up to lr, so the absolute tolerance is a fraction of
    # the total learning-rate budget (3 steps, lr 8e-4 after a 1-step warm-up).
    np.testing.assert_allclose(losses[:3], losses[3:], rtol=1e-4)
    for a, b in zip(*out):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=2e-4)
    print("OK")
""")


@pytest.mark.slow  # ~10 min on 2 cores: compiles the train step for 8 simulated devices
def test_eight_devices_equal_one():
    # 8 simulated devices share 2 cores: XLA:CPU's 40 s collective rendezvous timeout aborted
    # this run once while other slow tests loaded the machine
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8 "
                                     "--xla_cpu_collective_call_terminate_timeout_seconds=600",
               JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-c", _MULTI], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-3000:]


def test_phase_weights_ramp_the_qa_loss_in():
    """Phase 1 is grounding only; phase 2 ramps the QA weight linearly to 1 over qa_ramp_steps
    and keeps the grounding loss at aux_weight."""
    cfg = TrainConfig(phase1_steps=10, qa_ramp_steps=4, aux_weight=0.5)
    got = [T.phase_weights(cfg, s) for s in range(8, 17)]
    assert got == [(0.0, 1.0), (0.0, 1.0), (0.25, 0.5), (0.5, 0.5), (0.75, 0.5), (1.0, 0.5),
                   (1.0, 0.5), (1.0, 0.5), (1.0, 0.5)]
    assert T.phase_weights(TrainConfig(phase1_steps=0, qa_ramp_steps=0), 0) == (1.0, 1.0)


def test_oversample_repeats_named_buckets_in_the_round_robin():
    """Oversampling a bucket k times makes it k times as frequent in the training stream, in
    every density that can hold it, and leaves the other buckets' shares equal."""
    from gridvqa_jax.world import universe as U

    cfg = dataclasses.replace(CFG, oversample=(("D3_CMP_F0", 5), ("D1_A_F1", 2)))
    plain, heavy = T.train_specs(CFG), T.train_specs(cfg)
    for p, h in zip(plain, heavy):
        assert set(p.buckets) == set(h.buckets)
        period = len(h.buckets)
        ids = np.asarray(G.bucket_ids(h, 3, 4 * period))  # 4 full cycles, any offset
        counts = {b: int(np.sum(ids == b)) for b in set(h.buckets)}
        for b, c in counts.items():
            want = {"D3_CMP_F0": 5, "D1_A_F1": 2}.get(U.BUCKETS[b].name, 1)
            assert c == 4 * want, (U.BUCKETS[b].name, c)
    d07 = heavy[cfg.densities.index("d07")]
    assert any(U.BUCKETS[b].name == "D3_CMP_F0" for b in d07.buckets)
    # the setting survives the JSON round trip of train_config.json
    assert TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


@pytest.mark.parametrize("bad, msg", [((("D4_M_F0", 2),), "unknown bucket 'D4_M_F0'"),
                                      ((("D2_M_F0", 0),), "integer >= 1"),
                                      ((("D2_M_F0",),), "pairs")])
def test_oversample_rejects_bad_entries(bad, msg):
    with pytest.raises(ValueError, match=msg):
        dataclasses.replace(CFG, oversample=bad)


def test_init_from_starts_at_the_exported_parameters(tmp_path):
    """``init_from`` loads an exported model's parameters exactly (fresh optimiser state), and
    refuses an export of a different architecture, naming the field."""
    params = M.init_params(TINY, jax.random.key(42))
    EX.export_model(tmp_path / "m", params, TINY, {"summary": {"steps_done": 7, "wall_s": 12.5}})
    assert T.load_init_params(dataclasses.replace(CFG, init_from=str(tmp_path / "m")))[1] == {
        "path": str(tmp_path / "m"), "steps": 7, "wall_s": 12.5}
    # A model that was itself fine-tuned reports its totals.
    EX.export_model(tmp_path / "ft", params, TINY, {"summary": {
        "steps_done": 2, "wall_s": 1.0, "total_steps": 9, "total_wall_s": 13.5}})
    parent = T.load_init_params(dataclasses.replace(CFG, init_from=str(tmp_path / "ft")))[1]
    assert (parent["steps"], parent["wall_s"]) == (9, 13.5)
    mesh = G.data_mesh(jax.devices()[:1])
    state = T.init_state(dataclasses.replace(CFG, init_from=str(tmp_path / "m")), mesh)
    for a, b in zip(_leaves(state), jax.tree.leaves(params)):
        np.testing.assert_array_equal(a, np.asarray(b))
    assert int(state["step"]) == 0
    fresh = _leaves(T.init_state(CFG, mesh))
    assert any(not np.array_equal(a, b) for a, b in zip(fresh, _leaves(state)))

    wide = dataclasses.replace(TINY, mlp_dim=96)
    with pytest.raises(ValueError, match="mlp_dim: 64 there, 96 here"):
        T.init_state(dataclasses.replace(CFG, model=wide, init_from=str(tmp_path / "m")), mesh)


@pytest.mark.parametrize("arg, msg", [("D3_CMP_F0", "BUCKET=K"), ("D3_CMP_F0=x", "BUCKET=K"),
                                      ("D9_M_F0=2", "unknown bucket 'D9_M_F0'")])
def test_cli_train_rejects_bad_oversample_before_writing(tmp_path, capsys, arg, msg):
    """A malformed --oversample is refused with a message naming it, and no run directory is
    created."""
    from reproduction.cli import gridvqa as gcli

    out = tmp_path / "run"
    rc = gcli.main(["train", "--variant", "pure", "--out", str(out), "--oversample", arg,
                   "--quiet"])
    assert rc == 2
    assert msg in capsys.readouterr().err
    assert not out.exists()


def test_cli_train_rejects_missing_init_from_before_writing(tmp_path, capsys):
    from reproduction.cli import gridvqa as gcli

    out = tmp_path / "run"
    rc = gcli.main(["train", "--variant", "pure", "--out", str(out), "--init-from",
                   str(tmp_path / "nowhere"), "--quiet"])
    assert rc == 2
    assert "nowhere is not an exported model" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("field, value", [("steps", 0), ("steps", -5), ("batch_size", 0),
                                          ("save_every", 0), ("log_every", -1),
                                          ("warmup_steps", -1), ("lr", 0.0),
                                          ("lr", float("nan")), ("hires_frac", 1.5)])
def test_train_config_rejects_bad_sizes(field, value):
    """Zero / negative sizes and non-finite rates are refused, naming the field (they used to
    train 0 steps or the default number of steps silently)."""
    with pytest.raises(InputError, match=rf"TrainConfig\.{field} must"):
        dataclasses.replace(CFG, **{field: value})


def _params_equal(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(np.array_equal(np.asarray(x), np.asarray(y))
                                      for x, y in zip(la, lb))


def test_export_refuses_to_overwrite_and_never_leaves_half_an_export(tmp_path, monkeypatch):
    p1, p2 = M.init_params(TINY, jax.random.key(1)), M.init_params(TINY, jax.random.key(2))
    dest = tmp_path / "m"
    EX.export_model(dest, p1, TINY, {"variant": "pure"})
    assert sorted(os.listdir(tmp_path)) == ["m"]  # no staging directory left beside it
    assert sorted(os.listdir(dest)) == ["config.json", "params.msgpack"]
    with pytest.raises(ExportError, match="already exists; refusing to overwrite"):
        EX.export_model(dest, p2, TINY)
    assert _params_equal(EX.load_model(dest)[1], p1)
    EX.export_model(dest, p2, TINY, {"variant": "spur"}, overwrite=True)
    _, got, cfg = EX.load_model(dest)
    assert _params_equal(got, p2) and EX.load_meta(dest)["variant"] == "spur" and cfg == TINY
    assert sorted(os.listdir(tmp_path)) == ["m"]
    # A directory holding anything besides an export is never replaced.
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(ExportError, match="holds more than an export"):
        EX.export_model(tmp_path / "run", p1, TINY, overwrite=True)
    # A write that fails half-way leaves the old export whole and nothing else behind.
    from flax import serialization

    def boom(_):
        raise OSError("disk full")

    monkeypatch.setattr(serialization, "to_bytes", boom)
    for target in (dest, tmp_path / "new"):
        with pytest.raises(OSError, match="disk full"):
            EX.export_model(target, p1, TINY, overwrite=True)
    assert sorted(os.listdir(tmp_path)) == ["m", "run"]
    assert _params_equal(EX.load_model(dest)[1], p2)


def test_train_refuses_a_taken_export_before_writing(tmp_path):
    EX.export_model(tmp_path / "m", M.init_params(TINY, jax.random.key(1)), TINY)
    with pytest.raises(ExportError, match="refusing to overwrite"):
        T.train(CFG, tmp_path / "run", export=str(tmp_path / "m"), progress=False,
                log=lambda *_: None)
    assert not (tmp_path / "run").exists()


def test_damaged_exports_raise_export_error(tmp_path):
    params = M.init_params(TINY, jax.random.key(0))
    good = tmp_path / "good"
    EX.export_model(good, params, TINY)
    raw, doc = (good / "params.msgpack").read_bytes(), json.loads((good / "config.json").read_text())

    def variant(name, params_bytes=raw, config_text=None):
        d = tmp_path / name
        d.mkdir()
        if params_bytes is not None:
            (d / "params.msgpack").write_bytes(params_bytes)
        if config_text is not None or name != "no_config":
            (d / "config.json").write_text(json.dumps(doc) if config_text is None else config_text)
        return d

    wide = {**doc, "model": {**doc["model"], "mlp_dim": 96}}
    from flax import serialization

    fewer = dict(params)
    fewer.pop(sorted(fewer)[0])
    cases = [
        (tmp_path / "nowhere", "is not an exported model"),
        (variant("no_params", params_bytes=None), "is not an exported model"),
        (variant("no_config"), "is not an exported model"),
        (variant("truncated", params_bytes=raw[: len(raw) // 2]), "corrupt or truncated"),
        (variant("garbage", params_bytes=b"\x00garbage"), "corrupt or truncated"),
        (variant("not_json", config_text="{\"model\": "), "not JSON"),
        (variant("no_model_key", config_text=json.dumps({"variant": "pure"})), "'model'"),
        (variant("stale_key", config_text=json.dumps(
            {"model": {**doc["model"], "cell_size": 3}})), "unknown model config fields"),
        (variant("other_arch", config_text=json.dumps(wide)), "shapes do not match"),
        (variant("missing_leaf", params_bytes=serialization.to_bytes(fewer)), "missing"),
    ]
    for path, msg in cases:
        with pytest.raises(ExportError, match=msg):
            EX.load_model(path)


def test_cli_train_export_refuses_the_shipped_model_without_overwrite(tmp_path, capsys):
    """The README's fine-tune command (``--export checkpoints/m_pure``) refuses to replace the
    shipped model unless ``--overwrite`` is given; nothing is written."""
    from reproduction.cli import gridvqa as gcli

    shipped = EX.CHECKPOINTS / "m_pure"
    before = {f: (shipped / f).stat().st_mtime_ns for f in os.listdir(shipped)}
    out = tmp_path / "runs" / "pure_ft"
    rc = gcli.main(["train", "--variant", "pure", "--out", str(out), "--steps", "2",
                   "--export", str(shipped), "--quiet"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "m_pure already exists; refusing to overwrite it" in err and "--overwrite" in err
    assert not out.exists()
    assert {f: (shipped / f).stat().st_mtime_ns for f in os.listdir(shipped)} == before
    assert gcli.build_parser().parse_args(["train", "--variant", "pure", "--out", "x",
                                          "--export", "y", "--overwrite"]).overwrite


# ----------------------------------------------------------------------------------------------
# The shared loop (mmx_base.loop.run) on a toy trainer: metrics fetched at log and save steps
# only, the same logged numbers, NaN caught before any checkpoint past it.
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _ToyConfig:
    steps: int = 10
    save_every: int = 5
    log_every: int = 4

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d):
        return cls(**d)


def _toy_losses(n, nan_at=None):
    loss = np.float32(1.0) / (np.arange(n, dtype=np.float32) + np.float32(3.0))
    if nan_at is not None:
        loss[nan_at] = np.nan
    return loss


def _toy_run(tmp_path, monkeypatch, cfg, losses, evaluate=None):
    import jax.numpy as jnp

    from mmx_base import loop as L

    fetched = []
    real = L.fetch_metrics

    def counting(pending, *a):
        fetched.append([s for s, _ in pending])
        return real(pending, *a)

    monkeypatch.setattr(L, "fetch_metrics", counting)

    def advance(state, step):
        loss = jnp.asarray(losses[step])
        return {"params": state["params"] + 1}, {"loss": loss, "acc": loss * 2}

    _, summary = L.run(cfg, tmp_path, init_state=lambda: {"params": jnp.zeros(2)},
                       advance=advance, progress=False, log=lambda *_: None, evaluate=evaluate)
    return summary, fetched


def test_loop_fetches_metrics_only_at_log_and_save_steps(tmp_path, monkeypatch):
    from mmx_base import loop as L

    cfg = _ToyConfig()
    losses = _toy_losses(cfg.steps)
    summary, fetched = _toy_run(tmp_path, monkeypatch, cfg, losses)
    # done = 4 (log), 5 (save), 8 (log), 10 (log + save, the end): four fetches covering every
    # step once, in order.
    assert fetched == [[0, 1, 2, 3], [4], [5, 6, 7], [8, 9]]
    recs = [r for r in L.read_metrics(tmp_path / L.METRICS) if "loss" in r]
    assert [r["step"] for r in recs] == [4, 8, 10]
    # The window mean of the per-step floats, as float64 (the numbers logged before).
    for rec, window in zip(recs, ([0, 1, 2, 3], [4, 5, 6, 7], [8, 9])):
        want = float(np.mean([float(losses[i]) for i in window]))
        assert rec["loss"] == want
        assert rec["acc"] == float(np.mean([float(np.float32(losses[i] * 2)) for i in window]))
    assert summary["last"]["step"] == 10


def test_loop_nan_is_caught_before_a_checkpoint_or_eval_past_it(tmp_path, monkeypatch):
    cfg = _ToyConfig(steps=10, save_every=5, log_every=10)

    def evaluate(state, done):  # an evaluation after step 4 (done = 4), before the save at 5
        return {"eval_acc": 1.0} if done == 4 else None

    with pytest.raises(FloatingPointError, match=r"non-finite loss \(nan\) at step 2 .* "
                                                 r"last checkpoint is step None"):
        _toy_run(tmp_path, monkeypatch, cfg, _toy_losses(10, nan_at=2), evaluate)
    assert not (tmp_path / "ckpt").exists() or not any((tmp_path / "ckpt").iterdir())
    assert (tmp_path / "metrics.jsonl").read_text() == ""  # no eval record past the NaN
