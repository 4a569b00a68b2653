"""Every collective of a training step, each a differentiable pair.

The iteration (gsplat rendering.py's distributed path, Zhao et al. 2024 "On Scaling Up 3D
Gaussian Splatting Training"): ranks own disjoint shards of the Gaussians and their own cameras.

1. :func:`gather_metadata` — one all_gather of int32 [num_gaussians, num_cameras, width, height]
   per rank (gsplat does the Gaussian counts alone; the camera counts and sizes ride along so that
   ranks may hold different numbers of cameras of different sizes).
2. :class:`AllGatherCameras` — all_gather of every rank's view matrices and intrinsics. Backward:
   reduce-scatter (each rank receives the sum over ranks of the gradient of *its* cameras).
3. :class:`AllToAll` — the projected records travel to the rank that renders their camera, in one
   concatenated buffer. Backward: the reverse all_to_all (gradient rows travel back to the rank
   that owns the Gaussian). Dense mode sends every (camera, local Gaussian) pair; packed mode
   sends only visible pairs, after exchanging per-destination counts with :func:`exchange_counts`.
   With ``sparse=True`` (``--sparse_grad_comm``) the reverse exchange elides rows whose gradient is exactly zero
   (ByteSplat section 6; sparse_exchange.py): counts first, then bitmap + nonzero rows.

No collective here reduces a Gaussian gradient: a Gaussian's partial gradients reach its owner
through the reverse exchange and are summed there by autograd. At world size 1 every function is
the identity and issues no collective, except under ``--loopback`` (launch.loopback_group;
``DistContext.distributed``), where each runs as at W > 1, over a process group of one rank.

Besides the step's pairs, this module is the one home of every other collective of a run (with
sparse_exchange.py for the zero-eliding backward and launch.py for the process group itself):
control values (:func:`any_rank`, :func:`from_main`, :func:`gather_metadata`), results to rank 0
(:func:`gather_to_main`), rows on every rank (:func:`all_gather_rows`, :func:`sum_over_ranks`),
point-to-point rows for exports (:func:`send_rows`, :func:`recv_rows`) and the DDP wrapping of
the replicated auxiliary modules (:func:`replicate`). No other module imports torch.distributed.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from .launch import DistContext

# torch 2.13 renamed all_gather_into_tensor (kept as a deprecated alias); older torch has only that.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def deal_views(n: int, ctx: DistContext) -> tuple[list[int], int]:
    """Views dealt round-robin to the ranks for evaluation and pruning: (the indices of the ``n``
    views rank ``ctx.rank`` renders, the number of rounds every rank runs, ceil(n / W))."""
    rounds = -(-n // ctx.world_size) if n else 0
    return list(range(ctx.rank, n, ctx.world_size)), rounds


def padded_rounds(mine: list[int], rounds: int) -> list[int]:
    """The view a rank renders in each of the ``rounds`` rounds of :func:`deal_views`: its own
    views ``mine``, then (rounds every rank must run for the collectives to line up) its last one
    again, or view 0 when it has none. Rounds ``>= len(mine)`` are discarded by the caller."""
    return mine + [mine[-1] if mine else 0] * (rounds - len(mine))


def gather_metadata(ctx: DistContext, values: Sequence[int]) -> torch.Tensor:
    """All-gather a few int32 values per rank -> [W, len(values)] int64 on the CPU.

    One all_gather_single (all_gather_into_tensor before torch 2.13; not all_gather_object, which pickles through the host)."""
    local = torch.tensor(list(values), dtype=torch.int32)
    if not ctx.distributed:
        return local[None].long()
    local = local.to(ctx.comm_device)
    out = torch.empty(ctx.world_size * len(values), dtype=torch.int32, device=ctx.comm_device)
    _all_gather_single(out, local, group=ctx.group)
    ctx.stats.record("all_gather", local.numel() * 4 * (ctx.world_size - 1), out.numel() * 4 - local.numel() * 4)
    return out.view(ctx.world_size, len(values)).long().cpu()


def any_rank(ctx: DistContext, flags: Sequence[bool]) -> list[bool]:
    """For each flag, whether it is set on any rank: one all_reduce (MAX) of a few int32 control
    values, read on the host (a synchronization; no Gaussian data). Identity at world size 1."""
    if not ctx.distributed:
        return [bool(f) for f in flags]
    values = torch.tensor([int(bool(f)) for f in flags], dtype=torch.int32, device=ctx.comm_device)
    dist.all_reduce(values, op=dist.ReduceOp.MAX, group=ctx.group)
    ctx.stats.record("all_reduce", values.numel() * 4, values.numel() * 4)
    return [bool(v) for v in values.cpu().tolist()]


def max_over_ranks(ctx: DistContext, values: Sequence[float]) -> list[float]:
    """Each value's maximum over the ranks: one all_reduce (MAX) of a few float64 control values,
    read on the host (a synchronization; no Gaussian data), counted in the "control" phase of
    the rank's CommStats. Identity at world size 1."""
    if not ctx.distributed:
        return [float(v) for v in values]
    tensor = torch.tensor([float(v) for v in values], dtype=torch.float64, device=ctx.comm_device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=ctx.group)
    phase, ctx.stats.phase = ctx.stats.phase, "control"
    ctx.stats.record("all_reduce", tensor.numel() * 8, tensor.numel() * 8)
    ctx.stats.phase = phase
    return [float(v) for v in tensor.cpu().tolist()]


