"""The detector-quality sweep (analysis.quality_sweep), the re-choice of the improved variant
on a tuning seed (analysis.tune_variant), their CLI flags and the sweep's figure. Stand-in
views and detectors keep these fast; the real ones run in the slow CLI test."""

import json

import jax
import numpy as np
import pytest

from bias_jax import analysis as AN
from bias_jax import detectors as D
from bias_jax import ensemble as EN
from bias_jax import views as VW
from bias_jax.data.batch import Batch
from bias_jax.views import causal as CA
from reproduction import quality_sweep as QS
from reproduction.cli import bias as bcli

N = 60
RNG = np.random.default_rng(0)
TRUTH = np.concatenate([np.zeros(12), np.ones(38), np.full(10, 2)]).astype(np.int32)
LABEL = np.tile([0, 1], N // 2).astype(np.int32)


def _batch() -> Batch:
    """Sample i carries its index and label in its pixels and tokens (what the stand-in
    detectors read)."""
    image = np.zeros((N, 4, 4, 3), np.uint8)
    image[:, 0, 0, 0], image[:, 0, 0, 1] = np.arange(N), LABEL
    tokens = np.zeros((N, 3), np.int32)
    tokens[:, 0], tokens[:, 1] = np.arange(N) + 1, LABEL + 1
    return Batch(image=image, tokens=tokens, label=LABEL, bias=TRUTH,
                 fine_label=np.full(N, -1, np.int32), image_core=np.zeros((N, 4, 4), bool),
                 text_core=np.zeros((N, 3), bool), has_gt=np.ones(N, bool),
                 index=np.arange(N, dtype=np.int32))


def _stub(reads_text: bool):
    """A detector that is right on sample i iff ``params[i] > 0`` (i and the label read from
    the tokens, or from the pixels when it does not read text)."""
    def apply(params, image, tokens):
        image, tokens = np.asarray(image), np.asarray(tokens)
        if reads_text:
            i, lab = tokens[:, 0] - 1, tokens[:, 1] - 1
        else:
            i, lab = image[:, 0, 0, 0].astype(np.int64), image[:, 0, 0, 1].astype(np.int64)
        return np.asarray(params)[i] * (2.0 * lab - 1.0)
    return apply


def _set(p_right: dict, rng) -> dict:
    return {k: (_stub("text" in D.MODALITIES[k]),
                np.where(rng.random(N) < p_right[k], 1.0, -1.0), D.DetectorConfig(kind=k))
            for k in D.KINDS}


def _noisy(truth, p_wrong, rng):
    wrong = rng.random(truth.size) < p_wrong
    return np.where(wrong, (truth + rng.integers(1, 3, truth.size)) % 3, truth).astype(np.int32)


def _macro_f1(pred, truth) -> float:
    f1 = []
    for c in range(3):
        tp = np.sum((pred == c) & (truth == c))
        fp, fn = np.sum((pred == c) & (truth != c)), np.sum((pred != c) & (truth == c))
        f1.append(0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn))
    return float(np.mean(f1))


def _prior_majority(labels: dict) -> np.ndarray:
    """The paper's prior majority by hand: two or three equal votes win; three different ones
    go to the class most frequent among all the views' labels."""
    table = np.stack([labels[v] for v in ("benefit", "flow", "causal")])
    counts = np.bincount(table.ravel(), minlength=3)
    top = int(np.argmax(counts))
    assert sorted(counts)[-1] > sorted(counts)[-2]  # no tie in the priority (by construction)
    out = np.full(N, top)
    for n in range(N):
        vals, cnt = np.unique(table[:, n], return_counts=True)
        if cnt.max() >= 2:
            out[n] = vals[np.argmax(cnt)]
    return out


def _install_views(monkeypatch, table: dict):
    """Views answering the labels ``table[id(joint params)][view]``."""
    def fake(name):
        def view(detectors, batch, *, key=None, **opts):
            lab = table[id(detectors["joint"][1])][name]
            return VW.ViewResult(lab, np.zeros(N, np.float32), {})
        return view

    for name in VW.VIEWS:
        monkeypatch.setitem(VW.VIEW_FNS, name, fake(name))


