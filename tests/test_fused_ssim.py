"""Triton fused SSIM (kernels/fused_ssim.py) against trainer/losses.py's PyTorch SSIM.

The kernels run under ``TRITON_INTERPRET=1`` in ONE child process (Triton fixes
compiled-vs-interpreted at import, and the variable must not leak into other test modules): the
parent writes fresh seeded images, the child (``python tests/test_fused_ssim.py kernels IN OUT``)
runs the public ``fused_ssim`` (value and gradient through autograd) and the raw kernels into
NaN-poisoned buffers (so an element a kernel fails to write shows up), and the parent compares
with the PyTorch SSIM in float64 (itself tested against an independent numpy SSIM in
test_losses.py). NaN never passes: every result is checked finite before it is compared.
"""

import sys

import pytest
import torch

from interpreted import run_interpreted

from splat_train.kernels import fused_ssim as fs
from splat_train.trainer import losses

SIZES = [(2, 37, 23), (2, 16, 16), (2, 64, 48), (1, 11, 11)]
PADDINGS = ["same", "valid"]
KINDS = ["random", "correlated", "identical", "nchw_view"]
CASES = [(size, padding, kind) for size in SIZES for padding in PADDINGS for kind in KINDS]
VALUE_ATOL = 1e-5
GRAD_RTOL = 1e-4  # max |error| relative to max |reference gradient|


def case_id(case):
    (b, h, w), padding, kind = case
    return f"{b}x{h}x{w}-{padding}-{kind}"


def make_images(size, kind, seed):
    """(img1, img2) float32 [B, H, W, 3] in [0, 1]; fresh random draws per seed."""
    gen = torch.Generator().manual_seed(seed)
    img1 = torch.rand(*size, 3, generator=gen)
    if kind == "identical":
        return img1, img1.clone()
    if kind == "correlated":  # a render close to its ground truth: SSIM near 1, as in training
        return img1, (img1 + 0.1 * torch.randn(img1.shape, generator=gen)).clamp(0, 1)
    return img1, torch.rand(*size, 3, generator=gen)


def reference(img1, img2, padding):
    """(value, d value / d img1) of the PyTorch SSIM, in float64."""
    x = img1.double().requires_grad_()
    value = losses.ssim(x, img2.double(), padding=padding, backend="pytorch")
    value.backward()
    return value.detach(), x.grad


def run_case(img1, img2, padding, kind):
    """Kernel results for one case (runs wherever fused_ssim can: interpreter or GPU)."""
    if kind == "nchw_view":  # NCHW storage handed over as a [B, H, W, 3] view, no copy
        img1 = img1.permute(0, 3, 1, 2).contiguous().permute(0, 2, 3, 1)
        img2 = img2.permute(0, 3, 1, 2).contiguous().permute(0, 2, 3, 1)
        assert not img1.is_contiguous()
    x = img1.clone().requires_grad_() if kind != "nchw_view" else img1.detach().requires_grad_()
    value = fs.fused_ssim(x, img2, padding=padding)
    value.backward(torch.tensor(2.0, device=value.device))  # a non-unit upstream gradient
    # The raw kernels into NaN-poisoned buffers: every element must be overwritten.
    partials, maps = (t.fill_(float("nan")) for t in fs.buffers(img1, padding, train=True))
    poisoned_value = fs.ssim_forward_into(img1, img2, padding, partials, maps)
    grad = torch.full(img1.shape, float("nan"), device=img1.device)
    fs.ssim_backward_into(torch.tensor(2.0, device=img1.device), img1, img2, padding, maps, grad)
    with torch.no_grad():  # inference: no maps written, same value
        no_grad_value = fs.fused_ssim(img1, img2, padding=padding)
    render = img1.detach().clone().requires_grad_()  # through the trainer's entry point
    via_losses = losses.ssim(render, img2, padding=padding, backend="triton")
    (2.0 * via_losses).backward()
    return dict(
        value=value.detach().cpu(),
        grad=x.grad.cpu(),
        partials=partials.cpu(),
        maps=maps.cpu(),
        poisoned_value=poisoned_value.cpu(),
        poisoned_grad=grad.cpu(),
        no_grad_value=no_grad_value.cpu(),
        via_losses_value=via_losses.detach().cpu(),
        via_losses_grad=render.grad.cpu(),
    )


