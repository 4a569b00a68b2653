"""Atomic file writes: every checkpoint, PLY, stats file and cached image goes through here.

The data is written to a temporary file in the destination directory, flushed and fsynced, then
renamed over the destination (``os.replace`` is atomic on POSIX within a file system) and the
directory is fsynced so the rename itself persists. A reader sees the old file or the new one,
never a torn one; on any error the temporary file is removed and the destination is untouched.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable


def _read_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# Read once, at import (single-threaded): os.umask can only be read by setting it. mkstemp creates
# 0600 files; the final file gets the mode an ordinary open() would give it (0666 & ~umask), so a
# team can read each other's checkpoints and PLYs.
_FILE_MODE = 0o666 & ~_read_umask()


def _fsync_directory(directory: str) -> None:
    """Persist a rename (POSIX); a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: "str | os.PathLike", write_fn: Callable[[str], object]) -> None:
    """Call ``write_fn(tmp_path)`` (it writes the whole file there), then move it onto ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write_fn(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, _FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    _fsync_directory(str(path.parent))


def atomic_write_bytes(path: "str | os.PathLike", data: bytes) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(data)

    atomic_write(path, write)
