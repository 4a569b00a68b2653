"""Fused SSIM in Triton: one pass for the five local statistics, a fused backward for the render.

``fused_ssim(img1, img2, padding)`` is the mean SSIM of two image batches with the 11 x 11
Gaussian window (sigma 1.5 pixels) of Wang, Bovik, Sheikh, Simoncelli, "Image quality
assessment: from error visibility to structural similarity", IEEE TIP 2004 (eq. 13, with
C1 = (0.01 L)^2, C2 = (0.03 L)^2, L = 1). It computes the same value as
:func:`splat_train.trainer.losses.ssim_map` (``.mean()``), which is the reference it is tested
against; the idea (all five moments in one pass per tile, a backward that blurs three per-pixel
partial-derivative maps) follows rahul-goel/fused-ssim, the code is this project's own.

Layout and shapes
    img1, img2: float32 [B, H, W, 3], values in [0, 1] (channels-last, as the rasterizer returns
    them). The kernels read through the tensors' strides, so NCHW images [B, 3, H, W] are passed
    as the view ``img.permute(0, 2, 3, 1)`` with no copy. The result is a 0-dim float32 tensor;
    the gradient (``img1`` only: ``img2`` is the ground truth and gets none) is a contiguous
    float32 [B, H, W, 3].

Formula, per pixel p and channel (mu, sigma: Gaussian-weighted local moments, w: the window)
    mu_x = w * x, sigma_x^2 = w * x^2 - mu_x^2, sigma_xy = w * (x y) - mu_x mu_y (same for y),
    S = (2 mu_x mu_y + C1)(2 sigma_xy + C2) / ((mu_x^2 + mu_y^2 + C1)(sigma_x^2 + sigma_y^2 + C2)),
    result = mean of S over the output domain: padding "same" zero-pads the images by 5 pixels
    (every one of the H x W pixels is an output; the 3DGS reference), "valid" keeps only
    windows fully inside the image ((H - 10) x (W - 10) outputs; gsplat simple_trainer).
    Writing a1 = 2 mu_x mu_y + C1, b1 = 2 sigma_xy + C2, a2 = mu_x^2 + mu_y^2 + C1,
    b2 = sigma_x^2 + sigma_y^2 + C2, the derivatives of S in the raw moments are
        dS/d(w*x^2) = -S / b2,   dS/d(w*xy) = 2 a1 / (a2 b2),
        dS/d(mu_x)  = 2 mu_y b1 / (a2 b2) - 2 mu_x S / a2 - 2 mu_x dS/d(w*x^2) - mu_y dS/d(w*xy),
    and, as the window is symmetric, dL/dx = g/N [w * dS/dmu_x + 2 x (w * dS/d(w*x^2))
    + y (w * dS/d(w*xy))], each map zero outside the output domain (g the upstream gradient,
    N = B * 3 * number of outputs per channel).

Kernels
    One program per BLOCK x BLOCK input tile (32 x 32: a 22 x 22 output tile plus its 5-pixel
    halo on each side) and image, looping over the 3 channels. The separable blur stays in
    registers: the horizontal pass is ``tile @ G`` and the vertical pass ``G^T @ (.)``, with G
    the banded (Toeplitz) [BLOCK, BLOCK] matrix G[c, j] = g[c - j] (0 <= c - j < 11), as
    ``tl.dot`` in IEEE float32. That costs 2 * 32^3 multiply-adds per statistic and tile
    (about 680 per output pixel for the five statistics, versus 110 for a direct separable
    filter through shared memory, which Triton cannot address explicitly) but needs no scratch
    memory, no barriers and no warp-size or vendor assumption, so the same source runs on
    NVIDIA, AMD and, under ``TRITON_INTERPRET=1``, on the CPU. 32 minimizes the work per
    output among power-of-two tiles (16: ~1140, 64: ~900).
    The forward writes one partial sum per program (summed in float64 by PyTorch: deterministic,
    no atomics) and, when img1 needs a gradient, the three partial-derivative maps.
    The backward blurs those maps over the same tiling and combines them with x and y.

Memory traffic (float32, per pixel and channel, DRAM, halo re-reads served by cache)
    forward:  reads x, y (8 bytes); training adds writes of the 3 saved maps (12 bytes).
    backward: reads the 3 maps, x and y (20 bytes), writes dL/dx (4 bytes).
    The maps (3 x 4 bytes per output pixel and channel, held from forward to backward) are
    saved rather than recomputed: recomputing them in the backward needs a 10-pixel halo,
    which with 32 x 32 register tiles leaves 12 x 12 outputs per tile (3.4x the blur work).

Numerics: float32 throughout (partial sums reduced in float64). A NaN or Inf pixel makes the
result NaN; in the gradient it spreads over its whole tile row and column (0 * NaN in the
banded product), not only its 11 x 11 neighbourhood.

Triton decides compiled-vs-interpreted when a kernel is defined, so ``TRITON_INTERPRET=1`` must
be set before this module is imported for CPU tensors to be accepted.
"""

