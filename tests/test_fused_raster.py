"""Tests of splat_train.kernels.fused_raster (ByteSplat fused rasterization + tile-local loss).

The native kernel's source (kernels/csrc/fused_raster.cuh) runs on the CPU under the emulation of
tests/csrc/cpu_emu.h (one host thread per GPU thread, warp shuffles and barriers emulated), at
warp sizes 32 (NVIDIA) and 64 (AMD wavefronts), and is compared with the REFERENCE
(kernels.reference.rasterize_to_pixels + the PyTorch tile-local loss, autograd). Scenes are
fresh seeded random 2D records (means2d, conics, colours, opacities) with gsplat-style tile lists
from kernels.reference.isect_tiles, or hand-made lists of chosen lengths (0, 1, 255, 256, 257 and
over 2,000 Gaussians in a tile). tests/test_gpu_fused_raster.py runs the compiled kernel on a GPU.

Errors: the loss within relative 1e-5, each gradient tensor within ||a - b|| / ||b|| <= 1e-4 (atomics
reorder sums); NaN never passes. The image and per-tile partial sums start NaN-filled, so a pixel
or tile the kernel fails to write fails; records in no tile must keep an exactly zero gradient.
"""

import itertools
import math
import shutil

import pytest
import torch

from splat_train.kernels import fused_raster as fr
from splat_train.kernels import reference as ref

LOSS_TOL = 1e-5
GRAD_TOL = 1e-4
GRAD_NAMES = fr.GRAD_NAMES  # the differentiable inputs, in the kernel's order

# name -> scene / call parameters (make_scene / make_list_scene)
CASES = {
    "dense_bg_border": dict(I=2, H=40, W=50, N=160, seed=1, packed=False, bg=True, lam=0.2),
    "packed_three_images": dict(I=3, H=47, W=33, N=120, seed=2, packed=True, bg=True, lam=0.2),
    # absgrad=False: the kernel's instantiation without the absolute-gradient sums (the default)
    "saturated_no_bg": dict(
        I=1, H=36, W=64, N=100, seed=3, packed=False, bg=False, lam=0.2, saturate=60, absgrad=False
    ),
    "ssim_only_packed": dict(I=2, H=20, W=37, N=80, seed=5, packed=True, bg=False, lam=1.0),
    "opaque_front_wall": dict(I=2, H=30, W=80, N=400, seed=6, packed=False, bg=True, lam=0.2, wall=6),
    # the ground truth covers x >= 5, y >= 11 only (--random_tile_shift): both layouts
    "origin_dense": dict(I=2, H=40, W=50, N=160, seed=8, packed=False, bg=True, lam=0.2, origin=(5, 11)),
    "origin_packed": dict(
        I=2, H=47, W=33, N=120, seed=9, packed=True, bg=False, lam=0.5, origin=(15, 1), absgrad=False
    ),
    # hand-made tile lists: the list lengths of every tile (I = 1, 2 x 3 tiles of 16 px)
    "list_lengths": dict(lists=(0, 1, 255, 256, 257, 2100), seed=11, bg=True, lam=0.2, origin=(3, 2)),
    "list_lengths_saturated": dict(lists=(33, 64, 0, 300, 700, 65), seed=12, bg=False, lam=0.2, opaque=True),
    "list_lengths_no_absgrad": dict(lists=(0, 1, 255, 256, 257, 2100), seed=13, bg=True, lam=0.2, absgrad=False),
}
WARP_SIZES = {
    "list_lengths": (32, 64),
    "dense_bg_border": (32, 64),
    "packed_three_images": (64,),
    "list_lengths_no_absgrad": (32, 64),
}


# ------------------------------------------------------------------------------------------------
# Scenes
# ------------------------------------------------------------------------------------------------


