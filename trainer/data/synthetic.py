"""The embedded default scene: a known Gaussian cloud seen by cameras on an orbit.

Used when no ``--data_dir`` is given, so a fresh clone trains something real with no download.
The ground-truth images are rendered from the cloud with the plain-PyTorch reference renderer
(kernels/reference.py), so a perfect model exists and the test PSNR measures the optimizer and the
pipeline, not the data. The "SfM points" handed to the initializer are the true centres jittered
by 2% of the scene scale with perturbed colours, as a stand-in for a structure-from-motion cloud.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch

from .images import Camera, Scene


def look_at(eye: np.ndarray, target: np.ndarray, up: np.ndarray) -> np.ndarray:
    """Camera-to-world [4, 4] in OpenCV axes (x right, y down, z forward) looking at ``target``."""
    forward = target - eye
    forward /= np.linalg.norm(forward)
    right = np.cross(forward, up)
    right /= np.linalg.norm(right)
    down = np.cross(forward, right)
    c2w = np.eye(4)
    c2w[:3, 0], c2w[:3, 1], c2w[:3, 2], c2w[:3, 3] = right, down, forward, eye
    return c2w


def _cloud(num_gaussians: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A torus knot of small coloured Gaussians around a sphere: structure at several scales."""
    n_knot = num_gaussians // 2
    t = rng.random(n_knot) * 2 * math.pi
    p, q = 2, 3
    r = 0.6 + 0.25 * np.cos(q * t)
    knot = np.stack([r * np.cos(p * t), r * np.sin(p * t), 0.25 * np.sin(q * t)], axis=1)
    n_sphere = num_gaussians - n_knot
    v = rng.normal(size=(n_sphere, 3))
    sphere = 0.35 * v / np.linalg.norm(v, axis=1, keepdims=True)
    means = np.concatenate([knot, sphere]).astype(np.float32)
    hue = np.concatenate([t / (2 * math.pi), 0.5 + 0.5 * sphere[:, 2] / 0.35])
    rgbs = np.stack([0.5 + 0.5 * np.cos(2 * math.pi * (hue + k / 3.0)) for k in range(3)], axis=1)
    # the cloud is a set of surfaces: keep the coverage similar at any count (600 -> 0.035)
    size = 0.035 * (600.0 / num_gaussians) ** (1.0 / 3.0)
    scales = np.full((num_gaussians, 3), size, dtype=np.float32) * rng.uniform(0.7, 1.4, (num_gaussians, 1))
    return dict(
        means=means,
        rgbs=rgbs.astype(np.float32),
        scales=scales.astype(np.float32),
        opacities=np.full(num_gaussians, 0.9, dtype=np.float32),
    )


def _intrinsics(camera_model: str, width: int, height: int) -> np.ndarray:
    """[3, 3] K of the synthetic cameras: a 60 degree horizontal field of view (pinhole), 80
    degrees (equidistant fisheye: f = half width / 40 degrees in radians), or 2.4 scene units
    across (ortho: pixels per unit)."""
    if camera_model == "ortho":
        focal = width / 2.4
    elif camera_model == "fisheye":
        focal = 0.5 * width / math.radians(40.0)
    else:
        focal = 0.5 * width / math.tan(math.radians(30.0))
    return np.array([[focal, 0, width / 2], [0, focal, height / 2], [0, 0, 1]], dtype=np.float32)


def _unoccluded(means2d, depths, radii, expected_depth, width: int, height: int) -> np.ndarray:
    """int64 ids of the Gaussians whose projected centre lies in the image and whose depth is at
    most the rendered expected depth there plus 0.05 scene units."""
    px = means2d.floor().long()
    inside = (radii > 0).all(-1) & (px[:, 0] >= 0) & (px[:, 0] < width) & (px[:, 1] >= 0) & (px[:, 1] < height)
    ids = inside.nonzero()[:, 0]
    seen = depths[ids] <= expected_depth[px[ids, 1], px[ids, 0]] + 0.05
    return ids[seen].cpu().numpy().astype(np.int64)


