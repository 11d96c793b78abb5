"""Training of the detectors on the closed-world benchmark (optax AdamW, Orbax resume).

Step ``s`` trains on closed-world samples ``s * B .. s * B + B - 1`` of ``TRAIN_SEED`` (drawn
from ``TrainConfig.world()``), so the data stream is a function of the step alone and a resumed
run sees exactly the batches an uninterrupted one would: resume after an interruption loses at
most ``save_every`` steps and ends with the same parameters.

Loss: ``mean_b BCE(sigmoid(logit_b), label_b == REAL)``, plus for the detectors with cell
gates (joint, lvlm) ``aux_weight * mean_b sum_{i,k<2} BCE(gate_{b,i,k}, target_{b,k,i})``, the
grounding loss: gate 0 (1) should mark the cells holding the claim's first (second) named
object key (``grounding_targets``; none for "more than k objects"). Without it the label is a
conjunction of image and text features each independent of it (the benchmark is built that
way), and gradient descent sits on a long plateau at chance. Optimiser: global-norm clipping, then
AdamW with linear warm-up and cosine decay. Each detector sees only its own modalities
(``detectors.detector_inputs``: the others are the absent inputs).

Files under ``out``: ``train_config.json``, ``ckpt/<step>/`` (Orbax ``CheckpointManager``,
the last two kept), ``metrics.jsonl`` (one JSON object per ``log_every`` steps, and one per
held-out evaluation). A non-finite loss stops the run with ``FloatingPointError`` naming the
step and the last checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bias_jax import detectors as D
from bias_jax import evaluate as E
from bias_jax.data import batch as B
from bias_jax.data import closed_world as CW
from bias_jax.data.batch import REAL

DATA_SOURCES = ("closed_world",)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """One training run (saved as ``train_config.json``; ``--resume`` requires it unchanged)."""

    detector: D.DetectorConfig = D.DetectorConfig()  # architecture
    data: str = "closed_world"  # data source (DATA_SOURCES)
    type_mix: tuple = (0.25, 0.5, 0.25)  # training mix of uni_image / balance / uni_text
    steps: int = 2000  # optimisation steps
    batch_size: int = 64  # samples per step
    lr: float = 2e-3  # peak learning rate
    warmup: int = 100  # linear warm-up steps
    weight_decay: float = 1e-4  # AdamW decoupled weight decay
    clip: float = 1.0  # global gradient-norm clip
    init_seed: int = 0  # parameter initialisation key
    save_every: int = 250  # Orbax checkpoint interval (steps)
    log_every: int = 50  # metrics.jsonl interval (steps)
    eval_every: int = 0  # held-out per-type evaluation interval (0 = only at the end)
    eval_n: int = 1000  # held-out samples per evaluation (0 = none)
    aux_weight: float = 0.2  # joint / lvlm: weight of the grounding loss on gates 0 and 1

    def __post_init__(self):
        object.__setattr__(self, "type_mix", tuple(float(x) for x in self.type_mix))
        if self.data not in DATA_SOURCES:
            raise ValueError(f"unknown --data {self.data!r}; available: {DATA_SOURCES} (real "
                             "benchmarks have no bias labels to train per type on)")
        for f in ("steps", "batch_size", "save_every", "log_every"):
            if getattr(self, f) < 1:
                raise ValueError(f"TrainConfig.{f} must be >= 1, got {getattr(self, f)}")
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, got {self.lr}")

    def world(self) -> CW.WorldSpec:
        """The ``WorldSpec`` training draws from: the detector's grid size, cell px and claim
        length, this run's ``type_mix``, every other field at its default."""
        d = self.detector
        return CW.WorldSpec(grid_size=d.grid_size, cell_px=d.cell_px, type_mix=self.type_mix,
                            max_tokens=d.max_tokens)

    def to_json(self) -> dict:
        """JSON-ready dict of every field (``detector`` nested as a dict, ``type_mix`` a list)."""
        doc = dataclasses.asdict(self)
        doc["type_mix"] = list(self.type_mix)
        return doc

    @classmethod
    def from_json(cls, d: dict) -> "TrainConfig":
        """Inverse of ``to_json`` (needs the ``detector`` and ``type_mix`` keys)."""
        d = dict(d)
        d["detector"] = D.DetectorConfig.from_json(d["detector"])
        d["type_mix"] = tuple(d["type_mix"])
        return cls(**d)


