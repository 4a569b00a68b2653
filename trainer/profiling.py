"""Per-phase timing of a training step, for the benchmark and ``--profile``.

A step is cut into consecutive phases by :meth:`PhaseTimer.begin` calls, in data-flow order:

    projection -> forward_exchange -> rasterization -> loss -> backward_raster
    -> backward_exchange -> backward_projection -> optimizer -> densification

(a step replayed by trainer/step/graphed.py has projection -> rasterization (the tile
intersection alone) -> raster_loss_backward (its tail graph: the rasterizer, the loss and their
backward) -> backward_projection -> optimizer -> densification.)

Forward boundaries are calls in render.py / loop.py; backward boundaries fire inside autograd
through :class:`PhaseBoundary`, an identity op whose backward begins the next phase (the
gradient reaching the exchange's output ends the backward rasterization, the gradient leaving
its input ends the backward exchange). On CUDA each boundary records a CUDA event (the GPU's own
clock: ms between events, not host time) and an NVTX range (ROCm's PyTorch maps these to
roctx); on the CPU, where ops run synchronously, it reads the host clock. Each phase is also a
``torch.profiler.record_function`` range, so a ``--profile`` trace shows the phases by name.

A disabled timer (the default in training) does nothing.
"""

from __future__ import annotations

import time
from typing import Any, Optional

import torch

PHASES = (
    "projection",
    "forward_exchange",
    "rasterization",
    "loss",
    "raster_loss_backward",
    "backward_raster",
    "backward_exchange",
    "backward_projection",
    "optimizer",
    "densification",
)


