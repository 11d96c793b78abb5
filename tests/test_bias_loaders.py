"""Real-benchmark readers on tiny fixtures in the released formats, the split protocol, the
tokenizer, and the one Batch structure shared with the closed world."""

import csv
import json

import jax
import numpy as np
import pytest
from PIL import Image

from bias_jax.data import batch as BA
from bias_jax.data import closed_world as CW
from bias_jax.data import fakeddit as FD
from bias_jax.data import mmfakebench as MM
from bias_jax.data import split as SPL
from bias_jax.data.text import PAD_ID, UNK_ID, Vocab, split_words
from mmx_base.errors import DatasetError


def _jpeg(path, color, size):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path, "JPEG", quality=95)


def _row(uid, title, l2, l3, l6, has_image="True"):
    return {"author": "someone", "clean_title": title, "created_utc": "1551641036.0",
            "domain": "i.imgur.com", "hasImage": has_image, "id": uid,
            "image_url": f"https://i.imgur.com/{uid}.jpg", "linked_submission_id": "",
            "num_comments": "2.0", "score": "12", "subreddit": "photoshopbattles",
            "title": title.upper(), "upvote_ratio": "0.84", "2_way_label": l2,
            "3_way_label": l3, "6_way_label": l6}


GOOD_FAKEDDIT = {"a1": (1, 0, 0), "b2": (0, 2, 1), "c3": (0, 1, 2), "d4": (0, 2, 4),
                 "l12": (0, 2, 5)}


def write_fakeddit(tmp_path, index_column=False):
    """A Fakeddit TSV with 5 good rows and one row for each skip reason."""
    images = tmp_path / "images"
    colors = {"a1": (255, 0, 0), "b2": (0, 0, 255), "c3": (0, 255, 0), "d4": (255, 255, 0),
              "l12": (255, 0, 255), "i9": (9, 9, 9), "j10": (10, 10, 10), "f6": (6, 6, 6)}
    for i, (uid, col) in enumerate(colors.items()):
        _jpeg(images / f"{uid}.jpg", col, (20 + 7 * i, 30 - 2 * i))
    (images / "k11.jpg").write_bytes(b"this is not a jpeg")
    rows = [
        _row("a1", "Cat saves dog from fire", "1", "0", "0"),
        _row("b2", "Moon made of cheese, NASA confirms", "0", "2", "1"),
        _row("c3", "Old photo of the 1906 earthquake", "0", "1", "2"),
        _row("d4", "Shark swims on flooded highway", "0.0", "2.0", "4.0"),
        _row("e5", "Image file is missing", "0", "2", "3"),  # missing image
        _row("f6", "Two-way label out of range", "7", "0", "0"),  # bad label
        _row("g7", "Labels disagree", "1", "2", "0"),  # bad label (inconsistent)
        _row("h8", "Label is not a number", "abc", "0", "0"),  # bad label
        _row("i9", "No image flagged", "1", "0", "0", has_image="False"),  # no image
        _row("j10", "", "1", "0", "0"),  # empty text
        _row("a1", "Duplicate of the first row", "1", "0", "0"),  # duplicate id
        _row("k11", "Corrupt image file", "0", "2", "3"),  # unreadable image
        _row("l12", 'He said "stop"\tand left', "0", "2", "5"),  # quoted title with a tab
    ]
    path = tmp_path / "multimodal_train.tsv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, delimiter="\t", lineterminator="\n")
        w.writerow(([""] if index_column else []) + list(FD.COLUMNS))
        for i, r in enumerate(rows):
            w.writerow(([str(i)] if index_column else []) + [r[c] for c in FD.COLUMNS])
        f.write("m13\tonly\tthree fields\n")  # malformed row
        f.write("\n")  # trailing blank line: ignored
    return path


