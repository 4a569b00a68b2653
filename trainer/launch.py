"""How processes start and find each other, and the :class:`DistContext` passed to everything.

Launch modes, first match wins:

* torchrun (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``);
* OpenMPI's mpirun (``OMPI_COMM_WORLD_SIZE``/``_RANK``/``_LOCAL_RANK``; ``MASTER_ADDR`` and
  ``MASTER_PORT`` must be exported, e.g. ``mpirun -x MASTER_ADDR=host0 -x MASTER_PORT=29500``);
* SLURM's srun (``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``; ``MASTER_ADDR``/``_PORT``);
* otherwise this process spawns one worker per visible GPU (``torch.cuda.device_count()``, which
  honours ``CUDA_VISIBLE_DEVICES`` on NVIDIA and ``HIP_VISIBLE_DEVICES``/``ROCR_VISIBLE_DEVICES`` on
  ROCm), or ``--nproc_per_node`` CPU workers over gloo, or runs in-process when that is one.

Each worker sets its device *before* creating the process group and passes it as the group's
device (a group created before ``set_device`` gave an illegal memory access on two H200s). The
backend is ``nccl`` on GPUs (RCCL answers to that name on ROCm) and ``gloo`` on CPUs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import faulthandler
import logging
import math
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, NoReturn, Optional

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .log import get_logger, set_rank

log = get_logger(__name__)


DIST_TIMEOUT_S = 1800.0  # default --dist_timeout_s: rank 0 alone scores and writes evaluation images
STOP_GRACE_S = 120.0  # after SIGTERM, what ranks get to checkpoint before SIGKILL (SLURM's TERM@120)
# W > 1: the longest a stop request waits for the ranks' next agreement, when steps are shorter
# (StopRequest.schedule): well inside this launcher's grace and torchrun's 30 s
STOP_AGREE_BUDGET_S = 10.0


@dataclass
class CommStats:
    """Collectives issued and bytes this rank sent/received to/from peers, since the last reset."""

    calls: Counter = field(default_factory=Counter)
    bytes_sent: Counter = field(default_factory=Counter)
    bytes_recv: Counter = field(default_factory=Counter)
    phase: str = "forward"

    def record(self, op: str, sent: int, recv: int) -> None:
        key = f"{self.phase}/{op}"
        self.calls[key] += 1
        self.bytes_sent[key] += int(sent)
        self.bytes_recv[key] += int(recv)

    def reset(self) -> dict:
        """Return {"calls", "bytes_sent", "bytes_recv"} (each {phase/op: n}) and start afresh."""
        out = dict(calls=dict(self.calls), bytes_sent=dict(self.bytes_sent), bytes_recv=dict(self.bytes_recv))
        self.calls.clear()
        self.bytes_sent.clear()
        self.bytes_recv.clear()
        return out


@dataclass(frozen=True)
class DistContext:
    """Who this process is in the job. Passed explicitly; there is no global state. Frozen: what
    a pass does differently (e.g. --sparse_grad_comm) is an argument of that pass, not a field set
    here; ``stats`` and ``stop`` are the rank's own mutable records."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    backend: str = "none"  # "nccl", "gloo" or "none" (one process, no group)
    group: Any = None
    stats: CommStats = field(default_factory=CommStats)
    stop: "StopRequest" = field(default_factory=lambda: StopRequest())
    loopback: bool = False  # one process over a real group of one rank (--loopback, :func:`loopback_group`)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """Whether this process takes the distributed path: every collective issued and every
        record routed through the exchange (world_size > 1, or ``loopback`` at world size 1);
        else the exchange's identity shortcuts of one process."""
        return self.world_size > 1 or self.loopback

    @property
    def comm_device(self) -> torch.device:
        """Where collective buffers live: the GPU for nccl, the CPU for gloo."""
        return self.device


class LaunchError(RuntimeError):
    """The launch environment is incomplete (message names the missing variables)."""


