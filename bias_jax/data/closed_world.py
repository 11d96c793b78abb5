"""Closed-world multimodal misinformation with exact modality-bias labels.

Each sample is a rendered GridVQA-X scene (image), a one-sentence claim about it (tokens), a
label (1 real, 0 fake) and its bias type (0 Uni-image, 1 Modality-balance, 2 Uni-text), plus
the causal-view ground truth of the modality-bias paper (core entity E / irrelevant content C
as cell masks, core words W / irrelevant words R as token masks).

One labelling rule holds for every sample::

    real  <=>  the image is an authentic render  AND  the claim is true of the scene,

and the bias type fixes which modality the label can be read from:

- Modality-balance: authentic scene, contingent claim (true in some scenes, false in others),
  true with probability ``p_real[1]``. Both modalities are needed; each alone is at chance.
- Uni-text: authentic scene, a claim that is true in every scene of the universe or in none
  ("there are more than 12 objects" with 7 objects per scene, "the red circle is left of the
  red circle", "no red circle is left of itself", "there are more red circles than red
  circles", "there are as many red circles as red circles"). The scene is drawn independently
  of the label.
- Uni-image: a contingent claim that is true of the underlying scene, shown on the same scene
  with one visible manipulation of a named object's cell (off-palette colour, a cell spliced
  from two objects, a shape with a quadrant erased): a fake that the image alone exposes. The
  claim is drawn independently of the label.

Every Uni-image sample is fake by default (``p_real[0] = 0``). A *real* Uni-image sample would
be an authentic scene with a true contingent claim: exactly the distribution of a real balanced
sample, so the label needs both modalities and no function of the inputs (and the label) could
tell the two apart; under the labelling rule no authentic image settles "real" by itself. The
paper's definition of the type (appendix 12.3, the annotators' question 1: "the extent to which
Image modality enables you to predict without the other modality") therefore admits only
manipulated fakes here. ``p_real[0] > 0`` still generates such samples (typed Uni-image by
their generation, not by what the inputs show: ``bias_jax.analysis.identifiable_labels`` gives
their identifiable type, balance); the shipped detectors were trained on that mixture, where
they are simply more real authentic samples.

Why each modality alone is at chance where it should be (tests check every step):

1. Scenes come from two symmetric scaffolds. A *relation* scene has two unique keys
   (colour, shape) X, Y at cells u, v with u strictly ``d`` of v (uniform over such pairs),
   X at u iff the claim "the X is d the Y" is to be true; a *comparison* scene has ``hi > lo``
   objects of one key and ``lo`` of the other, X getting ``hi`` iff "there are more Xs than Ys"
   is to be true. The other objects (distractors) take keys outside {X, Y}, uniformly.
2. (X, Y) is a uniform ordered pair of distinct keys, so the map (X, Y, truth) -> (Y, X, not
   truth) preserves the latent distribution and, with the same remaining randomness, yields
   the *identical* scene (``realize`` is written so that this holds exactly). Hence
   P(scene | claim true) = P(scene | claim false): the image is independent of the label in
   Modality-balance, and clean scenes have one distribution in every type (Uni-image reals use
   "true", Uni-text an independent coin).
3. The claim tokens are a function of (family, X, Y, d) (and for Uni-text of its own draws),
   never of the label in Modality-balance / Uni-image, and the family mix is the same in both,
   so the text alone is at chance there and cannot tell Uni-image from Modality-balance.
4. Manipulations produce cell images outside the 17 legal tiles (checked for every possible
   manipulation when the table is built), so the image-only oracle decides Uni-image exactly.

Randomness: ``draw_latents`` (the discrete choices above) and ``realize`` (positions,
distractors, manipulated cell) each hash their own key with the counter-based generator of
``gridvqa_jax.world.sampler``; ``sample(key, spec)`` is pure, fixed-shape and vmappable, and
``sample_batch`` is its jitted vmap. The exact oracles that check all this from the rendered
pixels and/or the tokens alone (``image_oracle``, ``text_oracle``, ``joint_oracle``) live in
``bias_jax.data.closed_world_oracles``.
"""

from __future__ import annotations