from __future__ import annotations

import functools
import os

import torch
from torch import Tensor

from .constants import SSIM_C1, SSIM_C2, SSIM_WINDOW, gaussian_window_1d
from .resources import spill_free_warps

try:  # the CPU-only torch wheel may ship without Triton; then nothing here can run
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the environment
    triton = None

WINDOW, C1, C2 = SSIM_WINDOW, SSIM_C1, SSIM_C2  # the kernels' constexpr names (kernels/constants.py)
PADDINGS = ("same", "valid")
BLOCK = 32  # input tile side, pixels (power of two, for tl.arange / tl.dot)
TILE = BLOCK - WINDOW + 1  # output tile side: 22 pixels
_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"


def kernel_specs() -> dict:
    """This module's Triton kernels at the configurations their host code launches, in the format
    of kernels/registry.py (which lists every kernel of the package)."""
    ssim_fwd = dict(C1=C1, C2=C2, WINDOW=WINDOW, BLOCK=BLOCK, SAVE=True)
    ssim_bwd = dict(WINDOW=WINDOW, BLOCK=BLOCK)
    scalars = {n: "fp32" for n in ("y_scale", "ssim_factor", "l1_factor")}
    u8_gt = {"y_ptr": "*u8"}
    return {
        "ssim_forward": (_ssim_fwd_kernel, dict(ssim_fwd, L1=False), {}, scalars, 4),
        "ssim_backward": (_ssim_bwd_kernel, dict(ssim_bwd, L1=False), {}, scalars, 4),
        # the training loss: L1 + D-SSIM against uint8 ground truth (fused_l1_ssim_loss)
        "l1_ssim_forward": (_ssim_fwd_kernel, dict(ssim_fwd, L1=True), u8_gt, scalars, 4),
        "l1_ssim_backward": (_ssim_bwd_kernel, dict(ssim_bwd, L1=True), u8_gt, scalars, 4),
        "loss_combine": (
            _combine_kernel,
            dict(BLOCK=COMBINE_BLOCK),
            {},
            {n: "fp32" for n in ("lam", "inv_ssim", "inv_l1")},
            4,
        ),
    }


def available() -> bool:
    """Whether Triton imported (the kernels still need a CUDA/ROCm tensor or the interpreter)."""
    return triton is not None


@functools.lru_cache(maxsize=8)
def _gaussian_taps(device: torch.device) -> Tensor:
    """float32 [11]: the normalized 1D window, the same float32 taps the PyTorch SSIM uses. Made
    once per device (a host-to-device copy at every call would stall the step)."""
    return gaussian_window_1d().to(device=device, dtype=torch.float32)


def output_size(height: int, width: int, padding: str) -> tuple[int, int, int]:
    """(out_h, out_w, origin): the output domain of one channel and its first image row/column."""
    if padding == "same":
        return height, width, 0
    half = WINDOW // 2
    return height - 2 * half, width - 2 * half, half


