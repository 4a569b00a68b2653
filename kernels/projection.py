"""Projection + SH colours of the dense pass in one Triton launch, and its per-Gaussian backward.

:func:`project_and_shade_fused` takes a shard's RAW parameters and returns what
``render.project_and_shade(ops, model.activated(params), ...)`` returns for a dense pass whose C
cameras share one image size: the activations (exp of the log-scales, sigmoid of the logit
opacities, quaternion normalization), gsplat 1.5.3's fully_fused_projection (pinhole camera,
opacity-aware extent, ``antialiased`` compensations) and spherical_harmonics (+0.5, clamped at
0), fused. The plain-PyTorch reference is that composition with ``kernels/reference.py``'s ops
(tests/test_projection_kernel.py); the formulas are gsplat's (ProjectionEWA3DGSFused.cu,
Utils.cuh persp_proj / add_blur / quat_to_rotmat, SphericalHarmonicsCUDA.cu), as reference.py
documents them.

Kernels (one program per BLOCK Gaussians, one Gaussian per lane; C, the cameras, loop inside):
    forward: read each Gaussian's mean, log-scales and logit opacity; per camera, a conservative
    frustum test (below) sets bit c of ``pre``; the quaternion is read only for lanes with a bit
    set; per camera the full projection writes radii, means2d, depths, conics and opacities and
    sets bit c of ``bits`` (int32 [N], saved for the backward: radii > 0 in camera c); the SH
    coefficients are read only for lanes with a bit of ``bits`` set, and colours written, one
    colour channel at a time (16 coefficients live, not 48).
    backward: read ``bits``; a lane with none set reads nothing more and writes exact zeros;
    the others read their parameters once, loop over the cameras whose bit is set (reading those
    records' gradients only), recompute the projection and accumulate the gradient of the mean,
    of M = R S (R from the normalized quaternion) and of the opacity in registers, then the SH
    gradients per colour channel, and write the gradients of the six raw parameters once,
    through the activations. No atomics: a Gaussian's cameras are summed by its own lane (the
    per-Gaussian backward of Taming 3DGS, Mallick et al. 2024, and Faster-GS). The gradients
    leave as 2D tiles, a row per Gaussian (means, scales, quats, sh0: [BLOCK, 4]; shN: two [BLOCK,
    32], coefficient j's channel c in column 4 j + c), each one store that Triton lays out with
    consecutive lanes along a row's contiguous floats: a store of one float per lane at a
    Gaussian's stride would touch a different 32-byte sector per lane (shN's stride is 180 bytes),
    and writes, unlike reads, do not merge in L1.

With ``lazy`` (--lazy_sh_adam, kernels/lazy_adam.py) two forward kernels follow: the Gaussians
seen are listed (compacted on the device, for the step's Adam), and, in a second list, those whose
SH rows wait for deferred Adam steps; then the waiting ones are caught up (their sh0, shN and
moments written in place, lanes along each row's coefficients) and their colours written again
from the caught-up coefficients.

Culling before projecting (conservative: a Gaussian the full projection gives radii > 0 in a
camera always passes): near/far is the projection's own test; the image test bounds the radius
from the scales alone. With w = J_row Rv (the pinhole Jacobian row, clamped as persp_proj clamps
it, times the camera rotation) and R orthonormal, the projected variance is |w R S|^2 <=
|w|^2 max(scales)^2, so radius <= extent * sqrt(|w|^2 max(s)^2 + 0.3), extent the opacity-aware
one of the uncompensated opacity (compensation <= 1). The bound is widened by 0.1% and one pixel
(the ceil, rounding). Outputs equal those of the unculled computation.

Numerics: the 2D determinant is |a0 x a1|^2 (A = J Rv R S, cov2d = A A^T; Lagrange's identity)
instead of gsplat's c00 c11 - c01^2, which cancels for thin Gaussians: with ``antialiased``,
gsplat's compensations of needle-like Gaussians (2D condition number ~1e5) can be off by ~10%, and
their opacity-aware radii by tens of pixels; here they match the reference evaluated in float64.

Gradient semantics: gsplat's backward (radii, culling and the extent are constants; the
Jacobian clamp's gradient as persp_proj_vjp), which autograd through the reference reproduces.
One difference in what is read: the gradient arriving at a culled (camera, Gaussian) record is
ignored for every output, the opacities included, so a Gaussian no camera sees gets exact zero
gradients. Autograd through the reference would pass a culled record's opacity gradient to the
logit (render.project_and_shade expands the opacities unmasked); in a training step that
gradient is zero (a culled record is in no tile), so the step is unchanged. Not supported (raise;
the caller takes the gsplat / reference path): camera models other than pinhole, gradients for
viewmats / Ks / campos (``--pose_opt``), SH degree 4, more than :data:`MAX_CAMERAS` cameras,
float64. Culled records hold radii 0, means2d / depths / conics 0, colour 0.5 (masked SH 0, +0.5)
and opacity sigmoid(logit) (antialiased: 0), the reference's values.

Memory traffic: :func:`traffic`. Triton decides compiled-vs-interpreted when a kernel is defined:
set ``TRITON_INTERPRET=1`` before importing this module to run it on CPU tensors.
"""

from __future__ import annotations

import inspect
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Optional

import torch
from torch import Tensor

from . import constants, prewarm
from .reference import ALPHA_THRESHOLD, EXTENT_SIGMAS

if TYPE_CHECKING:  # pragma: no cover
    from .adam import SeenRows
    from .lazy_adam import LazyRows

try:  # the CPU-only torch wheel may ship without Triton
    import triton
    import triton.language as tl

    from .adam import adam_in_place
    from .lazy_adam import catch_up_listed, list_seen
except ImportError:  # pragma: no cover - depends on the environment
    triton = None

BLOCK = 128  # Gaussians per program: one per lane of 4 warps
NUM_WARPS = 4
CATCH_UP_LANES = 512  # lanes of a program of the listed catch-up (rows x lanes per row)
CATCH_UP_WARPS = 8  # its warps: two lanes a thread (64 registers for sm_90; four lanes a thread took 146)
EPS2D = 0.3  # px^2 low-pass blur (gsplat's eps2d default, as render._project uses)
MAX_CAMERAS = 32  # bits of the int32 visibility mask
MAX_SH_DEGREE = 3
CULL_SLACK = 1e-3  # relative widening of the conservative radius bound (plus one pixel)
PARAM_KEYS = ("means", "quats", "scales", "opacities", "sh0", "shN")
GEOMETRIC_KEYS = PARAM_KEYS[:4]  # what the projection needs of every Gaussian (the SH rows: of the seen ones)
OUTPUT_KEYS = ("radii", "means2d", "depths", "conics", "opacities", "colors")
_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"


def available() -> bool:
    """Whether Triton imported (the kernels still need a CUDA/ROCm tensor or the interpreter)."""
    return triton is not None


# ------------------------------------------------------------------------------------------------
# Bytes model
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Traffic:
    """Bytes the kernels must move between DRAM and the chip (float32, each byte once)."""

    forward_read: int
    forward_write: int
    backward_read: int
    backward_write: int

    @property
    def forward(self) -> int:
        return self.forward_read + self.forward_write

    @property
    def backward(self) -> int:
        return self.backward_read + self.backward_write


def traffic(
    n: int,
    cameras: int,
    num_bases: int,
    sh_degree: Optional[int] = None,
    visible: Optional[int] = None,
    visible_records: Optional[int] = None,
    depth_grad: bool = False,
) -> Traffic:
    """The bytes model of one forward and one backward over ``n`` Gaussians, ``cameras`` cameras,
    ``num_bases`` = K stored SH bases (shN holds K - 1), degree ``sh_degree`` in use (default the
    full one); ``visible``: Gaussians some camera sees (default all), ``visible_records``: visible
    (camera, Gaussian) pairs (default visible x cameras); ``depth_grad``: the depths receive a
    gradient (rendered depth).

    Forward: reads means, log-scales, logit opacity (28 B) of every Gaussian, the quaternion (16 B)
    and the (sh_degree + 1)^2 coefficients in use (12 B each) of the visible ones (the frustum test
    is conservative: a few more pass it); writes a 48-byte record per camera (radii 8, means2d 8,
    depth 4, conic 12, opacity 4, colour 12) and the 4-byte visibility mask. Backward: reads the
    mask, the parameters of the visible Gaussians (44 B + coefficients) and the gradients of their
    visible records (means2d, conic, opacity, colour: 36 B, + 4 with depth_grad); writes the
    gradient of every parameter (44 + 12 K bytes per Gaussian). The cameras' few bytes are left out.
    SH degree 3, K = 16, all visible, C = 1: forward 288 B, backward 512 B per Gaussian.
    """
    degree = _degree_of(num_bases) if sh_degree is None else sh_degree
    used = (degree + 1) ** 2
    if used > num_bases or n < 0 or cameras < 1:
        raise ValueError(f"traffic: n={n}, cameras={cameras}, K={num_bases}, sh_degree={degree} are inconsistent")
    visible = n if visible is None else visible
    visible_records = visible * cameras if visible_records is None else visible_records
    geometry = 4 * (3 + 3 + 1)  # means, log-scales, logit opacity
    return Traffic(
        forward_read=n * geometry + visible * (16 + 12 * used),
        forward_write=n * (48 * cameras + 4),
        backward_read=n * 4 + visible * (geometry + 16 + 12 * used) + visible_records * (40 if depth_grad else 36),
        backward_write=n * (geometry + 16 + 12 * num_bases),
    )


def _degree_of(num_bases: int) -> int:
    degree = int(round(num_bases**0.5)) - 1
    if (degree + 1) ** 2 != num_bases:
        raise ValueError(f"K={num_bases} SH bases is not a square (degree + 1)^2")
    return degree


# ------------------------------------------------------------------------------------------------
# Kernels
# ------------------------------------------------------------------------------------------------


def unspecialized_jit(sizes, pointers):
    """``triton.jit`` that compiles one kernel whatever the values of ``sizes`` (int arguments)
    and the 16-byte alignment of ``pointers``.

    Triton specializes an int argument on being 1 or a multiple of 16 and a pointer on 16-byte
    alignment, one compilation per combination. The Gaussian count changes at every
    densification; a camera's Ks (36 bytes) and campos (12 bytes) sliced from a batch, and
    gradient views into the rasterizer's buffers, are aligned or not by offset: each flip
    compiled the projection again inside a training run (seconds per compilation, per SH
    degree). These kernels load per lane with a stride of 3, so the hints buy no vector loads.
    Triton versions with ``do_not_specialize_on_alignment`` take the pointers there; older ones
    under ``do_not_specialize``. Raises RuntimeError without Triton."""
    if triton is None:
        raise RuntimeError("unspecialized_jit needs Triton")
    if "do_not_specialize_on_alignment" in inspect.signature(triton.jit).parameters:
        return triton.jit(do_not_specialize=list(sizes), do_not_specialize_on_alignment=list(pointers))
    return triton.jit(do_not_specialize=[*sizes, *pointers])


# Pointers whose alignment varies between calls of one run (see unspecialized_jit)
VARYING_POINTERS = ("ks_ptr", "campos_ptr")
VARYING_GRADIENT_POINTERS = ("v_means2d_ptr", "v_depths_ptr", "v_conics_ptr", "v_opac_ptr", "v_colors_ptr")


