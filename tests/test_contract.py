"""The contract users' code touches: strict budget keywords, explainers by callable or
``module:function``, the ``Model`` value of every loader, ``feature_mask`` grouping (checked
against exact enumeration) and an explicit ``grid_size``."""

import itertools
import math
import sys
import textwrap
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gridvqa_jax import explain as EXPL
from gridvqa_jax.explain import global_synergy as GS
from gridvqa_jax.explain import perturb as PT
from gridvqa_jax.explain import scoring
from gridvqa_jax.world import render as R
from gridvqa_jax.world import universe as U
from mmx_base.errors import InputError


class Grid(NamedTuple):
    color: np.ndarray
    shape: np.ndarray
    tokens: np.ndarray


S, CELL = 2, 8
W = jnp.asarray([1.0, 2.0, -0.5, 0.25])  # per-cell weight of "something is drawn here"


def tiny_model(params, image, tokens):
    """f = sum_c W_c d_c + 3 d_0 p_0 - 2 d_3 p_1 + 0.5 p_2 (d_c: darkness of cell c, p_t: token
    t present); answer 0 always wins, so the explained value is f."""
    img = jnp.asarray(image, jnp.float32).reshape(-1, S, CELL, S, CELL, 3)
    d = 1.0 - img.mean((2, 4, 5)).reshape(-1, S * S) / 255.0
    p = (tokens != U.PAD_ID).astype(jnp.float32)
    f = d @ W + 3 * d[:, 0] * p[:, 0] - 2 * d[:, 3] * p[:, 1] + 0.5 * p[:, 2]
    return {"answer_logprobs": jnp.stack([f, f - 1e3], -1)}


def _grid():
    color = np.array([[[0, 1], [2, 3]]], np.int32)
    shape = np.array([[[1, 0], [2, 3]]], np.int32)
    tokens = np.zeros((1, 6), np.int32)
    tokens[0, :3] = [U.WORD_ID[w] for w in ("how", "many", "red")]
    return Grid(color, shape, tokens)


def _grouped_game(sc, fmask):
    """v(ids present) of the grouped game, built without the library's masking: an absent
    group's cells are drawn empty (color and shape -1) and its tokens become PAD; id -1 is
    never absent."""
    cells, toks = np.asarray(fmask.cells), np.asarray(fmask.tokens)

    def v(present_ids):
        keep_c = (cells < 0) | np.isin(cells, list(present_ids))
        keep_t = (toks < 0) | np.isin(toks, list(present_ids))
        img = R.render(np.where(keep_c, sc.color[0], -1), np.where(keep_c, sc.shape[0], -1), CELL)
        tok = np.where(keep_t, sc.tokens[0], U.PAD_ID)
        return float(tiny_model(None, np.asarray(img)[None], tok[None])["answer_logprobs"][0, 0])

    return v


def _exact_grouped_shapley(sc, fmask):
    """Shapley values of the grouped game by enumerating every coalition of groups."""
    ids = sorted({int(i) for i in np.concatenate([np.ravel(fmask.cells), np.ravel(fmask.tokens)])
                  if i >= 0})
    n = len(ids)
    game = _grouped_game(sc, fmask)

    def v(present):
        return game([ids[k] for k in present])

    phi = {}
    for i in range(n):
        rest = [k for k in range(n) if k != i]
        tot = 0.0
        for r in range(n):
            for T in itertools.combinations(rest, r):
                w = math.factorial(r) * math.factorial(n - r - 1) / math.factorial(n)
                tot += w * (v(T + (i,)) - v(T))
        phi[ids[i]] = tot
    return phi


def test_feature_mask_groups_players_against_exact_enumeration():
    sc = _grid()
    # cells 0 and 1 (the top row) are one player; tokens 0 and 2 are one player, token 1 another
    fmask = PT.FeatureMask(np.array([[0, 0], [1, 2]], np.int32),
                          np.array([10, 11, 10, -1, -1, -1], np.int32))
    exact = _exact_grouped_shapley(sc, fmask)
    got = EXPL.multishap(tiny_model, None, sc, jax.random.key(0), cell_px=CELL, order=1,
                      n_samples=2, feature_mask=fmask)
    vis, txt = np.asarray(got.visual[0]), np.asarray(got.textual[0])
    # every feature of a group carries the group's Shapley value (captum's convention)
    np.testing.assert_allclose(vis, [[exact[0], exact[0]], [exact[1], exact[2]]], atol=1e-4)
    np.testing.assert_allclose(txt[:3], [exact[10], exact[11], exact[10]], atol=1e-4)
    assert np.all(txt[3:] == 0)
    # efficiency of the grouped game: sum over groups = v(all) - v(none)
    full = tiny_model(None, R.render(sc.color[0], sc.shape[0], CELL)[None], sc.tokens)
    assert sum(exact.values()) == pytest.approx(
        float(full["answer_logprobs"][0, 0]) - 0.0, abs=1e-4)
    # the ungrouped game differs: merging cells changes the values
    plain = EXPL.multishap(tiny_model, None, sc, jax.random.key(0), cell_px=CELL, order=1,
                        n_samples=2)
    assert not np.allclose(np.asarray(plain.visual[0, 0]), vis[0])


