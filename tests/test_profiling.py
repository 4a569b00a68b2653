"""trainer.profiling: phase ranges stay balanced when backward phases begin on another thread."""

import json
import threading

import torch

from splat_train.trainer import profiling


class _Event:
    """Stand-in for torch.cuda.Event: records a host timestamp (the phases' ms come from it)."""

    def __init__(self, enable_timing=False):
        self.t = None

    def record(self):
        import time

        self.t = time.perf_counter()

    def elapsed_time(self, other):
        return (other.t - self.t) * 1000.0


def test_nvtx_ranges_are_closed_by_id_across_threads(monkeypatch):
    """On CUDA autograd runs backward nodes on its device thread, so a phase begun there closes
    one begun on the main thread: every range started must be ended exactly once, whichever
    thread ends it (push / pop, being per thread, left ranges open and popped empty stacks)."""
    started, ended = [], []
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda.nvtx, "range_start", lambda msg: started.append(msg) or len(started))
    monkeypatch.setattr(torch.cuda.nvtx, "range_end", lambda rid: ended.append(rid))
    timer = profiling.PhaseTimer(torch.device("cuda", 0), enabled=True)
    for _ in range(3):  # steps
        timer.begin("loss")
        worker = threading.Thread(target=lambda: (timer.begin("backward_raster"), timer.begin("backward_exchange")))
        worker.start()
        worker.join()
        timer.begin("optimizer")
        phases = timer.end_step()
        assert set(phases) == {"loss", "backward_raster", "backward_exchange", "optimizer", "total"}
    assert started == ["loss", "backward_raster", "backward_exchange", "optimizer"] * 3
    assert sorted(ended) == list(range(1, len(started) + 1))  # each range ended once


def test_disabled_timer_does_nothing():
    timer = profiling.PhaseTimer(torch.device("cpu"))
    timer.begin("loss")
    assert timer.end_step() == {}


def test_trace_summary_counts_busy_time_launches_and_syncs():
    """A hand-made trace of 2 steps: overlapping device intervals count once, syncs are counted."""

    def span(cat, name, ts, dur):
        return dict(ph="X", cat=cat, name=name, ts=ts, dur=dur)

    trace = {
        "traceEvents": [
            span("kernel", "rasterize", 0, 100),
            span("kernel", "ssim", 50, 100),  # overlap: busy 0-150
            span("gpu_memcpy", "Memcpy HtoD", 300, 50),  # busy 300-350; idle 150-300
            span("kernel", "rasterize", 500, 100),  # wall 0-600
            span("cuda_runtime", "cudaLaunchKernel", 0, 1),
            span("cuda_runtime", "cudaLaunchKernel", 1, 1),
            span("cuda_runtime", "cudaStreamSynchronize", 2, 1),
            span("cpu_op", "aten::add", 0, 5),
            dict(ph="i", name="marker", ts=10),
        ]
    }
    s = profiling.summarize_trace(trace, steps=2)
    assert s["wall_ms_per_step"] == 0.3 and s["gpu_busy_ms_per_step"] == 0.15
    assert abs(s["gpu_busy_share"] - 0.5) < 1e-12
    assert s["kernels_per_step"] == 1.5 and s["memcpys_per_step"] == 0.5 and s["syncs_per_step"] == 0.5
    assert s["top_kernels"][0] == dict(name="rasterize", ms_per_step=0.1, count_per_step=1.0)
    assert s["runtime_calls_per_step"]["cudaLaunchKernel"] == 1.0
    assert "GPU busy 0.15 ms/step (50%)" in profiling.format_trace_summary(s)
    cpu_only = profiling.summarize_trace({"traceEvents": [span("cpu_op", "aten::add", 0, 5)]}, steps=3)
    assert cpu_only["gpu_busy_share"] is None and "CPU run" in profiling.format_trace_summary(cpu_only)


