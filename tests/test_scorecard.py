"""The Table 1 scorecard: bounds from the controls, exact scores of constant maps, the per-form
breakdown, the spread measures, the `gridvqa explain` JSON schema and files, and the bench keys."""

import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from reproduction.cli import gridvqa as gcli
from gridvqa_jax.explain import attribution as AT
from reproduction import table1 as T1
from gridvqa_jax.world import generate as G
from gridvqa_jax.world import universe as U
from test_multiviz import tiny_mdetr


@pytest.fixture(scope="module")
def scenes():
    spec, _ = U.Spec.feasible("pure", grid_size=5, density=0.7)
    return G.to_numpy(G.generate_chunk(spec, seed=11, start=0, n=48))


def _constant(apply_fn, params, scenes, key, **_):
    """Every cell and every valid token gets 1."""
    valid = np.asarray(scenes.tokens) != U.PAD_ID
    return AT.from_maps(np.ones(scenes.gt_cells.shape, np.float32), valid.astype(np.float32),
                       valid)


def test_oracle_scores_one_with_empty_ground_truth_excluded(scenes):
    res = T1.score_explainer(T1.resolve_explainer("oracle"), None, None, scenes,
                             jax.random.key(0))
    empty = ~scenes.gt_cells.reshape(len(scenes.gt_cells), -1).any(1)
    assert 0 < empty.sum() < len(empty)
    for level in ("pixel", "cell"):
        for m in ("rma", "iou", "rra", "pointing"):
            s = res["visual"][level][m]
            assert s["mean"] == pytest.approx(1.0) and s["std"] == pytest.approx(0.0)
            assert s["n_excluded"] == int(empty.sum()) and s["n"] == int((~empty).sum())
    tok_empty = ~(scenes.gt_tokens & (scenes.tokens != U.PAD_ID)).any(1)
    assert res["textual"]["rma"]["mean"] == pytest.approx(1.0)
    assert res["textual"]["iou"]["n_excluded"] == int(tok_empty.sum())
    assert res["table"]["visual"] == {"rma": 1.0, "rma_std": 0.0, "iou": 1.0, "iou_std": 0.0}


def test_constant_map_scores_the_mask_share_per_form(scenes):
    # A constant map's RMA, RRA and pointing game are the ground truth's share of the players
    # (exactly; ties are averaged), at pixel and cell level, and on tokens.
    res = T1.score_explainer(_constant, None, None, scenes, jax.random.key(0),
                             return_per_sample=True)
    gt = scenes.gt_cells.reshape(len(scenes.gt_cells), -1).astype(float)
    share = np.where(gt.any(1), gt.mean(1), np.nan)
    valid = scenes.tokens != U.PAD_ID
    tshare = (scenes.gt_tokens & valid).sum(1) / valid.sum(1)
    tshare = np.where(tshare > 0, tshare, np.nan)
    for level in ("pixel", "cell"):
        for m in ("rma", "rra", "pointing"):
            np.testing.assert_allclose(res["per_sample"]["visual"][level][m], share, rtol=1e-5)
    np.testing.assert_allclose(res["per_sample"]["textual"]["rma"], tshare, rtol=1e-5)
    # Otsu on a constant map keeps every cell: IoU = |mask| / (S*S) too.
    np.testing.assert_allclose(res["per_sample"]["visual"]["cell"]["iou"], share, rtol=1e-5)
    for f in (0, 1):
        sel = scenes.form == f
        assert sel.any()
        want = np.nanmean(share[sel])
        assert res["by_form"][str(f)]["visual"]["pixel"]["rma"]["mean"] == pytest.approx(want,
                                                                                     rel=1e-5)
        assert res["by_form"][str(f)]["n"] == int(sel.sum())


def test_random_control_scores_the_share_on_average(scenes):
    rnd = T1.resolve_explainer("random")
    gt = scenes.gt_cells.reshape(len(scenes.gt_cells), -1)
    ok = gt.any(1)
    rma = np.stack([T1.per_sample_scores(rnd(None, None, scenes, jax.random.key(i)), scenes,
                                         levels=("cell",))["visual"]["cell"]["rma"]
                    for i in range(30)])
    np.testing.assert_allclose(rma[:, ok].mean(), gt[ok].mean(1).mean(), atol=0.02)


