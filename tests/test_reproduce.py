"""gridvqa reproduce: verdicts, statistics, the report directory (atomic, refusal, keys)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from reproduction import reproduce as R


# ---------------------------------------------------------------------------------------------
# Verdicts and intervals
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ci, claim, want", [
    ((0.1, 0.3), (">", 0.0), "reproduced"),
    ((-0.3, -0.1), (">", 0.0), "refuted"),
    ((-0.1, 0.2), (">", 0.0), "inconclusive"),
    ((-0.3, -0.1), ("<", 0.0), "reproduced"),
    ((0.1, 0.3), ("<", 0.0), "refuted"),
    ((92.0, 100.0), ("in", 90.0, 100.0), "reproduced"),
    ((40.0, 60.0), ("in", 90.0, 100.0), "refuted"),
    ((85.0, 95.0), ("in", 90.0, 100.0), "inconclusive"),
    ((float("nan"), 1.0), (">", 0.0), "inconclusive"),
    (None, (">", 0.0), "inconclusive"),
])
def test_verdict(ci, claim, want):
    assert R.verdict(ci, claim) == want


def test_verdict_unknown_claim():
    with pytest.raises(ValueError):
        R.verdict((0, 1), ("~", 0))


def test_wilson_against_closed_form_and_coverage():
    # k = 0: the Wilson upper bound is z²/(n + z²) exactly.
    n, z = 50, 1.96
    lo, hi = R.wilson(0, n)
    assert lo == 0.0 and hi == pytest.approx(z * z / (n + z * z))
    # Symmetry k <-> n - k.
    a, b = R.wilson(7, 40)
    c, d = R.wilson(33, 40)
    assert a == pytest.approx(1 - d) and b == pytest.approx(1 - c)
    # Coverage by simulation (independent of the formula): close to 95% at p = 0.3.
    rng = np.random.default_rng(0)
    ks = rng.binomial(60, 0.3, size=4000)
    cover = np.mean([lo <= 0.3 <= hi for lo, hi in (R.wilson(int(k), 60) for k in ks)])
    assert 0.93 < cover < 0.97
    assert all(math.isnan(x) for x in R.wilson(0, 0))


def test_paired_and_diff_ci():
    a = np.array([1, 1, 1, 0, 1, 1, 0, 1], float)
    b = np.array([0, 1, 0, 0, 1, 0, 0, 1], float)
    d, lo, hi = R.paired_ci(a, b)
    diffs = a - b
    se = diffs.std(ddof=1) / math.sqrt(len(diffs))
    assert d == pytest.approx(0.375) and hi - d == pytest.approx(1.96 * se)
    d, lo, hi = R.diff_ci(30, 40, 10, 40)
    assert d == pytest.approx(0.5)
    assert hi - d == pytest.approx(1.96 * math.sqrt(0.75 * 0.25 / 40 + 0.25 * 0.75 / 40))


def test_regimes_findings_on_synthetic_counts():
    def cell(k, n):
        return R._acc_row(k, n)

    res = {"table2_accuracy": {
        "M_pure": {b: cell(200, 200) for b in ("D1", "D2", "D3")},
        "M_spur": {"D1": cell(3, 200), "D2": cell(150, 200), "D3": cell(0, 200)}},
        "regimes": {"cross": {"buckets": {"D1_A_F0_d07": cell(9, 10)}}}}
    f = {x["finding"]: x["verdict"] for x in R.regimes_findings(res)}
    assert f["Table 2 accuracy: M_pure"] == "reproduced"
    assert f["Table 2 accuracy: M_spur"] == "refuted"  # depth 2 at 75% is wholly above 20%
    assert f["M_spur keeps attribute-only questions on D_pure"] == "inconclusive"  # 9/10: Wilson [59.6, 98.2]


def test_bias_findings_on_synthetic_labels():
    rng = np.random.default_rng(1)
    truth = rng.integers(0, 3, 600)
    noisy = lambda p: np.where(rng.random(600) < p, truth, rng.integers(0, 3, 600))  # noqa
    labels = {"benefit": noisy(0.5), "flow": noisy(0.5), "causal": noisy(0.5)}
    res = {"n": 600, "per_sample": {"truth": truth, "labels": labels, "ensemble": truth.copy()},
           "scores": {"ensemble": {"accuracy": 1.0}},
           "kmeans": {"ensemble": {"accuracy": 0.3}}, "swap": {}}
    f = {x["finding"]: x for x in R.bias_findings(res)}
    assert f["Finding 1: ensembling views beats every single view"]["verdict"] == "reproduced"
    assert f["Table 7: a fixed flow threshold beats K-means"]["verdict"] == "reproduced"
    assert f["Finding 2: analysis fluctuates with the detectors"]["verdict"] == "inconclusive"
    res["per_sample"]["ensemble"] = (truth + 1) % 3  # always wrong
    f = {x["finding"]: x for x in R.bias_findings(res)}
    assert f["Finding 1: ensembling views beats every single view"]["verdict"] == "refuted"
    # the improved views are reported beside the paper's: ensemble 0% vs causal 100%
    res["per_sample"].update(labels_improved=dict(labels, causal=truth.copy()),
                             ensemble_improved=(truth + 1) % 3)
    ev = {x["finding"]: x for x in R.bias_findings(res)}[
        "Finding 1: ensembling views beats every single view"]["evidence"]
    assert "improved views" in ev and "ensemble 0.0% vs causal 100.0%, -100.0 pts" in ev


# ---------------------------------------------------------------------------------------------
# The report directory, with the sections stubbed (fast)
# ---------------------------------------------------------------------------------------------
def _fake_regimes(sizes, log=None):
    cell = R._acc_row
    return {"regimes": {n: {"model": m, "data": d, "overall": cell(9, 10),
                            "buckets": {"D1_A_F0_d07": cell(9, 10)}}
                        for n, m, d in (("pure", "pure", "pure"), ("spurious", "spur", "spur"),
                                        ("cross", "spur", "pure"))},
            "table2_accuracy": {"M_pure": {f"D{d}_M_F0_d07": cell(10, 10) for d in (1, 2, 3)},
                                "M_spur": {f"D{d}_M_F0_d07": cell(0, 10) for d in (1, 2, 3)}},
            "paper_table2_accuracy": R.PAPER_T2_ACC, "n_per_density": sizes["acc_n"],
            "n_per_bucket_table2": sizes["t2_n"], "seeds": {}, "cell_px": 16}


@pytest.fixture
def stubbed(monkeypatch):
    monkeypatch.setattr(R, "run_regimes", _fake_regimes)

    def missing(*a, **k):
        raise ImportError("No module named 'not_landed_yet'")

    monkeypatch.setattr(R, "run_table1_regime", missing)
    monkeypatch.setattr(R, "run_synergy", missing)
    monkeypatch.setattr(R, "run_bias", missing)
    return monkeypatch


def test_report_written_with_every_key(stubbed, tmp_path):
    out = tmp_path / "rep"
    res = R.reproduce(out, "quick", progress=False)
    assert set(res) == {"regimes", "local_explainers", "synergy", "bias", "findings", "meta"}
    on_disk = json.loads((out / "results.json").read_text())
    assert set(on_disk) == set(res)
    for k in ("versions", "seeds", "device", "wall_s", "sizes"):
        assert k in on_disk["meta"]
    assert {"jax", "flax", "numpy", "gridvqa-jax"} <= set(on_disk["meta"]["versions"])
    assert on_disk["synergy"] == {"available": False,
                                  "reason": "ImportError: No module named 'not_landed_yet'"}
    md = (out / "report.md").read_text()
    assert "not available: ImportError" in md and "## Verdicts" in md
    assert "| M_pure | paper | 100.0 | 100.0 | 100.0 |" in md
    assert (out / "figures" / "table2_accuracy.png").read_bytes()[:4] == b"\x89PNG"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".rep.")]  # no stage left


def test_refuses_non_empty_out(stubbed, tmp_path):
    out = tmp_path / "rep"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        R.reproduce(out, progress=False)
    assert (out / "keep.txt").read_text() == "mine"
    R.reproduce(out, progress=False, overwrite=True)
    assert not (out / "keep.txt").exists() and (out / "report.md").exists()


def test_nothing_half_written_when_a_section_raises(stubbed, tmp_path):
    def boom(*a, **k):
        raise RuntimeError("bug in a section")

    stubbed.setattr(R, "run_bias", boom)
    out = tmp_path / "rep"
    with pytest.raises(RuntimeError, match="bug in a section"):
        R.reproduce(out, progress=False)
    assert list(tmp_path.iterdir()) == []
    # an existing report survives a failed --overwrite run
    stubbed.setattr(R, "run_bias", lambda *a, **k: (_ for _ in ()).throw(ImportError("x")))
    R.reproduce(out, progress=False)
    before = (out / "results.json").read_text()
    stubbed.setattr(R, "run_bias", boom)
    with pytest.raises(RuntimeError):
        R.reproduce(out, progress=False, overwrite=True)
    assert (out / "results.json").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep"]


def test_cli_refuses_non_empty_out(tmp_path):
    (tmp_path / "x").write_text("")
    p = subprocess.run([sys.executable, "-m", "reproduction.cli.gridvqa", "reproduce", "--out",
                        str(tmp_path)], capture_output=True, text=True)
    assert p.returncode == 2
    assert p.stderr.strip().startswith("gridvqa reproduce: error:") and "--overwrite" in p.stderr


TINY = {"acc_n": 4, "t2_n": 2, "t1_n": 2, "t1_batch": 2, "syn_n": 3, "syn_boot": 4,
        "bias_n": 12, "n_figures": 1}


@pytest.mark.slow
def test_tiny_real_run(tmp_path):
    """Every section for real at the smallest sizes (several minutes on a loaded 2-core CPU:
    compiles dominate)."""
    out = tmp_path / "rep"
    res = R.reproduce(out, "quick", sizes=TINY, progress=False)
    on_disk = json.loads((out / "results.json").read_text())
    assert set(on_disk) == {"regimes", "local_explainers", "synergy", "bias", "findings",
                            "meta"}
    figs = {p.name for p in (out / "figures").iterdir()}
    assert "table2_accuracy.png" in figs
    for sec, fig in (("synergy", "synergy_vs_depth.png"), ("bias", "bias_venn.png"),
                     ("bias", "bias_threshold_sweep.png")):
        if res[sec].get("available") is not False:
            assert fig in figs
    if res["local_explainers"].get("available") is not False:
        assert any(f.startswith("heatmap_pure") for f in figs)
    assert {f["verdict"] for f in res["findings"]} <= {"reproduced", "refuted", "inconclusive"}


# ---------------------------------------------------------------------------------------------
# docs/: every python block runs (each page's blocks in order, in a fresh interpreter)
# ---------------------------------------------------------------------------------------------
DOCS = Path(__file__).resolve().parent.parent / "docs"
DOC_PAGES = ("evaluate_your_explainer.md", "evaluate_your_vlm.md", "analyse_your_benchmark.md")


def python_blocks(text: str) -> list[str]:
    """The ```python fenced blocks of a markdown page, in order."""
    import re

    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_docs_have_python_blocks():
    for page in DOC_PAGES:
        assert python_blocks((DOCS / page).read_text()), page


@pytest.mark.slow
@pytest.mark.parametrize("page", DOC_PAGES)
def test_doc_blocks_run(page, tmp_path):
    code = "\n".join(python_blocks((DOCS / page).read_text()))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=tmp_path, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip()