if triton is not None:

    @triton.jit
    def _blur(tile, band, band_t):
        """[BLOCK, BLOCK] -> [BLOCK, BLOCK]: separable Gaussian blur as two banded products."""
        rows = tl.dot(tile, band, input_precision="ieee")  # horizontal pass
        return tl.dot(band_t, rows, input_precision="ieee")  # vertical pass

    @triton.jit
    def _bands(g_ptr, offs, WINDOW: tl.constexpr):
        """G[c, j] = g[c - j] and its transpose G^T[i, r] = g[r - i], zero off the band."""
        d = offs[:, None] - offs[None, :]
        band = tl.load(g_ptr + d, mask=(d >= 0) & (d < WINDOW), other=0.0)
        band_t = tl.load(g_ptr - d, mask=(d <= 0) & (d > -WINDOW), other=0.0)
        return band, band_t

    @triton.jit
    def _ssim_fwd_kernel(
        x_ptr,
        y_ptr,
        g_ptr,
        partial_ptr,
        maps_ptr,
        height,
        width,
        out_h,
        out_w,
        origin,
        map_plane,
        y_scale,
        sxb,
        sxh,
        sxw,
        sxc,
        syb,
        syh,
        syw,
        syc,
        C1: tl.constexpr,
        C2: tl.constexpr,
        WINDOW: tl.constexpr,
        BLOCK: tl.constexpr,
        SAVE: tl.constexpr,
        L1: tl.constexpr,
    ):
        TILE: tl.constexpr = BLOCK - WINDOW + 1
        HALF: tl.constexpr = WINDOW // 2
        tx, ty, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        offs = tl.arange(0, BLOCK)
        band, band_t = _bands(g_ptr, offs, WINDOW)
        oy = origin + ty * TILE + offs  # image row of output-local row i
        ox = origin + tx * TILE + offs
        iy = oy - HALF  # image row of input-tile row r
        ix = ox - HALF
        in_mask = (iy[:, None] >= 0) & (iy[:, None] < height) & (ix[None, :] >= 0) & (ix[None, :] < width)
        out_mask = (
            (offs[:, None] < TILE)
            & (offs[None, :] < TILE)
            & (oy[:, None] < origin + out_h)
            & (ox[None, :] < origin + out_w)
        )
        x_offs = b * sxb + iy[:, None] * sxh + ix[None, :] * sxw
        y_offs = b * syb + iy[:, None] * syh + ix[None, :] * syw
        m_offs = (oy[:, None] - origin) * out_w + (ox[None, :] - origin)
        acc = tl.zeros([BLOCK, BLOCK], dtype=tl.float32)
        if L1:  # the pixels whose |x - y| this program sums: its output tile, widened at the first
            # and last tile to the image border, so the programs partition the image
            lo_y = tl.where(ty == 0, 0, origin + ty * TILE)
            hi_y = tl.where(ty == tl.num_programs(1) - 1, height, origin + ty * TILE + TILE)
            lo_x = tl.where(tx == 0, 0, origin + tx * TILE)
            hi_x = tl.where(tx == tl.num_programs(0) - 1, width, origin + tx * TILE + TILE)
            own = in_mask & (iy[:, None] >= lo_y) & (iy[:, None] < hi_y) & (ix[None, :] >= lo_x) & (ix[None, :] < hi_x)
            l1_acc = tl.zeros([BLOCK, BLOCK], dtype=tl.float32)
        for c in tl.static_range(3):
            x = tl.load(x_ptr + x_offs + c * sxc, mask=in_mask, other=0.0)
            y = tl.load(y_ptr + y_offs + c * syc, mask=in_mask, other=0).to(tl.float32) * y_scale
            if L1:
                l1_acc += tl.where(own, tl.abs(x - y), 0.0)
            mu_x = _blur(x, band, band_t)
            mu_y = _blur(y, band, band_t)
            var_x = _blur(x * x, band, band_t) - mu_x * mu_x
            var_y = _blur(y * y, band, band_t) - mu_y * mu_y
            cov = _blur(x * y, band, band_t) - mu_x * mu_y
            a1 = 2.0 * mu_x * mu_y + C1
            b1 = 2.0 * cov + C2
            a2 = mu_x * mu_x + mu_y * mu_y + C1
            b2 = var_x + var_y + C2
            s = (a1 * b1) / (a2 * b2)
            acc += tl.where(out_mask, s, 0.0)
            if SAVE:
                d_sq = -s / b2  # dS / d(w * x^2)
                d_xy = 2.0 * a1 / (a2 * b2)  # dS / d(w * xy)
                d_mu = (
                    2.0 * mu_y * b1 / (a2 * b2) - 2.0 * mu_x * s / a2 - 2.0 * mu_x * d_sq - mu_y * d_xy
                )  # dS / d mu_x
                plane = (b * 3 + c) * out_h * out_w
                tl.store(maps_ptr + plane + m_offs, d_mu, mask=out_mask)
                tl.store(maps_ptr + map_plane + plane + m_offs, d_sq, mask=out_mask)
                tl.store(maps_ptr + 2 * map_plane + plane + m_offs, d_xy, mask=out_mask)
        pid = (b * tl.num_programs(1) + ty) * tl.num_programs(0) + tx
        tl.store(partial_ptr + pid, tl.sum(tl.sum(acc, axis=1), axis=0))
        if L1:  # second row of the partials buffer
            num = tl.num_programs(0) * tl.num_programs(1) * tl.num_programs(2)
            tl.store(partial_ptr + num + pid, tl.sum(tl.sum(l1_acc, axis=1), axis=0))

    @triton.jit
    def _ssim_bwd_kernel(
        x_ptr,
        y_ptr,
        g_ptr,
        maps_ptr,
        gout_ptr,
        grad_ptr,
        height,
        width,
        out_h,
        out_w,
        origin,
        map_plane,
        y_scale,
        ssim_factor,
        l1_factor,
        sxb,
        sxh,
        sxw,
        sxc,
        syb,
        syh,
        syw,
        syc,
        WINDOW: tl.constexpr,
        BLOCK: tl.constexpr,
        L1: tl.constexpr,
    ):
        TILE: tl.constexpr = BLOCK - WINDOW + 1
        HALF: tl.constexpr = WINDOW // 2
        tx, ty, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        offs = tl.arange(0, BLOCK)
        band, band_t = _bands(g_ptr, offs, WINDOW)
        qy = ty * TILE + offs  # image row of gradient-local row i
        qx = tx * TILE + offs
        py = qy - HALF - origin  # output-domain row of map-tile row r
        px = qx - HALF - origin
        m_mask = (py[:, None] >= 0) & (py[:, None] < out_h) & (px[None, :] >= 0) & (px[None, :] < out_w)
        q_mask = (offs[:, None] < TILE) & (offs[None, :] < TILE) & (qy[:, None] < height) & (qx[None, :] < width)
        m_offs = py[:, None] * out_w + px[None, :]
        x_offs = b * sxb + qy[:, None] * sxh + qx[None, :] * sxw
        y_offs = b * syb + qy[:, None] * syh + qx[None, :] * syw
        g_offs = ((b * height + qy[:, None]) * width + qx[None, :]) * 3
        gout = tl.load(gout_ptr).to(tl.float32)
        for c in tl.static_range(3):
            plane = (b * 3 + c) * out_h * out_w
            d_mu = tl.load(maps_ptr + plane + m_offs, mask=m_mask, other=0.0)
            d_sq = tl.load(maps_ptr + map_plane + plane + m_offs, mask=m_mask, other=0.0)
            d_xy = tl.load(maps_ptr + 2 * map_plane + plane + m_offs, mask=m_mask, other=0.0)
            x = tl.load(x_ptr + x_offs + c * sxc, mask=q_mask, other=0.0)
            y = tl.load(y_ptr + y_offs + c * syc, mask=q_mask, other=0).to(tl.float32) * y_scale
            grad = ssim_factor * (
                _blur(d_mu, band, band_t) + 2.0 * x * _blur(d_sq, band, band_t) + y * _blur(d_xy, band, band_t)
            )
            if L1:  # d|x - y|/dx = sign(x - y), 0 where equal (as torch's abs)
                grad += l1_factor * tl.where(x > y, 1.0, tl.where(x < y, -1.0, 0.0))
            tl.store(grad_ptr + g_offs + c, gout * grad, mask=q_mask)


