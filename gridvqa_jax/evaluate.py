"""Accuracy of models (and of any image+question -> answer callable) per GridVQA-X bucket.

Buckets are keyed ``D{depth}_{qtype}_F{form}_{density}`` (e.g. ``D2_M_F0_d07``). Held-out data
is generated from fixed seeds (``EVAL_SEED + density index``) that no training stream uses, or
read from a directory (native shards, or the official release layout incl. data made by the
official generator). Images are rendered from the symbolic scene at ``cell_px`` (64 = the
official Pillow images pixel for pixel); models resize them to their own input size.

Three regimes (GridVQA-X, Table 2): pure (M_pure on D_pure), spurious (M_spur on D_spur) and
cross (M_spur on D_pure).
"""

from __future__ import annotations

import functools
import re
import sys
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from mmx_base.errors import DatasetError, InputError
from gridvqa_jax.formats.datasets import load_dataset
from gridvqa_jax.world import generate as G
from gridvqa_jax.world import render as R
from gridvqa_jax.world import universe as U
from gridvqa_jax.models import mdetr as M
from gridvqa_jax.training.export import load_reference_model  # re-exported for users

EVAL_SEED = 777_000  # held-out data: seed EVAL_SEED + density index (training uses 1000 + i)


def bucket_key(bucket_id: int, density_key: str) -> str:
    """Report key of a bucket at a density, e.g. (id of D2/M/form 0, "d07") -> "D2_M_F0_d07"."""
    return f"{U.BUCKETS[int(bucket_id)].name}_{density_key}"


# ----------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------
def eval_sets(data, n: int, densities=("d03", "d07"), grid_size: int = 5, seed: int = EVAL_SEED,
              mesh=None):
    """[(Scene batch (numpy), density key)] for data "pure"/"spur" (n samples per density,
    generated from the held-out seeds) or a dataset directory (all its samples, n ignored
    when 0, else the first n per density). The variant of a directory is not needed.

    Raises InputError for a generated set with n < 1 or an unknown density key, and
    DatasetError for a directory that cannot be read, holds no samples, or has grids other
    than ``grid_size`` x ``grid_size``.
    """
    if data in U.VARIANTS:
        if n < 1:
            raise InputError(f"n must be >= 1 to generate {data} samples, got {n}")
        unknown = [dk for dk in densities if dk not in U.DENSITIES]
        if unknown:
            raise InputError(f"unknown density {unknown[0]!r}: expected one of "
                             f"{', '.join(U.DENSITIES)}")
        out = []
        for i, dk in enumerate(densities):
            spec = U.Spec.feasible(data, grid_size, U.DENSITIES[dk])[0]
            out.append((G.to_numpy(G.generate_chunk(spec, seed + i, 0, n, mesh)), dk))
        return out
    if not Path(data).exists():
        raise InputError(f"unknown data {data!r}: expected {' or '.join(U.VARIANTS)} (held-out "
                         "samples generated on the fly) or a dataset directory")
    out = []
    for part in load_dataset(data):
        if part.grid_size != grid_size:
            raise DatasetError(f"{part.source} has {part.grid_size}x{part.grid_size} grids; "
                               f"the model reads {grid_size}x{grid_size}")
        batch = jax.tree.map(np.asarray, part.batch)
        if n:
            batch = jax.tree.map(lambda a: a[:n], batch)
        if len(batch.bucket):
            out.append((batch, part.density_key))
    if not out:
        raise DatasetError(f"{data} holds no samples")
    return out


@functools.partial(jax.jit, static_argnames="cell_px")
def render_batch(color, shape, cell_px: int):
    """``vmap(render.render)``: int [B, S, S] colour and shape codes -> uint8 images
    [B, S * cell_px, S * cell_px, 3] (a jax array, on the inputs' devices)."""
    return jax.vmap(lambda c, s: R.render(c, s, cell_px))(color, shape)


def _chunks(n: int, size: int):
    for i in range(0, n, size):
        yield i, min(n, i + size)


