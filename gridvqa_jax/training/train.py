"""Two-phase training of the MDETR-style reference models (M_pure on D_pure, M_spur on D_spur).

* Data stream straight from the JAX generator: the batch of step t holds samples
  ``[t*B/2, (t+1)*B/2)`` of the training dataset of each density (d03, d07), rendered on the fly
  (``hires_frac`` of them at the official 64 px and area-downsampled, the rest at ``cell_px``), so
  a step's batch is a pure function of (config, t) and a resumed run sees the same data.
  Training seeds (``data_seed + density index``) are disjoint from the evaluation seeds
  (``evaluate.EVAL_SEED``).
* Phase 1 (steps < ``phase1_steps``), grounding: ``L = L_cell + L_set + L_type`` with the MDETR
  set loss ``L_set = 1*CE + 5*L1 + 2*GIoU`` (Hungarian matched, no-object weight 0.1) on the
  ground-truth boxes (anchors + targets), ``L_cell`` the per-cell role cross-entropy and
  ``L_type`` the answer-type cross-entropy.
  Phase 2, QA: ``L = sum_i w(a_i) CE(answer_i) / sum_i w(a_i) + aux * (phase-1 loss)`` with
  ``w(a) = 1 / freq(a)`` (clipped) measured on the first samples of the training stream.
* optax AdamW, linear warm-up + cosine decay, global-norm clipping; one global-view ``jit`` over a
  ``('data',)`` mesh, batch sharded with ``NamedSharding(mesh, P('data'))``, params replicated.
* Orbax ``CheckpointManager`` every ``save_every`` steps (and at the end), ``resume=True``
  continues from the latest checkpoint; metrics go to ``metrics.jsonl``; a non-finite loss stops
  training with ``FloatingPointError`` naming the step.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from gridvqa_jax.world import generate as G
from gridvqa_jax.world import render as R
from gridvqa_jax.world import universe as U
from gridvqa_jax.models import matching as Mt
from gridvqa_jax.models import mdetr as M
from gridvqa_jax.training.config import TrainConfig
from gridvqa_jax.training.export import export_model, load_model


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
    return jax.device_put(batch, NamedSharding(mesh, P("data")))


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


def make_optimizer(cfg: TrainConfig):
    """(optax transform, lr schedule): global-norm clipping, then AdamW with a linear warm-up to
    ``lr`` and cosine decay to ``lr * end_lr_frac`` at ``steps``."""
    sched = optax.warmup_cosine_decay_schedule(
        0.0, cfg.lr, cfg.warmup_steps, max(cfg.steps, cfg.warmup_steps + 1),
        end_value=cfg.lr * cfg.end_lr_frac)
    return optax.chain(optax.clip_by_global_norm(cfg.clip_norm),
                       optax.adamw(sched, weight_decay=cfg.weight_decay)), sched


def make_step(cfg: TrainConfig, mesh):
    """Jitted ``step(state, batch, qa_w, ground_w, ans_w) -> (state, metrics)`` over the mesh."""
    apply_fn = M.make_apply(cfg.model)
    tx, _ = make_optimizer(cfg)
    repl = NamedSharding(mesh, P())

    def step(state, batch, qa_w, ground_w, ans_w):
        params, opt_state = state["params"], state["opt_state"]
        (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            params, batch, apply_fn, qa_w, ground_w, ans_w)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        metrics["grad_norm"] = optax.tree_utils.tree_norm(grads)
        return {"params": params, "opt_state": opt_state, "step": state["step"] + 1}, metrics

    return jax.jit(step, donate_argnums=(0,), out_shardings=(repl, repl))


def load_init_params(cfg: TrainConfig):
    """(params, parent) of ``cfg.init_from``, an exported model or a training run directory.

    The architecture must equal ``cfg.model`` (ValueError naming the differing fields otherwise).
    ``parent`` = {"path", "steps", "wall_s"}: what that model cost (totals when it was itself
    fine-tuned; for a run directory, its latest step and the wall time logged up to it).
    """
    _, params, meta = load_model(cfg.init_from)
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
        wall = _logged_elapsed(Path(cfg.init_from) / "metrics.jsonl", steps) if steps else None
    return params, {"path": str(cfg.init_from), "steps": steps, "wall_s": wall}


def init_state(cfg: TrainConfig, mesh, params=None):
    """Replicated {params, opt_state, step}: ``params`` if given, else loaded from ``init_from``,
    else random (``init_seed``); the optimiser state always starts fresh."""
    if params is None:
        params = (load_init_params(cfg)[0] if cfg.init_from
                  else M.init_params(cfg.model, jax.random.key(cfg.init_seed)))
    tx, _ = make_optimizer(cfg)
    state = {"params": params, "opt_state": tx.init(params), "step": jnp.int32(0)}
    return jax.device_put(state, NamedSharding(mesh, P()))


def phase_weights(cfg: TrainConfig, step: int) -> tuple[float, float]:
    """(qa_weight, ground_weight) at ``step``: grounding only in phase 1, then the QA loss
    ramped in linearly over ``qa_ramp_steps`` with the grounding loss kept at ``aux_weight``.

    Why the ramp: switching the weighted QA loss on at once threw M_pure back from 0.87 to 0.40
    training answer accuracy for ~800 steps (issue 3 notes). With the ramp (500 steps) the
    shipped M_pure still fell from 0.997 to 0.86 and recovered in ~600 steps: Adam is
    scale-invariant, so once the grounding gradients are near zero even a small QA term sets the
    update direction. The ramp softens the switch; it cannot remove it.
    """
    if step < cfg.phase1_steps:
        return 0.0, 1.0
    ramp = min(1.0, (step - cfg.phase1_steps + 1) / max(cfg.qa_ramp_steps, 1))
    return ramp, cfg.aux_weight


# ----------------------------------------------------------------------------------------------
# Checkpoints and export
# ----------------------------------------------------------------------------------------------
def _manager(out: Path, cfg: TrainConfig):
    import orbax.checkpoint as ocp

    opts = ocp.CheckpointManagerOptions(max_to_keep=2, save_interval_steps=1, create=True)
    return ocp.CheckpointManager((out / "ckpt").absolute(), options=opts)


def _logged_elapsed(metrics_path: Path, upto: int) -> float:
    """Largest ``elapsed_s`` logged at a step <= ``upto`` in a run's metrics.jsonl (0 if none)."""
    best = 0.0
    if metrics_path.exists():
        for line in metrics_path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by a kill
                continue
            if "elapsed_s" in rec and rec.get("step", upto + 1) <= upto:
                best = max(best, float(rec["elapsed_s"]))
    return best


