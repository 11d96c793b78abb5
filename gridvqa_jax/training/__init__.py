"""Training of the reference models: the trainer's config, the M_pure / M_spur trainer, and
their export and loaders (``export.load_reference_model``). The loop, optimiser and export
format every trainer shares are in ``mmx_base``. Imports ``models``, ``world``, ``mmx_base``."""