if triton is not None:
    # real SH constants: Sloan 2013 with gsplat's signs (reference._sh_bases)
    SH_C0 = tl.constexpr(0.2820947917738781)
    SH_C1 = tl.constexpr(0.48860251190292)
    SH_C2A = tl.constexpr(0.5462742152960395)
    SH_C2B = tl.constexpr(1.092548430592079)
    SH_C2C = tl.constexpr(0.9461746957575601)
    SH_C2D = tl.constexpr(0.3153915652525201)
    SH_C3A = tl.constexpr(0.5900435899266435)
    SH_C3B = tl.constexpr(1.445305721320277)
    SH_C3C = tl.constexpr(2.285228997322329)
    SH_C3D = tl.constexpr(0.4570457994644658)
    SH_C3E = tl.constexpr(1.865881662950577)
    SH_C3F = tl.constexpr(1.119528997770346)
    THRESHOLD = tl.constexpr(ALPHA_THRESHOLD)
    EXTENT = tl.constexpr(EXTENT_SIGMAS)

    @triton.jit
    def _camera(vm_ptr, ks_ptr, cam):
        """Camera ``cam``: rotation rows and translation of the [4, 4] world-to-camera matrix,
        then fx, cx, fy, cy of the [3, 3] intrinsics."""
        v = vm_ptr + cam * 16
        k = ks_ptr + cam * 9
        return (
            tl.load(v), tl.load(v + 1), tl.load(v + 2), tl.load(v + 3),
            tl.load(v + 4), tl.load(v + 5), tl.load(v + 6), tl.load(v + 7),
            tl.load(v + 8), tl.load(v + 9), tl.load(v + 10), tl.load(v + 11),
            tl.load(k), tl.load(k + 2), tl.load(k + 4), tl.load(k + 5),
        )  # fmt: skip

    @triton.jit
    def _fov_clamp(xc, yc, rz, fx, cx, fy, cy, W, H):
        """persp_proj's clamp of x/z and y/z to 1.3x the field of view: the clamped values and
        whether each was inside (where the clamp passes a gradient)."""
        lxp = (W - cx) / fx + 0.3 * (0.5 * W / fx)
        lxn = cx / fx + 0.3 * (0.5 * W / fx)
        lyp = (H - cy) / fy + 0.3 * (0.5 * H / fy)
        lyn = cy / fy + 0.3 * (0.5 * H / fy)
        u = xc * rz
        v = yc * rz
        xin = (u >= -lxn) & (u <= lxp)
        yin = (v >= -lyn) & (v <= lyp)
        return tl.minimum(tl.maximum(u, -lxn), lxp), tl.minimum(tl.maximum(v, -lyn), lyp), xin, yin

    @triton.jit
    def _rotation(qw, qx, qy, qz):
        """Rotation matrix (row-major) of the normalized quaternion, then the normalized
        quaternion and 1/|q| (reference.quat_to_rotmat)."""
        inv = 1.0 / tl.sqrt(qw * qw + qx * qx + qy * qy + qz * qz)
        w = qw * inv
        x = qx * inv
        y = qy * inv
        z = qz * inv
        return (
            1.0 - 2.0 * (y * y + z * z), 2.0 * (x * y - w * z), 2.0 * (x * z + w * y),
            2.0 * (x * y + w * z), 1.0 - 2.0 * (x * x + z * z), 2.0 * (y * z - w * x),
            2.0 * (x * z - w * y), 2.0 * (y * z + w * x), 1.0 - 2.0 * (x * x + y * y),
            w, x, y, z, inv,
        )  # fmt: skip

    @triton.jit
    def _unit_dir(mx, my, mz, cam_ptr, cam):
        """The direction from camera ``cam``'s centre to the mean, normalized (clamped as the
        reference: |d|^2 >= 1e-30), its 1/|d| and whether the clamp was inactive."""
        dx = mx - tl.load(cam_ptr + cam * 3)
        dy = my - tl.load(cam_ptr + cam * 3 + 1)
        dz = mz - tl.load(cam_ptr + cam * 3 + 2)
        n2 = dx * dx + dy * dy + dz * dz
        inv = 1.0 / tl.sqrt(tl.maximum(n2, 1e-30))
        return dx * inv, dy * inv, dz * inv, inv, n2 >= 1e-30

    @triton.jit
    def _band1(x, y, z):
        return -SH_C1 * y, SH_C1 * z, -SH_C1 * x

    @triton.jit
    def _band2(x, y, z):
        return (
            SH_C2A * (2.0 * x * y),
            -SH_C2B * z * y,
            SH_C2C * z * z - SH_C2D,
            -SH_C2B * z * x,
            SH_C2A * (x * x - y * y),
        )

    @triton.jit
    def _band3(x, y, z):
        cos1 = x * x - y * y
        sin1 = 2.0 * x * y
        p3 = -SH_C3C * z * z + SH_C3D
        return (
            -SH_C3A * (x * sin1 + y * cos1),
            SH_C3B * z * sin1,
            p3 * y,
            z * (SH_C3E * z * z - SH_C3F),
            p3 * x,
            SH_C3B * z * cos1,
            -SH_C3A * (x * cos1 - y * sin1),
        )

    @triton.jit
    def _sh_color(x, y, z, k0, k1, k2, k3, k4, k5, k6, k7, k8, k9, k10, k11, k12, k13, k14, k15, DEG: tl.constexpr):
        """One colour channel of the SH expansion of degree DEG at unit direction (x, y, z)."""
        col = SH_C0 * k0
        if DEG >= 1:
            b1, b2, b3 = _band1(x, y, z)
            col += b1 * k1 + b2 * k2 + b3 * k3
        if DEG >= 2:
            b4, b5, b6, b7, b8 = _band2(x, y, z)
            col += b4 * k4 + b5 * k5 + b6 * k6 + b7 * k7 + b8 * k8
        if DEG >= 3:
            b9, b10, b11, b12, b13, b14, b15 = _band3(x, y, z)
            col += b9 * k9 + b10 * k10 + b11 * k11 + b12 * k12 + b13 * k13 + b14 * k14 + b15 * k15
        return col

    @triton.jit
    def _sh_dir_grad(x, y, z, k1, k2, k3, k4, k5, k6, k7, k8, k9, k10, k11, k12, k13, k14, k15, DEG: tl.constexpr):
        """d colour / d (x, y, z) of one channel at unit direction (x, y, z) (DEG >= 1)."""
        gx = -SH_C1 * k3
        gy = -SH_C1 * k1
        gz = SH_C1 * k2
        if DEG >= 2:
            gx += SH_C2B * (k4 * y - k7 * z) + 2.0 * SH_C2A * k8 * x
            gy += SH_C2B * (k4 * x - k5 * z) - 2.0 * SH_C2A * k8 * y
            gz += -SH_C2B * (k5 * y + k7 * x) + 2.0 * SH_C2C * k6 * z
        if DEG >= 3:
            p3 = -SH_C3C * z * z + SH_C3D
            dp3 = -2.0 * SH_C3C * z
            d2 = 3.0 * (x * x - y * y)
            gx += -SH_C3A * (6.0 * x * y * k9 + d2 * k15) + 2.0 * SH_C3B * z * (y * k10 + x * k14) + p3 * k13
            gy += -SH_C3A * (d2 * k9 - 6.0 * x * y * k15) + 2.0 * SH_C3B * z * (x * k10 - y * k14) + p3 * k11
            gz += (
                SH_C3B * (2.0 * x * y * k10 + (x * x - y * y) * k14)
                + dp3 * (y * k11 + x * k13)
                + (3.0 * SH_C3E * z * z - SH_C3F) * k12
            )
        return gx, gy, gz

    @triton.jit
    def _load_coeffs(sh0_ptr, shn_ptr, offs, KR, ch, mask, DEG: tl.constexpr):
        """Channel ``ch`` of the (DEG + 1)^2 coefficients in use; 0 beyond (and where ~mask)."""
        k0 = tl.load(sh0_ptr + offs * 3 + ch, mask=mask, other=0.0)
        base = shn_ptr + offs * (KR * 3) + ch
        zero = tl.zeros_like(k0)
        k1, k2, k3, k4, k5, k6, k7, k8 = zero, zero, zero, zero, zero, zero, zero, zero
        k9, k10, k11, k12, k13, k14, k15 = zero, zero, zero, zero, zero, zero, zero
        if DEG >= 1:
            k1 = tl.load(base, mask=mask, other=0.0)
            k2 = tl.load(base + 3, mask=mask, other=0.0)
            k3 = tl.load(base + 6, mask=mask, other=0.0)
        if DEG >= 2:
            k4 = tl.load(base + 9, mask=mask, other=0.0)
            k5 = tl.load(base + 12, mask=mask, other=0.0)
            k6 = tl.load(base + 15, mask=mask, other=0.0)
            k7 = tl.load(base + 18, mask=mask, other=0.0)
            k8 = tl.load(base + 21, mask=mask, other=0.0)
        if DEG >= 3:
            k9 = tl.load(base + 24, mask=mask, other=0.0)
            k10 = tl.load(base + 27, mask=mask, other=0.0)
            k11 = tl.load(base + 30, mask=mask, other=0.0)
            k12 = tl.load(base + 33, mask=mask, other=0.0)
            k13 = tl.load(base + 36, mask=mask, other=0.0)
            k14 = tl.load(base + 39, mask=mask, other=0.0)
            k15 = tl.load(base + 42, mask=mask, other=0.0)
        return k0, k1, k2, k3, k4, k5, k6, k7, k8, k9, k10, k11, k12, k13, k14, k15

    @triton.jit
    def _jacobian(xc, yc, zs, fx, cx, fy, cy, W, H):
        """Pinhole projection at camera-space (xc, yc, zs): 1/z, the Jacobian's entries J00,
        J02, J11, J12 (x/z, y/z clamped), tx, ty, the clamps' in-range flags, means2d."""
        rz = 1.0 / zs
        uc, vc, xin, yin = _fov_clamp(xc, yc, rz, fx, cx, fy, cy, W, H)
        tx = zs * uc
        ty = zs * vc
        return (
            rz, fx * rz, -fx * tx * rz * rz, fy * rz, -fy * ty * rz * rz, tx, ty, xin, yin,
            fx * xc * rz + cx, fy * yc * rz + cy,
        )  # fmt: skip

    @triton.jit
    def _sqrt_ieee(x):
        """Correctly rounded square root (what the CPU reference computes) for float32; any other
        dtype (float64: the tests' exact-arithmetic runs under the interpreter) as tl.sqrt."""
        y = tl.sqrt(x)
        if x.dtype == tl.float32:
            y = tl.sqrt_rn(x)
        return y

    @triton.jit
    def _determinants(a00, a01, a02, a10, a11, a12, e00, e11, eps2d):
        """det(A A^T) as |a0 x a1|^2 (Lagrange's identity: no cancellation for thin Gaussians, where
        c00 c11 - c01^2 loses digits) and the determinant after add_blur, det + eps (c00 + c11) + eps^2."""
        x = a01 * a12 - a02 * a11
        y = a02 * a10 - a00 * a12
        z = a00 * a11 - a01 * a10
        det = x * x + y * y + z * z
        return det, det + eps2d * (e00 + e11) + eps2d * eps2d

    @triton.jit
    def _precull(mx, my, mz, smax, op, live, vm_ptr, ks_ptr, C, W, H, near, far, eps2d, SLACK: tl.constexpr):
        """Bit c set where camera c may see the Gaussian (never clear where the projection gives
        radii > 0): near/far as the projection tests it, the image bounds with the radius bound
        of the module docstring."""
        thr: tl.constexpr = THRESHOLD
        ext = tl.minimum(tl.sqrt(tl.maximum(2.0 * tl.log(op / thr), 0.0)), EXTENT)
        ext = tl.where(op >= thr, ext * (1.0 + SLACK), 0.0)
        s2 = smax * smax
        pre = tl.zeros(mx.shape, dtype=tl.int32)
        for cam in range(C):
            r00, r01, r02, t0, r10, r11, r12, t1, r20, r21, r22, t2, fx, cx, fy, cy = _camera(vm_ptr, ks_ptr, cam)
            xc = r00 * mx + r01 * my + r02 * mz + t0
            yc = r10 * mx + r11 * my + r12 * mz + t1
            zc = r20 * mx + r21 * my + r22 * mz + t2
            ok = live & (op >= thr) & (zc >= near) & (zc <= far)
            zs = tl.where(ok, zc, 1.0)
            rz, j00, j02, j11, j12, tx, ty, xin, yin, m2x, m2y = _jacobian(xc, yc, zs, fx, cx, fy, cy, W, H)
            w0 = j00 * r00 + j02 * r20
            w1 = j00 * r01 + j02 * r21
            w2 = j00 * r02 + j02 * r22
            v0 = j11 * r10 + j12 * r20
            v1 = j11 * r11 + j12 * r21
            v2 = j11 * r12 + j12 * r22
            rx = ext * tl.sqrt((w0 * w0 + w1 * w1 + w2 * w2) * s2 + eps2d) + 1.0
            ry = ext * tl.sqrt((v0 * v0 + v1 * v1 + v2 * v2) * s2 + eps2d) + 1.0
            ok = ok & (m2x + rx > 0) & (m2x - rx < W) & (m2y + ry > 0) & (m2y - ry < H)
            pre = pre | (ok.to(tl.int32) << cam)
        return pre

    @triton.jit
    def _activated_geometry(means_ptr, scales_ptr, opac_ptr, offs, mask):
        """The rows ``offs`` (``mask``) of the means, exp of the log-scales and sigmoid of the
        opacity logits: (mx, my, mz, s0, s1, s2, opacity), what the forward and the backward both
        start from."""
        mx = tl.load(means_ptr + offs * 3, mask=mask, other=0.0)
        my = tl.load(means_ptr + offs * 3 + 1, mask=mask, other=0.0)
        mz = tl.load(means_ptr + offs * 3 + 2, mask=mask, other=0.0)
        s0 = tl.exp(tl.load(scales_ptr + offs * 3, mask=mask, other=0.0))
        s1 = tl.exp(tl.load(scales_ptr + offs * 3 + 1, mask=mask, other=0.0))
        s2 = tl.exp(tl.load(scales_ptr + offs * 3 + 2, mask=mask, other=0.0))
        op = 1.0 / (1.0 + tl.exp(-tl.load(opac_ptr + offs, mask=mask, other=0.0)))
        return mx, my, mz, s0, s1, s2, op

    @unspecialized_jit(["N", "KR"], VARYING_POINTERS)
    def _forward_kernel(
        means_ptr, quats_ptr, scales_ptr, opac_ptr, sh0_ptr, shn_ptr, vm_ptr, ks_ptr, campos_ptr,
        radii_ptr, means2d_ptr, depths_ptr, conics_ptr, opac_out_ptr, colors_ptr, bits_ptr,
        N, C, KR, W, H, near, far, eps2d,
        DEG: tl.constexpr, AA: tl.constexpr, BLOCK: tl.constexpr, SLACK: tl.constexpr,
    ):  # fmt: skip
        thr: tl.constexpr = THRESHOLD
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        live = offs < N
        mx, my, mz, s0, s1, s2, op = _activated_geometry(means_ptr, scales_ptr, opac_ptr, offs, live)
        pre = _precull(mx, my, mz, tl.maximum(tl.maximum(s0, s1), s2), op, live, vm_ptr, ks_ptr, C, W, H, near, far,
                       eps2d, SLACK)  # fmt: skip
        maybe = pre != 0
        qw = tl.load(quats_ptr + offs * 4, mask=maybe, other=1.0)
        qx = tl.load(quats_ptr + offs * 4 + 1, mask=maybe, other=0.0)
        qy = tl.load(quats_ptr + offs * 4 + 2, mask=maybe, other=0.0)
        qz = tl.load(quats_ptr + offs * 4 + 3, mask=maybe, other=0.0)
        q00, q01, q02, q10, q11, q12, q20, q21, q22, _w, _x, _y, _z, _inv = _rotation(qw, qx, qy, qz)
        m00, m01, m02 = q00 * s0, q01 * s1, q02 * s2  # M = R S
        m10, m11, m12 = q10 * s0, q11 * s1, q12 * s2
        m20, m21, m22 = q20 * s0, q21 * s1, q22 * s2
        bits = tl.zeros([BLOCK], dtype=tl.int32)
        for cam in range(C):
            r00, r01, r02, t0, r10, r11, r12, t1, r20, r21, r22, t2, fx, cx, fy, cy = _camera(vm_ptr, ks_ptr, cam)
            xc = r00 * mx + r01 * my + r02 * mz + t0
            yc = r10 * mx + r11 * my + r12 * mz + t1
            zc = r20 * mx + r21 * my + r22 * mz + t2
            valid = (((pre >> cam) & 1) != 0) & (zc >= near) & (zc <= far)
            zs = tl.where(valid, zc, 1.0)
            rz, j00, j02, j11, j12, tx, ty, xin, yin, m2x, m2y = _jacobian(xc, yc, zs, fx, cx, fy, cy, W, H)
            # A = J Rv M: cov2d = A A^T (= J Rv Sigma Rv^T J^T)
            c0 = r00 * m00 + r01 * m10 + r02 * m20
            c1 = r00 * m01 + r01 * m11 + r02 * m21
            c2 = r00 * m02 + r01 * m12 + r02 * m22
            d0 = r20 * m00 + r21 * m10 + r22 * m20
            d1 = r20 * m01 + r21 * m11 + r22 * m21
            d2 = r20 * m02 + r21 * m12 + r22 * m22
            a00, a01, a02 = j00 * c0 + j02 * d0, j00 * c1 + j02 * d1, j00 * c2 + j02 * d2
            c0 = r10 * m00 + r11 * m10 + r12 * m20
            c1 = r10 * m01 + r11 * m11 + r12 * m21
            c2 = r10 * m02 + r11 * m12 + r12 * m22
            a10, a11, a12 = j11 * c0 + j12 * d0, j11 * c1 + j12 * d1, j11 * c2 + j12 * d2
            e00 = a00 * a00 + a01 * a01 + a02 * a02
            e01 = a00 * a10 + a01 * a11 + a02 * a12
            e11 = a10 * a10 + a11 * a11 + a12 * a12
            det_orig, det = _determinants(a00, a01, a02, a10, a11, a12, e00, e11, eps2d)
            e00 = e00 + eps2d  # add_blur
            e11 = e11 + eps2d
            valid = valid & (det > 0)
            det = tl.where(valid, det, 1.0)
            opacity = op
            if AA:
                comp = tl.sqrt(tl.maximum(det_orig / det, 0.0))
                opacity = op * comp
            valid = valid & (opacity >= thr)
            safe = tl.where(valid, opacity, 1.0)
            extent = tl.minimum(tl.sqrt(2.0 * tl.log(safe / thr)), EXTENT)
            rx = tl.ceil(extent * _sqrt_ieee(tl.maximum(e00, 0.0)))
            ry = tl.ceil(extent * _sqrt_ieee(tl.maximum(e11, 0.0)))
            valid = valid & ((rx > 0) | (ry > 0))
            valid = valid & (m2x + rx > 0) & (m2x - rx < W) & (m2y + ry > 0) & (m2y - ry < H)
            rec = cam * N.to(tl.int64) + offs
            tl.store(radii_ptr + rec * 2, tl.where(valid, rx, 0.0).to(tl.int32), mask=live)
            tl.store(radii_ptr + rec * 2 + 1, tl.where(valid, ry, 0.0).to(tl.int32), mask=live)
            tl.store(means2d_ptr + rec * 2, tl.where(valid, m2x, 0.0), mask=live)
            tl.store(means2d_ptr + rec * 2 + 1, tl.where(valid, m2y, 0.0), mask=live)
            tl.store(depths_ptr + rec, tl.where(valid, zc, 0.0), mask=live)
            tl.store(conics_ptr + rec * 3, tl.where(valid, e11 / det, 0.0), mask=live)
            tl.store(conics_ptr + rec * 3 + 1, tl.where(valid, -e01 / det, 0.0), mask=live)
            tl.store(conics_ptr + rec * 3 + 2, tl.where(valid, e00 / det, 0.0), mask=live)
            if AA:
                tl.store(opac_out_ptr + rec, tl.where(valid, opacity, 0.0), mask=live)
            else:
                tl.store(opac_out_ptr + rec, op, mask=live)
            bits = bits | (valid.to(tl.int32) << cam)
        tl.store(bits_ptr + offs, bits, mask=live)
        _write_colors(sh0_ptr, shn_ptr, campos_ptr, colors_ptr, offs, bits != 0, live, bits, mx, my, mz, N, C, KR, DEG)

    @triton.jit
    def _write_colors(sh0_ptr, shn_ptr, campos_ptr, colors_ptr, offs, seen, store, bits, mx, my, mz, N, C, KR,
                      DEG: tl.constexpr):  # fmt: skip
        """The colours of the lanes ``store`` (SH coefficients read for ``seen`` ones) for every
        camera: the expansion where bit c of ``bits`` is set, else 0, plus 0.5, clamped at 0; one
        colour channel at a time (16 coefficients live, not 48)."""
        for ch in tl.static_range(3):
            k0, k1, k2, k3, k4, k5, k6, k7, k8, k9, k10, k11, k12, k13, k14, k15 = _load_coeffs(
                sh0_ptr, shn_ptr, offs, KR, ch, seen, DEG
            )
            for cam in range(C):
                x, y, z = mx, my, mz
                if DEG >= 1:
                    x, y, z, _inv, _full = _unit_dir(mx, my, mz, campos_ptr, cam)
                col = _sh_color(x, y, z, k0, k1, k2, k3, k4, k5, k6, k7, k8, k9, k10, k11, k12, k13, k14, k15, DEG)
                col = tl.where(((bits >> cam) & 1) != 0, col, 0.0) + 0.5
                tl.store(colors_ptr + (cam * N.to(tl.int64) + offs) * 3 + ch, tl.maximum(col, 0.0), mask=store)

    @triton.jit(do_not_specialize=["KR"])
    def _catch_up_kernel(
        sh0_ptr, shn_ptr, m_sh0_ptr, v_sh0_ptr, m_shn_ptr, v_shn_ptr, applied_ptr, count_ptr, tab_ptr, lr_ptr, T1,
        beta1, beta2, eps, rows_ptr, waiting_ptr, KR, ROWS: tl.constexpr, LANES: tl.constexpr,
    ):  # fmt: skip
        """After the forward (--lazy_sh_adam, kernels/lazy_adam.py): the seen Gaussians whose SH
        rows wait for deferred Adam steps (``rows_ptr[:waiting]``, lazy_adam.list_seen's list) are
        caught up to the count, ROWS at a time with LANES lanes along each row
        (lazy_adam.catch_up_listed), and their count recorded; a fixed grid striding over the list.
        :func:`_listed_colors_kernel` then writes their colours again. One program per block of
        Gaussians with the waiting ones masked took 2.6x longer on the city 20 M, one lane per listed
        row longer still, and the colours written from these ROWS-row tiles (one lane per row)
        longer than the catch-up itself (docs/large-scenes.md)."""
        n = tl.load(waiting_ptr)
        t = tl.load(count_ptr)
        for b in range(tl.program_id(0), tl.cdiv(n, ROWS), tl.num_programs(0)):
            i = b * ROWS + tl.arange(0, ROWS)
            stale = i < n  # every listed row waits (list_seen listed those behind the count)
            offs = tl.load(rows_ptr + i, mask=stale, other=0).to(tl.int64)
            catch_up_listed(sh0_ptr, m_sh0_ptr, v_sh0_ptr, shn_ptr, m_shn_ptr, v_shn_ptr, applied_ptr, rows_ptr,
                            b * ROWS, n, t, KR, tab_ptr, T1, lr_ptr, beta1, beta2, eps, ROWS, LANES)  # fmt: skip
            tl.debug_barrier()  # every lane's rows caught up (and their counts read) first
            tl.store(applied_ptr + offs, t + tl.zeros_like(offs).to(tl.int32), mask=stale)

    @unspecialized_jit(["N", "KR"], ("campos_ptr",))
    def _listed_colors_kernel(
        means_ptr, sh0_ptr, shn_ptr, campos_ptr, colors_ptr, bits_ptr, rows_ptr, waiting_ptr, N, C, KR,
        DEG: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        """The colours of the listed Gaussians (``rows_ptr[:waiting]``) for every camera, as the
        forward writes them (:func:`_write_colors`, one lane per Gaussian): after
        :func:`_catch_up_kernel` moved their SH coefficients; a fixed grid striding over the list."""
        n = tl.load(waiting_ptr)
        for b in range(tl.program_id(0), tl.cdiv(n, BLOCK), tl.num_programs(0)):
            i = b * BLOCK + tl.arange(0, BLOCK)
            live = i < n
            offs = tl.load(rows_ptr + i, mask=live, other=0).to(tl.int64)
            bits = tl.load(bits_ptr + offs, mask=live, other=0)
            mx = tl.load(means_ptr + offs * 3, mask=live, other=0.0)
            my = tl.load(means_ptr + offs * 3 + 1, mask=live, other=0.0)
            mz = tl.load(means_ptr + offs * 3 + 2, mask=live, other=0.0)
            _write_colors(sh0_ptr, shn_ptr, campos_ptr, colors_ptr, offs, live, live, bits, mx, my, mz, N, C, KR,
                          DEG)  # fmt: skip

    @triton.jit
    def _cols4(a, b, c, d):
        """[BLOCK, 4] tile of four [BLOCK] vectors, column i the i-th. Built with joins, so each
        lane holds its own row; a store of the tile is one 2D store that Triton converts (through
        shared memory) to a layout with consecutive lanes along a row's contiguous columns."""
        t = tl.join(tl.join(a, c), tl.join(b, d))  # [BLOCK, 2, 2]: [i, k] is column 2 i + k
        return tl.reshape(t, [a.shape[0], 4])

    @triton.jit
    def _cols8(v0, v1, v2, v3, v4, v5, v6, v7):
        """[BLOCK, 8] tile of eight [BLOCK] vectors, column j the j-th (as :func:`_cols4`)."""
        p0, p1, p2, p3 = tl.join(v0, v4), tl.join(v1, v5), tl.join(v2, v6), tl.join(v3, v7)  # [i0]: + 4 i0
        t = tl.join(tl.join(p0, p2), tl.join(p1, p3))  # [i0, i1, i2]: column 4 i0 + 2 i1 + i2
        return tl.reshape(t, [v0.shape[0], 8])

    @triton.jit
    def _adam(p_ptr, m_ptr, v_ptr, idx, mask, g, hyp_ptr, SLOT: tl.constexpr):
        """Adam on the elements ``idx`` (from ``p_ptr``, ``m_ptr``, ``v_ptr``) with gradient ``g``,
        the constants of parameter SLOT read from the device (``hyp_ptr``: [6, 5] float32, row
        SLOT = step size, 1 / sqrt(bias correction 2), beta1, beta2, eps), so a CUDA graph replays
        each step's; the update is kernels/adam.py's ``adam_in_place``."""
        step_size = tl.load(hyp_ptr + SLOT * 5)
        inv_bc2_sqrt = tl.load(hyp_ptr + SLOT * 5 + 1)
        beta1 = tl.load(hyp_ptr + SLOT * 5 + 2)
        beta2 = tl.load(hyp_ptr + SLOT * 5 + 3)
        eps = tl.load(hyp_ptr + SLOT * 5 + 4)
        adam_in_place(p_ptr, m_ptr, v_ptr, idx, mask, g, step_size, inv_bc2_sqrt, beta1, beta2, eps)

    @triton.jit
    def _emit(ptr, m_ptr, v_ptr, idx, mask, act, g, hyp_ptr, SLOT: tl.constexpr, ADAM: tl.constexpr,
              SELECTIVE: tl.constexpr):  # fmt: skip
        """The gradient ``g`` of elements ``idx`` of parameter SLOT: stored into its gradient
        (``ptr``), or with ADAM its Adam step taken in place (``ptr`` the parameter itself; with
        SELECTIVE only for the rows of ``act``, the visible Gaussians)."""
        if ADAM:
            if SELECTIVE:
                mask = mask & act
            _adam(ptr, m_ptr, v_ptr, idx, mask, g, hyp_ptr, SLOT)
        else:
            tl.store(ptr + idx, g, mask=mask)

    @triton.jit
    def _store_rows(ptr, m_ptr, v_ptr, rows, live, act, tile, width: tl.constexpr, hyp_ptr, SLOT: tl.constexpr,
                    ADAM: tl.constexpr, SELECTIVE: tl.constexpr):  # fmt: skip
        """A [BLOCK, 4] tile into rows ``rows`` (int32, from ``ptr``: the block's first row) of a
        contiguous [N, width] array (width <= 4), through :func:`_emit`. The block-relative int32
        offsets keep the tile's addresses at one 32-bit add each."""
        col = tl.arange(0, 4)[None, :]
        idx = rows[:, None] * width + col
        _emit(ptr, m_ptr, v_ptr, idx, live[:, None] & (col < width), act[:, None], tile, hyp_ptr, SLOT, ADAM,
              SELECTIVE)  # fmt: skip

    @triton.jit
    def _store_shn_half(ptr, m_ptr, v_ptr, rows, live, act, KR, J0: tl.constexpr, t0, t1, t2, hyp_ptr,
                        ADAM: tl.constexpr, SELECTIVE: tl.constexpr):  # fmt: skip
        """Channels 0, 1, 2's [BLOCK, 8] tiles (column j: shN coefficient J0 + j) into rows ``rows``
        (from ``ptr``, the block's first row) of shN's [N, KR, 3] gradient, as one [BLOCK, 32]
        store: column 4 j + channel, the fourth skipped (through :func:`_emit`, slot 5)."""
        if ADAM:  # in quarters ([BLOCK, 16] tiles, the tiles' [BLOCK, 4, 2] layout): a [BLOCK, 32] tile with
            # its parameter and moments spills, and a store per channel (180-byte stride) writes partial sectors
            a0, b0 = tl.split(t0)
            a1, b1 = tl.split(t1)
            a2, b2 = tl.split(t2)
            col = tl.arange(0, 16)[None, :]
            c = col % 4
            j = col // 4 + J0
            zq = tl.zeros_like(a0)
            tile = tl.reshape(tl.join(tl.join(a0, a2), tl.join(a1, zq)), [a0.shape[0], 16])
            idx = rows[:, None] * (KR * 3) + (j * 3 + c)
            _emit(ptr, m_ptr, v_ptr, idx, live[:, None] & ((c < 3) & (j < KR)), act[:, None], tile, hyp_ptr, 5, ADAM,
                  SELECTIVE)  # fmt: skip
            tile = tl.reshape(tl.join(tl.join(b0, b2), tl.join(b1, zq)), [a0.shape[0], 16])
            idx = idx + 12  # coefficients 4 on
            _emit(ptr, m_ptr, v_ptr, idx, live[:, None] & ((c < 3) & (j + 4 < KR)), act[:, None], tile, hyp_ptr, 5,
                  ADAM, SELECTIVE)  # fmt: skip
        else:
            tile = tl.reshape(tl.join(tl.join(t0, t2), tl.join(t1, tl.zeros_like(t0))), [t0.shape[0], 32])
            col = tl.arange(0, 32)[None, :]
            j = col // 4 + J0
            c = col % 4
            idx = rows[:, None] * (KR * 3) + (j * 3 + c)
            tl.store(ptr + idx, tile, mask=live[:, None] & ((c < 3) & (j < KR)))

    @triton.jit
    def _store_shn(ptr, m_ptr, v_ptr, rows, live, act, KR, lo0, lo1, lo2, hi0, hi1, hi2, hyp_ptr,
                   ADAM: tl.constexpr, SELECTIVE: tl.constexpr):  # fmt: skip
        """shN's gradient from the channels' tiles of coefficients 0-7 (``lo``) and 8-15 (``hi``),
        in two halves (one [BLOCK, 64] tile costs 40 more registers); the bases beyond 16 are
        :func:`_store_shn_tail`'s."""
        _store_shn_half(ptr, m_ptr, v_ptr, rows, live, act, KR, 0, lo0, lo1, lo2, hyp_ptr, ADAM, SELECTIVE)
        _store_shn_half(ptr, m_ptr, v_ptr, rows, live, act, KR, 8, hi0, hi1, hi2, hyp_ptr, ADAM, SELECTIVE)

    @triton.jit
    def _store_shn_tail(ptr, rows, live, KR):
        """Zeros for shN's stored bases beyond 16 (KR = 24), rows ``rows`` from ``ptr``. Called
        first: a loop after the tiles' stores costs them 40 registers."""
        zero = tl.zeros_like(rows).to(tl.float32)
        for k in range(48, KR * 3):
            tl.store(ptr + (rows * (KR * 3) + k), zero, mask=live)

    @triton.jit
    def _store_sh_zeros(v_sh0_ptr, m1_sh0_ptr, m2_sh0_ptr, v_shn_ptr, m1_shn_ptr, m2_shn_ptr, start, rows, live, act,
                        zero, KR, hyp_ptr, ADAM: tl.constexpr, SELECTIVE: tl.constexpr):  # fmt: skip
        """Zero gradients of sh0 and of shN's bases up to 16 for rows ``rows`` (``live``) of the block
        starting at row ``start`` (``zero``: a [BLOCK] vector of the parameters' dtype), through
        :func:`_store_rows` and :func:`_store_shn` (with ADAM: zero-gradient Adam steps)."""
        _store_rows(v_sh0_ptr + start * 3, m1_sh0_ptr + start * 3, m2_sh0_ptr + start * 3, rows, live, act,
                    _cols4(zero, zero, zero, zero), 3, hyp_ptr, 4, ADAM, SELECTIVE)  # fmt: skip
        if ADAM:  # the quarters' layout (_sh_backward's QUARTERS)
            t0 = tl.zeros([zero.shape[0], 4, 2], dtype=zero.dtype)
        else:
            t0 = tl.zeros([zero.shape[0], 8], dtype=zero.dtype)
        _store_shn(v_shn_ptr + start * (KR * 3), m1_shn_ptr + start * (KR * 3), m2_shn_ptr + start * (KR * 3),
                   rows, live, act, KR, t0, t0, t0, t0, t0, t0, hyp_ptr, ADAM, SELECTIVE)  # fmt: skip

    @triton.jit
    def _sh_backward(mx, my, mz, act, bits, offs, sh0_ptr, shn_ptr, campos_ptr, v_colors_ptr, N, C, KR, ch,
                     DEG: tl.constexpr, QUARTERS: tl.constexpr):  # fmt: skip
        """Colour channel ``ch``: the gradient of its sh0 coefficient, two [BLOCK, 8] tiles whose
        column j is the gradient of its shN coefficient j, then j + 8 (0 beyond DEG), then the
        gradient of the mean through the view directions, summed over the cameras. QUARTERS: each
        of the two tiles as two [BLOCK, 4] tiles joined ([BLOCK, 4, 2], coefficient 4 h + j at
        [:, j, h]), which :func:`_store_shn_half` stores a quarter at a time."""
        k0, k1, k2, k3, k4, k5, k6, k7, k8, k9, k10, k11, k12, k13, k14, k15 = _load_coeffs(
            sh0_ptr, shn_ptr, offs, KR, ch, act, DEG
        )
        zero = tl.zeros_like(mx)
        a0, a1, a2, a3, a4, a5, a6, a7 = zero, zero, zero, zero, zero, zero, zero, zero
        a8, a9, a10, a11, a12, a13, a14, a15 = zero, zero, zero, zero, zero, zero, zero, zero
        vx, vy, vz = zero, zero, zero
        for cam in range(C):
            vis = act & (((bits >> cam) & 1) != 0)
            g = tl.load(v_colors_ptr + (cam * N.to(tl.int64) + offs) * 3 + ch, mask=vis, other=0.0)
            x, y, z, inv, full = mx, my, mz, zero, vis
            if DEG >= 1:
                x, y, z, inv, full = _unit_dir(mx, my, mz, campos_ptr, cam)
            col = _sh_color(x, y, z, k0, k1, k2, k3, k4, k5, k6, k7, k8, k9, k10, k11, k12, k13, k14, k15, DEG)
            g = tl.where(vis & (col + 0.5 >= 0.0), g, 0.0)  # clamp_min(colour + 0.5, 0)'s gradient
            a0 += SH_C0 * g
            if DEG >= 1:
                b1, b2, b3 = _band1(x, y, z)
                a1 += b1 * g
                a2 += b2 * g
                a3 += b3 * g
            if DEG >= 2:
                b4, b5, b6, b7, b8 = _band2(x, y, z)
                a4 += b4 * g
                a5 += b5 * g
                a6 += b6 * g
                a7 += b7 * g
                a8 += b8 * g
            if DEG >= 3:
                b9, b10, b11, b12, b13, b14, b15 = _band3(x, y, z)
                a9 += b9 * g
                a10 += b10 * g
                a11 += b11 * g
                a12 += b12 * g
                a13 += b13 * g
                a14 += b14 * g
                a15 += b15 * g
            if DEG >= 1:  # through the normalization of d = mean - campos
                gx, gy, gz = _sh_dir_grad(x, y, z, k1, k2, k3, k4, k5, k6, k7, k8, k9, k10, k11, k12, k13, k14, k15,
                                          DEG)  # fmt: skip
                gx, gy, gz = gx * g, gy * g, gz * g
                dot = tl.where(full, gx * x + gy * y + gz * z, 0.0)
                vx += (gx - dot * x) * inv
                vy += (gy - dot * y) * inv
                vz += (gz - dot * z) * inv
        if QUARTERS:
            lo = tl.join(_cols4(a1, a2, a3, a4), _cols4(a5, a6, a7, a8))
            hi = tl.join(_cols4(a9, a10, a11, a12), _cols4(a13, a14, a15, zero))
        else:
            lo = _cols8(a1, a2, a3, a4, a5, a6, a7, a8)
            hi = _cols8(a9, a10, a11, a12, a13, a14, a15, zero)
        return a0, lo, hi, vx, vy, vz

    @triton.jit
    def _backward_rows(
        ptrs, start, rows, offs, live, act, sh_live, bits, N, C, KR, W, H, eps2d,
        DEG: tl.constexpr, AA: tl.constexpr, HAS_MEANS2D: tl.constexpr, HAS_DEPTHS: tl.constexpr,
        HAS_CONICS: tl.constexpr, HAS_OPAC: tl.constexpr, HAS_COLORS: tl.constexpr, ADAM: tl.constexpr,
        SELECTIVE: tl.constexpr,
    ):  # fmt: skip
        """The backward of the block of Gaussians ``offs`` = ``start`` + ``rows`` (``live``; ``act``:
        those some camera sees, their visibility ``bits``): every parameter's gradient (or Adam step)
        stored at the int32 offsets ``rows`` from row ``start``, the SH ones for ``sh_live``;
        ``ptrs``: :func:`_backward_kernel`'s 33 pointers, from means_ptr to hyp_ptr, in its order."""
        (means_ptr, quats_ptr, scales_ptr, opac_ptr, sh0_ptr, shn_ptr, vm_ptr, ks_ptr, campos_ptr,
         v_means2d_ptr, v_depths_ptr, v_conics_ptr, v_opac_ptr, v_colors_ptr,
         v_means_ptr, v_quats_ptr, v_scales_ptr, v_logits_ptr, v_sh0_ptr, v_shn_ptr,
         m1_means_ptr, m1_quats_ptr, m1_scales_ptr, m1_logits_ptr, m1_sh0_ptr, m1_shn_ptr,
         m2_means_ptr, m2_quats_ptr, m2_scales_ptr, m2_logits_ptr, m2_sh0_ptr, m2_shn_ptr, hyp_ptr) = ptrs  # fmt: skip
        mx, my, mz, s0, s1, s2, op = _activated_geometry(means_ptr, scales_ptr, opac_ptr, offs, act)
        qw = tl.load(quats_ptr + offs * 4, mask=act, other=1.0)
        qx = tl.load(quats_ptr + offs * 4 + 1, mask=act, other=0.0)
        qy = tl.load(quats_ptr + offs * 4 + 2, mask=act, other=0.0)
        qz = tl.load(quats_ptr + offs * 4 + 3, mask=act, other=0.0)
        q00, q01, q02, q10, q11, q12, q20, q21, q22, w, x, y, z, inv = _rotation(qw, qx, qy, qz)
        m00, m01, m02 = q00 * s0, q01 * s1, q02 * s2
        m10, m11, m12 = q10 * s0, q11 * s1, q12 * s2
        m20, m21, m22 = q20 * s0, q21 * s1, q22 * s2
        zero = tl.zeros_like(mx)
        vmx, vmy, vmz, vsig = zero, zero, zero, zero
        g00, g01, g02, g10, g11, g12, g20, g21, g22 = zero, zero, zero, zero, zero, zero, zero, zero, zero  # dL/dM
        for cam in range(C):
            vis = act & (((bits >> cam) & 1) != 0)
            r00, r01, r02, t0, r10, r11, r12, t1, r20, r21, r22, t2, fx, cx, fy, cy = _camera(vm_ptr, ks_ptr, cam)
            xc = r00 * mx + r01 * my + r02 * mz + t0
            yc = r10 * mx + r11 * my + r12 * mz + t1
            zc = r20 * mx + r21 * my + r22 * mz + t2
            zs = tl.where(vis, zc, 1.0)
            rz, j00, j02, j11, j12, tx, ty, xin, yin, m2x, m2y = _jacobian(xc, yc, zs, fx, cx, fy, cy, W, H)
            b00 = r00 * m00 + r01 * m10 + r02 * m20  # B = Rv M
            b01 = r00 * m01 + r01 * m11 + r02 * m21
            b02 = r00 * m02 + r01 * m12 + r02 * m22
            b10 = r10 * m00 + r11 * m10 + r12 * m20
            b11 = r10 * m01 + r11 * m11 + r12 * m21
            b12 = r10 * m02 + r11 * m12 + r12 * m22
            b20 = r20 * m00 + r21 * m10 + r22 * m20
            b21 = r20 * m01 + r21 * m11 + r22 * m21
            b22 = r20 * m02 + r21 * m12 + r22 * m22
            a00, a01, a02 = j00 * b00 + j02 * b20, j00 * b01 + j02 * b21, j00 * b02 + j02 * b22  # A = J B
            a10, a11, a12 = j11 * b10 + j12 * b20, j11 * b11 + j12 * b21, j11 * b12 + j12 * b22
            e00 = a00 * a00 + a01 * a01 + a02 * a02
            e01 = a00 * a10 + a01 * a11 + a02 * a12
            e11 = a10 * a10 + a11 * a11 + a12 * a12
            f00 = e00 + eps2d
            f11 = e11 + eps2d
            det_orig, det = _determinants(a00, a01, a02, a10, a11, a12, e00, e11, eps2d)
            det = tl.where(vis, det, 1.0)
            ca = f11 / det
            cb = -e01 / det
            cc = f00 / det
            rec = cam * N.to(tl.int64) + offs
            gx, gy, gd, ga, gb, gc, go = zero, zero, zero, zero, zero, zero, zero
            if HAS_MEANS2D:
                gx = tl.load(v_means2d_ptr + rec * 2, mask=vis, other=0.0)
                gy = tl.load(v_means2d_ptr + rec * 2 + 1, mask=vis, other=0.0)
            if HAS_DEPTHS:
                gd = tl.load(v_depths_ptr + rec, mask=vis, other=0.0)
            if HAS_CONICS:
                ga = tl.load(v_conics_ptr + rec * 3, mask=vis, other=0.0)
                gb = tl.load(v_conics_ptr + rec * 3 + 1, mask=vis, other=0.0)
                gc = tl.load(v_conics_ptr + rec * 3 + 2, mask=vis, other=0.0)
            if HAS_OPAC:
                go = tl.load(v_opac_ptr + rec, mask=vis, other=0.0)
            # conic = inverse(cov2d): dL/dcov2d = -P V P (inverse_vjp), V the symmetric conic gradient
            hb = 0.5 * gb
            p00 = ca * ga + cb * hb
            p01 = ca * hb + cb * gc
            p10 = cb * ga + cc * hb
            p11 = cb * hb + cc * gc
            h00 = -(p00 * ca + p01 * cb)
            h01 = -(p00 * cb + p01 * cc)
            h11 = -(p10 * cb + p11 * cc)
            if AA:  # opacity x compensation, compensation = sqrt(max(0, det_orig / det))
                ratio_raw = det_orig / det
                ratio = tl.maximum(ratio_raw, 0.0)
                comp = tl.sqrt(ratio)
                vsig += go * comp
                dr = tl.where(ratio_raw >= 0.0, go * op * 0.5 / (comp + 1e-6), 0.0) / det
                h00 += dr * (e11 - ratio * f11)
                h11 += dr * (e00 - ratio * f00)
                h01 -= dr * e01 * (1.0 - ratio)
            else:
                vsig += go
            # cov2d = A A^T
            u00, u01, u02 = (
                2.0 * (h00 * a00 + h01 * a10),
                2.0 * (h00 * a01 + h01 * a11),
                2.0 * (h00 * a02 + h01 * a12),
            )
            u10, u11, u12 = (
                2.0 * (h01 * a00 + h11 * a10),
                2.0 * (h01 * a01 + h11 * a11),
                2.0 * (h01 * a02 + h11 * a12),
            )
            vj00 = u00 * b00 + u01 * b01 + u02 * b02
            vj02 = u00 * b20 + u01 * b21 + u02 * b22
            vj11 = u10 * b10 + u11 * b11 + u12 * b12
            vj12 = u10 * b20 + u11 * b21 + u12 * b22
            # persp_proj_vjp: J and means2d -> camera-space mean
            rz2 = rz * rz
            rz3 = rz2 * rz
            vxc = gx * fx * rz + tl.where(xin, -fx * rz2 * vj02, 0.0)
            vyc = gy * fy * rz + tl.where(yin, -fy * rz2 * vj12, 0.0)
            vzc = (
                gd
                - (fx * xc * gx + fy * yc * gy) * rz2
                - fx * rz2 * vj00
                - fy * rz2 * vj11
                + fx * tx * rz3 * vj02 * tl.where(xin, 2.0, 1.0)
                + fy * ty * rz3 * vj12 * tl.where(yin, 2.0, 1.0)
            )
            vmx += r00 * vxc + r10 * vyc + r20 * vzc
            vmy += r01 * vxc + r11 * vyc + r21 * vzc
            vmz += r02 * vxc + r12 * vyc + r22 * vzc
            # B = Rv M, rows of dL/dB: (u0 J00), (u1 J11), (u0 J02 + u1 J12)
            w0, w1, w2 = u00 * j00, u01 * j00, u02 * j00
            y0, y1, y2 = u10 * j11, u11 * j11, u12 * j11
            z0, z1, z2 = u00 * j02 + u10 * j12, u01 * j02 + u11 * j12, u02 * j02 + u12 * j12
            g00 += r00 * w0 + r10 * y0 + r20 * z0
            g01 += r00 * w1 + r10 * y1 + r20 * z1
            g02 += r00 * w2 + r10 * y2 + r20 * z2
            g10 += r01 * w0 + r11 * y0 + r21 * z0
            g11 += r01 * w1 + r11 * y1 + r21 * z1
            g12 += r01 * w2 + r11 * y2 + r21 * z2
            g20 += r02 * w0 + r12 * y0 + r22 * z0
            g21 += r02 * w1 + r12 * y1 + r22 * z1
            g22 += r02 * w2 + r12 * y2 + r22 * z2
        # M = R S: dL/dS_j = sum_i dL/dM_ij R_ij, dL/dR_ij = dL/dM_ij S_j; log-scales through exp
        q00, q01, q02, q10, q11, q12, q20, q21, q22, w, x, y, z, inv = _rotation(qw, qx, qy, qz)  # fewer live values
        vs0 = (g00 * q00 + g10 * q10 + g20 * q20) * s0
        vs1 = (g01 * q01 + g11 * q11 + g21 * q21) * s1
        vs2 = (g02 * q02 + g12 * q12 + g22 * q22) * s2
        e00, e01, e02 = g00 * s0, g01 * s1, g02 * s2  # dL/dR
        e10, e11, e12 = g10 * s0, g11 * s1, g12 * s2
        e20, e21, e22 = g20 * s0, g21 * s1, g22 * s2
        vw = 2.0 * (z * (e10 - e01) + y * (e02 - e20) + x * (e21 - e12))
        vx = 2.0 * (y * (e01 + e10) + z * (e02 + e20) + w * (e21 - e12) - 2.0 * x * (e11 + e22))
        vy = 2.0 * (x * (e01 + e10) + z * (e12 + e21) + w * (e02 - e20) - 2.0 * y * (e00 + e22))
        vz = 2.0 * (x * (e02 + e20) + y * (e12 + e21) + w * (e10 - e01) - 2.0 * z * (e00 + e11))
        dot = vw * w + vx * x + vy * y + vz * z  # through the normalization of the quaternion
        vw = tl.where(act, (vw - dot * w) * inv, 0.0)
        vx = tl.where(act, (vx - dot * x) * inv, 0.0)
        vy = tl.where(act, (vy - dot * y) * inv, 0.0)
        vz = tl.where(act, (vz - dot * z) * inv, 0.0)
        _store_rows(v_quats_ptr + start * 4, m1_quats_ptr + start * 4, m2_quats_ptr + start * 4, rows, live, act,
                    _cols4(vw, vx, vy, vz), 4, hyp_ptr, 1, ADAM, SELECTIVE)  # fmt: skip
        vs0, vs1, vs2 = tl.where(act, vs0, 0.0), tl.where(act, vs1, 0.0), tl.where(act, vs2, 0.0)
        _store_rows(v_scales_ptr + start * 3, m1_scales_ptr + start * 3, m2_scales_ptr + start * 3, rows, live, act,
                    _cols4(vs0, vs1, vs2, zero), 3, hyp_ptr, 2, ADAM, SELECTIVE)  # fmt: skip
        _emit(v_logits_ptr, m1_logits_ptr, m2_logits_ptr, offs, live, act, tl.where(act, vsig * op * (1.0 - op), 0.0),
              hyp_ptr, 3, ADAM, SELECTIVE)  # fmt: skip
        # the SH after the rest: the geometry's values are no longer live
        if HAS_COLORS:
            c0, lo0, hi0, dx, dy, dz = _sh_backward(mx, my, mz, act, bits, offs, sh0_ptr, shn_ptr, campos_ptr,
                                                            v_colors_ptr, N, C, KR, 0, DEG, ADAM)  # fmt: skip
            vmx, vmy, vmz = vmx + dx, vmy + dy, vmz + dz
            c1, lo1, hi1, dx, dy, dz = _sh_backward(mx, my, mz, act, bits, offs, sh0_ptr, shn_ptr, campos_ptr,
                                                            v_colors_ptr, N, C, KR, 1, DEG, ADAM)  # fmt: skip
            vmx, vmy, vmz = vmx + dx, vmy + dy, vmz + dz
            c2, lo2, hi2, dx, dy, dz = _sh_backward(mx, my, mz, act, bits, offs, sh0_ptr, shn_ptr, campos_ptr,
                                                            v_colors_ptr, N, C, KR, 2, DEG, ADAM)  # fmt: skip
            vmx, vmy, vmz = vmx + dx, vmy + dy, vmz + dz
            _store_rows(v_sh0_ptr + start * 3, m1_sh0_ptr + start * 3, m2_sh0_ptr + start * 3, rows, sh_live, act,
                        _cols4(c0, c1, c2, zero), 3, hyp_ptr, 4, ADAM, SELECTIVE)  # fmt: skip
            _store_shn(v_shn_ptr + start * (KR * 3), m1_shn_ptr + start * (KR * 3), m2_shn_ptr + start * (KR * 3),
                       rows, sh_live, act, KR, lo0, lo1, lo2, hi0, hi1, hi2, hyp_ptr, ADAM, SELECTIVE)  # fmt: skip
        else:
            _store_sh_zeros(v_sh0_ptr, m1_sh0_ptr, m2_sh0_ptr, v_shn_ptr, m1_shn_ptr, m2_shn_ptr, start, rows,
                            sh_live, act, zero, KR, hyp_ptr, ADAM, SELECTIVE)  # fmt: skip
        vmx, vmy, vmz = tl.where(act, vmx, 0.0), tl.where(act, vmy, 0.0), tl.where(act, vmz, 0.0)
        _store_rows(v_means_ptr + start * 3, m1_means_ptr + start * 3, m2_means_ptr + start * 3, rows, live, act,
                    _cols4(vmx, vmy, vmz, zero), 3, hyp_ptr, 0, ADAM, SELECTIVE)  # fmt: skip

    @triton.jit
    def _zero_rows(ptrs, start, rows, offs, live, sh_live, KR, dtype: tl.constexpr, BLOCK: tl.constexpr):
        """Zero gradients for the rows ``live`` of a block (``rows`` from row ``start``; ``offs`` =
        start + rows), those of sh0 and of shN's bases up to 16 for ``sh_live``: the backward of
        Gaussians no camera sees, without its math (``ptrs`` as :func:`_backward_rows`'s; never with
        Adam in the backward, which the deferral excludes)."""
        (_, _, _, _, _, _, _, _, _, _, _, _, _, _,
         v_means_ptr, v_quats_ptr, v_scales_ptr, v_logits_ptr, v_sh0_ptr, v_shn_ptr,
         _, _, _, _, _, _, _, _, _, _, _, _, _) = ptrs  # fmt: skip
        zero = tl.zeros([BLOCK], dtype=dtype)
        tile = _cols4(zero, zero, zero, zero)
        no = live & False  # the Adam's row mask: unused without Adam
        _store_rows(v_quats_ptr + start * 4, v_quats_ptr, v_quats_ptr, rows, live, no, tile, 4, v_quats_ptr, 1,
                    False, False)  # fmt: skip
        _store_rows(v_scales_ptr + start * 3, v_scales_ptr, v_scales_ptr, rows, live, no, tile, 3, v_scales_ptr, 2,
                    False, False)  # fmt: skip
        tl.store(v_logits_ptr + offs, zero, mask=live)
        _store_sh_zeros(v_sh0_ptr, v_sh0_ptr, v_sh0_ptr, v_shn_ptr, v_shn_ptr, v_shn_ptr, start, rows, sh_live, no,
                        zero, KR, v_sh0_ptr, False, False)  # fmt: skip
        _store_rows(v_means_ptr + start * 3, v_means_ptr, v_means_ptr, rows, live, no, tile, 3, v_means_ptr, 0,
                    False, False)  # fmt: skip

    @unspecialized_jit(["N", "KR"], VARYING_POINTERS + VARYING_GRADIENT_POINTERS)
    def _backward_kernel(
        means_ptr, quats_ptr, scales_ptr, opac_ptr, sh0_ptr, shn_ptr, vm_ptr, ks_ptr, campos_ptr, bits_ptr,
        v_means2d_ptr, v_depths_ptr, v_conics_ptr, v_opac_ptr, v_colors_ptr,
        v_means_ptr, v_quats_ptr, v_scales_ptr, v_logits_ptr, v_sh0_ptr, v_shn_ptr,
        m1_means_ptr, m1_quats_ptr, m1_scales_ptr, m1_logits_ptr, m1_sh0_ptr, m1_shn_ptr,
        m2_means_ptr, m2_quats_ptr, m2_scales_ptr, m2_logits_ptr, m2_sh0_ptr, m2_shn_ptr, hyp_ptr, list_ptr,
        count_ptr, N, C, KR, W, H, eps2d,
        DEG: tl.constexpr, AA: tl.constexpr, BLOCK: tl.constexpr,
        HAS_MEANS2D: tl.constexpr, HAS_DEPTHS: tl.constexpr, HAS_CONICS: tl.constexpr, HAS_OPAC: tl.constexpr,
        HAS_COLORS: tl.constexpr, ADAM: tl.constexpr = False, SELECTIVE: tl.constexpr = False,
        SEEN_SH: tl.constexpr = False, LISTED: tl.constexpr = False,
    ):  # fmt: skip
        """One program per block of BLOCK Gaussians. With SEEN_SH (--lazy_sh_adam, the large scenes
        whose cameras may see few of them) and without LISTED a block none of whose Gaussians is
        seen stores its zero gradients without the math; without SEEN_SH that early exit is not
        compiled in (it took the kernel from 128 to 255 registers for sm_90, 166 with SEEN_SH).
        LISTED (with SEEN_SH; the unseen Gaussians' geometric gradient rows zeroed before the launch
        or left unwritten, as backward_into decides): one program per block of BLOCK entries of the
        forward's list of the seen Gaussians (``list_ptr[:count]``), a fixed
        grid striding over them (a program per block of the shard, most of them idle past the
        list's end, costs a launch per program); a list of every Gaussian runs the blockwise form
        instead (its rows' int32 offsets within a block, where the list's int64 row indices cost a
        third more time at 20 M Gaussians)."""
        ptrs = (means_ptr, quats_ptr, scales_ptr, opac_ptr, sh0_ptr, shn_ptr, vm_ptr, ks_ptr, campos_ptr,
                v_means2d_ptr, v_depths_ptr, v_conics_ptr, v_opac_ptr, v_colors_ptr,
                v_means_ptr, v_quats_ptr, v_scales_ptr, v_logits_ptr, v_sh0_ptr, v_shn_ptr,
                m1_means_ptr, m1_quats_ptr, m1_scales_ptr, m1_logits_ptr, m1_sh0_ptr, m1_shn_ptr,
                m2_means_ptr, m2_quats_ptr, m2_scales_ptr, m2_logits_ptr, m2_sh0_ptr, m2_shn_ptr, hyp_ptr)  # fmt: skip
        if LISTED:  # a fixed grid striding over the blocks: idle programs cost a launch each
            n = tl.load(count_ptr)
            if n == N:  # every Gaussian seen: no block is empty
                for b in range(tl.program_id(0), tl.cdiv(N, BLOCK), tl.num_programs(0)):
                    _backward_block(ptrs, bits_ptr, b, N, C, KR, W, H, eps2d, DEG, AA, BLOCK, HAS_MEANS2D,
                                    HAS_DEPTHS, HAS_CONICS, HAS_OPAC, HAS_COLORS, ADAM, SELECTIVE, SEEN_SH,
                                    False)  # fmt: skip
            else:
                for b in range(tl.program_id(0), tl.cdiv(n, BLOCK), tl.num_programs(0)):
                    i = (tl.full([], 0, tl.int64) + b) * BLOCK + tl.arange(0, BLOCK)
                    live = i < n
                    offs = tl.load(list_ptr + i, mask=live, other=0).to(tl.int64)
                    bits = tl.load(bits_ptr + offs, mask=live, other=0)
                    act = live & (bits != 0)  # every listed Gaussian (list_seen lists the set bits)
                    _store_shn_tail(v_shn_ptr, offs, act, KR)
                    # rows: the listed Gaussians' int64 indices from row 0
                    _backward_rows(
                        ptrs, 0, offs, offs, act, act, act, bits, N, C, KR, W, H, eps2d,
                        DEG, AA, HAS_MEANS2D, HAS_DEPTHS, HAS_CONICS, HAS_OPAC, HAS_COLORS, ADAM, SELECTIVE,
                    )  # fmt: skip
        else:
            _backward_block(ptrs, bits_ptr, tl.program_id(0), N, C, KR, W, H, eps2d, DEG, AA, BLOCK, HAS_MEANS2D,
                            HAS_DEPTHS, HAS_CONICS, HAS_OPAC, HAS_COLORS, ADAM, SELECTIVE, SEEN_SH,
                            SEEN_SH)  # fmt: skip

    @triton.jit
    def _backward_block(
        ptrs, bits_ptr, block, N, C, KR, W, H, eps2d, DEG: tl.constexpr, AA: tl.constexpr, BLOCK: tl.constexpr,
        HAS_MEANS2D: tl.constexpr, HAS_DEPTHS: tl.constexpr, HAS_CONICS: tl.constexpr, HAS_OPAC: tl.constexpr,
        HAS_COLORS: tl.constexpr, ADAM: tl.constexpr, SELECTIVE: tl.constexpr, SEEN_SH: tl.constexpr,
        EXIT: tl.constexpr,
    ):  # fmt: skip
        """Block ``block`` of BLOCK Gaussians (``ptrs`` as :func:`_backward_rows`'s), addressed
        from the block's first row with int32 offsets; SEEN_SH: the SH gradient rows of unseen
        Gaussians unwritten; EXIT: a block none of whose Gaussians is seen stores its zeros without
        the math."""
        v_shn_ptr = ptrs[19]
        start = (tl.full([], 0, tl.int64) + block) * BLOCK  # the tiles' addresses: the block's row + int32 offsets
        rows = tl.arange(0, BLOCK)
        offs = start + rows
        live = offs < N
        if not ADAM:  # with ADAM the host allows no bases beyond 16 (Adam would have to step them too)
            _store_shn_tail(v_shn_ptr + start * (KR * 3), rows, live, KR)
        bits = tl.load(bits_ptr + offs, mask=live, other=0)
        act = live & (bits != 0)
        sh_live = act if SEEN_SH else live  # --lazy_sh_adam: the SH gradient rows of unseen Gaussians unwritten
        # with EXIT a block none of whose Gaussians is seen skips the math; without it no such test
        empty = tl.max(act.to(tl.int32), 0) == 0 if EXIT else False
        if empty:
            _zero_rows(ptrs, start, rows, offs, live, sh_live, KR, ptrs[0].dtype.element_ty, BLOCK)
        else:
            _backward_rows(
                ptrs, start, rows, offs, live, act, sh_live, bits, N, C, KR, W, H, eps2d,
                DEG, AA, HAS_MEANS2D, HAS_DEPTHS, HAS_CONICS, HAS_OPAC, HAS_COLORS, ADAM, SELECTIVE,
            )  # fmt: skip


def kernel_specs() -> dict:
    """This module's kernels at the configuration :func:`project_and_shade_fused` launches for
    SH degree 3 (the format of kernels/registry.py)."""
    fwd_ints = {"radii_ptr": "*i32", "bits_ptr": "*i32"}
    floats = {n: "fp32" for n in ("near", "far", "eps2d")}
    bwd_flags = dict(HAS_MEANS2D=True, HAS_DEPTHS=False, HAS_CONICS=True, HAS_OPAC=True, HAS_COLORS=True)
    fwd = dict(DEG=3, BLOCK=BLOCK, SLACK=CULL_SLACK)
    # every constexpr given (one left out compiles as an int argument: its branches both built)
    bwd = dict(DEG=3, BLOCK=BLOCK, ADAM=False, SELECTIVE=False, SEEN_SH=False, LISTED=False, **bwd_flags)
    bwd_ints = {"bits_ptr": "*i32", "list_ptr": "*i32", "count_ptr": "*i32"}
    return {
        "projection_forward": (_forward_kernel, dict(fwd, AA=False), fwd_ints, floats, NUM_WARPS),
        "projection_forward_aa": (_forward_kernel, dict(fwd, AA=True), fwd_ints, floats, NUM_WARPS),
        # --lazy_sh_adam: the seen rows' deferred SH Adam steps caught up, then their colours again
        "projection_catch_up": (
            _catch_up_kernel,
            dict(ROWS=CATCH_UP_LANES // 64, LANES=64),
            dict(
                applied_ptr="*i32",
                count_ptr="*i32",
                tab_ptr="*fp64",
                lr_ptr="*fp64",
                rows_ptr="*i32",
                waiting_ptr="*i32",
            ),
            dict(beta1="fp32", beta2="fp32", eps="fp32"),
            CATCH_UP_WARPS,
        ),
        "projection_listed_colors": (
            _listed_colors_kernel,
            dict(DEG=3, BLOCK=BLOCK),
            dict(bits_ptr="*i32", rows_ptr="*i32", waiting_ptr="*i32"),
            {},
            NUM_WARPS,
        ),
        "projection_backward": (_backward_kernel, dict(bwd, AA=False), bwd_ints, floats, NUM_WARPS),
        "projection_backward_aa": (_backward_kernel, dict(bwd, AA=True), bwd_ints, floats, NUM_WARPS),
        # --lazy_sh_adam: the math over the forward's list of seen Gaussians (blockwise where it lists all)
        "projection_backward_lazy": (
            _backward_kernel,
            dict(bwd, AA=False, SEEN_SH=True, LISTED=True),
            bwd_ints,
            floats,
            NUM_WARPS,
        ),
        # --fused_adam: the backward takes the Adam step (selective: --visible_adam)
        "projection_backward_adam": (
            _backward_kernel,
            dict(bwd, AA=False, ADAM=True),
            bwd_ints,
            floats,
            NUM_WARPS,
        ),
        "projection_backward_adam_selective": (
            _backward_kernel,
            dict(bwd, AA=False, ADAM=True, SELECTIVE=True),
            bwd_ints,
            floats,
            NUM_WARPS,
        ),
    }


# ------------------------------------------------------------------------------------------------
# Host side
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Setup:
    """What a pass fixes besides the tensors: image size (pixels), SH degree, near/far planes
    (scene units), antialiased compensation."""

    width: int
    height: int
    sh_degree: int
    near: float
    far: float
    antialiased: bool


def unsupported(
    params: Mapping[str, Tensor], viewmats: Tensor, Ks: Tensor, campos: Tensor, sh_degree: int, camera_model: str
) -> Optional[str]:
    """Why :func:`project_and_shade_fused` cannot run this pass (None when it can): the caller
    then takes the activated + render.project_and_shade path."""
    if triton is None:
        return "Triton is not installed"
    if camera_model != "pinhole":
        return f"camera_model {camera_model!r}: the fused projection is pinhole only"
    if any(t.requires_grad for t in (viewmats, Ks, campos)):
        return "viewmats / Ks / campos require a gradient (--pose_opt): the fused backward has none for cameras"
    if not 0 <= sh_degree <= MAX_SH_DEGREE:
        return f"sh_degree {sh_degree}: the fused projection evaluates degrees 0..{MAX_SH_DEGREE}"
    C = viewmats.shape[0]
    if not 1 <= C <= MAX_CAMERAS:
        return f"{C} cameras: the fused projection takes 1..{MAX_CAMERAS}"
    tensors = [params[k] for k in PARAM_KEYS] + [viewmats, Ks, campos]
    if any(t.dtype != torch.float32 for t in tensors):
        return "the fused projection is float32 only"
    device = params["means"].device
    if device.type != "cuda" and not _INTERPRETED:
        return f"tensors on {device}: the fused projection needs a CUDA/ROCm device (or TRITON_INTERPRET=1)"
    return None


def _check(params: Mapping[str, Tensor], viewmats: Tensor, Ks: Tensor, campos: Tensor, sh_degree: int) -> None:
    N = params["means"].shape[0]
    K = params["sh0"].shape[1] + params["shN"].shape[1] if params["shN"].dim() == 3 else -1
    shapes = dict(means=(N, 3), quats=(N, 4), scales=(N, 3), opacities=(N,), sh0=(N, 1, 3), shN=(N, K - 1, 3))
    for k, shape in shapes.items():
        if tuple(params[k].shape) != shape:
            raise ValueError(f"project_and_shade_fused: {k} must be {shape}, got {tuple(params[k].shape)}")
    C = viewmats.shape[0]
    for name, t, shape in (("viewmats", viewmats, (C, 4, 4)), ("Ks", Ks, (C, 3, 3)), ("campos", campos, (C, 3))):
        if tuple(t.shape) != shape:
            raise ValueError(f"project_and_shade_fused: {name} must be {shape}, got {tuple(t.shape)}")
    if (sh_degree + 1) ** 2 > K:
        raise ValueError(f"project_and_shade_fused: SH degree {sh_degree} needs {(sh_degree + 1) ** 2} bases, K={K}")


def _prewarm_degrees(kernel, args: list, consts: dict, sh_degree: int, params: Mapping[str, Tensor]) -> None:
    """kernels/prewarm.py: the same launch at the SH degrees above ``sh_degree`` that the stored
    bases allow (a run raises its degree as it trains), compiled in the background; a launch at a
    degree queued before waits for its compilation."""
    top = min(MAX_SH_DEGREE, math.isqrt(params["shN"].shape[1] + 1) - 1)
    prewarm.settle(kernel, args, consts, "DEG", sh_degree)
    prewarm.ahead(kernel, args, consts, "DEG", range(sh_degree + 1, top + 1), params["means"].device)


def forward_into(
    params: Mapping[str, Tensor], viewmats, Ks, campos, setup: Setup, out: dict, lazy: "Optional[LazyRows]" = None
) -> None:
    """Launch the forward kernel, writing every element of ``out`` (:data:`OUTPUT_KEYS` as
    :func:`project_and_shade_fused` returns them, and "bits", int32 [N]). Contiguous float32
    tensors on one device. ``lazy`` (kernels/lazy_adam.LazyRows): the SH rows of the Gaussians
    seen are first caught up to its count (their parameters and moments written in place)."""
    means = params["means"]
    N, C = means.shape[0], viewmats.shape[0]
    if N == 0:
        return
    if lazy is not None and lazy.applied.shape != (N,):
        raise ValueError(f"project_and_shade_fused: lazy.applied must be ({N},), got {tuple(lazy.applied.shape)}")
    grid = (triton.cdiv(N, BLOCK),)
    args = [
        *(params[k] for k in PARAM_KEYS), viewmats, Ks, campos,
        *(out[k] for k in OUTPUT_KEYS), out["bits"],
        N, C, params["shN"].shape[1], setup.width, setup.height, float(setup.near), float(setup.far), EPS2D,
    ]  # fmt: skip
    consts = dict(AA=setup.antialiased, BLOCK=BLOCK, SLACK=CULL_SLACK, num_warps=NUM_WARPS)
    _prewarm_degrees(_forward_kernel, args, consts, setup.sh_degree, params)
    _forward_kernel[grid](*args, DEG=setup.sh_degree, **consts)
    if lazy is not None:
        seen = lazy.seen
        list_seen(out["bits"], seen, lazy.applied, lazy.count)
        KR = params["shN"].shape[1]
        lanes = triton.next_power_of_2(3 + 3 * KR)
        rows = max(1, CATCH_UP_LANES // lanes)
        args = [
            params["sh0"], params["shN"], *lazy.moments, lazy.applied, lazy.count, lazy.tables, lazy.lr,
            lazy.tables.shape[1], lazy.beta1, lazy.beta2, lazy.eps, seen.waiting_rows, seen.waiting, KR,
        ]  # fmt: skip
        _catch_up_kernel[(min(triton.cdiv(N, rows), constants.LISTED_PROGRAMS),)](
            *args, ROWS=rows, LANES=lanes, num_warps=CATCH_UP_WARPS
        )
        args = [
            params["means"], params["sh0"], params["shN"], campos, out["colors"], out["bits"], seen.waiting_rows,
            seen.waiting, N, C, KR,
        ]  # fmt: skip
        consts = dict(BLOCK=BLOCK, num_warps=NUM_WARPS)
        _prewarm_degrees(_listed_colors_kernel, args, consts, setup.sh_degree, params)
        _listed_colors_kernel[(min(grid[0], constants.LISTED_PROGRAMS),)](*args, DEG=setup.sh_degree, **consts)


def backward_into(
    params,
    viewmats,
    Ks,
    campos,
    bits: Tensor,
    setup: Setup,
    grads: dict,
    out: dict,
    adam: "Optional[AdamStep]" = None,
    seen_sh: bool = False,
    listed: "Optional[SeenRows]" = None,
    unseen_zeros: bool = True,
) -> None:
    """Launch the backward kernel: ``grads`` maps the differentiable outputs of
    :data:`OUTPUT_KEYS` to their contiguous gradients (missing or None: zero); every element of
    ``out`` (the raw parameters' gradients, keys :data:`PARAM_KEYS`) is written, but with
    ``seen_sh`` (--lazy_sh_adam, whose Adam reads the SH gradients of the seen Gaussians only) the
    sh0 / shN rows of Gaussians with no bit in ``bits``, whose gradient is zero, are left as they
    were (stored bases beyond 16 excepted: written as zeros, but with ``listed``). With ``adam`` (:class:`AdamStep`) no gradient is written: each parameter of ``params``
    takes its Adam step in place, its moments ``adam.moments[k]`` updated with it (``out`` is not
    read). ``listed`` (kernels/adam.SeenRows, the forward's list of the Gaussians with a bit in
    ``bits``; with ``seen_sh`` only): the backward's programs take the listed Gaussians, a block of
    the list each, so its math runs for the seen Gaussians alone (the same gradients; where the
    seen ones are few and scattered, hardly a block of the shard is without one); the other
    Gaussians' geometric gradients (means, quats, scales, opacities) are zeroed first with
    ``unseen_zeros`` (a loss term outside the projection adds to them), else left unwritten too,
    and ``listed.bits`` set to ``bits`` so that kernels/adam.py reads them as the zeros they are
    (``listed.bits`` None otherwise). Raises ValueError for ``adam`` with ``seen_sh``, or
    ``listed`` without ``seen_sh``."""
    if adam is not None and seen_sh:
        raise ValueError("backward_into: seen_sh leaves gradient rows unwritten; Adam in the backward writes none")
    if listed is not None and not seen_sh:
        raise ValueError("backward_into: listed needs seen_sh (the unseen rows' SH gradients are left unwritten)")
    means = params["means"]
    N, C = means.shape[0], viewmats.shape[0]
    if N == 0:
        return
    names = ("means2d", "depths", "conics", "opacities", "colors")
    given = [grads.get(k) for k in names]
    if adam is not None:
        adam.check(params)
        targets = [params[k] for k in PARAM_KEYS]
        moments = [adam.moments[k][i] for i in (0, 1) for k in PARAM_KEYS]
        hyper = adam.hyper
    else:
        targets = [out[k] for k in PARAM_KEYS]
        moments, hyper = targets * 2, means  # unused pointers
    args = [
        *(params[k] for k in PARAM_KEYS), viewmats, Ks, campos, bits,
        *(g if g is not None else means for g in given),
        *targets, *moments, hyper,
        *((listed.rows, listed.count) if listed is not None else (bits, bits)),  # bits: unused pointers
        N, C, params["shN"].shape[1], setup.width, setup.height, EPS2D,
    ]  # fmt: skip
    consts = dict(
        AA=setup.antialiased, BLOCK=BLOCK,
        HAS_MEANS2D=given[0] is not None, HAS_DEPTHS=given[1] is not None, HAS_CONICS=given[2] is not None,
        HAS_OPAC=given[3] is not None, HAS_COLORS=given[4] is not None,
        ADAM=adam is not None, SELECTIVE=adam is not None and adam.selective, SEEN_SH=seen_sh,
        LISTED=listed is not None, num_warps=NUM_WARPS,
    )  # fmt: skip
    if listed is not None:  # the programs over the list write the seen Gaussians' rows only
        listed.bits = None if unseen_zeros else bits
        if unseen_zeros:
            for k in GEOMETRIC_KEYS:
                out[k].zero_()
    _prewarm_degrees(_backward_kernel, args, consts, setup.sh_degree, params)
    grid = triton.cdiv(N, BLOCK)
    if listed is not None:  # programs striding over the list (its length is on the device)
        grid = min(grid, constants.LISTED_PROGRAMS)
    _backward_kernel[(grid,)](*args, DEG=setup.sh_degree, **consts)


@dataclass
class AdamStep:
    """The Adam step the backward kernel takes in place of writing the parameters' gradients
    (the per-Gaussian backward fused with the optimizer, as Taming 3DGS and Faster-GS fuse them):
    each Gaussian's gradient stays in registers, and the kernel reads its parameters and two
    moments and writes them back once, instead of the backward writing a gradient that a
    separate Adam reads again (236 bytes per Gaussian at SH degree 3, each way).

    ``moments``: per key of :data:`PARAM_KEYS`, (exp_avg, exp_avg_sq) shaped as the parameter
    (torch.optim.Adam's state tensors); ``hyper``: float32 [6, 5] on the parameters' device, row i
    for parameter i of :data:`PARAM_KEYS`: step size (lr / (1 - beta1^t); selective: lr),
    1 / sqrt(1 - beta2^t) (selective: 1), beta1, beta2, eps, read by the kernel at run time (a
    CUDA graph's replay reads the step's values); ``selective``: gsplat's SelectiveAdam, only the
    Gaussians some camera sees (bit set in the visibility mask) step. The update is
    kernels/adam.py's, formula for formula. Stored SH bases beyond 16 are not supported (raises
    ValueError in :meth:`check`)."""

    moments: dict
    hyper: Tensor
    selective: bool = False

    def check(self, params: Mapping[str, Tensor]) -> None:
        """Raise ValueError unless every moment is a contiguous float32 tensor shaped as its
        parameter, ``hyper`` is [6, 5] float32, and shN holds at most 15 bases."""
        if params["shN"].shape[1] > 15:
            raise ValueError(f"AdamStep: shN holds {params['shN'].shape[1]} bases; Adam in the backward takes <= 15")
        if tuple(self.hyper.shape) != (len(PARAM_KEYS), 5) or self.hyper.dtype != torch.float32:
            raise ValueError(
                f"AdamStep: hyper must be float32 [6, 5], got {self.hyper.dtype} {tuple(self.hyper.shape)}"
            )
        for k in PARAM_KEYS:
            for m in self.moments[k]:
                if m.shape != params[k].shape or m.dtype != torch.float32 or not m.is_contiguous():
                    raise ValueError(
                        f"AdamStep: the moments of {k} must be contiguous float32 {tuple(params[k].shape)}"
                    )

    def key(self) -> tuple:
        """The moments' and constants' storage (what a captured graph reads)."""
        return (self.hyper.data_ptr(), tuple(m.data_ptr() for k in PARAM_KEYS for m in self.moments[k]))


def empty_outputs(N: int, C: int, device) -> dict:
    """Uninitialized forward outputs (and "bits") for :func:`forward_into`."""
    f = dict(dtype=torch.float32, device=device)
    return dict(
        radii=torch.empty(C, N, 2, dtype=torch.int32, device=device),
        means2d=torch.empty(C, N, 2, **f),
        depths=torch.empty(C, N, **f),
        conics=torch.empty(C, N, 3, **f),
        opacities=torch.empty(C, N, **f),
        colors=torch.empty(C, N, 3, **f),
        bits=torch.empty(N, dtype=torch.int32, device=device),
    )


class _ProjectShade(torch.autograd.Function):
    """Forward and backward kernels as one autograd node; saves the raw parameters (no copy),
    the cameras and the visibility mask. With an :class:`AdamStep` the backward steps the
    parameters in place and returns no gradient for them."""

    @staticmethod
    def forward(ctx, setup: Setup, adam, lazy, means, quats, scales, opacities, sh0, shN, viewmats, Ks, campos):
        params = dict(means=means, quats=quats, scales=scales, opacities=opacities, sh0=sh0, shN=shN)
        out = empty_outputs(means.shape[0], viewmats.shape[0], means.device)
        forward_into(params, viewmats, Ks, campos, setup, out, lazy)
        ctx.setup, ctx.adam, ctx.lazy = setup, adam, lazy is not None
        ctx.seen = lazy.seen if lazy is not None else None  # listed by the forward, read by the backward
        ctx.unseen_zeros = lazy.unseen_zeros if lazy is not None else True
        ctx.save_for_backward(means, quats, scales, opacities, sh0, shN, viewmats, Ks, campos, out["bits"])
        ctx.mark_non_differentiable(out["radii"])
        ctx.set_materialize_grads(False)
        return tuple(out[k] for k in OUTPUT_KEYS)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, _radii, *grads):
        *tensors, viewmats, Ks, campos, bits = ctx.saved_tensors
        params = dict(zip(PARAM_KEYS, tensors))
        given = {k: None if g is None else g.contiguous() for k, g in zip(OUTPUT_KEYS[1:], grads)}
        if ctx.adam is not None:
            backward_into(params, viewmats, Ks, campos, bits, ctx.setup, given, {}, ctx.adam)
            return (None,) * 12
        out = {k: torch.empty_like(params[k]) for k in PARAM_KEYS}
        # --lazy_sh_adam: the unseen Gaussians' SH gradient rows, which its Adam does not read, stay unwritten
        backward_into(
            params, viewmats, Ks, campos, bits, ctx.setup, given, out, seen_sh=ctx.lazy, listed=ctx.seen,
            unseen_zeros=ctx.unseen_zeros,
        )  # fmt: skip
        wanted = ctx.needs_input_grad[3:9]
        return (None, None, None, *(out[k] if w else None for k, w in zip(PARAM_KEYS, wanted)), None, None, None)


def project_and_shade_fused(
    params: Mapping[str, Tensor],
    viewmats: Tensor,
    Ks: Tensor,
    campos: Tensor,
    width: int,
    height: int,
    sh_degree: int,
    near: float,
    far: float,
    camera_model: str = "pinhole",
    antialiased: bool = False,
    adam: Optional[AdamStep] = None,
    lazy: "Optional[LazyRows]" = None,
) -> dict[str, Tensor]:
    """``render.project_and_shade(ops, model.activated(params), viewmats, Ks, campos,
    [(width, height)] * C, sh_degree, near, far, packed=False, camera_model, antialiased)`` in one
    forward launch and one backward launch (module docstring).

    params: the shard's raw parameters (:data:`PARAM_KEYS`): means [N, 3] (scene units), quats
    [N, 4] (unnormalized, w first), scales [N, 3] (log), opacities [N] (logit), sh0 [N, 1, 3],
    shN [N, K - 1, 3]; viewmats [C, 4, 4] world-to-camera, Ks [C, 3, 3] (pixels), campos [C, 3]
    camera centres; width, height: the image size of every camera (pixels).
    Returns {"radii" int32 [C, N, 2], "means2d" [C, N, 2], "depths" [C, N], "conics" [C, N, 3],
    "opacities" [C, N] (times the compensations when ``antialiased``), "colors" [C, N, 3]},
    differentiable w.r.t. the six parameters (not the cameras). Static shapes, no host
    synchronization: capturable in a CUDA graph. ``adam`` (:class:`AdamStep`): the backward
    takes the parameters' Adam step in place instead and leaves them no gradient (the
    parameters must be the tensors given, contiguous: they are written). ``lazy``
    (kernels/lazy_adam.LazyRows, --lazy_sh_adam): the forward lists the Gaussians it sees in
    ``lazy.seen`` and catches up their deferred SH Adam steps (sh0, shN and their moments written
    in place: contiguous ones); the backward then leaves the sh0 / shN gradient rows of the
    Gaussians not seen unwritten (their gradient is zero; the deferred Adam reads the listed rows
    only).

    Raises NotImplementedError for what :func:`unsupported` names (camera models other than
    pinhole, cameras requiring a gradient, SH degree > 3, ...) and ValueError for shapes that
    disagree or an SH degree beyond the stored bases.
    """
    _check(params, viewmats, Ks, campos, sh_degree)
    reason = unsupported(params, viewmats, Ks, campos, sh_degree, camera_model)
    if reason is not None:
        raise NotImplementedError(f"project_and_shade_fused: {reason}")
    setup = Setup(int(width), int(height), int(sh_degree), float(near), float(far), bool(antialiased))
    if adam is not None and not all(params[k].is_contiguous() for k in PARAM_KEYS):
        raise ValueError("project_and_shade_fused: Adam in the backward steps the parameters in place: contiguous ones")
    if lazy is not None and not all(params[k].is_contiguous() for k in ("sh0", "shN")):
        raise ValueError("project_and_shade_fused: lazy catches sh0 / shN up in place: contiguous ones")
    tensors = [params[k].contiguous() for k in PARAM_KEYS]
    cams = (viewmats.contiguous(), Ks.contiguous(), campos.contiguous())
    outs = _ProjectShade.apply(setup, adam, lazy, *tensors, *cams)
    return dict(zip(OUTPUT_KEYS, outs))
