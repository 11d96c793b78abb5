"""experiments/compare_parts.py and table1_parts.read_part: two runs' parts paired on their
shared samples, the difference checked against scipy; runs on other samples are refused."""

import jax
import numpy as np
import pytest
from scipy import stats as sps

from mmx_base.errors import InputError
from reproduction import table1_parts as PARTS


def _scores(rng, n, shift=0.0):
    u = lambda: rng.uniform(0, 1, n) + shift  # noqa: E731
    return {"visual": {"pixel": {"rma": u(), "iou": u()}, "cell": {"rma": u(), "iou": u()}},
            "textual": {"rma": u(), "iou": u()}, "form": np.zeros(n, np.int32)}


def _run(tmp, name, objects, row, budget):
    d = tmp / name
    PARTS.save_part(d, "objects", "pure", objects, {"budget": {}}, wall_s=0.1)
    PARTS.save_part(d, "multishap_ref", "pure", row, {"budget": budget}, wall_s=2.0)
    return d


def test_compare_pairs_the_shared_samples(tmp_path, experiment):
    mod = experiment("compare_parts")
    rng = np.random.default_rng(1)
    obj64 = _scores(rng, 64)
    obj32 = jax.tree.map(lambda x: x[:32], obj64)  # the same first 32 samples
    a = _scores(rng, 64, 0.1)
    b = _scores(rng, 32)
    da = _run(tmp_path, "a", obj64, a, {"n_samples": 128})
    db = _run(tmp_path, "b", obj32, b, {"n_samples": 8})
    scores, fp, wall = PARTS.read_part(da / "multishap_ref__pure.npz")
    np.testing.assert_array_equal(scores["textual"]["rma"], a["textual"]["rma"])
    assert fp == {"budget": {"n_samples": 128}} and wall == 2.0
    res = mod.compare(da, db)
    assert list(res) == ["multishap_ref/pure"]  # the control is left out
    row = res["multishap_ref/pure"]
    assert row["n"] == 32 and row["budget_b"] == {"n_samples": 8}
    x, y = a["visual"]["pixel"]["iou"][:32], b["visual"]["pixel"]["iou"]
    d = x - y
    half = sps.norm.ppf(0.975) * sps.sem(d)
    np.testing.assert_allclose(row["visual_iou"]["diff"], (d.mean(), d.mean() - half,
                                                           d.mean() + half), rtol=1e-3)
    np.testing.assert_allclose(row["visual_iou"]["r"], sps.pearsonr(x, y)[0], rtol=1e-6)
    assert "multishap_ref/pure" in mod.format_compare(res, "a", "b")


def test_runs_on_other_samples_and_non_parts_are_refused(tmp_path, experiment):
    mod = experiment("compare_parts")
    rng = np.random.default_rng(2)
    da = _run(tmp_path, "a", _scores(rng, 16), _scores(rng, 16), {})
    db = _run(tmp_path, "b", _scores(rng, 16), _scores(rng, 16), {})
    with pytest.raises(InputError, match="do not share their samples"):
        mod.compare(da, db)
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(InputError, match="not a readable"):
        PARTS.read_part(tmp_path / "junk.npz")
    np.savez(tmp_path / "plain.npz", x=np.zeros(3))
    with pytest.raises(InputError, match="not a part written by Table 1"):
        PARTS.read_part(tmp_path / "plain.npz")


def _pieces(d, scores, batches, fingerprint, first=0):
    """Save ``scores`` (sample order) as the pieces of an unfinished multishap/pure row:
    ``batches`` lists each piece's sample indices in the batch's order, as ``explain_row``
    saves them; the maps are placeholders (only their index is read)."""
    from gridvqa_jax.explain.attribution import Attribution

    for bi, idx in enumerate(batches, first):
        idx = np.asarray(idx, np.int64)
        fig = Attribution(visual=np.zeros((len(idx), 5, 5)), textual=np.zeros((len(idx), 4)),
                          token_valid=np.ones((len(idx), 4), bool), visual_px=None)
        path = PARTS.piece_path(d, "multishap", "pure", bi, 0)
        PARTS.save_piece(path, jax.tree.map(lambda x: x[idx], scores),
                         {**fingerprint, "piece": [bi, 0, len(idx)]}, fig, idx, 3.0)