LOSS_CASES = [
    ((2, 37, 23), "valid", "u8"),
    ((1, 40, 70), "valid", "float"),
    ((2, 16, 16), "same", "u8"),
    ((1, 64, 48), "same", "float"),
    ((1, 11, 11), "valid", "u8"),
    ((1, 30, 60), "valid", "identical-u8"),
]
LOSS_LAMBDA = 0.2


def loss_case_id(case):
    (b, h, w), padding, kind = case
    return f"loss-{b}x{h}x{w}-{padding}-{kind}"


def make_loss_images(size, kind, seed):
    """(render float32, ground truth float32 or uint8) for the fused loss."""
    gen = torch.Generator().manual_seed(seed)
    gt8 = torch.randint(0, 256, (*size, 3), generator=gen, dtype=torch.uint8)
    gt = gt8.float() * fs.UINT8_SCALE  # the kernels' reading of uint8 ground truth
    if kind == "identical-u8":
        return gt, gt8
    render = (gt + 0.1 * torch.randn((*size, 3), generator=gen)).clamp(0, 1)
    return render, (gt8 if kind.endswith("u8") else gt)


def loss_reference(render, gt, padding):
    """(loss, l1, ssim, d loss / d render) of trainer.losses.photometric_loss in float64."""
    x = render.double().requires_grad_()
    y = (gt.float() * fs.UINT8_SCALE if gt.dtype == torch.uint8 else gt).double()
    loss, terms = losses.photometric_loss(x, y, LOSS_LAMBDA, ssim_padding=padding, ssim_backend_name="pytorch")
    loss.backward()
    return loss.detach(), terms["l1"], terms["ssim"], x.grad


def run_loss_case(render, gt, padding):
    """The fused loss's value, terms and gradient (upstream gradient 3), wherever it can run."""
    x = render.clone().requires_grad_()
    loss, terms = fs.fused_l1_ssim_loss(x, gt, LOSS_LAMBDA, padding=padding)
    (3.0 * loss).backward()
    return dict(loss=loss.detach().cpu(), l1=terms["l1"].cpu(), ssim=terms["ssim"].cpu(), grad=x.grad.cpu())


def check_loss_case(render, gt, padding, got):
    for name, t in got.items():
        assert torch.isfinite(t).all(), f"{name} has NaN/Inf"
    ref_loss, ref_l1, ref_ssim, ref_grad = loss_reference(render, gt, padding)
    assert abs(got["loss"].item() - ref_loss.item()) <= 1e-5 * max(1.0, abs(ref_loss.item()))
    assert abs(got["l1"].item() - ref_l1.item()) <= 1e-5
    assert abs(got["ssim"].item() - ref_ssim.item()) <= VALUE_ATOL
    ref_grad = 3.0 * ref_grad
    if ref_l1.item() == 0:  # identical images: |x - y| has no derivative at 0; any subgradient in
        # [-1, 1] x (1 - lambda) / N is right (a GPU's fused multiply-add leaves x - y at +-1 ulp)
        assert abs(got["loss"].item()) <= 1e-6
        assert got["grad"].abs().max().item() <= 3.0 * (1.0 - LOSS_LAMBDA) / render.numel() * (1 + 1e-3)
        return
    scale = ref_grad.abs().max().item()
    assert (got["grad"].double() - ref_grad).abs().max().item() <= GRAD_RTOL * scale


def check_case(img1, img2, padding, kind, got):
    for name, t in got.items():
        assert torch.isfinite(t).all(), f"{name} has NaN/Inf (unwritten or wrong)"
    ref_value, ref_grad = reference(img1, img2, padding)
    ref_grad = 2.0 * ref_grad
    assert abs(got["value"].item() - ref_value.item()) <= VALUE_ATOL, (got["value"], ref_value)
    assert got["poisoned_value"].item() == got["value"].item()
    # inference compiles the kernel without its map stores (SAVE=False): on a GPU that build may
    # order the float32 sums differently (seen on the H200: 1 ulp), so equal to rounding only
    assert got["no_grad_value"].item() == pytest.approx(got["value"].item(), rel=1e-6, abs=1e-9)
    assert got["via_losses_value"].item() == got["value"].item()
    assert torch.equal(got["via_losses_grad"], got["grad"])
    assert torch.equal(got["poisoned_grad"], got["grad"])
    assert got["grad"].shape == img1.shape and got["grad"].dtype == torch.float32
    if kind == "identical":
        assert got["value"].item() == pytest.approx(1.0, abs=1e-6)
        num_outputs = (
            img1.numel() if padding == "same" else img1.shape[0] * 3 * ((img1.shape[1] - 10) * (img1.shape[2] - 10))
        )
        # per-pixel dS/dx below 1e-4 (the float64 reference is ~1e-12; a real one is O(1))
        assert got["grad"].abs().max().item() <= 2.0 * 1e-4 / num_outputs
        return
    scale = ref_grad.abs().max().item()
    assert scale > 0
    err = (got["grad"].double() - ref_grad).abs().max().item()
    assert err <= GRAD_RTOL * scale, (err, scale)


