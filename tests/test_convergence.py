"""Budget convergence (reproduction.convergence): the reliability statistics against numpy /
the Spearman-Brown formula, the settled budget on synthetic results (including a mean that
wanders back out of the band), the structure of a real sweep at n = 2 with tiny budgets,
reliability 1 for deterministic explainers and the correlation of the two runs for the random
control, and the `--convergence` CLI's JSON line."""

import json
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

from mmx_base.errors import InputError
from reproduction import convergence as CV
from reproduction import table1 as T1
from reproduction import table1_parts as PARTS
from reproduction.cli import gridvqa as gcli
from test_multiviz import tiny_mdetr

# docs/table1_default/convergence_parts: every run of the shipped budget sweeps
SHIPPED_PARTS = (Path(__file__).resolve().parents[1] / "docs" / "table1_default"
                 / "convergence_parts")


def test_reliability_is_the_pearson_correlation_of_the_two_runs():
    rng = np.random.default_rng(0)
    a = rng.random(20)
    b = a + 0.3 * rng.random(20)
    b[3] = np.nan  # excluded pairwise
    rel = CV.reliability(a, b)
    ok = np.isfinite(b)
    r = np.corrcoef(a[ok], b[ok])[0, 1]
    assert rel["n"] == 19
    assert rel["r"] == pytest.approx(r, rel=1e-12)
    assert rel["spearman_brown"] == pytest.approx(2 * r / (1 + r), rel=1e-12)
    assert rel["mean_abs_diff"] == pytest.approx(np.mean(np.abs(a[ok] - b[ok])))
    # identical runs: no noise, r = 1 even for constant scores (where Pearson is 0 / 0)
    assert CV.reliability([1.0, 1.0], [1.0, 1.0])["r"] == 1.0
    assert CV.reliability(a, a)["spearman_brown"] == 1.0
    # too few pairs, or one run constant: undefined
    assert np.isnan(CV.reliability([0.1, 0.5], [0.3, 0.2])["r"])
    assert np.isnan(CV.reliability([0.5, 0.5, 0.5], [0.1, 0.2, 0.3])["r"])
    assert np.isnan(CV.reliability([np.nan] * 3, [0.1, 0.2, 0.3])["r"])


def test_settled_budget_is_where_the_mean_stays_within_the_band():
    v = [8, 32, 128]
    assert CV.settled_budget(v, [0.30, 0.305, 0.31]) == 8
    assert CV.settled_budget(v, [0.25, 0.305, 0.31]) == 32
    # 8 is within a point of 128, but 32 is not: the mean has not settled before 128
    assert CV.settled_budget(v, [0.31, 0.35, 0.305]) == 128
    assert CV.settled_budget(v, [0.30, 0.31, 0.31], tolerance=0.01) == 8  # the band is closed
    assert CV.settled_budget(v, [0.30, 0.31, 0.31], tolerance=0.005) == 32
    assert CV.settled_budget(v, [np.nan, 0.31, 0.31]) == 32
    assert CV.settled_budget(v, [0.3, 0.3, np.nan]) is None


def _row(vr, vi, tr, ti):
    return {"visual": {"rma": vr, "rma_std": 0.1, "iou": vi, "iou_std": 0.1},
            "textual": {"rma": tr, "rma_std": 0.1, "iou": ti, "iou_std": 0.1}}


def synthetic():
    # visual RMA settles at 128 (wanders back), visual IoU at 32, textual RMA at 8, textual
    # IoU is not measured (NaN / None at the largest budget); spurious settles at 32 overall
    means = {"pure": [(0.31, 0.20, 0.5, None), (0.35, 0.245, 0.5, None),
                      (0.305, 0.25, 0.5, None)],
             "spurious": [(0.40, 0.20, 0.5, 0.1), (0.452, 0.203, 0.5, 0.1),
                          (0.45, 0.20, 0.5, 0.1)]}
    runs = [{"value": v, "budget": {"n_samples": v},
             "table": {r: _row(*means[r][i]) for r in means}} for i, v in enumerate((8, 32, 128))]
    return {"n": 4, "seed": 1, "regimes": ["pure", "spurious"], "reliability_n": 0,
            "tolerance": 0.01,
            "explainers": {"multishap": {"values": [8, 32, 128], "runs": runs},
                           "flat": {"values": [1, 2], "runs": [
                               {"value": v, "table": {"pure": _row(0.2, 0.1, 0.3, 0.4)}}
                               for v in (1, 2)]}}}


