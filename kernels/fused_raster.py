"""Fused rasterization + tile-local loss + backward rasterization in ONE native kernel (ByteSplat §4).

One block per (image, 16x16 tile), whatever the number of Gaussians in the tile, composites its
pixels front to back, computes the photometric loss of its pixels against the ground truth and
dL/dpixel in shared memory, then runs the backward compositing over the same Gaussians. Only the
per-tile loss partial sums, the gradients, per-bucket compositing checkpoints and, when asked,
the rendered image leave the chip. The loss needs no neighbouring tile because its SSIM is
tile-local (ByteSplat §4.2):

    per image i (render X, ground truth Y of H x W pixels p, 3 channels ch):
      L1_i        = 1 / (3 H W) * sum_{p, ch} |X - Y|
      SSIM_tile_i = 1 / (3 H W) * sum_{p, ch} SSIM_t(p)(p, ch)
      L_i         = (1 - lambda) * L1_i + lambda * (1 - SSIM_tile_i)
    loss = mean_i L_i
    SSIM_t is the SSIM map of Wang et al. 2004 (eq. 13; C1 = 0.01^2, C2 = 0.03^2, mu = w*x,
    var = w*x^2 - mu^2, cov = w*(xy) - mu_x mu_y) with the 11x11 Gaussian window (sigma 1.5 px)
    restricted to the pixels of the pixel's own 16x16 tile t that have ground truth and
    renormalized to sum 1 there: w*x = Gy X Gx^T with G[i, j] = g(i - j) / sum_{a <= j' < b} g(i - j')
    for a <= i, j < b ([a, b) = the tile's rows, resp. columns, with ground truth; ``tile_window``).
    The render may extend past the ground truth at the top and left (``origin``; the trainer's
    ``--random_tile_shift`` moves the tile grid that way); those pixels are not in the loss.
    Renormalizing keeps the statistics unbiased at tile borders (zero padding would add the contrast
    between the content and the zeros to every border window's variance and drive SSIM towards 1);
    docs/bytesplat.md has the measured quality against the full-image SSIM.

Compositing rules (gsplat 1.5.3 RasterizeToPixels3DGSFwd.cu / RasterizeToPixels3DGSBwd.cu,
as mirrored by kernels/reference.py): pixel centre (x + 0.5, y + 0.5); delta = mean - centre;
sigma = 0.5 (a dx^2 + c dy^2) + b dx dy; alpha = min(0.999, opacity exp(-sigma)); a Gaussian is
skipped when sigma < 0 or alpha < 1/255; a pixel stops BEFORE the first Gaussian whose
next_T = T (1 - alpha) <= 1e-4; colour += alpha T c; finally colour += T background. The
backward walks back to front from the final T (buffer of what lies behind each Gaussian), as
RasterizeToPixels3DGSBwd.cu does; alpha's gradient is 0 where the 0.999 clamp is active. The
kernel computes o exp(-sigma) as 2^(log2 o - sigma log2 e) with a log2(e)-scaled conic (one
subtraction and one exponential; both skip tests become one, made the same way in the forward and
the backward), which agrees with the reference up to float32 rounding.

Implementation (kernels/csrc/fused_raster.cuh, CUDA C++; HIP through PyTorch's hipify; built on
first use by kernels/native.py): 256 threads per tile, one per pixel. The forward stages the
tile's records through shared memory 256 at a time and composites as gsplat's forward does (T a
running product); every ``warpSize`` list positions (a bucket) each pixel writes a checkpoint
(T and the colour accumulated at the bucket's end) to a global scratch buffer. The loss is
then computed in shared memory (the tile-local SSIM as separable 11-tap passes of the window
restricted to the tile's pixels with ground truth, its backward by the transposed passes), and
each pixel keeps K = C_final . dL/dpixel + T_final background . dL/dpixel, so that "what lies
behind a bucket's end, dotted with dL/dpixel" is K - C_end . dL/dpixel (Taming-3DGS's form; the
difference costs about float32 eps |K| of absolute error there). The backward runs per bucket
(Taming-3DGS's per-Gaussian scheme): the block's warps take the tile's buckets in turn, each lane
holds one Gaussian in registers and the pixels flow through the lanes (warp shuffles), each lane
recovering T before its Gaussian by one division from the anchor at the bucket's end; gradient
terms are summed in registers and added with one atomic per Gaussian per bucket and field. There
is no per-tile Gaussian budget and no fallback. The checkpoints take 16 bytes per pixel and bucket
(about 128 bytes per tile-Gaussian intersection); a call that would need more than its cap
(``scratch_mb``: the step plan's, trainer/step/plan.scratch_mode; default 2048 MiB;
SPLAT_TRAIN_FUSED_SCRATCH_MB overrides both) runs in launches over chunks of tiles that reuse one
buffer (:func:`tile_chunks`). Within a launch the blocks take the tiles longest list first
(:func:`longest_first`). The last block to finish its loss (a count of finished tiles in
device memory) sums the per-tile partial sums in tile order and writes the loss and its terms, so
no reduction runs after the kernel and the loss does not depend on block timing. The gradients
live in one zeroed buffer, which :class:`KnownGradients` scales in place by the incoming gradient
(kernels/grad_scale.py: no pass at all when it is 1), or in buffers the caller passes
(``grads_out``: the whole-step replay's gradient buffers). Loss and gradients equal the reference's up to
float32 rounding (including the difference above) and a pixel's stop decision at T <= 1e-4
(float32 running product vs. the reference's float64 sums of logs). The same source runs on the CPU under an emulation of the few
CUDA builtins it uses (tests/csrc/cpu_emu.h; tests only) at warp sizes 32 and 64.

``reference_fused_loss`` (marked REFERENCE below) is the plain-PyTorch definition the kernel is
tested against.

Sources: ByteSplat §4 (fused dataflow, tile-local SSIM); Taming-3DGS (Mallick et al. 2024,
per-Gaussian backward over 32-Gaussian buckets with forward checkpoints); gsplat 1.5.3 RasterizeToPixels3DGSFwd.cu / RasterizeToPixels3DGSBwd.cu; Wang et al. 2004 (SSIM);
Kerbl et al. 2023 eq. 7 ((1 - lambda) L1 + lambda D-SSIM).
"""

