"""Scene rendering and decoding for the GridVQA-X grid universe.

The official release draws each scene with Pillow, one object at a time: a white ``S*P x S*P``
RGB canvas, and in cell ``(x, y)`` (x = column, y = row) a shape inset by ``0.1 * P`` on each
side, filled with its colour and outlined in black with ``width=2``::

    box = [P*x + 0.1*P, P*y + 0.1*P, P*(x+1) - 0.1*P, P*(y+1) - 0.1*P]
    circle    draw.ellipse(box, ...)
    square    draw.rectangle(box, ...)
    triangle  draw.polygon([(cx, top), (left, bottom), (right, bottom)], ...)
    pentagon  draw.polygon([(cx + r cos t_k, cy + r sin t_k)], t_k = -90deg + 72deg * k,
                           r = half the box width, ...)

(this geometry reproduces every object of the official fixture images pixel for pixel).

Here the four shapes are rasterised once per cell size, without Pillow, by re-deriving Pillow's
integer rasterisation rules (vertex truncation, scan-line spans, wide-line outline quads and the
midpoint ellipse walk). A scene is then rendered on device by gathering rows of a 17-entry
``(colour, shape)`` tile table, which is jit- and vmap-friendly and does no per-pixel arithmetic.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from mmx_base import grid
from gridvqa_jax.world.universe import COLORS, SHAPES

__all__ = [
    "COLORS",
    "SHAPES",
    "PALETTE",
    "NUM_TILES",
    "MIN_DECODE_CELL_PX",
    "shape_masks",
    "tile_table",
    "cell_ids",
    "render",
    "render_packed",
    "iter_images",
    "render_images",
    "pixel_mask",
    "decode_image",
]

# PIL named colours, indexed like ``COLORS``.
PALETTE = np.array([[255, 0, 0], [0, 128, 0], [0, 0, 255], [255, 255, 0]], dtype=np.uint8)
WHITE = np.array([255, 255, 255], dtype=np.uint8)
BLACK = np.array([0, 0, 0], dtype=np.uint8)
INSET_FRAC = 0.1
OUTLINE_WIDTH = 2
NUM_TILES = 1 + len(COLORS) * len(SHAPES)  # tile 0 is the empty (white) cell
# Below 7 px some fills vanish under the outline, so colour or shape becomes undecidable.
MIN_DECODE_CELL_PX = 7


# --------------------------------------------------------------------------------------------
# Rasterisation (host side, once per cell size)
# --------------------------------------------------------------------------------------------


def _round_up(v):
    # Pillow's ROUND_UP (Draw.c): halves go up; only non-negative inputs occur here.
    return np.floor(np.asarray(v, np.float64) + 0.5).astype(np.int64)


def _round_down(v):
    # Pillow's ROUND_DOWN: halves go down.
    return np.ceil(np.asarray(v, np.float64) - 0.5).astype(np.int64)


def _scan_convex(vertices, cell_px: int) -> np.ndarray:
    """Fill mask of a convex polygon with integer vertices, following Pillow's scan-line rule.

    Pixel centres sit on integer coordinates. On row ``y`` the polygon's cross-section
    ``[xl, xr]`` is intersected at the row centre, and pixel ``x`` is filled when
    ``xl - 0.5 < x < xr + 0.5`` (ROUND_UP/ROUND_DOWN of the span ends), so a boundary that
    touches a pixel's half-width already claims it. Horizontal edges are drawn end to end.
    """
    n = len(vertices)
    mask = np.zeros((cell_px, cell_px), dtype=bool)
    rows = np.arange(cell_px)
    lo = np.full(cell_px, np.inf, np.float32)
    hi = np.full(cell_px, -np.inf, np.float32)
    for i in range(n):
        x0, y0 = vertices[i]
        x1, y1 = vertices[(i + 1) % n]
        if y0 == y1:
            if 0 <= y0 < cell_px:
                mask[y0, max(min(x0, x1), 0) : max(x0, x1) + 1] = True
            continue
        # float32 slope and int row offset, as in Pillow's Edge, so the span ends round the
        # same way Pillow's do when a crossing falls near a half-pixel boundary.
        slope = np.float32(x1 - x0) / np.float32(y1 - y0)
        on_edge = (rows >= min(y0, y1)) & (rows <= max(y0, y1))
        xs = (rows[on_edge] - y0).astype(np.float32) * slope + np.float32(x0)
        lo[on_edge] = np.minimum(lo[on_edge], xs)
        hi[on_edge] = np.maximum(hi[on_edge], xs)
    crossed = np.isfinite(lo)
    start = np.where(crossed, _round_up(np.where(crossed, lo, 0)), cell_px)
    stop = np.where(crossed, _round_down(np.where(crossed, hi, 0)), -1)
    cols = np.arange(cell_px)
    mask |= (cols[None, :] >= start[:, None]) & (cols[None, :] <= stop[:, None])
    return mask


def _wide_line_quad(p0, p1, width: int):
    """Integer corner points of Pillow's thick line from ``p0`` to ``p1`` (ImagingDrawWideLine)."""
    (x0, y0), (x1, y1) = p0, p1
    dx, dy = x1 - x0, y1 - y0
    length = math.hypot(dx, dy)
    half = (width - 1) / 2.0
    r_max = int(_round_up(half)) / length
    r_min = int(_round_down(half)) / length
    dxmin, dxmax = int(_round_down(r_min * dy)), int(_round_down(r_max * dy))
    dymin, dymax = int(_round_down(r_min * dx)), int(_round_down(r_max * dx))
    return [(x0 - dxmin, y0 + dymax), (x1 - dxmin, y1 + dymax),
            (x1 + dxmax, y1 - dymin), (x0 + dxmax, y0 - dymin)]


