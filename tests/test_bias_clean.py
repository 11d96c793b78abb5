"""``modality-bias clean``: a benchmark cut down to the samples of the kept bias types, in its own
format. Fakeddit rows are compared with the input's lines byte for byte, MMFakeBench records as
JSON values (and as bytes where the input is what ``json.dumps`` writes); the labels come from
``labels_table``, the writer of ``analyze --out DIR/labels.csv``."""

import contextlib
import io
import json
import types

import numpy as np
import pytest

from bias_jax import labels_table as LT
from bias_jax.data import clean as CL
from bias_jax.data import fakeddit as FD
from bias_jax.data import mmfakebench as MM
from bias_jax.data.batch import BIAS_TYPES
from mmx_base.errors import InputError
from reproduction.cli import bias as bcli
from test_bias_loaders import MM_GOOD, write_mmfakebench

CODE = {t: i for i, t in enumerate(BIAS_TYPES)}


def labels_csv(path, labels: dict, benefit: dict | None = None):
    """``labels.csv`` as ``analyze --out`` writes it (``labels_table``): ``labels`` id -> the
    ensemble's type; each view says ``benefit``'s type (default: the ensemble's)."""
    ids = list(labels)
    benefit = benefit or labels
    view = types.SimpleNamespace(label=np.array([CODE[benefit[i]] for i in ids]),
                                 score=np.linspace(-1, 1, len(ids)))
    rows = LT.labels_rows(ids, {"benefit": view, "flow": view, "causal": view},
                          np.array([CODE[labels[i]] for i in ids]))
    path.write_text(LT.to_csv(rows), encoding="utf-8")
    return path


def _fields(uid, title, l2="0", l3="2", l6="5"):
    """One Fakeddit data row as pandas writes it (leading index), fields in FD.COLUMNS order."""
    row = {c: "x" for c in FD.COLUMNS}
    row.update({"clean_title": title, "hasImage": "True", "id": uid, "2_way_label": l2,
                "3_way_label": l3, "6_way_label": l6, "linked_submission_id": ""})
    return "\t".join(row[c] for c in FD.COLUMNS)


# The raw lines of a pandas-written Fakeddit TSV, written verbatim (no csv module on this side):
# a quoted title with a tab and doubled quotes, a quoted newline, tab-free unicode, a CRLF line,
# a blank line, rows the reader skips, and a last line without a terminator.
HEADER = "\t" + "\t".join(FD.COLUMNS) + "\n"
RAW = [
    ("a1", "0\t" + _fields("a1", "Cat saves dog", "1", "0", "0") + "\n"),
    ("b2", "1\t" + _fields("b2", '"He said ""stop""\tand left"') + "\n"),
    ("c3", "2\t" + _fields("c3", "Zürich floods — 東京 café") + "\n"),
    ("d4", "3\t" + _fields("d4", '"line one\nline two"') + "\n"),
    ("e5", "4\t" + _fields("e5", "Windows line ending") + "\r\n"),
    (None, "\n"),  # blank: not a row
    ("f6", "5\t" + _fields("f6", "bad label", "7") + "\n"),  # skipped by the reader
    ("a1", "6\t" + _fields("a1", "a repeated id") + "\n"),  # skipped: duplicate id
    ("h8", "7\t" + _fields("h8", "no final newline")),
]
TSV_LABELS = {"c3": "balance", "a1": "balance", "b2": "uni_text", "e5": "uni_image",
              "h8": "balance", "d4": "balance", "zz": "balance", "f6": "balance"}


def write_tsv(tmp_path):
    path = tmp_path / "multimodal_train.tsv"
    path.write_bytes((HEADER + "".join(raw for _, raw in RAW)).encode("utf-8"))
    return path