def test_fakeddit_reads_good_rows_and_counts_every_skip(tmp_path):
    path = write_fakeddit(tmp_path)
    records, report = FD.read_fakeddit(path)
    assert [r.uid for r in records] == list(GOOD_FAKEDDIT)
    assert report.skipped == {"missing image": 1, "bad label": 3, "no image": 1,
                              "empty text": 1, "duplicate id": 1, "unreadable image": 1,
                              "malformed row": 1}
    assert report.n_rows == 14 and report.n_kept == 5 and report.n_skipped == 9
    assert any(":6: missing image" in e and "e5.jpg" in e for e in report.examples)
    for r in records:
        l2, _, l6 = GOOD_FAKEDDIT[r.uid]
        assert (r.label, r.fine_label) == (l2, l6)
    assert records[-1].text == 'He said "stop"\tand left'
    # 3-way as the fine label instead.
    records3, _ = FD.read_fakeddit(path, fine="3_way")
    assert [r.fine_label for r in records3] == [v[1] for v in GOOD_FAKEDDIT.values()]
    # pandas-style files with a leading unnamed index column read the same.
    other = tmp_path / "indexed"
    other.mkdir()
    indexed_path = write_fakeddit(other, index_column=True)
    assert indexed_path.read_text().startswith("\tauthor\tclean_title\t")  # pandas' header
    indexed, report2 = FD.read_fakeddit(indexed_path)
    assert [r.uid for r in indexed] == list(GOOD_FAKEDDIT) and report2.skipped == report.skipped


def test_fakeddit_written_by_pandas(tmp_path):
    """A TSV as the release wrote it, ``DataFrame.to_csv(sep="\\t")``: the unnamed index
    column, numeric labels, a title with quotes and a tab (quoted by pandas)."""
    pd = pytest.importorskip("pandas")
    rows = [_row("a1", "Cat saves dog", 1, 0, 0), _row("b2", 'He said "stop"\tand left', 0, 2, 5),
            _row("c3", "Zürich floods — again", 0.0, 1.0, 2.0)]
    for uid, col in (("a1", (1, 2, 3)), ("b2", (4, 5, 6)), ("c3", (7, 8, 9))):
        _jpeg(tmp_path / "images" / f"{uid}.jpg", col, (8, 8))
    path = tmp_path / "multimodal_validate.tsv"
    pd.DataFrame(rows, columns=list(FD.COLUMNS)).to_csv(path, sep="\t")
    assert path.read_text("utf-8").startswith("\tauthor\t")
    records, report = FD.read_fakeddit(path)
    assert [r.uid for r in records] == ["a1", "b2", "c3"] and report.n_skipped == 0
    assert [r.label for r in records] == [1, 0, 0] and [r.fine_label for r in records] == [0, 5, 2]
    assert records[1].text == 'He said "stop"\tand left'
    assert [r.row for r in records] == [2, 3, 4]


def test_fakeddit_batch(tmp_path):
    batch, vocab, _ = FD.load_fakeddit(write_fakeddit(tmp_path), image_size=32, max_len=8)
    BA.validate(batch)
    assert batch.image.shape == (5, 32, 32, 3) and batch.tokens.shape == (5, 8)
    np.testing.assert_array_equal(batch.label, [1, 0, 0, 0, 0])
    np.testing.assert_array_equal(batch.fine_label, [0, 1, 2, 4, 5])
    assert (batch.bias == -1).all() and not batch.has_gt.any() and not batch.image_core.any()
    assert not batch.text_irrelevant.any() and not batch.image_irrelevant.any()
    np.testing.assert_array_equal(batch.index, [2, 3, 4, 5, 14])  # TSV line numbers
    assert vocab.decode(batch.tokens[1]) == ["moon", "made", "of", "cheese", ",", "nasa",
                                             "confirms"]
    # Images are decoded and resized: the first is a uniform red square.
    assert np.abs(batch.image[0].astype(int) - [255, 0, 0]).max() <= 3


def test_fakeddit_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.tsv"):
        FD.read_fakeddit(tmp_path / "nope.tsv")
    path = write_fakeddit(tmp_path)
    with pytest.raises(FileNotFoundError, match="image directory not found"):
        FD.read_fakeddit(path, tmp_path / "no_images")
    with pytest.raises(ValueError, match="fine must be"):
        FD.read_fakeddit(path, fine="4_way")
    lines = path.read_text().splitlines()
    bad = tmp_path / "bad.tsv"
    bad.write_text("\n".join([lines[0].replace("6_way_label", "six")] + lines[1:]))
    with pytest.raises(ValueError, match=r"bad.tsv: header lacks column\(s\) 6_way_label"):
        FD.read_fakeddit(bad)
    empty = tmp_path / "empty.tsv"
    empty.write_text("")
    with pytest.raises(ValueError, match="empty file"):
        FD.read_fakeddit(empty)


