"""Models of GridVQA-X: the MDETR-style reference model and its set-prediction losses."""

from gridvqa_jax.models.mdetr import (ModelConfig, GridMDETR, init_params, make_apply,  # noqa: F401
                                      answer_index, answer_string, answer_type, n_params)
from gridvqa_jax.models import matching  # noqa: F401
