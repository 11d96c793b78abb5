"""mmx_base.staging: every writer's atomic publish and single-file write."""

import pytest

from mmx_base import staging


def _staged(tmp_path, name, text):
    stage = staging.make_staging(tmp_path / name, overwrite=True)
    (stage / "f.txt").write_text(text)
    return stage


def test_publish_refuses_a_non_empty_target_and_leaves_both_intact(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with pytest.raises(ValueError, match="not empty"):
        staging.make_staging(out)
    stage = _staged(tmp_path, "out", "new")
    with pytest.raises(ValueError, match="not empty"):
        staging.publish(stage, out)
    assert (out / "old.txt").read_text() == "old" and (stage / "f.txt").exists()


def test_publish_with_overwrite_replaces_and_removes_the_old_output(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    staging.publish(_staged(tmp_path, "out", "new"), out, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["f.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no stage, nothing aside
    assert oct(out.stat().st_mode & 0o777) == oct(0o755)


def test_publish_with_overwrite_puts_the_old_output_back_when_the_rename_fails(tmp_path,
                                                                               monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    stage = _staged(tmp_path, "out", "new")
    real = staging.os.replace

    def failing(src, dst):
        if str(src) == str(stage):
            raise OSError("disk full")
        return real(src, dst)

    monkeypatch.setattr(staging.os, "replace", failing)
    with pytest.raises(OSError, match="disk full"):
        staging.publish(stage, out, overwrite=True)
    assert (out / "old.txt").read_text() == "old"
    assert not [p for p in tmp_path.iterdir() if ".old-" in p.name]


def test_write_atomic_writes_bytes_text_and_writers_and_leaves_nothing_on_failure(tmp_path):
    p = tmp_path / "sub" / "a.json"
    staging.write_atomic(p, "{}")
    assert p.read_text() == "{}" and oct(p.stat().st_mode & 0o777) == oct(0o644)
    staging.write_atomic(p, b"[1]")
    assert p.read_text() == "[1]"
    staging.write_atomic(p, lambda f: f.write(b"[2]"))
    assert p.read_text() == "[2]"

    def broken(f):
        f.write(b"half")
        raise RuntimeError("writer failed")

    with pytest.raises(RuntimeError):
        staging.write_atomic(p, broken)
    assert p.read_text() == "[2]"  # untouched
    assert sorted(x.name for x in p.parent.iterdir()) == ["a.json"]  # no temporary left