def make_scene(I, H, W, N, seed, packed, bg, saturate=0, wall=0, origin=(0, 0), **_):
    """Random records of I images plus tile lists; the first tile column of every image stays empty.

    saturate: that many extra nearly opaque (opacity 0.995-1) wide Gaussians stacked on one spot,
    so pixels there hit the T <= 1e-4 stop. wall (dense only): the last ``wall`` records become
    opaque Gaussians 100 px wide in front of everything else, over every tile but the first
    column: with alpha >= 0.92 each, every pixel there stops inside the wall, long before its
    tile's list ends (the streaming variant's early exit). Packed scenes drop ~30% of records
    (culled) and list the rest per image. The ground truth covers the pixels x >= origin[0],
    y >= origin[1]. Returns a dict of tensors / ints.
    """
    gen = torch.Generator().manual_seed(seed)
    u = lambda *s: torch.rand(*s, generator=gen)  # noqa: E731
    means2d = torch.stack([u(I, N) * (W + 12) - 6, u(I, N) * (H + 12) - 6], -1)
    L = torch.randn(I, N, 2, 2, generator=gen) * 1.2 + torch.eye(2) * 1.5
    cov = L @ L.transpose(-1, -2) + 0.3 * torch.eye(2)
    opacities = 0.05 + 0.9 * u(I, N)
    if saturate:
        s = slice(0, saturate)
        means2d[:, s] = torch.tensor([W * 0.75, H * 0.5]) + u(I, saturate, 2) * 4 - 2
        cov[:, s] = torch.eye(2) * (20.0 + 10 * u(I, saturate, 1, 1))
        opacities[:, s] = 0.995 + 0.005 * u(I, saturate)
    depths = 1.0 + u(I, N)
    if wall:
        s = slice(N - wall, N)
        means2d[:, s] = torch.tensor([W * 0.6, H * 0.5])
        cov[:, s] = torch.eye(2) * 1e4
        opacities[:, s] = 1.0
        depths[:, s] = 0.1 + 0.01 * torch.arange(wall)
    inv = torch.linalg.inv(cov)
    conics = torch.stack([inv[..., 0, 0], inv[..., 0, 1], inv[..., 1, 1]], -1)
    colors = u(I, N, 3)
    radii = torch.ceil(3.0 * torch.sqrt(torch.stack([cov[..., 0, 0], cov[..., 1, 1]], -1))).int()
    if wall:  # reach every tile but the first column
        radii[:, N - wall :] = torch.tensor([int(W * 0.6) - fr.TILE_SIZE - 1, 10 * H], dtype=radii.dtype)
    tw, th = math.ceil(W / fr.TILE_SIZE), math.ceil(H / fr.TILE_SIZE)
    left = means2d[..., 0] - radii[..., 0] < fr.TILE_SIZE  # would touch the first tile column
    if packed:
        keep = (u(I, N) > 0.3) & ~left
        image_ids = torch.arange(I)[:, None].expand(I, N)[keep]
        means2d, conics, colors, opacities = means2d[keep], conics[keep], colors[keep], opacities[keep]
        radii, depths = radii[keep], depths[keep]
        _, isect_ids, flatten_ids = ref.isect_tiles(
            means2d, radii, depths, fr.TILE_SIZE, tw, th, packed=True, n_images=I, image_ids=image_ids
        )
    else:
        radii[left] = 0
        radii[:, : N // 10] = 0  # culled records: in no tile, gradient must stay exactly 0
        _, isect_ids, flatten_ids = ref.isect_tiles(means2d, radii, depths, fr.TILE_SIZE, tw, th)
    offsets = ref.isect_offset_encode(isect_ids, I, tw, th)
    return dict(
        means2d=means2d, conics=conics, colors=colors, opacities=opacities, isect_offsets=offsets,
        flatten_ids=flatten_ids, gts=u(I, H - origin[1], W - origin[0], 3), width=W, height=H,
        backgrounds=u(I, 3) if bg else None, packed=packed, origin=origin,
    )  # fmt: skip


def make_list_scene(lists, seed, bg, opaque=False, origin=(0, 0), **_):
    """One 48 x 32 image (2 x 3 tiles) whose tile t lists ``lists[t]`` Gaussians of its own, small
    (sigma 1-2.5 px) and faint (opacity 0.01-0.06, so pixels rarely saturate and every bucket of a
    long list composites), centred in the tile, in a random depth order; ``opaque``: opacities
    0.3-1, so most pixels stop early. Dense layout [1, N]."""
    gen = torch.Generator().manual_seed(seed)
    u = lambda *s: torch.rand(*s, generator=gen)  # noqa: E731
    W, H, ts = 48, 32, fr.TILE_SIZE
    tw = W // ts
    means, ids = [], []
    for t, n in enumerate(lists):
        ty, tx = divmod(t, tw)
        means.append(torch.stack([tx * ts + u(n) * ts, ty * ts + u(n) * ts], -1))
        ids.append(torch.randperm(n, generator=gen) + sum(lists[:t]))
    N = sum(lists)
    means2d = torch.cat(means)[None]
    sig = 1.0 + 1.5 * u(1, N, 2)
    rho = 0.6 * u(1, N) - 0.3
    cov = torch.stack(
        [sig[..., 0] ** 2, rho * sig[..., 0] * sig[..., 1], rho * sig[..., 0] * sig[..., 1], sig[..., 1] ** 2], -1
    ).reshape(1, N, 2, 2)
    inv = torch.linalg.inv(cov)
    conics = torch.stack([inv[..., 0, 0], inv[..., 0, 1], inv[..., 1, 1]], -1)
    opacities = (0.3 + 0.7 * u(1, N)) if opaque else (0.01 + 0.05 * u(1, N))
    counts = torch.tensor(lists)
    offsets = (torch.cumsum(counts, 0) - counts).to(torch.int32).reshape(1, H // ts, tw)
    return dict(
        means2d=means2d, conics=conics, colors=u(1, N, 3), opacities=opacities, isect_offsets=offsets,
        flatten_ids=torch.cat(ids).to(torch.int32), gts=u(1, H - origin[1], W - origin[0], 3), width=W, height=H,
        backgrounds=u(1, 3) if bg else None, packed=False, origin=origin,
    )  # fmt: skip


def scene_of(params):
    return make_list_scene(**params) if "lists" in params else make_scene(**params)


def _leaves(scene):
    names = [n for n in GRAD_NAMES if scene[n] is not None]
    return names, [scene[n].clone().requires_grad_(True) for n in names]


def _call(fn, scene, leaves, names, **kw):
    args = dict(scene, **dict(zip(names, leaves)))
    return fn(
        args["means2d"],
        args["conics"],
        args["colors"],
        args["opacities"],
        args["isect_offsets"],
        args["flatten_ids"],
        args["gts"],
        args["width"],
        args["height"],
        backgrounds=args["backgrounds"],
        packed=args["packed"],
        origin=args["origin"],
        **kw,
    )


def rel_norm(a, b):
    """||a - b|| / ||b||; NaN if a has a non-finite element."""
    if not torch.isfinite(a).all():
        return math.nan
    return ((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-30)).item()


TIE = 1e-5


# a pair whose alpha = o exp(-sigma) lies within this relative margin of the skip threshold 1/255 or
# of the clamp 0.999 moves its Gaussian's opacity (away_from_thresholds)
THRESHOLD_MARGIN = 1e-4


def away_from_thresholds(scene):
    """The scene with the opacity of each record that has a (pixel, record) pair of its tile lists
    within THRESHOLD_MARGIN (relative) of alpha = 1/255 (skipped below) or of raw alpha = 0.999
    (clamped above, where d alpha / d opacity, sigma becomes 0) raised by 0.1%, until none has.
    The kernel's exponential (__expf on CUDA) and the reference's differ by a few float32 roundings,
    so at such a pair they can decide differently: a jump in the image and the gradients that says
    nothing about the kernel (a fresh GPU seed of ``list_lengths_no_absgrad``, whose faint
    Gaussians cross 1/255 often, met one in 2026-12: image 8.8e-5, means2d 1.1e-4 relative)."""
    offsets = scene["isect_offsets"]
    I, th, tw = offsets.shape
    W, H, ts = scene["width"], scene["height"], fr.TILE_SIZE
    flat = offsets.reshape(-1).long().tolist() + [scene["flatten_ids"].numel()]
    fids = scene["flatten_ids"].long()
    means = scene["means2d"].reshape(-1, 2).double()
    conics = scene["conics"].reshape(-1, 3).double()
    opac = scene["opacities"].reshape(-1).double().clone()
    for _ in range(5):
        near = torch.zeros_like(opac, dtype=torch.bool)
        for t in range(I * th * tw):
            ids = fids[flat[t] : flat[t + 1]]
            if ids.numel() == 0:
                continue
            ty, tx = divmod(t % (th * tw), tw)
            ys, xs = torch.meshgrid(
                torch.arange(ty * ts, min(H, ty * ts + ts)), torch.arange(tx * ts, min(W, tx * ts + ts)), indexing="ij"
            )
            px = xs.reshape(-1).double() + 0.5
            py = ys.reshape(-1).double() + 0.5
            dx = means[ids, 0:1] - px
            dy = means[ids, 1:2] - py
            a, b, c = conics[ids, 0:1], conics[ids, 1:2], conics[ids, 2:3]
            raw = opac[ids, None] * torch.exp(-(0.5 * (a * dx * dx + c * dy * dy) + b * dx * dy))
            close = ((raw * 255.0 - 1.0).abs() < THRESHOLD_MARGIN) | ((raw / 0.999 - 1.0).abs() < THRESHOLD_MARGIN)
            near[ids[close.any(1)]] = True
        if not near.any():
            break
        opac[near] *= 1.001
    shape = scene["opacities"].shape
    return dict(scene, opacities=opac.to(scene["opacities"].dtype).reshape(shape))


def away_from_ties(scene):
    """The scene with each ground-truth value within TIE of the reference render set to the render
    plus (or minus) 2 TIE. L1's gradient is sign(x - y): where the render equals the ground truth to a rounding, the
    kernel's and the reference's renders (equal within float32 rounding) can take different signs,
    a gradient difference of l1_scale at that pixel that says nothing about the kernel (a fresh
    seed of ``list_lengths`` met one in 2026-12: relative gradient error 0.7%, red channel only)."""
    names, leaves = _leaves(scene)
    with torch.no_grad():
        _, image = _call(fr.reference_fused_loss, scene, leaves, names, ssim_lambda=0.2)
    ox, oy = scene["origin"]
    x, y = image[:, oy:, ox:], scene["gts"]
    near = (x - y).abs() < TIE
    moved = torch.where(x + 2 * TIE <= 1.0, x + 2 * TIE, x - 2 * TIE)
    return dict(scene, gts=torch.where(near, moved, y))


def compare(params, fn, **kw):
    """Kernel (``fn``: the emulated or the compiled one) vs reference for one case: a dict of the
    relative errors of the loss, the image and each gradient, and flags."""
    scene = away_from_ties(away_from_thresholds(scene_of(params)))
    names, leaves = _leaves(scene)
    ref_terms: dict = {}
    absgrad = params.get("absgrad", True)
    ref_loss, ref_image = _call(
        fr.reference_fused_loss, scene, leaves, names, ssim_lambda=params["lam"], terms=ref_terms, absgrad=absgrad
    )
    ref_grads = torch.autograd.grad(ref_loss, leaves)
    ref_absgrad = leaves[0].absgrad.reshape(-1, 2) if absgrad else None
    dev_scene = {k: (v.to(kw.get("device", "cpu")) if torch.is_tensor(v) else v) for k, v in scene.items()}
    kw.pop("device", None)
    names, leaves = _leaves(dev_scene)
    loss, stats = _call(
        fn, dev_scene, leaves, names, ssim_lambda=params["lam"], return_image=True, absgrad=absgrad, **kw
    )
    grads = [g.cpu() for g in torch.autograd.grad(2.5 * loss, leaves)]  # backward scales by the incoming gradient
    out = {
        "loss": abs(loss.item() - ref_loss.item()) / abs(ref_loss.item()),
        "image": rel_norm(stats["image"].cpu(), ref_image.detach()),
        # the loss's terms, as the trainer logs them: L1 relative to L1, and SSIM relative to the
        # D-SSIM term 1 - SSIM that enters the loss (the SSIM of these random scenes can lie near 0,
        # where a relative error of SSIM itself says nothing: a fresh GPU seed met 1.8e-4 there)
        "terms": max(
            abs(float(stats["l1"]) - float(ref_terms["l1"])) / abs(float(ref_terms["l1"])),
            abs(float(stats["ssim"]) - float(ref_terms["ssim"])) / abs(1.0 - float(ref_terms["ssim"])),
        ),
    }
    used = torch.zeros(scene["means2d"].reshape(-1, 2).shape[0], dtype=torch.bool)
    used[scene["flatten_ids"].long()] = True
    untouched_exact = True
    for n, g, rg in zip(names, grads, ref_grads):
        out[n] = rel_norm(g / 2.5, rg)
        if n != "backgrounds":
            untouched_exact &= bool((g.reshape(used.numel(), -1)[~used] == 0).all())
    out["untouched_exact"] = untouched_exact
    unscaled = grads[0].reshape(-1, 2) / 2.5
    if absgrad:
        got = stats["absgrad"].cpu()
        out["absgrad_bound"] = bool((got >= unscaled.abs() * (1 - 1e-4) - 1e-12).all())
        out["absgrad"] = rel_norm(got, ref_absgrad)
    else:
        out["absgrad_bound"] = stats["absgrad"] is None
        out["absgrad"] = 0.0
    counts = torch.diff(
        torch.cat([scene["isect_offsets"].reshape(-1).long(), torch.tensor([scene["flatten_ids"].numel()])])
    )
    out["counts"] = counts.tolist()
    T = (
        1.0
        - ref.rasterize_to_pixels(
            scene["means2d"],
            scene["conics"],
            scene["colors"],
            scene["opacities"],
            scene["width"],
            scene["height"],
            fr.TILE_SIZE,
            scene["isect_offsets"],
            scene["flatten_ids"],
            packed=scene["packed"],
        )[1]
    )
    out["min_final_T"] = T.min().item()
    return out


def assert_matches(r, params, case):
    assert r["loss"] <= LOSS_TOL, f"{case}: loss relative error {r['loss']}"  # NaN fails too
    # the logged terms: float32 sums of |x - y| and of the SSIM map over a tile's 256 pixels, in
    # another order than the reference's (their combination, the loss, is held to LOSS_TOL)
    assert r["terms"] <= 1e-4, f"{case}: l1 / d-ssim relative error {r['terms']}"
    keys = ("image", "absgrad") + GRAD_NAMES
    for key in keys:
        if key == "backgrounds" and not params["bg"]:
            continue
        assert r[key] <= GRAD_TOL, f"{case}: {key} relative error {r[key]}"
    assert r["untouched_exact"], f"{case}: records in no tile got a non-zero gradient"
    assert r["absgrad_bound"], f"{case}: absgrad smaller than |grad|, or returned when not asked for"


# ------------------------------------------------------------------------------------------------
# The kernel's source, emulated on the CPU
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def emulation():
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler to build the CPU emulation of the native kernel")
    from splat_train.kernels import native

    return native.load_cpu_emulation()


EMULATED = [(case, w) for case in CASES for w in WARP_SIZES.get(case, (32,))]


@pytest.mark.parametrize("case, warp_size", EMULATED)
def test_kernel_source_matches_reference(emulation, case, warp_size):
    params = CASES[case]
    r = compare(params, fr.emulated_fused_raster_loss, warp_size=warp_size)
    assert_matches(r, params, f"{case} (warp {warp_size})")
    if case == "list_lengths":  # the lengths the issue names, one tile each, fully composited
        assert r["counts"] == [0, 1, 255, 256, 257, 2100] and r["min_final_T"] > 1e-3
    if case in ("saturated_no_bg", "list_lengths_saturated"):
        assert r["min_final_T"] < 1e-3  # pixels that ran into the stop rule


@pytest.mark.parametrize("n_list", [2100, (1 << 23) - 1, 1 << 23, 1 << 40])
def test_pixels_ranked_by_decreasing_stop(emulation, n_list):
    # below 2^23 the kernel ranks packed keys, from 2^23 on it compares (stop, thread) pairs: both
    # must give the stable order of decreasing stop, ties broken by the lower thread first
    gen = torch.Generator().manual_seed(n_list % 1000)
    top = min(n_list, (1 << 31) - 1)
    stops = torch.randint(0, 40, (256,), generator=gen, dtype=torch.int32)  # many ties
    stops[:8] = torch.tensor([0, top, top, top - 1, 1, 0, top, 5], dtype=torch.int32)
    ranks = emulation.rank_by_stop(stops, n_list)
    order = sorted(range(256), key=lambda t: (-int(stops[t]), t))
    expected = torch.empty(256, dtype=torch.int32)
    expected[torch.tensor(order)] = torch.arange(256, dtype=torch.int32)
    assert torch.equal(ranks, expected)


def _normalized_conv_ssim(x, y):
    """SSIM of one tile [B, h, w, 3] by normalized convolution: zero-padded 11x11 Gaussian filter
    divided by the same filter of ones (the window's weight inside the tile), Wang et al. 2004."""
    from splat_train.trainer.losses import _gaussian_filter

    def w(t):  # [B, h, w, 3] -> mean under the renormalized window
        t = t.permute(0, 3, 1, 2)
        return (_gaussian_filter(t, 11, 1.5) / _gaussian_filter(torch.ones_like(t), 11, 1.5)).permute(0, 2, 3, 1)

    mx, my = w(x), w(y)
    vx, vy, cxy = w(x * x) - mx * mx, w(y * y) - my * my, w(x * y) - mx * my
    c1, c2 = 0.01**2, 0.03**2
    return ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx * mx + my * my + c1) * (vx + vy + c2))


