"""Fused rasterization + tile-local loss + backward rasterization in ONE Triton kernel (ByteSplat §4).

One program per (image, 16x16 tile) within the per-tile Gaussian budget (tiles over it fall back,
see Implementation) reads the tile's depth-sorted records, composites its pixels front to back,
computes the photometric loss of its pixels against the ground truth and dL/dpixel in registers,
then runs the backward compositing over the same Gaussians and adds each Gaussian's gradient ONCE
per tile (a block reduction over the tile's pixels, then one atomic add per (Gaussian, tile) and
field). Only the per-tile loss partial sums, the gradients and, when asked, the rendered image leave
the chip. The loss needs no neighbouring tile because its SSIM is tile-local (ByteSplat §4.2):

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
    Renormalizing keeps the statistics unbiased at tile borders: zero padding instead (an earlier
    version) adds the contrast between the content and the zeros to every border window's variance,
    which drove SSIM towards 1 and left the D-SSIM term and its gradient about a third of the
    full-image one on juicebox, and densification grew 35% fewer Gaussians. Test PSNR / SSIM after
    7,000 steps on H200s (docs/MEASURED_H200.md, session 6), means of 7 seeds on juicebox: fused
    26.94 / 0.9438, unfused (full-image SSIM) 26.92 / 0.9445, fused with ``--random_tile_shift``
    26.97 / 0.9439 (seed-to-seed SD 0.13-0.33 dB); mouse, 3 seeds: 19.60 / 19.78 / 19.73 (SD
    0.17-0.64 dB). Session 4's -0.5 dB on juicebox (3 seeds) was one low seed.

Compositing rules (gsplat 1.5.3 RasterizeToPixels3DGSFwd.cu / RasterizeToPixels3DGSBwd.cu,
as mirrored by kernels/reference.py): pixel centre (x + 0.5, y + 0.5); delta = mean - centre;
sigma = 0.5 (a dx^2 + c dy^2) + b dx dy; alpha = min(0.999, opacity exp(-sigma)); a Gaussian is
skipped when sigma < 0 or alpha < 1/255; a pixel stops BEFORE the first Gaussian whose
next_T = T (1 - alpha) <= 1e-4; colour += alpha T c; finally colour += T background. The
backward walks back to front from the final T (buffer of what lies behind each Gaussian), as
RasterizeToPixels3DGSBwd.cu does; alpha's gradient is 0 where the 0.999 clamp is active.

Implementation: one program of NUM_WARPS warps per tile, one pixel per thread; three paths,
chosen per tile by its Gaussian count n_t:
  - resident (n_t <= min(budget, resident_max)): the list in one [256 pixels, K] block (K = the
    longest such list rounded up to a power of two); transmittance is the exp of a per-pixel
    cumulative sum of ln(1 - alpha) (``tl.cumsum``); the records are loaded ONCE and the whole
    alpha / weight state stays in registers between forward, loss and backward;
  - streaming (resident_max < n_t <= budget): the forward walks the list one Gaussian at a time
    (T a running product, as gsplat's forward; no cross-thread work but one block reduction per
    _STOP_CHECK Gaussians that ends the loop once every pixel has stopped), the backward in
    [256, stream_chunk] chunks back to front from the last chunk any pixel composited (T
    recovered from the final T by reverse cumulative sums);
  - fallback (n_t > budget; ByteSplat §5.1, "conventional execution"): ``fallback`` renders
    only these tiles (gsplat's tile masks), the kernel's LOSS_ONLY mode scores their pixels with
    the same tile-local loss and writes dL/dpixel, and the fallback's backward turns that into
    record gradients. Long lists run in gsplat's warp-parallel backward: a [256, K] block
    reduction per chunk (below) costs more per Gaussian than gsplat's warp reductions, and a
    tile's chunks run one after another, so the longest list bounds the kernel's time.
The records are first gathered into list order (``_gather_records``, 36 bytes per intersection),
so a tile reads consecutive addresses. Per chunk the nine gradient fields are summed over the
tile's pixels in one multi-operand ``tl.reduce`` (one round of shared memory and barriers), then
one atomic add per (Gaussian, tile, field). The blocks live in registers, so the chunk length
decides whether the state stays on chip; ``chunk_limits`` picks, per device, the longest chunks
that compile without spilling (ahead-of-time compiles for sm_90: resident K = 8 uses 175
registers and no spill, K = 16 spills; streaming K = 8 170 registers). All paths give the same
loss and gradients to float32 rounding (and to a pixel's float32 stop decision at T <= 1e-4).
The SSIM filtering of a tile is computed as a
normalized convolution, (G X G^T) / (G M G^T) on 16x16 blocks (``tl.dot``, IEEE fp32; G the
banded matrix of the 1D window, M the tile's mask of the pixels with ground truth), which equals Gy X Gx^T above; its
backward is G (D / (G M G^T)) G^T of per-pixel coefficient maps. No warp-size assumption and no
vendor intrinsics; runs under TRITON_INTERPRET=1.

``reference_fused_loss`` (marked REFERENCE below) is the plain-PyTorch definition the kernel is
tested against; it lives here rather than in kernels/reference.py because that file was being
edited by another engineer at the time.

Sources: ByteSplat §4 (fused dataflow, tile-local SSIM), §5 (per-tile shared-memory budget);
gsplat 1.5.3 RasterizeToPixels3DGSFwd.cu / RasterizeToPixels3DGSBwd.cu; Wang et al. 2004 (SSIM);
Kerbl et al. 2023 eq. 7 ((1 - lambda) L1 + lambda D-SSIM).
"""

import importlib
import math
import os
import warnings
from types import ModuleType
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

from . import reference as ref
from .resources import (CPU_TILE_BUDGET, RECORD_BYTES, RESIDENT_BYTES_PER_GAUSSIAN,  # noqa: F401 (re-exported)
                        TILE_SIZE, tile_budget)

SSIM_WINDOW = 11  # Gaussian window side, pixels (Wang et al. 2004)
SSIM_SIGMA = 1.5  # window standard deviation, pixels
SSIM_C1 = 0.01**2
SSIM_C2 = 0.03**2
GRAD_NAMES = ("means2d", "conics", "colors", "opacities", "backgrounds")  # the differentiable inputs
STREAM_CHUNK = 8  # streaming chunk on CPU / the interpreter, and on a GPU when probing fails
NUM_WARPS = 8  # warps (NVIDIA) / wavefronts (AMD) per program; untuned, the lead measures on GPU
# Chunk lengths tried on a GPU, increasing; the largest that compiles without spilling is used
# (chunk_limits). Ahead-of-time compiles at NUM_WARPS 8 (scripts/kernel_resources.py): sm_90
# resident 8 = 175 registers and no spill, 16 spills 24 B/thread (zero-padded SSIM: 177 / 32 B),
# 128 spills 12.6 KB/thread (zero-padded SSIM); gfx942 resident 16 = 226 VGPRs and no spill.
RESIDENT_CANDIDATES = (8, 16, 32, 64, 128)
STREAM_CANDIDATES = (8, 16, 32)