def write_mmfakebench(tmp_path, indent=None):
    """An MMFakeBench dataset in the released layout, ``<tmp>/MMFakeBench_val/`` holding
    ``source/MMFakeBench_val.json`` (``image_path`` relative to the dataset folder, with the
    release's leading "/", ``gt_answers`` one-element lists) and the images under ``real/`` and
    ``fake/``: 5 good entries and one for each skip reason. Returns the dataset folder."""
    root = tmp_path / "MMFakeBench_val"
    _jpeg(root / "real" / "0.jpg", (200, 10, 10), (40, 30))
    _jpeg(root / "fake" / "fever_AI_val_100" / "fever_dalle_val_1.jpg", (10, 200, 10), (25, 25))
    _jpeg(root / "fake" / "image" / "2.jpg", (10, 10, 200), (31, 17))
    _jpeg(root / "fake" / "mix" / "3.jpg", (100, 100, 100), (16, 48))
    _jpeg(root / "real" / "5.jpg", (50, 60, 70), (20, 20))
    entries = [
        {"image_path": "/real/0.jpg", "text": "A protest in the city centre.",
         "gt_answers": ["True"], "fake_cls": "original"},
        {"image_path": "/fake/fever_AI_val_100/fever_dalle_val_1.jpg",
         "text": "Aliens landed at the White House.", "gt_answers": ["Fake"],
         "fake_cls": "textual_veracity_distortion"},
        {"image_path": "/fake/image/2.jpg", "text": "The mayor opens a bridge.",
         "gt_answers": ["Fake"], "fake_cls": "visual_veracity_distortion", "extra": 1},
        {"image_path": "fake/mix/3.jpg", "text": "Floods hit the desert town.",
         "gt_answers": "fake", "fake_cls": "mismatch"},  # a plain string, no leading "/"
        {"image_path": "/real/0.jpg", "text": "x", "gt_answers": ["Fake"],
         "fake_cls": "deepfake"},  # bad label
        {"image_path": "/real/0.jpg", "text": "x", "gt_answers": ["Fake"],
         "fake_cls": "original"},  # bad label (inconsistent)
        {"image_path": "/real/0.jpg", "gt_answers": ["True"], "fake_cls": "original"},  # malformed
        "not an object",  # malformed
        {"image_path": "/real/missing.jpg", "text": "x", "gt_answers": ["True"],
         "fake_cls": "original"},  # missing image
        {"image_path": "/real/0.jpg", "text": "x", "gt_answers": ["maybe"],
         "fake_cls": "original"},  # bad label
        {"image_path": "/real/0.jpg", "text": "  ", "gt_answers": ["True"],
         "fake_cls": "original"},  # empty text
        {"image_path": "/real/0.jpg", "text": "Same image, another text.", "gt_answers": ["True"],
         "fake_cls": "original"},  # duplicate id
        {"image_path": "/real/0.jpg", "text": "x", "gt_answers": ["True", "Fake"],
         "fake_cls": "original"},  # malformed (two answers)
        {"image_path": "/real/5.jpg", "text": "Le maire inaugure un pont à Zürich.",
         "gt_answers": ["True"], "fake_cls": "original"},
    ]
    path = root / "source" / "MMFakeBench_val.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(entries, indent=indent, ensure_ascii=False), encoding="utf-8")
    return root


MM_GOOD = [0, 1, 2, 3, 13]  # list indices of the good entries


def test_mmfakebench_reads_the_released_layout_and_counts_every_skip(tmp_path):
    root = write_mmfakebench(tmp_path)
    entries = json.loads((root / "source" / "MMFakeBench_val.json").read_text("utf-8"))
    records, report = MM.read_mmfakebench(root)
    assert [r.row for r in records] == MM_GOOD
    # The id is image_path as written (leading "/" and all); images under the dataset folder.
    assert [r.uid for r in records] == [entries[i]["image_path"] for i in MM_GOOD]
    assert records[1].image_path == str(root / "fake" / "fever_AI_val_100"
                                        / "fever_dalle_val_1.jpg")
    assert [r.label for r in records] == [1, 0, 0, 0, 1]
    assert [r.fine_label for r in records] == [0, 1, 2, 3, 0]
    assert report.skipped == {"bad label": 3, "malformed row": 3, "missing image": 1,
                              "empty text": 1, "duplicate id": 1}
    assert report.n_rows == 14 and report.n_kept == 5
    assert any("[8]: missing image" in e for e in report.examples)
    assert any("[11]: duplicate id" in e and "/real/0.jpg" in e for e in report.examples)
    # The JSON itself as the root reads the same (images above source/).
    again, report2 = MM.read_mmfakebench(root / "source" / "MMFakeBench_val.json")
    assert again == records and report2.skipped == report.skipped
    batch, vocab, _ = MM.load_mmfakebench(root, image_size=(24, 40), max_len=6)
    BA.validate(batch)
    assert batch.image.shape == (5, 24, 40, 3) and batch.tokens.shape == (5, 6)
    assert vocab.decode(batch.tokens[1]) == ["aliens", "landed", "at", "the", "white", "house"]
    assert np.abs(batch.image[2].astype(int) - [10, 10, 200]).max() <= 3


