"""Data formats: the official GridVQA-X release layout, the native shard format, and one
``load_dataset(path)`` for both. Imports ``world`` and ``mmx_base``."""
