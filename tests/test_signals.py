"""SIGTERM and SIGINT end a run quietly: one line, exit 128 + the signal, spawned ranks stopped."""

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path


from splat_train.trainer.launch import STOP_GRACE_S

TINY = [
    "default",
    "--synthetic_image_size",
    "32",
    "--synthetic_num_cameras",
    "8",
    "--synthetic_num_gaussians",
    "150",
    "--num_traj_frames",
    "0",
    "--sh_degree",
    "1",
    "--device",
    "cpu",
    "--max_steps",
    "100000",
]


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
    proc = subprocess.Popen(
        [sys.executable, "-m", "splat_train.trainer.cli", *TINY, *flags, "--result_dir", str(tmp_path / "run")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout] + [lines.put(None)], daemon=True).start()
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


def _bar_steps(stderr: str) -> list[int]:
    """The step counts the progress bar showed, in order ("  0%|  | 12/100000 [...")."""
    return [int(m) for m in re.findall(r"%\|[^|]*\| *(\d+)/\d+", stderr.replace("\r", "\n"))]


def test_sigint_writes_a_checkpoint_at_the_next_step_as_sigterm_does(tmp_path):
    """Ctrl-C during training: one line says so at once, the step in flight finishes, its
    checkpoint is written, and the run ends (130) with one line naming it."""
    rc, err, _ = _interrupt_when_training(tmp_path, signal.SIGINT)
    assert rc == 130, err
    messages = _messages(err)
    assert len(messages) == 2, err  # no native stack dump (pycolmap's glog), no traceback
    assert messages[0] == (
        "SIGINT: writing a checkpoint at the next step boundary, then stopping (Ctrl-C again stops at once, "
        "without one)"
    )
    step = _newest_checkpoint_step(messages[1], "SIGINT")
    assert step > 0 and (tmp_path / "run" / "ckpts" / f"ckpt_{step}_rank0.pt").is_file()


def _newest_checkpoint_step(message: str, name: str = "SIGTERM") -> int:
    match = re.match(rf"stopped by {name}; the newest checkpoint is step (\d+) in ", message)
    assert match, message
    return int(match.group(1))


def test_sigterm_writes_a_checkpoint_at_the_next_step_and_ends_with_one_line(tmp_path):
    """SIGTERM (SLURM's preemption warning) during training: the step in flight finishes, its
    checkpoint is written, then the run ends (143) with one line naming it."""
    rc, err, _ = _interrupt_when_training(tmp_path, signal.SIGTERM)
    assert rc == 143, err
    messages = _messages(err)
    assert len(messages) == 2, err
    assert messages[0] == "SIGTERM: writing a checkpoint at the next step boundary, then stopping"
    step = _newest_checkpoint_step(messages[1])
    assert step > 0 and (tmp_path / "run" / "ckpts" / f"ckpt_{step}_rank0.pt").is_file()
    assert _bar_steps(err)[-1] == step  # the bar's last state is the checkpoint's step, not the one before


def test_sigterm_stops_spawned_cpu_ranks(tmp_path):
    rc, err, spawned = _interrupt_when_training(tmp_path, signal.SIGTERM, "--nproc_per_node", "2", "--save_steps", "1")
    assert rc == 143, err
    messages = _messages(err)
    assert len(messages) == 2, err
    assert messages[0] == (
        "SIGTERM: ranks 0, 1 write a checkpoint at the next step boundary, then end; a rank still running "
        f"{STOP_GRACE_S:g} s from now is killed (SIGKILL)"
    )
    step = _newest_checkpoint_step(messages[1])  # the ranks agreed on a step and both wrote it
    assert step > 1
    assert all((tmp_path / "run" / "ckpts" / f"ckpt_{step}_rank{r}.pt").is_file() for r in (0, 1))
    assert len(spawned) >= 2  # the two ranks (and multiprocessing's resource tracker)
    deadline = time.monotonic() + 60
    while any(_alive(pid) for pid in spawned) and time.monotonic() < deadline:
        time.sleep(0.5)
    survivors = [pid for pid in spawned if _alive(pid)]
    for pid in survivors:  # this test's own processes: do not leave them running when it fails
        os.kill(pid, signal.SIGKILL)
    assert not survivors, "spawned ranks outlived the launcher"


