"""kernels/grad_scale.py (the fused loss's in-place gradient scaling, skipped on the device when the
incoming gradient is 1) against its reference ``x.mul_(factor)``, bit for bit: under
``TRITON_INTERPRET=1`` in a child process (``python tests/test_grad_scale.py kernel OUT``) with a
grid-stride loop of two programs, and on a GPU (``-m gpu``)."""

import sys

import pytest
import torch

from interpreted import run_interpreted

from splat_train.kernels import grad_scale

FACTORS = [1.0, 2.5, 0.0, -1.0, float("nan"), 1.0 + 2**-23]


def make_x(n=5000, seed=0):
    """Random values and the floats a multiplication by 1 must keep: signed zeros, infinities, NaN,
    subnormals."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=gen) * 10.0 ** torch.randint(-30, 30, (n,), generator=gen)
    x[:6] = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-42])
    return x


def run_kernel(device):
    """x scaled in place by grad_scale.scale_, for each of FACTORS."""
    out = []
    for f in FACTORS:
        x = make_x().to(device)
        grad_scale.scale_(x, torch.tensor([f], device=device))
        out.append(x.cpu())
    return out


def check(out):
    for f, got in zip(FACTORS, out):
        want = make_x()
        grad_scale.scale_reference(want, torch.tensor([f]))
        nan = torch.isnan(want)
        assert torch.equal(torch.isnan(got), nan), f"factor {f}: NaNs"
        # bit patterns, so that signed zeros count (NaN payloads may differ between the two)
        assert torch.equal(got[~nan].view(torch.int32), want[~nan].view(torch.int32)), f"factor {f}"
    # factor 1: untouched, NaN payload included
    assert torch.equal(out[FACTORS.index(1.0)].view(torch.int32), make_x().view(torch.int32))


@pytest.mark.skipif(not grad_scale.available(), reason="Triton is not installed")
def test_kernel_matches_reference_under_the_interpreter(tmp_path):
    run_interpreted(__file__, "kernel", str(tmp_path / "out.pt"))
    check(torch.load(tmp_path / "out.pt"))


def test_reference_runs_off_the_gpu():
    """On the CPU (no interpreter) scale_ is the reference itself."""
    check(run_kernel("cpu"))


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="contiguous float32"):
        grad_scale.scale_(torch.zeros(4, dtype=torch.float64), torch.ones(1))
    with pytest.raises(ValueError, match="contiguous float32"):
        grad_scale.scale_(torch.zeros(4, 2).t(), torch.ones(1))
    with pytest.raises(ValueError, match="one float32 element"):
        grad_scale.scale_(torch.zeros(4), torch.ones(2))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU")
def test_kernel_matches_reference_on_the_gpu(monkeypatch):
    check(run_kernel("cuda"))
    monkeypatch.setattr(grad_scale, "MAX_PROGRAMS", 2)  # the grid-stride loop
    check(run_kernel("cuda"))


if __name__ == "__main__" and sys.argv[1:2] == ["kernel"]:
    grad_scale.MAX_PROGRAMS = 2  # 5000 elements in blocks of 2048: each program loops
    torch.save(run_kernel("cpu"), sys.argv[2])
