"""Tests of splat_train.kernels.reference, the plain-PyTorch renderer.

Oracles: gsplat 1.5.3's pure-PyTorch implementation (gsplat.cuda._torch_impl) for projection,
spherical harmonics and tile intersection; for rasterization (gsplat's torch version needs its
CUDA ops and nerfacc) a per-pixel Python loop written from RasterizeToPixels3DGSFwd.cu's rules,
autograd through that loop, finite differences (gradcheck), and, on a CUDA machine (marker
`gpu`), gsplat's CUDA kernels. Inputs are fresh seeded random scenes; NaN never passes.

`python tests/test_reference.py [cpu|cuda]` prints forward+backward timings (not asserted).
"""

import math
import time

import pytest
import torch
from gsplat.cuda import _torch_impl as gs

from splat_train.kernels import reference as ref

TILE = 16


# ------------------------------------------------------------------------------------------------
# Scene generators
# ------------------------------------------------------------------------------------------------


def random_gaussians(n, gen, dtype=torch.float32, depth=(2.0, 8.0), spread=1.0, log_scale=(-4.0, -1.5)):
    """Means in a box in front of the camera (z in `depth`), random rotations, log-uniform scales."""
    u = lambda *s: torch.rand(*s, generator=gen, dtype=dtype)  # noqa: E731
    z = depth[0] + (depth[1] - depth[0]) * u(n)
    xy = (u(n, 2) * 2 - 1) * spread * z[:, None] * 0.6
    means = torch.cat([xy, z[:, None]], -1)
    quats = torch.randn(n, 4, generator=gen, dtype=dtype)
    scales = torch.exp(log_scale[0] + (log_scale[1] - log_scale[0]) * u(n, 3))
    opacities = 0.05 + 0.9 * u(n)
    return means, quats, scales, opacities


def random_cameras(c, width, height, gen, dtype=torch.float32):
    """World-to-camera matrices with small random rotations/translations; focal ~ image width."""
    viewmats = torch.eye(4, dtype=dtype).repeat(c, 1, 1)
    for i in range(c):
        axis_angle = (torch.rand(3, generator=gen, dtype=dtype) - 0.5) * 0.2
        skew = torch.cross(torch.eye(3, dtype=dtype), axis_angle.expand(3, 3), dim=-1)
        viewmats[i, :3, :3] = torch.linalg.matrix_exp(skew)
        viewmats[i, :3, 3] = (torch.rand(3, generator=gen, dtype=dtype) - 0.5) * 0.2
    f = width * (0.8 + 0.4 * torch.rand(c, generator=gen, dtype=dtype))
    Ks = torch.zeros(c, 3, 3, dtype=dtype)
    Ks[:, 0, 0], Ks[:, 1, 1] = f, f * 1.05
    Ks[:, 0, 2], Ks[:, 1, 2], Ks[:, 2, 2] = width / 2 + 3.3, height / 2 - 2.1, 1.0
    return viewmats, Ks


def with_edge_cases(means, scales, opacities):
    """Overwrite the first Gaussians: behind the camera, before near_plane=0.5, beyond far_plane=15,
    far off-screen, tiny, nearly transparent, and just outside the image border."""
    means, scales, opacities = means.clone(), scales.clone(), opacities.clone()
    means[0] = torch.tensor([0.1, 0.2, -3.0])  # behind
    means[1] = torch.tensor([0.0, 0.0, 0.3])  # in front of near_plane=0.5
    means[2] = torch.tensor([0.3, -0.2, 20.0])  # beyond far_plane=15
    means[3] = torch.tensor([40.0, 0.0, 3.0])  # far off-screen right
    means[4] = torch.tensor([0.0, -30.0, 3.0])  # far off-screen top
    means[5] = torch.tensor([0.05, 0.05, 4.0])
    scales[5] = 1e-5  # tiny: only the eps2d blur is left
    opacities[6] = 0.002  # below 1/255: culled by the opacity-aware bbox
    means[7] = torch.tensor([2.6, 0.0, 3.0])  # near the right border, clamped Jacobian
    scales[7] = 0.2
    return means, scales, opacities


def edge_case_scene(n, num_cameras, width, height, gen, dtype=torch.float32, **gaussian_kwargs):
    """random_gaussians with the edge cases written in, and random cameras:
    (means, quats, scales, opacities, viewmats, Ks)."""
    means, quats, scales, opacities = random_gaussians(n, gen, dtype, **gaussian_kwargs)
    means, scales, opacities = with_edge_cases(means, scales, opacities)
    viewmats, Ks = random_cameras(num_cameras, width, height, gen, dtype)
    return means, quats, scales, opacities, viewmats, Ks


def project_and_bin(means, quats, scales, opacities, viewmats, Ks, width, height, packed=False, **kw):
    """Reference projection + tile binning. Returns a dict of everything rasterization needs."""
    C = viewmats.shape[0]
    tw, th = math.ceil(width / TILE), math.ceil(height / TILE)
    out = ref.fully_fused_projection(means, None, quats, scales, viewmats, Ks, width, height,
                                     packed=packed, opacities=opacities, **kw)  # fmt: skip
    if packed:
        cam, gid, radii, means2d, depths, conics = out[1], out[2], out[3], out[4], out[5], out[6]
        opac = opacities[gid]
        _, isect_ids, flatten_ids = ref.isect_tiles(means2d, radii, depths, TILE, tw, th, packed=True,
                                                    n_images=C, image_ids=cam, gaussian_ids=gid)  # fmt: skip
    else:
        radii, means2d, depths, conics, _ = out
        opac = opacities.expand(C, -1)
        cam = gid = None
        _, isect_ids, flatten_ids = ref.isect_tiles(means2d, radii, depths, TILE, tw, th)
    offsets = ref.isect_offset_encode(isect_ids, C, tw, th)
    return dict(means2d=means2d, conics=conics, opacities=opac, radii=radii, depths=depths,
                offsets=offsets, flatten_ids=flatten_ids, camera_ids=cam, gaussian_ids=gid)  # fmt: skip


