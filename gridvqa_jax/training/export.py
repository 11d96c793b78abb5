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
from mmx_base.model import Model
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


def _run_meta(path: Path) -> tuple[TrainConfig, int, dict]:
    """(train config, latest finished step, meta) of a training run directory."""
    try:
        cfg = TrainConfig.from_dict(json.loads((path / "train_config.json").read_text()))
    except (json.JSONDecodeError, TypeError, ValueError) as e:
        raise ExportError(f"{path / 'train_config.json'}: corrupt train config ({e})") from None
    ckpt = path / "ckpt"
    steps = sorted(int(p.name) for p in ckpt.iterdir()
                   if p.name.isdigit() and (p / "default").is_dir()) if ckpt.is_dir() else []
    if not steps:
        raise ExportError(f"{path}: training run without a finished checkpoint")
    meta = {"model": dataclasses.asdict(cfg.model), "variant": cfg.variant, "step": steps[-1]}
    return cfg, steps[-1], meta


def _is_run(path: Path) -> bool:
    return (path / "train_config.json").is_file() and not (path / "params.msgpack").is_file()


def load_run(path) -> Model:
    """Latest Orbax checkpoint of a training run directory (``train_config.json`` + ``ckpt/``)
    as a ``Model`` like ``load_model`` (``load_meta(path)["step"]`` is the checkpoint step).
    ``ExportError`` if the run has no finished checkpoint or an unreadable config.
    """
    import orbax.checkpoint as ocp

    path = Path(path)
    cfg, step, _ = _run_meta(path)
    tree = ocp.StandardCheckpointer().restore((path / "ckpt" / str(step) / "default").absolute())
    return Model(jitted_apply(cfg.model), tree["params"], cfg.model)


def load_meta(path) -> dict:
    """The metadata of an export directory (its whole ``config.json`` object: ``"model"``,
    ``"variant"``, ``"summary"``, ...) or of a training run directory (``"model"``,
    ``"variant"``, ``"step"``: its latest finished checkpoint). ``ExportError`` if unreadable."""
    path = Path(path)
    if _is_run(path):
        return _run_meta(path)[2]
    try:
        meta = json.loads((path / "config.json").read_text())
    except FileNotFoundError:
        raise ExportError(f"{path}: not a model export (no config.json)") from None
    except json.JSONDecodeError as e:
        raise ExportError(f"{path / 'config.json'}: corrupt config ({e})") from None
    if not isinstance(meta, dict) or "model" not in meta:
        raise ExportError(f"{path / 'config.json'}: no \"model\" entry (not a model export)")
    return meta


def load_model(path) -> Model:
    """Load an exported model directory (``params.msgpack`` + ``config.json``), or the latest
    checkpoint of a training run directory (see ``load_run``).

    Returns ``Model(apply, params, config)``: ``apply(params, image, tokens) -> ModelOutput``
    is jitted, ``config`` the ``ModelConfig``; models of one architecture share one ``apply``
    object (``jitted_apply``). The rest of ``config.json`` is ``load_meta(path)``.
    ``ExportError`` for a missing, truncated or mismatched export
    (``export_format.read_export``).
    """
    path = Path(path)
    if _is_run(path):
        return load_run(path)
    params, cfg, _ = read_export(path, what="model", key="model",
                                 parse=M.ModelConfig.from_dict,
                                 init=lambda c: M.init_params(c, jax.random.key(0)))
    return Model(jitted_apply(cfg), params, cfg)


def _reference_path(name) -> Path:
    return CHECKPOINTS / REFERENCE[name] if name in REFERENCE else Path(name)


def load_reference_model(name) -> Model:
    """``load_reference_model("pure"|"spur") -> Model(apply, params, config)``: a shipped
    checkpoint (a path to an export or training run directory also works); ``config`` is its
    ``ModelConfig``. ``reference_spec(name)`` is the dataset it was trained on."""
    return load_model(_reference_path(name))


def reference_spec(name):
    """The D07 dataset ``universe.Spec`` of the variant the model ``name`` (as
    ``load_reference_model``) was trained on: its export's ``"variant"`` (default: ``name``
    for a shipped model, else ``"pure"``) at its grid size (official 64-px cells; the model
    resizes images itself)."""
    meta = load_meta(_reference_path(name))
    variant = meta.get("variant", name if name in REFERENCE else "pure")
    return U.Spec.feasible(variant, meta["model"]["grid_size"], 0.7)[0]


__all__ = ["Model", "jitted_apply", "export_model", "load_run", "load_model", "load_meta",
           "load_reference_model", "reference_spec", "CHECKPOINTS", "REFERENCE"]
