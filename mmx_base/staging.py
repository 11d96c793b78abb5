"""Atomic outputs: write under a temporary sibling name, rename when complete.

Every writer of the library goes through here (datasets, exports, results directories,
figures, JSON files), so that an interrupted or failed write never leaves anything at the
output path that looks finished: directories with ``make_staging`` / ``publish`` / ``discard``,
single files with ``write_atomic``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def check_out_dir(out_dir: Path):
    """Raise ValueError unless ``out_dir`` is absent or an empty directory."""
    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ValueError(f"output directory {out_dir} already exists and is not empty; "
                         "refusing to overwrite it (choose a new directory or remove it)")


def make_staging(out_dir, *, overwrite: bool = False) -> Path:
    """Check ``out_dir`` (absent or empty, unless ``overwrite``) and create the temporary
    sibling ``<name>.tmp-XXXX`` to write into (mode 0755, as a plain ``mkdir`` would)."""
    out_dir = Path(out_dir).absolute()
    if not overwrite:
        check_out_dir(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out_dir.name + ".tmp-", dir=out_dir.parent))
    tmp.chmod(0o755)
    return tmp


def publish(tmp: Path, out_dir, *, overwrite: bool = False) -> Path:
    """Rename the finished temporary directory to ``out_dir``.

    ``out_dir`` must be absent or empty (re-checked now), unless ``overwrite``: then an existing
    ``out_dir`` is first renamed aside, and removed once the new one is in place (put back if
    the rename fails), so at every moment ``out_dir`` is either the old or the new output.
    """
    out_dir = Path(out_dir).absolute()
    if not overwrite:
        check_out_dir(out_dir)
    aside = None
    if out_dir.is_dir() and not out_dir.is_symlink() and not any(out_dir.iterdir()):
        out_dir.rmdir()
    elif out_dir.exists() or out_dir.is_symlink():
        aside = Path(tempfile.mkdtemp(prefix=out_dir.name + ".old-", dir=out_dir.parent))
        os.replace(out_dir, aside / out_dir.name)
    try:
        os.replace(tmp, out_dir)
    except BaseException:
        if aside is not None and not out_dir.exists():
            os.replace(aside / out_dir.name, out_dir)
        raise
    finally:
        if aside is not None:
            discard(aside)
    return out_dir


def write_atomic(path, data, *, mode: int = 0o644) -> Path:
    """Write one file atomically: into a temporary file beside ``path``, then renamed to it.

    ``data``: ``bytes``, ``str`` (UTF-8), or a callable ``write(binary_file)`` (e.g.
    ``lambda f: fig.savefig(f, format="png")``). The parent directory is created; on any
    error the temporary file is removed and ``path`` is untouched. Returns ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data.encode() if isinstance(data, str) else data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def discard(tmp) -> None:
    """Remove a temporary directory and everything in it (missing is fine)."""
    shutil.rmtree(tmp, ignore_errors=True)


class StagedWriter:
    """Context-manager protocol of the writers: ``close()`` on success, ``abort()`` on error."""

    def close(self):  # pragma: no cover - overridden
        """Finish writing and publish the output."""
        raise NotImplementedError

    def abort(self):  # pragma: no cover - overridden
        """Discard everything written so far."""
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abort()
        return False
