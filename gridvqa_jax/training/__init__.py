"""Training: one loop, optimiser and export/load format for every trained thing (reference
models and bias detectors), and the reference-model trainer. Imports ``models``, ``world``,
``core``."""
