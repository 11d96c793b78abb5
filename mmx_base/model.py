"""The value every loader of a trained model returns: ``Model(apply, params, config)``.

``apply(params, *inputs) -> outputs`` is a pure (usually jitted) function, ``params`` its
parameter pytree and ``config`` the frozen, hashable architecture config the model was built
from (``gridvqa_jax.models.mdetr.ModelConfig`` for GridMDETR, ``bias_jax.detectors.
DetectorConfig`` for the bias detectors). A ``Model`` is a NamedTuple, so it unpacks as
``apply_fn, params, cfg = load_reference_model("pure")`` and ``model[:2]`` is the pair an
explainer takes; ``model(*inputs)`` is ``apply(params, *inputs)``.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple


class Model(NamedTuple):
    """A trained model: ``apply(params, *inputs) -> outputs``, its ``params`` and ``config``."""

    apply: Callable  # pure apply(params, *inputs) -> outputs
    params: Any  # parameter pytree
    config: Any  # frozen architecture config (hashable)

    def __call__(self, *inputs):
        """``apply(params, *inputs)``."""
        return self.apply(self.params, *inputs)


__all__ = ["Model"]
