"""Human bias labels (``bias_jax.data.human_labels``), scoring against a labelled subset
(``analysis.analyze``), the per-sample table (``bias_jax.labels_table``) and their CLI:
``modality-bias analyze --labels FILE --out DIR`` (``DIR/labels.csv``)."""

import csv
import itertools
import json
import math

import numpy as np
import pytest

from bias_jax import analysis as AN
from bias_jax import ensemble as EN
from bias_jax import labels_table as LT
from bias_jax import scoring
from bias_jax import views as VW
from bias_jax.data import human_labels as HL
from bias_jax.data.batch import BIAS_TYPES, Batch
from bias_jax.views.common import ViewResult
from mmx_base.errors import InputError

SCORE_HEADER = ["id", "annotator", "q1_uni_image", "q2_uni_text", "q3_balance"]


def write_csv(path, header, rows):
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


def alpha_interval_by_hand(table) -> float:
    """Krippendorff's alpha, interval level, from its definition (Krippendorff 2011):
    ``1 - D_o / D_e`` with the squared difference as the metric; only units with two or more
    ratings count (``n`` pairable values); ``D_o = 1/n sum_u 1/(m_u - 1) sum_{i != j in u}
    (v_i - v_j)^2``, ``D_e = 1/(n (n - 1)) sum_{i != j over all pairable values} (v_i -
    v_j)^2``."""
    units = [[v for v in col if not math.isnan(v)] for col in np.asarray(table, float).T]
    units = [u for u in units if len(u) > 1]
    values = [v for u in units for v in u]
    n = len(values)
    d_o = sum(sum((a - b) ** 2 for a, b in itertools.permutations(u, 2)) / (len(u) - 1)
              for u in units) / n
    d_e = sum((a - b) ** 2 for a, b in itertools.permutations(values, 2)) / (n * (n - 1))
    return 1 - d_o / d_e


# ----------------------------------------------------------------------------------------------
# Reading the two forms.
# ----------------------------------------------------------------------------------------------
def test_bias_form_reads_types_in_file_order(tmp_path):
    path = write_csv(tmp_path / "l.csv", ["note", "id", "bias"],
                     [["x", "b7", "uni_text"], ["", " a1 ", "balance"], ["y", "c3", "uni_image"]])
    lab = HL.read_labels(path)
    assert lab.ids == ("b7", "a1", "c3") and lab.form == "bias" and lab.n_annotators == 1
    np.testing.assert_array_equal(lab.bias, [2, 1, 0])
    assert lab.annotator_alpha is None and lab.bias.dtype == np.int32


def test_scores_form_averages_annotators_then_takes_the_argmax(tmp_path):
    rows = [  # id, annotator, q1 (image), q2 (text), q3 (balance)
        ("s1", "A", 5, 1, 2), ("s1", "B", 3, 1, 4), ("s1", "C", 4, 0, 1),  # means 4, 2/3, 7/3
        ("s2", "A", 0, 5, 1), ("s2", "B", 1, 4, 1),  # rated by two only: text 4.5
        ("s3", "A", 1, 1, 5), ("s3", "B", 2, 2, 4), ("s3", "C", 0, 0, 3),  # balance
        # ties for the highest mean -> balance: image vs text, image vs balance, all three
        ("t_it", "A", 4, 3, 1), ("t_it", "B", 2, 3, 1),  # image 3, text 3, balance 1
        ("t_ib", "A", 3.5, 0, 3.5),
        ("t_all", "A", 2, 2, 2),
    ]
    path = write_csv(tmp_path / "s.csv", SCORE_HEADER, rows)
    lab = HL.read_labels(path)
    assert lab.form == "scores" and lab.n_annotators == 3
    assert lab.ids == ("s1", "s2", "s3", "t_it", "t_ib", "t_all")
    assert [BIAS_TYPES[c] for c in lab.bias] == ["uni_image", "uni_text", "balance",
                                                 "balance", "balance", "balance"]
    # mean_scores in BIAS_TYPES order (image, balance, text), over the annotators who rated
    np.testing.assert_allclose(lab.mean_scores[0], [4, 7 / 3, 2 / 3])
    np.testing.assert_allclose(lab.mean_scores[1], [0.5, 1, 4.5])
    # a tie within float noise of the averaging is still a tie
    np.testing.assert_array_equal(HL.argmax_type([[0.1 + 0.2, 0.3, 0.0], [1, 0, 1 - 1e-6]]),
                                  [1, 0])


