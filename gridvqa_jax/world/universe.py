"""The closed GridVQA-X universe: vocabulary, question buckets, templates and the dataset spec.

Everything here is static (host-side Python and numpy): the jitted sampler indexes these tables
with traced bucket ids, so one compiled program serves every depth / type / form.

Semantics follow the public GridVQA-X release (see ``tests/fixtures/official_gridvqa/FORMAT.md``):
colours and shapes in PIL order, directions as half-planes on one coordinate, and the official
question templates word for word.
"""

from __future__ import annotations

import dataclasses
import re
from typing import NamedTuple

import numpy as np

from mmx_base.grid import SquareGrid

COLORS = ("red", "green", "blue", "yellow")
SHAPES = ("circle", "square", "triangle", "pentagon")
# "left of a" = x < a.x, "right of a" = x > a.x, "above a" = y < a.y, "below a" = y > a.y.
DIRECTIONS = ("left of", "right of", "above", "below")
QTYPES = ("A", "SO", "CO", "M", "CMP")
DENSITIES = {"d03": 0.3, "d07": 0.7}
VARIANTS = ("pure", "spur")

QTYPES_AT_DEPTH = {1: ("A", "SO", "CO", "M", "CMP"), 2: ("SO", "CO", "M", "CMP"), 3: ("M", "CMP")}

MAX_CLAUSES = 2  # CMP compares two clauses; every other type has one.
MAX_ANCHORS_PER_CLAUSE = 3  # depth-3 M has three anchors.
MAX_ANCHORS = MAX_CLAUSES * MAX_ANCHORS_PER_CLAUSE
MAX_TOKENS = 32  # the longest question (depth-3 CMP) has 26 tokens.

# Cell roles of a scene.
EMPTY, ANCHOR, TARGET, CONFUSER, DISTRACTOR = 0, 1, 2, 3, 4
ROLE_NAMES = ("empty", "anchor", "target", "confuser", "distractor")
# Token roles of a question; the ground-truth token mask is role > FUNCTION.
FUNCTION, TARGET_ATTR, ANCHOR_ATTR, RELATION = 0, 1, 2, 3
TOKEN_ROLE_NAMES = ("function", "target_attr", "anchor_attr", "relation")


class Bucket(NamedTuple):
    """One GridVQA-X question bucket: hop depth (1-3), question type (A, SO, CO, M, CMP) and form
    (0 count, 1 yes/no); the paper reports accuracy per bucket and density."""

    depth: int
    qtype: str
    form: int

    @property
    def name(self) -> str:
        """Bucket key used in reports and CSVs, e.g. ``D2_M_F0``."""
        return f"D{self.depth}_{self.qtype}_F{self.form}"

    @property
    def n_clauses(self) -> int:
        """Counted clauses: 2 for a comparison (CMP), else 1."""
        return 2 if self.qtype == "CMP" else 1

    @property
    def anchors_per_clause(self) -> int:
        """Anchors (relational hops) per clause: 0 for A, D-1 for CMP, else D."""
        # CMP at depth D has D-1 hops per clause ("more X left of Y than Z below W" is depth 2).
        if self.qtype == "A":
            return 0
        return self.depth - 1 if self.qtype == "CMP" else self.depth

    @property
    def n_anchors(self) -> int:
        """Anchors in the whole question: clauses x anchors per clause."""
        return self.n_clauses * self.anchors_per_clause

    @property
    def is_yesno(self) -> bool:
        """True when the answer is yes/no: form 1, or any CMP question ("are there more ...")."""
        return self.form == 1 or self.qtype == "CMP"


BUCKETS: tuple[Bucket, ...] = tuple(
    Bucket(d, q, f)
    for d, qs in QTYPES_AT_DEPTH.items()
    for q in qs
    for f in ((0,) if q == "CMP" else (0, 1))
)
BUCKET_INDEX = {b: i for i, b in enumerate(BUCKETS)}