def test_deferred_timer_synchronizes_once_at_collect(monkeypatch):
    """In a --profile window the timer keeps each step's events and reads them at the end, so the
    window does not synchronize the device every step (which would hide the host running ahead)."""
    syncs = []
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: syncs.append(device))
    monkeypatch.setattr(torch.cuda.nvtx, "range_start", lambda msg: 1)
    monkeypatch.setattr(torch.cuda.nvtx, "range_end", lambda rid: None)
    timer = profiling.PhaseTimer(torch.device("cuda", 0), enabled=True, deferred=True)
    for _ in range(4):
        timer.begin("loss")
        timer.begin("optimizer")
        assert timer.end_step() == {}
    assert syncs == []
    steps = timer.collect()
    assert len(syncs) == 1 and len(steps) == 4
    assert all(set(s) == {"loss", "optimizer", "total"} and s["total"] >= 0 for s in steps)
    assert timer.collect() == []


def test_deferred_steps_are_read_after_the_window_switched_the_timer_off(monkeypatch):
    """A --profile window that ends before the last step: the loop switches the timer off (cuda
    False) while the window's CUDA events still wait in collect(); reading them must use the
    events' clock, not the host's (it raised TypeError subtracting two events)."""
    syncs = []
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: syncs.append(device))
    monkeypatch.setattr(torch.cuda.nvtx, "range_start", lambda msg: 1)
    monkeypatch.setattr(torch.cuda.nvtx, "range_end", lambda rid: None)
    timer = profiling.PhaseTimer(torch.device("cuda", 0))
    timer.switch(True, deferred=True)
    for _ in range(3):
        timer.begin("projection")
        timer.begin("loss")
        timer.end_step()
    timer.switch(False, deferred=True)  # the step after the window
    assert not timer.cuda
    steps = timer.collect()
    assert len(steps) == 3 and len(syncs) == 1
    assert all(set(s) == {"projection", "loss", "total"} and s["total"] >= 0 for s in steps)


def test_profile_window_writes_trace_summary_and_phases_on_cpu(tmp_path, capsys):
    """--profile end to end on the CPU: the window's trace, its summary and the per-phase table
    are written; --profile_mode device on a CPU run records the host operators anyway (there is
    no device activity to record), so it writes the same three files."""
    from test_cli import run

    for mode in ("full", "device"):
        out = tmp_path / mode
        assert (
            run(
                "--max_steps",
                "6",
                "--num_traj_frames",
                "0",
                "--profile",
                "--profile_start_step",
                "2",
                "--profile_num_steps",
                "3",
                "--profile_mode",
                mode,
                "--result_dir",
                str(out),
            )
            == 0
        )
        prof = out / "profile"
        summary = json.loads((prof / "summary_rank0.json").read_text())
        assert summary["steps"] == 3 and summary["gpu_busy_share"] is None  # a CPU run
        phases = json.loads((prof / "phases_rank0.json").read_text())
        assert phases["steps"] == 3 and phases["median_ms"]["total"] > 0
        assert (prof / "trace_rank0.json").stat().st_size > 0
    out, err = capsys.readouterr()
    assert out.count("profile: no device events over 3 steps") == 2
    assert err.count("--profile_mode device: a CPU run has no device activity") == 1  # said once, for device


def test_profile_window_past_the_end_is_refused_and_a_cut_window_says_so(tmp_path, capsys):
    """A window that starts at or after the last step is an error before anything runs; one that
    runs past the end covers the steps that exist, says so, and divides by them."""
    import pytest

    from splat_train.trainer.cli import parse_args
    from test_cli import run

    with pytest.raises(ValueError, match="--profile: the window starts at step 100"):  # main: one line, exit 2
        parse_args(["default", "--max_steps", "30", "--profile"])  # the window starts at step 100
    out_dir = tmp_path / "cut"
    assert (
        run(
            "--max_steps",
            "6",
            "--num_traj_frames",
            "0",
            "--profile",
            "--profile_start_step",
            "4",
            "--profile_num_steps",
            "5",
            "--result_dir",
            str(out_dir),
        )
        == 0
    )
    summary = json.loads((out_dir / "profile" / "summary_rank0.json").read_text())
    assert summary["steps"] == 2
    assert "--profile: the window covers steps 4-5, 2 of --profile_num_steps 5" in capsys.readouterr().err
