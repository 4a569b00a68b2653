"""Zero-eliding encoder and decoder of gradient records (ByteSplat §6.2, Fig. 9).

In the backward all_to_all most gradient rows are exactly zero (records that reached no pixel).
The encoder keeps one bit per row, set when the row holds any nonzero value, and packs the
nonzero rows contiguously in row order; the decoder uses the bitmap to put each packed row back
at its position, either copying it (``decode_copy``), adding it in place (``decode_add``), or adding
it into a buffer indexed by an arbitrary row -> target map with atomics (``decode_index_add``,
the owner-side aggregation of §6.2).

Format, for a chunk of R rows of D float32 lanes:
    bitmap  int32 [ceil(R / 32)]   bit (r % 32) of word r // 32 is row r's; bits past R are 0
    rows    float32 [nnz, D]       the rows whose bit is set, in row order (bitwise copies)

"Nonzero" is decided on the bits: a lane is nonzero unless it is +0.0 or -0.0, so NaN and Inf
rows are always kept (a NaN is never dropped) and a row of -0.0 is elided (decoded as +0.0).

Kernels are Triton with no warp-size assumption and no vendor intrinsics (word building and
counting are reductions over a [words, 32] tile, not ballot/popc), so the same source runs on
NVIDIA, AMD and, under ``TRITON_INTERPRET=1``, on the CPU. The public functions dispatch on the
tensor's device: CUDA/ROCm tensors (or any tensor when the interpreter is on) use the kernels,
CPU tensors otherwise use the ``reference_*`` functions below. Triton fixes compiled-vs-interpreted
when a kernel is defined, so ``TRITON_INTERPRET`` must be set before this module is imported.

The plain-PyTorch references live here rather than in kernels/reference.py (the renderer's
reference module) to keep the exchange's format in one file; each kernel is tested against them.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

try:  # the CPU-only torch wheel ships without Triton; the references then serve every call
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the environment
    triton = None

WORD_BITS = 32  # rows per bitmap word
BLOCK_ROWS = 128  # rows per program (4 words); any multiple of WORD_BITS works
# Triton decides compiled vs interpreted when the kernels below are defined (at import), so this
# constant, read at the same moment, says whether CPU tensors can be handed to them.
_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"


def num_words(num_rows: int) -> int:
    """Bitmap words (int32) for num_rows rows: ceil(num_rows / 32)."""
    return (num_rows + WORD_BITS - 1) // WORD_BITS


def _use_kernels(t: Tensor) -> bool:
    return triton is not None and (t.device.type == "cuda" or _INTERPRETED)


def _check_rows(name: str, x: Tensor) -> None:
    if x.dtype != torch.float32 or x.dim() != 2:
        raise ValueError(f"{name} must be float32 [R, D], got {x.dtype} {tuple(x.shape)}")


def _check_bitmap(bitmap: Tensor, num_rows: int) -> None:
    if bitmap.dtype != torch.int32 or bitmap.shape != (num_words(num_rows),):
        raise ValueError(
            f"bitmap must be int32 [{num_words(num_rows)}] for {num_rows} rows, "
            f"got {bitmap.dtype} {tuple(bitmap.shape)}"
        )


# ------------------------------------------------------------------------------------------------
# References (plain PyTorch): the definition of the format
# ------------------------------------------------------------------------------------------------


def reference_row_mask(grad: Tensor) -> Tensor:
    """float32 [R, D] -> bool [R]: rows with a lane that is neither +0.0 nor -0.0 (NaN counts)."""
    return ((grad.view(torch.int32) & 0x7FFFFFFF) != 0).any(dim=1)


def reference_pack_bits(mask: Tensor) -> Tensor:
    """bool [R] -> int32 [ceil(R / 32)]: bit r % 32 of word r // 32 is mask[r]."""
    padded = mask.new_zeros(num_words(mask.shape[0]) * WORD_BITS)
    padded[: mask.shape[0]] = mask
    shifts = torch.arange(WORD_BITS, device=mask.device, dtype=torch.int64)
    words = (padded.view(-1, WORD_BITS).long() << shifts).sum(dim=1)  # in [0, 2^32)
    return (words - (words >= 2**31).long() * 2**32).to(torch.int32)  # two's complement wrap


def reference_unpack_bits(bitmap: Tensor, num_rows: int) -> Tensor:
    """int32 [ceil(R / 32)] -> bool [R] (inverse of :func:`reference_pack_bits`)."""
    shifts = torch.arange(WORD_BITS, device=bitmap.device, dtype=torch.int64)
    bits = (bitmap.long()[:, None] >> shifts) & 1
    return bits.flatten()[:num_rows].bool()


