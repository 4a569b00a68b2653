"""kernels/isect.py: the presorted tile lists equal kernels.reference.isect_tiles +
isect_offset_encode (gsplat's lists) on the CPU (the module's PyTorch forms), under the Triton
interpreter in a child process (``python tests/test_isect.py kernel OUT``) and, with ``-m gpu``,
gsplat's own CUDA isect_tiles on the GPU."""

import sys

import pytest
import torch

from interpreted import interpreted_results

from splat_train.kernels import isect, reference

# name: (cameras, Gaussians per camera, width, height)
CASES = {
    "one-camera": (1, 3000, 200, 120),
    "three-cameras-odd-size": (3, 2000, 97, 61),
    "int32-keys": (40, 120, 640, 480),  # 40 x 40 x 30 (image, tile) indices pass int16
    "nothing-seen": (2, 300, 64, 64),
    "no-gaussians": (2, 0, 64, 64),
}


def make_case(name, seed):
    C, N, W, H = CASES[name]
    gen = torch.Generator().manual_seed(seed)
    means2d = torch.rand(C, N, 2, generator=gen) * torch.tensor([W * 1.4, H * 1.4]) - torch.tensor([W * 0.2, H * 0.2])
    radii = torch.randint(0, 48, (C, N, 2), generator=gen, dtype=torch.int32)  # 0 on one axis: not seen
    if name == "nothing-seen":
        radii[..., 0] = 0
    depths = torch.rand(C, N, generator=gen) * 10 + 0.05
    depths[:, ::5] = 2.5  # ties: equal depths keep their record order
    return dict(means2d=means2d, radii=radii, depths=depths, tw=(W + 15) // 16, th=(H + 15) // 16)


def expected(case):
    C = case["depths"].shape[0]
    _, isect_ids, flatten_ids = reference.isect_tiles(
        case["means2d"], case["radii"], case["depths"], 16, case["tw"], case["th"]
    )
    return reference.isect_offset_encode(isect_ids, C, case["tw"], case["th"]), flatten_ids


def got(case, device="cpu", out=None):
    args = [case[k].to(device) for k in ("means2d", "radii", "depths")]
    offsets, flatten_ids = isect.tile_lists(*args, 16, case["tw"], case["th"], out=out)
    return offsets.cpu(), flatten_ids.cpu()


def check(case, result):
    want_offsets, want_ids = expected(case)
    offsets, ids = result
    assert offsets.dtype == ids.dtype == torch.int32
    assert torch.equal(offsets, want_offsets)
    assert torch.equal(ids, want_ids)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_pytorch_forms_list_what_gsplat_lists(name):
    case = make_case(name, 1)
    check(case, got(case))
    if name == "nothing-seen":
        assert got(case)[1].numel() == 0


def test_the_lists_are_written_into_a_buffer_that_holds_them_and_not_into_one_too_short():
    case = make_case("one-camera", 2)
    n = expected(case)[1].numel()
    buffer = torch.full((n + 10,), -1, dtype=torch.int32)
    offsets, ids = isect.tile_lists(
        case["means2d"], case["radii"], case["depths"], 16, case["tw"], case["th"], out=buffer
    )
    assert ids.data_ptr() == buffer.data_ptr() and torch.equal(buffer[n:], torch.full((10,), -1, dtype=torch.int32))
    check(case, (offsets, ids))
    short = torch.full((n - 1,), -1, dtype=torch.int32)
    offsets, ids = isect.tile_lists(
        case["means2d"], case["radii"], case["depths"], 16, case["tw"], case["th"], out=short
    )
    assert ids.data_ptr() != short.data_ptr() and (short == -1).all()
    check(case, (offsets, ids))


def test_the_check_sees_a_depth_order_that_is_not_stable():
    """Equal depths in reverse record order: the lists differ from gsplat's, and the check says so."""
    case = make_case("one-camera", 3)
    offsets, ids = got(case)
    depths = case["depths"].reshape(-1)
    tied = (depths[ids.long()] == 2.5).nonzero().squeeze(1)
    assert len(tied) > 1
    ids = ids.clone()
    ids[tied[:2]] = ids[tied[:2]].flip(0)
    with pytest.raises(AssertionError):
        check(case, (offsets, ids))


def test_bad_inputs_are_refused_with_their_shapes():
    case = make_case("one-camera", 4)
    with pytest.raises(ValueError, match="means2d"):
        isect.tile_lists(case["means2d"][0], case["radii"], case["depths"], 16, case["tw"], case["th"])
    with pytest.raises(ValueError, match="power of two"):
        isect.tile_lists(case["means2d"], case["radii"], case["depths"], 12, case["tw"], case["th"])


def test_the_presort_is_taken_from_its_record_count_on():
    assert not isect.presort_pays(isect.PRESORT_MIN_RECORDS - 1)
    assert isect.presort_pays(isect.PRESORT_MIN_RECORDS)


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    return interpreted_results(__file__, tmp_path_factory, "isect", isect.available())


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_kernels_list_what_gsplat_lists_under_the_interpreter(interpreted, name):
    check(make_case(name, 1), interpreted[name])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm device")
@pytest.mark.skipif(not isect.available(), reason="needs Triton")
@pytest.mark.parametrize("name", sorted(CASES))
def test_the_kernels_list_what_gsplats_cuda_isect_tiles_lists_on_the_gpu(name):
    from gsplat.cuda import _wrapper as gs

    case = make_case(name, 1)
    check(case, got(case, "cuda"))
    C = case["depths"].shape[0]
    args = [case[k].cuda() for k in ("means2d", "radii", "depths")]
    _, isect_ids, flatten_ids = gs.isect_tiles(*args, 16, case["tw"], case["th"], packed=False, n_images=C)
    offsets = gs.isect_offset_encode(isect_ids, C, case["tw"], case["th"])
    mine = got(case, "cuda")
    assert torch.equal(mine[0], offsets.cpu()) and torch.equal(mine[1], flatten_ids.cpu())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm device")
@pytest.mark.skipif(not isect.available(), reason="needs Triton")
def test_a_large_pass_lists_what_gsplats_cuda_isect_tiles_lists():
    """2 M records at 1920x1080 (int16 keys, the path's real size), against gsplat's CUDA lists."""
    from gsplat.cuda import _wrapper as gs

    gen = torch.Generator(device="cuda").manual_seed(0)
    N, W, H = 2_000_000, 1920, 1080
    means2d = torch.rand(1, N, 2, device="cuda", generator=gen) * torch.tensor([W, H], device="cuda")
    radii = torch.randint(0, 24, (1, N, 2), device="cuda", generator=gen, dtype=torch.int32)
    depths = (torch.rand(1, N, device="cuda", generator=gen) * 1000).round() / 10 + 0.1  # many ties
    tw, th = W // 16, (H + 15) // 16
    _, isect_ids, flatten_ids = gs.isect_tiles(means2d, radii, depths, 16, tw, th, packed=False, n_images=1)
    offsets = gs.isect_offset_encode(isect_ids, 1, tw, th)
    got_offsets, got_ids = isect.tile_lists(means2d, radii, depths, 16, tw, th)
    assert flatten_ids.numel() > 10 * N
    assert torch.equal(got_offsets, offsets) and torch.equal(got_ids, flatten_ids)


if __name__ == "__main__" and sys.argv[1:2] == ["kernel"]:
    assert isect._use_kernels(torch.zeros(1)), "run under TRITON_INTERPRET=1"
    torch.save({name: got(make_case(name, 1)) for name in CASES}, sys.argv[2])
