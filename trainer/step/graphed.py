"""A one-process training step as three CUDA-graph replays around gsplat's tile intersection.

With step/capture.py's head captured, a step still runs the rasterizer, the loss and autograd's
backward eagerly: a few hundred operator calls and Triton launches of host time, more than the
GPU's own work on a small scene (docs/performance.md). For the common run (one process, dense
records, the photometric loss alone) :class:`GraphedStep` runs a step as

  1. the head's forward graph: activation, projection, SH (capture.CapturedGraphs);
  2. gsplat's tile intersection, eagerly: isect_tiles reads its intersection count on the host
     (the step's one synchronization) and sizes its outputs by it;
  3. the tail graph (capture.CapturedCall): rasterize_to_pixels, the background, the loss, and the
     loss's and rasterizer's backward, which writes the gradients of the head's outputs straight
     into the head's static gradient buffers (with --raster fused: the fused kernel, which does
     all of that in one launch);
  4. the head's backward graph: the parameters' gradients.

No autograd graph is built on the host. The optimizer, densification's statistics and everything
after them are the training step's own code (trainer/loop.py).

The tail's shapes are static; the number of intersections is not. The tail reads the tile lists
from static buffers: ``flatten_ids`` with ``capacity`` entries (the step's count, then stale or
zero entries, all valid record indices) and tile offsets with one more row of tiles below each
image. gsplat's kernels end the list of the last tile of the last image at the length of
``flatten_ids`` and every other tile's at the next tile's offset (range_end in
RasterizeToPixels3DGSFwd.cu and ...Bwd.cu). With the extra row, each real tile's list ends where the
next real one's begins, as in the eager pass (the extra row of image c starts at image c + 1's first
entry, the last image's at the step's count), and the padded entries fall to the last extra tile.
That tile, like its whole row, lies below the image: the forward stops before its first batch (no
pixel inside, all done) and the backward returns at once (``masks`` False there). The fused kernel
reads the same padded lists (kernels/fused_raster.py, ``padded_rows``): the rows below the image
have no pixels, so it composites nothing there and gives their Gaussians no gradient. The capacity
grows by a quarter past a step's count that exceeds it, which captures the tail again.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from ...kernels.constants import TILE_SIZE
from ...kernels.fused_raster import fits_one_launch
from ...kernels.fused_ssim import uint8_to_unit
from ...kernels.reference import composite_background
from ..render import RenderInfo
from ..launch import DistContext
from .capture import OUTPUT_KEYS, PARAM_KEYS, CaptureBudget, CapturedCall, GraphedHead, Uncaptured, collector_held
from .graphed_exchange import GraphedExchange, HeadBinding

RASTER_KEYS = ("means2d", "conics", "colors", "opacities")  # the head outputs the rasterizer reads
CAPACITY_ROUND = 4096  # the tail's flatten_ids capacity is a multiple of this many entries


def capacity_for(n_isects: int) -> int:
    """The tail's flatten_ids capacity for a step of ``n_isects`` intersections: a quarter more,
    rounded up to a multiple of CAPACITY_ROUND (at least one multiple)."""
    return max(1, math.ceil(1.25 * n_isects / CAPACITY_ROUND)) * CAPACITY_ROUND


def _extra_row_starts(offsets: torch.Tensor, n_isects: int) -> torch.Tensor:
    """[C] int32: where image c's extra tile row starts, image c + 1's first list entry (the
    intersection count for the last image). Device work only: no upload."""
    return torch.cat([offsets[1:, 0, 0], offsets.new_full((1,), n_isects)])


def tail_function(
    ops,
    loss_fn: Callable,
    width: int,
    height: int,
    absgrad: bool,
    grad_targets: dict,
    fused: Optional[Callable] = None,
    weight: float = 1.0,
) -> Callable:
    """The tail of a step, as captured: (means2d, conics, colors, opacities — leaves over the head's
    outputs —, offsets, flatten_ids, masks, gts uint8 [C, H, W, 3], backgrounds [C, 3] or None) ->
    (loss, l1, ssim, absgrad [C, N, 2] or an empty tensor). The gradients of the four leaves are
    copied into ``grad_targets`` (the head's static gradient buffers, by output name; "depths"
    there is zeroed: no depth term); the fused kernel writes them there itself where they are
    float32 and contiguous (kernels.fused_raster.fused_raster_loss's ``grads_out``). ``loss_fn(colors [C, H, W, 3], gts) -> (loss, {"l1", "ssim"})``.
    ``fused``: kernels.fused_raster.fused_raster_loss with its ssim_lambda bound (tests: the CPU
    emulation), which replaces the rasterizer and ``loss_fn``; l1 and ssim are then its terms (the
    SSIM tile-local), as in the eager fused step. ``weight``: the gradients are those of ``weight``
    times the loss (a rank's share of the global batch on the distributed path; the returned loss
    is not weighted)."""

    def write_gradients(loss, leaves):
        for key, grad in zip(RASTER_KEYS, torch.autograd.grad(loss * weight if weight != 1.0 else loss, leaves)):
            grad_targets[key].copy_(grad)
        if "depths" in grad_targets:
            grad_targets["depths"].zero_()

    def tail(means2d, conics, colors, opacities, offsets, flatten_ids, masks, gts, backgrounds):
        leaves = (means2d, conics, colors, opacities)
        if fused is not None:
            return fused_tail(leaves, offsets, flatten_ids, gts, backgrounds)
        render_colors, render_alphas = ops.rasterize_to_pixels(
            means2d,
            conics,
            colors,
            opacities,
            width,
            height,
            TILE_SIZE,
            offsets,
            flatten_ids,
            masks=masks,
            absgrad=absgrad,
        )
        render_colors = composite_background(render_colors, render_alphas, backgrounds)
        loss, parts = loss_fn(render_colors, gts)
        write_gradients(loss, leaves)
        abs_means2d = getattr(means2d, "absgrad", None) if absgrad else None
        if absgrad and abs_means2d is None:
            abs_means2d = torch.zeros_like(means2d)
        return (
            loss.detach(),
            parts["l1"].detach(),
            parts["ssim"].detach(),
            abs_means2d.detach() if abs_means2d is not None else means2d.new_empty(0),
        )

    # the fused kernel accumulates straight into the gradient buffers where they fit it (float32,
    # contiguous): no copy after it, and the weight scales them in place
    raster_grads = {key: grad_targets[key] for key in RASTER_KEYS}
    fits = all(g.dtype == torch.float32 and g.is_contiguous() for g in raster_grads.values())
    in_place: dict[str, torch.Tensor] | None = raster_grads if fits else None

    def fused_tail(leaves, offsets, flatten_ids, gts, backgrounds):
        assert fused is not None
        loss, stats = fused(
            *leaves, offsets, flatten_ids, uint8_to_unit(gts), width, height,
            backgrounds=backgrounds, absgrad=absgrad, padded_rows=True, grads_out=in_place,
        )  # fmt: skip
        if in_place is None:
            write_gradients(loss, leaves)
        else:
            if weight != 1.0:
                for grad in in_place.values():
                    grad.mul_(weight)
            if "depths" in grad_targets:
                grad_targets["depths"].zero_()
        abs_means2d = stats["absgrad"].view(leaves[0].shape) if absgrad else leaves[0].new_empty(0)
        return loss.detach(), stats["l1"], stats["ssim"], abs_means2d.detach()

    return tail


@dataclass
class StepOutputs:
    """What a graphed step leaves for the optimizer and densification: the loss and its parts
    (0-dim device tensors, overwritten by the next step: read them before it) and the pass's
    :class:`render.RenderInfo` (``means2d.grad`` and, with absgrad, ``absgrad.grad`` set)."""

    loss: torch.Tensor
    parts: dict
    info: RenderInfo


class _Tail:
    """One capture of the tail and its static buffers."""

    def __init__(self, key, C, th, tw, capacity, gts, backgrounds):
        self.key = key  # holds the head's capture it reads while this tail lives
        self.th = th
        device = gts.device
        self.offsets = torch.zeros(C, th + 1, tw, dtype=torch.int32, device=device)
        self.flatten_ids = torch.zeros(capacity, dtype=torch.int32, device=device)
        self.masks = torch.ones(C, th + 1, tw, dtype=torch.bool, device=device)
        self.masks[:, th] = False
        self.gts = torch.empty_like(gts)
        self.backgrounds = None if backgrounds is None else torch.empty_like(backgrounds)
        self.call = None  # the CapturedCall (or a test's stand-in)
        self.means2d = self.absgrad_lanes = None  # the RenderInfo's gradient holders

    def fill(self, offsets, flatten_ids, gts, backgrounds) -> None:
        """Write a step's tile lists, images and backgrounds into the static buffers."""
        n = flatten_ids.numel()
        self.offsets[:, : self.th].copy_(offsets)
        self.offsets[:, self.th].copy_(_extra_row_starts(offsets, n)[:, None])
        self.flatten_ids[:n].copy_(flatten_ids)
        self.gts.copy_(gts)
        if self.backgrounds is not None:
            self.backgrounds.copy_(backgrounds)


class GraphedStep:
    """Steps 1-4 of the module docstring for a :class:`capture.GraphedHead` ``head``.

    ``ops``: gsplat's CUDA ops (or the reference's, with stand-in captures, in tests);
    ``loss_fn`` and ``fused`` (--raster fused): as :func:`tail_function`'s; ``absgrad``:
    --absgrad. ``capture``: turns the tail
    function and its static inputs into an object whose ``replay()`` returns the static outputs
    (:class:`capture.CapturedCall`; tests pass an eager stand-in). ``warn``: told once, in one line,
    when a capture fails; the run then goes on with the eager step (``__call__`` returns None).
    ``captures``, ``failures`` and ``capture_seconds`` count the tail's own captures; ``declined``
    the fused steps left to the eager step because the kernel would need several launches
    (kernels.fused_raster.fits_one_launch, within ``scratch_mb``: the MiB ``fused`` was bound to,
    StepPlan.fused_scratch_mb)."""

    def __init__(
        self,
        head: GraphedHead,
        ops,
        loss_fn: Callable,
        absgrad: bool = False,
        capture: Optional[Callable] = None,
        warn: Optional[Callable[[str], None]] = None,
        fused: Optional[Callable] = None,
        ctx: Optional[DistContext] = None,
        scratch_mb: Optional[float] = None,
    ):
        self.head, self.ops, self.loss_fn, self.absgrad = head, ops, loss_fn, absgrad
        self.fused, self.scratch_mb = fused, scratch_mb
        self.ctx = ctx if ctx is not None and ctx.distributed else None  # the distributed path's rank
        if self.ctx is not None and absgrad:
            raise ValueError("a whole-step replay on the distributed path takes no --absgrad (step/plan.graphs_mode)")
        self._exchange: Optional[GraphedExchange] = None
        self._exchange_key: Optional[tuple] = None
        self._binding: Optional[HeadBinding] = None
        self._binding_key: Optional[tuple] = None
        # layouts that change too often to repay a capture (uneven batches at epoch ends): the
        # exchange then runs its collectives eagerly; decided from the layouts alone, which every
        # rank sees alike at the same steps, so every rank decides alike
        self.exchange_stopped = False
        self._calls_distributed = 0
        self._exchange_budget = CaptureBudget(GraphedHead.most_captures, GraphedHead.window)
        self.exchange_captures = 0  # the record exchanges captured (both directions each), distributed path
        self.capture = capture or CapturedCall
        self.warn = warn
        self.capacity = 0
        self.captures = self.failures = 0
        self.declined = 0  # fused steps too large for one launch of the kernel (their tails ran uncaptured)
        self.capture_seconds = 0.0
        self.failed = False  # a tail capture failed: no more graphed steps in this run
        self._tail: Optional[_Tail] = None
        self._warmed: set = set()  # tail keys, less head and capacity, warmed up before a capture

    def __call__(
        self,
        params,
        viewmats,
        Ks,
        campos,
        width: int,
        height: int,
        sh_degree: int,
        gts,
        backgrounds=None,
        timer=None,
        n_world: Optional[list[int]] = None,
        c_world: Optional[list[int]] = None,
    ) -> Optional[StepOutputs]:
        """One step's forward and backward for the C_all cameras (viewmats [C_all, 4, 4], Ks
        [C_all, 3, 3], campos [C_all, 3], all of ``width`` x ``height`` pixels) against ``gts``
        (uint8 [C, H, W, 3], on the device) and ``backgrounds`` ([C, 3] or None); leaves the
        parameters' ``.grad`` set (static buffers: the optimizer must consume and drop them before
        the next step). One process: C_all = C. The distributed path (``ctx``): every rank's
        cameras, ``n_world`` and ``c_world`` every rank's Gaussian and camera counts
        (render.PassLayout); the records travel through :class:`GraphedExchange`, and the loss
        is weighted by this rank's share of the cameras, as step/eager.EagerStep weights it.
        One process: returns None, having set no gradient, when the head runs without a capture
        for these arguments or a tail capture has failed; the caller then runs its eager step.
        The distributed path never leaves the replay on one rank alone (every rank's collectives
        must meet): a head without a capture runs through autograd, its records through the same
        exchange, and a tail whose capture failed runs uncaptured between the replays. A fused
        step whose kernel needs several launches runs its tail uncaptured (``declined`` counts them)."""
        if self.failed:
            return None
        C_all, C = viewmats.shape[0], gts.shape[0]
        N = int(params["means"].shape[0])
        n_world, c_world = list(n_world or [N]), list(c_world or [C])
        if n_world[self.rank] != N or sum(c_world) != C_all or c_world[self.rank] != C:
            raise ValueError(
                f"stale pass layout: {n_world} Gaussians and {c_world} cameras per rank, this rank {N}, {C}"
            )
        sizes = [(width, height)] * C_all
        head_key = self.head.key_of(params, viewmats, Ks, campos, sizes, sh_degree)
        if not self.head.is_current(head_key):
            self._drop_head()  # what holds the head's capture goes before the head captures again
        run, inputs = self.head.prepare(params, viewmats, Ks, campos, sizes, sh_degree, key=head_key)
        eager_head = not hasattr(run, "replay_forward")  # the head runs eagerly for these arguments
        if eager_head and self.ctx is None:
            self._drop_head()
            self.head.calls -= 1  # the eager step calls the head again for this step: count it once
            return None
        if timer is not None:
            timer.begin("projection")
        head_graphs: Any = run  # a CapturedGraphs, or a test's stand-in with its methods
        if eager_head:  # the distributed path: this rank's head through autograd, its exchange as every rank's
            outs = dict(zip(OUTPUT_KEYS, run(*inputs)))
            head_grads = {k: torch.zeros_like(outs[k]) for k in OUTPUT_KEYS if outs[k].requires_grad}
        else:
            outs = dict(zip(OUTPUT_KEYS, head_graphs.replay_forward(*inputs)))
            head_grads = dict(zip([k for k in OUTPUT_KEYS if outs[k].requires_grad], head_graphs.grad_outputs))
        exchange = binding = None
        records, record_grads = outs, head_grads
        if self.ctx is not None:
            if timer is not None:
                timer.begin("forward_exchange")
            self._calls_distributed += 1
            exchange = self._exchange_for(n_world, c_world, outs["means2d"].device)
            if eager_head:
                self._release_binding()
                exchange.pack(outs)
            else:
                binding = self._binding_for(run, exchange, outs, head_grads)
                binding.pack()
            records, record_grads = exchange.forward(), exchange.record_grads
        if timer is not None:
            timer.begin("rasterization")
        tw, th = math.ceil(width / TILE_SIZE), math.ceil(height / TILE_SIZE)
        _, isect_ids, flatten_ids = self.ops.isect_tiles(
            records["means2d"], records["radii"], records["depths"], TILE_SIZE, tw, th, packed=False, n_images=C
        )
        offsets = self.ops.isect_offset_encode(isect_ids, C, tw, th)
        n = flatten_ids.numel()
        if n > self.capacity or self.capacity == 0:
            self.capacity = capacity_for(n)
        # a fused kernel too large for one launch runs in chunks of tiles, reading the tile offsets
        # on the host, which no capture allows: that step's tail runs uncaptured, on the same
        # static buffers, between the head's two replays (a later, smaller step replays again)
        uncaptured = self.fused is not None and not fits_one_launch(self.capacity, C * (th + 1) * tw, self.scratch_mb)
        weight = C / C_all  # this rank's share of the global batch's mean loss (step/eager.py)
        key = (
            run if exchange is None else None,  # the distributed tail reads the exchange's buffers
            exchange,
            self.capacity,
            C,
            width,
            height,
            tuple(gts.shape),
            backgrounds is None,
            weight,
            uncaptured,
        )
        if self._tail is not None and self._tail.key == key:
            tail = self._tail
            tail.fill(offsets, flatten_ids, gts, backgrounds)
        else:
            self._forget_tail()  # the old capture goes before the new one is made
            captured = self._capture(
                key, records, record_grads, width, height, C, th, tw, offsets, flatten_ids, gts, backgrounds, weight
            )
            if captured is None:  # one process: the run goes on with the eager step
                self._drop()
                return None
            tail = captured
        self.declined += uncaptured
        if timer is not None:
            timer.begin("raster_loss_backward")  # the tail: rasterizer, loss and their backward
        loss, l1, ssim, absgrad = tail.call.replay()
        if self.absgrad and uncaptured:  # a new tensor every call
            assert tail.absgrad_lanes is not None
            tail.absgrad_lanes.grad = absgrad
        if exchange is not None:
            assert self.ctx is not None
            self.ctx.stats.phase = "backward"
            if timer is not None:
                timer.begin("backward_exchange")
            exchange.backward()
            if binding is not None:
                binding.unpack()
            else:
                exchange.unpack(head_grads)
        if timer is not None:
            timer.begin("backward_projection")
        if eager_head:
            torch.autograd.backward([outs[k] for k in head_grads], list(head_grads.values()))
            means2d_holder = head_grads["means2d"].new_empty(1).expand(head_grads["means2d"].shape)
            means2d_holder.grad = head_grads["means2d"]
        else:
            grad_inputs = head_graphs.replay_backward()
            for key_, grad in zip(PARAM_KEYS, grad_inputs):
                if grad is not None:
                    params[key_].grad = grad
            means2d_holder = tail.means2d if binding is None else binding.means2d
        info = RenderInfo(
            means2d=means2d_holder,
            radii=outs["radii"],
            packed=False,
            n_cameras=C_all,
            widths=[width] * C_all,
            heights=[height] * C_all,
            N_world=n_world,
            C_world=c_world,
            num_isects=n,
            absgrad=tail.absgrad_lanes,
            width=width,
            height=height,
            num_local_cameras=C,
            layout=exchange.layout if exchange is not None else None,
        )
        return StepOutputs(loss, {"l1": l1, "ssim": ssim}, info)

    @property
    def rank(self) -> int:
        return self.ctx.rank if self.ctx is not None else 0

    def _exchange_for(self, n_world, c_world, device) -> GraphedExchange:
        """The record collectives of these counts (every rank's alike, so every rank builds them at
        the same step): the current ones, or new ones built now, after the old ones, the tail that
        read their buffers and the binding that wrote them are released."""
        key = (tuple(n_world), tuple(c_world))
        if self._exchange is not None and self._exchange_key == key:
            return self._exchange
        self._drop()
        assert self.ctx is not None
        if not self.exchange_stopped and not self._exchange_budget.spend(self._calls_distributed):
            self.exchange_stopped = True
            line = (
                f"--cuda_graphs: the pass layout changed {GraphedHead.most_captures} times within "
                f"{GraphedHead.window} steps; the record exchange runs without graphs from now on"
            )
            (self.warn or warnings.warn)(line)
        capture = None if self.exchange_stopped else self.capture
        self._exchange = GraphedExchange(self.ctx, n_world, c_world, device, capture, self.warn)
        self._exchange_key = key
        self.exchange_captures += all(self._exchange.captured.values())
        return self._exchange

    def _binding_for(self, run, exchange: GraphedExchange, outs, head_grads) -> HeadBinding:
        """The pack and unpack of head capture ``run`` for ``exchange``: the current ones, or new ones."""
        if self._binding is not None and self._binding_key == (run, exchange):
            return self._binding
        self._release_binding()
        self._binding = HeadBinding(exchange, outs, head_grads, self.capture, self.warn)
        self._binding_key = (run, exchange)
        return self._binding

    def _release_binding(self) -> None:
        if self._binding is not None:
            self._binding.release()
        self._binding = self._binding_key = None

    def _forget_tail(self) -> None:
        """Drop the tail now: an uncaptured tail's call and its inputs' closure refer to each other,
        and the buffers it reads (the head's outputs, or an exchange's records) must not wait for
        the cycle collector, which a capture holds off (capture.collector_held)."""
        if self._tail is not None:
            self._tail.call = None
        self._tail = None

    def _drop_head(self) -> None:
        """Let go of what holds the head's capture: one process's tail (it reads the head's
        outputs), the distributed path's binding (the tail there reads the exchange's buffers)."""
        if self.ctx is None:
            self._forget_tail()
        self._release_binding()

    def _drop(self) -> None:
        """Let the tail, the binding and the record exchange go (their graphs destroyed now)."""
        self._forget_tail()
        self._release_binding()
        if self._exchange is not None:
            self._exchange.release()
        self._exchange = self._exchange_key = None

    def release(self) -> None:
        """Free every capture this object holds (the record exchange's collectives must be gone
        before the process group is destroyed: step/graphed_exchange.py). Later calls capture again."""
        self._drop()

    def _captured_call(self, tail: _Tail, fn: Callable, inputs: Callable[[], tuple], warm_up: bool) -> bool:
        """Capture ``fn(*inputs())`` into ``tail.call``, warmed up first where ``warm_up`` (a
        capture that fails without its warm-up is tried once more with it); False when the
        capture failed (said once through ``warn``; the run goes on eagerly)."""
        while True:
            try:
                if warm_up:  # lazy loading and compilation stay out of the capture
                    fn(*inputs())
                if tail.gts.is_cuda:
                    torch.cuda.synchronize(tail.gts.device)
                with collector_held():
                    tail.call = self.capture(fn, inputs())
                return True
            except RuntimeError as e:  # torch.AcceleratorError is one
                if not warm_up:  # a first launch of some kernel in the capture? once more, warmed up
                    warm_up = True
                    continue
                self.failures += 1
                if self.ctx is None:  # one process: the eager step from now on
                    self.failed = True
                    line = "--cuda_graphs: the step's tail could not be captured, steps run eagerly"
                else:  # the distributed path keeps the other ranks' collectives: this tail runs uncaptured
                    line = "--cuda_graphs: a step's tail could not be captured, it runs uncaptured between the replays"
                if self.failures == 1:
                    (self.warn or warnings.warn)(f"{line} ({str(e).splitlines()[0]})")
                return False

    def _capture(
        self, key, records, targets, width, height, C, th, tw, offsets, flatten_ids, gts, backgrounds, weight=1.0
    ):
        """A new :class:`_Tail` for ``key``, filled with this step's data, warmed up once eagerly
        and captured (replayed later by the caller), or None when the capture failed (said once
        through ``warn``; the run goes on eagerly). ``records``: the rasterizer's static inputs by
        name (the head's outputs, or the received records); ``targets``: their static gradient
        buffers. A key of a fused kernel too large for one launch (its last element) gets a tail
        that runs uncaptured at each replay."""
        start = time.perf_counter()
        tail = _Tail(key, C, th, tw, self.capacity, gts, backgrounds)
        tail.fill(offsets, flatten_ids, gts, backgrounds)
        fn = tail_function(self.ops, self.loss_fn, width, height, self.absgrad, targets, self.fused, weight)

        def inputs():
            leaves = tuple(records[k].detach().requires_grad_() for k in RASTER_KEYS)
            return (*leaves, tail.offsets, tail.flatten_ids, tail.masks, tail.gts, tail.backgrounds)

        warmed = key[3:]  # all but the head, the exchange and the capacity: same images, same kernels
        uncaptured = key[-1]
        if uncaptured or self.exchange_stopped:  # no capture: the tail runs eagerly at each replay
            tail.call = Uncaptured(fn, inputs)
            uncaptured = True
        elif not self._captured_call(tail, fn, inputs, warm_up=warmed not in self._warmed):
            if self.ctx is None:
                return None
            tail.call = Uncaptured(fn, inputs)  # the distributed path: no rank may leave the replay alone
            uncaptured = True
        means2d_grad = targets["means2d"]
        # holders whose .grad the strategy reads: stride-0 views, no memory of their own
        tail.means2d = means2d_grad.new_empty(1).expand(means2d_grad.shape)
        tail.means2d.grad = means2d_grad
        if self.absgrad:
            tail.absgrad_lanes = means2d_grad.new_empty(1).expand(means2d_grad.shape)
            tail.absgrad_lanes.grad = tail.call.outputs[3] if not uncaptured else None
        self._tail = tail
        if not uncaptured:
            self._warmed.add(warmed)
            self.captures += 1
            self.capture_seconds += time.perf_counter() - start
        return tail
