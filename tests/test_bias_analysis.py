"""bias_jax.scoring / thresholds / masking / analysis and reproduction.bias_tables: the scores
against hand computations and the reference packages, the threshold sweep, K-means mapping,
masking counts, the Venn counts and figure, the pipeline with stub views."""

import math

import jax
import numpy as np
import pytest

from bias_jax import analysis as AN
from bias_jax import detectors as D
from bias_jax import ensemble as EN
from bias_jax import masking, scoring, thresholds
from bias_jax import views as VW
from bias_jax.data.batch import Batch
from bias_jax.data.text import PAD_ID
from reproduction import bias_tables

UI, MB, UT = 0, 1, 2


def test_proportions_and_format_by_hand():
    truth = np.array([MB, MB, MB, UI, UI, UT, MB, UT, MB, MB])
    pred = np.array([MB, MB, UI, UI, MB, UT, MB, MB, MB, UT])
    p = scoring.proportions(pred, truth)
    # predicted MB: samples 0,1,4,6,7,8 (6 of 10), right on 0,1,6,8 -> 4/6
    assert p["balance"][0] == pytest.approx(0.6) and p["balance"][1] == pytest.approx(4 / 6)
    # predicted UI: 2,3 -> right on 3; predicted UT: 5,9 -> right on 5
    assert p["uni_image"] == pytest.approx((0.2, 0.5))
    assert p["uni_text"] == pytest.approx((0.2, 0.5))
    assert bias_tables.format_cell(*p["balance"]) == "0.60[66.67]"
    assert bias_tables.format_cell(0.78, 0.8553) == "0.78[85.53]"
    assert bias_tables.format_cell(0.0, math.nan) == "0.00[0.00]"  # the paper's empty class
    s = scoring.score_labels(pred, truth)
    assert s["accuracy"] == pytest.approx(0.6)
    # unknown truth: shares only
    u = scoring.score_labels(pred, np.full(10, -1))
    assert u["accuracy"] is None and u["macro_f1"] is None
    assert u["proportions"]["balance"] == [pytest.approx(0.6), None]


def test_macro_f1_by_hand_and_with_explicit_labels():
    from sklearn.metrics import f1_score

    truth = np.array([MB, MB, MB, UI, UI, UT, MB, UT, MB, MB])
    pred = np.array([MB, MB, UI, UI, MB, UT, MB, MB, MB, UT])
    # per class (tp, fp, fn): UI (1, 1, 1), MB (4, 2, 2), UT (1, 1, 1) -> F1 = 2tp/(2tp+fp+fn)
    hand = np.mean([2 / 4, 8 / 12, 2 / 4])
    assert scoring.macro_f1(pred, truth) == pytest.approx(hand)
    # a class absent from both pred and truth still counts (as 0) with labels=[0, 1, 2]
    t2, p2 = np.array([MB, MB, UI]), np.array([MB, MB, UI])
    assert scoring.macro_f1(p2, t2) == pytest.approx(2 / 3)
    assert f1_score(t2, p2, average="macro") == pytest.approx(1.0)  # what labels=None gives
    # always "balance" on the default mix: accuracy 0.75, macro-F1 0.29
    t3 = np.array([UI] * 15 + [MB] * 75 + [UT] * 10)
    s = scoring.score_labels(np.full(100, MB), t3)
    assert s["accuracy"] == pytest.approx(0.75)
    assert s["macro_f1"] == pytest.approx((2 * 75 / (2 * 75 + 25)) / 3)
    assert round(s["macro_f1"], 2) == 0.29


def _alpha_by_hand(table):
    """Nominal Krippendorff alpha from the coincidence matrix (Krippendorff 2011)."""
    table = np.asarray(table)
    vals = np.unique(table)
    o = np.zeros((len(vals), len(vals)))
    for col in table.T:
        m = len(col)
        for i in range(m):
            for j in range(m):
                if i != j:
                    o[np.searchsorted(vals, col[i]), np.searchsorted(vals, col[j])] += 1 / (m - 1)
    n_c = o.sum(1)
    n = n_c.sum()
    d_o = (o.sum() - np.trace(o)) / n
    d_e = (n * n - (n_c ** 2).sum()) / (n * (n - 1))
    return 1 - d_o / d_e


