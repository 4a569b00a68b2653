"""kernels/projection.py (fused projection + SH and its per-Gaussian backward) against its
reference: ``render.project_and_shade`` with kernels/reference.py's ops on ``model.activated`` of
the raw parameters, gradients by autograd through it.

The kernels run under ``TRITON_INTERPRET=1`` in a child process (``python
tests/test_projection_kernel.py kernel IN OUT``) on seeded scenes with Gaussians behind the
cameras, beyond the far plane, at the near plane, just outside the image with radii reaching into
it, tiny and huge, below the opacity threshold. On a GPU (``-m gpu``) the same checks run against
gsplat's CUDA ops at 200k Gaussians, and forward + backward are replayed from a CUDA graph."""

import json
import math
import sys

import pytest
import torch

from interpreted import run_interpreted

from splat_train.kernels import projection
from splat_train.kernels import reference as reference_ops
from splat_train.trainer.model import activated
from splat_train.trainer.render import camera_centres, project_and_shade, rigid_inverse

NEAR, FAR = 0.3, 20.0
# (N, C, K stored bases, SH degree, antialiased); N = 250: two programs, the second partly masked; N =
# 384: three, the second's Gaussians all unseen
CASES = [
    (250, 1, 16, 0, False),
    (250, 2, 16, 1, True),  # bases beyond the degree in use: zero gradients
    (250, 3, 9, 2, False),
    (384, 2, 16, 3, True),  # a whole program of Gaussians unseen (make_scene)
    (250, 3, 16, 3, False),
    (250, 1, 1, 0, True),  # no shN
    (250, 1, 25, 3, False),  # stored degree 4
]
POISONED = (3, 6)  # cases also run into NaN-filled outputs
GRADS = ("means2d", "depths", "conics", "opacities", "colors")


def make_cameras(C, width, height, seed):
    """C pinhole cameras 4 units from the origin looking at it; fx = fy = width (about 53 degrees)."""
    gen = torch.Generator().manual_seed(seed)
    c2w = []
    for c in range(C):
        a = 2 * math.pi * c / max(C, 1) + float(torch.rand(1, generator=gen))
        eye = torch.tensor([4.0 * math.cos(a), 0.5 + float(torch.rand(1, generator=gen)), 4.0 * math.sin(a)])
        forward = -eye / eye.norm()
        right = torch.linalg.cross(forward, torch.tensor([0.0, 1.0, 0.0]))
        right = right / right.norm()
        down = torch.linalg.cross(forward, right)
        m = torch.eye(4)
        m[:3, 0], m[:3, 1], m[:3, 2], m[:3, 3] = right, down, forward, eye
        c2w.append(m)
    c2w = torch.stack(c2w)
    f = float(width)
    Ks = torch.tensor([[f, 0.0, width / 2], [0.0, f, height / 2], [0.0, 0.0, 1.0]]).repeat(C, 1, 1)
    return rigid_inverse(c2w), Ks, c2w


def make_scene(seed, N, C, K, width=64, height=48):
    """Raw parameters and C cameras: 40% of the means in a cube around the origin (some behind a
    camera or outside its image), 15% at camera 0's near plane, 25% just outside camera 0's image
    (by 1-30 px, large scales: the radius decides), 10% beyond the far plane, 10% on camera 0's
    axis; log-scales from tiny (-7) to huge (1), logit opacities around the 1/255 threshold."""
    gen = torch.Generator().manual_seed(seed)
    viewmats, Ks, c2w = make_cameras(C, width, height, seed + 1)
    rot, eye = c2w[0, :3, :3], c2w[0, :3, 3]

    def rand(*shape):
        return torch.rand(*shape, generator=gen)

    def unproject(px, py, depth):  # camera 0's pixel (px, py) at camera depth -> world
        f = float(width)
        cam = torch.stack([(px - width / 2) / f * depth, (py - height / 2) / f * depth, depth], -1)
        return cam @ rot.T + eye

    n_cube, n_near, n_edge, n_far = int(0.4 * N), int(0.15 * N), int(0.25 * N), int(0.1 * N)
    n_axis = N - n_cube - n_near - n_edge - n_far
    cube = (rand(n_cube, 3) * 2 - 1) * 3
    near = unproject(rand(n_near) * width, rand(n_near) * height, NEAR + (rand(n_near) - 0.5) * 0.02)
    side = torch.randint(0, 4, (n_edge,), generator=gen)
    off = 1 + rand(n_edge) * 29
    along = rand(n_edge)
    px = torch.where(side == 0, -off, torch.where(side == 1, width + off, along * width))
    py = torch.where(side == 2, -off, torch.where(side == 3, height + off, along * height))
    edge = unproject(px, py, 1 + rand(n_edge) * 4)
    far = unproject(rand(n_far) * width, rand(n_far) * height, FAR * (1 + rand(n_far) * 0.5))
    axis = unproject(width / 2 + rand(n_axis), height / 2 + rand(n_axis), 0.5 + rand(n_axis) * 5)
    means = torch.cat([cube, near, edge, far, axis])
    scales = rand(N, 3) * 8 - 7
    scales[n_cube + n_near : n_cube + n_near + n_edge] = rand(n_edge, 3) * 2.5 - 2.5
    params = dict(
        means=means,
        quats=torch.randn(N, 4, generator=gen) * (0.2 + rand(N, 1) * 3),
        scales=scales,
        opacities=rand(N) * 12 - 8,
        sh0=torch.randn(N, 1, 3, generator=gen),
        shN=torch.randn(N, K - 1, 3, generator=gen) * 0.5,
    )
    if N >= 3 * projection.BLOCK:  # the second program's Gaussians below 1/255 opacity: no camera sees them
        params["opacities"][projection.BLOCK : 2 * projection.BLOCK] = -20.0
    return dict(params=params, viewmats=viewmats, Ks=Ks, campos=camera_centres(viewmats), width=width, height=height)


def upstream(scene, C, N, seed):
    """Random gradients for the differentiable outputs (colours' entries of either sign)."""
    gen = torch.Generator().manual_seed(seed)
    shapes = dict(means2d=(C, N, 2), depths=(C, N), conics=(C, N, 3), opacities=(C, N), colors=(C, N, 3))
    return {k: torch.randn(shapes[k], generator=gen) for k in GRADS}


