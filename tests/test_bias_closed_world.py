"""The closed-world benchmark's bias types hold by construction, checked three ways.

1. Exact oracles that read only the pixels, only the tokens, or both (``image_oracle``,
   ``text_oracle``, ``joint_oracle``) reach 100% where a modality decides and chance where it
   should not, per bias type, on a few thousand samples.
2. Exact couplings: changing the label while keeping the rest of the randomness leaves the
   uninformative modality bit-for-bit unchanged (Modality-balance images under the label flip
   + X/Y swap involution, claims under a label flip in Uni-image and Modality-balance, images
   under a label flip in Uni-text). With the latent law invariant under the same maps, this
   proves P(modality | real) = P(modality | fake) exactly.
3. Statistics a predictor could use (claim attributes, decoded scene statistics, held-out
   lookup / nearest-neighbour predictors) are independent of the label (and of the type, where
   a modality must not reveal it): chi-square tests and held-out accuracies at chance.
"""

import dataclasses

import jax
import numpy as np
import pytest
from scipy import stats

from bias_jax.data import batch as BA
from bias_jax.data import closed_world as CW
from bias_jax.data import closed_world_oracles as OR
from gridvqa_jax.world import render as R

N = 3072
SEED = 7
# The symmetric mixture (Uni-image reals included, p_real 1/2 everywhere): every unimodal oracle
# is at exactly chance off its own type.
EQUAL = CW.WorldSpec(type_mix=(1 / 3, 1 / 3, 1 / 3), p_real=0.5)
NAMES = CW.BIAS_TYPES


def _np(tree):
    return jax.tree.map(np.asarray, jax.device_get(tree))


def tol(n, k=4.0):
    """k binomial standard deviations of an accuracy at p = 0.5 over n samples."""
    return k * np.sqrt(0.25 / n)


@pytest.fixture(scope="module")
def world():
    """N samples of the equal-mix benchmark, with their latents and scene keys."""
    keys = CW.sample_keys(SEED, 0, N)
    k_lat, k_scene = jax.vmap(CW.split_key)(keys)
    lats = CW.draw_latents_batch(k_lat, EQUAL)
    s = _np(CW.realize_batch(lats, k_scene, EQUAL))
    return s, lats, k_scene


def _with(lats, mask, **fields):
    """Latents with ``fields`` replaced on the lanes of ``mask``."""
    m = np.asarray(mask)
    return dataclasses.replace(lats, **{
        k: np.where(m, np.asarray(v), np.asarray(getattr(lats, k))) for k, v in fields.items()})


# ----------------------------------------------------------------------------------------------
def test_spec_rejects_bad_configurations():
    bad = [dict(type_mix=(0.5, 0.6, 0.0)), dict(type_mix=(0.5, 0.5)), dict(p_real=1.2),
           dict(p_real=(0.5, 0.5)), dict(grid_size=3), dict(density=0.05),
           dict(manipulations=("blur",)), dict(manipulations=()), dict(max_tokens=5),
           dict(cell_px=4), dict(cell_px=8), dict(p_relation=-0.1)]
    for kw in bad:
        with pytest.raises(ValueError):
            CW.WorldSpec(**kw)
    spec = CW.WorldSpec(p_real=0.3)
    assert spec.p_real == (0.3, 0.3, 0.3) and hash(spec) == hash(CW.WorldSpec(p_real=0.3))
    assert CW.WorldSpec.from_json(spec.to_json()) == spec


def test_every_manipulation_is_visible():
    """Every one of the 320 manipulated cells differs from all 17 legal tiles (16 px)."""
    table = CW.manipulation_tiles(16)
    legal = R.tile_table(16).reshape(R.NUM_TILES, -1)
    assert table.shape == (320, 16, 16, 3)
    assert not (table.reshape(320, 1, -1) == legal[None]).all(-1).any()
    with pytest.raises(ValueError, match="too small"):
        CW.manipulation_tiles(8)


