"""Fisheye cameras: an OpenCV fisheye image (COLMAP OPENCV_FISHEYE, nerfstudio OPENCV_FISHEYE)
remapped to the ideal equidistant fisheye that ``--camera_model fisheye`` projects with.

OpenCV's fisheye model (and COLMAP's OPENCV_FISHEYE): a camera-space point at angle theta from the
optical axis lands at radius f * theta_d with theta_d = theta (1 + k1 theta^2 + k2 theta^4 +
k3 theta^6 + k4 theta^8). The ideal equidistant fisheye (gsplat's ``fisheye_proj``, Utils.cuh)
puts it at f * theta. The remap samples, for every output pixel at (u, v) (pixel centres at
+0.5, images.py), the source at the same direction with theta replaced by theta_d:
    x = (u - cx) / fx, y = (v - cy) / fy, theta = hypot(x, y),
    source = (cx + fx x theta_d / theta, cy + fy y theta_d / theta),
with the same focal lengths (gsplat examples/datasets/colmap.py remaps the same way, about the
image centre). Output pixels whose source falls outside the image are masked (masks.py); the
output is cropped to the bounding box of the valid pixels, the principal point moved with it
(images.make_fisheye_undistortion). Pure numpy: this module imports nothing of the package.
"""

from __future__ import annotations

import numpy as np


def _source(
    K_distorted: np.ndarray, coeffs: np.ndarray, K: np.ndarray, width: int, height: int
) -> tuple[np.ndarray, np.ndarray]:
    """Source coordinates (corner convention, pixels) of every output pixel of a [height, width]
    equidistant image with intrinsics K: two float64 [height, width] arrays."""
    u, v = np.meshgrid(np.arange(width, dtype=np.float64) + 0.5, np.arange(height, dtype=np.float64) + 0.5)
    x, y = (u - K[0, 2]) / K[0, 0], (v - K[1, 2]) / K[1, 1]
    theta = np.hypot(x, y)
    t2 = theta * theta
    k1, k2, k3, k4 = (float(c) for c in coeffs)
    scale = 1.0 + t2 * (k1 + t2 * (k2 + t2 * (k3 + t2 * k4)))  # theta_d / theta (1 on the axis)
    return K_distorted[0, 2] + K_distorted[0, 0] * x * scale, K_distorted[1, 2] + K_distorted[1, 1] * y * scale


def remap_tables(
    K_distorted: np.ndarray, coeffs: np.ndarray, K: np.ndarray, width: int, height: int
) -> tuple[np.ndarray, np.ndarray]:
    """cv2.remap float32 tables (OpenCV convention: pixel centres at integers) of the
    [height, width] output with intrinsics K."""
    sx, sy = _source(K_distorted, coeffs, K, width, height)
    return (sx - 0.5).astype(np.float32), (sy - 0.5).astype(np.float32)