def _run(tmp_path: Path, result: str, *flags: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "splat_train.trainer.cli", *RERUN, *flags, "--result_dir", str(tmp_path / result)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


RERUN = [
    "default",
    "--synthetic_image_size",
    "32",
    "--synthetic_num_cameras",
    "8",
    "--synthetic_num_gaussians",
    "150",
    "--num_traj_frames",
    "0",
    "--sh_degree",
    "1",
    "--device",
    "cpu",
    "--max_steps",
    "120",
    "--refine_start_iter",
    "10",
    "--refine_every",
    "10",
    "--save_steps",
    "5",
    "--eval_steps",
    "120",
    "--nproc_per_node",
    "2",
    "--resume",
    "auto",
]


def test_sigterm_then_the_same_command_equals_an_uninterrupted_run(tmp_path):
    """The requeue a cluster does: a 2-rank run stopped by SIGTERM, then started again with the
    very same command (``--resume auto``), ends bitwise where an uninterrupted run ends."""
    import torch

    straight = _run(tmp_path, "straight")
    first = _run(tmp_path, "requeued")
    try:
        ckpt = tmp_path / "requeued" / "ckpts" / "ckpt_5_rank0.pt"
        deadline = time.monotonic() + 300
        while not ckpt.exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        first.send_signal(signal.SIGTERM)  # a few steps in, well before step 120
        _, err = first.communicate(timeout=180)
        assert first.returncode == 143, err
        stopped_at = _newest_checkpoint_step(_messages(err)[-1])
        assert 5 < stopped_at < 120
        again = _run(tmp_path, "requeued")  # the same command
        out, err = again.communicate(timeout=300)
        assert again.returncode == 0, err
        assert f"resumed from step {stopped_at}" in out
        _, err = straight.communicate(timeout=300)
        assert straight.returncode == 0, err
    finally:
        for proc in (straight, first):
            if proc.poll() is None:
                proc.kill()
    for rank in (0, 1):
        a = torch.load(tmp_path / "straight" / "ckpts" / f"ckpt_120_rank{rank}.pt", weights_only=False)
        b = torch.load(tmp_path / "requeued" / "ckpts" / f"ckpt_120_rank{rank}.pt", weights_only=False)
        for name in a["params"]:
            assert torch.equal(a["params"][name], b["params"][name]), (rank, name)


# A run whose every step takes SLOW_STEP_S longer (a sleep in train_step), with the launcher's grace
# and the ranks' agreement budget shortened to keep the test short. Spawned ranks import this
# script as their __mp_main__, so the same changes apply in every rank.
SLOW = """
import sys, time
from splat_train.trainer import cli, launch, loop

launch.STOP_GRACE_S = {grace}
launch.STOP_AGREE_BUDGET_S = {budget}
real_step = loop.Trainer.train_step


def slow_step(self, step):
    time.sleep({sleep})
    return real_step(self, step)


loop.Trainer.train_step = slow_step
if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:]))
"""
SLOW_STEP_S, GRACE_S, BUDGET_S = 1.5, 15.0, 1.0


def _slow_run(tmp_path: Path, *flags: str) -> tuple[subprocess.Popen, queue.Queue]:
    script = tmp_path / "slow.py"
    script.write_text(SLOW.format(grace=GRACE_S, budget=BUDGET_S, sleep=SLOW_STEP_S))
    proc = subprocess.Popen(
        [sys.executable, str(script), *TINY, *flags, "--result_dir", str(tmp_path / "run")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout] + [lines.put(None)], daemon=True).start()
    return proc, lines


def _wait_for(lines: queue.Queue, proc: subprocess.Popen, prefix: str) -> str:
    while True:
        line = lines.get(timeout=300)
        assert line is not None, f"the run ended before printing {prefix!r}: {proc.stderr.read()}"
        if line.startswith(prefix):
            return line


def _stop_slow_run(proc: subprocess.Popen, sig: int) -> tuple[int, str]:
    try:
        time.sleep(2 * SLOW_STEP_S)  # a step or two in
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, err


def test_sigterm_at_two_ranks_with_slow_steps_checkpoints_within_the_grace_and_resumes(tmp_path):
    """Steps slower than the ranks' agreement budget: the ranks agree at every step boundary, so
    a SIGTERM is answered at the next one, with a checkpoint of both ranks, well before the
    launcher's grace ends (at 20 steps between agreements it would have killed them first, with no
    checkpoint); the same command then resumes it."""
    command = ("--nproc_per_node", "2", "--resume", "auto")
    proc, lines = _slow_run(tmp_path, *command)
    _wait_for(lines, proc, "splat-train:")
    rc, err = _stop_slow_run(proc, signal.SIGTERM)
    assert rc == 143, err
    messages = _messages(err)
    assert messages[0] == (
        f"SIGTERM: ranks 0, 1 write a checkpoint at the next step boundary, then end; a rank still running "
        f"{GRACE_S:g} s from now is killed (SIGKILL)"
    ), err
    assert not any("killed (SIGKILL);" in m or "still running" in m for m in messages[1:]), err
    step = _newest_checkpoint_step(messages[-1])
    assert step >= 1 and all((tmp_path / "run" / "ckpts" / f"ckpt_{step}_rank{r}.pt").is_file() for r in (0, 1))
    assert _bar_steps(err)[-1] == step
    again, lines = _slow_run(tmp_path, *command)  # the same command
    assert _wait_for(lines, again, "resumed from step").startswith(f"resumed from step {step} (world size 2)")
    _wait_for(lines, again, "splat-train:")
    rc, err = _stop_slow_run(again, signal.SIGTERM)
    assert rc == 143, err
    assert _newest_checkpoint_step(_messages(err)[-1]) > step


def test_a_second_sigint_stops_at_once(tmp_path):
    """A user's Ctrl-C, then another before the step in flight ends: the run ends at once (130),
    without the checkpoint the first one asked for."""
    proc, lines = _slow_run(tmp_path)
    _wait_for(lines, proc, "splat-train:")
    try:
        time.sleep(SLOW_STEP_S / 3)
        proc.send_signal(signal.SIGINT)
        time.sleep(SLOW_STEP_S / 10)  # within the same step
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    messages = _messages(err)
    assert messages[0].startswith("SIGINT: writing a checkpoint at the next step boundary"), err
    assert messages[-1].startswith("stopped by SIGINT before the first checkpoint"), err
    assert not (tmp_path / "run" / "ckpts").exists()
