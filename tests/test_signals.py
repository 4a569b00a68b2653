"""SIGTERM and SIGINT end a run quietly: one line, exit 128 + the signal, spawned ranks stopped."""

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

TINY = ["default", "--synthetic_image_size", "32", "--synthetic_num_cameras", "8", "--synthetic_num_gaussians",
        "150", "--num_traj_frames", "0", "--sh_degree", "1", "--device", "cpu", "--max_steps", "100000"]


def _children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (from /proc/<pid>/stat: pid (comm) state ppid ...)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _interrupt_when_training(tmp_path: Path, sig: int, *flags: str) -> tuple[int, str, list[int]]:
    """Start ``splat-train`` (a subprocess), send ``sig`` once training has begun; return its exit
    code, its stderr and the pids of the processes it had started."""
    proc = subprocess.Popen([sys.executable, "-m", "splat_train.trainer.cli", *TINY, *flags,
                             "--result_dir", str(tmp_path / "run")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout] + [lines.put(None)],
                     daemon=True).start()
    try:
        while True:  # "splat-train: ..." is printed when the training loop starts
            line = lines.get(timeout=300)
            assert line is not None, f"the run ended before training: {proc.stderr.read()}"
            if line.startswith("splat-train:"):
                break
        time.sleep(1.0)  # a few steps in
        spawned = _children(proc.pid)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, err, spawned


def _messages(stderr: str) -> list[str]:
    """stderr without the progress bar's redraws."""
    lines = stderr.replace("\r", "\n").splitlines()
    return [line for line in lines if line.strip() and "%|" not in line]


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_ends_a_run_with_one_line(tmp_path, sig, code):
    rc, err, _ = _interrupt_when_training(tmp_path, sig)
    assert rc == code, err
    messages = _messages(err)
    assert len(messages) == 1, err  # no native stack dump (pycolmap's glog), no traceback
    assert messages[0] == (f"stopped by {signal.Signals(sig).name} before the first checkpoint; "
                           f"{tmp_path / 'run'} needs --overwrite to start again")


def test_sigterm_stops_spawned_cpu_ranks(tmp_path):
    rc, err, spawned = _interrupt_when_training(tmp_path, signal.SIGTERM, "--nproc_per_node", "2",
                                                "--save_steps", "1")
    assert rc == 143, err
    messages = _messages(err)
    assert len(messages) == 1 and messages[0].startswith("stopped by SIGTERM; the newest checkpoint is step 1"), err
    assert len(spawned) >= 2  # the two ranks (and multiprocessing's resource tracker)
    deadline = time.monotonic() + 60
    while any(_alive(pid) for pid in spawned) and time.monotonic() < deadline:
        time.sleep(0.5)
    survivors = [pid for pid in spawned if _alive(pid)]
    for pid in survivors:  # this test's own processes: do not leave them running when it fails
        os.kill(pid, signal.SIGKILL)
    assert not survivors, "spawned ranks outlived the launcher"
