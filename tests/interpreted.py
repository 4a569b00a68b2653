"""Run a test module's kernel checks under the Triton interpreter (not a test module).

TRITON_INTERPRET is read when Triton defines a kernel, so it must be set before import; running
the checks in a child process keeps the variable out of every other test module."""

import os
import subprocess
import sys


def run_interpreted(script: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """``python script *args`` with TRITON_INTERPRET=1; asserts a zero exit (stderr shown)."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(
        [sys.executable, os.path.abspath(script), *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    return proc


def interpreted_results(script: str, tmp_path_factory, name: str, available: bool):
    """What ``python script kernel OUT`` saved to OUT under the interpreter (torch.load), for a
    module-scoped fixture; skips where Triton is not installed (``available`` False)."""
    import pytest
    import torch

    if not available:
        pytest.skip("Triton is not installed")
    out = tmp_path_factory.mktemp(name) / "out.pt"
    run_interpreted(script, "kernel", str(out))
    return torch.load(out)
