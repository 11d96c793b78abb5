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

from gridvqa_jax.world import generate as G
from gridvqa_jax.world import render as Rd
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
            for _, im in Rd.iter_images(color, shape, px, render_chunk):
                pass
            return im
        out[f"render_{px}px_per_s"] = _rate(host, render_batch)
    # The in-graph uint8 renderer (jit(vmap(render)) on one chunk), for comparison.
    fn = jax.jit(jax.vmap(lambda c, s: Rd.render(c, s, 64)))
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


__all__ = ["bench_generate"]