MAX_OFFSET_FACTOR = 3  # the kernels address 3 per-element maps (d_mu, d_sq, d_xy) in one int32-indexed buffer


def _check(img1: Tensor, img2: Tensor, padding: str, saves_maps: bool = True) -> None:
    """Raise ValueError / RuntimeError for arguments the kernels cannot take."""
    for name, img, dtypes in (("img1", img1, (torch.float32,)), ("img2", img2, (torch.float32, torch.uint8))):
        if img.dim() != 4 or img.shape[-1] != 3 or img.dtype not in dtypes:
            kinds = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
            raise ValueError(
                f"fused_ssim: {name} must be {kinds} [B, H, W, 3] (pass NCHW images as "
                f"img.permute(0, 2, 3, 1)), got {img.dtype} {tuple(img.shape)}"
            )
    if img1.shape != img2.shape or img1.device != img2.device:
        raise ValueError(
            f"fused_ssim: images differ: {tuple(img1.shape)} on {img1.device} vs {tuple(img2.shape)} on {img2.device}"
        )
    if padding not in PADDINGS:
        raise ValueError(f"fused_ssim padding must be one of {PADDINGS}, got {padding!r}")
    height, width = img1.shape[1:3]
    if padding == "valid" and (height < WINDOW or width < WINDOW):
        raise ValueError(
            f"fused_ssim padding='valid' needs images of at least {WINDOW}x{WINDOW} pixels, got {height}x{width}"
        )
    if (MAX_OFFSET_FACTOR if saves_maps else 1) * img1.numel() >= 2**31:  # the third map starts at 2 x numel
        raise ValueError(
            f"fused_ssim: {img1.numel()} elements: its saved maps (3 x that) overflow the kernels' "
            f"int32 offsets; split the batch (at most {(2**31 - 1) // MAX_OFFSET_FACTOR} elements)"
        )
    if triton is None:
        raise RuntimeError("fused_ssim needs Triton, which is not installed")
    if img1.device.type == "cpu" and not _INTERPRETED:
        raise RuntimeError(
            "fused_ssim runs on CUDA/ROCm tensors, or on CPU tensors when "
            "TRITON_INTERPRET=1 was set before splat_train.kernels.fused_ssim "
            "was imported"
        )


