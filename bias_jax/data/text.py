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

Vocabulary-free alternative (the pretrained MiniLM text encoder, ``bias_jax.minilm``):
``PieceTokenizer`` wraps a WordPiece ``tokenizers.Tokenizer`` (a ``tokenizer.json``) behind the
same ``encode`` / ``encode_batch`` / ``decode`` interface. Its ids are word pieces only, no
``[CLS]`` / ``[SEP]`` (the encoder adds them, so every non-PAD token is a piece of the text and
masking a token is replacing it by PAD), with ``[PAD] = 0 = PAD_ID`` after the text.
``retokenize`` carries word-level ids (e.g. the closed world's ``CLAIM_VOCAB`` claims) and a
per-word mask (the core words) over to the pieces.
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


class PieceTokenizer:
    """A WordPiece tokenizer (HF ``tokenizers``, e.g. MiniLM's ``tokenizer.json``) with the
    ``Vocab`` interface: ``encode`` / ``encode_batch`` -> int32 piece ids, PAD after the text.

    The ids never include the special tokens (``[CLS]``, ``[SEP]``): a detector's encoder adds
    them (``bias_jax.minilm.with_specials``). Its normaliser (lower-casing, accent stripping,
    punctuation splitting) replaces ``split_words``; unknown words become pieces or ``[UNK]``,
    so no vocabulary is built from the data. Requires ``[PAD]`` to be id ``PAD_ID`` (0), so the
    absent text and masked tokens are the same ids for every text encoder.
    """

    def __init__(self, tokenizer, name: str = ""):
        tokenizer.no_padding()  # MiniLM's tokenizer.json pads to 128: lengths are ours
        tokenizer.no_truncation()
        pad = tokenizer.token_to_id("[PAD]")
        if pad != PAD_ID:
            raise ValueError(f"tokenizer {name or ''}: [PAD] must be id {PAD_ID}, got {pad}")
        self.tokenizer, self.name = tokenizer, name
        self.unk_id = tokenizer.token_to_id("[UNK]")

    @classmethod
    def from_file(cls, path) -> "PieceTokenizer":
        """The tokenizer of a ``tokenizer.json`` file (``tokenizers.Tokenizer.from_file``)."""
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_file(str(path)), name=str(path))

    def __len__(self) -> int:
        """Number of ids (pieces and special tokens): every id is below it."""
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def token_id(self, token: str) -> int:
        """Id of a token string such as ``"[CLS]"`` (KeyError when unknown)."""
        i = self.tokenizer.token_to_id(token)
        if i is None:
            raise KeyError(f"{token!r} is not a token of {self.name or 'the tokenizer'}")
        return int(i)

    def pieces(self, text: str) -> list[int]:
        """Piece ids of ``text`` (no special tokens, no truncation)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode(self, text: str, max_len: int) -> np.ndarray:
        """int32 ``[max_len]``: the pieces of ``text``, truncated, PAD-filled."""
        return self.encode_batch([text], max_len)[0]

    def encode_batch(self, texts: Sequence[str], max_len: int) -> np.ndarray:
        """int32 ``[B, max_len]``, one ``encode`` per text (the Rust batch encoder)."""
        if max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {max_len}")
        texts = list(texts)
        for t in texts:
            if not isinstance(t, str):
                raise TypeError(f"text must be a str, got {type(t).__name__}")
        out = np.full((len(texts), max_len), PAD_ID, np.int32)
        for i, enc in enumerate(self.tokenizer.encode_batch(texts, add_special_tokens=False)):
            ids = enc.ids[:max_len]
            out[i, : len(ids)] = ids
        return out

    def decode(self, ids) -> list[str]:
        """Piece strings of the non-PAD ids (``"##"`` marks a continuation); out-of-range ids
        raise ValueError."""
        ids = np.asarray(ids).reshape(-1)
        bad = ids[(ids < 0) | (ids >= len(self))]
        if bad.size:
            raise ValueError(f"token id {int(bad[0])} outside vocabulary of size {len(self)}")
        return [self.tokenizer.id_to_token(int(i)) for i in ids.tolist() if i != PAD_ID]


def retokenize(tokens, core, vocab: Vocab, tokenizer: PieceTokenizer,
               max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Word ids of ``vocab`` -> the pieces of ``tokenizer``, each piece inheriting its word's
    ``core`` flag.

    tokens int32 [B, L] (``vocab`` ids, PAD anywhere: PAD words are dropped), core bool [B, L];
    returns (int32 [B, max_len], bool [B, max_len]), truncated, PAD / False after the pieces.
    Each word is tokenized alone (its pieces do not depend on its neighbours for WordPiece), so
    the claim ``"there are more red pentagons ..."`` gives ``... "red", "pentagon", "##s" ...``
    with both pieces of ``pentagons`` in the core if the word is.
    """
    tokens, core = np.asarray(tokens), np.asarray(core, bool)
    if tokens.shape != core.shape or tokens.ndim != 2:
        raise ValueError(f"tokens {tokens.shape} and core {core.shape} must be equal [B, L]")
    table = _piece_table(vocab, tokenizer)
    out = np.full((tokens.shape[0], max_len), PAD_ID, np.int32)
    out_core = np.zeros((tokens.shape[0], max_len), bool)
    for b in range(tokens.shape[0]):
        ids, flags = [], []
        for w, c in zip(tokens[b].tolist(), core[b].tolist()):
            if w == PAD_ID:
                continue
            if not 0 <= w < len(vocab):
                raise ValueError(f"token id {w} outside vocabulary of size {len(vocab)}")
            ids.extend(table[w])
            flags.extend([c] * len(table[w]))
        n = min(len(ids), max_len)
        out[b, :n], out_core[b, :n] = ids[:n], flags[:n]
    return out, out_core


def _piece_table(vocab: Vocab, tokenizer: PieceTokenizer) -> list[list[int]]:
    tables = tokenizer.__dict__.setdefault("_piece_tables", {})  # per tokenizer, per vocab
    if vocab.words not in tables:
        # UNK (a word outside the vocabulary) has no text: the tokenizer's own unknown token.
        tables[vocab.words] = [[] if i == PAD_ID else [tokenizer.unk_id] if i == UNK_ID
                               else tokenizer.pieces(w) for i, w in enumerate(vocab.words)]
    return tables[vocab.words]
