"""Photometric loss (L1 + D-SSIM) and the Gaussian regularizers used by the training step.

Images are channels-last, as the rasterizer returns them: ``[B, H, W, 3]``, float, values in
[0, 1]. SSIM on a CUDA device runs through the ``fused_ssim`` CUDA extension when it is
installed, else through this project's Triton kernel (kernels/fused_ssim.py) when Triton
imports; everywhere else through a separable Gaussian ``conv2d`` (:func:`ssim_backend` says
which one a device gets). SSIM's default padding is the 3DGS reference's: zero-padded "same"
filtering, mean over all H x W pixels.

Sources:
  - SSIM: Wang, Bovik, Sheikh, Simoncelli, "Image quality assessment: from error visibility to
    structural similarity", IEEE TIP 2004 (11x11 Gaussian window, sigma 1.5, K1 0.01, K2 0.03).
  - Loss: Kerbl et al., "3D Gaussian Splatting for Real-Time Radiance Field Rendering",
    SIGGRAPH 2023, eq. 7: (1 - lambda) L1 + lambda D-SSIM with lambda 0.2, where D-SSIM is
    1 - SSIM as in the reference code and in gsplat's examples/simple_trainer.py (some
    write-ups print (1 - SSIM) / 2, which would halve the effective lambda; the code wins).
  - Regularizers: gsplat examples/simple_trainer.py (``opacity_reg``, ``scale_reg``).
"""

from __future__ import annotations

import functools
import importlib

import torch
import torch.nn.functional as F

from ..kernels.constants import SSIM_C1, SSIM_C2, SSIM_SIGMA, SSIM_WINDOW
from ..kernels.constants import gaussian_window_1d as gaussian_kernel_1d  # noqa: F401 (the tests' name)

SSIM_PADDINGS = ("same", "valid")
SSIM_BACKENDS = ("fused_ssim", "triton", "pytorch")


@functools.lru_cache(maxsize=1)
def _fused_ssim_fn():
    """The ``fused_ssim.fused_ssim`` function, or None when the package cannot be imported.

    Imported lazily (it is a CUDA extension that may be absent or fail to load) and once.
    """
    try:
        return importlib.import_module("fused_ssim").fused_ssim
    except (ImportError, OSError, RuntimeError, AttributeError):
        return None


@functools.lru_cache(maxsize=1)
def _triton_ssim_fn():
    """This project's Triton ``fused_ssim`` (kernels/fused_ssim.py), or None without Triton."""
    try:
        module = importlib.import_module("splat_train.kernels.fused_ssim")
    except ImportError:
        return None
    return module.fused_ssim if module.available() else None


def ssim_backend(device: torch.device | str) -> str:
    """Which SSIM implementation :func:`ssim` uses for tensors on ``device``.

    On a CUDA (or ROCm) device: "fused_ssim" when the ``fused_ssim`` package imports (a
    CUDA-only extension), else the project's Triton kernel ("triton", kernels/fused_ssim.py) when
    Triton imports, else "pytorch". Other devices: "pytorch". (The measurements behind the
    order: docs/design-measurements.md.)
    """
    if torch.device(device).type != "cuda":
        return "pytorch"
    if _fused_ssim_fn() is not None:
        return "fused_ssim"
    if _triton_ssim_fn() is not None:
        return "triton"
    return "pytorch"


def training_loss_backend(device: torch.device | str, ssim_backend_flag: str = "auto") -> str:
    """How the training step computes L1 + D-SSIM on ``device`` for ``--ssim_backend``:
    "fused_l1_ssim" (kernels/fused_ssim.py's one-pass loss, reading uint8 ground truth) on a
    CUDA/ROCm device with Triton when the flag is "auto" or "triton"; otherwise the flag itself
    ("auto" then picks :func:`ssim_backend` inside :func:`photometric_loss`)."""
    if ssim_backend_flag in ("auto", "triton") and torch.device(device).type == "cuda" and _triton_ssim_fn():
        return "fused_l1_ssim"
    return ssim_backend_flag


