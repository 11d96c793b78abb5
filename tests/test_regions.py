"""Image players as pixel regions (gridvqa_jax.explain.regions), the per-pixel Attribution map,
its pixel-level scoring, and MultiSHAP / DIME at region granularity, against explicit numpy
loops, scikit-image, closed-form games and the cell-player explainers."""

import importlib
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import random_scenes
from gridvqa_jax.explain import regions as RG
from gridvqa_jax.explain.attribution import Attribution, concat, from_maps, from_pixel_maps
from gridvqa_jax.explain import scoring as SC
from gridvqa_jax.world import render as Rn
from gridvqa_jax.world import universe as U

MS = importlib.import_module("gridvqa_jax.explain.multishap")
DM = importlib.import_module("gridvqa_jax.explain.dime")

S, PX = 5, 4  # 5 x 5 grid rendered at 4 px per cell: 20-px images
H = S * PX
V = 30  # random_scenes draws token ids 1..29


# ----------------------------------------------------------------------------- players
@pytest.mark.parametrize("h,w,n", [(80, 80, 12), (20, 20, 3), (64, 48, 7), (20, 20, 5)])
def test_patch_players_against_a_loop(h, w, n):
    labels = RG.patch_players(h, w, n)
    ref = np.empty((h, w), np.int64)
    for y in range(h):
        for x in range(w):
            ref[y, x] = (y * n // h) * n + (x * n // w)
    assert labels.dtype == np.int32 and labels.shape == (h, w)
    np.testing.assert_array_equal(labels, ref)
    sizes = np.bincount(labels.ravel(), minlength=n * n)
    assert sizes.min() >= (h // n) * (w // n) and sizes.max() <= -(-h // n) * -(-w // n)


def test_patches_at_the_grid_size_are_the_cells():
    # n_per_side = S: patch y*S + x is cell (x, y), the default cell players' ids
    ref = np.kron(np.arange(S * S).reshape(S, S), np.ones((PX, PX), int))
    np.testing.assert_array_equal(RG.patch_players(H, H, S), ref)


def _images(n, seed=0, cell_px=16):
    sc = random_scenes(n, seed, S)
    return np.stack([np.asarray(Rn.render(c, s, cell_px)) for c, s in zip(sc.color, sc.shape)])


def test_superpixels_equal_skimage_quickshift_with_lime_defaults():
    from skimage.segmentation import quickshift

    images = _images(3)
    labels = RG.superpixel_players(images)
    assert labels.shape == images.shape[:3] and labels.dtype == np.int32
    for im, lab in zip(images, labels):
        ref = quickshift(im, kernel_size=4, max_dist=200, ratio=0.2)  # seed 42: default
        np.testing.assert_array_equal(lab, ref)
        assert lab.max() >= 1  # a scene with objects has several superpixels
        np.testing.assert_array_equal(np.unique(lab), np.arange(lab.max() + 1))
    # one image, and float input in 0..255 units, give the same labels
    np.testing.assert_array_equal(RG.superpixel_players(images[0]), labels[0])
    np.testing.assert_array_equal(RG.superpixel_players(images.astype(np.float32)), labels)
    assert RG.n_regions(labels) == labels.max() + 1


# ----------------------------------------------------------------------------- masking
def _loop_mask(image, labels, region_mask, fill):
    """image [H, W, C], labels [H, W], region_mask [R], fill broadcast to [H, W, C]."""
    out = np.array(image, copy=True)
    fill = np.broadcast_to(np.asarray(fill, image.dtype), image.shape)
    for y in range(image.shape[0]):
        for x in range(image.shape[1]):
            r = labels[y, x]
            if r >= 0 and region_mask[r]:
                out[y, x] = fill[y, x]
    return out


@pytest.mark.parametrize("fill_kind", ["scalar", "colour", "image"])
def test_mask_regions_equals_a_numpy_loop(fill_kind):
    rng = np.random.default_rng(1)
    image = _images(1, cell_px=PX)[0]
    labels = rng.integers(-1, 7, (H, H)).astype(np.int32)  # -1 = never masked
    masks = rng.random((6, 7)) < 0.5  # K = 6 region masks
    fill = {"scalar": 0, "colour": np.array([10, 200, 30], np.uint8),
            "image": rng.integers(0, 256, (H, H, 3)).astype(np.uint8)}[fill_kind]
    ref = np.stack([_loop_mask(image, labels, m, fill) for m in masks])
    out_np = RG.mask_regions(image[None], labels, masks, fill)
    assert isinstance(out_np, np.ndarray) and out_np.dtype == np.uint8
    np.testing.assert_array_equal(out_np, ref)
    jitted = jax.jit(lambda im, lab, m: RG.mask_regions(im[None], lab, m, jnp.asarray(fill)))
    out_jax = jitted(jnp.asarray(image), jnp.asarray(labels), jnp.asarray(masks))
    assert isinstance(out_jax, jax.Array)
    np.testing.assert_array_equal(np.asarray(out_jax), ref)
    # per-sample label maps with a batch of images (vmap)
    labels_b = rng.integers(-1, 7, (2, H, H)).astype(np.int32)
    imgs = _images(2, seed=3, cell_px=PX)
    out_b = jax.vmap(lambda im, lab, m: RG.mask_regions(im, lab, m, jnp.asarray(fill)))(
        jnp.asarray(imgs), jnp.asarray(labels_b), jnp.asarray(masks[:2]))
    for b in range(2):
        np.testing.assert_array_equal(np.asarray(out_b[b]),
                                      _loop_mask(imgs[b], labels_b[b], masks[b], fill))


def test_spread_and_pool_regions_against_loops():
    rng = np.random.default_rng(2)
    labels = rng.integers(-1, 5, (2, 8, 9)).astype(np.int32)
    labels[1][labels[1] == 3] = 0  # region 3 owns no pixel in map 1
    values = rng.normal(size=(2, 6)).astype(np.float32)  # region 5 owns no pixel anywhere
    out = RG.spread_regions(values, labels)
    ref = np.zeros(labels.shape, np.float32)
    for b in range(2):
        for y in range(8):
            for x in range(9):
                r = labels[b, y, x]
                if r >= 0:
                    ref[b, y, x] = values[b, r] / np.sum(labels[b] == r)
    np.testing.assert_allclose(out, ref, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(RG.spread_regions(jnp.asarray(values),
                                                            jnp.asarray(labels))), ref, rtol=1e-6)
    pooled = RG.pool_regions(out, labels, 6)
    sizes = RG.region_sizes(labels, 6)
    np.testing.assert_array_equal(sizes, [[np.sum(labels[b] == r) for r in range(6)]
                                          for b in range(2)])
    np.testing.assert_allclose(pooled, np.where(sizes > 0, values, 0), rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- Attribution
def test_pixel_attribution_pools_mass_per_cell_and_resamples():
    rng = np.random.default_rng(3)
    px = rng.normal(size=(2, H, H)).astype(np.float32)
    tokens_valid = np.arange(U.MAX_TOKENS)[None, :] < np.array([[4], [7]])
    att = from_pixel_maps(px, rng.normal(size=(2, U.MAX_TOKENS)), tokens_valid, S)
    ref = np.array([[[px[b, y * PX:(y + 1) * PX, x * PX:(x + 1) * PX].sum() for x in range(S)]
                     for y in range(S)] for b in range(2)])
    np.testing.assert_allclose(att.visual, ref, rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(att.textual)[~tokens_valid] == 0)
    np.testing.assert_array_equal(att.visual_pixels(PX), px)  # its own resolution
    up = np.asarray(att.visual_pixels(4 * PX))  # each pixel a 4 x 4 block of a 16th
    np.testing.assert_allclose(up, np.kron(px, np.ones((1, 4, 4))) / 16, rtol=1e-6)
    np.testing.assert_allclose(att.visual_pixels(PX // 2),
                               px.reshape(2, H // 2, 2, H // 2, 2).sum((2, 4)), rtol=1e-5,
                               atol=1e-6)
    with pytest.raises(ValueError):
        att.visual_pixels(3)
    padded = att.pad_tokens(U.MAX_TOKENS + 2)
    np.testing.assert_array_equal(padded.visual_px, px)
    both = concat([att, att])
    assert both.visual_px.shape == (4, H, H)
    # a cell attribution has none, and keeps the even spread
    cell = from_maps(ref, np.zeros((2, U.MAX_TOKENS)), tokens_valid)
    assert cell.visual_px is None
    np.testing.assert_allclose(cell.visual_pixels(PX), np.kron(ref, np.ones((1, PX, PX))) / PX ** 2,
                               rtol=1e-6)


class GtScenes(NamedTuple):
    color: np.ndarray
    shape: np.ndarray
    tokens: np.ndarray
    gt_cells: np.ndarray
    gt_tokens: np.ndarray
    form: np.ndarray


def test_pixel_map_is_scored_without_aggregation():
    rng = np.random.default_rng(4)
    B = 6
    sc = random_scenes(B, 4, S)
    gt = rng.random((B, S, S)) < 0.3
    gt[:, 0, 0] = True
    scenes = GtScenes(sc.color, sc.shape, sc.tokens, gt, sc.tokens != U.PAD_ID,
                      np.arange(B) % 2)
    px = rng.exponential(size=(B, H, H)).astype(np.float32)  # no ties
    att = from_pixel_maps(px, rng.normal(size=sc.tokens.shape), sc.tokens != U.PAD_ID, S)
    out = SC.per_sample_scores(att, scenes)
    gt_px = np.kron(gt, np.ones((1, PX, PX), bool))
    a = np.abs(px).reshape(B, -1)
    m = gt_px.reshape(B, -1)
    rma = (a * m).sum(1) / a.sum(1)
    K = m.sum(1)
    rra = np.array([m[b][np.argsort(-a[b])[:K[b]]].mean() for b in range(B)])
    pointing = m[np.arange(B), np.argmax(a, 1)].astype(float)
    np.testing.assert_allclose(out["visual"]["pixel"]["rma"], rma, rtol=1e-5)
    np.testing.assert_allclose(out["visual"]["pixel"]["rra"], rra, rtol=1e-6)
    np.testing.assert_allclose(out["visual"]["pixel"]["pointing"], pointing)
    # the cell level scores the pooled map: RRA differs, RMA does not (whole-cell ground truth)
    cells = np.asarray(att.visual).reshape(B, -1)
    cell_rra = np.array([gt.reshape(B, -1)[b][np.argsort(-cells[b])[:gt[b].sum()]].mean()
                         for b in range(B)])
    np.testing.assert_allclose(out["visual"]["cell"]["rra"], cell_rra, rtol=1e-6)
    assert not np.allclose(out["visual"]["pixel"]["rra"], out["visual"]["cell"]["rra"])
    np.testing.assert_allclose(out["visual"]["cell"]["rma"], rma, rtol=1e-4)
    # scoring at the map's resolution equals scoring its upsampling at the 64-px ground truth
    up = Attribution(visual=att.visual, textual=att.textual, token_valid=att.token_valid,
                     visual_px=att.visual_pixels(SC.GT_CELL_PX))
    out64 = SC.per_sample_scores(up, scenes, levels=("pixel",))
    for k in ("rma", "rra", "pointing", "iou"):
        np.testing.assert_allclose(out64["visual"]["pixel"][k], out["visual"]["pixel"][k],
                                   rtol=1e-4, err_msg=k)


# ----------------------------------------------------------------------------- explainers
def bilinear_apply(params, image, tokens):
    """v = sum_t y_t sum_{p,c} A[p, c, id_t] x_pc + sum_{p,c} b_pc x_pc + sum_t wt[id_t] y_t with
    x = image / 255, y_t = token t not PAD: bilinear in (pixel, token), so every region x token
    SII is exactly sum_{p in r, c} A[p, c, id_t] (x_pc - fill_pc) / 255."""
    x = jnp.asarray(image, jnp.float32) / 255.0
    y = (tokens != U.PAD_ID).astype(jnp.float32)
    per_tok = jnp.einsum("khwc,hwcv->kv", x, params["A"])  # [K, V]
    v = (jnp.sum(jnp.take_along_axis(per_tok, tokens, axis=1) * y, axis=1)
         + jnp.einsum("khwc,hwc->k", x, params["b"]) + jnp.sum(params["wt"][tokens] * y, 1))
    return {"answer_logprobs": jnp.stack([v, v - 1.0], -1)}


def occupancy_apply(params, image, tokens):
    """A nonlinear model of the cells' occupancy and the tokens (cell-level, so a region game
    over patches equal to the cells is the cell game)."""
    img = jnp.asarray(image, jnp.float32)
    K = img.shape[0]
    occ = ((255.0 - img).reshape(K, S, PX, S, PX, 3).sum((2, 4, 5)) > 0).reshape(K, S * S)
    y = (tokens != U.PAD_ID).astype(jnp.float32)
    t = jnp.sum(params["wt"][tokens] * y, 1)
    v = jnp.tanh(occ.astype(jnp.float32) @ params["wc"] + t) * (1.0 + 0.5 * t)
    return {"answer_logprobs": jnp.stack([v, -v], -1)}


def _params(seed=0):
    r = np.random.default_rng(seed)
    return {"A": jnp.asarray(r.normal(0, 0.05, (H, H, 3, V)), jnp.float32),
            "b": jnp.asarray(r.normal(0, 0.05, (H, H, 3)), jnp.float32),
            "wt": jnp.asarray(r.normal(0, 0.5, V), jnp.float32),
            "wc": jnp.asarray(r.normal(0, 0.5, S * S), jnp.float32)}


def _expected_bilinear(params, scenes, labels, fill):
    """Phi[b, r, t] of the bilinear game in numpy: labels [B, H, W], fill [H, W, 3] 0..255."""
    A = np.asarray(params["A"], np.float64)
    B, L = scenes.tokens.shape
    R = labels.max() + 1
    out = np.zeros((B, R, L))
    for b in range(B):
        img = np.asarray(Rn.render(scenes.color[b], scenes.shape[b], PX), np.float64)
        diff = (img - np.broadcast_to(fill, img.shape)) / 255.0
        for t in range(L):
            tok = scenes.tokens[b, t]
            if tok == U.PAD_ID:
                continue
            contrib = np.sum(A[..., tok] * diff, axis=-1)  # [H, W]
            for r in range(R):
                out[b, r, t] = contrib[labels[b] == r].sum()
    return out


@pytest.mark.parametrize("players,baseline,text_aggregate", [
    ("patches3", "gray", "signed"), ("random", "black", "abs")])
def test_multishap_regions_recovers_a_bilinear_game_exactly(players, baseline, text_aggregate):
    scenes = random_scenes(3, 5, S)
    params = _params(1)
    rng = np.random.default_rng(6)
    if players == "patches3":
        labels = np.broadcast_to(RG.patch_players(H, H, 3), (3, H, H)).astype(np.int32)
    else:  # irregular regions, pixels never masked, a region that sample 1 lacks
        labels = rng.integers(-1, 6, (3, H, H)).astype(np.int32)
        labels[1][labels[1] == 4] = -1
    fill = np.asarray(MS.PT.baseline_fill(baseline, S, PX), np.float64)
    att = MS.multishap_regions(bilinear_apply, params, scenes, jax.random.key(0),
                               image_players=labels, cell_px=PX, n_samples=3,
                               baseline=baseline, text_aggregate=text_aggregate)
    phi = _expected_bilinear(params, scenes, labels, fill)  # [B, R, L]
    assert att.visual_px.shape == (3, H, H)
    region_mass = RG.pool_regions(np.asarray(att.visual_px), labels, phi.shape[1])
    np.testing.assert_allclose(region_mass, phi.sum(2), rtol=2e-3, atol=2e-4)
    text = np.abs(phi).sum(1) if text_aggregate == "abs" else phi.sum(1)
    np.testing.assert_allclose(att.textual, text, rtol=2e-3, atol=2e-4)
    np.testing.assert_allclose(att.visual, np.asarray(att.visual_px).reshape(
        3, S, PX, S, PX).sum((2, 4)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("sampling", ["iid", "stratified"])
def test_multishap_regions_with_cell_patches_is_the_cell_game(sampling):
    scenes = random_scenes(3, 7, S)
    params = _params(2)
    key = jax.random.key(3)
    cell = MS.multishap(occupancy_apply, params, scenes, key, cell_px=PX, n_samples=5,
                        sampling=sampling)
    reg = MS.multishap_regions(occupancy_apply, params, scenes, key,
                               image_players=RG.patch_players(H, H, S), cell_px=PX,
                               n_samples=5, baseline="empty", sampling=sampling)
    assert float(np.abs(np.asarray(cell.visual)).max()) > 1e-3
    np.testing.assert_allclose(reg.visual, cell.visual, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(reg.textual, cell.textual, rtol=1e-4, atol=1e-5)
    if sampling != "iid":  # the option reaches the estimator: other coalitions, other maps
        iid = MS.multishap(occupancy_apply, params, scenes, key, cell_px=PX, n_samples=5)
        assert float(np.abs(np.asarray(iid.visual) - np.asarray(cell.visual)).max()) > 1e-3
    # the default players are ViLT's 12 x 12 patches: 144 region players
    n = MS.game_size(scenes)[1]
    assert MS.multishap_region_evaluations(scenes, 144, 2) == 3 * 2 * (1 + 144 + n + 144 * n)


@pytest.mark.parametrize("sampling", ["iid", "stratified"])
def test_multishap_regions_maps_do_not_depend_on_the_batchs_region_count(sampling):
    """Another sample's finer label map (9 regions, the others 4) pads every game of the batch
    with 5 null region players; they join no coalition and move no other player's draws, so
    the other samples' maps are unchanged."""
    scenes = random_scenes(4, 7, S)
    coarse = np.broadcast_to((np.arange(H)[:, None] >= H // 2) * 2
                             + (np.arange(H)[None, :] >= H // 2), (4, H, H)).astype(np.int32)
    finer = coarse.copy()
    finer[3] = (np.arange(H)[:, None] * 3 // H) * 3 + np.arange(H)[None, :] * 3 // H
    a, b = (MS.multishap_regions(occupancy_apply, _params(4), scenes, jax.random.key(5),
                                 image_players=labels, cell_px=PX, n_samples=6,
                                 sampling=sampling) for labels in (coarse, finer))
    assert RG.n_regions(finer) == 9 and float(np.abs(np.asarray(a.visual)).max()) > 1e-3
    np.testing.assert_allclose(b.visual_px[:3], a.visual_px[:3], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b.textual[:3], a.textual[:3], rtol=1e-5, atol=1e-6)


def test_dime_regions_with_cell_patches_is_cell_dime():
    scenes = random_scenes(4, 8, S)
    params = _params(3)
    key = jax.random.key(4)
    cell = DM.dime_maps(occupancy_apply, params, scenes, key, n_samples=24, cell_px=PX)
    reg = DM.dime_region_maps(occupancy_apply, params, scenes, key,
                              image_players=RG.patch_players(H, H, S), n_samples=24,
                              cell_px=PX, baseline="empty")
    np.testing.assert_array_equal(reg.visual_masks, cell.visual_masks)
    for part in ("uc", "mi"):
        a, b = getattr(reg, part), getattr(cell, part)
        assert float(np.abs(np.asarray(b.visual)).max()) > 1e-4
        np.testing.assert_allclose(a.visual, b.visual, rtol=1e-3, atol=1e-5)
        np.testing.assert_allclose(a.textual, b.textual, rtol=1e-4, atol=1e-6)


def test_dime_superpixels_targets_and_maps_against_numpy():
    """Superpixel players (black hide colour): the (UC, MI) targets under sampled region masks
    equal DIME's formula on model calls on images masked by a numpy loop, and each region's
    pixel mass is its LIME coefficient."""
    scenes = random_scenes(3, 9, S)
    params = _params(4)
    out = DM.dime_region_maps(bilinear_apply, params, scenes, jax.random.key(5), n_samples=8,
                              cell_px=PX)  # defaults: superpixels, black
    images = np.stack([np.asarray(Rn.render(c, s, PX)) for c, s in zip(scenes.color,
                                                                        scenes.shape)])
    labels = RG.superpixel_players(images)
    R = labels.max() + 1
    assert out.visual_masks.shape == (3, 8, R)
    f = lambda img, tok: np.asarray(bilinear_apply(params, img, tok)["answer_logprobs"])
    for i in range(3):
        a = int(out.answer[i])
        F = np.array([[f(images[k][None], scenes.tokens[j][None])[0, a] for k in range(3)]
                      for j in range(3)])
        for k in (0, 3, 7):
            z = np.asarray(out.visual_masks[i, k])
            img = _loop_mask(images[i], labels[i], ~z, 0)
            Fp = F.copy()
            Fp[:, i] = [f(img[None], scenes.tokens[j][None])[0, a] for j in range(3)]
            uc = Fp[i].mean() + Fp[:, i].mean() - Fp.mean()
            np.testing.assert_allclose(out.visual_targets[i, k], [uc, Fp[i, i] - uc],
                                       rtol=1e-4, atol=1e-4)
        coef, _ = DM.LIME.lime_fit(out.visual_masks[i], out.visual_targets[i],
                                   RG.region_sizes(labels[i], R) > 0)
        mass = RG.pool_regions(np.asarray(out.mi.visual_px[i]), labels[i], R)
        np.testing.assert_allclose(mass, np.asarray(coef)[:, 1], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(out.mi.visual).sum((1, 2)),
                               np.asarray(out.mi.visual_px).sum((1, 2)), rtol=1e-4, atol=1e-5)
    att = DM.dime_regions(bilinear_apply, params, scenes, jax.random.key(5), n_samples=8,
                          cell_px=PX)
    np.testing.assert_array_equal(att.visual_px, out.mi.visual_px)


def test_unknown_players_and_bad_label_maps_are_errors():
    scenes = random_scenes(1, 0, S)
    with pytest.raises(ValueError, match="image_players"):
        RG.resolve_image_players("pixels", scenes, PX)
    with pytest.raises(ValueError, match="label map"):
        RG.resolve_image_players(np.zeros((H + 1, H), np.int32), scenes, PX)
    with pytest.raises(ValueError, match="n_per_side"):
        RG.patch_players(10, 10, 11)


def test_table1_players_select_the_reference_rows():
    from reproduction import table1 as T1

    fns = SC.resolve_explainers(["multishap", "dime", "multiviz", "random"])
    assert T1.select_players(fns, "cells") == fns
    ref = T1.select_players(fns, "reference")
    assert list(ref) == ["multishap_ref", "dime_ref", "multiviz_ref", "random"]
    assert ref["multishap_ref"] is MS.multishap_regions and ref["dime_ref"] is DM.dime_regions
    assert ref["multiviz_ref"] is SC.EXPLAINERS["multiviz"]
    both = T1.select_players(fns, "both")
    assert list(both) == ["multishap", "dime", "multiviz", "random", "multishap_ref", "dime_ref",
                          "multiviz_ref"]
    budgets = T1.reference_budgets()
    for e, fn in ref.items():
        SC.check_budget(fn, budgets.get(e, {}))  # the reference options are accepted
    assert budgets["multishap_ref"]["baseline"] == "gray"
    assert budgets["multiviz_ref"] == {"granularity": "pixels", "pixel_baseline": "gray"}
    assert "per-pixel" in T1.explainer_protocol("multiviz_ref", ref["multiviz_ref"],
                                                budgets["multiviz_ref"], "embedding")["players"]
    # a user callable under a shipped name is not replaced
    assert T1.select_players({"multishap": lambda *a, **k: None}, "reference").keys() == {
        "multishap"}
    with pytest.raises(Exception, match="players"):
        T1.select_players(fns, "pixels")


def test_explain_cli_players_flag():
    from reproduction.cli.gridvqa import build_parser

    p = build_parser()
    assert p.parse_args(["explain", "--regimes"]).players == "cells"
    assert p.parse_args(["explain", "--regimes", "--players", "reference"]).players == "reference"
    with pytest.raises(SystemExit):
        p.parse_args(["explain", "--regimes", "--players", "pixels"])


def test_multishap_regions_converges_to_exact_enumeration_on_four_patches():
    """A nonlinear game (cell occupancy through tanh) over 2 x 2 patches that cut cells in
    half, and 3 tokens: the SII by enumeration of all 2^7 coalitions, each input masked by a
    numpy loop, against the Monte Carlo estimate (unbiased: within a few standard errors)."""
    import math

    sc = random_scenes(1, 11, S)
    tokens = np.zeros_like(sc.tokens)
    tokens[0, :3] = [5, 17, 23]
    scenes = sc._replace(tokens=tokens)
    params = _params(5)
    labels = RG.patch_players(H, H, 2)  # 10-px patches: cell 2 (px 8..11) is split
    fill = np.asarray(MS.PT.baseline_fill("gray", S, PX))
    image = np.asarray(Rn.render(scenes.color[0], scenes.shape[0], PX))
    n_reg, n_tok = 4, 3
    m = n_reg + n_tok
    codes = np.arange(2 ** m)
    bits = ((codes[:, None] >> np.arange(m)[None, :]) & 1).astype(bool)
    imgs = np.stack([_loop_mask(image, labels, ~b[:n_reg], fill) for b in bits])
    toks = np.where(np.concatenate([bits[:, n_reg:], np.ones((len(codes), U.MAX_TOKENS - 3),
                                                             bool)], 1), tokens[0], U.PAD_ID)
    v = np.asarray(occupancy_apply(params, imgs, toks)["answer_logprobs"], np.float64)
    a = int(np.argmax(v[-1]))  # the answer predicted on the full input
    v = v[:, a]
    size = bits.sum(1)
    weight = [math.factorial(k) * math.factorial(m - k - 2) / math.factorial(m - 1)
              for k in range(m - 1)]
    exact = np.zeros((n_reg, n_tok))
    for r in range(n_reg):
        for t in range(n_tok):
            i, j = 1 << r, 1 << (n_reg + t)
            T = codes[(codes & i == 0) & (codes & j == 0)]
            exact[r, t] = sum(weight[size[c]] * (v[c | i | j] - v[c | i] - v[c | j] + v[c])
                              for c in T)
    assert np.abs(exact).max() > 0.05
    est = [MS.multishap_regions(occupancy_apply, params, scenes, jax.random.key(s),
                                image_players=labels, cell_px=PX, n_samples=4000,
                                baseline="gray") for s in range(2)]
    mass = np.stack([RG.pool_regions(np.asarray(e.visual_px[0]), labels, n_reg) for e in est])
    text = np.stack([np.asarray(e.textual[0, :3]) for e in est])
    # two independent estimates: their spread bounds the Monte Carlo error
    # (the mean's standard error is about half their difference)
    tol = 2 * np.abs(mass[0] - mass[1]).max() + 0.002
    assert tol < 0.25 * np.abs(exact.sum(1)).max()  # the check is not vacuous
    np.testing.assert_allclose(mass.mean(0), exact.sum(1), atol=tol)
    tol = 2 * np.abs(text[0] - text[1]).max() + 0.002
    assert tol < 0.25 * np.abs(exact.sum(0)).max()
    np.testing.assert_allclose(text.mean(0), exact.sum(0), atol=tol)


def region_mesh_case(mesh):
    """3 samples (padded to 4 on a 4-device mesh) of both region explainers: one flat vector."""
    scenes = random_scenes(3, 12, S)
    params = _params(6)
    labels = np.broadcast_to(RG.patch_players(H, H, 3), (3, H, H))
    ms = MS.multishap_regions(occupancy_apply, params, scenes, jax.random.key(1),
                              image_players=labels, cell_px=PX, n_samples=2, mesh=mesh)
    dm = DM.dime_regions(occupancy_apply, params, scenes, jax.random.key(2),
                         image_players=labels, cell_px=PX, n_samples=8, mesh=mesh)
    return np.concatenate([np.asarray(a).ravel() for a in (ms.visual_px, ms.textual,
                                                            dm.visual_px, dm.textual)])


REGION_MESH_CODE = """
import jax, numpy as np, sys
sys.path.insert(0, "tests")
import test_regions as T
out = T.region_mesh_case(jax.make_mesh((4,), ("data",)))
print(" ".join(repr(float(x)) for x in out))
"""


def test_region_explainers_give_the_same_maps_on_four_devices():
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    one = region_mesh_case(jax.make_mesh((1,), ("data",), devices=jax.devices()[:1]))
    assert np.all(np.isfinite(one)) and np.abs(one).max() > 0
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
           "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(repo)}
    res = subprocess.run([sys.executable, "-c", REGION_MESH_CODE], env=env,
                         capture_output=True, text=True, cwd=repo, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    four = np.array(res.stdout.split(), np.float64)
    np.testing.assert_allclose(four, one, rtol=1e-5, atol=1e-6)
