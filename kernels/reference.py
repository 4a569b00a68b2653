"""Plain-PyTorch 3D Gaussian Splatting renderer: the reference every kernel is tested against.

It is also the trainer's ``--backend reference`` (the CPU training path), so it is vectorized, and
gradients come from autograd. It mirrors the semantics of gsplat 1.5.3's CUDA ops and the
signatures of ``gsplat/cuda/_wrapper.py``, so ``splat_train.trainer.render`` can swap this module
for gsplat's:

    fully_fused_projection -> spherical_harmonics -> isect_tiles -> isect_offset_encode
    -> rasterize_to_pixels

Sources of the rules (cited again where used):
- 3DGS: Kerbl et al. 2023, "3D Gaussian Splatting for Real-Time Radiance Field Rendering".
- EWA splatting: Zwicker et al. 2001 (local affine approximation of the projection).
- Opacity-aware bounding box: arXiv 2402.00525, Section B.2.
- gsplat 1.5.3 csrc: ProjectionEWA3DGSFused.cu, include/Utils.cuh (persp_proj, add_blur,
  quat_to_rotmat), IntersectTile.cu, RasterizeToPixels3DGSFwd.cu, SphericalHarmonicsCUDA.cu.

Units: means and scales in metres (world units), means2d, radii and conics in pixels, depths in
metres along the camera z axis. Pixel (x, y) has its centre at (x + 0.5, y + 0.5).

Deviations from gsplat, all in degenerate inputs: outputs of culled Gaussians are 0 instead of
uninitialized; zero-length SH directions give finite colours instead of NaN; masked SH entries
and masked tiles return 0 / background with alpha 0 instead of uninitialized memory. The camera
models are gsplat's pinhole, ortho and fisheye (Utils.cuh persp_proj, ortho_proj, fisheye_proj).
"""

import math
from typing import Any, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

ALPHA_THRESHOLD = 1.0 / 255.0  # a Gaussian with alpha below this is skipped (Common.h)
MAX_ALPHA = 0.999  # alpha is clamped here so that 1 - alpha >= 0.001 (3DGS, Kerbl et al.)
TRANSMITTANCE_MIN = 1e-4  # a pixel stops before the Gaussian that takes T to or below this
EXTENT_SIGMAS = 3.33  # bbox half-extent in standard deviations (ProjectionEWA3DGSFused.cu)
CHUNK_ELEMENTS = 1 << 22  # pixel x Gaussian pairs the rasterizer evaluates at once (16 MiB f32)
WAVE_DEPTH = 128  # depth ranks per tile evaluated before finished tiles drop out
CAMERA_MODELS = ("pinhole", "ortho", "fisheye")  # gsplat's CameraModelType without the UT-only ftheta


# ------------------------------------------------------------------------------------------------
# Covariances
# ------------------------------------------------------------------------------------------------


def quat_to_rotmat(quats: Tensor) -> Tensor:
    """Rotation matrices of quaternions (w, x, y, z), normalized here (Utils.cuh quat_to_rotmat).

    quats: [..., 4], any non-zero norm (a zero quaternion gives NaN, as in gsplat).
    Returns [..., 3, 3].
    """
    q = quats * torch.rsqrt((quats * quats).sum(-1, keepdim=True))
    w, x, y, z = q.unbind(-1)
    rows = (
        1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
        2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
        2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y),
    )  # fmt: skip
    return torch.stack(rows, dim=-1).unflatten(-1, (3, 3))


def quat_scale_to_covar(quats: Tensor, scales: Tensor) -> Tensor:
    """3D covariances Sigma = R S S^T R^T (3DGS, Kerbl et al. 2023, Eq. 6).

    quats: [..., 4] unnormalized; scales: [..., 3] activated, metres. Returns [..., 3, 3] (m^2).
    """
    M = quat_to_rotmat(quats) * scales[..., None, :]  # R S: column j scaled by scales[j]
    return M @ M.transpose(-1, -2)


def _triu_to_covar(covars: Tensor) -> Tensor:
    """[..., 6] upper triangle (xx, xy, xz, yy, yz, zz) -> symmetric [..., 3, 3]."""
    xx, xy, xz, yy, yz, zz = covars.unbind(-1)
    rows = (xx, xy, xz, xy, yy, yz, xz, yz, zz)
    return torch.stack(rows, dim=-1).unflatten(-1, (3, 3))


# ------------------------------------------------------------------------------------------------
# Projection
# ------------------------------------------------------------------------------------------------


