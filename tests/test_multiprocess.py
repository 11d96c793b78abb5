"""Multi-process JAX on one machine: 2 processes x 2 CPU devices give the results of 1 process.

Each worker is a subprocess with ``XLA_FLAGS=--xla_force_host_platform_device_count=2`` that
calls ``jax.distributed.initialize(coordinator_address="127.0.0.1:<port>", num_processes=2,
process_id=i)`` and runs the pieces ``gridvqa reproduce`` is built from:

* ``regimes.sharded_predictions``: M_pure's answers on held-out D_pure samples, the batch laid
  out over the global 4-device mesh (each process renders and runs only its own rows), the
  predictions all-gathered;
* a work unit run by one process alone (``process_local``: scenes generated with the library's
  default mesh) whose result reaches process 0 through ``gather_objects``.

The same script with one process (2 devices) is the reference.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

WORKER = textwrap.dedent("""
    import hashlib, json, sys
    import jax
    rank, nproc, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    if nproc > 1:
        jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}",
                                   num_processes=nproc, process_id=rank)
    import numpy as np
    from reproduction import regimes as RG
    from reproduction import reproduce as R
    from gridvqa_jax.training.export import load_reference_model
    from gridvqa_jax.models import mdetr as M
    from gridvqa_jax.world import generate as G, universe as U

    spec = U.Spec.feasible("pure", 5, U.DENSITIES["d07"])[0]
    sc = RG.local_scenes(spec, 4242, 6)
    apply_fn, params, _ = load_reference_model("pure")
    pred = RG.sharded_predictions(apply_fn, params, sc.color, sc.shape, sc.tokens, batch=4)

    mine = {}
    if rank == nproc - 1:  # a unit owned by the last process only
        with R.process_local():
            s2 = G.to_numpy(G.generate_chunk(spec, 99, 0, 5))
        mine["digest"] = hashlib.sha256(np.ascontiguousarray(s2.color).tobytes()
                                        + np.ascontiguousarray(s2.tokens).tobytes()).hexdigest()
    merged = {}
    for d in R.gather_objects(mine):
        merged.update(d)
    res = {"rank": rank, "processes": jax.process_count(), "devices": jax.device_count(),
           "pred": pred.tolist(), "truth": np.asarray(M.answer_index(sc.answer, sc.is_yesno, 25)).tolist(), "digest": merged["digest"]}
    with open(out, "w") as f:
        json.dump(res, f)
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(nproc: int, tmp_path) -> list[dict]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2",
               JAX_PLATFORMS="cpu")
    port = str(_free_port())
    outs = [tmp_path / f"out_{nproc}_{i}.json" for i in range(nproc)]
    procs = [subprocess.Popen([sys.executable, str(script), str(i), str(nproc), port,
                               str(outs[i])], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(nproc)]
    for p in procs:
        try:
            _, err = p.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        assert p.returncode == 0, err[-3000:]
    return [json.loads(o.read_text()) for o in outs]


@pytest.mark.slow  # ~85 s on a loaded 2-core machine (3 interpreters, each compiling the model)
def test_two_processes_equal_one(tmp_path):
    one = _run(1, tmp_path)[0]
    two = _run(2, tmp_path)
    assert one["processes"] == 1 and one["devices"] == 2
    assert [r["processes"] for r in two] == [2, 2] and two[0]["devices"] == 4
    for r in two:  # every process holds the gathered predictions and the other's unit
        assert r["pred"] == one["pred"]
        assert r["digest"] == one["digest"]
    assert len(one["pred"]) == 6
    # the shipped M_pure answers held-out D_pure counts correctly (not a constant output)
    assert sum(p == t for p, t in zip(one["pred"], one["truth"])) >= 5