import math
import os
from types import ModuleType
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from . import grad_scale, native
from . import reference as ref
from .constants import SSIM_C1, SSIM_C2, SSIM_WINDOW, TILE_SIZE, gaussian_window_1d

GRAD_NAMES = ("means2d", "conics", "colors", "opacities", "backgrounds")  # the differentiable inputs


def ssim_window_1d(dtype: torch.dtype = torch.float32) -> Tensor:
    """Normalized 1D Gaussian window [SSIM_WINDOW] (sigma 1.5 px), computed in float64, cast to dtype."""
    return gaussian_window_1d().to(dtype)


# ------------------------------------------------------------------------------------------------
# REFERENCE: plain PyTorch definition of the fused function (autograd gives the gradients)
# ------------------------------------------------------------------------------------------------


def tile_window(
    first: int,
    stop: int,
    tile_size: int = TILE_SIZE,
    dtype: torch.dtype = torch.float32,
    device: "torch.device | str" = "cpu",
) -> Tensor:
    """The tile-restricted, renormalized filter matrix [tile_size, tile_size] of a tile whose rows
    (or columns) ``first <= i < stop`` have ground truth:
    ``G[i, j] = g(i - j) / sum_{first <= j' < stop} g(i - j')`` for ``first <= i, j < stop`` and
    ``|i - j| <= 5``, zero elsewhere (rows outside are pixels without ground truth, whose SSIM
    is never used). g is the normalized 1D window of :func:`ssim_window_1d`. Built in float64,
    cast to ``dtype``. Raises ValueError unless ``0 <= first < stop <= tile_size``.
    """
    if not 0 <= first < stop <= tile_size:
        raise ValueError(f"need 0 <= first < stop <= {tile_size}, got first={first}, stop={stop}")
    g = ssim_window_1d(torch.float64)
    idx = torch.arange(tile_size)
    d = idx[:, None] - idx[None, :]
    band = torch.where(d.abs() <= SSIM_WINDOW // 2, g[(d + SSIM_WINDOW // 2).clamp(0, SSIM_WINDOW - 1)], 0.0)
    inside = (idx >= first) & (idx < stop)
    band = band * (inside[:, None] & inside[None, :])
    out = torch.zeros_like(band)
    out[inside] = band[inside] / band[inside].sum(dim=1, keepdim=True)
    return out.to(dtype=dtype, device=device)


def window_taps() -> list:
    """The kernel's 11 window taps: :func:`ssim_window_1d` in float32, as Python floats (exact)."""
    return [float(v) for v in ssim_window_1d()]


def tile_local_ssim_map(
    img: Tensor, gt: Tensor, tile_size: int = TILE_SIZE, origin: Tuple[int, int] = (0, 0)
) -> Tensor:
    """REFERENCE tile-local SSIM map of the pixels with ground truth (module docstring).

    img: the render [I, H, W, C]; gt: [I, H - oy, W - ox, C], the ground truth of render pixels
    x >= ox, y >= oy (``origin = (ox, oy)``); returns the map [I, H - oy, W - ox, C]. Each
    tile_size x tile_size tile of the render is filtered on its own with the 11x11 Gaussian
    window (sigma 1.5) restricted to the tile's pixels with ground truth and renormalized to sum 1
    there (``Gy X Gx^T``, :func:`tile_window` of the rows / columns with ground truth);
    C1 = 0.01^2, C2 = 0.03^2 (Wang et al. 2004). Differentiable.
    """
    I, H, W, Ch = img.shape
    ox, oy = origin
    if gt.shape != (I, H - oy, W - ox, Ch):
        raise ValueError(f"gt must be {(I, H - oy, W - ox, Ch)} for a {tuple(img.shape)} render at origin {origin}")
    th, tw = -(-H // tile_size), -(-W // tile_size)
    pad = (0, tw * tile_size - W, 0, th * tile_size - H)

    def tiles(x):  # [I, H, W, C] -> [I, C, th, tw, ts, ts]
        x = F.pad(x.permute(0, 3, 1, 2), pad)
        return x.reshape(I, Ch, th, tile_size, tw, tile_size).permute(0, 1, 2, 4, 3, 5)

    def windows(o, n, count):  # one matrix per tile row (column): its pixels in [o, n) have ground truth
        return torch.stack(
            [
                tile_window(
                    max(o - t * tile_size, 0), min(n - t * tile_size, tile_size), tile_size, img.dtype, img.device
                )
                if o < (t + 1) * tile_size
                else torch.zeros(tile_size, tile_size, dtype=img.dtype, device=img.device)
                for t in range(count)
            ]
        )

    Gy = windows(oy, H, th)[:, None]  # [th, 1, ts, ts]
    Gx = windows(ox, W, tw)[None, :]  # [1, tw, ts, ts]

    def blur(x):
        return Gy @ x @ Gx.transpose(-1, -2)

    gt_full = F.pad(gt, (0, 0, ox, 0, oy, 0))  # zeros where the render has no ground truth
    x, y = tiles(img), tiles(gt_full)
    mu_x, mu_y = blur(x), blur(y)
    var_x, var_y, cov = blur(x * x) - mu_x * mu_x, blur(y * y) - mu_y * mu_y, blur(x * y) - mu_x * mu_y
    s = ((2 * mu_x * mu_y + SSIM_C1) * (2 * cov + SSIM_C2)) / (
        (mu_x * mu_x + mu_y * mu_y + SSIM_C1) * (var_x + var_y + SSIM_C2)
    )
    s = s.permute(0, 1, 2, 4, 3, 5).reshape(I, Ch, th * tile_size, tw * tile_size)
    return s[:, :, oy:H, ox:W].permute(0, 2, 3, 1)


def tile_local_terms(img: Tensor, gt: Tensor, origin: Tuple[int, int] = (0, 0)) -> Tuple[Tensor, Tensor]:
    """REFERENCE terms of the loss, per image: (L1_i [I], SSIM_tile_i [I]) over the pixels with
    ground truth (module docstring; img, gt and origin as :func:`tile_local_ssim_map`)."""
    ox, oy = origin
    l1 = (img[:, oy:, ox:] - gt).abs().mean(dim=(1, 2, 3))
    return l1, tile_local_ssim_map(img, gt, origin=origin).mean(dim=(1, 2, 3))


def combine_terms(l1: Tensor, ssim: Tensor, ssim_lambda: float) -> Tensor:
    """The loss from the per-image terms: mean over images of (1 - l) L1_i + l (1 - SSIM_tile_i)."""
    return ((1.0 - ssim_lambda) * l1 + ssim_lambda * (1.0 - ssim)).mean()


def term_stats(l1: Tensor, ssim: Tensor) -> Dict[str, Tensor]:
    """stats["l1"] and stats["ssim"]: the terms' means over the images, detached (0-dim)."""
    return {"l1": l1.detach().mean(), "ssim": ssim.detach().mean()}


def tile_local_loss(img: Tensor, gt: Tensor, ssim_lambda: float, origin: Tuple[int, int] = (0, 0)) -> Tensor:
    """REFERENCE loss: mean over images of (1 - l) L1_i + l (1 - SSIM_tile_i) over the pixels with
    ground truth (module docstring; img, gt and origin as :func:`tile_local_ssim_map`)."""
    return combine_terms(*tile_local_terms(img, gt, origin), ssim_lambda)


def reference_fused_loss(
    means2d: Tensor,
    conics: Tensor,
    colors: Tensor,
    opacities: Tensor,
    isect_offsets: Tensor,
    flatten_ids: Tensor,
    gts: Tensor,
    width: int,
    height: int,
    ssim_lambda: float = 0.2,
    backgrounds: Optional[Tensor] = None,
    packed: bool = False,
    origin: Tuple[int, int] = (0, 0),
    absgrad: bool = False,
    terms: Optional[dict] = None,
) -> Tuple[Tensor, Tensor]:
    """REFERENCE of the fused kernel: kernels.reference.rasterize_to_pixels + tile_local_loss.

    Same arguments as :func:`fused_raster_loss`. Returns (loss 0-dim, image [I, H, W, 3]);
    differentiate the loss with autograd. ``absgrad``: ``means2d.absgrad`` is set to a tensor that
    the backward fills (kernels.reference.rasterize_to_pixels). ``terms``: a dict that receives
    :func:`term_stats` ("l1", "ssim").
    """
    image, _ = ref.rasterize_to_pixels(
        means2d, conics, colors, opacities, width, height, TILE_SIZE, isect_offsets, flatten_ids,
        backgrounds=backgrounds, packed=packed, absgrad=absgrad,
    )  # fmt: skip
    l1, ssim = tile_local_terms(image, gts, origin)
    if terms is not None:
        terms.update(term_stats(l1, ssim))
    return combine_terms(l1, ssim, ssim_lambda), image


def _check_inputs(
    means2d,
    conics,
    colors,
    opacities,
    isect_offsets,
    flatten_ids,
    gts,
    width,
    height,
    ssim_lambda,
    backgrounds,
    packed,
    origin=(0, 0),
    padded_rows=False,
):
    """Raises ValueError on inconsistent shapes / arguments. Returns the number of images I.
    ``padded_rows``: isect_offsets may hold more tile rows than the image (below it)."""
    ox, oy = origin
    if not (0 <= ox < width and 0 <= oy < height):
        raise ValueError(f"origin {tuple(origin)} must lie in the {width}x{height} image")
    if not 0.0 <= ssim_lambda <= 1.0:
        raise ValueError(f"ssim_lambda must be in [0, 1], got {ssim_lambda}")
    if isect_offsets.dim() != 3:
        raise ValueError(f"isect_offsets must be [I, tile_h, tile_w], got {tuple(isect_offsets.shape)}")
    I, th, tw = isect_offsets.shape
    need = (-(-height // TILE_SIZE), -(-width // TILE_SIZE))
    if tw != need[1] or th < need[0] or (th != need[0] and not padded_rows):
        shape = tuple(isect_offsets.shape)
        raise ValueError(f"isect_offsets {shape} do not tile a {width}x{height} image by {TILE_SIZE}")
    lead = means2d.shape[:-1]
    if (packed and len(lead) != 1) or (not packed and lead[:-1] != (I,)):
        raise ValueError(f"means2d {tuple(means2d.shape)} does not fit packed={packed} and {I} images")
    if means2d.shape[-1] != 2 or conics.shape != lead + (3,) or colors.shape != lead + (3,) or opacities.shape != lead:
        raise ValueError("means2d [..,2], conics [..,3], colors [..,3] and opacities [..] disagree")
    if gts.shape != (I, height - oy, width - ox, 3):
        raise ValueError(f"gts must be {(I, height - oy, width - ox, 3)}, got {tuple(gts.shape)}")
    if backgrounds is not None and backgrounds.shape != (I, 3):
        raise ValueError(f"backgrounds must be {(I, 3)}, got {tuple(backgrounds.shape)}")
    if flatten_ids.dim() != 1:
        raise ValueError(f"flatten_ids must be [n_isects], got {tuple(flatten_ids.shape)}")
    return I


def _check_grads_out(grads_out, means2d, conics, colors, opacities) -> None:
    """Raises ValueError unless ``grads_out`` is None or holds, for each of the four records'
    inputs, a float32 contiguous tensor of its element count on its device."""
    if grads_out is None:
        return
    inputs = {"means2d": means2d, "conics": conics, "colors": colors, "opacities": opacities}
    if set(grads_out) != set(inputs):
        raise ValueError(f"grads_out must hold exactly {sorted(inputs)}, got {sorted(grads_out)}")
    for name, x in inputs.items():
        g = grads_out[name]
        if g.dtype != torch.float32 or not g.is_contiguous() or g.numel() != x.numel() or g.device != x.device:
            raise ValueError(
                f"grads_out[{name!r}] must be float32, contiguous, of {x.numel()} elements on {x.device}; "
                f"got {g.dtype}, {tuple(g.shape)}, contiguous={g.is_contiguous()} on {g.device}"
            )


# ------------------------------------------------------------------------------------------------
# Native kernel: launcher, autograd function, entry point
# ------------------------------------------------------------------------------------------------


CP_BUCKET_MIN = 32  # the kernel's checkpoint scratch is sized in buckets of 32 list positions
CP_BUCKET_FLOATS = 256 * 4  # one bucket's checkpoints: 256 pixels x (T, colour)
DEFAULT_SCRATCH_MB = 2048
# The kernel's phases a launch runs: 3 (forward, loss, backward); 1 (forward) or 2 (and the loss,
# no gradients) time its parts (benchmark scripts only: the outputs are then incomplete).
TIMING_PHASES = 3
# Blocks take the tiles longest list first (:func:`longest_first`); False: in tile order (a
# benchmark's comparison; the results are the same up to the order of the gradient atomics).
TILE_ORDER = True


def tile_lengths(offsets: Tensor, num_isects: int) -> Tensor:
    """int32 [T] tile list lengths from the flat tile offsets [T] (int32) and the list's total."""
    ends = torch.cat([offsets[1:], offsets.new_full((1,), num_isects)])
    return ends - offsets


def longest_first(lengths: Tensor) -> Tensor:
    """int32 [T]: the tiles 0 .. T - 1 by decreasing list length, ties in tile order (a stable
    sort on the device, no host synchronization). The kernel's block b renders tile order[b], so
    the long tiles start in the first wave and the launch does not end on a few of them still
    running (longest-processing-time-first scheduling, Graham 1969)."""
    return torch.sort(lengths, descending=True, stable=True).indices.to(torch.int32)


def _scratch_cap_floats(scratch_mb: Optional[float] = None) -> int:
    """The checkpoint scratch one call may allocate, in floats: SPLAT_TRAIN_FUSED_SCRATCH_MB MiB
    where that is set, else ``scratch_mb`` (the step plan's, trainer/step/plan.scratch_mode), else
    DEFAULT_SCRATCH_MB; the tiles run in several launches that reuse one buffer when they need
    more. Raises ValueError for a size that is not positive."""
    env = os.environ.get("SPLAT_TRAIN_FUSED_SCRATCH_MB")
    mb = float(env) if env is not None else float(scratch_mb if scratch_mb is not None else DEFAULT_SCRATCH_MB)
    if not mb > 0:
        what = "SPLAT_TRAIN_FUSED_SCRATCH_MB" if env is not None else "the fused kernel's scratch size (MiB)"
        raise ValueError(f"{what} must be > 0, got {mb}")
    return int(mb * 2**20) // 4


def _one_launch_buckets(num_isects: int, num_tiles_all: int) -> int:
    """Checkpoint buckets of one launch over every tile (kernels/csrc/fused_raster_params.h,
    checkpoint_floats)."""
    return num_isects // CP_BUCKET_MIN + num_tiles_all + 1


def fits_one_launch(num_isects: int, num_tiles_all: int, scratch_mb: Optional[float] = None) -> bool:
    """Whether a call of ``num_isects`` intersections over ``num_tiles_all`` (image, tile) pairs
    runs in one launch: its checkpoint scratch within the cap (:func:`_scratch_cap_floats` of
    ``scratch_mb``). Such a call copies nothing to the host, so a CUDA graph can capture it
    (trainer/step/graphed.py)."""
    return _one_launch_buckets(num_isects, num_tiles_all) * CP_BUCKET_FLOATS <= _scratch_cap_floats(scratch_mb)


def tile_chunks(offsets: Tensor, num_isects: int, cap_floats: int) -> list:
    """Launches of the kernel over the flat (image, tile) ids, each within ``cap_floats`` of
    checkpoint scratch (a tile that alone needs more gets a launch of its own): a list of
    (first tile, tile count, first bucket, buckets). Tile t's checkpoints start at bucket
    ``offsets[t] // 32 + t`` and take ``ceil(n_t / 32)`` buckets (kernels/csrc/fused_raster.cuh,
    bucket_base). When everything fits, one launch and no device -> host copy; else one copy of the
    tile offsets."""
    T = offsets.numel()
    total = _one_launch_buckets(num_isects, T)
    if T == 0 or total * CP_BUCKET_FLOATS <= cap_floats:
        return [(0, T, 0, total)]
    starts = offsets.reshape(-1).to("cpu", torch.int64)
    counts = torch.cat([starts[1:], starts.new_full((1,), num_isects)]) - starts
    base = starts // CP_BUCKET_MIN + torch.arange(T)
    stop = base + (counts + CP_BUCKET_MIN - 1) // CP_BUCKET_MIN  # exclusive; nondecreasing in t
    cap = max(1, cap_floats // CP_BUCKET_FLOATS)
    chunks, t0 = [], 0
    while t0 < T:
        t1 = max(int(torch.searchsorted(stop, base[t0] + cap, right=True)), t0 + 1)
        chunks.append((t0, t1 - t0, int(base[t0]), max(1, int(stop[t1 - 1] - base[t0]))))
        t0 = t1
    return chunks


def _allocate_scratch(floats: int, device) -> Tensor:
    return torch.empty(floats, dtype=torch.float32, device=device)


def _chunks_and_scratch(offsets: Tensor, num_isects: int, scratch_mb: Optional[float], device) -> tuple:
    """The launches (:func:`tile_chunks`) within the cap of ``scratch_mb`` and their one scratch
    buffer. Where a cap above DEFAULT_SCRATCH_MB meets an out-of-memory error (the model grew after
    the step plan sized the cap from the memory then free), the launches are cut again at
    DEFAULT_SCRATCH_MB; other errors, and one at the default, propagate."""
    cap = _scratch_cap_floats(scratch_mb)
    chunks = tile_chunks(offsets, num_isects, cap)
    try:
        return chunks, _allocate_scratch(max(c[3] for c in chunks) * CP_BUCKET_FLOATS, device)
    except torch.OutOfMemoryError:
        default = _scratch_cap_floats(DEFAULT_SCRATCH_MB)
        if cap <= default:
            raise
    chunks = tile_chunks(offsets, num_isects, default)
    return chunks, _allocate_scratch(max(c[3] for c in chunks) * CP_BUCKET_FLOATS, device)


def _launch(
    ext,
    means2d,
    conics,
    colors,
    opacities,
    backgrounds,
    gts,
    isect_offsets,
    flatten_ids,
    width,
    height,
    ssim_lambda,
    return_image,
    absgrad,
    origin=(0, 0),
    warp_size=None,
    grads_out=None,
    scratch_mb=None,
):
    """Runs the native kernel (``ext``: kernels.native.load(), or the CPU emulation with
    ``warp_size``). Returns (loss 0-dim, grads dict (GRAD_NAMES, float32, flattened records), stats
    dict, scaled): every gradient is a view of ``scaled``, one zero-initialized float32 buffer, so
    that one memset clears them and one pass scales them (:class:`KnownGradients`). With
    ``grads_out`` (:func:`fused_raster_loss`'s, checked there) the four records' gradients are
    those buffers instead, zeroed here, and ``scaled`` holds the backgrounds' only. The kernel's
    last block writes the loss and its terms (a [3] buffer); the image starts NaN-filled when asked
    for, so that a pixel the kernel missed shows."""
    device = means2d.device
    I, th, tw = isect_offsets.shape
    num_tiles = th * tw
    f32 = dict(dtype=torch.float32, device=device)
    m2d, con, col, opa = (
        t.detach().reshape(shape).to(torch.float32).contiguous()
        for t, shape in ((means2d, (-1, 2)), (conics, (-1, 3)), (colors, (-1, 3)), (opacities, (-1,)))
    )
    R = m2d.shape[0]
    none = torch.empty(0, **f32)
    bg = backgrounds.detach().to(torch.float32).contiguous() if backgrounds is not None else none
    gt = gts.detach().to(torch.float32).contiguous()
    offsets = isect_offsets.reshape(-1).to(torch.int32).contiguous()
    fids = flatten_ids.reshape(-1).to(torch.int32).contiguous()
    # one zeroed buffer: the gradients (scaled by the incoming gradient), then absgrad (not scaled)
    # and the kernel's count of finished tiles (int32)
    widths = {"means2d": 2, "conics": 3, "colors": 3, "opacities": 1}
    sizes = {name: w * R for name, w in widths.items()} if grads_out is None else {}
    sizes["backgrounds"] = 3 * I if backgrounds is not None else 0
    num_scaled = sum(sizes.values())
    num_abs = 2 * R if absgrad else 0
    buf = torch.zeros(num_scaled + num_abs + 1, **f32)
    scaled = buf[:num_scaled]
    grads, at = {}, 0
    for name, w in widths.items():
        shape = (R, w) if w > 1 else (R,)
        if grads_out is not None:
            grads[name] = grads_out[name].view(shape).zero_()
        else:
            grads[name] = buf[at : at + sizes[name]].view(shape)
            at += sizes[name]
    grads["backgrounds"] = buf[at : at + sizes["backgrounds"]].view(I, 3) if backgrounds is not None else none
    abs_buf = buf[num_scaled : num_scaled + num_abs].view(R, 2) if absgrad else none
    done_tiles = buf[-1:].view(torch.int32)
    image = torch.full((I, height, width, 3), math.nan, **f32) if return_image else none
    partial = torch.empty(I * num_tiles, 2, **f32)
    terms = torch.empty(3, **f32)  # loss, L1, SSIM: written by the kernel's last block
    chunks, scratch = _chunks_and_scratch(offsets, fids.numel(), scratch_mb, device)
    ox, oy = origin
    num_pixels = (height - oy) * (width - ox)  # the pixels with ground truth, per image
    denom = float(I * 3 * num_pixels)
    args = (
        m2d,
        con,
        col,
        opa,
        bg,
        gt,
        offsets,
        fids,
        I,
        width,
        height,
        ox,
        oy,
        (1.0 - ssim_lambda) / denom,
        ssim_lambda / denom,
        float(ssim_lambda),
        1.0 / denom,
        window_taps(),
        grads["means2d"],
        grads["conics"],
        grads["colors"],
        grads["opacities"],
        grads["backgrounds"],
        abs_buf,
        image,
        partial,
        terms,
        done_tiles,
        scratch,
        TIMING_PHASES,  # the kernel's phases: 3, forward, loss and backward
    )
    lengths = tile_lengths(offsets, fids.numel()) if TILE_ORDER else None
    for chunk in chunks:
        t0, count = chunk[0], chunk[1]
        if lengths is not None:
            order = longest_first(lengths[t0 : t0 + count])
        else:
            order = torch.arange(count, dtype=torch.int32, device=device)
        if warp_size is None:
            ext.fused_raster_loss(*args, *chunk, order)
        else:
            ext.fused_raster_loss(int(warp_size), *args, *chunk, order)
    del scratch
    stats = {
        "l1": terms[1],
        "ssim": terms[2],
        "num_tiles": I * num_tiles,
        "image": image if return_image else None,
        "absgrad": abs_buf if absgrad else None,
    }
    return terms[0], grads, stats, scaled


class KnownGradients(torch.autograd.Function):
    """A loss whose gradients were computed with it: forward returns the loss (in ``inputs[0]``'s
    dtype); backward hands each input its precomputed gradient times the incoming one, so autograd
    carries them on to the projection, SH and the exchange. The fused kernel computes the loss AND
    all its gradients in one launch (:func:`fused_raster_loss`).

    apply(known, *inputs) with ``known`` = (loss, grads, scaled): ``grads`` a list aligned with
    ``inputs`` (each the input's number of elements, float32; None for an input without gradient),
    every one a view of ``scaled`` (one contiguous float32 buffer). The backward scales ``scaled`` in
    place (kernels/grad_scale.py: no pass at all when the incoming gradient is 1), so it runs once:
    a second backward through the same loss raises RuntimeError."""

    @staticmethod
    def forward(ctx, known, *inputs):
        loss, grads, scaled = known
        ctx.known = (grads, scaled)
        ctx.shapes = [(x.shape, x.dtype) for x in inputs]
        return loss.to(inputs[0].dtype)

    @staticmethod
    def backward(ctx, grad_loss):
        if ctx.known is None:
            raise RuntimeError(
                "the fused rasterization loss was back-propagated twice: its precomputed gradients are "
                "scaled in place by the first backward (compute the loss again instead of retain_graph=True)"
            )
        grads, scaled = ctx.known
        ctx.known = None
        grad_scale.scale_(scaled, grad_loss.detach().reshape(1).to(torch.float32))
        out = [None if g is None else g.reshape(shape).to(dtype) for g, (shape, dtype) in zip(grads, ctx.shapes)]
        return (None, *out)


def _native_loss(
    ext,
    means2d,
    conics,
    colors,
    opacities,
    backgrounds,
    gts,
    isect_offsets,
    flatten_ids,
    width,
    height,
    ssim_lambda,
    return_image,
    absgrad,
    origin,
    warp_size=None,
    grads_out=None,
    scratch_mb=None,
) -> Tuple[Tensor, Dict]:
    """The kernel ``ext`` launched now (:func:`_launch`), its loss tied to its gradients by
    :class:`KnownGradients`; with ``grads_out`` the gradients are left there and the loss is
    returned detached. Returns (loss, stats)."""
    loss, grads, stats, scaled = _launch(
        ext,
        means2d,
        conics,
        colors,
        opacities,
        backgrounds,
        gts,
        isect_offsets,
        flatten_ids,
        width,
        height,
        float(ssim_lambda),
        return_image,
        absgrad,
        origin,
        warp_size,
        grads_out,
        scratch_mb,
    )
    if absgrad:  # where gsplat's rasterizer leaves it (render.AbsGradRelay reads it in the backward)
        means2d.absgrad = stats["absgrad"].view(means2d.shape)
    if grads_out is not None:
        return loss, stats
    inputs = [means2d, conics, colors, opacities] + ([backgrounds] if backgrounds is not None else [])
    known = (loss, [grads[name] for name in GRAD_NAMES[: len(inputs)]], scaled)
    return KnownGradients.apply(known, *inputs), stats


def _unfused(
    means2d,
    conics,
    colors,
    opacities,
    isect_offsets,
    flatten_ids,
    gts,
    width,
    height,
    ssim_lambda,
    backgrounds,
    packed,
    origin,
    ops,
    return_image,
    absgrad,
):
    """The same function without the native kernel: ``ops.rasterize_to_pixels`` (gsplat's on a GPU,
    else the PyTorch reference), the PyTorch tile-local loss, autograd. Returns (loss, stats)."""
    image, alphas = ops.rasterize_to_pixels(
        means2d, conics, colors, opacities, width, height, TILE_SIZE, isect_offsets, flatten_ids, packed=packed,
        absgrad=absgrad)  # fmt: skip
    image = ref.composite_background(image, alphas, backgrounds)
    l1, ssim = tile_local_terms(image, gts, origin)
    loss = combine_terms(l1, ssim, ssim_lambda)
    stats = {
        **term_stats(l1, ssim),
        "num_tiles": isect_offsets.numel(),
        "image": image.detach() if return_image else None,
        "absgrad": means2d.absgrad.reshape(-1, 2) if absgrad else None,
    }  # type: ignore[attr-defined]
    return loss, stats


def fused_raster_loss(
    means2d: Tensor,  # [I, N, 2] or [nnz, 2] (packed), pixels
    conics: Tensor,  # [I, N, 3] or [nnz, 3], px^-2 (a, b, c upper triangle of the inverse covariance)
    colors: Tensor,  # [I, N, 3] or [nnz, 3]
    opacities: Tensor,  # [I, N] or [nnz]
    isect_offsets: Tensor,  # [I, tile_h, tile_w] int32
    flatten_ids: Tensor,  # [n_isects] int32, depth-sorted per tile, index the flattened records
    gts: Tensor,  # [I, height - oy, width - ox, 3] ground truth in [0, 1] (origin (ox, oy), default (0, 0))
    width: int,
    height: int,
    ssim_lambda: float = 0.2,
    backgrounds: Optional[Tensor] = None,  # [I, 3]
    packed: bool = False,
    return_image: bool = False,
    absgrad: bool = False,
    fallback: Optional[ModuleType] = None,
    origin: Tuple[int, int] = (0, 0),
    padded_rows: bool = False,
    grads_out: Optional[Dict[str, Tensor]] = None,
    scratch_mb: Optional[float] = None,
) -> Tuple[Tensor, Dict]:
    """Composites, scores and back-propagates I images in one fused native kernel (ByteSplat §4).

    loss = mean_i [(1 - ssim_lambda) L1_i + ssim_lambda (1 - SSIM_tile_i)] with the tile-local
    SSIM of the module docstring; tile size 16. The records and tile lists are gsplat's
    (isect_tiles / isect_offset_encode), dense or packed. Differentiable w.r.t. means2d, conics,
    colors, opacities and backgrounds (not gts). Computation is in float32. Every tile runs in the
    kernel, whatever its number of Gaussians.

    origin: (ox, oy) pixels. The ground truth covers the render's pixels x >= ox, y >= oy
    (gts [I, height - oy, width - ox, 3]); the rest have no loss and no gradient. A trainer that
    moves the principal point by (ox, oy) and pads the image by as much shifts the image
    against the 16-pixel tile grid, so that the tile-local SSIM's tile borders fall elsewhere
    (``--random_tile_shift``). The L1 and SSIM means are over the pixels with ground truth.
    padded_rows: isect_offsets [I, th, tw] may have more tile rows than the image needs; the rows
    below the image have no pixels, and whatever their lists hold is read by no pixel (the native
    kernel only: trainer/step/graphed.py pads its static tile lists so). Raises ValueError on the
    CPU reference and the unfused path.
    grads_out: {"means2d", "conics", "colors", "opacities"} -> float32 contiguous tensors of those
    inputs' element counts on their device: the kernel zeroes them and accumulates d loss / d input
    there instead of in buffers of its own, and the returned loss is detached (no autograd node, no
    gradient for backgrounds). trainer/step/graphed.py passes the head's gradient buffers, so no
    copy follows the kernel. The native kernel only: raises ValueError on the CPU reference and
    the unfused path, and for buffers of another count, dtype, layout or device.
    absgrad: also return, in stats["absgrad"] [R, 2] (R = I*N or nnz), the sum over pixels of
    |d loss / d means2d| of each pixel's contribution (gsplat's absgrad; unscaled by the
    incoming gradient), and leave it as ``means2d.absgrad`` (shaped as means2d), where gsplat's
    rasterizer leaves it. The kernel fills it in this call; on the CPU reference and the unfused
    path it is filled during the backward (gsplat's and the reference's ``.absgrad``).
    scratch_mb: MiB of checkpoint scratch one launch of the native kernel may take (default
    DEFAULT_SCRATCH_MB; SPLAT_TRAIN_FUSED_SCRATCH_MB overrides it): a call that needs more runs in
    launches over chunks of tiles, reading the tile offsets on the host (:func:`tile_chunks`).

    Where it runs: CUDA / ROCm tensors run the native kernel (kernels/native.py builds it on first
    use). When it cannot be built here (no CUDA toolkit, a build error), kernels.native warns once,
    in one line, and this call computes the same function unfused: ``fallback.rasterize_to_pixels``
    (default gsplat's on a GPU, else kernels/reference.py) + the PyTorch tile-local loss + autograd.
    CPU tensors run the REFERENCE (kernels/reference.py + autograd).

    Returns (loss 0-dim, stats) with stats = {"l1", "ssim" (the loss's terms, means over the
    images, 0-dim, detached: L1 and the tile-local SSIM, not 1 - SSIM), "num_tiles": I * n_tiles,
    "image": [I, H, W, 3] or None, "absgrad"}.
    Raises ValueError on inconsistent shapes, an origin outside the image or a ssim_lambda outside
    [0, 1].
    """
    origin = (int(origin[0]), int(origin[1]))
    _check_inputs(
        means2d,
        conics,
        colors,
        opacities,
        isect_offsets,
        flatten_ids,
        gts,
        width,
        height,
        ssim_lambda,
        backgrounds,
        packed,
        origin,
        padded_rows,
    )
    _check_grads_out(grads_out, means2d, conics, colors, opacities)
    for flag, given in (("padded_rows", padded_rows), ("grads_out", grads_out is not None)):
        if given and (means2d.device.type == "cpu" or native.load() is None):
            raise ValueError(f"{flag} needs the native kernel (a CUDA/ROCm device where it builds)")
    if means2d.device.type == "cpu":
        terms: dict = {}
        loss, image = reference_fused_loss(
            means2d,
            conics,
            colors,
            opacities,
            isect_offsets,
            flatten_ids,
            gts,
            width,
            height,
            ssim_lambda,
            backgrounds,
            packed,
            origin,
            absgrad,
            terms,
        )
        stats = {
            **terms,
            "num_tiles": isect_offsets.numel(),
            "image": image.detach() if return_image else None,
            "absgrad": means2d.absgrad.reshape(-1, 2) if absgrad else None,  # type: ignore[attr-defined]
        }
        return loss, stats
    ext = native.load()
    if ext is None:
        ops = default_fallback(means2d.device) if fallback is None else fallback
        return _unfused(
            means2d,
            conics,
            colors,
            opacities,
            isect_offsets,
            flatten_ids,
            gts,
            width,
            height,
            ssim_lambda,
            backgrounds,
            packed,
            origin,
            ops,
            return_image,
            absgrad,
        )
    return _native_loss(
        ext,
        means2d,
        conics,
        colors,
        opacities,
        backgrounds,
        gts,
        isect_offsets,
        flatten_ids,
        width,
        height,
        ssim_lambda,
        return_image,
        absgrad,
        origin,
        grads_out=grads_out,
        scratch_mb=scratch_mb,
    )


def default_fallback(device) -> ModuleType:
    """The rasterizer of the unfused path: gsplat's (``gsplat.cuda._wrapper``) on a GPU when it
    imports, else this project's PyTorch reference (kernels/reference.py)."""
    import importlib

    if torch.device(device).type == "cuda":
        try:
            return importlib.import_module("gsplat.cuda._wrapper")
        except ImportError:
            pass
    return ref


def emulated_fused_raster_loss(
    means2d,
    conics,
    colors,
    opacities,
    isect_offsets,
    flatten_ids,
    gts,
    width,
    height,
    ssim_lambda=0.2,
    backgrounds=None,
    packed=False,
    return_image=False,
    absgrad=False,
    origin=(0, 0),
    warp_size=32,
    padded_rows=False,
    grads_out=None,
    scratch_mb=None,
):
    """TESTS ONLY: :func:`fused_raster_loss` with the native kernel's source run on the CPU
    (kernels.native.load_cpu_emulation) at ``warp_size`` lanes per warp. Same returns."""
    origin = (int(origin[0]), int(origin[1]))
    _check_inputs(
        means2d,
        conics,
        colors,
        opacities,
        isect_offsets,
        flatten_ids,
        gts,
        width,
        height,
        ssim_lambda,
        backgrounds,
        packed,
        origin,
        padded_rows,
    )
    _check_grads_out(grads_out, means2d, conics, colors, opacities)
    return _native_loss(
        native.load_cpu_emulation(),
        means2d,
        conics,
        colors,
        opacities,
        backgrounds,
        gts,
        isect_offsets,
        flatten_ids,
        width,
        height,
        ssim_lambda,
        return_image,
        absgrad,
        origin,
        warp_size,
        grads_out,
        scratch_mb,
    )