def test_mmfakebench_image_root_override_and_json_outside_source(tmp_path):
    root = write_mmfakebench(tmp_path)
    # --image-dir elsewhere: the same relative paths under it.
    moved = tmp_path / "moved"
    moved.mkdir()
    (root / "real").rename(moved / "real")
    (root / "fake").rename(moved / "fake")
    # (7 missing: the 5 good, the missing one, and the repeated id, unclaimed now)
    assert MM.read_mmfakebench(root)[1].skipped == {"missing image": 7, "bad label": 3,
                                                     "malformed row": 3, "empty text": 1}
    records, _ = MM.read_mmfakebench(root, moved)
    assert [r.row for r in records] == MM_GOOD
    assert records[0].image_path == str(moved / "real" / "0.jpg")
    # A JSON in a folder not named source/: images resolve against the JSON's own folder.
    flat = moved / "val.json"
    flat.write_bytes((root / "source" / "MMFakeBench_val.json").read_bytes())
    assert MM.locate(flat) == (str(flat), str(moved))
    assert [r.row for r in MM.read_mmfakebench(flat)[0]] == MM_GOOD


def test_mmfakebench_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.json"):
        MM.read_mmfakebench(tmp_path / "missing.json")
    root = write_mmfakebench(tmp_path)
    with pytest.raises(FileNotFoundError, match="image root directory not found"):
        MM.read_mmfakebench(root, tmp_path / "nowhere")
    # A dataset folder needs exactly one source/*.json; the error names what it found.
    with pytest.raises(DatasetError, match=r"found 0 \(it holds fake, real, source\)"):
        (root / "source" / "MMFakeBench_val.json").rename(tmp_path / "aside.json")
        MM.read_mmfakebench(root)
    (tmp_path / "aside.json").rename(root / "source" / "MMFakeBench_val.json")
    (root / "source" / "MMFakeBench_test.json").write_text("[]")
    with pytest.raises(DatasetError, match=r"found 2 \(several: MMFakeBench_test.json, "
                                           r"MMFakeBench_val.json\).*JSON file itself"):
        MM.read_mmfakebench(root)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DatasetError, match="empty: .*found 0 \\(it is empty\\)"):
        MM.locate(empty)
    obj = tmp_path / "obj.json"
    obj.write_text('{"image_path": "a.jpg"}')
    with pytest.raises(ValueError, match="obj.json: expected a JSON list"):
        MM.read_mmfakebench(obj, tmp_path)
    broken = tmp_path / "broken.json"
    broken.write_text("[{")
    with pytest.raises(ValueError, match="broken.json: not valid JSON"):
        MM.read_mmfakebench(broken, tmp_path)
    only_bad = tmp_path / "only_bad.json"
    only_bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="no usable entries"):
        MM.load_mmfakebench(only_bad, tmp_path)


def test_every_source_produces_the_same_batch_structure(tmp_path):
    fd, _, _ = FD.load_fakeddit(write_fakeddit(tmp_path), image_size=80, max_len=12)
    mm, _, _ = MM.load_mmfakebench(write_mmfakebench(tmp_path), image_size=80, max_len=12)
    cw = CW.load_closed_world(CW.WorldSpec(), seed=0, n=4)
    assert jax.tree.structure(fd) == jax.tree.structure(mm) == jax.tree.structure(cw)
    for a, b, c in zip(*(jax.tree.leaves(BA.validate(x)) for x in (fd, mm, cw))):
        assert a.dtype == b.dtype == c.dtype and a.shape[1:] == b.shape[1:] == c.shape[1:]
    both = BA.concat([fd, mm, cw])
    assert both.size == 14 and set(np.unique(both.bias)) <= {-1, 0, 1, 2}
    assert BA.take(both, [0, 13]).size == 2
    with pytest.raises(ValueError, match="Batch.label"):
        BA.validate(BA.Batch(**{**{f: getattr(fd, f) for f in BA.FIELDS},
                              "label": fd.label.astype(np.int64)}))


