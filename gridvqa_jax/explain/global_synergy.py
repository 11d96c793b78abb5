"""Model-level global synergy estimators: EMAP, InterSHAP and PID of a model over a set of samples.

The score formulas live in ``gridvqa_jax.explain.synergy`` (EMAP, InterSHAP) and
``gridvqa_jax.explain.pid`` (PID); this module runs the model to build their inputs.

One table serves all three. For N samples with images ``v_j`` (``[N, H, W, 3]``, rendered at the
model's 16 px per cell) and questions ``t_i`` (``[N, L]``), ``cross_table(..., baselines=True)``
returns the answer log-probabilities of every (question, image) pair of the *extended* set
``{t_0..t_{N-1}, t_PAD} x {v_0..v_{N-1}, v_empty}``::

    F[i, j, :] = log P(. | t_i, v_j)      i, j in 0..N   ([N+1, N+1, A])

where row N is the all-PAD question (``universe.PAD_ID`` everywhere; the models read no PAD token)
and column N the empty grid (every cell masked by ``perturb.mask_cells``, the white tile the
closed world draws for "no object"). ``(N+1)^2`` forward passes, evaluated as fixed-size chunks
of (i, j) pairs through one vmapped forward (``lax.map`` over chunks; compiled once per
``(N, chunk)``), the chunk axis sharded over a ``('data',)`` mesh with params replicated.

Scores (all per sample ``i`` at the model's answer on its own input, ``a_i = argmax_c F[i, i, c]``):

* **EMAP** (Hessel & Lee 2020): ``synergy.emap(F[:N, :N])``. The projection is taken per answer
  class over all ``N^2`` pairs (as Hessel & Lee project every logit), then read at ``a_i``: the
  mismatched pairs ``(t_i, v_j)`` are scored at the answer predicted for sample ``i`` on its own
  input in row ``i`` and at ``a_j`` in column ``j`` only through their own projections (the
  InterSHAP authors' "best" output). Per-sample score ``|gap| / (|gap| + |text effect| +
  |image effect|)`` (``synergy.emap``); the percentage "EMAP synergy (%)" is 100 x its mean.
* **InterSHAP** (Wenderoth et al. 2025): the two-player game ``v[i] = [[v(empty), v({T})],
  [v({I}), v({I, T})]]`` of log P(a_i | .); ``baseline="empty"`` (default) fills an absent
  modality with the empty grid / all-PAD question (``F[N, i]``, ``F[i, N]``, ``F[N, N]``),
  ``baseline="average"`` with every other sample's input in turn (then the score equals EMAP's
  exactly, ``synergy.emap`` docstring). Score ``synergy.intershap`` per sample, mean over samples;
  ``synergy.intershap_global`` only with the empty baseline (see its docstring).
  Difference from the authors: they use softmax probabilities; we use log-probabilities, the
  quantity EMAP projects, so the two estimators differ only in the baseline.
* **PID** (Liang et al. 2023): ``pid.pid`` of the empirical joint ``p[x1, x2, y]`` with
  ``y_i = a_i`` (the model's answer: we measure what the model computes, not the task) and the
  unimodal codes chosen by ``discretise``:

  - ``"marginal"`` (default): ``x1_i = argmax_c mean_j F[j, i, c]`` (the answer image ``i`` gets
    averaged over the set's questions) and ``x2_i = argmax_c mean_j F[i, j, c]`` (question ``i``
    averaged over the set's images), i.e. the answers of EMAP's unimodal projections;
  - ``"empty"``: the answers on the image-only and text-only inputs, ``argmax F[N, i]`` and
    ``argmax F[i, N]``. On the reference models both are constant (every all-PAD question is
    answered "yes", every empty grid "0"), so every PID term is 0 whatever the model: this
    discretisation cannot see anything here, which is why it is not the default;
  - ``"kmeans"``: k-means (``kmeans_codes``) on caller-supplied per-sample image and text
    features (``gridvqa synergy --pid-codes kmeans`` uses ``synergy_check.input_features``: per-cell
    mean colours and one-hot words; the model's embeddings, ``models.mdetr.make_embed``, work
    too).

  Codes are remapped to ``0..K-1`` over the set. The score is the synergy share ``S / I(X1, X2;
  Y)`` (0 when ``I = 0``); "PID synergy (%)" = 100 x share. PID is a set-level quantity, so its
  spread is a set-level one: a bootstrap spread, or the delete-one jackknife
  (``jackknife_scores``, which ``synergy_check.score_table`` uses for every estimator).

Reference statistics (``REFERENCE_ESTIMATORS``, beside ours; ``set_statistic``):

* ``emap_gap``: the statistic Hessel & Lee and the InterSHAP authors' ``EMAP.py`` report, model
  accuracy minus the accuracy of its additive projection (``emap_gap_scores``; needs the
  ground-truth answers). Our "EMAP %" above is a definition of ours (it equals InterSHAP with
  the averaging baseline).
* ``intershap_ref``: the authors' InterSHAP (``modality_games(F, "reference")``: softmax
  probabilities, absent modalities filled from the data, ``v(empty)`` the mean prediction).
* ``pid_null``: PID's synergy share on the same codes with the answers permuted (its chance
  level: a plug-in PID on N samples is biased upwards, so a share is read against this null);
  ``pid_discretise="reference"`` clusters the inputs as the authors' ``PID.py`` does
  (``reference_pid_codes``: normalise, PCA to 2, k-means with 20 clusters).

Bootstrap (``bootstrap_scores``), B times: EMAP and InterSHAP resample their per-sample scores
(each computed once, on the projection of the whole N-set); PID rebuilds the joint of the
resampled samples. EMAP is not re-projected on a resampled table ``F[idx][:, idx]``: a sample
drawn twice meets itself as a "mismatched" pair, which pulls the projection towards f and the
synergy down (on our models the depth-3 point estimate lay above its own 95% interval).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from mmx_base.batching import check_chunk, rows_per_call
from gridvqa_jax.explain import synergy as SY
from gridvqa_jax.explain.pid import joint_from_labels, pid
from gridvqa_jax.explain.perturb import mask_cells
from gridvqa_jax.world import universe as U

ESTIMATORS = ("emap", "intershap", "pid")
# The references' statistics, reported beside ours (module docstring, "Reference statistics")
REFERENCE_ESTIMATORS = ("emap_gap", "intershap_ref", "pid_null")


# ----------------------------------------------------------------------------------------------
# Model tables
# ----------------------------------------------------------------------------------------------
@functools.partial(jax.jit, static_argnames=("apply_fn", "chunk", "mesh"))
def _forward_pairs(apply_fn, params, images, tokens, text_idx, image_idx, chunk, mesh):
    """answer_logprobs of ``(tokens[text_idx[k]], images[image_idx[k]])`` for k = 0..K-1 (K a
    multiple of ``chunk``): lax.map over chunks of one vmapped (batched) forward."""
    n_chunks = text_idx.shape[0] // chunk
    sharding = None if mesh is None else NamedSharding(mesh, P("data"))

    def one(idx):
        ti, vi = idx
        im, tok = images[vi], tokens[ti]
        if sharding is not None:
            im = jax.lax.with_sharding_constraint(im, sharding)
            tok = jax.lax.with_sharding_constraint(tok, sharding)
        return apply_fn(params, im, tok)["answer_logprobs"]

    out = jax.lax.map(one, (text_idx.reshape(n_chunks, chunk), image_idx.reshape(n_chunks, chunk)))
    return out.reshape(n_chunks * chunk, -1)


def forward_pairs(apply_fn, params, images, tokens, text_idx, image_idx, *,
                  chunk: int | None = None, mesh=None) -> jax.Array:
    """``[K, A]`` answer log-probabilities of the pairs ``(tokens[text_idx[k]],
    images[image_idx[k]])``. The K pairs are padded to a multiple of ``chunk`` (rounded up to a
    multiple of the mesh size) and evaluated chunk by chunk; memory is O(chunk), not O(K).
    Default ``chunk``: ``mmx_base.batching.rows_per_call()`` per device (64 on CPU)."""
    text_idx = np.asarray(text_idx, np.int32)
    image_idx = np.asarray(image_idx, np.int32)
    k = text_idx.shape[0]
    n_dev = 1 if mesh is None else mesh.devices.size
    if chunk is None:
        chunk = rows_per_call() * n_dev
    chunk = -(-min(check_chunk(chunk), k) // n_dev) * n_dev
    pad = -(-k // chunk) * chunk - k
    text_idx = np.concatenate([text_idx, np.zeros(pad, np.int32)])
    image_idx = np.concatenate([image_idx, np.zeros(pad, np.int32)])
    if mesh is not None:
        rep = NamedSharding(mesh, P())
        params, images, tokens = jax.device_put((params, jnp.asarray(images), jnp.asarray(tokens)),
                                                rep)
    out = _forward_pairs(apply_fn, params, jnp.asarray(images), jnp.asarray(tokens),
                         jnp.asarray(text_idx), jnp.asarray(image_idx), chunk, mesh)
    return out[:k]


def with_baselines(images, tokens, grid_size: int | None = None):
    """Append the empty grid (every cell masked, ``perturb.mask_cells``) and the all-PAD question:
    ``images [N, H, W, 3] -> [N+1, H, W, 3]``, ``tokens [N, L] -> [N+1, L]``.

    ``grid_size``: S of the images (checked against their side, ``grid_size_of``). The empty
    grid is the same white image at every S that divides the side (the empty tile is plain
    white), so None masks the whole image as one cell and needs no grid size.
    """
    images = jnp.asarray(images)
    tokens = jnp.asarray(tokens)
    S = 1 if grid_size is None else grid_size_of(images, grid_size)
    empty = mask_cells(images[:1], jnp.ones((1, S, S), bool))
    pad = jnp.full((1, tokens.shape[1]), U.PAD_ID, tokens.dtype)
    return jnp.concatenate([images, empty]), jnp.concatenate([tokens, pad])


def grid_size_of(images, grid_size: int | None = None) -> int:
    """S of square images ``[..., H, W, 3]`` of an S x S grid (``4 <= S <= 10``).

    ``grid_size`` given: checked (``H == W`` and a multiple of it) and returned. None: inferred
    only when exactly one S in 4..10 divides the side; otherwise ``ValueError`` naming the
    candidates (an 80-px image is a 4x4 grid of 20-px cells or a 5x5 grid of 16-px cells, ...).
    """
    h, w = (int(d) for d in np.shape(images)[-3:-1])
    if h != w:
        raise ValueError(f"images are {h}x{w}: a grid image is square")
    if grid_size is not None:
        if not (isinstance(grid_size, (int, np.integer)) and grid_size >= 1 and h % grid_size == 0):
            raise ValueError(f"grid_size={grid_size!r} does not divide the {h}-px image side")
        return int(grid_size)
    fits = [s for s in range(4, 11) if h % s == 0]
    if len(fits) != 1:
        raise ValueError(f"cannot infer the grid size of a {h}-px image: "
                         + (f"it fits {', '.join(f'{s}x{s}' for s in fits)}" if fits
                            else "no grid size 4..10 divides it") + "; pass grid_size=")
    return fits[0]


def cross_table(apply_fn, params, images, tokens, *, baselines: bool = True,
                chunk: int | None = None,
                mesh=None, grid_size: int | None = None) -> jax.Array:
    """The cross table of a model: ``F[i, j, :] = log P(. | t_i, v_j)`` (module docstring).

    Args:
      apply_fn: pure ``apply(params, image [B, H, W, 3], tokens [B, L]) -> {"answer_logprobs":
        [B, A]}`` (hashable; it is a static argument of the jitted forward).
      images: ``[N, H, W, 3]`` (uint8 or float), tokens ``[N, L]`` int.
      baselines: append the empty grid and the all-PAD question (``with_baselines``) ->
        ``[N+1, N+1, A]``; else ``[N, N, A]``.
      chunk: pairs per forward call (default ``forward_pairs``'); mesh: optional ``('data',)`` mesh (chunk axis sharded).
      grid_size: S of the images, checked against their side (``with_baselines``; None: not
        needed, the empty grid is white at every grid size).
    """
    images, tokens = jnp.asarray(images), jnp.asarray(tokens)
    if baselines:
        images, tokens = with_baselines(images, tokens, grid_size)
    n = images.shape[0]
    ti, vi = np.divmod(np.arange(n * n), n)
    out = forward_pairs(apply_fn, params, images, tokens, ti, vi, chunk=chunk, mesh=mesh)
    return out.reshape(n, n, -1)


# ----------------------------------------------------------------------------------------------
# Scores on a table (jittable; idx selects a (bootstrap) subset of the N-set)
# ----------------------------------------------------------------------------------------------
def emap_scores(F) -> jax.Array:
    """Per-sample EMAP synergy share ``[N]`` of a cross table ``F[N, N, A]`` (``synergy.emap``,
    scored at each sample's own predicted answer)."""
    return SY.emap(F)["synergy"]


def emap_gap_scores(F, labels) -> jax.Array:
    """Per-sample ``(model correct) - (additive projection correct)`` ``[N]`` in {-1, 0, 1} of a
    cross table ``F[N, N, A]`` against ``labels`` int [N] (``synergy.emap``'s ``correct_gap``):
    its mean is the reference EMAP statistic, model accuracy minus the accuracy of its
    projection (Hessel & Lee 2020; the InterSHAP authors' ``EMAP.py``). The projection of
    log-probabilities has the argmax of the projection of logits (they differ by the projection
    of the per-pair log-normaliser, which is the same for every answer)."""
    return SY.emap(jnp.asarray(F), labels=jnp.asarray(labels))["correct_gap"]


def modality_games(F_ext, baseline: str = "empty") -> jax.Array:
    """Per-sample two-player games ``v[N, 2, 2]`` (``synergy`` convention: ``v[image present,
    text present]``) at ``a_i = argmax F[i, i]``, from an extended table ``F_ext[N+1, N+1, A]``
    (``baseline="empty"``: its last row and column are the baselines) or from the N x N table
    ``F[N, N, A]`` (``"average"``, ``"reference"``: every row is a sample, so pass
    ``F_ext[:-1, :-1]``, not ``F_ext``; the shapes cannot tell them apart).

    ``"empty"`` / ``"average"``: games of ``log P(a_i | .)`` with an absent modality the empty
    grid / all-PAD question, or every other sample's input in turn. ``"reference"``: the
    InterSHAP authors' game (``synergy_evaluation/interaction_values.py``): softmax
    probabilities ``P(a_i | .)``, an absent modality filled from the data (their
    ``random_masking`` draws, here averaged exactly over all N samples: ``v({I}) = mean_j
    P(a_i | t_j, v_i)``, ``v({T}) = mean_j P(a_i | t_i, v_j)``) and ``v(empty)`` the mean
    prediction over the data (their ``calc_base_values``: ``mean_j P(a_i | t_j, v_j)``)."""
    F_ext = jnp.asarray(F_ext)
    if baseline == "empty":
        n = F_ext.shape[0] - 1
        d = jnp.arange(n)
        a = jnp.argmax(F_ext[d, d], axis=-1)
        v11 = F_ext[d, d, a]
        v10 = F_ext[n, d, a]  # image i, all-PAD question
        v01 = F_ext[d, n, a]  # question i, empty grid
        v00 = F_ext[n, n, a]
    elif baseline == "average":
        F = F_ext
        n = F.shape[0]
        d = jnp.arange(n)
        a = jnp.argmax(F[d, d], axis=-1)
        v11 = F[d, d, a]
        v10 = F[:, d, a].mean(axis=0)  # mean_j F[j, i, a_i]
        v01 = F[d, :, a].mean(axis=1)  # mean_j F[i, j, a_i]
        v00 = F[:, :, a].mean(axis=(0, 1))
    elif baseline == "reference":
        Pr = jnp.exp(F_ext)  # the models return log-softmax: exp is the softmax
        n = Pr.shape[0]
        d = jnp.arange(n)
        a = jnp.argmax(Pr[d, d], axis=-1)
        v11 = Pr[d, d, a]
        v10 = Pr[:, d, a].mean(axis=0)  # image i, every sample's question
        v01 = Pr[d, :, a].mean(axis=1)  # question i, every sample's image
        v00 = Pr[d, d].mean(axis=0)[a]  # the mean matched prediction, at a_i
    else:
        raise ValueError(f"unknown baseline {baseline!r}; expected 'empty', 'average' or "
                         "'reference'")
    return jnp.stack([jnp.stack([v00, v01], -1), jnp.stack([v10, v11], -1)], -2)


def intershap_scores(F_ext, baseline: str = "empty") -> jax.Array:
    """Per-sample InterSHAP ``[N]`` (``synergy.intershap`` of ``modality_games``: ``F_ext``
    [N+1, N+1, A] for ``baseline="empty"``, the N x N table for the others)."""
    return SY.intershap(modality_games(F_ext, baseline))


def pid_codes(F_ext, discretise: str = "marginal", features=None, k: int = 6, key=None):
    """Integer codes ``(x1 image, x2 text, y answer)``, each ``[N]``, of the module docstring.

    ``F_ext``: the extended table ``[N+1, N+1, A]`` for ``"empty"`` (it needs the baseline row and
    column), the ``[N, N, A]`` table for ``"marginal"`` and ``"kmeans"``. ``features``:
    ``(image_features [N, D1], text_features [N, D2])`` for ``"kmeans"`` (``k`` clusters each,
    ``key`` for the initialisation)."""
    F_ext = jnp.asarray(F_ext)
    if discretise == "empty":
        n = F_ext.shape[0] - 1
        d = jnp.arange(n)
        return (jnp.argmax(F_ext[n, d], -1), jnp.argmax(F_ext[d, n], -1),
                jnp.argmax(F_ext[d, d], -1))
    F = F_ext
    d = jnp.arange(F.shape[0])
    y = jnp.argmax(F[d, d], -1)
    if discretise == "marginal":
        return jnp.argmax(F.mean(axis=0), -1), jnp.argmax(F.mean(axis=1), -1), y
    if discretise == "kmeans":
        if features is None:
            raise ValueError("discretise='kmeans' needs features=(image_features, text_features)")
        key = jax.random.key(0) if key is None else key
        k1, k2 = jax.random.split(key)
        return kmeans_codes(features[0], k, k1), kmeans_codes(features[1], k, k2), y
    raise ValueError(f"unknown discretise {discretise!r}; expected marginal, empty or kmeans")


def reference_pid_codes(image_features, text_features, n_clusters: int = 20,
                        n_components: int = 2, seed: int = 0):
    """The InterSHAP authors' unimodal PID codes (``synergy_evaluation/PID.py``,
    ``clustering(X, pca=True, n_components=2, n_clusters=20)``): each modality's features
    ``[N, D]`` L2-normalised per sample (``sklearn.preprocessing.normalize``), projected on
    their first ``n_components`` principal components (``sklearn.decomposition.PCA``) and
    clustered by ``sklearn.cluster.KMeans(n_clusters, n_init=10)`` -> (x1 image [N], x2 text
    [N]) int codes (clusters capped at the number of distinct projected points)."""
    from sklearn.cluster import KMeans
    from sklearn.decomposition import PCA
    from sklearn.preprocessing import normalize

    out = []
    for m, x in enumerate((image_features, text_features)):
        x = np.nan_to_num(np.asarray(x, np.float64).reshape(np.shape(x)[0], -1))
        z = PCA(n_components=min(n_components, *x.shape)).fit_transform(normalize(x))
        k = max(1, min(int(n_clusters), len(np.unique(np.round(z, 9), axis=0))))
        out.append(KMeans(n_clusters=k, n_init=10, random_state=seed + m).fit(z).labels_)
    return tuple(np.asarray(c, np.int32) for c in out)


def kmeans_codes(x, k: int, key, iters: int = 50) -> jax.Array:
    """Cluster ids ``[N]`` of ``x [N, D]`` by Lloyd's k-means (k-means++-free: k distinct random
    points as initial centres, ``iters`` steps; an emptied cluster keeps its centre)."""
    x = jnp.asarray(x, jnp.float32).reshape(np.shape(x)[0], -1)
    k = min(int(k), x.shape[0])
    c = x[jax.random.choice(key, x.shape[0], (k,), replace=False)]

    def step(c, _):
        lab = jnp.argmin(((x[:, None] - c[None]) ** 2).sum(-1), axis=1)
        oh = jax.nn.one_hot(lab, k)
        cnt = oh.sum(0)
        new = (oh.T @ x) / jnp.maximum(cnt, 1)[:, None]
        return jnp.where(cnt[:, None] > 0, new, c), None

    c, _ = jax.lax.scan(step, c, None, length=iters)
    return jnp.argmin(((x[:, None] - c[None]) ** 2).sum(-1), axis=1)


def dense_codes(*codes):
    """Remap each integer code array to ``0..K-1`` (host numpy); returns the arrays and the Ks."""
    out, sizes = [], []
    for c in codes:
        u, inv = np.unique(np.asarray(c), return_inverse=True)
        out.append(inv.astype(np.int32))
        sizes.append(max(len(u), 1))
    return out, sizes


def _solver_sizes(sizes, multiple: int = 8) -> tuple:
    # alphabet sizes rounded up: sets with different alphabets share one compiled solver (a
    # compile per set cost ~1 s each, 40 per reproduction); the extra symbols have zero mass and
    # change no PID term (a resampled joint has such symbols anyway)
    return tuple(-(-int(k) // multiple) * multiple for k in sizes)


def pid_share(x1, x2, y, sizes, idx=None) -> dict:
    """PID (bits) of the joint of dense codes (optionally of the resampled samples ``idx``) and
    the synergy share ``S / I(X1, X2; Y)`` (0 when I = 0; clipped to [0, 1], the solver's
    round-off aside a share lies there). Jittable given static ``sizes``."""
    if idx is not None:
        x1, x2, y = x1[idx], x2[idx], y[idx]
    p = joint_from_labels(x1, x2, y, *sizes)
    out = pid(p)
    total = out["redundancy"] + out["unique1"] + out["unique2"] + out["synergy"]
    out["total"] = total
    share = jnp.where(total > 1e-6, out["synergy"] / jnp.where(total > 1e-6, total, 1), 0.0)
    out["share"] = jnp.clip(share, 0.0, 1.0)  # solver round-off must not make a share negative
    return out


# ----------------------------------------------------------------------------------------------
# Set scores with bootstrap
# ----------------------------------------------------------------------------------------------
def _mean_stat(idx, per):
    return per[idx].mean()


@functools.partial(jax.jit, static_argnames="sizes")
def _pid_stat(idx, x1, x2, y, sizes):
    return pid_share(x1, x2, y, sizes, idx)["share"]


PER_SAMPLE_ESTIMATORS = ("emap", "emap_gap", "intershap", "intershap_ref")


def _per_sample_scores(F_ext, estimator: str, labels=None, intershap_baseline: str = "empty"):
    """Per-sample ``[N]`` scores of the estimators that average one (``PER_SAMPLE_ESTIMATORS``)
    on an extended table ``F_ext [N+1, N+1, A]`` (jittable: the set-level jackknife calls it on
    every leave-one-out sub-table)."""
    n = F_ext.shape[0] - 1
    F = F_ext[:n, :n]
    if estimator == "emap":
        return emap_scores(F)
    if estimator == "emap_gap":
        return emap_gap_scores(F, labels)
    if estimator == "intershap":
        return (intershap_scores(F, "average") if intershap_baseline == "average"
                else intershap_scores(F_ext, "empty"))
    return intershap_scores(F, "reference")  # intershap_ref


@functools.partial(jax.jit, static_argnames="sizes")
def _pid_null_stat(perm, x1, x2, y, sizes):
    return pid_share(x1, x2, y[perm], sizes)["share"]


def set_statistic(F_ext, estimator: str, *, intershap_baseline: str = "empty",
                  pid_discretise: str = "marginal", pid_features=None, pid_k: int = 6,
                  labels=None):
    """``(per_sample [N] or None, stat, args)`` for one estimator on an extended table.

    ``stat(idx, *args)`` is the set score of the resampled set ``idx`` (int ``[N]``), a
    module-level jittable function (so the bootstrap compiles once per table shape);
    ``stat(arange(N), *args)`` is the point estimate. EMAP and InterSHAP average resampled
    per-sample scores (projected once on the whole N-set, module docstring); PID rebuilds the
    joint of the resampled samples.

    The reference statistics (``REFERENCE_ESTIMATORS``): ``"emap_gap"`` averages
    ``emap_gap_scores`` (needs ``labels`` int [N]); ``"intershap_ref"`` averages InterSHAP of
    the authors' games (``modality_games(F, "reference")``); ``"pid_null"`` is PID's share on
    the same codes with the answers permuted, ``stat(perm, ...)`` for a permutation ``perm``
    of ``arange(N)`` (its chance level; ``bootstrap_scores`` draws the permutations).
    ``pid_discretise="reference"``: the authors' codes (``reference_pid_codes`` of
    ``pid_features``).
    """
    F_ext = jnp.asarray(F_ext)
    n = F_ext.shape[0] - 1
    F = F_ext[:n, :n]
    if estimator == "emap_gap" and labels is None:
        raise ValueError("estimator 'emap_gap' needs labels= (the ground-truth answers)")
    if estimator in PER_SAMPLE_ESTIMATORS:
        per = _per_sample_scores(F_ext, estimator, labels, intershap_baseline)
        return per, _mean_stat, (per,)
    if estimator in ("pid", "pid_null"):
        if pid_discretise == "reference":
            if pid_features is None:
                raise ValueError("pid_discretise='reference' needs pid_features=(image, text)")
            x1, x2 = reference_pid_codes(*pid_features)
            y = np.asarray(jnp.argmax(F[jnp.arange(n), jnp.arange(n)], -1))
            (x1, x2, y), sizes = dense_codes(x1, x2, y)
        else:
            src = F_ext if pid_discretise == "empty" else F
            (x1, x2, y), sizes = dense_codes(*pid_codes(src, pid_discretise, pid_features,
                                                        pid_k))
        fn = _pid_stat if estimator == "pid" else _pid_null_stat
        return None, functools.partial(fn, sizes=_solver_sizes(sizes)), tuple(
            map(jnp.asarray, (x1, x2, y)))
    raise ValueError(f"unknown estimator {estimator!r}; expected one of "
                     f"{', '.join(ESTIMATORS + REFERENCE_ESTIMATORS)}")


def bootstrap_scores(F_ext, estimator: str, key, n_boot: int = 200, **kw) -> dict:
    """Point estimate, spread and bootstrap replicates of one estimator on one table.

    Returns ``{"mean": stat(all samples), "std": std over samples (EMAP, InterSHAP) or bootstrap
    std (PID), "ci": [2.5, 97.5] bootstrap percentiles, "boot": float [n_boot] replicates,
    (``"pid_null"``: ``n_boot`` permutations of the answers, "mean" their mean, "std" / "ci"
    the spread and percentiles of the null distribution),
    "per_sample": [N] or None, "n": N}``. Resampling: ``n_boot`` index sets drawn with
    replacement from ``key``; replicates by one vmapped, jitted statistic.
    """
    per, stat, args = set_statistic(F_ext, estimator, **kw)
    n = jnp.asarray(F_ext).shape[0] - 1
    if estimator == "pid_null":  # the null distribution: answers permuted, its mean the point
        idx = jax.vmap(lambda k: jax.random.permutation(k, n))(jax.random.split(key, n_boot))
        boot = np.asarray(_boot_fn(stat)(idx, *args), np.float64)
        point = float(boot.mean())
    else:
        idx = jax.random.randint(key, (n_boot, n), 0, n)
        point = float(_boot_fn(stat)(jnp.arange(n)[None], *args)[0])
        boot = np.asarray(_boot_fn(stat)(idx, *args), np.float64)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    std = float(np.std(np.asarray(per))) if per is not None else float(np.std(boot))
    return {"mean": point, "std": std, "ci": [float(lo), float(hi)], "boot": boot,
            "per_sample": None if per is None else np.asarray(per), "n": n}


# The range of each set score: an interval is clipped to it (a synergy share is never negative)
SCORE_RANGE = {"emap": (0.0, 1.0), "intershap": (0.0, 1.0), "pid": (0.0, 1.0),
               "emap_gap": (-1.0, 1.0), "intershap_ref": (0.0, 1.0), "pid_null": (0.0, 1.0)}


def _leave_one_out(n: int) -> np.ndarray:
    """int32 [n, n-1]: row i = 0..n-1 without i."""
    return np.stack([np.delete(np.arange(n), i) for i in range(n)]).astype(np.int32)


@functools.partial(jax.jit, static_argnames=("estimator", "intershap_baseline"))
def _loo_values(F_ext, labels, idx, *, estimator, intershap_baseline):
    """The set score of each leave-one-out set ``idx[k]`` recomputed on its own sub-table (the
    projection, the averaged baselines and the mean prediction of the smaller set)."""
    n = F_ext.shape[0] - 1

    def one(keep):
        ext = jnp.concatenate([keep, jnp.array([n], keep.dtype)])  # the baselines stay
        return _per_sample_scores(F_ext[ext][:, ext], estimator, labels[keep],
                                  intershap_baseline).mean()

    return jax.vmap(one)(idx)


def jackknife_scores(F_ext, estimator: str, key=None, n_perm: int = 200, **kw) -> dict:
    """Point estimate and set-level jackknife interval of one estimator on one table.

    The scores depend on the whole N-set (EMAP's projection, the reference InterSHAP's
    data-filled baselines, PID's joint), so the samples are not independent draws: the
    delete-one jackknife (Quenouille 1949, Tukey 1958) recomputes the set score ``theta_(i)``
    on each set without sample i (on the sub-table; PID on the joint of the N - 1 remaining
    samples, codes fixed) and ``se = sqrt((N - 1) / N sum_i (theta_(i) - mean theta_(.))^2)``.
    The interval ``mean ± t_{0.975, N-1} se`` (Student's t at N - 1 degrees of freedom, the
    jackknife's reference distribution: Tukey 1958) is centred on the point estimate (a
    reported mean lies inside its interval) and clipped to ``SCORE_RANGE`` (a share is never
    below 0), as is the mean itself.

    ``"pid_null"`` is a null distribution, not an estimate: ``n_perm`` permutations of the
    answers (``bootstrap_scores``), mean and percentile interval. Keywords as
    ``set_statistic``. Returns ``{"mean", "std" (over samples for per-sample scores, else the
    jackknife se), "se", "ci", "loo" float [N] (None for pid_null), "per_sample", "n", "df"
    (N - 1; None for pid_null), "method": "jackknife" | "permutation"}``.
    """
    F_ext = jnp.asarray(F_ext)
    n = F_ext.shape[0] - 1
    lo_r, hi_r = SCORE_RANGE[estimator]
    if estimator == "pid_null":
        key = jax.random.key(0) if key is None else key
        out = bootstrap_scores(F_ext, estimator, key, n_perm, **kw)
        out.pop("boot")
        return {**out, "se": out["std"], "loo": None, "df": None, "method": "permutation"}
    per, stat, args = set_statistic(F_ext, estimator, **kw)
    point = float(_boot_fn(stat)(jnp.arange(n)[None], *args)[0])
    idx = jnp.asarray(_leave_one_out(n))
    if estimator == "pid":
        loo = _boot_fn(stat)(idx, *args)
    else:
        labels = kw.get("labels")
        labels = jnp.zeros(n, jnp.int32) if labels is None else jnp.asarray(labels, jnp.int32)
        loo = _loo_values(F_ext, labels, idx, estimator=estimator,
                          intershap_baseline=kw.get("intershap_baseline", "empty"))
    loo = np.asarray(loo, np.float64)
    se = float(np.sqrt((n - 1) / n * np.sum((loo - loo.mean()) ** 2)))
    point = float(np.clip(point, lo_r, hi_r))
    from scipy import stats as sps

    q = float(sps.t.ppf(0.975, n - 1)) if n > 1 else float("nan")
    lo, hi = (float(np.clip(v, lo_r, hi_r)) for v in (point - q * se, point + q * se))
    std = float(np.std(np.asarray(per))) if per is not None else se
    return {"mean": point, "std": std, "se": se, "ci": [lo, hi], "loo": loo,
            "per_sample": None if per is None else np.asarray(per), "n": n, "df": n - 1,
            "method": "jackknife"}


_BOOT = {}


def _boot_fn(stat):
    """jit(vmap(stat over idx, args broadcast)), cached per statistic."""
    k = (stat.func, tuple(sorted(stat.keywords.items()))) if isinstance(stat, functools.partial) \
        else stat
    if k not in _BOOT:
        _BOOT[k] = jax.jit(lambda idx, *args: jax.vmap(lambda i: stat(i, *args))(idx))
    return _BOOT[k]


__all__ = ["ESTIMATORS", "REFERENCE_ESTIMATORS", "PER_SAMPLE_ESTIMATORS", "forward_pairs",
           "with_baselines", "grid_size_of", "cross_table", "emap_scores",
           "emap_gap_scores", "modality_games", "intershap_scores", "pid_codes",
           "reference_pid_codes", "kmeans_codes", "dense_codes",
           "pid_share", "set_statistic", "bootstrap_scores", "SCORE_RANGE",
           "jackknife_scores"]