_MAX_ALPHA = tl.constexpr(ref.MAX_ALPHA)
_ALPHA_THRESHOLD = tl.constexpr(ref.ALPHA_THRESHOLD)
_LOG_T_MIN = tl.constexpr(math.log(float(torch.tensor(ref.TRANSMITTANCE_MIN, dtype=torch.float32))))
_T_MIN = tl.constexpr(ref.TRANSMITTANCE_MIN)
_STOP_CHECK = tl.constexpr(32)  # Gaussians between the streaming forward's all-pixels-stopped checks
RECORD_FIELDS = tl.constexpr(9)  # floats per gathered record: means2d (2), conic (3), opacity, colour (3)
_C1 = tl.constexpr(SSIM_C1)
_C2 = tl.constexpr(SSIM_C2)


_CHUNK_LIMITS: Dict[str, Tuple[int, int]] = {}


def chunk_limits(device) -> Tuple[int, int]:
    """(resident_max, stream_chunk) for ``device``: the longest tile list the resident variant
    takes in one chunk, and the streaming variant's chunk length, in Gaussians.

    The kernel holds [256 pixels, K] fp32 blocks in registers, so K, not the shared memory, decides
    whether a tile's state stays on chip. On a GPU each is the largest K (of RESIDENT_CANDIDATES /
    STREAM_CANDIDATES) whose kernel, compiled for this device's target at NUM_WARPS, does not spill
    (kernels/resources.py reads the compiled code object; Triton's cache makes later runs cheap).
    It depends on the register file and the compiler, so it is measured, never tabled per GPU.
    On CPU / the interpreter: (CPU_TILE_BUDGET, STREAM_CHUNK). If the probe fails (no cuobjdump,
    an unknown backend), a warning and (RESIDENT_CANDIDATES[0], STREAM_CHUNK).
    """
    dev = torch.device(device)
    if dev.type != "cuda":
        return CPU_TILE_BUDGET, STREAM_CHUNK
    from . import resources

    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    key = str(dev)
    if key not in _CHUNK_LIMITS:
        try:
            target = resources.device_target(dev)
            resident = resources.largest_spill_free(
                lambda k: resources.compile_config(target, True, k, NUM_WARPS), RESIDENT_CANDIDATES)
            stream = resources.largest_spill_free(
                lambda k: resources.compile_config(target, False, k, NUM_WARPS), STREAM_CANDIDATES)
        except Exception as e:  # pragma: no cover - depends on the GPU toolchain
            warnings.warn(f"fused rasterizer: could not measure register use on {key} ({type(e).__name__}: {e}); "
                          f"resident lists up to {RESIDENT_CANDIDATES[0]}, streaming chunks of {STREAM_CHUNK}")
            resident, stream = RESIDENT_CANDIDATES[0], STREAM_CHUNK
        _CHUNK_LIMITS[key] = (resident, stream)
    return _CHUNK_LIMITS[key]


def ssim_window_1d(dtype: torch.dtype = torch.float32) -> Tensor:
    """Normalized 1D Gaussian window [SSIM_WINDOW] (sigma 1.5 px), computed in float64, cast to dtype."""
    offsets = torch.arange(SSIM_WINDOW, dtype=torch.float64) - (SSIM_WINDOW - 1) / 2
    g = torch.exp(-(offsets**2) / (2.0 * SSIM_SIGMA**2))
    return (g / g.sum()).to(dtype)


# ------------------------------------------------------------------------------------------------
# REFERENCE: plain PyTorch definition of the fused function (autograd gives the gradients)
# ------------------------------------------------------------------------------------------------


def tile_window(first: int, stop: int, tile_size: int = TILE_SIZE, dtype: torch.dtype = torch.float32,
                device: "torch.device | str" = "cpu") -> Tensor:
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


_WINDOWS: Dict[str, Tensor] = {}


def _device_window(device: torch.device) -> Tensor:
    """The kernel's 1D window (:func:`ssim_window_1d`, float32) on ``device``, copied once per device."""
    key = str(device)
    if key not in _WINDOWS:
        _WINDOWS[key] = ssim_window_1d().to(device)
    return _WINDOWS[key]


def tile_local_ssim_map(img: Tensor, gt: Tensor, tile_size: int = TILE_SIZE,
                        origin: Tuple[int, int] = (0, 0)) -> Tensor:
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
        return torch.stack([tile_window(max(o - t * tile_size, 0), min(n - t * tile_size, tile_size), tile_size,
                                        img.dtype, img.device) if o < (t + 1) * tile_size
                            else torch.zeros(tile_size, tile_size, dtype=img.dtype, device=img.device)
                            for t in range(count)])
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


def tile_local_loss(img: Tensor, gt: Tensor, ssim_lambda: float, origin: Tuple[int, int] = (0, 0)) -> Tensor:
    """REFERENCE loss: mean over images of (1 - l) L1_i + l (1 - SSIM_tile_i) over the pixels with
    ground truth (module docstring; img, gt and origin as :func:`tile_local_ssim_map`)."""
    ox, oy = origin
    l1 = (img[:, oy:, ox:] - gt).abs().mean(dim=(1, 2, 3))
    ssim = tile_local_ssim_map(img, gt, origin=origin).mean(dim=(1, 2, 3))
    return ((1.0 - ssim_lambda) * l1 + ssim_lambda * (1.0 - ssim)).mean()


def reference_fused_loss(
    means2d: Tensor, conics: Tensor, colors: Tensor, opacities: Tensor,
    isect_offsets: Tensor, flatten_ids: Tensor, gts: Tensor, width: int, height: int,
    ssim_lambda: float = 0.2, backgrounds: Optional[Tensor] = None, packed: bool = False,
    origin: Tuple[int, int] = (0, 0),
) -> Tuple[Tensor, Tensor]:
    """REFERENCE of the fused kernel: kernels.reference.rasterize_to_pixels + tile_local_loss.

    Same arguments as :func:`fused_raster_loss`. Returns (loss 0-dim, image [I, H, W, 3]);
    differentiate the loss with autograd.
    """
    image, _ = ref.rasterize_to_pixels(
        means2d, conics, colors, opacities, width, height, TILE_SIZE, isect_offsets, flatten_ids,
        backgrounds=backgrounds, packed=packed,
    )  # fmt: skip
    return tile_local_loss(image, gts, ssim_lambda, origin), image