def fully_fused_projection(
    means: Tensor,  # [..., N, 3]
    covars: Optional[Tensor],  # [..., N, 6] or None
    quats: Optional[Tensor],  # [..., N, 4] or None
    scales: Optional[Tensor],  # [..., N, 3] or None
    viewmats: Tensor,  # [..., C, 4, 4]
    Ks: Tensor,  # [..., C, 3, 3]
    width: int,
    height: int,
    eps2d: float = 0.3,
    near_plane: float = 0.01,
    far_plane: float = 1e10,
    radius_clip: float = 0.0,
    packed: bool = False,
    sparse_grad: bool = False,
    calc_compensations: bool = False,
    camera_model: str = "pinhole",
    opacities: Optional[Tensor] = None,  # [..., N] or None
) -> Tuple[Any, ...]:  # Tensors; the last (compensations) None unless calc_compensations
    """Projects 3D Gaussians to 2D (EWA splatting, Zwicker et al. 2001; 3DGS, Kerbl et al. 2023).

    Same signature and outputs as ``gsplat.fully_fused_projection`` (gsplat 1.5.3,
    ProjectionEWA3DGSFused.cu), differentiable by autograd w.r.t. means, covars / quats, scales,
    viewmats (and Ks). Give either ``covars`` or ``quats`` and ``scales``.

    Per camera and Gaussian, in this order (a culled Gaussian gets radii 0, all other outputs 0,
    and passes no gradient):
    1. camera-space mean t = R mean + T; culled when t.z < near_plane or t.z > far_plane;
    2. 2D covariance J Sigma_cam J^T with the camera model's Jacobian J at t (:func:`_camera_jacobian`):
       pinhole: x/y of J clamped to 1.3x the field of view (Utils.cuh persp_proj), means2d =
       (fx x/z + cx, fy y/z + cy) unclamped; ortho: means2d = (fx x + cx, fy y + cy) (fx, fy in
       pixels per scene unit); fisheye (ideal equidistant): means2d = f theta (x, y) / rho + c with
       rho = |(x, y)| and theta = atan2(rho, z);
    3. low-pass blur: eps2d px^2 added to the diagonal; culled when the determinant <= 0;
       compensation = sqrt(max(0, det_before / det_after)) (Utils.cuh add_blur);
    4. conics = upper triangle of the inverse blurred 2D covariance, (a, b, c) in px^-2;
    5. extent 3.33 sigma; with ``opacities`` (times compensation if ``calc_compensations``)
       culled when opacity < 1/255, else extent = min(3.33, sqrt(2 ln(255 opacity)))
       (opacity-aware bbox, arXiv 2402.00525 Sec. B.2);
    6. radii = ceil(extent * sqrt(diag of blurred covariance)) px; culled when both are <=
       radius_clip, or when the bbox mean2d +- radii lies outside [0, width] x [0, height].

    Returns, dense: radii [..., C, N, 2] int32, means2d [..., C, N, 2] (px),
    depths [..., C, N] (camera z, m), conics [..., C, N, 3] (px^-2),
    compensations [..., C, N] or None.
    Packed (``packed=True``): batch_ids, camera_ids, gaussian_ids (each [nnz] int64, row-major
    order over (batch, camera, Gaussian)), radii [nnz, 2], means2d [nnz, 2], depths [nnz],
    conics [nnz, 3], compensations [nnz] or None.

    Raises NotImplementedError for camera models other than "pinhole", "ortho", "fisheye" and for
    sparse_grad; ValueError for inconsistent shapes or when neither covars nor quats+scales is given.
    """
    if camera_model not in CAMERA_MODELS:
        raise NotImplementedError(f"reference projection supports camera_model {CAMERA_MODELS}, got {camera_model!r}")
    if sparse_grad:
        raise NotImplementedError("reference projection has no sparse_grad: gradients are dense")
    batch_dims = means.shape[:-2]
    N, C = means.shape[-2], viewmats.shape[-3]
    if means.shape != batch_dims + (N, 3) or viewmats.shape != batch_dims + (C, 4, 4):
        raise ValueError(f"means {tuple(means.shape)} / viewmats {tuple(viewmats.shape)} mismatch")
    if Ks.shape != batch_dims + (C, 3, 3):
        raise ValueError(f"Ks must be {batch_dims + (C, 3, 3)}, got {tuple(Ks.shape)}")
    if covars is not None:
        if covars.shape != batch_dims + (N, 6):
            raise ValueError(f"covars must be {batch_dims + (N, 6)}, got {tuple(covars.shape)}")
        covar = _triu_to_covar(covars)  # [..., N, 3, 3]
    else:
        if quats is None or scales is None:
            raise ValueError("fully_fused_projection needs covars, or quats and scales")
        if quats.shape != batch_dims + (N, 4) or scales.shape != batch_dims + (N, 3):
            raise ValueError(f"quats {tuple(quats.shape)} / scales {tuple(scales.shape)} mismatch")
        covar = quat_scale_to_covar(quats, scales)  # [..., N, 3, 3]
    if opacities is not None and opacities.shape != batch_dims + (N,):
        raise ValueError(f"opacities must be {batch_dims + (N,)}, got {tuple(opacities.shape)}")

    # World to camera (posW2C, covarW2C).
    R = viewmats[..., :3, :3]  # [..., C, 3, 3]
    t = viewmats[..., :3, 3]  # [..., C, 3]
    means_c = torch.einsum("...cij,...nj->...cni", R, means) + t[..., :, None, :]  # [..., C, N, 3]
    covar_c = torch.einsum("...cij,...njk,...clk->...cnil", R, covar, R)  # [..., C, N, 3, 3]
    x, y, z = means_c.unbind(-1)  # [..., C, N]

    valid = (z >= near_plane) & (z <= far_plane)
    z = torch.where(valid, z, torch.ones_like(z))  # safe values: no inf/NaN in culled branches

    J, means2d = _camera_jacobian(camera_model, x, y, z, Ks, width, height)  # [..., C, N, 2, 3], [..., C, N, 2]
    cov2d = J @ covar_c @ J.transpose(-1, -2)  # [..., C, N, 2, 2]

    # Low-pass blur (Utils.cuh add_blur) and inverse.
    c00, c01, c11 = cov2d[..., 0, 0], cov2d[..., 0, 1], cov2d[..., 1, 1]
    det_orig = c00 * c11 - c01 * c01
    c00, c11 = c00 + eps2d, c11 + eps2d
    det = c00 * c11 - c01 * c01
    valid = valid & (det > 0)
    det = torch.where(valid, det, torch.ones_like(det))
    compensations = None
    if calc_compensations:  # sqrt with add_blur_vjp's gradient 0.5 / (sqrt + 1e-6): finite at 0
        ratio = torch.clamp(det_orig / det, min=0.0)
        root = torch.sqrt(ratio.detach())
        compensations = root + (ratio - ratio.detach()) * (0.5 / (root + 1e-6))
    conics = torch.stack([c11 / det, -c01 / det, c00 / det], dim=-1)  # [..., C, N, 3]

    # Bounding box (non-differentiable), opacity-aware when opacities are given.
    with torch.no_grad():
        extent = torch.full_like(z, EXTENT_SIGMAS)
        if opacities is not None:
            opac = opacities.detach()[..., None, :].expand_as(z)
            if compensations is not None:
                opac = opac * compensations.detach()
            valid = valid & (opac >= ALPHA_THRESHOLD)
            safe = torch.where(valid, opac, torch.ones_like(opac))
            extent = torch.clamp(torch.sqrt(2.0 * torch.log(safe / ALPHA_THRESHOLD)), max=EXTENT_SIGMAS)
        radius_x = torch.ceil(extent * torch.sqrt(c00.detach().clamp(min=0)))
        radius_y = torch.ceil(extent * torch.sqrt(c11.detach().clamp(min=0)))
        valid = valid & ((radius_x > radius_clip) | (radius_y > radius_clip))
        mx, my = means2d.detach().unbind(-1)
        inside = (mx + radius_x > 0) & (mx - radius_x < width) & (my + radius_y > 0) & (my - radius_y < height)
        valid = valid & inside
        radii = torch.where(valid[..., None], torch.stack([radius_x, radius_y], -1), 0.0).int()

    def keep(v: Tensor) -> Tensor:  # zero culled entries; torch.where passes them no gradient
        mask = valid if v.dim() == valid.dim() else valid[..., None]
        return torch.where(mask, v, torch.zeros_like(v))

    means2d, depths, conics = keep(means2d), keep(means_c[..., 2]), keep(conics)
    if compensations is not None:
        compensations = keep(compensations)
    if not packed:
        return radii, means2d, depths, conics, compensations

    nz = valid.reshape(-1, C, N).nonzero()  # [nnz, 3], row-major (batch, camera, Gaussian)
    batch_ids, camera_ids, gaussian_ids = nz.unbind(-1)
    flat = valid.reshape(-1).nonzero().squeeze(-1)
    return (
        batch_ids, camera_ids, gaussian_ids,
        radii.reshape(-1, 2)[flat], means2d.reshape(-1, 2)[flat], depths.reshape(-1)[flat],
        conics.reshape(-1, 3)[flat], None if compensations is None else compensations.reshape(-1)[flat],
    )  # fmt: skip


