"""The numbers the kernels, their PyTorch references and the trainer must agree on, one home each:
the tile, the exchange's record layout, the SSIM window and constants.

Sources: gsplat 1.5.3 (16-pixel tiles, isect_tiles); Wang, Bovik, Sheikh, Simoncelli, "Image
quality assessment: from error visibility to structural similarity", IEEE TIP 2004 (11x11
Gaussian window, sigma 1.5 px, K1 = 0.01, K2 = 0.03, dynamic range L = 1).
"""

from __future__ import annotations

import torch

TILE_SIZE = 16  # pixels per tile side (the fused kernel's pixel block is TILE_SIZE^2 = 256)

# One exchanged record (trainer/render.py), in float32 lanes, in this order: radii (2, pixels),
# means2d (2, pixels), depth (1, camera z), conic (3, px^-2), opacity (1), colour (3).
RECORD_FIELDS = (("radii", 2), ("means2d", 2), ("depths", 1), ("conics", 3), ("opacities", 1), ("colors", 3))
RECORD_LANES = sum(n for _, n in RECORD_FIELDS)  # 12 lanes, 48 bytes
# What the rasterizer reads of a record: means2d, conic, opacity, colour (9 float32).
RASTER_RECORD_BYTES = 9 * 4

# Programs of the kernels that stride over a list of rows whose length only the device knows (the
# Gaussians a step's projection saw, --lazy_sh_adam: kernels/lazy_adam.py's stamp, adam.py's SH rows,
# and the waiting ones, projection.py's catch-up): a fixed grid, which CUDA graphs replay, of about
# two waves of 4-warp programs on an H100 / H200 (four of the catch-up's 8-warp ones)
LISTED_PROGRAMS = 4096

SSIM_WINDOW = 11  # Gaussian window side, pixels
SSIM_SIGMA = 1.5  # window standard deviation, pixels
SSIM_C1 = 0.01**2  # (K1 L)^2, L = 1 (Wang et al. 2004, eq. 7)
SSIM_C2 = 0.03**2  # (K2 L)^2


def gaussian_window_1d(window_size: int = SSIM_WINDOW, sigma: float = SSIM_SIGMA) -> torch.Tensor:
    """Normalized 1D Gaussian, float64 [window_size], centred, entries summing to 1 (the SSIM
    window's separable factor). Raises ValueError for an even or non-positive size or a
    non-positive sigma."""
    if window_size < 1 or window_size % 2 == 0:
        raise ValueError(f"SSIM window_size must be a positive odd integer, got {window_size}")
    if sigma <= 0:
        raise ValueError(f"SSIM sigma must be positive, got {sigma}")
    offsets = torch.arange(window_size, dtype=torch.float64) - (window_size - 1) / 2
    g = torch.exp(-(offsets**2) / (2.0 * sigma**2))
    return g / g.sum()