def test_scenes_are_moved_off_the_alpha_thresholds():
    """The comparison's scene conditioning: a record placed exactly on alpha = 1/255 at one pixel of
    its tile, and one on the 0.999 clamp, get their opacity moved; the others keep theirs."""
    scene = make_list_scene(lists=(0, 1, 40, 0, 0, 0), seed=21, bg=False)
    ids = scene["flatten_ids"].long()
    first, second = int(ids[0]), int(ids[1])  # in tiles 1 (x 16..31, y 0..15) and 2 (x 32..47)
    m = scene["means2d"].reshape(-1, 2).double()
    a, b, c = scene["conics"].reshape(-1, 3).double().unbind(-1)
    op = scene["opacities"].reshape(-1).clone()

    def sigma(g, x, y):
        dx, dy = m[g, 0] - (x + 0.5), m[g, 1] - (y + 0.5)
        return 0.5 * (a[g] * dx * dx + c[g] * dy * dy) + b[g] * dx * dy

    op[first] = float(math.exp(sigma(first, 20, 5)) / 255.0)
    op[second] = float(math.exp(sigma(second, 40, 9)) * 0.999)
    scene = dict(scene, opacities=op.reshape(scene["opacities"].shape))
    moved = away_from_thresholds(scene)["opacities"].reshape(-1)
    changed = (moved != op).nonzero().reshape(-1).tolist()
    assert first in changed and second in changed
    assert len(changed) <= 4  # only records that lie near a threshold somewhere