def test_settle_on_a_synthetic_result():
    res = CV.settle(synthetic())
    st = res["explainers"]["multishap"]["settled"]
    assert st["by"]["pure"] == {"visual": {"rma": 128, "iou": 32},
                                "textual": {"rma": 8, "iou": None}}
    assert st["by"]["spurious"] == {"visual": {"rma": 32, "iou": 8},
                                    "textual": {"rma": 8, "iou": 8}}
    assert st["value"] == 128 and st["within_sweep"] is False
    assert res["explainers"]["flat"]["settled"]["value"] == 1
    assert res["explainers"]["flat"]["settled"]["within_sweep"] is True
    # a wider band settles earlier
    wide = CV.settle(synthetic(), tolerance=0.05)["explainers"]["multishap"]["settled"]
    assert wide["by"]["pure"]["visual"] == {"rma": 8, "iou": 8} and wide["value"] == 8
    assert wide["within_sweep"] is True
    with_delta = synthetic()
    with_delta["explainers"]["multishap"]["runs"][0]["delta"] = {
        "pure": {"visual": {"rma": {"d": -0.05, "lo": -0.1, "hi": 0.0}}}}
    assert "-5.0 [-10.0,+0.0]" in CV.format_convergence(CV.settle(with_delta))
    text = CV.format_convergence(res)
    # settling "at" the largest budget is no evidence of settling: printed as not settled
    assert "multishap: not settled within the sweep" in text and "flat: settled at 1" in text
    assert "settled at 128" not in text
    assert "no split-half r (reliability_n 0)" in text and "r on 0 samples" not in text
    assert "pure visual RMA not settled" in text and "pure visual IoU 32" in text
    assert "pure textual IoU n/a" in text


def test_parse_budgets():
    assert CV.parse_budgets(["multishap=8,32,128", "dime=64"]) == {"multishap": (8, 32, 128),
                                                                   "dime": (64,)}
    for bad in (["multishap"], ["multishap=8,x"], ["=8"], ["dime=0,4"]):
        with pytest.raises(InputError, match="NAME=INT"):
            CV.parse_budgets(bad)
    with pytest.raises(InputError, match="twice"):
        CV.parse_budgets(["dime=4", "dime=8"])


