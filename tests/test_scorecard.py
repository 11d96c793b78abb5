"""The Table 1 scorecard: bounds from the controls, exact scores of constant maps, the per-form
breakdown, the spread measures, the `gridvqa explain` JSON schema and files, and the bench keys."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from reproduction.cli import gridvqa as gcli
from gridvqa_jax.explain import attribution as AT
from reproduction import table1 as T1
from gridvqa_jax.world import generate as G
from gridvqa_jax.world import universe as U


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
    assert set(last) == {"multishap", "dime", "multiviz", "random", "oracle"}
    for e, regimes in last.items():
        assert set(regimes) == {"pure", "spurious", "cross"}
        for r in regimes.values():
            assert set(r) == {"visual", "textual"}
            for mod in r.values():
                assert set(mod) == {"rma", "rma_std", "iou", "iou_std"}
    assert last["oracle"]["pure"]["visual"]["rma"] == 1.0
    body = json.loads((out / "results.json").read_text())
    assert len(body["findings"]) == 4 and all("verdict" in f for f in body["findings"])
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


@pytest.mark.slow
def test_bench_explainers_keys():
    from reproduction import bench_explainers as BX

    res = BX.bench_explainers(batch=2, budget=128, chunk=32, multishap_samples=1, dime_samples=2,
                             mae_budget=100, cheap_budget=500, repeats=1)
    keys = ["forward_evals_per_s", "multishap_evals_per_s", "shapley_evals_per_s",
            "dime_evals_per_s", "multiviz_samples_per_s", "shap_permutation_evals_per_s",
            "shapiq_evals_per_s", "cheap_shapley_evals_per_s", "cheap_shap_evals_per_s",
            "cheap_shapiq_evals_per_s", "shapley_mae", "shap_mae", "multishap_mae",
            "shapiq_mae"]
    for k in keys:
        assert k in res
    assert res["forward_evals_per_s"] > 0
    for k in ("shapley_evals_per_s", "multishap_evals_per_s", "dime_evals_per_s",
              "multiviz_samples_per_s", "cheap_shapley_evals_per_s"):
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
    assert set(last) == {"gt_cells", "random", "oracle"}
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