class Interrupted(BaseException):
    """SIGTERM or SIGINT arrived (:func:`interruptible`). A BaseException, as KeyboardInterrupt,
    so that no ``except Exception`` on the way out swallows it."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)

    @property
    def exit_code(self) -> int:
        """128 + the signal number, the shell's convention: 130 for SIGINT, 143 for SIGTERM."""
        return 128 + self.signum


@dataclass
class StopRequest:
    """A SIGTERM or SIGINT the training loop answers at its next step boundary (every rank agrees
    on the step, writes its checkpoint, then ends with :class:`Interrupted`) rather than at once:
    SLURM's preemption warning (``--signal=TERM@120``), a launcher's SIGTERM and a user's Ctrl-C
    leave a checkpoint to resume from. ``deferring`` is set while the loop can answer
    (:meth:`deferred`); ``signum`` is the request (0: none; the first signal's). Per process,
    passed in the DistContext: no global state.

    ``announce``: this process says, on stderr, that it got the request (the one process that
    speaks for the job: an in-process run, rank 0 under an external launcher; spawned ranks leave
    it to their launcher). ``abort_on_repeat``: a second SIGINT ends the process at once (a user's
    second Ctrl-C; off where a launcher forwards the SIGINT its ranks also received, as torchrun
    does).

    With W > 1 the ranks agree on a request only at some step boundaries (a collective each
    time): :meth:`check_due` says whether ``done`` is one, :meth:`seconds_per_step` what this rank
    measured since the last, and :meth:`schedule` sets the next from the ranks' slowest figure,
    so that a request waits at most about STOP_AGREE_BUDGET_S (or one step, when a step is longer)."""

    deferring: bool = False
    signum: int = 0
    announce: bool = False
    abort_on_repeat: bool = False
    next_check: int = 0  # the step boundary of the next agreement (0: the first boundary of the loop)
    checked_step: Optional[int] = None  # the boundary of the previous agreement (None: the loop's start)
    checked_at: float = 0.0  # time.monotonic() then

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        self.deferring = True
        self.next_check, self.checked_step, self.checked_at = 0, None, time.monotonic()
        try:
            yield
        finally:
            self.deferring = False

    def check_due(self, done: int) -> bool:
        """Whether the ranks agree at the boundary after ``done`` steps (every rank answers alike)."""
        return done >= self.next_check

    def seconds_per_step(self, done: int) -> float:
        """Seconds per step on this rank since the previous agreement (the loop's first boundary:
        since the loop started, one step), all that ran between them included."""
        steps = 1 if self.checked_step is None else max(done - self.checked_step, 1)
        return (time.monotonic() - self.checked_at) / steps

    def schedule(self, done: int, step_s: float, most: int) -> int:
        """After an agreement at ``done`` on the ranks' slowest ``step_s`` seconds per step: the
        next comes clamp(floor(STOP_AGREE_BUDGET_S / step_s), 1, most) steps later. Every rank
        computes it from the same numbers, so every rank calls the next collective at the same
        step. Returns that step."""
        gap = most if step_s <= 0 else min(most, max(1, math.floor(STOP_AGREE_BUDGET_S / step_s)))
        self.next_check, self.checked_step, self.checked_at = done + gap, done, time.monotonic()
        return self.next_check


def _write_stderr(line: str) -> None:
    """``line`` on stderr from a signal handler: straight to the file descriptor, as the handler
    may run while the main thread is inside a write to sys.stderr (a buffered write re-entered raises)."""
    try:
        os.write(2, f"\n{line}\n".encode())
    except OSError:  # pragma: no cover - stderr closed
        pass