def test_an_unfinished_row_pairs_the_samples_its_pieces_hold(tmp_path, experiment):
    mod = experiment("compare_parts")
    rng = np.random.default_rng(3)
    fp = {"budget": {"n_samples": 512}, "samples": "abc", "n": 16}
    whole, partial = _scores(rng, 16), _scores(rng, 16, 0.05)
    db = tmp_path / "b"
    PARTS.save_part(db, "multishap", "pure", whole, fp)  # no objects part: same samples digest
    da = tmp_path / "a"
    _pieces(da, partial, [[9, 2], [5], [0, 13]],
            {**fp, "budget": {"n_samples": 2048}})
    scores, index, got_fp = PARTS.read_pieces(PARTS.pieces_dir(da, "multishap", "pure"))
    np.testing.assert_array_equal(index, [0, 2, 5, 9, 13])
    np.testing.assert_array_equal(scores["textual"]["iou"], partial["textual"]["iou"][index])
    assert got_fp == {**fp, "budget": {"n_samples": 2048}}
    row = mod.compare(da, db)["multishap/pure"]
    assert row["n"] == 5 and row["pieces"] == ["a"] and row["samples"] == [0, 2, 5, 9, 13]
    x = partial["visual"]["pixel"]["rma"][[0, 2, 5, 9, 13]]
    y = whole["visual"]["pixel"]["rma"][[0, 2, 5, 9, 13]]
    d = x - y
    half = sps.norm.ppf(0.975) * sps.sem(d)
    np.testing.assert_allclose(row["visual_rma"]["diff"], (d.mean(), d.mean() - half,
                                                           d.mean() + half), rtol=1e-3)
    np.testing.assert_allclose(row["visual_rma"]["a"], x.mean(), rtol=1e-9)
    # a floor of the same samples: its mean and A - floor on the paired samples only
    floor = _scores(rng, 16)
    PARTS.save_part(tmp_path / "f", "objects", "pure", floor, {**fp, "regime": "pure"})
    part = PARTS.part_path(tmp_path / "f", "objects", "pure")
    got = mod.compare(da, db, floor=part)["multishap/pure"]["textual_iou"]
    f = floor["textual"]["iou"][[0, 2, 5, 9, 13]]
    np.testing.assert_allclose(got["floor"], f.mean(), rtol=1e-9)
    e = partial["textual"]["iou"][[0, 2, 5, 9, 13]] - f
    half = sps.norm.ppf(0.975) * sps.sem(e)
    np.testing.assert_allclose(got["a_floor"], (e.mean(), e.mean() - half, e.mean() + half),
                               rtol=1e-3)
    assert "A - floor" in mod.format_compare(mod.compare(da, db, floor=part), "a", "b")
    for bad in ({**fp, "regime": "cross"}, {**fp, "regime": "pure", "samples": "xyz"}):
        PARTS.save_part(tmp_path / "g", "objects", "pure", floor, bad)
        with pytest.raises(InputError, match="not the same samples"):
            mod.compare(da, db, floor=PARTS.part_path(tmp_path / "g", "objects", "pure"))
        PARTS.part_path(tmp_path / "g", "objects", "pure").unlink()
    # other samples (digest) and no objects part to check them on: refused
    other = tmp_path / "c"
    PARTS.save_part(other, "multishap", "pure", whole, {**fp, "samples": "xyz"})
    with pytest.raises(InputError, match="objects__pure"):
        mod.compare(da, other)