def _polygon_masks(vertices, cell_px: int):
    fill = _scan_convex(vertices, cell_px)
    ring = np.zeros_like(fill)
    n = len(vertices)
    for i in range(n):
        p0, p1 = vertices[i], vertices[(i + 1) % n]
        if p0 == p1:
            if 0 <= p0[0] < cell_px and 0 <= p0[1] < cell_px:
                ring[p0[1], p0[0]] = True
            continue
        # Pillow strokes each edge 2*width-1 wide, centred on the edge, and keeps only the part
        # inside the fill: the outline never grows the shape outwards.
        ring |= _scan_convex(_wide_line_quad(p0, p1, 2 * OUTLINE_WIDTH - 1), cell_px)
    return fill, ring & fill


def _ellipse_quarter(a: int, b: int):
    """Lattice points of Pillow's quarter-ellipse walk (Draw.c ``quarter_*``).

    Works on the doubled grid ``(2x + a%2, 2y + b%2)`` with semi-axes ``a, b`` (the integer box
    width and height), stepping up / diagonal / left towards the point of smallest algebraic
    error ``|a^2 y^2 + b^2 x^2 - a^2 b^2|``. A continuous inside-test cannot reproduce these
    greedy choices pixel for pixel, so the walk itself is replayed.
    """
    if a < 0 or b < 0:
        return []
    a2, b2 = a * a, b * b

    def err(x, y):
        return abs(a2 * y * y + b2 * x * x - a2 * b2)

    x, y, end = a, b % 2, (a % 2, b)
    points = [(x, y)]
    while (x, y) != end:
        nx, ny, best = x, y + 2, err(x, y + 2)
        if x > 1:
            for cx, cy in ((x - 2, y + 2), (x - 2, y)):
                e = err(cx, cy)
                if best > e:
                    nx, ny, best = cx, cy, e
        x, y = nx, ny
        points.append((x, y))
    return points