def test_krippendorff_alpha_against_package_and_hand():
    import krippendorff

    table = np.array([[0, 1, 1, 2, 1, 0, 1], [0, 1, 2, 2, 1, 1, 1], [1, 1, 1, 2, 0, 0, 1]])
    a = scoring.krippendorff_alpha(table)
    assert a == pytest.approx(krippendorff.alpha(reliability_data=table.astype(float),
                                                 level_of_measurement="nominal"))
    assert a == pytest.approx(_alpha_by_hand(table))
    assert scoring.krippendorff_alpha(np.array([[0, 1, 2, 1], [0, 1, 2, 1], [0, 1, 2, 1]])) == 1.0
    assert math.isnan(scoring.krippendorff_alpha(np.ones((3, 5), int)))  # no variation: undefined
    ag = scoring.agreement({"benefit": table[0], "flow": table[1], "causal": table[2]})
    assert ag["all"] == pytest.approx(a)
    assert ag["benefit-flow"] == pytest.approx(_alpha_by_hand(table[:2]))


def test_venn_counts_and_figure(tmp_path):
    labels = {"benefit": np.array([0, 0, 1, 1, 2, 0]), "flow": np.array([0, 1, 1, 2, 2, 0]),
              "causal": np.array([0, 1, 1, 1, 0, 2])}
    v = scoring.venn_counts(labels)
    # class 0 sets: benefit {0,1,5}, flow {0,5}, causal {0, 4}
    assert v["uni_image"] == {"100": 1, "010": 0, "001": 1, "110": 1, "101": 0, "011": 0,
                              "111": 1}
    # regions partition the union of the three sets
    for c, name in enumerate(("uni_image", "balance", "uni_text")):
        union = sum((labels[k] == c) for k in labels) > 0
        assert sum(v[name].values()) == union.sum()
    path = tmp_path / "venn.png"
    bias_tables.venn_figure(v, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob("*.tmp*"))


def test_threshold_sweep_is_monotone():
    rng = np.random.default_rng(0)
    n = 400
    score = rng.uniform(-1, 1, n)
    truth = rng.integers(0, 3, n)
    labels = {"benefit": rng.integers(0, 3, n), "flow": np.zeros(n, int),
              "causal": rng.integers(0, 3, n)}
    rows = thresholds.threshold_sweep(labels, score, truth=truth)
    assert [r["eps"] for r in rows] == [0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4]
    bal = [r["flow"]["proportions"]["balance"][0] for r in rows]
    ui = [r["flow"]["proportions"]["uni_image"][0] for r in rows]
    ut = [r["flow"]["proportions"]["uni_text"][0] for r in rows]
    assert all(a <= b for a, b in zip(bal, bal[1:])) and bal[0] == 0
    assert all(a >= b for a, b in zip(ui, ui[1:])) and all(a >= b for a, b in zip(ut, ut[1:]))
    # the flow share at eps is the share of |score| < eps
    assert bal[-1] == pytest.approx(np.mean(np.abs(score) < 0.4))
    # the ensemble share of balance can only grow with the flow's
    eb = [r["ensemble"]["proportions"]["balance"][0] for r in rows]
    assert all(a <= b for a, b in zip(eb, eb[1:]))
    # each row: the flow relabelled at its eps (numpy), and the ensemble of that relabelling
    # (EN.combine is checked by hand in test_bias_ensemble)
    for r in rows:
        fl = np.where(np.abs(score) < r["eps"], 1, np.where(score > 0, 0, 2))
        assert r["flow"]["accuracy"] == pytest.approx((fl == truth).mean())
        assert r["ensemble"] == scoring.score_labels(EN.combine(dict(labels, flow=fl)), truth)


def test_kmeans_maps_clusters_by_centre_order():
    rng = np.random.default_rng(1)
    score = np.concatenate([rng.normal(-0.8, 0.05, 50), rng.normal(0.0, 0.05, 80),
                            rng.normal(0.7, 0.05, 30)])
    truth = np.array([UT] * 50 + [MB] * 80 + [UI] * 30)
    perm = rng.permutation(len(score))
    assert (thresholds.kmeans_labels(score[perm]) == truth[perm]).all()
    assert (thresholds.kmeans_labels(np.array([-1.0, 1.0, -1.0])) == [UT, UI, UT]).all()
    assert (thresholds.kmeans_labels(np.zeros(4)) == MB).all()


