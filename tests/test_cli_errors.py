"""Both command lines fail cleanly on bad input: exit status 2, one line
``<prog> <command>: error: <message>`` on stderr naming the problem, no traceback, nothing on
stdout, and nothing written to the output path. One test per kind of bad input."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from reproduction.cli import bias as bcli
from bias_jax import detectors as D
from reproduction.cli import gridvqa as gcli
from gridvqa_jax.formats import native
from gridvqa_jax.models import mdetr as M
from gridvqa_jax.training import export as EX
from gridvqa_jax.world import universe as U
from gridvqa_jax.world.scene import Scene

REPO = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n" + bytes(64)  # a PNG signature: a file in the wrong format
TINY = M.ModelConfig(d_model=16, n_heads=2, mlp_dim=16, enc_layers=1, dec_layers=1)
TINY_DET = D.DetectorConfig(kind="text", d_model=16, mlp_dim=32, n_gates=4, n_layers=2,
                            n_heads=2)


def run(main, *argv, capsys):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def assert_clean_failure(rc, out, err, prog, *needles):
    """rc 2, exactly one stderr line, of the form "<prog>...: error: ...", holding every
    needle; no traceback; nothing on stdout (no JSON line, no summary)."""
    assert rc == 2, (rc, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"{prog} ") and ": error: " in lines[0], lines[0]
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert out == ""


def gfail(*argv, capsys, needles=()):
    rc, out, err = run(gcli.main, *argv, "--quiet", "--json", capsys=capsys)
    assert_clean_failure(rc, out, err, "gridvqa", *needles)
    return err


def bfail(*argv, capsys, needles=()):
    rc, out, err = run(bcli.main, *argv, "--quiet", "--json", capsys=capsys)
    assert_clean_failure(rc, out, err, "modality-bias", *needles)
    return err


# ----------------------------------------------------------------------------------------------
# Shared inputs (built once).
# ----------------------------------------------------------------------------------------------
def zeros_like_init(init):
    """Parameters of the right structure, all zero, without compiling ``init`` (the error tests
    never reach a forward pass)."""
    return jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), jax.eval_shape(init))


def write_native(out: Path, grid_size: int = 5, n: int = 8) -> Path:
    """A native dataset of ``n`` zero-filled samples (well-formed files; the contents are never
    read by the tests that use it)."""
    spec = U.Spec.feasible("pure", grid_size, 0.7)[0]
    shapes = {"color": (grid_size, grid_size), "shape": (grid_size, grid_size)}
    batch = Scene(**{f.name: np.zeros((n, *shapes.get(f.name, ())), np.int32)
                     for f in dataclasses.fields(Scene)})
    with native.NativeWriter(out, spec, seed=0) as w:
        w.add(batch)
    return out


@pytest.fixture(scope="module")
def native_ds(tmp_path_factory):
    return write_native(tmp_path_factory.mktemp("ds") / "native")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("m") / "model"
    params = zeros_like_init(lambda: M.init_params(TINY, jax.random.key(0)))
    EX.export_model(path, params, TINY, {"variant": "pure"})
    return path


@pytest.fixture(scope="module")
def detector_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("det")
    params = zeros_like_init(lambda: D.init_params(TINY_DET, jax.random.key(0)))
    D.export_detector(root / "bias_text", params, TINY_DET)
    return root


def copy_tree(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


# ----------------------------------------------------------------------------------------------
# gridvqa: impossible sizes and bad names.
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("flag, value", [("--n", "-5"), ("--n", "0"), ("--chunk", "-1"),
                                         ("--chunk", "0"), ("--grid-size", "0")])
def test_generate_impossible_size(tmp_path, capsys, flag, value):
    argv = {"--n": "8", flag: value}
    out = tmp_path / "out"
    gfail("generate", "--variant", "pure", "--n", argv["--n"], *([flag, value] if flag != "--n"
          else []), "--out", out, capsys=capsys, needles=(f"argument {flag}", value, ">= 1"))
    assert not out.exists()


def test_generate_fewer_samples_than_densities(tmp_path, capsys):
    out = tmp_path / "out"
    gfail("generate", "--variant", "pure", "--n", 1, "--density", "d03", "d07", "--out", out,
          capsys=capsys, needles=("--n 1", "2 densities"))
    assert not out.exists()


def test_generate_into_a_non_empty_directory(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    for fmt in ("native", "official"):
        gfail("generate", "--variant", "pure", "--n", 4, "--format", fmt, "--out", out,
              capsys=capsys, needles=(str(out), "already exists", "refusing to overwrite"))
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    assert (out / "notes.txt").read_text() == "keep me"


@pytest.mark.parametrize("flag, value", [("--variant", "purr"), ("--density", "d05"),
                                         ("--qtype", "XX"), ("--format", "csv")])
def test_generate_unknown_name(tmp_path, capsys, flag, value):
    argv = {"--variant": "pure", flag: value}
    out = tmp_path / "out"
    rest = [] if flag == "--variant" else [flag, value]
    gfail("generate", "--variant", argv["--variant"], "--n", 4, *rest, "--out", out,
          capsys=capsys, needles=(f"argument {flag}", f"invalid choice: '{value}'"))
    assert not out.exists()


def test_evaluate_unknown_model_lists_the_accepted_names(capsys):
    gfail("evaluate", "--model", "nosuch", "--data", "pure", "--n", 4, capsys=capsys,
          needles=("unknown model 'nosuch'", "pure", "spur", "exported model directory",
                   "training run directory"))


def test_evaluate_model_given_as_a_file(tmp_path, capsys):
    (tmp_path / "model.png").write_bytes(PNG)
    gfail("evaluate", "--model", tmp_path / "model.png", "--data", "pure", "--n", 4,
          capsys=capsys, needles=("model.png is a file",))


def test_evaluate_unknown_data(capsys):
    gfail("evaluate", "--data", "nowhere", "--n", 4, capsys=capsys,
          needles=("unknown data 'nowhere'", "pure or spur", "dataset directory"))


def test_evaluate_zero_generated_samples(capsys):
    gfail("evaluate", "--data", "pure", "--n", 0, capsys=capsys,
          needles=("--n 0", "dataset directory"))


def test_explain_piece_needs_parts(capsys):
    gfail("explain", "--regimes", "--n", 2, "--piece", 1, capsys=capsys,
          needles=("--piece", "--parts"))


def test_train_impossible_steps(tmp_path, capsys):
    out = tmp_path / "run"
    for flag, value in (("--steps", "0"), ("--steps", "-3"), ("--batch-size", "0"),
                        ("--lr", "0"), ("--lr", "nan"), ("--lr", "inf")):
        gfail("train", "--variant", "pure", "--out", out, flag, value, capsys=capsys,
              needles=(f"argument {flag}",))
    assert not out.exists()


# ----------------------------------------------------------------------------------------------
# gridvqa: datasets that are missing, empty, in the wrong format or corrupt.
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cmd", ["verify", "stats", "evaluate"])
def test_dataset_missing(tmp_path, capsys, cmd):
    argv = (["evaluate", "--data"] if cmd == "evaluate" else [cmd])
    # the needles are the branch's own words, not the path's name (also "missing")
    needles = (("unknown data", "dataset directory") if cmd == "evaluate"
               else ("is not a directory (it does not exist)",))
    gfail(*argv, tmp_path / "missing", capsys=capsys, needles=needles)


def test_dataset_empty_directory(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    for argv in (["verify"], ["stats"], ["evaluate", "--model", "pure", "--data"]):
        gfail(*argv, tmp_path / "empty", capsys=capsys,
              needles=(f"{tmp_path / 'empty'} is empty;",))
    assert not any((tmp_path / "empty").iterdir())


def test_dataset_given_as_a_png(tmp_path, capsys):
    (tmp_path / "scene.png").write_bytes(PNG)
    for argv in (["verify"], ["evaluate", "--data"]):
        gfail(*argv, tmp_path / "scene.png", capsys=capsys,
              needles=("scene.png is a file, not a dataset directory", "manifest.json",
                       "qa_<split>.jsonl"))


def test_dataset_directory_of_other_files(tmp_path, capsys):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "scene.png").write_bytes(PNG)
    gfail("verify", tmp_path / "d", capsys=capsys, needles=("holds no dataset",))


def test_native_corrupt_shard(tmp_path, capsys, native_ds):
    ds = copy_tree(native_ds, tmp_path / "ds")
    shard = sorted(ds.glob("shard-*.npz"))[0]
    shard.write_bytes(shard.read_bytes()[:100])  # truncated
    for argv in (["verify"], ["evaluate", "--data"]):
        gfail(*argv, ds, capsys=capsys, needles=(shard.name, "not a readable .npz shard"))


def test_native_missing_shard(tmp_path, capsys, native_ds):
    ds = copy_tree(native_ds, tmp_path / "ds")
    shard = sorted(ds.glob("shard-*.npz"))[0]
    shard.unlink()
    gfail("stats", ds, capsys=capsys, needles=(shard.name, "listed in the manifest is missing"))


def test_native_truncated_manifest(tmp_path, capsys, native_ds):
    ds = copy_tree(native_ds, tmp_path / "ds")
    text = (ds / "manifest.json").read_text()
    (ds / "manifest.json").write_text(text[: len(text) // 2])
    gfail("verify", ds, capsys=capsys, needles=("manifest.json", "not valid JSON"))


def test_native_manifest_missing_key(tmp_path, capsys, native_ds):
    ds = copy_tree(native_ds, tmp_path / "ds")
    doc = json.loads((ds / "manifest.json").read_text())
    del doc["spec"]
    (ds / "manifest.json").write_text(json.dumps(doc))
    gfail("verify", ds, capsys=capsys, needles=(str(ds), "lacks the key 'spec'"))


def test_official_malformed_jsonl(tmp_path, capsys):
    out = tmp_path / "off"
    (out).mkdir()
    (out / "qa_val.jsonl").write_text('{"image_id": 1, "question": "How many\n')
    (out / "grounding_val.jsonl").write_text("")
    gfail("verify", out, capsys=capsys, needles=("qa_val.jsonl:1", "not valid JSON"))


# ----------------------------------------------------------------------------------------------
# gridvqa: exported models that are missing, truncated, stale or mistyped.
# ----------------------------------------------------------------------------------------------
def _broken_model(tmp_path, model_dir, edit) -> Path:
    m = copy_tree(model_dir, tmp_path / "m")
    edit(m)
    return m


def _edit_config(**change):
    def edit(m):
        doc = json.loads((m / "config.json").read_text())
        doc["model"].update(change)
        (m / "config.json").write_text(json.dumps(doc))
    return edit


@pytest.mark.parametrize("edit, needles", [
    (_edit_config(d_model="16"), ("config.json", "d_model", "must be an integer", "'16'")),
    (_edit_config(enc_layers=1.5), ("enc_layers", "must be an integer")),
    (_edit_config(pool_select="yes"), ("pool_select", "true or false")),
    (_edit_config(n_layer=2), ("unknown model config fields", "n_layer")),  # stale key
    (_edit_config(mlp_dim=32), ("params.msgpack", "config.json")),  # shapes disagree
    (lambda m: (m / "config.json").write_text('{"model": {"d_model": 1'), ("config.json", "JSON")),
    (lambda m: (m / "params.msgpack").write_bytes((m / "params.msgpack").read_bytes()[:50]),
     ("params.msgpack", "truncated")),
    (lambda m: (m / "params.msgpack").unlink(), ("params.msgpack",)),
], ids=["mistyped-str", "mistyped-float", "mistyped-bool", "stale-key", "shape-mismatch",
        "truncated-config", "truncated-params", "missing-params"])
def test_evaluate_broken_export(tmp_path, capsys, model_dir, edit, needles):
    m = _broken_model(tmp_path, model_dir, edit)
    gfail("evaluate", "--model", m, "--data", "pure", "--n", 4, "--density", "d07",
          capsys=capsys, needles=needles)


def test_evaluate_grid_size_mismatch(tmp_path, capsys, model_dir):
    ds = write_native(tmp_path / "g6", grid_size=6)
    gfail("evaluate", "--model", model_dir, "--data", ds, "--n", 0, capsys=capsys,
          needles=("6x6", "5x5"))


@pytest.mark.parametrize("tool", ["gridvqa", "modality-bias"])
@pytest.mark.parametrize("text, needles", [
    ('{"steps": "many"}', ("train_config.json", "'steps'", "must be an integer", "'many'")),
    ('{"steps": 3', ("train_config.json", "delimiter")),
], ids=["mistyped", "truncated"])
def test_resume_with_a_broken_saved_config(tmp_path, capsys, tool, text, needles):
    """--resume reads the run's saved config: a mistyped or truncated one is named and the run
    directory is left as it was."""
    run_dir = tmp_path / "run"
    (run_dir / "ckpt" / "5" / "default").mkdir(parents=True)
    (run_dir / "train_config.json").write_text(text)
    before = sorted(p.relative_to(run_dir) for p in run_dir.rglob("*"))
    if tool == "gridvqa":
        gfail("train", "--variant", "pure", "--out", run_dir, "--resume", "--steps", 2,
              capsys=capsys, needles=needles)
    else:
        bfail("train", "--detector", "text", "--out", run_dir, "--resume", "--steps", 2,
              capsys=capsys, needles=needles)
    assert sorted(p.relative_to(run_dir) for p in run_dir.rglob("*")) == before
    assert (run_dir / "train_config.json").read_text() == text


# ----------------------------------------------------------------------------------------------
# Non-finite loss and unexpected exceptions (the error path itself).
# ----------------------------------------------------------------------------------------------
def test_non_finite_loss_is_one_line(tmp_path, capsys, monkeypatch):
    """A trainer's FloatingPointError (its non-finite-loss stop) becomes one line and rc 2 in
    both tools; no export appears."""
    from bias_jax import train as BT
    from gridvqa_jax.training import train as T

    def diverge(cfg, out, **kw):
        raise FloatingPointError(f"non-finite loss (nan) at step 3 of {out}")

    monkeypatch.setattr(T, "train", diverge)
    monkeypatch.setattr(BT, "train", diverge)
    exp = tmp_path / "exp"
    gfail("train", "--variant", "pure", "--out", tmp_path / "a", "--export", exp,
          capsys=capsys, needles=("non-finite loss (nan) at step 3",))
    bfail("train", "--detector", "text", "--out", tmp_path / "b", "--export", exp,
          capsys=capsys, needles=("non-finite loss (nan) at step 3",))
    assert not exp.exists()


def test_unexpected_exception_keeps_its_traceback(monkeypatch):
    """Only expected failures are turned into one line: a bug still raises."""
    def bug(args):
        raise RuntimeError("a bug")

    monkeypatch.setattr(gcli, "_dataset_with_variant", bug)  # what cmd_stats calls first
    with pytest.raises(RuntimeError, match="a bug"):
        gcli.main(["stats", "anything"])


def test_usage_error_and_help_return_a_status():
    assert gcli.main(["--help"]) == 0
    assert gcli.main(["frobnicate"]) == 2
    assert bcli.main([]) == 2


def _parsed(parser, argv) -> dict:
    args = vars(parser.parse_args(argv))
    return {**args, "fn": args["fn"].__name__}


@pytest.mark.parametrize("old, new", [
    (["bench", "generate", "--batch", "64", "--export-n", "8"],
     ["bench", "generate", "--batch", "64", "--export-n", "8"]),
    (["bench", "synergy", "--synergy-n", "4", "--synergy-chunk", "16", "--json"],
     ["bench", "synergy", "--n", "4", "--chunk", "16", "--json"]),
    (["bench", "explainers", "--explainers-batch", "2", "--explainers-budget", "64",
      "--mae-budget", "10"],
     ["bench", "explainers", "--batch", "2", "--budget", "64", "--mae-budget", "10"]),
])
def test_bench_prefixed_flags_still_parse(old, new):
    """`gridvqa bench <what>` with the old prefixed flags parses to the same arguments as the
    sub-subcommand with unprefixed ones (the prefixed ones are hidden aliases)."""
    p = gcli.build_parser()
    got = _parsed(p, old)
    assert got == _parsed(p, new)
    assert got["command"] == "bench" and got["what"] == new[1]
    assert got["fn"] == f"cmd_bench_{new[1]}"
    bench = p._subparsers._group_actions[0].choices["bench"]
    help_text = bench._subparsers._group_actions[0].choices[new[1]].format_help()
    assert new[2] in help_text and old[2] not in help_text.replace(new[2], "")


def test_bench_ignores_the_other_benches_flags():
    """The one old `bench` parser took every bench's flags: another bench's flag is still
    accepted and changes nothing."""
    p = gcli.build_parser()
    plain = _parsed(p, ["bench", "synergy", "--n", "4"])
    extra = _parsed(p, ["bench", "synergy", "--n", "4", "--render-batch", "3",
                        "--mae-budget", "9"])
    assert {k: v for k, v in extra.items() if not k.startswith("legacy_")} == plain
    assert _parsed(p, ["bench", "generate", "--synergy-n", "7"])["batch"] == 65536


def test_bench_needs_a_sub_subcommand(capsys):
    assert gcli.main(["bench"]) == 2
    assert gcli.main(["bench", "frobnicate"]) == 2
    assert gcli.main(["bench", "generate", "--batch", "0"]) == 2
    assert "gridvqa bench generate: error: argument --batch" in capsys.readouterr().err


@pytest.mark.parametrize("cli, dest", [(gcli, "command"), (bcli, "cmd")])
def test_every_command_is_registered_with_its_handler(cli, dest):
    """Each entry of COMMANDS is a subcommand with the output flags, running its handler."""
    p = cli.build_parser()
    leaves = [(c.name, None, c) for c in cli.COMMANDS if not c.subcommands] + [
        (c.name, s.name, s) for c in cli.COMMANDS for s in c.subcommands]
    assert {c.name for c in cli.COMMANDS} == set(p._subparsers._group_actions[0].choices)
    required = {"generate": ["--variant", "pure", "--n", "1", "--out", "x"], "verify": ["d"],
                "stats": ["d"], "train": ["--variant", "pure", "--out", "x"],
                "reproduce": ["--out", "x"]}
    if cli is bcli:
        required = {"train": ["--detector", "text", "--out", "x"],
                    "clean": ["--data", "fakeddit", "--root", "d", "--labels", "l", "--keep",
                              "balance", "--out", "x"]}
    for name, sub, command in leaves:
        argv = [name] + ([sub] if sub else []) + required.get(name, []) + ["--json", "--quiet"]
        args = p.parse_args(argv)
        assert getattr(args, dest) == name and args.fn is command.run
        assert args.json and args.quiet and not args.no_progress


def test_bias_analysis_commands_keep_their_sample_defaults():
    p = bcli.build_parser()
    assert p.parse_args(["analyze"]).n_default == 2000
    assert p.parse_args(["bench"]).n_default == 2048
    assert not hasattr(p.parse_args(["bench"]), "tables")


@pytest.mark.parametrize("module, argv, needle", [
    ("reproduction.cli.gridvqa", ["generate", "--variant", "pure", "--n", "-5", "--out", "OUT"],
     "gridvqa generate: error: argument --n"),
    ("reproduction.cli.bias", ["train", "--detector", "text", "--out", "OUT", "--steps", "0"],
     "modality-bias train: error: argument --steps"),
])
def test_entry_point_in_a_process(tmp_path, module, argv, needle):
    """The real process: exit status 2, one stderr line, no traceback, no output written."""
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    r = subprocess.run([sys.executable, "-m", module, *argv], capture_output=True, text=True,
                       env=env, cwd=REPO, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and needle in r.stderr
    assert r.stdout == "" and not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------------------------
# modality-bias.
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("flag, value", [("--steps", "0"), ("--steps", "-1"),
                                         ("--batch-size", "0"), ("--lr", "-0.001"),
                                         ("--save-every", "0"), ("--eval-n", "-1")])
def test_bias_train_impossible_size(tmp_path, capsys, flag, value):
    out = tmp_path / "run"
    bfail("train", "--detector", "text", "--out", out, flag, value, capsys=capsys,
          needles=(f"argument {flag}", value))
    assert not out.exists()


@pytest.mark.parametrize("argv, needles", [
    (["train", "--detector", "audio", "--out", "X"], ("argument --detector", "'audio'")),
    (["train", "--detector", "text", "--data", "imagenet", "--out", "X"],
     ("argument --data", "'imagenet'")),
    (["detectors", "--detectors", "audio"], ("argument --detectors", "'audio'")),
    (["detectors", "--n", "0"], ("argument --n", ">= 1")),
])
def test_bias_unknown_name_or_size(tmp_path, capsys, argv, needles):
    argv = [str(tmp_path / "x") if a == "X" else a for a in argv]
    bfail(*argv, capsys=capsys, needles=needles)
    assert not (tmp_path / "x").exists()


def test_bias_detectors_missing_root(tmp_path, capsys):
    bfail("detectors", "--root", tmp_path / "nowhere", capsys=capsys,
          needles=("nowhere is not a directory", "bias_image/"))


def test_bias_detectors_missing_export(tmp_path, capsys, detector_dir):
    bfail("detectors", "--root", detector_dir, "--detectors", "image", "--n", 4,
          capsys=capsys, needles=("bias_image", "not an exported detector"))


def test_bias_detectors_wrong_kind(tmp_path, capsys, detector_dir):
    root = tmp_path / "root"
    copy_tree(detector_dir / "bias_text", root / "bias_image")
    bfail("detectors", "--root", root, "--detectors", "image", "--n", 4, capsys=capsys,
          needles=("holds a 'text' detector, expected 'image'",))


@pytest.mark.parametrize("change, needles", [
    ({"d_model": "16"}, ("d_model", "must be an integer")),
    ({"kind": "audio"}, ("unknown detector kind 'audio'",)),
    ({"n_gate": 4}, ("unknown DetectorConfig fields", "n_gate")),
])
def test_bias_detectors_mistyped_config(tmp_path, capsys, detector_dir, change, needles):
    root = copy_tree(detector_dir, tmp_path / "root")
    doc = json.loads((root / "bias_text" / "config.json").read_text())
    doc["detector"].update(change)
    (root / "bias_text" / "config.json").write_text(json.dumps(doc))
    bfail("detectors", "--root", root, "--detectors", "text", "--n", 4, capsys=capsys,
          needles=("config.json",) + needles)


def test_bias_detectors_truncated_params(tmp_path, capsys, detector_dir):
    root = copy_tree(detector_dir, tmp_path / "root")
    p = root / "bias_text" / "params.msgpack"
    p.write_bytes(p.read_bytes()[:40])
    bfail("detectors", "--root", root, "--detectors", "text", "--n", 4, capsys=capsys,
          needles=("params.msgpack",))


# ----------------------------------------------------------------------------------------------
# End to end with a real divergence (slow: compiles a trainer).
# ----------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_bias_train_real_divergence_exports_nothing(tmp_path, capsys):
    exp = tmp_path / "exp"
    bfail("train", "--detector", "text", "--out", tmp_path / "run", "--steps", 3,
          "--batch-size", 8, "--eval-n", 0, "--lr", "1e30", "--export", exp, capsys=capsys,
          needles=("non-finite loss",))
    assert not exp.exists()


# ----------------------------------------------------------------------------------------------
# A dataset that does not record its variant.
# ----------------------------------------------------------------------------------------------
FIXTURE = REPO / "tests" / "fixtures" / "official_gridvqa"


def official_without_reports(tmp_path, folder: str) -> Path:
    """A copy of an official-generator fixture without its report CSVs (no spec.json either):
    nothing records the variant."""
    out = copy_tree(FIXTURE / folder, tmp_path / folder)
    for csv in out.glob("*.csv"):
        csv.unlink()
    return out


def test_verify_infers_the_variant_or_asks_for_it(tmp_path, capsys):
    """The official spurious output satisfies the D_spur condition on every sample and fails
    the D_pure one on some, so verify tells the variant itself; the official pure output breaks
    both (the official pure generator leaves depth-1 confuser regions empty, see DESIGN.md), so
    only there is --variant needed."""
    spur = official_without_reports(tmp_path, "spurious")
    rc, out, err = run(gcli.main, "verify", spur, "--json", "--no-progress", capsys=capsys)
    res = json.loads(out.strip().splitlines()[-1])
    assert rc == 0 and res["all_pass"] and res["variant"] == "spur" and res["n"] == 24
    assert "variant spur inferred from the samples" in err

    pure = official_without_reports(tmp_path, "pure")
    gfail("verify", pure, capsys=capsys,
          needles=("variant unknown", "fit neither", "--variant pure"))
    rc, out, err = run(gcli.main, "verify", pure, "--variant", "pure", "--json", "--quiet",
                       capsys=capsys)
    assert rc in (0, 1) and "error" not in err
    assert json.loads(out.strip().splitlines()[-1])["variant"] == "pure"
