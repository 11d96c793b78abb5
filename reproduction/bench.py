"""Throughput of generation, rendering and export, measured in one run.

Every figure is samples per second of wall time for a warmed-up (compiled) jitted batch, with
``block_until_ready``; the ratios between stages come from the same run, so they stay
meaningful on another machine.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from gridvqa_jax.world import generate as G
from gridvqa_jax.world import render as R
from gridvqa_jax.world import universe as U


def _rate(fn, n_items: int, min_time: float = 1.0, min_reps: int = 3) -> float:
    jax.block_until_ready(fn())  # compile and warm up
    reps, t0 = 0, time.perf_counter()
    while reps < min_reps or time.perf_counter() - t0 < min_time:
        jax.block_until_ready(fn())
        reps += 1
    return n_items * reps / (time.perf_counter() - t0)


def bench_generate(batch: int = 65536, render_batch: int = 512, export_n: int = 512,
                   seed: int = 0, spec: U.Spec | None = None, render_chunk: int = 64) -> dict:
    """Measure symbolic, rendered (64 px and 16 px cells) and official-export samples/s.

    symbolic = scene + question + ground truth (``sample_batch``) over all devices' data mesh
    (``gridvqa bench`` runs with one CPU device per core, ``generate.use_one_cpu_device_per_core``),
    and on one device when there are several; render = uint8 RGB images on
    the host from per-cell colour/shape ids (``render.iter_images``, ``render_chunk`` scenes per
    call); render in graph = ``jit(vmap(render.render))`` on one chunk (uint8 on device, no
    host transfer); export = official layout on disk (PNG + npz + jsonl) for already generated
    samples, including rendering.
    """
    from gridvqa_jax.formats import official

    spec = spec or U.Spec.feasible("pure", 5, 0.7)[0]
    mesh = G.data_mesh()
    out = {"devices": len(jax.devices()), "platform": jax.devices()[0].platform,
           "grid_size": spec.grid_size, "variant": spec.variant, "batch": batch}
    out["symbolic_per_s"] = _rate(lambda: G.generate_chunk(spec, seed, 0, batch, mesh), batch)
    if len(jax.devices()) > 1:  # the same on one device, for comparison
        one = G.data_mesh(jax.devices()[:1])
        out["symbolic_one_device_per_s"] = _rate(
            lambda: G.generate_chunk(spec, seed, 0, batch, one), batch)

    scenes = G.to_numpy(G.generate_chunk(spec, seed, 0, max(render_batch, export_n), mesh))
    color, shape = scenes.color[:render_batch], scenes.shape[:render_batch]
    for px in (64, 16):
        # The host renderer (uint8 numpy images, streamed in chunks): what export and users get.
        def host(px=px):
            for _, im in R.iter_images(color, shape, px, render_chunk):
                pass
            return im
        out[f"render_{px}px_per_s"] = _rate(host, render_batch)
    # The in-graph uint8 renderer (jit(vmap(render)) on one chunk), for comparison.
    fn = jax.jit(jax.vmap(lambda c, s: R.render(c, s, 64)))
    c_dev, s_dev = jax.device_put(color[:render_chunk]), jax.device_put(shape[:render_chunk])
    out["render_64px_in_graph_per_s"] = _rate(lambda: fn(c_dev, s_dev), len(c_dev))
    out["render_batch"], out["render_chunk"] = render_batch, render_chunk

    sub = jax.tree.map(lambda a: a[:export_n], scenes)
    with tempfile.TemporaryDirectory() as tmp:
        # Warm the renderer and the writer once, then time a fresh export.
        official.write_official(Path(tmp) / "warm", jax.tree.map(lambda a: a[:8], sub), spec)
        t0 = time.perf_counter()
        official.write_official(Path(tmp) / "run", sub, spec)
        out["export_official_per_s"] = export_n / (time.perf_counter() - t0)
    out["export_n"] = export_n
    out["render_64px_over_symbolic"] = out["render_64px_per_s"] / out["symbolic_per_s"]
    out["export_over_render_64px"] = out["export_official_per_s"] / out["render_64px_per_s"]
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in out.items()}


def _cvxpy_pid_rate(tables) -> float | None:
    """Tables/s of cvxpy (exponential cone; CLARABEL when installed) on the BROJA program,
    None when cvxpy is not installed."""
    try:
        import cvxpy as cp
    except ImportError:
        return None
    import numpy as np

    t0 = time.perf_counter()
    for p in np.asarray(tables, np.float64):
        n1, n2, ny = p.shape
        q = [cp.Variable((n1, n2), nonneg=True) for _ in range(ny)]
        q12 = sum(q)
        cons = []
        for y in range(ny):
            cons += [cp.sum(q[y], axis=1) == p[:, :, y].sum(1),
                     cp.sum(q[y], axis=0) == p[:, :, y].sum(0)]
        prob = cp.Problem(cp.Minimize(sum(cp.sum(cp.rel_entr(q[y], q12)) for y in range(ny))),
                          cons)
        prob.solve(solver="CLARABEL" if "CLARABEL" in cp.installed_solvers() else None)
    return len(tables) / (time.perf_counter() - t0)


def bench_synergy(n: int = 32, chunk: int | None = None, n_tables: int = 32, table_shape=(6, 6, 6),
                  n_cvxpy: int = 8, seed: int = 0) -> dict:
    """EMAP pairs/s against the raw batched forward, and PID tables/s against cvxpy.

    raw forward = the jitted reference model (M_pure) on a ``chunk``-sized batch of matched
    (image, question) pairs; EMAP = ``global_synergy.cross_table`` on an N-set (N^2 pairs, no
    baselines) in chunks of ``chunk`` (default ``mmx_base.batching.rows_per_call()``); ``emap_over_forward`` is their ratio (target >= 0.9).
    PID = ``jit(vmap(explain.pid.pid))`` on ``n_tables`` random Dirichlet tables of
    ``table_shape``; cvxpy solves the first ``n_cvxpy`` of the same tables one by one (null when
    cvxpy is not installed).
    """
    import jax.numpy as jnp

    from gridvqa_jax.explain import global_synergy as GS
    from gridvqa_jax.explain.pid import pid
    from gridvqa_jax.explain.synergy_check import bucket_samples
    from gridvqa_jax.training.export import load_reference_model

    apply_fn, params, _ = load_reference_model("pure")
    from mmx_base.batching import rows_per_call

    chunk = rows_per_call() if chunk is None else chunk
    images, tokens, _ = bucket_samples("pure", "D2_M_F0", n, seed)
    idx = jnp.arange(chunk) % n
    im_b, tok_b = images[idx], tokens[idx]
    fwd = jax.jit(lambda p, i, t: apply_fn(p, i, t)["answer_logprobs"])
    out = {"devices": len(jax.devices()), "platform": jax.devices()[0].platform, "n": n,
           "pairs": n * n, "chunk": chunk}
    out["forward_pairs_per_s"] = _rate(lambda: fwd(params, im_b, tok_b), chunk)
    out["emap_pairs_per_s"] = _rate(
        lambda: GS.cross_table(apply_fn, params, images, tokens, baselines=False, chunk=chunk),
        n * n)
    out["emap_over_forward"] = out["emap_pairs_per_s"] / out["forward_pairs_per_s"]

    tables = jax.random.dirichlet(jax.random.key(seed), jnp.ones(int(np.prod(table_shape))),
                                  (n_tables,)).reshape(n_tables, *table_shape)
    solve = jax.jit(jax.vmap(pid))
    out["pid_tables_per_s"] = _rate(lambda: solve(tables), n_tables)
    out["pid_table_shape"] = list(table_shape)
    cv = _cvxpy_pid_rate(tables[:n_cvxpy])
    out["cvxpy_tables_per_s"] = cv
    out["pid_over_cvxpy"] = None if cv is None else out["pid_tables_per_s"] / cv
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in out.items()}


__all__ = ["bench_generate", "bench_synergy"]
