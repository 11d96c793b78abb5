"""The one on-disk format of every trained thing (reference models and bias detectors).

An export is a directory holding exactly two files:

* ``params.msgpack``: the parameter pytree, ``flax.serialization.to_bytes`` (msgpack of the
  nested dict of arrays);
* ``config.json``: one JSON object with the architecture under one key (``"model"`` for a
  ``ModelConfig``, ``"detector"`` for a ``DetectorConfig``) and free metadata beside it
  (``"train"``: the training config, ``"summary"``: what the run did, ``"variant"``...).

``write_export`` writes both files into a temporary sibling directory and renames it into
place, so a reader sees either the complete pair or nothing; it never replaces an existing
export unless asked to (``overwrite=True``). ``read_export`` checks everything a reader relies
on (both files present, the config parses, the parameters decode and have exactly the keys and
shapes the architecture needs) and raises ``ExportError`` naming the file otherwise.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from mmx_base import staging
from mmx_base.errors import ExportError

PARAMS, CONFIG = "params.msgpack", "config.json"


def check_export_target(path, overwrite: bool = False) -> Path:
    """Absolute ``path`` if an export may be written there, else ``ExportError``.

    Allowed: ``path`` absent or an empty directory; with ``overwrite=True`` also an existing
    export (a directory holding only ``params.msgpack`` / ``config.json``). Anything else (a
    file, a directory with other contents such as a training run) is refused even with
    ``overwrite``, so that no flag can delete unrelated files.
    """
    path = Path(path).absolute()
    if not path.exists():
        return path
    if not path.is_dir():
        raise ExportError(f"export target {path} exists and is not a directory")
    contents = {p.name for p in path.iterdir()}
    if not contents:
        return path
    if not overwrite:
        raise ExportError(f"export target {path} already exists; refusing to overwrite it "
                          "(pass overwrite=True / --overwrite, or choose another directory)")
    if not contents <= {PARAMS, CONFIG}:
        raise ExportError(f"export target {path} holds more than an export "
                          f"({', '.join(sorted(contents - {PARAMS, CONFIG}))}); refusing to "
                          "replace it even with overwrite")
    return path


def write_export(path, params, config: dict, *, overwrite: bool = False) -> Path:
    """Write ``params`` (a pytree of arrays) and ``config`` (a JSON-able dict; values that JSON
    cannot hold are written with ``str``) as an export directory at ``path``; returns it.

    Both files are written into ``<name>.tmp-XXXX`` beside ``path`` and the directory is then
    renamed to ``path``. With ``overwrite=True`` an existing export is first renamed aside and
    removed after the new one is in place. Raises ``ExportError`` (``check_export_target``)
    before writing anything if the target is taken.
    """
    from flax import serialization

    path = check_export_target(path, overwrite)
    tmp = staging.make_staging(path, overwrite=True)  # the target was checked just above
    try:
        (tmp / PARAMS).write_bytes(serialization.to_bytes(jax.device_get(params)))
        (tmp / CONFIG).write_text(json.dumps(config, indent=1, default=str))
        check_export_target(path, overwrite)  # re-check: something may have appeared meanwhile
        staging.publish(tmp, path, overwrite=True)
    except BaseException:
        staging.discard(tmp)
        raise
    return path


def _leaves_by_path(tree) -> dict:
    return {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(tree)}


def read_export(path, *, what: str, key: str, parse: Callable[[dict], Any],
                init: Callable[[Any], Any]):
    """``(params, cfg, doc)`` of the export directory ``path``.

    what: the noun for messages ("model", "detector"); key: the ``config.json`` key holding the
    architecture; parse: that dict -> config object (may raise ValueError / TypeError);
    init: config -> a parameter pytree of the architecture (only traced, via
    ``jax.eval_shape``; it fixes the expected keys and shapes). ``params`` has the structure of
    ``init(cfg)`` with ``jax.Array`` leaves; ``doc`` is the whole ``config.json`` object.

    Raises ``ExportError`` for a missing directory or file, a config that is not JSON, lacks
    ``key`` or does not parse, and parameters that are truncated, corrupt, or whose keys or
    shapes differ from the architecture's.
    """
    from flax import serialization

    path = Path(path)
    cfg_file, par_file = path / CONFIG, path / PARAMS
    if not cfg_file.is_file() or not par_file.is_file():
        raise ExportError(f"{path} is not an exported {what} (needs {CONFIG} and {PARAMS})")
    try:
        doc = json.loads(cfg_file.read_text())
        cfg = parse(doc[key])
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ExportError(f"{cfg_file}: corrupt {what} config, not JSON ({e})") from None
    except (KeyError, TypeError) as e:
        raise ExportError(f"{cfg_file}: corrupt {what} config, no valid {key!r} entry "
                          f"({type(e).__name__}: {e})") from None
    except ValueError as e:
        raise ExportError(f"{cfg_file}: corrupt {what} config ({e})") from None
    template = jax.eval_shape(lambda: init(cfg))
    try:
        state = serialization.msgpack_restore(par_file.read_bytes())
    except Exception as e:  # msgpack raises several types on truncated/corrupt files
        raise ExportError(f"{par_file}: corrupt or truncated parameters "
                          f"({type(e).__name__}: {e})") from None
    want = _leaves_by_path(serialization.to_state_dict(template))
    got = _leaves_by_path(state) if isinstance(state, dict) else {}
    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    if missing or extra:
        raise ExportError(f"{par_file}: parameters do not match the {what} in {cfg_file} "
                          f"(missing {missing[:3]}, unexpected {extra[:3]})")
    bad = [k for k in want if np.shape(got[k]) != tuple(want[k].shape)]
    if bad:
        k = bad[0]
        raise ExportError(f"{par_file}: parameter shapes do not match {cfg_file} ({len(bad)} "
                          f"differ; {k}: {np.shape(got[k])} stored, {tuple(want[k].shape)} "
                          "expected)")
    params = serialization.from_state_dict(template, state)
    return jax.tree.map(jnp.asarray, params), cfg, doc


__all__ = ["PARAMS", "CONFIG", "check_export_target", "write_export", "read_export"]
