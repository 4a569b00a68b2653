"""--random_tile_shift: the images move against the 16-pixel tile grid each step, so that the fused
kernel's tile-local SSIM (kernels/fused_raster.py) has its tile borders elsewhere every step."""

import pytest
import torch

from splat_train.kernels import reference
from splat_train.trainer import densify
from splat_train.trainer.launch import DistContext
from splat_train.trainer.render import CameraBatch, render, shift_cameras

from scenes import make_cameras, make_scene

FLAGS = [
    "--synthetic_image_size",
    "40",
    "--synthetic_num_cameras",
    "4",
    "--synthetic_num_gaussians",
    "200",
    "--max_steps",
    "3",
    "--num_traj_frames",
    "0",
    "--raster",
    "fused",
]


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
@pytest.mark.parametrize("ox, oy", [(0, 7), (13, 2), (15, 15)])
def test_shifted_cameras_render_the_same_image_moved(packed, ox, oy):
    """Moving the principal point by (ox, oy) and padding the image by as much renders the same
    pixels at (x + ox, y + oy): what lets the loss skip the padding and stay the same loss."""
    params = make_scene(seed=3)
    cams = make_cameras([(40, 32)] * 2)
    batch = CameraBatch(torch.stack([c[0] for c in cams]), torch.stack([c[1] for c in cams]), 40, 32)
    plain = render(params, batch, DistContext(), reference, 1, packed=packed)
    shifted = shift_cameras(batch, ox, oy)
    assert (shifted.width, shifted.height) == (40 + ox, 32 + oy)
    assert (batch.Ks[:, 0, 2] == 20).all() and (shifted.Ks[:, 0, 2] == 20 + ox).all()  # a copy moved
    moved = render(params, shifted, DistContext(), reference, 1, packed=packed)
    assert moved.colors.shape == (2, 32 + oy, 40 + ox, 3)
    assert plain.alphas.sum() > 10  # the scene is in view
    torch.testing.assert_close(moved.colors[:, oy:, ox:], plain.colors, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(moved.alphas[:, oy:, ox:], plain.alphas, atol=2e-5, rtol=1e-4)


def _trainer(flags):
    from splat_train.trainer.cli import build_scene, parse_args
    from splat_train.trainer.loop import Trainer

    cfg = parse_args(["default", *flags])
    return Trainer(cfg, DistContext(), build_scene(cfg))


def test_shift_is_uniform_reproducible_and_off_by_default():
    on = _trainer(FLAGS + ["--random_tile_shift"])
    shifts = [on.batches.origin(s) for s in range(400)]
    assert all(0 <= ox < 16 and 0 <= oy < 16 for ox, oy in shifts)
    assert len(set(shifts)) > 150 and {ox for ox, _ in shifts} == set(range(16)) == {oy for _, oy in shifts}
    again = _trainer(FLAGS + ["--random_tile_shift"])  # another rank, or a resumed run
    assert [again.batches.origin(s) for s in range(400)] == shifts
    other_seed = _trainer(FLAGS + ["--random_tile_shift", "--seed", "7"])
    assert [other_seed.batches.origin(s) for s in range(400)] != shifts
    assert {_trainer(FLAGS).batches.origin(s) for s in range(50)} == {(0, 0)}


def test_training_step_scores_the_shifted_render(monkeypatch):
    """The step renders the padded image and the fused loss scores the ground truth at the
    step's origin; densification sees the images' size, not the padded one."""
    from splat_train.kernels import fused_raster

    calls = []
    real = fused_raster.fused_raster_loss

    def spy(*args, **kw):
        calls.append(dict(gts=tuple(args[6].shape), width=args[7], height=args[8], origin=kw["origin"]))
        return real(*args, **kw)

    monkeypatch.setattr(fused_raster, "fused_raster_loss", spy)
    trainer = _trainer(FLAGS + ["--random_tile_shift"])
    seen, masked = [], []
    from splat_train.trainer import render as render_module

    real_info, real_mask = densify.strategy_info, render_module.padding_only_radii

    def info_spy(info):
        seen.append((info.widths, info.heights, info.radii.clone(), info.means2d.detach().clone()))
        return real_info(info)

    def mask_spy(radii, means2d, ox, oy):
        masked.append((ox, oy))
        return real_mask(radii, means2d, ox, oy)

    monkeypatch.setattr(densify, "strategy_info", info_spy)  # the strategy step reads it there
    monkeypatch.setattr(render_module, "padding_only_radii", mask_spy)  # the render drops them
    for step in range(3):
        out = trainer.train_step(step)
        assert torch.isfinite(out["loss"])
        ox, oy = trainer.batches.origin(step)
        c = calls[-1]
        assert c["origin"] == (ox, oy) and (c["width"], c["height"]) == (40 + ox, 40 + oy)
        assert c["gts"][1:] == (40, 40, 3)
        widths, heights, radii, means2d = seen[-1]
        assert set(widths) == {40} and set(heights) == {40}
        reach = means2d + radii
        seen_here = (radii > 0).all(-1)
        assert seen_here.any() and not (seen_here & ((reach[..., 0] <= ox) | (reach[..., 1] <= oy))).any()
    assert any(c["origin"] != (0, 0) for c in calls)
    assert masked == [c["origin"] for c in calls if c["origin"] != (0, 0)]  # radii of the padding dropped


def test_projections_only_in_the_padding_are_not_seen():
    from splat_train.trainer.render import padding_only_radii

    means2d = torch.tensor([[2.0, 30.0], [2.0, 30.0], [30.0, 1.0], [30.0, 30.0], [-5.0, 30.0]])
    radii = torch.tensor([[3, 3], [9, 9], [4, 4], [2, 2], [20, 20]], dtype=torch.int32)
    got = padding_only_radii(radii, means2d, 6, 5)  # reach x: 5, 11, 34, 32, 15; y: 33, 39, 5, 32, 50
    assert got.dtype == radii.dtype
    assert got.tolist() == [[0, 0], [9, 9], [0, 0], [2, 2], [20, 20]]