def bucket_id(depth: int, qtype: str, form: int) -> int:
    """Index of a (depth, qtype, form) bucket in ``BUCKETS``; raises ValueError naming the problem."""
    if depth not in QTYPES_AT_DEPTH:
        raise ValueError(f"depth must be 1, 2 or 3, got {depth!r}")
    if qtype not in QTYPES:
        raise ValueError(f"unknown question type {qtype!r}; known: {', '.join(QTYPES)}")
    if qtype not in QTYPES_AT_DEPTH[depth]:
        raise ValueError(
            f"question type {qtype} is not defined at depth {depth}; "
            f"depth {depth} has {', '.join(QTYPES_AT_DEPTH[depth])}")
    if form not in (0, 1):
        raise ValueError(f"form must be 0 (count) or 1 (yes/no), got {form!r}")
    if qtype == "CMP" and form != 0:
        raise ValueError("CMP questions exist only as form 0 (their answer is yes/no)")
    return BUCKET_INDEX[Bucket(depth, qtype, form)]


def color_id(name: str) -> int:
    """Index of the colour ``name`` in ``COLORS``; ValueError naming the known ones otherwise."""
    try:
        return COLORS.index(name)
    except ValueError:
        raise ValueError(f"unknown color {name!r}; known: {', '.join(COLORS)}") from None


def shape_id(name: str) -> int:
    """Index of the shape ``name`` in ``SHAPES``; ValueError naming the known ones otherwise."""
    try:
        return SHAPES.index(name)
    except ValueError:
        raise ValueError(f"unknown shape {name!r}; known: {', '.join(SHAPES)}") from None


def direction_id(name: str) -> int:
    """Index of the direction ``name`` in ``DIRECTIONS``; ValueError naming the known ones otherwise."""
    try:
        return DIRECTIONS.index(name)
    except ValueError:
        raise ValueError(f"unknown direction {name!r}; known: {', '.join(DIRECTIONS)}") from None


# ----------------------------------------------------------------------------------------------
# Word vocabulary. Questions are lower-cased and "," / "?" are their own tokens; decoding restores
# the official capitalisation and punctuation.
# ----------------------------------------------------------------------------------------------
PAD = "<pad>"
VOCAB: tuple[str, ...] = (
    PAD, "how", "many", "are", "is", "there", "any", "that", "and", "more", "than",
    "object", "objects", "left", "right", "of", "above", "below", ",", "?",
    *COLORS, *SHAPES, *(s + "s" for s in SHAPES),
)
WORD_ID = {w: i for i, w in enumerate(VOCAB)}
PAD_ID = 0
COLOR_TOKEN0 = WORD_ID[COLORS[0]]
SHAPE_TOKEN0 = WORD_ID[SHAPES[0]]
SHAPE_PLURAL_TOKEN0 = WORD_ID[SHAPES[0] + "s"]
# Each direction is written with up to two tokens; PAD_ID marks "no second token".
DIRECTION_TOKENS = np.array(
    [[WORD_ID["left"], WORD_ID["of"]], [WORD_ID["right"], WORD_ID["of"]],
     [WORD_ID["above"], PAD_ID], [WORD_ID["below"], PAD_ID]], dtype=np.int32)


# ----------------------------------------------------------------------------------------------
# Templates. Python format strings reproduce the official wording; the jitted sampler uses the
# slot programs compiled from the same grammar below, and tests check the two agree.
# ----------------------------------------------------------------------------------------------
def _relations(clause_rel: list[str], oxford: bool) -> str:
    if len(clause_rel) == 1:
        return clause_rel[0]
    if len(clause_rel) == 2:
        return f"{clause_rel[0]} and {clause_rel[1]}"
    if oxford:
        return ", ".join(clause_rel[:-1]) + ", and " + clause_rel[-1]
    return " and ".join(clause_rel)