def test_fakeddit_rows_are_copied_byte_for_byte_in_file_order(tmp_path):
    path = write_tsv(tmp_path)
    records, _ = FD.read_fakeddit(path, images=False)
    assert [r.uid for r in records] == ["a1", "b2", "c3", "d4", "e5", "h8"]
    assert records[1].text == 'He said "stop"\tand left' and records[3].text == "line one\nline two"
    labels = CL.read_labels(labels_csv(tmp_path / "labels.csv", TSV_LABELS))
    text, summary = CL.clean("fakeddit", path, labels, ["balance"])
    # Expected: the header and the first row of each balance id, selected on the raw lines.
    expect = HEADER + RAW[0][1] + RAW[2][1] + RAW[3][1] + RAW[8][1]
    assert text.encode("utf-8") == expect.encode("utf-8")
    assert summary["rows_in"] == 8 and summary["samples"] == 6  # the blank line is no row
    assert summary["labelled"] == 6 and summary["kept"] == {"balance": 4}
    assert summary["n_kept"] == 4 and summary["dropped"] == {"uni_image": 1, "uni_text": 1}
    assert summary["left_out_unlabelled"] == 2  # the bad label and the repeated id
    assert summary["not_samples"] == {"bad label": 1, "duplicate id": 1}
    assert summary["unknown_ids"] == 2 and summary["unknown_examples"] == ["zz", "f6"]
    # Two kept types; the output reads back as the kept samples.
    text2, summary2 = CL.clean("fakeddit", path, labels, ["uni_text", "balance"])
    assert text2 == HEADER + RAW[0][1] + RAW[1][1] + RAW[2][1] + RAW[3][1] + RAW[8][1]
    assert summary2["kept"] == {"balance": 4, "uni_text": 1}
    out = tmp_path / "clean.tsv"
    out.write_bytes(text2.encode("utf-8"))
    assert [r.uid for r in FD.read_fakeddit(out, images=False)[0]] == ["a1", "b2", "c3", "d4",
                                                                       "h8"]


def test_mmfakebench_records_unchanged_in_file_order(tmp_path):
    root = write_mmfakebench(tmp_path, indent=4)
    src = root / "source" / "MMFakeBench_val.json"
    entries = json.loads(src.read_text("utf-8"))
    ids = [entries[i]["image_path"] for i in MM_GOOD]
    # Labels in another order than the file's; entry 13 holds non-ASCII text.
    labels = {ids[4]: "balance", ids[2]: "uni_image", ids[0]: "balance", ids[1]: "uni_text",
              ids[3]: "balance"}
    text, summary = CL.clean("mmfakebench", root, labels, ["balance"])
    kept = [entries[i] for i in (0, 3, 13)]
    out = json.loads(text)
    assert out == kept and [list(r) for r in out] == [list(r) for r in kept]  # key order too
    # The input is json.dumps(indent=4, ensure_ascii=False): the output is written the same way,
    # so each kept record's bytes are the input's.
    assert text == json.dumps(kept, indent=4, ensure_ascii=False)
    for rec in kept:
        piece = json.dumps(rec, indent=4, ensure_ascii=False).replace("\n", "\n    ")
        assert piece in src.read_text("utf-8") and piece in text
    assert "Zürich" in text
    # clean looks at no image: the entry whose image is missing counts as a sample here
    assert summary["rows_in"] == 14 and summary["samples"] == 6 and summary["labelled"] == 5
    assert summary["kept"] == {"balance": 3} and summary["left_out_unlabelled"] == 9
    assert summary["unknown_ids"] == 0
    # Read back with the images of the original dataset folder.
    (tmp_path / "clean.json").write_text(text, "utf-8")
    back, _ = MM.read_mmfakebench(tmp_path / "clean.json", root)
    assert [r.uid for r in back] == [ids[0], ids[3], ids[4]]


@pytest.mark.parametrize("style", [dict(), dict(indent=2), dict(ensure_ascii=True),
                                   dict(separators=(",", ":")), dict(indent="\t")])
def test_json_written_in_the_inputs_style(tmp_path, style):
    data = [{"image_path": "/real/a.jpg", "text": "café à Zürich", "n": 1.5},
            {"image_path": "/fake/b.jpg", "text": "b", "gt_answers": ["Fake"]}]
    text = json.dumps(data, **style) + "\n"
    got = CL.json_style(text, data)
    assert got.pop("newline") is True
    assert json.dumps(data[:1], **got) == json.dumps(data[:1], **style)


def test_json_style_falls_back_to_the_first_records_indent():
    data = [{"a": 1}, {"b": 2}]
    text = '[\n   {"a" : 1},\n   {"b": 2}\n]'  # no json.dumps style writes this
    assert CL.json_style(text, data) == {"indent": 3, "ensure_ascii": False, "separators": None,
                                         "newline": False}
    assert CL.json_style('[{"a" :1}]', data[:1])["indent"] is None