def test_shapes_dtypes_and_batch_independence(world):
    s, _, _ = world
    S, P, L = EQUAL.grid_size, EQUAL.cell_px, EQUAL.max_tokens
    assert s.image.shape == (N, S * P, S * P, 3) and s.image.dtype == np.uint8
    assert s.tokens.shape == (N, L) and s.tokens.dtype == np.int32
    assert s.core_cells.shape == (N, S, S) and s.core_tokens.shape == (N, L)
    assert ((s.color >= 0).sum(axis=(1, 2)) == EQUAL.n_objects).all()
    # Sample i depends on (seed, i) only: the same samples drawn at another offset agree.
    shifted = _np(CW.generate(EQUAL, SEED, 1000, N))
    for a, b in zip(jax.tree.leaves(s), jax.tree.leaves(shifted)):
        np.testing.assert_array_equal(a[1000:], b[: N - 1000])


def test_type_and_class_proportions_are_configurable():
    n = 20000
    for spec in (CW.WorldSpec(), CW.WorldSpec(type_mix=(0.5, 0.2, 0.3), p_real=(0.2, 0.7, 0.9))):
        lat = _np(CW.draw_latents_batch(jax.vmap(lambda k: CW.split_key(k)[0])(
            CW.sample_keys(1, 0, n)), spec))
        for t in range(3):
            frac = (lat.bias == t).mean()
            assert abs(frac - spec.type_mix[t]) < 4 * np.sqrt(spec.type_mix[t] / n), (t, frac)
            m = lat.bias == t
            real = lat.label[m].mean()
            p = spec.p_real[t]
            assert abs(real - p) <= 4 * np.sqrt(p * (1 - p) / m.sum()), (t, real)
            for fam in np.unique(lat.family[m]):  # both labels in every claim family
                assert set(np.unique(lat.label[m & (lat.family == fam)])) == (
                    {0, 1} if 0 < p < 1 else {int(p)})
        assert set(np.unique(lat.family[lat.bias == CW.UNI_TEXT])) == {2, 3, 4}
        assert set(np.unique(lat.family[lat.bias != CW.UNI_TEXT])) == {0, 1}


def test_oracles_per_type(world):
    """Bayes-optimal oracles from pixels / tokens / both: 100% where they decide, else chance."""
    s, _, _ = world
    oracles = {"image": OR.image_oracle(s.image, EQUAL), "text": OR.text_oracle(s.tokens, EQUAL),
               "joint": OR.joint_oracle(s.image, s.tokens, EQUAL)}
    decides = {"image": {CW.UNI_IMAGE}, "text": {CW.UNI_TEXT}, "joint": {0, 1, 2}}
    table = {}
    for name, p in oracles.items():
        for t in range(3):
            m = s.bias == t
            acc = ((p[m] >= 0.5) == (s.label[m] == CW.REAL)).mean()
            table[(name, NAMES[t])] = acc
            if t in decides[name]:
                assert acc == 1.0, (name, NAMES[t], acc)
            else:
                assert abs(acc - 0.5) < tol(m.sum()), (name, NAMES[t], acc)
    print("\noracle accuracy per type:", {f"{k[0]}/{k[1]}": round(float(v), 4) for k, v in table.items()})
    # Conditioned on the type as well, the posteriors are exactly 0/1 or the type's base rate.
    pi = OR.image_oracle(s.image, EQUAL, s.bias)
    pt = OR.text_oracle(s.tokens, EQUAL, s.bias)
    ui, ut = s.bias == CW.UNI_IMAGE, s.bias == CW.UNI_TEXT
    np.testing.assert_array_equal(pi[ui], s.label[ui])
    np.testing.assert_array_equal(pt[ut], s.label[ut])
    assert (pi[~ui] == 0.5).all() and (pt[~ut] == 0.5).all()
    # The joint rule: real <=> authentic image and claim true of the underlying scene.
    np.testing.assert_array_equal(s.label, (~s.manipulated & s.claim_true).astype(int))