def _ellipse_mask(x0: int, x1: int, cell_px: int, width: int | None) -> np.ndarray:
    """Pillow's ellipse in the square box ``[x0, x1]^2``: a ring ``width`` px thick, or the
    filled disc when ``width is None`` (Draw.c ``ellipse_next``, replayed row by row)."""
    a = b = x1 - x0
    if width is None:
        width = a + b  # Pillow fills by asking for a ring thick enough to swallow the centre
    outer = _ellipse_quarter(a, b)
    inner = _ellipse_quarter(a - 2 * (width - 1), b - 2 * (width - 1))
    leftmost = a % 2
    segments = []
    oi, ii = 1, 0
    pr_x, py = outer[0]
    pl = leftmost
    done = False
    while not done:
        y, l, r = py, pl, pr_x
        while oi < len(outer) and outer[oi][1] <= y:
            oi += 1
        if oi >= len(outer):
            done = True
        else:
            pr_x, py = outer[oi]
            oi += 1
        while ii < len(inner) and inner[ii][1] <= y:
            l = inner[ii][0]
            ii += 1
        if ii >= len(inner):
            pl = leftmost
        else:
            pl = inner[ii][0]
            ii += 1
        # Four mirrored copies of the quarter row; the x==0 / y==0 guards avoid drawing the
        # axis twice, exactly as Pillow does (it matters for the ring, not the fill).
        if (l > 0 or l < r) and y > 0:
            segments.append((2 if l == 0 else l, y, r))
        if y > 0:
            segments.append((-r, y, -l))
        if l > 0 or l < r:
            segments.append((2 if l == 0 else l, -y, r))
        segments.append((-r, -y, -l))
    mask = np.zeros((cell_px, cell_px), dtype=bool)
    for xa, yy, xb in segments:
        row = x0 + (yy + b) // 2
        c0, c1 = x0 + (xa + a) // 2, x0 + (xb + a) // 2
        if 0 <= row < cell_px and c0 <= c1:
            mask[row, max(c0, 0) : c1 + 1] = True
    return mask


def _inset_box(cell_px: int):
    pad = cell_px * INSET_FRAC
    return pad, pad, cell_px - pad, cell_px - pad


@functools.lru_cache(maxsize=None)
def shape_masks(cell_px: int):
    """Per-shape masks of one ``cell_px x cell_px`` cell, as drawn by the official renderer.

    Returns ``(fill, outline)``, two read-only numpy bool arrays of shape ``[4, cell_px, cell_px]``
    indexed ``[shape, row, col]`` in ``SHAPES`` order (circle, square, triangle, pentagon).
    ``fill`` marks the pixels painted in the object's colour, ``outline`` the black 2-px ring;
    they are disjoint and their union is the object's footprint. The masks reproduce Pillow's
    ``ellipse`` / ``rectangle`` / ``polygon(..., outline='black', width=2)`` for the official
    geometry (10% inset box, upright triangle, regular pentagon with a vertex on top), computed
    without Pillow. Cached per cell size.
    """
    cell_px = int(cell_px)
    if cell_px < 1:
        raise ValueError(f"cell_px must be positive, got {cell_px}")
    bx0, by0, bx1, by1 = _inset_box(cell_px)
    # Pillow truncates float box and polygon coordinates to int before rasterising.
    ix0, ix1 = int(bx0), int(bx1)
    cx, cy = (bx0 + bx1) / 2, (by0 + by1) / 2
    fills, rings = [], []
    for name in SHAPES:
        if name == "circle":
            full = _ellipse_mask(ix0, ix1, cell_px, None)
            ring = _ellipse_mask(ix0, ix1, cell_px, OUTLINE_WIDTH)
        elif name == "square":
            full = np.zeros((cell_px, cell_px), dtype=bool)
            full[ix0 : ix1 + 1, ix0 : ix1 + 1] = True
            hole = np.zeros_like(full)
            w = OUTLINE_WIDTH
            hole[ix0 + w : ix1 - w + 1, ix0 + w : ix1 - w + 1] = True
            ring = full & ~hole
        else:
            if name == "triangle":
                pts = [(cx, by0), (bx0, by1), (bx1, by1)]
            else:
                r = (bx1 - bx0) / 2
                angles = [-math.pi / 2 + 2 * math.pi * k / 5 for k in range(5)]
                pts = [(cx + r * math.cos(t), cy + r * math.sin(t)) for t in angles]
            full, ring = _polygon_masks([(int(px), int(py)) for px, py in pts], cell_px)
        fills.append(full & ~ring)
        rings.append(ring)
    fill = np.stack(fills)
    outline = np.stack(rings)
    fill.setflags(write=False)
    outline.setflags(write=False)
    return fill, outline


