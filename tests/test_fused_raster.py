"""Tests of splat_train.kernels.fused_raster (ByteSplat fused rasterization + tile-local loss).

The Triton kernel runs under TRITON_INTERPRET=1 in ONE subprocess (this file run as a script), so
the variable never leaks into other test modules; it compares every case against the REFERENCE
(kernels.reference.rasterize_to_pixels + the PyTorch tile-local loss, autograd) and prints JSON
that the tests below assert on. Scenes are fresh seeded random 2D records (means2d, conics,
colours, opacities) with gsplat-style tile lists from kernels.reference.isect_tiles.

Errors are normwise: max |kernel - reference| / max |reference| <= 1e-4 per tensor; NaN never
passes. The kernel allocates its image and per-tile partial-sum buffers NaN-filled, so a pixel or
tile the kernel fails to write makes the image or the loss NaN and fails; gradient buffers must
be zero-initialized (atomic accumulation), so untouched records are checked to stay exactly 0.
"""

import json
import math
import os

import pytest
import torch

from interpreted import run_interpreted

from splat_train.kernels import fused_raster as fr
from splat_train.kernels import reference as ref

TOL = 1e-4
GRAD_NAMES = fr.GRAD_NAMES  # the differentiable inputs, in the kernel's order

# name -> scene / call parameters. A tile with more than ``budget`` Gaussians falls back (the
# reference rasterizer renders it, the kernel scores it); within the budget it runs the resident
# variant up to ``resident`` Gaussians (default: the budget) and streams in chunks of ``chunk``
# (default 8) above. Up to ~80 Gaussians per tile, so the cases mix the three paths.
CASES = {
    "dense_bg_border": dict(I=2, H=40, W=50, N=160, seed=1, packed=False, bg=True, budget=16, resident=4,
                            lam=0.2),
    "packed_three_images": dict(I=3, H=47, W=33, N=120, seed=2, packed=True, bg=True, budget=16, lam=0.2,
                                chunk=32),
    "saturated_no_bg": dict(I=1, H=36, W=64, N=100, seed=3, packed=False, bg=False, budget=32, resident=2,
                            lam=0.2, saturate=60, chunk=1),
    "all_resident": dict(I=2, H=32, W=48, N=150, seed=4, packed=False, bg=True, budget=256, lam=0.5,
                         saturate=30),
    "all_streaming": dict(I=2, H=32, W=48, N=150, seed=4, packed=False, bg=True, budget=256, resident=1,
                          lam=0.5, saturate=30, chunk=32),
    "all_fallback": dict(I=2, H=32, W=48, N=150, seed=4, packed=False, bg=True, budget=0, lam=0.5,
                         saturate=30),
    "ssim_only_packed": dict(I=2, H=20, W=37, N=80, seed=5, packed=True, bg=False, budget=8, resident=2,
                             lam=1.0, chunk=1),
    "opaque_front_wall": dict(I=2, H=30, W=80, N=400, seed=6, packed=False, bg=True, budget=256, resident=1,
                              lam=0.2, wall=6, chunk=4),
    "opaque_front_wall_chunks": dict(I=2, H=30, W=80, N=400, seed=7, packed=False, bg=True, budget=256,
                                     resident=1, lam=0.2, wall=6, chunk=8),
    # the ground truth covers x >= 5, y >= 11 only (--random_tile_shift): every path, both layouts
    "origin_dense": dict(I=2, H=40, W=50, N=160, seed=8, packed=False, bg=True, budget=16, resident=4,
                         lam=0.2, origin=(5, 11)),
    "origin_packed": dict(I=2, H=47, W=33, N=120, seed=9, packed=True, bg=False, budget=16, lam=0.5,
                          chunk=4, origin=(15, 1)),
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
        radii[:, N - wall:] = torch.tensor([int(W * 0.6) - fr.TILE_SIZE - 1, 10 * H], dtype=radii.dtype)
    tw, th = math.ceil(W / fr.TILE_SIZE), math.ceil(H / fr.TILE_SIZE)
    left = means2d[..., 0] - radii[..., 0] < fr.TILE_SIZE  # would touch the first tile column
    if packed:
        keep = (u(I, N) > 0.3) & ~left
        image_ids = torch.arange(I)[:, None].expand(I, N)[keep]
        means2d, conics, colors, opacities = means2d[keep], conics[keep], colors[keep], opacities[keep]
        radii, depths = radii[keep], depths[keep]
        _, isect_ids, flatten_ids = ref.isect_tiles(means2d, radii, depths, fr.TILE_SIZE, tw, th, packed=True,
                                                    n_images=I, image_ids=image_ids)
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


def _leaves(scene):
    names = [n for n in GRAD_NAMES if scene[n] is not None]
    return names, [scene[n].clone().requires_grad_(True) for n in names]


def _call(fn, scene, leaves, names, **kw):
    args = dict(scene, **dict(zip(names, leaves)))
    return fn(args["means2d"], args["conics"], args["colors"], args["opacities"], args["isect_offsets"],
              args["flatten_ids"], args["gts"], args["width"], args["height"], backgrounds=args["backgrounds"],
              packed=args["packed"], origin=args["origin"], **kw)


def _rel(a, b):
    """Normwise relative error; NaN if a has a non-finite element."""
    if not torch.isfinite(a).all():
        return math.nan
    return ((a - b).abs().max() / b.abs().max().clamp(min=1e-30)).item()


def run_case(params):
    """Kernel vs reference for one case. Returns a JSON-able dict of errors and flags."""
    scene = make_scene(**params)
    names, leaves = _leaves(scene)
    ref_loss, ref_image = _call(fr.reference_fused_loss, scene, leaves, names, ssim_lambda=params["lam"])
    ref_grads = torch.autograd.grad(ref_loss, leaves)
    names, leaves = _leaves(scene)
    counts = torch.diff(torch.cat([scene["isect_offsets"].reshape(-1).long(),
                                   torch.tensor([scene["flatten_ids"].numel()])]))
    resident = params.get("resident", max(params["budget"], 1))
    absgrad = bool((counts <= params["budget"]).all())  # the reference fallback has no absgrad
    loss, stats = _call(fr.fused_raster_loss, scene, leaves, names, ssim_lambda=params["lam"],
                        return_image=True, budget=params["budget"], absgrad=absgrad,
                        resident_max=resident, stream_chunk=params.get("chunk", 8))
    grads = torch.autograd.grad(2.5 * loss, leaves)  # backward scales by the incoming gradient
    out = {"loss": _rel(loss.detach(), ref_loss.detach()), "image": _rel(stats["image"], ref_image.detach()),
           "fraction_fused": stats["fraction_fused"], "fraction_resident": stats["fraction_resident"],
           "fraction_isects_fused": stats["fraction_isects_fused"],
           "expected_isects_fused": float(counts[counts <= params["budget"]].sum() / counts.sum()),
           "num_tiles": stats["num_tiles"]}
    used = torch.zeros(scene["means2d"].reshape(-1, 2).shape[0], dtype=torch.bool)
    used[scene["flatten_ids"].long()] = True
    out["unused_records"] = int((~used).sum())
    untouched_exact = True
    for n, g, rg in zip(names, grads, ref_grads):
        out[n] = _rel(g / 2.5, rg)
        if n != "backgrounds":
            untouched_exact &= bool((g.reshape(used.numel(), -1)[~used] == 0).all())
    out["untouched_exact"] = untouched_exact
    if absgrad:
        unscaled = grads[0].reshape(-1, 2) / 2.5
        out["absgrad_bound"] = bool((stats["absgrad"] >= unscaled.abs() * (1 - 1e-5) - 1e-12).all())
    out["expected_fraction_resident"] = float((counts <= min(params["budget"], resident)).float().mean())
    out["empty_tiles"] = int((counts == 0).sum())
    out["max_tile_count"] = int(counts.max())
    out["nonempty_resident_tiles"] = int(((counts > 0) & (counts <= params["budget"])).sum())
    T = 1.0 - ref.rasterize_to_pixels(
        scene["means2d"], scene["conics"], scene["colors"], scene["opacities"], scene["width"], scene["height"],
        fr.TILE_SIZE, scene["isect_offsets"], scene["flatten_ids"], packed=scene["packed"])[1]
    out["min_final_T"] = T.min().item()
    out["tiles_stopped_early"] = tiles_stopped_early(scene)
    return out


def tiles_stopped_early(scene, margin: int = int(fr._STOP_CHECK)) -> int:
    """How many tiles have every in-image pixel stop (next_T <= 1e-4) more than ``margin``
    Gaussians before the end of the tile's list: tiles whose streaming forward can end early
    (it checks every _STOP_CHECK Gaussians) and whose backward can skip chunks. Float64
    compositing with the reference's rules (dense layout only)."""
    I, th, tw = scene["isect_offsets"].shape
    H, W, ts = scene["height"], scene["width"], fr.TILE_SIZE
    flat = scene["isect_offsets"].reshape(-1).long()
    ends = torch.cat([flat[1:], torch.tensor([scene["flatten_ids"].numel()])])
    n = 0
    for tile, (start, end) in enumerate(zip(flat.tolist(), ends.tolist())):
        if end - start <= margin:
            continue
        ty, tx = divmod(tile % (th * tw), tw)
        ys, xs = torch.meshgrid(torch.arange(ty * ts, min(H, ty * ts + ts)),
                                torch.arange(tx * ts, min(W, tx * ts + ts)), indexing="ij")
        ids = scene["flatten_ids"][start:end].long()
        m, c = scene["means2d"].reshape(-1, 2)[ids].double(), scene["conics"].reshape(-1, 3)[ids].double()
        dx = m[:, 0] - (xs.reshape(-1, 1) + 0.5)
        dy = m[:, 1] - (ys.reshape(-1, 1) + 0.5)
        sigma = 0.5 * (c[:, 0] * dx * dx + c[:, 2] * dy * dy) + c[:, 1] * dx * dy
        alpha = (scene["opacities"].reshape(-1)[ids].double() * torch.exp(-sigma)).clamp(max=ref.MAX_ALPHA)
        keep = (sigma >= 0) & (alpha >= ref.ALPHA_THRESHOLD)
        next_t = torch.cumprod(torch.where(keep, 1.0 - alpha, 1.0), dim=1)  # [P, n]
        stops = keep & (next_t <= ref.TRANSMITTANCE_MIN)
        never = torch.full_like(stops[:, 0], end - start, dtype=torch.long)
        first = torch.where(stops.any(1), stops.float().argmax(1), never)
        n += int((first < end - start - margin).all())
    return n


def _gsplat_like_rasterize_to_pixels(means2d, conics, colors, opacities, width, height, tile_size, isect_offsets,
                                     flatten_ids, backgrounds=None, masks=None, packed=False, absgrad=False):
    """A fallback with gsplat 1.5.3's contract (cuda/_wrapper.py, RasterizeToPixels3DGSFwd.cu), on
    the reference: backgrounds must be ``means2d.shape[:-2] + (D,)`` (so per-image backgrounds are
    rejected when packed), and the alphas of tiles masked out are left unwritten (NaN here)."""
    if backgrounds is not None:
        assert backgrounds.shape == means2d.shape[:-2] + (colors.shape[-1],), backgrounds.shape
    image, alphas = ref.rasterize_to_pixels(means2d, conics, colors, opacities, width, height, tile_size,
                                            isect_offsets, flatten_ids, backgrounds=backgrounds, masks=masks,
                                            packed=packed)
    if masks is not None:
        pixels = masks.repeat_interleave(tile_size, -2).repeat_interleave(tile_size, -1)[..., :height, :width, None]
        alphas = torch.where(pixels, alphas, torch.nan)
    return image, alphas


def _gsplat_like_fallback_cases():
    """Fallback tiles (with backgrounds, dense and packed) through the gsplat-like fallback: the
    largest relative error of the loss and of every gradient against the reference."""
    from types import SimpleNamespace

    ops = SimpleNamespace(rasterize_to_pixels=_gsplat_like_rasterize_to_pixels)
    out = {}
    for name in ("dense_bg_border", "packed_three_images", "all_fallback", "origin_dense"):
        params = CASES[name]
        scene = make_scene(**params)
        names, leaves = _leaves(scene)
        ref_loss, _ = _call(fr.reference_fused_loss, scene, leaves, names, ssim_lambda=params["lam"])
        ref_grads = torch.autograd.grad(ref_loss, leaves)
        names, leaves = _leaves(scene)
        loss, stats = _call(fr.fused_raster_loss, scene, leaves, names, ssim_lambda=params["lam"],
                            budget=params["budget"], resident_max=params.get("resident", max(params["budget"], 1)),
                            stream_chunk=params.get("chunk", 8), fallback=ops)
        grads = torch.autograd.grad(loss, leaves)
        out[name] = dict(loss=_rel(loss.detach(), ref_loss.detach()), fraction_fused=stats["fraction_fused"],
                         **{n: _rel(g, rg) for n, g, rg in zip(names, grads, ref_grads)})
    return out


def _worker():
    assert os.environ.get("TRITON_INTERPRET") == "1"
    results = {name: run_case(params) for name, params in CASES.items()}
    print("RESULTS " + json.dumps(results))
    print("RESIDENT_LIMIT " + json.dumps(_resident_limit_case()))
    print("GSPLAT_LIKE_FALLBACK " + json.dumps(_gsplat_like_fallback_cases()))


# ------------------------------------------------------------------------------------------------
# Tests
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def interpreted_stdout():
    return run_interpreted(__file__, timeout=900).stdout


def _line(stdout, tag):
    line = [ln for ln in stdout.splitlines() if ln.startswith(tag + " ")][-1]
    return json.loads(line[len(tag) + 1:])


@pytest.fixture(scope="module")
def results(interpreted_stdout):
    return _line(interpreted_stdout, "RESULTS")


@pytest.mark.parametrize("case", sorted(CASES))
def test_kernel_matches_reference(results, case):
    r = results[case]
    for key in ("loss", "image") + GRAD_NAMES:
        if key == "backgrounds" and not CASES[case]["bg"]:
            continue
        assert r[key] <= TOL, f"{case}: {key} relative error {r[key]}"  # NaN fails too
    assert r["untouched_exact"], f"{case}: records in no tile got a non-zero gradient"
    assert r.get("absgrad_bound", True), f"{case}: absgrad smaller than |grad|"


def test_cases_cover_edge_cases(results):
    """The scenes really have the three tile paths, empty tiles, border tiles and saturated pixels."""
    mixed = [r["fraction_fused"] for c, r in results.items() if 0 < CASES[c]["budget"] < 256]
    assert len(mixed) >= 3 and all(0.0 < f < 1.0 for f in mixed), mixed  # some tiles fall back
    assert all(r["nonempty_resident_tiles"] > 0 for c, r in results.items() if CASES[c]["budget"] > 0)
    assert results["all_resident"]["fraction_fused"] == results["all_resident"]["fraction_resident"] == 1.0
    assert all(r["fraction_resident"] == r["expected_fraction_resident"] for r in results.values())
    streaming = [c for c, r in results.items() if r["fraction_resident"] < r["fraction_fused"]]
    assert {"dense_bg_border", "saturated_no_bg", "all_streaming", "ssim_only_packed"} <= set(streaming)
    fallback = results["all_fallback"]  # budget 0: every tile with a Gaussian falls back
    assert fallback["fraction_fused"] == pytest.approx(fallback["empty_tiles"] / fallback["num_tiles"])
    assert fallback["fraction_isects_fused"] == 0.0  # only empty tiles are within budget 0
    assert all(r["fraction_isects_fused"] == pytest.approx(r["expected_isects_fused"]) for r in results.values())
    assert any(0.0 < r["fraction_isects_fused"] < r["fraction_fused"] < 1.0 for r in results.values())
    assert sum("absgrad_bound" in r for r in results.values()) >= 3
    assert all(r["empty_tiles"] > 0 for r in results.values())
    assert results["saturated_no_bg"]["min_final_T"] < 1e-3  # pixels that ran into the stop rule
    # every pixel behind the wall stops (T ~ 1e-4 / (1 - alpha)) while its list goes on: the
    # streaming forward ends the tile early and the backward starts at the last composited chunk
    for case in ("opaque_front_wall", "opaque_front_wall_chunks"):
        wall = results[case]
        assert wall["tiles_stopped_early"] >= (wall["num_tiles"] - wall["empty_tiles"]) // 2
    assert any(CASES[c]["H"] % 16 or CASES[c]["W"] % 16 for c in CASES)
    assert results["dense_bg_border"]["unused_records"] > 0


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
    base = torch.nn.functional.interpolate(torch.rand(1, 3, 16, 24, generator=gen), size=(128, 192),
                                           mode="bicubic", align_corners=False).clamp(0, 1)
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


def test_cpu_without_interpreter_uses_reference(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    scene = make_scene(I=1, H=20, W=24, N=30, seed=9, packed=False, bg=True)
    names, leaves = _leaves(scene)
    loss, stats = _call(fr.fused_raster_loss, scene, leaves, names, return_image=True)
    ref_loss, ref_image = _call(fr.reference_fused_loss, scene, leaves, names)
    assert loss.item() == ref_loss.item() and torch.equal(stats["image"], ref_image.detach())
    assert stats["num_tiles"] == 4 and 0.0 <= stats["fraction_fused"] <= 1.0
    assert 0.0 <= stats["fraction_isects_fused"] <= 1.0
    grads = torch.autograd.grad(loss, leaves)
    assert all(torch.isfinite(g).all() for g in grads) and grads[0].abs().sum() > 0


def test_tile_budget(monkeypatch):
    assert fr.tile_budget("cpu") == fr.CPU_TILE_BUDGET == 64

    class Props:
        def __init__(self, optin, per_block):
            self.shared_memory_per_block_optin, self.shared_memory_per_block = optin, per_block

    for optin, per_block, want in [(232448, 49152, 128), (0, 65536, 32), (0, 1000, 0)]:
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda dev, p=Props(optin, per_block): p)
        assert fr.tile_budget("cuda:0") == want


def test_resident_limit_below_budget_streams_the_rest(interpreted_stdout):
    """With resident_max below the budget, tiles within budget but over resident_max stream: the
    budget statistic is unchanged, fewer tiles run resident, and the results stay the reference's."""
    res = _line(interpreted_stdout, "RESIDENT_LIMIT")
    assert res["fraction_fused_capped"] == res["fraction_fused_uncapped"] == 1.0
    assert 0.0 < res["fraction_resident_capped"] < res["fraction_resident_uncapped"] == 1.0
    assert res["loss"] <= TOL and res["grads"] <= TOL


def test_fallback_with_gsplats_contract_matches_reference(interpreted_stdout):
    """Through a fallback that, like gsplat, rejects per-image backgrounds when packed and leaves
    the alphas of skipped tiles unwritten (NaN), the fused loss and every gradient (backgrounds
    included) still equal the reference's: the background is composited here, over the fallback
    tiles' pixels only."""
    res = _line(interpreted_stdout, "GSPLAT_LIKE_FALLBACK")
    assert set(res) == {"dense_bg_border", "packed_three_images", "all_fallback", "origin_dense"}
    for case, r in res.items():
        assert r["fraction_fused"] < 1.0, case  # some tiles really fall back
        for key, err in r.items():
            if key != "fraction_fused":
                assert err <= TOL, f"{case}: {key} relative error {err}"  # NaN fails too


def _resident_limit_case():
    scene = make_scene(I=1, H=32, W=48, N=150, seed=4, packed=False, bg=True, saturate=30)
    out = {}
    got = {}
    for tag, cap in (("capped", 8), ("uncapped", 256)):
        names, leaves = _leaves(scene)
        loss, stats = _call(fr.fused_raster_loss, scene, leaves, names, budget=256, resident_max=cap)
        got[tag] = (loss.detach(), torch.autograd.grad(loss, leaves))
        out[f"fraction_fused_{tag}"] = stats["fraction_fused"]
        out[f"fraction_resident_{tag}"] = stats["fraction_resident"]
    out["loss"] = _rel(got["capped"][0], got["uncapped"][0])
    out["grads"] = max(_rel(a, b) for a, b in zip(got["capped"][1], got["uncapped"][1]))
    return out


def test_chunk_limits_on_cpu_and_the_spill_free_rule():
    from splat_train.kernels.resources import largest_spill_free

    assert fr.chunk_limits("cpu") == (fr.CPU_TILE_BUDGET, fr.STREAM_CHUNK)
    spills = {8: 0, 16: 0, 32: 24, 64: 0}  # 64 would not be reached: the search stops at 32
    tried = []

    def usage(k):
        tried.append(k)
        return {"spill_bytes": spills[k]}

    assert largest_spill_free(usage, (8, 16, 32, 64)) == 16 and tried == [8, 16, 32]
    assert largest_spill_free(lambda k: {"spill_bytes": 4}, (8, 16)) == 8  # nothing spill-free: the smallest


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
    with pytest.raises(ValueError, match="budget"):
        fr.fused_raster_loss(*args, 24, 20, budget=-1)
    with pytest.raises(ValueError, match="resident_max"):
        fr.fused_raster_loss(*args, 24, 20, resident_max=12)
    with pytest.raises(ValueError, match="stream_chunk"):
        fr.fused_raster_loss(*args, 24, 20, stream_chunk=0)


if __name__ == "__main__":
    _worker()