def _grid(height: int, width: int, batch: int) -> tuple[int, int, int]:
    return triton.cdiv(width, TILE), triton.cdiv(height, TILE), batch


def ssim_forward_into(
    img1: Tensor, img2: Tensor, padding: str, partials: Tensor, maps: Tensor | None, with_l1: bool = False
) -> Tensor | None:
    """Run the forward kernel into caller-given buffers; return the mean SSIM (0-dim float32), or
    None with ``with_l1`` (then :func:`combine_loss` reads the partial sums).

    partials: float32 [num_programs] (see :func:`buffers`), one SSIM sum per program; with
        ``with_l1`` [2, num_programs], the second row the programs' sums of |img1 - img2| (each
        pixel counted by exactly one program).
    maps: None (inference), or float32 [3, B, 3, out_h, out_w]: dS/dmu_x, dS/d(w*x^2),
        dS/d(w*xy) per output pixel and channel, for :func:`ssim_backward_into`.
    img2 may be uint8 (values 0..255, read as value / 255). Every element of both buffers is
    written. Arguments as :func:`fused_ssim`.
    """
    _check(img1, img2, padding, saves_maps=maps is not None)
    batch, height, width, _ = img1.shape
    out_h, out_w, origin = output_size(height, width, padding)
    grid = _grid(out_h, out_w, batch)
    rows = 2 if with_l1 else 1
    assert partials.numel() == rows * grid[0] * grid[1] * grid[2] and partials.dtype == torch.float32
    assert maps is None or (maps.shape == (3, batch, 3, out_h, out_w) and maps.is_contiguous())
    _ssim_fwd_kernel[grid](
        img1,
        img2,
        _gaussian_taps(img1.device),
        partials,
        partials if maps is None else maps,
        height,
        width,
        out_h,
        out_w,
        origin,
        batch * 3 * out_h * out_w,
        _gt_scale(img2),
        *img1.stride(),
        *img2.stride(),
        C1=C1,
        C2=C2,
        WINDOW=WINDOW,
        BLOCK=BLOCK,
        SAVE=maps is not None,
        L1=with_l1,
        num_warps=spill_free_warps("l1_ssim_forward" if with_l1 else "ssim_forward", kernel_specs, img1.device),
    )
    if with_l1:
        return None
    return (partials.double().sum() / (batch * 3 * out_h * out_w)).float()


def ssim_backward_into(
    grad_output: Tensor,
    img1: Tensor,
    img2: Tensor,
    padding: str,
    maps: Tensor,
    grad: Tensor,
    ssim_factor: float | None = None,
    l1_factor: float = 0.0,
) -> Tensor:
    """Run the backward kernel: grad (float32 [B, H, W, 3], contiguous, every element written)
    becomes grad_output * (ssim_factor * d(sum of the SSIM map)/d img1 + l1_factor *
    sign(img1 - img2)), from the forward's ``maps``; ``ssim_factor`` defaults to 1 / (number of
    SSIM outputs), the derivative of the mean SSIM. grad_output is a 0-dim device tensor (read
    by the kernel: no host synchronization). Returns grad."""
    _check(img1, img2, padding)
    batch, height, width, _ = img1.shape
    out_h, out_w, origin = output_size(height, width, padding)
    assert grad.shape == img1.shape and grad.is_contiguous() and grad.dtype == torch.float32
    if ssim_factor is None:
        ssim_factor = 1.0 / (batch * 3 * out_h * out_w)
    _ssim_bwd_kernel[_grid(height, width, batch)](
        img1,
        img2,
        _gaussian_taps(img1.device),
        maps,
        grad_output.detach().reshape(1),
        grad,
        height,
        width,
        out_h,
        out_w,
        origin,
        batch * 3 * out_h * out_w,
        _gt_scale(img2),
        float(ssim_factor),
        float(l1_factor),
        *img1.stride(),
        *img2.stride(),
        WINDOW=WINDOW,
        BLOCK=BLOCK,
        L1=l1_factor != 0.0,
        num_warps=spill_free_warps("l1_ssim_backward" if l1_factor else "ssim_backward", kernel_specs, img1.device),
    )
    return grad


