"""The three modality-bias views (benefit, flow, causal) and a registry of them.

Each view is a function ``view(detectors, batch, *, key=None, **options) -> ViewResult``
(:mod:`bias_jax.views.common`); ``detectors`` maps a kind ("image", "text", "joint", "lvlm")
to ``(apply_fn, params, cfg)`` as returned by :func:`bias_jax.detectors.load_detector`.

``VIEW_FNS`` maps each view name to its function; :func:`run_views` runs several of them on one
batch, :func:`view_fn` looks one up (an unknown name is a ``ValueError``). A new view is added
by putting its function in ``VIEW_FNS``.
"""

from __future__ import annotations

import jax

from bias_jax.views.benefit import benefit_view
from bias_jax.views.causal import causal_view
from bias_jax.views.common import ViewResult, label_from_score
from bias_jax.views.flow import flow_view

VIEW_FNS = {"benefit": benefit_view, "flow": flow_view, "causal": causal_view}
VIEWS = tuple(VIEW_FNS)  # ("benefit", "flow", "causal"), the order of bias_jax.ensemble.VIEWS


def view_fn(name: str):
    """The view function registered as ``name`` in ``VIEW_FNS``."""
    if name not in VIEW_FNS:
        raise ValueError(f"unknown view {name!r}; expected one of {tuple(VIEW_FNS)}")
    return VIEW_FNS[name]


def run_views(detectors: dict, batch, *, key=None, views=VIEWS, options=None,
              progress=None) -> dict:
    """``{name: ViewResult}`` of each view in ``views`` on ``batch``.

    Args:
      detectors: kind -> ``(apply_fn, params, cfg)``.
      batch: a ``bias_jax.data.batch.Batch``.
      key: JAX PRNG key (default ``jax.random.key(0)``); view i of ``views`` gets
        ``fold_in(key, i)``.
      views: names in ``VIEW_FNS``.
      options: ``{name: keyword arguments of that view}``, e.g. ``{"flow": {"eps": 0.25}}``.
      progress: called with each view's name before it runs.
    """
    fns = [view_fn(name) for name in views]  # an unknown name fails before any view runs
    key = jax.random.key(0) if key is None else key
    options = options or {}
    out = {}
    for i, (name, fn) in enumerate(zip(views, fns)):
        if progress:
            progress(name)
        out[name] = fn(detectors, batch, key=jax.random.fold_in(key, i), **options.get(name, {}))
    return out


__all__ = ["VIEW_FNS", "VIEWS", "ViewResult", "label_from_score", "benefit_view", "flow_view",
           "causal_view", "view_fn", "run_views"]