def test_feature_mask_of_one_player_per_feature_is_the_default():
    sc = _grid()
    default = PT.players(Grid(sc.color[0], sc.shape[0], sc.tokens[0]))
    for order in (1, 2):
        a = EXPL.multishap(tiny_model, None, sc, jax.random.key(3), cell_px=CELL, order=order,
                        n_samples=4)
        b = EXPL.multishap(tiny_model, None, sc, jax.random.key(3), cell_px=CELL, order=order,
                        n_samples=4, feature_mask=default)
        np.testing.assert_allclose(np.asarray(a.visual), np.asarray(b.visual), atol=1e-5)
        np.testing.assert_allclose(np.asarray(a.textual), np.asarray(b.textual), atol=1e-5)


def test_feature_mask_rejects_an_id_owning_cells_and_tokens():
    sc = _grid()
    bad = PT.FeatureMask(np.zeros((S, S), np.int32), np.zeros((6,), np.int32))
    with pytest.raises(ValueError, match="own both cells and tokens"):
        EXPL.multishap(tiny_model, None, sc, jax.random.key(0), cell_px=CELL, feature_mask=bad)


def test_grid_size_is_explicit_when_the_side_is_ambiguous():
    # an 80-px image is a 4x4 grid of 20-px cells (or 5x5 of 16, 8x8, 10x10)
    color = np.full((4, 4), -1, np.int32)
    color[1, 2] = 0
    shape = np.where(color >= 0, 1, -1).astype(np.int32)
    img = np.asarray(R.render(color, shape, 20))[None]
    assert img.shape[1] == 80
    with pytest.raises(ValueError, match="4x4, 5x5, 8x8, 10x10"):
        GS.grid_size_of(img)
    assert GS.grid_size_of(img, 4) == 4
    with pytest.raises(ValueError, match="does not divide"):
        GS.grid_size_of(img, 6)
    tokens = np.ones((1, 5), np.int32)
    imgs, toks = GS.with_baselines(img, tokens, grid_size=4)
    empty = np.asarray(R.render(np.full((4, 4), -1, np.int32), np.full((4, 4), -1, np.int32), 20))
    np.testing.assert_array_equal(np.asarray(imgs[1]), empty)
    assert np.all(np.asarray(toks[1]) == U.PAD_ID)
    np.testing.assert_array_equal(np.asarray(GS.with_baselines(img, tokens)[0]), np.asarray(imgs))
    assert GS.grid_size_of(np.zeros((1, 49, 49, 3))) == 7  # unambiguous: only 7 divides 49


CALLS = []


def _fixed(apply_fn, params, scenes, key, *, n_samples: int = 4):
    CALLS.append(n_samples)
    valid = np.asarray(scenes.tokens) != U.PAD_ID
    return EXPL.from_maps(np.ones(np.shape(scenes.color), np.float32) * n_samples,
                       valid.astype(np.float32), valid)


def test_budget_keywords_are_strict():
    sc = _grid()
    CALLS.clear()
    # refused by call_explainer itself (a BudgetError, one line on the CLI), before the body runs
    with pytest.raises(scoring.BudgetError, match="n_sample"):
        scoring.call_explainer(_fixed, None, None, sc, jax.random.key(0), n_sample=8)
    assert CALLS == []
    with pytest.raises(scoring.BudgetError, match="n_sample"):
        scoring.check_budget(EXPL.multishap, {"n_sample": 8})
    assert isinstance(scoring.BudgetError("x"), InputError)
    assert np.all(np.asarray(scoring.call_explainer(_fixed, None, None, sc, jax.random.key(0),
                                                    n_samples=3).visual) == 3)
    scoring.check_budget(lambda *a, **kw: None, {"anything": 1})  # **kwargs accepts all
    from reproduction import table1

    for name, budget in table1.DEFAULT_BUDGETS.items():
        scoring.check_budget(scoring.EXPLAINERS[name], budget)