def test_labels_file_errors_name_the_problem(tmp_path):
    with pytest.raises(InputError, match="labels file not found"):
        CL.read_labels(tmp_path / "nope.csv")
    bad = tmp_path / "bad.csv"
    bad.write_text("id,ensemble\na1,balance\nb2,mixed\n")
    with pytest.raises(InputError, match=r"bad.csv:3: column 'ensemble' holds 'mixed'"):
        CL.read_labels(bad)
    bad.write_text("id,ensemble\na1,balance\na1,uni_text\n")
    with pytest.raises(InputError, match=r"bad.csv:3: id 'a1' is labelled twice \(first on line 2"):
        CL.read_labels(bad)
    bad.write_text("id,bias\na1,balance\n")
    with pytest.raises(InputError, match=r"header lacks column\(s\) ensemble \(found: id, bias\)"):
        CL.read_labels(bad)
    bad.write_text("\ufeffid,ensemble,flow\na1,balance,uni_text\n")  # a BOM is fine
    assert CL.read_labels(bad) == {"a1": "balance"}
    assert CL.read_labels(bad, by="flow") == {"a1": "uni_text"}
    with pytest.raises(InputError, match="no labelled sample"):
        bad.write_text("id,ensemble\n")
        CL.read_labels(bad)
    with pytest.raises(InputError, match="--keep mixed"):
        CL.clean("fakeddit", write_tsv(tmp_path), {"a1": "balance"}, ["mixed"])
    with pytest.raises(InputError, match=r"none of the 1 labelled ids names a sample.*'nope'.*"
                                         r"'a1'"):
        CL.clean("fakeddit", write_tsv(tmp_path), {"nope": "balance"}, ["balance"])


def test_labels_columns_match_the_writer():
    assert {"id", *CL.BY_COLUMNS} <= set(LT.COLUMNS)


def run_cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = bcli.main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()


def test_cli_clean_end_to_end(tmp_path):
    data = write_tsv(tmp_path)
    (tmp_path / "analysis").mkdir()
    labels = labels_csv(tmp_path / "analysis" / "labels.csv", TSV_LABELS,
                        benefit={**TSV_LABELS, "a1": "uni_text", "b2": "balance"})
    out = tmp_path / "clean" / "train_balanced.tsv"
    args = ["clean", "--data", "fakeddit", "--root", data, "--labels", labels,
            "--keep", "balance", "--out", out]
    rc, stdout, err = run_cli(*args, "--json")
    assert rc == 0, err
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["n_kept"] == 4 and summary["out"] == str(out) and summary["by"] == "ensemble"
    assert out.read_bytes() == (HEADER + RAW[0][1] + RAW[2][1] + RAW[3][1] + RAW[8][1]).encode()
    assert "2 of 8 labelled ids name no sample" in err and "zz, f6" in err
    assert not [p for p in out.parent.iterdir() if p != out]  # no temporary file left
    # An existing --out is refused without --overwrite, and left as it was.
    out.write_text("keep me")
    rc, _, err = run_cli(*args, "--by", "benefit", "--keep", "uni_text")
    assert rc == 2 and err.startswith("modality-bias clean: error: ") and str(out) in err
    assert "--overwrite" in err and out.read_text() == "keep me"
    rc, stdout, err = run_cli(*args, "--by", "benefit", "--keep", "uni_text", "--overwrite")
    assert rc == 0, err
    # by benefit a1 is uni_text and b2 balance
    assert out.read_text("utf-8") == HEADER + "".join(RAW[i][1] for i in (0, 1, 2, 3, 8))
    assert "kept 5 (balance 4, uni_text 1)" in stdout
    assert "left out: 2 unlabelled, 1 of the other types (uni_image 1)" in stdout
    # The benchmark itself is never the output.
    rc, _, err = run_cli(*args[:-1], data, "--overwrite")
    assert rc == 2 and "is the benchmark itself" in err
    assert data.read_bytes() == (HEADER + "".join(r for _, r in RAW)).encode()
    # An unknown --keep type is a usage error.
    rc, _, err = run_cli(*args[:-4], "--keep", "mixed", "--out", tmp_path / "x.tsv")
    assert rc == 2 and "invalid choice: 'mixed'" in err and not (tmp_path / "x.tsv").exists()


def test_cli_clean_mmfakebench_dataset_folder(tmp_path):
    root = write_mmfakebench(tmp_path)
    entries = json.loads((root / "source" / "MMFakeBench_val.json").read_text("utf-8"))
    ids = [entries[i]["image_path"] for i in MM_GOOD]
    labels = labels_csv(tmp_path / "labels.csv", dict(zip(ids, ["balance", "uni_text",
                                                                "balance", "uni_image",
                                                                "uni_text"])))
    out = tmp_path / "MMFakeBench_val_balanced.json"
    rc, stdout, err = run_cli("clean", "--data", "mmfakebench", "--root", root, "--labels",
                              labels, "--keep", "balance", "--out", out, "--json")
    assert rc == 0, err
    assert json.loads(out.read_text("utf-8")) == [entries[0], entries[2]]
    assert out.read_text("utf-8") == json.dumps([entries[0], entries[2]], ensure_ascii=False)
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["data"] == str(root / "source" / "MMFakeBench_val.json")
    assert summary["kept"] == {"balance": 2} and summary["labelled"] == 5
