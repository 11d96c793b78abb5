"""Voting rules of bias_jax.ensemble against hand-worked label tables (ties included)."""

import jax
import numpy as np
import pytest

from bias_jax import ensemble as EN

UI, MB, UT = 0, 1, 2

# Columns are samples; rows are the views benefit, flow, causal.
TABLE = np.array([
    # clear   2-vs-1  all-differ  2-vs-1   all-differ (other order)
    [UI,      UT,     UI,         MB,      UT],
    [UI,      UT,     MB,         UI,      UI],
    [UI,      MB,     UT,         MB,      MB],
])


def test_vote_counts_by_hand():
    votes = EN.vote_counts(TABLE)
    assert votes.tolist() == [[3, 0, 0], [0, 1, 2], [1, 1, 1], [1, 2, 0], [1, 1, 1]]
    w = EN.vote_counts(TABLE, [0.3, 0.2, 0.5])
    np.testing.assert_allclose(w[1], [0, 0.5, 0.5])  # benefit+flow (UT) vs causal (MB)


def test_prior_majority_ties_go_to_the_most_frequent_class():
    # priority balance > uni_image > uni_text: the all-differ samples become balance
    assert EN.prior_majority(TABLE, (MB, UI, UT)).tolist() == [UI, UT, MB, MB, MB]
    # with uni_text most frequent, both all-differ samples become uni_text
    assert EN.prior_majority(TABLE, (UT, UI, MB)).tolist() == [UI, UT, UT, MB, UT]
    # majorities never depend on the priority
    for pr in [(0, 1, 2), (2, 1, 0), (1, 2, 0)]:
        out = EN.prior_majority(TABLE, pr)
        assert out[[0, 1, 3]].tolist() == [UI, UT, MB]


def test_two_view_tie_chooses_between_the_two_proposals_only():
    pair = TABLE[[0, 2]]  # benefit, causal: [UI,UI] [UT,MB] [UI,UT] [MB,MB] [UT,MB]
    # priority puts uni_image first, but in sample 1 uni_image was proposed by neither view
    assert EN.prior_majority(pair, (UI, MB, UT)).tolist() == [UI, MB, UI, MB, MB]
    assert EN.prior_majority(pair, (UT, UI, MB)).tolist() == [UI, UT, UT, MB, UT]


def test_class_priority_counts_pooled_labels():
    assert EN.class_priority(TABLE) == (UI, MB, UT)  # pooled counts UI 6, MB 5, UT 4
    assert EN.class_priority(np.array([0, 1, 2])) == (MB, UI, UT)  # equal counts: fixed order
    assert EN.class_priority(np.array([[2, 2, 0], [2, 1, 0]])) == (UT, UI, MB)
    assert EN.class_priority(np.array([0, 0, 1, -1, -1, -1])) == (UI, MB, UT)  # -1 ignored
    assert EN.priority_from_counts([0.15, 0.75, 0.10]) == (MB, UI, UT)


def test_weighted_vote_paper_weights():
    w = [EN.VOTE_WEIGHTS[v] for v in EN.VIEWS]
    assert w == [0.3, 0.2, 0.5]  # benefit, flow, causal (appendix 10.3)
    out = EN.weighted_vote(TABLE, w, (MB, UI, UT))
    # sample 1: UT 0.5 vs MB 0.5, a tie -> priority MB; sample 2: causal's UT (0.5) wins;
    # sample 3: MB 0.3 + 0.5 = 0.8; sample 4: causal's MB (0.5) beats UT 0.3 / UI 0.2
    assert out.tolist() == [UI, MB, UT, MB, MB]
    assert EN.weighted_vote(TABLE, w, (UT, UI, MB))[1] == UT
    # weights that favour flow alone make flow the answer whenever the views all differ
    assert EN.weighted_vote(TABLE, [0.1, 0.8, 0.1], (MB, UI, UT)).tolist() == [UI, UT, MB,
                                                                                  UI, UI]


def test_random_majority_breaks_ties_uniformly_and_keeps_majorities():
    n = 4000
    tie = np.tile(np.array([[UI], [MB], [UT]]), (1, n))
    out = EN.random_majority(tie, jax.random.key(3))
    freq = np.bincount(out, minlength=3) / n
    np.testing.assert_allclose(freq, 1 / 3, atol=0.03)  # 3-sigma ~ 0.022
    assert EN.random_majority(TABLE, jax.random.key(0))[[0, 1, 3]].tolist() == [UI, UT, MB]
    pair = np.tile(np.array([[UI], [UT]]), (1, n))
    out = EN.random_majority(pair, jax.random.key(4))
    assert set(np.unique(out)) == {UI, UT}  # never the class nobody proposed
    assert abs((out == UI).mean() - 0.5) < 0.03
    # reproducible from the key
    assert (EN.random_majority(tie, jax.random.key(3)) == EN.random_majority(
        tie, jax.random.key(3))).all()