@pytest.mark.parametrize("origin", [(0, 0), (5, 11), (15, 0)])
def test_reference_tile_ssim_is_each_tile_by_normalized_convolution(origin):
    """Tile-local SSIM == each tile's part with ground truth filtered on its own with the window
    renormalized to that part (partial tiles at the right and bottom edges, and at the top and
    left when the render extends past the ground truth, included)."""
    ox, oy = origin
    gen = torch.Generator().manual_seed(7)
    img = torch.rand(2, 37, 43, 3, generator=gen, dtype=torch.float64)
    gt = (img + 0.3 * torch.rand(2, 37, 43, 3, generator=gen, dtype=torch.float64)).clamp(max=1)[:, oy:, ox:]
    got = fr.tile_local_ssim_map(img, gt, origin=origin)
    assert got.shape == gt.shape
    for ty in range(3):
        for tx in range(3):
            rows = slice(max(16 * ty, oy), 16 * ty + 16)
            cols = slice(max(16 * tx, ox), 16 * tx + 16)
            in_gt = (slice(None), slice(rows.start - oy, rows.stop - oy), slice(cols.start - ox, cols.stop - ox))
            want = _normalized_conv_ssim(img[:, rows, cols], gt[in_gt])
            torch.testing.assert_close(got[in_gt], want, rtol=1e-10, atol=1e-12)