def _check_images(img1: torch.Tensor, img2: torch.Tensor, name: str) -> None:
    if img1.dim() != 4 or img1.shape[-1] != 3:
        raise ValueError(f"{name}: expected images [B, H, W, 3], got {tuple(img1.shape)}")
    if img1.shape != img2.shape:
        raise ValueError(f"{name}: image shapes differ: {tuple(img1.shape)} vs {tuple(img2.shape)}")
    if not img1.is_floating_point() or not img2.is_floating_point():
        raise ValueError(f"{name}: expected floating-point images, got {img1.dtype}, {img2.dtype}")


@functools.lru_cache(maxsize=16)
def _window_on(window_size: int, sigma: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The 1D window on a device, made once (a host-to-device copy every step would stall it)."""
    return gaussian_kernel_1d(window_size, sigma).to(dtype=dtype, device=device)


def _gaussian_filter(images: torch.Tensor, window_size: int, sigma: float) -> torch.Tensor:
    """Zero-padded ("same") Gaussian filter of each channel: [B, C, H, W] -> [B, C, H, W].

    The 2D window is the outer product of a 1D Gaussian, so filtering rows then columns equals
    the 2D convolution (with zero padding too: the padded border is zero in both passes) at
    2 S instead of S^2 multiply-adds per pixel. CUDA folds the channels into the batch and
    every other device runs a grouped (depthwise) convolution; padded 1D convolutions, so "valid"
    SSIM crops a padded result (the measurements: docs/design-measurements.md).
    """
    batch, num_channels, height, width = images.shape
    g = _window_on(window_size, sigma, images.dtype, images.device)
    pad = window_size // 2
    if images.device.type == "cuda":
        planes = images.reshape(batch * num_channels, 1, height, width)
        planes = F.conv2d(planes, g.view(1, 1, 1, window_size), padding=(0, pad))
        planes = F.conv2d(planes, g.view(1, 1, window_size, 1), padding=(pad, 0))
        return planes.reshape(batch, num_channels, height, width)
    rows = g.view(1, 1, 1, window_size).expand(num_channels, 1, 1, window_size)
    cols = g.view(1, 1, window_size, 1).expand(num_channels, 1, window_size, 1)
    filtered = F.conv2d(images, rows, padding=(0, pad), groups=num_channels)
    return F.conv2d(filtered, cols, padding=(pad, 0), groups=num_channels)


def ssim_map(
    img1: torch.Tensor,
    img2: torch.Tensor,
    window_size: int = SSIM_WINDOW,
    sigma: float = SSIM_SIGMA,
    padding: str = "same",
) -> torch.Tensor:
    """Per-pixel, per-channel SSIM map in plain PyTorch (Wang et al. 2004, eq. 13).

    Args:
        img1, img2: [B, H, W, 3] float images in [0, 1].
        window_size, sigma: Gaussian window, in pixels.
        padding: "same" zero-pads the images by window_size // 2 before the Gaussian
            filtering (as the 3DGS reference and fused_ssim do), so the map is [B, H, W, 3]
            and border windows see zeros; "valid" keeps only windows fully inside the image,
            [B, H - window_size + 1, W - window_size + 1, 3].

    Local statistics are Gaussian-weighted means: mu = w * x, sigma_x^2 = w * x^2 - mu_x^2,
    sigma_xy = w * (x y) - mu_x mu_y; then
    SSIM = (2 mu_x mu_y + C1)(2 sigma_xy + C2) / ((mu_x^2 + mu_y^2 + C1)(sigma_x^2 + sigma_y^2 + C2)).
    Filtering is separable (see :func:`_gaussian_filter`). Differentiable in both images; runs on
    any device, in the images' dtype.

    Raises ValueError on bad shapes, dtypes, padding, or a "valid" image smaller than the window.
    """
    _check_images(img1, img2, "ssim")
    if padding not in SSIM_PADDINGS:
        raise ValueError(f"ssim padding must be one of {SSIM_PADDINGS}, got {padding!r}")
    height, width = img1.shape[1:3]
    if padding == "valid" and (height < window_size or width < window_size):
        raise ValueError(
            f"ssim padding='valid' needs images of at least {window_size}x{window_size} pixels, got {height}x{width}"
        )
    x = img1.permute(0, 3, 1, 2)  # [B, 3, H, W]
    y = img2.permute(0, 3, 1, 2)
    # The five local moments in one batched filtering: [B, 5*3, H, W].
    stacked = torch.cat([x, y, x * x, y * y, x * y], dim=1)
    moments = _gaussian_filter(stacked, window_size, sigma)
    if padding == "valid":  # windows that lie fully inside the image never touch the padding
        half = window_size // 2
        moments = moments[:, :, half : height - half, half : width - half]
    mu_x, mu_y, xx, yy, xy = moments.chunk(5, dim=1)
    mu_xx, mu_yy, mu_xy = mu_x * mu_x, mu_y * mu_y, mu_x * mu_y
    var_x, var_y, cov_xy = xx - mu_xx, yy - mu_yy, xy - mu_xy
    numerator = (2.0 * mu_xy + SSIM_C1) * (2.0 * cov_xy + SSIM_C2)
    denominator = (mu_xx + mu_yy + SSIM_C1) * (var_x + var_y + SSIM_C2)
    return (numerator / denominator).permute(0, 2, 3, 1)  # [B, H', W', 3]


def ssim(
    img1: torch.Tensor,
    img2: torch.Tensor,
    window_size: int = SSIM_WINDOW,
    sigma: float = SSIM_SIGMA,
    padding: str = "same",
    backend: str | None = None,
) -> torch.Tensor:
    """Mean SSIM over every pixel, channel and image of a batch: a 0-dim tensor, 1 when equal.

    Args:
        img1: [B, H, W, 3] float images in [0, 1] (the render: with the fused_ssim and triton
            backends only this argument receives a gradient; both differentiate img1 alone).
        img2: [B, H, W, 3] float images in [0, 1] (the ground truth).
        window_size, sigma: Gaussian window, pixels (Wang et al. 2004: 11 and 1.5).
        padding: "same" (default) follows the 3DGS reference code (utils/loss_utils.py): zero
            padding, mean over all H x W pixels. "valid" averages only windows fully inside the
            image (what gsplat's simple_trainer passes to fused_ssim, and what torchmetrics'
            reflect-pad-then-crop SSIM amounts to). See :func:`ssim_map`.
        backend: None picks :func:`ssim_backend` of img1's device; "pytorch", "fused_ssim" or
            "triton" forces one. The fused kernels only have the 11 / 1.5 window (and the
            Triton one float32), so other windows (or dtypes) always use PyTorch.

    Raises ValueError on bad arguments, ImportError when "fused_ssim" or "triton" is forced but
    missing (and what kernels.fused_ssim.fused_ssim raises, e.g. for CPU tensors).
    """
    _check_images(img1, img2, "ssim")
    if backend is None:
        backend = ssim_backend(img1.device)
        if (window_size, sigma) != (SSIM_WINDOW, SSIM_SIGMA):
            backend = "pytorch"
        if backend == "triton" and (img1.dtype != torch.float32 or img2.dtype != torch.float32):
            backend = "pytorch"
    if backend not in SSIM_BACKENDS:
        raise ValueError(f"ssim backend must be one of {SSIM_BACKENDS} or None, got {backend!r}")
    if backend == "pytorch":
        return ssim_map(img1, img2, window_size, sigma, padding).mean()
    if backend == "triton":
        triton_ssim = _triton_ssim_fn()
        if triton_ssim is None:
            raise ImportError("ssim backend 'triton' requested but Triton is missing")
        if (window_size, sigma) != (SSIM_WINDOW, SSIM_SIGMA):
            raise ValueError("the triton ssim backend supports only window_size=11, sigma=1.5")
        return triton_ssim(img1, img2, padding=padding)  # [B, H, W, 3] as is

    fused = _fused_ssim_fn()
    if fused is None:
        raise ImportError("ssim backend 'fused_ssim' requested but the fused_ssim package is missing")
    if (window_size, sigma) != (SSIM_WINDOW, SSIM_SIGMA):
        raise ValueError("the fused_ssim backend supports only window_size=11, sigma=1.5")
    if padding not in SSIM_PADDINGS:
        raise ValueError(f"ssim padding must be one of {SSIM_PADDINGS}, got {padding!r}")
    train = torch.is_grad_enabled() and img1.requires_grad
    return fused(
        img1.permute(0, 3, 1, 2).contiguous(),  # [B, 3, H, W]
        img2.permute(0, 3, 1, 2).contiguous(),
        padding=padding,
        train=train,
    )


def photometric_loss(
    renders: torch.Tensor,
    gts: torch.Tensor,
    ssim_lambda: float = 0.2,
    ssim_padding: str = "same",
    ssim_backend_name: str | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(1 - lambda) L1 + lambda (1 - SSIM) (Kerbl et al. 2023, eq. 7; gsplat simple_trainer).

    Args:
        renders: [B, H, W, 3] rendered images in [0, 1]; the gradient flows to these.
        gts: [B, H, W, 3] ground-truth images in [0, 1].
        ssim_lambda: weight of the D-SSIM term, in [0, 1].
        ssim_padding: see :func:`ssim`.
        ssim_backend_name: see :func:`ssim`'s ``backend`` (None: :func:`ssim_backend`).

    Returns (loss, terms): loss is a 0-dim tensor; terms holds the detached 0-dim tensors
    "l1" (mean absolute error) and "ssim" (mean SSIM, not 1 - SSIM). They stay tensors so a
    caller that logs them only every few steps does not synchronize the device every step.

    Raises ValueError when ssim_lambda is outside [0, 1] or the images do not match.
    """
    if not 0.0 <= ssim_lambda <= 1.0:
        raise ValueError(f"ssim_lambda must be in [0, 1], got {ssim_lambda}")
    _check_images(renders, gts, "photometric_loss")
    l1 = (renders - gts).abs().mean()
    ssim_value = ssim(renders, gts, padding=ssim_padding, backend=ssim_backend_name)
    loss = (1.0 - ssim_lambda) * l1 + ssim_lambda * (1.0 - ssim_value)
    return loss, {"l1": l1.detach(), "ssim": ssim_value.detach()}


def opacity_reg(opacities_activated: torch.Tensor, weight: float) -> torch.Tensor:
    """weight * mean(|opacity|) over Gaussians: a 0-dim tensor (gsplat simple_trainer opacity_reg).

    Takes ACTIVATED opacities, [N] or [N, 1] in (0, 1), i.e. sigmoid of the stored logits, so
    the caller activates once and reuses the result. Pushes opacities towards 0 so pruning can
    remove Gaussians. An empty tensor gives 0.
    """
    if opacities_activated.numel() == 0:
        return opacities_activated.sum() * weight
    return weight * opacities_activated.abs().mean()


def scale_reg(scales_activated: torch.Tensor, weight: float) -> torch.Tensor:
    """weight * mean(|scale|) over Gaussians and axes: a 0-dim tensor (gsplat simple_trainer scale_reg).

    Takes ACTIVATED scales, [N, 3] in scene units (meters for metric captures), i.e. exp of
    the stored log-scales. Penalizes large Gaussians. An empty tensor gives 0.
    """
    if scales_activated.numel() == 0:
        return scales_activated.sum() * weight
    return weight * scales_activated.abs().mean()


class TrainingLoss:
    """The training step's photometric loss: ``loss(colors, gts)`` of renders ``colors``
    [C, H, W, 3] against uint8 ground truth ``gts`` [C, H, W, 3] is (1 - --ssim_lambda) L1 +
    --ssim_lambda D-SSIM (valid-padded SSIM, as gsplat simple_trainer's fused_ssim call), returned
    with its parts {"l1", "ssim"}. ``backend``: :func:`training_loss_backend` of the device and
    --ssim_backend ("fused_l1_ssim": L1 + D-SSIM in two kernels reading the uint8 images)."""

    def __init__(self, device: torch.device | str, ssim_backend_flag: str, ssim_lambda: float):
        self.backend = training_loss_backend(device, ssim_backend_flag)
        self.ssim_lambda = ssim_lambda

    def __call__(self, colors: torch.Tensor, gts: torch.Tensor) -> tuple[torch.Tensor, dict]:
        from ..kernels.fused_ssim import fused_l1_ssim_loss, uint8_to_unit

        if self.backend == "fused_l1_ssim":
            return fused_l1_ssim_loss(colors, gts, self.ssim_lambda, padding="valid")
        return photometric_loss(
            colors,
            uint8_to_unit(gts),
            self.ssim_lambda,
            ssim_padding="valid",
            ssim_backend_name=None if self.backend == "auto" else self.backend,
        )
