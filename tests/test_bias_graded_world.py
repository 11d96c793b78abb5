"""The graded closed world's annotation scores are exact, checked by independent oracles.

1. Oracles that read only pixels and/or tokens (``graded_world_oracles``) recover the sufficient
   statistics of every sample, and their closed-form posteriors (written out per statistic)
   equal the generator's case-table posteriors, for the default and for another spec.
2. Monte Carlo of the generator: the label frequency given each statistic (image alone, text
   alone, both) lies within a binomial interval of the closed-form posterior; the scores and
   types follow from it (the type by ``human_labels.argmax_type``'s tie rule); each case
   appears at its configured rate; the type mix and the trivial baselines match the exact ones.
3. Given its statistic, a modality carries no further label information (chi-square on scene
   and claim features); generation is pure in its key (same key -> same sample; vmapped equals
   one by one, slow test).
"""

from fractions import Fraction

import jax
import numpy as np
import pytest
from scipy import stats

from bias_jax.data import batch as BA
from bias_jax.data import graded_world as GW
from bias_jax.data import graded_world_oracles as GO
from bias_jax.data import human_labels as HL
from gridvqa_jax.world import render as R

N = 3000
SEED = 5
SPEC = GW.GradedSpec()
OTHER = GW.GradedSpec(case_mix=(0.05, 0.2, 0.1, 0.1, 0.2, 0.15, 0.1, 0.1), p_real_balance=0.5,
                      p_real_uni_text=0.6, p_real_undecidable=0.4,
                      image_cue_real=(0.05, 0.2, 0.4), text_cue_real=(0.7,))


def _np(tree):
    return jax.tree.map(np.asarray, jax.device_get(tree))


def _within(k, n, p, z=4.5):
    """k successes of n are within z binomial sigmas of p (exactly p when p is 0 or 1)."""
    if p in (0.0, 1.0):
        return k == p * n
    return abs(k / n - p) <= z * np.sqrt(p * (1 - p) / n)


@pytest.fixture(scope="module")
def world():
    return _np(GW.generate(SPEC, SEED, 0, N))


_SMALL = ("label", "case", "level", "claim_true", "image_stat", "text_stat", "bias", "scores",
          "posteriors")


def _stats_only(spec, seed, chunks):
    """The small fields of ``chunks`` x N samples (one compiled shape; images dropped)."""
    parts = [_np(GW.generate(spec, seed, i * N, N)) for i in range(chunks)]
    return {k: np.concatenate([getattr(p, k) for p in parts]) for k in _SMALL}


@pytest.fixture(scope="module")
def many(world):
    """4 N samples' statistics (the first N are ``world``'s) for the Monte Carlo checks."""
    return _stats_only(SPEC, SEED, 4)


def _groups_ok(groups, what):
    """groups: (key, successes, trials, p). Each within 4.5 sigmas (exact for p in {0, 1}),
    and their pooled chi-square sum (dof = groups with 0 < p < 1) at p-value > 1e-4."""
    chi, dof = 0.0, 0
    for key, k, n, p in groups:
        assert n > 0 and _within(k, n, p), (what, key, k, n, p)
        if 0.0 < p < 1.0:
            chi += (k - n * p) ** 2 / (n * p * (1 - p))
            dof += 1
    assert dof == 0 or stats.chi2.sf(chi, dof) > 1e-4, (what, chi, dof)
    return len(groups)