def assert_close(actual, expected, rtol=1e-4, atol=1e-6, what=""):
    assert torch.isfinite(actual).all(), f"{what}: non-finite values"
    assert torch.isfinite(expected).all(), f"{what}: non-finite oracle"
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


def assert_grads_close(actual, expected, rtol=1e-4, atol_frac=1e-5, what=""):
    """Gradients: elementwise rtol, absolute floor relative to the gradient's scale."""
    scale = expected.abs().max().item()
    assert_close(actual, expected, rtol=rtol, atol=atol_frac * max(scale, 1e-12), what=what)


# ------------------------------------------------------------------------------------------------
# Projection
# ------------------------------------------------------------------------------------------------


def gsplat_projection(means, quats, scales, viewmats, Ks, width, height, **kw):
    covars, _ = gs._quat_scale_to_covar_preci(quats, scales, compute_preci=False)
    return gs._fully_fused_projection(means, covars, viewmats, Ks, width, height, **kw)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_projection_matches_gsplat(dtype):
    gen = torch.Generator().manual_seed(1)
    W, H = 97, 71
    means, quats, scales, _, viewmats, Ks = edge_case_scene(300, 3, W, H, gen, dtype, depth=(0.5, 12.0))
    params = [p.clone().requires_grad_() for p in (means, quats, scales, viewmats)]
    radii, means2d, depths, conics, comp = ref.fully_fused_projection(
        params[0],
        None,
        params[1],
        params[2],
        params[3],
        Ks,
        W,
        H,
        near_plane=0.5,
        far_plane=15.0,
        calc_compensations=True,
    )
    oracle = [p.clone().requires_grad_() for p in (means, quats, scales, viewmats)]
    g_radii, g_means2d, g_depths, g_conics, g_comp = gsplat_projection(
        *oracle[:3], oracle[3], Ks, W, H, near_plane=0.5, far_plane=15.0, calc_compensations=True
    )
    assert radii.dtype == torch.int32 and radii.shape == (3, 300, 2)
    # ceil() of a float32 value within rounding of an integer may flip by 1 (about 1 seed in 100)
    differ = (radii != g_radii).any(-1)
    assert (radii - g_radii).abs().max() <= 1 and differ.sum() <= 1, f"{differ.sum()} radii differ"
    valid = (radii > 0).all(-1)
    both = valid & (g_radii > 0).all(-1)
    assert not valid[:, :5].any(), "behind / near / far / off-screen Gaussians must be culled"
    assert valid[:, 5].all(), "a tiny Gaussian stays (blurred to eps2d)"
    tol = dict(rtol=1e-5, atol=1e-4) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-10)
    for a, b, name in [(means2d, g_means2d, "means2d"), (depths, g_depths, "depths"),
                       (conics, g_conics, "conics"), (comp, g_comp, "compensations")]:  # fmt: skip
        assert_close(a[both], b[both], **tol, what=name)
        assert (a[~valid] == 0).all(), f"culled {name} must be 0"
    valid = both

    # (compensations are left out: their gradient follows CUDA's 0.5 / (sqrt + 1e-6), not 0.5 / sqrt)
    gen_w = torch.Generator().manual_seed(2)
    weights = [torch.randn(t.shape, generator=gen_w, dtype=dtype) for t in (means2d, depths, conics)]

    def loss(outs):
        return sum(((w * o)[valid]).sum() for w, o in zip(weights, outs))

    loss([means2d, depths, conics]).backward()
    loss([g_means2d, g_depths, g_conics]).backward()
    rtol = 2e-3 if dtype == torch.float32 else 1e-8
    for p, q, name in zip(params, oracle, ["means", "quats", "scales", "viewmats"]):
        assert_grads_close(p.grad, q.grad, rtol=rtol, atol_frac=1e-4 if dtype == torch.float32 else 1e-9, what=name)


def test_projection_opacity_aware_radii_and_clip():
    gen = torch.Generator().manual_seed(3)
    W, H = 64, 48
    means, quats, scales, opacities = random_gaussians(400, gen, log_scale=(-5.0, -2.0))
    means, scales, opacities = with_edge_cases(means, scales, opacities)
    opacities[8:20] = torch.logspace(-3, 0, 12)  # around the 1/255 cut
    viewmats, Ks = random_cameras(2, W, H, gen)
    radius_clip = 1.5
    radii, means2d, _, _, _ = ref.fully_fused_projection(
        means, None, quats, scales, viewmats, Ks, W, H, radius_clip=radius_clip, opacities=opacities
    )
    # Expected from the oracle's 2D covariance and the rules of ProjectionEWA3DGSFused.cu.
    covars, _ = gs._quat_scale_to_covar_preci(quats, scales, compute_preci=False)
    means_c, covars_c = gs._world_to_cam(means, covars, viewmats)
    m2d, cov2d = gs._persp_proj(means_c, covars_c, Ks, W, H)
    var = torch.stack([cov2d[..., 0, 0], cov2d[..., 1, 1]], -1) + 0.3  # [C, N, 2]
    extent = torch.clamp(torch.sqrt(2 * torch.log(opacities.clamp(min=1e-12) * 255.0)), max=3.33)
    arg = extent[None, :, None] * torch.sqrt(var)
    expected = torch.ceil(arg)
    z = means_c[..., 2]
    valid = (z >= 0.01) & (opacities >= 1 / 255)[None]
    valid &= (expected > radius_clip).any(-1)
    inside = (m2d + expected > 0).all(-1) & (m2d[..., 0] - expected[..., 0] < W) & (m2d[..., 1] - expected[..., 1] < H)
    valid &= inside
    expected = torch.where(valid[..., None], expected, 0).int()
    near_integer = ((arg - arg.round()).abs() < 1e-4).any(-1)  # ceil is ill-conditioned there
    ok = (radii == expected).all(-1) | near_integer
    assert ok.all(), f"{(~ok).sum()} radii differ"
    assert (radii[:, 6] == 0).all(), "opacity < 1/255 must be culled"
    assert ((radii > 0).all(-1) == valid).float().mean() > 0.99
    assert (~valid).any() and valid.any()