def test_sweep_structure_and_reliability_of_deterministic_and_random_explainers():
    model = tiny_mdetr()
    key = jax.random.key(5)
    res = CV.convergence(
        2, budgets={"multishap": (2, 3), "oracle": (1, 2)},
        reliability_n=2, models={"pure": model}, key=key, batch=2)
    assert res["n"] == 2 and res["regimes"] == ["pure"] and res["reliability_n"] == 2
    # the random control (no model call) on more samples: a correlation needs >= 3
    rnd = CV.convergence(4, budgets={"random": (1,)}, reliability_n=4, models={"pure": model},
                         key=key, batch=2)
    ex = {**res["explainers"], **rnd["explainers"]}
    res["per_sample"].update(rnd["per_sample"])
    assert set(ex) == {"multishap", "oracle", "random"}
    ms = ex["multishap"]
    assert ms["values"] == [2, 3]
    assert [b["n_samples"] for b in ms["budgets"]] == [2, 3]
    assert ms["budgets"][0] == {**T1.DEFAULT_BUDGETS["multishap"], "n_samples": 2}
    for e, x in ex.items():
        assert len(x["runs"]) == len(x["values"]) == len(res["per_sample"][e])
        for run in x["runs"]:
            assert set(run["table"]) == {"pure"}
            for mod, m in CV.METRIC_KEYS:
                assert set(run["reliability"]["pure"][mod][m]) == {"r", "spearman_brown",
                                                                  "mean_abs_diff", "n"}
                assert set(run["delta"]["pure"][mod][m]) == {"d", "lo", "hi"}
            assert run["wall_s"] > 0
        assert x["settled"]["value"] in x["values"]
        d = x["runs"][-1]["delta"]["pure"]["visual"]["rma"]["d"]
        assert d == 0.0 or np.isnan(d)  # the largest budget's paired difference to itself
    # the main run at a budget is Table 1 at that budget (same samples, key, model)
    t1 = T1.table1(2, explainers=("multishap",), regimes=("pure",), key=key, batch=2,
                   budgets={"multishap": {"n_samples": 2}}, models={"pure": model})
    np.testing.assert_equal(ms["runs"][0]["table"], t1["table"]["multishap"])
    # deterministic explainers: the two split-half runs agree, r = 1 on every metric
    for e in ("oracle",):  # (MultiViz, deterministic too, is left out: its compile costs 20 s)
        for run in ex[e]["runs"]:
            for mod, m in CV.METRIC_KEYS:
                rel = run["reliability"]["pure"][mod][m]
                if rel["n"]:
                    assert rel["r"] == 1.0 and rel["mean_abs_diff"] == 0.0, (e, mod, m)
    assert ex["oracle"]["settled"]["value"] == 1
    # random: r is the correlation of two runs with keys fold_in(key, 1) and fold_in(key, 2)
    runs = [T1.table1(4, explainers=("random",), regimes=("pure",), batch=2, models={
        "pure": model}, key=jax.random.fold_in(key, i))["per_sample"]["random"]["pure"]
        for i in (1, 2)]
    a, b = (r["visual"]["pixel"]["rma"] for r in runs)
    rel = ex["random"]["runs"][0]["reliability"]["pure"]["visual"]["rma"]
    assert rel["n"] == 4 and rel["r"] == pytest.approx(np.corrcoef(a, b)[0, 1], abs=1e-9)
    assert rel["r"] < 1
    json.dumps(CV.compact(res), allow_nan=False)
    assert "per_sample" not in CV.compact(res)
    text = CV.format_convergence(res)
    assert "oracle: settled at 1" in text
    assert ("multishap: not settled within the sweep" in text) != ("multishap: settled at 2"
                                                                  in text)


def test_convergence_refuses_bad_arguments():
    with pytest.raises(InputError, match="reliability_n"):
        CV.convergence(2, budgets={"oracle": (1,)}, reliability_n=3)
    with pytest.raises(InputError, match="unknown regime"):
        CV.convergence(2, budgets={"oracle": (1,)}, regimes=("both",))
    with pytest.raises(InputError, match="budget"):
        CV.convergence(2, budgets={"oracle": (0,)})
    with pytest.raises(InputError, match="does not accept"):
        CV.convergence(2, budgets={"multiviz": (4,)})  # no n_samples keyword


def test_cli_convergence_adds_its_table_to_the_json_line(capsys):
    rc = gcli.main(["explain", "--regimes", "--n", "2", "--batch", "2", "--json",
                    "--explainers", "random", "oracle", "--convergence",
                    "--convergence-budgets", "oracle=1,2", "random=1,3", "--reliability-n", "2"])
    assert rc == 0
    out = capsys.readouterr().out.strip().splitlines()
    last = json.loads(out[-1])
    assert {"random", "oracle", "convergence"} <= set(last)
    assert set(last["random"]) == {"pure", "spurious", "cross"}  # Table 1's keys are kept
    conv = last["convergence"]
    assert conv["regimes"] == ["pure"] and conv["n"] == 2 and conv["reliability_n"] == 2
    assert conv["explainers"]["random"]["values"] == [1, 3]
    assert conv["explainers"]["oracle"]["settled"]["value"] == 1
    assert any(line.startswith("Budget convergence") for line in out)
    assert any(line.startswith("oracle: settled at 1") for line in out)


