"""Word-level tokenizer shared by every data source.

Real claims (Fakeddit ``clean_title``, MMFakeBench ``text``) and the closed-world claims go
through the same two steps:

1. ``split_words(text)``: lower-case, then words (``\\w+`` with an optional apostrophe suffix,
   e.g. ``don't``) and single punctuation marks as tokens; whitespace is dropped.
2. ``Vocab.encode``: word -> id with ``PAD_ID = 0`` after the text and ``UNK_ID = 1`` for words
   outside the vocabulary; texts longer than ``max_len`` are truncated.

A ``Vocab`` for real data is built from the fine-tuning texts (``Vocab.build``), so analysis
texts never change the ids; the closed world has its own fixed vocabulary
(``bias_jax.data.closed_world.CLAIM_VOCAB``), also a ``Vocab``.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import re
from typing import Iterable, Sequence

import numpy as np

PAD, UNK = "<pad>", "<unk>"
PAD_ID, UNK_ID = 0, 1

_WORD = re.compile(r"\w+(?:['\u2019]\w+)?|[^\w\s]")


def split_words(text: str) -> list[str]:
    """Lower-cased word and punctuation tokens: ``"Don't PANIC!" -> ["don't", "panic", "!"]``."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    return _WORD.findall(text.lower())


@dataclasses.dataclass(frozen=True)
class Vocab:
    """An ordered word list: id ``i`` is ``words[i]``; ``words[0] = PAD``, ``words[1] = UNK``."""

    words: tuple[str, ...]

    def __post_init__(self):
        words = tuple(self.words)
        object.__setattr__(self, "words", words)
        if len(words) < 2 or words[0] != PAD or words[1] != UNK:
            raise ValueError(f"a vocabulary must start with {PAD!r}, {UNK!r}; got {words[:2]}")
        if len(set(words)) != len(words):
            dup = [w for w, n in collections.Counter(words).items() if n > 1]
            raise ValueError(f"duplicate words in vocabulary: {dup[:5]}")

    @functools.cached_property
    def index(self) -> dict[str, int]:
        """word -> id (built on first use, then cached)."""
        return {w: i for i, w in enumerate(self.words)}

    def __len__(self) -> int:
        return len(self.words)

    @classmethod
    def build(cls, texts: Iterable[str], *, min_count: int = 1,
              max_size: int | None = None) -> "Vocab":
        """Vocabulary of the words of ``texts`` seen at least ``min_count`` times.

        Order: descending frequency, ties alphabetically, so the result is a deterministic
        function of the multiset of texts. ``max_size`` caps the size including PAD and UNK.
        """
        if min_count < 1:
            raise ValueError(f"min_count must be >= 1, got {min_count}")
        if max_size is not None and max_size < 2:
            raise ValueError(f"max_size must be >= 2 (PAD and UNK), got {max_size}")
        counts = collections.Counter(w for t in texts for w in split_words(t))
        counts.pop(PAD, None)
        counts.pop(UNK, None)
        kept = sorted((w for w, n in counts.items() if n >= min_count),
                      key=lambda w: (-counts[w], w))
        if max_size is not None:
            kept = kept[: max_size - 2]
        return cls((PAD, UNK, *kept))

    def encode(self, text: str, max_len: int) -> np.ndarray:
        """int32 ``[max_len]``: ids of ``split_words(text)``, truncated, PAD-filled."""
        if max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {max_len}")
        ids = [self.index.get(w, UNK_ID) for w in split_words(text)][:max_len]
        out = np.full(max_len, PAD_ID, np.int32)
        out[: len(ids)] = ids
        return out

    def encode_batch(self, texts: Sequence[str], max_len: int) -> np.ndarray:
        """int32 ``[B, max_len]``, one ``encode`` per text."""
        out = np.full((len(texts), max_len), PAD_ID, np.int32)
        for i, t in enumerate(texts):
            out[i] = self.encode(t, max_len)
        return out

    def decode(self, ids) -> list[str]:
        """Words of the non-PAD ids (out-of-range ids raise ValueError)."""
        ids = np.asarray(ids).reshape(-1)
        bad = ids[(ids < 0) | (ids >= len(self.words))]
        if bad.size:
            raise ValueError(f"token id {int(bad[0])} outside vocabulary of size {len(self)}")
        return [self.words[i] for i in ids.tolist() if i != PAD_ID]

    def to_json(self) -> dict:
        """``{"words": [...]}`` in id order (what ``from_json`` and ``save`` use)."""
        return {"words": list(self.words)}

    @classmethod
    def from_json(cls, d: dict) -> "Vocab":
        """The vocabulary of a ``to_json`` dict (validated as in the constructor)."""
        return cls(tuple(d["words"]))

    def save(self, path) -> None:
        """Write ``to_json()`` to ``path`` as UTF-8 JSON (non-ASCII words kept as is)."""
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_json(), f, ensure_ascii=False)

    @classmethod
    def load(cls, path) -> "Vocab":
        """The vocabulary written to ``path`` by ``save``."""
        with open(path, encoding="utf-8") as f:
            return cls.from_json(json.load(f))