def _toy_batch(b=6, grid=5, px=4, L=8):
    rng = np.random.default_rng(2)
    image = rng.integers(1, 255, (b, grid * px, grid * px, 3)).astype(np.uint8)
    tokens = rng.integers(2, 20, (b, L)).astype(np.int32)
    n_words = np.array([8, 7, 5, 3, 1, 0])[:b]
    tokens[np.arange(L)[None] >= n_words[:, None]] = PAD_ID
    z = np.zeros(b, np.int32)
    return Batch(image=image, tokens=tokens, label=z, bias=z, fine_label=z,
                 image_core=np.zeros(image.shape[:3], bool), text_core=tokens < 0,
                 has_gt=z.astype(bool), index=z), n_words


@pytest.mark.parametrize("ratio", [0.2, 0.4, 0.5, 0.6])
def test_masking_masks_round_r_n_players(ratio):
    batch, n_words = _toy_batch()
    m = masking.mask_batch(batch, jax.random.key(5), image_ratio=ratio, text_ratio=ratio, grid_size=5)
    cells = np.asarray(m.image).reshape(6, 5, 4, 5, 4, 3)
    zero_cells = (cells == 0).all(axis=(2, 4, 5))
    partial = (cells == 0).any(axis=(2, 4, 5)) & ~zero_cells
    assert not partial.any()  # whole cells only
    assert (zero_cells.sum((1, 2)) == round(ratio * 25)).all()
    kept = np.asarray(m.tokens) != PAD_ID
    assert kept.sum(1).tolist() == [w - round(ratio * w) for w in n_words]
    # kept tokens are unchanged and stay where they were
    assert (np.asarray(m.tokens)[kept] == batch.tokens[kept]).all()
    assert masking.n_masked(ratio, 25) == round(ratio * 25)
    # image-only masking leaves the text alone
    m2 = masking.mask_batch(batch, jax.random.key(5), image_ratio=ratio, grid_size=5)
    assert (np.asarray(m2.tokens) == batch.tokens).all()


def test_post_validation_groups_with_stub_detector():
    batch, _ = _toy_batch()
    batch = batch.replace(label=np.array([1, 1, 1, 0, 0, 0], np.int32))

    def apply(params, image, tokens):  # "real" iff the top-left cell is intact
        return (image[:, :4, :4].astype(np.float32).mean((1, 2, 3)) > 0) * 2.0 - 1.0

    dets = {"joint": (apply, None, None)}
    groups = {"first": np.array([1, 1, 1, 0, 0, 0], bool), "last": ~np.array([1, 1, 1, 0, 0, 0],
                                                                              bool)}
    rows = masking.post_validation(dets, batch, groups, jax.random.key(0), grid_size=5,
                             grid=((0.0, 0.0), (1.0, 0.0)))
    assert rows[0]["groups"]["first"]["accuracy"] == 1.0  # no masking: all predicted real
    assert rows[0]["groups"]["last"]["accuracy"] == 0.0
    assert rows[1]["groups"]["first"] == {"accuracy": 0.0, "delta": -1.0, "n": 3}
    assert rows[1]["groups"]["last"]["delta"] == 1.0


def test_mean_detector_averages_logits():
    f = lambda p, i, t: p * i.sum((1, 2, 3)).astype(np.float32)  # noqa: E731
    apply, params, cfg = AN.mean_detector([(f, 1.0, "a"), (f, 3.0, "b")])
    x = np.ones((2, 2, 2, 3), np.uint8)
    np.testing.assert_allclose(apply(params, x, None), [24.0, 24.0])
    assert cfg == "a"


def test_cli_refuses_training_seeds_and_real_data_without_detectors(capsys):
    from reproduction.cli import bias as bcli
    from bias_jax import evaluate as BE

    for argv in (["analyze", "--seed", str(BE.TRAIN_SEED)], ["bench", "--seed", str(BE.EVAL_SEED)],
                 ["analyze", "--data", "fakeddit"], ["analyze", "--n", "0"]):
        assert bcli.main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("modality-bias ")