# ------------------------------------------------------------------------------------------------
# Triton kernel
# ------------------------------------------------------------------------------------------------


@triton.jit
def _load_chunk(rec_ptr, flatten_ptr, k0, end, px, py, in_img, K: tl.constexpr):
    """Records of list positions [k0, k0 + K) and their [P, K] per-pixel alpha terms. ``rec_ptr``
    holds the records gathered in list order, RECORD_FIELDS floats each (``_gather_records``)."""
    ks = k0 + tl.arange(0, K)
    in_list = ks < end
    gid = tl.load(flatten_ptr + ks, mask=in_list, other=0).to(tl.int64)
    base = rec_ptr + ks.to(tl.int64) * RECORD_FIELDS
    mx = tl.load(base, mask=in_list, other=0.0)
    my = tl.load(base + 1, mask=in_list, other=0.0)
    ca = tl.load(base + 2, mask=in_list, other=0.0)
    cb = tl.load(base + 3, mask=in_list, other=0.0)
    cc = tl.load(base + 4, mask=in_list, other=0.0)
    op = tl.load(base + 5, mask=in_list, other=0.0)
    cr = tl.load(base + 6, mask=in_list, other=0.0)
    cg = tl.load(base + 7, mask=in_list, other=0.0)
    cbl = tl.load(base + 8, mask=in_list, other=0.0)
    dx = mx[None, :] - px[:, None]  # [P, K], delta = mean - pixel centre
    dy = my[None, :] - py[:, None]
    sigma = 0.5 * (ca[None, :] * dx * dx + cc[None, :] * dy * dy) + cb[None, :] * dx * dy
    vis = tl.exp(-sigma)
    raw = op[None, :] * vis
    alpha = tl.minimum(raw, _MAX_ALPHA)
    keep = in_list[None, :] & in_img[:, None] & (sigma >= 0) & (alpha >= _ALPHA_THRESHOLD)
    log1m = tl.where(keep, tl.log(1.0 - alpha), 0.0)
    return ks, in_list, gid, ca, cb, cc, cr, cg, cbl, dx, dy, vis, raw, alpha, keep, log1m


@triton.jit
def _forward_sequential(rec_ptr, start, end, px, py, in_img):
    """Front-to-back compositing one Gaussian at a time, every pixel in its own thread, as
    RasterizeToPixels3DGSFwd.cu does: T carried as a product, no cross-thread work except one
    block reduction every _STOP_CHECK Gaussians, which ends the tile's loop once every pixel has
    stopped (gsplat's per-block early exit). Returns (T_final, stop_idx, colour r, g, b), all [P];
    stop_idx = list position of the Gaussian a pixel stopped before (``end`` if none)."""
    t = tl.where(in_img, 1.0, 0.0)
    active = in_img
    stop_idx = tl.zeros_like(px).to(tl.int32) + end
    out_r = tl.zeros_like(px)
    out_g = tl.zeros_like(px)
    out_b = tl.zeros_like(px)
    k0 = start
    last = end
    while k0 < last:
        k1 = tl.minimum(k0 + _STOP_CHECK, end)
        base = rec_ptr + k0.to(tl.int64) * RECORD_FIELDS
        for k in range(k0, k1):
            dx = tl.load(base) - px
            dy = tl.load(base + 1) - py
            sigma = 0.5 * (tl.load(base + 2) * dx * dx + tl.load(base + 4) * dy * dy) + tl.load(base + 3) * dx * dy
            alpha = tl.minimum(tl.load(base + 5) * tl.exp(-sigma), _MAX_ALPHA)
            keep = active & (sigma >= 0) & (alpha >= _ALPHA_THRESHOLD)
            next_t = t * (1.0 - alpha)
            stop = keep & (next_t <= _T_MIN)
            stop_idx = tl.where(stop, k, stop_idx)
            active = active & ~stop
            w = tl.where(keep & ~stop, alpha * t, 0.0)
            out_r += w * tl.load(base + 6)
            out_g += w * tl.load(base + 7)
            out_b += w * tl.load(base + 8)
            t = tl.where(keep & ~stop, next_t, t)
            base += RECORD_FIELDS
        k0 = k1
        last = tl.where(tl.max(active.to(tl.int32), axis=0) > 0, end, k0)
    return t, stop_idx, out_r, out_g, out_b


@triton.jit
def _forward_chunk(ks, cr, cg, cbl, alpha, keep, log1m, log_t, stop_idx, out_r, out_g, out_b):
    """Front-to-back compositing of one chunk; carries ln T and each pixel's stop position."""
    incl = log_t[:, None] + tl.cumsum(log1m, axis=1)  # ln next_T, [P, K]
    stops = keep & (incl <= _LOG_T_MIN) & (ks[None, :] < stop_idx[:, None])
    first = tl.min(tl.where(stops, ks[None, :], stop_idx[:, None]), axis=1)
    stop_idx = tl.minimum(stop_idx, first)
    valid = keep & (ks[None, :] < stop_idx[:, None])
    t_before = tl.exp(incl - log1m)
    w = tl.where(valid, alpha * t_before, 0.0)
    out_r += tl.sum(w * cr[None, :], axis=1)
    out_g += tl.sum(w * cg[None, :], axis=1)
    out_b += tl.sum(w * cbl[None, :], axis=1)
    log_t += tl.sum(tl.where(valid, log1m, 0.0), axis=1)
    return stop_idx, valid, t_before, w, log_t, out_r, out_g, out_b


@triton.jit
def _blur(x, G):
    """Tile-truncated separable Gaussian filter G X G^T of a [TS, TS] block (G symmetric)."""
    return tl.dot(tl.dot(G, x, input_precision="ieee"), G, input_precision="ieee")


