"""Two-phase training of the MDETR-style reference models (M_pure on D_pure, M_spur on D_spur).

* Data stream straight from the JAX generator: the batch of step t holds samples
  ``[t*B/K, (t+1)*B/K)`` of the training dataset of each of the K densities (default d03, d07),
  rendered on the fly
  (``hires_frac`` of them at the official 64 px and area-downsampled, the rest at ``cell_px``), so
  a step's batch is a pure function of (config, t) and a resumed run sees the same data.
  Training seeds (``data_seed + density index``) are disjoint from the evaluation seeds
  (``evaluate.EVAL_SEED``).
* Phase 1 (steps < ``phase1_steps``), grounding: ``L = L_cell + L_set + L_type`` with the MDETR
  set loss ``L_set = 1*CE + 5*L1 + 2*GIoU`` (Hungarian matched, no-object weight 0.1) on the
  ground-truth boxes (anchors + targets), ``L_cell`` the per-cell role cross-entropy and
  ``L_type`` the answer-type cross-entropy.
  Phase 2, QA: ``L = q_t sum_i w(a_i) CE(answer_i) / sum_i w(a_i) + aux * (phase-1 loss)``
  with ``w(a) = 1 / freq(a)`` (clipped) measured on the first samples of the training stream
  and the ramp ``q_t = min(1, (t - phase1_steps + 1) / qa_ramp_steps)`` (``phase_weights``).
* ``optim.make_optimizer``: AdamW, linear warm-up + cosine decay, global-norm clipping.
* The loop is ``loop.run`` (shared with the bias detectors): one global-view ``jit`` over a
  ``('data',)`` mesh, batch sharded with ``NamedSharding(mesh, P('data'))``, params replicated;
  Orbax checkpoints every ``save_every`` steps (and at the end), ``resume=True`` continues from
  the latest one; metrics go to ``metrics.jsonl``; a non-finite loss stops training with
  ``FloatingPointError`` naming the step; the final parameters are exported
  (``export_format``).
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from gridvqa_jax.world import generate as G
from gridvqa_jax.world import render as R
from gridvqa_jax.world import universe as U
from gridvqa_jax.models import matching as Mt
from gridvqa_jax.models import mdetr as M
from mmx_base.trees import n_params
from mmx_base import loop as L
from gridvqa_jax.training.config import TrainConfig
from gridvqa_jax.training.export import export_model, load_meta, load_model
from mmx_base.optim import make_optimizer


def train_specs(cfg: TrainConfig) -> list[U.Spec]:
    """One generator spec per training density (every bucket that density can hold), with the
    buckets named in ``cfg.oversample`` repeated in the round-robin table."""
    S = cfg.model.grid_size
    factor = dict(cfg.oversample)
    specs = []
    for k in cfg.densities:
        spec = U.Spec.feasible(cfg.variant, S, U.DENSITIES[k])[0]
        table = tuple(b for b in spec.buckets for _ in range(factor.get(U.BUCKETS[b].name, 1)))
        specs.append(dataclasses.replace(spec, buckets=table))
    return specs


# ----------------------------------------------------------------------------------------------
# Batches
# ----------------------------------------------------------------------------------------------
@functools.partial(jax.jit, static_argnames=("cell_px", "n_hires"))
def render_mixed(color, shape, cell_px: int, n_hires: int = 0):
    """float32 [B, S*cell_px, S*cell_px, 3] in 0..255: scenes drawn at ``cell_px``; the first
    ``n_hires`` are drawn at 64 px and area-averaged down instead (as evaluation treats the
    official 64-px images)."""
    img = jax.vmap(lambda c, s: R.render(c, s, cell_px))(color, shape).astype(jnp.float32)
    if n_hires:
        hi = jax.vmap(lambda c, s: R.render(c, s, 64))(color[:n_hires], shape[:n_hires])
        H = img.shape[1]
        f = hi.shape[1] // H
        hi = hi.astype(jnp.float32).reshape(n_hires, H, f, H, f, 3).mean(axis=(2, 4))
        img = img.at[:n_hires].set(hi)
    return img


def scene_targets(scene, n_cells: int) -> dict:
    """Training targets of a Scene batch (arrays with leading batch axis)."""
    B = scene.role.shape[0]
    role = scene.role.reshape(B, -1)
    clause = scene.clause.reshape(B, -1)
    cell_label = jnp.where(role == U.ANCHOR, 1,
                           jnp.where(role == U.TARGET, 2 + jnp.clip(clause, 0, 1), 0))
    boxes, mask = scene.gt_boxes
    return {
        "tokens": scene.tokens,
        "cell_label": cell_label.astype(jnp.int32),
        "gt_boxes": boxes,
        "gt_mask": mask,
        "answer": M.answer_index(scene.answer, scene.is_yesno, n_cells),
        "atype": M.answer_type(scene.qtype, scene.is_yesno),
        "bucket": scene.bucket,
    }


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _assemble(parts, n_cells: int, cell_px: int, n_hires: int):
    """Concatenate per-density Scene batches into one training batch (targets + images)."""
    scene = jax.tree.map(lambda *xs: jnp.concatenate(xs), *parts)
    batch = scene_targets(scene, n_cells)
    imgs = [render_mixed(p.color, p.shape, cell_px, n_hires) for p in parts]
    batch["image"] = jnp.concatenate(imgs)
    return batch


def make_batch(cfg: TrainConfig, specs, step: int, mesh) -> dict:
    """The (deterministic) training batch of ``step``; arrays sharded over the mesh."""
    n = len(specs)
    if cfg.batch_size % n:
        raise ValueError(f"batch_size {cfg.batch_size} must split evenly over {n} densities")
    share = cfg.batch_size // n
    parts = [G.generate_chunk(s, cfg.data_seed + i, step * share, share, mesh)
             for i, s in enumerate(specs)]
    batch = _assemble(parts, cfg.model.n_cells, cfg.model.cell_px,
                      int(round(cfg.hires_frac * share)))
    return L.shard_batch(batch, mesh)


def answer_weights(cfg: TrainConfig, specs, mesh) -> np.ndarray:
    """Inverse answer-class frequencies on the first ``freq_samples`` training samples.

    float32 [C+3]; weights are normalised to mean 1 over those samples and clipped at
    ``max_answer_weight``; classes never seen get the clip value.
    """
    C = cfg.model.n_cells
    counts = np.zeros(C + 3)
    per = max(1, cfg.freq_samples // len(specs))
    for i, s in enumerate(specs):
        sc = G.generate_chunk(s, cfg.data_seed + i, 0, per, mesh)
        a = np.asarray(M.answer_index(sc.answer, sc.is_yesno, C))
        counts += np.bincount(a, minlength=C + 3)
    freq = counts / counts.sum()
    w = np.where(counts > 0, 1.0 / np.maximum(freq, 1e-12), 0.0)
    w = w / np.sum(freq * w)  # mean weight 1 over the stream
    w = np.where(counts > 0, np.minimum(w, cfg.max_answer_weight), cfg.max_answer_weight)
    return w.astype(np.float32)


# ----------------------------------------------------------------------------------------------
# Loss and step
# ----------------------------------------------------------------------------------------------
def loss_fn(params, batch, apply_fn, qa_weight, ground_weight, ans_w):
    """Total loss and metrics of one batch. qa_weight / ground_weight are traced scalars so both
    phases share one compiled step."""
    out = apply_fn(params, batch["image"], batch["tokens"])
    cell_ce = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(
        out["cell_logits"], batch["cell_label"]))
    set_loss, parts = Mt.detr_loss(out["pred_boxes"], out["pred_logits"], batch["gt_boxes"],
                                   batch["gt_mask"])
    type_ce = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(
        out["type_logits"], batch["atype"]))
    ground = cell_ce + set_loss + type_ce
    w = ans_w[batch["answer"]]
    nll = -jnp.take_along_axis(out["answer_logprobs"], batch["answer"][:, None], axis=1)[:, 0]
    qa = jnp.sum(w * nll) / jnp.sum(w)
    loss = qa_weight * qa + ground_weight * ground
    pred = jnp.argmax(out["answer_logprobs"], axis=-1)
    metrics = {"loss": loss, "qa_ce": qa, "cell_ce": cell_ce, "set_loss": set_loss,
               "type_ce": type_ce, "acc": jnp.mean(pred == batch["answer"]),
               "cell_acc": jnp.mean(jnp.argmax(out["cell_logits"], -1) == batch["cell_label"]),
               **parts}
    return loss, metrics


def optimizer(cfg: TrainConfig):
    """``optim.make_optimizer`` with the run's settings: (optax transform, lr schedule)."""
    return make_optimizer(lr=cfg.lr, steps=cfg.steps, warmup_steps=cfg.warmup_steps,
                          weight_decay=cfg.weight_decay, clip_norm=cfg.clip_norm,
                          end_lr_frac=cfg.end_lr_frac)