UINT8_SCALE = 1.0 / 255.0  # the kernels read uint8 ground truth as value * UINT8_SCALE (float32)


def _gt_scale(img2: Tensor) -> float:
    """What the kernels multiply the ground truth by: UINT8_SCALE for uint8 images, else 1."""
    return UINT8_SCALE if img2.dtype == torch.uint8 else 1.0


def uint8_to_unit(images: Tensor) -> Tensor:
    """uint8 images -> float32 in [0, 1]: value / 255, as the data loader has always converted
    them (the kernels multiply by UINT8_SCALE instead, which differs by at most 1 ulp)."""
    return images.float() / 255.0


def buffers(img1: Tensor, padding: str, train: bool) -> tuple[Tensor, Tensor | None]:
    """Uninitialized (partials [num_programs], maps [3, B, 3, out_h, out_w] or None) for img1."""
    batch, height, width, _ = img1.shape
    out_h, out_w, _ = output_size(height, width, padding)
    gx, gy, gb = _grid(out_h, out_w, batch)
    partials = torch.empty(gx * gy * gb, dtype=torch.float32, device=img1.device)
    maps = torch.empty(3, batch, 3, out_h, out_w, dtype=torch.float32, device=img1.device) if train else None
    return partials, maps


class _FusedSSIM(torch.autograd.Function):
    """Forward: the mean SSIM kernel. Backward: the fused blur of the saved maps, for img1 only."""

    @staticmethod
    def forward(ctx, img1: Tensor, img2: Tensor, padding: str, train: bool) -> Tensor:
        partials, maps = buffers(img1, padding, train)
        value = ssim_forward_into(img1, img2, padding, partials, maps)
        assert value is not None  # None only with with_l1
        ctx.padding = padding
        if train:
            ctx.save_for_backward(img1, img2, maps)
        return value

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output: Tensor):
        img1, img2, maps = ctx.saved_tensors
        grad = torch.empty(img1.shape, dtype=torch.float32, device=img1.device)
        ssim_backward_into(grad_output, img1, img2, ctx.padding, maps, grad)
        return grad, None, None, None


def fused_ssim(img1: Tensor, img2: Tensor, padding: str = "valid") -> Tensor:
    """Mean SSIM (11 x 11 Gaussian window, sigma 1.5) of two image batches: a 0-dim float32 tensor.

    Args:
        img1: float32 [B, H, W, 3] in [0, 1], the render; differentiable (once).
        img2: float32 [B, H, W, 3] in [0, 1], the ground truth; receives no gradient.
            Either may be a strided view, e.g. ``nchw.permute(0, 2, 3, 1)``.
        padding: "valid" (default, as gsplat simple_trainer calls fused_ssim): mean over the
            (H - 10) x (W - 10) windows fully inside the image; "same": zero padding, mean over
            all H x W pixels (the 3DGS reference).

    The maps for the backward are written only when grad mode is on and img1 requires grad.
    Raises ValueError for wrong dtypes, shapes, devices or padding, or a "valid" image under
    11 x 11; RuntimeError without Triton, or for CPU tensors without ``TRITON_INTERPRET=1``.
    """
    train = torch.is_grad_enabled() and img1.requires_grad
    _check(img1, img2, padding, saves_maps=train)
    return _FusedSSIM.apply(img1, img2.detach(), padding, train)