def _camera_jacobian(
    camera_model: str, x: Tensor, y: Tensor, z: Tensor, Ks: Tensor, width: int, height: int
) -> Tuple[Tensor, Tensor]:
    """The projection of camera-space means (x, y, z) [..., C, N] and its Jacobian for the EWA
    covariance: (J [..., C, N, 2, 3], means2d [..., C, N, 2]) in pixels.

    pinhole: Utils.cuh persp_proj (J's x/y clamped to 1.3x the field of view, the gradient passing
    on the limit as CUDA's); ortho: ortho_proj (J = diag(fx, fy) in its first two columns);
    fisheye: fisheye_proj, the ideal equidistant model, with its eps = 1e-7 placed as there.
    """
    fx, fy = Ks[..., 0, 0, None], Ks[..., 1, 1, None]  # [..., C, 1]
    cx, cy = Ks[..., 0, 2, None], Ks[..., 1, 2, None]
    zeros = torch.zeros_like(z)
    if camera_model == "ortho":
        J = torch.stack([fx + zeros, zeros, zeros, zeros, fy + zeros, zeros], dim=-1)
        return J.unflatten(-1, (2, 3)), torch.stack([fx * x + cx, fy * y + cy], dim=-1)
    if camera_model == "fisheye":
        eps = 1e-7
        rho = torch.sqrt(x * x + y * y + 1e-20) + eps  # the 1e-20 keeps sqrt's gradient finite on the axis
        theta = torch.atan2(rho, z + eps)
        means2d = torch.stack([x * fx * theta / rho + cx, y * fy * theta / rho + cy], dim=-1)
        x2, y2, xy = x * x + eps, y * y, x * y
        x2y2 = x2 + y2
        inv = 1.0 / (x2y2 + z * z)
        b = torch.atan2(rho, z) / rho / x2y2
        a = z * inv / x2y2
        J = torch.stack(
            [
                fx * (x2 * a + y2 * b),
                fx * xy * (a - b),
                -fx * x * inv,
                fy * xy * (a - b),
                fy * (y2 * a + x2 * b),
                -fy * y * inv,
            ],
            dim=-1,
        )
        return J.unflatten(-1, (2, 3)), means2d
    lim_x_pos = (width - cx) / fx + 0.3 * (0.5 * width / fx)
    lim_x_neg = cx / fx + 0.3 * (0.5 * width / fx)
    lim_y_pos = (height - cy) / fy + 0.3 * (0.5 * height / fy)
    lim_y_neg = cy / fy + 0.3 * (0.5 * height / fy)
    rz = 1.0 / z
    tx = z * torch.clamp(x * rz, min=-lim_x_neg, max=lim_x_pos)
    ty = z * torch.clamp(y * rz, min=-lim_y_neg, max=lim_y_pos)
    J = torch.stack([fx * rz, zeros, -fx * tx * rz * rz, zeros, fy * rz, -fy * ty * rz * rz], dim=-1)
    return J.unflatten(-1, (2, 3)), torch.stack([fx * x * rz + cx, fy * y * rz + cy], dim=-1)


# ------------------------------------------------------------------------------------------------
# Spherical harmonics
# ------------------------------------------------------------------------------------------------


def _sh_bases(degree: int, dirs: Tensor) -> List[Tensor]:
    """Real SH basis values up to ``degree`` (<= 4) at unit directions, each [...].

    Sloan, "Efficient Spherical Harmonic Evaluation", JCGT 2013, with gsplat's order and signs
    (SphericalHarmonicsCUDA.cu sh_coeffs_to_color_fast).
    """
    bases = [torch.full_like(dirs[..., 0], 0.2820947917738781)]
    if degree < 1:
        return bases
    x, y, z = dirs.unbind(-1)
    bases += [-0.48860251190292 * y, 0.48860251190292 * z, -0.48860251190292 * x]
    if degree < 2:
        return bases
    z2 = z * z
    cos1, sin1 = x * x - y * y, 2.0 * x * y  # Re/Im of (x + iy)^1..3 (unnormalized)
    b6 = 0.9461746957575601 * z2 - 0.3153915652525201
    bases += [0.5462742152960395 * sin1, -1.092548430592079 * z * y, b6, -1.092548430592079 * z * x,
              0.5462742152960395 * cos1]  # fmt: skip
    if degree < 3:
        return bases
    cos2, sin2 = x * cos1 - y * sin1, x * sin1 + y * cos1
    p3 = -2.285228997322329 * z2 + 0.4570457994644658
    b12 = z * (1.865881662950577 * z2 - 1.119528997770346)
    bases += [-0.5900435899266435 * sin2, 1.445305721320277 * z * sin1, p3 * y, b12, p3 * x,
              1.445305721320277 * z * cos1, -0.5900435899266435 * cos2]  # fmt: skip
    if degree < 4:
        return bases
    cos3, sin3 = x * cos2 - y * sin2, x * sin2 + y * cos2
    p4 = z * (-4.683325804901025 * z2 + 2.007139630671868)
    q4 = 3.31161143515146 * z2 - 0.47308734787878
    bases += [0.6258357354491763 * sin3, -1.770130769779931 * z * sin2, q4 * sin1, p4 * y,
              1.984313483298443 * z * b12 - 1.006230589874905 * b6, p4 * x, q4 * cos1,
              -1.770130769779931 * z * cos2, 0.6258357354491763 * cos3]  # fmt: skip
    return bases