def test_label_flips_leave_the_uninformative_modality_unchanged(world):
    """Exact couplings (module docstring, point 2)."""
    s, lats, k_scene = world
    lat = _np(lats)
    bal, ui, ut = (lat.bias == t for t in (CW.BALANCE, CW.UNI_IMAGE, CW.UNI_TEXT))
    # Balance: (X, Y, truth) -> (Y, X, not truth); Uni-image and Uni-text: label flip only.
    flipped = _with(lats, bal | ui | ut, label=1 - lat.label)
    flipped = _with(flipped, bal, claim_true=~lat.claim_true, key_x=lat.key_y, key_y=lat.key_x)
    f = _np(CW.realize_batch(flipped, k_scene, EQUAL))
    np.testing.assert_array_equal(f.image[bal], s.image[bal])
    np.testing.assert_array_equal(f.core_cells[bal], s.core_cells[bal])
    np.testing.assert_array_equal(f.image[ut], s.image[ut])
    np.testing.assert_array_equal(f.tokens[ui], s.tokens[ui])
    assert (f.label != s.label).all()
    # A Uni-image flip changes exactly the manipulated cell.
    P = EQUAL.cell_px
    diff = (f.image[ui] != s.image[ui]).any(-1)
    cells = diff.reshape(-1, 5, P, 5, P).any(axis=(2, 4))
    manip = np.where(s.manipulated[ui, None, None], s.manip_cells[ui], f.manip_cells[ui])
    np.testing.assert_array_equal(cells, manip)
    assert (cells.sum(axis=(1, 2)) == 1).all()
    # Balance, label flip without the swap: the claim is unchanged (the scene changes).
    only = _np(CW.realize_batch(_with(lats, bal, label=1 - lat.label,
                                     claim_true=~lat.claim_true), k_scene, EQUAL))
    np.testing.assert_array_equal(only.tokens[bal], s.tokens[bal])
    # The involution preserves the latent law: (X, Y) is exchangeable (Bowker's symmetry test)
    # and X is uniform over the 16 keys.
    t = np.zeros((16, 16))
    np.add.at(t, (lat.key_x, lat.key_y), 1)
    iu = np.triu_indices(16, 1)
    num, den = (t[iu] - t.T[iu]) ** 2, t[iu] + t.T[iu]
    bowker = (num[den > 0] / den[den > 0]).sum()
    assert stats.chi2.sf(bowker, (den > 0).sum()) > 1e-3
    assert stats.chisquare(np.bincount(lat.key_x, minlength=16)).pvalue > 1e-3
    # ... and the other latents are independent of the label within each type.
    for t_mask in (bal, ui, ut):
        for field in ("scaffold", "direction", "count_hi", "manip_kind"):
            tab = _crosstab(getattr(lat, field)[t_mask], lat.label[t_mask])
            assert stats.chi2_contingency(tab).pvalue > 1e-3, field


def _crosstab(a, b):
    ua, ia = np.unique(a, return_inverse=True)
    ub, ib = np.unique(b, return_inverse=True)
    t = np.zeros((len(ua), len(ub)))
    np.add.at(t, (ia, ib), 1)
    return t


def _lookup_accuracy(features, target):
    """Held-out accuracy of the majority-label-per-feature-value predictor (fit on even rows)."""
    keys = [tuple(np.atleast_1d(f)) for f in features]
    fit, ev = np.arange(len(keys)) % 2 == 0, np.arange(len(keys)) % 2 == 1
    votes = {}
    for k, y, m in zip(keys, target, fit):
        if m:
            votes.setdefault(k, []).append(y)
    guess = np.array([round(np.mean(votes.get(k, [1]))) for k in keys])
    return (guess[ev] == target[ev]).mean(), ev.sum()