def from_main(ctx: DistContext, obj):
    """Rank 0's ``obj`` on every rank (a pickled broadcast through the host; control values only,
    e.g. rank 0's decision to resume and from which files). Identity at world size 1."""
    if not ctx.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=ctx.group, device=ctx.comm_device)
    return box[0]


def gather_to_main(ctx: DistContext, obj) -> "list | None":
    """Every rank's ``obj`` on rank 0, as a list in rank order (None on the other ranks; a pickled
    gather through the host: small results such as scores, or a shard for an export). ``[obj]``
    at world size 1."""
    if not ctx.distributed:
        return [obj]
    out = [None] * ctx.world_size if ctx.is_main else None
    dist.gather_object(obj, out, dst=0, group=ctx.group)
    return out


def all_gather_rows(ctx: DistContext, rows: torch.Tensor) -> torch.Tensor:
    """[n_r, D] on each rank -> [sum n_r, D] in rank order on every rank, on ``rows``'s device
    (identity at world size 1): the row counts first (:func:`gather_metadata`), then one
    all_gather of rows padded to the largest count."""
    if not ctx.distributed:
        return rows
    counts = gather_metadata(ctx, [rows.shape[0]])[:, 0].tolist()
    out = _padded_all_gather(ctx, rows.to(ctx.comm_device), counts)
    return out.to(rows.device)


def sum_over_ranks(ctx: DistContext, values: torch.Tensor) -> torch.Tensor:
    """The sum over ranks of ``values`` [D] (or [1, D]), on every rank, as :func:`all_gather_rows`
    followed by a sum in rank order (so every rank, and every world size, adds in one order)."""
    return all_gather_rows(ctx, values.reshape(1, -1)).sum(0)