def test_confusion_and_identifiable_bound_by_hand():
    truth = np.array([UI, UI, UI, MB, MB, UT, UT])
    label = np.array([1, 0, 1, 1, 0, 1, 0])  # 1 real, 0 fake
    pred = np.array([MB, UI, UT, MB, UT, UT, MB])
    assert scoring.confusion(pred, truth) == [[1, 1, 1], [0, 1, 1], [0, 1, 1]]
    # real Uni-image samples (0 and 2) become balance; nothing else changes
    ident = scoring.identifiable_labels(truth, label)
    assert ident.tolist() == [MB, UI, MB, MB, MB, UT, UT]
    # on the default mix with p_real 1/2: accuracy 1 - 0.15 / 2, macro-F1 (2/3 + F1_MB + 1) / 3
    t = np.array([UI] * 30 + [MB] * 150 + [UT] * 20)
    y = np.tile([0, 1], 100)
    s = scoring.score_labels(scoring.identifiable_labels(t, y), t)
    f1_mb = 2 * 150 / (2 * 150 + 15)
    assert s["accuracy"] == pytest.approx(1 - 0.075)
    assert s["macro_f1"] == pytest.approx((2 / 3 + f1_mb + 1) / 3)


def _scores(acc):
    return {"accuracy": acc, "macro_f1": acc / 2, "proportions": {}}


def test_headline_reports_the_chosen_variant_and_rule():
    keys = ("benefit", "flow", "causal", "ensemble", "random", "weighted", "benefit_flow",
            "benefit_causal", "flow_causal")
    res = {"scores": {k: _scores(0.1 + i / 100) for i, k in enumerate(keys)},
           "scores_improved": {k: _scores(0.5 + i / 100) for i, k in enumerate(keys)},
           "default": {"variant": "improved", "rule": "benefit_causal"}}
    line = AN.headline(res)
    assert set(line) == {"benefit", "flow", "causal", "ensemble", "benefit_paper",
                         "causal_paper", "ensemble_paper"}
    assert line["ensemble"] == res["scores_improved"]["benefit_causal"]
    assert line["benefit"] == res["scores_improved"]["benefit"]
    assert line["ensemble_paper"] == res["scores"]["ensemble"]  # the paper's prior majority
    assert line["causal_paper"] == res["scores"]["causal"]
    p = AN.headline(res, "paper")
    assert p["ensemble"] == res["scores"]["ensemble"]
    # the other variant answers with its own default rule
    assert p["ensemble_improved"] == res["scores_improved"][EN.rule_key(None, "improved")]
    assert AN.headline(res, "improved", "weighted")["ensemble"] == \
        res["scores_improved"]["weighted"]
    with pytest.raises(ValueError):
        AN.headline(res, "best")


