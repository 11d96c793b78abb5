"""Tests for gridvqa_jax.world.render against Pillow and the official GridVQA-X fixture images."""

import json
import math
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image, ImageDraw

from gridvqa_jax.world import render as R

# The in-repo copy first (runs on a clean clone), else the shared folder beside the checkout.
FIXTURES = next((p for p in (Path(__file__).resolve().parent / "fixtures/official_gridvqa",
                             Path(__file__).resolve().parents[2] / "shared/fixtures/official_gridvqa")
                 if p.is_dir()), Path("/nonexistent"))
VARIANTS = ("pure", "spurious")


def pil_cell(color: str, shape: str, cell_px: int) -> np.ndarray:
    """One cell drawn the way the official release draws it (geometry from FORMAT.md)."""
    img = Image.new("RGB", (cell_px, cell_px), "white")
    draw = ImageDraw.Draw(img)
    pad = 0.1 * cell_px
    x0, y0, x1, y1 = pad, pad, cell_px - pad, cell_px - pad
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    kw = dict(fill=color, outline="black", width=2)
    if shape == "circle":
        draw.ellipse([x0, y0, x1, y1], **kw)
    elif shape == "square":
        draw.rectangle([x0, y0, x1, y1], **kw)
    elif shape == "triangle":
        draw.polygon([(cx, y0), (x0, y1), (x1, y1)], **kw)
    else:
        r = (x1 - x0) / 2
        ang = [-math.pi / 2 + 2 * math.pi * k / 5 for k in range(5)]
        draw.polygon([(cx + r * math.cos(t), cy + r * math.sin(t)) for t in ang], **kw)
    return np.asarray(img)


def our_cell(color: str, shape: str, cell_px: int) -> np.ndarray:
    c = np.array([[R.COLORS.index(color)]], np.int32)
    s = np.array([[R.SHAPES.index(shape)]], np.int32)
    return np.asarray(R.render(c, s, cell_px=cell_px))


def random_scene(rng, s, p_empty=0.3):
    color = rng.integers(0, 4, (s, s)).astype(np.int32)
    shape = rng.integers(0, 4, (s, s)).astype(np.int32)
    empty = rng.random((s, s)) < p_empty
    color[empty] = -1
    shape[empty] = -1
    return color, shape


def fixture_scenes():
    """(variant, file_name, color[5,5], shape[5,5]) for every fixture image."""
    out = []
    for variant in VARIANTS:
        for line in (FIXTURES / variant / "sidecar_scene.jsonl").read_text().splitlines():
            rec = json.loads(line)
            color = np.full((5, 5), -1, np.int32)
            shape = np.full((5, 5), -1, np.int32)
            for o in rec["all_scene_objects"]:
                color[o["y"], o["x"]] = R.COLORS.index(o["color"])
                shape[o["y"], o["x"]] = R.SHAPES.index(o["shape"])
            out.append((variant, rec["file_name"], color, shape))
    return out


needs_fixtures = pytest.mark.skipif(not FIXTURES.is_dir(), reason="official fixtures absent")


# ----------------------------------------------------------------------------- shape masks


@pytest.mark.parametrize("shape", R.SHAPES)
@pytest.mark.parametrize("color", R.COLORS)
def test_cell_matches_pillow_64px(color, shape):
    ours, ref = our_cell(color, shape, 64), pil_cell(color, shape, 64)
    # The rasteriser replays Pillow's rules: every pixel agrees (measured: 0 differing pixels).
    n_diff = int((ours != ref).any(-1).sum())
    assert n_diff == 0, f"{color} {shape}: {n_diff} pixels differ from Pillow"


@pytest.mark.parametrize("cell_px", [8, 13, 16, 32, 37, 100])
def test_cell_matches_pillow_other_sizes(cell_px):
    for shape in R.SHAPES:
        ours, ref = our_cell("green", shape, cell_px), pil_cell("green", shape, cell_px)
        n_diff = int((ours != ref).any(-1).sum())  # measured: 0 at every size listed
        assert n_diff == 0, f"{cell_px} px {shape}: {n_diff} pixels differ from Pillow"


