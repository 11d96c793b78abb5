"""analyze on a stream: the samples are chosen before any image is decoded
(``train.analysis_records``), decoded a chunk at a time (``batch.iter_batches``) and analysed
chunk by chunk with only per-sample results kept (``analysis.analyze`` on an iterable,
``analysis.merge_views``); the results equal the in-memory analysis of the same samples."""

import functools

import jax
import numpy as np
import pytest

from bias_jax import analysis as AN
from bias_jax import detectors as D
from bias_jax import train as BT
from bias_jax import views as VW
from bias_jax.data import batch as BA
from bias_jax.data.text import Vocab
from bias_jax.views import causal as CA
from bias_jax.views.common import ViewResult
from test_bias_real_data import _fake_exports, last_json, run_cli, write_fakeddit

N = 11  # analysed samples; chunks of 4 -> 4, 4, 3 (the last padded)


@pytest.fixture
def dataset(tmp_path):
    """A Fakeddit TSV of N rows and zero-initialised exports whose fingerprint is another
    file's, so every row is analysed: ``(tsv, dets, records, batching)``."""
    data = write_fakeddit(tmp_path / "data", n=N)
    records, _ = BT.read_real("fakeddit", data)
    _fake_exports(tmp_path / "dets", Vocab.build(r.text for r in records), fp="another file")
    recs, info = BT.analysis_records("fakeddit", data, tmp_path / "dets")
    return data, tmp_path / "dets", recs, info["batching"]


class DecodeCounter:
    """Stands in for ``batch.load_image``: counts the images decoded, then decodes."""

    def __init__(self, monkeypatch):
        self.paths, self._load = [], BA.load_image
        monkeypatch.setattr(BA, "load_image", self)

    def __call__(self, path, size):
        self.paths.append(path)
        return self._load(path, size)


# ----------------------------------------------------------------------------------------------
# Choosing the samples, decoding in chunks.
# ----------------------------------------------------------------------------------------------
def test_iter_batches_chunks_equal_one_batch_at_every_boundary(dataset, monkeypatch):
    _, _, recs, batching = dataset
    whole = BA.records_to_batch(recs, **batching)
    bias = np.arange(N, dtype=np.int32) % 3
    for chunk, sizes in ((4, [4, 4, 3]), (1, [1] * N), (N, [N]), (N + 5, [N]), (3, [3, 3, 3, 2])):
        for prefetch in (True, False):
            parts = list(BA.iter_batches(recs, chunk=chunk, bias=bias, prefetch=prefetch,
                                         **batching))
            assert [p.size for p in parts] == sizes
            got = BA.concat(parts)
            for f in ("image", "tokens", "label", "fine_label", "index", "has_gt"):
                np.testing.assert_array_equal(getattr(got, f), getattr(whole, f))
            np.testing.assert_array_equal(got.bias, bias)
    assert list(BA.iter_batches([], **batching)) == []
    with pytest.raises(ValueError, match="chunk must be >= 1"):
        next(BA.iter_batches(recs, chunk=0, **batching))
    with pytest.raises(ValueError, match=r"bias has shape \(3,\), expected \(11,\)"):
        next(BA.iter_batches(recs, bias=[0, 1, 2], **batching))
    # At most two chunks decoded ahead of the consumer, none after it stops.
    count = DecodeCounter(monkeypatch)
    it = BA.iter_batches(recs, chunk=2, **batching)
    assert next(it).size == 2 and len(count.paths) <= 4
    it.close()
    assert len(count.paths) <= 4


def test_analysis_records_choose_before_decoding(tmp_path, monkeypatch):
    data = write_fakeddit(tmp_path / "data", n=20)
    records, _ = BT.read_real("fakeddit", data)
    _fake_exports(tmp_path / "dets", Vocab.build(r.text for r in records),
                  BT.fingerprint(records), split_seed=1)
    count = DecodeCounter(monkeypatch)
    keep = BT.real_splits(records, 1)["Analysis_train"]
    recs, info = BT.analysis_records("fakeddit", data, tmp_path / "dets", n=5)
    assert count.paths == []  # reading and splitting decode nothing
    assert recs == [records[i] for i in keep[:5]] and info["ids"] == [r.uid for r in recs]
    assert (info["n_records"], info["n_available"], info["n_analysed"],
            info["left_out_finetune"]) == (20, len(keep), 5, 20 - len(keep))
    assert info["batching"]["image_size"] == 80 and info["batching"]["max_len"] == 8
    assert BT.analysis_records("fakeddit", data, tmp_path / "dets", n=99)[1]["n_analysed"] \
        == len(keep)


