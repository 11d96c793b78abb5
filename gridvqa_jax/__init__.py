"""GridVQA-X in JAX: a closed-world grid VQA universe with provably unique ground truth."""

from gridvqa_jax.world.universe import BUCKETS, Spec  # noqa: F401
from gridvqa_jax.world.scene import Scene  # noqa: F401
from gridvqa_jax.world.sampler import sample  # noqa: F401
from gridvqa_jax.world.generate import sample_batch, sample_keys, bucket_ids  # noqa: F401

__version__ = "0.1.0"