def _knn_accuracy(x, y, k=15):
    """Held-out accuracy of a k-nearest-neighbour vote (fit on even rows, Hamming distance)."""
    fit, ev = np.arange(len(y)) % 2 == 0, np.arange(len(y)) % 2 == 1
    xf, xe = x[fit].astype(np.float32), x[ev].astype(np.float32)
    d = (xe ** 2).sum(1)[:, None] + (xf ** 2).sum(1)[None] - 2 * xe @ xf.T
    nn = np.argsort(d, axis=1, kind="stable")[:, :k]
    guess = (y[fit][nn].mean(1) > 0.5).astype(int)
    return (guess == y[ev]).mean(), ev.sum()


def test_claims_carry_no_label_where_the_image_decides_or_both_are_needed(world):
    s, _, _ = world
    claims = [OR.parse_claim(t) for t in s.tokens]
    attrs = {"family": np.array([c.family for c in claims]),
             "x": np.array([c.x for c in claims]), "y": np.array([c.y for c in claims]),
             "direction": np.array([c.direction for c in claims])}
    text = np.array([hash(tuple(t)) for t in s.tokens])
    contingent = s.bias != CW.UNI_TEXT
    for t in (CW.BALANCE, CW.UNI_IMAGE):
        m = s.bias == t
        for name, a in attrs.items():
            assert stats.chi2_contingency(_crosstab(a[m], s.label[m])).pvalue > 1e-3, (t, name)
        acc, n = _lookup_accuracy(text[m], s.label[m])  # every distinct text, both labels
        assert abs(acc - 0.5) < tol(n), (t, acc)
    # The claim does not reveal Uni-image vs Modality-balance either.
    is_ui = (s.bias[contingent] == CW.UNI_IMAGE).astype(int)
    for name, a in attrs.items():
        assert stats.chi2_contingency(_crosstab(a[contingent], is_ui)).pvalue > 1e-3, name
    acc, n = _lookup_accuracy(text[contingent], is_ui)
    assert abs(acc - 0.5) < tol(n)
    # Every contingent text is read the same way by the text oracle; every Uni-text claim is
    # decided by the text alone.
    assert all(OR.text_truth(c, EQUAL) is None for c, u in zip(claims, contingent) if u)
    assert all(OR.text_truth(c, EQUAL) == bool(y)
               for c, u, y in zip(claims, contingent, s.label) if not u)


def _scene_features(keys):
    """Statistics of decoded scenes: per-key counts, occupancy, multiplicity pattern."""
    b = len(keys)
    onehot = np.zeros((b, keys.shape[1] * keys.shape[2], 17), np.uint8)
    flat = keys.reshape(b, -1)
    onehot[np.arange(b)[:, None], np.arange(flat.shape[1])[None], flat + 1] = 1
    counts = np.stack([(flat == k).sum(1) for k in range(16)], 1)
    pattern = np.sort(counts, axis=1)[:, ::-1]
    return onehot.reshape(b, -1), counts, (flat >= 0), pattern