# ----------------------------------------------------------------------------------------------
def test_split_protocol_40_60_disjoint_seeded():
    ft, an = SPL.finetune_analysis_split(1000, seed=0)
    assert len(ft) == 400 and len(an) == 600
    assert not set(ft) & set(an) and set(ft) | set(an) == set(range(1000))
    np.testing.assert_array_equal(ft, SPL.finetune_analysis_split(1000, seed=0)[0])
    assert not np.array_equal(ft, SPL.finetune_analysis_split(1000, seed=1)[0])
    assert len(SPL.finetune_analysis_split(7, seed=0)[0]) == 3  # round(2.8)
    # Stratified: each class gets its 40% (largest remainder), the total stays round(0.4 n).
    labels = np.r_[np.ones(301, int), np.zeros(702, int)]
    ft, an = SPL.finetune_analysis_split(1003, seed=5, labels=labels)
    assert len(ft) == 401 and abs(labels[ft].sum() - 0.4 * 301) < 1
    assert abs((1 - labels[ft]).sum() - 0.4 * 702) < 1
    splits = SPL.paper_splits(1003, 200, 300, seed=5, labels=labels)
    assert tuple(splits) == SPL.SPLIT_NAMES
    f_tr, f_va, a_tr = splits["Finetune_train"], splits["Finetune_valid"], splits["Analysis_train"]
    assert len(f_va) == 40 and len(f_tr) == 361 and len(a_tr) == 602
    assert set(f_tr) | set(f_va) == set(ft) and not set(f_tr) & set(f_va)
    np.testing.assert_array_equal(a_tr, an)
    np.testing.assert_array_equal(splits["Analysis_valid"], np.arange(200))
    np.testing.assert_array_equal(splits["Analysis_test"], np.arange(300))
    again = SPL.paper_splits(1003, 200, 300, seed=5, labels=labels)
    assert all(np.array_equal(splits[k], again[k]) for k in splits)
    for bad in (dict(frac=1.5), dict(labels=np.zeros(3))):
        with pytest.raises(ValueError):
            SPL.finetune_analysis_split(10, seed=0, **bad)
    with pytest.raises(ValueError, match="Train set is empty"):
        SPL.paper_splits(0, seed=0)


def test_split_then_vocabulary_from_finetune_texts(tmp_path):
    records, _ = FD.read_fakeddit(write_fakeddit(tmp_path))
    s = SPL.paper_splits(len(records), seed=0, labels=[r.label for r in records],
                        finetune_valid_frac=0.0)
    assert len(s["Finetune_train"]) == 2 and len(s["Analysis_train"]) == 3
    vocab = Vocab.build(records[i].text for i in s["Finetune_train"])
    analysis = BA.records_to_batch([records[i] for i in s["Analysis_train"]], vocab,
                                  image_size=16, max_len=10)
    seen = {w for i in s["Finetune_train"] for w in split_words(records[i].text)}
    for row, i in zip(analysis.tokens, s["Analysis_train"]):
        words = split_words(records[i].text)[:10]
        expect = [vocab.index[w] if w in seen else UNK_ID for w in words]
        np.testing.assert_array_equal(row[: len(words)], expect)


def test_tokenizer():
    assert split_words("Don't PANIC! 3 cats, 2 dogs") == ["don't", "panic", "!", "3", "cats",
                                                          ",", "2", "dogs"]
    v = Vocab.build(["b a b", "c b a", "z"], min_count=2)
    assert v.words == ("<pad>", "<unk>", "b", "a")
    assert Vocab.build(["c b a b a b"]).words == Vocab.build(["b a b c a b"]).words
    assert len(Vocab.build(["a b c d"], max_size=4)) == 4
    np.testing.assert_array_equal(v.encode("a q b", 5), [3, UNK_ID, 2, PAD_ID, PAD_ID])
    np.testing.assert_array_equal(v.encode("a b a b a b", 3), [3, 2, 3])
    assert v.decode(v.encode("b a", 4)) == ["b", "a"]
    assert Vocab.from_json(v.to_json()) == v
    with pytest.raises(ValueError):
        Vocab(("a", "b"))
    with pytest.raises(ValueError, match="outside vocabulary"):
        v.decode([7])
    # The closed world's claims use the same tokenizer.
    assert CW.CLAIM_VOCAB.decode(CW.CLAIM_VOCAB.encode("The red circle is left of the blue "
                                                     "square", 12))[-3:] == ["the", "blue",
                                                                             "square"]