@functools.lru_cache(maxsize=None)
def tile_table(cell_px: int) -> np.ndarray:
    """The 17 possible cell images, uint8 ``[NUM_TILES, cell_px, cell_px, 3]`` (read-only).

    Tile 0 is an empty (white) cell; tile ``1 + 4 * color + shape`` is that object drawn on white
    with its black outline, exactly as ``shape_masks`` describes.
    """
    fill, outline = shape_masks(cell_px)
    tiles = np.empty((NUM_TILES, cell_px, cell_px, 3), dtype=np.uint8)
    tiles[0] = WHITE
    for c in range(len(COLORS)):
        for s in range(len(SHAPES)):
            t = tiles[1 + len(SHAPES) * c + s]
            t[...] = WHITE
            t[fill[s]] = PALETTE[c]
            t[outline[s]] = BLACK
    tiles.setflags(write=False)
    return tiles


def cell_ids(color, shape):
    """Tile index per cell: int32 with the same shape as ``color``/``shape`` (e.g. ``[S, S]``).

    0 for an empty cell (either id negative), else ``1 + 4 * color + shape``; ids above 3 are
    clamped so the index can never leave the tile table.
    """
    color = jnp.asarray(color, jnp.int32)
    shape = jnp.asarray(shape, jnp.int32)
    occupied = (color >= 0) & (shape >= 0)
    c = jnp.clip(color, 0, len(COLORS) - 1)
    s = jnp.clip(shape, 0, len(SHAPES) - 1)
    return jnp.where(occupied, 1 + len(SHAPES) * c + s, 0)


@functools.partial(jax.jit, static_argnames="cell_px")
def render(color, shape, cell_px: int = 64):
    """Render one scene: uint8 ``[S * cell_px, S * cell_px, 3]`` RGB.

    ``color`` and ``shape`` are int ``[S, S]`` arrays indexed ``[y, x]`` (y = row, growing
    downwards), with -1 for an empty cell. At ``cell_px=64`` this reproduces the official
    Pillow-drawn GridVQA-X PNGs pixel for pixel. Pure jnp: jit it with ``cell_px`` static and
    vmap it over a leading batch axis.
    """
    ids = cell_ids(color, shape)
    s_y, s_x = ids.shape
    rows = jnp.asarray(tile_table(cell_px).reshape(NUM_TILES * cell_px, cell_px * 3))
    # One gather of whole tile rows straight into the output layout [y, row, x, row bytes], so
    # no transpose pass follows. XLA:CPU's gather costs about the same per output element
    # whatever the slice size; gathering uint32 words would be 4x cheaper, but the uint32 ->
    # uint8 bitcast it then needs is a per-byte pass that costs more than it saves (measured).
    row_idx = ids[:, None, :] * cell_px + jnp.arange(cell_px, dtype=jnp.int32)[None, :, None]
    out = jnp.take(rows, row_idx, axis=0, mode="clip")
    return out.reshape(s_y * cell_px, s_x * cell_px, 3)


@functools.lru_cache(maxsize=None)
def _packed_rows(cell_px: int) -> np.ndarray:
    """The tile rows as native-endian uint32 words: ``[NUM_TILES * cell_px, cell_px * 3 // 4]``."""
    rows = np.ascontiguousarray(tile_table(cell_px).reshape(NUM_TILES * cell_px, cell_px * 3))
    return rows.view(np.uint32)


