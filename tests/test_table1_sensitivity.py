"""reproduction.table1_sensitivity: MultiSHAP's Table 1 row under each of its open choices, on
the same samples, models and keys as Table 1 (a tiny linear-softmax model over the real d07
scenes keeps the runs in seconds; the estimator itself is tested in test_multishap)."""

import importlib
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gridvqa_jax.explain import attribution as AT
from gridvqa_jax.world import universe as U
from mmx_base.errors import InputError
from reproduction import table1 as T1
from reproduction import table1_sensitivity as T1S
from reproduction.cli import gridvqa as gcli

MS = importlib.import_module("gridvqa_jax.explain.multishap")  # the package binds the function

S, A, V = 5, 5 * 5 + 3, len(U.VOCAB)


def tiny_apply(params, image, tokens):
    """log_softmax of cell-colour x question-embedding logits: every cell and token interacts,
    and the absent state matters (white, gray and black cells have different means)."""
    K, H = image.shape[0], image.shape[1]
    p = H // S
    f = jnp.asarray(image, jnp.float32).reshape(K, S, p, S, p, 3).mean((2, 4)) / 255 - 0.5
    f = f.reshape(K, S * S, 3)
    q = jnp.sum(params["E"][tokens] * (tokens != U.PAD_ID)[..., None], axis=1)  # [K, 3]
    logits = (jnp.einsum("kcd,cda->ka", f, params["Wc"])
              + jnp.einsum("kcd,kd,ca->ka", f, q, params["Wi"]))
    return {"answer_logprobs": jax.nn.log_softmax(logits, axis=-1)}


def tiny_model(seed=0):
    r = np.random.default_rng(seed)
    return tiny_apply, {"E": jnp.asarray(r.normal(0, 1, (V, 3)), jnp.float32),
                        "Wc": jnp.asarray(r.normal(0, 1, (S * S, 3, A)), jnp.float32),
                        "Wi": jnp.asarray(r.normal(0, 1, (S * S, A)), jnp.float32)}


def test_choices_cover_each_option_and_the_reference():
    one = T1S.choices()
    assert set(one) == {"default", "target=label", "quantity=log_odds", "baseline=gray",
                        "baseline=black", "text_aggregate=abs", "visual_aggregate=abs",
                        "reference"}
    assert one["default"] == {} and one["reference"] == MS.REFERENCE_OPTIONS
    for name, opts in one.items():
        if "=" in name:
            k, v = name.split("=")
            assert opts == {k: v}
    full = T1S.choices("full")
    assert len(full) == 2 * 2 * 3 * 2 and "default" in full and full["default"] == {}
    combos = {tuple(sorted({**MS.DEFAULT_OPTIONS, **o}.items())) for o in full.values()}
    assert len(combos) == 24
    with pytest.raises(InputError, match="design"):
        T1S.choices("half")


