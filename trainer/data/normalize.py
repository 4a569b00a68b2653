"""World normalization: scene at the origin, unit-ish scale, z up.

The math follows gsplat examples/datasets/normalize.py (itself from nerf-factory) and the
"Normalize the world space" block of gsplat examples/datasets/colmap.py:
  T1 = similarity_from_cameras: rotate the mean camera up vector (-y of the OpenCV camera axes)
       onto the world up, translate the median of the cameras' "focus" points (the point of each
       optical axis nearest to the origin) to the origin, scale so the median camera distance is 1;
  T2 = align_principal_axes (only with points): PCA of the points, centred at their median, the
       axis of least variance becomes z;
  T3 = 180 deg about x when the cameras' mean z is below the points' median z.
Two deliberate differences from gsplat:
- T1: gsplat's code rotates the camera up onto -y although its comment says +z; we rotate onto
  +z, the stated intent, which the NeRF path (no points, so no T2/T3) relies on for "z up".
- T3: gsplat flips when the points' median z is above their mean z ("most points are floor").
  On the real captures in ../shared/data that rule leaves cup and juicebox upside down (every
  camera below the scene, looking up; background points skew the mean), while "the cameras are
  above the scene" holds for all four hand-held captures and for forward-facing ones (z then
  points from the scene towards the cameras).
With points, T2 fixes the axes up to eigenvector signs, so our result equals gsplat's up to a
180 deg rotation about z whenever the two T3 rules agree.
"""

from __future__ import annotations

from typing import Optional

import numpy as np


def _rotation_between(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[3, 3] rotation R with R @ a = b for unit vectors a, b (Rodrigues' formula)."""
    axis = np.cross(a, b)
    cos = float(a @ b)
    if cos < -1.0 + 1e-9:  # opposite: half turn about any axis orthogonal to a
        ortho = np.cross(a, [1.0, 0.0, 0.0] if abs(a[0]) < 0.9 else [0.0, 1.0, 0.0])
        ortho /= np.linalg.norm(ortho)
        return 2.0 * np.outer(ortho, ortho) - np.eye(3)
    skew = np.array([[0.0, -axis[2], axis[1]], [axis[2], 0.0, -axis[0]], [-axis[1], axis[0], 0.0]])
    return np.eye(3) + skew + skew @ skew / (1.0 + cos)


def similarity_from_cameras(camtoworlds: np.ndarray) -> np.ndarray:
    """[C, 4, 4] OpenCV camtoworlds -> [4, 4] float64 similarity (rotation, translation, scale).

    gsplat examples/datasets/normalize.py similarity_from_cameras (center_method="focus",
    strict_scaling=False), up mapped to +z (see module docstring). The scale falls back to 1
    when the median camera distance is 0 (e.g. a single camera looking through the origin).
    """
    rotations = camtoworlds[:, :3, :3].astype(np.float64)  # [C, 3, 3]
    centres = camtoworlds[:, :3, 3].astype(np.float64)  # [C, 3]
    up = (-rotations[:, :, 1]).mean(axis=0)
    norm = np.linalg.norm(up)
    R_align = _rotation_between(up / norm, np.array([0.0, 0.0, 1.0])) if norm > 1e-12 else np.eye(3)

    centres = centres @ R_align.T
    forwards = (R_align @ rotations)[:, :, 2]  # [C, 3] optical axes
    focus = centres - (centres * forwards).sum(-1, keepdims=True) * forwards  # nearest to origin
    translate = -np.median(focus, axis=0)

    distance = float(np.median(np.linalg.norm(centres + translate, axis=-1)))
    scale = 1.0 / distance if np.isfinite(distance) and distance > 1e-12 else 1.0
    transform = np.eye(4)
    transform[:3, :3] = R_align
    transform[:3, 3] = translate
    transform[:3, :] *= scale
    return transform


def align_principal_axes(points: np.ndarray) -> np.ndarray:
    """[P, 3] points -> [4, 4] float64 rigid transform putting their principal axes on x, y, z.

    gsplat examples/datasets/normalize.py align_principal_axes: centre at the median, axes in
    decreasing variance (z = least variance), a proper rotation (det +1).
    """
    points = points.astype(np.float64)
    centre = np.median(points, axis=0)
    eigenvalues, eigenvectors = np.linalg.eigh(np.cov(points - centre, rowvar=False))
    eigenvectors = eigenvectors[:, np.argsort(eigenvalues)[::-1]]
    if np.linalg.det(eigenvectors) < 0:
        eigenvectors[:, 0] *= -1
    transform = np.eye(4)
    transform[:3, :3] = eigenvectors.T
    transform[:3, 3] = -eigenvectors.T @ centre
    return transform


def transform_points(transform: np.ndarray, points: np.ndarray) -> np.ndarray:
    """[4, 4] similarity applied to [P, 3] points -> [P, 3] (same dtype as points)."""
    out = points.astype(np.float64) @ transform[:3, :3].T + transform[:3, 3]
    return out.astype(points.dtype)


def transform_cameras(transform: np.ndarray, camtoworlds: np.ndarray) -> np.ndarray:
    """[4, 4] similarity applied to [C, 4, 4] camtoworlds -> [C, 4, 4] float64.

    Camera centres move with the transform; rotations stay orthonormal (the similarity's scale,
    cbrt(det), is divided out of the rotation block), as gsplat's transform_cameras.
    """
    out = transform[None] @ camtoworlds.astype(np.float64)
    scale = np.cbrt(np.linalg.det(transform[:3, :3]))
    out[:, :3, :3] /= scale
    return out


def normalize_world(
    camtoworlds: np.ndarray, points: Optional[np.ndarray]
) -> tuple[np.ndarray, Optional[np.ndarray], np.ndarray]:
    """Apply T1 (and, with 3+ points, T2 and T3) -> (camtoworlds [C, 4, 4], points [P, 3], T [4, 4]).

    camtoworlds come back float64, points in their dtype, T float64 with T @ old = new.
    """
    transform = similarity_from_cameras(camtoworlds)
    if points is not None and len(points) >= 3:
        moved = transform_points(transform, points.astype(np.float64))
        transform = align_principal_axes(moved) @ transform
        moved = transform_points(transform, points.astype(np.float64))
        camera_z = transform_cameras(transform, camtoworlds)[:, 2, 3]  # [C]
        if np.mean(camera_z) < np.median(moved[:, 2]):
            transform = np.diag([1.0, -1.0, -1.0, 1.0]) @ transform
    camtoworlds = transform_cameras(transform, camtoworlds)
    if points is not None:
        points = transform_points(transform, points)
    return camtoworlds, points, transform


def scene_scale(camtoworlds: np.ndarray) -> float:
    """Max distance of the [C, 4, 4] camera centres from their mean (gsplat's Parser.scene_scale).

    Falls back to 1.0 when it is 0 (a single camera, or all at one spot), so that learning rates
    scaled by it stay usable.
    """
    centres = camtoworlds[:, :3, 3].astype(np.float64)
    radius = float(np.linalg.norm(centres - centres.mean(axis=0), axis=-1).max())
    return radius if np.isfinite(radius) and radius > 0 else 1.0