@functools.partial(jax.jit, static_argnames="cell_px")
def render_packed(color, shape, cell_px: int = 64):
    """``render`` with four bytes to a word: uint32 ``[S * cell_px, S * cell_px * 3 // 4]``.

    The words, read in memory order as uint8 (native byte order), are exactly the RGB bytes of
    ``render(color, shape, cell_px)``: on the host, ``np.asarray(out).view(np.uint8)`` reshaped
    to ``[S * cell_px, S * cell_px, 3]`` is the image, without a copy. Gathering words moves a
    quarter of the elements of the uint8 gather (XLA:CPU's gather costs per element), which is
    what makes it the faster kernel for the host renderer ``iter_images``; inside a jit graph a
    uint32 -> uint8 bitcast is a per-byte pass and loses the gain, so in-graph users keep
    ``render``. Needs ``cell_px % 4 == 0`` (a tile row is then whole words).
    """
    if cell_px % 4:
        raise ValueError(f"render_packed needs a cell size divisible by 4, got {cell_px} px")
    ids = cell_ids(color, shape)
    s_y, s_x = ids.shape
    words = jnp.asarray(_packed_rows(cell_px))
    row_idx = ids[:, None, :] * cell_px + jnp.arange(cell_px, dtype=jnp.int32)[None, :, None]
    out = jnp.take(words, row_idx, axis=0, mode="clip")  # [y, row, x, words]
    return out.reshape(s_y * cell_px, s_x * words.shape[1])


@functools.lru_cache(maxsize=None)
def _chunk_renderer(cell_px: int):
    if cell_px % 4 == 0:
        return jax.jit(jax.vmap(lambda c, s: render_packed(c, s, cell_px)))
    return jax.jit(jax.vmap(lambda c, s: render(c, s, cell_px)))


def iter_images(color, shape, cell_px: int = 64, chunk: int = 64):
    """Render a batch on the host side, ``chunk`` scenes at a time.

    color, shape: int ``[B, S, S]`` (numpy or jax). Yields ``(start, images)`` with images uint8
    numpy ``[n, S * cell_px, S * cell_px, 3]`` for scenes ``start .. start + n - 1`` (every
    chunk is a buffer of its own: rendering later chunks never overwrites earlier ones). Chunks
    are padded to ``chunk`` so one compiled shape serves any batch. Why chunks of 64: a chunk's
    output (64 x 300 KB at 64 px) stays below the allocator's mmap threshold and its memory is
    recycled, whereas a much larger output is freshly mapped on every call and pays its page
    faults each time.
    """
    if chunk <= 0:
        raise ValueError(f"chunk must be positive, got {chunk}")
    color, shape = np.asarray(color, np.int32), np.asarray(shape, np.int32)
    if color.ndim != 3 or color.shape != shape.shape:
        raise ValueError(f"color and shape must both be [B, S, S], got {color.shape} and "
                         f"{shape.shape}")
    fn = _chunk_renderer(int(cell_px))
    b, s_y, s_x = color.shape
    for i in range(0, b, chunk):
        c, s = color[i:i + chunk], shape[i:i + chunk]
        n = c.shape[0]
        if n < chunk:  # pad with copies of the first scene: one compiled shape
            c = np.concatenate([c, np.repeat(c[:1], chunk - n, 0)])
            s = np.concatenate([s, np.repeat(s[:1], chunk - n, 0)])
        out = np.asarray(fn(c, s))[:n]
        yield i, out.view(np.uint8).reshape(n, s_y * cell_px, s_x * cell_px, 3)


def render_images(color, shape, cell_px: int = 64, chunk: int = 64) -> np.ndarray:
    """All images of a batch as one uint8 numpy array ``[B, S * cell_px, S * cell_px, 3]``
    (``iter_images`` chunks, concatenated)."""
    parts = [im for _, im in iter_images(color, shape, cell_px, chunk)]
    if not parts:
        raise ValueError("render_images needs at least one scene")
    return np.concatenate(parts, 0)


def pixel_mask(cell_mask, cell_px: int):
    """Upsample a cell mask ``[..., S, S]`` to uint8 ``[..., S*cell_px, S*cell_px]``.

    Every cell becomes a ``cell_px x cell_px`` block of its value (nonzero -> 1). This is what the
    official ``pixel_obj_mask`` intends; the release passes the grid size as the cell size and so
    stores a 25x25 mask. jnp; works under jit (``cell_px`` static) and on batches
    (``mmx_base.grid.upsample``).
    """
    return grid.upsample(jnp.asarray(cell_mask) != 0, cell_px).astype(jnp.uint8)