def test_tile_window_rows_sum_to_one_inside():
    """The renormalized windows: rows sum to 1 over the part with ground truth, zero outside it."""
    for first, stop in ((0, 1), (0, 5), (0, 16), (3, 16), (7, 9)):
        G = fr.tile_window(first, stop, dtype=torch.float64)
        torch.testing.assert_close(G[first:stop].sum(1), torch.ones(stop - first, dtype=torch.float64))
        inside = torch.zeros(16, dtype=torch.bool)
        inside[first:stop] = True
        assert G[~inside].abs().sum() == 0 and G[:, ~inside].abs().sum() == 0
    with pytest.raises(ValueError, match="first < stop"):
        fr.tile_window(4, 4)


def test_tile_local_ssim_tracks_the_full_image_ssim():
    """Against a noisy copy of a smooth image, tile-local D-SSIM and its mean |gradient| are within
    25% of the full-image ("valid") ones (here +22% and +18%; zero-padded tiles gave about a third
    on juicebox, and densification, which thresholds these gradients, grew 35% fewer Gaussians)."""
    from splat_train.trainer.losses import ssim

    gen = torch.Generator().manual_seed(3)
    # a smooth random "photograph": upsampled noise, 128x192
    base = torch.nn.functional.interpolate(
        torch.rand(1, 3, 16, 24, generator=gen), size=(128, 192), mode="bicubic", align_corners=False
    ).clamp(0, 1)
    gt = base.permute(0, 2, 3, 1).contiguous()
    render = (gt + 0.05 * torch.randn(gt.shape, generator=gen)).clamp(0, 1)
    x1 = render.clone().requires_grad_()
    tile = 1 - fr.tile_local_ssim_map(x1, gt).mean()
    (g_tile,) = torch.autograd.grad(tile, x1)
    x2 = render.clone().requires_grad_()
    full = 1 - ssim(x2, gt, padding="valid")
    (g_full,) = torch.autograd.grad(full, x2)
    assert tile.item() == pytest.approx(full.item(), rel=0.25)
    assert g_tile.abs().mean().item() == pytest.approx(g_full.abs().mean().item(), rel=0.25)


