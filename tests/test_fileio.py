"""Atomic writes: the destination is the old file or the whole new one, never a torn one, and the
new file has the permissions an ordinary open() would give it (not mkstemp's 0600)."""

import os
import stat

import pytest

from splat_train.trainer.fileio import atomic_write, atomic_write_bytes


def test_new_file_gets_the_umask_mode_not_0600(tmp_path):
    mask = os.umask(0o022)
    os.umask(mask)
    path = tmp_path / "sub" / "ckpt.pt"
    atomic_write_bytes(path, b"payload")
    assert path.read_bytes() == b"payload"
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask


def test_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "model.ply"
    atomic_write_bytes(path, b"old")

    def broken(tmp):
        with open(tmp, "wb") as f:
            f.write(b"half of the new")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, broken)
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.ply"]