def masked(grads, radii):
    """The gradients a rasterizer gives: zero at culled records."""
    seen = (radii > 0).all(-1)
    return {k: torch.where(seen if g.dim() == 2 else seen[..., None], g, 0.0) for k, g in grads.items()}


def run_reference(scene, deg, aa, grads, device="cpu", dtype=torch.float64):
    """The reference's outputs and, for ``grads`` (masked), autograd's raw-parameter gradients,
    evaluated in ``dtype``. Float64 is the reference's semantics without
    float32 rounding, which loses digits for thin Gaussians (the 2D determinant, the gradients of
    their thin axes)."""
    leaves = {k: v.detach().to(device, dtype).clone().requires_grad_() for k, v in scene["params"].items()}
    cams = [scene[k].to(device, dtype) for k in ("viewmats", "Ks", "campos")]
    C = cams[0].shape[0]
    out = project_and_shade(
        reference_ops, activated(leaves), *cams, [(scene["width"], scene["height"])] * C, deg, NEAR, FAR, False,
        "pinhole", aa,
    )  # fmt: skip
    g = masked({k: v.to(device, dtype) for k, v in grads.items()}, out["radii"])
    torch.autograd.backward([out[k] for k in GRADS], [g[k] for k in GRADS])
    return {k: v.detach().cpu() for k, v in out.items()}, {k: leaves[k].grad.cpu() for k in projection.PARAM_KEYS}


def run_fused(scene, deg, aa, grads_list, device):
    """The fused outputs and its raw-parameter gradients for each upstream gradient dict."""
    C = scene["viewmats"].shape[0]
    cams = [scene[k].to(device) for k in ("viewmats", "Ks", "campos")]
    results = []
    for grads in grads_list:
        leaves = {k: v.to(device).clone().requires_grad_() for k, v in scene["params"].items()}
        out = projection.project_and_shade_fused(leaves, *cams, scene["width"], scene["height"], deg, NEAR, FAR,
                                                 antialiased=aa)  # fmt: skip
        assert set(out) == set(projection.OUTPUT_KEYS) and out["radii"].shape == (C, leaves["means"].shape[0], 2)
        torch.autograd.backward([out[k] for k in GRADS], [grads[k].to(device) for k in GRADS])
        results.append(
            ({k: v.detach().cpu() for k, v in out.items()}, {k: leaves[k].grad.cpu() for k in projection.PARAM_KEYS})
        )
    return results


def run_poisoned(scene, deg, aa, grads):
    """forward_into / backward_into into outputs filled with NaN (radii with -7) and with zeros:
    bit-equal results when every element is written."""
    p = scene["params"]
    N, C = p["means"].shape[0], scene["viewmats"].shape[0]
    cams = [scene[k] for k in ("viewmats", "Ks", "campos")]
    setup = projection.Setup(scene["width"], scene["height"], deg, NEAR, FAR, aa)
    runs = []
    for fill in (float("nan"), 0.0):
        out = projection.empty_outputs(N, C, "cpu")
        for k, t in out.items():
            t.fill_(-7 if t.dtype == torch.int32 else fill)
        projection.forward_into(p, *cams, setup, out)
        g = {k: torch.full_like(v, fill) for k, v in p.items()}
        projection.backward_into(p, *cams, out["bits"], setup, grads, g)
        runs.append((out, g))
    return runs


def forwarded(scene, deg, aa):
    """(params, cameras, Setup, forward outputs) of ``scene`` after forward_into on the CPU."""
    p = scene["params"]
    N, C = p["means"].shape[0], scene["viewmats"].shape[0]
    cams = [scene[k] for k in ("viewmats", "Ks", "campos")]
    setup = projection.Setup(scene["width"], scene["height"], deg, NEAR, FAR, aa)
    out = projection.empty_outputs(N, C, "cpu")
    projection.forward_into(p, *cams, setup, out)
    return p, cams, setup, out


def run_seen_sh(scene, deg, aa, grads):
    """backward_into into NaN-filled gradients: (bits, [plain, seen_sh blockwise, seen_sh over the
    forward's list of seen Gaussians in reverse order, seen_sh over a list of every row (the
    kernel's blockwise path for it), the two lists again with one program striding over them, the
    list again without the unseen Gaussians' zeros])."""
    from splat_train.kernels.adam import SeenRows

    p, cams, setup, out = forwarded(scene, deg, aa)
    N = p["means"].shape[0]
    seen = SeenRows.from_mask(out["bits"] != 0)
    count = int(seen.count)
    seen.rows[:count] = seen.rows[:count].flip(0)
    every = SeenRows.from_mask(torch.ones(N, dtype=torch.bool))
    runs = []
    from splat_train.kernels import constants

    programs = constants.LISTED_PROGRAMS
    for seen_sh, listed, grid, zeros in ((False, None, 0, True), (True, None, 0, True), (True, seen, 0, True),
                                         (True, every, 0, True), (True, seen, 1, True), (True, every, 1, True),
                                         (True, seen, 0, False)):  # fmt: skip
        constants.LISTED_PROGRAMS = grid or programs  # 1: one program striding over every block
        g = {k: torch.full_like(v, float("nan")) for k, v in p.items()}
        projection.backward_into(p, *cams, out["bits"], setup, grads, g, seen_sh=seen_sh, listed=listed,
                                 unseen_zeros=zeros)  # fmt: skip
        if listed is not None:  # the bits the Adam reads the unwritten rows by, or None
            g["bits"] = listed.bits
        runs.append(g)
    constants.LISTED_PROGRAMS = programs
    return out["bits"], runs


def run_partial(scene, deg, aa, grads):
    """backward_into with some outputs' gradients missing (the kernel's HAS_* flags off) and with
    those gradients given as zeros: (missing, zeros) gradient dicts for no colour gradient, then
    for the colour gradient alone."""
    p, cams, setup, out = forwarded(scene, deg, aa)
    pairs = []
    for missing in (("colors",), ("means2d", "depths", "conics", "opacities")):
        runs = []
        for given in (
            {k: v for k, v in grads.items() if k not in missing},
            {k: v * 0 if k in missing else v for k, v in grads.items()},
        ):
            g = {k: torch.full_like(v, float("nan")) for k, v in p.items()}
            projection.backward_into(p, *cams, out["bits"], setup, given, g)
            runs.append(g)
        pairs.append(runs)
    return pairs