def spherical_harmonics(
    degrees_to_use: int,
    dirs: Tensor,  # [..., 3]
    coeffs: Tensor,  # [..., K, 3]
    masks: Optional[Tensor] = None,  # [...] bool
) -> Tensor:
    """Evaluates view-dependent colour from SH coefficients (gsplat spherical_harmonics).

    dirs need not be normalized (normalized here; a zero direction gives a finite colour where
    gsplat gives NaN). Uses the first (degrees_to_use + 1)^2 of the K coefficients; no +0.5
    offset (the caller adds 0.5 and clamps at 0). Masked-out entries are 0 with no gradient.
    Returns [..., 3]. Raises ValueError on bad shapes or degree > 4 / more bases than K.
    """
    num_bases = (degrees_to_use + 1) ** 2
    batch_dims = dirs.shape[:-1]
    if not 0 <= degrees_to_use <= 4 or num_bases > coeffs.shape[-2]:
        raise ValueError(f"SH degree {degrees_to_use} needs {num_bases} <= K={coeffs.shape[-2]} bases, degree <= 4")
    if dirs.shape[-1] != 3 or coeffs.shape[:-2] != batch_dims or coeffs.shape[-1] != 3:
        raise ValueError(f"dirs {tuple(dirs.shape)} / coeffs {tuple(coeffs.shape)} mismatch")
    if masks is not None and masks.shape != batch_dims:
        raise ValueError(f"masks must be {tuple(batch_dims)}, got {tuple(masks.shape)}")
    if degrees_to_use > 0:
        dirs = dirs * torch.rsqrt((dirs * dirs).sum(-1, keepdim=True).clamp(min=1e-30))
    bases = torch.stack(_sh_bases(degrees_to_use, dirs), dim=-1)  # [..., num_bases]
    colors = (bases[..., None, :] @ coeffs[..., :num_bases, :]).squeeze(-2)  # [..., 3]
    if masks is not None:
        colors = torch.where(masks[..., None], colors, torch.zeros_like(colors))
    return colors


# ------------------------------------------------------------------------------------------------
# Tile intersection
# ------------------------------------------------------------------------------------------------


def _id_bits(n_images: int, tile_width: int, tile_height: int) -> Tuple[int, int]:
    """Bits for the image id and the tile id in an isect id (IntersectTile.cu); ValueError if > 32."""
    image_n_bits, tile_n_bits = int(n_images).bit_length(), int(tile_width * tile_height).bit_length()
    if image_n_bits + tile_n_bits > 32:
        raise ValueError(f"{n_images} images x {tile_width * tile_height} tiles do not fit 32 bits of isect id")
    return image_n_bits, tile_n_bits


