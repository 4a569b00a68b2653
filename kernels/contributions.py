"""Each pixel's largest-contribution record and each record's summed contribution, in one Triton
launch for every tile of every image of a pass: the compositing statistics of ByteSplat's pruning
(§5.2; trainer/prune_scores.py), without materializing the (pixel, Gaussian) pairs.

Definitions, over the pairs (p, r) that gsplat's compositing blends and their weights
w(p, r) = alpha * T_before (kernels.reference.compositing_weights; RasterizeToPixels3DGSFwd.cu's
rules):

    winners[p]     = the record r of pixel p with the largest w(p, r); an exact tie goes to the
                     lower ``keys[r]`` (the global Gaussian index); -1 where p blends nothing
    importance[r] += sum over pixels p of w(p, r)      (float64, units: pixels)

PyTorch reference: :func:`reference_contributions` (compositing_weights, then
:func:`winners_per_pixel`).

Kernel: one program per (image, 16x16 tile), a lane per pixel. It reads the tile's depth-sorted
list BLOCK_K records at a time as a [256, BLOCK_K] block: sigma, alpha and the skip test as the
reference's ``_alphas``; each pixel's log transmittance a float64 running sum of log(1 - alpha)
over the records it keeps (a cumulative sum along the block); a pixel stops before the first kept
record whose log T after it is <= ln(1e-4), as the reference's waves do; w = alpha * exp(log T
before), float32. Per block: one float64 atomic add per record of its sum over the tile's pixels,
and each pixel's best (w, key, record) so far. A program ends when its list does or every pixel of
the tile has stopped. What differs from the reference is float rounding only: log(1 - alpha) where
the reference takes log1p(-alpha), a block's sum in tree order, Triton's exp and log; a pixel's
winner can differ only between records whose weights agree to float32 rounding (tested in
tests/test_contributions.py).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from . import reference
from .constants import TILE_SIZE

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only torch wheels
    triton = None

BLOCK_K = 16  # list positions per block of the kernel's loop
NUM_WARPS = 8  # 256 lanes: one per pixel of a tile
NO_KEY = 2**62  # above every key (keys are Gaussian indices)


def available() -> bool:
    return triton is not None


def runs_on(device: torch.device) -> bool:
    """Whether :func:`contributions` runs on ``device``: a CUDA / ROCm device with Triton."""
    return triton is not None and torch.device(device).type == "cuda"


if triton is not None:

    @triton.jit(do_not_specialize=["n_isects", "n_tiles_all", "n_tiles", "tile_width", "width", "height"])
    def _kernel(
        table_ptr,  # [R, 6] float32: mean x, mean y, conic a, b, c, opacity
        keys_ptr,  # [R] int64
        offsets_ptr,  # [I * n_tiles] int32: first list position of each tile
        flat_ptr,  # [n_isects] int32: record of each list position
        winners_ptr,  # [I * H * W] int64, -1 filled
        importance_ptr,  # [R] float64, zeroed
        n_isects,
        n_tiles_all,
        n_tiles,
        tile_width,
        width,
        height,
        TILE: tl.constexpr,
        BLOCK_K: tl.constexpr,
        MAX_ALPHA: tl.constexpr,
        ALPHA_THRESHOLD: tl.constexpr,
        T_MIN: tl.constexpr,
        NO_KEY: tl.constexpr,
    ):
        tid = tl.program_id(0)
        image = tid // n_tiles
        t = tid - image * n_tiles
        ty = t // tile_width
        tx = t - ty * tile_width
        lane = tl.arange(0, TILE * TILE)
        x = tx * TILE + lane % TILE
        y = ty * TILE + lane // TILE
        inside = (x < width) & (y < height)
        px = x.to(tl.float32) + 0.5
        py = y.to(tl.float32) + 0.5
        start = tl.load(offsets_ptr + tid)
        end = tl.load(offsets_ptr + tid + 1, mask=tid + 1 < n_tiles_all, other=n_isects)
        log_t_min = tl.log(tl.full([TILE * TILE], T_MIN, tl.float32).to(tl.float64))  # the reference's ln(f32(1e-4))
        log_t = tl.zeros([TILE * TILE], dtype=tl.float64)
        done = tl.where(inside, 0, 1)
        best_w = tl.full([TILE * TILE], -1.0, tl.float32)
        best_key = tl.full([TILE * TILE], NO_KEY, tl.int64)
        best_rec = tl.full([TILE * TILE], -1, tl.int64)
        j = start
        live = tl.sum(1 - done, axis=0)
        while (j < end) & (live > 0):
            k = j + tl.arange(0, BLOCK_K)
            in_list = k < end
            rec = tl.load(flat_ptr + k, mask=in_list, other=0).to(tl.int64)
            row = table_ptr + rec * 6
            mx = tl.load(row, mask=in_list, other=0.0)
            my = tl.load(row + 1, mask=in_list, other=0.0)
            a = tl.load(row + 2, mask=in_list, other=0.0)
            b = tl.load(row + 3, mask=in_list, other=0.0)
            c = tl.load(row + 4, mask=in_list, other=0.0)
            o = tl.load(row + 5, mask=in_list, other=0.0)
            key = tl.load(keys_ptr + rec, mask=in_list, other=NO_KEY)
            dx = mx[None, :] - px[:, None]  # [pixels, BLOCK_K]
            dy = my[None, :] - py[:, None]
            sigma = 0.5 * (a[None, :] * dx * dx + c[None, :] * dy * dy) + b[None, :] * dx * dy
            alpha = tl.minimum(o[None, :] * tl.exp(-sigma), MAX_ALPHA)
            keep = (sigma >= 0) & (alpha >= ALPHA_THRESHOLD) & in_list[None, :] & (done == 0)[:, None]
            log_keep = tl.where(keep, tl.log(1.0 - alpha), 0.0).to(tl.float64)
            log_after = log_t[:, None] + tl.cumsum(log_keep, axis=1)  # ln T after each record
            blends = keep & (log_after > log_t_min[:, None])  # a prefix of the kept ones: log_after falls
            stops = keep & (log_after <= log_t_min[:, None])
            weight = tl.where(blends, alpha * tl.exp(log_after - log_keep).to(tl.float32), 0.0)
            sums = tl.sum(weight.to(tl.float64), axis=0)  # [BLOCK_K] over the tile's pixels
            tl.atomic_add(importance_ptr + rec, sums, mask=in_list & (sums > 0))
            bw = tl.max(weight, axis=1)
            tie = blends & (weight == bw[:, None])
            bkey = tl.min(tl.where(tie, key[None, :], NO_KEY), axis=1)
            brec = tl.min(tl.where(tie & (key[None, :] == bkey[:, None]), rec[None, :], NO_KEY), axis=1)
            better = (bkey < NO_KEY) & ((bw > best_w) | ((bw == best_w) & (bkey < best_key)))
            best_w = tl.where(better, bw, best_w)
            best_key = tl.where(better, bkey, best_key)
            best_rec = tl.where(better, brec, best_rec)
            log_t += tl.sum(tl.where(blends, log_keep, 0.0), axis=1)
            done = tl.where(tl.max(stops.to(tl.int32), axis=1) > 0, 1, done)
            live = tl.sum(1 - done, axis=0)
            j += BLOCK_K
        pixel = (image.to(tl.int64) * height + y) * width + x
        tl.store(winners_ptr + pixel, best_rec, mask=inside)


def _record_table(means2d: Tensor, conics: Tensor, opacities: Tensor) -> Tensor:
    """[R, 6] float32 rows (mean x, mean y, conic a, b, c, opacity) of the flattened records."""
    rows = [means2d.reshape(-1, 2), conics.reshape(-1, 3), opacities.reshape(-1, 1)]
    return torch.cat(rows, dim=1).float().contiguous()


def contributions(
    means2d: Tensor,  # [..., N, 2] or [nnz, 2]
    conics: Tensor,  # [..., N, 3] or [nnz, 3]
    opacities: Tensor,  # [..., N] or [nnz]
    keys: Tensor,  # [R] int64, R = the records' count
    image_width: int,
    image_height: int,
    isect_offsets: Tensor,  # [I, tile_height, tile_width] int32
    flatten_ids: Tensor,  # [n_isects] int32
) -> tuple[Tensor, Tensor]:
    """(winners [I * H * W] int64, importance [R] float64) of the module docstring, in one launch
    on a CUDA / ROCm device (or the CPU under TRITON_INTERPRET=1). Records are indexed as
    ``flatten_ids`` indexes them (the flattened dense [I * N] or packed [nnz] records)."""
    table = _record_table(means2d, conics, opacities)
    num_records = table.shape[0]
    tile_height, tile_width = isect_offsets.shape[-2:]
    n_tiles = tile_width * tile_height
    n_tiles_all = isect_offsets.numel()
    num_pixels = (n_tiles_all // max(n_tiles, 1)) * image_height * image_width
    winners = torch.full((num_pixels,), -1, dtype=torch.int64, device=table.device)
    importance = torch.zeros(num_records, dtype=torch.float64, device=table.device)
    if n_tiles_all == 0 or flatten_ids.numel() == 0:
        return winners, importance
    _kernel[(n_tiles_all,)](
        table,
        keys.to(torch.int64).contiguous(),
        isect_offsets.reshape(-1).to(torch.int32).contiguous(),
        flatten_ids.to(torch.int32).contiguous(),
        winners,
        importance,
        flatten_ids.numel(),
        n_tiles_all,
        n_tiles,
        tile_width,
        image_width,
        image_height,
        TILE=TILE_SIZE,
        BLOCK_K=BLOCK_K,
        MAX_ALPHA=reference.MAX_ALPHA,
        ALPHA_THRESHOLD=reference.ALPHA_THRESHOLD,
        T_MIN=reference.TRANSMITTANCE_MIN,
        NO_KEY=NO_KEY,
        num_warps=NUM_WARPS,
    )
    return winners, importance


# ---------------------------------------------------------------- REFERENCE (plain PyTorch)


def winners_per_pixel(pixel_ids: Tensor, record_ids: Tensor, weights: Tensor, keys: Tensor, num_pixels: int) -> Tensor:
    """Each pixel's largest-weight record: pixel_ids, record_ids, weights [M] (the pairs of
    kernels.reference.compositing_weights), keys [R] int64 (an exact tie goes to the lower key;
    a pixel's records have distinct keys). Returns [num_pixels] int64 record ids, -1 where a
    pixel has no pair."""
    winners = torch.full((num_pixels,), -1, dtype=torch.int64, device=record_ids.device)
    if pixel_ids.numel() == 0:
        return winners
    best = torch.full((num_pixels,), -math.inf, dtype=weights.dtype, device=weights.device)
    best.scatter_reduce_(0, pixel_ids, weights, "amax")
    is_best = weights == best[pixel_ids]
    rec_keys = keys[record_ids]
    best_key = torch.full((num_pixels,), NO_KEY, dtype=torch.int64, device=keys.device)
    best_key.scatter_reduce_(0, pixel_ids, torch.where(is_best, rec_keys, NO_KEY), "amin")
    win = is_best & (rec_keys == best_key[pixel_ids])
    winners[pixel_ids[win]] = record_ids[win]
    return winners


def reference_contributions(
    means2d: Tensor,
    conics: Tensor,
    opacities: Tensor,
    keys: Tensor,
    image_width: int,
    image_height: int,
    isect_offsets: Tensor,
    flatten_ids: Tensor,
    packed: bool = False,
) -> tuple[Tensor, Tensor]:
    """REFERENCE of :func:`contributions`, same arguments (``packed``: the records are [nnz, ...])
    and results, from kernels.reference.compositing_weights's pairs."""
    pixel_ids, record_ids, weights, _ = reference.compositing_weights(
        means2d, conics, opacities, image_width, image_height, TILE_SIZE, isect_offsets, flatten_ids, packed=packed
    )
    n_tiles = isect_offsets.shape[-1] * isect_offsets.shape[-2]
    num_pixels = (isect_offsets.numel() // max(n_tiles, 1)) * image_height * image_width
    importance = torch.zeros(opacities.numel(), dtype=torch.float64, device=opacities.device)
    importance.index_add_(0, record_ids, weights.double())
    return winners_per_pixel(pixel_ids, record_ids, weights, keys, num_pixels), importance