def noun_phrase(qtype: str, color: int, shape: int, plural: bool) -> str:
    """Official noun phrase naming an object: M/A/CMP 'red circle(s)', CO 'red object(s)', SO 'circle(s)'."""
    s = "s" if plural else ""
    if qtype == "CO":
        return f"{COLORS[color]} object{s}"
    if qtype == "SO":
        return f"{SHAPES[shape]}{s}"
    return f"{COLORS[color]} {SHAPES[shape]}{s}"


def format_question(bucket: Bucket, target_color, target_shape, anchor_color, anchor_shape,
                    direction) -> str:
    """Official question text for one sample (host side, pure Python).

    target_*: per clause ([n_clauses]); anchor_* and direction: per clause and anchor
    ([n_clauses][anchors_per_clause]). Unnamed attributes are ignored (CO names colours only,
    SO shapes only). Templates are those of the public GridVQA-X release.
    """
    q, m = bucket.qtype, bucket.anchors_per_clause

    def rels(c):
        return [f"{DIRECTIONS[direction[c][i]]} "
                f"{noun_phrase(q if q != 'CMP' else 'M', anchor_color[c][i], anchor_shape[c][i], False)}"
                for i in range(m)]

    if q == "CMP":
        parts = []
        for c in range(2):
            t = noun_phrase("M", target_color[c], target_shape[c], True)
            parts.append(t + (" " + _relations(rels(c), oxford=False) if m else ""))
        return f"Are there more {parts[0]} than {parts[1]}?"
    single = noun_phrase(q, target_color[0], target_shape[0], False)
    plural = noun_phrase(q, target_color[0], target_shape[0], True)
    if q == "A":
        return f"How many {plural}?" if bucket.form == 0 else f"Is there any {single}?"
    r = _relations(rels(0), oxford=True)
    if bucket.form == 1:
        return f"Is there any {single} that is {r}?"
    return f"How many {plural} that are {r}?" if m == 3 else f"How many {plural} are {r}?"


def tokenize(text: str) -> list[str]:
    """Split an official question into our word tokens: lower-case, ',' and '?' separate."""
    return re.findall(r"[a-z]+|[,?]", text.lower())


def detokenize(words) -> str:
    """Inverse of ``tokenize`` for questions of this universe (restores capitals and spacing)."""
    words = [w for w in words if w != PAD]
    text = " ".join(words).replace(" ,", ",").replace(" ?", "?")
    return text[:1].upper() + text[1:]


# Slot kinds of the compiled templates. Each slot emits up to two tokens.
(S_WORD, S_TCOLOR, S_TSHAPE, S_TSHAPES, S_ACOLOR, S_ASHAPE, S_DIR) = range(7)


def _slot_program(bucket: Bucket) -> list[tuple[int, int, int, int]]:
    """(kind, word_id, clause, anchor) slots spelling the bucket's template; see format_question."""
    q, m, f = bucket.qtype, bucket.anchors_per_clause, bucket.form
    W = lambda w: (S_WORD, WORD_ID[w], 0, 0)  # noqa: E731

    def target(c, plural):
        if q == "CO":
            return [(S_TCOLOR, 0, c, 0), W("objects" if plural else "object")]
        if q == "SO":
            return [(S_TSHAPES if plural else S_TSHAPE, 0, c, 0)]
        return [(S_TCOLOR, 0, c, 0), (S_TSHAPES if plural else S_TSHAPE, 0, c, 0)]

    def anchor(c, i):
        rel = [(S_DIR, 0, c, i)]
        if q == "CO":
            return rel + [(S_ACOLOR, 0, c, i), W("object")]
        if q == "SO":
            return rel + [(S_ASHAPE, 0, c, i)]
        return rel + [(S_ACOLOR, 0, c, i), (S_ASHAPE, 0, c, i)]

    def relations(c, oxford):
        out = []
        for i in range(m):
            if i > 0:
                if oxford and m == 3:
                    out += [W(",")] + ([W("and")] if i == m - 1 else [])
                else:
                    out += [W("and")]
            out += anchor(c, i)
        return out

    if q == "CMP":
        prog = [W("are"), W("there"), W("more")] + target(0, True) + relations(0, False)
        prog += [W("than")] + target(1, True) + relations(1, False)
    elif q == "A":
        prog = ([W("how"), W("many")] + target(0, True) if f == 0
                else [W("is"), W("there"), W("any")] + target(0, False))
    elif f == 1:
        prog = [W("is"), W("there"), W("any")] + target(0, False) + [W("that"), W("is")]
        prog += relations(0, True)
    else:
        prog = [W("how"), W("many")] + target(0, True)
        prog += [W("that"), W("are")] if m == 3 else [W("are")]
        prog += relations(0, True)
    return prog + [W("?")]