_REFERENCE_COLORS = np.concatenate([WHITE[None], BLACK[None], PALETTE]).astype(np.int32)


def _nearest_reference(rgb: np.ndarray) -> np.ndarray:
    """Index into ``_REFERENCE_COLORS`` (white, black, palette) of each pixel of ``rgb [N, 3]``."""
    rgb = rgb.astype(np.int32)

    def pack(c):
        return (c[:, 0] << 16) | (c[:, 1] << 8) | c[:, 2]

    packed, ref_packed = pack(rgb), pack(_REFERENCE_COLORS)
    # Rendered images hold only the six exact colours, so exact matching settles almost every
    # pixel cheaply; the nearest-colour search is left to the rest (resampled or lossy images).
    label = np.full(packed.shape, -1, np.int64)
    for i, ref in enumerate(ref_packed):
        label[packed == ref] = i
    rest = np.flatnonzero(label < 0)
    if rest.size:
        d = ((rgb[rest, None, :] - _REFERENCE_COLORS[None]) ** 2).sum(-1)
        label[rest] = d.argmin(-1)
    return label


def decode_image(image_uint8, grid_size: int):
    """Recover a scene from its image (numpy, host side).

    ``image_uint8``: uint8 ``[S*P, S*P, 3]`` (an alpha channel is ignored), any cell size
    ``P >= MIN_DECODE_CELL_PX``; ``grid_size``: ``S``. Returns ``(color, shape)``, int32 ``[S, S]``
    indexed ``[y, x]``, -1 for empty cells. Each pixel is snapped to the nearest of white, black
    and the four palette colours; a cell's colour is the majority palette colour, and its shape
    the one whose rendered footprint (fill + outline) has the best IoU with the cell's non-white
    pixels.
    """
    img = np.asarray(image_uint8)
    if img.ndim != 3 or img.shape[-1] < 3:
        raise ValueError(f"expected an [H, W, 3] image, got shape {img.shape}")
    h, w = img.shape[:2]
    s = int(grid_size)
    p = h // s
    if h != w or p * s != h:
        raise ValueError(f"image {h}x{w} is not a {s}x{s} grid of square cells")
    if p < MIN_DECODE_CELL_PX:
        raise ValueError(f"cell size {p} px is below {MIN_DECODE_CELL_PX}: shapes are ambiguous")
    label = _nearest_reference(img[..., :3].reshape(-1, 3))
    label = label.reshape(s, p, s, p).transpose(0, 2, 1, 3).reshape(s, s, p * p)
    ink = label != 0
    counts = np.stack([(label == 2 + c).sum(-1) for c in range(len(COLORS))], axis=-1)
    n_colored = counts.sum(-1)

    fill, outline = shape_masks(p)
    footprint = (fill | outline).reshape(len(SHAPES), p * p).astype(np.float32)
    inter = ink.astype(np.float32) @ footprint.T
    union = ink.sum(-1, keepdims=True) + footprint.sum(-1)[None, None] - inter
    iou = inter / np.maximum(union, 1.0)

    # A few stray coloured pixels (noise) must not turn an empty cell into an object; the
    # threshold is a quarter of the smallest fill, far below any real object's colour area.
    min_fill = int(fill.reshape(len(SHAPES), -1).sum(-1).min())
    occupied = n_colored >= max(1, min_fill // 4)
    color = np.where(occupied, counts.argmax(-1), -1).astype(np.int32)
    shape = np.where(occupied, iou.argmax(-1), -1).astype(np.int32)
    return color, shape


def render_scene(scene, cell_px: int = 64):
    """Image and full-resolution ground-truth pixel mask of one Scene (vmap for batches).

    Returns (uint8 [S*cell_px, S*cell_px, 3], uint8 [S*cell_px, S*cell_px]): the rendered scene
    and ``pixel_mask(scene.gt_cells)``, the pixel-level ground truth A ∪ T of GridVQA-X.
    """
    return render(scene.color, scene.shape, cell_px), pixel_mask(scene.gt_cells, cell_px)