def test_map_spread_bounds():
    one_hot = np.zeros((1, 5, 5)); one_hot[0, 2, 3] = 4.0
    uniform = np.full((1, 5, 5), 0.3)
    s1, su = T1.map_spread(one_hot), T1.map_spread(uniform)
    assert s1["entropy"][0] == pytest.approx(0.0) and s1["cells_50"][0] == pytest.approx(1 / 25)
    assert su["entropy"][0] == pytest.approx(1.0)
    assert su["cells_50"][0] == pytest.approx(math.ceil(12.5) / 25)
    half = np.zeros((1, 5, 5)); half[0, 0, :2] = 1.0  # two equal cells: 50% needs one of them
    assert T1.map_spread(half)["cells_50"][0] == pytest.approx(1 / 25)
    assert T1.map_spread(half)["entropy"][0] == pytest.approx(math.log(2) / math.log(25))
    assert np.isnan(T1.map_spread(np.zeros((1, 5, 5)))["entropy"][0])


def test_explain_cli_json_schema_results_and_figures(tmp_path, capsys, monkeypatch):
    # The real explainers are tested in their own modules; here cheap stand-ins (constant and
    # per-cell-index maps) keep the run in seconds while going through the whole protocol.
    def cells_index(apply_fn, params, scenes, key, **_):
        valid = np.asarray(scenes.tokens) != U.PAD_ID
        vis = np.broadcast_to(np.arange(25, dtype=np.float32).reshape(5, 5),
                              scenes.gt_cells.shape)
        return AT.from_maps(vis, np.cumsum(valid, 1).astype(np.float32), valid)

    fakes = {"multishap": _constant, "dime": _constant, "multiviz": cells_index}
    for name, fn in fakes.items():
        monkeypatch.setitem(T1.EXPLAINERS, name, fn)
    out = tmp_path / "t1"
    rc = gcli.main(["explain", "--regimes", "--n", "2", "--batch", "2", "--json", "--quiet",
                   "--figures", "1", "--out", str(out)])
    assert rc == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(last) == {"multishap", "dime", "multiviz", "random", "objects", "oracle",
                         "protocol"}
    protocol = last.pop("protocol")
    # one protocol per row; the budget is the one the CLI passed (its defaults), controls say so
    assert set(protocol) == set(last)
    for p in protocol.values():
        assert set(p) == {"players", "baseline", "target", "budget"}
    assert protocol["multishap"] == {"players": "cells x tokens (SII)",
                                     "baseline": "empty tile / PAD",
                                     "target": "log-probability of the predicted answer",
                                     "budget": T1.DEFAULT_BUDGETS["multishap"]}
    assert protocol["dime"]["budget"] == T1.DEFAULT_BUDGETS["dime"]  # the CLI's default
    assert protocol["multiviz"]["budget"] == {}
    for c in ("random", "objects", "oracle"):
        assert protocol[c]["players"] == "none (control)" and protocol[c]["budget"] == {}
    for e, regimes in last.items():
        assert set(regimes) == {"pure", "spurious", "cross"}
        for r in regimes.values():
            assert set(r) == {"visual", "textual"}
            for mod in r.values():
                assert set(mod) == {"rma", "rma_std", "iou", "iou_std"}
    assert last["oracle"]["pure"]["visual"]["rma"] == 1.0
    body = json.loads((out / "results.json").read_text())
    assert len(body["findings"]) == 4 and all("verdict" in f for f in body["findings"])
    assert body["protocol"] == protocol and body["data"]["pure"] == "generated (seed 913000)"
    # every finding states the objects floor
    assert all("objects floor" in f["evidence"] for f in body["findings"]), body["findings"]
    # the report's Table 1: the objects row and one protocol row per explainer
    from reproduction import report as RE

    md = RE.table1_markdown(body)
    assert "| visual | objects | " in md and "| textual | objects | " in md
    assert ("| multishap | cells x tokens (SII) | empty tile / PAD | log-probability of the "
            f"predicted answer | n_samples = {T1.DEFAULT_BUDGETS['multishap']['n_samples']} |") in md
    assert "| objects | none (control) | none | " in md
    pngs = sorted(out.glob("*.png"))
    assert [p.name for p in pngs] == ["cross_00.png", "pure_00.png", "spurious_00.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 1000
               for p in pngs)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left
    # A non-empty --out is refused with one error line, before any work.
    rc = gcli.main(["explain", "--regimes", "--n", "2", "--out", str(out)])
    assert rc == 2 and "gridvqa explain: error:" in capsys.readouterr().err


