"""trainer.profiling: phase ranges stay balanced when backward phases begin on another thread."""

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
