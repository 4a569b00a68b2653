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
output is cropped to the bounding box of the valid pixels, the principal point moved with it.
"""

from __future__ import annotations

import numpy as np

from .images import DataError, Undistortion


def _source(K_distorted: np.ndarray, coeffs: np.ndarray, K: np.ndarray, width: int, height: int
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


def remap_tables(K_distorted: np.ndarray, coeffs: np.ndarray, K: np.ndarray, width: int, height: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """cv2.remap float32 tables (OpenCV convention: pixel centres at integers) of the
    [height, width] output with intrinsics K."""
    sx, sy = _source(K_distorted, coeffs, K, width, height)
    return (sx - 0.5).astype(np.float32), (sy - 0.5).astype(np.float32)


def make_fisheye_undistortion(K: np.ndarray, coeffs, width: int, height: int, what: str,
                              cache_maps: bool = False, model: str = "") -> Undistortion:
    """Plan the remap of a [height, width] OpenCV-fisheye image with intrinsics K [3, 3] (pixels)
    and coeffs k1..k4 to an ideal equidistant fisheye of the same focal lengths, cropped to the
    valid pixels' bounding box. ``what`` names the camera in the DataError raised when no output
    pixel sees the image (a malformed camera)."""
    K = np.asarray(K, dtype=np.float64)
    coeffs = np.asarray(coeffs, dtype=np.float64)
    mapx, mapy = remap_tables(K, coeffs, K, width, height)
    valid = (mapx >= 0) & (mapy >= 0) & (mapx <= width - 1) & (mapy <= height - 1)
    rows, cols = np.nonzero(valid.any(axis=1))[0], np.nonzero(valid.any(axis=0))[0]
    if len(rows) < 2 or len(cols) < 2:
        raise DataError(f"{what}: fisheye coefficients {coeffs.tolist()} leave no valid image region")
    x0, y0 = int(cols[0]), int(rows[0])
    out_w, out_h = int(cols[-1]) + 1 - x0, int(rows[-1]) + 1 - y0
    K_new = K.copy()
    K_new[0, 2] -= x0
    K_new[1, 2] -= y0
    return Undistortion(K_distorted=K, coeffs=coeffs, src_width=width, src_height=height, K=K_new,
                        width=out_w, height=out_h, cache_maps=cache_maps, model=model, fisheye=True)
