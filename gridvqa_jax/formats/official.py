"""The official GridVQA-X release layout: read it into Scenes, write Scenes in it.

The official generators (``dataset_generation/pure`` and ``/spurious`` of the public release)
write, per split (``tests/fixtures/official_gridvqa/FORMAT.md`` documents every field)::

    qa_{split}.jsonl                                          {"image_id", "question", "answer"}
    grounding_{split}.jsonl                                   MDETR-style boxes and phrase spans
    images/{split}/depth{D}/{QT}/form{F}/g{S}_d{XX}/{i:06d}.png
    {split}/depth{D}/{QT}/form{F}/g{S}_d{XX}/{i:06d}.npz       per-sample arrays

This module is the public entry point; the work is split by concern:

- ``official_layout``: file names, paths, constants and the object-list encoding;
- ``official_questions``: ``parse_question``, the official templates as regular expressions;
- ``official_write``: ``OfficialWriter`` / ``write_official`` (same files, defects fixed);
- ``official_read``: ``read_official`` (files -> checked, decoded samples), ``OfficialInfo``,
  ``read_official_images``, ``verify_official``;
- ``official_scene``: full Scenes rebuilt from scene + question + anchors + label.
"""

from __future__ import annotations

from gridvqa_jax.formats.official_layout import (FIXES, GENERATOR, MANIFEST, NPZ_KEYS, SIDECAR,
                                                 bucket_folder)
from gridvqa_jax.formats.official_questions import parse_question
from gridvqa_jax.formats.official_read import (OfficialInfo, read_official, read_official_images,
                                               verify_official)
from gridvqa_jax.formats.official_write import (NPZ_COMPRESS_LEVEL, PNG_COMPRESS_LEVEL,
                                                OfficialWriter, write_official)

__all__ = ["read_official", "read_official_images", "verify_official", "OfficialInfo",
           "write_official", "OfficialWriter", "parse_question", "bucket_folder", "NPZ_KEYS",
           "MANIFEST", "GENERATOR", "SIDECAR", "FIXES", "PNG_COMPRESS_LEVEL",
           "NPZ_COMPRESS_LEVEL"]