def test_projection_culled_pass_no_gradient():
    gen = torch.Generator().manual_seed(4)
    W, H = 40, 30
    means, quats, scales, opacities = random_gaussians(10, gen)
    means, scales, opacities = with_edge_cases(means, scales, opacities)
    means = means[:7].clone().requires_grad_()  # all culled except the tiny one (index 5)
    quats, scales = quats[:7].clone().requires_grad_(), scales[:7].clone().requires_grad_()
    viewmats, Ks = random_cameras(1, W, H, gen)
    # (with calc_compensations the tiny one would be culled too: opacity x compensation < 1/255)
    radii, means2d, depths, conics, _ = ref.fully_fused_projection(
        means, None, quats, scales, viewmats, Ks, W, H, near_plane=0.5, far_plane=15.0, opacities=opacities[:7]
    )
    (means2d.sum() + depths.sum() + conics.sum()).backward()
    culled = ~(radii[0] > 0).all(-1)
    assert culled.sum() == 6
    for p in (means, quats, scales):
        assert torch.isfinite(p.grad).all()
        assert (p.grad[culled] == 0).all()
    assert (means.grad[5] != 0).any()


def test_projection_packed_matches_dense():
    gen = torch.Generator().manual_seed(5)
    W, H = 50, 40
    means, quats, scales, opacities, viewmats, Ks = edge_case_scene(200, 3, W, H, gen)
    dense = ref.fully_fused_projection(means, None, quats, scales, viewmats, Ks, W, H, opacities=opacities)
    packed = ref.fully_fused_projection(
        means, None, quats, scales, viewmats, Ks, W, H, packed=True, opacities=opacities
    )
    _, cam, gid = packed[:3]
    valid = (dense[0] > 0).all(-1)
    assert torch.equal(torch.stack([cam, gid], -1), valid.nonzero())
    for d, p in zip(dense[:4], packed[3:7]):
        assert torch.equal(d[cam, gid], p)
    # covars input gives the same as quats + scales
    cov = ref.quat_scale_to_covar(quats, scales)
    triu = cov[:, [0, 0, 0, 1, 1, 2], [0, 1, 2, 1, 2, 2]]
    from_covars = ref.fully_fused_projection(means, triu, None, None, viewmats, Ks, W, H, opacities=opacities)
    assert torch.equal(from_covars[0], dense[0])
    assert_close(from_covars[3], dense[3], rtol=1e-5, atol=1e-5, what="conics from covars")


def test_projection_gradcheck():
    gen = torch.Generator().manual_seed(6)
    W, H = 32, 24
    means, quats, scales, _ = random_gaussians(4, gen, torch.float64, depth=(2.0, 3.0), log_scale=(-2.5, -1.5))
    means[0, 0] = 2.2  # off the FOV limit: clamped Jacobian (still visible through its radius)
    viewmats, Ks = random_cameras(2, W, H, gen, torch.float64)
    radii = ref.fully_fused_projection(means, None, quats, scales, viewmats, Ks, W, H)[0]

    def fn(means, quats, scales, viewmats):
        out = ref.fully_fused_projection(means, None, quats, scales, viewmats, Ks, W, H, calc_compensations=True)
        return out[1], out[2], out[3], out[4]

    assert torch.autograd.gradcheck(fn, [t.clone().requires_grad_() for t in (means, quats, scales, viewmats)])
    assert (radii[:, 1:] > 0).all()


# ------------------------------------------------------------------------------------------------
# Spherical harmonics
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("degree", [0, 1, 2, 3, 4])
def test_spherical_harmonics_matches_gsplat(degree):
    gen = torch.Generator().manual_seed(10 + degree)
    dirs = torch.randn(2, 50, 3, generator=gen, dtype=torch.float64) * 3
    coeffs = torch.randn(2, 50, 25, 3, generator=gen, dtype=torch.float64)
    a = [dirs.clone().requires_grad_(), coeffs.clone().requires_grad_()]
    b = [dirs.clone().requires_grad_(), coeffs.clone().requires_grad_()]
    out = ref.spherical_harmonics(degree, *a)
    expected = gs._spherical_harmonics(degree, *b)
    assert_close(out, expected, rtol=1e-10, atol=1e-12, what="sh")
    w = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    (w * out).sum().backward()
    (w * expected).sum().backward()
    assert_close(a[1].grad, b[1].grad, rtol=1e-10, atol=1e-12, what="v_coeffs")
    if degree > 0:
        assert_close(a[0].grad, b[0].grad, rtol=1e-9, atol=1e-12, what="v_dirs")
    # float32 and masks
    masks = torch.rand(2, 50, generator=gen) > 0.3
    out32 = ref.spherical_harmonics(degree, dirs.float(), coeffs.float(), masks=masks)
    assert_close(out32[masks], expected.detach().float()[masks], rtol=1e-4, atol=1e-5, what="sh f32")
    assert (out32[~masks] == 0).all()


def test_spherical_harmonics_rejects_bad_degree():
    with pytest.raises(ValueError):
        ref.spherical_harmonics(3, torch.randn(5, 3), torch.randn(5, 9, 3))