ADAM_CASES = (1, 2, 3, 5)  # cases whose backward also runs with Adam in it (K <= 16)
ADAM_STEP = 4  # the Adams' step count before the step (bias correction of t = 5)


def adam_state(scene, seed):
    """Moments of either sign / positive for every parameter, and a learning rate per parameter."""
    gen = torch.Generator().manual_seed(seed)
    moments = {
        k: (torch.randn(v.shape, generator=gen) * 1e-2, torch.rand(v.shape, generator=gen) * 1e-4)
        for k, v in scene["params"].items()
    }
    lrs = {k: 1e-3 * (i + 1) for i, k in enumerate(projection.PARAM_KEYS)}
    return moments, lrs


def adam_float32(p, g, m, v, row, visible=None):
    """kernels/adam.py's ``_update`` in float32 operation by operation, its constants ``row``
    (step size, 1/sqrt(bias correction 2), beta1, beta2, eps) float32 as the GPU passes them
    (the interpreter would evaluate a Python float argument in float64); ``visible``: rows that
    step (selective). Returns (param, exp_avg, exp_avg_sq)."""
    s, c, b1, b2, eps = (torch.tensor(x, dtype=torch.float32) for x in row)
    one = torch.tensor(1.0)
    m2 = b1 * m + (one - b1) * g
    v2 = b2 * v + (one - b2) * g * g
    p2 = p - s * m2 / (torch.sqrt(v2) * c + eps)
    if visible is None:
        return p2, m2, v2
    rows = visible.reshape(-1, *([1] * (p.dim() - 1)))
    return tuple(torch.where(rows, new, old) for new, old in ((p2, p), (m2, m), (v2, v)))


def run_adam(scene, deg, aa, grads, seed):
    """The backward with Adam in it (plain, selective, and with the frozen constants of a capture's
    warm-up) against the backward's gradients stepped by :func:`adam_float32` (kernels/adam.py's
    update; on a GPU, test_gpu_adam_in_the_backward_matches_the_adam_kernel compares with the
    kernel itself): {mode: ((param, exp_avg, exp_avg_sq) per key fused, the same separately,
    the visibility bits)}."""
    from splat_train.kernels import adam as adam_kernel
    from splat_train.trainer.step.backward_adam import FROZEN

    p, cams, setup, out = forwarded(scene, deg, aa)
    g = {k: torch.empty_like(v) for k, v in p.items()}
    projection.backward_into(p, *cams, out["bits"], setup, grads, g)
    moments, lrs = adam_state(scene, seed)
    results = {}
    for mode in ("adam", "selective", "frozen"):
        selective = mode == "selective"
        rows = []
        for k in projection.PARAM_KEYS:
            group = dict(lr=lrs[k], betas=(0.9, 0.999), eps=1e-15)
            constants = adam_kernel.step_constants(group, dict(step=torch.tensor(float(ADAM_STEP))), selective)
            rows.append((*constants, 0.9, 0.999, 1e-15))
        fused = {k: p[k].clone() for k in projection.PARAM_KEYS}
        step = projection.AdamStep(
            {k: (moments[k][0].clone(), moments[k][1].clone()) for k in projection.PARAM_KEYS},
            torch.tensor([FROZEN] * 6 if mode == "frozen" else rows, dtype=torch.float32),
            selective,
        )
        projection.backward_into(fused, *cams, out["bits"], setup, grads, {}, step)
        got = {k: (fused[k], *step.moments[k]) for k in projection.PARAM_KEYS}
        if mode == "frozen":
            want = {k: (p[k], *moments[k]) for k in projection.PARAM_KEYS}
        else:
            visible = out["bits"] != 0
            want = {k: adam_float32(p[k], g[k], *moments[k], row, visible if selective else None)
                    for k, row in zip(projection.PARAM_KEYS, rows)}  # fmt: skip
        results[mode] = (got, want, out["bits"])
    return results


def run_probe(scene):
    """The kernel's conservative frustum test (projection._precull), bits per Gaussian."""
    p = scene["params"]
    N, C = p["means"].shape[0], scene["viewmats"].shape[0]
    bits = torch.empty(N, dtype=torch.int32)
    _probe_kernel[(triton.cdiv(N, projection.BLOCK),)](
        p["means"], p["scales"], p["opacities"], scene["viewmats"], scene["Ks"], bits,
        N, C, scene["width"], scene["height"], NEAR, FAR, projection.EPS2D,
        SLACK=projection.CULL_SLACK, BLOCK=projection.BLOCK,
    )  # fmt: skip
    return bits


