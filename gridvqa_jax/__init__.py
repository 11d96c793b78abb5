"""GridVQA-X in JAX: a closed-world grid VQA universe with provably unique ground truth."""

from gridvqa_jax.universe import BUCKETS, Spec  # noqa: F401
from gridvqa_jax.scenes import Scene, sample, sample_batch, sample_keys, bucket_ids  # noqa: F401

__version__ = "0.1.0"