def test_sweep_has_one_entry_per_set_scored_as_an_independent_recount(monkeypatch):
    rng = np.random.default_rng(1)
    quality = (0.55, 0.75, 0.95)
    sets, table = [], {}
    for q in quality:
        s = _set({k: q for k in D.KINDS}, rng)
        sets.append(s)
        table[id(s["joint"][1])] = {v: _noisy(TRUTH, 1 - q + 0.05 * i, rng)
                                    for i, v in enumerate(("benefit", "flow", "causal"))}
    _install_views(monkeypatch, table)
    batch = _batch()
    sweep = AN.quality_sweep(sets, batch, names=["a", "b", "c"])
    assert len(sweep) == len(sets) and [e["set"] for e in sweep] == ["a", "b", "c"]
    for s, e in zip(sets, sweep):
        per = {k: float(np.mean(s[k][1] > 0)) for k in D.KINDS}
        assert e["detector_accuracies"] == pytest.approx(per)
        assert e["detector_accuracy"] == pytest.approx(np.mean(list(per.values())))
        labels = dict(table[id(s["joint"][1])])
        labels["ensemble"] = _prior_majority(labels)
        for v, lab in labels.items():
            assert e[v]["accuracy"] == pytest.approx(np.mean(lab == TRUTH)), v
            assert e[v]["macro_f1"] == pytest.approx(_macro_f1(lab, TRUTH)), v
    # better detectors, better views here (by construction): the figure's x-axis is ordered
    assert [e["detector_accuracy"] for e in sweep] == sorted(e["detector_accuracy"]
                                                            for e in sweep)
    # one entry is what analyze itself reports for that set
    res, _ = AN.analyze(sets[1], batch)
    line = AN.headline(res)
    for v in ("benefit", "flow", "causal", "ensemble"):
        assert sweep[1][v] == line[v]
    assert "quality_sweep" not in line


def _tuning_fakes(monkeypatch, causal_same: bool):
    rng = np.random.default_rng(2)
    benefit = {"logprob": _noisy(TRUTH, 0.3, rng), "binary": _noisy(TRUTH, 0.1, rng)}
    flow = _noisy(TRUTH, 0.6, rng)
    target = {"fusion": "tanh", "calibration": "path", "effect": "abs", "mediator": "both"}
    good, noise = _noisy(TRUTH, 0.05, rng), {}

    def fake_benefit(detectors, batch, *, key=None, value="binary", **_):
        return VW.ViewResult(benefit[value], np.zeros(N, np.float32), {})

    def fake_flow(detectors, batch, *, key=None, **_):
        return VW.ViewResult(flow, np.zeros(N, np.float32), {})

    def fake_causal(detectors, batch, *, key=None, **_):
        ex = {b: np.zeros(N, np.float32) for b in CA.BRANCH_KIND}
        ex.update(core_cells=np.zeros((N, 5, 5), bool), core_tokens=np.zeros((N, 3), bool))
        return VW.ViewResult(flow, np.zeros(N, np.float32), ex)

    def fake_decision(out, label, cells, tokens, **opts):
        key = json.dumps(opts, sort_keys=True)
        if causal_same:
            lab = good
        elif opts == target:
            lab = good
        else:
            lab = noise.setdefault(key, _noisy(TRUTH, 0.4, rng))
        return VW.ViewResult(lab, np.zeros(N, np.float32), {})

    monkeypatch.setitem(VW.VIEW_FNS, "benefit", fake_benefit)
    monkeypatch.setitem(VW.VIEW_FNS, "flow", fake_flow)
    monkeypatch.setitem(VW.VIEW_FNS, "causal", fake_causal)
    monkeypatch.setattr(CA, "causal_decision", fake_decision)
    return benefit, flow, good, target


def test_tune_variant_rechooses_each_view_then_the_rule(monkeypatch):
    benefit, flow, good, target = _tuning_fakes(monkeypatch, causal_same=False)
    tuned = AN.tune_variant({}, _batch())
    assert tuned["options"]["benefit"] == {"value": "binary"}
    assert {k: tuned["options"]["causal"][k] for k in target} == target
    assert tuned["options"]["flow"] == EN.view_options("improved", 0.25)["flow"]
    cands = tuned["candidates"]["causal"]
    first = dict(EN.VARIANTS["improved"]["causal"], mediator="each")
    assert cands[0]["options"] == first  # the current choice is tried first (kept on ties)
    assert len(cands) == len(CA.FUSIONS) * len(CA.CALIBRATIONS) * len(CA.EFFECTS) * \
        len(CA.MEDIATORS)
    assert len({json.dumps(c["options"], sort_keys=True) for c in cands}) == len(cands)
    # the rule: the best macro-F1 among the non-random rules, on the chosen views' labels
    labels = {"benefit": benefit["binary"], "flow": flow, "causal": good}
    ens = EN.all_ensembles(labels)
    assert "random" not in AN.TUNE_RULES and set(AN.TUNE_RULES) == set(EN.RULES) - {"random"}
    f1 = {r: _macro_f1(ens[EN.RULES[r]], TRUTH) for r in AN.TUNE_RULES}
    assert f1[tuned["rule"]] == pytest.approx(max(f1.values()))
    assert tuned["scores"]["ensemble"]["macro_f1"] == pytest.approx(max(f1.values()))
    assert tuned["scores"]["causal"]["accuracy"] == pytest.approx(np.mean(good == TRUTH))