def _run_dir(e, v, tag) -> Path:
    """A sweep run's shipped folder: ``<explainer>_<budget>_<run>``, a budget given as
    keywords written ``k=v,k=v`` (``--multishap-sampling stratified``'s runs)."""
    label = ",".join(f"{k}={x}" for k, x in v.items()) if isinstance(v, dict) else str(v)
    return SHIPPED_PARTS / f"{e}_{label}_{tag}"


@pytest.mark.parametrize("name, explainers", [
    ("convergence", {"multishap", "dime", "multishap_ref", "dime_ref"}),
    ("convergence_more", {"multishap", "dime", "multishap_ref"}),
    ("convergence_2048", {"multishap"}),
    ("convergence_stratified", {"multishap"}),
    ("convergence_dime16384", {"dime"})])
def test_shipped_sweep_is_its_parts(name, explainers):
    """docs/table1_default/convergence.json (the GPU sweep to 128 coalitions / 1,024 masks),
    convergence_more.json (its extension on the CPU: over cells to 512 / 4,096, over patches to
    512), convergence_2048.json (MultiSHAP over cells at 2,048 coalitions on the CPU, beside
    the 128 and 512 runs), convergence_stratified.json (MultiSHAP over cells at 32, 128,
    256 and 512 stratified coalitions, on the CPU) and convergence_dime16384.json (DIME over
    cells at 1,024, 4,096 and 16,384 masks, main runs only), main runs and split halves, hold
    what their shipped parts give: each
    budget's mean, its paired difference to the largest budget (recomputed here: mean ± 1.96
    standard errors, stats.paired_ci's normal interval) and, where measured, the split-half r
    (np.corrcoef); and the reported settled budget is the smallest from which every mean lies
    within the tolerance of the largest budget's."""
    from gridvqa_jax.explain.scoring import row_scores

    conv = json.loads((SHIPPED_PARTS.parent / f"{name}.json").read_text())

    def scores(e, v, run, mod="visual", m="rma"):
        (path,) = _run_dir(e, v, run).glob("*__pure.npz")
        return row_scores(PARTS.read_part(path)[0], mod, m)

    assert set(conv["explainers"]) == explainers
    for e, ex in conv["explainers"].items():
        metrics = (("visual", "rma"), ("visual", "iou"), ("textual", "rma"), ("textual", "iou"))
        last = {k: scores(e, ex["values"][-1], "main", *k) for k in metrics}
        assert last["visual", "rma"].shape == (16,)
        within = []
        for run in ex["runs"]:
            main = {k: scores(e, run["value"], "main", *k) for k in metrics}
            for (mod, m), x in main.items():
                assert run["table"]["pure"][mod][m] == pytest.approx(x.mean(), abs=1e-6)
            within.append(all(abs(main[k].mean() - last[k].mean()) <= conv["tolerance"] + 1e-9
                              for k in metrics))
            diff = main["visual", "rma"] - last["visual", "rma"]
            half = 1.96 * diff.std(ddof=1) / np.sqrt(diff.size)
            got = run["delta"]["pure"]["visual"]["rma"]
            assert [got["d"], got["lo"], got["hi"]] == pytest.approx(
                [diff.mean(), diff.mean() - half, diff.mean() + half], abs=1e-6)
            assert ("reliability" in run) == (conv["reliability_n"] > 0)
            if "reliability" in run:
                a, b = (scores(e, run["value"], f"split{i}") for i in (1, 2))
                r = run["reliability"]["pure"]["visual"]["rma"]["r"]
                assert r == pytest.approx(np.corrcoef(a, b)[0, 1], abs=1e-6)
        # settled: the first budget from which every later one is close too; in every shipped
        # sweep that is only the largest budget itself (docs/results.md: nothing settled)
        first = next(i for i in range(len(within)) if all(within[i:]))
        assert first == len(within) - 1
        assert ex["settled"]["value"] == ex["values"][first] == ex["values"][-1]
        assert ex["settled"]["within_sweep"] is False