import dataclasses
import functools

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from mmx_base.grid import SquareGrid
from bias_jax.data import batch as BA
from bias_jax.data.text import PAD, PAD_ID, UNK, Vocab
from gridvqa_jax.world import render as R
from gridvqa_jax.world import sampling as SP
from gridvqa_jax.world import generate as G
from gridvqa_jax.world.universe import COLORS, DIRECTIONS, SHAPES

BIAS_TYPES = BA.BIAS_TYPES
UNI_IMAGE, BALANCE, UNI_TEXT = BA.UNI_IMAGE, BA.BALANCE, BA.UNI_TEXT
REAL, FAKE = BA.REAL, BA.FAKE
# fine_label, MMFakeBench coding (batch.FINE_MMFAKEBENCH).
ORIGINAL, TEXTUAL, VISUAL, MISMATCH = 0, 1, 2, 3

N_KEYS = len(COLORS) * len(SHAPES)  # an object key is 4 * colour + shape (tile id - 1)

# Scene scaffolds and claim families.
SCAFFOLDS = ("relation", "comparison")
FAMILIES = ("relation", "comparison", "count", "self_relation", "self_comparison")
F_RELATION, F_COMPARISON, F_COUNT, F_SELF_RELATION, F_SELF_COMPARISON = range(5)
MANIPULATIONS = ("off_palette", "spliced", "broken")
# Colours no legal tile uses (purple, orange, cyan, grey).
OFF_PALETTE = np.array([[128, 0, 128], [255, 165, 0], [0, 255, 255], [128, 128, 128]], np.uint8)
MAX_GRID = 10

# ----------------------------------------------------------------------------------------------
# Claim vocabulary.
# ----------------------------------------------------------------------------------------------
CLAIM_WORDS = (PAD, UNK, "the", "is", "there", "are", "more", "than", "as", "many", "no",
               "itself", "objects", "left", "right", "of", "above", "below", *COLORS, *SHAPES,
               *(s + "s" for s in SHAPES), *(str(i) for i in range(MAX_GRID * MAX_GRID + 1)))
CLAIM_VOCAB = Vocab(CLAIM_WORDS)
_ID = CLAIM_VOCAB.index
_COLOR0, _SHAPE0, _PLURAL0 = _ID[COLORS[0]], _ID[SHAPES[0]], _ID[SHAPES[0] + "s"]
_NUM0 = _ID["0"]
_DIR_TOKENS = np.array([[_ID[w] for w in (d.split() + [PAD])[:2]] for d in DIRECTIONS], np.int32)
_RAW_LEN = 10  # a template's padded length before packing (the longest claim has 9 tokens)


# ----------------------------------------------------------------------------------------------
# Spec.
# ----------------------------------------------------------------------------------------------
def _as_triple(v, name):
    t = (float(v),) * 3 if np.isscalar(v) else tuple(float(x) for x in v)
    if len(t) != 3:
        raise ValueError(f"{name} needs one value per bias type (uni_image, balance, uni_text), "
                         f"got {v!r}")
    return t