def test_annotator_alpha_per_question_matches_a_hand_computation(tmp_path):
    # Two annotators, three samples, question 1 ratings [1, 2, 3] and [1, 2, 4]: n = 6
    # values, D_o = 2 / 6, D_e = 82 / 30, alpha = 1 - 10 / 82 = 36 / 41.
    assert alpha_interval_by_hand([[1, 2, 3], [1, 2, 4]]) == pytest.approx(36 / 41)
    rng = np.random.default_rng(3)
    a, m = 3, 7
    r = rng.integers(0, 6, (a, m, 3)).astype(float)
    r[..., 0] = np.clip(rng.integers(0, 6, m) + rng.integers(-1, 2, (a, m)), 0, 5)  # agreeing
    r[2, 4] = np.nan  # annotator C skipped sample 4
    rows = [(f"id{j}", "ABC"[i], *(int(x) for x in r[i, j][[0, 2, 1]]))
            for i in range(a) for j in range(m) if not np.isnan(r[i, j, 0])]
    # the file's columns are q1 image, q2 text, q3 balance; r is in BIAS_TYPES order
    lab = HL.read_labels(write_csv(tmp_path / "s.csv", SCORE_HEADER, rows))
    assert lab.n_annotators == 3 and set(lab.annotator_alpha) == set(BIAS_TYPES)
    for k, t in enumerate(BIAS_TYPES):
        assert lab.annotator_alpha[t] == pytest.approx(alpha_interval_by_hand(r[:, :, k]))
    hand = alpha_interval_by_hand(r[:, :, 0])
    assert hand > 0.5 and HL.ALPHA_LEVEL == "interval"
    tiny = HL.read_labels(write_csv(tmp_path / "t.csv", SCORE_HEADER, [
        ("u1", "A", 1, 0, 0), ("u2", "A", 2, 0, 0), ("u3", "A", 3, 0, 0),
        ("u1", "B", 1, 0, 0), ("u2", "B", 2, 0, 0), ("u3", "B", 4, 0, 0)]))
    assert tiny.annotator_alpha["uni_image"] == pytest.approx(36 / 41)
    # a question rated 0 everywhere has no variation: alpha undefined (None in the JSON)
    assert math.isnan(tiny.annotator_alpha["uni_text"])
    summ = HL.summary(tiny, {"n_labels": 3})
    assert summ["annotator_alpha"] == {"uni_image": pytest.approx(36 / 41), "balance": None,
                                       "uni_text": None}
    assert summ["annotator_alpha_level"] == "interval" and summ["n_annotators"] == 2
    json.dumps(summ, allow_nan=False)
    one = HL.read_labels(write_csv(tmp_path / "one.csv", SCORE_HEADER, [("u1", "A", 1, 2, 3)]))
    assert one.annotator_alpha is None and one.n_annotators == 1


@pytest.mark.parametrize("header, rows, match", [
    (["id", "bias"], [["a", "balance"], ["b", "uni_image"], ["a", "uni_text"]],
     r"line 4, column 'id': id 'a' is labelled twice \(first on line 2\)"),
    (["id", "bias"], [["a", "Balance"]], r"line 2, column 'bias': 'Balance' is not one of"),
    (["id", "bias"], [["a", "balance"], ["", "balance"]], r"line 3, column 'id': empty id"),
    (["id", "label"], [["a", "balance"]], "expected either a column 'bias'"),
    (["id", "bias", "q1_uni_image"], [["a", "balance", "1"]], "expected either"),
    (["bias"], [["balance"]], r"needs column\(s\) \['id'\]"),
    (["id", "bias"], [], "no label rows"),
    (["id", "bias"], [["a", "balance", "extra"]], "line 2: more values than the 2 header"),
    (SCORE_HEADER, [["a", "A", "1", "6", "0"]], r"line 2, column 'q2_uni_text': '6' is not a "
                                                r"rating in \[0, 5\]"),
    (SCORE_HEADER, [["a", "A", "1", "2", "0"], ["a", "B", "x", "2", "0"]],
     r"line 3, column 'q1_uni_image': 'x' is not a rating"),
    (SCORE_HEADER, [["a", "A", "1", "2", ""]], r"line 2, column 'q3_balance': '' is not"),
    (SCORE_HEADER, [["a", "A", "nan", "2", "1"]], "column 'q1_uni_image': 'nan'"),
    (SCORE_HEADER, [["a", "", "1", "2", "0"]], r"line 2, column 'annotator': empty"),
    (SCORE_HEADER, [["a", "A", "1", "2", "0"], ["a", "A", "1", "2", "0"]],
     r"line 3: annotator 'A' rated id 'a' twice \(first on line 2\)"),
    (["id", "q1_uni_image", "q2_uni_text", "q3_balance"], [["a", "1", "2", "3"]],
     r"needs column\(s\) \['annotator'\]"),
])
def test_malformed_files_are_errors_naming_line_and_column(tmp_path, header, rows, match):
    path = write_csv(tmp_path / "bad.csv", header, rows)
    with pytest.raises(InputError, match=match) as e:
        HL.read_labels(path)
    assert str(path) in str(e.value)