def make_optimizer(cfg: TrainConfig):
    """``(optimizer, schedule)``: global-norm clipping at ``clip``, then AdamW (``weight_decay``)
    on a learning rate rising linearly from 0 to ``lr`` over ``min(warmup, steps)`` steps, then
    cosine-decaying to ``0.02 * lr`` at step ``max(steps, warmup + 1)``."""
    sched = optax.warmup_cosine_decay_schedule(0.0, cfg.lr, min(cfg.warmup, cfg.steps),
                                               max(cfg.steps, cfg.warmup + 1), cfg.lr * 0.02)
    return optax.chain(optax.clip_by_global_norm(cfg.clip),
                       optax.adamw(sched, weight_decay=cfg.weight_decay)), sched


def init_state(cfg: TrainConfig) -> dict:
    """``{"params", "opt_state"}`` at step 0 (a pure function of ``cfg.init_seed``)."""
    params = D.init_params(cfg.detector, jax.random.key(cfg.init_seed))
    opt, _ = make_optimizer(cfg)
    return {"params": params, "opt_state": opt.init(params)}


def grounding_targets(samples: CW.WorldSample) -> np.ndarray:
    """bool [B, 2, C]: cells holding the shown claim's first / second named object key.

    Relation and comparison claims name X then Y; the self claims name one key twice; "there
    are more than k objects" names none (all False). Read from the underlying scene."""
    lat = samples.latents
    color, shape = np.asarray(samples.color), np.asarray(samples.shape)
    B = color.shape[0]
    keys = np.where(color >= 0, 4 * color + shape, -1).reshape(B, -1)
    fam = np.asarray(lat.family)
    none = np.full(B, -2)
    kx = np.where(fam <= CW.F_COMPARISON, lat.key_x,
                  np.where(fam == CW.F_COUNT, none, lat.ut_key))
    ky = np.where(fam <= CW.F_COMPARISON, lat.key_y,
                  np.where(fam == CW.F_COUNT, none, lat.ut_key))
    return np.stack([keys == kx[:, None], keys == ky[:, None]], axis=1)


def loss_fn(cfg: TrainConfig, params, image, tokens, label, ground):
    """Classification BCE (+ ``aux_weight`` x grounding BCE for gated detectors); returns
    (loss, (classification loss, accuracy, grounding loss))."""
    det = cfg.detector
    y = (label == REAL).astype(jnp.float32)
    if det.kind in ("joint", "lvlm") and cfg.aux_weight > 0:
        logits, gates = D.apply_with_gates(det, params, image, tokens)  # gates [B, C, m]
        target = jnp.transpose(ground, (0, 2, 1)).astype(jnp.float32)  # [B, C, 2]
        aux = optax.sigmoid_binary_cross_entropy(gates[..., :2], target).sum(axis=(1, 2)).mean()
    else:
        logits = D.make_apply(det)(params, image, tokens)
        aux = jnp.float32(0.0)
    cls = optax.sigmoid_binary_cross_entropy(logits, y).mean()
    acc = ((logits > 0) == (y > 0.5)).mean()
    return cls + cfg.aux_weight * aux, (cls, acc, aux)


def make_step(cfg: TrainConfig):
    """Jitted ``step(state, image, tokens, label, ground) -> (state, metrics)`` (state
    donated)."""
    opt, _ = make_optimizer(cfg)

    def step(state, image, tokens, label, ground):
        (loss, (cls, acc, aux)), grads = jax.value_and_grad(
            lambda p: loss_fn(cfg, p, image, tokens, label, ground),
            has_aux=True)(state["params"])
        updates, opt_state = opt.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        return ({"params": params, "opt_state": opt_state},
                {"loss": loss, "cls_loss": cls, "acc": acc, "ground_loss": aux,
                 "grad_norm": optax.tree.norm(grads)})

    return jax.jit(step, donate_argnums=(0,))


def make_batch(cfg: TrainConfig, step: int, spec: CW.WorldSpec | None = None):
    """(image, tokens, label, grounding targets [B, 2, C]) of training step ``step`` (host
    numpy; the modalities the detector does not read are absent)."""
    spec = cfg.world() if spec is None else spec
    start = step * cfg.batch_size
    s = CW.generate(spec, E.TRAIN_SEED, start, cfg.batch_size)
    b = B.to_numpy(CW.to_batch(s, spec, np.arange(start, start + cfg.batch_size)))
    image, tokens = D.detector_inputs(cfg.detector.kind, b)
    return image, tokens, b.label, grounding_targets(jax.device_get(s))


def _manager(out: Path):
    import orbax.checkpoint as ocp

    opts = ocp.CheckpointManagerOptions(max_to_keep=2, create=True)
    return ocp.CheckpointManager((out / "ckpt").absolute(), options=opts)


