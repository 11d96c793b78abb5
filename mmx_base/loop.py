"""The training loop shared by every trainer (reference models and bias detectors).

A trainer supplies its config, how to build the initial state and how to advance it by one
step; ``run`` does the rest, the same way for all of them:

* Run directory ``out``: ``train_config.json`` (the config, ``cfg.to_dict()``), ``ckpt/<step>/``
  (Orbax ``CheckpointManager``, the last two kept) and ``metrics.jsonl``. A fresh run refuses a
  directory that already holds checkpoints; ``resume=True`` refuses a config different from the
  saved one (naming the differing fields) and continues from the latest checkpoint, so a run
  killed at any point loses at most ``save_every`` steps.
* ``metrics.jsonl``: one JSON object per ``log_every`` steps (``step``, the trainer's extra
  keys, ``steps_per_s``, ``elapsed_s`` and the window means of the step metrics) and one per
  evaluation. On (re)start the file is repaired: a line cut short by a kill and the records of
  steps after the checkpoint the run continues from are dropped (those steps are redone), so the
  file always holds one record per logged step.
* Wall time counts across resumes: the clock continues from the last ``elapsed_s`` logged at or
  before the restored step.
* The step metrics stay on the device until a log, save or final step, where the steps since
  the last fetch are copied to the host in one ``jax.device_get`` (as big_vision's loop does: no
  host sync per step, so the host dispatches ahead of the accelerator). The logged numbers are
  the same: each step's metrics as Python floats, their window mean in float64.
* A non-finite loss stops the run with ``FloatingPointError`` naming the (first such) step and
  the last checkpoint; it is checked at every fetch, so before any checkpoint is saved.
* Multi-device: one global-view ``jit`` over a ``('data',)`` mesh; batches are sharded with
  ``NamedSharding(mesh, P('data'))`` (``shard_batch``), the state is replicated
  (``replicate``, ``jit_step``).
* At the end (``cfg.steps`` reached) the final parameters are exported (``export_format``),
  never over an existing export unless ``overwrite``; the target is checked before anything is
  written, so a taken target fails at once instead of after training.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from mmx_base import staging
from mmx_base.errors import InputError
from mmx_base.export_format import check_export_target, write_export

METRICS, TRAIN_CONFIG = "metrics.jsonl", "train_config.json"


# ----------------------------------------------------------------------------------------------
# Sharding.
# ----------------------------------------------------------------------------------------------
def shard_batch(batch, mesh):
    """``batch`` (pytree of arrays with a leading batch axis divisible by the mesh size) placed
    on ``mesh`` split along that axis: ``NamedSharding(mesh, P('data'))``."""
    return jax.device_put(batch, NamedSharding(mesh, P("data")))


def replicate(tree, mesh):
    """``tree`` replicated on every device of ``mesh`` (``NamedSharding(mesh, P())``)."""
    return jax.device_put(tree, NamedSharding(mesh, P()))


def jit_step(step: Callable, mesh) -> Callable:
    """``jax.jit(step)`` for a ``step(state, *args) -> (state, metrics)``: the state is donated
    and both outputs are replicated over ``mesh`` (one global-view program; XLA inserts the
    gradient all-reduce over the sharded batch)."""
    repl = NamedSharding(mesh, P())
    return jax.jit(step, donate_argnums=(0,), out_shardings=(repl, repl))


def check_batch_split(batch_size: int, mesh, parts: int = 1):
    """``InputError`` unless ``batch_size`` splits evenly into ``parts`` x (devices of mesh)."""
    n = parts * mesh.devices.size
    if batch_size % n:
        what = f"{parts} parts x {mesh.devices.size} devices" if parts > 1 else \
            f"{mesh.devices.size} devices"
        raise InputError(f"batch_size {batch_size} must be a multiple of {what}")


# ----------------------------------------------------------------------------------------------
# Run directory: config, metrics.
# ----------------------------------------------------------------------------------------------
def _has_checkpoints(out: Path) -> bool:
    return (out / "ckpt").is_dir() and any((out / "ckpt").iterdir())


def check_run_dir(cfg, out, resume: bool):
    """``InputError`` if ``out`` cannot take this run: without ``resume`` it must hold no
    checkpoints; with ``resume`` its ``train_config.json`` (if any) must equal ``cfg``
    (compared through ``type(cfg).from_dict``, so defaults added since compare equal)."""
    out = Path(out)
    path = out / TRAIN_CONFIG
    if resume and path.exists():
        try:
            saved = type(cfg).from_dict(json.loads(path.read_text()))
        except (json.JSONDecodeError, TypeError, ValueError) as e:
            raise InputError(f"{path}: unreadable saved config ({e}); use a new --out") from None
        if saved != cfg:
            new, old = cfg.to_dict(), saved.to_dict()
            diff = sorted(k for k in new if new[k] != old.get(k))
            raise InputError(f"--resume with a config different from {path} (fields {diff}); "
                             "use the same flags or a new --out")
    elif not resume and _has_checkpoints(out):
        raise InputError(f"{out} already holds checkpoints; pass --resume or use a new --out")


def read_metrics(path) -> list[dict]:
    """The complete records of a ``metrics.jsonl`` (lines that are not a JSON object, such as
    one cut short by a kill, are skipped)."""
    recs = []
    path = Path(path)
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict):
                recs.append(rec)
    return recs


def logged_elapsed(path, upto: int) -> float:
    """Largest ``elapsed_s`` logged at a step <= ``upto`` in a ``metrics.jsonl`` (0 if none)."""
    return max((float(r["elapsed_s"]) for r in read_metrics(path)
                if "elapsed_s" in r and r.get("step", upto + 1) <= upto), default=0.0)


def repair_metrics(path, upto: int) -> None:
    """Rewrite ``metrics.jsonl`` keeping only its complete records of steps <= ``upto`` (the
    checkpoint a run continues from); atomic (written beside, then renamed). No file: none
    is created."""
    path = Path(path)
    if not path.exists():
        return
    keep = [r for r in read_metrics(path) if r.get("step", upto + 1) <= upto]
    staging.write_atomic(path, "".join(json.dumps(r) + "\n" for r in keep))


def _manager(out: Path):
    import orbax.checkpoint as ocp

    opts = ocp.CheckpointManagerOptions(max_to_keep=2, save_interval_steps=1, create=True)
    return ocp.CheckpointManager((out / "ckpt").absolute(), options=opts)


# ----------------------------------------------------------------------------------------------
# The loop.
# ----------------------------------------------------------------------------------------------
def fetch_metrics(pending, where="", last_checkpoint=None) -> list[dict]:
    """Host copies of the step metrics ``pending`` = ``[(step, metrics), ...]`` (device values),
    in one ``jax.device_get``: ``[{name: float}, ...]`` in the same order.

    Raises ``FloatingPointError`` at the first step whose ``metrics["loss"]`` is not finite,
    naming that step, the run ``where`` and ``last_checkpoint``.
    """
    rows = [{k: float(v) for k, v in m.items()} for m in jax.device_get([m for _, m in pending])]
    for (step, _), m in zip(pending, rows):
        if not math.isfinite(m["loss"]):
            raise FloatingPointError(
                f"non-finite loss ({m['loss']}) at step {step} of {where}; training "
                f"stopped. The last checkpoint is step {last_checkpoint}; lower "
                "--lr or check the data.")
    return rows


def run(cfg, out, *, init_state: Callable[[], Any],
        advance: Callable[[Any, int], tuple[Any, dict]], resume: bool = False,
        stop_after: int | None = None, progress: bool = True, log=print, desc: str = "train",
        intro: Callable[[Any], str] | None = None, record: Callable[[int], dict] | None = None,
        evaluate: Callable[[Any, int], dict | None] | None = None,
        summarize: Callable[[dict], dict] | None = None, export=None,
        export_config: Callable[[dict], dict] | None = None, overwrite: bool = False,
        prepare: Callable[[], None] | None = None):
    """Run (or resume) the training loop of ``cfg`` in ``out``; returns ``(state, summary)``.

    cfg: a frozen config with ``steps``, ``save_every``, ``log_every``, ``to_dict()`` and
      ``from_dict``. init_state(): the state at step 0 (a pytree, replicated; it is also the
      restore template). advance(state, step): ``(state, metrics)`` after training step
      ``step`` (0-based), metrics scalars (device arrays are fine: they are fetched at log and
      save steps); ``metrics["loss"]`` is checked for finiteness, every metric is averaged
      over the log window.
    stop_after: end after that many steps (saving there), as if killed at a save boundary.
    intro(state): a line logged before the first step. record(step): extra keys of the log
      record closing the window at 0-based ``step``. evaluate(state, done): called after each
      step with the number of steps done; a non-None dict is logged to ``metrics.jsonl`` as
      ``{"step": done, **result}``.
    summarize(summary): the summary with the trainer's extra keys (before the export).
    export: directory for the final parameters, written when ``cfg.steps`` are done, with
      ``config.json = export_config(summary)``; ``overwrite`` allows replacing an export.
    prepare(): checks run before anything is written (after the export-target check).
    summary = ``{"out", "steps_done", "wall_s", "last"}`` (then ``summarize``): ``wall_s``
      counts earlier runs of this directory, ``last`` is the last log record.
    """
    import orbax.checkpoint as ocp
    from tqdm.auto import tqdm

    out = Path(out)
    if export is not None:
        check_export_target(export, overwrite)
    if prepare is not None:
        prepare()
    check_run_dir(cfg, out, resume)
    out.mkdir(parents=True, exist_ok=True)
    (out / TRAIN_CONFIG).write_text(json.dumps(cfg.to_dict(), indent=1))

    state = init_state()
    mngr = _manager(out)
    start = 0
    if resume and mngr.latest_step() is not None:
        start = int(mngr.latest_step())
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
        state = mngr.restore(start, args=ocp.args.StandardRestore(abstract))
        log(f"resumed from step {start} ({out / 'ckpt'})")
    metrics_path = out / METRICS
    repair_metrics(metrics_path, start)
    t0 = time.time() - logged_elapsed(metrics_path, start)
    if intro is not None:
        log(intro(state))
    end = cfg.steps if stop_after is None else min(cfg.steps, stop_after)
    bar = tqdm(total=cfg.steps, initial=start, desc=desc, disable=not progress,
               file=sys.stderr, dynamic_ncols=True)
    t_last, window, pending, last = time.time(), [], [], {}
    try:
        with open(metrics_path, "a") as metrics_f:
            def write(rec):
                metrics_f.write(json.dumps(rec) + "\n")
                metrics_f.flush()

            for step in range(start, end):
                state, m = advance(state, step)
                pending.append((step, m))
                bar.update(1)
                done = step + 1
                logs = done % cfg.log_every == 0 or done == end
                saves = done % cfg.save_every == 0 or done == end
                if logs or saves:  # the one host sync: never save past a non-finite loss
                    window += fetch_metrics(pending, out, mngr.latest_step())
                    pending = []
                if logs:
                    now = time.time()
                    avg = {k: float(np.mean([w[k] for w in window])) for k in window[0]}
                    last = {"step": done, **(record(step) if record else {}),
                            "steps_per_s": len(window) / max(now - t_last, 1e-9),
                            "elapsed_s": now - t0, **avg}
                    write(last)
                    bar.set_postfix({k: f"{avg[k]:.3f}" for k in ("loss", "acc") if k in avg})
                    window, t_last = [], now
                res = evaluate(state, done) if evaluate is not None else None
                if res is not None:  # no record of an evaluation past a non-finite loss
                    window += fetch_metrics(pending, out, mngr.latest_step())
                    pending = []
                    write({"step": done, **res})
                if saves:
                    mngr.save(done, args=ocp.args.StandardSave(state))
            mngr.wait_until_finished()
    finally:
        bar.close()
        mngr.close()
    summary = {"out": str(out), "steps_done": end, "wall_s": time.time() - t0, "last": last}
    if summarize is not None:
        summary = summarize(summary)
    if export is not None and end == cfg.steps:
        doc = export_config(summary) if export_config is not None else {}
        write_export(export, state["params"], doc, overwrite=overwrite)
        log(f"exported the final parameters to {export}")
    return state, summary


__all__ = ["run", "fetch_metrics", "shard_batch", "replicate", "jit_step", "check_batch_split",
           "check_run_dir", "read_metrics", "logged_elapsed", "repair_metrics", "METRICS", "TRAIN_CONFIG"]