def test_missing_or_binary_file_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="labels file not found"):
        HL.read_labels(tmp_path / "nope.csv")
    (tmp_path / "bin.csv").write_bytes(b"id,bias\n\xff\xfe,balance\n")
    with pytest.raises(InputError, match="not UTF-8"):
        HL.read_labels(tmp_path / "bin.csv")


def test_align_reports_unmatched_ids_and_skips_them(tmp_path):
    path = write_csv(tmp_path / "l.csv", ["id", "bias"],
                     [[f"x{i}", "uni_text"] for i in range(7)] + [["3", "uni_image"],
                                                                  ["5", "balance"]])
    lab = HL.read_labels(path)
    bias, rep = HL.align(lab, np.arange(6))  # closed world: int indices match "3"
    np.testing.assert_array_equal(bias, [-1, -1, -1, 0, -1, 1])
    assert rep == {"n_labels": 9, "n_labelled": 2, "n_unmatched": 7,
                   "unmatched_examples": ["x0", "x1", "x2", "x3", "x4"]}
    with pytest.raises(InputError, match="none of its 9 ids is among the 2 analysed"):
        HL.align(lab, ["q", "r"])


# ----------------------------------------------------------------------------------------------
# Scoring against a labelled subset; the per-sample table.
# ----------------------------------------------------------------------------------------------
def fake_views(monkeypatch):
    """Deterministic stand-ins for the three views (labels from batch.index), so analyze and
    the CLI run without compiling a detector; the improved options flip a third of the
    labels, so the variants differ."""
    def fake(name, shift):
        def view(detectors, batch, *, key=None, **opts):
            idx = np.asarray(batch.index).astype(np.int64)
            good = opts.get("value") == "logprob" or opts.get("fusion") == "prob"
            lab = (idx * (shift + 1) + shift + (idx % 3 == 0) * good) % 3
            score = (1 - lab).astype(np.float32) * (0.5 + shift) + idx * 1e-3
            return ViewResult(lab.astype(np.int32), score, {})
        return view

    for i, name in enumerate(VW.VIEWS):
        monkeypatch.setitem(VW.VIEW_FNS, name, fake(name, i))