def test_format_table_prints_the_paper_beside_ours():
    row = {"visual": {"rma": 0.5, "rma_std": 0.1, "iou": 0.25, "iou_std": 0.05},
           "textual": {"rma": 0.6, "rma_std": 0.1, "iou": 0.3, "iou_std": 0.1}}
    res = {"n": 4, "seed": 1, "missing": [], "findings": [],
           "table": {"multishap": {r: row for r in ("pure", "spurious", "cross")}}}
    text = T1.format_table(res)
    assert " 50.0 ±  10.0" in text and "56.0 ± 22.7" in text and "64.5 ± 21.8" in text
    assert "66.8 ± 17.3" in text  # textual MultiSHAP, pure
    # the protocol of the row: without recorded budgets, table1's defaults
    assert ("  multishap  cells x tokens (SII); empty tile / PAD; log-probability of the "
            f"predicted answer; n_samples = {T1.DEFAULT_BUDGETS['multishap']['n_samples']}") in text
    res["budgets"] = {"multishap": {"n_samples": 32, "chunk": 4}, "objects": {}}
    res["table"]["objects"] = res["table"]["multishap"]
    text = T1.format_table(res)
    assert "answer; n_samples = 32, sampling = iid\n" in text  # chunk is no budget
    assert "  objects    none (control); none; none: uniform on the occupied cells" in text
    assert "no sampling" in text


@pytest.mark.slow
def test_bench_explainers_keys():
    from reproduction import bench_explainers as BX

    res = BX.bench_explainers(batch=2, budget=128, chunk=32, multishap_samples=1, dime_samples=2,
                             mae_budget=100, cheap_budget=500, repeats=1)
    keys = ["forward_evals_per_s", "multishap_evals_per_s", "shapley_evals_per_s",
            "dime_evals_per_s", "multiviz_samples_per_s", "shap_permutation_evals_per_s",
            "shapiq_evals_per_s", "cheap_shapley_evals_per_s", "cheap_shap_evals_per_s",
            "cheap_shapiq_evals_per_s", "shapley_mae", "shap_mae", "multishap_mae",
            "shapiq_mae", "multishap_ref_evals_per_s", "dime_ref_evals_per_s",
            "multiviz_ref_samples_per_s", "multishap_ref_vs_forward", "dime_ref_vs_forward"]
    for k in keys:
        assert k in res
    assert res["forward_evals_per_s"] > 0
    # XLA's count of the forward's arithmetic: tens of MFLOP per row for the shipped model
    assert 10 < res["forward_mflop_per_row"] < 1000
    assert res["forward_gflop_per_s"] == pytest.approx(
        res["forward_mflop_per_row"] * res["forward_evals_per_s"] / 1e3)
    for k in ("shapley_evals_per_s", "multishap_evals_per_s", "dime_evals_per_s",
              "multiviz_samples_per_s", "cheap_shapley_evals_per_s", "multishap_ref_evals_per_s",
              "dime_ref_evals_per_s", "multiviz_ref_samples_per_s"):
        assert res[k] > 0, k
    # the estimates beat the all-zero estimate against exact enumeration, and every
    # permutation estimate is efficient whatever its budget
    assert 0 < res["shapley_mae"] < res["shapley_mae_of_zero"]
    assert 0 < res["multishap_mae"] < res["multishap_mae_of_zero"]
    assert res["shapley_efficiency_gap"] < 1e-3 * max(1.0, res["shapley_mae_of_zero"])
    sweep = res["forward_sweep"]  # padded and trimmed questions, every call size
    assert len(sweep) == 2 and f"L={32}" in sweep
    assert all(set(r) == {"16", "64", "128", "1024"} and min(r.values()) > 0
               for r in sweep.values())