def make_synthetic_scene(
    num_gaussians: int = 600,
    num_cameras: int = 40,
    image_size: int = 96,
    seed: int = 0,
    height: Optional[int] = None,
    device: str = "cpu",
    camera_model: str = "pinhole",
    tracks: bool = False,
) -> Scene:
    """Build the scene: cameras on a tilted orbit of radius 2.2 looking at the origin (OpenCV
    axes, z up world), ``image_size`` x ``height`` (default square) images (:func:`_intrinsics`
    of ``camera_model``: pinhole, ortho or fisheye, the cameras' ``model``), ground truth
    rendered at SH degree 0 over a black background. Deterministic in ``seed``.
    ``device="cuda"`` renders the ground truth with gsplat's CUDA ops (benchmark-sized scenes);
    the CPU uses the reference renderer. ``tracks``: each camera's ``point_ids`` lists the SfM
    stand-in points it observes: those inside its image whose true centre lies in front of the
    ground truth's expected depth there plus 0.05 scene units (not hidden behind other
    Gaussians), as an SfM track would (--depth_loss). ``Scene.visible_fraction``: each camera's
    share of the Gaussians its projection keeps (radii > 0)."""
    import importlib

    # deferred: the renderer is only needed to build the images
    reference = (
        importlib.import_module("gsplat.cuda._wrapper")
        if device.startswith("cuda")
        else importlib.import_module("splat_train.kernels.reference")
    )
    width, height = image_size, height or image_size

    rng = np.random.default_rng(seed)
    gt = _cloud(num_gaussians, rng)
    K = _intrinsics(camera_model, width, height)
    cameras, images, observed, visible = [], [], [], []
    means = torch.from_numpy(gt["means"]).to(device)
    quats = torch.tensor([[1.0, 0.0, 0.0, 0.0]], device=device).repeat(num_gaussians, 1)
    scales = torch.from_numpy(gt["scales"]).to(device)
    opacities = torch.from_numpy(gt["opacities"]).to(device)
    colors = torch.from_numpy(gt["rgbs"]).to(device)
    for i in range(num_cameras):
        angle = 2 * math.pi * i / num_cameras
        elevation = math.radians(20.0 + 15.0 * math.sin(3 * angle))
        eye = 2.2 * np.array(
            [math.cos(angle) * math.cos(elevation), math.sin(angle) * math.cos(elevation), math.sin(elevation)]
        )
        c2w = look_at(eye, np.zeros(3), np.array([0.0, 0.0, 1.0])).astype(np.float32)
        viewmat = torch.from_numpy(np.linalg.inv(c2w)).float()[None].to(device)
        Kt = torch.from_numpy(K)[None].to(device)
        with torch.no_grad():
            radii, means2d, depths, conics, _ = reference.fully_fused_projection(
                means, None, quats, scales, viewmat, Kt, width, height, opacities=opacities, camera_model=camera_model
            )
            tw, th = math.ceil(width / 16), math.ceil(height / 16)
            _, isect_ids, flatten_ids = reference.isect_tiles(means2d, radii, depths, 16, tw, th)
            offsets = reference.isect_offset_encode(isect_ids, 1, tw, th)
            img, alpha = reference.rasterize_to_pixels(
                means2d,
                conics,
                colors[None].contiguous(),
                opacities[None].contiguous(),
                width,
                height,
                16,
                offsets,
                flatten_ids,
            )
            if tracks:
                depth, _ = reference.rasterize_to_pixels(
                    means2d,
                    conics,
                    depths[..., None].contiguous(),
                    opacities[None].contiguous(),
                    width,
                    height,
                    16,
                    offsets,
                    flatten_ids,
                )
                observed.append(
                    _unoccluded(
                        means2d[0],
                        depths[0],
                        radii[0],
                        depth[0, ..., 0] / alpha[0, ..., 0].clamp_min(1e-10),
                        width,
                        height,
                    )
                )
        images.append((img[0].clamp(0, 1).cpu().numpy() * 255.0 + 0.5).astype(np.uint8))
        visible.append(int((radii[0] > 0).all(-1).sum()) / num_gaussians)
        cameras.append(
            Camera(
                name=f"synthetic_{i:03d}.png",
                image_path=None,  # type: ignore[arg-type]  # no file: the pixels are rendered
                camtoworld=c2w,
                K=K.copy(),
                width=width,
                height=height,
                dist=None,
                model=camera_model,
                point_ids=observed[-1] if tracks else None,
            )
        )
    jitter = rng.normal(scale=0.02, size=gt["means"].shape).astype(np.float32)
    points = gt["means"] + jitter
    points_rgb = np.clip(gt["rgbs"] + rng.normal(scale=0.1, size=gt["rgbs"].shape), 0, 1)
    centres = np.stack([c.camtoworld[:3, 3] for c in cameras])
    scene_scale = float(np.linalg.norm(centres - centres.mean(0), axis=1).max())
    return Scene(
        cameras=cameras,
        points=points.astype(np.float32),
        points_rgb=(points_rgb * 255).astype(np.uint8),
        scene_scale=scene_scale,
        transform=np.eye(4, dtype=np.float32),
        source="synthetic",
        images=images,
        visible_fraction=np.asarray(visible),
    )
