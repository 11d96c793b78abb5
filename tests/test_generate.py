"""Sharded generation, the native format and the command line."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import pytest

from reproduction.cli import gridvqa as gcli
from gridvqa_jax.world import generate as G
from gridvqa_jax.formats import native
from gridvqa_jax.world import universe as U

REPO = Path(__file__).resolve().parents[1]


def test_eight_devices_give_the_same_samples_as_one():
    spec, _ = U.Spec.feasible("spur", 5, 0.3)
    one = G.scene_digest(G.generate_chunk(spec, 5, 3, 101))
    code = textwrap.dedent("""
        import jax
        from gridvqa_jax.world import generate as G, universe as U
        assert len(jax.devices()) == 8, jax.devices()
        spec, _ = U.Spec.feasible("spur", 5, 0.3)
        out = G.generate_chunk(spec, 5, 3, 101, G.data_mesh())
        print(len(out.bucket), G.scene_digest(out))
    """)
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8 "
                 "--xla_cpu_collective_call_terminate_timeout_seconds=600",
           "JAX_PLATFORMS": "cpu"}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         cwd=REPO, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    n, digest = res.stdout.split()
    assert int(n) == 101 and digest == one


def test_native_round_trip_and_atomicity(tmp_path, pure03):
    spec, s = pure03
    out = tmp_path / "ds"
    with native.NativeWriter(out, spec, seed=0) as w:
        w.add(G.jax.tree.map(lambda a: a[:100], s))
        w.add(G.jax.tree.map(lambda a: a[100:], s))
    back, spec2, manifest = native.load_native(out)
    assert spec2 == spec and manifest["n"] == len(s.bucket) and len(manifest["shards"]) == 2
    assert G.scene_digest(back) == G.scene_digest(s)
    # An exception inside the writer leaves neither the dataset nor a temporary directory.
    with pytest.raises(RuntimeError):
        with native.NativeWriter(tmp_path / "bad", spec, seed=0) as w:
            w.add(s)
            raise RuntimeError("interrupted")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]
    with pytest.raises(ValueError, match="not empty"):
        native.NativeWriter(out, spec, seed=0)
    # Corrupt inputs are named.
    (tmp_path / "notds").mkdir()
    with pytest.raises(ValueError, match="manifest.json is missing"):
        native.load_native(tmp_path / "notds")
    (out / "shard-000001.npz").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="shard-000001.npz is not a readable"):
        native.load_native(out)


def run_cli(*argv, capsys):
    code = gcli.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_generate_verify_stats(tmp_path, capsys):
    out = tmp_path / "spur"
    code, so, _ = run_cli("generate", "--variant", "spur", "--n", 76, "--density", "d07",
                          "--format", "native", "--out", out, "--json", "--quiet", capsys=capsys)
    assert code == 0
    assert json.loads(so.strip().splitlines()[-1])["n"] == 76
    code, so, _ = run_cli("verify", out, "--json", capsys=capsys)
    res = json.loads(so.strip().splitlines()[-1])
    assert code == 0 and res["all_pass"] and res["n"] == 76
    code, so, _ = run_cli("stats", out, "--json", capsys=capsys)
    st = json.loads(so.strip().splitlines()[-1])
    assert st["_overall"]["bow_acc"] == 1.0  # D_spur: bag-of-words is exact
    assert st["D2_M_F1_d07"]["n"] == 4
    # Official layout, narrowed to one bucket.
    off = tmp_path / "off"
    code, so, _ = run_cli("generate", "--variant", "pure", "--n", 6, "--depth", 2, "--qtype", "M",
                          "--form", 0, "--out", off, "--json", "--quiet", capsys=capsys)
    assert code == 0, so
    pngs = sorted((off / "images/val/depth2/M/form0/g5_d07").glob("*.png"))
    assert len(pngs) == 6
    code, so, _ = run_cli("verify", off, "--json", "--quiet", capsys=capsys)
    assert code == 0 and json.loads(so.strip().splitlines()[-1])["all_pass"]


def test_cli_bad_input_is_named(tmp_path, capsys):
    code, _, err = run_cli("verify", tmp_path / "missing", capsys=capsys)
    assert code == 2 and "is not a directory" in err
    code, _, err = run_cli("generate", "--variant", "pure", "--n", 5, "--depth", 3, "--qtype", "A",
                           "--out", tmp_path / "x", capsys=capsys)
    assert code == 2 and "not defined at depth 3" in err
    code, _, err = run_cli("generate", "--variant", "pure", "--n", 5, "--grid-size", 3,
                           "--out", tmp_path / "y", capsys=capsys)
    assert code == 2 and "grid_size" in err
    code, _, err = run_cli("generate", "--variant", "pure", "--n", 5, "--density", "d03",
                           "--depth", 3, "--qtype", "CMP", "--out", tmp_path / "z", capsys=capsys)
    assert code == 2 and "needs at least 9 objects" in err
    assert not any(tmp_path.iterdir())  # nothing half-written


def test_bench_reports_every_stage(capsys):
    """`gridvqa bench generate --json` prints one JSON object on its last line with a positive
    rate for every stage (tiny sizes; the figures themselves are measured, not tested)."""
    from reproduction.cli import gridvqa as gcli

    rc = gcli.main(["bench", "generate", "--batch", "64", "--render-batch", "12",
                   "--render-chunk", "8", "--export-n", "8", "--json"])
    assert rc == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("symbolic_per_s", "render_64px_per_s", "render_16px_per_s",
                "render_64px_in_graph_per_s", "export_official_per_s"):
        assert isinstance(res[key], float) and res[key] > 0, key
    assert res["render_chunk"] == 8 and res["render_batch"] == 12


def test_bucket_scenes_of_one_spec_equal_one_bucket_specs():
    """``regimes.local_bucket_scenes`` (every bucket from one all-bucket spec, padded lanes)
    gives, bucket by bucket, the samples of that bucket's own one-bucket spec and seed."""
    from reproduction import regimes as REG

    full, _ = U.Spec.feasible("pure", 5, 0.7)
    seeds = {full.buckets[3]: 11, full.buckets[7]: 12}
    got = REG.local_bucket_scenes(full, seeds, 5, lanes=16)
    assert len(got.bucket) == 10
    bid, seed = list(seeds.items())[1]  # the second bucket: its order and its seed
    want = REG.local_scenes(U.Spec("pure", 5, 0.7, 64, buckets=(bid,)), seed, 5)
    assert G.scene_digest(jax.tree.map(lambda a: a[5:], got)) == G.scene_digest(want)
    with pytest.raises(ValueError, match="not buckets"):
        REG.local_bucket_scenes(U.Spec("pure", 5, 0.7, 64, buckets=(0,)), {1: 3}, 2)