class PhaseTimer:
    def __init__(self, device: torch.device, enabled: bool = False, deferred: bool = False):
        self.device, self.enabled = device, enabled
        self.cuda = enabled and device.type == "cuda"
        self.deferred = deferred  # keep the steps' CUDA events; read them all in collect()
        self._marks: list[tuple[str, object]] = []
        self._pending: list[list[tuple[str, object]]] = []
        self._range: Any = None
        self._nvtx: Optional[int] = None  # id of the open NVTX / roctx range

    def switch(self, enabled: bool, deferred: bool = False) -> None:
        """Turn the per-phase timing on or off (CUDA events on a GPU); ``deferred`` keeps the
        steps' events to read them all in :meth:`collect` instead of synchronizing each step."""
        self.enabled = enabled
        self.cuda = enabled and self.device.type == "cuda"
        self.deferred = deferred

    def _stamp(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def _close_range(self) -> None:
        if self._range is not None:
            self._range.__exit__(None, None, None)
            self._range = None
        if self._nvtx is not None:
            torch.cuda.nvtx.range_end(self._nvtx)
            self._nvtx = None

    def begin(self, phase: str) -> None:
        """End the current phase and begin ``phase``."""
        if not self.enabled:
            return
        self._close_range()
        self._marks.append((phase, self._stamp()))
        self._range = torch.profiler.record_function(phase)
        self._range.__enter__()
        if self.cuda:  # start / end by id: backward phases begin on autograd's device thread, and
            self._nvtx = torch.cuda.nvtx.range_start(phase)  # push / pop stacks are per thread

    def end_step(self) -> dict[str, float]:
        """Close the step; return {phase: ms} (phases that occurred twice add up) and the total.
        On CUDA this synchronizes the device, unless ``deferred``: then the step's events are kept
        for :meth:`collect` and {} is returned (a profiled window keeps the host ahead of the
        device, as training does)."""
        if not self.enabled:
            return {}
        self._close_range()
        self._marks.append(("end", self._stamp()))
        marks, self._marks = self._marks, []
        if self.cuda and self.deferred:
            self._pending.append(marks)
            return {}
        if self.cuda:
            torch.cuda.synchronize(self.device)
        return self._phase_ms(marks)

    def collect(self) -> list[dict[str, float]]:
        """The {phase: ms} of every step kept by a deferred timer (one synchronization). Works
        after :meth:`switch` turned the timer off: the kept steps still hold their CUDA events."""
        if self._pending and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        out = [self._phase_ms(marks) for marks in self._pending]
        self._pending.clear()
        return out

    @staticmethod
    def _phase_ms(marks: list) -> dict[str, float]:
        """{phase: ms} of one step's marks; each mark says by its type which clock stamped it (a
        CUDA event or the host's perf_counter), whatever the timer's mode is now."""
        out: dict[str, float] = {}
        for (name, a), (_, b) in zip(marks[:-1], marks[1:]):
            ms = (b - a) * 1000.0 if isinstance(a, float) else a.elapsed_time(b)
            out[name] = out.get(name, 0.0) + ms
        out["total"] = sum(out.values())
        return out


class PhaseBoundary(torch.autograd.Function):
    """Identity; in backward, begins phase ``name`` on ``timer`` (then passes the gradient on)."""

    @staticmethod
    def forward(fctx, x, timer: PhaseTimer, name: str):
        fctx.timer, fctx.name = timer, name
        return x.view_as(x)

    @staticmethod
    def backward(fctx, grad):
        fctx.timer.begin(fctx.name)
        return grad, None, None


def boundary(x: torch.Tensor, timer: Optional[PhaseTimer], name: str) -> torch.Tensor:
    """Mark ``x`` so that the backward pass begins phase ``name`` when its gradient arrives."""
    if timer is None or not timer.enabled or not x.requires_grad:
        return x
    return PhaseBoundary.apply(x, timer, name)


def memory_model(sh_degree: int, world_size: int, device: torch.device) -> dict:
    """Bytes per Gaussian and the predicted capacity.

    Parameters + Adam moments + gradients in float32: (3 + 3 + 4 + 1 + 3K) floats x 4 bytes x 4
    copies (value, grad, exp_avg, exp_avg_sq), K = (sh_degree + 1)^2 (the reference write-up's
    708 bytes at SH degree 3 count value + Adam only; the gradient adds a fourth copy while it
    lives). Capacity = 90% of the device's memory / bytes per Gaussian, per GPU and per job; the
    transient per-step buffers (projected records, tile intersections) come on top of this.
    """
    floats = 3 + 3 + 4 + 1 + 3 * (sh_degree + 1) ** 2
    per = floats * 4 * 4
    total = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
    per_gpu = int(0.9 * total / per) if total else None
    return dict(
        bytes_per_gaussian=per,
        bytes_per_gaussian_without_grad=floats * 4 * 3,
        device_memory_bytes=total,
        predicted_capacity_per_gpu=per_gpu,
        predicted_capacity_per_job=per_gpu * world_size if per_gpu else None,
    )


def stage_traffic(
    n: int,
    cameras: int,
    num_bases: int,
    sh_degree: int,
    visible: int,
    visible_records: int,
    lazy: bool = False,
    fused_adam: bool = False,
    waiting: Optional[int] = None,
    unseen_zeros: bool = True,
) -> dict:
    """Bytes model of the per-Gaussian stages of one step on kernels/projection.py's and
    kernels/adam.py's kernels, as the bench's phases name them: {"projection", "backward_projection",
    "optimizer"} -> bytes between DRAM and the chip (each once; None where the model does not
    cover the step). ``n`` Gaussians, ``cameras`` in the pass, ``num_bases`` stored SH bases,
    ``visible`` Gaussians with a radius in some camera and ``visible_records`` such (camera,
    Gaussian) pairs (render.visibility_counts); ``lazy`` (--lazy_sh_adam), ``fused_adam``
    (--fused_adam) as the step plan's; ``waiting``: with ``lazy``, how many of the visible
    Gaussians the forward caught up (kernels/adam.SeenRows.waiting; None: all of them);
    ``unseen_zeros``: with ``lazy``, whether the backward writes the unseen Gaussians' geometric
    zeros (kernels/lazy_adam.LazyRows.unseen_zeros).

    projection and backward_projection: kernels.projection.traffic. With ``lazy`` the forward also
    reads the visibility bits (4 B a Gaussian) to list the visible ones (4 B each) and reads their
    4-byte applied counts; the ``waiting`` ones are listed again (4 B written, 4 B read back), their
    count read and written (8 B), their SH rows caught up (parameter and both moments read and
    written, 24 B a coefficient), their bits and means read (16 B) and their colours written again
    (12 B a camera); the backward reads the list and the listed Gaussians' bits (8 B each) instead
    of every bit, and writes no SH gradient rows of the others (where every Gaussian is seen it
    reads the bits blockwise, as without ``lazy``); with ``unseen_zeros`` a fill writes every
    Gaussian's geometric gradient rows (44 B) before the kernel writes the seen ones, without it the
    unseen ones stay unwritten and the optimizer reads the visibility bits instead of their
    gradients (4 B a Gaussian for each of the four dense tensors: at 20 M the bits outgrow the L2).

    optimizer: 28 B per float (parameter and both moments read and written, the gradient read);
    with ``lazy`` the SH floats of the listed Gaussians only (and their list and count, 8 B each).
    With ``fused_adam`` the backward takes Adam: neither the backward nor the optimizer is
    modelled (None)."""
    from ..kernels.projection import traffic

    t = traffic(n, cameras, num_bases, sh_degree, visible, visible_records)
    sh_floats, geometry_floats = 3 * num_bases, 3 + 3 + 4 + 1
    forward, backward = t.forward, t.backward
    optimizer = 28 * (geometry_floats + sh_floats) * n
    if lazy:
        caught_up = visible if waiting is None else waiting
        forward += 4 * n + visible * (4 + 4) + caught_up * (8 + 8 + 24 * sh_floats + 16 + 12 * cameras)
        backward -= 4 * sh_floats * (n - visible)
        optimizer = 28 * geometry_floats * n + (28 * sh_floats + 8) * visible
        if visible < n:
            backward += 8 * visible - 4 * n
            if unseen_zeros:  # a fill writes every geometric row first, the kernel the seen ones again
                backward += 4 * geometry_floats * visible
            else:  # each of the four dense tensors' programs reads the bits of its rows
                backward -= 4 * geometry_floats * (n - visible)
                optimizer += 4 * 4 * n - 4 * geometry_floats * (n - visible)
    return dict(
        projection=forward,
        backward_projection=None if fused_adam else backward,
        optimizer=None if fused_adam else optimizer,
    )


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 28, repeats: int = 5) -> float:
    """The device's memory bandwidth as a copy of ``nbytes`` (five times an H100's or H200's L2
    cache) reaches it (bytes read + written, per second; the median of ``repeats`` after one
    untimed copy; CUDA events on a GPU): the floor the bench measures the per-Gaussian stages
    against. On the CPU, 1/16
    of ``nbytes``. Raises torch.OutOfMemoryError where the two buffers do not fit."""
    if device.type != "cuda":
        nbytes //= 16
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(repeats):
        if device.type == "cuda":  # CUDA events: no launch or synchronization in the time
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - t0)
    return 2 * src.numel() * 4 / sorted(times)[repeats // 2]


def profile_calls(fn, calls: int, device: torch.device, most: int = 6) -> dict:
    """Runs ``fn`` ``calls`` times under ``torch.profiler`` and says where the time went, per call.

    On a CUDA/ROCm device: the device kernels (and memcpys), by their own (self) device time, so
    an autograd node is not counted with the kernels it launched; on the CPU: the operators' self
    CPU time. Returns {"unit": "GPU kernels" | "CPU operators", "calls", "total_ms" (sum per call),
    "count" (kernel launches / operator calls per call), "top": up to ``most`` entries
    {"name", "ms", "count"}, largest first}. Raises ValueError if calls < 1.
    """
    from torch.profiler import ProfilerActivity, profile

    if calls < 1:
        raise ValueError(f"calls must be >= 1, got {calls}")
    gpu = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    with profile(activities=activities) as prof:
        for _ in range(calls):
            fn()
        if gpu:
            torch.cuda.synchronize(device)
    if gpu:
        events = [
            (e.key, e.self_device_time_total, e.count)
            for e in prof.key_averages()
            if e.device_type == torch.autograd.DeviceType.CUDA and e.self_device_time_total > 0
        ]
    else:
        events = [(e.key, e.self_cpu_time_total, e.count) for e in prof.key_averages() if e.self_cpu_time_total > 0]
    events.sort(key=lambda e: -e[1])
    return dict(
        unit="GPU kernels" if gpu else "CPU operators",
        calls=calls,
        total_ms=sum(e[1] for e in events) / calls / 1e3,
        count=sum(e[2] for e in events) / calls,
        top=[dict(name=k, ms=t / calls / 1e3, count=c / calls) for k, t, c in events[:most]],
    )


SYNC_CALLS = (
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "hipStreamSynchronize",
    "hipDeviceSynchronize",
    "hipEventSynchronize",
)
"""Runtime calls that block the host until the device catches up (a host synchronization)."""


def summarize_trace(trace: dict | list, steps: int, most: int = 12) -> dict:
    """Where a ``--profile`` window's time went, from the torch-profiler Chrome trace of ``steps``
    steps (``profile/trace_rank<r>.json``).

    Returns {"steps", "wall_ms_per_step" (first to last device event), "gpu_busy_ms_per_step"
    (the union of kernel, memcpy and memset intervals), "gpu_busy_share", "kernels_per_step",
    "memcpys_per_step", "memsets_per_step", "syncs_per_step" (:data:`SYNC_CALLS`),
    "runtime_calls_per_step" {name: n}, "top_kernels" [{"name", "ms_per_step", "count_per_step"}]}.
    A trace without device events (a CPU run) gives the step count and None elsewhere.
    Raises ValueError if steps < 1.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    spans = [e for e in events if e.get("ph") == "X"]
    device = [e for e in spans if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    runtime: dict[str, int] = {}
    for e in spans:
        if e.get("cat") == "cuda_runtime":
            runtime[e["name"]] = runtime.get(e["name"], 0) + 1
    out: dict[str, Any] = dict(
        steps=steps,
        wall_ms_per_step=None,
        gpu_busy_ms_per_step=None,
        gpu_busy_share=None,
        kernels_per_step=None,
        memcpys_per_step=None,
        memsets_per_step=None,
        syncs_per_step=sum(runtime.get(n, 0) for n in SYNC_CALLS) / steps,
        runtime_calls_per_step={k: v / steps for k, v in sorted(runtime.items(), key=lambda kv: -kv[1])},
        top_kernels=[],
    )
    if not device:
        return out
    start = min(e["ts"] for e in device)
    end = max(e["ts"] + e["dur"] for e in device)
    busy = 0.0
    current: Any = None  # the open [start, end] span
    for e in sorted(device, key=lambda e: e["ts"]):
        a, b = e["ts"], e["ts"] + e["dur"]
        if current is None or a > current[1]:
            busy += 0.0 if current is None else current[1] - current[0]
            current = [a, b]
        else:
            current[1] = max(current[1], b)
    busy += current[1] - current[0]
    by_name: dict[str, list] = {}
    for e in device:
        entry = by_name.setdefault(e["name"][:90], [0.0, 0])
        entry[0] += e["dur"]
        entry[1] += 1
    count = {cat: sum(1 for e in device if e["cat"] == cat) / steps for cat in ("kernel", "gpu_memcpy", "gpu_memset")}
    out.update(
        wall_ms_per_step=(end - start) / 1e3 / steps,
        gpu_busy_ms_per_step=busy / 1e3 / steps,
        gpu_busy_share=busy / max(end - start, 1e-9),
        kernels_per_step=count["kernel"],
        memcpys_per_step=count["gpu_memcpy"],
        memsets_per_step=count["gpu_memset"],
        top_kernels=[
            dict(name=k, ms_per_step=v[0] / 1e3 / steps, count_per_step=v[1] / steps)
            for k, v in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:most]
        ],
    )
    return out


def format_trace_summary(summary: dict) -> str:
    """The printed form of :func:`summarize_trace`: a few lines, largest kernels last."""
    if summary["wall_ms_per_step"] is None:
        return f"profile: no device events over {summary['steps']} steps (a CPU run)"
    s = summary
    calls = ", ".join(f"{k} {v:.1f}" for k, v in list(s["runtime_calls_per_step"].items())[:6])
    lines = [
        f"profile: {s['wall_ms_per_step']:.2f} ms/step (first to last device event), GPU busy "
        f"{s['gpu_busy_ms_per_step']:.2f} ms/step ({100 * s['gpu_busy_share']:.0f}%); per step "
        f"{s['kernels_per_step']:.0f} kernels, {s['memcpys_per_step']:.1f} memcpys, "
        f"{s['syncs_per_step']:.1f} host syncs",
        f"  runtime calls per step: {calls}",
        "  largest kernels (ms/step):",
    ]
    lines += [f"  {k['ms_per_step']:8.3f}  x{k['count_per_step']:.1f}  {k['name']}" for k in s["top_kernels"]]
    return "\n".join(lines)


def memory_model_line(backend: str, device: torch.device, world_size: int, num_gaussians: int, sh_degree: int) -> str:
    """The run's first line: backend, device, world size, rank 0's Gaussians and :func:`memory_model`'s
    bytes per Gaussian and predicted capacity (the benchmark checks the model against the peak)."""
    m = memory_model(sh_degree, world_size, device)
    line = (
        f"splat-train: {backend} backend on {device}, world size {world_size}, {num_gaussians:,} Gaussians on "
        f"rank 0; {m['bytes_per_gaussian']} bytes per Gaussian (params + grad + Adam, SH degree {sh_degree})"
    )
    if m["predicted_capacity_per_gpu"]:
        line += (
            f"; predicted capacity {m['predicted_capacity_per_gpu'] / 1e6:.0f} M per GPU, "
            f"{m['predicted_capacity_per_job'] / 1e6:.0f} M per job (before per-step buffers)"
        )
    return line
