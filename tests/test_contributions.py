"""kernels/contributions.py (each pixel's largest-contribution record, each record's summed
alpha * T) against its PyTorch reference (kernels.reference.compositing_weights +
winners_per_pixel), under the Triton interpreter in a child process (``python
tests/test_contributions.py kernel IN OUT``) and, with ``-m gpu``, on the GPU: the scenes of
test_fused_raster.py (borders, packed lists, saturated pixels, an opaque wall that stops every
pixel early, hand-made list lengths around the kernel's 16-record blocks and up to 700) and an empty pass; and pruning's per-record
statistics (prune_scores.record_statistics) with the kernel against those with the reference."""

import sys

import pytest
import torch

from interpreted import interpreted_results
from test_fused_raster import make_list_scene, make_scene

from splat_train.kernels import contributions, reference
from splat_train.kernels.constants import TILE_SIZE

CASES = {
    "dense_border": dict(I=2, H=40, W=50, N=160, seed=1, packed=False, bg=False),
    "packed_three_images": dict(I=3, H=47, W=33, N=120, seed=2, packed=True, bg=False),
    "saturated": dict(I=1, H=36, W=64, N=100, seed=3, packed=False, bg=False, saturate=60),
    "opaque_front_wall": dict(I=2, H=30, W=80, N=400, seed=6, packed=False, bg=False, wall=6),
    "list_lengths": dict(lists=(0, 1, 15, 16, 17, 700), seed=11, bg=False),
    "list_lengths_opaque": dict(lists=(33, 64, 0, 300, 700, 65), seed=12, bg=False, opaque=True),
    "empty": dict(lists=(0, 0, 0, 0, 0, 0), seed=13, bg=False),
}
FIELDS = ("means2d", "conics", "opacities", "keys", "width", "height", "isect_offsets", "flatten_ids")


def make_case(name):
    params = CASES[name]
    scene = make_list_scene(**params) if "lists" in params else make_scene(**params)
    num = scene["opacities"].numel()
    if scene["packed"]:  # distinct keys in another order than the records
        keys = torch.randperm(num, generator=torch.Generator().manual_seed(7))
    else:
        keys = torch.arange(num) % scene["opacities"].shape[-1]
    return dict(scene, keys=keys)


def run_kernel(case, device):
    args = [case[k].to(device) if isinstance(case[k], torch.Tensor) else case[k] for k in FIELDS]
    return [t.cpu() for t in contributions.contributions(*args)]


def check(case, got):
    """Winners equal the reference's but where two records' weights agree to float32 rounding
    (the kernel's documented difference); importance to float32 rounding."""
    args = [case[k] for k in FIELDS]
    want_winners, want_importance = contributions.reference_contributions(*args, packed=case["packed"])
    winners, importance = got
    assert winners.shape == want_winners.shape and importance.shape == want_importance.shape
    torch.testing.assert_close(importance, want_importance, rtol=1e-5, atol=1e-6)
    differ = (winners != want_winners).nonzero().squeeze(1)
    assert differ.numel() <= 1e-3 * max(int((want_winners >= 0).sum()), 1)
    if differ.numel():
        pixel_ids, record_ids, weights, _ = reference.compositing_weights(
            *args[:3], case["width"], case["height"], TILE_SIZE, *args[6:], packed=case["packed"]
        )
        weight_of = {(int(p), int(r)): float(w) for p, r, w in zip(pixel_ids, record_ids, weights)}
        for p in differ.tolist():
            a, b = weight_of[(p, int(winners[p]))], weight_of[(p, int(want_winners[p]))]
            assert abs(a - b) <= 1e-6 * b, (p, a, b)


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    return interpreted_results(__file__, tmp_path_factory, "contributions", contributions.available())


@pytest.mark.parametrize("name", sorted(CASES))
def test_kernel_matches_reference_under_the_interpreter(interpreted, name):
    case = make_case(name)
    got = interpreted["cases"][name]
    check(case, got)
    if name != "empty":  # the comparison means something: pixels won, some of them early-stopped
        assert int((got[0] >= 0).sum()) > 50 and float(got[1].sum()) > 1.0
    else:
        assert (got[0] == -1).all() and got[1].numel() == case["opacities"].numel()