@contextlib.contextmanager
def interruptible(stop: Optional[StopRequest] = None) -> Iterator[None]:
    """Within this block SIGTERM and SIGINT raise :class:`Interrupted` in the main thread, so a run
    ends through its own exception handling: one line, the spawned ranks stopped. The handlers
    replace native ones installed at import (pycolmap's glog prints a native stack trace on
    SIGTERM), so enter the block after the imports. A second signal meanwhile takes the default
    action (ends the process at once). While ``stop`` is deferring, either signal only records the
    request (repeats too: a launcher forwards the signal its ranks also received), except a second
    SIGINT where ``stop.abort_on_repeat``, which raises at once. The previous handlers are
    restored on exit; outside the main thread this does nothing."""
    previous: dict = {}

    def handler(signum, frame):
        if stop is not None and stop.deferring:
            repeat = signum == signal.SIGINT and stop.abort_on_repeat and stop.signum == signal.SIGINT
            if not repeat:
                if stop.announce and not stop.signum:
                    name = signal.Signals(signum).name
                    again = (
                        " (Ctrl-C again stops at once, without one)"
                        if stop.abort_on_repeat and signum == signal.SIGINT
                        else ""
                    )
                    _write_stderr(f"{name}: writing a checkpoint at the next step boundary, then stopping{again}")
                stop.signum = stop.signum or int(signum)
                return
        for sig in previous:
            signal.signal(sig, signal.SIG_DFL)
        raise Interrupted(signum)

    try:
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, handler)
    except ValueError:  # not the main thread
        pass
    try:
        yield
    finally:
        for sig, old in previous.items():  # None: a native handler, which Python cannot reinstall
            signal.signal(sig, old if old is not None else signal.SIG_DFL)


def _require(env: dict, names: list[str], launcher: str) -> None:
    missing = [n for n in names if not env.get(n)]
    if missing:
        raise LaunchError(
            f"{launcher} launch detected, but {', '.join(missing)} not set: export "
            f"{' and '.join(missing)} (the address and a free port of rank 0's host), e.g. "
            "`mpirun -x MASTER_ADDR=$(hostname) -x MASTER_PORT=29500 ...`"
        )


def first_slurm_host(nodelist: str) -> str:
    """The first host of a SLURM hostlist: "gpu[03-05,09],login1" -> "gpu03" (zero padding kept),
    "node7" -> "node7". Raises LaunchError on an empty or malformed list."""
    item, depth = "", 0
    for ch in nodelist.strip():  # the first comma-separated item outside brackets
        if ch == "," and depth == 0:
            break
        depth += (ch == "[") - (ch == "]")
        item += ch
    if not item or depth != 0:
        raise LaunchError(f"cannot read the first host of SLURM's node list {nodelist!r}")
    while "[" in item:  # each bracket group: its first number (or name), padding kept
        head, _, rest = item.partition("[")
        group, _, tail = rest.partition("]")
        first = group.split(",")[0].split("-")[0]
        if not first:
            raise LaunchError(f"cannot read the first host of SLURM's node list {nodelist!r}")
        item = head + first + tail
    return item


