"""The world registry (bias_jax.data.worlds) and the closed-world commands' --world."""

import json

import jax
import numpy as np
import pytest

from bias_jax import analysis as AN
from bias_jax import detectors as D
from bias_jax import views as VW
from bias_jax.data import closed_world as CW
from bias_jax.data import worlds as WD
from bias_jax.data import batch as BA
from mmx_base.errors import InputError
from reproduction.cli import bias as bcli


def test_world_names_and_specs():
    assert WD.WORLDS == ("graded", "basic") and WD.DEFAULT_WORLD in WD.WORLDS
    with pytest.raises(InputError, match="unknown world 'flat'.*graded, basic"):
        WD.check_world("flat")
    with pytest.raises(InputError, match="unknown world"):
        WD.world_spec("flat")
    spec = WD.world_spec("basic", grid_size=6, cell_px=12, max_tokens=14)
    assert spec == CW.WorldSpec(grid_size=6, cell_px=12, max_tokens=14)
    assert WD.world_of(spec) == "basic"
    with pytest.raises(TypeError):
        WD.world_of(object())


def test_load_world_in_chunks_equals_one_call():
    """Chunked loading (two chunks of 4) gives the samples of one load_closed_world call,
    global indices included (shapes 8 and 4 are compiled by other tests too)."""
    spec = CW.WorldSpec()
    got = WD.load_world(spec, 5, 8, start=4, chunk=4)
    ref = CW.load_closed_world(spec, 5, 8, start=4)
    for field in BA.FIELDS:
        np.testing.assert_array_equal(np.asarray(getattr(got, field)),
                                      np.asarray(getattr(ref, field)), err_msg=field)
    np.testing.assert_array_equal(got.index, np.arange(4, 12))
    with pytest.raises(ValueError, match="positive"):
        WD.load_world(spec, 5, 0)


def test_graded_world_spec_through_the_registry():
    from bias_jax.data import graded_world as GW

    spec = WD.world_spec("graded", grid_size=6, cell_px=16, max_tokens=14)
    assert spec == GW.GradedSpec(grid_size=6, cell_px=16, max_tokens=14)
    assert WD.world_of(spec) == "graded"


@pytest.mark.slow
def test_graded_world_samples_through_the_registry():
    """The graded world's samples come from data.graded_world (chunks of 4: the samples of
    its own loader at the same global indices; compiles the graded sampler, ~10 s)."""
    from bias_jax.data import graded_world as GW

    spec = WD.world_spec("graded")
    got = WD.load_world(spec, 3, 8, start=4, chunk=4)
    ref = BA.concat([GW.load_graded_world(spec, 3, 4, start=s) for s in (4, 8)])
    for field in BA.FIELDS:
        np.testing.assert_array_equal(np.asarray(getattr(got, field)),
                                      np.asarray(getattr(ref, field)), err_msg=field)
    np.testing.assert_array_equal(got.index, np.arange(4, 12))


@pytest.mark.parametrize("argv", [
    ["analyze", "--world", "flat", "--n", "4"],
    ["bench", "--world", "flat", "--n", "4"],
    ["detectors", "--world", "flat", "--n", "4"],
])
def test_cli_rejects_an_unknown_world(argv, capsys):
    assert bcli.main(argv + ["--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"modality-bias {argv[0]}: error: unknown world 'flat'" in err
    assert "graded, basic" in err


def test_cli_rejects_a_world_for_real_data(tmp_path, capsys):
    assert bcli.main(["analyze", "--data", "fakeddit", "--root", str(tmp_path / "x.tsv"),
                      "--detectors-root", str(tmp_path), "--world", "basic", "--quiet"]) == 2
    assert "--world names a closed world" in capsys.readouterr().err


def _content_views(monkeypatch):
    """Stand-in views whose labels are a function of each sample's pixels and tokens (so
    another world, seed or sample order changes them) and of the options they get."""
    def fake(name):
        def view(detectors, batch, *, key=None, **opts):
            s = (np.asarray(batch.image, np.int64).sum((1, 2, 3))
                 + 7 * np.asarray(batch.tokens, np.int64).sum(1)
                 + len(name) + len(json.dumps(opts, sort_keys=True)))
            return VW.ViewResult((s % 3).astype(np.int32), (s % 5).astype(np.float32), {})
        return view

    for name in VW.VIEWS:
        monkeypatch.setitem(VW.VIEW_FNS, name, fake(name))


@pytest.mark.parametrize("world", ["basic", "graded", None])
def test_analyze_scores_the_samples_of_the_named_world(monkeypatch, capsys, world):
    """analyze --world W (None: no flag, the default world) scores that world's samples drawn
    at the detectors' grid, cell size and claim length with the same seed; the views are
    stand-ins reading only the samples, so any other sample differs."""
    _content_views(monkeypatch)
    cfg = D.DetectorConfig(kind="joint")
    monkeypatch.setattr(AN, "world_detectors", lambda world=None, **k: {"joint": (None, None, cfg)})
    seed, n = 12_345, 8
    name = WD.DEFAULT_WORLD if world is None else world
    spec = WD.world_spec(name, grid_size=cfg.grid_size, cell_px=cfg.cell_px,
                         max_tokens=cfg.max_tokens)
    ref_batch = WD.load_world(spec, seed, n)
    if name == "basic":  # the basic world's own loader draws the same samples
        basic = CW.load_closed_world(CW.WorldSpec(grid_size=cfg.grid_size,
                                                  cell_px=cfg.cell_px), seed, n)
        np.testing.assert_array_equal(np.asarray(basic.image), np.asarray(ref_batch.image))
    ref, _ = AN.analyze({"joint": (None, None, cfg)}, ref_batch, key=jax.random.key(seed),
                        world=name)
    flag = [] if world is None else ["--world", world]
    assert bcli.main(["analyze", "--n", str(n), "--seed", str(seed), "--json", "--quiet",
                      *flag]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line == json.loads(json.dumps(AN.headline(ref)))
    # another seed gives other samples, so the check above can fail
    assert bcli.main(["analyze", "--n", str(n), "--seed", str(seed + 1), "--json", "--quiet",
                      *flag]) == 0
    other = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert other != line


def test_world_detectors_names_the_worlds():
    with pytest.raises(InputError, match="unknown world"):
        AN.world_detectors("flat")


def test_evaluate_world_defaults_to_the_default_world():
    """evaluate_world(world=None) evaluates the default world, as analyze and the CLI do: on
    the graded world it reports the per-case accuracies the basic world has none of."""
    from bias_jax import evaluate as BE

    cfg = D.DetectorConfig(kind="joint")
    # a stand-in detector reading the pixels: its accuracy depends on the samples drawn
    apply = lambda p, image, tokens: np.asarray(image, np.float32).mean((1, 2, 3)) - 200  # noqa
    by_name = {w: BE.evaluate_world(apply, None, cfg, world=w, n=16) for w in WD.WORLDS}
    same = lambda a, b: json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)  # noqa
    assert same(BE.evaluate_world(apply, None, cfg, n=16), by_name[WD.DEFAULT_WORLD])
    assert not same(by_name["graded"], by_name["basic"])
    assert any(k.startswith("case:") for k in by_name["graded"])
    assert not any(k.startswith("case:") for k in by_name["basic"])
