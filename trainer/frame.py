"""Gaussians and cameras under a similarity transform: the normalized world <-> the input's frame.

The trainer works in a normalized world (data/normalize.py): ``Scene.transform`` is the [4, 4]
similarity T with ``x_normalized = T @ x_input``, T = [s R | t] (s > 0 a uniform scale, R a proper
rotation). Exports go back to the input's frame (the COLMAP / transforms.json world) by applying
T^-1 to the model, so that the splats line up with the input cameras and points and with other
tools' outputs of the same capture (gsplat issue #328 reports the mismatch this avoids).

Under x' = s R x + t a Gaussian maps to another Gaussian, parameter by parameter (pre-activation
values, as the PLY stores them):
    means       m' = s R m + t
    quats       q' = q_R * q  (Hamilton product; the Gaussian's rotation becomes R R_g; the norm of
                a raw quaternion is kept)
    log scales  l' = l + log s
    opacities, sh0 (the view-independent DC term): unchanged
    shN         the view direction d = m - c (camera centre c) becomes s R d, so the colour seen
                along d' must equal the old colour along R^-1 d': degree-l coefficients are
                multiplied by the real-SH rotation matrix of R for that degree (see
                :func:`sh_rotation`).
Rendering a camera moved by the same similarity (data/normalize.transform_cameras) then gives the
same image: perspective projection and the rasterizer's pixel-space terms are invariant to a
uniform scale of the world about the camera (tests/test_frame.py checks it with the reference
rasterizer).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..kernels.reference import _sh_bases

MAX_SH_DEGREE = 3


def decompose_similarity(transform: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """[4, 4] similarity -> (scale s, rotation R [3, 3], translation t [3]), float64, with
    ``transform[:3, :3] = s R``. Raises ValueError when the block is not s times a proper
    rotation (a reflection, a shear, a singular matrix) to 1e-5 relative."""
    transform = np.asarray(transform, dtype=np.float64)
    if transform.shape != (4, 4):
        raise ValueError(f"a similarity is a [4, 4] matrix, got shape {transform.shape}")
    block = transform[:3, :3]
    det = float(np.linalg.det(block))
    if not np.isfinite(det) or det <= 0:
        raise ValueError(f"not a similarity with a proper rotation (det {det:.3g})")
    scale = det ** (1.0 / 3.0)
    rotation = block / scale
    if not np.allclose(rotation @ rotation.T, np.eye(3), atol=1e-5):
        raise ValueError("not a similarity: the 3x3 block is not a scaled rotation")
    return scale, rotation, transform[:3, 3].copy()


def _fibonacci_directions(num: int) -> np.ndarray:
    """[num, 3] float64 unit vectors spread over the sphere (a Fibonacci lattice)."""
    i = np.arange(num, dtype=np.float64) + 0.5
    z = 1.0 - 2.0 * i / num
    r = np.sqrt(1.0 - z * z)
    phi = math.pi * (1.0 + math.sqrt(5.0)) * i
    return np.stack([r * np.cos(phi), r * np.sin(phi), z], axis=-1)


def sh_rotation(rotation: np.ndarray, degree: int) -> list[np.ndarray]:
    """Real-SH rotation matrices for degrees 1..``degree``: [D_1 [3, 3], D_2 [5, 5], D_3 [7, 7]].

    For the degree-l coefficients c (2l+1 values per colour channel, in gsplat's basis order and
    signs, kernels/reference._sh_bases), ``c' = D_l @ c`` satisfies
        sum_k c'_k Y_k(R d) = sum_k c_k Y_k(d)   for every direction d,
    i.e. the rotated Gaussian shows, along R d, the colour the original showed along d.

    Method: the degree-l real harmonics span a space that every rotation maps into itself (the
    real form of the Wigner D matrices; Blanco, Florez & Bermejo, "Evaluation of the rotation
    matrices in the basis of real spherical harmonics", J. Mol. Struct. 1997). So with A = Y(d_i)
    and B = Y(R d_i) stacked over 64 sample directions (rows), B c' = A c holds exactly and
    c' = pinv(B) A c; the least-squares solve is exact up to float64 rounding (1e-13), with no
    hand-written recurrence whose signs could disagree with the renderer's basis.

    rotation: [3, 3] proper rotation. Raises ValueError for degree outside 0..3.
    """
    if not 0 <= degree <= MAX_SH_DEGREE:
        raise ValueError(f"SH degree must be in 0..{MAX_SH_DEGREE}, got {degree}")
    dirs = torch.from_numpy(_fibonacci_directions(64))  # [64, 3] float64
    rotated = dirs @ torch.from_numpy(np.asarray(rotation, dtype=np.float64)).T
    a = torch.stack(_sh_bases(degree, dirs), dim=-1)  # [64, (degree+1)^2]
    b = torch.stack(_sh_bases(degree, rotated), dim=-1)
    out = []
    for l in range(1, degree + 1):
        band = slice(l * l, (l + 1) * (l + 1))
        out.append(torch.linalg.lstsq(b[:, band], a[:, band]).solution.numpy())  # [2l+1, 2l+1]
    return out


def rotate_sh(shN: torch.Tensor, rotation: np.ndarray) -> torch.Tensor:
    """shN [N, K-1, 3] (degrees 1..L, K = (L+1)^2, L <= 3) -> the coefficients of the rotated
    Gaussians (:func:`sh_rotation`), same shape, dtype and device. Raises ValueError when K-1 is
    not (L+1)^2 - 1 for some L in 0..3."""
    num_rest = shN.shape[1]
    degree = round(math.sqrt(num_rest + 1)) - 1
    if (degree + 1) ** 2 - 1 != num_rest or degree > MAX_SH_DEGREE:
        raise ValueError(f"shN holds {num_rest} coefficients per channel, not (L+1)^2 - 1 for L in 1..3")
    out = shN.detach().clone()  # in its own dtype: a float64 copy of 20 M Gaussians' shN is 7 GB
    for l, matrix in enumerate(sh_rotation(rotation, degree), start=1):
        band = slice(l * l - 1, (l + 1) * (l + 1) - 1)  # shN starts at degree 1
        out[:, band] = torch.einsum("ij,njc->nic", torch.from_numpy(matrix).to(out), out[:, band])
    return out


def _quat_multiply(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Hamilton product a * b of wxyz quaternions, broadcasting: [..., 4] x [..., 4] -> [..., 4]."""
    aw, ax, ay, az = a.unbind(-1)
    bw, bx, by, bz = b.unbind(-1)
    return torch.stack(
        [
            aw * bw - ax * bx - ay * by - az * bz,
            aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw,
        ],
        dim=-1,
    )


def rotation_to_quat(rotation: np.ndarray) -> np.ndarray:
    """[3, 3] rotation -> [4] unit quaternion wxyz, float64 (scipy's conversion)."""
    from scipy.spatial.transform import Rotation

    x, y, z, w = Rotation.from_matrix(np.asarray(rotation, dtype=np.float64)).as_quat()
    return np.array([w, x, y, z])


def transform_gaussians(params: dict[str, torch.Tensor], transform: np.ndarray) -> dict[str, torch.Tensor]:
    """Gaussians (pre-activation: means [N, 3], quats [N, 4] wxyz raw, scales [N, 3] log,
    opacities [N], sh0 [N, 1, 3], shN [N, K-1, 3]) moved by the similarity ``transform`` [4, 4]
    (x' = transform @ x; see the module docstring for each parameter). Returns new CPU tensors in
    the input dtypes (means and quats computed in float64, shN in its dtype). An exact identity
    returns the tensors unchanged.
    Raises ValueError from :func:`decompose_similarity`."""
    if np.array_equal(np.asarray(transform, dtype=np.float64), np.eye(4)):
        return {k: v.detach().cpu() for k, v in params.items()}
    scale, rotation, translation = decompose_similarity(transform)
    out = {k: v.detach().cpu() for k, v in params.items()}
    means = out["means"].to(torch.float64)
    out["means"] = (scale * means @ torch.from_numpy(rotation).T + torch.from_numpy(translation)).to(
        params["means"].dtype
    )
    q = torch.from_numpy(rotation_to_quat(rotation))
    out["quats"] = _quat_multiply(q, out["quats"].to(torch.float64)).to(params["quats"].dtype)
    out["scales"] = (out["scales"].to(torch.float64) + math.log(scale)).to(params["scales"].dtype)
    if out["shN"].shape[1]:
        out["shN"] = rotate_sh(out["shN"], rotation)
    return out


def to_input_frame(params: dict[str, torch.Tensor], scene_transform: np.ndarray) -> dict[str, torch.Tensor]:
    """Gaussians of the normalized world -> the input data's frame: :func:`transform_gaussians`
    with the inverse of ``Scene.transform`` (x_normalized = T @ x_input)."""
    return transform_gaussians(params, np.linalg.inv(np.asarray(scene_transform, dtype=np.float64)))