def test_registry_holds_callables_and_resolves_names_and_callables():
    assert all(callable(f) for f in scoring.EXPLAINERS.values())
    assert scoring.resolve_explainer("multishap") is EXPL.multishap
    assert scoring.resolve_explainer(_fixed) is _fixed
    with pytest.raises(InputError, match="unknown explainer 'nope'"):
        scoring.resolve_explainer("nope")
    got = scoring.resolve_explainers([_fixed, "random"])
    assert list(got) == ["_fixed", "random"] and got["_fixed"] is _fixed
    assert scoring.resolve_explainers({"mine": _fixed})["mine"] is _fixed


def test_explainer_from_spec(tmp_path, monkeypatch):
    (tmp_path / "my_xai.py").write_text(textwrap.dedent("""
        CONST = 3
        def explain(apply_fn, params, scenes, key, **kw):
            return None
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert scoring.explainer_from_spec("my_xai:explain").__name__ == "explain"
    for spec, needle in (("my_xai", "package.module:function"),
                         ("no_such_mod_xyz:f", "cannot import module"),
                         ("my_xai:missing", "no attribute"), ("my_xai:CONST", "not a callable")):
        with pytest.raises(InputError, match=needle):
            scoring.explainer_from_spec(spec)


def test_explain_package_face():
    for name in ("multishap", "dime", "multiviz", "score_explainer", "emap", "intershap", "pid",
                 "Attribution", "FeatureMask", "cross_table"):
        assert name in EXPL.__all__ and callable(getattr(EXPL, name)) or name in ("Attribution",)
    from gridvqa_jax import metrics

    assert {"relevance_mass_accuracy", "otsu_iou", "summarise"} <= set(metrics.__all__)
    assert all(hasattr(metrics, n) for n in metrics.__all__)
    assert all(hasattr(EXPL, n) for n in EXPL.__all__)


def test_feature_mask_reaches_every_grouping_explainer_through_the_strict_budget():
    """MultiSHAP and DIME take ``feature_mask`` as a budget keyword of the scoring protocol
    (``scoring.call_explainer``); with cells {0, 1} one group, cell 2 never masked and tokens
    {0, 1} one group, every feature of a group carries one value and the unmasked cell and PAD
    positions carry 0. A misspelt keyword is an error."""
    sc = _grid()
    fm = PT.FeatureMask(np.array([[7, 7], [-1, 8]], np.int32),
                       np.array([3, 3, 4, 4, 4, 4], np.int32))
    for name, budget in (("multishap", {"order": 1, "n_samples": 4}),
                         ("dime", {"n_samples": 16, "maps": "uc", "alpha": 0.0})):
        fn = scoring.resolve_explainer(name)
        att = scoring.call_explainer(fn, tiny_model, None, sc, jax.random.key(1), cell_px=CELL,
                                     feature_mask=fm, **budget)
        with pytest.raises((scoring.BudgetError, TypeError), match="feature_masks"):
            scoring.call_explainer(fn, tiny_model, None, sc, jax.random.key(1), cell_px=CELL,
                                   feature_masks=fm, **budget)
        v, t = np.asarray(att.visual[0]), np.asarray(att.textual[0])
        assert v[0, 0] == v[0, 1] != 0 and v[1, 0] == 0 and v[1, 1] != 0
        assert t[0] == t[1] != 0 and t[2] != 0 and np.all(t[3:] == 0)
        if name == "multishap":  # exact at 4 groups: efficiency with cell 2 always drawn
            game = _grouped_game(sc, fm)
            assert v[0, 0] + v[1, 1] + t[0] + t[2] == pytest.approx(
                game([3, 4, 7, 8]) - game([]), abs=1e-4)


def test_every_public_name_listed_in_all_exists():
    """Every name in a module's ``__all__``, over every module of the packages, is defined
    there (``from module import *`` would raise ``AttributeError`` otherwise)."""
    import importlib
    import pkgutil

    missing = []
    for pkg in ("mmx_base", "gridvqa_jax", "bias_jax", "reproduction"):
        root = importlib.import_module(pkg)
        for info in pkgutil.walk_packages(root.__path__, pkg + "."):
            mod = importlib.import_module(info.name)
            missing += [f"{info.name}.{n}" for n in getattr(mod, "__all__", ())
                        if not hasattr(mod, n)]
    assert not missing, missing