# ----------------------------------------------------------------------------------------------
# analyze on a stream: the plumbing, with per-sample stand-in views (no compilation).
# ----------------------------------------------------------------------------------------------
def fake_views(monkeypatch, shapes):
    """Per-sample stand-ins for the views reading the pixels and tokens (so a wrong row shows),
    recording the batch sizes they are called on in ``shapes``; extras: a per-sample array and
    a set-level one (dropped from a stream's chunks)."""
    def fake(shift):
        def view(detectors, batch, *, key=None, **opts):
            shapes.append(batch.size)
            img = np.asarray(batch.image, np.float64).mean((1, 2, 3))
            tok = np.asarray(batch.tokens).sum(1)
            lab = ((img * 7 + tok + shift + (opts.get("value") == "logprob")).astype(np.int64)
                   % 3).astype(np.int32)
            score = (img / 255 - 0.5 + 0.1 * shift).astype(np.float32)
            return ViewResult(lab, score, {"img": img, "set_level": {"mean": float(img.mean())}})
        return view

    for i, name in enumerate(VW.VIEWS):
        monkeypatch.setitem(VW.VIEW_FNS, name, fake(i))


def test_stream_plumbing_equals_one_batch(dataset, monkeypatch):
    _, dets, recs, batching = dataset
    shapes = []
    fake_views(monkeypatch, shapes)
    whole = BA.records_to_batch(recs, **batching)
    bias = np.array([0, 1, 2, -1, 1, 1, 0, -1, 2, 1, 1], np.int32)  # human labels, partial
    ref, ref_views = AN.analyze({}, whole.replace(bias=bias))
    assert set(shapes) == {N}
    shapes.clear()
    got, views = AN.analyze({}, BA.iter_batches(recs, chunk=4, bias=bias, **batching))
    assert set(shapes) == {4}  # the last chunk (3 samples) padded: one compiled shape
    drop = lambda r: {k: v for k, v in r.items() if "wall" not in k}  # noqa: E731
    assert drop(got) == drop(ref) and got["n"] == N and got["n_scored"] == 9
    assert set(got["view_wall_s"]) == set(ref_views) | {"decode"}
    for name, v in ref_views.items():
        np.testing.assert_array_equal(views[name].label, v.label)
        np.testing.assert_array_equal(views[name].score, v.score)
        np.testing.assert_array_equal(views[name].extras["img"], v.extras["img"])
        assert "set_level" not in views[name].extras  # per chunk: meaningless, left out
    with pytest.raises(ValueError, match="stream holds no samples"):
        AN.analyze({}, iter([]))


def test_stream_tables_run_on_the_first_tables_n(dataset, monkeypatch):
    _, _, recs, batching = dataset
    fake_views(monkeypatch, [])
    seen = {}

    def fake_saliency(detectors, batch, labels, opts, *, truth=None, n=64, key=None):
        seen["saliency"] = (batch.size, {k: v.copy() for k, v in labels.items()})
        return {"n": batch.size}

    def fake_masking(detectors, batch, groups, key, **kw):
        seen["masking"] = (batch.size, {k: v.size for k, v in groups.items()}, batch.index)
        return {}

    monkeypatch.setattr(AN, "saliency_table", fake_saliency)
    monkeypatch.setattr(AN, "post_validation", fake_masking)
    dets = {"joint": (None, None, D.DetectorConfig(kind="joint"))}
    res, views = AN.analyze(dets, BA.iter_batches(recs, chunk=4, **batching), tables=True,
                            tables_n=6)
    assert res["n"] == N and res["tables_n"] == 6
    assert seen["saliency"][0] == 6 and seen["masking"][:2] == (6, {"pred_uni_image": 6,
                                                                    "pred_uni_text": 6})
    np.testing.assert_array_equal(seen["masking"][2], [r.row for r in recs[:6]])
    for v in AN.VIEWS:
        np.testing.assert_array_equal(seen["saliency"][1][v], views[v].label[:6])
    assert res["kmeans"]["flow"]["proportions"] and len(res["sweep"])


