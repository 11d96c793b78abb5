"""The three modality-bias views of Modality-Bias (benefit, flow, causal).

Each view is a function ``view(detectors, batch, *, key=None, **options) -> ViewResult``
(:mod:`bias_jax.views.common`); ``detectors`` maps a kind ("image", "text", "joint", "lvlm")
to ``(apply_fn, params, cfg)`` as returned by :func:`bias_jax.detectors.load_detector`.
"""
