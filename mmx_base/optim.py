"""The optimiser of every trainer: global-norm clipping, then AdamW on a warm-up + cosine
learning-rate schedule."""

from __future__ import annotations

import optax


def make_optimizer(*, lr: float, steps: int, warmup_steps: int, weight_decay: float,
                   clip_norm: float, end_lr_frac: float = 0.02):
    """``(optax transform, schedule)`` of a run of ``steps`` optimiser steps.

    Schedule: ``lr(t) = lr * t / W`` for ``t < W`` with ``W = min(warmup_steps, steps)`` (a run
    shorter than its warm-up still reaches the peak at its end), then cosine decay
    ``lr(t) = e + (lr - e) * (1 + cos(pi * (t - W) / (T - W))) / 2`` to ``e = lr * end_lr_frac``
    at ``T = max(steps, warmup_steps + 1)`` (``optax.warmup_cosine_decay_schedule``).
    Transform: ``optax.clip_by_global_norm(clip_norm)`` then ``optax.adamw(schedule,
    weight_decay=weight_decay)`` (decoupled weight decay, Loshchilov & Hutter 2019).
    """
    sched = optax.warmup_cosine_decay_schedule(
        0.0, lr, min(warmup_steps, steps), max(steps, warmup_steps + 1),
        end_value=lr * end_lr_frac)
    return optax.chain(optax.clip_by_global_norm(clip_norm),
                       optax.adamw(sched, weight_decay=weight_decay)), sched


__all__ = ["make_optimizer"]