try:
    import triton
    import triton.language as tl

    @triton.jit
    def _probe_kernel(means_ptr, scales_ptr, opac_ptr, vm_ptr, ks_ptr, out_ptr, N, C, W, H, near, far, eps2d,
                      SLACK: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        live = offs < N
        mx = tl.load(means_ptr + offs * 3, mask=live, other=0.0)
        my = tl.load(means_ptr + offs * 3 + 1, mask=live, other=0.0)
        mz = tl.load(means_ptr + offs * 3 + 2, mask=live, other=0.0)
        s = tl.maximum(tl.load(scales_ptr + offs * 3, mask=live, other=0.0),
                       tl.load(scales_ptr + offs * 3 + 1, mask=live, other=0.0))  # fmt: skip
        s = tl.exp(tl.maximum(s, tl.load(scales_ptr + offs * 3 + 2, mask=live, other=0.0)))
        op = 1.0 / (1.0 + tl.exp(-tl.load(opac_ptr + offs, mask=live, other=0.0)))
        pre = projection._precull(mx, my, mz, s, op, live, vm_ptr, ks_ptr, C, W, H, near, far, eps2d, SLACK)
        tl.store(out_ptr + offs, pre, mask=live)

except ImportError:  # pragma: no cover - CPU-only torch wheels
    triton = None


# ------------------------------------------------------------------------------------------------
# Comparisons
# ------------------------------------------------------------------------------------------------


def radii_mismatch(got, want, per=500, excused=None):
    """Records whose radii differ ([C, N] bool). Allowed: at most 1 + records/per of them, each by one
    pixel (float rounding at a ceil, or at the image-bounds test), besides ``excused`` records
    ([C, N] bool), which may differ in any way."""
    diff = (got != want).any(-1)
    counted = diff if excused is None else diff & ~excused
    total = want.shape[0] * want.shape[1]
    assert int(counted.sum()) <= 1 + total // per, f"{int(counted.sum())} of {total} records' radii differ"
    by_one = ((got - want).abs() <= 1).all(-1) | (got == 0).all(-1) | (want == 0).all(-1)
    assert not (counted & ~by_one).any(), "radii differ by more than a pixel"
    return diff


def thin(want, limit=1e4):
    """[C, N] bool: visible records whose blurred 2D covariance has a condition number above
    ``limit`` (from the float64 reference's conics). gsplat's det = c00 c11 - c01^2 in float32
    loses most digits there, so its antialiased compensation, and with it the opacity-aware radius,
    can be far off (the kernel's determinant does not cancel)."""
    a, b, c = want["conics"].double().unbind(-1)
    mean, half = (a + c) / 2, torch.sqrt(((a - c) / 2) ** 2 + b * b)
    return (want["radii"] > 0).all(-1) & ((mean + half) > limit * (mean - half))


def check_forward(got, want, rel=1e-5):
    diff = radii_mismatch(got["radii"], want["radii"])
    keep = ~diff
    for k in projection.OUTPUT_KEYS[1:]:
        a, b = got[k][keep].double(), want[k][keep].double()
        assert torch.isfinite(a).all(), k
        scale = float(b.abs().max())
        assert torch.allclose(a, b, rtol=10 * rel, atol=rel * scale), (k, float((a - b).abs().max()), scale)
    assert got["radii"].dtype == torch.int32
    return diff


def check_grads(got, want, baseline, ignore=None, rel=1e-4, factor=4.0):
    """Raw-parameter gradients ``got`` against the float64 reference's ``want``, per tensor: the
    largest and the root-mean-square error within ``rel`` of the tensor's largest entry / norm, or
    within ``factor`` times those of ``baseline`` (the float32 reference, or gsplat): float32
    rounding makes the gradients of thin Gaussians ill-conditioned, the reference's own errors there
    pass 1e-4 (which digits survive depends on the order of operations; test_kernel_formulas_in_
    float64_equal_the_reference checks the formulas exactly). ``ignore``: bool [N] Gaussians left
    out (radii that differ by rounding)."""
    for k in projection.PARAM_KEYS:
        a, b, c = got[k].double(), want[k].double(), baseline[k].double()
        assert a.shape == b.shape and torch.isfinite(a).all(), k
        if ignore is not None:
            a, b, c = a[~ignore], b[~ignore], c[~ignore]
        if b.numel() == 0:
            continue
        worst, worst_baseline = float((a - b).abs().max()), float((c - b).abs().max())
        assert worst <= max(rel * float(b.abs().max()), factor * worst_baseline), (k, worst, worst_baseline)
        l2, l2_baseline = float((a - b).norm()), float((c - b).norm())
        assert l2 <= max(rel * float(b.norm()), factor * l2_baseline), (k, l2, l2_baseline)


def run_exact(scene, deg, aa, grads):
    """forward_into / backward_into on float64 tensors (the interpreter computes in the inputs'
    dtype): the kernels' formulas without float32 rounding."""
    p = {k: v.double() for k, v in scene["params"].items()}
    N, C = p["means"].shape[0], scene["viewmats"].shape[0]
    cams = [scene[k].double() for k in ("viewmats", "Ks", "campos")]
    setup = projection.Setup(scene["width"], scene["height"], deg, NEAR, FAR, aa)
    out = {k: v if v.dtype == torch.int32 else v.double() for k, v in projection.empty_outputs(N, C, "cpu").items()}
    projection.forward_into(p, *cams, setup, out)
    g = {k: torch.empty_like(v) for k, v in p.items()}
    projection.backward_into(p, *cams, out["bits"], setup, masked({k: v.double() for k, v in grads.items()},
                                                                   out["radii"]), g)  # fmt: skip
    return out, g


# ------------------------------------------------------------------------------------------------
# Interpreted (CPU)
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    if not projection.available():
        pytest.skip("Triton is not installed")
    tmp = tmp_path_factory.mktemp("projection")
    scenes = [make_scene(10 + i, N, C, K) for i, (N, C, K, _, _) in enumerate(CASES)]
    grads = [upstream(s, C, N, 100 + i) for i, (s, (N, C, *_)) in enumerate(zip(scenes, CASES))]
    torch.save(dict(scenes=scenes, grads=grads), tmp / "in.pt")
    run_interpreted(__file__, "kernel", str(tmp / "in.pt"), str(tmp / "out.pt"))
    out = torch.load(tmp / "out.pt")
    refs = [run_reference(s, deg, aa, g) for s, g, (_, _, _, deg, aa) in zip(scenes, grads, CASES)]
    refs32 = [run_reference(s, deg, aa, g, dtype=torch.float32)[1] for s, g, (*_, deg, aa) in zip(scenes, grads, CASES)]
    return scenes, grads, refs, out, refs32


@pytest.mark.parametrize("case", range(len(CASES)))
def test_forward_matches_reference_under_the_interpreter(interpreted, case):
    scenes, _, refs, out, _ = interpreted
    want, _ = refs[case]
    (got, _), _ = out["fused"][case]
    check_forward(got, want)
    seen = (want["radii"] > 0).all(-1)
    assert 0.2 < float(seen.float().mean()) < 0.8  # the scene culls and keeps


@pytest.mark.parametrize("case", range(len(CASES)))
def test_backward_matches_autograd_through_reference_under_the_interpreter(interpreted, case):
    scenes, _, refs, out, refs32 = interpreted
    want, want_grads = refs[case]
    (got, got_grads), _ = out["fused"][case]
    diff = check_forward(got, want)
    check_grads(got_grads, want_grads, refs32[case], ignore=diff.any(0))
    deg, K = CASES[case][3], CASES[case][2]
    if K > (deg + 1) ** 2:  # bases beyond the degree in use
        assert (got_grads["shN"][:, (deg + 1) ** 2 - 1 :] == 0).all()


@pytest.mark.parametrize("case", range(len(CASES)))
def test_kernel_formulas_in_float64_equal_the_reference(interpreted, case):
    """The same kernels on float64 inputs: outputs and gradients equal the float64 reference to
    1e-9 (the derivation is exact; what the float32 tests allow is rounding)."""
    _, _, refs, out, _ = interpreted
    want, want_grads = refs[case]
    got, got_grads = out["exact"][case]
    assert torch.equal(got["radii"], want["radii"])
    for k in projection.OUTPUT_KEYS[1:]:
        assert torch.allclose(got[k], want[k], rtol=1e-9, atol=1e-12), k
    for k in projection.PARAM_KEYS:
        a, b = got_grads[k], want_grads[k]
        if b.numel():
            assert float((a - b).abs().max()) <= 1e-9 * float(b.abs().max()), k


@pytest.mark.parametrize("case", range(len(CASES)))
def test_culled_records_pass_no_gradient_and_invisible_gaussians_get_exact_zeros(interpreted, case):
    """Upstream gradients at culled records (non-zero here) are ignored: the same gradients as the
    masked ones, bit for bit; a Gaussian no camera sees gets exactly 0 everywhere."""
    _, _, refs, out, _ = interpreted
    (got, masked_grads), (_, unmasked_grads) = out["fused"][case]
    invisible = ~(got["radii"] > 0).all(-1).any(0)
    assert invisible.any() and not invisible.all()
    if got["radii"].shape[1] >= 3 * projection.BLOCK:  # a program whose Gaussians are all unseen
        assert invisible[projection.BLOCK : 2 * projection.BLOCK].all()
    for k in projection.PARAM_KEYS:
        assert torch.equal(masked_grads[k], unmasked_grads[k]), k
        assert (unmasked_grads[k][invisible] == 0).all(), k


@pytest.mark.parametrize("case", POISONED)
def test_every_output_element_is_written(interpreted, case):
    _, _, _, out, _ = interpreted
    (nan_out, nan_grads), (zero_out, zero_grads) = out["poisoned"][case]
    for k in (*projection.OUTPUT_KEYS, "bits"):
        assert torch.equal(nan_out[k], zero_out[k]), k
    for k in projection.PARAM_KEYS:
        assert torch.equal(nan_grads[k], zero_grads[k]), k


@pytest.mark.parametrize("case", POISONED)
def test_missing_output_gradients_count_as_zeros(interpreted, case):
    """No gradient for the colours (or for everything but them): the gradients of zeros there,
    every element written (the outputs start as NaN), the SH coefficients' exactly 0 without a
    colour gradient."""
    _, _, _, out, _ = interpreted
    no_colour, colour_only = out["partial"][case]
    for missing, zeros in (no_colour, colour_only):
        for k in projection.PARAM_KEYS:
            assert torch.equal(missing[k], zeros[k]), k
    assert (no_colour[0]["sh0"] == 0).all() and (no_colour[0]["shN"] == 0).all()
    assert (colour_only[0]["shN"] != 0).any() and (colour_only[0]["quats"] == 0).all()


@pytest.mark.parametrize("case", POISONED)
def test_seen_sh_backward_writes_the_same_gradients_but_the_unseen_sh_rows(interpreted, case):
    """With seen_sh (--lazy_sh_adam) the backward writes every geometric gradient as without it
    (zeros for the unseen Gaussians, case 3's whole unseen program among them, stored without the
    math), the SH rows of the seen Gaussians and the stored bases past 16 of shN (zeros), and leaves
    the unseen Gaussians' SH rows unwritten (NaN here); over the forward's list of seen Gaussians
    (in any order) it writes the same, the unseen SH rows' bases past 16 also unwritten, and with a list of every row (the blockwise form, the bits still saying which
    rows are seen) it writes what the blockwise form writes; without the unseen Gaussians' zeros it
    leaves their geometric rows unwritten too and hands the Adam the bits to read them by."""
    _, _, _, out, _ = interpreted
    bits, (plain, lazy, listed, every, listed1, every1, unwritten) = out["seen_sh"][case]
    assert listed["bits"] is None and torch.equal(unwritten["bits"], bits)  # for the Adam: rows to read as zeros
    for k in projection.PARAM_KEYS:  # without the zeros: the seen rows as with them, the others untouched
        seen = bits != 0
        assert torch.equal(unwritten[k][seen], listed[k][seen]) and torch.isnan(unwritten[k][~seen]).all(), k
    for k in projection.PARAM_KEYS:  # one program striding over the blocks writes what one per block writes
        torch.testing.assert_close(listed1[k], listed[k], rtol=0, atol=0, equal_nan=True, msg=k)
        torch.testing.assert_close(every1[k], every[k], rtol=0, atol=0, equal_nan=True, msg=k)
    seen = bits != 0
    assert seen.any() and not seen.all()
    for k in projection.PARAM_KEYS:
        assert not torch.isnan(plain[k]).any(), k
        if k in ("sh0", "shN"):
            assert torch.equal(lazy[k][seen], plain[k][seen]), k
            assert torch.isnan(lazy[k][~seen][:, :16]).all() and (lazy[k][~seen][:, 16:] == 0).all(), k
        else:
            assert torch.equal(lazy[k], plain[k]) and (lazy[k][~seen] == 0).all(), k
        if k in ("sh0", "shN"):  # the list form leaves the unseen rows' stored bases past 16 unwritten too
            assert torch.equal(listed[k][seen], lazy[k][seen]) and torch.isnan(listed[k][~seen]).all(), k
        else:
            assert torch.equal(listed[k], lazy[k]), k
        torch.testing.assert_close(every[k], lazy[k], rtol=0, atol=0, equal_nan=True, msg=k)


@pytest.mark.parametrize("case", ADAM_CASES)
@pytest.mark.parametrize("mode", ["adam", "selective", "frozen"])
def test_adam_in_the_backward_equals_the_gradients_stepped_by_adam(interpreted, case, mode):
    """The backward with Adam in it leaves every moment as kernels/adam.py's update leaves them
    after the plain backward (bit for bit: the same operations in float32), the parameters to an
    ulp or two (on a GPU bit for bit, test_gpu_adam_in_the_backward_matches_the_adam_kernel);
    selective: only the visible Gaussians change (gsplat's SelectiveAdam); the frozen constants of
    a capture's warm-up change nothing."""
    scenes, _, _, out, _ = interpreted
    got, want, bits = out["adam"][case][mode]
    invisible = bits == 0
    assert invisible.any() and not invisible.all()
    for k in projection.PARAM_KEYS:
        for name, a, b in zip(("exp_avg", "exp_avg_sq"), got[k][1:], want[k][1:]):
            assert torch.equal(a, b), (k, name, float((a - b).abs().max()))
        # the parameter to an ulp or two of its operands (the interpreter's sqrt and division do not
        # round as torch's do)
        before = scenes[case]["params"][k]
        err = (got[k][0] - want[k][0]).abs()
        assert (err <= 2.4e-7 * (before.abs() + want[k][0].abs())).all(), (k, float(err.max()))
        if mode == "frozen":
            assert torch.equal(got[k][0], want[k][0]), k
    if mode != "frozen":
        start_m = adam_state_moments(case)
        for k in projection.PARAM_KEYS:
            if got[k][1].numel() == 0:
                continue
            changed = (got[k][1] != start_m[k]).reshape(bits.shape[0], -1).any(1)
            if mode == "selective":
                assert not changed[invisible].any(), k  # invisible rows keep their moments
            else:
                assert changed[invisible].all(), k  # decayed by beta1 even with a zero gradient


def adam_state_moments(case):
    N, C, K = CASES[case][:3]
    return {k: m for k, (m, _) in adam_state(make_scene(10 + case, N, C, K), 200 + case)[0].items()}


def test_precull_is_conservative_and_culls(interpreted):
    """The frustum test before the quaternion and SH loads keeps every record the projection gives
    radii > 0 and drops most of the others; the scene has visible Gaussians whose centre projects
    outside the image (only their radius keeps them), so a bound too tight would fail here."""
    scenes, _, refs, out, _ = interpreted
    outside = dropped = culled = 0
    for case, bits in enumerate(out["probe"]):
        want, _ = refs[case]
        C = want["radii"].shape[0]
        pre = torch.stack([(bits >> c) & 1 for c in range(C)]).bool()  # [C, N]
        seen = (want["radii"] > 0).all(-1)
        assert not (seen & ~pre).any(), f"case {case}: the frustum test dropped a visible record"
        W, H = scenes[case]["width"], scenes[case]["height"]
        with torch.no_grad():  # centres of visible records outside the image
            m = project_and_shade(
                reference_ops, activated(scenes[case]["params"]), scenes[case]["viewmats"], scenes[case]["Ks"],
                scenes[case]["campos"], [(W, H)] * C, 0, NEAR, FAR, False,
            )["means2d"]  # fmt: skip
        off = (m[..., 0] < 0) | (m[..., 0] > W) | (m[..., 1] < 0) | (m[..., 1] > H)
        outside += int((seen & off).sum())
        dropped += int((~seen & ~pre).sum())
        culled += int((~seen).sum())
    assert outside >= 20, outside
    assert dropped >= 0.6 * culled, (dropped, culled)


# ------------------------------------------------------------------------------------------------
# Host side, no kernel
# ------------------------------------------------------------------------------------------------


def test_traffic_counts_the_bytes_of_the_tensors_read_and_written():
    N, C, K, deg = 10, 3, 16, 2
    scene = make_scene(0, N, C, K)
    p = scene["params"]
    outputs = projection.empty_outputs(N, C, "cpu")
    t = projection.traffic(N, C, K, deg)
    used = (deg + 1) ** 2
    params_read = sum(p[k].nbytes for k in ("means", "quats", "scales", "opacities", "sh0")) + N * (used - 1) * 12
    assert t.forward_read == params_read
    assert t.forward_write == sum(v.nbytes for v in outputs.values())
    grads_read = sum(outputs[k].nbytes for k in ("means2d", "conics", "opacities", "colors"))
    assert t.backward_read == outputs["bits"].nbytes + params_read + grads_read
    assert t.backward_write == sum(v.nbytes for v in p.values())
    assert projection.traffic(N, C, K, deg, depth_grad=True).backward_read == t.backward_read + outputs["depths"].nbytes
    none = projection.traffic(N, C, K, deg, visible=0)
    assert none.forward_read == N * 28 and none.backward_read == N * 4  # means, scales, opacity; the mask
    assert t.forward == t.forward_read + t.forward_write and t.backward == t.backward_read + t.backward_write
    with pytest.raises(ValueError):
        projection.traffic(N, C, 9, 3)


@pytest.mark.skipif(projection.triton is None, reason="needs Triton")
def test_the_kernels_compile_once_whatever_the_counts_and_the_alignments():
    """Every name given to unspecialized_jit is a parameter of the kernel and is left
    unspecialized (a misspelt one would be ignored by Triton, and the run would compile again
    at each flip); the gradient pointers named are the backward's rasterizer inputs."""
    kernels = {
        projection._forward_kernel: ("N", "KR", *projection.VARYING_POINTERS),
        projection._backward_kernel: ("N", "KR", *projection.VARYING_POINTERS, *projection.VARYING_GRADIENT_POINTERS),
    }
    for kernel, names in kernels.items():
        params = {p.name: p for p in kernel.params}
        for name in names:
            assert name in params, (kernel.fn.__name__, name)
            p = params[name]
            assert p.do_not_specialize or getattr(p, "do_not_specialize_on_alignment", False), name
        assert not params["means_ptr"].do_not_specialize  # the others keep Triton's hints
    grads = [n for n in (p.name for p in projection._backward_kernel.params) if n.startswith("v_")]
    assert set(projection.VARYING_GRADIENT_POINTERS) == {
        f"v_{k}_ptr" for k in ("means2d", "depths", "conics", "opac", "colors")
    }
    assert set(projection.VARYING_GRADIENT_POINTERS) <= set(grads)


def test_unsupported_passes_are_refused_with_the_reason():
    scene = make_scene(0, 20, 2, 16)
    args = [scene[k] for k in ("viewmats", "Ks", "campos")]

    def call(params=scene["params"], cams=args, deg=3, model="pinhole"):
        return projection.project_and_shade_fused(params, *cams, 64, 48, deg, NEAR, FAR, camera_model=model)

    if projection.available():
        with pytest.raises(NotImplementedError, match="pinhole only"):
            call(model="ortho")
        with pytest.raises(NotImplementedError, match="pose_opt"):
            call(cams=[args[0].clone().requires_grad_(), *args[1:]])
    with pytest.raises(ValueError, match="SH degree 3 needs 16 bases"):
        call(params=dict(scene["params"], shN=scene["params"]["shN"][:, :8]))
    with pytest.raises(ValueError, match="quats must be"):
        call(params=dict(scene["params"], quats=scene["params"]["quats"][:, :3]))
    with pytest.raises(ValueError, match="Ks must be"):
        call(cams=[args[0], args[1][:1], args[2]])


def test_bench_script_refuses_bad_arguments(capsys):
    from splat_train.scripts import bench_projection

    assert bench_projection.main(["--resolution", "1920by1080"]) == 2
    assert "--resolution" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------
# GPU
# ------------------------------------------------------------------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm device")
needs_triton = pytest.mark.skipif(not projection.available(), reason="needs Triton")


def _gsplat_pass(scene, deg, aa, grads):
    """gsplat's ops on the GPU: outputs and autograd's raw-parameter gradients (masked upstream)."""
    from splat_train.trainer.render import ops_for

    dev = torch.device("cuda")
    leaves = {k: v.to(dev).clone().requires_grad_() for k, v in scene["params"].items()}
    C = scene["viewmats"].shape[0]
    out = project_and_shade(
        ops_for("gsplat", dev), activated(leaves), *(scene[k].to(dev) for k in ("viewmats", "Ks", "campos")),
        [(scene["width"], scene["height"])] * C, deg, NEAR, FAR, False, "pinhole", aa,
    )  # fmt: skip
    g = masked({k: v.to(dev) for k, v in grads.items()}, out["radii"])
    torch.autograd.backward([out[k] for k in GRADS], [g[k] for k in GRADS])
    return {k: v.detach().cpu() for k, v in out.items()}, {k: leaves[k].grad.cpu() for k in projection.PARAM_KEYS}


@pytest.mark.gpu
@needs_cuda
@needs_triton
@pytest.mark.parametrize("deg,aa,C", [(3, False, 1), (3, True, 2), (1, False, 3), (0, True, 1)])
def test_gpu_matches_the_reference_and_gsplat_at_200k_gaussians(deg, aa, C):
    """On the GPU: outputs against the float64 reference (as on the CPU), radii against gsplat's
    CUDA ops (at most 1 in 500 records differ, by a pixel: gsplat computes with fast math; with
    ``antialiased`` besides the :func:`thin` records), and gradients against the float64 reference
    within 1e-4 or 4x gsplat's own float32 error."""
    N, K = 200_000, 16
    scene = make_scene(7, N, C, K, width=640, height=480)
    grads = upstream(scene, C, N, 8)
    want, want_grads = run_reference(scene, deg, aa, grads, device="cuda")
    gs, gs_grads = _gsplat_pass(scene, deg, aa, grads)
    got, got_grads = run_fused(scene, deg, aa, [masked(grads, want["radii"])], "cuda")[0]
    diff = check_forward(got, want)
    excused = thin(want) if aa else None
    gs_diff = radii_mismatch(gs["radii"], want["radii"], excused=excused)
    radii_mismatch(got["radii"], gs["radii"], excused=excused)
    check_grads(got_grads, want_grads, gs_grads, ignore=(diff | gs_diff).any(0))


@pytest.mark.gpu
@needs_cuda
@needs_triton
def test_gpu_forward_and_backward_replay_from_a_cuda_graph():
    """Captured once (torch.cuda.graph), replayed after the parameters changed in place: the
    eager pass's outputs and gradients, bit for bit (no atomics: deterministic)."""
    N, C, deg = 50_000, 2, 3
    scene = make_scene(3, N, C, 16, width=640, height=480)
    dev = torch.device("cuda")
    params = {k: v.to(dev).requires_grad_() for k, v in scene["params"].items()}
    cams = [scene[k].to(dev) for k in ("viewmats", "Ks", "campos")]
    ups = {k: v.to(dev) for k, v in upstream(scene, C, N, 4).items()}

    def step():
        out = projection.project_and_shade_fused(params, *cams, 640, 480, deg, NEAR, FAR, antialiased=True)
        grads = torch.autograd.grad([out[k] for k in GRADS], list(params.values()), [ups[k] for k in GRADS])
        return [out[k] for k in projection.OUTPUT_KEYS], list(grads)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # compiles outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out, static_grads = step()
    with torch.no_grad():
        params["means"].add_(0.05)
        params["shN"].mul_(0.5)
    graph.replay()
    torch.cuda.synchronize()
    eager_out, eager_grads = step()
    for a, b in zip(static_out + static_grads, eager_out + eager_grads):
        assert torch.equal(a, b)
    assert (eager_out[0] > 0).any()


def compare_adam_in_the_backward(selective, N=200_000, device="cuda"):
    """The backward with Adam in it (``fused``) and the plain backward + kernels/adam.py's launch
    (``separate``), both float32, against Adam applied in float64 to the float64 reference's
    gradients (``exact``), at N Gaussians (deg 3, 2 cameras, antialiased), torch.optim.Adam state
    at step 4. Returns (failures, visible share): per tensor (parameters and moments), the
    fused error must stay within 4x the separate one or 1e-4 of the exact value's norm, as
    check_grads holds the gradients (both are float32 roundings of one update: the compiled
    kernels contract the gradient's multiply-adds differently, thin Gaussians' gradients are
    ill-conditioned, and Adam's m / sqrt(v) turns a gradient's rounding into a whole step's
    sign); Gaussians whose float32 and float64 radii differ are left out. Selective: invisible
    rows are unchanged, bit for bit."""
    from splat_train.kernels import adam as adam_kernel
    from splat_train.kernels.reference import adam_update, selective_adam_update

    C, deg = 2, 3
    scene = make_scene(5, N, C, 16, width=640, height=480)
    dev = torch.device(device)
    p = {k: v.to(dev).contiguous() for k, v in scene["params"].items()}
    cams = [scene[k].to(dev) for k in ("viewmats", "Ks", "campos")]
    setup = projection.Setup(640, 480, deg, NEAR, FAR, True)
    out = projection.empty_outputs(N, C, dev)
    projection.forward_into(p, *cams, setup, out)
    up = masked(upstream(scene, C, N, 6), out["radii"].cpu())
    want64, exact_grads = run_reference(scene, deg, True, up)
    ignore = (want64["radii"] != out["radii"].cpu()).any(-1).any(0)
    grads = {k: v.to(dev) for k, v in up.items()}
    g = {k: torch.empty_like(v) for k, v in p.items()}
    projection.backward_into(p, *cams, out["bits"], setup, grads, g)
    moments, lrs = adam_state(scene, 7)
    opts, rows, leaves = [], [], []
    for k in projection.PARAM_KEYS:
        q = p[k].clone()
        opt = torch.optim.Adam([q], lr=lrs[k], eps=1e-15)
        state = adam_kernel.state_of(opt, q)
        state["step"] += ADAM_STEP
        state["exp_avg"].copy_(moments[k][0])
        state["exp_avg_sq"].copy_(moments[k][1])
        rows.append((*adam_kernel.step_constants(opt.param_groups[0], state, selective), 0.9, 0.999, 1e-15))
        q.grad = g[k].clone()
        opts.append(opt)
        leaves.append(q)
    visible = out["bits"] != 0
    adam_kernel.adam_step(opts, visible if selective else None)
    step = projection.AdamStep(
        {k: tuple(m.to(dev).clone() for m in moments[k]) for k in projection.PARAM_KEYS},
        torch.tensor(rows, dtype=torch.float32, device=dev),
        selective,
    )
    fused = {k: v.clone() for k, v in p.items()}
    projection.backward_into(fused, *cams, out["bits"], setup, grads, {}, step)
    failures = []
    keep = ~ignore
    for k, opt, leaf in zip(projection.PARAM_KEYS, opts, leaves):
        d = lambda t: t.detach().double().cpu()[keep]  # noqa: E731
        m, v = (x.double() for x in moments[k])
        gx = exact_grads[k].double()
        if selective:
            exact = selective_adam_update(p[k].double().cpu(), gx, m, v, visible.cpu(), lrs[k], 0.9, 0.999, 1e-15)
        else:
            exact = adam_update(p[k].double().cpu(), gx, m, v, ADAM_STEP + 1, lrs[k], 0.9, 0.999, 1e-15)
        separate = (leaf, opt.state[leaf]["exp_avg"], opt.state[leaf]["exp_avg_sq"])
        for name, a, b, e in zip(("param", "exp_avg", "exp_avg_sq"), (fused[k], *step.moments[k]), separate, exact):
            e = e[keep]
            err, base = float((d(a) - e).norm()), float((d(b) - e).norm())
            print(f"{k} {name}: fused error {err:.3e}, separate {base:.3e}, norm {float(e.norm()):.3e}")
            if err > max(4 * base, 1e-4 * float(e.norm())):
                failures.append((k, name, err, base))
        if selective:
            hidden = ~visible.reshape(-1, *([1] * (p[k].dim() - 1))).expand_as(p[k])
            if not torch.equal(fused[k][hidden], p[k][hidden]):
                failures.append((k, "invisible rows moved"))
    return failures, float(visible.float().mean())


@pytest.mark.gpu
@needs_cuda
@needs_triton
@pytest.mark.parametrize("selective", [False, True])
def test_gpu_adam_in_the_backward_matches_the_adam_kernel(selective):
    """At 200k Gaussians on the GPU: the backward with Adam in it as close to the float64 update
    as the plain backward + kernels/adam.py's launch (:func:`compare_adam_in_the_backward`)."""
    failures, share = compare_adam_in_the_backward(selective)
    assert not failures, failures
    assert 0.1 < share < 0.9


@pytest.mark.gpu
@needs_cuda
@needs_triton
def test_gpu_bench_script_runs(tmp_path):
    from splat_train.scripts import bench_projection

    out = tmp_path / "bench.json"
    args = ["--gaussians", "100000", "--cameras", "2", "--layout", "tenth", "--repeats", "2", "--json", str(out)]
    assert bench_projection.main(args) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["path"] for r in rows] == ["gsplat (activated + project_and_shade)", "fused"]
    assert all(r["forward_ms"] > 0 and r["backward_gbs"] > 0 for r in rows)