def make_step(cfg: TrainConfig, mesh):
    """Jitted ``step(state, batch, qa_w, ground_w, ans_w) -> (state, metrics)`` over the mesh
    (state donated, outputs replicated: ``loop.jit_step``)."""
    apply_fn = M.make_apply(cfg.model)
    tx, _ = optimizer(cfg)

    def step(state, batch, qa_w, ground_w, ans_w):
        params, opt_state = state["params"], state["opt_state"]
        (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            params, batch, apply_fn, qa_w, ground_w, ans_w)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        metrics["grad_norm"] = optax.tree_utils.tree_norm(grads)
        return {"params": params, "opt_state": opt_state, "step": state["step"] + 1}, metrics

    return L.jit_step(step, mesh)


def load_init_params(cfg: TrainConfig):
    """(params, parent) of ``cfg.init_from``, an exported model or a training run directory.

    The architecture must equal ``cfg.model`` (ValueError naming the differing fields otherwise).
    ``parent`` = {"path", "steps", "wall_s"}: what that model cost (totals when it was itself
    fine-tuned; for a run directory, its latest step and the wall time logged up to it).
    """
    params, meta = load_model(cfg.init_from).params, load_meta(cfg.init_from)
    theirs = M.ModelConfig.from_dict(meta["model"])
    if theirs != cfg.model:
        diff = [f"{f.name}: {getattr(theirs, f.name)!r} there, {getattr(cfg.model, f.name)!r} here"
                for f in dataclasses.fields(theirs)
                if getattr(theirs, f.name) != getattr(cfg.model, f.name)]
        raise ValueError(f"--init-from {cfg.init_from}: different architecture ({'; '.join(diff)})")
    if "summary" in meta:
        done = meta["summary"]
        steps = done.get("total_steps", done.get("steps_done"))
        wall = done.get("total_wall_s", done.get("wall_s"))
    else:  # a run directory: load_model gave its latest checkpoint step
        steps = meta.get("step")
        wall = L.logged_elapsed(Path(cfg.init_from) / L.METRICS, steps) if steps else None
    return params, {"path": str(cfg.init_from), "steps": steps, "wall_s": wall}