def _compile_templates() -> np.ndarray:
    progs = [_slot_program(b) for b in BUCKETS]
    n = max(len(p) for p in progs)
    table = np.zeros((len(BUCKETS), n, 4), np.int32)
    table[:, :, 1] = PAD_ID  # padding slots: a word slot that emits PAD, i.e. nothing
    for i, p in enumerate(progs):
        table[i, : len(p)] = p
    return table


SLOT_TABLE = _compile_templates()  # [n_buckets, n_slots, (kind, word, clause, anchor)]

# Per-bucket static facts, as arrays the jitted code can index with a traced bucket id.
BUCKET_DEPTH = np.array([b.depth for b in BUCKETS], np.int32)
BUCKET_QTYPE = np.array([QTYPES.index(b.qtype) for b in BUCKETS], np.int32)
BUCKET_FORM = np.array([b.form for b in BUCKETS], np.int32)
BUCKET_N_CLAUSES = np.array([b.n_clauses for b in BUCKETS], np.int32)
BUCKET_ANCHORS_PER_CLAUSE = np.array([b.anchors_per_clause for b in BUCKETS], np.int32)
BUCKET_IS_YESNO = np.array([b.is_yesno for b in BUCKETS], bool)


# ----------------------------------------------------------------------------------------------
# The dataset spec.
# ----------------------------------------------------------------------------------------------
def n_objects_for(grid_size: int, density: float) -> int:
    """Official object count: exactly ``int(rho * S * S)`` objects (7 and 17 on a 5x5 grid)."""
    return int(density * grid_size * grid_size)