# ------------------------------------------------------------------------------------------------
# Tile intersection
# ------------------------------------------------------------------------------------------------


def test_isect_tiles_and_offsets_match_gsplat():
    gen = torch.Generator().manual_seed(20)
    W, H = 83, 61  # not multiples of 16
    means, quats, scales, opacities = random_gaussians(150, gen, spread=0.5, log_scale=(-4.0, -1.0))
    means[:, 0] -= 0.3 * means[:, 2]  # leaves the right tiles empty
    means, scales, opacities = with_edge_cases(means, scales, opacities)
    viewmats, Ks = random_cameras(3, W, H, gen)
    radii, means2d, depths, _, _ = ref.fully_fused_projection(
        means, None, quats, scales, viewmats, Ks, W, H, opacities=opacities
    )
    tw, th = math.ceil(W / TILE), math.ceil(H / TILE)
    tpg, isect_ids, flatten_ids = ref.isect_tiles(means2d, radii, depths, TILE, tw, th)
    e_tpg, e_isect_ids, e_flatten_ids = gs._isect_tiles(means2d, radii, depths, TILE, tw, th)
    assert tpg.dtype == torch.int32 and isect_ids.dtype == torch.int64 and flatten_ids.dtype == torch.int32
    assert torch.equal(tpg, e_tpg)
    assert torch.equal(isect_ids, e_isect_ids)
    # gsplat's torch sort is not stable; cub's radix sort (and ours) keeps flatten order on ties
    key = isect_ids * (3 * 150) + flatten_ids.long()
    assert torch.equal(key, torch.sort(e_isect_ids * (3 * 150) + e_flatten_ids.long()).values)
    assert isect_ids.numel() > 100
    offsets = ref.isect_offset_encode(isect_ids, 3, tw, th)
    assert offsets.dtype == torch.int32 and offsets.shape == (3, th, tw)
    assert torch.equal(offsets, gs._isect_offset_encode(isect_ids, 3, tw, th))
    assert (offsets.reshape(-1).diff() == 0).any(), "the scene should have empty tiles"
    # unsorted order is record order, each record's tiles row-major
    _, unsorted, unsorted_flat = ref.isect_tiles(means2d, radii, depths, TILE, tw, th, sort=False)
    assert (unsorted_flat.diff() >= 0).all()
    assert torch.equal(torch.sort(unsorted, stable=True).values, isect_ids)

    # packed layout: same intersections, flatten ids index the packed records
    cam, gid = (radii > 0).all(-1).nonzero().unbind(-1)
    p_tpg, p_isect_ids, p_flatten_ids = ref.isect_tiles(
        means2d[cam, gid], radii[cam, gid], depths[cam, gid], TILE, tw, th,
        packed=True, n_images=3, image_ids=cam, gaussian_ids=gid,
    )  # fmt: skip
    assert torch.equal(p_tpg, tpg[cam, gid])
    assert torch.equal(p_isect_ids, isect_ids)
    assert torch.equal((cam * 150 + gid)[p_flatten_ids.long()], flatten_ids.long())


def test_isect_offset_encode_empty():
    offsets = ref.isect_offset_encode(torch.zeros(0, dtype=torch.int64), 2, 3, 4)
    assert offsets.shape == (2, 4, 3) and (offsets == 0).all()


# ------------------------------------------------------------------------------------------------
# Rasterization
# ------------------------------------------------------------------------------------------------


