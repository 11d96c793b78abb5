"""Export and load trained reference models: ``params.msgpack`` + ``config.json``, and the
latest Orbax checkpoint of a training run directory."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from gridvqa_jax.models import mdetr as M
from gridvqa_jax.training.config import TrainConfig
from gridvqa_jax.world import universe as U

CHECKPOINTS = Path(__file__).resolve().parent.parent.parent / "checkpoints"
REFERENCE = {"pure": "m_pure", "spur": "m_spur"}  # shipped reference models under CHECKPOINTS


def export_model(path, params, cfg: M.ModelConfig, meta: dict | None = None):
    """Write ``params.msgpack`` + ``config.json`` to ``path`` (staged, then renamed in place)."""
    from flax import serialization

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tmp = path / "params.msgpack.tmp"
    tmp.write_bytes(serialization.to_bytes(jax.device_get(params)))
    tmp.replace(path / "params.msgpack")
    doc = {"model": dataclasses.asdict(cfg), **(meta or {})}
    (path / "config.json.tmp").write_text(json.dumps(doc, indent=1, default=str))
    (path / "config.json.tmp").replace(path / "config.json")


def load_run(path):
    """Latest Orbax checkpoint of a training run directory (``train_config.json`` + ``ckpt/``).

    Returns (apply_fn, params, meta) like ``load_model``; meta["step"] is the checkpoint step.
    """
    import orbax.checkpoint as ocp


    path = Path(path)
    cfg = TrainConfig.from_dict(json.loads((path / "train_config.json").read_text()))
    steps = sorted(int(p.name) for p in (path / "ckpt").iterdir()
                   if p.name.isdigit() and (p / "default").is_dir()) if (path / "ckpt").is_dir() else []
    if not steps:
        raise ValueError(f"{path}: training run without a finished checkpoint")
    tree = ocp.StandardCheckpointer().restore((path / "ckpt" / str(steps[-1]) / "default").absolute())
    meta = {"model": dataclasses.asdict(cfg.model), "variant": cfg.variant, "step": steps[-1]}
    return jax.jit(M.make_apply(cfg.model)), tree["params"], meta


def load_model(path):
    """Load an exported model directory (``params.msgpack`` + ``config.json``), or the latest
    checkpoint of a training run directory (see ``load_run``).

    Returns (apply_fn, params, meta): ``apply_fn(params, image, tokens) -> outputs`` is jitted.
    """
    from flax import serialization

    path = Path(path)
    if (path / "train_config.json").is_file() and not (path / "params.msgpack").is_file():
        return load_run(path)
    cfg_file, par_file = path / "config.json", path / "params.msgpack"
    if not cfg_file.is_file() or not par_file.is_file():
        raise ValueError(f"{path} is not an exported model (needs config.json and params.msgpack)")
    try:
        meta = json.loads(cfg_file.read_text())
        cfg = M.ModelConfig.from_dict(meta["model"])
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"{cfg_file}: corrupt model config ({e})") from None
    template = jax.eval_shape(lambda: M.init_params(cfg, jax.random.key(0)))
    template = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), template)
    try:
        params = serialization.from_bytes(template, par_file.read_bytes())
    except Exception as e:  # msgpack raises several types on truncated/corrupt files
        raise ValueError(f"{par_file}: corrupt or incompatible parameters ({e})") from None
    shapes_ok = jax.tree.map(lambda a, b: np.shape(a) == np.shape(b), template, params)
    if not all(jax.tree.leaves(shapes_ok)):
        raise ValueError(f"{par_file}: parameter shapes do not match {cfg_file}")
    params = jax.tree.map(jnp.asarray, params)
    return jax.jit(M.make_apply(cfg)), params, meta


def load_reference_model(name: str):
    """``load_reference_model("pure"|"spur") -> (apply_fn, params, spec)``: a shipped checkpoint.

    ``spec`` is the D07 dataset spec of the variant the model was trained on (official 64-px
    cells; the model resizes images itself). A path to an exported directory also works.
    """
    path = CHECKPOINTS / REFERENCE[name] if name in REFERENCE else Path(name)
    apply_fn, params, meta = load_model(path)
    variant = meta.get("variant", name if name in REFERENCE else "pure")
    spec = U.Spec.feasible(variant, meta["model"]["grid_size"], 0.7)[0]
    return apply_fn, params, spec


__all__ = ["export_model", "load_run", "load_model", "load_reference_model", "CHECKPOINTS",
           "REFERENCE"]
