"""modality-bias on real benchmarks, end to end on tiny fixtures written here in the released
formats: ``train`` fits all four detector kinds on a Fakeddit TSV and on an MMFakeBench JSON
(binary real/fake labels only), exports them as ``<dets>/bias_<kind>/``, and ``analyze --data
<source> --root FILE --detectors-root <dets>`` runs the three views and the ensemble on the
samples the detectors did not fine-tune on, tokenized with the vocabulary they were trained
with."""

import contextlib
import csv
import dataclasses
import functools
import io
import json

import jax
import numpy as np
import pytest
from PIL import Image

from reproduction.cli import bias as bcli
from bias_jax import detectors as D
from bias_jax import train as BT
from bias_jax.data import fakeddit as FD
from bias_jax.data import mmfakebench as MM
from bias_jax.data.batch import FINE_MMFAKEBENCH
from bias_jax.data.text import Vocab

N = 16  # samples per fixture: 40% fine-tune (6 train + 0-1 valid), the rest analysed
# Tiny detectors and budgets: the point is the plumbing, not the accuracy.
TINY = ["--d-model", "16", "--mlp-dim", "32", "--n-layers", "2", "--max-tokens", "8",
        "--steps", "2", "--batch-size", "4", "--save-every", "2"]
EVAL_KINDS = ("image", "text")  # held-out evaluation (one more compilation) for the cheap ones
VIEWS = ("benefit", "flow", "causal", "ensemble")
TYPES = ("uni_image", "balance", "uni_text")
REAL_WORDS = ("council", "opens", "new", "library", "in", "town", "today")
FAKE_WORDS = ("aliens", "secretly", "replace", "moon", "with", "cheese", "shocking")