# ------------------------------------------------------------------------------------------------
# Under the Triton interpreter (one child process)
# ------------------------------------------------------------------------------------------------


def _run_kernels(in_path, out_path):
    """Child side: run the kernels on the parent's images and save what they return."""
    assert fs._INTERPRETED, "TRITON_INTERPRET=1 must be set before the import"
    out = {}
    for key, c in torch.load(in_path).items():
        if key.startswith("loss-"):
            out[key] = run_loss_case(c["img1"], c["img2"], c["padding"])
        else:
            out[key] = run_case(c["img1"], c["img2"], c["padding"], c["kind"])
    torch.save(out, out_path)


@pytest.fixture(scope="module")
def kernel_results(tmp_path_factory):
    if not fs.available():
        pytest.skip("Triton is not installed")
    tmp = tmp_path_factory.mktemp("fused_ssim")
    cases = {}
    for i, case in enumerate(CASES):
        size, padding, kind = case
        img1, img2 = make_images(size, kind, seed=1000 + i)
        cases[case_id(case)] = dict(img1=img1, img2=img2, padding=padding, kind=kind)
    for i, case in enumerate(LOSS_CASES):
        size, padding, kind = case
        render, gt = make_loss_images(size, kind, seed=3000 + i)
        cases[loss_case_id(case)] = dict(img1=render, img2=gt, padding=padding, kind=kind)
    torch.save(cases, tmp / "in.pt")
    run_interpreted(__file__, "kernels", str(tmp / "in.pt"), str(tmp / "out.pt"), timeout=600)
    return cases, torch.load(tmp / "out.pt")


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_kernel_matches_pytorch_ssim(kernel_results, case):
    cases, results = kernel_results
    c = cases[case_id(case)]
    check_case(c["img1"], c["img2"], c["padding"], c["kind"], results[case_id(case)])


@pytest.mark.parametrize("case", LOSS_CASES, ids=loss_case_id)
def test_fused_loss_matches_photometric_loss(kernel_results, case):
    """L1 + D-SSIM in the SSIM kernels (uint8 or float ground truth) equals the PyTorch loss."""
    cases, results = kernel_results
    c = cases[loss_case_id(case)]
    check_loss_case(c["img1"], c["img2"], c["padding"], results[loss_case_id(case)])


def test_loss_checker_rejects_wrong_values():
    render, gt = make_loss_images((1, 20, 30), "u8", seed=5)
    loss, l1, ssim_value, grad = loss_reference(render, gt, "valid")
    good = dict(loss=loss.float(), l1=l1.float(), ssim=ssim_value.float(), grad=(3 * grad).float())
    check_loss_case(render, gt, "valid", good)
    for name, bad in [
        ("loss", loss.float() + 1e-3),
        ("l1", l1.float() * 1.01),
        ("grad", good["grad"] * 1.01),
        ("ssim", torch.tensor(float("nan"))),
    ]:
        with pytest.raises(AssertionError):
            check_loss_case(render, gt, "valid", dict(good, **{name: bad}))


def test_checker_rejects_nan_and_wrong_values():
    """The comparison itself: a NaN anywhere, or a wrong value or gradient, fails."""
    img1, img2 = make_images((1, 16, 16), "random", seed=7)
    value, grad = reference(img1, img2, "same")
    good = dict(
        value=value.float(),
        grad=(2 * grad).float(),
        partials=torch.zeros(1),
        maps=torch.zeros(1),
        poisoned_value=value.float(),
        poisoned_grad=(2 * grad).float(),
        no_grad_value=value.float(),
        via_losses_value=value.float(),
        via_losses_grad=(2 * grad).float(),
    )
    check_case(img1, img2, "same", "random", good)
    for name, bad in [
        ("partials", torch.tensor([float("nan")])),
        ("value", value.float() + 1e-3),
        ("grad", good["grad"] * 1.01),
    ]:
        with pytest.raises(AssertionError):
            check_case(img1, img2, "same", "random", dict(good, **{name: bad}))
    nan_grad = good["grad"].clone()
    nan_grad[0, 3, 4, 1] = float("nan")
    with pytest.raises(AssertionError):
        check_case(
            img1, img2, "same", "random", dict(good, grad=nan_grad, poisoned_grad=nan_grad, via_losses_grad=nan_grad)
        )