@dataclasses.dataclass(frozen=True)
class WorldSpec(SquareGrid):
    """Static description of the closed-world benchmark (hashable: a jit static argument)."""

    grid_size: int = 5  # S: scenes are S x S cells, 4 <= S <= 10
    density: float = 0.3  # every scene has exactly N = int(density * S * S) objects (7 on 5x5)
    cell_px: int = 16  # pixels per cell when rendering (GridVQA-X official: 64)
    type_mix: tuple = (0.15, 0.75, 0.10)  # P(uni_image), P(balance), P(uni_text); sums to 1
    p_real: tuple = (0.0, 0.5, 0.5)  # P(real | type), per type (a float means all three);
    #                                  Uni-image reals are not identifiable (module docstring)
    p_relation: float = 0.5  # P(relation scaffold); comparison otherwise (all types alike)
    manipulations: tuple = MANIPULATIONS  # Uni-image fake kinds, drawn uniformly
    max_tokens: int = 12  # L: claim length (the longest claim has 9 tokens)

    def __post_init__(self):
        mix, p = _as_triple(self.type_mix, "type_mix"), _as_triple(self.p_real, "p_real")
        object.__setattr__(self, "type_mix", mix)
        object.__setattr__(self, "p_real", p)
        object.__setattr__(self, "manipulations", tuple(self.manipulations))
        if not (isinstance(self.grid_size, int) and 4 <= self.grid_size <= MAX_GRID):
            raise ValueError(f"grid_size must be an int from 4 to {MAX_GRID}, "
                             f"got {self.grid_size!r}")
        if not 0.0 < float(self.density) < 1.0:
            raise ValueError(f"density must lie strictly between 0 and 1, got {self.density!r}")
        if self.n_objects < 3:
            raise ValueError(f"a scene needs at least 3 objects (a comparison scene has 2 + 1); "
                             f"density {self.density} on {self.grid_size}x{self.grid_size} "
                             f"gives {self.n_objects}")
        if any(m < 0 for m in mix) or abs(sum(mix) - 1.0) > 1e-6:
            raise ValueError(f"type_mix must be 3 non-negative numbers summing to 1, got {mix}")
        if any(not 0.0 <= q <= 1.0 for q in p):
            raise ValueError(f"p_real values must lie in [0, 1], got {p}")
        if not 0.0 <= float(self.p_relation) <= 1.0:
            raise ValueError(f"p_relation must lie in [0, 1], got {self.p_relation!r}")
        if not self.manipulations or any(m not in MANIPULATIONS for m in self.manipulations):
            raise ValueError(f"manipulations must be a non-empty subset of {MANIPULATIONS}, "
                             f"got {self.manipulations!r}")
        if not (isinstance(self.max_tokens, int) and self.max_tokens >= _RAW_LEN - 1):
            raise ValueError(f"max_tokens must be an int >= {_RAW_LEN - 1} (the longest claim), "
                             f"got {self.max_tokens!r}")
        if not (isinstance(self.cell_px, int) and self.cell_px >= R.MIN_DECODE_CELL_PX):
            raise ValueError(f"cell_px must be an int >= {R.MIN_DECODE_CELL_PX}, "
                             f"got {self.cell_px!r}")
        manipulation_tiles(self.cell_px)  # raises if some manipulation would be invisible

    @property
    def n_objects(self) -> int:
        """N = int(density * S * S): objects in every scene."""
        return int(self.density * self.grid_size * self.grid_size)

    @property
    def image_px(self) -> int:
        """Side of the rendered image in pixels, S * cell_px."""
        return self.grid_size * self.cell_px

    @property
    def max_count(self) -> int:
        """Largest per-key count of a comparison scene: hi <= H, lo < hi, hi + lo <= N."""
        return min(4, (self.n_objects + 1) // 2)

    def to_json(self) -> dict:
        """``{field: value}`` of every field (tuples stay tuples; ``from_json`` takes lists)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_json(cls, d: dict) -> "WorldSpec":
        """Inverse of ``to_json``: ``type_mix``, ``p_real``, ``manipulations`` back to tuples;
        missing fields take the defaults. Validated as in the constructor."""
        d = dict(d)
        for k in ("type_mix", "p_real", "manipulations"):
            if k in d:
                d[k] = tuple(d[k])
        return cls(**d)


# ----------------------------------------------------------------------------------------------
# Manipulated tiles (host side, once per cell size).
# ----------------------------------------------------------------------------------------------
_N_OFF, _N_SPLICE, _N_QUAD = len(OFF_PALETTE), 12, 4
_OFFSETS = np.array([0, N_KEYS * _N_OFF, N_KEYS * (_N_OFF + _N_SPLICE)], np.int32)


def splice_partner(key: int, param: int) -> int:
    """Key whose lower half is spliced under ``key``'s upper half: a different colour."""
    color = key // 4
    return 4 * ((color + 1 + param // 4) % 4) + param % 4


@functools.lru_cache(maxsize=None)
def manipulation_tiles(cell_px: int) -> np.ndarray:
    """uint8 [N_KEYS * (4 + 12 + 4), P, P, 3]: every manipulated cell image (read-only).

    Layout (``key`` = 4 * colour + shape of the manipulated object):

    - off_palette ``[key * 4 + j]``: the object's fill painted ``OFF_PALETTE[j]``;
    - spliced ``[64 + key * 12 + j]``: rows ``< P // 2`` from the object's tile, the rest from
      the tile of ``splice_partner(key, j)`` (another colour): a visible seam;
    - broken ``[256 + key * 4 + q]``: the object's tile with quadrant ``q`` (0 top-left,
      1 top-right, 2 bottom-left, 3 bottom-right) of the cell painted white.

    Raises ValueError if any of them equals a legal tile (it would be undetectable), which
    happens only for cell sizes too small to draw the shapes.
    """
    tiles = R.tile_table(cell_px)
    fill, _ = R.shape_masks(cell_px)
    P, h = cell_px, cell_px // 2
    out = []
    for key in range(N_KEYS):  # off-palette
        for j in range(_N_OFF):
            t = tiles[1 + key].copy()
            t[fill[key % 4]] = OFF_PALETTE[j]
            out.append(t)
    for key in range(N_KEYS):  # spliced
        for j in range(_N_SPLICE):
            t = tiles[1 + key].copy()
            t[h:] = tiles[1 + splice_partner(key, j)][h:]
            out.append(t)
    for key in range(N_KEYS):  # broken
        for q in range(_N_QUAD):
            t = tiles[1 + key].copy()
            r0, c0 = (q // 2) * h, (q % 2) * h
            t[r0: r0 + h if q < 2 else P, c0: c0 + h if q % 2 == 0 else P] = 255
            out.append(t)
    table = np.stack(out)
    legal = tiles.reshape(len(tiles), -1)
    same = (table.reshape(len(table), 1, -1) == legal[None]).all(-1).any(-1)
    if same.any():
        kinds = sorted({MANIPULATIONS[int(np.searchsorted(_OFFSETS, i, side="right")) - 1]
                        for i in np.flatnonzero(same)})
        raise ValueError(f"cell_px={cell_px} is too small: {int(same.sum())} manipulated cells "
                         f"({', '.join(kinds)}) look exactly like legal tiles")
    table.setflags(write=False)
    return table


# ----------------------------------------------------------------------------------------------
# Latents and samples.
# ----------------------------------------------------------------------------------------------
@flax.struct.dataclass
class Latents:
    """The discrete choices of one sample (all int32 [] / bool [])."""

    bias: jax.Array  # 0 uni_image, 1 balance, 2 uni_text
    label: jax.Array  # 1 real, 0 fake
    scaffold: jax.Array  # 0 relation scene, 1 comparison scene
    key_x: jax.Array  # the scaffold's two named keys (distinct, uniform ordered pair)
    key_y: jax.Array
    direction: jax.Array  # relation scaffold: index into DIRECTIONS
    count_hi: jax.Array  # comparison scaffold: hi > lo >= 1 objects of the two keys
    count_lo: jax.Array
    claim_true: jax.Array  # bool: the scaffold claim "X d Y" / "more Xs than Ys" holds
    family: jax.Array  # claim shown: index into FAMILIES (the scaffold's, or a Uni-text one)
    ut_key: jax.Array  # Uni-text claims: their key, direction and number
    ut_direction: jax.Array
    ut_number: jax.Array
    manip_kind: jax.Array  # index into MANIPULATIONS (used only when manipulated)
    manip_param: jax.Array  # 0..11: off-palette colour / splice partner / erased quadrant

    @property
    def manipulated(self):
        """bool, shape of ``bias``: the image is manipulated, i.e. a Uni-image fake."""
        return (self.bias == UNI_IMAGE) & (self.label == FAKE)


@flax.struct.dataclass
class WorldSample:
    """One closed-world sample. S = grid size, P = cell px, L = spec.max_tokens."""

    latents: Latents
    image: jax.Array  # uint8 [S*P, S*P, 3]: the rendered (possibly manipulated) scene
    tokens: jax.Array  # int32 [L]: claim word ids (CLAIM_VOCAB), PAD after
    n_tokens: jax.Array  # int32 []
    label: jax.Array  # int32 []: 1 real, 0 fake
    bias: jax.Array  # int32 []: 0 uni_image, 1 balance, 2 uni_text
    fine_label: jax.Array  # int32 []: 0 original, 1 textual, 2 visual, 3 mismatch
    claim_true: jax.Array  # bool []: the shown claim holds in the underlying scene
    color: jax.Array  # int32 [S, S]: underlying scene, colour per cell, -1 empty ([y, x])
    shape: jax.Array  # int32 [S, S]
    manipulated: jax.Array  # bool []
    manip_cells: jax.Array  # bool [S, S]: the manipulated cell (none if not manipulated)
    core_cells: jax.Array  # bool [S, S]: core entity E = the objects the claim refers to
    core_tokens: jax.Array  # bool [L]: core words W (attributes, relation, quantifier, number)

    @property
    def irrelevant_cells(self):
        """bool [S, S]: irrelevant visual content C = every cell outside E."""
        return ~self.core_cells

    @property
    def irrelevant_tokens(self):
        """bool [L]: irrelevant words R = the non-PAD tokens outside W."""
        return (self.tokens != PAD_ID) & ~self.core_tokens


def _skip_two(r, a, b):
    """Map r in [0, 14) onto [0, 16) minus {a, b} (a != b), monotonically."""
    lo, hi = jnp.minimum(a, b), jnp.maximum(a, b)
    k = r + (r >= lo)
    return k + (k >= hi)


def draw_latents(key, spec: WorldSpec) -> Latents:
    """The discrete choices of a sample; see the module docstring for their distribution."""
    rng = SP.Bits(key)
    N, C = spec.n_objects, spec.n_cells
    m0, m1, m2 = spec.type_mix
    t1 = m0 / (m0 + m1 + m2)
    t2 = np.inf if m2 == 0 else (m0 + m1) / (m0 + m1 + m2)  # a zero share is never drawn
    u = rng.uniform()
    bias = (u >= np.float32(t1)).astype(jnp.int32) + (u >= np.float32(t2)).astype(jnp.int32)
    label = (rng.uniform() < jnp.asarray(spec.p_real, jnp.float32)[bias]).astype(jnp.int32)
    scaffold = (rng.uniform() >= np.float32(spec.p_relation)).astype(jnp.int32)
    perm = SP.permutation(SP.priority(rng, N_KEYS))  # uniform ordered pair of distinct keys
    key_x, key_y = perm[0], perm[1]
    direction = rng.randint((), 0, 4)
    H = spec.max_count
    lo = rng.randint((), 1, H)  # [1, H-1]
    hi = rng.randint((), lo + 1, H + 1)  # [lo+1, H]
    coin = rng.uniform() < 0.5
    claim_true = jnp.where(bias == BALANCE, label == REAL, jnp.where(bias == UNI_IMAGE, True, coin))
    family = jnp.where(bias == UNI_TEXT, F_COUNT + rng.randint((), 0, 3), scaffold)
    ut_key = rng.randint((), 0, N_KEYS)
    ut_direction = rng.randint((), 0, 4)
    # "there are more than k objects": true iff k < N; k uniform on [0, N-1] or [N, S*S].
    ut_number = jnp.where(label == REAL, rng.randint((), 0, N), rng.randint((), N, C + 1))
    manip_kind = rng.randint((), 0, len(spec.manipulations))
    manip_param = rng.randint((), 0, 12)
    i32 = lambda a: jnp.asarray(a, jnp.int32)  # noqa: E731
    return Latents(bias=i32(bias), label=i32(label), scaffold=i32(scaffold), key_x=i32(key_x),
                   key_y=i32(key_y), direction=i32(direction), count_hi=i32(hi),
                   count_lo=i32(lo), claim_true=jnp.asarray(claim_true, bool),
                   family=i32(family), ut_key=i32(ut_key), ut_direction=i32(ut_direction),
                   ut_number=i32(ut_number), manip_kind=i32(manip_kind),
                   manip_param=i32(manip_param))


@functools.lru_cache(maxsize=None)
def _lt_pairs(n: int) -> np.ndarray:
    """All (a, b) with 0 <= a < b < n."""
    return np.array([(a, b) for a in range(n) for b in range(a + 1, n)], np.int32)


def _scene(rng, lat: Latents, spec: WorldSpec):
    """Cell keys int32 [C] (-1 empty) of the scaffold scene, and the X/Y cells bool [C].

    Invariant (module docstring, step 2): swapping key_x/key_y and negating claim_true gives
    the same output for the same ``rng`` draws.
    """
    S, C, N = spec.grid_size, spec.n_cells, spec.n_objects
    X, Y, ct = lat.key_x, lat.key_y, lat.claim_true
    first = jnp.where(ct, X, Y)  # the key at u (relation) / with hi objects (comparison)
    second = jnp.where(ct, Y, X)
    cells = jnp.arange(C, dtype=jnp.int32)
    # Relation: (u, v) uniform over ordered cell pairs with u strictly `direction` of v.
    pairs = jnp.asarray(_lt_pairs(S))
    a, b = SP.take(pairs, rng.randint((), 0, pairs.shape[0])).T
    o = rng.randint((2,), 0, S)
    d = lat.direction
    small_first = (d == 0) | (d == 2)  # left of / above: u has the smaller coordinate
    cu, cv = jnp.where(small_first, a, b), jnp.where(small_first, b, a)
    horizontal = d < 2
    u = jnp.where(horizontal, o[0] * S + cu, cu * S + o[0])
    v = jnp.where(horizontal, o[1] * S + cv, cv * S + o[1])
    named_rel = (cells == u) | (cells == v)
    dist_rel = SP.choose(SP.priority(rng, C), ~named_rel, N - 2)
    key_rel = jnp.where(cells == u, first, jnp.where(cells == v, second, -1))
    # Comparison: N uniform cells in random order; the first hi get `first`, the next lo
    # `second`, the rest are distractors.
    rank = SP.rank(SP.priority(rng, C))
    hi, lo = lat.count_hi, lat.count_lo
    key_cmp = jnp.where(rank < hi, first, jnp.where(rank < hi + lo, second, -1))
    dist_cmp = (rank >= hi + lo) & (rank < N)
    # Distractor keys: uniform over the 14 keys outside {X, Y} (symmetric in X and Y).
    dist_key = _skip_two(rng.randint((C,), 0, N_KEYS - 2), X, Y)
    rel = lat.scaffold == 0
    named_key = jnp.where(rel, key_rel, key_cmp)
    dist = jnp.where(rel, dist_rel, dist_cmp)
    key = jnp.where(named_key >= 0, named_key, jnp.where(dist, dist_key, -1))
    return key.astype(jnp.int32), named_key >= 0


def _claim(lat: Latents):
    """Raw tokens and core flags of the shown claim, int32 / bool [_RAW_LEN] (PAD holes)."""
    w = lambda s: jnp.int32(_ID[s])  # noqa: E731
    col = lambda k: _COLOR0 + k // 4  # noqa: E731
    shp = lambda k: _SHAPE0 + k % 4  # noqa: E731
    plu = lambda k: _PLURAL0 + k % 4  # noqa: E731
    dtok = jnp.asarray(_DIR_TOKENS)

    def rel(x, y, d):  # "the X is d the Y"
        return ([w("the"), col(x), shp(x), w("is"), dtok[d, 0], dtok[d, 1], w("the"), col(y),
                 shp(y)], [0, 1, 1, 0, 1, 1, 0, 1, 1])

    def more(x, y):  # "there are more Xs than Ys"
        return ([w("there"), w("are"), w("more"), col(x), plu(x), w("than"), col(y), plu(y)],
                [0, 0, 1, 1, 1, 1, 1, 1])

    X, Y, U = lat.key_x, lat.key_y, lat.ut_key
    variants = [
        rel(X, Y, lat.direction),
        more(X, Y),
        ([w("there"), w("are"), w("more"), w("than"), _NUM0 + lat.ut_number, w("objects")],
         [0, 0, 1, 1, 1, 1]),
        rel(U, U, lat.ut_direction),  # impossible (an object is never d of itself)
        ([w("no"), col(U), shp(U), w("is"), dtok[lat.ut_direction, 0],
          dtok[lat.ut_direction, 1], w("itself")], [1, 1, 1, 0, 1, 1, 1]),  # certain
        more(U, U),  # impossible
        ([w("there"), w("are"), w("as"), w("many"), col(U), plu(U), w("as"), col(U), plu(U)],
         [0, 0, 1, 1, 1, 1, 1, 1, 1]),  # certain
    ]
    pad = lambda xs, v: list(xs) + [v] * (_RAW_LEN - len(xs))  # noqa: E731
    toks = jnp.stack([jnp.stack([jnp.asarray(x, jnp.int32) for x in pad(words, PAD_ID)])
                      for words, _ in variants])
    core = jnp.asarray(np.array([pad(c, 0) for _, c in variants], bool))
    fam, real = lat.family, lat.label == REAL
    row = jnp.select([fam == F_RELATION, fam == F_COMPARISON, fam == F_COUNT,
                      fam == F_SELF_RELATION],
                     [0, 1, 2, jnp.where(real, 4, 3)], jnp.where(real, 6, 5))
    return toks[row], core[row]


def _pack(toks, core, L: int):
    """Drop PAD holes and left-pack into [L] (a scatter, as gridvqa_jax.world.questions.build_tokens)."""
    keep = toks != PAD_ID
    pos = jnp.where(keep, jnp.cumsum(keep) - 1, L)
    t = jnp.full(L, PAD_ID, jnp.int32).at[pos].set(toks, mode="drop")
    c = jnp.zeros(L, bool).at[pos].set(core, mode="drop")
    return t, c, jnp.sum(keep).astype(jnp.int32)


def realize(lat: Latents, key, spec: WorldSpec) -> WorldSample:
    """Scene, image, claim and ground truth of ``lat``; the remaining randomness from ``key``.

    Deterministic in (lat, key); every random draw happens whatever the latents, so a test can
    change a latent and keep the rest of the sample fixed.
    """
    S, C, P = spec.grid_size, spec.n_cells, spec.cell_px
    rng = SP.Bits(key)
    cell_key, named = _scene(rng, lat, spec)
    occupied = cell_key >= 0
    color = jnp.where(occupied, cell_key // 4, -1)
    shape = jnp.where(occupied, cell_key % 4, -1)

    # Core entity E: the objects the claim refers to.
    fam = lat.family
    core = jnp.where(fam <= F_COMPARISON, named,
                     jnp.where(fam == F_COUNT, occupied, cell_key == lat.ut_key))

    # Manipulation: one of the scaffold's named objects (Uni-image fakes only).
    manipulated = lat.manipulated
    manip = SP.choose_one(SP.priority(rng, C), named, manipulated)
    kind = jnp.asarray([MANIPULATIONS.index(m) for m in spec.manipulations],
                       jnp.int32)[lat.manip_kind]
    mkey = jnp.sum(jnp.where(manip, cell_key, 0))
    per_key = jnp.asarray([_N_OFF, _N_SPLICE, _N_QUAD], jnp.int32)[kind]
    tile_idx = jnp.asarray(_OFFSETS)[kind] + mkey * per_key + lat.manip_param % per_key
    image = R.render(color.reshape(S, S), shape.reshape(S, S), P)
    cell = jnp.argmax(manip)
    y0, x0 = (cell // S) * P, (cell % S) * P
    clean_tile = jax.lax.dynamic_slice(image, (y0, x0, 0), (P, P, 3))
    tile = jnp.where(manipulated, jnp.asarray(manipulation_tiles(P))[tile_idx], clean_tile)
    image = jax.lax.dynamic_update_slice(image, tile, (y0, x0, 0))

    raw, raw_core = _claim(lat)
    tokens, core_tokens, n_tokens = _pack(raw, raw_core, spec.max_tokens)
    claim_true = jnp.where(fam <= F_COMPARISON, lat.claim_true, lat.label == REAL)
    fine = jnp.where(lat.label == REAL, ORIGINAL,
                     jnp.asarray([VISUAL, MISMATCH, TEXTUAL], jnp.int32)[lat.bias])
    grid = lambda a: a.reshape(S, S)  # noqa: E731
    return WorldSample(
        latents=lat, image=image, tokens=tokens, n_tokens=n_tokens, label=lat.label,
        bias=lat.bias, fine_label=fine.astype(jnp.int32), claim_true=claim_true,
        color=grid(color).astype(jnp.int32), shape=grid(shape).astype(jnp.int32),
        manipulated=manipulated, manip_cells=grid(manip), core_cells=grid(core),
        core_tokens=core_tokens)


def split_key(key):
    """(latent key, scene key) of a sample key: ``fold_in(key, 0)``, ``fold_in(key, 1)``."""
    return jax.random.fold_in(key, 0), jax.random.fold_in(key, 1)


def sample(key, spec: WorldSpec) -> WorldSample:
    """One sample: ``realize(draw_latents(k_lat), k_scene)`` with ``split_key(key)``. Pure."""
    k_lat, k_scene = split_key(key)
    return realize(draw_latents(k_lat, spec), k_scene, spec)


@functools.partial(jax.jit, static_argnums=(1,))
def draw_latents_batch(keys, spec: WorldSpec) -> Latents:
    """``jax.vmap(draw_latents)`` over latent keys [B], jitted."""
    return jax.vmap(lambda k: draw_latents(k, spec))(keys)


@functools.partial(jax.jit, static_argnums=(2,))
def realize_batch(lats: Latents, keys, spec: WorldSpec) -> WorldSample:
    """``jax.vmap(realize)`` over latents and scene keys [B], jitted."""
    return jax.vmap(lambda l, k: realize(l, k, spec))(lats, keys)


def sample_batch(keys, spec: WorldSpec) -> WorldSample:
    """``jax.vmap(sample)`` over keys [B]: the jitted latent and scene stages in turn.

    Equal to ``sample`` key by key (vmap), so a sample depends on its key only, not on the
    batch it was drawn in. Tests can edit the latents between the two stages.
    """
    k_lat, k_scene = jax.vmap(split_key)(keys)
    return realize_batch(draw_latents_batch(k_lat, spec), k_scene, spec)


def sample_keys(seed: int, start: int, n: int):
    """Keys of samples start..start+n-1: ``fold_in(key(seed), i)`` (batching-independent)."""
    return G.sample_keys(seed, start, n)


def generate(spec: WorldSpec, seed: int, start: int, n: int) -> WorldSample:
    """Samples start..start+n-1 of the benchmark (spec, seed), as a batched WorldSample."""
    if n <= 0:
        raise ValueError(f"number of samples must be positive, got {n}")
    return sample_batch(sample_keys(seed, start, n), spec)


def to_batch(samples: WorldSample, spec: WorldSpec, index=None) -> BA.Batch:
    """The common ``Batch`` of a batched WorldSample (pixel masks upsampled from the cells)."""
    b = samples.label.shape[0]
    index = jnp.arange(b, dtype=jnp.int32) if index is None else jnp.asarray(index, jnp.int32)
    return BA.Batch(
        image=samples.image, tokens=samples.tokens, label=samples.label, bias=samples.bias,
        fine_label=samples.fine_label,
        image_core=R.pixel_mask(samples.core_cells, spec.cell_px).astype(bool),
        text_core=samples.core_tokens, has_gt=jnp.ones(b, bool), index=index)


def load_closed_world(spec: WorldSpec, seed: int, n: int, start: int = 0) -> BA.Batch:
    """Samples start..start+n-1 as a host ``Batch`` (``index`` = the global sample index)."""
    s = generate(spec, seed, start, n)
    return BA.to_numpy(to_batch(s, spec, np.arange(start, start + n)))


__all__ = [
    "BIAS_TYPES", "UNI_IMAGE", "BALANCE", "UNI_TEXT", "REAL", "FAKE", "FAMILIES", "SCAFFOLDS",
    "MANIPULATIONS", "CLAIM_VOCAB", "WorldSpec", "Latents", "WorldSample", "draw_latents",
    "realize", "split_key", "sample", "sample_batch", "draw_latents_batch", "realize_batch",
    "sample_keys", "generate", "to_batch",
    "load_closed_world", "manipulation_tiles", "splice_partner", "F_RELATION", "F_COMPARISON",
    "F_COUNT", "F_SELF_RELATION", "F_SELF_COMPARISON", "N_KEYS",
]