def init_state(cfg: TrainConfig, mesh, params=None):
    """Replicated {params, opt_state, step}: ``params`` if given, else loaded from ``init_from``,
    else random (``init_seed``); the optimiser state always starts fresh."""
    if params is None:
        params = (load_init_params(cfg)[0] if cfg.init_from
                  else M.init_params(cfg.model, jax.random.key(cfg.init_seed)))
    tx, _ = optimizer(cfg)
    state = {"params": params, "opt_state": tx.init(params), "step": jnp.int32(0)}
    return L.replicate(state, mesh)


def phase_weights(cfg: TrainConfig, step: int) -> tuple[float, float]:
    """(qa_weight, ground_weight) at ``step``: grounding only in phase 1, then the QA loss
    ramped in linearly over ``qa_ramp_steps`` with the grounding loss kept at ``aux_weight``.

    Why the ramp: switching the weighted QA loss on at once threw M_pure back from 0.87 to 0.40
    training answer accuracy for ~800 steps. With the ramp (500 steps) the
    shipped M_pure still fell from 0.997 to 0.86 and recovered in ~600 steps: Adam is
    scale-invariant, so once the grounding gradients are near zero even a small QA term sets the
    update direction. The ramp softens the switch; it cannot remove it.
    """
    if step < cfg.phase1_steps:
        return 0.0, 1.0
    ramp = min(1.0, (step - cfg.phase1_steps + 1) / max(cfg.qa_ramp_steps, 1))
    return ramp, cfg.aux_weight