def test_pieces_of_two_settings_or_without_their_maps_are_refused(tmp_path):
    rng = np.random.default_rng(4)
    s = _scores(rng, 8)
    _pieces(tmp_path, s, [[0, 1]], {"budget": {"n_samples": 8}})
    _pieces(tmp_path, s, [[2]], {"budget": {"n_samples": 16}}, first=1)
    with pytest.raises(InputError, match="budget differ"):
        PARTS.read_pieces(PARTS.pieces_dir(tmp_path, "multishap", "pure"))
    e = tmp_path / "e"
    PARTS.save_piece(PARTS.piece_path(e, "m", "pure", 0, 0), s, {"budget": {}})  # no maps
    with pytest.raises(InputError, match="which samples it holds is not known"):
        PARTS.read_pieces(PARTS.pieces_dir(e, "m", "pure"))
    with pytest.raises(InputError, match="no pieces"):
        PARTS.read_pieces(tmp_path / "empty")


def test_a_finished_runs_per_sample_file_pairs_with_a_sweep_folder_through_the_floor(
        tmp_path, experiment):
    """A run given as its ``per_sample.npz`` (samples 0..n-1, budgets from the results.json
    beside it, no samples digest) pairs with a sweep's run folder (a digest, no objects part)
    when the --floor part carries that digest and agrees with the per-sample objects row."""
    import json

    mod = experiment("compare_parts")
    rng = np.random.default_rng(5)
    obj, row = _scores(rng, 32), _scores(rng, 32, 0.2)
    out = tmp_path / "out"
    out.mkdir()
    PARTS.save_per_sample(out / "per_sample.npz",
                          {"objects": {"pure": obj}, "dime": {"pure": row}})
    (out / "results.json").write_text(json.dumps({"budgets": {"dime": {"n_samples": 1024}}}))
    fp = {"budget": {"n_samples": 4096}, "samples": "abc", "n": 16}
    sweep = _scores(rng, 16)
    PARTS.save_part(tmp_path / "sweep", "dime", "pure", sweep, fp)
    first16 = jax.tree.map(lambda x: x[:16], obj)
    PARTS.save_part(tmp_path / "f", "objects", "pure", first16, {**fp, "regime": "pure"})
    floor = PARTS.part_path(tmp_path / "f", "objects", "pure")
    got = mod.compare(out / "per_sample.npz", tmp_path / "sweep", floor=floor)["dime/pure"]
    assert got["n"] == 16 and got["samples"] == list(range(16)) and got["pieces"] == []
    assert got["budget_a"] == {"n_samples": 1024} and got["budget_b"] == fp["budget"]
    x, y = row["textual"]["rma"][:16], sweep["textual"]["rma"]
    d = x - y
    half = sps.norm.ppf(0.975) * sps.sem(d)
    np.testing.assert_allclose(got["textual_rma"]["diff"], (d.mean(), d.mean() - half,
                                                            d.mean() + half), rtol=1e-3)
    np.testing.assert_allclose(got["textual_rma"]["floor"], first16["textual"]["rma"].mean())
    # without the floor, or with one of other samples, the samples cannot be checked
    with pytest.raises(InputError, match="objects__pure row"):
        mod.compare(out / "per_sample.npz", tmp_path / "sweep")
    PARTS.save_part(tmp_path / "g", "objects", "pure", first16,
                    {**fp, "regime": "pure", "samples": "xyz"})
    with pytest.raises(InputError, match="objects__pure row"):
        mod.compare(out / "per_sample.npz", tmp_path / "sweep",
                    floor=PARTS.part_path(tmp_path / "g", "objects", "pure"))
    # a floor of the sweep's digest whose scores are not the per-sample run's first samples
    PARTS.save_part(tmp_path / "h", "objects", "pure", _scores(rng, 16),
                    {**fp, "regime": "pure"})
    with pytest.raises(InputError, match="do not share their samples"):
        mod.compare(out / "per_sample.npz", tmp_path / "sweep",
                    floor=PARTS.part_path(tmp_path / "h", "objects", "pure"))
    with pytest.raises(InputError, match="neither a parts folder nor a per_sample.npz"):
        mod.compare(tmp_path / "missing", tmp_path / "sweep")