def _image(path, seed, real):
    """A tiny JPEG: real samples reddish, fake ones bluish, plus noise (odd sizes on purpose:
    the loaders resize)."""
    rng = np.random.default_rng(seed)
    h, w = 10 + seed % 5, 12 + seed % 3
    base = np.array([200, 40, 40] if real else [40, 40, 200])
    px = np.clip(base + rng.integers(-30, 30, (h, w, 3)), 0, 255).astype(np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(px).save(path, "JPEG", quality=90)


def _text(i, real):
    """Every word of the sample's class, rotated by i: any fine-tuning split holding both
    classes sees all 14 words, so both fixtures give the same vocabulary size and hence the
    same detector shapes (the second source reuses the first one's compiled programs)."""
    words = REAL_WORDS if real else FAKE_WORDS
    return " ".join(words[(i + k) % len(words)] for k in range(len(words)))


def write_fakeddit(d, n=N):
    """``d/train.tsv`` + ``d/images/<id>.jpg``: n rows, every other one real (2-way 1)."""
    rows = []
    for i in range(n):
        real = i % 2 == 0
        uid = f"fd{i:03d}"
        _image(d / "images" / f"{uid}.jpg", i, real)
        l2, l3, l6 = (1, 0, 0) if real else (0, 1 + i % 2, 1 + i % 5)
        rows.append({"author": "a", "clean_title": _text(i, real), "created_utc": "1.0",
                     "domain": "i.imgur.com", "hasImage": "True", "id": uid, "image_url": "",
                     "linked_submission_id": "", "num_comments": "0", "score": "1",
                     "subreddit": "pics", "title": _text(i, real), "upvote_ratio": "0.9",
                     "2_way_label": str(l2), "3_way_label": str(l3), "6_way_label": str(l6)})
    path = d / "train.tsv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, delimiter="\t", lineterminator="\n")
        w.writerow(FD.COLUMNS)
        for r in rows:
            w.writerow([r[c] for c in FD.COLUMNS])
    return path


def write_mmfakebench(d, n=N):
    """The released layout: ``d/MMFakeBench_val/source/MMFakeBench_val.json`` (``gt_answers``
    one-element lists, ``image_path`` "/real/..." / "/fake/<cls>/...") with the images under
    ``d/MMFakeBench_val/real/`` and ``fake/``. Returns the dataset folder (the ``--root``)."""
    root = d / "MMFakeBench_val"
    entries = []
    for i in range(n):
        real = i % 2 == 0
        cls = "original" if real else FINE_MMFAKEBENCH[1 + i % 3]
        rel = f"real/{i}.jpg" if real else f"fake/{cls}/{i}.jpg"
        _image(root / rel, 100 + i, real)
        entries.append({"image_path": "/" + rel, "text": _text(i, real),
                        "gt_answers": ["True" if real else "Fake"], "fake_cls": cls})
    path = root / "source" / "MMFakeBench_val.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(entries, indent=4))
    return root


WRITERS = {"fakeddit": write_fakeddit, "mmfakebench": write_mmfakebench}


def run_cli(*argv):
    """``cli.main`` in-process: (rc, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = bcli.main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()


def last_json(stdout):
    """The last stdout line as strict JSON (NaN / Infinity refused)."""
    def refuse(c):
        raise AssertionError(f"non-JSON constant {c} in the --json line")
    return json.loads(stdout.strip().splitlines()[-1], parse_constant=refuse)


# ----------------------------------------------------------------------------------------------
# End to end: train the four kinds, export, analyze.
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("source", BT.REAL_SOURCES)
def test_train_four_kinds_then_analyze(source, tmp_path):
    data = WRITERS[source](tmp_path / "data")
    dets = tmp_path / "dets"
    records, _ = BT.read_real(source, data)
    splits = BT.real_splits(records, 0)
    vocab = Vocab.build(records[i].text for i in splits["Finetune_train"])
    for kind in D.KINDS:
        rc, out, err = run_cli("train", "--detector", kind, "--data", source, "--root", data,
                               "--out", tmp_path / "runs" / kind, "--export",
                               dets / D.SHIPPED[kind], *TINY, "--no-progress", "--json",
                               "--eval-n", 8 if kind in EVAL_KINDS else 0)
        assert rc == 0, err
        res = last_json(out)
        assert res["steps_done"] == 2 and np.isfinite(res["last"]["loss"])
        assert res["last"]["ground_loss"] == 0.0  # no grounding loss on real data
        assert res["data"]["fingerprint"] == BT.fingerprint(records)
        assert res["data"]["splits"]["Finetune_train"] == len(splits["Finetune_train"]) > 0
        if kind in EVAL_KINDS:  # on the Finetune_valid sample (one: 10% of the 40%)
            assert len(splits["Finetune_valid"]) == 1
            assert set(res["eval"]) == {"overall", "real", "fake"}
            assert res["eval"]["overall"] in (0.0, 1.0)
        else:
            assert res["eval"] is None
        doc = json.loads((dets / D.SHIPPED[kind] / "config.json").read_text())
        # The export carries the vocabulary of the Finetune_train texts and fits it.
        assert tuple(doc["vocab"]) == vocab.words
        assert doc["detector"]["vocab_size"] == len(vocab) and doc["detector"]["kind"] == kind
        assert doc["train"]["data"] == source and doc["data"]["split_seed"] == 0
        assert D.load_detector(dets / D.SHIPPED[kind])[2].max_tokens == 8
    analysis = tmp_path / "analysis"
    rc, out, err = run_cli("analyze", "--data", source, "--root", data, "--detectors-root",
                           dets, "--json", "--quiet", "--out", analysis)
    assert rc == 0, err
    line = last_json(out)
    assert set(VIEWS) <= set(line)  # (+ the other view variant's benefit / causal / ensemble)
    for v in line:
        s = line[v]
        assert set(s) == {"accuracy", "macro_f1", "proportions"}
        # Real data has no bias labels: proportions only, their shares summing to 1.
        assert s["accuracy"] is None and s["macro_f1"] is None
        assert set(s["proportions"]) == set(TYPES)
        shares = [s["proportions"][t][0] for t in TYPES]
        assert all(0 <= x <= 1 for x in shares) and sum(shares) == pytest.approx(1.0)
        assert all(s["proportions"][t][1] is None for t in TYPES)
    # The views saw the Analysis part only (the 60% the detectors did not fine-tune on).
    full = json.loads((analysis / "results.json").read_text())
    assert full["n"] == len(splits["Analysis_train"]) == N - len(splits["Finetune_train"]) \
        - len(splits["Finetune_valid"])
    assert (analysis / "venn.png").stat().st_size > 0
    # --n keeps the first N analysis samples; --image-dir finds images moved since training
    moved = tmp_path / "moved"
    moved.mkdir()
    for sub in (["images"] if source == "fakeddit" else ["real", "fake"]):
        (data.parent / sub if source == "fakeddit" else data / sub).rename(moved / sub)
    image_dir = moved / "images" if source == "fakeddit" else moved
    rc, out, err = run_cli("analyze", "--data", source, "--root", data, "--detectors-root",
                           dets, "--json", "--quiet", "--n", 3, "--out", tmp_path / "first3",
                           "--image-dir", image_dir)
    assert rc == 0, err
    assert json.loads((tmp_path / "first3" / "results.json").read_text())["n"] == 3


# ----------------------------------------------------------------------------------------------
# The pieces: analysis samples, training stream, errors.
# ----------------------------------------------------------------------------------------------
def _fake_exports(dets, vocab, fp=None, kinds=D.KINDS, split_seed=0, train=None):
    """Exports of zero-initialised tiny detectors as ``train`` would write them on real data
    (``vocab`` None: as trained on the closed world, no vocabulary; ``train``: the
    ``config.json`` "train" record, e.g. its data, root and image_dir)."""
    for kind in kinds:
        cfg = D.DetectorConfig(kind=kind, d_model=8, mlp_dim=8, n_layers=1, n_heads=2,
                               n_gates=2, max_tokens=8,
                               vocab_size=len(vocab) if vocab else D.DetectorConfig.vocab_size)
        meta = {} if vocab is None else {
            "vocab": list(vocab.words),
            "data": {"fingerprint": fp, "split_seed": split_seed}}
        if train is not None:
            meta["train"] = train
        shapes = jax.eval_shape(functools.partial(D.init_params, cfg), jax.random.key(0))
        params = jax.tree.map(lambda a: np.zeros(a.shape, a.dtype), shapes)  # no compilation
        D.export_detector(dets / D.SHIPPED[kind], params, cfg, meta)


def test_analysis_batch_uses_the_training_vocabulary_and_skips_finetune_samples(tmp_path):
    data = write_fakeddit(tmp_path / "data")
    records, _ = BT.read_real("fakeddit", data)
    # A vocabulary that differs from the one the analysed file would build by itself.
    vocab = Vocab.build([" ".join(FAKE_WORDS[:3]), "council"])
    _fake_exports(tmp_path / "dets", vocab, BT.fingerprint(records), split_seed=3)
    batch, info = BT.analysis_batch("fakeddit", data, tmp_path / "dets")
    keep = BT.real_splits(records, 3)["Analysis_train"]
    assert info.pop("ids") == [records[i].uid for i in keep]
    assert info == {"n_records": N, "n_analysed": len(keep), "left_out_finetune": N - len(keep),
                    "vocab_size": len(vocab)}
    np.testing.assert_array_equal(batch.index, [records[i].row for i in keep])
    np.testing.assert_array_equal(batch.tokens, vocab.encode_batch(
        [records[i].text for i in keep], 8))
    assert batch.tokens.max() < len(vocab) and batch.image.shape[1:] == (80, 80, 3)
    # Another file (here: the same rows less one) is analysed whole.
    lines = data.read_text().splitlines()
    other = tmp_path / "data" / "other.tsv"
    other.write_text("\n".join(lines[:-1]) + "\n")
    batch2, info2 = BT.analysis_batch("fakeddit", other, tmp_path / "dets")
    assert info2["n_analysed"] == N - 1 and info2["left_out_finetune"] == 0


def test_analysis_images_from_image_dir_or_the_detectors_export(tmp_path):
    """analyze reads the images under --image-dir, else under the --image-dir the detectors
    were trained with on the same file (their config.json "train"), else the reader's
    default."""
    data = write_mmfakebench(tmp_path / "data")  # the dataset folder
    moved = tmp_path / "moved"
    moved.mkdir()
    for sub in ("real", "fake"):
        (data / sub).rename(moved / sub)
    records, _ = BT.read_real("mmfakebench", data, moved)
    vocab = Vocab.build(r.text for r in records)
    json_file = data / "source" / "MMFakeBench_val.json"
    # Trained on the same data given as its JSON (another spelling of the same file).
    _fake_exports(tmp_path / "dets", vocab, BT.fingerprint(records),
                  train={"data": "mmfakebench", "root": str(json_file), "image_dir": str(moved)})
    batch, info = BT.analysis_batch("mmfakebench", data, tmp_path / "dets")
    assert info["n_records"] == N and info["left_out_finetune"] > 0  # same file: split applied
    assert np.abs(batch.image[0].astype(int).mean((0, 1)) - [200, 40, 40]).max() < 25  # real
    # An explicit --image-dir wins: an empty one leaves every image missing.
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="missing image"):
        BT.analysis_batch("mmfakebench", data, tmp_path / "dets", image_dir=tmp_path / "empty")
    # Another file: the export's image_dir does not apply, the default (its folder) has none.
    other = tmp_path / "other"
    (other / "source").mkdir(parents=True)
    (other / "source" / "MMFakeBench_val.json").write_bytes(json_file.read_bytes())
    with pytest.raises(ValueError, match="no usable mmfakebench samples.*missing image"):
        BT.analysis_batch("mmfakebench", other, tmp_path / "dets")
    assert BT.analysis_batch("mmfakebench", other, tmp_path / "dets", image_dir=moved)[1][
        "n_records"] == N
    # Detectors that disagree, or a recorded directory that is not one here: say so.
    train = {"data": "mmfakebench", "root": str(data), "image_dir": str(tmp_path / "empty")}
    docs = {"image": {"train": train},
            "joint": {"train": {**train, "image_dir": str(moved)}}}
    with pytest.raises(ValueError, match="different --image-dir"):
        BT.export_image_dir(docs, "mmfakebench", data, "dets")
    with pytest.raises(ValueError, match="gone, which is not a directory here; pass --image-dir"):
        BT.export_image_dir({"joint": {"train": {**train, "image_dir": "gone"}}}, "mmfakebench",
                            json_file)
    assert BT.export_image_dir({"joint": {"train": {**train, "image_dir": ""}}}, "mmfakebench",
                               data) is None
    assert BT.export_image_dir(docs, "fakeddit", data) is None  # trained on another source
    # analyze --image-dir is for real data only.
    rc, _, err = run_cli("analyze", "--image-dir", moved, "--n", 2, "--quiet")
    assert rc == 2 and "--data closed_world has none" in err


def test_analysis_refuses_detectors_without_a_real_vocabulary(tmp_path, capsys):
    data = write_mmfakebench(tmp_path / "data")
    _fake_exports(tmp_path / "dets", None)
    rc, _, err = run_cli("analyze", "--data", "mmfakebench", "--root", data,
                         "--detectors-root", tmp_path / "dets", "--quiet")
    assert rc == 2
    assert err.startswith("modality-bias analyze: error: ") and "bias_text" in err
    assert "no real-data vocabulary" in err and "Traceback" not in err
    # Different vocabularies across the text-reading detectors are refused as well.
    _fake_exports(tmp_path / "dets2", Vocab.build(["a b"]), kinds=("image", "text"))
    _fake_exports(tmp_path / "dets2", Vocab.build(["a b c"]), kinds=("joint", "lvlm"))
    with pytest.raises(ValueError, match="different vocabularies"):
        BT.analysis_batch("mmfakebench", data, tmp_path / "dets2")


def test_real_training_stream_is_a_function_of_the_step():
    n, b = 7, 3
    seen = np.concatenate([BT.real_positions(n, s, b, 5) for s in range(7)])  # 21 = 3 epochs
    for e in range(3):
        assert sorted(seen[e * n:(e + 1) * n]) == list(range(n))  # each epoch: a permutation
    np.testing.assert_array_equal(BT.real_positions(n, 4, b, 5), seen[12:15])
    assert not np.array_equal(seen[:n], np.concatenate(
        [BT.real_positions(n, s, 1, 6) for s in range(n)]))  # another seed, another order
    assert len(BT.real_positions(2, 0, 5, 0)) == 5  # batches larger than the set wrap epochs


def test_real_config_and_data_errors(tmp_path):
    data = write_fakeddit(tmp_path / "data", n=4)
    cfg = BT.TrainConfig(detector=D.DetectorConfig(kind="text"), data="fakeddit", root=data)
    assert cfg.real and not cfg.grounded and cfg.root == str(data)
    prepared = BT.prepare_real(cfg)
    assert BT.resolve_config(cfg, prepared).detector.vocab_size == len(prepared.vocab)
    assert BT.TrainConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="needs --root FILE"):
        BT.TrainConfig(data="mmfakebench")
    with pytest.raises(ValueError, match="has none"):
        BT.TrainConfig(root=str(data))
    one = tmp_path / "one"
    one.mkdir()
    with pytest.raises(ValueError, match="leave none to fine-tune on"):
        BT.prepare_real(BT.TrainConfig(data="fakeddit", root=write_fakeddit(one, n=1)))


@pytest.mark.parametrize("argv, needles", [
    (["--data", "fakeddit"], ("--data fakeddit needs --root FILE", "Fakeddit TSV")),
    (["--data", "mmfakebench"], ("--data mmfakebench needs --root FILE",)),
    (["--data", "imagenet"], ("argument --data", "'imagenet'")),
    (["--root", "ROOT"], ("--data closed_world has none",)),
    (["--data", "fakeddit", "--root", "MISSING"], ("Fakeddit TSV not found", "nope.tsv")),
    (["--data", "mmfakebench", "--root", "ROOT", "--d-model", "10"], ("multiple of n_heads",)),
])
def test_cli_train_real_data_errors(tmp_path, argv, needles):
    data = write_fakeddit(tmp_path / "data", n=2)
    subs = {"ROOT": str(data), "MISSING": str(tmp_path / "nope.tsv")}
    out = tmp_path / "run"
    rc, stdout, err = run_cli("train", "--detector", "lvlm", "--out", out,
                              *[subs.get(a, a) for a in argv], "--no-progress")
    assert rc == 2 and err.startswith("modality-bias train: error: "), err
    assert len(err.strip().splitlines()) == 1
    for needle in needles:
        assert needle in err
    assert not out.exists()  # nothing written


def test_real_data_resume_equals_uninterrupted(tmp_path):
    """On real data a resumed run sees the batches an uninterrupted one would (the stream is a
    function of the step) and ends with the same parameters; the saved config holds the
    resolved vocabulary size, so resuming with the same flags is accepted, another file not."""
    data = write_mmfakebench(tmp_path / "data")
    det = D.DetectorConfig(kind="text", d_model=16, mlp_dim=32, max_tokens=8)
    cfg = BT.TrainConfig(detector=det, data="mmfakebench", root=data, steps=4, batch_size=4,
                        warmup=1, save_every=2, log_every=2, eval_n=0)
    quiet = dict(progress=False, log=lambda *a: None)
    full = BT.train(cfg, tmp_path / "full", **quiet)
    part = BT.train(cfg, tmp_path / "part", stop_after=2, **quiet)
    assert part["steps_done"] == 2
    assert any(not np.allclose(a, b) for a, b in zip(jax.tree.leaves(part["params"]),
                                                       jax.tree.leaves(full["params"])))
    lines = []
    res = BT.train(cfg, tmp_path / "part", resume=True, progress=False,
                   log=lambda *a: lines.append(" ".join(map(str, a))))
    assert any("resumed from step 2" in line for line in lines), lines
    assert res["steps_done"] == 4
    steps = [json.loads(r)["step"] for r in
             (tmp_path / "part" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [2, 4]
    for a, b in zip(jax.tree.leaves(res["params"]), jax.tree.leaves(full["params"])):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    saved = json.loads((tmp_path / "part" / "train_config.json").read_text())
    assert saved["detector"]["vocab_size"] == 16 and saved["root"] == str(data)
    other = write_mmfakebench(tmp_path / "other", n=N - 2)
    with pytest.raises(ValueError, match=r"different from .*'root'"):
        BT.train(dataclasses.replace(cfg, root=str(other)), tmp_path / "part", resume=True,
                **quiet)