def test_images_carry_no_label_where_the_claim_decides_or_both_are_needed(world):
    s, _, _ = world
    keys = OR.decode_cells(s.image, EQUAL)
    clean = (keys >= -1).all(axis=(1, 2))
    assert (clean == ~s.manipulated).all()
    np.testing.assert_array_equal(keys[clean], np.where(s.color >= 0, 4 * s.color + s.shape,
                                                        -1)[clean])
    onehot, counts, occ, pattern = _scene_features(keys)
    pat = np.array([hash(tuple(p)) for p in pattern])
    n_tests = 0
    for t in (CW.BALANCE, CW.UNI_TEXT):
        m = s.bias == t
        y = s.label[m]
        for j in range(16):
            assert stats.chi2_contingency(_crosstab(counts[m, j], y)).pvalue > 1e-4, (t, j)
        for j in range(occ.shape[1]):
            assert stats.chi2_contingency(_crosstab(occ[m, j], y)).pvalue > 1e-4, (t, j)
        assert stats.chi2_contingency(_crosstab(pat[m], y)).pvalue > 1e-3
        for acc, n in (_lookup_accuracy(pat[m], y), _knn_accuracy(onehot[m], y)):
            assert abs(acc - 0.5) < tol(n), (t, acc)
        n_tests += 1
    # Authentic images do not reveal the type: Uni-image reals vs Modality-balance vs Uni-text.
    m = clean
    for t in (CW.UNI_IMAGE, CW.UNI_TEXT):
        target = (s.bias[m] == t).astype(int)
        assert stats.chi2_contingency(_crosstab(pat[m], target)).pvalue > 1e-3
    # The manipulation kind is independent of the claim (family) in Uni-image fakes.
    fam = np.array([OR.parse_claim(t).family for t in s.tokens])
    mf = s.manipulated
    assert stats.chi2_contingency(_crosstab(np.asarray(s.latents.manip_kind)[mf],
                                            fam[mf])).pvalue > 1e-3
    assert n_tests == 2


def test_causal_ground_truth(world):
    """E / C are the claim's objects / the rest; W / R the content / function words."""
    s, _, _ = world
    keys = np.where(s.color >= 0, 4 * s.color + s.shape, -1)
    for i in range(N):
        c = OR.parse_claim(s.tokens[i])
        if c.family in (CW.F_RELATION, CW.F_COMPARISON):
            expect = (keys[i] == c.x) | (keys[i] == c.y)
            if c.family == CW.F_RELATION:
                assert expect.sum() == 2
        elif c.family == CW.F_COUNT:
            expect = keys[i] >= 0
        else:
            expect = keys[i] == c.x
        np.testing.assert_array_equal(s.core_cells[i], expect)
    # The manipulated cell is one of the claim's objects, and only Uni-image fakes have one.
    assert (s.manip_cells.sum(axis=(1, 2)) == s.manipulated).all()
    assert not (s.manip_cells & ~s.core_cells).any()
    # Words: every attribute / relation / quantifier / number word is core, the rest is not.
    words = np.array(CW.CLAIM_VOCAB.words)
    core_words, other_words = set(words[s.tokens[s.core_tokens]]), set(
        words[s.tokens[(s.tokens != 0) & ~s.core_tokens]])
    assert other_words == {"the", "is", "there", "are"}
    assert not core_words & other_words
    assert {"more", "than", "itself", "no", "as", "many", "objects"} <= core_words

    # Causal effects, with the joint oracle as the decision rule: blanking an irrelevant object
    # never changes a Modality-balance verdict; blanking the subject of a true relation claim
    # makes it false; restoring the manipulated cell makes a Uni-image fake authentic.
    P, rng = EQUAL.cell_px, np.random.default_rng(0)
    bal = np.flatnonzero(s.bias == CW.BALANCE)[:300]
    img = s.image[bal].copy()
    for j, i in enumerate(bal):
        cand = np.argwhere((keys[i] >= 0) & ~s.core_cells[i])
        if len(cand):
            y, x = cand[rng.integers(len(cand))]
            img[j, y * P:(y + 1) * P, x * P:(x + 1) * P] = 255
    np.testing.assert_array_equal(OR.joint_oracle(img, s.tokens[bal], EQUAL), s.label[bal])
    rel_true = np.array([i for i in bal if s.label[i] == 1
                         and OR.parse_claim(s.tokens[i]).family == CW.F_RELATION])
    img = s.image[rel_true].copy()
    for j, i in enumerate(rel_true):
        y, x = np.argwhere(keys[i] == OR.parse_claim(s.tokens[i]).x)[0]
        img[j, y * P:(y + 1) * P, x * P:(x + 1) * P] = 255
    assert (OR.joint_oracle(img, s.tokens[rel_true], EQUAL) == 0).all() and len(rel_true) > 20
    fakes = np.flatnonzero(s.manipulated)
    restored = np.asarray(jax.vmap(lambda c, sh: R.render(c, sh, P))(s.color[fakes],
                                                                      s.shape[fakes]))
    assert (OR.image_oracle(s.image[fakes], EQUAL) == 0).all()
    assert (OR.image_oracle(restored, EQUAL) > 0.5).all()


