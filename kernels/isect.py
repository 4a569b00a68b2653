"""Tile lists of a dense pass with two short sorts in place of one long one.

gsplat's isect_tiles (IntersectTile.cu) lists every (record, tile) intersection with a 64-bit key
``image << (32 + tile_bits) | tile << 32 | float32-bits(depth)`` and radix-sorts the keys over
their 32 + tile_bits + image_bits bits: six 8-bit passes over every intersection at 1920x1080 (13
tile bits), each moving the 8-byte key and the 4-byte record index. At 20 M visible Gaussians that
is 45.5 M intersections and the step's third-largest stage.

Here the same lists come from

1. the records' depth order: a stable sort of the visible records' float32 depths (4 passes over
   the records, not the intersections; invisible records, radii 0, take no part);
2. the intersections written in that order (one Triton program per block of depth-sorted records),
   each as its (image, tile) index, int16 where image x tiles fit (else int32), and its record;
3. a stable sort of those indices: 2 passes over the intersections at int16.

Within a tile the stable sort keeps the depth order, and records of equal depth keep their record
order (the presort is stable too), which is where gsplat's stable radix sort puts them: the tile
offsets and ``flatten_ids`` equal gsplat's (isect_offset_encode's semantics for the offsets: each
(image, tile)'s first entry, an empty tile the next one's). A tile covers [floor(m/ts - r/ts),
ceil(m/ts + r/ts)) per axis, clamped to the grid, as in kernels.reference.isect_tiles; the scaling by
1 / tile_size is exact for a power-of-two tile size, which is required.

The Triton kernels run on a CUDA/ROCm device (or the CPU under TRITON_INTERPRET=1); elsewhere their
PyTorch forms in this module (:func:`tile_counts_reference`, :func:`write_reference`) take their
place. The whole pipeline is tested against kernels.reference.isect_tiles / isect_offset_encode.
"""

from __future__ import annotations

import os
from typing import Optional, Tuple

import torch
from torch import Tensor

try:  # the CPU-only torch wheel may ship without Triton
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

BLOCK = 256
INT16_KEYS = 1 << 15  # image x tile indices below this fit int16 keys


def available() -> bool:
    return triton is not None


