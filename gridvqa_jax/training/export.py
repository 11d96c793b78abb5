"""Export and load trained reference models (the format of ``export_format``: ``config.json``
holds the ``ModelConfig`` under ``"model"``), and the latest Orbax checkpoint of a training run
directory."""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import jax

from mmx_base.errors import ExportError
from gridvqa_jax.models import mdetr as M
from gridvqa_jax.training.config import TrainConfig
from mmx_base.export_format import read_export, write_export
from gridvqa_jax.world import universe as U

CHECKPOINTS = Path(__file__).resolve().parent.parent.parent / "checkpoints"
REFERENCE = {"pure": "m_pure", "spur": "m_spur"}  # shipped reference models under CHECKPOINTS


@functools.lru_cache(maxsize=None)
def jitted_apply(cfg: M.ModelConfig):
    """The jitted ``apply(params, image, tokens) -> outputs`` of an architecture, one function
    object per ``ModelConfig`` (memoized): every model loaded with the same architecture shares
    it, so a program jitted over it (an explainer, an estimator; ``apply_fn`` is their static
    argument) compiles once for all of them and takes the parameters as an argument."""
    return jax.jit(M.make_apply(cfg))


def export_model(path, params, cfg: M.ModelConfig, meta: dict | None = None, *,
                 overwrite: bool = False) -> Path:
    """Write ``params`` + ``{"model": cfg, **meta}`` as an export directory at ``path``
    (``export_format.write_export``: atomic; ``ExportError`` if ``path`` is taken and
    ``overwrite`` is False)."""
    return write_export(path, params, {"model": dataclasses.asdict(cfg), **(meta or {})},
                        overwrite=overwrite)


def load_run(path):
    """Latest Orbax checkpoint of a training run directory (``train_config.json`` + ``ckpt/``).

    Returns (apply_fn, params, meta) like ``load_model``; meta["step"] is the checkpoint step.
    ``ExportError`` if the run has no finished checkpoint or an unreadable config.
    """
    import orbax.checkpoint as ocp

    path = Path(path)
    try:
        cfg = TrainConfig.from_dict(json.loads((path / "train_config.json").read_text()))
    except (json.JSONDecodeError, TypeError, ValueError) as e:
        raise ExportError(f"{path / 'train_config.json'}: corrupt train config ({e})") from None
    ckpt = path / "ckpt"
    steps = sorted(int(p.name) for p in ckpt.iterdir()
                   if p.name.isdigit() and (p / "default").is_dir()) if ckpt.is_dir() else []
    if not steps:
        raise ExportError(f"{path}: training run without a finished checkpoint")
    tree = ocp.StandardCheckpointer().restore((ckpt / str(steps[-1]) / "default").absolute())
    meta = {"model": dataclasses.asdict(cfg.model), "variant": cfg.variant, "step": steps[-1]}
    return jitted_apply(cfg.model), tree["params"], meta


def load_model(path):
    """Load an exported model directory (``params.msgpack`` + ``config.json``), or the latest
    checkpoint of a training run directory (see ``load_run``).

    Returns (apply_fn, params, meta): ``apply_fn(params, image, tokens) -> outputs`` is jitted,
    ``meta`` is the whole ``config.json`` object; models of one architecture share one
    ``apply_fn`` object (``jitted_apply``). ``ExportError`` for a missing, truncated or
    mismatched export (``export_format.read_export``).
    """
    path = Path(path)
    if (path / "train_config.json").is_file() and not (path / "params.msgpack").is_file():
        return load_run(path)
    params, cfg, meta = read_export(path, what="model", key="model",
                                    parse=M.ModelConfig.from_dict,
                                    init=lambda c: M.init_params(c, jax.random.key(0)))
    return jitted_apply(cfg), params, meta


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


__all__ = ["jitted_apply", "export_model", "load_run", "load_model", "load_reference_model", "CHECKPOINTS",
           "REFERENCE"]