def test_explain_cli_scores_a_user_explainer_on_a_given_model(tmp_path, capsys, monkeypatch):
    """`gridvqa explain --explainer module:function --model PATH`: the user's function is scored
    beside the controls, on the exported model (both regimes' models replaced)."""
    import sys
    import textwrap

    from gridvqa_jax.models import mdetr as M
    from gridvqa_jax.training import export as EX

    tiny = M.ModelConfig(d_model=32, n_heads=2, mlp_dim=64, enc_layers=1, dec_layers=1)
    params = M.init_params(tiny, jax.random.key(5))
    EX.export_model(tmp_path / "m", params, tiny, {"variant": "pure"})
    (tmp_path / "my_xai_cli.py").write_text(textwrap.dedent("""
        import numpy as np
        from gridvqa_jax.explain import from_maps
        SEEN = []
        def gt_cells(apply_fn, params, scenes, key, *, n_samples=1):
            SEEN.append(params)
            valid = np.asarray(scenes.tokens) != 0
            return from_maps(np.asarray(scenes.gt_cells, np.float32),
                             np.zeros(valid.shape, np.float32), valid)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    rc = gcli.main(["explain", "--regimes", "--n", "2", "--batch", "2", "--json", "--quiet",
                   "--explainer", "my_xai_cli:gt_cells", "--model", str(tmp_path / "m")])
    assert rc == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(last) == {"gt_cells", "random", "objects", "oracle", "protocol"}
    assert last["protocol"]["gt_cells"]["players"] == "not stated (user explainer)"
    assert last["protocol"]["gt_cells"]["budget"] == {"n_samples": 1}  # its signature's default
    assert last["gt_cells"]["pure"]["visual"]["rma"] == 1.0  # its map is the ground truth
    seen = sys.modules["my_xai_cli"].SEEN
    assert len(seen) == 3  # one batch of 2 per regime
    for p in seen:  # every regime ran on the exported model, not a shipped one
        for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(params)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # a bad spec or budget is one error line, exit status 2
    rc = gcli.main(["explain", "--regimes", "--n", "2", "--explainer", "my_xai_cli:nope"])
    assert rc == 2 and "no attribute 'nope'" in capsys.readouterr().err
    rc = gcli.main(["explain", "--regimes", "--n", "2", "--model", "both=" + str(tmp_path)])
    assert rc == 2 and "pure=PATH or spur=PATH" in capsys.readouterr().err


def test_table1_rejects_a_budget_keyword_before_any_model_runs():
    with pytest.raises(TypeError, match="n_sample"):
        T1.table1(n=2, explainers=("multishap",), budgets={"multishap": {"n_sample": 8}})


OFFICIAL = __import__("pathlib").Path(__file__).parent / "fixtures" / "official_gridvqa"


def _official_d07(root, n):
    """The first n d07 samples of an official folder, read here with json alone: (answer as a
    Scene label, {(row, col): colour} of the grounding boxes) in qa line order."""
    files = {}
    boxes = {}
    for line in (root / "grounding_val.jsonl").read_text().splitlines():
        g = json.loads(line)
        files[g["image"]["id"]] = g["image"]["file_name"]
        boxes[g["image"]["id"]] = {(a["bbox"][1] // 64, a["bbox"][0] // 64): a["color"]
                                   for a in g["annotations"]}
    out = []
    for line in (root / "qa_val.jsonl").read_text().splitlines():
        q = json.loads(line)
        if "/g5_d07/" in files[q["image_id"]]:
            a = q["answer"]
            out.append(({"yes": 1, "no": 0}.get(a, a), boxes[q["image_id"]]))
    return out[:n]


def test_explain_cli_scores_the_official_data(tmp_path, capsys, monkeypatch):
    """`gridvqa explain --pure-data DIR --spur-data DIR`: the scored samples are the first n d07
    samples of each folder in file order (answers and grounding boxes checked against the
    fixture's own files), pure and cross score the same D_pure samples, and too few samples is
    one error line before any model runs."""
    import sys
    import textwrap

    (tmp_path / "my_xai_rec.py").write_text(textwrap.dedent("""
        import numpy as np
        from gridvqa_jax.explain import from_maps
        SEEN = []
        def record(apply_fn, params, scenes, key):
            SEEN.append((np.asarray(scenes.answer), np.asarray(scenes.color)))
            valid = np.asarray(scenes.tokens) != 0
            return from_maps(np.asarray(scenes.gt_cells, np.float32),
                             np.zeros(valid.shape, np.float32), valid)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    n = 3
    rc = gcli.main(["explain", "--regimes", "--n", str(n), "--batch", str(n), "--json",
                    "--quiet", "--explainer", "my_xai_rec:record", "--explainers", "objects",
                    "--pure-data", str(OFFICIAL / "pure"),
                    "--spur-data", str(OFFICIAL / "spurious")])
    assert rc == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(last) == {"record", "objects", "protocol"}
    seen = sys.modules["my_xai_rec"].SEEN
    assert len(seen) == 3  # pure, spurious, cross: one batch of n each
    for (answer, color), folder in zip(seen, ("pure", "spurious", "pure")):
        want = _official_d07(OFFICIAL / folder, n)
        assert answer.tolist() == [a for a, _ in want]
        for i, (_, boxes) in enumerate(want):
            for (row, col), c in boxes.items():  # every grounded object is in the scene
                assert color[i, row, col] >= 0 and U.COLORS[color[i, row, col]] == c
    np.testing.assert_array_equal(seen[0][1], seen[2][1])  # cross: the same D_pure samples
    assert not np.array_equal(seen[0][1], seen[1][1])
    # the fixture holds 19 d07 samples per variant: more is refused, naming the folder
    rc = gcli.main(["explain", "--regimes", "--n", "20", "--explainers", "objects",
                    "--pure-data", str(OFFICIAL / "pure")])
    err = capsys.readouterr().err
    assert rc == 2 and "19 d07 samples, fewer than the n = 20" in err and "pure" in err
    # a D_spur folder where D_pure is needed is refused too
    rc = gcli.main(["explain", "--regimes", "--n", "2", "--explainers", "objects",
                    "--pure-data", str(OFFICIAL / "spurious")])
    assert rc == 2 and "D_pure" in capsys.readouterr().err


def test_dataset_scenes_cycles_through_the_buckets_of_a_bucket_sorted_file(scenes, monkeypatch):
    # The official generator writes many samples per bucket, one bucket after another: the
    # first n samples of the file would be one bucket. dataset_scenes takes them round-robin
    # over the buckets (file order within a bucket), as regime_scenes' generated ones.
    from gridvqa_jax.formats import datasets as DS

    assert T1.bucket_round_robin([3, 3, 3, 1, 1, 2]).tolist() == [0, 3, 5, 1, 4, 2]
    assert T1.bucket_round_robin([0, 1, 2, 0, 1, 2, 0]).tolist() == list(range(7))
    sorted_idx = np.argsort(scenes.bucket, kind="stable")
    layout = U.Spec.feasible("pure", grid_size=5, density=0.7)[0]
    part = DS.DatasetPart(DS.take_samples(scenes, sorted_idx), "d07", "pure", "fake", layout)
    d03 = part._replace(density_key="d03")
    monkeypatch.setattr(DS, "load_dataset", lambda path, variant=None: [d03, part])
    buckets = scenes.bucket[sorted_idx]
    firsts = [int(np.flatnonzero(buckets == b)[0]) for b in dict.fromkeys(buckets.tolist())]
    n = len(firsts) + 3  # every bucket, then the second sample of the first three
    assert np.all(np.bincount(buckets)[buckets] >= 2)
    want = (firsts + [i + 1 for i in firsts])[:n]
    got = T1.dataset_scenes("somewhere", "pure", n)
    np.testing.assert_array_equal(got.bucket, buckets[want])
    np.testing.assert_array_equal(got.color, scenes.color[sorted_idx][want])
    with pytest.raises(ValueError, match="D_pure dataset, but this regime needs D_spur"):
        T1.dataset_scenes("somewhere", "spur", 2)
    with pytest.raises(ValueError, match="48 d07 samples, fewer than the n = 49"):
        T1.dataset_scenes("somewhere", "pure", 49)
    monkeypatch.setattr(DS, "load_dataset", lambda path, variant=None: [d03])
    with pytest.raises(ValueError, match="no d07 samples"):
        T1.dataset_scenes("somewhere", "pure", 2)


def test_protocol_follows_the_options_and_budget_actually_used():
    # the budget is the n_* keywords passed, else the signature's default; options rename the
    # explained quantity, the baseline and the aggregation; a control has no players
    from gridvqa_jax.explain.multishap import multishap

    p = T1.explainer_protocol("multishap", multishap, {"chunk": 4})
    # multishap's defaults; chunk is no budget
    assert p["budget"] == {"n_samples": 64, "sampling": "iid"}
    p = T1.explainer_protocol("multishap", multishap, {
        "n_samples": 32, "target": "label", "quantity": "log_odds", "baseline": "gray",
        "text_aggregate": "abs"})
    assert p == {"players": "cells x tokens (SII); textual map sum_c |Phi[c, t]|",
                 "baseline": "mid-gray 128 / PAD",
                 "target": "log-odds of the ground-truth answer",
                 "budget": {"n_samples": 32, "sampling": "iid"}}
    assert T1.explainer_protocol("multiviz", None, {}, {"pure": "pixel"})["baseline"].startswith(
        "no embed split: pixel gradient x (input - empty tiles)")
    assert T1.explainer_protocol("objects", T1.EXPLAINERS["objects"], {}) == {
        "players": "none (control)", "baseline": "none",
        "target": "none: uniform on the occupied cells and the non-PAD tokens", "budget": {}}

    def mine(apply_fn, params, scenes, key, *, n_masks=10):
        return None

    mine.protocol = {"players": "superpixels", "baseline": "blur", "target": "logit"}
    assert T1.explainer_protocol("mine", mine, {}) == {
        "players": "superpixels", "baseline": "blur", "target": "logit",
        "budget": {"n_masks": 10}}


def test_protocol_names_how_multishap_draws_its_coalitions():
    # the reference stratifies coalition sizes, so an i.i.d. row says it draws i.i.d.: as passed,
    # else the signature's default; order 1 samples permutations and names no size draw
    from gridvqa_jax.explain.multishap import multishap, multishap_regions

    for fn in (multishap, multishap_regions):
        assert T1.explainer_protocol("multishap", fn, {})["budget"]["sampling"] == "iid"
        assert T1.explainer_protocol("multishap", fn, {"sampling": "stratified"})[
            "budget"]["sampling"] == "stratified"
    assert "sampling" not in T1.explainer_protocol("multishap", multishap, {"order": 1})["budget"]
    assert "sampling" not in T1.explainer_protocol("dime", T1.EXPLAINERS["dime"], {})["budget"]
    # the note under a table names the i.i.d. rows only
    p = {"multishap": {"budget": {"n_samples": 128, "sampling": "iid"}},
         "multishap_ref": {"budget": {"n_samples": 8, "sampling": "stratified"}},
         "dime": {"budget": {"n_samples": 1024}}}
    note = T1.sampling_note(p)
    assert note.startswith("multishap: coalition sizes drawn i.i.d.") and "stratified" in note
    assert T1.sampling_note({e: p[e] for e in ("multishap_ref", "dime")}) is None
    # the shipped table (H200, i.i.d.: no part was stratified then) says so, in text and report
    res = json.loads((Path(T1.__file__).parents[1] / "docs/table1_default/results.json")
                     .read_text())
    assert {res["protocol"][e]["budget"]["sampling"] for e in T1.MULTISHAP_ROWS} == {"iid"}
    assert "multishap, multishap_ref: coalition sizes drawn i.i.d." in T1.format_table(res)
    from reproduction import report
    assert "multishap, multishap_ref: coalition sizes drawn i.i.d." in report.table1_markdown(res)


def test_multishap_sampling_reaches_the_multishap_rows_their_sweeps_and_protocol(
        tmp_path, capsys, monkeypatch):
    seen = []

    def recording(apply_fn, params, scenes, key, *, n_samples=64, sampling="iid", **kw):
        seen.append(sampling)
        return _constant(apply_fn, params, scenes, key)

    monkeypatch.setitem(T1.EXPLAINERS, "multishap", recording)
    rc = gcli.main(["explain", "--regimes", "--n", "2", "--batch", "2", "--json", "--quiet",
                    "--figures", "0", "--explainers", "multishap", "objects",
                    "--multishap-samples", "8", "--multishap-sampling", "stratified"])
    assert rc == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert seen == ["stratified"] * 3  # one batch per regime
    assert last["protocol"]["multishap"]["budget"] == {"n_samples": 8, "sampling": "stratified"}
    assert last["protocol"]["objects"]["budget"] == {}
    # a sweep: every MultiSHAP budget becomes a mapping, other rows and "iid" are untouched
    sweep = {"multishap": (8, 32), "multishap_ref": ({"n_samples": 8, "baseline": "gray"},),
             "dime": (64, 256)}
    assert T1.with_multishap_sampling(sweep, "stratified") == {
        "multishap": ({"n_samples": 8, "sampling": "stratified"},
                      {"n_samples": 32, "sampling": "stratified"}),
        "multishap_ref": ({"n_samples": 8, "baseline": "gray", "sampling": "stratified"},),
        "dime": (64, 256)}
    assert T1.with_multishap_sampling(sweep, "iid") is sweep
    assert T1.sample_budgets({"multishap": 4, "dime": 8}, "both", "stratified")[
        "multishap_ref"]["sampling"] == "stratified"
    with pytest.raises(ValueError, match="sampling must be one of iid, stratified"):
        T1.with_multishap_sampling(sweep, "sobol")


@pytest.mark.slow  # ~100 s: six real explainers compiled
def test_explain_cli_players_both_end_to_end(tmp_path, capsys):
    """`gridvqa explain --regimes --players both` with the real explainers on a tiny random
    GridMDETR: every cell row and its reference row scored in every regime, each reference row
    with its reference protocol (patches / superpixels / pixels, gray or black, MultiSHAP's
    label log-odds), MultiViz on the embedding path, the findings re-judged on the reference
    rows, and per-pixel maps that differ from the cell maps."""
    from gridvqa_jax.training import export as EX

    model = tiny_mdetr(seed=3)
    EX.export_model(tmp_path / "m", model.params, model.config, {"variant": "pure"})
    out = tmp_path / "t1"
    rc = gcli.main(["explain", "--regimes", "--n", "2", "--batch", "2", "--json", "--quiet",
                    "--players", "both", "--multishap-samples", "1", "--dime-samples", "4",
                    "--figures", "0", "--explainers", "multishap", "dime", "multiviz",
                    "objects", "--model", str(tmp_path / "m"), "--out", str(out)])
    assert rc == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = ["multishap", "dime", "multiviz", "objects", "multishap_ref", "dime_ref",
            "multiviz_ref"]
    assert list(last) == [*rows, "protocol"]
    for e in rows:
        for r in ("pure", "spurious", "cross"):
            for mod in ("visual", "textual"):
                assert 0.0 <= last[e][r][mod]["rma"] <= 1.0, (e, r, mod)
    p = last["protocol"]
    assert p["multishap_ref"]["players"].startswith("12 x 12 image patches")
    assert p["multishap_ref"]["baseline"] == "mid-gray 128 / PAD"
    assert p["multishap_ref"]["target"] == "log-odds of the ground-truth answer"
    assert p["multishap_ref"]["budget"] == p["multishap"]["budget"] == {"n_samples": 1,
                                                                        "sampling": "iid"}
    assert p["dime_ref"]["players"].startswith("quickshift superpixels")
    assert p["dime_ref"]["baseline"] == "black 0 / PAD"
    assert p["dime_ref"]["budget"] == {"n_samples": 4}
    assert p["multiviz_ref"]["players"].startswith("pixels x tokens")
    body = json.loads((out / "results.json").read_text())
    assert body["model_access"]["multiviz_ref"] == {r: "embedding"
                                                    for r in ("pure", "spurious", "cross")}
    assert body["budgets"]["multiviz_ref"] == {"granularity": "pixels", "pixel_baseline": "gray"}
    ref = body["findings_reference"]
    assert ref and all(f["finding"].endswith("[reference players]") for f in ref)
    # the reference rows are other maps: their visual scores are not the cell rows'
    for e in ("multishap", "dime", "multiviz"):
        assert not np.isclose(last[e]["pure"]["visual"]["iou"],
                              last[e + "_ref"]["pure"]["visual"]["iou"]), e
