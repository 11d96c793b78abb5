"""The shared base of ``gridvqa_jax`` and ``bias_jax``: strict configs, errors, atomic writes,
chunked batching, the data mesh, grid primitives, shared layers, LIME, the training loop and the
export format. Imports nothing else from the project."""
