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
way), and gradient descent sits on a long plateau at chance. Optimiser:
``gridvqa_jax.training.optim.make_optimizer`` (global-norm clipping, then AdamW with linear
warm-up and cosine decay). Each detector sees only its own modalities
(``detectors.detector_inputs``: the others are the absent inputs).

The loop is ``gridvqa_jax.training.loop.run``, shared with the reference models: files under
``out`` are ``train_config.json``, ``ckpt/<step>/`` (Orbax ``CheckpointManager``, the last two
kept) and ``metrics.jsonl`` (one JSON object per ``log_every`` steps, and one per held-out
evaluation; repaired on resume); batches are sharded over a ``('data',)`` mesh, parameters
replicated; wall time counts across resumes; a non-finite loss stops the run with
``FloatingPointError`` naming the step and the last checkpoint; the final detector is exported
in the one export format (``gridvqa_jax.training.export_format``).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bias_jax import detectors as D
from bias_jax import evaluate as E
from bias_jax.data import batch as B
from bias_jax.data import closed_world as CW
from bias_jax.data.batch import REAL
from gridvqa_jax.core.configs import check_ints, check_reals, config_from_dict
from gridvqa_jax.core.errors import InputError
from gridvqa_jax.core.trees import n_params
from gridvqa_jax.training import loop as L
from gridvqa_jax.training.optim import make_optimizer
from gridvqa_jax.world.generate import data_mesh

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
        check_ints(self, ("steps", "batch_size", "save_every", "log_every"), 1)
        check_ints(self, ("warmup", "eval_every", "eval_n"), 0)
        check_reals(self, ("lr", "clip"), positive=True)
        check_reals(self, ("weight_decay", "aux_weight"), positive=False)
        if len(self.type_mix) != 3 or min(self.type_mix) < 0 or not sum(self.type_mix) > 0:
            raise InputError(f"TrainConfig.type_mix must be 3 non-negative shares with a "
                             f"positive sum, got {self.type_mix!r}")

    def world(self) -> CW.WorldSpec:
        """The ``WorldSpec`` training draws from: the detector's grid size, cell px and claim
        length, this run's ``type_mix``, every other field at its default."""
        d = self.detector
        return CW.WorldSpec(grid_size=d.grid_size, cell_px=d.cell_px, type_mix=self.type_mix,
                            max_tokens=d.max_tokens)

    def to_dict(self) -> dict:
        """JSON-ready dict of every field (``detector`` nested as a dict, ``type_mix`` a list)."""
        doc = dataclasses.asdict(self)
        doc["type_mix"] = list(self.type_mix)
        return doc

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        """Inverse of ``to_dict``; unknown keys raise ValueError, missing ones take defaults."""
        d = dict(d)
        d["detector"] = D.DetectorConfig.from_json(d.get("detector", {}))
        d["type_mix"] = tuple(d.get("type_mix", cls.type_mix))
        return config_from_dict(cls, d, "train config")

    to_json, from_json = to_dict, from_dict  # the names DetectorConfig uses


def optimizer(cfg: TrainConfig):
    """``optim.make_optimizer`` with the run's settings (end learning rate ``0.02 * lr``):
    (optax transform, lr schedule)."""
    return make_optimizer(lr=cfg.lr, steps=cfg.steps, warmup_steps=cfg.warmup,
                          weight_decay=cfg.weight_decay, clip_norm=cfg.clip, end_lr_frac=0.02)


def init_state(cfg: TrainConfig, mesh=None) -> dict:
    """``{"params", "opt_state"}`` at step 0 (a pure function of ``cfg.init_seed``), replicated
    over ``mesh`` (default: all devices)."""
    params = D.init_params(cfg.detector, jax.random.key(cfg.init_seed))
    opt, _ = optimizer(cfg)
    return L.replicate({"params": params, "opt_state": opt.init(params)},
                       data_mesh() if mesh is None else mesh)


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