def reference_encode(grad: Tensor) -> tuple[Tensor, Tensor]:
    """float32 [R, D] -> (bitmap int32 [ceil(R / 32)], rows float32 [nnz, D])."""
    mask = reference_row_mask(grad)
    return reference_pack_bits(mask), grad[mask]


def _reference_decode_mask(out: Tensor, bitmap: Tensor, rows: Tensor) -> Tensor:
    mask = reference_unpack_bits(bitmap, out.shape[0])
    if int(mask.sum()) != rows.shape[0]:
        raise ValueError(f"bitmap has {int(mask.sum())} set bits but {rows.shape[0]} rows were given")
    return mask


def reference_decode_copy(out: Tensor, bitmap: Tensor, rows: Tensor) -> Tensor:
    """out[r] = the packed row of r for every set bit r (bitwise copy); other rows untouched."""
    out[_reference_decode_mask(out, bitmap, rows)] = rows
    return out


def reference_decode_add(out: Tensor, bitmap: Tensor, rows: Tensor) -> Tensor:
    """out[r] += the packed row of r for every set bit r; other rows untouched."""
    out[_reference_decode_mask(out, bitmap, rows)] += rows
    return out


def reference_decode_index_add(out: Tensor, index: Tensor, bitmap: Tensor, rows: Tensor) -> Tensor:
    """out[index[r]] += the packed row of r for every set bit r (duplicate targets add up)."""
    mask = reference_unpack_bits(bitmap, index.shape[0])
    if int(mask.sum()) != rows.shape[0]:
        raise ValueError(f"bitmap has {int(mask.sum())} set bits but {rows.shape[0]} rows were given")
    return out.index_add_(0, index[mask].long(), rows)


# ------------------------------------------------------------------------------------------------
# Triton kernels. Every program owns BLOCK_R consecutive rows (BLOCK_R / 32 whole words); row
# offsets are int64 so R * D may exceed 2^31. Data is read through int32 views of the float32
# buffers: the zero test looks at bits and the copies are bitwise.
# ------------------------------------------------------------------------------------------------