def brute_force_rasterize(means2d, conics, colors, opacities, width, height, tile_size, offsets, flatten_ids,
                          backgrounds=None, masks=None, differentiable=False):  # fmt: skip
    """Per-pixel loop over each tile's Gaussians with the rules of RasterizeToPixels3DGSFwd.cu.

    Python floats (float64) unless `differentiable`, where each quantity is a 0-d tensor so that
    autograd gives the gradients of exactly this computation.
    """
    m, con, o = means2d.reshape(-1, 2), conics.reshape(-1, 3), opacities.reshape(-1)
    col = colors.reshape(-1, colors.shape[-1])
    D = col.shape[-1]
    if not differentiable:
        m, con, o, col = m.tolist(), con.tolist(), o.tolist(), col.tolist()
    exp = torch.exp if differentiable else math.exp
    val = (lambda x: float(x.detach())) if differentiable else float  # noqa: E731
    image_dims = offsets.shape[:-2]
    th, tw = offsets.shape[-2:]
    I = math.prod(image_dims)
    offs, ids = offsets.reshape(-1).tolist(), flatten_ids.tolist()
    tile_mask = masks.reshape(-1).tolist() if masks is not None else None
    bg = backgrounds.reshape(I, D) if backgrounds is not None else None
    pixels, alphas = [], []
    for i in range(I):
        for y in range(height):
            for x in range(width):
                tile = (i * th + y // tile_size) * tw + x // tile_size
                end = offs[tile + 1] if tile + 1 < len(offs) else len(ids)
                if tile_mask is not None and not tile_mask[tile]:
                    end = offs[tile]
                T, acc = 1.0, [0.0] * D
                for k in range(offs[tile], end):
                    g = ids[k]
                    dx, dy = m[g][0] - (x + 0.5), m[g][1] - (y + 0.5)
                    sigma = 0.5 * (con[g][0] * dx * dx + con[g][2] * dy * dy) + con[g][1] * dx * dy
                    alpha = o[g] * exp(-sigma)
                    if val(alpha) > 0.999:
                        alpha = alpha * 0 + 0.999
                    if val(sigma) < 0 or val(alpha) < 1 / 255:
                        continue
                    next_T = T * (1 - alpha)
                    if val(next_T) <= 1e-4:
                        break
                    acc = [acc[d] + alpha * T * col[g][d] for d in range(D)]
                    T = next_T
                if bg is not None:
                    acc = [acc[d] + T * bg[i][d] for d in range(D)]
                if differentiable:
                    zero = means2d.new_zeros(())
                    pixels.append(torch.stack([a + zero for a in acc]))
                    alphas.append((1 - T) + zero)
                else:
                    pixels.append(acc)
                    alphas.append(1 - T)
    if differentiable:
        colors_out, alphas_out = torch.stack(pixels), torch.stack(alphas)
    else:
        colors_out, alphas_out = torch.tensor(pixels, dtype=torch.float64), torch.tensor(alphas, dtype=torch.float64)
    return colors_out.reshape(image_dims + (height, width, D)), alphas_out.reshape(image_dims + (height, width, 1))


def raster_scene(seed, C, W, H, N, D=3, packed=False, saturated=False, dtype=torch.float32):
    """Projected random scene; `saturated` stacks opaque Gaussians so pixels hit the T <= 1e-4 stop.
    Gaussians sit in the left 60% of the image, so the right tiles are empty."""
    gen = torch.Generator().manual_seed(seed)
    means, quats, scales, opacities = random_gaussians(N, gen, dtype, spread=0.6)
    means[:, 0] -= 0.35 * means[:, 2]
    if saturated:
        opacities[: N // 2] = 0.95 + 0.05 * torch.rand(N // 2, generator=gen, dtype=dtype)
        scales[: N // 2] *= 3
    viewmats, Ks = random_cameras(C, W, H, gen, dtype)
    scene = project_and_bin(means, quats, scales, opacities, viewmats, Ks, W, H, packed=packed)
    lead = scene["means2d"].shape[:-1]
    scene["colors"] = torch.rand(lead + (D,), generator=gen, dtype=dtype)
    scene["backgrounds"] = torch.rand((C, D), generator=gen, dtype=dtype)
    return scene


def rasterize_scene(s, W, H, use_bg=True, packed=False, masks=None, **override):
    args = {k: override.get(k, s[k]) for k in ("means2d", "conics", "colors", "opacities")}
    return ref.rasterize_to_pixels(
        args["means2d"], args["conics"], args["colors"], args["opacities"], W, H, TILE, s["offsets"],
        s["flatten_ids"], backgrounds=override.get("backgrounds", s["backgrounds"]) if use_bg else None,
        masks=masks, packed=packed,
    )  # fmt: skip


@pytest.mark.parametrize(
    "C, W, H, N, D, packed, saturated, backgrounds",
    [
        (1, 37, 29, 60, 3, False, False, False),
        (2, 50, 33, 120, 3, False, True, True),
        (3, 33, 47, 90, 2, True, True, True),
        (2, 48, 32, 80, 5, True, False, True),
    ],
)
def test_rasterize_matches_brute_force(C, W, H, N, D, packed, saturated, backgrounds):
    s = raster_scene(100 + C * N, C, W, H, N, D, packed=packed, saturated=saturated)
    colors, alphas = rasterize_scene(s, W, H, use_bg=backgrounds, packed=packed)
    e_colors, e_alphas = brute_force_rasterize(
        s["means2d"], s["conics"], s["colors"], s["opacities"], W, H, TILE, s["offsets"], s["flatten_ids"],
        backgrounds=s["backgrounds"] if backgrounds else None,
    )  # fmt: skip
    assert colors.shape == (C, H, W, D) and alphas.shape == (C, H, W, 1)
    assert_close(colors.double(), e_colors, rtol=1e-4, atol=2e-5, what="colors")
    assert_close(alphas.double(), e_alphas, rtol=1e-4, atol=2e-5, what="alphas")
    assert (e_alphas == 0).any(), "scene should have empty pixels"
    if saturated:
        assert (e_alphas > 1 - 1.5e-4).any(), "scene should have pixels stopped by T <= 1e-4"


@pytest.mark.parametrize("packed", [False, True])
def test_composite_background_equals_rendering_with_backgrounds(packed):
    """A render without background composited over per-image backgrounds (what the trainer does,
    since gsplat rejects them when packed) equals rendering with them, in value and in the
    gradients of every input, backgrounds included."""
    C, W, H = 2, 37, 29
    s = raster_scene(11, C, W, H, 90, packed=packed, saturated=True)
    names = ("means2d", "conics", "colors", "opacities", "backgrounds")
    weights = torch.rand(C, H, W, 3, generator=torch.Generator().manual_seed(12))
    outs = []
    for composite in (False, True):
        leaves = {k: s[k].clone().requires_grad_(True) for k in names}
        if composite:
            colors, alphas = rasterize_scene(s, W, H, use_bg=False, packed=packed, **leaves)
            image = ref.composite_background(colors, alphas, leaves["backgrounds"])
        else:
            image, _ = rasterize_scene(s, W, H, packed=packed, **leaves)
        grads = torch.autograd.grad((image * weights).sum(), [leaves[k] for k in names])
        outs.append((image.detach(), grads))
    (img_a, g_a), (img_b, g_b) = outs
    assert_close(img_b, img_a, rtol=1e-6, atol=1e-6, what="image")
    assert float((img_a - s["backgrounds"][:, None, None, :]).abs().min()) == 0.0  # empty pixels show it
    for name, a, b in zip(names, g_a, g_b):
        assert_grads_close(b, a, what=name)
    assert ref.composite_background(img_a, img_a[..., :1], None) is img_a


def test_rasterize_masks_render_background():
    C, W, H = 2, 40, 36
    s = raster_scene(7, C, W, H, 80)
    masks = torch.rand(s["offsets"].shape, generator=torch.Generator().manual_seed(8)) > 0.4
    colors, alphas = rasterize_scene(s, W, H, masks=masks)
    e_colors, e_alphas = brute_force_rasterize(
        s["means2d"], s["conics"], s["colors"], s["opacities"], W, H, TILE, s["offsets"], s["flatten_ids"],
        backgrounds=s["backgrounds"], masks=masks,
    )  # fmt: skip
    assert_close(colors.double(), e_colors, rtol=1e-4, atol=2e-5, what="masked colors")
    assert_close(alphas.double(), e_alphas, rtol=1e-4, atol=2e-5, what="masked alphas")


@pytest.mark.parametrize("packed", [False, True])
def test_rasterize_gradients_match_brute_force(packed):
    C, W, H = 2, 20, 18
    s = raster_scene(31, C, W, H, 30, saturated=True, packed=packed, dtype=torch.float64)
    names = ("means2d", "conics", "colors", "opacities", "backgrounds")
    mine = {k: s[k].detach().clone().requires_grad_() for k in names}
    oracle = {k: s[k].detach().clone().requires_grad_() for k in names}
    colors, alphas = rasterize_scene(s, W, H, packed=packed, **mine)
    e_colors, e_alphas = brute_force_rasterize(
        oracle["means2d"], oracle["conics"], oracle["colors"], oracle["opacities"], W, H, TILE, s["offsets"],
        s["flatten_ids"], backgrounds=oracle["backgrounds"], differentiable=True,
    )  # fmt: skip
    assert_close(colors, e_colors, rtol=1e-9, atol=1e-10, what="colors f64")
    assert_close(alphas, e_alphas, rtol=1e-9, atol=1e-10, what="alphas f64")
    gen = torch.Generator().manual_seed(32)
    wc = torch.randn(colors.shape, generator=gen, dtype=torch.float64)
    wa = torch.randn(alphas.shape, generator=gen, dtype=torch.float64)
    ((wc * colors).sum() + (wa * alphas).sum()).backward()
    ((wc * e_colors).sum() + (wa * e_alphas).sum()).backward()
    for k in names:
        assert mine[k].grad.abs().sum() > 0, k
        assert_grads_close(mine[k].grad, oracle[k].grad, rtol=1e-7, atol_frac=1e-9, what=f"v_{k}")


def test_rasterize_float32_gradients_match_float64():
    C, W, H = 2, 45, 38
    s = raster_scene(41, C, W, H, 150, saturated=True)
    names = ("means2d", "conics", "colors", "opacities", "backgrounds")
    p32 = {k: s[k].detach().clone().requires_grad_() for k in names}
    p64 = {k: s[k].detach().double().requires_grad_() for k in names}
    c32, a32 = rasterize_scene(s, W, H, **p32)
    c64, a64 = rasterize_scene(s, W, H, **p64)
    gen = torch.Generator().manual_seed(42)
    wc = torch.randn(c64.shape, generator=gen, dtype=torch.float64)
    wa = torch.randn(a64.shape, generator=gen, dtype=torch.float64)
    ((wc.float() * c32).sum() + (wa.float() * a32).sum()).backward()
    ((wc * c64).sum() + (wa * a64).sum()).backward()
    for k in names:
        assert_grads_close(p32[k].grad.double(), p64[k].grad, rtol=1e-3, atol_frac=1e-4, what=f"v_{k} f32")


def test_rasterize_gradcheck():
    """Finite differences on a tiny scene away from the discontinuities (all alphas well above
    1/255 and below 0.999, T far from 1e-4)."""
    W, H = 9, 7
    means2d = torch.tensor([[[3.0, 2.5], [6.2, 4.1], [4.4, 3.3]]], dtype=torch.float64)
    conics = torch.tensor([[[0.05, 0.01, 0.06], [0.04, -0.012, 0.05], [0.08, 0.02, 0.07]]], dtype=torch.float64)
    opacities = torch.tensor([[0.6, 0.5, 0.7]], dtype=torch.float64)
    colors = torch.rand(1, 3, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    backgrounds = torch.tensor([[0.2, 0.7]], dtype=torch.float64)
    radii = torch.full((1, 3, 2), 20, dtype=torch.int32)
    depths = torch.tensor([[1.0, 3.0, 2.0]], dtype=torch.float64)
    _, isect_ids, flatten_ids = ref.isect_tiles(means2d, radii, depths, TILE, 1, 1)
    offsets = ref.isect_offset_encode(isect_ids, 1, 1, 1)

    def fn(m, c, col, o, bg):
        return ref.rasterize_to_pixels(m, c, col, o, W, H, TILE, offsets, flatten_ids, backgrounds=bg)

    inputs = [t.clone().requires_grad_() for t in (means2d, conics, colors, opacities, backgrounds)]
    assert torch.autograd.gradcheck(fn, inputs)


def test_rasterize_empty_scene_renders_background():
    C, W, H = 2, 20, 17
    means2d = torch.zeros(C, 4, 2, requires_grad=True)
    conics, opacities = torch.ones(C, 4, 3), torch.full((C, 4), 0.5, requires_grad=True)
    colors, bg = torch.rand(C, 4, 3), torch.rand(C, 3)
    radii = torch.zeros(C, 4, 2, dtype=torch.int32)  # all culled
    _, isect_ids, flatten_ids = ref.isect_tiles(means2d, radii, torch.ones(C, 4), TILE, 2, 2)
    offsets = ref.isect_offset_encode(isect_ids, C, 2, 2)
    img, alpha = ref.rasterize_to_pixels(means2d, conics, colors, opacities, W, H, TILE, offsets, flatten_ids,
                                         backgrounds=bg)  # fmt: skip
    assert isect_ids.numel() == 0
    assert torch.equal(img, bg[:, None, None, :].expand(C, H, W, 3)) and (alpha == 0).all()
    (img.sum() + alpha.sum()).backward()
    assert (means2d.grad == 0).all() and (opacities.grad == 0).all()


def test_compositing_weights_sum_to_alpha():
    C, W, H = 2, 40, 30
    s = raster_scene(51, C, W, H, 100, saturated=True)
    pixel_ids, record_ids, weights, T = ref.compositing_weights(
        s["means2d"], s["conics"], s["opacities"], W, H, TILE, s["offsets"], s["flatten_ids"]
    )
    _, alphas = rasterize_scene(s, W, H)
    per_pixel = torch.zeros(C * H * W, dtype=torch.float64).index_add(0, pixel_ids, weights.double())
    assert_close(per_pixel.reshape(C, H, W).float(), 1 - T, rtol=1e-5, atol=1e-5, what="sum of weights")
    assert_close(alphas[..., 0], 1 - T, what="alphas")
    assert ((weights > 0) & (weights <= 0.999)).all()


@pytest.mark.parametrize("wave_depth, chunk_elements", [(3, 256 * 7), (1000, 1 << 16)])
def test_rasterize_independent_of_waves_and_chunks(monkeypatch, wave_depth, chunk_elements):
    """Depth waves (with finished tiles dropping out) and memory chunks only change the schedule."""
    C, W, H = 2, 30, 20
    s = raster_scene(61, C, W, H, 200, saturated=True)
    colors, alphas = rasterize_scene(s, W, H)
    monkeypatch.setattr(ref, "WAVE_DEPTH", wave_depth)
    monkeypatch.setattr(ref, "CHUNK_ELEMENTS", chunk_elements)
    colors_2, alphas_2 = rasterize_scene(s, W, H)
    assert_close(colors_2, colors, rtol=1e-6, atol=1e-6, what="colors")
    assert_close(alphas_2, alphas, rtol=1e-6, atol=1e-6, what="alphas")
    e_colors, _ = brute_force_rasterize(s["means2d"], s["conics"], s["colors"], s["opacities"], W, H, TILE,
                                        s["offsets"], s["flatten_ids"], backgrounds=s["backgrounds"])  # fmt: skip
    assert_close(colors_2.double(), e_colors, rtol=1e-4, atol=2e-5, what="colors vs brute force")


def test_end_to_end_no_nan_and_no_gradient_from_culled():
    """Projection -> SH -> rasterization with culled Gaussians: finite, culled grads exactly 0."""
    gen = torch.Generator().manual_seed(71)
    W, H = 48, 40
    means, quats, scales, opacities, viewmats, Ks = edge_case_scene(120, 2, W, H, gen)
    sh = torch.randn(120, 16, 3, generator=gen) * 0.3
    params = [t.clone().requires_grad_() for t in (means, quats, scales, opacities, sh)]
    s = project_and_bin(params[0], params[1], params[2], params[3], viewmats, Ks, W, H, near_plane=0.5, far_plane=15.0)
    dirs = params[0][None] - torch.linalg.inv(viewmats)[:, None, :3, 3]
    colors = torch.clamp(ref.spherical_harmonics(3, dirs, params[4].expand(2, -1, -1, -1)) + 0.5, min=0.0)
    img, alpha = ref.rasterize_to_pixels(s["means2d"], s["conics"], colors, s["opacities"], W, H, TILE,
                                         s["offsets"], s["flatten_ids"])  # fmt: skip
    (img.sum() + alpha.sum()).backward()
    for p in params:
        assert torch.isfinite(p.grad).all()
    for i in range(5):
        assert (params[0].grad[i] == 0).all() and (params[2].grad[i] == 0).all()


def test_projection_degenerate_inputs_finite():
    """Zero scales (compensation 0), a mean exactly on the FOV clamp limit: finite gradients."""
    gen = torch.Generator().manual_seed(75)
    W, H = 30, 20
    means, quats, scales, opacities = random_gaussians(6, gen, depth=(2.0, 3.0))
    means[:2] = torch.tensor([[0.1, 0.1, 2.0], [-0.1, 0.0, 2.5]])
    scales[0] = 0.0
    scales[1, 2] = 0.0
    viewmats, Ks = torch.eye(4)[None], torch.tensor([[[30.0, 0.0, 15.0], [0.0, 30.0, 10.0], [0.0, 0.0, 1.0]]])
    means[2] = torch.tensor([(15 / 30 + 0.3 * 0.5) * 2.0, 0.0, 2.0])  # x/z == lim_x_pos
    scales[2] = 0.3  # large enough to reach into the image
    params = [t.clone().requires_grad_() for t in (means, quats, scales)]
    out = ref.fully_fused_projection(params[0], None, *params[1:3], viewmats, Ks, W, H, calc_compensations=True)
    assert (out[0][0, :3] > 0).all(), "degenerate Gaussians still project (blurred)"
    assert out[4][0, 0] == 0
    (out[1].sum() + out[2].sum() + out[3].sum() + out[4].sum()).backward()
    for p in params:
        assert torch.isfinite(p.grad).all()
    # with opacities, compensation 0 makes the opacity < 1/255: culled, as in gsplat
    out = ref.fully_fused_projection(
        params[0], None, *params[1:3], viewmats, Ks, W, H, calc_compensations=True, opacities=opacities
    )
    assert (out[0][0, 0] == 0).all() and (out[0][0, 1:3] > 0).all()


def _gpu_pipeline(mod, W, H, means, quats, scales, opacities, viewmats, Ks, colors, bg):
    """Projection -> binning -> rasterization through `mod` (the reference or gsplat)."""
    C = viewmats.shape[0]
    radii, m2d, depths, conics, _ = mod.fully_fused_projection(
        means, None, quats, scales, viewmats, Ks, W, H, near_plane=0.5, far_plane=15.0, opacities=opacities
    )
    tw, th = math.ceil(W / TILE), math.ceil(H / TILE)
    _, isect_ids, flatten_ids = mod.isect_tiles(m2d, radii, depths, TILE, tw, th)
    offsets = mod.isect_offset_encode(isect_ids, C, tw, th)
    img, alpha = mod.rasterize_to_pixels(m2d, conics, colors, opacities.expand(C, -1).contiguous(), W, H, TILE,
                                         offsets, flatten_ids, backgrounds=bg)  # fmt: skip
    return radii, isect_ids, offsets, img, alpha


def _gpu_inputs(device):
    gen = torch.Generator().manual_seed(81)
    C, W, H, N = 3, 150, 101, 4000
    means, quats, scales, opacities = random_gaussians(N, gen, spread=0.8, log_scale=(-4.5, -2.0))
    means, scales, opacities = with_edge_cases(means, scales, opacities)
    opacities[: N // 4] = 0.97  # saturated pixels
    viewmats, Ks = random_cameras(C, W, H, gen)
    colors, bg = torch.rand(C, N, 3, generator=gen), torch.rand(C, 3, generator=gen)
    weights = torch.randn(C, H, W, 3, generator=gen)
    tensors = [t.to(device) for t in (means, quats, scales, opacities, viewmats, Ks, colors, bg)]
    return W, H, tensors, weights.to(device)


def _compare_pipelines(mod_a, device_a, mod_b, device_b, rtol):
    W, H, tensors, weights = _gpu_inputs(device_a)
    a = [t.clone().requires_grad_() for t in tensors]
    b = [t.to(device_b).requires_grad_() for t in tensors]
    out_a = _gpu_pipeline(mod_a, W, H, *a)
    out_b = _gpu_pipeline(mod_b, W, H, *b)
    assert (out_a[0] == out_b[0].to(device_a)).float().mean() > 0.999, "radii"
    assert (out_a[1] == out_b[1].to(device_a)).float().mean() > 0.99, "isect ids"
    assert (out_a[2] == out_b[2].to(device_a)).float().mean() > 0.99, "offsets"
    assert_close(out_a[3], out_b[3].to(device_a), rtol=rtol, atol=rtol, what="colors")
    assert_close(out_a[4], out_b[4].to(device_a), rtol=rtol, atol=rtol, what="alphas")
    (weights * out_a[3]).sum().backward()
    (weights.to(device_b) * out_b[3]).sum().backward()
    for name, p, q in zip(["means", "quats", "scales", "opacities", "viewmats", "Ks", "colors", "bg"], a, b):
        if name == "Ks":
            continue  # gsplat gives Ks no gradient
        cos = torch.nn.functional.cosine_similarity(p.grad.flatten(), q.grad.to(device_a).flatten(), dim=0)
        assert torch.isfinite(p.grad).all() and cos > 0.999, f"v_{name}: cosine {cos.item():.6f}"


@pytest.mark.gpu
def test_reference_on_cuda_matches_cpu():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    _compare_pipelines(ref, torch.device("cuda"), ref, torch.device("cpu"), rtol=1e-4)


@pytest.mark.gpu
def test_matches_gsplat_cuda():
    """The reference (on the GPU) against gsplat's CUDA kernels: values and gradients."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from gsplat.cuda._backend import _C

    if _C is None:
        pytest.skip("gsplat's CUDA extension is not built")
    import gsplat

    _compare_pipelines(ref, torch.device("cuda"), gsplat, torch.device("cuda"), rtol=1e-3)


# ------------------------------------------------------------------------------------------------
# Timing (python tests/test_reference.py)
# ------------------------------------------------------------------------------------------------


def benchmark(W, H, N, repeats=5, seed=0, device="cpu"):
    """Forward+backward of projection -> SH (degree 3) -> binning -> rasterization, 1 camera."""
    gen = torch.Generator().manual_seed(seed)
    means, quats, scales, opacities = random_gaussians(N, gen, depth=(2.0, 6.0), spread=0.9, log_scale=(-4.6, -2.8))
    viewmats, Ks = (t.to(device) for t in random_cameras(1, W, H, gen))
    sh = torch.randn(N, 16, 3, generator=gen) * 0.2
    params = [t.to(device).requires_grad_() for t in (means, quats, scales, opacities, sh)]
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    times = []
    for _ in range(repeats):
        for p in params:
            p.grad = None
        sync()
        t0 = time.perf_counter()
        s = project_and_bin(params[0], params[1], params[2], params[3], viewmats, Ks, W, H)
        dirs = params[0][None] - torch.linalg.inv(viewmats)[:, None, :3, 3]
        colors = torch.clamp(ref.spherical_harmonics(3, dirs, params[4][None]) + 0.5, min=0.0)
        sync()
        t1 = time.perf_counter()
        img, alpha = ref.rasterize_to_pixels(s["means2d"], s["conics"], colors, s["opacities"], W, H, TILE,
                                             s["offsets"], s["flatten_ids"])  # fmt: skip
        sync()
        t2 = time.perf_counter()
        (img.mean() + alpha.mean()).backward()
        sync()
        times.append((time.perf_counter() - t0, t1 - t0, t2 - t1, time.perf_counter() - t2))
    total, proj, raster, backward = min(times)
    print(f"{device} {W}x{H} px, {N} Gaussians, {s['flatten_ids'].numel()} tile intersections, "
          f"mean alpha {alpha.mean():.2f}: forward+backward {total * 1e3:.0f} ms (projection+SH+binning "
          f"{proj * 1e3:.0f}, rasterization {raster * 1e3:.0f}, backward {backward * 1e3:.0f}), "
          f"torch threads {torch.get_num_threads()}")  # fmt: skip


if __name__ == "__main__":
    import sys

    device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    benchmark(128, 128, 5000, device=device)
    benchmark(200, 150, 30000, device=device)