def test_sensitivity_rows_and_the_default_is_table1s_multishap_row():
    models = {"pure": tiny_model()}
    seen = []
    res = T1S.sensitivity(2, budget=1, models=models, batch=2, log=seen.append)
    names = list(T1S.choices())
    assert list(res["table"]) == names and list(res["per_sample"]) == names
    assert res["regimes"] == ["pure"] and res["budget"] == {"n_samples": 1}
    assert res["options"]["reference"] == MS.REFERENCE_OPTIONS
    assert res["options"]["default"] == MS.DEFAULT_OPTIONS
    assert len(seen) == len(names)
    # Table 1 itself (MultiSHAP beside the controls, same seed, batches and budget)
    t1 = T1.table1(2, explainers=("multishap", "random", "oracle"), regimes=("pure",),
                   budgets={"multishap": {"n_samples": 1}}, batch=2, models=models)
    np.testing.assert_equal(res["table"]["default"]["pure"], t1["table"]["multishap"]["pure"])
    np.testing.assert_equal(res["per_sample"]["default"]["pure"],
                            t1["per_sample"]["multishap"]["pure"])
    # same game and key: an aggregate changes one modality only, bit for bit
    ps = res["per_sample"]
    np.testing.assert_equal(ps["text_aggregate=abs"]["pure"]["visual"],
                            ps["default"]["pure"]["visual"])
    np.testing.assert_equal(ps["visual_aggregate=abs"]["pure"]["textual"],
                            ps["default"]["pure"]["textual"])
    # a different game gives different maps somewhere
    assert any(not np.array_equal(ps[c]["pure"]["visual"]["pixel"]["rma"],
                                  ps["default"]["pure"]["visual"]["pixel"]["rma"],
                                  equal_nan=True) for c in ("baseline=gray", "baseline=black"))
    # paired differences to the default, for every other choice
    assert set(res["delta"]) == set(names) - {"default"}
    for name, d in res["delta"].items():
        assert set(d["pure"]) == {"visual_rma", "visual_iou", "textual_rma", "textual_iou"}
        # in float64, as the table's differences are (the maps' scores are float32)
        want = np.nanmean(np.asarray(ps[name]["pure"]["visual"]["pixel"]["rma"], np.float64)
                          - np.asarray(ps["default"]["pure"]["visual"]["pixel"]["rma"],
                                       np.float64))
        if np.isfinite(want):
            assert abs(d["pure"]["visual_rma"][0] - want) < 1e-12
    # the objects floor: Table 1's control on the same samples, and every choice against it
    np.testing.assert_equal(res["floor"]["pure"], T1.table1(
        2, explainers=("objects",), regimes=("pure",), batch=2, models=models)["table"]
        ["objects"]["pure"])
    floor = np.asarray(res["floor_per_sample"]["pure"]["visual"]["pixel"]["rma"], np.float64)
    assert set(res["vs_floor"]) == set(names)
    for name, d in res["vs_floor"].items():
        want = np.nanmean(np.asarray(ps[name]["pure"]["visual"]["pixel"]["rma"], np.float64)
                          - floor)
        assert abs(d["pure"]["visual_rma"][0] - want) < 1e-12
    d0 = res["delta"]["text_aggregate=abs"]["pure"]["visual_rma"][0]
    assert d0 == 0.0 or np.isnan(d0)
    text = T1S.format_sensitivity(res)
    for name in names:
        assert name in text
    assert "reference (WGLab/MultiSHAP)" in text and "regime pure" in text
    # the budget names MultiSHAP's draw, and the reference's stratified one is not hidden
    assert "n_samples = 1, sampling = iid;" in text.splitlines()[0]
    assert text.splitlines()[1].endswith("it stratifies coalition sizes, which no choice here "
                                         "does (sampling = iid)")
    text = T1S.format_sensitivity({**res, "budget": {**res["budget"], "sampling": "stratified"}})
    assert "sampling = stratified;" in text and text.splitlines()[1].endswith(", as here")
    floor_line = next(x for x in text.splitlines() if x.startswith("objects floor"))
    assert f"{100 * res['floor']['pure']['visual']['rma']:5.1f}" in floor_line
    line = json.loads(json.dumps(T1S.compact(res)))
    assert "per_sample" not in line and "floor_per_sample" not in line
    assert set(line["table"]) == set(names) and set(line["vs_floor"]) == set(names)


def test_sensitivity_refuses_bad_arguments():
    models = {"pure": tiny_model()}
    with pytest.raises(InputError, match="unknown option"):
        T1S.sensitivity(2, budget=1, models=models, design={"x": {"colour": "red"}})
    with pytest.raises(InputError, match="baseline must be one of"):
        T1S.sensitivity(2, budget=1, models=models, design={"x": {"baseline": "white"}})
    with pytest.raises(InputError, match="regimes"):
        T1S.sensitivity(2, budget=1, models=models, regimes=("both",))
    with pytest.raises(InputError, match="the choices set"):
        T1S.sensitivity(2, budget={"n_samples": 1, "baseline": "gray"}, models=models)


def test_cli_sensitivity_prints_it_and_adds_it_to_the_json_line(capsys, monkeypatch):
    # a stand-in MultiSHAP (its options move its maps) keeps the CLI run in seconds
    def fake_multishap(apply_fn, params, scenes, key, *, cell_px=16, n_samples=8,
                       target="predicted", quantity="logprob", baseline="empty",
                       text_aggregate="signed", visual_aggregate="signed"):
        valid = np.asarray(scenes.tokens) != U.PAD_ID
        shift = {"empty": 0.0, "gray": 1.0, "black": 2.0}[baseline]
        vis = np.broadcast_to(np.arange(25, dtype=np.float32).reshape(5, 5) + shift,
                              scenes.gt_cells.shape)
        return AT.from_maps(vis, np.cumsum(valid, 1).astype(np.float32), valid)

    monkeypatch.setitem(T1.EXPLAINERS, "multishap", fake_multishap)
    rc = gcli.main(["explain", "--regimes", "--n", "2", "--batch", "2", "--json",
                    "--explainers", "random", "--sensitivity"])
    assert rc == 0
    out = capsys.readouterr().out.strip().splitlines()
    last = json.loads(out[-1])
    assert {"random", "sensitivity"} <= set(last)
    sens = last["sensitivity"]
    assert sens["regimes"] == ["pure"] and sens["n"] == 2 and sens["budget"] == T1.DEFAULT_BUDGETS["multishap"]
    assert set(sens["table"]) == set(T1S.choices())
    assert any(line.startswith("MultiSHAP sensitivity") for line in out)