# ----------------------------------------------------------------------------------------------
# Scoring
# ----------------------------------------------------------------------------------------------
def _summarise(correct: dict[str, list]) -> dict:
    buckets = {k: float(np.mean(v)) for k, v in sorted(correct.items())}
    allv = np.concatenate([np.asarray(v, bool) for v in correct.values()])
    return {"overall": float(np.mean(allv)), "n": int(allv.size), "buckets": buckets}


def predict(apply_fn, params, image, tokens):
    """Unified answer class (int [B]) of a model on images + token ids."""
    return np.asarray(jnp.argmax(apply_fn(params, image, tokens)["answer_logprobs"], axis=-1))


def evaluate_model(apply_fn, params, data, n: int = 1024, densities=("d03", "d07"),
                   grid_size: int = 5, cell_px: int = 16, batch: int = 256, seed: int = EVAL_SEED,
                   mesh=None, progress: bool = True) -> dict:
    """Accuracy of a model per bucket: {"overall", "n", "buckets": {key: acc}}.

    ``apply_fn(params, image uint8 [B, H, W, 3], tokens int32 [B, L]) -> {"answer_logprobs"}``;
    images are rendered at ``cell_px`` (use 64 for the official resolution). Predictions are
    exact matches on the unified answer space (count, or yes/no).
    """
    from tqdm.auto import tqdm

    correct: dict[str, list] = {}
    sets = eval_sets(data, n, densities, grid_size, seed, mesh)
    total = sum(len(b.bucket) for b, _ in sets)
    bar = tqdm(total=total, desc="evaluate", disable=not progress, file=sys.stderr,
               unit="sample", dynamic_ncols=True)
    C = grid_size * grid_size
    for scenes, dk in sets:
        m = len(scenes.bucket)
        for a, b in _chunks(m, batch):
            sl = slice(a, b)
            # Pad the last chunk to a fixed size so the jitted model compiles once.
            idx = np.arange(a, a + batch).clip(max=b - 1)
            img = render_batch(jnp.asarray(scenes.color[idx]), jnp.asarray(scenes.shape[idx]), cell_px)
            pred = predict(apply_fn, params, img, jnp.asarray(scenes.tokens[idx]))[: b - a]
            truth = np.asarray(M.answer_index(scenes.answer[sl], scenes.is_yesno[sl], C))
            for bid, ok in zip(scenes.bucket[sl], pred == truth):
                correct.setdefault(bucket_key(bid, dk), []).append(bool(ok))
            bar.update(b - a)
    bar.close()
    return _summarise(correct)


# ----------------------------------------------------------------------------------------------
# Any callable (foundation VLMs)
# ----------------------------------------------------------------------------------------------
NUMBER_WORDS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty twenty-one twenty-two twenty-three "
    "twenty-four twenty-five".split())}
NUMBER_WORDS.update({"none": 0, "no objects": 0, "a single": 1, "single": 1, "once": 1})
_YES = re.compile(r"\b(yes|yeah|yep|true|correct|there (?:is|are) (?:a|an|some|more))\b")
_NO = re.compile(r"\b(no|nope|false|incorrect|there (?:is|are) (?:no|not|none|fewer))\b")


def parse_answer(text: str, is_yesno: bool) -> int | None:
    """Parse a free-form answer: yes/no -> 1/0, count -> int; None when no answer is found.

    Counts: the first integer written in digits, or else the first number word (zero ...
    twenty-five; "no"/"none" count as 0). Yes/no: the first of yes/no-like words; a bare digit
    answer to a yes/no question is read as 0 -> no, positive -> yes.
    """
    t = " " + str(text).strip().lower().replace("\n", " ") + " "
    if is_yesno:
        my, mn = _YES.search(t), _NO.search(t)
        if my and (not mn or my.start() < mn.start()):
            return 1
        if mn:
            return 0
        d = re.search(r"\d+", t)
        return None if d is None else int(int(d.group()) > 0)
    d = re.search(r"(?<![\w.])(\d+)(?![\w.]*\d)", t)
    if d:
        return int(d.group(1))
    words = re.findall(r"[a-z]+(?:-[a-z]+)?", t)
    for i, w in enumerate(words):
        two = " ".join(words[i:i + 2])
        if two in NUMBER_WORDS:
            return NUMBER_WORDS[two]
        if w in NUMBER_WORDS:
            return NUMBER_WORDS[w]
        if w == "no":
            return 0
    return None