def test_shape_masks_structure():
    fill, outline = R.shape_masks(64)
    assert fill.shape == outline.shape == (4, 64, 64) and fill.dtype == bool
    assert not (fill & outline).any()
    foot = fill | outline
    # Nothing is drawn in the 6-px inset margin (6.4 px truncated by Pillow to 6).
    for m in (foot[:, :6], foot[:, 58:], foot[:, :, :6], foot[:, :, 58:]):
        assert not m.any()
    # Square: the full inset box with a 2-px ring; triangle: base on the bottom rows, apex on top.
    assert foot[1, 6:58, 6:58].all() and outline[1, 6:8, 6:58].all() and fill[1, 8:56, 8:56].all()
    assert foot[2, 57, 6:58].all() and foot[2, 6].sum() == 1 and foot[2, 6, 32]
    # Pentagon: one vertex at the top centre, widest at the side vertices (row 24), flat bottom.
    assert foot[3, 6].sum() == 1 and foot[3, 6, 32]
    widths = foot[3].sum(1)
    assert widths.argmax() in (23, 24) and foot[3, 53:].sum() == 0 and foot[3, 52].sum() > 20
    assert len({m.tobytes() for m in foot}) == 4
    assert R.shape_masks(64)[0] is fill  # cached


def test_render_works_without_pillow(tmp_path):
    """With Pillow unimportable (``sys.modules["PIL"] = None`` in a fresh interpreter) the
    renderer still imports and draws every tile, the same pixels as here (where the Pillow
    comparisons above pin them)."""
    import subprocess
    import sys

    color = np.array([[0, 1, -1], [2, 3, 0], [-1, 1, 2]])
    shape = np.array([[0, 1, -1], [2, 3, 3], [-1, 0, 1]])
    out = tmp_path / "img.npy"
    code = ("import sys; sys.modules['PIL'] = None\n"
            "try:\n    import PIL.Image\nexcept ImportError:\n    pass\n"
            "else:\n    raise SystemExit('Pillow is not blocked')\n"
            "import numpy as np\n"
            "from gridvqa_jax.world import render as R\n"
            f"np.save({str(out)!r}, np.asarray(R.render(np.array({color.tolist()}), "
            f"np.array({shape.tolist()}), 24)))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    np.testing.assert_array_equal(np.load(out), np.asarray(R.render(color, shape, 24)))


# ----------------------------------------------------------------------------- official images


@needs_fixtures
def test_render_matches_official_pngs():
    scenes = fixture_scenes()
    assert len(scenes) == 48
    differing = {}
    for variant, name, color, shape in scenes:
        ref = np.asarray(Image.open(FIXTURES / variant / name).convert("RGB"))
        ours = np.asarray(R.render(color, shape, cell_px=64))
        assert ours.shape == ref.shape == (320, 320, 3) and ours.dtype == np.uint8
        n_diff = int((ours != ref).any(-1).sum())
        if n_diff:
            differing[f"{variant}/{name}"] = n_diff
    # Every official image is reproduced pixel for pixel (measured: 0 differing pixels).
    assert not differing, differing


@needs_fixtures
def test_decode_official_pngs_exactly():
    for variant, name, color, shape in fixture_scenes():
        img = np.asarray(Image.open(FIXTURES / variant / name).convert("RGB"))
        dc, ds = R.decode_image(img, 5)
        np.testing.assert_array_equal(dc, color, err_msg=f"{variant}/{name}")
        np.testing.assert_array_equal(ds, shape, err_msg=f"{variant}/{name}")


# ----------------------------------------------------------------------------- rendering


def test_render_layout_and_cell_placement():
    s, p = 4, 16
    color = np.full((s, s), -1, np.int32)
    shape = np.full((s, s), -1, np.int32)
    color[1, 3], shape[1, 3] = 2, 2  # blue triangle at x=3 (column), y=1 (row)
    img = np.asarray(R.render(color, shape, cell_px=p))
    assert img.shape == (64, 64, 3) and img.dtype == np.uint8
    ys, xs = np.nonzero((img != 255).any(-1))
    assert ys.min() >= p * 1 and ys.max() < p * 2 and xs.min() >= p * 3 and xs.max() < p * 4
    blue = (img == [0, 0, 255]).all(-1)
    assert blue.any() and blue[p : 2 * p, 3 * p : 4 * p].sum() == blue.sum()
    # Whole image = tile table laid out cell by cell.
    rng = np.random.default_rng(1)
    color, shape = random_scene(rng, s)
    img = np.asarray(R.render(color, shape, cell_px=p))
    tiles = R.tile_table(p)
    ids = np.where(color >= 0, 1 + 4 * color + shape, 0)
    for y in range(s):
        for x in range(s):
            cell = img[p * y : p * (y + 1), p * x : p * (x + 1)]
            np.testing.assert_array_equal(cell, tiles[ids[y, x]])


def test_tile_table_colours():
    tiles = R.tile_table(32)
    assert tiles.shape == (17, 32, 32, 3)
    assert (tiles[0] == 255).all()
    fill, outline = R.shape_masks(32)
    for c in range(4):
        for s in range(4):
            t = tiles[1 + 4 * c + s]
            assert (t[fill[s]] == R.PALETTE[c]).all() and (t[outline[s]] == 0).all()
            assert (t[~(fill[s] | outline[s])] == 255).all()


@pytest.mark.parametrize("s,p", [(4, 16), (10, 32), (5, 64)])
def test_jit_vmap_batch_equals_per_sample(s, p):
    rng = np.random.default_rng(s * 100 + p)
    scenes = [random_scene(rng, s) for _ in range(6)]
    color = np.stack([c for c, _ in scenes])
    shape = np.stack([sh for _, sh in scenes])
    render_batch = jax.jit(jax.vmap(partial(R.render, cell_px=p)))
    batched = jax.block_until_ready(render_batch(jnp.asarray(color), jnp.asarray(shape)))
    batched = np.asarray(batched)
    assert batched.shape == (6, s * p, s * p, 3) and batched.dtype == np.uint8
    for i in range(6):
        single = np.asarray(R.render(color[i], shape[i], cell_px=p))
        np.testing.assert_array_equal(batched[i], single)


def test_empty_and_all_classes_scene():
    # All 16 (colour, shape) classes in a 4x4 grid, plus an all-empty 10x10 grid.
    color = np.repeat(np.arange(4, dtype=np.int32), 4).reshape(4, 4)
    shape = np.tile(np.arange(4, dtype=np.int32), 4).reshape(4, 4)
    for p in (16, 32, 64):
        dc, ds = R.decode_image(np.asarray(R.render(color, shape, cell_px=p)), 4)
        np.testing.assert_array_equal(dc, color)
        np.testing.assert_array_equal(ds, shape)
    empty = -np.ones((10, 10), np.int32)
    img = np.asarray(R.render(empty, empty, cell_px=16))
    assert img.shape == (160, 160, 3) and (img == 255).all()
    dc, ds = R.decode_image(img, 10)
    assert (dc == -1).all() and (ds == -1).all()


# ----------------------------------------------------------------------------- decoding


@pytest.mark.parametrize("p", [16, 32, 64])
@pytest.mark.parametrize("s", [4, 10])
def test_decode_random_scenes_exactly(s, p):
    rng = np.random.default_rng(7 * s + p)
    scenes = [random_scene(rng, s) for _ in range(4)]
    color = np.stack([c for c, _ in scenes])
    shape = np.stack([sh for _, sh in scenes])
    imgs = np.asarray(jax.jit(jax.vmap(partial(R.render, cell_px=p)))(color, shape))
    for i in range(len(scenes)):
        dc, ds = R.decode_image(imgs[i], s)
        assert dc.dtype == ds.dtype == np.int32 and dc.shape == (s, s)
        np.testing.assert_array_equal(dc, color[i])
        np.testing.assert_array_equal(ds, shape[i])


def test_decode_tolerates_colour_noise():
    rng = np.random.default_rng(3)
    color, shape = random_scene(rng, 5)
    img = np.asarray(R.render(color, shape, cell_px=32)).astype(np.int16)
    noisy = np.clip(img + rng.integers(-40, 41, img.shape), 0, 255).astype(np.uint8)
    dc, ds = R.decode_image(noisy, 5)
    np.testing.assert_array_equal(dc, color)
    np.testing.assert_array_equal(ds, shape)


def test_decode_rejects_bad_geometry():
    with pytest.raises(ValueError):
        R.decode_image(np.zeros((100, 90, 3), np.uint8), 5)
    with pytest.raises(ValueError):
        R.decode_image(np.zeros((20, 20, 3), np.uint8), 5)  # 4-px cells


# ----------------------------------------------------------------------------- pixel mask


@pytest.mark.parametrize("s,p", [(4, 64), (10, 16), (5, 64)])
def test_pixel_mask_full_resolution(s, p):
    rng = np.random.default_rng(s + p)
    cell = rng.integers(0, 2, (s, s))
    pm = np.asarray(R.pixel_mask(cell, p))
    assert pm.shape == (s * p, s * p)
    np.testing.assert_array_equal(pm, np.kron(cell, np.ones((p, p), np.int64)))
    np.testing.assert_array_equal(np.asarray(R.pixel_mask(cell.astype(bool), p)), pm)
    jitted = jax.jit(R.pixel_mask, static_argnums=1)(jnp.asarray(cell), p)
    np.testing.assert_array_equal(np.asarray(jitted), pm)
    batch = np.asarray(R.pixel_mask(np.stack([cell, 1 - cell]), p))
    assert batch.shape == (2, s * p, s * p)
    np.testing.assert_array_equal(batch[1], 1 - pm)


@needs_fixtures
def test_pixel_mask_fixes_official_25x25_bug():
    npz = np.load(FIXTURES / "pure/val/depth2/M/form0/g5_d07/000000.npz", allow_pickle=True)
    cell = npz["cell_mask"]
    assert npz["pixel_mask"].shape == (25, 25)  # the official bug
    pm = np.asarray(R.pixel_mask(cell, 64))
    assert pm.shape == (320, 320)
    np.testing.assert_array_equal(pm[::64, ::64], cell)
    # Downsampling ours by 64/5 per axis gives back the official 25x25 (5-px cell) mask.
    np.testing.assert_array_equal(np.asarray(R.pixel_mask(cell, 5)), npz["pixel_mask"])


# ----------------------------------------------------------------------------- host renderer


def _tile_layout(color, shape, p):
    """Reference images built in numpy: the tile of each cell, laid out row by row."""
    b, s, _ = color.shape
    ids = np.where((color >= 0) & (shape >= 0), 1 + 4 * color + shape, 0)
    tiles = R.tile_table(p)[ids]  # [b, y, x, row, col, 3]
    return tiles.transpose(0, 1, 3, 2, 4, 5).reshape(b, s * p, s * p, 3)


@pytest.mark.parametrize("s,p,chunk,b", [(5, 64, 16, 37), (4, 16, 8, 8), (7, 10, 4, 9)])
def test_host_renderer_equals_tile_layout(s, p, chunk, b):
    """iter_images / render_images give the tile layout exactly, for a last chunk that is
    partial (37 = 2*16 + 5), exact (8 = 8) and a cell size that is not whole words (10 px ->
    the uint8 fallback); earlier chunks stay intact while later ones are rendered."""
    rng = np.random.default_rng(7 * s + p)
    scenes = [random_scene(rng, s) for _ in range(b)]
    color = np.stack([c for c, _ in scenes])
    shape = np.stack([sh for _, sh in scenes])
    want = _tile_layout(color, shape, p)
    chunks = list(R.iter_images(color, shape, p, chunk))
    assert [i for i, _ in chunks] == list(range(0, b, chunk))
    got = np.concatenate([im for _, im in chunks])
    assert got.dtype == np.uint8 and got.shape == (b, s * p, s * p, 3)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(R.render_images(color, shape, p, chunk), want)


def test_render_packed_is_the_uint8_image_in_words():
    rng = np.random.default_rng(3)
    color, shape = random_scene(rng, 5)
    words = np.asarray(R.render_packed(color, shape, 16))
    assert words.dtype == np.uint32 and words.shape == (80, 80 * 3 // 4)
    img = words.view(np.uint8).reshape(80, 80, 3)
    np.testing.assert_array_equal(img, _tile_layout(color[None], shape[None], 16)[0])
    with pytest.raises(ValueError, match="divisible by 4, got 10 px"):
        R.render_packed(color, shape, 10)
    with pytest.raises(ValueError, match=r"\[B, S, S\]"):
        next(R.iter_images(color, shape, 16))