def train(cfg: TrainConfig, out, *, resume: bool = False, export=None, progress: bool = True,
          stop_after: int | None = None, log=print) -> dict:
    """Run or resume training; returns ``{"out", "steps_done", "wall_s", "last", "eval",
    "params"}``. ``stop_after`` ends the run after that step (saving there), as if killed at a
    save boundary. ``export`` (a directory) receives ``params.msgpack`` + ``config.json`` when
    the run completes."""
    import orbax.checkpoint as ocp
    from tqdm.auto import tqdm

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg_path = out / "train_config.json"
    has_ckpt = (out / "ckpt").is_dir() and any((out / "ckpt").iterdir())
    if resume and cfg_path.exists():
        saved = TrainConfig.from_json(json.loads(cfg_path.read_text()))
        if saved != cfg:
            diff = sorted(k for k in cfg.to_json() if cfg.to_json()[k] != saved.to_json()[k])
            raise ValueError(f"--resume with a config different from {cfg_path} (fields "
                             f"{diff}); use the same flags or a new --out")
    elif not resume and has_ckpt:
        raise ValueError(f"{out} already holds checkpoints; pass --resume or use a new --out")
    cfg_path.write_text(json.dumps(cfg.to_json(), indent=1))

    spec = cfg.world()
    state = init_state(cfg)
    mngr = _manager(out)
    start = 0
    if resume and mngr.latest_step() is not None:
        start = int(mngr.latest_step())
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
        state = mngr.restore(start, args=ocp.args.StandardRestore(abstract))
        log(f"resumed from step {start} ({out / 'ckpt'})")
    step_fn = make_step(cfg)
    apply_fn = jax.jit(D.make_apply(cfg.detector))
    end = cfg.steps if stop_after is None else min(cfg.steps, stop_after)
    log(f"{cfg.detector.kind} detector: {D.n_params(state['params']):,} parameters; "
        f"{cfg.steps} steps of {cfg.batch_size} closed-world samples")
    metrics_f = open(out / "metrics.jsonl", "a")
    bar = tqdm(total=cfg.steps, initial=start, desc=f"train {cfg.detector.kind}",
               disable=not progress, file=sys.stderr, dynamic_ncols=True)
    t0 = t_last = time.time()
    window, last, ev = [], {}, None

    def evaluate(done):
        res = E.evaluate_detector(apply_fn, state["params"], cfg.detector, n=cfg.eval_n)
        metrics_f.write(json.dumps({"step": done, "eval": res}) + "\n")
        metrics_f.flush()
        log(f"step {done}: held-out accuracy " + ", ".join(f"{k} {v:.3f}" for k, v in res.items()))
        return res

    try:
        for step in range(start, end):
            state, m = step_fn(state, *make_batch(cfg, step, spec))
            loss = float(m["loss"])
            if not math.isfinite(loss):
                raise FloatingPointError(
                    f"non-finite loss ({loss}) at step {step} of {out}; training stopped. The "
                    f"last checkpoint is step {mngr.latest_step()}; lower --lr or check the data.")
            window.append({k: float(v) for k, v in m.items()})
            bar.update(1)
            done = step + 1
            if done % cfg.log_every == 0 or done == end:
                now = time.time()
                avg = {k: float(np.mean([w[k] for w in window])) for k in window[0]}
                last = {"step": done, "steps_per_s": len(window) / max(now - t_last, 1e-9),
                        "elapsed_s": now - t0, **avg}
                metrics_f.write(json.dumps(last) + "\n")
                metrics_f.flush()
                bar.set_postfix(loss=f"{avg['loss']:.3f}", acc=f"{avg['acc']:.3f}")
                window, t_last = [], now
            if cfg.eval_n and cfg.eval_every and done % cfg.eval_every == 0 and done < cfg.steps:
                evaluate(done)
            if done % cfg.save_every == 0 or done == end:
                mngr.save(done, args=ocp.args.StandardSave(state))
        mngr.wait_until_finished()
    finally:
        bar.close()
        mngr.close()
    if end == cfg.steps and cfg.eval_n:
        ev = evaluate(end)
    metrics_f.close()
    summary = {"out": str(out), "steps_done": end, "wall_s": time.time() - t0, "last": last,
               "eval": ev}
    if export is not None and end == cfg.steps:
        D.export_detector(export, state["params"], cfg.detector,
                          {"train": cfg.to_json(), "summary": summary})
        log(f"exported the final detector to {export}")
    return {**summary, "params": state["params"]}


__all__ = ["TrainConfig", "DATA_SOURCES", "make_optimizer", "init_state", "loss_fn",
           "make_step", "make_batch", "grounding_targets", "train"]
