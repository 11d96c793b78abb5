"""Global synergy of a model by bucket: held-out samples of one closed-world bucket, every
estimator on one extended cross table, the input features of PID's k-means codes, and the
estimators on the stand-in models of known synergy (``explain.controls``).

These are the pieces of a depth sweep (does a synergy estimator grow with the relational depth
of the questions a model answers?): draw the samples of buckets D1/D2/D3 with
``bucket_samples``, build each bucket's table with ``global_synergy.cross_table`` and score it
with ``score_table``; the set-level (jackknife) standard errors it returns give intervals of
differences between buckets (independent samples).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from mmx_base.errors import InputError
from gridvqa_jax.explain import controls as CT
from gridvqa_jax.explain import global_synergy as GS
from gridvqa_jax.explain import synergy as SY
from gridvqa_jax.models import mdetr as M
from gridvqa_jax.world import generate as G
from gridvqa_jax.world import render as R
from gridvqa_jax.world import universe as U
from gridvqa_jax.world.scene import trim_tokens


def bucket_id(name: str) -> int:
    """The bucket id of a name ``"D<depth>_<M|A|...>_F<form>"`` (``universe.bucket_id``)."""
    d, q, f = name.split("_")
    return U.bucket_id(int(d[1:]), q, int(f[1:]))


VARIANT_STRIDE = 1_000  # seed offset between the variants' buckets (more than any bucket id)


def bucket_seed(variant: str, bucket: str, seed: int) -> int:
    """The generator seed of one variant's bucket: ``seed + bucket id + VARIANT_STRIDE *
    universe.VARIANTS.index(variant)`` (``ValueError`` for an unknown variant)."""
    if variant not in U.VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; expected one of {', '.join(U.VARIANTS)}")
    return int(seed) + bucket_id(bucket) + VARIANT_STRIDE * U.VARIANTS.index(variant)


def bucket_samples(variant: str, bucket: str, n: int, seed: int, grid_size: int = 5,
                   cell_px: int = 16, density: float = 0.7):
    """N samples of one bucket: ``(images uint8 [N, S*P, S*P, 3], tokens [N, L'], truth [N]
    unified answer class)``.

    Drawn from the ``variant`` world (``"pure"`` or ``"spur"``) with seed ``seed + bucket id +
    VARIANT_STRIDE * variant index`` (``universe.VARIANTS``: one seed for both variants would
    give them the same anchors and targets, so D_pure and D_spur buckets would not be
    independent samples), rendered at ``cell_px`` (P) per cell; the tokens keep the longest
    question's positions rounded up to 4 (``scene.trim_tokens``: only trailing PAD is dropped, and the models' cost
    falls with the length).
    """
    bid = bucket_id(bucket)
    try:
        spec = U.Spec(variant, grid_size, density, 64)
    except ValueError:  # some bucket infeasible at this size: this one's own spec (or its reason)
        spec = U.Spec(variant, grid_size, density, 64, buckets=(bid,))
    # the bucket as a traced argument of one spec (not a one-bucket spec each): every bucket
    # shares the generator's compiled programs; sample i is the same (generate.sample_batch)
    keys = G.sample_keys(bucket_seed(variant, bucket, seed), 0, n)
    sc = G.to_numpy(G.sample_lanes(keys, spec, np.full(n, bid, np.int32), G.DRAW_LANES,
                                   G.data_mesh(jax.local_devices())))
    return scene_arrays(sc, grid_size, cell_px)


def scene_arrays(sc, grid_size: int = 5, cell_px: int = 16):
    """A numpy ``Scene`` batch -> ``(images uint8 [N, S*P, S*P, 3], tokens [N, L'], truth [N]
    unified answer class)`` as ``bucket_samples`` returns them (trailing PAD dropped)."""
    images = jax.jit(jax.vmap(lambda c, s: R.render(c, s, cell_px)))(
        jnp.asarray(sc.color), jnp.asarray(sc.shape))
    truth = np.asarray(M.answer_index(sc.answer, sc.is_yesno, grid_size * grid_size))
    return images, jnp.asarray(trim_tokens(sc).tokens), truth


def dataset_bucket_samples(batch, bucket: str, n: int, source: str = "dataset",
                           grid_size: int = 5, cell_px: int = 16):
    """The first ``n`` samples of ``bucket`` (file order) of a Scene batch read from disk
    (``formats.datasets.load_density``), as ``bucket_samples`` returns generated ones.
    ``InputError`` naming ``source`` when the bucket has fewer than ``n``."""
    from gridvqa_jax.formats import datasets as DS

    idx = np.flatnonzero(np.asarray(batch.bucket) == bucket_id(bucket))
    if len(idx) < n:
        raise InputError(f"{source}: {len(idx)} {bucket} samples, fewer than the n = {n} asked "
                         "(lower --n)")
    return scene_arrays(DS.take_samples(batch, idx[:n]), grid_size, cell_px)


def score_table(F_ext, key, n_boot: int = 200,
                estimators=GS.ESTIMATORS + GS.REFERENCE_ESTIMATORS,
                pid_discretise: str = "marginal", pid_features=None, labels=None) -> dict:
    """Every estimator on one extended cross table ``F_ext [N+1, N+1, A]``: ours and the
    references' (``global_synergy.ESTIMATORS``, ``REFERENCE_ESTIMATORS``; ``"emap_gap"`` only
    with ``labels``, the N ground-truth answers).

    Returns ``{est: global_synergy.jackknife_scores(...)}`` (set-level jackknife intervals;
    ``pid_null`` from ``n_boot`` permutations with key ``fold_in(key, k)`` for estimator k of
    ``estimators``; fractions, not percent) plus two diagnostics:
    ``"intershap_global_empty"`` (``synergy.intershap_global`` of the empty-baseline games) and
    ``"pid_empty_total_bits"`` (``I(X1, X2; Y)`` in bits seen by the "empty" PID codes).
    ``pid_discretise`` / ``pid_features``: the codes of PID and its null
    (``global_synergy.set_statistic``).
    """
    out = {}
    for k, est in enumerate(estimators):
        if est == "emap_gap" and labels is None:
            continue
        kw = ({"pid_discretise": pid_discretise, "pid_features": pid_features}
              if est in ("pid", "pid_null") else {"labels": labels} if est == "emap_gap" else {})
        out[est] = GS.jackknife_scores(F_ext, est, jax.random.fold_in(key, k), n_boot, **kw)
    out["intershap_global_empty"] = float(SY.intershap_global(GS.modality_games(F_ext, "empty")))
    (x1, x2, y), sizes = GS.dense_codes(*GS.pid_codes(F_ext, "empty"))
    out["pid_empty_total_bits"] = float(GS.pid_share(jnp.asarray(x1), jnp.asarray(x2),
                                                     jnp.asarray(y), tuple(sizes))["total"])
    return out


def input_features(images, tokens, grid_size: int = 5):
    """Per-sample unimodal features for PID's k-means codes: ``(image [N, S*S*3], text
    [N, L*V])``: the mean RGB of every cell (0..1) and the one-hot word at every token position
    (PAD = all zeros), flattened.

    Each holds its own input exactly at the closed world's resolution (which colour / shape lies
    where; which words in which order) and nothing of the other modality; they do not depend on
    the model, so the codes are the same for every model on the same data.
    """
    x = jnp.asarray(images, jnp.float32) / 255.0
    N, H = x.shape[0], x.shape[1]
    P = H // grid_size
    cells = x.reshape(N, grid_size, P, grid_size, P, 3).mean(axis=(2, 4))
    words = jax.nn.one_hot(jnp.asarray(tokens), len(U.VOCAB))
    words = jnp.where((jnp.asarray(tokens) == U.PAD_ID)[..., None], 0.0, words)
    return cells.reshape(N, -1), words.reshape(N, -1)


def run_controls(images, tokens, key, n_boot: int = 200, grid_size: int = 5,
                 labels=None) -> dict:
    """Every estimator on every stand-in model of ``controls.synergy_control_models()`` over
    the given inputs: ``{control: score_table(...)}`` (control c with key ``fold_in(key, c)``).

    ``emap_gap`` (accuracy minus the additive projection's) is scored against each control's
    own answers on the unperturbed inputs, ``argmax F[i, i]``: a control computes its rule
    exactly, so its rule is its task (model accuracy 1), and the gap is what its additive
    projection loses: 0 for the additive and one-modality controls, about 1/2 for the XOR of
    two balanced bits. The scenes' answers would not do: a control answers in its own two
    classes, so against them both the control and its projection are always wrong and the gap
    is 0 whatever the synergy. ``labels`` int [N] overrides this (one set for every control).
    """
    out = {}
    for c, (name, fn) in enumerate(CT.synergy_control_models().items()):
        F = GS.cross_table(fn, None, images, tokens, grid_size=grid_size)
        n = F.shape[0] - 1
        own = jnp.argmax(F[jnp.arange(n), jnp.arange(n)], axis=-1)
        out[name] = score_table(F, jax.random.fold_in(key, c), n_boot,
                                labels=own if labels is None else labels)
    return out


__all__ = ["VARIANT_STRIDE", "bucket_id", "bucket_seed", "bucket_samples", "scene_arrays",
           "dataset_bucket_samples", "score_table", "input_features", "run_controls"]