def test_sensitivity_of_the_reference_granularity_row():
    # players="reference": the multishap_ref row (ViLT's patches); its "reference" choice is
    # Table 1's reference row (the reference's options), on the same keys
    models = {"pure": tiny_model()}
    design = {"reference": MS.REFERENCE_OPTIONS}
    res = T1S.sensitivity(2, budget=1, models=models, batch=2, design=design,
                          players="reference")
    assert res["row"] == "multishap_ref" and list(res["table"]) == ["default", "reference"]
    t1 = T1.table1(2, explainers=("multishap",), regimes=("pure",), batch=2, models=models,
                   players="reference", budgets={"multishap_ref": {"n_samples": 1,
                                                                   **MS.REFERENCE_OPTIONS}})
    np.testing.assert_equal(res["per_sample"]["reference"]["pure"],
                            t1["per_sample"]["multishap_ref"]["pure"])
    assert "multishap_ref row" in T1S.format_sensitivity(res)
    with pytest.raises(InputError, match="players"):
        T1S.sensitivity(2, budget=1, models=models, players="both")


def test_a_stopped_sensitivity_run_resumes_from_its_parts(tmp_path, monkeypatch):
    models = {"pure": tiny_model()}
    design = {"default": {}, "baseline=gray": {"baseline": "gray"}}
    kw = dict(budget=1, models=models, batch=2, design=design, parts_dir=tmp_path / "sens")
    first = T1S.sensitivity(2, **kw)
    assert sorted(p.name for p in (tmp_path / "sens").iterdir()) == ["baseline=gray", "default",
                                                                   "objects_floor"]
    monkeypatch.setattr(T1, "call_explainer", lambda *a, **k: 1 / 0)  # nothing may run again
    again = T1S.sensitivity(2, **kw)
    jax.tree.map(np.testing.assert_array_equal, again["per_sample"], first["per_sample"])
    jax.tree.map(np.testing.assert_array_equal, again["floor_per_sample"],
                 first["floor_per_sample"])
    # a part saved under other settings is refused, not reused
    with pytest.raises(InputError, match="budget"):
        T1S.sensitivity(2, **{**kw, "budget": 2})


def test_shipped_sensitivity_parts_are_step_3s_and_are_reused(tmp_path, monkeypatch):
    """docs/table1_default/sensitivity_parts holds the choices of experiments/table1_full.sh's
    step 3 (the multishap_ref row over ViLT's patches, pure, n = 32, 16 coalitions) that a CPU
    finished. They were drawn before MultiSHAP's per-player coalition keys (``MASK_DRAWS``), so
    the step refuses them, naming that field and no other; under the draws they were made with
    (no ``MASK_DRAWS``) each loads under the fingerprint that step computes, so the step reuses
    it and no MultiSHAP run starts again; and where M_pure predicts the label (checked by its
    own forward here), target=label explains the same answer with the same keys as the
    default, so its per-sample scores equal the default's exactly."""
    import shutil
    from pathlib import Path

    import jax.numpy as jnp

    from gridvqa_jax.evaluate import predict, render_batch
    from gridvqa_jax.models import mdetr as M
    from gridvqa_jax.training.export import load_reference_model

    shipped = Path(__file__).resolve().parents[1] / "docs" / "table1_default" / "sensitivity_parts"
    design = {k: v for k, v in T1S.choices().items() if (shipped / k).is_dir()}
    assert "default" in design and set(p.name for p in shipped.iterdir()) <= set(design) | {
        T1S.FLOOR + "_floor"}
    shutil.copytree(shipped, tmp_path / "sensitivity")
    real = T1.call_explainer

    def floor_only(fn, *a, **k):
        assert "multishap" not in T1._function_name(fn), "a shipped choice ran again"
        return real(fn, *a, **k)

    monkeypatch.setattr(T1, "call_explainer", floor_only)
    complete = list(design) == list(T1S.choices())  # then the step's own call
    with pytest.raises(InputError, match=r"other settings \(mask_draws differ\)"):
        T1S.sensitivity(32, budget=16, players="reference", design={"default": {}},
                        parts_dir=tmp_path / "sensitivity")
    monkeypatch.delattr(importlib.import_module("gridvqa_jax.explain.multishap"), "MASK_DRAWS")
    res = T1S.sensitivity(32, budget=16, players="reference",
                          design="one_at_a_time" if complete else design,
                          parts_dir=tmp_path / "sensitivity")
    assert list(res["table"]) == list(design)
    if "target=label" in design:
        scenes = T1.regime_scenes("pure", 32)
        apply_fn, params, *_ = load_reference_model("pure")
        image = render_batch(jnp.asarray(scenes.color), jnp.asarray(scenes.shape), 16)
        agree = (predict(apply_fn, params, image, jnp.asarray(scenes.tokens))
                 == np.asarray(M.answer_index(scenes.answer, scenes.is_yesno, 25)))
        assert agree.any()
        jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a)[agree],
                                                                np.asarray(b)[agree]),
                     res["per_sample"]["target=label"]["pure"],
                     res["per_sample"]["default"]["pure"])
    if complete:  # every choice shipped: so are the step's outputs, recomputed from the parts
        import json

        docs = shipped.parent
        assert T1S.format_sensitivity(res) == (docs / "sensitivity.txt").read_text().rstrip("\n")
        assert json.loads(json.dumps(T1S.compact(res))) == json.loads(
            (docs / "sensitivity.json").read_text())
