"""Atomic dataset directories: write under a temporary sibling name, rename when complete.

Shared by the native and the official writers, so that an interrupted or failed write never
leaves anything at the output path that looks like a dataset.
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


def make_staging(out_dir) -> Path:
    """Check ``out_dir`` and create the temporary sibling ``<name>.tmp-XXXX`` to write into."""
    out_dir = Path(out_dir).absolute()
    check_out_dir(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=out_dir.name + ".tmp-", dir=out_dir.parent))


def publish(tmp: Path, out_dir) -> Path:
    """Rename the finished temporary directory to ``out_dir`` (re-checked: absent or empty)."""
    out_dir = Path(out_dir).absolute()
    check_out_dir(out_dir)
    if out_dir.exists():
        out_dir.rmdir()
    os.replace(tmp, out_dir)
    return out_dir


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