@torch.no_grad()
def isect_tiles(
    means2d: Tensor,  # [..., N, 2] or [nnz, 2]
    radii: Tensor,  # [..., N, 2] or [nnz, 2] int32
    depths: Tensor,  # [..., N] or [nnz]
    tile_size: int,
    tile_width: int,
    tile_height: int,
    sort: bool = True,
    segmented: bool = False,
    packed: bool = False,
    n_images: Optional[int] = None,
    image_ids: Optional[Tensor] = None,  # [nnz], packed only
    gaussian_ids: Optional[Tensor] = None,  # [nnz], packed only (unused, as in gsplat)
) -> Tuple[Tensor, Tensor, Tensor]:
    """Lists the (Gaussian, tile) intersections (gsplat isect_tiles, IntersectTile.cu).

    A Gaussian with both radii > 0 covers tiles [floor(m/ts - r/ts), ceil(m/ts + r/ts)) per axis,
    clamped to the grid, computed in float32. Each intersection gets
    isect_id = (image_id << (32 + tile_bits)) | (tile_id << 32) | float32-bits(depth), tile_id =
    ty * tile_width + tx, tile_bits = (tile_width * tile_height).bit_length(); flatten_id = index
    of the record in the flattened [I * N] (dense) or [nnz] (packed) inputs. Sorting is stable
    (ties keep flatten order, like cub's radix sort); ``segmented`` gives the same result.

    Returns tiles_per_gauss ([..., N] or [nnz] int32), isect_ids ([n_isects] int64, sorted when
    ``sort``), flatten_ids ([n_isects] int32). Raises ValueError on bad shapes / too many bits.
    """
    if packed:
        if image_ids is None or n_images is None:
            raise ValueError("isect_tiles(packed=True) needs image_ids and n_images")
        n_images, lead = int(n_images), means2d.shape[:-1]
    else:
        lead = means2d.shape[:-1]  # image_dims + (N,)
        n_images = math.prod(lead[:-1])
    if radii.shape != lead + (2,) or depths.shape != lead:
        shapes = f"means2d {tuple(means2d.shape)}, radii {tuple(radii.shape)}, depths {tuple(depths.shape)}"
        raise ValueError(f"isect_tiles: {shapes} mismatch")
    _, tile_n_bits = _id_bits(n_images, tile_width, tile_height)
    device = means2d.device

    m = means2d.reshape(-1, 2).float() / float(tile_size)  # [R, 2] tile units
    r = radii.reshape(-1, 2).float() / float(tile_size)
    hits = (radii.reshape(-1, 2) > 0).all(-1)  # [R]
    grid = torch.tensor([tile_width, tile_height], device=device)
    lo = torch.minimum(torch.floor(m - r).clamp(min=0).long(), grid)  # [R, 2] inclusive
    hi = torch.minimum(torch.ceil(m + r).clamp(min=0).long(), grid)  # [R, 2] exclusive
    span = torch.where(hits[:, None], hi - lo, 0)  # [R, 2]
    tiles_per_gauss = span[:, 0] * span[:, 1]  # [R]

    # One row per intersection, records in order, each record's tiles row-major (y then x).
    rec = torch.repeat_interleave(torch.arange(len(tiles_per_gauss), device=device), tiles_per_gauss)
    first = torch.cumsum(tiles_per_gauss, 0) - tiles_per_gauss  # [R]
    j = torch.arange(len(rec), device=device) - first[rec]  # index within the record's bbox
    w = span[rec, 0]
    tile_id = (lo[rec, 1] + j // w) * tile_width + (lo[rec, 0] + j % w)
    if packed:
        assert image_ids is not None, "packed records carry image_ids"
        image_id = image_ids.reshape(-1).long()[rec]
    else:
        image_id = rec // lead[-1]
    depth_bits = depths.reshape(-1).float().contiguous().view(torch.int32).long() & 0xFFFFFFFF
    isect_ids = (image_id << (32 + tile_n_bits)) | (tile_id << 32) | depth_bits[rec]
    flatten_ids = rec.int()
    if sort:
        isect_ids, order = torch.sort(isect_ids, stable=True)
        flatten_ids = flatten_ids[order]
    return tiles_per_gauss.int().reshape(lead), isect_ids, flatten_ids


@torch.no_grad()
def isect_offset_encode(isect_ids: Tensor, n_images: int, tile_width: int, tile_height: int) -> Tensor:
    """First intersection of each (image, tile) in sorted isect_ids (gsplat isect_offset_encode).

    An empty tile gets the offset of the next non-empty one (n_isects past the last), so tile i's
    range is [offsets[i], offsets[i + 1]) over the flattened offsets. Returns
    [n_images, tile_height, tile_width] int32.
    """
    _, tile_n_bits = _id_bits(n_images, tile_width, tile_height)
    device = isect_ids.device
    n_tiles = tile_width * tile_height
    keys = (torch.arange(n_images, device=device)[:, None] << tile_n_bits) + torch.arange(n_tiles, device=device)
    offsets = torch.searchsorted((isect_ids >> 32).contiguous(), keys.reshape(-1).contiguous())
    return offsets.int().reshape(n_images, tile_height, tile_width)


# ------------------------------------------------------------------------------------------------
# Rasterization
# ------------------------------------------------------------------------------------------------


def _record_table(means2d: Tensor, conics: Tensor, opacities: Tensor) -> Tensor:
    """Rows (mean x, mean y, a, b, c, opacity) of the flattened records, so one gather serves all.

    [6, R] with R = I * N (dense) or nnz (packed); differentiable.
    """
    rows = [means2d.reshape(-1, 2), conics.reshape(-1, 3), opacities.reshape(-1, 1)]
    return torch.cat(rows, dim=1).t().contiguous()


def _alphas(records: Tensor, px: Tensor, py: Tensor) -> Tuple[Tensor, Tensor]:
    """alpha = min(0.999, opacity exp(-sigma)) with sigma = 0.5 (a dx^2 + c dy^2) + b dx dy,
    delta = mean - pixel centre; keep = sigma >= 0 and alpha >= 1/255 (RasterizeToPixels3DGSFwd.cu).

    records: [6, M] gathered from _record_table; px, py: [M] pixel centres. Returns [M], [M] bool.
    """
    mx, my, a, b, c, opacity = records.unbind(0)
    dx, dy = mx - px, my - py
    sigma = 0.5 * (a * dx * dx + c * dy * dy) + b * dx * dy
    alpha = torch.clamp(opacity * torch.exp(-sigma), max=MAX_ALPHA)
    return alpha, (sigma >= 0) & (alpha >= ALPHA_THRESHOLD)


def _segment_exclusive_cumsum(values: Tensor, segment_ids: Tensor) -> Tensor:
    """Sum of the earlier elements of the same segment; segments are contiguous runs of equal
    segment_ids. Accumulated in float64 (the running sum spans all segments). [M] float64."""
    v = values.double()
    before = torch.cumsum(v, 0) - v  # global exclusive cumsum
    idx = torch.arange(len(v), device=v.device)
    starts = torch.ones_like(segment_ids, dtype=torch.bool)
    starts[1:] = segment_ids[1:] != segment_ids[:-1]
    first = torch.cummax(torch.where(starts, idx, 0), 0).values  # index of each segment's start
    return before - before.gather(0, first)


@torch.no_grad()
def _candidate_pairs(
    table: Tensor,  # [6, R] from _record_table
    tiles: Tensor,
    k0: int,
    k1: int,  # [T] flat (image * n_tiles + tile) ids; depth-list range
    starts: Tensor,
    counts: Tensor,  # [I * n_tiles] range of each tile in flatten_ids
    flatten_ids: Tensor,
    image_width: int,
    image_height: int,
    tile_size: int,
    tile_width: int,
    n_tiles: int,
) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(pixel, Gaussian) pairs of a chunk of tiles whose alpha may reach 1/255.

    Evaluates sigma for the [T, tile_size, tile_size, k1 - k0] pairs of the tiles' depth ranks
    [k0, k1) as separable broadcasts and keeps those with sigma <= ln(255 opacity) + 1e-3 (a
    superset of alpha >= 1/255; the exact test follows); pixels outside the image are never kept.
    Returns pixel_ids, record ids ([M] int64), their table columns [6, M] and pixel centres x, y
    ([M]), ordered by (tile, pixel, depth rank).
    """
    dtype, device = table.dtype, table.device
    T, K = len(tiles), k1 - k0
    tile_xy = tiles % n_tiles
    offs = torch.arange(tile_size, device=device)
    xs = ((tile_xy % tile_width) * tile_size)[:, None] + offs  # [T, ts] pixel columns
    ys = ((tile_xy // tile_width) * tile_size)[:, None] + offs  # [T, ts] pixel rows
    ks = torch.arange(k0, k1, device=device)  # [K]
    in_list = ks < counts[tiles][:, None]  # [T, K]
    rec = flatten_ids[torch.where(in_list, starts[tiles][:, None] + ks, 0)].long()  # [T, K]
    local = table.index_select(1, rec.reshape(-1))  # [6, T * K]
    mx, my, a, b, c, opacity = local.reshape(6, T, 1, K).unbind(0)
    bound = torch.where(in_list[:, None], torch.log(opacity / ALPHA_THRESHOLD) + 1e-3, -math.inf)

    cx, cy = xs.to(dtype)[:, :, None] + 0.5, ys.to(dtype)[:, :, None] + 0.5  # [T, ts, 1]
    dx, dy = mx - cx, my - cy  # [T, ts(x), K], [T, ts(y), K]
    u = (0.5 * a * dx * dx - bound).masked_fill_((xs >= image_width)[:, :, None], math.inf)
    v = (0.5 * c * dy * dy).masked_fill_((ys >= image_height)[:, :, None], math.inf)
    excess = torch.add(u[:, None, :, :], v[:, :, None, :])  # [T, ts(y), ts(x), K] = sigma - bound
    excess.addcmul_(dy[:, :, None, :], (b * dx)[:, None, :, :])
    flat = (excess <= 0).reshape(-1).nonzero().squeeze(1)  # row-major: by tile, pixel, rank
    del excess
    q = flat // K  # (tile, pixel) index into [T * ts * ts]
    tk = q // (tile_size * tile_size) * K + (flat - q * K)  # (tile, rank) index into [T * K]
    image = (tiles // n_tiles)[:, None, None]
    pixel_table = (image * image_height + ys[:, :, None]) * image_width + xs[:, None, :]  # [T, ts, ts]
    px = cx.reshape(T, 1, tile_size).expand(T, tile_size, tile_size).reshape(-1).gather(0, q)
    py = cy.reshape(T, tile_size, 1).expand(T, tile_size, tile_size).reshape(-1).gather(0, q)
    records = local.index_select(1, tk)  # [6, M], gathered from the chunk's small table
    return pixel_table.reshape(-1).gather(0, q), rec.reshape(-1).gather(0, tk), records, px, py


def _tiles_done(
    done: Tensor, image_width: int, image_height: int, tile_size: int, tile_width: int, tile_height: int
) -> Tensor:
    """Tiles all of whose pixels are done. done: [I * H * W] bool -> [I * n_tiles] bool."""
    pad = (0, tile_width * tile_size - image_width, 0, tile_height * tile_size - image_height)
    grid = F.pad(done.reshape(-1, image_height, image_width), pad, value=True)
    return grid.reshape(-1, tile_height, tile_size, tile_width, tile_size).all(4).all(2).reshape(-1)


@torch.no_grad()
def _contributing_pairs(
    table: Tensor,  # [6, R] from _record_table
    image_width: int,
    image_height: int,
    tile_size: int,
    isect_offsets: Tensor,
    flatten_ids: Tensor,
    masks: Optional[Tensor],
) -> List[Tuple[Tensor, Tensor]]:
    """All (pixel, record) pairs that gsplat composites, in waves of WAVE_DEPTH depth ranks.

    Applies RasterizeToPixels3DGSFwd.cu's rules: skip when sigma < 0 or alpha < 1/255; a pixel
    stops BEFORE the first Gaussian whose next_T = T (1 - alpha) <= 1e-4. Wave w holds depth ranks
    [w * WAVE_DEPTH, (w + 1) * WAVE_DEPTH) of the tiles still active (a tile drops out, as in
    gsplat, once all its pixels have stopped); the log-transmittance of every pixel is carried
    from wave to wave. Returns per wave (pixel_ids, record_ids), [M_w] int64 each, pixel_ids
    flattened over [I, H, W], record ids into the flattened records, ordered by pixel then depth.
    """
    tile_height, tile_width = isect_offsets.shape[-2:]
    n_tiles, pixels_per_tile = tile_width * tile_height, tile_size * tile_size
    device = table.device
    starts = isect_offsets.reshape(-1).long()  # [I * n_tiles]
    ends = torch.cat([starts[1:], starts.new_full((1,), flatten_ids.numel())])
    counts = ends - starts
    if masks is not None:
        counts = torch.where(masks.reshape(-1), counts, 0)
    num_pixels = isect_offsets.reshape(-1, n_tiles).shape[0] * image_height * image_width
    log_t = torch.zeros(num_pixels, dtype=torch.float64, device=device)  # carried ln T
    done = torch.zeros(num_pixels, dtype=torch.bool, device=device)
    log_t_min = math.log(torch.tensor(TRANSMITTANCE_MIN, dtype=torch.float32).item())
    tiles_per_chunk = max(1, CHUNK_ELEMENTS // (WAVE_DEPTH * pixels_per_tile))
    counts_host = counts.tolist()
    active = [t for t, n in enumerate(counts_host) if n > 0]
    waves, k0 = [], 0
    while active:
        k1 = k0 + WAVE_DEPTH
        wave_pixels, wave_recs = [], []
        for c in range(0, len(active), tiles_per_chunk):
            tiles = torch.tensor(active[c : c + tiles_per_chunk], device=device)
            pixel_ids, rec, records, px, py = _candidate_pairs(
                table, tiles, k0, k1, starts, counts, flatten_ids, image_width, image_height, tile_size,
                tile_width, n_tiles,
            )  # fmt: skip
            alpha, keep = _alphas(records, px, py)
            log_keep = torch.where(keep, torch.log1p(-alpha), 0.0).double()
            log_next_t = log_t.gather(0, pixel_ids) + _segment_exclusive_cumsum(log_keep, pixel_ids) + log_keep
            stop = keep & (log_next_t <= log_t_min)  # monotone along depth: all later ones fail too
            valid = keep & ~stop & ~done.gather(0, pixel_ids)
            done.index_fill_(0, pixel_ids[stop], True)
            log_t.index_add_(0, pixel_ids, torch.where(valid, log_keep, 0.0))
            sel = valid.nonzero().squeeze(1)
            wave_pixels.append(pixel_ids.gather(0, sel))
            wave_recs.append(rec.gather(0, sel))
        waves.append((torch.cat(wave_pixels), torch.cat(wave_recs)))
        tile_done = _tiles_done(done, image_width, image_height, tile_size, tile_width, tile_height).tolist()
        active = [t for t in active if counts_host[t] > k1 and not tile_done[t]]
        k0 = k1
    return waves


def _check_raster_inputs(means2d, conics, colors, opacities, isect_offsets, backgrounds, masks, packed):
    """Returns image_dims; raises ValueError on inconsistent shapes (as gsplat's asserts)."""
    image_dims = isect_offsets.shape[:-2]
    lead = means2d.shape[:-1]
    if not packed and lead[:-1] != image_dims:
        raise ValueError(f"means2d {tuple(means2d.shape)} does not match isect_offsets {tuple(isect_offsets.shape)}")
    if conics.shape != lead + (3,) or opacities.shape != lead or (colors is not None and colors.shape[:-1] != lead):
        raise ValueError("means2d, conics, colors and opacities disagree on their leading dims")
    if backgrounds is not None and colors is not None and backgrounds.shape != image_dims + colors.shape[-1:]:
        raise ValueError(f"backgrounds must be {image_dims + colors.shape[-1:]}, got {tuple(backgrounds.shape)}")
    if masks is not None and masks.shape != isect_offsets.shape:
        raise ValueError(f"masks must be {tuple(isect_offsets.shape)}, got {tuple(masks.shape)}")
    return image_dims


def compositing_weights(
    means2d: Tensor,  # [..., N, 2] or [nnz, 2]
    conics: Tensor,  # [..., N, 3] or [nnz, 3]
    opacities: Tensor,  # [..., N] or [nnz]
    image_width: int,
    image_height: int,
    tile_size: int,
    isect_offsets: Tensor,  # [..., tile_height, tile_width]
    flatten_ids: Tensor,  # [n_isects]
    masks: Optional[Tensor] = None,  # [..., tile_height, tile_width] bool
    packed: bool = False,
    absgrad_into: Optional[Tensor] = None,  # [R, 2]
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per (pixel, Gaussian) blending weights alpha * T_before of gsplat's compositing.

    Every pair that contributes to a pixel (RasterizeToPixels3DGSFwd.cu rules; see
    rasterize_to_pixels). A pixel's pairs are in front-to-back order but not contiguous (they
    come in depth waves). Differentiable w.r.t. means2d, conics and opacities. Useful to find
    each pixel's max-contribution Gaussian (pruning).

    Returns pixel_ids [M] int64 (flattened over image_dims + [H, W]), record_ids [M] int64 (index
    into the flattened [I * N] or [nnz] records, as flatten_ids), weights [M], and the final
    transmittances image_dims + [H, W] (T after the last Gaussian; 1 where none).

    ``absgrad_into`` (float [R, 2], zeros): during backward, each pair's |dL/dmean2d| per axis is
    added to its record's row, the sum over pixels of the absolute per-pixel gradients that
    gsplat's rasterizer returns as ``means2d.absgrad`` (RasterizeToPixels3DGSBwd.cu v_xy_abs).
    """
    image_dims = _check_raster_inputs(means2d, conics, None, opacities, isect_offsets, None, masks, packed)
    num_pixels = math.prod(image_dims) * image_height * image_width
    table = _record_table(means2d, conics, opacities)  # [6, R]
    waves = _contributing_pairs(table.detach(), image_width, image_height, tile_size, isect_offsets, flatten_ids, masks)
    # ln T carried across waves; the empty sum keeps outputs in the graph when no pair contributes
    log_t = torch.zeros(num_pixels, dtype=torch.float64, device=table.device) + table[:, :0].sum().double()
    weights = []
    for pixel_ids, record_ids in waves:
        px = (pixel_ids % image_width).to(table.dtype) + 0.5
        py = ((pixel_ids // image_width) % image_height).to(table.dtype) + 0.5
        pair_records = table.index_select(1, record_ids)  # [6, M]: one column per (pixel, record) pair
        if absgrad_into is not None and pair_records.requires_grad:
            pair_records.register_hook(_absgrad_hook(absgrad_into, record_ids))
        alpha, _ = _alphas(pair_records, px, py)
        log_one_minus = torch.log1p(-alpha).double()  # >= ln(0.001): 1 - alpha never reaches 0
        log_t_before = log_t.gather(0, pixel_ids) + _segment_exclusive_cumsum(log_one_minus, pixel_ids)
        weights.append(alpha * torch.exp(log_t_before).to(alpha.dtype))
        log_t = log_t.index_add(0, pixel_ids, log_one_minus)
    T_final = torch.exp(log_t).to(table.dtype).reshape(image_dims + (image_height, image_width))
    if not waves:
        empty = torch.zeros(0, dtype=torch.long, device=table.device)
        return empty, empty, table[0, :0], T_final
    pixel_ids, record_ids = (torch.cat(ids) for ids in zip(*waves))
    return pixel_ids, record_ids, torch.cat(weights), T_final


def _absgrad_hook(absgrad_into: Tensor, record_ids: Tensor):
    """A tensor hook on a wave's [6, M] pair columns: adds |gradient| of rows 0, 1 (the mean's x,
    y) to ``absgrad_into[record_ids]``; leaves the gradient as it is."""

    def hook(grad: Tensor) -> None:
        absgrad_into.index_add_(0, record_ids, grad[:2].t().abs().to(absgrad_into.dtype))

    return hook


def composite_background(colors: Tensor, alphas: Tensor, backgrounds: Optional[Tensor]) -> Tensor:
    """``colors + (1 - alphas) * backgrounds``: an image rendered without a background, over one.

    colors [I, H, W, D], alphas [I, H, W, 1] (1 - the final transmittance, as rasterize_to_pixels
    returns them), backgrounds [I, D] or None (colors returned unchanged). Equals rendering with
    ``backgrounds=`` (RasterizeToPixels3DGSFwd.cu adds T_final * background) and is differentiable
    in all three. The trainer composites this way because gsplat 1.5.3's rasterize_to_pixels
    asserts ``backgrounds.shape == image_dims + (D,)`` with image_dims = () in packed mode, so it
    rejects per-image backgrounds there.
    """
    if backgrounds is None:
        return colors
    return colors + (1.0 - alphas) * backgrounds[:, None, None, :]


def rasterize_to_pixels(
    means2d: Tensor,  # [..., N, 2] or [nnz, 2]
    conics: Tensor,  # [..., N, 3] or [nnz, 3]
    colors: Tensor,  # [..., N, D] or [nnz, D]
    opacities: Tensor,  # [..., N] or [nnz]
    image_width: int,
    image_height: int,
    tile_size: int,
    isect_offsets: Tensor,  # [..., tile_height, tile_width] int32
    flatten_ids: Tensor,  # [n_isects] int32
    backgrounds: Optional[Tensor] = None,  # [..., D]
    masks: Optional[Tensor] = None,  # [..., tile_height, tile_width] bool
    packed: bool = False,
    absgrad: bool = False,
) -> Tuple[Tensor, Tensor]:
    """Alpha-composites depth-sorted 2D Gaussians per tile (gsplat rasterize_to_pixels).

    Rules of RasterizeToPixels3DGSFwd.cu (3DGS, Kerbl et al. 2023, Eq. 2-3): each pixel walks its
    tile's range of flatten_ids front to back; with its centre (x + 0.5, y + 0.5) and
    delta = mean - centre, sigma = 0.5 (a dx^2 + c dy^2) + b dx dy, alpha =
    min(0.999, opacity exp(-sigma)); a Gaussian is skipped when sigma < 0 or alpha < 1/255;
    next_T = T (1 - alpha); when next_T <= 1e-4 the pixel stops before adding it; otherwise
    colour += alpha T c and T = next_T. Finally colour += T background, alpha = 1 - T. Tiles
    whose mask is False render the background with alpha 0.

    Vectorized (no per-pixel or per-Gaussian Python loop): tiles advance through their depth
    lists in waves of WAVE_DEPTH Gaussians; per chunk of tiles one broadcast evaluation of sigma
    over [tiles, pixels, Gaussians] finds the candidate pairs, then the skip/stop rules and the
    weights alpha T (T = exp of a per-pixel cumulative sum of ln(1 - alpha), float64, carried
    across waves) run on the compact pair list; tiles whose pixels have all stopped drop out.
    Autograd differentiates w.r.t. means2d, conics, colors, opacities and backgrounds.

    ``absgrad``: ``means2d.absgrad`` is set to a tensor of means2d's shape that the backward pass
    fills with the absolute 2D-mean gradients (gsplat's attribute, set there in backward; see
    :func:`compositing_weights`).

    Returns render_colors image_dims + [H, W, D] and render_alphas image_dims + [H, W, 1].
    Raises ValueError on inconsistent shapes.
    """
    image_dims = _check_raster_inputs(means2d, conics, colors, opacities, isect_offsets, backgrounds, masks, packed)
    absgrad_into = None
    if absgrad:
        absgrad_into = torch.zeros(means2d.reshape(-1, 2).shape, dtype=means2d.dtype, device=means2d.device)
        means2d.absgrad = absgrad_into.view(means2d.shape)  # type: ignore[attr-defined]  # gsplat's attribute
    pixel_ids, record_ids, weights, T_final = compositing_weights(
        means2d,
        conics,
        opacities,
        image_width,
        image_height,
        tile_size,
        isect_offsets,
        flatten_ids,
        masks,
        packed,
        absgrad_into,
    )
    D = colors.shape[-1]
    flat_colors = colors.reshape(-1, D)
    num_pixels = T_final.numel()
    out = torch.zeros(num_pixels, D, dtype=flat_colors.dtype, device=flat_colors.device)
    out = out.index_add(0, pixel_ids, weights[:, None] * flat_colors.index_select(0, record_ids))
    out = out.reshape(image_dims + (image_height, image_width, D))
    T_final = T_final[..., None]
    if backgrounds is not None:
        out = out + T_final * backgrounds[..., None, None, :]
    return out, 1.0 - T_final


# ------------------------------------------------------------------------------------------------
# Optimizer (kernels/adam.py)
# ------------------------------------------------------------------------------------------------


def adam_update(
    param: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    step: int,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
) -> Tuple[Tensor, Tensor, Tensor]:
    """One Adam step (Kingma & Ba 2015, Algorithm 1, eps placed as torch.optim.Adam places it):
    returns the new (param, exp_avg, exp_avg_sq) for step number ``step`` (1 for the first); the
    inputs are not modified. Any shapes, all alike."""
    m = beta1 * exp_avg + (1.0 - beta1) * grad
    v = beta2 * exp_avg_sq + (1.0 - beta2) * grad * grad
    denom = v.sqrt() / math.sqrt(1.0 - beta2**step) + eps
    return param - lr / (1.0 - beta1**step) * m / denom, m, v


def selective_adam_update(
    param: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    visible: Tensor,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
) -> Tuple[Tensor, Tensor, Tensor]:
    """gsplat's SelectiveAdam step (csrc/AdamCUDA.cu; Taming 3DGS, Mallick et al. 2024): rows i
    with ``visible[i]`` get m = beta1 m + (1 - beta1) g, v = beta2 v + (1 - beta2) g^2,
    p = p - lr m / (sqrt(v) + eps) (no bias correction); other rows keep p, m, v. Tensors
    [N, ...], visible bool [N]; returns new (param, exp_avg, exp_avg_sq), inputs unmodified."""
    rows = visible.reshape(-1, *([1] * (param.dim() - 1)))
    m = beta1 * exp_avg + (1.0 - beta1) * grad
    v = beta2 * exp_avg_sq + (1.0 - beta2) * grad * grad
    p = param - lr * m / (v.sqrt() + eps)
    return torch.where(rows, p, param), torch.where(rows, m, exp_avg), torch.where(rows, v, exp_avg_sq)


def adam_zero_grad_steps(
    param: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    applied: Tensor,
    count: int,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
) -> Tuple[Tensor, Tensor, Tensor]:
    """The zero-gradient Adam steps that kernels/lazy_adam.py defers, taken one by one as the dense
    Adam takes them: each row i (tensors [N, ...], ``applied`` int [N]) steps at the counts
    applied[i] + 1 .. ``count`` with :func:`adam_update`'s formula and a zero gradient. Computed in
    the inputs' dtype (the tests pass float64); returns new (param, exp_avg, exp_avg_sq), inputs
    unmodified."""
    p, m, v = param.clone(), exp_avg.clone(), exp_avg_sq.clone()
    if applied.numel() == 0:
        return p, m, v
    rows = applied.reshape(-1, *([1] * (param.dim() - 1)))
    zero = torch.zeros_like(p)
    for u in range(int(applied.min()) + 1, int(count) + 1):
        new_p, new_m, new_v = adam_update(p, zero, m, v, u, lr, beta1, beta2, eps)
        on = rows < u
        p, m, v = torch.where(on, new_p, p), torch.where(on, new_m, m), torch.where(on, new_v, v)
    return p, m, v


def densify_stats_update(
    grad2d: Tensor,
    count: Tensor,
    grads: Tensor,
    scales: Tensor,
    radii: Tensor | None = None,
    gaussian_ids: Tensor | None = None,
    camera_ids: Tensor | None = None,
) -> None:
    """Densification statistics (kernels/densify_stats.py): add one step's to ``grad2d`` [N] and
    ``count`` [N] in place.

    Dense: grads [C, N, 2], radii [C, N, 2]; packed: grads [R, 2], gaussian_ids [R], camera_ids [R].
    scales [C, 2]: (sx, sy) per camera of the pass."""
    if gaussian_ids is not None:
        norms = (grads * scales[camera_ids]).norm(dim=-1)
        grad2d.index_add_(0, gaussian_ids, norms)
        count.index_add_(0, gaussian_ids, torch.ones_like(norms))
        return
    assert radii is not None, "dense statistics need radii"
    seen = (radii > 0).all(dim=-1)  # [C, N]
    norms = (grads * scales[:, None, :]).norm(dim=-1)
    grad2d.add_(torch.where(seen, norms, 0.0).sum(dim=0))
    count.add_(seen.sum(dim=0, dtype=count.dtype))