def _jsonable(tree):
    return {k: float(v) for k, v in jax.device_get(tree).items()}


# ----------------------------------------------------------------------------------------------
def train(cfg: TrainConfig, out, resume: bool = False, mesh=None, progress: bool = True,
          export: str | None = None, stop_after: int | None = None, log=print) -> dict:
    """Run (or resume) training; returns a summary dict. ``stop_after`` ends the run early at
    that step (after saving), as if killed at a save boundary (used by tests)."""
    import orbax.checkpoint as ocp
    from tqdm.auto import tqdm

    out = Path(out)
    mesh = G.data_mesh() if mesh is None else mesh
    # Load the starting point before anything is written, so a bad --init-from leaves no run dir.
    params0, parent = load_init_params(cfg) if cfg.init_from else (None, None)
    if cfg.batch_size % (len(cfg.densities) * mesh.devices.size):
        raise ValueError(f"batch_size {cfg.batch_size} must be a multiple of "
                         f"{len(cfg.densities)} densities x {mesh.devices.size} devices")
    out.mkdir(parents=True, exist_ok=True)
    cfg_path = out / "train_config.json"
    if resume and cfg_path.exists():
        saved = TrainConfig.from_dict(json.loads(cfg_path.read_text()))
        if saved != cfg:
            raise ValueError(f"--resume with a different config than {cfg_path}; "
                             "use the same flags or a new --out")
    elif not resume and (out / "ckpt").exists() and any((out / "ckpt").iterdir()):
        raise ValueError(f"{out} already holds checkpoints; pass --resume or use a new --out")
    cfg_path.write_text(json.dumps(cfg.to_dict(), indent=1))

    specs = train_specs(cfg)
    ans_w = jnp.asarray(answer_weights(cfg, specs, mesh))
    state = init_state(cfg, mesh, params0)
    mngr = _manager(out, cfg)
    start = 0
    if resume and mngr.latest_step() is not None:
        start = mngr.latest_step()
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
        state = mngr.restore(start, args=ocp.args.StandardRestore(abstract))
        log(f"resumed from step {start} ({out / 'ckpt'})")
    step_fn = make_step(cfg, mesh)
    metrics_f = open(out / "metrics.jsonl", "a")
    if metrics_f.tell() and not (out / "metrics.jsonl").read_bytes().endswith(b"\n"):
        metrics_f.write("\n")  # a kill mid-line must not glue the next record onto it
    log(f"model: {M.n_params(state['params']):,} parameters; training {cfg.variant} for "
        f"{cfg.steps} steps (phase 1 until {cfg.phase1_steps}), batch {cfg.batch_size}, "
        f"{mesh.devices.size} device(s)")
    end = cfg.steps if stop_after is None else min(cfg.steps, stop_after)
    bar = tqdm(total=cfg.steps, initial=start, desc=f"train {cfg.variant}", disable=not progress,
               file=sys.stderr, dynamic_ncols=True)
    # Wall time counts across resumes: continue from the last logged elapsed_s of this run.
    t0 = time.time() - (_logged_elapsed(out / "metrics.jsonl", start) if start else 0.0)
    t_last, window = time.time(), []
    last = {}
    for step in range(start, end):
        batch = make_batch(cfg, specs, step, mesh)
        qa_w, g_w = phase_weights(cfg, step)
        state, m = step_fn(state, batch, jnp.float32(qa_w), jnp.float32(g_w), ans_w)
        loss = float(m["loss"])
        if not math.isfinite(loss):
            metrics_f.close()
            bar.close()
            raise FloatingPointError(
                f"non-finite loss ({loss}) at step {step} of {out}; training stopped. The last "
                f"checkpoint is step {mngr.latest_step()}; lower --lr or check the data.")
        window.append(m)
        bar.update(1)
        done = step + 1
        if done % cfg.log_every == 0 or done == end:
            avg = {k: float(np.mean([float(w[k]) for w in window])) for k in window[0]}
            now = time.time()
            rec = {"step": done, "phase": 1 if step < cfg.phase1_steps else 2,
                   "steps_per_s": len(window) / max(now - t_last, 1e-9),
                   "elapsed_s": now - t0, **avg}
            metrics_f.write(json.dumps(rec) + "\n")
            metrics_f.flush()
            bar.set_postfix(loss=f"{avg['loss']:.3f}", acc=f"{avg['acc']:.3f}")
            window, t_last, last = [], now, rec
        if cfg.eval_every and (done % cfg.eval_every == 0 or done == cfg.steps):
            from gridvqa_jax import evaluate as E

            apply_fn = jax.jit(M.make_apply(cfg.model))
            res = E.evaluate_model(apply_fn, state["params"], cfg.variant, n=cfg.eval_n,
                                   densities=cfg.densities, mesh=mesh, progress=False)
            rec = {"step": done, "eval": res["buckets"], "eval_overall": res["overall"]}
            metrics_f.write(json.dumps(rec) + "\n")
            metrics_f.flush()
            worst = min(res["buckets"].items(), key=lambda kv: kv[1])
            log(f"step {done}: held-out accuracy {res['overall']:.4f} (worst {worst[0]} "
                f"{worst[1]:.3f})")
        if done % cfg.save_every == 0 or done == end:
            mngr.save(done, args=ocp.args.StandardSave(state))
    mngr.wait_until_finished()
    metrics_f.close()
    bar.close()
    summary = {"out": str(out), "steps_done": end, "wall_s": time.time() - t0, "last": last}
    if parent:  # the cost of the model is this run plus the one it started from
        summary["init_from"] = parent
        if parent["wall_s"] is not None:
            summary["total_wall_s"] = summary["wall_s"] + parent["wall_s"]
            summary["total_steps"] = end + (parent["steps"] or 0)
    if export and end == cfg.steps:
        export_model(export, state["params"], cfg.model,
                     {"variant": cfg.variant, "train": cfg.to_dict(), "summary": summary})
        log(f"exported final parameters to {export}")
    return {**summary, "state": state}


__all__ = ["TrainConfig", "train", "make_batch", "make_step", "loss_fn", "answer_weights",
           "init_state", "load_init_params", "export_model", "train_specs", "render_mixed"]