if __name__ == "__main__" and sys.argv[1:2] == ["kernel"]:
    data = torch.load(sys.argv[2])
    fused, poisoned, partial, probe, exact, adam, seen_sh = [], {}, {}, [], [], {}, {}
    for i, (scene, grads, (N, C, K, deg, aa)) in enumerate(zip(data["scenes"], data["grads"], CASES)):
        ((out, unmasked),) = run_fused(scene, deg, aa, [grads], "cpu")
        fused.append(run_fused(scene, deg, aa, [masked(grads, out["radii"])], "cpu") + [(out, unmasked)])
        if i in POISONED:
            poisoned[i] = run_poisoned(scene, deg, aa, grads)
            partial[i] = run_partial(scene, deg, aa, masked(grads, out["radii"]))
            seen_sh[i] = run_seen_sh(scene, deg, aa, masked(grads, out["radii"]))
        probe.append(run_probe(scene))
        exact.append(run_exact(scene, deg, aa, grads))
        if i in ADAM_CASES:
            adam[i] = run_adam(scene, deg, aa, masked(grads, out["radii"]), 200 + i)
    torch.save(
        dict(fused=fused, poisoned=poisoned, partial=partial, probe=probe, exact=exact, adam=adam, seen_sh=seen_sh),
        sys.argv[3],
    )
