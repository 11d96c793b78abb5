"""Frozen-dataclass configs read back from JSON: one strict constructor for all of them."""

from __future__ import annotations

import dataclasses


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
    return cls(**d)