def _check_monte_carlo(d, spec):
    """Label frequencies vs the oracles' closed-form posteriors given each statistic, the
    generator's per-case draws vs the spec's rates, and the case frequencies vs case_mix."""
    si, st, tr = d["image_stat"], d["text_stat"], d["claim_true"].astype(int)
    real, case, level = d["label"] == GW.REAL, d["case"], d["level"]
    n_checked = 0
    for name, stat, post in (("image", si, GO.image_posterior(si, spec)),
                             ("text", st, GO.text_posterior(st, spec)),
                             ("joint", si * 100 + st * 2 + tr,
                              GO.joint_posterior(si, st, tr, spec))):
        groups = []
        for v in np.unique(stat):
            m = stat == v
            groups.append((v, real[m].sum(), m.sum(), float(post[m][0])))
        n_checked += _groups_ok(groups, name)
    # Per case and level: P(claim true) and P(real | claim true) are the spec's rates.
    r, g, kt = spec.image_cue_real, spec.text_cue_real, len(spec.text_cue_real)
    truth_rate = {"uni_image": lambda l: 1.0, "balance": lambda l: spec.p_real_balance,
                  "uni_text": lambda l: spec.p_real_uni_text, "redundant": lambda l: 0.0,
                  "graded_image": lambda l: 1.0, "graded_text": lambda l: g[l],
                  "undecidable": lambda l: 1.0, "mixed": lambda l: g[l % kt]}
    auth_rate = {"uni_image": lambda l: 0.0, "balance": lambda l: 1.0,
                 "uni_text": lambda l: 1.0, "redundant": lambda l: 0.0,
                 "graded_image": lambda l: r[l], "graded_text": lambda l: 1.0,
                 "undecidable": lambda l: spec.p_real_undecidable,
                 "mixed": lambda l: r[l // kt]}
    truth_groups, auth_groups = [], []
    for c, name in enumerate(GW.CASES):
        for lvl in np.unique(level[case == c]):
            m = (case == c) & (level == lvl)
            truth_groups.append(((name, lvl), tr[m].sum(), m.sum(), truth_rate[name](lvl)))
            mt = m & (tr == 1)
            if mt.any():
                auth_groups.append(((name, lvl), real[mt].sum(), mt.sum(), auth_rate[name](lvl)))
            assert not real[m & (tr == 0)].any(), name  # real needs a true claim
    n_checked += _groups_ok(truth_groups, "truth") + _groups_ok(auth_groups, "authentic")
    counts = np.bincount(case, minlength=len(GW.CASES))
    n = len(case)
    assert _groups_ok([(GW.CASES[c], counts[c], n, p) for c, p in enumerate(spec.case_mix)
                       if p > 0], "case") == sum(p > 0 for p in spec.case_mix)
    assert stats.chisquare(counts, n * np.asarray(spec.case_mix)).pvalue > 1e-4 or \
        min(spec.case_mix) == 0
    return n_checked


# ----------------------------------------------------------------------------------------------
def test_spec_validation_and_json():
    bad = [dict(case_mix=(0.5, 0.5)), dict(case_mix=(0.5, 0.6, 0, 0, 0, 0, 0, 0)),
           dict(case_mix=(-0.1, 0.3, 0.2, 0.2, 0.2, 0.1, 0.1, 0.0)), dict(p_real_balance=1.5),
           dict(image_cue_real=()), dict(image_cue_real=(0.1, 0.2, 0.3, 0.4)),
           dict(text_cue_real=(1.2,)), dict(max_tokens=10), dict(grid_size=3),
           dict(cell_px=8), dict(manipulations=("blur",))]
    for kw in bad:
        with pytest.raises(ValueError):
            GW.GradedSpec(**kw)
    GW.GradedSpec(text_cue_real=(0.1, 0.2), max_tokens=11)  # 9 + 2 UNK words fit
    assert hash(OTHER) == hash(GW.GradedSpec.from_json(OTHER.to_json()))
    assert GW.GradedSpec.from_json({k: list(v) if isinstance(v, tuple) else v
                                    for k, v in OTHER.to_json().items()}) == OTHER
    with pytest.raises(ValueError, match="unknown"):
        GW.GradedSpec.from_json({"case_mixx": 1})


def test_marked_tiles_are_readable():
    """The 64 marked tiles differ from each other, from the 17 legal tiles and from the 320
    obvious manipulations, so the statistics are functions of the pixels."""
    marks = GW.mark_tiles(16).reshape(64, -1)
    known = GO._known_tiles(16)
    assert len(known) == 17 + 64
    assert {m.tobytes() for m in marks} <= set(known)
    from bias_jax.data.closed_world import manipulation_tiles
    assert not set(known) & {t.tobytes() for t in manipulation_tiles(16)}


def test_oracle_posteriors_equal_the_case_table():
    """Closed forms of the oracles == the generator's exact posteriors, for every statistic."""
    for spec in (SPEC, OTHER):
        img, txt, joint = GW.posterior_tables(spec)
        si, st = np.arange(spec.n_image_stats), np.arange(spec.n_text_stats)
        np.testing.assert_allclose(GO.image_posterior(si, spec), [float(p) for p in img])
        np.testing.assert_allclose(GO.text_posterior(st, spec), [float(p) for p in txt])
        for a in si:
            for b in st:
                for tr in (0, 1):
                    if joint[a][b][tr] is not None:
                        assert GO.joint_posterior([a], [b], [tr], spec)[0] == pytest.approx(
                            float(joint[a][b][tr])), (a, b, tr)


def test_default_scores_are_exact_and_uninformative_statistics_are_at_chance():
    img, txt, _ = GW.posterior_tables(SPEC)
    assert img[GW.I_CLEAN] == Fraction(1, 2) and txt[GW.T_PLAIN] == Fraction(1, 2)
    def q(p):  # score of a posterior P(real) = p
        return 5 * (2 * max(p, 1 - p) - 1)

    # Posteriors of the cue levels, by hand from the default spec: a faint mark of level l comes
    # from graded_image (share 0.2, half per level, real w.p. r_l) or mixed (0.05, real w.p.
    # r_l times the mean truth rate 0.95 of its claims); UNK level l from graded_text (0.1, true
    # w.p. g_l) or mixed (0.05, real w.p. g_l times the mean authenticity rate 0.825).
    r, g = (0.75, 0.9), (0.9, 1.0)
    p_faint = [(0.1 * x + 0.025 * x * 0.95) / 0.125 for x in r]  # 0.7425, 0.891
    p_unk = [(0.05 * x + 0.025 * x * 0.825) / 0.075 for x in g]  # 0.8475, 0.9417
    mixed = []
    for li in range(2):
        for lt in range(2):
            a, b = q(p_faint[li]), q(p_unk[lt])
            kind = "uni_image" if a > b else "uni_text"
            mixed.append(((a, b, max(0.0, q(r[li]) - max(a, b))), kind))  # true claim: r_l
            if g[lt] < 1:
                mixed.append(((a, b, 5 - max(a, b)), kind))  # false claim: both decide
    want_cases = {
        "uni_image": [((5, 0, 0), "uni_image")], "balance": [((0, 0, 5), "balance")],
        "uni_text": [((0, 5, 0), "uni_text")], "redundant": [((5, 5, 0), "balance")],
        "graded_image": [((q(p), 0, q(x) - q(p)), "uni_image") for p, x in zip(p_faint, r)],
        "graded_text": [((0, q(p), 5 - q(p)), "uni_text") for p in p_unk],
        "undecidable": [((0, 0, 0), "balance")], "mixed": mixed}
    per_case = {c: sorted({(sc, t) for _, sc, t in rows}) for c, rows in
                GW.case_scores(SPEC).items()}
    got = {c: [(tuple(round(float(x), 5) for x in sc), t) for sc, t in v]
           for c, v in per_case.items()}
    want = {c: sorted({(tuple(round(float(x), 5) for x in sc), t) for sc, t in v})
            for c, v in want_cases.items()}
    assert got == want
    # uni_image: its case, graded_image, mixed with level-1 faint and level-0 UNK (0.05 / 4)
    want_mix = [0.1 + 0.2 + 0.0125, 0.25 + 0.1 + 0.05, 0.15 + 0.1 + 0.0375]
    np.testing.assert_allclose(GW.type_distribution(SPEC), want_mix)
    base = GW.trivial_baselines(SPEC)
    assert base["majority_type"] == "balance" and base["accuracy"] == pytest.approx(0.4)
    assert base["macro_f1"] == pytest.approx((2 * 0.4 / 1.4) / 3)


def test_accuracy_ceilings_by_hand_and_on_samples(many):
    """The exact ceilings: by hand for the default spec, and vs the majority label per statistic
    group of 4 N samples (an empirical Bayes detector of each kind's inputs)."""
    c = GW.accuracy_ceilings(SPEC)
    real = 0.25 * 0.44 + 0.15 * 0.3 + 0.2 * 0.825 + 0.1 * 0.95 + 0.05 * 0.5 + 0.05 * 0.825 * 0.95
    assert c["always_real"] == pytest.approx(real) and c["always_fake"] == pytest.approx(1 - real)
    # image: clean and smudge at chance, obvious always fake, faint marks by their posterior
    clean, obvious, faint = 0.25 + 0.15 + 0.1, 0.1 + 0.1, 0.125 * (0.7425 + 0.891)
    assert c["image"] == pytest.approx(0.5 * (clean + 0.05) + obvious + faint)
    # text: plain at chance, certain claims decide, UNK levels by their posterior
    plain, certain, unk = 0.1 + 0.25 + 0.2 + 0.05, 0.15 + 0.1, 0.075 * (0.8475 + 0.941667)
    assert c["text"] == pytest.approx(0.5 * plain + certain + unk, abs=1e-6)
    assert c["always_fake"] < min(c["image"], c["text"]) < c["joint_without_truth"] < c["joint"]
    lab = many["label"]
    n = len(lab)

    def empirical(*keys):
        k = np.stack(keys, 1)
        _, inv = np.unique(k, axis=0, return_inverse=True)
        inv = inv.ravel()
        real_n = np.bincount(inv, weights=(lab == BA.REAL).astype(float))
        tot = np.bincount(inv)
        return np.maximum(real_n, tot - real_n).sum() / n

    truth = np.where(many["image_stat"] == GW.I_OBVIOUS, 0, many["claim_true"].astype(int))
    for name, acc in (("image", empirical(many["image_stat"])),
                      ("text", empirical(many["text_stat"])),
                      ("joint", empirical(many["image_stat"], many["text_stat"], truth)),
                      ("joint_without_truth", empirical(many["image_stat"], many["text_stat"]))):
        assert abs(acc - c[name]) < 4.5 * np.sqrt(0.25 / n) + 0.01, (name, acc, c[name])


def test_summary_is_json():
    import json

    d = json.loads(json.dumps(GW.summary(SPEC)))
    assert d["trivial_baselines"]["accuracy"] == pytest.approx(0.4)
    assert d["accuracy_ceilings"] == pytest.approx(GW.accuracy_ceilings(SPEC))
    assert GW.GradedSpec.from_json(d["spec"]) == SPEC
    assert list(d["cases"]) == list(GW.CASES)
    for c in d["cases"].values():
        assert sum(r["p"] for r in c["scores"]) == pytest.approx(1.0)


def test_tie_rule_is_the_human_labels_rule():
    s = np.array([[5, 5, 0], [0, 0, 0], [1, 2, 2], [2, 1, 2], [4, 1, 0], [0, 4, 1], [0, 2, 3],
                  [3, 3, 1], [1, 0, 0.5]], np.float64)
    want = [1, 1, 1, 1, 0, 2, 1, 1, 0]
    np.testing.assert_array_equal(GW.type_of_scores(s), want)
    np.testing.assert_array_equal(HL.argmax_type(s[:, [0, 2, 1]]), want)
    np.testing.assert_array_equal(GO.oracle_types(s), want)


def test_scores_csv_reads_back_as_the_same_types(world, tmp_path):
    """The exact scores written as a human-labels CSV give, through ``read_labels`` (the
    annotators' argmax and tie rule), the samples' own types."""
    s = jax.tree.map(lambda a: a[:400], world)
    path = GW.write_scores_csv(tmp_path / "scores.csv", s, index=np.arange(100, 500))
    lab = HL.read_labels(path)
    assert lab.form == "scores" and lab.ids == tuple(str(i) for i in range(100, 500))
    np.testing.assert_array_equal(lab.bias, s.bias)
    np.testing.assert_allclose(lab.mean_scores[:, [0, 2, 1]], s.scores, rtol=0, atol=0)


def test_statistics_are_read_from_pixels_and_tokens(world):
    s = world
    si, st = GO.image_statistic(s.image, SPEC), GO.text_statistic(s.tokens, SPEC)
    np.testing.assert_array_equal(si, s.image_stat)
    np.testing.assert_array_equal(st, s.text_stat)
    tr = GO.decoded_truth(s.image, s.tokens, SPEC)
    ok = si != GW.I_OBVIOUS  # an obviously manipulated cell no longer shows its object
    np.testing.assert_array_equal(tr[ok], s.claim_true[ok])
    # Scores from the inputs alone equal the generator's; the types follow by the tie rule.
    sc = GO.oracle_scores(s.image, s.tokens, SPEC)
    np.testing.assert_allclose(s.scores, sc, atol=1e-5)
    np.testing.assert_array_equal(s.bias, HL.argmax_type(s.scores[:, [0, 2, 1]]))
    np.testing.assert_array_equal(s.bias, GO.oracle_types(sc))
    assert s.scores.dtype == np.float32 and s.scores.shape == (N, 3)
    assert ((s.scores >= 0) & (s.scores <= 5)).all()


def test_label_frequencies_match_the_posteriors(world, many):
    """Monte Carlo of 4 N samples: empirical P(real | statistic) within 4.5 binomial sigmas of
    the closed form (exact where it is 0 or 1) and pooled chi-square, for the image, the text
    and both together; the per-case draws and the case frequencies at the spec's rates."""
    assert _check_monte_carlo(many, SPEC) >= 5 + 5 + 9 + 8
    s = world
    np.testing.assert_array_equal(many["label"][:N], s.label)
    si, st, tr = s.image_stat, s.text_stat, s.claim_true
    np.testing.assert_allclose(s.posteriors, np.stack(
        [GO.image_posterior(si, SPEC), GO.text_posterior(st, SPEC),
         GO.joint_posterior(si, st, tr, SPEC)], 1), atol=1e-6)


def test_cases_appear_at_their_rates_and_show_their_cues(world):
    s = world
    counts = np.bincount(s.case, minlength=len(GW.CASES))
    for c, p in enumerate(SPEC.case_mix):
        assert _within(counts[c], N, p), (GW.CASES[c], counts[c])
    expect_image = {"uni_image": {1}, "balance": {0}, "uni_text": {0}, "redundant": {1},
                    "graded_image": {3, 4}, "graded_text": {0}, "undecidable": {2},
                    "mixed": {3, 4}}
    expect_text = {"uni_image": {0}, "balance": {0}, "uni_text": {1, 2}, "redundant": {2},
                   "graded_image": {0}, "graded_text": {3, 4}, "undecidable": {0},
                   "mixed": {3, 4}}
    for c, name in enumerate(GW.CASES):
        m = s.case == c
        assert set(np.unique(s.image_stat[m])) == expect_image[name], name
        assert set(np.unique(s.text_stat[m])) == expect_text[name], name


def test_type_mix_and_trivial_baselines_match_the_samples(many):
    """The exact type mix and majority-type baselines vs 4 N samples, scored by sklearn."""
    from sklearn.metrics import accuracy_score, f1_score

    bias = many["bias"]
    n = len(bias)
    mix = GW.type_distribution(SPEC)
    for t in range(3):
        assert _within((bias == t).sum(), n, mix[t]), t
    base = GW.trivial_baselines(SPEC)
    const = np.full(n, BA.BIAS_TYPES.index(base["majority_type"]))
    assert abs(accuracy_score(bias, const) - base["accuracy"]) < 4.5 * np.sqrt(0.25 / n)
    f1 = f1_score(bias, const, average="macro", labels=[0, 1, 2], zero_division=0)
    assert abs(f1 - base["macro_f1"]) < 4.5 * np.sqrt(0.25 / n)
    np.testing.assert_array_equal(bias, GW.type_of_scores(many["scores"]))


def _crosstab(a, b):
    _, ia = np.unique(a, return_inverse=True)
    _, ib = np.unique(b, return_inverse=True)
    t = np.zeros((ia.max() + 1, ib.max() + 1))
    np.add.at(t, (ia, ib), 1)
    return t[t.sum(1) > 0][:, t.sum(0) > 0]


def test_no_label_information_beyond_the_statistics(world):
    """Given its statistic, a modality's other features are independent of the label:
    scene features of clean / faint images, claim features of plain / UNK claims."""
    s = world
    keys, _ = GO.decode_cells(s.image, SPEC)
    n_distinct = np.array([len(np.unique(k[k >= 0])) for k in keys])
    colours = np.array([np.bincount(k[k >= 0] // 4, minlength=4).argmax() for k in keys])
    for v in (GW.I_CLEAN, GW.I_FAINT0, GW.I_FAINT0 + 1):
        m = s.image_stat == v
        for feat in (n_distinct, colours):
            assert stats.chi2_contingency(_crosstab(feat[m], s.label[m])).pvalue > 1e-3, v
    first_word = s.tokens[:, 0]
    second = s.tokens[:, 1]
    for v in (GW.T_PLAIN, GW.T_MARKED0):
        m = s.text_stat == v
        for feat in (first_word, second, s.n_tokens):
            t = _crosstab(feat[m], s.label[m])
            if t.shape[0] > 1:
                assert stats.chi2_contingency(t).pvalue > 1e-3, v


def test_causal_ground_truth(world):
    s = world
    np.testing.assert_array_equal(s.core_tokens, GO.core_words(s.tokens))
    np.testing.assert_array_equal(s.core_cells, GO.core_entity(s.image, s.tokens, SPEC))
    assert (s.core_cells | ~s.evidence_cells).all()
    has_evidence = s.evidence_cells.any(axis=(1, 2))
    np.testing.assert_array_equal(has_evidence, np.isin(s.image_stat, [GW.I_OBVIOUS,
                                                                       GW.I_SMUDGE, 3, 4]))


def test_to_batch_and_purity(world):
    s = world
    b = _np(GW.to_batch(jax.tree.map(lambda a: a[:64], s), SPEC))
    BA.validate(b)
    np.testing.assert_array_equal(b.bias, s.bias[:64])
    np.testing.assert_array_equal(b.label, s.label[:64])
    np.testing.assert_array_equal(b.image_core, R.pixel_mask(s.core_cells[:64], 16) > 0)
    assert b.has_gt.all() and b.image.shape == (64, 80, 80, 3)
    # Same key -> same sample, whatever the batch position (same shape: no recompilation).
    again = _np(GW.generate(SPEC, SEED, 1000, N))
    for x, y in zip(jax.tree.leaves(s), jax.tree.leaves(again)):
        np.testing.assert_array_equal(x[1000:], y[: N - 1000])
    keys = GW.sample_keys(SEED, 0, N)
    rev = _np(GW.sample_batch(keys[::-1], SPEC))
    for x, y in zip(jax.tree.leaves(s), jax.tree.leaves(rev)):
        np.testing.assert_array_equal(x, y[::-1])


@pytest.mark.slow
def test_vmapped_equals_one_by_one_and_another_spec_is_exact():
    keys = GW.sample_keys(SEED, 0, 6)
    batch = _np(GW.sample_batch(keys, SPEC))
    one = jax.jit(GW.sample, static_argnums=1)
    for i in range(6):
        for x, y in zip(jax.tree.leaves(batch), jax.tree.leaves(_np(one(keys[i], SPEC)))):
            np.testing.assert_array_equal(x[i], y)
    s = _np(GW.generate(OTHER, 9, 0, N))
    si, st = GO.image_statistic(s.image, OTHER), GO.text_statistic(s.tokens, OTHER)
    np.testing.assert_array_equal(si, s.image_stat)
    np.testing.assert_array_equal(st, s.text_stat)
    np.testing.assert_allclose(s.scores, GO.oracle_scores(s.image, s.tokens, OTHER), atol=1e-5)
    _check_monte_carlo(_stats_only(OTHER, 9, 4), OTHER)


def test_oracles_do_not_use_the_generator():
    """From the generator module the oracles import only the public contract (spec, case
    names, statistic codes, vocabulary, mark colour): no tables, tiles or sampling code."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(GO))
    imported = {a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and node.module == GW.__name__ for a in node.names}
    contract = {"GradedSpec", "CASES", "CLAIM_VOCAB", "MARK_RGB", "UNK_ID", "I_CLEAN",
                "I_OBVIOUS", "I_SMUDGE", "I_FAINT0", "T_PLAIN", "T_CERTAIN_TRUE",
                "T_CERTAIN_FALSE", "T_MARKED0"}
    assert imported and imported <= contract, imported - contract
    package, module = GW.__name__.rsplit(".", 1)
    assert not any(isinstance(node, ast.ImportFrom) and node.module == package
                   and any(a.name == module for a in node.names) for node in ast.walk(tree))
