"""Data for modality-bias analysis: one ``Batch`` structure from every source.

- ``worlds``: the closed worlds by name (``--world``; default ``"graded"``) and their specs;
- ``graded_world`` (the default world): samples labelled as the paper's annotators label them,
  with exact answers to its three annotation questions, redundant, graded-cue and undecidable
  samples; ``graded_world_oracles`` its exact oracles;
- ``closed_world`` (the ``"basic"`` world): a GridVQA-X-based misinformation benchmark of three
  clean cases whose bias type (Uni-image / Modality-balance / Uni-text) and causal ground
  truth are exact by construction;
- ``closed_world_oracles``: its exact, independent oracles (P(real | image), P(real | claim),
  P(real | image, claim) from the pixels and/or tokens alone);
- ``human_labels``: human bias labels of real samples read from a CSV and aligned to them;
- ``fakeddit`` / ``mmfakebench``: readers for the real benchmarks' released formats;
- ``clean``: a benchmark cut down to the samples of kept bias types, in its own format
  (``modality-bias clean``);
- ``real``: what those readers share (path checks, the row loop and its report, -> ``Batch``);
- ``split``: the paper's Finetune (40%) / Analysis (60%) protocol;
- ``batch``: ``Batch``, ``Record``, ``LoadReport`` and record -> batch decoding;
- ``text``: the word-level ``Vocab`` shared by all sources.
"""

from bias_jax.data.batch import (BALANCE, BIAS_TYPES, FAKE, REAL, UNI_IMAGE, UNI_TEXT,  # noqa: F401
                                 UNKNOWN_BIAS, Batch, LoadReport, Record, records_to_batch)
from bias_jax.data.closed_world import (CLAIM_VOCAB, WorldSample, WorldSpec,  # noqa: F401
                                        load_closed_world)
from bias_jax.data.closed_world_oracles import (image_oracle, joint_oracle,  # noqa: F401
                                                text_oracle)
from bias_jax.data.fakeddit import load_fakeddit, read_fakeddit  # noqa: F401
from bias_jax.data.mmfakebench import load_mmfakebench, read_mmfakebench  # noqa: F401
from bias_jax.data.split import SPLIT_NAMES, finetune_analysis_split, paper_splits  # noqa: F401
from bias_jax.data.text import PAD_ID, UNK_ID, Vocab, split_words  # noqa: F401
