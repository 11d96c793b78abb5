"""Frozen-dataclass configs: one strict constructor from JSON for all of them, and the checks of
their numeric fields."""

from __future__ import annotations

import dataclasses
import math
import types
import typing

from mmx_base.errors import InputError


def config_from_dict(cls, d: dict, what: str):
    """``cls(**d)`` after checking that every key of ``d`` is a field of the dataclass ``cls``.

    A misspelt or stale key in a saved config must fail loudly instead of being dropped, so the
    error names ``what`` (e.g. "model config") and the offending keys. Missing keys take the
    dataclass defaults.
    """
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - known
    if unknown:
        raise ValueError(f"unknown {what} fields: {sorted(unknown)}; known: {sorted(known)}")
    hints = typing.get_type_hints(cls)
    for k, v in d.items():
        if not _has_type(v, hints.get(k, typing.Any)):
            raise InputError(f"{what} field {k!r} must be {_type_name(hints[k])}, got {v!r}")
    return cls(**d)


def _has_type(value, tp) -> bool:
    """Whether a JSON-decoded ``value`` fits the annotation ``tp`` (bool is no int; an int is a
    float; a list is a tuple). Annotations it does not know pass."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_has_type(value, a) for a in args)
    if tp is type(None):
        return value is None
    if tp in (bool, str):
        return isinstance(value, tp)
    if tp in (int, float):
        ok = int if tp is int else (int, float)
        return isinstance(value, ok) and not isinstance(value, bool)
    if origin is tuple:
        if not isinstance(value, (tuple, list)):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_has_type(v, args[0]) for v in value)
        return len(value) == len(args) and all(_has_type(v, a) for v, a in zip(value, args))
    if dataclasses.is_dataclass(tp):
        return isinstance(value, tp)
    return True


def _type_name(tp) -> str:
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    if tp in names:
        return names[tp]
    if typing.get_origin(tp) is tuple:
        return "a list"
    return str(tp).replace("typing.", "")


def check_ints(cfg, fields, low: int, what: str = "") -> None:
    """``InputError`` naming ``<what or class>.<field>`` unless each field of ``cfg`` is an int
    (not a bool) >= ``low``."""
    for f in fields:
        v = getattr(cfg, f)
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise InputError(f"{what or type(cfg).__name__}.{f} must be an integer >= {low}, "
                             f"got {v!r}")


def check_reals(cfg, fields, *, positive: bool, what: str = "") -> None:
    """``InputError`` naming ``<what or class>.<field>`` unless each field of ``cfg`` is a
    finite number > 0 (``positive``) or >= 0."""
    for f in fields:
        v = getattr(cfg, f)
        ok = (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
              and (v > 0 if positive else v >= 0))
        if not ok:
            raise InputError(f"{what or type(cfg).__name__}.{f} must be a finite number "
                             f"{'> 0' if positive else '>= 0'}, got {v!r}")


__all__ = ["config_from_dict", "check_ints", "check_reals"]
