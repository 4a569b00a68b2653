"""kernels/densify_stats.py against kernels.reference.densify_stats_update (dense and packed), under
the Triton interpreter in a child process (``python tests/test_densify_stats.py kernel IN OUT``)
and, with ``-m gpu``, on the GPU. The reference itself is tested against gsplat's own update in
test_model.py::test_update_state_equals_gsplats."""

import sys

import pytest
import torch

from interpreted import run_interpreted

from splat_train.kernels import densify_stats
from splat_train.kernels.reference import densify_stats_update

CASES = {"dense-1cam": (1, 3000), "dense-3cams": (3, 1500), "packed": (3, 1500), "empty": (2, 0)}


def make_case(name, seed):
    num_cameras, n = CASES[name]
    gen = torch.Generator().manual_seed(seed)
    case = dict(
        grad2d=torch.rand(n, generator=gen),
        count=torch.randint(0, 5, (n,), generator=gen).float(),
        scales=torch.rand(num_cameras, 2, generator=gen) * 100,
    )
    radii = torch.randint(0, 3, (num_cameras, n, 2), generator=gen, dtype=torch.int32)  # 0: not seen
    grads = torch.randn(num_cameras, n, 2, generator=gen) * 1e-3
    if name == "packed":
        cams, ids = torch.nonzero((radii > 0).all(-1), as_tuple=True)
        case.update(grads=grads[cams, ids], gaussian_ids=ids, camera_ids=cams)
    else:
        case.update(grads=grads, radii=radii)
    return case


def run(case, device, fn):
    c = {k: v.to(device, copy=True) for k, v in case.items()}  # the update is in place
    fn(c["grad2d"], c["count"], c["grads"], c["scales"], c.get("radii"), c.get("gaussian_ids"), c.get("camera_ids"))
    return dict(grad2d=c["grad2d"].cpu(), count=c["count"].cpu())


def check(case, got):
    want = run(case, "cpu", densify_stats_update)
    assert torch.isfinite(got["grad2d"]).all()
    assert torch.equal(got["count"], want["count"])
    torch.testing.assert_close(got["grad2d"], want["grad2d"], rtol=1e-5, atol=1e-7)
    if want["count"].numel():
        assert not torch.equal(want["count"], case["count"])  # the step added something


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    if not densify_stats.available():
        pytest.skip("Triton is not installed")
    tmp = tmp_path_factory.mktemp("densify_stats")
    cases = {name: make_case(name, i) for i, name in enumerate(CASES)}
    torch.save(cases, tmp / "in.pt")
    run_interpreted(__file__, "kernel", str(tmp / "in.pt"), str(tmp / "out.pt"))
    return cases, torch.load(tmp / "out.pt")


@pytest.mark.parametrize("name", sorted(CASES))
def test_kernel_matches_reference_under_the_interpreter(interpreted, name):
    cases, results = interpreted
    check(cases[name], results[name])


def test_check_rejects_a_wrong_sum():
    case = make_case("dense-3cams", 9)
    got = run(case, "cpu", densify_stats_update)
    got["grad2d"] = got["grad2d"] * 1.001
    with pytest.raises(AssertionError):
        check(case, got)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm device")
@pytest.mark.skipif(not densify_stats.available(), reason="needs Triton")
@pytest.mark.parametrize("name", sorted(CASES))
def test_kernel_on_gpu_matches_reference(name):
    case = make_case(name, 100)
    check(case, run(case, "cuda", densify_stats.accumulate))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm device")
@pytest.mark.skipif(not densify_stats.available(), reason="needs Triton")
def test_kernel_on_gpu_indexes_past_2_31():
    """Dense C x N x 2 and packed 2 R lanes past 2^31 (about 30 GiB of device memory): the rows of
    the last camera / records must land on their Gaussians."""
    if torch.cuda.get_device_properties(0).total_memory < 48 * 2**30:
        pytest.skip("needs 48 GiB of device memory")
    num = 2**29 + 17  # 3 cameras x num x 2 lanes > 2^31
    grads = torch.zeros(3, num, 2, device="cuda")
    radii = torch.zeros(3, num, 2, dtype=torch.int32, device="cuda")
    grads[2, -5:] = torch.tensor([3.0, 4.0], device="cuda")
    radii[2, -5:] = 1
    scales = torch.ones(3, 2, device="cuda")
    grad2d, count = torch.zeros(num, device="cuda"), torch.zeros(num, device="cuda")
    densify_stats.accumulate(grad2d, count, grads, scales, radii=radii)
    assert grad2d[-5:].tolist() == [5.0] * 5 and count[-5:].tolist() == [1.0] * 5
    assert float(grad2d.sum()) == 25.0 and float(count.sum()) == 5.0
    del grads, radii
    records = 2**30 + 9  # 2 x records lanes > 2^31
    grads = torch.zeros(records, 2, device="cuda")
    grads[-3:] = torch.tensor([6.0, 8.0], device="cuda")
    # records dealt round-robin over the Gaussians (counts of 1 or 2: exact in float32), the last
    # three with a gradient, on Gaussians num - 1, num - 2, num - 2
    ids = (torch.arange(records, device="cuda") % num).to(torch.int32)
    ids[-3:] = torch.tensor([num - 1, num - 2, num - 2], dtype=torch.int32, device="cuda")
    cams = torch.zeros(records, dtype=torch.int32, device="cuda")
    grad2d.zero_(), count.zero_()
    densify_stats.accumulate(grad2d, count, grads, scales, gaussian_ids=ids, camera_ids=cams)
    expected = torch.bincount(ids.long(), minlength=num).float()
    assert grad2d[-2:].tolist() == [20.0, 10.0] and float(grad2d.double().sum()) == 30.0
    assert torch.equal(count, expected) and float(count.double().sum()) == float(records)
    del grads, ids, cams
    torch.cuda.empty_cache()


if __name__ == "__main__" and sys.argv[1:2] == ["kernel"]:
    cases = torch.load(sys.argv[2])
    torch.save({name: run(c, "cpu", densify_stats.accumulate) for name, c in cases.items()}, sys.argv[3])