if triton is not None:

    @triton.jit
    def _combine_kernel(partial_ptr, out_ptr, num, lam, inv_ssim, inv_l1, BLOCK: tl.constexpr):
        """One program: out = [loss, mean |x - y|, mean SSIM] from the [2, num] partial sums."""
        offs = tl.arange(0, BLOCK)
        s_acc = tl.zeros([BLOCK], dtype=tl.float32)
        l_acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, num, BLOCK):
            m = start + offs < num
            s_acc += tl.load(partial_ptr + start + offs, mask=m, other=0.0)
            l_acc += tl.load(partial_ptr + num + start + offs, mask=m, other=0.0)
        ssim = tl.sum(s_acc, axis=0) * inv_ssim
        l1 = tl.sum(l_acc, axis=0) * inv_l1
        tl.store(out_ptr, (1.0 - lam) * l1 + lam * (1.0 - ssim))
        tl.store(out_ptr + 1, l1)
        tl.store(out_ptr + 2, ssim)


COMBINE_BLOCK = 1024


class _FusedL1SSIMLoss(torch.autograd.Function):
    """Forward: the SSIM kernel with the L1 sums, then one combining program. Backward: one
    kernel writes (1 - lambda) / N_l1 * sign(x - y) - lambda / N_ssim * dS/dx."""

    @staticmethod
    def forward(ctx, render: Tensor, gt: Tensor, ssim_lambda: float, padding: str):
        batch, height, width, _ = render.shape
        out_h, out_w, _ = output_size(height, width, padding)
        gx, gy, gb = _grid(out_h, out_w, batch)
        partials = torch.empty(2, gx * gy * gb, dtype=torch.float32, device=render.device)
        train = ctx.needs_input_grad[0]
        maps = torch.empty(3, batch, 3, out_h, out_w, dtype=torch.float32, device=render.device) if train else None
        ssim_forward_into(render, gt, padding, partials, maps, with_l1=True)
        out = torch.empty(3, dtype=torch.float32, device=render.device)
        num_ssim, num_l1 = batch * 3 * out_h * out_w, render.numel()
        _combine_kernel[(1,)](
            partials, out, partials.shape[1], float(ssim_lambda), 1.0 / num_ssim, 1.0 / num_l1, BLOCK=COMBINE_BLOCK
        )
        ctx.padding, ctx.factors = padding, (-ssim_lambda / num_ssim, (1.0 - ssim_lambda) / num_l1)
        if train:
            ctx.save_for_backward(render, gt, maps)
        ctx.mark_non_differentiable(out)
        return out[0], out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss: Tensor, _unused):
        render, gt, maps = ctx.saved_tensors
        grad = torch.empty(render.shape, dtype=torch.float32, device=render.device)
        ssim_backward_into(grad_loss, render, gt, ctx.padding, maps, grad, *ctx.factors)
        return grad, None, None, None


def fused_l1_ssim_loss(
    render: Tensor, gt: Tensor, ssim_lambda: float = 0.2, padding: str = "valid"
) -> tuple[Tensor, dict[str, Tensor]]:
    """(1 - lambda) mean|render - gt| + lambda (1 - mean SSIM) in two kernels forward and one
    backward (Kerbl et al. 2023, eq. 7; the SSIM as :func:`fused_ssim`).

    Args:
        render: float32 [B, H, W, 3] in [0, 1]; differentiable (once).
        gt: float32 [B, H, W, 3] in [0, 1], or uint8 [B, H, W, 3] (0..255, read as value / 255,
            so images can stay uint8 on the device); no gradient.
        ssim_lambda: weight of the D-SSIM term, in [0, 1].
        padding: the SSIM's, as :func:`fused_ssim` ("valid" is gsplat simple_trainer's).

    Returns (loss, terms): loss a 0-dim tensor; terms "l1" (mean absolute error) and "ssim" (mean
    SSIM), detached 0-dim views of the same device buffer (reading them on the host
    synchronizes; the step does not need to). The value equals
    :func:`splat_train.trainer.losses.photometric_loss` (the tests' reference) up to float32
    rounding. Raises ValueError as :func:`fused_ssim`, and for a lambda outside [0, 1].
    """
    if not 0.0 <= ssim_lambda <= 1.0:
        raise ValueError(f"ssim_lambda must be in [0, 1], got {ssim_lambda}")
    _check(render, gt, padding)
    loss, out = _FusedL1SSIMLoss.apply(render, gt.detach(), float(ssim_lambda), padding)
    return loss, {"l1": out[1], "ssim": out[2]}