def test_claims_are_sentences_of_the_shared_tokenizer(world):
    s, _, _ = world
    for i in range(0, N, 37):
        text = OR.claim_text(s.tokens[i])
        assert text.endswith(".") and text[0].isupper()
        np.testing.assert_array_equal(CW.CLAIM_VOCAB.encode(text[:-1], EQUAL.max_tokens),
                                      s.tokens[i])
        assert OR.parse_claim(s.tokens[i]).family == int(s.latents.family[i])
    with pytest.raises(ValueError, match="not a claim"):
        OR.parse_claim(CW.CLAIM_VOCAB.encode("the red circle is", 12))


def test_to_batch_is_the_common_batch(world):
    s, _, _ = world
    sub = jax.tree.map(lambda a: a[:64], s)
    b = BA.validate(BA.to_numpy(CW.to_batch(sub, EQUAL, np.arange(64) + 100)))
    assert b.image.shape == (64, 80, 80, 3) and b.has_gt.all()
    np.testing.assert_array_equal(b.image_core, np.asarray(R.pixel_mask(sub.core_cells, 16),
                                                           bool))
    np.testing.assert_array_equal(b.text_irrelevant, (sub.tokens != 0) & ~sub.core_tokens)
    np.testing.assert_array_equal(b.index, np.arange(64) + 100)
    np.testing.assert_array_equal(b.fine_label[b.label == 1], 0)
    np.testing.assert_array_equal(b.fine_label[(b.label == 0) & (b.bias == CW.UNI_IMAGE)], 2)


def test_oracles_do_not_use_the_generator():
    """The oracles are independent checks: from the generator module they import only the
    benchmark's public contract (spec, vocabulary, claim families), no construction code."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(OR))
    imported = {a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and node.module == CW.__name__ for a in node.names}
    contract = {"WorldSpec", "CLAIM_VOCAB", "FAMILIES", "F_RELATION", "F_COMPARISON", "F_COUNT",
                "F_SELF_RELATION", "F_SELF_COMPARISON"}
    assert imported and imported <= contract, imported - contract
    package, module = CW.__name__.rsplit(".", 1)
    assert not any((isinstance(node, ast.Import) and any(a.name == CW.__name__ for a in node.names))
                   or (isinstance(node, ast.ImportFrom) and node.module == package
                       and any(a.name == module for a in node.names))
                   for node in ast.walk(tree))  # no access to the module as a whole


def test_default_types_are_identifiable_from_the_inputs():
    """Default spec: every Uni-image sample is a manipulated fake, so the image oracle alone
    settles it, the text oracle settles every Uni-text sample, and no sample needs the
    identifiable relabelling (a real Uni-image sample would look exactly like a real balanced
    one)."""
    from bias_jax.scoring import identifiable_labels

    spec = CW.WorldSpec()
    s = _np(CW.generate(spec, 11, 0, 1500))
    ui, ut = s.bias == CW.UNI_IMAGE, s.bias == CW.UNI_TEXT
    assert ui.sum() > 150 and ut.sum() > 100
    assert (s.label[ui] == CW.FAKE).all() and s.manipulated[ui].all() and not s.manipulated[~ui].any()
    np.testing.assert_array_equal(identifiable_labels(s.bias, s.label), s.bias)
    np.testing.assert_array_equal(OR.image_oracle(s.image[ui], spec), 0.0)
    np.testing.assert_array_equal(OR.text_oracle(s.tokens[ut], spec), s.label[ut])
