"""Triton compilations of the SH degrees a run reaches later, made in the background.

The projection kernels (kernels/projection.py) are compiled once per SH degree, and a run raises its
degree every ``--sh_degree_interval`` steps: on a fresh machine (an empty Triton cache) each new
degree stopped the training thread for the forward's and the backward's compilation, seconds each,
inside the step that first used it. When a kernel is first launched at degree d, :func:`ahead`
queues the same launch at the degrees above d, up to the pass's stored SH bases, for a few daemon
threads that compile them with Triton's ``warmup`` (compile, keep in Triton's in-memory and on-disk
caches, no launch): the argument tensors are replaced by their dtypes (Triton's mock tensors,
16-byte aligned), so the threads hold no device memory and make no CUDA call that could disturb a
graph capture on the training thread. Triton's compiler releases the interpreter lock for most of
its work (MLIR passes, ptxas), so the compilations overlap the steps at the lower degrees; a
launch at a degree whose compilation is still under way waits for it (:func:`settle`) rather than
compile it a second time.

At exit the compilations not yet started are dropped and those in flight finished (a thread killed
inside Triton's compiler at interpreter shutdown aborts the process). ``SPLAT_TRAIN_PREWARM=0``
turns it off. Only on a CUDA/ROCm device, never under the interpreter.
"""

from __future__ import annotations

import atexit
import itertools
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import torch

WORKERS = max(1, min(4, (os.cpu_count() or 2) // 2))  # compile threads per process (each rank has its own)
EXIT_WAIT_S = 120.0  # the longest an exiting process waits for the compilations in flight


@dataclass(order=True)
class _Job:
    priority: Any  # the constexpr's value: lowest first (-1: a worker's stop)
    order: int
    kernel: Any = field(compare=False, default=None)
    args: list = field(compare=False, default_factory=list)
    constexprs: dict = field(compare=False, default_factory=dict)
    index: int = field(compare=False, default=0)
    finished: threading.Event = field(compare=False, default_factory=threading.Event)


_queue: "queue.PriorityQueue" = queue.PriorityQueue()
_order = itertools.count()
_lock = threading.Lock()
_jobs: dict = {}  # (signature, value) -> _Job, each launch queued once
_threads: list = []
_counts = {"done": 0, "failed": 0}  # compilations finished (or failed), for tests
_pending = [0]  # jobs queued and not finished: settle() costs nothing once they are done
_asked: set = set()  # ahead()'s calls seen before, by their cheap part (launches repeat every step)


def _forget_after_fork() -> None:
    """A forked child has none of the parent's threads: it starts with an empty queue of its own
    (a job it inherited unfinished would otherwise keep settle() waiting)."""
    global _queue, _lock, _jobs, _threads, _asked
    _queue, _lock, _jobs, _threads, _asked = queue.PriorityQueue(), threading.Lock(), {}, [], set()
    _pending[0] = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def enabled(device: torch.device) -> bool:
    """Whether :func:`ahead` queues anything for launches on ``device``."""
    return (
        device.type == "cuda"
        and os.environ.get("TRITON_INTERPRET", "0") != "1"
        and os.environ.get("SPLAT_TRAIN_PREWARM", "1") != "0"
    )


def _spec(value: Any) -> Any:
    """What Triton specializes a launch argument on (for the queue's deduplication only)."""
    if isinstance(value, torch.Tensor):
        return value.dtype
    if isinstance(value, bool) or not isinstance(value, int):
        return type(value).__name__ if isinstance(value, float) else value
    return "one" if value == 1 else ("d16" if value % 16 == 0 else "int")


def _signature(kernel, args: Sequence[Any], constexprs: dict, key: str) -> tuple:
    rest = tuple(sorted((k, v) for k, v in constexprs.items() if k != key))
    return (kernel, tuple(_spec(a) for a in args), rest)  # the kernel itself: its id could be reused


def ahead(kernel, args: Sequence[Any], constexprs: dict, key: str, values: Iterable[Any], device: torch.device) -> None:
    """Queue ``kernel``'s launch with ``args`` and ``constexprs`` (launch options such as
    num_warps included) at each of ``values`` for constexpr ``key``, lowest first, unless a launch
    of the same signature was queued before. No-op where :func:`enabled` is False."""
    if not enabled(device):
        return
    values = tuple(values)
    cheap = (
        kernel,
        values,
        tuple(constexprs.items()),
        tuple(_spec(a) for a in args if not isinstance(a, torch.Tensor)),
    )
    if cheap in _asked:
        return
    _asked.add(cheap)
    mocked = [a.dtype if isinstance(a, torch.Tensor) else a for a in args]
    signature = _signature(kernel, args, constexprs, key)
    index = (
        device.index if device.index is not None else (torch.cuda.current_device() if torch.cuda.is_available() else 0)
    )
    caches = getattr(kernel, "device_caches", None)
    if caches is not None:  # Triton builds a device's cache lazily: here, not in two threads at once
        caches[index]
    with _lock:
        for value in values:
            if (signature, value) in _jobs:
                continue
            job = _Job(value, next(_order), kernel, mocked, dict(constexprs, **{key: value}), index)
            _jobs[(signature, value)] = job
            _pending[0] += 1
            _queue.put(job)
        if not _threads:
            atexit.register(_shutdown)
        while len(_threads) < WORKERS:
            thread = threading.Thread(target=_work, name=f"splat-train-prewarm-{len(_threads)}", daemon=True)
            thread.start()
            _threads.append(thread)


def settle(kernel, args: Sequence[Any], constexprs: dict, key: str, value: Any) -> None:
    """Before the training thread launches ``kernel`` at ``value``: where that launch was queued,
    wait until its compilation has finished, so that the launch finds it in Triton's cache and
    never compiles it a second time beside the worker (the second compilation to finish would
    replace the first in Triton's cache, unloading a module a captured graph may hold)."""
    if not _pending[0]:
        return
    job = _jobs.get((_signature(kernel, args, constexprs, key), value))
    if job is not None:
        job.finished.wait()


def _shutdown() -> None:
    """At exit: drop the compilations not yet started and wait for those in flight. A thread
    still inside Triton's compiler when the interpreter finalizes aborts the process (its C++
    frames cannot unwind), so an exiting run waits seconds for a compilation rather than abort."""
    while True:
        try:
            job = _queue.get_nowait()
        except queue.Empty:
            break
        with _lock:
            _pending[0] -= 1
        job.finished.set()
        _queue.task_done()
    for _ in _threads:
        _queue.put(_Job(-1, next(_order)))  # first in the queue: the worker returns
    deadline = time.monotonic() + EXIT_WAIT_S
    for thread in _threads:
        thread.join(max(0.0, deadline - time.monotonic()))


def _work() -> None:
    while True:
        job = _queue.get()
        if job.kernel is None:
            _queue.task_done()
            return
        failed = False
        try:
            if torch.cuda.is_available() and torch.cuda.current_device() != job.index:  # a rank on another device
                torch.cuda.set_device(job.index)
            job.kernel.warmup(*job.args, grid=(1,), **job.constexprs)
        except Exception:  # the training thread compiles it then, and says why if it fails there too
            failed = True
        finally:
            with _lock:
                _counts["done"] += 1
                _counts["failed"] += failed
                _pending[0] -= 1
            job.finished.set()
            _queue.task_done()


def wait() -> None:
    """Block until every queued compilation has finished (tests, benchmarks)."""
    _queue.join()


def stats() -> dict:
    """{queued, done, failed} compilations of this process."""
    with _lock:
        return dict(queued=len(_jobs), **_counts)
