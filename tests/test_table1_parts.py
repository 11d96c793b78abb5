"""Table 1's parts on disk: a resumed run reuses finished explainer x regime scores only under
the same settings, and a finished run's per-sample scores judge the findings again."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from mmx_base.errors import InputError
from reproduction import table1 as T1
from reproduction import table1_parts as PARTS
from test_multiviz import tiny_mdetr


@pytest.fixture(scope="module")
def scenes(pure07):
    from conftest import subset

    return subset(pure07[1], np.arange(4))


def _run(model, parts, scenes, key=0):
    # the samples given: the generator's compile is the fixture's, shared with other tests
    return T1.table1(4, explainers=("random", "objects"), regimes=("pure", "cross"), batch=2,
                     models={"pure": model, "spur": model}, key=jax.random.key(key),
                     parts_dir=parts, data={"pure": scenes, "spur": scenes})


def test_a_resumed_run_reuses_its_parts_and_refuses_other_settings(tmp_path, monkeypatch,
                                                                    scenes):
    model = tiny_mdetr()
    parts = tmp_path / "parts"
    first = _run(model, parts, scenes)
    names = sorted(p.name for p in parts.iterdir())
    assert names == ["objects__cross.npz", "objects__pure.npz", "random__cross.npz",
                     "random__pure.npz"]
    # the second run computes nothing: every explainer call would fail
    def refuse(*a, **k):
        raise AssertionError("an explainer ran although its part was saved")

    monkeypatch.setattr(T1, "call_explainer", refuse)
    again = _run(model, parts, scenes)
    jax.tree.map(np.testing.assert_array_equal, again["per_sample"], first["per_sample"])
    assert again["table"] == first["table"]
    # another key: the saved parts belong to another run, refused with the field named
    with pytest.raises(InputError, match="key"):
        _run(model, parts, scenes, key=1)
    # other model parameters: the model digest differs
    other = model._replace(params=jax.tree.map(lambda p: p + 1.0, model.params))
    with pytest.raises(InputError, match="model"):
        _run(other, parts, scenes)
    # a truncated part is refused with its path, not read as scores
    path = PARTS.part_path(parts, "random", "pure")
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(InputError, match="random__pure.npz"):
        _run(model, parts, scenes)


def test_parts_drawn_another_way_are_refused(tmp_path, monkeypatch, scenes):
    """A row whose module declares how it draws its masks (``MASK_DRAWS``: DIME's and
    MultiSHAP's) carries it in its parts: parts of the earlier draws are refused, naming the
    field."""
    import importlib

    from gridvqa_jax.explain import scoring
    from mmx_base import lime

    dime = importlib.import_module("gridvqa_jax.explain.dime")  # the package binds the function
    model = tiny_mdetr()
    assert T1._mask_draws(T1.EXPLAINERS["dime"], {}) == {"mask_draws": lime.MASK_DRAWS}
    assert T1._mask_draws(dime.dime_regions, {}) == {"mask_draws": lime.MASK_DRAWS}
    from gridvqa_jax.explain import interactions, shapley

    multishap = importlib.import_module("gridvqa_jax.explain.multishap")
    for fn in (T1.EXPLAINERS["multishap"], multishap.multishap_regions):
        assert T1._mask_draws(fn, {}) == {"mask_draws": interactions.COALITION_DRAWS}
    # first-order values are drawn by permutations, not SII coalitions
    assert T1._mask_draws(T1.EXPLAINERS["multishap"], {"order": 1}) == {
        "mask_draws": multishap.PERMUTATION_DRAWS}
    assert multishap.PERMUTATION_DRAWS.startswith(shapley.PERMUTATION_DRAWS)
    assert T1._mask_draws(T1.EXPLAINERS["multiviz"], {"order": 1}) == {}
    _run(model, tmp_path, scenes)  # the controls' module declares no draws: parts without one
    monkeypatch.setattr(scoring, "MASK_DRAWS", "another law", raising=False)
    with pytest.raises(InputError, match="mask_draws"):
        _run(model, tmp_path, scenes)


def test_a_missing_part_is_computed_and_the_others_are_kept(tmp_path, scenes):
    model = tiny_mdetr()
    parts = tmp_path / "parts"
    first = _run(model, parts, scenes)
    PARTS.part_path(parts, "random", "cross").unlink()
    again = _run(model, parts, scenes)
    jax.tree.map(np.testing.assert_array_equal, again["per_sample"], first["per_sample"])
    assert PARTS.part_path(parts, "random", "cross").exists()


def test_per_sample_scores_round_trip_and_judge_the_findings_again(tmp_path, scenes):
    model = tiny_mdetr()
    res = _run(model, None, scenes)
    path = PARTS.save_per_sample(tmp_path / "per_sample.npz", res["per_sample"])
    back = PARTS.load_per_sample(path)
    jax.tree.map(np.testing.assert_array_equal, back, res["per_sample"])
    assert T1.cell_findings(back) == res["findings"]  # the run's own verdicts, from disk
    # write_results puts it beside results.json
    out = T1.write_results(tmp_path / "out", lambda stage: res)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["per_sample.npz",
                                                                    "results.json"]
    jax.tree.map(np.testing.assert_array_equal,
                 PARTS.load_per_sample(tmp_path / "out" / "per_sample.npz"), out["per_sample"])


def test_digest_sees_every_byte_dtype_and_shape():
    a = np.arange(6, dtype=np.int32)
    assert PARTS.digest({"x": a}) == PARTS.digest({"x": a.copy()})
    assert PARTS.digest({"x": a}) != PARTS.digest({"x": a.reshape(2, 3)})
    assert PARTS.digest({"x": a}) != PARTS.digest({"x": a.astype(np.int64)})
    b = a.copy()
    b[3] += 1
    assert PARTS.digest({"x": a}) != PARTS.digest({"x": b})
    assert PARTS.digest(jax.random.key(0)) != PARTS.digest(jax.random.key(1))


def test_a_stopped_budget_sweep_resumes_from_its_parts(tmp_path, monkeypatch, scenes):
    from reproduction import convergence as CV

    model = tiny_mdetr()
    kw = dict(budgets={"random": (1, 2)}, reliability_n=4, models={"pure": model, "spur": model},
              batch=2, key=jax.random.key(4), parts_dir=tmp_path / "conv",
              table1_kw={"data": {"pure": scenes, "spur": scenes}})
    first = CV.convergence(4, **kw)
    assert sorted(p.name for p in (tmp_path / "conv").iterdir()) == [
        f"random_{b}_{t}" for b in (1, 2) for t in ("main", "split1", "split2")]
    monkeypatch.setattr(T1, "call_explainer", lambda *a, **k: 1 / 0)
    again = CV.convergence(4, **kw)
    jax.tree.map(np.testing.assert_array_equal, again["per_sample"], first["per_sample"])
    assert again["explainers"]["random"]["runs"][0]["wall_s"] == \
        first["explainers"]["random"]["runs"][0]["wall_s"]  # the time it took, as saved