# ------------------------------------------------------------------------------------------------
# Argument checks and backend selection (no kernel launch)
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape1, shape2, dtype, padding",
    [
        ((1, 16, 16, 3), (1, 16, 16, 3), torch.float64, "same"),  # float32 only
        ((1, 3, 16, 16), (1, 3, 16, 16), torch.float32, "same"),  # NCHW must be permuted
        ((1, 16, 16, 3), (1, 16, 15, 3), torch.float32, "same"),
        ((1, 16, 16, 3), (1, 16, 16, 3), torch.float32, "reflect"),
        ((1, 10, 16, 3), (1, 10, 16, 3), torch.float32, "valid"),
    ],  # smaller than the window
)
def test_fused_ssim_rejects_bad_arguments(shape1, shape2, dtype, padding):
    with pytest.raises(ValueError):
        fs.fused_ssim(torch.rand(shape1, dtype=dtype), torch.rand(shape2, dtype=dtype), padding=padding)


def test_fused_ssim_refuses_batches_whose_saved_maps_overflow_int32():
    """805 M elements fit int32, but the third saved map starts at 2 x numel: with a gradient to
    save for, refused before any launch; without, the check passes (expanded tensors: no memory
    is allocated)."""
    base = torch.zeros(1, 1, 1, 3, requires_grad=True)
    big = base.expand(1, 16384, 16384, 3)
    assert big.numel() < 2**31 <= fs.MAX_OFFSET_FACTOR * big.numel()
    with pytest.raises(ValueError, match="saved maps"):
        fs.fused_ssim(big, big.detach())
    assert not fs._INTERPRETED  # else the call below would launch on 805 M elements
    with torch.no_grad(), pytest.raises(RuntimeError, match="CUDA/ROCm tensors"):  # past the size check
        fs.fused_ssim(big, big.detach())


def test_ssim_backend_prefers_fused_ssim_then_triton_then_pytorch(monkeypatch):
    monkeypatch.setitem(sys.modules, "fused_ssim", None)  # the package is missing
    losses._fused_ssim_fn.cache_clear()
    losses._triton_ssim_fn.cache_clear()
    try:
        assert losses.ssim_backend("cpu") == "pytorch"
        assert losses.ssim_backend(torch.device("cuda", 0)) == "triton"  # Triton imports here
        monkeypatch.setattr(losses, "_triton_ssim_fn", lambda: None)  # Triton missing too
        assert losses.ssim_backend("cuda") == "pytorch"
        with pytest.raises(ImportError):
            losses.ssim(torch.rand(1, 16, 16, 3), torch.rand(1, 16, 16, 3), backend="triton")
    finally:
        losses._fused_ssim_fn.cache_clear()


# ------------------------------------------------------------------------------------------------
# GPU
# ------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm device")
@pytest.mark.skipif(not fs.available(), reason="needs Triton")
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_kernel_on_gpu_matches_pytorch_ssim(case):
    size, padding, kind = case
    img1, img2 = make_images(size, kind, seed=2000 + CASES.index(case))
    got = run_case(img1.cuda(), img2.cuda(), padding, kind)
    check_case(img1, img2, padding, kind, got)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm device")
@pytest.mark.skipif(not fs.available(), reason="needs Triton")
@pytest.mark.parametrize(
    "case", LOSS_CASES + [((2, 270, 480), "valid", "u8"), ((1, 1200, 1600), "valid", "u8")], ids=loss_case_id
)
def test_fused_loss_on_gpu_matches_photometric_loss(case):
    size, padding, kind = case
    render, gt = make_loss_images(size, kind, seed=4000)
    got = run_loss_case(render.cuda(), gt.cuda(), padding)
    check_loss_case(render, gt, padding, got)


if __name__ == "__main__" and sys.argv[1:2] == ["kernels"]:
    _run_kernels(sys.argv[2], sys.argv[3])