def test_tune_variant_keeps_the_current_choice_on_ties(monkeypatch):
    _tuning_fakes(monkeypatch, causal_same=True)
    tuned = AN.tune_variant({}, _batch())
    assert tuned["options"]["causal"] == dict(EN.VARIANTS["improved"]["causal"],
                                              mediator="each")
    only = AN.tune_variant({}, _batch(), calibrations=("none",))["candidates"]["causal"]
    assert {c["options"]["calibration"] for c in only} == {"none"}
    assert len(only) == len(CA.FUSIONS) * len(CA.EFFECTS) * len(CA.MEDIATORS)
    with pytest.raises(ValueError, match="exact type"):
        AN.tune_variant({}, _batch().replace(bias=np.full(N, -1, np.int32)))


@pytest.mark.parametrize("argv,msg", [
    (["--figure", "x.png"], "add --quality-sweep"),
    (["--quality-sweep", "--data", "fakeddit", "--root", "r", "--detectors-root", "d"],
     "needs --data closed_world"),
    (["--tune-seed", str(AN.ANALYSIS_SEED)], "tuning needs samples of its own"),
    (["--quality-sweep", "--detectors-root", "d"], "drop --detectors-root"),
    (["--tune-seed", "5", "--labels", "l.csv"], "drop --labels"),
])
def test_cli_refuses_sweep_and_tuning_flags_that_cannot_work(argv, msg, capsys):
    assert bcli.main(["analyze", "--n", "4", "--quiet", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("modality-bias analyze: error:") and msg in err


def test_sweep_figure_and_table(tmp_path):
    e = lambda a: {"accuracy": a, "macro_f1": a / 2, "proportions": {}}  # noqa: E731
    sweep = [{"detector_accuracy": d, "steps": s, **{v: e(d - 0.1) for v in QS.SWEEP_VIEWS}}
             for d, s in ((0.9, 400), (0.6, 100))]
    sweep[1]["flow"] = {"accuracy": None, "macro_f1": None, "proportions": {}}
    path = QS.quality_sweep_figure(sweep, tmp_path / "sweep.png", title="t")
    assert path.read_bytes()[:4] == b"\x89PNG"
    assert [p.name for p in tmp_path.iterdir()] == ["sweep.png"]  # nothing half-written left
    text = QS.sweep_text(sweep).splitlines()
    assert text[2].split()[:3] == ["400", "90.0", "80.0"] and "n/a" in text[3]
    md = QS.sweep_markdown(sweep).splitlines()
    assert md[2].startswith("| 400 | 90.0% | 80.0% / 0.400")


@pytest.mark.slow
def test_cli_quality_sweep_and_tuning_with_the_basic_detectors(tmp_path, capsys):
    """The real views and the shipped basic detectors: the sweep's one entry (basic: its one
    set) is the headline itself; --tune-seed reports the re-chosen variant on --seed."""
    fig = tmp_path / "sweep.png"
    assert bcli.main(["analyze", "--world", "basic", "--n", "32", "--quality-sweep",
                      "--figure", str(fig), "--tune-seed", "3000017", "--json",
                      "--quiet"]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    (entry,) = line["quality_sweep"]
    tuned = line["tuned"]
    for v in ("benefit", "flow", "causal", "ensemble"):
        assert entry[v] == tuned[v]  # the sweep used the tuned options
        assert set(tuned[v]) == {"accuracy", "macro_f1", "proportions"}
    assert 0.5 <= entry["detector_accuracy"] <= 1.0
    assert fig.read_bytes()[:4] == b"\x89PNG"
    assert tuned["tune_seed"] == 3000017 and tuned["rule"] in AN.TUNE_RULES
    # without tuning, the sweep's entry is the headline's answer
    assert bcli.main(["analyze", "--world", "basic", "--n", "32", "--quality-sweep",
                      "--json", "--quiet"]) == 0
    plain = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for v in ("benefit", "flow", "causal", "ensemble"):
        assert plain["quality_sweep"][0][v] == plain[v]