@pytest.mark.parametrize("origin", [(0, 0), (9, 2)])
def test_reference_loss_formula(origin):
    """tile_local_loss = mean_i[(1-l) mean|x-y| + l (1 - mean tile SSIM)] over the pixels with
    ground truth; the render's pixels without ground truth get no gradient."""
    ox, oy = origin
    gen = torch.Generator().manual_seed(8)
    img = torch.rand(2, 20, 37, 3, generator=gen).requires_grad_()
    gt = torch.rand(2, 20 - oy, 37 - ox, 3, generator=gen)
    s = fr.tile_local_ssim_map(img, gt, origin=origin)
    assert s.shape == gt.shape and torch.isfinite(s).all()
    want = (0.7 * (img[:, oy:, ox:] - gt).abs().mean((1, 2, 3)) + 0.3 * (1 - s.mean((1, 2, 3)))).mean()
    loss = fr.tile_local_loss(img, gt, 0.3, origin)
    torch.testing.assert_close(loss, want)
    (grad,) = torch.autograd.grad(loss, img)
    outside = torch.ones(20, 37, dtype=torch.bool)
    outside[oy:, ox:] = False
    assert grad[:, outside].abs().sum() == 0 and grad[:, ~outside].abs().sum() > 0
    padded = torch.nn.functional.pad(gt, (0, 0, ox, 0, oy, 0))
    assert fr.tile_local_loss(padded, gt, 0.3, origin).item() == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match="gt must be"):
        fr.tile_local_ssim_map(img, gt[:, 1:], origin=origin)


def test_cpu_uses_reference():
    scene = make_scene(I=1, H=20, W=24, N=30, seed=9, packed=False, bg=True)
    names, leaves = _leaves(scene)
    loss, stats = _call(fr.fused_raster_loss, scene, leaves, names, return_image=True)
    ref_loss, ref_image = _call(fr.reference_fused_loss, scene, leaves, names)
    assert loss.item() == ref_loss.item() and torch.equal(stats["image"], ref_image.detach())
    assert stats["num_tiles"] == 4
    grads = torch.autograd.grad(loss, leaves)
    assert all(torch.isfinite(g).all() for g in grads) and grads[0].abs().sum() > 0


def test_autograd_function_scales_the_saved_gradients():
    """KnownGradients hands the kernel's gradients to autograd, scaled by the incoming gradient, in
    the inputs' shapes and dtypes, and None for the non-differentiable inputs; the loss is the
    kernel's; a second backward through the same loss raises (a stand-in kernel)."""
    scene = make_scene(I=2, H=20, W=24, N=30, seed=9, packed=False, bg=True)
    n_pix = 20 * 24
    seen = {}

    class FakeExt:
        @staticmethod
        def fused_raster_loss(*args):
            assert args[15] == 0.2 and args[16] == pytest.approx(1 / (2 * 3 * n_pix))  # lambda, 1 / count
            for i, t in enumerate(args[18:23]):  # the gradient buffers (zeroed)
                assert torch.all(t == 0)
                t.fill_(i + 1.0)
            assert args[27].dtype == torch.int32 and args[27].item() == 0  # the finished-tile count
            args[26].copy_(torch.tensor([0.25, 0.5, 0.75]))  # loss, L1, SSIM
            assert args[29] == 3 and args[30:33] == (0, 8, 0)  # every phase; one launch over the 2 x 4 tiles
            seen["called"] = True

    for factor in (3.0, 1.0):
        names, leaves = _leaves(scene)
        loss, stats = fr._native_loss(
            FakeExt(),
            *leaves[:4],
            leaves[4],
            scene["gts"],
            scene["isect_offsets"],
            scene["flatten_ids"],
            24,
            20,
            0.2,
            False,
            False,
            (0, 0),
        )
        assert seen.pop("called") and loss.item() == 0.25
        assert stats["l1"].item() == 0.5 and stats["ssim"].item() == 0.75
        out = factor * loss if factor != 1.0 else loss
        grads = torch.autograd.grad(out, leaves, retain_graph=True)
        for i, (g, leaf) in enumerate(zip(grads, leaves)):
            assert g.shape == leaf.shape and g.dtype == leaf.dtype and torch.all(g == factor * (i + 1))
        with pytest.raises(RuntimeError, match="back-propagated twice"):
            torch.autograd.grad(out, leaves)