def question_text(tokens) -> str:
    """Official question string of a token-id row."""
    return U.detokenize([U.VOCAB[int(t)] for t in tokens])


def evaluate_callable(fn: Callable[[np.ndarray, str], str], data, n: int = 64,
                      densities=("d03", "d07"), grid_size: int = 5, cell_px: int = 64,
                      seed: int = EVAL_SEED, progress: bool = True,
                      with_scene: bool = False) -> dict:
    """Score any ``fn(image_uint8 [H, W, 3], question_str) -> answer_str`` per bucket.

    Answers are parsed with ``parse_answer``; an unparseable answer counts as wrong and is
    tallied in ``"unparsed"``. ``with_scene=True`` passes the symbolic scene as a third argument
    (for oracles and tests). Returns {"overall", "n", "buckets", "unparsed"}.
    """
    from tqdm.auto import tqdm

    correct: dict[str, list] = {}
    unparsed = 0
    sets = eval_sets(data, n, densities, grid_size, seed)
    bar = tqdm(total=sum(len(b.bucket) for b, _ in sets), desc="evaluate callable",
               disable=not progress, file=sys.stderr, unit="sample", dynamic_ncols=True)
    for scenes, dk in sets:
        for a, b in _chunks(len(scenes.bucket), 64):
            imgs = np.asarray(render_batch(jnp.asarray(scenes.color[a:b]),
                                      jnp.asarray(scenes.shape[a:b]), cell_px))
            for j in range(b - a):
                i = a + j
                q = question_text(scenes.tokens[i])
                args = (imgs[j], q) + ((jax.tree.map(lambda x: x[i], scenes),)
                                       if with_scene else ())
                got = parse_answer(fn(*args), bool(scenes.is_yesno[i]))
                unparsed += got is None
                ok = got is not None and got == int(scenes.answer[i])
                correct.setdefault(bucket_key(scenes.bucket[i], dk), []).append(ok)
                bar.update(1)
    bar.close()
    return {**_summarise(correct), "unparsed": unparsed}


# ----------------------------------------------------------------------------------------------
# Tables
# ----------------------------------------------------------------------------------------------
REGIMES = (("pure", "pure", "pure"), ("spurious", "spur", "spur"), ("cross", "spur", "pure"))


def format_table(results: dict[str, dict]) -> str:
    """Buckets as rows, one accuracy column (in %) per named result."""
    names = list(results)
    keys = sorted({k for r in results.values() for k in r["buckets"]},
                  key=lambda k: (k[-3:], k))
    w = max([len(k) for k in keys] + [7])
    lines = [f"{'bucket':<{w}} " + " ".join(f"{n:>10}" for n in names)]
    for k in keys:
        cells = [f"{100 * results[n]['buckets'][k]:10.1f}" if k in results[n]["buckets"]
                 else f"{'-':>10}" for n in names]
        lines.append(f"{k:<{w}} " + " ".join(cells))
    lines.append(f"{'overall':<{w}} " + " ".join(f"{100 * results[n]['overall']:10.1f}"
                                                for n in names))
    lines.append(f"{'n':<{w}} " + " ".join(f"{results[n]['n']:>10}" for n in names))
    return "\n".join(lines)


__all__ = ["EVAL_SEED", "evaluate_model", "render_batch",
           "evaluate_callable", "parse_answer", "question_text", "format_table", "REGIMES",
           "bucket_key", "eval_sets", "load_reference_model"]
