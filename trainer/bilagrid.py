"""``--use_bilateral_grid``: a learned bilateral grid of colour transforms per training image.

Wang et al. 2024, "Bilateral Guided Radiance Field Processing" (BilaRF), as gsplat's
examples/lib_bilagrid.py applies it: each training image i owns a grid of 3x4 affine colour
matrices over (x, y, luminance), [12, L, H, W] cells; a rendered pixel at normalized position
(x, y) in [0, 1]^2 with colour c is transformed by the matrix trilinearly interpolated at
(x, y, gray(c)), gray = 0.299 r + 0.587 g + 0.114 b (BT.601), c' = A[:, :3] c + A[:, 3].
The grids start at the identity; they absorb per-image exposure, white balance and tone curves on
the rendering rank, so the Gaussians learn the scene's own colours. Test views have no grid and
render without one (gsplat's plain metrics; its colour-corrected "cc_" metrics are not computed).

Regularizer (gsplat simple_trainer): 10 x the total variation, the sum over the three grid axes
of the mean squared difference of neighbouring cells. Optimizer: Adam at 2e-3 (times the batch
rule's learning-rate factor), eps 1e-15, its rate rising linearly from 1% over
``--bilateral_grid_warmup`` steps and decaying exponentially to 1% at ``--max_steps`` (gsplat's
chained LinearLR and ExponentialLR). With W > 1 the grids are replicated and DDP sums their
gradients (exchange.replicate); each rank adds 1/W of the regularizer, so the sum is the
one-process gradient.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

TV_WEIGHT = 10.0  # gsplat simple_trainer's tvloss factor
LR = 2e-3  # gsplat simple_trainer's learning rate of the grids
GRAY = (0.299, 0.587, 0.114)  # BT.601 luma weights (lib_bilagrid's rgb2gray)


class BilateralGrid(torch.nn.Module):
    """``num`` grids of shape [12, grid_w, grid_y, grid_x] (luminance, y, x cells), identity-initialized.

    ``forward(images [C, H, W, 3], ids [C] int64) -> [C, H, W, 3]``: each image transformed by its
    grid (module docstring)."""

    def __init__(self, num: int, grid_x: int = 16, grid_y: int = 16, grid_w: int = 8):
        super().__init__()
        identity = torch.tensor([1.0, 0, 0, 0, 0, 1.0, 0, 0, 0, 0, 1.0, 0])  # row-major 3x4 [I | 0]
        self.grids = torch.nn.Parameter(identity[None, :, None, None, None].repeat(num, 1, grid_w, grid_y, grid_x))
        self.gray: torch.Tensor  # a buffer: follows .to() and state_dict
        self.register_buffer("gray", torch.tensor(GRAY))

    def forward(self, images: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        C, H, W, _ = images.shape
        ys = (torch.arange(H, device=images.device, dtype=images.dtype) + 0.5) / H * 2 - 1
        xs = (torch.arange(W, device=images.device, dtype=images.dtype) + 0.5) / W * 2 - 1
        guide = (images @ self.gray) * 2 - 1  # [C, H, W] luminance in [-1, 1]
        coords = torch.stack([xs.expand(C, H, W), ys[:, None].expand(C, H, W), guide], dim=-1)  # (x, y, z)
        # 5-D grid_sample: grids [C, 12, L, Hg, Wg] at coords [C, H, W, 1, 3] -> [C, 12, H, W, 1]
        affine = (
            F.grid_sample(
                self.grids[ids], coords[:, :, :, None, :], mode="bilinear", padding_mode="border", align_corners=True
            )[..., 0]
            .permute(0, 2, 3, 1)
            .reshape(C, H, W, 3, 4)
        )
        return (affine[..., :3] @ images[..., None])[..., 0] + affine[..., 3]

    def tv_loss(self) -> torch.Tensor:
        """Total variation of all grids: sum over the luminance, y and x axes of the mean squared
        difference of neighbouring cells (lib_bilagrid's total_variation_loss). A 0-dim tensor."""
        g = self.grids
        return sum(torch.diff(g, dim=d).pow(2).mean() for d in (2, 3, 4) if g.shape[d] > 1) + g.sum() * 0.0


def lr_lambda(warmup: int, max_steps: int):
    """The grids' learning-rate factor at a step: linear warm-up from 0.01 over ``warmup``
    steps times exponential decay to 0.01 at ``max_steps`` (gsplat's chained schedulers)."""

    def factor(step: int) -> float:
        return (0.01 + 0.99 * min(step, warmup) / warmup) * 0.01 ** (step / max_steps)

    return factor