def make_step(cfg: TrainConfig, mesh=None):
    """Jitted ``step(state, image, tokens, label, ground) -> (state, metrics)`` over ``mesh``
    (default: all devices; state donated, outputs replicated: ``loop.jit_step``)."""
    opt, _ = optimizer(cfg)

    def step(state, image, tokens, label, ground):
        (loss, (cls, acc, aux)), grads = jax.value_and_grad(
            lambda p: loss_fn(cfg, p, image, tokens, label, ground),
            has_aux=True)(state["params"])
        updates, opt_state = opt.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        return ({"params": params, "opt_state": opt_state},
                {"loss": loss, "cls_loss": cls, "acc": acc, "ground_loss": aux,
                 "grad_norm": optax.tree.norm(grads)})

    return L.jit_step(step, data_mesh() if mesh is None else mesh)


def make_batch(cfg: TrainConfig, step: int, spec: CW.WorldSpec | None = None):
    """(image, tokens, label, grounding targets [B, 2, C]) of training step ``step`` (host
    numpy; the modalities the detector does not read are absent)."""
    spec = cfg.world() if spec is None else spec
    start = step * cfg.batch_size
    s = CW.generate(spec, E.TRAIN_SEED, start, cfg.batch_size)
    b = B.to_numpy(CW.to_batch(s, spec, np.arange(start, start + cfg.batch_size)))
    image, tokens = D.detector_inputs(cfg.detector.kind, b)
    return image, tokens, b.label, grounding_targets(jax.device_get(s))


def train(cfg: TrainConfig, out, *, resume: bool = False, export=None, progress: bool = True,
          stop_after: int | None = None, log=print, mesh=None, overwrite: bool = False) -> dict:
    """Run or resume training (``loop.run``); returns ``{"out", "steps_done", "wall_s", "last",
    "eval", "params"}``. ``stop_after`` ends the run after that step (saving there), as if killed
    at a save boundary. ``export`` (a directory) receives ``params.msgpack`` + ``config.json``
    (``{"detector", "train", "summary"}``) when the run completes; an existing export there is
    replaced only with ``overwrite=True``. ``mesh``: a ``('data',)`` mesh (default: all
    devices); ``batch_size`` must split evenly over it."""
    mesh = data_mesh() if mesh is None else mesh
    spec = cfg.world()
    step_fn = make_step(cfg, mesh)
    apply_fn = jax.jit(D.make_apply(cfg.detector))
    final = {}

    def advance(state, step):
        return step_fn(state, *L.shard_batch(make_batch(cfg, step, spec), mesh))

    def evaluate(state, done):
        if not cfg.eval_n or not ((cfg.eval_every and done % cfg.eval_every == 0)
                                  or done == cfg.steps):
            return None
        res = E.evaluate_detector(apply_fn, state["params"], cfg.detector, n=cfg.eval_n)
        log(f"step {done}: held-out accuracy " + ", ".join(f"{k} {v:.3f}" for k, v in res.items()))
        if done == cfg.steps:
            final["eval"] = res
        return {"eval": res}

    state, summary = L.run(
        cfg, out, init_state=lambda: init_state(cfg, mesh), advance=advance, resume=resume,
        stop_after=stop_after, progress=progress, log=log, desc=f"train {cfg.detector.kind}",
        intro=lambda st: (f"{cfg.detector.kind} detector: {n_params(st['params']):,} "
                          f"parameters; {cfg.steps} steps of {cfg.batch_size} closed-world "
                          f"samples, {mesh.devices.size} device(s)"),
        evaluate=evaluate, summarize=lambda s: {**s, "eval": final.get("eval")},
        export=export, overwrite=overwrite,
        export_config=lambda s: {"detector": cfg.detector.to_json(), "train": cfg.to_dict(),
                                 "summary": s},
        prepare=lambda: L.check_batch_split(cfg.batch_size, mesh))
    return {**summary, "params": state["params"]}


__all__ = ["TrainConfig", "DATA_SOURCES", "optimizer", "init_state", "loss_fn",
           "make_step", "make_batch", "grounding_targets", "train"]