def test_grads_out_takes_the_kernels_gradients_in_place(emulation):
    """grads_out: the kernel (its source under the CPU emulation) zeroes the caller's buffers and
    leaves there the gradients autograd gets from the default call, bit for bit, with the same
    loss, now detached; buffers of another dtype, layout, count or key set raise ValueError, and
    so does the CPU reference, which has no kernel to write them."""
    scene = make_scene(I=2, H=20, W=24, N=30, seed=9, packed=False, bg=True)
    names, leaves = _leaves(scene)
    loss, _ = _call(fr.emulated_fused_raster_loss, scene, leaves, names)
    want = dict(zip(names, torch.autograd.grad(loss, leaves)))
    four = ("means2d", "conics", "colors", "opacities")
    out = {n: torch.full_like(scene[n], math.nan) for n in four}  # stale contents: zeroed first
    ptrs = {n: t.data_ptr() for n, t in out.items()}
    names, leaves = _leaves(scene)
    got, stats = _call(fr.emulated_fused_raster_loss, scene, leaves, names, grads_out=out)
    assert got.grad_fn is None and torch.equal(got, loss.detach())
    assert stats["l1"].item() > 0
    for n in four:
        assert out[n].data_ptr() == ptrs[n] and want[n].abs().sum() > 0, n
        assert torch.equal(out[n], want[n]), n
    bad = {
        "float64": dict(out, colors=out["colors"].double()),
        "strided": dict(out, conics=torch.zeros(2, 30, 6)[..., ::2]),
        "count": dict(out, opacities=torch.zeros(2, 29)),
        "keys": {n: out[n] for n in four[:3]},
    }
    for buffers in bad.values():
        with pytest.raises(ValueError, match="grads_out"):
            _call(fr.emulated_fused_raster_loss, scene, leaves, names, grads_out=buffers)
    with pytest.raises(ValueError, match="grads_out needs the native kernel"):
        _call(fr.fused_raster_loss, scene, leaves, names, grads_out=out)


def test_tile_chunks_partition_the_tiles_within_the_scratch():
    """Launches in chunks of tiles: they cover every tile once, in order, and each one's buckets
    (tile t from bucket offsets[t] // 32 + t, ceil(n_t / 32) of them) fit the cap unless one tile
    alone needs more."""
    gen = torch.Generator().manual_seed(0)
    counts = torch.randint(0, 3000, (200,), generator=gen) * (torch.rand(200, generator=gen) > 0.2)
    offsets = (torch.cumsum(counts, 0) - counts).to(torch.int32)
    n = int(counts.sum())
    assert fr.tile_chunks(offsets, n, 10**12) == [(0, 200, 0, n // 32 + 201)]  # fits: one launch, no copy
    for cap_buckets in (1, 7, 40, 500):
        chunks = fr.tile_chunks(offsets, n, cap_buckets * fr.CP_BUCKET_FLOATS)
        assert [c[0] for c in chunks] == list(itertools.accumulate([0] + [c[1] for c in chunks[:-1]]))
        assert sum(c[1] for c in chunks) == 200
        for t0, count, origin, buckets in chunks:
            ts = torch.arange(t0, t0 + count)
            base = offsets[ts].long() // 32 + ts
            need = base + (counts[ts] + 31) // 32
            assert int(base[0]) == origin and int(need.max()) - origin <= buckets
            assert buckets <= cap_buckets or count == 1


@pytest.mark.parametrize("case", ["dense_bg_border", "list_lengths"])
def test_kernel_source_in_chunks_of_tiles(emulation, monkeypatch, case):
    """A scratch cap small enough for a few tiles per launch: the kernel runs in several launches
    over one reused scratch buffer and still matches the reference."""
    monkeypatch.setenv("SPLAT_TRAIN_FUSED_SCRATCH_MB", "0.02")  # 5 buckets of checkpoints
    params = CASES[case]
    scene = scene_of(params)
    chunks = fr.tile_chunks(scene["isect_offsets"].reshape(-1), scene["flatten_ids"].numel(), fr._scratch_cap_floats())
    assert len(chunks) > 2
    assert_matches(compare(params, fr.emulated_fused_raster_loss, warp_size=32), params, case)


def test_a_larger_cap_that_meets_out_of_memory_falls_back_to_the_default(emulation, monkeypatch):
    """A launch whose scratch at the plan's cap (above the default) cannot be allocated is cut
    again at the default cap and still matches the reference; at the default cap the error
    propagates."""
    monkeypatch.delenv("SPLAT_TRAIN_FUSED_SCRATCH_MB", raising=False)
    monkeypatch.setattr(fr, "DEFAULT_SCRATCH_MB", 0.02)  # 5 buckets of checkpoints
    case = "list_lengths"
    scene = scene_of(CASES[case])
    offsets, n = scene["isect_offsets"].reshape(-1), scene["flatten_ids"].numel()
    chunked = fr.tile_chunks(offsets, n, fr._scratch_cap_floats(fr.DEFAULT_SCRATCH_MB))
    limit = max(c[3] for c in chunked) * fr.CP_BUCKET_FLOATS  # what the default cap's launches take
    assert len(chunked) > 2 and fr._one_launch_buckets(n, offsets.numel()) * fr.CP_BUCKET_FLOATS > limit
    real = fr._allocate_scratch
    sizes = []

    def allocate(floats, device):  # no more memory than the default cap's launches need
        sizes.append(floats)
        if floats > limit:
            raise torch.OutOfMemoryError("test: out of memory")
        return real(floats, device)

    monkeypatch.setattr(fr, "_allocate_scratch", allocate)
    assert_matches(compare(CASES[case], fr.emulated_fused_raster_loss, warp_size=32, scratch_mb=1.0), CASES[case], case)
    assert len(sizes) == 2 and sizes[0] > limit >= sizes[1]  # refused at the plan's cap, then the default's
    chunks, _ = fr._chunks_and_scratch(offsets, n, 1.0, "cpu")
    assert chunks == chunked
    limit = 0  # nothing can be allocated: at the default cap the error propagates
    with pytest.raises(torch.OutOfMemoryError):
        fr._chunks_and_scratch(offsets, n, 1.0, "cpu")
    with pytest.raises(torch.OutOfMemoryError):
        fr._chunks_and_scratch(offsets, n, 0.01, "cpu")


def test_tile_budget(monkeypatch):
    from splat_train.kernels import budget as fr  # noqa: F811 (the device's figure lives there)

    assert fr.tile_budget("cpu") == fr.CPU_TILE_BUDGET == 64

    class Props:
        def __init__(self, optin, per_block):
            self.shared_memory_per_block_optin, self.shared_memory_per_block = optin, per_block

    for optin, per_block, want in [(232448, 49152, 128), (0, 65536, 32), (0, 1000, 0)]:
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda dev, p=Props(optin, per_block): p)
        assert fr.tile_budget("cuda:0") == want


def test_unfused_path_when_the_native_kernel_cannot_be_built(monkeypatch, capsys):
    """Without the native module (no CUDA toolkit), a GPU call computes the same function unfused
    through the fallback rasterizer; checked here with CPU tensors posing as a GPU's."""
    from splat_train.kernels import native

    scene = make_scene(I=2, H=20, W=37, N=60, seed=5, packed=True, bg=True, origin=(3, 1))
    names, leaves = _leaves(scene)
    ref_loss, _ = _call(fr.reference_fused_loss, scene, leaves, names)
    ref_grads = torch.autograd.grad(ref_loss, leaves)
    names, leaves = _leaves(scene)
    loss, stats = fr._unfused(
        *leaves[:4],
        scene["isect_offsets"],
        scene["flatten_ids"],
        scene["gts"],
        37,
        20,
        0.2,
        leaves[4],
        True,
        (3, 1),
        ref,
        False,
        False,
    )
    grads = torch.autograd.grad(loss, leaves)
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-6)
    assert all(rel_norm(g, rg) < 1e-6 for g, rg in zip(grads, ref_grads))
    monkeypatch.setattr(native, "_MODULE", None)
    monkeypatch.setattr(native, "LOAD_ERROR", None)
    monkeypatch.setattr(native, "_why_not", lambda: "no CUDA toolkit (nvcc) found; set CUDA_HOME")
    assert native.load() is None and native.load() is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "native kernel is unavailable" in err[0] and "no CUDA toolkit" in err[0]
    assert "unfused path" in err[0] and native.LOAD_ERROR.startswith("no CUDA toolkit")  # said once


