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
degree reached before its compilation finished compiles on the training thread as before.

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
from typing import Any, Iterable, Sequence

import torch

WORKERS = 2  # compile threads per process (ranks on one host each have theirs)

_queue: "queue.PriorityQueue" = queue.PriorityQueue()
_order = itertools.count()
_lock = threading.Lock()
_queued: set = set()  # keys of the launches queued once
_threads: list = []
_done = 0  # compilations finished (or failed), for tests
_failed = 0
EXIT_WAIT_S = 120.0  # the longest an exiting process waits for the compilations in flight


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


def ahead(kernel, args: Sequence[Any], constexprs: dict, key: str, values: Iterable[Any], device: torch.device) -> None:
    """Queue ``kernel``'s launch with ``args`` and ``constexprs`` (launch options such as
    num_warps included) at each of ``values`` for constexpr ``key``, lowest first, unless a launch
    of the same signature was queued before. No-op where :func:`enabled` is False."""
    if not enabled(device):
        return
    mocked = [a.dtype if isinstance(a, torch.Tensor) else a for a in args]
    signature = (
        id(kernel),
        tuple(_spec(a) for a in args),
        tuple(sorted((k, v) for k, v in constexprs.items() if k != key)),
    )
    index = (
        device.index if device.index is not None else (torch.cuda.current_device() if torch.cuda.is_available() else 0)
    )
    with _lock:
        for value in values:
            if (signature, value) in _queued:
                continue
            _queued.add((signature, value))
            _queue.put((value, next(_order), kernel, mocked, dict(constexprs, **{key: value}), index))
        if not _threads:
            atexit.register(_shutdown)
        while len(_threads) < WORKERS:
            thread = threading.Thread(target=_work, name=f"splat-train-prewarm-{len(_threads)}", daemon=True)
            thread.start()
            _threads.append(thread)


def _shutdown() -> None:
    """At exit: drop the compilations not yet started and wait for those in flight. A thread
    still inside Triton's compiler when the interpreter finalizes aborts the process (its C++
    frames cannot unwind), so an exiting run waits seconds for a compilation rather than abort."""
    while True:
        try:
            _queue.get_nowait()
        except queue.Empty:
            break
        _queue.task_done()
    for _ in _threads:
        _queue.put((-1, next(_order), None, (), {}, 0))  # first in the queue: the worker returns
    for thread in _threads:
        thread.join(EXIT_WAIT_S)


def _work() -> None:
    global _done, _failed
    while True:
        _, _, kernel, args, constexprs, index = _queue.get()
        if kernel is None:
            _queue.task_done()
            return
        try:
            if torch.cuda.is_available() and torch.cuda.current_device() != index:  # a rank on another device
                torch.cuda.set_device(index)
            kernel.warmup(*args, grid=(1,), **constexprs)
        except Exception:  # the training thread compiles it then, and says why if it fails there too
            _failed += 1
        finally:
            _done += 1
            _queue.task_done()


def wait() -> None:
    """Block until every queued compilation has finished (tests, benchmarks)."""
    _queue.join()


def stats() -> dict:
    """{queued, done, failed} compilations of this process."""
    return dict(queued=len(_queued), done=_done, failed=_failed)