def _sweep(values, vis_rma, n=4, other=0.4, options=None):
    # one explainer "multishap" over ``values``; only visual RMA moves, with its paired
    # difference to the largest budget as a sweep stores it (lo / hi one point around it)
    runs = [{"value": v, "budget": {"n_samples": v, **(options or {})},
             "table": {"pure": _row(x, other, other, other)},
             "delta": {"pure": {"visual": {"rma": {"d": x - vis_rma[-1],
                                                   "lo": x - vis_rma[-1] - 0.01,
                                                   "hi": x - vis_rma[-1] + 0.01}}}}}
            for v, x in zip(values, vis_rma)]
    return {"n": n, "tolerance": 0.01,
            "explainers": {"multishap": {"values": list(values), "runs": runs}}}


def test_budget_status_reads_the_sweep_that_goes_furthest_above_the_budget():
    low = _sweep((8, 32, 128), (0.50, 0.55, 0.555))  # settles from 32 on (0.5 pt from 128)
    status = CV.budget_status([low], {"multishap": {"n_samples": 32}, "multiviz": {}})
    assert list(status) == ["multishap"]  # no sampling budget, no row
    st = status["multishap"]["pure"]
    assert st["status"] == "settled" and st["pair"] == [32, 128] and st["largest"] == 128
    assert st["delta"]["visual"]["rma"]["d"] == pytest.approx(-0.005)
    assert st["settled_from"]["visual"] == {"rma": 32, "iou": 8}
    st8 = CV.budget_status([low], {"multishap": {"n_samples": 8}})["multishap"]["pure"]
    assert st8["status"] == "not settled" and st8["pair"] == [8, 128]
    top = CV.budget_status([low], {"multishap": {"n_samples": 128}})["multishap"]["pure"]
    assert top["status"] == "not swept above" and top["pair"] == [32, 128]
    # a second sweep from 128 up: the row at 128 is judged by it, whatever the order
    high = _sweep((128, 512), (0.555, 0.60), n=16)
    for sweeps in ([low, high], [high, low]):
        st = CV.budget_status(sweeps, {"multishap": {"n_samples": 128}})["multishap"]["pure"]
        assert st["status"] == "not settled" and st["pair"] == [128, 512] and st["n"] == 16
    # the same sample count with other options is another budget
    other = CV.budget_status([low], {"multishap": {"n_samples": 32, "baseline": "gray"}})
    assert other == {"multishap": {"": {"budget": 32, "status": "not swept"}}}

    md = CV.budget_status_markdown(
        CV.budget_status([low, high], {"multishap": {"n_samples": 8}}), ["a.json"])
    row = next(line for line in md.splitlines() if line.startswith("| multishap |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:5] == ["multishap", "8", "pure (4)", "8 - 128", "-5.5 [-6.5, -4.5]"]
    assert cells[-1] == "**not settled**: vis RMA still move by more than 1.0 pt up to 128"
    md = CV.budget_status_markdown(
        CV.budget_status([low], {"multishap": {"n_samples": 128}}), ["a.json"])
    assert "**not swept above 128**; within 1.0 pt of its mean: vis RMA from 32" in md
    assert "vis IoU from 8" in md


def _copied(runs, tmp_path):
    """A parts folder of the sweep (``DIR/convergence``) holding copies of ``runs``."""
    parts = tmp_path / "convergence"
    for run in runs:
        shutil.copytree(run, parts / run.name)
    return parts


def _record_part_loads(monkeypatch) -> list:
    """Wrap ``table1_parts.load_part`` to record, per call, whether it found a saved part;
    returns the record."""
    real, record = PARTS.load_part, []

    def load(*a, **k):
        got = real(*a, **k)
        record.append(got is not None)
        return got

    monkeypatch.setattr(PARTS, "load_part", load)
    return record


def test_shipped_stratified_512_is_within_a_point_of_2048_on_both_rmas():
    """docs/results.md, Step 6 (and the README): MultiSHAP over cells at 512 stratified
    coalitions (its main run, shipped beside step 6's) is, on the same 16 pure samples, within
    a point of the i.i.d. run at 2,048 in both RMAs' means: visual -0.7 [-2.2, +0.8], textual
    -0.9 [-3.1, +1.4] (mean paired difference ± 1.96 standard errors, recomputed here from the
    per-sample scores). Its fingerprint names the budget and sampling the text says, and the
    samples are the 2,048 run's."""
    from gridvqa_jax.explain.scoring import row_scores

    strat = _run_dir("multishap", {"n_samples": 512, "sampling": "stratified"}, "main")
    scores_a, meta_a, _ = PARTS.read_part(strat / "multishap__pure.npz")
    scores_b, meta_b, _ = PARTS.read_part(
        _run_dir("multishap", 2048, "main") / "multishap__pure.npz")
    assert meta_a["budget"] == {"n_samples": 512, "sampling": "stratified"}
    assert meta_b["budget"] == {"n_samples": 2048}
    assert meta_a["samples"] == meta_b["samples"] and meta_a["n"] == 16
    for mod, documented in (("visual", (-0.7, -2.2, 0.8)), ("textual", (-0.9, -3.1, 1.4))):
        diff = 100 * (row_scores(scores_a, mod, "rma") - row_scores(scores_b, mod, "rma"))
        half = 1.96 * diff.std(ddof=1) / np.sqrt(diff.size)
        got = (diff.mean(), diff.mean() - half, diff.mean() + half)
        assert got == pytest.approx(documented, abs=0.05)
        assert abs(diff.mean()) <= 1.0


# step 6: MultiSHAP over cells, coalition sizes stratified (--multishap-sampling stratified)
STEP6 = T1.with_multishap_sampling({"multishap": (32, 128, 256, 512)}, "stratified")


@pytest.mark.parametrize("step, budgets, table1_kw, reliability_n", [
    ("convergence", {"multishap": (8, 32, 128), "dime": (64, 256, 1024),
                     "multishap_ref": (8, 32, 128), "dime_ref": (64, 256, 1024)}, {}, 8),
    ("convergence_more", {"multishap": (128, 512), "multishap_ref": (128, 512),
                          "dime": (1024, 4096)}, {"piece": 1}, 8),
    ("convergence_2048", {"multishap": (128, 512, 2048)}, {"piece": 1}, 8),
    ("convergence_stratified", STEP6, {"piece": 1}, 8),
    ("convergence_dime16384", {"dime": (1024, 4096, 16384)}, {"piece": 1}, 0)])
def test_shipped_parts_are_the_steps_so_it_computes_nothing(step, budgets, table1_kw,
                                                             reliability_n, tmp_path,
                                                             monkeypatch):
    """docs/table1_default/convergence_parts holds every run of experiments/table1_full.sh's
    sweep steps (pure, n = 16 and split halves of 8): step 2 (`convergence`: 8 / 32 / 128
    coalitions, 64 / 256 / 1,024 masks, cells and reference players, on an H200) and step 2b
    (`convergence_more`: 128 / 512 coalitions over cells and patches, 1,024 / 4,096 masks over
    cells; the 512 / 4,096 runs on a CPU, over patches with `--piece 1`) and step 5
    (`convergence_2048`: MultiSHAP over cells at 2,048 coalitions on a CPU with `--piece 1`,
    beside the 128 / 512 runs of steps 2 and 2b) and step 6 (`convergence_stratified`: 32 / 128 /
    256 / 512 coalitions with sizes stratified, on a CPU with `--piece 1`) and step 7
    (`convergence_dime16384`: DIME over cells at 16,384 masks on a CPU with `--piece 1`, beside
    the 1,024 / 4,096 runs, main runs only: `--reliability-n 0`). Every run was drawn before
    the per-player keys of DIME's masks and MultiSHAP's coalitions (``MASK_DRAWS``), so the
    step refuses each explainer's runs, naming that field and no other, instead of mixing two
    draws in one sweep. Under the draws they were made with (no ``MASK_DRAWS``), each run
    loads under the fingerprint its step computes, so the step reuses it and calls no
    explainer (the patched call would fail): the shipped parts are the steps' runs."""
    import importlib

    tags = ("main", "split1", "split2") if reliability_n else ("main",)
    runs = [_run_dir(e, v, tag) for e, vs in budgets.items() for v in vs for tag in tags]
    parts = _copied(runs, tmp_path)
    for e, vs in budgets.items():
        with pytest.raises(InputError, match=r"saved by a run with other settings "
                                             r"\(mask_draws differ\)"):
            CV.convergence(16, budgets={e: vs}, reliability_n=0, table1_kw=table1_kw,
                           parts_dir=parts)
    for module in ("multishap", "dime"):  # the packages bind the functions
        monkeypatch.delattr(importlib.import_module(f"gridvqa_jax.explain.{module}"),
                            "MASK_DRAWS")
    assert all(len(list(run.glob("*__pure.npz"))) == 1 for run in runs)
    assert not any(any(run.glob("*.pieces")) for run in runs)  # no run is left in pieces
    loaded = _record_part_loads(monkeypatch)

    def computed(*a, **k):
        raise AssertionError(f"step {step} computed a run that a shipped part holds")

    monkeypatch.setattr(T1, "call_explainer", computed)
    conv = CV.convergence(16, budgets=budgets, reliability_n=reliability_n, table1_kw=table1_kw,
                          parts_dir=parts)
    assert loaded == [True] * len(runs)
    assert all(run["reliability"]["pure"]["visual"]["rma"]["n"] == 8 if reliability_n
               else "reliability" not in run
               for ex in conv["explainers"].values() for run in ex["runs"])
    # the shipped table is what these parts give (test_shipped_sweep_is_its_parts checks it
    # against the per-sample scores; here: the step's own output)
    shipped = json.loads((SHIPPED_PARTS.parent / f"{step}.json").read_text())
    for e, ex in conv["explainers"].items():
        for run, ship in zip(ex["runs"], shipped["explainers"][e]["runs"], strict=True):
            assert run["value"] == ship["value"]
            assert run["table"]["pure"]["visual"]["rma"] == pytest.approx(
                ship["table"]["pure"]["visual"]["rma"], abs=1e-6)


def test_shipped_new_draw_runs_are_of_the_current_draws():
    """docs/table1_default/new_draws (the runs docs/results.md pairs with the old sweeps) holds
    parts of the draws each explainer makes now: a change to DIME's or MultiSHAP's draws must
    come with new runs, or these comparisons describe an estimator no longer shipped."""
    import importlib

    from mmx_base import lime

    # the module (the package binds the name to the function)
    multishap = importlib.import_module("gridvqa_jax.explain.multishap")
    draws = {"multishap": multishap.MASK_DRAWS, "dime": lime.MASK_DRAWS,
             "dime_ref": lime.MASK_DRAWS}
    parts = sorted((SHIPPED_PARTS.parent / "new_draws").glob("*/*__pure.npz"))
    rows = [p for p in parts if not p.name.startswith("objects")]
    assert len(rows) == 8
    for p in rows:
        _, fingerprint, wall = PARTS.read_part(p)
        assert fingerprint["mask_draws"] == draws[fingerprint["explainer"]], p
        assert fingerprint["regime"] == "pure" and fingerprint["n"] == 16 and wall > 0, p