@triton.jit
def _ssim_channel(x, y, m, G, inv_n, TS: tl.constexpr):
    """Tile-local SSIM of one channel: x, y, m (mask of the pixels with ground truth) [P], inv_n [TS, TS] (1 / the
    window's in-tile weight, 0 outside the ground truth) -> (sum of m * ssim, dsum/dx [P]).

    The renormalized filter of ``tile_window`` as a normalized convolution: x and y are zero
    outside the ground truth, so Gy X Gx^T = (G X G^T) * inv_n with inv_n = 1 / (G M G^T); its
    transpose is G (D * inv_n) G^T. One symmetric G keeps the register footprint of the
    zero-padded version (four distinct matrices spilled at K = 8 on sm_90)."""
    x = tl.reshape(x, (TS, TS))
    y = tl.reshape(y, (TS, TS))
    m = tl.reshape(m, (TS, TS))
    mu_x = _blur(x, G) * inv_n
    mu_y = _blur(y, G) * inv_n
    var_x = _blur(x * x, G) * inv_n - mu_x * mu_x
    var_y = _blur(y * y, G) * inv_n - mu_y * mu_y
    cov = _blur(x * y, G) * inv_n - mu_x * mu_y
    a1 = 2.0 * mu_x * mu_y + _C1
    a2 = 2.0 * cov + _C2
    b1 = mu_x * mu_x + mu_y * mu_y + _C1
    b2 = var_x + var_y + _C2
    den = b1 * b2
    s = a1 * a2 / den
    total = tl.sum(tl.sum(s * m, axis=1), axis=0)
    d_mu = m * (2.0 * mu_y * (a2 - a1) - 2.0 * mu_x * s * (b2 - b1)) / den  # d s / d mu_x
    d_xx = -m * s / b2  # d s / d E[x^2]
    d_xy = 2.0 * m * a1 / den  # d s / d E[xy]
    dx = _blur(d_mu * inv_n, G) + 2.0 * x * _blur(d_xx * inv_n, G) + y * _blur(d_xy * inv_n, G)
    return total, tl.reshape(dx, (TS * TS,))


@triton.jit
def _add9(a0, a1, a2, a3, a4, a5, a6, a7, a8, b0, b1, b2, b3, b4, b5, b6, b7, b8):
    return a0 + b0, a1 + b1, a2 + b2, a3 + b3, a4 + b4, a5 + b5, a6 + b6, a7 + b7, a8 + b8


@triton.jit
def _add_gradients(gid, mask, v_mx, v_my, v_sigma, dx, dy, v_op, v_r, v_g, v_b, v_means2d_ptr, v_conics_ptr,
                   v_colors_ptr, v_opac_ptr, absgrad_ptr, ABSGRAD: tl.constexpr, TUPLE_REDUCE: tl.constexpr):
    """Sums per-pixel gradient terms over the tile's pixels (axis 0; one multi-operand block
    reduction, so one round of shared memory and barriers for all nine fields) and adds them to
    the Gaussians' gradients, one atomic per (Gaussian, tile, field). Terms are [P, K] (a chunk;
    gid, mask [K]). TUPLE_REDUCE False (set
    under TRITON_INTERPRET=1, whose tl.reduce runs element by element in Python) sums the fields
    one by one: the same sums in another reduction order."""
    if TUPLE_REDUCE:
        s_mx, s_my, s_a, s_b, s_c, s_op, s_r, s_g, s_bl = tl.reduce(
            (v_mx, v_my, v_sigma * dx * dx, v_sigma * dx * dy, v_sigma * dy * dy, v_op, v_r, v_g, v_b), 0, _add9)
    else:  # the same sums one field at a time (the interpreter runs tl.reduce element by element)
        s_mx = tl.sum(v_mx, axis=0)
        s_my = tl.sum(v_my, axis=0)
        s_a = tl.sum(v_sigma * dx * dx, axis=0)
        s_b = tl.sum(v_sigma * dx * dy, axis=0)
        s_c = tl.sum(v_sigma * dy * dy, axis=0)
        s_op = tl.sum(v_op, axis=0)
        s_r = tl.sum(v_r, axis=0)
        s_g = tl.sum(v_g, axis=0)
        s_bl = tl.sum(v_b, axis=0)
    tl.atomic_add(v_means2d_ptr + 2 * gid, s_mx, mask=mask)
    tl.atomic_add(v_means2d_ptr + 2 * gid + 1, s_my, mask=mask)
    tl.atomic_add(v_conics_ptr + 3 * gid, 0.5 * s_a, mask=mask)
    tl.atomic_add(v_conics_ptr + 3 * gid + 1, s_b, mask=mask)
    tl.atomic_add(v_conics_ptr + 3 * gid + 2, 0.5 * s_c, mask=mask)
    tl.atomic_add(v_opac_ptr + gid, s_op, mask=mask)
    tl.atomic_add(v_colors_ptr + 3 * gid, s_r, mask=mask)
    tl.atomic_add(v_colors_ptr + 3 * gid + 1, s_g, mask=mask)
    tl.atomic_add(v_colors_ptr + 3 * gid + 2, s_bl, mask=mask)
    if ABSGRAD:
        a_x = tl.sum(tl.abs(v_mx), axis=0)
        a_y = tl.sum(tl.abs(v_my), axis=0)
        tl.atomic_add(absgrad_ptr + 2 * gid, a_x, mask=mask)
        tl.atomic_add(absgrad_ptr + 2 * gid + 1, a_y, mask=mask)


@triton.jit
def _backward_chunk(ks, in_list, gid, ca, cb, cc, cr, cg, cbl, dx, dy, vis, raw, alpha, valid, t_before,
                    w, acc, g_r, g_g, g_b, v_means2d_ptr, v_conics_ptr, v_colors_ptr, v_opac_ptr,
                    absgrad_ptr, ABSGRAD: tl.constexpr, TUPLE_REDUCE: tl.constexpr):
    """Back-to-front gradients of one chunk; acc = per-pixel d colour . g of what lies behind it."""
    cdot = cr[None, :] * g_r[:, None] + cg[None, :] * g_g[:, None] + cbl[None, :] * g_b[:, None]
    wc = w * cdot  # [P, K], 0 where not valid
    behind = acc[:, None] + (tl.cumsum(wc, axis=1, reverse=True) - wc)
    v_alpha = tl.where(valid, t_before * cdot - behind / (1.0 - alpha), 0.0)
    unclamped = raw <= _MAX_ALPHA
    v_op = tl.where(unclamped, vis * v_alpha, 0.0)
    v_sigma = tl.where(unclamped, -raw * v_alpha, 0.0)
    v_mx = v_sigma * (ca[None, :] * dx + cb[None, :] * dy)
    v_my = v_sigma * (cc[None, :] * dy + cb[None, :] * dx)
    _add_gradients(gid, in_list, v_mx, v_my, v_sigma, dx, dy, v_op, w * g_r[:, None], w * g_g[:, None],
                   w * g_b[:, None], v_means2d_ptr, v_conics_ptr, v_colors_ptr, v_opac_ptr, absgrad_ptr, ABSGRAD,
                   TUPLE_REDUCE)
    return acc + tl.sum(wc, axis=1)