def slurm_batch_without_srun(env: "Optional[Mapping[str, str]]" = None) -> bool:
    """True in an sbatch script's own process, which SLURM gives SLURM_PROCID=0 and the job's
    SLURM_NTASKS without starting the tasks: only srun's task processes carry a step id
    (SLURM_STEP_ID / SLURM_STEPID)."""
    env = os.environ if env is None else env
    return "SLURM_PROCID" in env and not (env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID"))


def detect_external(env: Optional[dict] = None) -> Optional[dict]:
    """Rank layout set by an external launcher, or None when this process should spawn its own.

    torchrun (RANK, WORLD_SIZE, LOCAL_RANK), OpenMPI (OMPI_COMM_WORLD_*), MPICH and Intel MPI
    (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID), srun (SLURM_PROCID, SLURM_STEP_NUM_TASKS or
    SLURM_NTASKS, SLURM_LOCALID; not an sbatch script's own process, see
    :func:`slurm_batch_without_srun`). Under srun MASTER_ADDR defaults to the first host of
    SLURM_STEP_NODELIST / SLURM_JOB_NODELIST and MASTER_PORT to 20000 + SLURM_JOB_ID mod 20000.
    Returns {"rank", "world_size", "local_rank", "master_addr", "master_port", "launcher"}.
    Raises LaunchError naming what is missing when a launcher is detected without a rendezvous.
    """
    env = dict(os.environ if env is None else env)
    if "RANK" in env and "WORLD_SIZE" in env:
        layout: dict[str, Any] = dict(
            rank=int(env["RANK"]),
            world_size=int(env["WORLD_SIZE"]),
            local_rank=int(env.get("LOCAL_RANK", 0)),
            launcher="torchrun",
        )
    elif "OMPI_COMM_WORLD_SIZE" in env:
        layout = dict(
            rank=int(env["OMPI_COMM_WORLD_RANK"]),
            world_size=int(env["OMPI_COMM_WORLD_SIZE"]),
            local_rank=int(env.get("OMPI_COMM_WORLD_LOCAL_RANK", 0)),
            launcher="mpirun",
        )
    elif "PMI_RANK" in env and "PMI_SIZE" in env:
        layout = dict(
            rank=int(env["PMI_RANK"]),
            world_size=int(env["PMI_SIZE"]),
            local_rank=int(env.get("MPI_LOCALRANKID", env.get("PMI_LOCAL_RANK", 0))),
            launcher="mpiexec (MPICH / Intel MPI)",
        )
    elif "SLURM_PROCID" in env and not slurm_batch_without_srun(env):
        tasks = int(env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS", "1"))
        if tasks <= 1:
            return None
        layout = dict(
            rank=int(env["SLURM_PROCID"]),
            world_size=tasks,
            local_rank=int(env.get("SLURM_LOCALID", 0)),
            launcher="srun",
        )
        nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        if not env.get("MASTER_ADDR") and nodes:
            env["MASTER_ADDR"] = first_slurm_host(nodes)
        if not env.get("MASTER_PORT") and env.get("SLURM_JOB_ID", "").isdigit():
            env["MASTER_PORT"] = str(20000 + int(env["SLURM_JOB_ID"]) % 20000)
    else:
        return None
    _require(env, ["MASTER_ADDR", "MASTER_PORT"], layout["launcher"])
    layout.update(master_addr=env["MASTER_ADDR"], master_port=int(env["MASTER_PORT"]))
    return layout


def local_processes_of_launcher(env: "Optional[Mapping[str, str]]" = None) -> int:
    """Processes an external launcher started on this host: torchrun's LOCAL_WORLD_SIZE, OpenMPI's
    OMPI_COMM_WORLD_LOCAL_SIZE, MPICH / Intel MPI's MPI_LOCALNRANKS, SLURM's
    SLURM_STEP_TASKS_PER_NODE or SLURM_NTASKS_PER_NODE (the leading number); 1 when none says."""
    env = os.environ if env is None else env
    for name in (
        "LOCAL_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "MPI_LOCALNRANKS",
        "SLURM_STEP_TASKS_PER_NODE",
        "SLURM_NTASKS_PER_NODE",
    ):
        value = env.get(name, "")
        digits = value[: len(value) - len(value.lstrip("0123456789"))] if value else ""
        if digits:
            return max(1, int(digits))
    return 1


def pick_device(local_rank: int, device: str) -> torch.device:
    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise LaunchError("--device cuda: no CUDA/ROCm device is visible")
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def init_context(
    rank: int,
    world_size: int,
    local_rank: int,
    device: str,
    store: Any = None,
    timeout_s: float = DIST_TIMEOUT_S,
    stop: Optional[StopRequest] = None,
) -> DistContext:
    """Set the device first, then create the process group bound to it (world_size > 1), whose
    collectives give up after ``timeout_s`` seconds (``--dist_timeout_s``)."""
    set_rank(rank)  # on this process's diagnostics (log.py)
    dev = pick_device(local_rank, device)
    stop = stop if stop is not None else StopRequest()
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if world_size == 1:
        return DistContext(device=dev, stop=stop)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    kwargs: dict[str, Any] = dict(
        backend=backend, rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s)
    )
    if store is not None:
        kwargs["store"] = store
    else:
        kwargs["init_method"] = "env://"
    if dev.type == "cuda":
        kwargs["device_id"] = dev
    dist.init_process_group(**kwargs)
    return DistContext(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        device=dev,
        backend=backend,
        group=dist.group.WORLD,
        stop=stop,
    )


@contextlib.contextmanager
def loopback_group(ctx: DistContext, enabled: bool = True) -> Iterator[DistContext]:
    """``--loopback``: ``ctx`` (one process, no group) as a rank of a real process group of one
    rank (NCCL on a GPU, gloo on the CPU, over an in-process HashStore: no port, no file), with
    ``loopback`` set, so that the step takes the distributed path (:attr:`DistContext.distributed`:
    every collective issued, every record and gradient through the all_to_alls) with no peer to
    wait for: a benchmarking and testing mode of that path. The group is destroyed on exit.
    ``enabled`` False yields ``ctx`` unchanged. Raises ValueError for a context of several ranks
    or a process that already has a process group."""
    if not enabled:
        yield ctx
        return
    if ctx.world_size > 1:
        raise ValueError(f"--loopback runs one process over a group of one rank; this run has {ctx.world_size} ranks")
    if dist.is_initialized():
        raise ValueError("--loopback: this process already has a process group")
    backend = "nccl" if ctx.device.type == "cuda" else "gloo"
    kwargs: dict[str, Any] = dict(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
    if ctx.device.type == "cuda":  # NCCL binds the group to one device, named with its index
        index = ctx.device.index if ctx.device.index is not None else torch.cuda.current_device()
        kwargs["device_id"] = torch.device("cuda", index)
    dist.init_process_group(**kwargs)
    try:
        yield dataclasses.replace(ctx, backend=backend, group=dist.group.WORLD, loopback=True)
    finally:
        dist.destroy_process_group()


def _free_store(world_size: int, attempts: int = 5):
    """A TCPStore master on a free local port (port 0: the OS picks one that is free, so the
    rendezvous cannot collide; retried if the bind fails anyway)."""
    last = None
    for _ in range(attempts):
        try:
            return dist.TCPStore(
                "127.0.0.1",
                0,
                world_size + 1,
                is_master=True,
                wait_for_workers=False,
                timeout=datetime.timedelta(seconds=600),
            )
        except (RuntimeError, OSError) as e:  # pragma: no cover - depends on the host
            last = e
    raise LaunchError(f"could not open a rendezvous port on 127.0.0.1: {last}")


def _worker(
    local_rank: int, world_size: int, port: int, device: str, fn: Callable, args: tuple, timeout_s: float = 600.0
) -> None:
    if hasattr(signal, "SIGUSR1"):  # `kill -USR1 <pid>` prints where this rank is (all threads)
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    share_cpu_threads(world_size)
    # tqdm's default lock is a multiprocessing RLock, a named semaphore that a rank ending with
    # os._exit never releases: the launcher's resource tracker then warns of "leaked semaphore
    # objects" after every run. Only rank 0 draws a progress bar; a thread lock is enough.
    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())
    code = 0
    try:
        stop = StopRequest()
        with interruptible(stop):
            store = dist.TCPStore(
                "127.0.0.1", port, world_size + 1, is_master=False, timeout=datetime.timedelta(seconds=timeout_s)
            )
            ctx = init_context(local_rank, world_size, local_rank, device, store=store, timeout_s=timeout_s, stop=stop)
            fn(ctx, *args)
    except Interrupted as e:  # the launcher stops the ranks with SIGTERM and says so itself
        code = e.exit_code
    except KeyboardInterrupt:  # Ctrl-C before the handlers were in place
        code = 128 + signal.SIGINT
    except (ValueError, LaunchError) as e:
        log.error(f"error (rank {local_rank}): {e}")
        code = 2
    except BaseException as e:
        if _in_collective(e):  # a peer ended: the launcher names it and how; no traceback here
            reason = (str(e).strip().splitlines() or [""])[0]
            if (
                reason.startswith("[") and "] " in reason
            ):  # gloo's "[<source file>:<line>] Read error ...: ...peer. This is ..."
                reason = reason.split("] ", 1)[1].split(". ", 1)[0]
            reason = reason[:300]
            log.error(f"error (rank {local_rank}): a collective failed, most likely as another rank ended ({reason})")
        else:
            log.error(f"rank {local_rank} failed:\n{traceback.format_exc()}")
        code = 1
    if code:
        # Exit at once: destroying the group would wait for peers blocked in a collective (NCCL
        # waits until its timeout); the launcher terminates the surviving ranks when one exits.
        sys.stderr.flush()
        os._exit(code)
    end_rank()


def _in_collective(error: BaseException) -> bool:
    """Whether ``error`` was raised inside torch.distributed (a collective whose peer went away:
    gloo's "Connection reset by peer", NCCL's watchdog ...), by the innermost frame of its traceback."""
    frames = traceback.extract_tb(error.__traceback__)
    return (
        isinstance(error, RuntimeError)
        and bool(frames)
        and "torch/distributed/" in frames[-1].filename.replace("\\", "/")
    )


def cpu_cores() -> int:
    """The CPU cores this process may run on: its affinity mask (taskset, cgroup cpusets, SLURM's
    binding), else os.cpu_count()."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def share_cpu_threads(local_processes: int) -> int:
    """Give this process ``cpu_cores() // local_processes`` CPU threads (at least 1) for torch's
    intra-op pool and OpenCV, and return that number: ranks on one host share its cores, and each
    library's default of one thread per core oversubscribes them (torchrun sets
    OMP_NUM_THREADS=1 for the same reason, but only for several processes of one of its "nodes").
    An OMP_NUM_THREADS the user exported wins."""
    if os.environ.get("OMP_NUM_THREADS"):
        threads = max(1, int(os.environ["OMP_NUM_THREADS"]))
    else:
        threads = max(1, cpu_cores() // max(1, local_processes))
    torch.set_num_threads(threads)
    try:
        import cv2

        cv2.setNumThreads(threads)
    except ImportError:  # pragma: no cover - opencv is a dependency
        pass
    return threads


def ranks_sharing_cores(ctx: DistContext) -> int:
    """The ranks of the job (this one included) on this host that run on this rank's CPU cores:
    one all_gather_object of (host name, affinity mask). Ranks an external launcher started as
    separate "nodes" of one host (two torchrun calls, say) each see LOCAL_WORLD_SIZE 1, yet share
    the cores; ranks that SLURM bound to cores of their own do not."""
    try:
        mask = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        mask = []
    mine = (socket.gethostname(), mask)
    everyone: list = [None] * ctx.world_size
    dist.all_gather_object(everyone, mine, group=ctx.group)
    return max(1, sum(1 for other in everyone if other == mine))


def end_rank() -> NoReturn:
    """End a rank of a multi-process run that succeeded: barrier, destroy the group, exit 0.

    The process ends with ``os._exit`` after flushing, not by returning to the interpreter: gloo's
    worker threads can still hold the last collective's tensors (``gather_object`` returns on a
    sender before the thread drops its work item), and when they release them while Python
    finalizes, the thread needs the GIL that finalization has taken away and the process aborts
    ("terminate called without an active exception", seen on CI). Every file a run writes is
    closed before this point (checkpoints and PLYs are atomic renames; the TensorBoard writer is
    closed by the trainer). The barrier keeps a rank from leaving while a peer still needs it.
    """
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def num_local_processes(nproc_per_node: int, device: str) -> int:
    """0 means one per visible GPU, or one on a CPU-only host."""
    if nproc_per_node > 0:
        return nproc_per_node
    if device != "cpu" and torch.cuda.is_available():
        return torch.cuda.device_count()
    return 1


def launch(
    fn: Callable[..., None],
    args: tuple,
    nproc_per_node: int = 0,
    device: str = "auto",
    timeout_s: Optional[float] = None,
    dist_timeout_s: float = DIST_TIMEOUT_S,
) -> int:
    """Run ``fn(ctx, *args)`` on every rank; return the exit code (0 when every rank succeeded).

    A failure on one rank ends the others within a bounded time (spawn terminates the survivors;
    external launchers do the same), with that rank's error printed on stderr. Under an external
    launcher (torchrun, mpirun, srun) with more than one rank, a successful rank ends its process
    here (``end_rank``); with one process the call returns 0 and the process goes on.

    ``timeout_s`` (spawned ranks only): a run still going after that many seconds has each rank
    that got as far as ``_worker`` print its Python stack (SIGUSR1, all threads), is then
    terminated, and the call returns :data:`TIMED_OUT`. A one-process run (in this process) is not
    bounded. ``dist_timeout_s``: how long a collective (and the rendezvous) waits for a peer.

    SIGTERM or SIGINT to this launcher is passed on to its ranks (as SIGTERM), which write a
    checkpoint at their next step boundary when training (StopRequest); they get STOP_GRACE_S
    seconds before SIGKILL, and one line says so (:func:`_stop_ranks`). A rank that dies (a
    signal) or fails ends the others, with one line naming it (:func:`_report_exit`).
    """
    external = detect_external()
    if external is not None:
        os.environ.setdefault("MASTER_ADDR", external["master_addr"])
        os.environ.setdefault("MASTER_PORT", str(external["master_port"]))
        ctx = init_context(
            external["rank"],
            external["world_size"],
            external["local_rank"],
            device,
            timeout_s=dist_timeout_s,
            stop=StopRequest(announce=external["rank"] == 0),
        )
        if ctx.world_size > 1:
            share_cpu_threads(max(local_processes_of_launcher(), ranks_sharing_cores(ctx)))
        fn(ctx, *args)
        if ctx.world_size > 1:
            del ctx
            end_rank()
        return 0
    if slurm_batch_without_srun() and int(os.environ.get("SLURM_NTASKS", "1") or 1) > 1:
        log.warning(
            f"note: SLURM batch script without srun (SLURM_NTASKS={os.environ['SLURM_NTASKS']}): this "
            "process starts the ranks of this node itself (one per visible GPU, or --nproc_per_node); to run "
            "on several nodes, start splat-train with srun"
        )
    nproc = num_local_processes(nproc_per_node, device)
    if nproc > 1 and device != "cpu" and torch.cuda.is_available() and nproc > torch.cuda.device_count():
        raise LaunchError(f"--nproc_per_node {nproc} exceeds the {torch.cuda.device_count()} visible GPUs")
    if nproc == 1:
        stop = StopRequest(announce=True, abort_on_repeat=True)  # the user's own process: a 2nd Ctrl-C aborts
        fn(init_context(0, 1, 0, device, timeout_s=dist_timeout_s, stop=stop), *args)
        return 0
    store = _free_store(nproc)
    # its "Terminating process <pid> via signal SIGTERM" when one rank fails: _report_exit says which rank ended and how
    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    procs = None
    try:
        with interruptible():
            procs = mp.start_processes(
                _worker,
                args=(nproc, store.port, device, fn, args, dist_timeout_s),
                nprocs=nproc,
                join=False,
                start_method="spawn",
            )
            while not procs.join(timeout=1.0):
                if deadline is not None and time.monotonic() > deadline:
                    if procs.join(timeout=0):  # every rank ended just now: not a timeout
                        break
                    _stop_hung(procs.processes, float(timeout_s or 0))
                    return TIMED_OUT
    except Interrupted as e:  # stop the ranks (a training rank checkpoints first), then let the caller say so
        if procs is not None:
            _stop_ranks(procs.processes, e.signum, STOP_GRACE_S)
        raise
    except mp.ProcessExitedException as e:
        return _report_exit(e)
    except mp.ProcessRaisedException as e:  # pragma: no cover - _worker catches everything
        log.error(str(e))
        return 1
    return 0


TIMED_OUT = 124  # launch()'s exit code for a run stopped at its timeout (as coreutils' timeout)


def _stop_hung(processes: list, timeout_s: float, grace_s: float = 10.0) -> None:
    """Have every live rank print its stack, then terminate them all (SIGTERM, then SIGKILL),
    within about ``2 + 2 * grace_s`` seconds whatever the ranks do. A rank still starting up
    (before ``_worker`` registered its handler) ends on SIGUSR1 without a stack."""
    log.error(
        f"error: the ranks were still running after {timeout_s:g} s; their stacks follow, then they are terminated"
    )
    live = [p for p in processes if p.is_alive()]
    if hasattr(signal, "SIGUSR1"):
        _signal_all(live, signal.SIGUSR1)
        time.sleep(2.0)  # faulthandler writes from a signal handler: give it a moment
    _terminate(live, grace_s)


def _signal_all(processes: list, sig) -> None:
    for p in processes:
        try:
            os.kill(p.pid, sig)
        except ProcessLookupError:  # ended meanwhile
            pass


def _ranks(indices: list) -> str:
    """ "rank 1", "ranks 0, 1"."""
    return ("rank " if len(indices) == 1 else "ranks ") + ", ".join(map(str, indices))


def _report_exit(e: "mp.ProcessExitedException") -> int:
    """One line naming the rank whose end ended the run and how (a signal: its number and name,
    and for SIGKILL where one usually comes from), after the launcher stopped the others. Returns
    the launch's exit code: 128 + the signal, or the rank's exit code."""
    code = int(e.exit_code or 1)
    if code < 0:
        name = e.signal_name or f"signal {-code}"
        hint = (
            ", sent from outside the run: the out-of-memory killer sends it when host memory runs out (dmesg names it)"
            if -code == getattr(signal, "SIGKILL", 9)
            else ""
        )
        log.error(f"\nerror: rank {e.error_index} died (signal {-code}, {name}{hint}); the other ranks were stopped")
        return 128 - code
    log.error(f"\nerror: rank {e.error_index} ended with exit code {code}; the other ranks were stopped")
    return code


def _stop_ranks(processes: list, signum: int, grace_s: float) -> None:
    """The launcher's answer to SIGTERM or SIGINT: one line saying what the ranks do and how long
    they have, SIGTERM to every live rank (a training rank writes its checkpoint at its next step
    boundary, then ends), then SIGKILL to those still running after ``grace_s`` seconds, or at
    once on a second SIGINT (a user's second Ctrl-C); one line names the ranks killed. A repeated
    SIGTERM meanwhile is ignored (SLURM and launchers signal every process of a job)."""
    name = signal.Signals(signum).name
    live = [i for i, p in enumerate(processes) if p.is_alive()]
    again = "; Ctrl-C again kills them at once" if signum == signal.SIGINT else ""
    log.warning(  # on a line of its own: rank 0's progress bar may be mid-line on the same terminal
        f"\n{name}: {_ranks(live)} write a checkpoint at the next step boundary, then end; a rank still running "
        f"{grace_s:g} s from now is killed (SIGKILL){again}"
    )
    try:
        previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    except ValueError:  # not the main thread
        previous = None
    try:
        killed = _terminate(processes, grace_s)
        if killed:
            log.warning(
                f"\nwarning: {_ranks(killed)} still running {grace_s:g} s after {name}: killed (SIGKILL); their "
                "checkpoint of this stop may be missing (the newest complete set is resumed)"
            )
    except KeyboardInterrupt:
        killed = [i for i, p in enumerate(processes) if p.is_alive()]
        _signal_all([processes[i] for i in killed], getattr(signal, "SIGKILL", signal.SIGTERM))
        log.warning(f"\nSIGINT again: {_ranks(killed)} killed (SIGKILL) without waiting for their checkpoint")
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _terminate(processes: list, grace_s: float = 10.0) -> list[int]:
    """End the live ``processes``: SIGTERM, then SIGKILL those still alive after ``grace_s``
    seconds (a rank blocked in a collective runs no Python signal handler until it returns).
    Returns the indices in ``processes`` of those that needed SIGKILL."""
    live = [p for p in processes if p.is_alive()]

    def join_all(seconds: float) -> list:
        until = time.monotonic() + seconds
        for p in live:
            p.join(max(0.0, until - time.monotonic()))
        return [p for p in live if p.is_alive()]

    _signal_all(live, signal.SIGTERM)
    late = join_all(grace_s)
    if late:
        _signal_all(late, getattr(signal, "SIGKILL", signal.SIGTERM))
        stuck = join_all(grace_s)
        if stuck:
            log.warning(
                f"warning: rank processes {[p.pid for p in stuck]} did not end on SIGKILL (stuck in the "
                "kernel or a driver call)"
            )
    return [i for i, p in enumerate(processes) if p in late]


def free_port() -> int:
    """A currently free TCP port on localhost (for tests and scripts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
