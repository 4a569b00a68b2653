"""The dense record exchange of a whole-step replay on the distributed path: :class:`GraphedExchange`.

On the distributed path (W > 1, or ``--loopback``) every rank projects its N_r Gaussians for the
C_all cameras of the step, sends each rank the records of that rank's cameras, and renders its own
C cameras from the records of all N_all Gaussians (render._exchange_dense). In the dense exchange
the split sizes are Python lists fixed by the shard sizes and the camera counts, which change only
at densification and pruning steps, and no host reads device data. So both all_to_alls can be
captured in CUDA graphs (NCCL supports stream capture) and replayed each step without host work:

- forward: the head's outputs [C_all, N_r, ...] -> one payload holding, for each rank j, the
  fields of kernels.constants.RECORD_FIELDS of j's cameras one after the other (each field a
  contiguous block [C_j, N_r, w] of a head output, the int32 radii bit-cast, 12 float32 lanes per
  record in all) -> all_to_all -> each field of the received records [C, N_all, ...], joined from
  the owners' blocks in rank order;
- backward: the gradients of the received records' rasterized fields (means2d, conics,
  opacities, colors: 9 lanes; the depth lane has no gradient in a step that trains nothing but
  the photometric loss and does not travel, where the eager reverse exchange sends it as zeros),
  field after field for each owner -> the reverse all_to_all -> the head's gradient buffers
  (depths' zeroed).

Field-major blocks rather than the eager exchange's interleaved 12-lane rows: every copy on either
side moves whole contiguous runs (an interleaved pack or unpack of the narrow fields ran at a
fraction of the memory bandwidth on the H200, docs/clusters.md).

Every rank must issue the same collectives in the same order, so what communicates depends only on
what every rank knows alike: :class:`GraphedExchange` (the two collectives, with the received
records' join and the gradients' pack) owns all of its buffers and is built, warmed up and captured
for the pass layout (every rank's Gaussian and camera counts), on every rank at the same step.
What is one rank's own, the head's capture (captured again when this rank's parameters are
reallocated, or run eagerly when its capture fails), binds to it through :class:`HeadBinding`: the
pack of the head's outputs into the payload and the unpack of the returned gradients into the
head's buffers, local copies captured (or run eagerly) on their own. A collective whose capture the
backend refuses runs eagerly on the same buffers, the same bytes at the same point of the step as
the other ranks' replays; said once through ``warn``.

What it moves equals the eager exchange's values (render._exchange_dense and exchange.AllToAll's
backward), in another order: every value is a copy, so the replayed step trains as the eager one
to the rasterizer's rounding.

A captured collective's plan belongs to NCCL until its graph is destroyed, and destroying the
process group waits for it: :meth:`GraphedExchange.release` must run before the group goes
(step/forward.ForwardBackward.release, called by the Trainer, the CLI and the bench).
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from typing import Callable, Optional

import torch

from ...kernels.constants import RECORD_FIELDS
from ..exchange import _all_to_all_rows
from ..launch import DistContext
from ..render import ExchangeLayout
from .capture import Uncaptured, collector_held

RECORD_KEYS = tuple(name for name, _ in RECORD_FIELDS)  # radii, means2d, depths, conics, opacities, colors
GRAD_FIELDS = (("means2d", 2), ("conics", 3), ("opacities", 1), ("colors", 3))  # what a photometric gradient reaches
GRAD_KEYS = tuple(name for name, _ in GRAD_FIELDS)
GRAD_LANES = sum(w for _, w in GRAD_FIELDS)  # 9
RECORD_LANES = sum(w for _, w in RECORD_FIELDS)  # 12


@contextlib.contextmanager
def stats_unchanged(ctx: DistContext):
    """The rank's CommStats as they were before the block: a warm-up and a capture issue the
    collectives once each, but the step they belong to exchanges once (its replay records it)."""
    stats = ctx.stats
    saved = (copy.copy(stats.calls), copy.copy(stats.bytes_sent), copy.copy(stats.bytes_recv), stats.phase)
    try:
        yield
    finally:
        stats.calls, stats.bytes_sent, stats.bytes_recv, stats.phase = saved


def _captured_or_eager(fn: Callable, capture: Callable, what: str, warn, on_device: bool):
    """(``fn`` captured through ``capture(fn, ())``, True), or (a capture.Uncaptured of it, False)
    where the backend refuses the capture (said through ``warn``). ``fn`` has run once eagerly
    before (the caller's warm-up)."""
    try:
        if on_device:
            torch.cuda.synchronize()
        with collector_held():
            return capture(fn, ()), True
    except RuntimeError as e:  # torch.AcceleratorError is one
        line = f"--cuda_graphs: the {what} could not be captured, it runs eagerly between the replays ({str(e).splitlines()[0]})"
        (warn or warnings.warn)(line)
        return Uncaptured(fn), False


def _reset(call) -> None:
    graph = getattr(call, "graph", None)
    if graph is not None:
        graph.reset()


class GraphedExchange:
    """Both record collectives of a dense step for one pass layout, with every buffer they touch.

    ``ctx``: the rank (``ctx.distributed``); ``n_world`` / ``c_world``: every rank's Gaussian and
    camera counts (render.PassLayout; the same on every rank, so every rank builds its exchange at
    the same step); ``device``; ``capture``: capture.CapturedCall or a test's stand-in (``fn,
    inputs -> .replay()``), or None for collectives that run eagerly, uncaptured and without a
    warm-up; ``warn``: one-line warnings. The constructor runs each collective once
    (a warm-up every rank runs alike) before capturing it. Raises what the collectives raise.

    Buffers: :attr:`payload` (what :meth:`HeadBinding.pack` writes), :attr:`records` (the received
    records by name, [C, N_all, ...]: what the tail reads), :attr:`record_grads` (their gradients:
    what the tail writes), :attr:`back` (the gradients of this rank's records per renderer: what
    :meth:`HeadBinding.unpack` reads). :meth:`forward` and :meth:`backward` replay the two
    collectives; ``layout`` (render.ExchangeLayout) goes into the step's RenderInfo; ``captured``
    says, per direction, whether it replays as a graph."""

    def __init__(
        self,
        ctx: DistContext,
        n_world: list[int],
        c_world: list[int],
        device: torch.device,
        capture: Optional[Callable],
        warn: Optional[Callable[[str], None]] = None,
    ):
        self.ctx, self.n_world, self.c_world = ctx, list(n_world), list(c_world)
        self.C, self.N = c_world[ctx.rank], n_world[ctx.rank]
        C, N_all = self.C, sum(n_world)
        self.send_rows = [c * self.N for c in c_world]  # records, as render._exchange_dense sends them
        self.recv_rows = [C * n for n in n_world]
        self.layout = ExchangeLayout(False, self.N, self.n_world, self.send_rows, self.recv_rows)
        self.send_elements = [r * RECORD_LANES for r in self.send_rows]  # float32 elements per peer
        self.recv_elements = [r * RECORD_LANES for r in self.recv_rows]
        self.back_send = [r * GRAD_LANES for r in self.recv_rows]  # gradients to each owner
        self.back_recv = [r * GRAD_LANES for r in self.send_rows]
        f32 = torch.float32
        self.payload = torch.zeros(sum(self.send_elements), dtype=f32, device=device)
        self._recv = torch.zeros(sum(self.recv_elements), dtype=f32, device=device)
        self.records = {
            name: torch.zeros((C, N_all, w), dtype=torch.int32 if name == "radii" else torch.float32, device=device)
            for name, w in RECORD_FIELDS
        }
        self._record_fields = dict(self.records)  # [C, N_all, w], also for the one-lane fields
        self.records.update({name: self.records[name][..., 0] for name, w in RECORD_FIELDS if w == 1})
        self.record_grads = {name: torch.zeros((C, N_all, w), dtype=f32, device=device) for name, w in GRAD_FIELDS}
        self._grad_fields = dict(self.record_grads)
        self.record_grads["opacities"] = self.record_grads["opacities"][..., 0]
        self._rows = torch.zeros(sum(self.back_send), dtype=f32, device=device)
        self.back = torch.zeros(sum(self.back_recv), dtype=f32, device=device)
        self.captured: dict = {}
        self._calls: dict = {}
        if capture is None:  # no graphs: both collectives run eagerly on these buffers at each step
            self._calls = {"forward": Uncaptured(self._forward_fn), "backward": Uncaptured(self._backward_fn)}
            self.captured = {"forward": False, "backward": False}
            return
        try:
            for phase, fn in (("forward", self._forward_fn), ("backward", self._backward_fn)):
                with stats_unchanged(ctx):
                    ctx.stats.phase = phase
                    fn()  # the warm-up: every rank, the same collectives
                    what = f"{phase} record exchange"
                    self._calls[phase], self.captured[phase] = _captured_or_eager(
                        fn, capture, what, warn, device.type == "cuda"
                    )
        except BaseException:  # a capture made before the failure must not outlive the group
            self.release()
            raise

    def _forward_fn(self) -> tuple:
        _all_to_all_rows(
            self.ctx, self.payload[:, None], self.send_elements, self.recv_elements, out=self._recv[:, None]
        )
        # from each owner r its field blocks [C, N_r, w]; each field joined along the Gaussians
        pieces: dict = {name: [] for name, _ in RECORD_FIELDS}
        start = 0
        for n in self.n_world:
            for name, width in RECORD_FIELDS:
                block = self._recv[start : start + self.C * n * width].view(self.C, n, width)
                pieces[name].append(block.view(torch.int32) if name == "radii" else block)
                start += self.C * n * width
        for name, _ in RECORD_FIELDS:
            torch.cat(pieces[name], dim=1, out=self._record_fields[name])
        return ()  # it writes the buffers it owns (a capture's outputs: none)

    def _backward_fn(self) -> tuple:
        g, C = self._grad_fields, self.C
        # to each owner j the gradients of its Gaussians, field after field ([C, n_j, w] blocks)
        first = start = 0
        for n in self.n_world:
            for name, width in GRAD_FIELDS:
                self._rows[first : first + C * n * width].view(C, n, width).copy_(g[name][:, start : start + n])
                first += C * n * width
            start += n
        _all_to_all_rows(self.ctx, self._rows[:, None], self.back_send, self.back_recv, out=self.back[:, None])
        return ()

    def _record(self, phase: str, send: list[int], recv: list[int]) -> None:
        """The replayed all_to_all of ``send`` / ``recv`` float32 elements per peer in the rank's
        CommStats, as exchange._all_to_all_rows records it."""
        stats, me = self.ctx.stats, self.ctx.rank
        saved, stats.phase = stats.phase, phase
        stats.record("all_to_all", 4 * (sum(send) - send[me]), 4 * (sum(recv) - recv[me]))
        stats.phase = saved

    def forward(self) -> dict:
        """Replay the forward collective (:attr:`payload` -> :attr:`records`); the records by name."""
        with stats_unchanged(self.ctx):  # a replay runs no host code; an eager exchange would count itself
            self._calls["forward"].replay()
        self._record("forward", self.send_elements, self.recv_elements)
        return self.records

    def backward(self) -> None:
        """Replay the reverse collective (:attr:`record_grads` -> :attr:`back`)."""
        with stats_unchanged(self.ctx):
            self._calls["backward"].replay()
        self._record("backward", self.back_send, self.back_recv)

    def pack(self, sources: dict) -> None:
        """Write the head's outputs ``sources`` ([C_all, N_r, ...] by name) into :attr:`payload`:
        for each rank its cameras' blocks, field after field. Local: no collective."""
        blocks, first = [], 0
        for c in self.c_world:
            for name, _ in RECORD_FIELDS:
                block = sources[name][first : first + c].detach()
                blocks.append((block.view(torch.float32) if name == "radii" else block).reshape(-1))
            first += c
        torch.cat(blocks, out=self.payload)

    def unpack(self, targets: dict) -> None:
        """Write :attr:`back` into the head's gradient buffers ``targets`` ([C_all, N_r, ...] by
        name; "depths" zeroed). Local: no collective."""
        first = cam = 0
        for c in self.c_world:
            for name, width in GRAD_FIELDS:
                size = c * self.N * width
                targets[name][cam : cam + c].view(c, self.N, width).copy_(
                    self.back[first : first + size].view(c, self.N, width)
                )
                first += size
            cam += c
        if "depths" in targets:
            targets["depths"].zero_()

    def release(self) -> None:
        """Destroy the captured graphs now (before the process group goes); unusable after."""
        for call in self._calls.values():
            _reset(call)
        self._calls = {}


class HeadBinding:
    """The local half of the exchange for one head capture: its outputs ``sources`` packed into
    ``exchange``'s payload and the returned gradients unpacked into its gradient buffers
    ``targets`` (both by name), each captured through ``capture`` (or run eagerly where refused;
    they communicate nothing, so a rank may do either alone). ``means2d`` (a stride-0 view whose
    ``.grad`` is the head's gradient buffer of the local 2D means, [C_all, N_r, 2]) goes into the
    step's RenderInfo. Raises ValueError when the sources' shapes disagree with the exchange's
    counts."""

    def __init__(self, exchange: GraphedExchange, sources: dict, targets: dict, capture: Callable, warn=None):
        expected = (sum(exchange.c_world), exchange.N)
        if tuple(sources["means2d"].shape[:2]) != expected:
            raise ValueError(
                f"the head's records are {tuple(sources['means2d'].shape[:2])} (cameras, Gaussians); "
                f"the pass layout says {expected}"
            )
        self.exchange, self.sources, self.targets = exchange, sources, targets
        self.means2d = targets["means2d"].new_empty(1).expand(targets["means2d"].shape)
        self.means2d.grad = targets["means2d"]
        on_device = sources["means2d"].is_cuda
        self.calls = []
        try:
            for fn, what in ((self._pack, "records' pack"), (self._unpack, "gradients' unpack")):
                fn()
                self.calls.append(_captured_or_eager(fn, capture, what, warn, on_device)[0])
        except BaseException:
            self.release()
            raise

    def _pack(self) -> tuple:
        self.exchange.pack(self.sources)
        return ()

    def _unpack(self) -> tuple:
        self.exchange.unpack(self.targets)
        return ()

    def pack(self) -> None:
        self.calls[0].replay()

    def unpack(self) -> None:
        self.calls[1].replay()

    def release(self) -> None:
        for call in self.calls:
            _reset(call)
        self.calls = []
