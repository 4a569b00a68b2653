"""Zero-eliding reverse all_to_all of gradient rows (ByteSplat §6.2, Fig. 9).

The drop-in replacement of the backward of :class:`splat_train.trainer.exchange.AllToAll`
(``_all_to_all_rows(ctx, grad, recv_rows, send_rows)``): the gradient rows of the records this
rank received in forward go back to the ranks that sent them, but rows that are exactly zero
(records that reached no pixel, most of them in the dense exchange) do not travel. Each peer's
chunk is sent as a bitmap (one bit per row) followed by its nonzero rows, packed
(:mod:`splat_train.kernels.sparse_comm`); the receiver decodes each source's chunk into a zeroed
output at that source's offset. The result equals the dense exchange's bit for bit, except that a
row made only of -0.0 comes back as +0.0 (same value; it was elided as zero).

Two collectives per call:
1. all_to_all of one int64 per peer: how many nonzero rows this rank sends each peer;
2. one all_to_all_single of a flat float32 buffer; the part for peer j is
   ``[bitmap words of chunk j (int32 bits in float32 lanes), ceil(n_j / 32)] + [nnz_j * D rows]``
   (a flat buffer, so the bitmap needs no padding to whole rows).
The self chunk never enters the network: it is copied as it is (exact, zero rows included);
under ``--loopback`` (one rank, whose only chunk is its own) it is encoded, sent to itself and
decoded as a peer's chunk would be, so that the loopback run does the work of the zero elision.
The bytes recorded are those to and from other ranks only (zero at loopback).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from splat_train.kernels.sparse_comm import decode_copy, encode, num_words

from .launch import DistContext


def sparse_all_to_all_rows(
    ctx: DistContext, grad: torch.Tensor, recv_rows: list[int], send_rows: list[int]
) -> torch.Tensor:
    """Reverse all_to_all of gradient rows with zero rows elided.

    grad: float32 [sum(recv_rows), D] on ctx.comm_device; chunk j (recv_rows[j] rows, in rank
    order) is the gradient of the rows received from rank j in forward and goes back to rank j.
    recv_rows / send_rows: the forward exchange's per-rank row counts, as in ``AllToAll``.
    Returns float32 [sum(send_rows), D]: chunk j holds rank j's gradient of the send_rows[j] rows
    this rank sent it, at the same positions as the dense exchange puts them.

    Records ``ctx.stats.record("all_to_all_sparse", sent, received)`` once per collective (the
    counts, then the payload), in bytes to/from peers other than this rank. Needs the distributed
    path (``ctx.distributed``: at world size 1 without --loopback the exchange is the identity and
    this is never called). Raises
    ValueError when grad is not float32 [sum(recv_rows), D] or a split list has the wrong length.
    """
    world_size, me = ctx.world_size, ctx.rank
    if len(recv_rows) != world_size or len(send_rows) != world_size:
        raise ValueError(
            f"recv_rows and send_rows need {world_size} entries, got {len(recv_rows)} and {len(send_rows)}"
        )
    if grad.dtype != torch.float32 or grad.dim() != 2 or grad.shape[0] != sum(recv_rows):
        raise ValueError(f"grad must be float32 [{sum(recv_rows)}, D], got {grad.dtype} {tuple(grad.shape)}")
    assert ctx.distributed, "sparse_all_to_all_rows is only called on the distributed path"
    assert recv_rows[me] == send_rows[me], "the self chunk has one size both ways"
    d = grad.shape[1]
    grad = grad.contiguous()
    chunks = torch.split(grad, recv_rows, dim=0)

    travels = [j != me or ctx.loopback for j in range(world_size)]  # the chunks that are encoded and sent

    # 1. encode every travelling chunk and exchange the nonzero-row counts
    encoded = [encode(chunks[j]) if travels[j] else None for j in range(world_size)]
    send_nnz = torch.tensor([0 if e is None else e[1].shape[0] for e in encoded], dtype=torch.int64)
    recv_counts = torch.empty_like(send_nnz, device=ctx.comm_device)
    dist.all_to_all_single(recv_counts, send_nnz.to(ctx.comm_device), group=ctx.group)
    ctx.stats.record("all_to_all_sparse", 8 * (world_size - 1), 8 * (world_size - 1))
    recv_nnz: list[int] = recv_counts.cpu().tolist()

    # 2. one all_to_all of [bitmap bits | packed rows] per travelling chunk (self: only at loopback)
    parts = []
    for e in encoded:
        if e is not None:
            parts += [e[0].view(torch.float32), e[1].reshape(-1)]
    send_buf = torch.cat(parts) if parts else grad.new_empty(0)
    in_splits = [num_words(recv_rows[j]) + int(send_nnz[j]) * d if travels[j] else 0 for j in range(world_size)]
    out_splits = [num_words(send_rows[j]) + recv_nnz[j] * d if travels[j] else 0 for j in range(world_size)]
    recv_buf = grad.new_empty(sum(out_splits))
    dist.all_to_all_single(
        recv_buf, send_buf, output_split_sizes=out_splits, input_split_sizes=in_splits, group=ctx.group
    )
    off_rank = [j != me for j in range(world_size)]
    ctx.stats.record(
        "all_to_all_sparse",
        4 * sum(n for n, peer in zip(in_splits, off_rank) if peer),
        4 * sum(n for n, peer in zip(out_splits, off_rank) if peer),
    )

    # 3. decode each source's chunk into the zeroed output at that source's offset
    out = grad.new_zeros(sum(send_rows), d)
    out_chunks = torch.split(out, send_rows, dim=0)
    for j, (part, dst) in enumerate(zip(torch.split(recv_buf, out_splits), out_chunks)):
        if not travels[j]:
            dst.copy_(chunks[me])
            continue
        words = num_words(send_rows[j])
        bitmap = part[:words].view(torch.int32)
        decode_copy(dst, bitmap, part[words:].view(recv_nnz[j], d))
    return out