@dataclasses.dataclass(frozen=True)
class Spec(SquareGrid):
    """Static description of a GridVQA-X dataset (hashable: it is a jit static argument)."""

    variant: str = "pure"  # "pure" (confusers defeat every shortcut) or "spur" (BoW is exact)
    grid_size: int = 5  # S: the grid is S x S cells, 4 <= S <= 10
    density: float = 0.7  # rho: the scene has exactly int(rho*S*S) objects, 0 < rho < 1
    cell_px: int = 64  # rendered pixels per cell side (official: 64; models resize to their own)
    buckets: tuple[int, ...] = tuple(range(len(BUCKETS)))  # bucket ids sampled round-robin

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise ValueError(f"unknown variant {self.variant!r}; known: {', '.join(VARIANTS)}")
        if not (isinstance(self.grid_size, int) and 4 <= self.grid_size <= 10):
            raise ValueError(
                f"grid_size must be an int from 4 to 10, got {self.grid_size!r} "
                "(a grid smaller than 4x4 cannot place a depth-3 query)")
        if not 0.0 < float(self.density) < 1.0:
            raise ValueError(f"density must lie strictly between 0 and 1, got {self.density!r}")
        if abs(10 * float(self.density) - round(10 * float(self.density))) > 1e-9:
            raise ValueError(f"density must be a multiple of 0.1 (its official name d01..d09 "
                             f"keeps one decimal), got {self.density!r}")
        if not (isinstance(self.cell_px, int) and self.cell_px >= 4):
            raise ValueError(f"cell_px must be an int >= 4, got {self.cell_px!r}")
        if not self.buckets:
            raise ValueError("a spec needs at least one bucket")
        for b in self.buckets:
            if not 0 <= b < len(BUCKETS):
                raise ValueError(f"bucket id {b} out of range 0..{len(BUCKETS) - 1}")
            problem = self.infeasibility(BUCKETS[b])
            if problem:
                raise ValueError(problem)

    def to_json(self) -> dict:
        """JSON-able dict of the spec, with derived facts (object count, bucket names) for readers."""
        return {"variant": self.variant, "grid_size": self.grid_size, "density": self.density,
                "density_key": self.density_key, "cell_px": self.cell_px,
                "n_objects": self.n_objects, "buckets": list(self.buckets),
                "bucket_names": [BUCKETS[b].name for b in self.buckets]}

    @classmethod
    def from_json(cls, d: dict) -> "Spec":
        """Inverse of ``to_json`` (validates like the constructor)."""
        return cls(variant=d["variant"], grid_size=int(d["grid_size"]),
                   density=float(d["density"]), cell_px=int(d["cell_px"]),
                   buckets=tuple(int(b) for b in d["buckets"]))

    @property
    def n_objects(self) -> int:
        """Objects per scene, ``int(density * S * S)`` (official rule)."""
        return n_objects_for(self.grid_size, self.density)

    @property
    def density_key(self) -> str:
        """Official density name, e.g. 0.7 -> "d07"."""
        return f"d{int(round(self.density * 10)):02d}"

    def infeasibility(self, bucket: Bucket) -> str | None:
        """Why this bucket cannot be generated under this spec, or None when it can."""
        n, m = self.n_objects, bucket.n_anchors
        # Each anchor is one object; D_pure also needs one target look-alike per anchor in C_k,
        # and every question needs room for at least one target.
        need = m + (m if self.variant == "pure" else 0) + 1
        if n < need:
            return (f"{bucket.name} {self.variant} needs at least {need} objects "
                    f"({m} anchors{f', {m} confusers' if self.variant == 'pure' else ''}, 1 target) "
                    f"but a {self.grid_size}x{self.grid_size} grid at density {self.density} "
                    f"holds only {n}")
        free_keys = {"CO": 4, "SO": 4}.get(bucket.qtype, 16) - bucket.n_clauses - m
        if free_keys < 1:
            return f"{bucket.name} names every attribute value; no distractor can be drawn"
        return None

    @classmethod
    def feasible(cls, variant="pure", grid_size=5, density=0.7, cell_px=64,
                 depth=None, qtype=None, form=None) -> tuple["Spec", list[str]]:
        """Spec over every bucket matching the filters that this grid and density can hold.

        Returns the spec and the reasons for the buckets left out (e.g. depth-3 CMP in D_pure at
        d03 on 5x5 needs 4 anchors + 4 confusers + 1 target > 7 objects).
        """
        probe = cls(variant, grid_size, density, cell_px, buckets=(0,))
        keep, dropped = [], []
        for i, b in enumerate(BUCKETS):
            if depth is not None and b.depth != depth:
                continue
            if qtype is not None and b.qtype != qtype:
                continue
            if form is not None and b.form != form:
                continue
            problem = probe.infeasibility(b)
            (dropped.append(problem) if problem else keep.append(i))
        if qtype is not None and qtype not in QTYPES:
            raise ValueError(f"unknown question type {qtype!r}; known: {', '.join(QTYPES)}")
        if depth is not None and qtype is not None:
            bucket_id(depth, qtype, 0 if form is None else form)  # raises naming the problem
        if not keep:
            raise ValueError("no bucket matches: " + ("; ".join(dropped) or "filters select nothing"))
        return dataclasses.replace(probe, buckets=tuple(keep)), dropped