def test_analyze_scores_the_paper_and_the_improved_views(monkeypatch):
    """analyze runs benefit and causal once with the paper's options and once with
    ensemble.VARIANTS["improved"], and each variant's ensembles combine its own labels."""
    from bias_jax.views.common import ViewResult

    n = 60
    rng = np.random.default_rng(0)
    truth = rng.integers(0, 3, n).astype(np.int32)
    noise = rng.integers(0, 3, (4, n)).astype(np.int32)
    calls = []

    def fake(name):
        def view(detectors, batch, *, key=None, **opts):
            calls.append((name, opts))
            good = opts.get("value") == "logprob" or opts.get("fusion") == "prob"
            lab = {"benefit": 0, "causal": 1, "flow": 2}[name] + (2 if good else 0)
            lab = np.where(np.arange(n) % 3 == 0, noise[lab % 4], truth) if good else \
                noise[lab % 4]
            return ViewResult(lab.astype(np.int32), np.zeros(n, np.float32), {})
        return view

    for name in VW.VIEWS:
        monkeypatch.setitem(VW.VIEW_FNS, name, fake(name))
    batch = Batch(image=np.zeros((n, 4, 4, 3), np.uint8), tokens=np.ones((n, 3), np.int32),
                  label=np.tile([0, 1], n // 2).astype(np.int32), bias=truth,
                  fine_label=np.full(n, -1, np.int32), image_core=np.zeros((n, 4, 4), bool),
                  text_core=np.zeros((n, 3), bool), has_gt=np.ones(n, bool),
                  index=np.arange(n, dtype=np.int32))
    res, views = AN.analyze({}, batch, flow_eps=0.3, world="basic")
    assert calls == [("benefit", EN.view_options("paper", 0.3)["benefit"]),
                     ("flow", {"eps": 0.3}),
                     ("causal", EN.view_options("paper")["causal"]),
                     ("benefit", EN.view_options("improved")["benefit"]),
                     ("causal", EN.view_options("improved")["causal"])]
    assert set(views) == {"benefit", "flow", "causal", "benefit_improved", "causal_improved"}
    imp = {"benefit": views["benefit_improved"].label, "flow": views["flow"].label,
           "causal": views["causal_improved"].label}
    paper = {v: views[v].label for v in EN.VIEWS}
    for sc, lab in ((res["scores_improved"], imp), (res["scores"], paper)):
        pr = EN.class_priority(np.stack([lab[v] for v in EN.VIEWS]))
        ens = EN.all_ensembles(lab, priority=pr)
        for k in ("ensemble", "weighted", "benefit_causal", "flow_causal"):
            assert sc[k] == scoring.score_labels(ens[k], truth)
        assert sc["benefit"] == scoring.score_labels(lab["benefit"], truth)
    assert res["default"] == {"variant": "improved", "rule": "prior"}
    assert AN.headline(res)["ensemble"] == res["scores_improved"]["ensemble"]
    assert res["confusion"]["improved"]["ensemble (prior)"] == scoring.confusion(
        EN.all_ensembles(imp)["ensemble"], truth)
    res_bc, _ = AN.analyze({}, batch, flow_eps=0.3, rule="benefit_causal")
    assert AN.headline(res_bc)["ensemble"] == res_bc["scores_improved"]["benefit_causal"]
    assert res_bc["confusion"]["improved"]["ensemble (benefit_causal)"] == scoring.confusion(
        EN.all_ensembles(imp)["benefit_causal"], truth)
    assert res["identifiable"] == scoring.score_labels(scoring.identifiable_labels(truth, batch.label),
                                                 truth)
    # the bound is a basic-world notion: a graded batch's types are identified by construction
    assert "identifiable" not in AN.analyze({}, batch, flow_eps=0.3, world="graded")[0]
    assert "identifiable" not in AN.analyze({}, batch, flow_eps=0.3)[0]  # the default world
    assert res["scores_improved"]["benefit"]["accuracy"] > res["scores"]["benefit"]["accuracy"]
    text = bias_tables.tables_text(res)
    assert "Improved views" in text and "*prior majority" in text
    with pytest.raises(ValueError, match="rule"):
        AN.analyze({}, batch, rule="median")


@pytest.mark.slow
def test_cli_analyze_json_line_matches_a_recount(tmp_path, capsys):
    import json

    from reproduction.cli import bias as bcli
    assert bcli.main(["analyze", "--world", "basic", "--n", "64", "--json", "--quiet", "--out",
                      str(tmp_path)]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(line) == {"benefit", "flow", "causal", "ensemble", "benefit_paper",
                         "causal_paper", "ensemble_paper"}
    for v in line.values():
        assert set(v) == {"accuracy", "macro_f1", "proportions"}
        assert sum(s for s, _ in v["proportions"].values()) == pytest.approx(1.0)
    res = json.loads((tmp_path / "results.json").read_text())
    # the README's default: improved views, prior majority of three; the paper's answer beside it
    assert res["scores_improved"]["ensemble"] == line["ensemble"]
    assert res["scores_improved"]["ensemble"] != res["scores_improved"]["benefit_causal"]
    assert res["scores"]["ensemble"] == line["ensemble_paper"]
    assert res["scores"]["causal"] == line["causal_paper"]
    assert (tmp_path / "venn.png").read_bytes()[:4] == b"\x89PNG"
    # recount from labels.csv and the samples' true types, drawn again (numpy F1 by hand)
    import csv

    rows = list(csv.DictReader((tmp_path / "labels.csv").read_text().splitlines()))
    cfg = AN.world_detectors("basic")["joint"][2]
    batch = AN.closed_world_batch(cfg, 64, world="basic")
    truth_of = dict(zip(np.asarray(batch.index).tolist(), np.asarray(batch.bias).tolist()))
    truth = np.array([truth_of[int(r["id"])] for r in rows])
    assert len(rows) == 64 and len(set(truth_of)) == 64
    code = {"uni_image": 0, "balance": 1, "uni_text": 2}
    for column in ("benefit", "flow", "causal", "ensemble"):
        pred = np.array([code[r[column]] for r in rows])
        tp = np.array([((pred == c) & (truth == c)).sum() for c in range(3)])
        den = np.array([(pred == c).sum() + (truth == c).sum() for c in range(3)])
        f1 = np.where(den > 0, 2 * tp / np.maximum(den, 1), 0.0).mean()
        assert line[column]["accuracy"] == pytest.approx((pred == truth).mean()), column
        assert line[column]["macro_f1"] == pytest.approx(f1), column
    # reproducible: the same command gives the same line
    assert bcli.main(["analyze", "--world", "basic", "--n", "64", "--json", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == line
    assert bcli.main(["analyze", "--world", "basic", "--n", "64", "--json", "--quiet",
                      "--views", "paper"]) == 0
    paper = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert paper["ensemble"] == res["scores"]["ensemble"]
    assert paper["ensemble_improved"] == line["ensemble"]


def test_saliency_table_runs_attention_and_lime_on_the_first_n(monkeypatch):
    """Table 3: each saliency compiles on one sample, then runs on the first n; the ensemble
    combines the other views' labels restricted to the same samples."""
    from bias_jax.views.common import ViewResult

    n, m = 30, 10
    truth = np.random.default_rng(3).integers(0, 3, n).astype(np.int32)
    calls = []

    def fake_flow(detectors, batch, *, key=None, **opts):
        calls.append((batch.size, opts["saliency"], opts["eps"]))
        lab = np.full(batch.size, 0 if opts["saliency"] == "lime" else 2, np.int32)
        return ViewResult(lab, np.zeros(batch.size, np.float32), {})

    monkeypatch.setitem(VW.VIEW_FNS, "flow", fake_flow)
    batch = Batch(image=np.zeros((n, 4, 4, 3), np.uint8), tokens=np.ones((n, 3), np.int32),
                  label=np.zeros(n, np.int32), bias=truth, fine_label=np.full(n, -1, np.int32),
                  image_core=np.zeros((n, 4, 4), bool), text_core=np.zeros((n, 3), bool),
                  has_gt=np.ones(n, bool), index=np.arange(n, dtype=np.int32))
    wrong = (truth + 1) % 3
    labels = {"benefit": truth, "flow": wrong, "causal": wrong}
    res = AN.saliency_table({}, batch, labels, {"eps": 0.3}, truth=truth, n=m)
    assert res["n"] == m
    assert calls == [(1, "attention", 0.3), (m, "attention", 0.3), (1, "lime", 0.3),
                     (m, "lime", 0.3)]
    for sal, c in (("attention", 2), ("lime", 0)):
        flow = np.full(m, c)
        assert res[sal]["flow"] == scoring.score_labels(flow, truth[:m])
        expect = EN.combine({"benefit": truth[:m], "flow": flow, "causal": wrong[:m]})
        assert res[sal]["ensemble"] == scoring.score_labels(expect, truth[:m])
        assert res[sal]["samples_per_s"] > 0


def test_view_registry_holds_the_view_functions():
    from bias_jax.views.benefit import benefit_view
    from bias_jax.views.causal import causal_view
    from bias_jax.views.flow import flow_view

    assert VW.VIEWS == EN.VIEWS
    assert VW.VIEW_FNS == {"benefit": benefit_view, "flow": flow_view, "causal": causal_view}
    assert VW.view_fn("causal") is causal_view
    with pytest.raises(ValueError, match="unknown view 'median'"):
        VW.view_fn("median")
    with pytest.raises(ValueError, match="unknown view"):
        VW.run_views({}, None, views=("benefit", "shap"))


def test_mask_cells_fill_is_the_zero_image_and_matches_a_recount():
    """mask_batch's image masking is mmx_base.grid.mask_cells with the zero fill: the masked
    pixels are exactly the cells' blocks of a np.kron upsampling of the masked cells."""
    batch, _ = _toy_batch()
    m = np.asarray(masking.mask_batch(batch, jax.random.key(9), image_ratio=0.4,
                                      grid_size=5).image)
    cells = (m.reshape(6, 5, 4, 5, 4, 3) == 0).all(axis=(2, 4, 5))  # [B, 5, 5]
    px = np.stack([np.kron(c, np.ones((4, 4), bool)) for c in cells])[..., None]
    np.testing.assert_array_equal(m, np.where(px, 0, batch.image))
    assert masking.IMAGE_FILL == 0


@pytest.mark.slow
def test_bias_tables_script_prints_the_basic_worlds_identifiable_bound(experiment, capsys):
    """experiments/bias_tables.py analyses basic-world samples as the basic world (the bound
    that exact types allow is a basic-world row; under the default world it went missing)."""
    import json

    mod = experiment("bias_tables")
    assert mod.main(["--n", "16"]) == 0
    text = capsys.readouterr().out
    assert "identifiable bound" in text


def test_detector_swap_counts_each_group_against_g1(monkeypatch):
    """Table 2's swapped groups carry ``vs_G1``: the samples whose ensemble the swap makes
    right (gained) and wrong (lost), against the ensemble of the first detectors, recounted
    here from the stand-in views' labels."""
    n = 60
    rng = np.random.default_rng(5)
    truth = rng.integers(0, 3, n).astype(np.int32)
    base = rng.integers(0, 3, (3, n))

    def fake(i):
        def view(detectors, batch, *, key=None, **opts):
            # a view's label moves with the marker (params) of each detector it would read
            shift = sum(detectors[k][1] for k in ("image", "text", "joint"))
            return VW.ViewResult(((base[i] + shift * (i + 1)) % 3).astype(np.int32),
                                 np.zeros(n, np.float32), {})
        return view

    for i, name in enumerate(VW.VIEWS):
        monkeypatch.setitem(VW.VIEW_FNS, name, fake(i))
    monkeypatch.setattr(AN, "saliency_table", lambda *a, **k: {"n": n})
    monkeypatch.setattr(AN, "post_validation", lambda *a, **k: {})
    monkeypatch.setattr(AN, "mean_detector", lambda dets: dets[0])
    cfg = lambda kind: D.DetectorConfig(kind=kind)  # noqa: E731
    first = {k: (None, 0, cfg(k)) for k in ("image", "text", "joint")}
    second = {k: (None, m, cfg(k)) for k, m in (("image", 1), ("joint", 2), ("text", 0))}
    batch = Batch(image=np.zeros((n, 4, 4, 3), np.uint8), tokens=np.ones((n, 3), np.int32),
                  label=np.zeros(n, np.int32), bias=truth, fine_label=np.full(n, -1, np.int32),
                  image_core=np.zeros((n, 4, 4), bool), text_core=np.zeros((n, 3), bool),
                  has_gt=np.zeros(n, bool), index=np.arange(n, dtype=np.int32))
    res, _ = AN.analyze(first, batch, tables=True, second=second)
    swap = res["swap"]
    assert list(swap) == ["G1", "G2", "G3", "G4"] and "vs_G1" not in swap["G1"]
    labels = lambda shift: {v: (base[i] + shift * (i + 1)) % 3  # noqa: E731
                            for i, v in enumerate(VW.VIEWS)}
    ok1 = EN.combine(labels(0)) == truth
    for g, shift in (("G2", 1), ("G3", 2), ("G4", 0)):
        # benefit and causal are rerun with the swapped detector; flow keeps G1's labels
        lab = dict(labels(shift), flow=labels(0)["flow"])
        ok = EN.combine(lab) == truth
        assert swap[g]["vs_G1"] == {"gained": int((ok & ~ok1).sum()),
                                    "lost": int((~ok & ok1).sum()), "n": n}, g
        assert swap[g]["ensemble"]["accuracy"] == pytest.approx(ok.mean())
    assert swap["G4"]["vs_G1"]["gained"] == swap["G4"]["vs_G1"]["lost"] == 0
    assert swap["G2"]["vs_G1"]["gained"] + swap["G2"]["vs_G1"]["lost"] > 0
    # Table 7 likewise: the eps ensemble against K-means' (a flat score: one cluster, balance)
    ok_km = EN.combine(dict(labels(0), flow=np.ones(n, int))) == truth
    assert res["kmeans"]["eps_vs_kmeans"] == {"gained": int((ok1 & ~ok_km).sum()),
                                              "lost": int((~ok1 & ok_km).sum()), "n": n}
    assert res["kmeans"]["eps_vs_kmeans"]["gained"] > 0
