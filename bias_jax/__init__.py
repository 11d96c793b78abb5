"""Sample-level modality-bias analysis (Uni-image / Modality-balance / Uni-text) in JAX."""

__version__ = "0.1.0"
