"""Lowest layer, shared by every package: chunked vmap, strict configs, atomic directories,
the error type of expected failures. Imports nothing from the project."""
