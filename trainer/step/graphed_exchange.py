"""The dense record exchange of a whole-step replay on the distributed path: :class:`GraphedExchange`.

On the distributed path (W > 1, or ``--loopback``) every rank projects its N_r Gaussians for the
C_all cameras of the step, sends each rank the records of that rank's cameras, and renders its own
C cameras from the records of all N_all Gaussians (render._exchange_dense). In the dense exchange
the split sizes are Python lists fixed by the shard sizes and the camera counts, which change only
at densification and pruning steps, and no host reads device data. So both all_to_alls can be
captured in CUDA graphs (NCCL supports stream capture) and replayed each step without host work:

- forward: the head's static outputs [C_all, N_r, ...] -> one payload holding, for each rank j,
  the fields of kernels.constants.RECORD_FIELDS of j's cameras one after the other (each field a
  contiguous block [C_j, N_r, w] of a head output, the int32 radii bit-cast, 12 float32 lanes per
  record in all) -> all_to_all -> each field of the received records [C, N_all, ...] in static
  memory, joined from the owners' blocks in rank order;
- backward: the static gradients of the received records' rasterized fields (means2d, conics,
  opacities, colors: 9 lanes; the depth lane has no gradient in a step that trains nothing but
  the photometric loss and does not travel, where the eager reverse exchange sends it as zeros),
  field after field for each owner -> the reverse all_to_all -> the head's static gradient
  buffers (depths' zeroed).

Field-major blocks rather than the eager exchange's interleaved 12-lane rows: every copy on either
side moves whole contiguous runs (an interleaved pack or unpack of the narrow fields ran at a
fraction of the memory bandwidth on the H200, docs/clusters.md).

What it moves equals the eager exchange's values (render._exchange_dense and exchange.AllToAll's
backward), in another order: every value is a copy, so the replayed step trains as the eager one to the rasterizer's
rounding. A capture the backend refuses runs that exchange eagerly on the same static buffers from
then on, said once through ``warn``.

A captured collective's plan belongs to NCCL until its graph is destroyed, and destroying the
process group waits for it: :meth:`GraphedExchange.release` must run before the group goes
(step/forward.ForwardBackward.release, called by the Trainer's close).
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from typing import Callable, Optional

import torch

from ..exchange import _all_to_all_rows
from ..launch import DistContext
from ...kernels.constants import RECORD_FIELDS
from ..render import ExchangeLayout

RECORD_KEYS = tuple(name for name, _ in RECORD_FIELDS)  # radii, means2d, depths, conics, opacities, colors
GRAD_FIELDS = (("means2d", 2), ("conics", 3), ("opacities", 1), ("colors", 3))  # what a photometric gradient reaches
GRAD_KEYS = tuple(name for name, _ in GRAD_FIELDS)
GRAD_LANES = sum(w for _, w in GRAD_FIELDS)  # 9


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


class _Eager:
    """An exchange that runs ``fn(*inputs)`` at each ``replay()``: what a refused capture leaves."""

    def __init__(self, fn: Callable, inputs: tuple):
        self.fn, self.inputs = fn, inputs
        self.outputs = tuple(fn(*inputs))

    def replay(self) -> tuple:
        out = self.fn(*self.inputs)
        if self.outputs:
            for static, o in zip(self.outputs, out):
                if static.data_ptr() != o.data_ptr():
                    static.copy_(o)
        return self.outputs


class GraphedExchange:
    """Both record exchanges of a dense step for one head capture and one pass layout.

    ``ctx``: the rank (``ctx.distributed``); ``n_world`` / ``c_world``: every rank's Gaussian and
    camera counts (render.PassLayout); ``sources``: the head's static outputs by name
    (capture.OUTPUT_KEYS; [C_all, N_r, ...] with C_all = sum(c_world)); ``targets``: the head's
    static gradient buffers by name (those of its differentiable outputs); ``capture``:
    capture.CapturedCall or a test's stand-in (``fn, inputs -> .replay(), .outputs``);
    ``warn``: one-line warnings. Raises ValueError when the sources' shapes disagree with the
    counts.

    :meth:`forward` returns the received records by name ([C, N_all, ...], static: overwritten by
    the next step); :attr:`record_grads` are the static gradient buffers of their rasterized
    fields, which the step's tail writes; :meth:`backward` takes them to ``targets``. ``layout``
    (render.ExchangeLayout) and ``means2d`` (whose ``.grad`` is the local 2D means' gradient) go
    into the step's RenderInfo.
    ``captured`` says, per direction ("forward", "backward"), whether it replays as a graph (False:
    its capture was refused and it runs eagerly)."""

    def __init__(
        self,
        ctx: DistContext,
        n_world: list[int],
        c_world: list[int],
        sources: dict,
        targets: dict,
        capture: Callable,
        warn: Optional[Callable[[str], None]] = None,
    ):
        self.ctx, self.n_world, self.c_world = ctx, list(n_world), list(c_world)
        self.C, self.N = c_world[ctx.rank], n_world[ctx.rank]
        C_all, N_all = sum(c_world), sum(n_world)
        if tuple(sources["means2d"].shape[:2]) != (C_all, self.N):
            raise ValueError(
                f"the head's records are {tuple(sources['means2d'].shape[:2])} (cameras, Gaussians); "
                f"the pass layout says {(C_all, self.N)}"
            )
        self.send_rows = [c * self.N for c in c_world]  # records, as render._exchange_dense sends them
        self.recv_rows = [self.C * n for n in n_world]
        lanes = sum(w for _, w in RECORD_FIELDS)
        self.send_elements = [r * lanes for r in self.send_rows]  # float32 elements per peer
        self.recv_elements = [r * lanes for r in self.recv_rows]
        self.recv_elements_back = [r * GRAD_LANES for r in self.recv_rows]  # what goes back to each owner
        self.send_elements_back = [r * GRAD_LANES for r in self.send_rows]
        self.layout = ExchangeLayout(False, self.N, self.n_world, self.send_rows, self.recv_rows)
        self.sources, self.targets, self.warn = sources, targets, warn
        like = sources["means2d"]
        self.record_grads = {
            k: like.new_zeros((self.C, N_all, *sources[k].shape[2:])) for k in GRAD_KEYS
        }  # written by the tail
        # the holder whose .grad the strategy reads (RenderInfo.means2d): a stride-0 view over
        # the head's gradient buffer of the local 2D means, [C_all, N_r, 2], no memory of its own
        self.means2d = targets["means2d"].new_empty(1).expand(targets["means2d"].shape)
        self.means2d.grad = targets["means2d"]
        self.captured = {"forward": True, "backward": True}
        self._forward = self._made(self._forward_fn, "forward", capture)
        self._backward = self._made(self._backward_fn, "backward", capture)

    def _made(self, fn: Callable, phase: str, capture: Callable):
        """``fn`` warmed up once eagerly (the communicator and the kernels exist before the
        capture) and captured, or run eagerly from now on where the capture is refused."""
        from .capture import collector_held

        with stats_unchanged(self.ctx):
            self.ctx.stats.phase = phase
            fn()
            try:
                if self.sources["means2d"].is_cuda:
                    torch.cuda.synchronize(self.sources["means2d"].device)
                with collector_held():
                    return capture(fn, ())
            except RuntimeError as e:  # torch.AcceleratorError is one
                self.captured[phase] = False
                line = (
                    f"--cuda_graphs: the {phase} record exchange could not be captured, it runs eagerly "
                    f"between the replays ({str(e).splitlines()[0]})"
                )
                (self.warn or warnings.warn)(line)
                return _Eager(fn, ())

    def _forward_fn(self) -> tuple:
        s = self.sources
        # to each rank its cameras' records, field after field (each a contiguous [C_j, N_r, w]
        # block of a head output: the payload is written in one pass of whole blocks)
        blocks, first = [], 0
        for c in self.c_world:
            for name, _ in RECORD_FIELDS:
                block = s[name][first : first + c]
                blocks.append((block.view(torch.float32) if name == "radii" else block).reshape(-1))
            first += c
        payload = torch.cat(blocks)
        recv = _all_to_all_rows(self.ctx, payload[:, None], self.send_elements, self.recv_elements)[:, 0]
        # from each owner r its field blocks [C, N_r, w]; each field joined along the Gaussians
        pieces: dict = {name: [] for name, _ in RECORD_FIELDS}
        start = 0
        for n in self.n_world:
            for name, width in RECORD_FIELDS:
                block = recv[start : start + self.C * n * width].view(self.C, n, width)
                pieces[name].append(block.view(torch.int32) if name == "radii" else block)
                start += self.C * n * width
        fields = []
        for name, width in RECORD_FIELDS:
            field = torch.cat(pieces[name], dim=1)
            fields.append(field[..., 0] if width == 1 else field)
        return tuple(fields)

    def _backward_fn(self) -> tuple:
        g, C = self.record_grads, self.C
        # to each owner j the gradients of its Gaussians, field after field ([C, n_j, w] blocks)
        rows = g["means2d"].new_empty(sum(self.recv_elements_back))
        first = start = 0
        for n in self.n_world:
            for name, width in GRAD_FIELDS:
                grad = g[name][:, start : start + n]
                rows[first : first + C * n * width].view(C, n, width).copy_(grad.view(C, n, width))
                first += C * n * width
            start += n
        back = _all_to_all_rows(self.ctx, rows[:, None], self.recv_elements_back, self.send_elements_back)[:, 0]
        # from each renderer r the blocks [C_r, N, w] of its cameras: rows of the head's gradients
        t, first, cam = self.targets, 0, 0
        for c in self.c_world:
            for name, width in GRAD_FIELDS:
                t[name][cam : cam + c].view(c, self.N, width).copy_(
                    back[first : first + c * self.N * width].view(c, self.N, width)
                )
                first += c * self.N * width
            cam += c
        if "depths" in t:
            t["depths"].zero_()
        return (back,)

    def _record(self, phase: str, send: list[int], recv: list[int]) -> None:
        """The replayed all_to_all of ``send`` / ``recv`` float32 elements per peer in the rank's
        CommStats, as exchange._all_to_all_rows records it."""
        stats, me = self.ctx.stats, self.ctx.rank
        saved, stats.phase = stats.phase, phase
        stats.record("all_to_all", 4 * (sum(send) - send[me]), 4 * (sum(recv) - recv[me]))
        stats.phase = saved

    def forward(self) -> dict:
        """Replay the forward exchange; the received records by name (static)."""
        with stats_unchanged(self.ctx):  # a replay runs no host code; an eager exchange would count itself
            out = self._forward.replay()
        self._record("forward", self.send_elements, self.recv_elements)
        return dict(zip(RECORD_KEYS, out))

    def backward(self) -> None:
        """Replay the reverse exchange: :attr:`record_grads` to the head's gradient buffers."""
        with stats_unchanged(self.ctx):
            self._backward.replay()
        self._record("backward", self.recv_elements_back, self.send_elements_back)

    def release(self) -> None:
        """Destroy the captured graphs now (before the process group goes); the object is unusable after."""
        for call in (self._forward, self._backward):
            graph = getattr(call, "graph", None)
            if graph is not None:
                graph.reset()
        self._forward = self._backward = None  # type: ignore[assignment]