def _sum_allreduce_hook(group, bucket):
    """DDP communication hook: all_reduce SUM (DDP's default divides by W). Each rank's loss is
    already its share of the global batch mean, so the global gradient is the sum over ranks."""
    work = dist.all_reduce(bucket.buffer(), group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def replicate(module: torch.nn.Module, ctx: DistContext) -> torch.nn.Module:
    """Move a replicated module (aux_modules.py, bilagrid.py) to the rank's device and, with
    W > 1, wrap it in DistributedDataParallel whose gradient all_reduce sums over ranks (every rank
    then applies the same Adam step, so the replicas stay identical)."""
    module = module.to(ctx.device)
    if not ctx.distributed:
        return module
    from torch.nn.parallel import DistributedDataParallel as DDP

    device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    ddp = DDP(module, device_ids=device_ids)
    ddp.register_comm_hook(ctx.group, _sum_allreduce_hook)
    return ddp


def main_decides(ctx: DistContext, decide):
    """``decide()`` run on rank 0 only, its result on every rank (:func:`from_main`): a decision
    that must not depend on what each rank sees (e.g. which checkpoint set to resume from)."""
    return from_main(ctx, decide() if ctx.is_main else None)


def send_rows(ctx: DistContext, rows: torch.Tensor, dst: int) -> None:
    """Point-to-point: float32 rows [n, D] of this rank to rank ``dst`` (:func:`recv_rows` there),
    through the communication device (the GPU for nccl). Non-differentiable (exports)."""
    if rows.shape[0]:
        dist.send(rows.to(ctx.comm_device, torch.float32).contiguous(), dst=dst, group=ctx.group)
    ctx.stats.record("send", rows.numel() * 4, 0)


def recv_rows(ctx: DistContext, n: int, d: int, src: int) -> torch.Tensor:
    """The float32 rows [n, D] rank ``src`` sends with :func:`send_rows`, on the CPU."""
    buffer = torch.empty(n, d, dtype=torch.float32, device=ctx.comm_device)
    if n:
        dist.recv(buffer, src=src, group=ctx.group)
    ctx.stats.record("recv", 0, buffer.numel() * 4)
    return buffer.cpu()


def _padded_all_gather(ctx: DistContext, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """all_gather of [counts[rank], D] rows with unequal counts -> [sum(counts), D]."""
    max_rows = max(counts)
    padded = x.new_zeros(max_rows, x.shape[1])
    padded[: x.shape[0]] = x
    out = x.new_empty(ctx.world_size * max_rows, x.shape[1])
    _all_gather_single(out, padded.contiguous(), group=ctx.group)
    ctx.stats.record("all_gather", padded.numel() * 4 * (ctx.world_size - 1), padded.numel() * 4 * (ctx.world_size - 1))
    out = out.view(ctx.world_size, max_rows, -1)
    return torch.cat([out[r, : counts[r]] for r in range(ctx.world_size)], dim=0)


def _reduce_scatter_rows(ctx: DistContext, grad: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """Transpose of :func:`_padded_all_gather`: [sum(counts), D] per rank -> the sum over ranks
    of the rows ``counts``-slice of this rank, [counts[rank], D]."""
    max_rows = max(counts)
    padded = grad.new_zeros(ctx.world_size, max_rows, grad.shape[1])
    for r, chunk in enumerate(torch.split(grad, counts, dim=0)):
        padded[r, : counts[r]] = chunk
    out = grad.new_empty(max_rows, grad.shape[1])
    if ctx.backend == "nccl":
        dist.reduce_scatter_tensor(out, padded.view(-1, grad.shape[1]).contiguous(), group=ctx.group)
    else:
        # gloo has no reduce_scatter: the same result as an all_to_all followed by a local sum.
        received = torch.empty_like(padded)
        dist.all_to_all_single(received, padded, group=ctx.group)
        out = received.sum(dim=0)
    ctx.stats.record("reduce_scatter", padded.numel() * 4 * (ctx.world_size - 1) // ctx.world_size, out.numel() * 4)
    return out[: counts[ctx.rank]]


class AllGatherCameras(torch.autograd.Function):
    """Forward: all_gather of per-camera rows [C_local, D] -> [C_all, D] (rank-major order).
    Backward: reduce-scatter — the gradient w.r.t. this rank's cameras summed over every rank's
    use of them (gsplat distributed.py's all_gather_tensor_list, made exact for unequal counts)."""

    @staticmethod
    def forward(fctx, x: torch.Tensor, ctx: DistContext, counts: list[int]) -> torch.Tensor:
        fctx.dist_ctx, fctx.counts = ctx, counts
        return _padded_all_gather(ctx, x, counts)

    @staticmethod
    def backward(fctx, grad: torch.Tensor):
        return _reduce_scatter_rows(fctx.dist_ctx, grad.contiguous(), fctx.counts), None, None


def all_gather_cameras(ctx: DistContext, viewmats: torch.Tensor, Ks: torch.Tensor, counts: list[int]):
    """viewmats [C_local, 4, 4], Ks [C_local, 3, 3] -> every rank's, [C_all, 4, 4] and [C_all, 3, 3],
    in one collective (both packed into one [C, 25] buffer)."""
    if not ctx.distributed:
        return viewmats, Ks
    rows = torch.cat([viewmats.reshape(-1, 16), Ks.reshape(-1, 9)], dim=1)
    rows = AllGatherCameras.apply(rows, ctx, counts)
    return rows[:, :16].reshape(-1, 4, 4), rows[:, 16:].reshape(-1, 3, 3)


def exchange_counts(ctx: DistContext, send_counts: torch.Tensor) -> list[int]:
    """all_to_all of one int per peer: how many records this rank sends each rank -> how many it
    receives from each rank (packed mode's first exchange)."""
    if not ctx.distributed:
        return [int(send_counts[0])]
    send = send_counts.to(device=ctx.comm_device, dtype=torch.int64)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=ctx.group)
    ctx.stats.record("all_to_all", 8 * (ctx.world_size - 1), 8 * (ctx.world_size - 1))
    return recv.cpu().tolist()


def _all_to_all_rows(
    ctx: DistContext, x: torch.Tensor, send_rows: list[int], recv_rows: list[int], out: "torch.Tensor | None" = None
) -> torch.Tensor:
    """Rows [sum(send_rows), D] -> rows [sum(recv_rows), D]: rank j gets the j-th chunk (into
    ``out``, contiguous [sum(recv_rows), D], where given: a buffer a captured graph replays into)."""
    d = x.shape[1]
    out = x.new_empty(sum(recv_rows), d) if out is None else out
    dist.all_to_all_single(
        out,
        x.contiguous(),
        output_split_sizes=recv_rows,
        input_split_sizes=send_rows,
        group=ctx.group,
    )
    item = x.element_size() * d
    me = ctx.rank
    ctx.stats.record(
        "all_to_all",
        item * (sum(send_rows) - send_rows[me]),
        item * (sum(recv_rows) - recv_rows[me]),
    )
    return out


class AllToAll(torch.autograd.Function):
    """Forward: all_to_all of record rows; rank j receives the ``send_rows[j]`` rows addressed to
    it, concatenated in source-rank order. Backward: the reverse all_to_all (the gradient of a
    received row goes back to the rank and position it came from). Only the columns
    ``grad_cols = (start, stop)`` carry gradient (radii and index lanes have none), so only they
    travel back; the others come back as zeros. With ``sparse`` rows whose gradient is exactly
    zero are elided (sparse_exchange.py)."""

    @staticmethod
    def forward(fctx, x, ctx: DistContext, send_rows: list[int], recv_rows: list[int], grad_cols, sparse: bool):
        fctx.dist_ctx, fctx.send_rows, fctx.recv_rows, fctx.sparse = ctx, send_rows, recv_rows, sparse
        fctx.grad_cols, fctx.width = grad_cols, x.shape[1]
        return _all_to_all_rows(ctx, x, send_rows, recv_rows)

    @staticmethod
    def backward(fctx, grad):
        ctx = fctx.dist_ctx
        start, stop = fctx.grad_cols or (0, fctx.width)
        grad = grad[:, start:stop].contiguous()
        if fctx.sparse:
            # zero-eliding: only nonzero gradient rows travel, with a bitmap (sparse_exchange.py)
            from .sparse_exchange import sparse_all_to_all_rows

            back = sparse_all_to_all_rows(ctx, grad, fctx.recv_rows, fctx.send_rows)
        else:
            back = _all_to_all_rows(ctx, grad, fctx.recv_rows, fctx.send_rows)
        if (start, stop) != (0, fctx.width):
            back = torch.nn.functional.pad(back, (start, fctx.width - stop))
        return back, None, None, None, None, None


def all_to_all_rows(ctx: DistContext, x: torch.Tensor, send_rows: list[int], recv_rows: list[int]) -> torch.Tensor:
    """Non-differentiable all_to_all of rows (for statistics routed like gradients)."""
    if not ctx.distributed:
        return x
    return _all_to_all_rows(ctx, x.contiguous(), list(send_rows), list(recv_rows))


def all_to_all(
    ctx: DistContext,
    x: torch.Tensor,
    send_rows: list[int],
    recv_rows: list[int],
    grad_cols: "tuple[int, int] | None" = None,
    sparse: bool = False,
) -> torch.Tensor:
    """Differentiable all_to_all of rows (identity at world size 1); see :class:`AllToAll`.
    ``sparse``: the backward elides zero gradient rows (--sparse_grad_comm)."""
    if not ctx.distributed:
        return x
    return AllToAll.apply(x, ctx, list(send_rows), list(recv_rows), grad_cols, sparse)


def ids_to_float_lanes(ids: torch.Tensor) -> torch.Tensor:
    """int32 [R] -> float32 [R, 1] holding the same bits, so indices travel in the payload buffer."""
    return ids.to(torch.int32).contiguous().view(torch.float32)[:, None]


def float_lanes_to_ids(lanes: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`ids_to_float_lanes`: float32 [R] (bits) -> int64 [R]."""
    return lanes.detach().contiguous().view(torch.int32).long()