def test_combine_and_all_ensembles():
    labels = dict(zip(EN.VIEWS, TABLE))
    # default priority = pooled counts (UI first): both all-differ samples become uni_image
    assert EN.combine(labels).tolist() == [UI, UT, UI, MB, UI]
    out = EN.all_ensembles(labels, priority=(MB, UI, UT))
    assert set(out) == {"ensemble", "random", "weighted", "benefit_flow", "benefit_causal",
                        "flow_causal"}
    # flow_causal = prior majority of flow and causal: [UI,UI] [UT,MB] [MB,UT] [UI,MB] [UI,MB]
    assert out["flow_causal"].tolist() == [UI, MB, MB, MB, MB]
    assert out["benefit_flow"].tolist() == [UI, UT, MB, MB, UI]
    # the three-view rules, by hand (test_prior_majority_..., test_weighted_vote_paper_weights)
    assert out["ensemble"].tolist() == [UI, UT, MB, MB, MB]
    assert out["weighted"].tolist() == [UI, MB, UT, MB, MB]  # prior voting: [UI, UT, ...]
    # combine's default weights are the paper's VOTE_WEIGHTS (default priority UI, MB, UT)
    assert EN.combine(labels, strategy="weighted").tolist() == [UI, MB, UT, MB, MB]
    # random voting keeps majorities; its ties are random_majority's with the same key
    assert out["random"][[0, 1, 3]].tolist() == [UI, UT, MB]
    assert out["random"][[2, 4]].tolist() == EN.random_majority(
        TABLE, jax.random.key(0))[[2, 4]].tolist()
    with pytest.raises(KeyError, match="causal"):
        EN.combine({"benefit": TABLE[0], "flow": TABLE[1]})
    with pytest.raises(ValueError, match="strategy"):
        EN.combine(labels, strategy="median")
    with pytest.raises(ValueError, match="0..2"):
        EN.prior_majority(np.array([[0, 3]]), (1, 0, 2))


def test_view_options_of_the_variants_reach_the_views():
    import inspect

    from bias_jax.views import benefit as BV
    from bias_jax.views import causal as CV
    from bias_jax.views import flow as FV

    paper, imp = EN.view_options("paper"), EN.view_options("improved", flow_eps=0.1)
    assert paper["benefit"] == {"value": "binary"}
    assert paper["causal"] == {"fusion": "paper", "calibration": "none"}
    assert imp["benefit"] == {"value": "logprob"}
    assert imp["causal"] == {"fusion": "prob", "calibration": "none", "effect": "label"}
    assert imp["flow"] == {"eps": 0.1} and "eps" not in paper["flow"]
    assert EN.view_options() == EN.view_options(EN.DEFAULT_VARIANT) == EN.view_options("improved")
    imp["causal"]["fusion"] = "tanh"  # a fresh copy each call
    assert EN.VARIANTS["improved"]["causal"]["fusion"] == "prob"
    fns = {"benefit": BV.benefit_view, "flow": FV.flow_view, "causal": CV.causal_view}
    for variant in EN.VARIANTS:
        for view, opts in EN.view_options(variant, 0.25).items():
            inspect.signature(fns[view]).bind(None, None, key=None, **opts)  # every name exists
    assert CV.CALIBRATIONS[0] == "none" and "detector" in CV.CALIBRATIONS
    with pytest.raises(ValueError, match="variant"):
        EN.view_options("best")


def test_rule_keys_and_defaults():
    assert EN.rule_key(None, "improved") == "ensemble"  # prior majority of three as well
    assert EN.rule_key(None, "paper") == "ensemble"  # the paper's prior majority of three
    assert EN.rule_key("prior", "improved") == "ensemble"
    labels = dict(zip(EN.VIEWS, TABLE))
    out = EN.all_ensembles(labels, priority=(MB, UI, UT))
    assert set(EN.RULES.values()) == set(out)
    # Benefit-Causal: prior majority of benefit and causal (agreement, else the proposal
    # first in priority): [UI,UI] [UT,MB] [UI,UT] [MB,MB] [UT,MB]
    assert out[EN.rule_key("benefit_causal", "improved")].tolist() == [UI, MB, UI, MB, MB]
    with pytest.raises(ValueError, match="rule"):
        EN.rule_key("median")