def test_saturated_scenes_stop_pixels_early():
    """The early-stop cases bring pixels near the T <= 1e-4 stop, with nearly opaque records
    behind (so the kernel's stop and its early exit are tested)."""
    for name in ("saturated", "opaque_front_wall", "list_lengths_opaque"):
        case = make_case(name)
        *_, T_final = reference.compositing_weights(
            case["means2d"], case["conics"], case["opacities"], case["width"], case["height"], TILE_SIZE,
            case["isect_offsets"], case["flatten_ids"], packed=case["packed"],
        )  # fmt: skip
        assert float(T_final.min()) < 1e-3, name


def test_check_rejects_a_wrong_winner_or_sum():
    case = make_case("dense_border")
    want = contributions.reference_contributions(*[case[k] for k in FIELDS], packed=False)
    winners = want[0].clone()
    won = (winners >= 0).nonzero().squeeze(1)
    winners[won[:5]] = winners[won[5:10]]  # other pixels' winners
    with pytest.raises(AssertionError):
        check(case, (winners, want[1]))
    with pytest.raises(AssertionError):
        check(case, (want[0], want[1] * 1.001))


def test_pixel_winner_ties_go_to_the_lower_key():
    pixel_ids = torch.tensor([0, 0, 0, 2, 2])
    record_ids = torch.tensor([4, 2, 3, 1, 0])
    weights = torch.tensor([0.5, 0.5, 0.1, 0.2, 0.3])
    keys = torch.tensor([9, 8, 7, 6, 5])  # record 4 has key 5 < record 2's key 7
    assert contributions.winners_per_pixel(pixel_ids, record_ids, weights, keys, 3).tolist() == [4, -1, 0]


def statistics_pair(device="cpu"):
    """prune_scores.record_statistics of one dense and one packed two-camera pass on ``device``,
    with the kernel and with the reference: {layout: (kernel values, reference values, counts
    equal)}, on the CPU."""
    from scenes import make_cameras
    from scenes import make_scene as make_world

    from splat_train.trainer import prune_scores
    from splat_train.trainer.launch import DistContext
    from splat_train.trainer.render import CameraBatch, render

    params = {k: v.to(device) for k, v in make_world(seed=3, num_gaussians=200, sh_degree=0).items()}
    params["opacities"] = params["opacities"].clamp(max=0.6)
    cams = make_cameras([(40, 32), (40, 32)])
    viewmats, Ks = (torch.stack([c[i] for c in cams]).to(device) for i in (0, 1))
    batch = CameraBatch(viewmats, Ks, 40, 32)
    out = {}
    for packed in (False, True):
        info = render(params, batch, DistContext(), reference, 0, rasterize=False, packed=packed).info
        with_kernel, counts_k = prune_scores.record_statistics(info, 10, True, kernel=True)
        with_reference, counts_r = prune_scores.record_statistics(info, 10, True, kernel=False)
        out["packed" if packed else "dense"] = (
            with_kernel.cpu(),
            with_reference.cpu(),
            torch.equal(counts_k, counts_r),
        )
    return out


def check_statistics(with_kernel, with_reference, same_counts):
    assert same_counts and with_kernel.shape == with_reference.shape
    assert float(with_reference[..., 0].sum()) > 1000  # pixels won: the comparison means something
    assert torch.equal(with_kernel[..., 0], with_reference[..., 0])  # pixels won
    torch.testing.assert_close(with_kernel[..., 1], with_reference[..., 1], rtol=1e-5, atol=1e-6)
    assert torch.equal(with_kernel[..., 2], with_reference[..., 2])  # overload: no compositing


@pytest.mark.parametrize("layout", ["dense", "packed"])
def test_record_statistics_with_the_kernel_equal_the_reference(interpreted, layout):
    check_statistics(*interpreted["statistics"][layout])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm device")
@pytest.mark.skipif(not contributions.available(), reason="needs Triton")
@pytest.mark.parametrize("name", sorted(CASES))
def test_kernel_on_gpu_matches_reference(name):
    case = make_case(name)
    check(case, run_kernel(case, "cuda"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm device")
@pytest.mark.skipif(not contributions.available(), reason="needs Triton")
def test_record_statistics_on_gpu_with_the_kernel_equal_the_reference():
    for layout, results in statistics_pair("cuda").items():
        check_statistics(*results)


if __name__ == "__main__" and sys.argv[1:2] == ["kernel"]:
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    results = {name: run_kernel(make_case(name), "cpu") for name in CASES}
    torch.save(dict(cases=results, statistics=statistics_pair()), sys.argv[2])