# ----------------------------------------------------------------------------------------------
# The causal view's set-level step, redone on the merged chunks.
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("calibration", ["path", "detector", "none"])
def test_merge_views_redoes_the_causal_calibration_over_all_samples(calibration):
    rng = np.random.default_rng(3)
    n, chunk = 8, 4
    out = {b: rng.normal(0, 2, n).astype(np.float32) for b in CA.BRANCH_KIND}
    label = rng.integers(0, 2, n).astype(np.int32)
    cells, toks = rng.random((n, 5, 5)) < 0.3, rng.random((n, 8)) < 0.5
    opts = {"fusion": "prob", "effect": "label", "calibration": calibration,
            "core_parts": "extracted", "chunk": 512}  # the view's other options are ignored
    dec = {k: v for k, v in opts.items() if k in CA.DECISION_OPTIONS}
    whole = CA.causal_decision(out, label, cells, toks, **dec)
    parts = [CA.causal_decision({b: v[s:s + chunk] for b, v in out.items()}, label[s:s + chunk],
                                cells[s:s + chunk], toks[s:s + chunk], **dec)
             for s in range(0, n, chunk)]
    naive = np.concatenate([p.score for p in parts])
    merged = AN.merge_views("causal", [AN._trim(p, p.label.size) for p in parts], label, opts)
    np.testing.assert_allclose(merged.score, whole.score, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(merged.label, whole.label)
    for p in CA.PATHS:
        np.testing.assert_allclose(merged.extras[p], whole.extras[p], rtol=1e-5, atol=1e-6)
    if calibration == "detector":
        assert merged.extras["scales"] == pytest.approx(whole.extras["scales"])
        assert whole.extras["scales"]["image"] == pytest.approx(
            np.std(np.concatenate([out["O_c"], out["O_e"]])), rel=1e-5)
    if calibration == "none":  # per sample: chunks concatenated are already right
        np.testing.assert_allclose(naive, whole.score, rtol=1e-5, atol=1e-6)
    else:  # the statistics of each chunk differ from those of all eight samples
        assert np.abs(naive - whole.score).max() > 1e-3


# ----------------------------------------------------------------------------------------------
# The command line: --n chooses before decoding, one chunk at a time, a progress bar.
# ----------------------------------------------------------------------------------------------
def test_cli_decodes_only_the_chosen_samples(dataset, tmp_path, monkeypatch):
    data, dets, recs, _ = dataset
    shapes = []
    fake_views(monkeypatch, shapes)
    count = DecodeCounter(monkeypatch)
    rc, out, err = run_cli("analyze", "--data", "fakeddit", "--root", data, "--detectors-root",
                           dets, "--n", 5, "--chunk", 2, "--json", "--out", tmp_path / "out")
    assert rc == 0, err
    assert sorted(count.paths) == sorted(r.image_path for r in recs[:5])  # 5 of the 11
    assert set(shapes) == {2}
    assert "5/5" in err and "analyze" in err  # the progress bar, on stderr
    assert set(last_json(out)) >= {"benefit", "flow", "causal", "ensemble"}
    rows = (tmp_path / "out" / "labels.csv").read_text().splitlines()
    assert [r.split(",")[0] for r in rows[1:]] == [r.uid for r in recs[:5]]
    rc, _, err = run_cli("analyze", "--data", "fakeddit", "--root", data, "--detectors-root",
                         dets, "--chunk", 0, "--quiet")
    assert rc == 2 and "--chunk" in err


# ----------------------------------------------------------------------------------------------
# The real views: the stream equals the in-memory analysis (compiles them for two shapes).
# ----------------------------------------------------------------------------------------------
def _random_exports(dets, vocab):
    """Tiny detectors with random parameters (zero ones tie everywhere)."""
    rng = np.random.default_rng(0)
    for kind in D.KINDS:
        cfg = D.DetectorConfig(kind=kind, d_model=8, mlp_dim=8, n_layers=1, n_heads=2,
                               n_gates=2, max_tokens=8, vocab_size=len(vocab))
        shapes = jax.eval_shape(functools.partial(D.init_params, cfg), jax.random.key(0))
        params = jax.tree.map(lambda a: rng.normal(0, 0.5, a.shape).astype(a.dtype), shapes)
        D.export_detector(dets / D.SHIPPED[kind], params, cfg, {"vocab": list(vocab.words)})


def _first_row_parts(batch):
    """Fixed core parts: the first row of cells, the first two words."""
    n, length = batch.tokens.shape
    cells = np.zeros((n, 5, 5), bool)
    cells[:, 0] = True
    toks = np.zeros((n, length), bool)
    toks[:, :2] = np.asarray(batch.tokens)[:, :2] != 0
    return cells, toks


@pytest.mark.slow
def test_streamed_analysis_equals_the_in_memory_one(tmp_path):
    data = write_fakeddit(tmp_path / "data", n=N)
    records, _ = BT.read_real("fakeddit", data)
    _random_exports(tmp_path / "dets", Vocab.build(r.text for r in records))
    dets = D.load_detectors(tmp_path / "dets")
    recs, info = BT.analysis_records("fakeddit", data, tmp_path / "dets")
    whole = BA.records_to_batch(recs, **info["batching"])
    drop = lambda r: {k: v for k, v in r.items() if "wall" not in k}  # noqa: E731
    # float32 logits up to ~15 (random parameters): another batch shape sums in another order
    thresholds = np.array([0.0, 0.25, 0.5 * np.log(2.0)])  # causal, flow, graded benefit
    for parts in ("extracted", _first_row_parts):
        ref, ref_views = AN.analyze(dets, whole, core_parts=parts)
        got, views = AN.analyze(dets, BA.iter_batches(recs, chunk=4, **info["batching"]),
                                core_parts=parts)
        for name, v in ref_views.items():
            w = views[name]
            np.testing.assert_allclose(w.score, v.score, rtol=1e-4, atol=1e-4)
            assert set(w.extras) == set(v.extras) - {"scales"}
            for k, e in v.extras.items():
                if k != "scales":
                    np.testing.assert_allclose(np.asarray(w.extras[k], np.float64),
                                               np.asarray(e, np.float64), rtol=1e-4, atol=1e-4)
            # A label may differ only where float noise of another batch shape decides an
            # exact tie (e.g. an empty extracted core: NDE(E) = TIE(E) = 0).
            near = np.abs(np.abs(np.asarray(v.score))[:, None] - thresholds).min(1) < 1e-4
            assert np.all((np.asarray(w.label) == np.asarray(v.label)) | near), name
        if parts is _first_row_parts:  # no structural ties: identical results
            assert drop(got) == drop(ref)
        assert got["n"] == ref["n"] == N