def tiny_batch(n, bias):
    return Batch(image=np.zeros((n, 4, 4, 3), np.uint8), tokens=np.ones((n, 3), np.int32),
                 label=np.tile([0, 1], n // 2).astype(np.int32), bias=np.asarray(bias, np.int32),
                 fine_label=np.full(n, -1, np.int32), image_core=np.zeros((n, 4, 4), bool),
                 text_core=np.zeros((n, 3), bool), has_gt=np.zeros(n, bool),
                 index=np.arange(n, dtype=np.int32))


def test_analyze_scores_the_labelled_subset_only(monkeypatch):
    fake_views(monkeypatch)
    n = 30
    rng = np.random.default_rng(1)
    bias = np.full(n, -1, np.int32)
    sub = np.sort(rng.choice(n, 12, replace=False))
    bias[sub] = rng.integers(0, 3, sub.size)
    res, views = AN.analyze({}, tiny_batch(n, bias), flow_eps=0.3)
    unlab, _ = AN.analyze({}, tiny_batch(n, np.full(n, -1)), flow_eps=0.3)
    assert res["n"] == n and res["n_scored"] == 12 and "n_scored" not in unlab
    for variant, sc in (("paper", res["scores"]), ("improved", res["scores_improved"])):
        vv = AN.variant_views(views, variant)
        lab = {v: np.asarray(r.label) for v, r in vv.items()}
        for v in EN.VIEWS:
            assert sc[v] == scoring.score_labels(lab[v][sub], bias[sub])
        # the ensemble is the one of all n samples (their class priority), restricted
        ens = EN.all_ensembles(lab, priority=EN.class_priority(np.stack(list(lab.values()))))
        assert sc["ensemble"] == scoring.score_labels(ens["ensemble"][sub], bias[sub])
        np.testing.assert_array_equal(AN.ensemble_labels(views, variant), ens["ensemble"])
        assert res["confusion"][variant]["causal"] == scoring.confusion(lab["causal"][sub],
                                                                        bias[sub])
    assert sc["benefit"]["accuracy"] is not None
    # agreement and Venn counts over all samples, as without labels
    assert res["agreement"] == unlab["agreement"] and res["venn"] == unlab["venn"]
    assert "identifiable" not in res  # a closed-world notion


def test_labels_rows_one_per_sample_with_names_and_scores():
    views = {"benefit": ViewResult(np.array([0, 1], np.int32), np.array([0.5, -0.125]), {}),
             "flow": ViewResult(np.array([2, 2], np.int32), np.float32([-1 / 3, -2]), {}),
             "causal": ViewResult(np.array([1, 0], np.int32), np.array([0.0, 7.0]), {})}
    rows = LT.labels_rows(["a,b", 7], views, np.array([1, 0]))
    assert rows[0] == {"id": "a,b", "benefit": "uni_image", "flow": "uni_text",
                       "causal": "balance", "ensemble": "balance", "benefit_score": "0.5",
                       "flow_score": format(float(np.float32(-1 / 3)), ".9g"),
                       "causal_score": "0"}
    back = list(csv.DictReader(LT.to_csv(rows).splitlines()))
    assert tuple(back[0]) == LT.COLUMNS and back[0]["id"] == "a,b" and back[1]["id"] == "7"
    assert np.float32(back[0]["flow_score"]) == np.float32(-1 / 3)  # exact for float32
    with pytest.raises(ValueError, match="lengths disagree"):
        LT.labels_rows(["a"], views, np.array([1, 0]))
    with pytest.raises(ValueError, match="not a type code"):
        LT.labels_rows(["a", "b"], views, np.array([1, 3]))


# ----------------------------------------------------------------------------------------------
# The CLI.
# ----------------------------------------------------------------------------------------------
def run_cli(*argv):
    from test_bias_real_data import run_cli as run
    return run(*argv)


def read_table(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def recount(rows, truth: dict, col: str) -> float:
    """Accuracy of labels.csv's column ``col`` on the ids of ``truth`` (id -> type name)."""
    hits = [r[col] == truth[r["id"]] for r in rows if r["id"] in truth]
    return sum(hits) / len(hits)


def test_cli_closed_world_labels_csv_and_human_labels(tmp_path, monkeypatch):
    fake_views(monkeypatch)
    # (the closed world's generator compiles for seconds; its ids are the sample indices)
    monkeypatch.setattr(AN, "closed_world_batch",
                        lambda cfg, n, seed, world=None: tiny_batch(n, np.arange(n) % 3))
    # annotators' scores for samples 0..9, plus ids the 32 analysed samples do not have
    rng = np.random.default_rng(5)
    rows = [(str(i), a, *rng.integers(0, 6, 3)) for i in range(10) for a in ("A", "B")]
    rows += [("999", "A", 1, 1, 1), ("not-a-sample", "B", 0, 0, 5)]
    labels = write_csv(tmp_path / "scores.csv", SCORE_HEADER, rows)
    human = HL.read_labels(labels)
    truth = {i: BIAS_TYPES[c] for i, c in zip(human.ids, human.bias) if i.isdigit()}
    truth.pop("999")
    out = tmp_path / "out"
    rc, stdout, err = run_cli("analyze", "--world", "basic", "--n", 32, "--out", out,
                              "--labels", labels,
                              "--ensemble", "weighted", "--json", "--no-progress")
    assert rc == 0, err
    assert "2 of 12 labelled ids are not among the 32 analysed samples" in err
    line = json.loads(stdout.strip().splitlines()[-1])
    res = json.loads((out / "results.json").read_text())
    table = read_table(out / "labels.csv")
    assert tuple(table[0]) == LT.COLUMNS
    assert [r["id"] for r in table] == [str(i) for i in range(32)]  # one row per sample
    assert {r[c] for r in table for c in ("benefit", "flow", "causal", "ensemble")} <= \
        set(BIAS_TYPES)
    hl = res["human_labels"]
    assert hl["file"] == str(labels) and hl["form"] == "scores" and hl["n_annotators"] == 2
    assert (hl["n_labels"], hl["n_labelled"], hl["n_unmatched"]) == (12, 10, 2)
    assert hl["unmatched_examples"] == ["999", "not-a-sample"]
    assert set(hl["annotator_alpha"]) == set(BIAS_TYPES) and res["n_scored"] == 10
    # the --json line's scores are those of labels.csv's columns against the human types
    for col in ("benefit", "flow", "causal", "ensemble"):
        assert line[col]["accuracy"] == pytest.approx(recount(table, truth, col))
    assert line["ensemble"] == res["scores_improved"]["weighted"]
    # the table's ensemble is the weighted vote of its own view columns
    code = {t: i for i, t in enumerate(BIAS_TYPES)}
    lab = {v: np.array([code[r[v]] for r in table]) for v in EN.VIEWS}
    pri = EN.class_priority(np.stack([lab[v] for v in EN.VIEWS]))
    np.testing.assert_array_equal(
        [code[r["ensemble"]] for r in table], EN.combine(lab, strategy="weighted", priority=pri))
    # the reported variant's views: sample 0's fake improved benefit is balance (score 0),
    # the paper's uni_image (0.5)
    assert (table[0]["benefit"], table[0]["benefit_score"]) == ("balance", "0")


def test_cli_real_data_ids_are_record_uids(tmp_path, monkeypatch):
    from bias_jax import train as BT
    from bias_jax.data.text import Vocab
    from test_bias_real_data import _fake_exports, write_fakeddit

    fake_views(monkeypatch)
    data = write_fakeddit(tmp_path / "data")
    records, _ = BT.read_real("fakeddit", data)
    _fake_exports(tmp_path / "dets", Vocab.build(r.text for r in records),
                  BT.fingerprint(records))
    keep = BT.real_splits(records, 0)["Analysis_train"]
    uids = [records[i].uid for i in keep]
    finetune = next(r.uid for i, r in enumerate(records) if i not in set(keep))
    labels = write_csv(tmp_path / "l.csv", ["id", "bias"],
                       [[uids[0], "uni_image"], [uids[2], "uni_text"], [finetune, "balance"]])
    out = tmp_path / "out"
    rc, stdout, err = run_cli("analyze", "--data", "fakeddit", "--root", data,
                              "--detectors-root", tmp_path / "dets", "--labels", labels,
                              "--out", out, "--json", "--quiet")
    assert rc == 0, err
    table = read_table(out / "labels.csv")
    assert [r["id"] for r in table] == uids
    res = json.loads((out / "results.json").read_text())
    hl = res["human_labels"]
    assert (hl["n_labelled"], hl["n_unmatched"], hl["unmatched_examples"]) == (2, 1, [finetune])
    assert hl["annotator_alpha"] is None and hl["form"] == "bias"
    truth = {uids[0]: "uni_image", uids[2]: "uni_text"}
    line = json.loads(stdout.strip().splitlines()[-1])
    assert line["causal"]["accuracy"] == pytest.approx(recount(table, truth, "causal"))
    # a labels file naming none of the analysed samples: exit 2, one line naming the file
    bad = write_csv(tmp_path / "bad.csv", ["id", "bias"], [[finetune, "balance"]])
    rc, _, err = run_cli("analyze", "--data", "fakeddit", "--root", data, "--detectors-root",
                         tmp_path / "dets", "--labels", bad, "--quiet")
    assert rc == 2 and "modality-bias analyze: error:" in err and "bad.csv: none of its 1" in err
    rc, _, err = run_cli("analyze", "--n", 4, "--labels", tmp_path / "missing.csv", "--quiet")
    assert rc == 2 and "labels file not found" in err


@pytest.mark.slow
def test_cli_closed_world_real_views_labels_csv(tmp_path):
    """The shipped detectors and the real views (about 25 s on 2 cores): labels.csv agrees with
    the results JSON's scores against the exact types."""
    from bias_jax import detectors as D

    out = tmp_path / "out"
    rc, stdout, err = run_cli("analyze", "--world", "basic", "--n", 32, "--out", out, "--json",
                              "--quiet")
    assert rc == 0, err
    table = read_table(out / "labels.csv")
    assert tuple(table[0]) == LT.COLUMNS and len(table) == 32
    batch = AN.closed_world_batch(D.load_detectors()["joint"][2], 32, world="basic")
    truth = {str(i): BIAS_TYPES[c] for i, c in zip(np.asarray(batch.index), batch.bias)}
    line = json.loads(stdout.strip().splitlines()[-1])
    for col in ("benefit", "flow", "causal", "ensemble"):
        assert line[col]["accuracy"] == pytest.approx(recount(table, truth, col))
