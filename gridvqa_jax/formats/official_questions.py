"""Parse official GridVQA-X questions back into the question fields of a ``Scene``.

One regular expression per bucket, built from the same pieces as ``universe.format_question``
(noun phrases, relation lists, joins), so every question our templates spell parses back, and
the official release's questions (same templates) parse too.
"""

from __future__ import annotations

import re

import numpy as np

from mmx_base.errors import InputError
from gridvqa_jax.world import universe as U


def _alt(names) -> str:
    return "|".join(sorted(names, key=len, reverse=True))


def _np_pattern(qtype: str, plural: bool, cname: str, sname: str) -> str:
    """Regex of ``universe.noun_phrase`` with named groups for the named attributes."""
    s = "s" if plural else ""
    color = f"(?P<{cname}>{_alt(U.COLORS)})"
    shape = f"(?P<{sname}>{_alt(U.SHAPES)})"
    if qtype == "CO":
        return f"{color} object{s}"
    if qtype == "SO":
        return f"{shape}{s}"
    return f"{color} {shape}{s}"


def _relations_pattern(qtype: str, clause: int, m: int, oxford: bool) -> str:
    rels = [f"(?P<d{clause}_{i}>{_alt(U.DIRECTIONS)}) "
            + _np_pattern(qtype, False, f"ac{clause}_{i}", f"as{clause}_{i}") for i in range(m)]
    return U._relations(rels, oxford)


def _question_pattern(bucket: U.Bucket) -> str:
    """Regex mirroring ``universe.format_question`` for one bucket (same wording, same joins)."""
    q, m = bucket.qtype, bucket.anchors_per_clause
    if q == "CMP":
        parts = []
        for c in range(2):
            t = _np_pattern("M", True, f"tc{c}", f"ts{c}")
            parts.append(t + (" " + _relations_pattern("M", c, m, oxford=False) if m else ""))
        return rf"Are there more {parts[0]} than {parts[1]}\?"
    single = _np_pattern(q, False, "tc0", "ts0")
    plural = _np_pattern(q, True, "tc0", "ts0")
    if q == "A":
        return rf"How many {plural}\?" if bucket.form == 0 else rf"Is there any {single}\?"
    r = _relations_pattern(q, 0, m, oxford=True)
    if bucket.form == 1:
        return rf"Is there any {single} that is {r}\?"
    return rf"How many {plural} that are {r}\?" if m == 3 else rf"How many {plural} are {r}\?"


_QUESTION_RES = tuple(re.compile(_question_pattern(b)) for b in U.BUCKETS)


def _match(text: str, bucket: int | None) -> tuple[int, re.Match]:
    """(bucket id, match) of the template that spells ``text`` (only ``bucket``'s if given)."""
    ids = range(len(U.BUCKETS)) if bucket is None else (int(bucket),)
    for bid in ids:
        mt = _QUESTION_RES[bid].fullmatch(text)
        if mt is not None:
            return bid, mt
    if bucket is not None:
        other = [U.BUCKETS[i].name for i, rx in enumerate(_QUESTION_RES) if rx.fullmatch(text)]
        hint = f" (it is a {other[0]} question)" if other else ""
        raise InputError(f"question {text!r} does not match the official "
                         f"{U.BUCKETS[int(bucket)].name} template{hint}")
    raise InputError(f"question {text!r} matches no official GridVQA-X template")


def parse_question(text: str, bucket: int | None = None) -> dict:
    """Parse an official question back into the question fields of a ``Scene``.

    text: the question as in ``qa_{split}.jsonl``; bucket: expected bucket id (None: infer it;
    the templates are unambiguous). Returns a dict of numpy arrays in ``Scene`` conventions:
    bucket int, target_color/target_shape int32 [2] (-1 unnamed or absent clause),
    anchor_active bool [2, K], anchor_color/anchor_shape/direction int32 [2, K] (anchors in
    question order; -1 / 0 when inactive or unnamed). Raises InputError (a ValueError) if no
    template matches.
    """
    K = U.MAX_ANCHORS_PER_CLAUSE
    bid, mt = _match(text, bucket)
    b = U.BUCKETS[bid]
    g = mt.groupdict()
    col = lambda k: U.COLORS.index(g[k]) if g.get(k) else -1  # noqa: E731
    shp = lambda k: U.SHAPES.index(g[k]) if g.get(k) else -1  # noqa: E731
    out = dict(bucket=bid,
               target_color=np.full(2, -1, np.int32), target_shape=np.full(2, -1, np.int32),
               anchor_active=np.zeros((2, K), bool), anchor_color=np.full((2, K), -1, np.int32),
               anchor_shape=np.full((2, K), -1, np.int32), direction=np.zeros((2, K), np.int32))
    for c in range(b.n_clauses):
        out["target_color"][c], out["target_shape"][c] = col(f"tc{c}"), shp(f"ts{c}")
        for i in range(b.anchors_per_clause):
            out["anchor_active"][c, i] = True
            out["anchor_color"][c, i] = col(f"ac{c}_{i}")
            out["anchor_shape"][c, i] = shp(f"as{c}_{i}")
            out["direction"][c, i] = U.DIRECTIONS.index(g[f"d{c}_{i}"])
    return out


__all__ = ["parse_question"]
