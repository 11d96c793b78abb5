"""Global cross-modal synergy scores on value tables: EMAP (Hessel & Lee 2020) and InterSHAP
(Wenderoth et al. 2025).

Both scores are formulas on numbers the caller has already computed with the model, so this module
is model-free, pure and jittable; building the tables (the N x N cross forward passes, the
modality-dropped forward passes) is the caller's job.

Conventions. Rows index the text (question tokens), columns the image:
``F[i, j] = f(t_i, v_j)``, the model's output for the question of sample ``i`` asked about the
image of sample ``j`` (as ``idx2logits[i][j] = f(t_i, v_j)`` in Hessel & Lee's reference
implementation). A modality game is a table ``v[..., 2, 2]`` indexed ``v[image present,
text present]``: ``v[0, 0] = v(empty)``, ``v[1, 0] = v({I})``, ``v[0, 1] = v({T})``,
``v[1, 1] = v({I, T})``.

Both scores rest on the same second difference, the interaction of the two modalities

    Delta = v({I, T}) - v({I}) - v({T}) + v(empty),

and EMAP's residual is exactly ``Delta`` for the game whose absent modality is averaged over the
other samples (``cross_game``): ``v({T}) = mean_j F[i, j]``, ``v({I}) = mean_j F[j, i]``,
``v(empty) = mean_jk F[j, k]``, ``v({I, T}) = F[i, i]``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = [
    "emap",
    "cross_game",
    "shapley_values",
    "interaction_matrix",
    "intershap",
    "intershap_global",
]


def _share(num, den):
    """num / den where den > 0, else 0 (a game with no effect at all has no interaction)."""
    pos = den > 0
    return jnp.where(pos, num / jnp.where(pos, den, 1), 0)


def _select(x, target):
    """x[i, target[i]] for x [N, C] and integer target [N]."""
    return jnp.take_along_axis(x, target[:, None], axis=1)[:, 0]


def emap(F: jax.Array, target: jax.Array | None = None, labels: jax.Array | None = None) -> dict:
    """Empirical multimodally-additive function projection (EMAP) of ``F`` and its synergy share.

    Hessel & Lee, "Does my multimodal model learn cross-modal interactions? It's harder to tell
    than you might think!", EMNLP 2020:

        f_hat(t_i, v_i) = mean_j F[i, j] + mean_j F[j, i] - mean_jk F[j, k]

    (means over all N samples, the diagonal included), the best additive approximation
    ``g(t) + h(v)`` of ``f`` on the empirical product distribution of texts and images.

    Args:
      F: ``[N, N]`` (one output per pair, e.g. the log-probability of a fixed answer) or
        ``[N, N, C]`` (a vector of C answer log-probabilities or logits per pair; the projection is
        taken per answer, as in the reference code).
      target: ``[N]`` answer index per sample for ``[N, N, C]`` inputs; default the model's answer
        on the matched pair, ``argmax_c F[i, i, c]`` (InterSHAP's "best" output). Ignored for 2-D F.
      labels: optional ``[N]`` ground-truth answers (``[N, N, C]`` only) for the accuracy gap.

    Returns a dict of per-sample ``[N]`` arrays (at the target answer for ``[N, N, C]``):
      ``f``: ``F[i, i]``; ``additive``: ``f_hat_i``; ``gap``: ``f - f_hat`` (signed residual,
      = Delta of ``cross_game``); ``text_effect``: ``mean_j F[i, j] - mean F``; ``image_effect``:
      ``mean_j F[j, i] - mean F``; ``synergy``: ``|gap| / (|gap| + |text_effect| +
      |image_effect|)`` in [0, 1] (0 when all three vanish);
    and scalars: ``variance_share``: interaction share of the two-way ANOVA of the whole table,
      ``sum_ij R_ij^2 / sum_ij (F_ij - mean F)^2`` with ``R_ij = F_ij - mean_k F[i, k] -
      mean_k F[k, j] + mean F`` (summed over answers for 3-D F); for 3-D F also ``agreement``:
      fraction of samples whose argmax answer is unchanged by the projection, and with ``labels``
      ``accuracy``, ``additive_accuracy``, ``accuracy_gap = |accuracy - additive_accuracy|``
      and per sample ``correct_gap`` float [N] in {-1, 0, 1}: (model correct) - (projection
      correct), whose mean is the signed gap Hessel & Lee report (model accuracy minus the
      projection's).

    The percentage reported as "EMAP synergy (%)" is ``100 * synergy`` averaged over samples (std
    over samples). GridVQA-X does not define its percentage; this per-sample share is the
    InterSHAP score of ``cross_game(F)`` (``intershap(cross_game(F)) == emap(F)["synergy"]``), so
    EMAP and InterSHAP differ here only in the baseline of an absent modality.

    Differences from the InterSHAP authors' EMAP (``synergy_evaluation/EMAP.py``, which copies
    Hessel & Lee's example): they project logits and report only ``accuracy_gap`` (and F1,
    precision, recall gaps) between the model and its projection, a dataset-level number; we
    return the same projection, the accuracy gap when labels are given, and in addition the
    per-sample residual, its share and the ANOVA share, so the score has a per-sample spread.
    Their ``F[i, j]`` swaps modality 0 of sample ``j`` for that of sample ``i``; with modality 0
    = text this is our convention.
    """
    F = jnp.asarray(F)
    squeeze = F.ndim == 2
    if squeeze:
        F = F[:, :, None]
    n = F.shape[0]
    row = F.mean(axis=1)  # [N, C]: mean_j F[i, j]  (text i, every image)
    col = F.mean(axis=0)  # [N, C]: mean_j F[j, i]  (every text, image i)
    grand = F.mean(axis=(0, 1))  # [C]
    diag = F[jnp.arange(n), jnp.arange(n)]  # [N, C]
    additive_all = row + col - grand[None, :]
    resid = F - row[:, None, :] - col[None, :, :] + grand[None, None, :]
    centred = F - grand[None, None, :]
    out = {"variance_share": _share(jnp.sum(resid**2), jnp.sum(centred**2))}
    if squeeze:
        sel = lambda x: x[:, 0]  # noqa: E731
    else:
        tgt = jnp.argmax(diag, axis=1) if target is None else jnp.asarray(target)
        sel = lambda x: _select(x, tgt)  # noqa: E731
        pred = jnp.argmax(diag, axis=1)
        pred_add = jnp.argmax(additive_all, axis=1)
        out["agreement"] = jnp.mean(pred == pred_add)
        if labels is not None:
            acc = jnp.mean(pred == labels)
            acc_add = jnp.mean(pred_add == labels)
            out.update(accuracy=acc, additive_accuracy=acc_add, accuracy_gap=jnp.abs(acc - acc_add),
                       correct_gap=((pred == labels).astype(jnp.float32)
                                    - (pred_add == labels).astype(jnp.float32)))
    f = sel(diag)
    add = sel(additive_all)
    gap = f - add
    te = sel(row - grand[None, :])
    ie = sel(col - grand[None, :])
    out.update(
        f=f,
        additive=add,
        gap=gap,
        text_effect=te,
        image_effect=ie,
        synergy=_share(jnp.abs(gap), jnp.abs(gap) + jnp.abs(te) + jnp.abs(ie)),
    )
    return out


def cross_game(F: jax.Array) -> jax.Array:
    """Per-sample modality games ``v[N, 2, 2]`` from the cross table ``F[N, N]`` (text x image).

    An absent modality is replaced by every other sample's input in turn and the outputs averaged
    (the "averaging over other samples' inputs" baseline): ``v[i, 0, 0] = mean_jk F[j, k]``,
    ``v[i, 1, 0] = mean_j F[j, i]`` (image i only), ``v[i, 0, 1] = mean_j F[i, j]`` (text i only),
    ``v[i, 1, 1] = F[i, i]``.
    """
    F = jnp.asarray(F)
    n = F.shape[0]
    grand = jnp.broadcast_to(F.mean(), (n,))
    v0 = jnp.stack([grand, F.mean(axis=1)], axis=-1)  # image absent: [empty, {T}]
    v1 = jnp.stack([F.mean(axis=0), F[jnp.arange(n), jnp.arange(n)]], axis=-1)  # [{I}, {I,T}]
    return jnp.stack([v0, v1], axis=-2)


def shapley_values(v: jax.Array) -> jax.Array:
    """Shapley values ``phi[..., 2]`` = (image, text) of the two-player games ``v[..., 2, 2]``.

    ``phi_I = (v({I}) - v(empty) + v({I, T}) - v({T})) / 2``, ``phi_T`` symmetrically; they sum
    to ``v({I, T}) - v(empty)`` (efficiency).
    """
    v = jnp.asarray(v)
    e, i, t, it = v[..., 0, 0], v[..., 1, 0], v[..., 0, 1], v[..., 1, 1]
    return jnp.stack([(i - e + it - t) / 2, (t - e + it - i) / 2], axis=-1)


def interaction_matrix(v: jax.Array) -> jax.Array:
    """Shapley interaction matrix ``Phi[..., 2, 2]`` (order image, text) of games ``v[..., 2, 2]``.

    Off-diagonal: the Shapley interaction index (Grabisch & Roubens 1999) split equally over the
    two symmetric entries, ``Phi_IT = Phi_TI = Delta / 2`` with
    ``Delta = v({I,T}) - v({I}) - v({T}) + v(empty)``. Diagonal: main effects
    ``Phi_ii = phi_i - sum_{j != i} Phi_ij``, which for two players is ``v({i}) - v(empty)``.
    Rows sum to the Shapley values and all entries to ``v({I, T}) - v(empty)`` (as in
    Lundberg et al.'s SHAP interaction values and the InterSHAP code).
    """
    v = jnp.asarray(v)
    e, i, t, it = v[..., 0, 0], v[..., 1, 0], v[..., 0, 1], v[..., 1, 1]
    half = (it - i - t + e) / 2
    return jnp.stack(
        [jnp.stack([i - e, half], axis=-1), jnp.stack([half, t - e], axis=-1)], axis=-2
    )


def intershap(v: jax.Array) -> jax.Array:
    """Per-game InterSHAP ``[...]``: ``sum |off-diagonal Phi| / sum |Phi|`` in [0, 1].

    Wenderoth, Hemker, Simidjievski & Jamnik, "Measuring Cross-Modal Interactions in Multimodal
    Models", AAAI 2025; ``Phi = interaction_matrix(v)``. For two players this is
    ``|Delta| / (|Delta| + |v({I}) - v(empty)| + |v({T}) - v(empty)|)``; 0 for a game with no
    effect at all.

    Differences from the authors' code (``synergy_evaluation/interaction_values.py``): their game
    values are softmax probabilities of the class the full input predicts ("best"), ``v(empty)``
    is the mean prediction over a background set and ``v({i})`` the mean over 1000 random
    background samples filling the absent modality; here ``v`` is whatever the caller computed
    (any output, any baseline: an empty grid / all-PAD input, or ``cross_game``'s average over
    the other samples). They return NaN for a game with no effect; we return 0.
    """
    phi = interaction_matrix(v)
    off = jnp.abs(phi[..., 0, 1]) + jnp.abs(phi[..., 1, 0])
    return _share(off, jnp.abs(phi).sum(axis=(-2, -1)))


def intershap_global(v: jax.Array) -> jax.Array:
    """Dataset-level InterSHAP of games ``v[N, 2, 2]``, as the authors aggregate it.

    ``sum_k |mean_s Phi_s[off_k]| / (sum_k |mean_s Phi_s[off_k]| + sum_k |mean_s Phi_s[diag_k]|)``
    (``calc_interaction_metric_over_dataset`` in the authors' ``interaction_index_dataset.py``):
    the matrices are averaged over samples before taking absolute values, so interactions of
    opposite sign cancel. The per-sample scores (``intershap``) averaged over samples are the
    authors' "LOCAL" number.

    Do not use it on ``cross_game`` tables of one output: there the sample means of both main
    effects are identically 0 (``mean_i (mean_j F[i, j] - mean F) = 0``), so the score is
    ``|mean Delta| / |mean Delta|`` (1, or 0 when that mean is exactly 0) whatever the model; use
    the mean of the per-sample scores. With a fixed baseline (empty grid, all PAD) it is well posed.
    """
    phi = interaction_matrix(v).mean(axis=0)
    off = jnp.abs(phi[0, 1]) + jnp.abs(phi[1, 0])
    return _share(off, off + jnp.abs(phi[0, 0]) + jnp.abs(phi[1, 1]))