if triton is not None:

    @triton.jit
    def _bit_or(a, b):
        return a | b

    @triton.jit
    def _row_bits(bitmap_ptr, rows, num_rows):
        """Bit of each row in `rows` (int64 [BLOCK_R]) as int32 0/1; 0 past num_rows."""
        valid = rows < num_rows
        words = tl.load(bitmap_ptr + rows // 32, mask=valid, other=0)
        return ((words >> (rows % 32).to(tl.int32)) & 1) * valid.to(tl.int32)

    @triton.jit
    def _mark_kernel(bits_ptr, bitmap_ptr, counts_ptr, num_rows, D, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
        """bits int32 [R, D] -> bitmap words of this block and its count of set rows."""
        pid = tl.program_id(0)
        rows = pid.to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
        valid = rows < num_rows
        nonzero = tl.zeros([BLOCK_R], dtype=tl.int32)
        for d0 in range(0, D, BLOCK_D):
            lanes = d0 + tl.arange(0, BLOCK_D)
            m = valid[:, None] & (lanes < D)[None, :]
            x = tl.load(bits_ptr + rows[:, None] * D + lanes[None, :], mask=m, other=0)
            lane_nz = ((x & 0x7FFFFFFF) != 0).to(tl.int32)  # +-0.0 are the only zeros
            nonzero = nonzero | tl.max(lane_nz, axis=1)
        shifts = tl.arange(0, 32)
        words = tl.reduce(tl.reshape(nonzero, [BLOCK_R // 32, 32]) << shifts[None, :], 1, _bit_or)
        word_ids = pid.to(tl.int64) * (BLOCK_R // 32) + tl.arange(0, BLOCK_R // 32)
        tl.store(bitmap_ptr + word_ids, words, mask=word_ids * 32 < num_rows)
        tl.store(counts_ptr + pid, tl.sum(nonzero, axis=0))

    @triton.jit
    def _count_kernel(bitmap_ptr, counts_ptr, num_rows, BLOCK_R: tl.constexpr):
        """Set bits of this block's rows (per-block popcount without a vendor intrinsic)."""
        pid = tl.program_id(0)
        rows = pid.to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
        tl.store(counts_ptr + pid, tl.sum(_row_bits(bitmap_ptr, rows, num_rows), axis=0))

    @triton.jit
    def _compact_kernel(
        bits_ptr, bitmap_ptr, offsets_ptr, packed_ptr, num_rows, D, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr
    ):
        """Copy the set rows of this block to packed[offsets[pid] + rank among set rows]."""
        pid = tl.program_id(0)
        rows = pid.to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
        keep = _row_bits(bitmap_ptr, rows, num_rows)
        dest = tl.load(offsets_ptr + pid) + tl.cumsum(keep, axis=0) - keep  # exclusive scan
        for d0 in range(0, D, BLOCK_D):
            lanes = d0 + tl.arange(0, BLOCK_D)
            m = (keep != 0)[:, None] & (lanes < D)[None, :]
            x = tl.load(bits_ptr + rows[:, None] * D + lanes[None, :], mask=m)
            tl.store(packed_ptr + dest.to(tl.int64)[:, None] * D + lanes[None, :], x, mask=m)

    @triton.jit
    def _scatter_kernel(
        out_ptr,
        index_ptr,
        bitmap_ptr,
        offsets_ptr,
        packed_ptr,
        num_rows,
        D,
        MODE: tl.constexpr,
        BLOCK_R: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        """Packed rows back to their rows. MODE 0: out[r] = row (bitwise); 1: out[r] += row;
        2: atomic out[index[r]] += row."""
        pid = tl.program_id(0)
        rows = pid.to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
        keep = _row_bits(bitmap_ptr, rows, num_rows)
        src = tl.load(offsets_ptr + pid) + tl.cumsum(keep, axis=0) - keep
        if MODE == 2:
            target = tl.load(index_ptr + rows, mask=keep != 0, other=0).to(tl.int64)
        else:
            target = rows
        for d0 in range(0, D, BLOCK_D):
            lanes = d0 + tl.arange(0, BLOCK_D)
            m = (keep != 0)[:, None] & (lanes < D)[None, :]
            x = tl.load(packed_ptr + src.to(tl.int64)[:, None] * D + lanes[None, :], mask=m)
            dst = out_ptr + target[:, None] * D + lanes[None, :]
            if MODE == 0:
                tl.store(dst, x, mask=m)
            elif MODE == 1:
                tl.store(dst, tl.load(dst, mask=m) + x, mask=m)
            else:
                tl.atomic_add(dst, x, mask=m)


def _block_d(d: int) -> int:
    return min(triton.next_power_of_2(max(d, 1)), 64)


def _exclusive_offsets(counts: Tensor) -> tuple[Tensor, int]:
    """Per-block counts int32 [B] -> (exclusive prefix sums int32 [B], total). One host sync."""
    inclusive = torch.cumsum(counts, dim=0, dtype=torch.int32)
    return inclusive - counts, int(inclusive[-1])


# ------------------------------------------------------------------------------------------------
# Public API
# ------------------------------------------------------------------------------------------------


def encode(grad: Tensor) -> tuple[Tensor, Tensor]:
    """Elide the zero rows of a gradient chunk.

    grad: float32 [R, D] (any device; made contiguous).
    Returns (bitmap int32 [ceil(R / 32)], rows float32 [nnz, D]): bit r set iff row r has a lane
    other than +-0.0 (NaN and Inf count as nonzero), and those rows in order, bitwise copies.
    Two passes on the GPU: mark (bitmap + per-block counts), prefix sum, compact; the nnz read
    for allocating `rows` is one host sync. Raises ValueError unless grad is float32 2-D.
    """
    _check_rows("grad", grad)
    num_rows, d = grad.shape
    if not _use_kernels(grad):
        return reference_encode(grad)
    bitmap = torch.zeros(num_words(num_rows), dtype=torch.int32, device=grad.device)
    if num_rows == 0 or d == 0:
        return bitmap, grad.new_empty(0, d)
    bits = grad.contiguous().view(torch.int32)
    num_blocks = triton.cdiv(num_rows, BLOCK_ROWS)
    counts = torch.empty(num_blocks, dtype=torch.int32, device=grad.device)
    _mark_kernel[(num_blocks,)](bits, bitmap, counts, num_rows, d, BLOCK_R=BLOCK_ROWS, BLOCK_D=_block_d(d))
    offsets, nnz = _exclusive_offsets(counts)
    packed = torch.empty(nnz, d, dtype=torch.int32, device=grad.device)
    if nnz:
        _compact_kernel[(num_blocks,)](
            bits, bitmap, offsets, packed, num_rows, d, BLOCK_R=BLOCK_ROWS, BLOCK_D=_block_d(d)
        )
    return bitmap, packed.view(torch.float32)


def _decode(out: Tensor, index: Tensor | None, bitmap: Tensor, rows: Tensor, mode: int) -> Tensor:
    num_rows = out.shape[0] if index is None else index.shape[0]
    num_blocks = triton.cdiv(num_rows, BLOCK_ROWS)
    if num_blocks == 0:
        if rows.shape[0]:
            raise ValueError(f"bitmap has 0 set bits but {rows.shape[0]} rows were given")
        return out
    counts = torch.empty(num_blocks, dtype=torch.int32, device=out.device)
    _count_kernel[(num_blocks,)](bitmap, counts, num_rows, BLOCK_R=BLOCK_ROWS)
    offsets, nnz = _exclusive_offsets(counts)
    if nnz != rows.shape[0]:
        raise ValueError(f"bitmap has {nnz} set bits but {rows.shape[0]} rows were given")
    if nnz == 0 or out.shape[1] == 0:
        return out
    # mode 0 copies bits (int32 views keep -0.0 and NaN payloads); the others add floats
    dst, src = out, rows.contiguous()
    if mode == 0:
        dst, src = dst.view(torch.int32), src.view(torch.int32)
    index_arg = index if index is not None else bitmap  # any pointer: only mode 2 reads it
    _scatter_kernel[(num_blocks,)](
        dst,
        index_arg,
        bitmap,
        offsets,
        src,
        num_rows,
        out.shape[1],
        MODE=mode,
        BLOCK_R=BLOCK_ROWS,
        BLOCK_D=_block_d(out.shape[1]),
    )
    return out


def _check_decode(out: Tensor, bitmap: Tensor, rows: Tensor, num_rows: int) -> None:
    _check_rows("out", out)
    _check_rows("rows", rows)
    _check_bitmap(bitmap, num_rows)
    if rows.shape[1] != out.shape[1]:
        raise ValueError(f"rows have {rows.shape[1]} lanes, out has {out.shape[1]}")
    if not out.is_contiguous():
        raise ValueError("out must be contiguous (it is written in place)")


def decode_copy(out: Tensor, bitmap: Tensor, rows: Tensor) -> Tensor:
    """Write each packed row into its row of out, bitwise; rows with clear bits stay untouched.

    out: float32 [R, D] contiguous, written in place and returned; bitmap: int32 [ceil(R / 32)]
    from :func:`encode`; rows: float32 [nnz, D]. Decoding into zeros rebuilds the encoded chunk
    exactly (elided -0.0 rows come back as +0.0). Raises ValueError on a shape/dtype mismatch or
    when nnz differs from the number of set bits (one host sync on the GPU).
    """
    _check_decode(out, bitmap, rows, out.shape[0])
    if not _use_kernels(out):
        return reference_decode_copy(out, bitmap, rows)
    return _decode(out, None, bitmap, rows, mode=0)


def decode_add(out: Tensor, bitmap: Tensor, rows: Tensor) -> Tensor:
    """Add each packed row into its row of out, in place; rows with clear bits stay untouched.

    Shapes, return and errors as :func:`decode_copy`. Each row has one source, so no atomics.
    """
    _check_decode(out, bitmap, rows, out.shape[0])
    if not _use_kernels(out):
        return reference_decode_add(out, bitmap, rows)
    return _decode(out, None, bitmap, rows, mode=1)


def decode_index_add(out: Tensor, index: Tensor, bitmap: Tensor, rows: Tensor) -> Tensor:
    """Add packed row of r into out[index[r]] for every set bit r, in place (ByteSplat §6.2's
    owner-side aggregation: rows of one Gaussian from several records add up, with atomics, so
    the summation order, and the last bits of a sum, may vary between runs on a GPU).

    out: float32 [M, D] contiguous; index: int32/int64 [R] with values in [0, M) (not checked on
    the GPU); bitmap: int32 [ceil(R / 32)]; rows: float32 [nnz, D]. Errors as :func:`decode_copy`.
    """
    if index.dim() != 1 or index.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"index must be int32/int64 [R], got {index.dtype} {tuple(index.shape)}")
    _check_decode(out, bitmap, rows, index.shape[0])
    if not _use_kernels(out):
        return reference_decode_index_add(out, index, bitmap, rows)
    return _decode(out, index.contiguous(), bitmap, rows, mode=2)