def test_bad_inputs_raise():
    scene = make_scene(I=1, H=20, W=24, N=10, seed=10, packed=False, bg=False)
    args = [scene[k] for k in ("means2d", "conics", "colors", "opacities", "isect_offsets", "flatten_ids", "gts")]
    with pytest.raises(ValueError, match="ssim_lambda"):
        fr.fused_raster_loss(*args, 24, 20, ssim_lambda=1.5)
    with pytest.raises(ValueError, match="gts"):
        fr.fused_raster_loss(*args[:6], args[6][:, :10], 24, 20)
    with pytest.raises(ValueError, match="tile"):
        fr.fused_raster_loss(*args, 40, 20)
    with pytest.raises(ValueError, match="backgrounds"):
        fr.fused_raster_loss(*args, 24, 20, backgrounds=torch.zeros(2, 3))
    # a tile row more than the image needs: only with padded_rows, and only in the native kernel
    padded = torch.cat([args[4], args[4][:, -1:]], dim=1)
    with pytest.raises(ValueError, match="tile"):
        fr.fused_raster_loss(*args[:4], padded, *args[5:], 24, 20)
    with pytest.raises(ValueError, match="padded_rows needs the native kernel"):
        fr.fused_raster_loss(*args[:4], padded, *args[5:], 24, 20, padded_rows=True)


def test_longest_first_orders_the_tiles_by_decreasing_list_length():
    offsets = torch.tensor([0, 3, 3, 10, 17], dtype=torch.int32)  # lengths 3, 0, 7, 7, 1
    lengths = fr.tile_lengths(offsets, 18)
    assert lengths.tolist() == [3, 0, 7, 7, 1]
    order = fr.longest_first(lengths)
    assert order.dtype == torch.int32 and order.tolist() == [2, 3, 0, 4, 1]  # ties in tile order


@pytest.mark.parametrize("case", ["dense_bg_border", "list_lengths"])
def test_kernel_source_renders_the_tiles_its_order_names(emulation, monkeypatch, case):
    """Blocks render the tiles of the launch's order: another permutation still matches the
    reference, and an order that names one tile for every block does not (so the order is read)."""
    params = CASES[case]
    monkeypatch.setattr(fr, "longest_first", lambda lengths: torch.arange(lengths.numel() - 1, -1, -1).int())
    assert_matches(compare(params, fr.emulated_fused_raster_loss, warp_size=32), params, case)
    monkeypatch.setattr(fr, "TILE_ORDER", False)
    assert_matches(compare(params, fr.emulated_fused_raster_loss, warp_size=32), params, case)
    monkeypatch.setattr(fr, "TILE_ORDER", True)
    monkeypatch.setattr(fr, "longest_first", lambda lengths: torch.zeros(lengths.numel(), dtype=torch.int32))
    with pytest.raises(AssertionError):
        assert_matches(compare(params, fr.emulated_fused_raster_loss, warp_size=32), params, case)