# ----------------------------------------------------------------------------------------------
def train(cfg: TrainConfig, out, resume: bool = False, mesh=None, progress: bool = True,
          export: str | None = None, stop_after: int | None = None, log=print,
          overwrite: bool = False) -> dict:
    """Run (or resume) training in the run directory ``out`` (``loop.run``: checkpoints,
    metrics.jsonl, refusal checks, NaN stop); returns the summary dict plus ``"state"``.

    ``stop_after`` ends the run early at that step (after saving), as if killed at a save
    boundary (used by tests). ``export`` receives ``params.msgpack`` + ``config.json``
    (``{"model", "variant", "train", "summary"}``) when all ``cfg.steps`` are done; an existing
    export there is replaced only with ``overwrite=True``. The summary also holds
    ``init_from`` (the parent's path, steps and wall time) and the totals ``total_steps`` /
    ``total_wall_s`` when the run started from another model whose own wall time is known.
    """
    out = Path(out)
    mesh = G.data_mesh() if mesh is None else mesh
    parent = {}

    def prepare():  # before anything is written: a bad --init-from leaves no run directory
        L.check_batch_split(cfg.batch_size, mesh, len(cfg.densities))
        if cfg.init_from:
            parent["params"], parent["info"] = load_init_params(cfg)

    specs, ans_w = [], []

    def init():
        specs.extend(train_specs(cfg))
        ans_w.append(jnp.asarray(answer_weights(cfg, specs, mesh)))
        return init_state(cfg, mesh, parent.get("params"))

    step_fn = make_step(cfg, mesh)

    def advance(state, step):
        qa_w, g_w = phase_weights(cfg, step)
        return step_fn(state, make_batch(cfg, specs, step, mesh), jnp.float32(qa_w),
                       jnp.float32(g_w), ans_w[0])

    def evaluate(state, done):
        if not (cfg.eval_every and (done % cfg.eval_every == 0 or done == cfg.steps)):
            return None
        from gridvqa_jax import evaluate as E

        apply_fn = jax.jit(M.make_apply(cfg.model))
        res = E.evaluate_model(apply_fn, state["params"], cfg.variant, n=cfg.eval_n,
                               densities=cfg.densities, mesh=mesh, progress=False)
        worst = min(res["buckets"].items(), key=lambda kv: kv[1])
        log(f"step {done}: held-out accuracy {res['overall']:.4f} (worst {worst[0]} "
            f"{worst[1]:.3f})")
        return {"eval": res["buckets"], "eval_overall": res["overall"]}

    def summarize(summary):
        info = parent.get("info")
        if info:  # the cost of the model is this run plus the one it started from
            summary["init_from"] = info
            if info["wall_s"] is not None:
                summary["total_wall_s"] = summary["wall_s"] + info["wall_s"]
                summary["total_steps"] = summary["steps_done"] + (info["steps"] or 0)
        return summary

    state, summary = L.run(
        cfg, out, init_state=init, advance=advance, resume=resume, stop_after=stop_after,
        progress=progress, log=log, desc=f"train {cfg.variant}",
        intro=lambda st: (f"model: {n_params(st['params']):,} parameters; training "
                          f"{cfg.variant} for {cfg.steps} steps (phase 1 until "
                          f"{cfg.phase1_steps}), batch {cfg.batch_size}, {mesh.devices.size} "
                          "device(s)"),
        record=lambda step: {"phase": 1 if step < cfg.phase1_steps else 2},
        evaluate=evaluate, summarize=summarize, export=export, overwrite=overwrite,
        export_config=lambda summary: {"model": dataclasses.asdict(cfg.model),
                                       "variant": cfg.variant, "train": cfg.to_dict(),
                                       "summary": summary},
        prepare=prepare)
    return {**summary, "state": state}


__all__ = ["TrainConfig", "train", "make_batch", "make_step", "loss_fn", "answer_weights",
           "init_state", "load_init_params", "export_model", "train_specs", "render_mixed"]
