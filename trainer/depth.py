"""``--depth_loss``: the SfM points as sparse depth supervision (gsplat simple_trainer's depth loss).

Targets (gsplat examples/datasets/colmap.py ``load_depths``): each training image's observed 3D
points (its COLMAP tracks, Camera.point_ids) projected with the view's camera: pixel (u, v) and
camera-space depth z, kept when the pixel lies in the image, z > 0 and, here, the pixel is not
masked out of the loss (masks.py). Made once at start for the training views.

Loss (gsplat simple_trainer): the rendered expected depth D (render.render's ``render_depth``) is
sampled bilinearly at each point's pixel and compared in disparity,
    L_depth = mean over points of | 1/D - 1/z | * scene_scale      (1/D taken as 0 where D <= 0),
here averaged per image and then over the images of the global batch (gsplat trains one image a
step, where the two agree), so that every rank's share sums to the one-process loss.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from .data import DataError, Dataset
from .data.masks import has_masks


def project_points(points_cam: np.ndarray, K: np.ndarray, camera_model: str) -> np.ndarray:
    """Pixels [P, 2] (corner convention: pixel centres at +0.5) of camera-space points [P, 3]
    through intrinsics K [3, 3]: pinhole (f x / z + c), ortho (f x + c) or fisheye (ideal
    equidistant, f theta x / rho + c), the projections of kernels/reference.py."""
    x, y, z = points_cam[:, 0], points_cam[:, 1], points_cam[:, 2]
    if camera_model == "ortho":
        nx, ny = x, y
    elif camera_model == "fisheye":
        rho = np.hypot(x, y)
        scale = np.where(rho > 0, np.arctan2(rho, z) / np.maximum(rho, 1e-30), 1.0 / np.maximum(z, 1e-30))
        nx, ny = x * scale, y * scale
    else:
        nx, ny = x / np.where(z > 0, z, 1.0), y / np.where(z > 0, z, 1.0)
    return np.stack([K[0, 0] * nx + K[0, 2], K[1, 1] * ny + K[1, 2]], axis=1)


class DepthTargets:
    """The training views' depth targets, flat on ``device``: ``pixels`` float32 [P, 2],
    ``depths`` float32 [P] (camera z, scene units), and per view the range ``starts[v]:starts[v+1]``
    (host ints). Raises DataError naming ``--depth_loss`` when the scene has no SfM tracks."""

    def __init__(self, dataset: Dataset, camera_model: str, device: torch.device):
        scene = dataset.scene
        if scene.points is None or any(scene.cameras[i].point_ids is None for i in dataset.indices):
            raise DataError(
                f"--depth_loss needs each image's SfM points (COLMAP tracks); the {scene.source} scene has none"
            )
        masked = has_masks(scene, dataset.alpha_as_mask)  # else no view is decoded here (streamed datasets)
        pixels, depths, starts = [], [], [0]
        for item, index in enumerate(dataset.indices):
            camera = scene.cameras[index]
            w2c = np.linalg.inv(camera.camtoworld.astype(np.float64))
            pts = scene.points[camera.point_ids].astype(np.float64) @ w2c[:3, :3].T + w2c[:3, 3]
            uv = project_points(pts, camera.K.astype(np.float64), camera_model)
            keep = (
                (uv[:, 0] >= 0)
                & (uv[:, 0] < camera.width)
                & (uv[:, 1] >= 0)
                & (uv[:, 1] < camera.height)
                & (pts[:, 2] > 0)
            )
            mask = dataset.mask(item) if masked else None
            if mask is not None:
                col = np.clip(uv[:, 0].astype(np.int64), 0, camera.width - 1)
                row = np.clip(uv[:, 1].astype(np.int64), 0, camera.height - 1)
                keep &= mask[row, col]
            pixels.append(uv[keep])
            depths.append(pts[keep, 2])
            starts.append(starts[-1] + int(keep.sum()))
        self.pixels = torch.from_numpy(np.concatenate(pixels).astype(np.float32)).reshape(-1, 2).to(device)
        self.depths = torch.from_numpy(np.concatenate(depths).astype(np.float32)).to(device)
        self.starts = starts
        self.num_points = starts[-1]

    def batch(self, items: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The targets of dataset items ``items``: pixels [P, 2], depths [P], image index in the
        batch [P] (int64), on the device (slices; no host synchronization)."""
        parts = [
            (self.pixels[self.starts[i] : self.starts[i + 1]], self.depths[self.starts[i] : self.starts[i + 1]])
            for i in items
        ]
        image = torch.cat(
            [torch.full((len(p),), j, dtype=torch.int64, device=self.depths.device) for j, (p, _) in enumerate(parts)]
        )
        return torch.cat([p for p, _ in parts]), torch.cat([d for _, d in parts]), image


def sample_bilinear(images: torch.Tensor, pixels: torch.Tensor, image_ids: torch.Tensor) -> torch.Tensor:
    """Bilinear samples of ``images`` [C, H, W, 1] at ``pixels`` [P, 2] (corner convention: the
    centre of pixel (i, j) is (i + 0.5, j + 0.5)) of image ``image_ids`` [P]; coordinates beyond
    the outer pixel centres take the border value. Returns [P], differentiable in ``images``."""
    C, H, W, _ = images.shape
    u = (pixels[:, 0] - 0.5).clamp(0, W - 1)
    v = (pixels[:, 1] - 0.5).clamp(0, H - 1)
    x0, y0 = u.floor().long().clamp(max=W - 1), v.floor().long().clamp(max=H - 1)
    x1, y1 = (x0 + 1).clamp(max=W - 1), (y0 + 1).clamp(max=H - 1)
    fx, fy = u - x0, v - y0
    flat = images.reshape(-1)
    base = image_ids * (H * W)
    at = lambda yy, xx: flat[base + yy * W + xx]  # noqa: E731
    return (1 - fy) * ((1 - fx) * at(y0, x0) + fx * at(y0, x1)) + fy * ((1 - fx) * at(y1, x0) + fx * at(y1, x1))


def depth_loss(
    rendered: torch.Tensor,
    pixels: torch.Tensor,
    depths: torch.Tensor,
    image_ids: torch.Tensor,
    scene_scale: float,
    weights: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """The module docstring's L_depth for one rank's batch: a 0-dim tensor, the mean over the C
    images of ``rendered`` [C, H, W, 1] of each image's mean |1/D - 1/z| over its points (an
    image without points adds 0), times ``scene_scale``. ``pixels`` [P, 2] are in the rendered
    images' pixel frame; ``weights`` [P] (0 or 1) drop points, e.g. outside a training crop."""
    C = rendered.shape[0]
    sampled = sample_bilinear(rendered, pixels, image_ids)
    disparity = torch.where(sampled > 0, 1.0 / sampled.clamp_min(1e-10), torch.zeros_like(sampled))
    err = (disparity - 1.0 / depths).abs()
    w = torch.ones_like(err) if weights is None else weights
    sums = torch.zeros(C, device=err.device, dtype=err.dtype).index_add_(0, image_ids, err * w)
    counts = torch.zeros(C, device=err.device, dtype=err.dtype).index_add_(0, image_ids, w)
    return (sums / counts.clamp_min(1.0)).mean() * scene_scale