if triton is not None:

    @triton.jit
    def _tile_box(means_ptr, radii_ptr, rec, mask, inv_ts, tw, th):
        """Tile box [x0, x1) x [y0, y1) of records ``rec`` (empty where a radius is 0)."""
        rx = tl.load(radii_ptr + 2 * rec, mask=mask, other=0)
        ry = tl.load(radii_ptr + 2 * rec + 1, mask=mask, other=0)
        mx = tl.load(means_ptr + 2 * rec, mask=mask, other=0.0) * inv_ts
        my = tl.load(means_ptr + 2 * rec + 1, mask=mask, other=0.0) * inv_ts
        fx = rx.to(tl.float32) * inv_ts
        fy = ry.to(tl.float32) * inv_ts
        x0 = tl.minimum(tl.maximum(tl.floor(mx - fx), 0.0), tw * 1.0).to(tl.int32)
        x1 = tl.minimum(tl.maximum(tl.ceil(mx + fx), 0.0), tw * 1.0).to(tl.int32)
        y0 = tl.minimum(tl.maximum(tl.floor(my - fy), 0.0), th * 1.0).to(tl.int32)
        y1 = tl.minimum(tl.maximum(tl.ceil(my + fy), 0.0), th * 1.0).to(tl.int32)
        hit = mask & (rx > 0) & (ry > 0)
        x1 = tl.where(hit, x1, x0)
        y1 = tl.where(hit, y1, y0)
        return x0, x1, y0, y1

    @triton.jit(do_not_specialize=["num"])
    def _count_kernel(means_ptr, radii_ptr, counts_ptr, num, inv_ts, tw, th, BLOCK: tl.constexpr):
        rec = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = rec < num
        x0, x1, y0, y1 = _tile_box(means_ptr, radii_ptr, rec, mask, inv_ts, tw, th)
        tl.store(counts_ptr + rec, (x1 - x0) * (y1 - y0), mask=mask)

    @triton.jit(do_not_specialize=["num", "n_per_image"])
    def _write_kernel(
        means_ptr, radii_ptr, recs_ptr, starts_ptr, keys_ptr, ids_ptr, num, n_per_image, inv_ts, tw, th,
        BLOCK: tl.constexpr,
    ):  # fmt: skip
        pos = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = pos < num
        rec = tl.load(recs_ptr + pos, mask=mask, other=0).to(tl.int64)
        start = tl.load(starts_ptr + pos, mask=mask, other=0)
        x0, x1, y0, y1 = _tile_box(means_ptr, radii_ptr, rec, mask, inv_ts, tw, th)
        w = x1 - x0
        count = w * (y1 - y0)
        base = (rec // n_per_image) * (tw * th) + y0 * tw + x0  # (image, tile) index of the box's corner
        w_safe = tl.maximum(w, 1)
        for j in range(0, tl.max(count, 0)):
            live = j < count
            key = base + (j // w_safe) * tw + (j % w_safe)
            tl.store(keys_ptr + start + j, key.to(keys_ptr.dtype.element_ty), mask=live)
            tl.store(ids_ptr + start + j, rec.to(tl.int32), mask=live)


def _tile_box_reference(means2d: Tensor, radii: Tensor, tile_size: int, tw: int, th: int) -> Tensor:
    """[R, 4] int64 (x0, x1, y0, y1) of the flattened records, as the kernels' ``_tile_box``."""
    inv = 1.0 / tile_size
    m = means2d.reshape(-1, 2).float() * inv
    r = radii.reshape(-1, 2).float() * inv
    grid = torch.tensor([tw, th], dtype=torch.float32, device=m.device)
    lo = torch.minimum(torch.floor(m - r).clamp(min=0), grid).long()
    hi = torch.minimum(torch.ceil(m + r).clamp(min=0), grid).long()
    hit = (radii.reshape(-1, 2) > 0).all(-1, keepdim=True)
    hi = torch.where(hit, hi, lo)
    return torch.stack([lo[:, 0], hi[:, 0], lo[:, 1], hi[:, 1]], -1)


def tile_counts_reference(means2d: Tensor, radii: Tensor, tile_size: int, tw: int, th: int) -> Tensor:
    """[R] int32: the tiles each flattened record covers (0 where a radius is 0)."""
    box = _tile_box_reference(means2d, radii, tile_size, tw, th)
    return ((box[:, 1] - box[:, 0]) * (box[:, 3] - box[:, 2])).int()


def write_reference(
    means2d: Tensor, radii: Tensor, recs: Tensor, starts: Tensor, keys: Tensor, ids: Tensor, n_per_image: int,
    tile_size: int, tw: int, th: int,
) -> None:  # fmt: skip
    """What ``_write_kernel`` writes: for the i-th record of ``recs``, its tiles row-major from
    ``starts[i]``, ``keys`` its (image, tile) indices and ``ids`` the record."""
    box = _tile_box_reference(means2d, radii, tile_size, tw, th)[recs]
    w = box[:, 1] - box[:, 0]
    count = w * (box[:, 3] - box[:, 2])
    owner = torch.repeat_interleave(torch.arange(len(recs), device=recs.device), count)
    j = torch.arange(len(owner), device=recs.device) - (torch.cumsum(count, 0) - count)[owner]
    ws = w[owner]
    tile = (box[owner, 2] + j // ws) * tw + box[owner, 0] + j % ws
    at = starts[owner] + j
    keys[at] = ((recs[owner] // n_per_image) * (tw * th) + tile).to(keys.dtype)
    ids[at] = recs[owner].to(ids.dtype)


def _use_kernels(t: Tensor) -> bool:
    return triton is not None and (t.is_cuda or os.environ.get("TRITON_INTERPRET") == "1")


@torch.no_grad()
def tile_lists(
    means2d: Tensor, radii: Tensor, depths: Tensor, tile_size: int, tile_width: int, tile_height: int,
    out: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:  # fmt: skip
    """The tile lists of a dense pass: (offsets [C, tile_height, tile_width] int32, flatten_ids
    [n_isects] int32), equal to gsplat's isect_tiles + isect_offset_encode.

    means2d [C, N, 2] float32 (pixels), radii [C, N, 2] int32 (0: not seen), depths [C, N] float32
    (positive where seen). ``out``: an int32 buffer for flatten_ids, used where it holds all
    n_isects entries (the returned tensor is then its head; else a new tensor). One host
    synchronization (the visible records' count and the intersections' total). Raises ValueError
    for shapes that disagree, a tile size that is not a power of two, or more than 2^31 - 1
    intersections.
    """
    if means2d.dim() != 3 or radii.shape != means2d.shape or depths.shape != means2d.shape[:2]:
        shapes = f"means2d {tuple(means2d.shape)}, radii {tuple(radii.shape)}, depths {tuple(depths.shape)}"
        raise ValueError(f"tile_lists: {shapes}; expected [C, N, 2], [C, N, 2], [C, N]")
    if tile_size <= 0 or tile_size & (tile_size - 1):
        raise ValueError(f"tile_lists: tile_size {tile_size} is not a power of two")
    C, N = depths.shape
    device = means2d.device
    n_keys = C * tile_width * tile_height
    key_dtype = torch.int16 if n_keys < INT16_KEYS else torch.int32
    means = means2d.contiguous().float()
    rad = radii.contiguous().int()
    kernels = _use_kernels(means)
    R = C * N
    if kernels and R:
        counts = torch.empty(R, dtype=torch.int32, device=device)
        grid = (triton.cdiv(R, BLOCK),)
        _count_kernel[grid](means, rad, counts, R, 1.0 / tile_size, tile_width, tile_height, BLOCK=BLOCK)
    else:
        counts = tile_counts_reference(means, rad, tile_size, tile_width, tile_height)
    total_t = counts.sum(dtype=torch.int64)
    visible = torch.nonzero(counts).squeeze(1)  # synchronizes: its length
    total = int(total_t.item())  # already computed: no second wait
    if total >= 2**31:
        raise ValueError(f"tile_lists: {total} intersections do not fit int32 flatten_ids")
    order = torch.sort(depths.reshape(-1)[visible].float(), stable=True).indices
    recs = visible[order]
    ends = torch.cumsum(counts[recs], 0)
    starts = ends - counts[recs]
    keys = torch.empty(total, dtype=key_dtype, device=device)
    ids = torch.empty(total, dtype=torch.int32, device=device)
    if kernels and len(recs):
        grid = (triton.cdiv(len(recs), BLOCK),)
        _write_kernel[grid](
            means, rad, recs, starts, keys, ids, len(recs), N, 1.0 / tile_size, tile_width, tile_height, BLOCK=BLOCK
        )
    elif len(recs):
        write_reference(means, rad, recs, starts, keys, ids, N, tile_size, tile_width, tile_height)
    sorted_keys, perm = torch.sort(keys, stable=True)
    if out is not None and out.dtype == torch.int32 and out.is_contiguous() and out.numel() >= total:
        flatten_ids = torch.index_select(ids, 0, perm, out=out[:total])
    else:
        flatten_ids = ids[perm]
    queries = torch.arange(n_keys, dtype=key_dtype, device=device)
    offsets = torch.searchsorted(sorted_keys, queries).int()
    return offsets.reshape(C, tile_height, tile_width), flatten_ids


def presort_pays(num_records: int) -> bool:
    """Whether :func:`tile_lists` takes the place of gsplat's isect_tiles for a pass of this many
    records (cameras x Gaussians): from :data:`PRESORT_MIN_RECORDS` on, where the intersections'
    64-bit sort outweighs the presort's extra launches (on a small model the step is bound by the
    host, and gsplat's one call launches less)."""
    return num_records >= PRESORT_MIN_RECORDS


PRESORT_MIN_RECORDS = 2_000_000