# The image size and origin change every step with --random_tile_shift: not specializing them on
# their value (1) or divisibility by 16 keeps that from compiling a variant per combination.
@triton.jit(do_not_specialize=["width", "height", "origin_x", "origin_y", "tile_width", "num_tiles"])
def _fused_raster_loss_kernel(
    rec_ptr, bg_ptr, gts_ptr, window_ptr,
    offsets_ptr, flatten_ptr, tile_ids_ptr,
    v_means2d_ptr, v_conics_ptr, v_colors_ptr, v_opac_ptr, v_bg_ptr, absgrad_ptr,
    image_ptr, partial_ptr, src_ptr, v_src_ptr,
    width, height, origin_x, origin_y, tile_width, num_tiles, l1_scale, ssim_scale,
    HAS_BG: tl.constexpr, RETURN_IMAGE: tl.constexpr, ABSGRAD: tl.constexpr, TUPLE_REDUCE: tl.constexpr,
    LOSS_ONLY: tl.constexpr, RESIDENT: tl.constexpr, K: tl.constexpr, TS: tl.constexpr, WIN: tl.constexpr,
):  # fmt: skip
    tile = tl.load(tile_ids_ptr + tl.program_id(0))  # flat (image, tile) id
    img = tile // num_tiles
    tx = (tile % num_tiles) % tile_width
    ty = (tile % num_tiles) // tile_width
    start = tl.load(offsets_ptr + tile)
    end = tl.load(offsets_ptr + tile + 1)

    p = tl.arange(0, TS * TS)
    xi = tx * TS + p % TS
    yi = ty * TS + p // TS
    in_img = (xi < width) & (yi < height)
    has_gt = in_img & (xi >= origin_x) & (yi >= origin_y)  # the pixels the loss covers
    px = xi.to(tl.float32) + 0.5
    py = yi.to(tl.float32) + 0.5

    pix = (img.to(tl.int64) * height + yi) * width + xi  # [P] flat pixel index
    if LOSS_ONLY:  # a tile over the budget, rendered by the fallback rasterizer into src
        x_r = tl.load(src_ptr + 3 * pix, mask=in_img, other=0.0)
        x_g = tl.load(src_ptr + 3 * pix + 1, mask=in_img, other=0.0)
        x_b = tl.load(src_ptr + 3 * pix + 2, mask=in_img, other=0.0)
    else:  # ---- forward compositing
        if RESIDENT:  # the whole list in one chunk, its [P, K] state kept for the backward
            log_t = tl.zeros([TS * TS], dtype=tl.float32)
            stop_idx = tl.zeros([TS * TS], dtype=tl.int32) + end
            out_r = tl.zeros([TS * TS], dtype=tl.float32)
            out_g = tl.zeros([TS * TS], dtype=tl.float32)
            out_b = tl.zeros([TS * TS], dtype=tl.float32)
            ks, in_list, gid, ca, cb, cc, cr, cg, cbl, dx, dy, vis, raw, alpha, keep, log1m = _load_chunk(
                rec_ptr, flatten_ptr, start, end, px, py, in_img, K)
            stop_idx, valid, t_before, w, log_t, out_r, out_g, out_b = _forward_chunk(
                ks, cr, cg, cbl, alpha, keep, log1m, log_t, stop_idx, out_r, out_g, out_b)
            t_final = tl.exp(log_t)
        else:
            t_final, stop_idx, out_r, out_g, out_b = _forward_sequential(rec_ptr, start, end, px, py, in_img)
            log_t = tl.log(tl.maximum(t_final, 1e-30))
        bg_r = 0.0
        bg_g = 0.0
        bg_b = 0.0
        if HAS_BG:
            bg_r = tl.load(bg_ptr + 3 * img)
            bg_g = tl.load(bg_ptr + 3 * img + 1)
            bg_b = tl.load(bg_ptr + 3 * img + 2)
        x_r = tl.where(in_img, out_r + t_final * bg_r, 0.0)
        x_g = tl.where(in_img, out_g + t_final * bg_g, 0.0)
        x_b = tl.where(in_img, out_b + t_final * bg_b, 0.0)
    if RETURN_IMAGE:
        tl.store(image_ptr + 3 * pix, x_r, mask=in_img)
        tl.store(image_ptr + 3 * pix + 1, x_g, mask=in_img)
        tl.store(image_ptr + 3 * pix + 2, x_b, mask=in_img)

    # ---- tile-local loss and dL/dpixel, over the pixels with ground truth (zero elsewhere)
    x_r = tl.where(has_gt, x_r, 0.0)
    x_g = tl.where(has_gt, x_g, 0.0)
    x_b = tl.where(has_gt, x_b, 0.0)
    gt_w = width - origin_x
    gpix = (img.to(tl.int64) * (height - origin_y) + (yi - origin_y)) * gt_w + (xi - origin_x)
    y_r = tl.load(gts_ptr + 3 * gpix, mask=has_gt, other=0.0)
    y_g = tl.load(gts_ptr + 3 * gpix + 1, mask=has_gt, other=0.0)
    y_b = tl.load(gts_ptr + 3 * gpix + 2, mask=has_gt, other=0.0)
    m = has_gt.to(tl.float32)
    r = tl.arange(0, TS)
    d = r[:, None] - r[None, :]
    band = (d <= WIN // 2) & (d >= -(WIN // 2))
    G = tl.load(window_ptr + (d + WIN // 2), mask=band, other=0.0)  # [TS, TS] banded 1D window
    m2 = tl.reshape(m, (TS, TS))
    inv_n = tl.where(m2 > 0, 1.0 / tl.maximum(_blur(m2, G), 1e-30), 0.0)  # 1 / in-tile window weight
    s_r, ds_r = _ssim_channel(x_r, y_r, m, G, inv_n, TS)
    s_g, ds_g = _ssim_channel(x_g, y_g, m, G, inv_n, TS)
    s_b, ds_b = _ssim_channel(x_b, y_b, m, G, inv_n, TS)
    e_r = x_r - y_r
    e_g = x_g - y_g
    e_b = x_b - y_b
    abs_sum = tl.sum(tl.abs(e_r) + tl.abs(e_g) + tl.abs(e_b), axis=0)
    tl.store(partial_ptr + 2 * tile, abs_sum)
    tl.store(partial_ptr + 2 * tile + 1, s_r + s_g + s_b)
    g_r = m * (l1_scale * tl.where(e_r > 0, 1.0, tl.where(e_r < 0, -1.0, 0.0)) - ssim_scale * ds_r)
    g_g = m * (l1_scale * tl.where(e_g > 0, 1.0, tl.where(e_g < 0, -1.0, 0.0)) - ssim_scale * ds_g)
    g_b = m * (l1_scale * tl.where(e_b > 0, 1.0, tl.where(e_b < 0, -1.0, 0.0)) - ssim_scale * ds_b)

    if LOSS_ONLY:  # dL/dpixel for the fallback's backward
        tl.store(v_src_ptr + 3 * pix, g_r, mask=in_img)
        tl.store(v_src_ptr + 3 * pix + 1, g_g, mask=in_img)
        tl.store(v_src_ptr + 3 * pix + 2, g_b, mask=in_img)
    else:  # ---- backward compositing, back to front from the final T
        acc = t_final * (bg_r * g_r + bg_g * g_g + bg_b * g_b)  # what lies behind, dotted with g
        if HAS_BG:
            tl.atomic_add(v_bg_ptr + 3 * img, tl.sum(t_final * g_r, axis=0))
            tl.atomic_add(v_bg_ptr + 3 * img + 1, tl.sum(t_final * g_g, axis=0))
            tl.atomic_add(v_bg_ptr + 3 * img + 2, tl.sum(t_final * g_b, axis=0))
        if RESIDENT:
            acc = _backward_chunk(ks, in_list, gid, ca, cb, cc, cr, cg, cbl, dx, dy, vis, raw, alpha, valid,
                                  t_before, w, acc, g_r, g_g, g_b, v_means2d_ptr, v_conics_ptr, v_colors_ptr,
                                  v_opac_ptr, absgrad_ptr, ABSGRAD, TUPLE_REDUCE)
        else:  # in chunks, from the chunk of the last Gaussian any pixel composited, back to the front
            last = tl.max(tl.where(has_gt, stop_idx, start), axis=0)  # the others have g = 0
            num_chunks = tl.cdiv(last - start, K)
            log_t_end = log_t
            for i in range(0, num_chunks):
                k0 = start + (num_chunks - 1 - i) * K
                ks, in_list, gid, ca, cb, cc, cr, cg, cbl, dx, dy, vis, raw, alpha, keep, log1m = _load_chunk(
                    rec_ptr, flatten_ptr, k0, end, px, py, in_img, K)
                valid = keep & (ks[None, :] < stop_idx[:, None])
                lv = tl.where(valid, log1m, 0.0)
                log_t_start = log_t_end - tl.sum(lv, axis=1)
                t_before = tl.exp(log_t_start[:, None] + tl.cumsum(lv, axis=1) - lv)
                w = tl.where(valid, alpha * t_before, 0.0)
                acc = _backward_chunk(ks, in_list, gid, ca, cb, cc, cr, cg, cbl, dx, dy, vis, raw, alpha, valid,
                                      t_before, w, acc, g_r, g_g, g_b, v_means2d_ptr, v_conics_ptr, v_colors_ptr,
                                      v_opac_ptr, absgrad_ptr, ABSGRAD, TUPLE_REDUCE)
                log_t_end = log_t_start


# ------------------------------------------------------------------------------------------------
# Host side
# ------------------------------------------------------------------------------------------------


def _check_inputs(means2d, conics, colors, opacities, isect_offsets, flatten_ids, gts, width, height,
                  ssim_lambda, backgrounds, packed, origin=(0, 0)):
    """Raises ValueError on inconsistent shapes / arguments. Returns the number of images I."""
    ox, oy = origin
    if not (0 <= ox < width and 0 <= oy < height):
        raise ValueError(f"origin {tuple(origin)} must lie in the {width}x{height} image")
    if not 0.0 <= ssim_lambda <= 1.0:
        raise ValueError(f"ssim_lambda must be in [0, 1], got {ssim_lambda}")
    if isect_offsets.dim() != 3:
        raise ValueError(f"isect_offsets must be [I, tile_h, tile_w], got {tuple(isect_offsets.shape)}")
    I, th, tw = isect_offsets.shape
    if (th, tw) != (-(-height // TILE_SIZE), -(-width // TILE_SIZE)):
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


def _tile_counts(isect_offsets: Tensor, num_isects: int) -> Tuple[Tensor, Tensor]:
    """(offsets extended by n_isects [I * n_tiles + 1] int32, counts [I * n_tiles] int64)."""
    flat = isect_offsets.reshape(-1).to(torch.int32)
    ext = torch.cat([flat, flat.new_full((1,), num_isects)])
    return ext, (ext[1:] - ext[:-1]).long()


def _isect_share(counts: Tensor, within: Tensor) -> float:
    """Share of the tile-Gaussian intersections in the tiles ``within`` (1.0 when there are none):
    the part of the rasterization work the fused kernel does; the rest is the fallback's."""
    total = int(counts.sum())
    return float(counts[within].sum()) / total if total else 1.0


def _gather_records(means2d: Tensor, conics: Tensor, opacities: Tensor, colors: Tensor,
                    flatten_ids: Tensor) -> Tensor:
    """The records in tile-list order, [n_isects, RECORD_FIELDS] float32: (means2d x, y, conic
    a, b, c, opacity, colour r, g, b) of record ``flatten_ids[k]`` in row k. The kernel then
    reads a tile's Gaussians from consecutive addresses (one cache line serves several), not
    through a dependent, scattered load per record. Costs 36 bytes per intersection."""
    table = torch.cat([means2d, conics, opacities[:, None], colors], dim=1)  # [R, 9]
    return table.index_select(0, flatten_ids.long()).contiguous()


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _use_triton(device: torch.device) -> bool:
    return device.type != "cpu" or _interpreted()


def default_fallback(device) -> ModuleType:
    """The rasterizer for tiles over the budget: gsplat's (``gsplat.cuda._wrapper``) on a GPU when
    it imports, else this project's PyTorch reference (kernels/reference.py)."""
    if torch.device(device).type == "cuda":
        try:
            return importlib.import_module("gsplat.cuda._wrapper")
        except ImportError:
            pass
    return ref


def _fallback_render(ops, means2d, conics, colors, opacities, backgrounds, isect_offsets, flatten_ids, width,
                     height, packed, over, absgrad):
    """Renders the tiles over the budget (``over`` [I, tile_h, tile_w] bool; the others are
    skipped, gsplat's tile masks) with ``ops.rasterize_to_pixels`` on contiguous float32 copies of
    the records (and backgrounds) that require grad. The background is composited here, on the
    fallback pixels only (``ref.composite_background``): gsplat leaves the alphas of skipped tiles
    unwritten, sums its background gradient over every pixel, and rejects per-image backgrounds
    when packed. Returns (image [I, H, W, 3] float32 contiguous, meaningful on the fallback tiles
    only; the copies, in GRAD_NAMES order, backgrounds last when given)."""
    leaves = [t.detach().to(torch.float32).contiguous().requires_grad_(True)
              for t in (means2d, conics, colors, opacities)]
    with torch.enable_grad():
        image, alphas = ops.rasterize_to_pixels(
            *leaves, width, height, TILE_SIZE, isect_offsets, flatten_ids, masks=over.contiguous(), packed=packed,
            absgrad=absgrad)  # fmt: skip
        if backgrounds is not None:
            leaves.append(backgrounds.detach().to(torch.float32).contiguous().requires_grad_(True))
            pixels = over.repeat_interleave(TILE_SIZE, 1).repeat_interleave(TILE_SIZE, 2)[:, :height, :width, None]
            image = ref.composite_background(image, torch.where(pixels, alphas, 1.0), leaves[-1])
    return image.contiguous(), leaves


def _launch(means2d, conics, colors, opacities, backgrounds, gts, isect_offsets, flatten_ids, width, height,
            ssim_lambda, budget, resident_max, stream_chunk, return_image, absgrad, num_warps, packed, fallback,
            origin=(0, 0)):
    """Runs the fallback and both kernel variants. Returns loss (0-dim), grads dict, stats dict."""
    device = means2d.device
    I, th, tw = isect_offsets.shape
    num_tiles = th * tw
    f32 = dict(dtype=torch.float32, device=device)
    rec = [means2d.reshape(-1, 2), conics.reshape(-1, 3), colors.reshape(-1, 3), opacities.reshape(-1)]
    m2d, con, col, opa = (t.detach().to(torch.float32).contiguous() for t in rec)
    R = m2d.shape[0]
    bg = backgrounds.detach().to(torch.float32).contiguous() if backgrounds is not None else m2d.new_zeros(1)
    gt = gts.detach().to(torch.float32).contiguous()
    offsets, counts = _tile_counts(isect_offsets, flatten_ids.numel())
    offsets = offsets.to(device)
    fids = flatten_ids.to(torch.int32).contiguous()
    records = _gather_records(m2d, con, opa, col, flatten_ids)
    grads = {
        "means2d": torch.zeros(R, 2, **f32), "conics": torch.zeros(R, 3, **f32),
        "colors": torch.zeros(R, 3, **f32), "opacities": torch.zeros(R, **f32),
        "backgrounds": torch.zeros(I, 3, **f32),
    }  # fmt: skip
    abs_buf = torch.zeros(R, 2, **f32) if absgrad else grads["means2d"]
    image = torch.full((I, height, width, 3), math.nan, **f32) if return_image else m2d.new_zeros(1)
    partial = torch.full((I * num_tiles, 2), math.nan, **f32)
    window = _device_window(device)
    ox, oy = origin
    num_pixels = (height - oy) * (width - ox)  # the pixels with ground truth, per image
    denom = float(I * 3 * num_pixels)
    # one device -> host copy decides every tile's path (each nonzero() / any() would wait on the GPU)
    counts_host = counts.cpu()
    over = counts_host > budget
    resident = ~over & (counts_host <= resident_max)
    src = v_src = m2d.new_zeros(1)
    if bool(over.any()):  # the fallback renders these tiles; the kernel scores them and forms dL/dpixel
        if absgrad and fallback is ref:
            raise NotImplementedError("absgrad with tiles over the budget needs gsplat's rasterizer (a CUDA device)")
        over_tiles = over.reshape(I, th, tw).to(device)
        src, leaves = _fallback_render(fallback, means2d, conics, colors, opacities, backgrounds, isect_offsets,
                                       flatten_ids, width, height, packed, over_tiles, absgrad)
        v_src = torch.zeros_like(src)
    tile_sets = [("fallback", over), ("resident", resident), ("streaming", ~over & ~resident)]
    for kind, mask in tile_sets:
        ids = mask.nonzero().squeeze(1)
        if ids.numel() == 0:
            continue
        if kind == "resident":  # block = the longest resident list rounded up to a power of two
            K = max(1, int(counts_host[ids].max()))
            K = 1 << (K - 1).bit_length()
        else:
            K = stream_chunk
        _fused_raster_loss_kernel[(ids.numel(),)](
            records, bg, gt, window, offsets, fids, ids.to(device=device, dtype=torch.int32),
            grads["means2d"], grads["conics"], grads["colors"], grads["opacities"], grads["backgrounds"], abs_buf,
            image, partial, src.detach(), v_src, width, height, ox, oy, tw, num_tiles,
            (1.0 - ssim_lambda) / denom, ssim_lambda / denom,
            HAS_BG=backgrounds is not None, RETURN_IMAGE=return_image, ABSGRAD=absgrad,
            TUPLE_REDUCE=not _interpreted(), LOSS_ONLY=kind == "fallback",
            RESIDENT=kind == "resident", K=K, TS=TILE_SIZE, WIN=SSIM_WINDOW, num_warps=num_warps,
        )  # fmt: skip
    if bool(over.any()):  # the fallback's backward with the kernel's dL/dpixel
        with torch.enable_grad():
            fallback_grads = torch.autograd.grad(src, leaves, v_src, allow_unused=True)
        for name, g in zip(GRAD_NAMES, fallback_grads):
            if g is not None:
                grads[name] += g.reshape(grads[name].shape)
        if absgrad:
            abs_buf += leaves[0].absgrad.reshape(-1, 2)
    sums = partial.reshape(I, num_tiles, 2).sum(1) / (3.0 * num_pixels)  # [I, 2]: L1_i, SSIM_i
    loss = ((1.0 - ssim_lambda) * sums[:, 0] + ssim_lambda * (1.0 - sums[:, 1])).mean()
    stats = {"fraction_fused": float((~over).float().mean()), "fraction_resident": float(resident.float().mean()),
             "fraction_isects_fused": _isect_share(counts_host, ~over),
             "num_tiles": I * num_tiles, "image": image if return_image else None,
             "absgrad": abs_buf if absgrad else None}
    return loss, grads, stats


class FusedRasterLoss(torch.autograd.Function):
    """loss = tile-local (1 - l) L1 + l D-SSIM of the composited images (module docstring).

    forward runs the fused kernel, which computes the loss AND all its gradients at once; they
    are saved and backward scales them by the incoming gradient, so autograd carries them on to
    the projection, SH and the exchange unchanged. Gradients: means2d, conics, colors, opacities,
    backgrounds (in the inputs' shapes and dtypes). ``meta`` (dict) holds the non-tensor
    arguments and receives the stats.
    """

    @staticmethod
    def forward(ctx, means2d, conics, colors, opacities, backgrounds, gts, isect_offsets, flatten_ids, meta):
        loss, grads, stats = _launch(
            means2d, conics, colors, opacities, backgrounds, gts, isect_offsets, flatten_ids, meta["width"],
            meta["height"], meta["ssim_lambda"], meta["budget"], meta["resident_max"], meta["stream_chunk"],
            meta["return_image"], meta["absgrad"], meta["num_warps"], meta["packed"], meta["fallback"],
            meta["origin"],
        )  # fmt: skip
        meta["stats"] = stats
        shaped = [grads["means2d"].reshape(means2d.shape).to(means2d.dtype),
                  grads["conics"].reshape(conics.shape).to(conics.dtype),
                  grads["colors"].reshape(colors.shape).to(colors.dtype),
                  grads["opacities"].reshape(opacities.shape).to(opacities.dtype)]  # fmt: skip
        if backgrounds is not None:
            shaped.append(grads["backgrounds"].to(backgrounds.dtype))
        ctx.has_bg = backgrounds is not None
        ctx.save_for_backward(*shaped)
        return loss.to(means2d.dtype)

    @staticmethod
    def backward(ctx, grad_loss):
        saved = [g * grad_loss for g in ctx.saved_tensors]
        v_bg = saved[4] if ctx.has_bg else None
        return saved[0], saved[1], saved[2], saved[3], v_bg, None, None, None, None


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
    budget: Optional[int] = None,
    absgrad: bool = False,
    resident_max: Optional[int] = None,
    stream_chunk: Optional[int] = None,
    num_warps: int = NUM_WARPS,
    fallback: Optional[ModuleType] = None,
    origin: Tuple[int, int] = (0, 0),
) -> Tuple[Tensor, Dict]:
    """Composites, scores and back-propagates I images in one fused kernel (ByteSplat §4).

    loss = mean_i [(1 - ssim_lambda) L1_i + ssim_lambda (1 - SSIM_tile_i)] with the tile-local
    SSIM of the module docstring; tile size 16. The records and tile lists are gsplat's
    (isect_tiles / isect_offset_encode). Differentiable w.r.t. means2d, conics, colors,
    opacities and backgrounds (not gts). Computation is in float32.

    budget: the per-tile Gaussian budget (default :func:`tile_budget` of the device: what fits in
    the device's on-chip memory; stats report the fraction of tiles within it, and pruning stage
    3 targets it). Tiles within it run the kernel: with at most resident_max Gaussians (default
    :func:`chunk_limits` of the device) the resident variant (one chunk, records loaded once),
    the others streaming (forward one Gaussian at a time, backward in chunks of stream_chunk).
    Tiles over it fall back (ByteSplat §5.1:
    "conventional execution"): ``fallback.rasterize_to_pixels`` (default
    :func:`default_fallback`: gsplat's on a GPU) renders only them (tile masks), the kernel
    scores them with the same tile-local loss and forms dL/dpixel, and the fallback's backward
    turns that into record gradients, all inside this call. Every path computes the same loss
    and gradients up to float32 rounding, and up to a pixel's stop decision at T <= 1e-4, which
    float32 and the reference's float64 can take differently. num_warps: warps (wavefronts) per program, a tuning knob
    (pass resident_max / stream_chunk measured for it; the defaults are measured at NUM_WARPS).
    origin: (ox, oy) pixels. The ground truth covers the render's pixels x >= ox, y >= oy
    (gts [I, height - oy, width - ox, 3]); the rest have no loss and no gradient. A trainer that
    moves the principal point by (ox, oy) and pads the image by as much shifts the image
    against the 16-pixel tile grid, so that the tile-local SSIM's tile borders fall elsewhere
    (``--random_tile_shift``). The L1 and SSIM means are over the pixels with ground truth.
    absgrad: also return, in stats["absgrad"] [R, 2] (R = I*N or nnz), the sum over pixels of
    |d loss / d means2d| of each pixel's contribution (gsplat's absgrad; unscaled by the
    incoming gradient); with tiles over the budget it needs gsplat's fallback
    (NotImplementedError with the reference).

    On CPU tensors without TRITON_INTERPRET=1 the REFERENCE (rasterize_to_pixels + autograd)
    runs instead; its stats have no absgrad.

    Returns (loss 0-dim, stats) with stats = {"fraction_fused": fraction of the I * n_tiles
    tiles within budget, "fraction_isects_fused": fraction of the tile-Gaussian intersections in
    those tiles (the kernel's share of the work), "fraction_resident": fraction run by the resident variant (Triton
    only), "num_tiles": I * n_tiles, "image": [I, H, W, 3] or None, "absgrad"}.
    Raises ValueError on inconsistent shapes, an origin outside the image, a ssim_lambda outside [0, 1], a negative budget or
    a resident_max / stream_chunk / num_warps that is not a positive power of two.
    """
    origin = (int(origin[0]), int(origin[1]))
    _check_inputs(means2d, conics, colors, opacities, isect_offsets, flatten_ids, gts, width, height,
                  ssim_lambda, backgrounds, packed, origin)
    budget = tile_budget(means2d.device) if budget is None else int(budget)
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    default_resident, default_stream = chunk_limits(means2d.device)
    resident_max = default_resident if resident_max is None else int(resident_max)
    stream_chunk = default_stream if stream_chunk is None else int(stream_chunk)
    for name, v in (("resident_max", resident_max), ("stream_chunk", stream_chunk), ("num_warps", num_warps)):
        if v < 1 or v & (v - 1):
            raise ValueError(f"{name} must be a positive power of two, got {v}")
    if not _use_triton(means2d.device):
        loss, image = reference_fused_loss(means2d, conics, colors, opacities, isect_offsets, flatten_ids, gts,
                                           width, height, ssim_lambda, backgrounds, packed, origin)
        _, counts = _tile_counts(isect_offsets, flatten_ids.numel())
        stats = {"fraction_fused": float((counts <= budget).float().mean()), "num_tiles": counts.numel(),
                 "fraction_isects_fused": _isect_share(counts, counts <= budget),
                 "image": image.detach() if return_image else None, "absgrad": None}
        return loss, stats
    meta = dict(width=width, height=height, ssim_lambda=float(ssim_lambda), budget=budget,
                resident_max=resident_max, stream_chunk=stream_chunk, return_image=return_image, absgrad=absgrad,
                num_warps=int(num_warps), packed=packed, origin=origin,
                fallback=default_fallback(means2d.device) if fallback is None else fallback)
    loss = FusedRasterLoss.apply(means2d, conics, colors, opacities, backgrounds, gts, isect_offsets,
                                 flatten_ids, meta)
    return loss, meta["stats"]
