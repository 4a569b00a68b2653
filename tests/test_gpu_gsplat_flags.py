"""On a GPU, gsplat simple_trainer's options with gsplat's CUDA ops: the camera models,
--antialiased, --absgrad and the expected depth agree with the plain-PyTorch reference; masks
keep the painted pixels out of the project's Triton L1 + SSIM loss; a training run with each
option completes. Marked ``gpu``; skipped without CUDA."""

import numpy as np
import pytest
import torch

from splat_train.trainer.launch import DistContext
from splat_train.trainer.render import CameraBatch, ops_for, render

from scenes import make_cameras, make_scene

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU")]


def _rel(a, b):
    return float((a - b).abs().mean() / b.abs().mean().clamp_min(1e-12))


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize(
    "model, antialiased", [("pinhole", True), ("ortho", False), ("fisheye", False), ("fisheye", True)]
)
def test_gsplat_and_reference_agree_on_camera_models_antialiasing_absgrad_depth(model, antialiased, packed):
    device = torch.device("cuda")
    params = {k: v.cuda() for k, v in make_scene(1, num_gaussians=3000, sh_degree=3).items()}
    cams = make_cameras([(160, 120)] * 2)
    Ks = torch.stack([c[1] for c in cams])
    if model == "ortho":  # pixels per scene unit: the scene's 1.6 units across the image
        Ks[:, 0, 0] = Ks[:, 1, 1] = 160 / 2.0
    batch = CameraBatch(torch.stack([c[0] for c in cams]).cuda(), Ks.cuda(), 160, 120)
    gt = torch.rand(2, 120, 160, 3, device=device)
    outs = {}
    for backend in ("gsplat", "reference"):
        leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
        res = render(
            leaves,
            batch,
            DistContext(device=device),
            ops_for(backend, device),
            3,
            packed=packed,
            camera_model=model,
            antialiased=antialiased,
            absgrad=True,
            render_depth=True,
        )
        ((res.colors - gt).abs().mean() + 0.01 * res.depths.mean()).backward()
        outs[backend] = (
            res.colors.detach(),
            res.depths.detach(),
            res.info.absgrad.grad,
            {k: v.grad for k, v in leaves.items()},
        )
    a, b = outs["gsplat"], outs["reference"]
    assert b[0].abs().sum() > 0 and b[2].abs().sum() > 0
    assert float((a[0] - b[0]).abs().mean()) < 1e-3
    assert _rel(a[1], b[1]) < 1e-3  # expected depth
    assert _rel(a[2], b[2]) < 1e-3  # absolute 2D-mean gradients
    for k in b[3]:
        assert torch.isfinite(a[3][k]).all() and _rel(a[3][k], b[3][k]) < 1e-3, k


def test_masked_pixels_reach_no_gradient_through_the_triton_loss():
    from splat_train.kernels.fused_ssim import fused_l1_ssim_loss

    g = torch.Generator(device="cuda").manual_seed(0)
    colors = torch.rand(2, 64, 80, 3, device="cuda", generator=g).requires_grad_()
    gts = (torch.rand(2, 64, 80, 3, device="cuda", generator=g) * 255).to(torch.uint8)
    keep = torch.ones(2, 64, 80, 1, dtype=torch.uint8, device="cuda")
    keep[:, 10:40, 20:60] = 0
    painted = gts.clone()
    painted[:, 10:40, 20:60] = torch.tensor([255, 0, 0], dtype=torch.uint8, device="cuda")
    grads = []
    for target in (gts, painted):
        colors.grad = None
        loss, _ = fused_l1_ssim_loss(colors * keep, target * keep)  # what trainer/loop.py does
        loss.backward()
        grads.append(colors.grad.clone())
    assert torch.equal(grads[0], grads[1]) and grads[0][:, 10:40, 20:60].abs().sum() == 0


FLAGS = [
    ["--absgrad", "--grow_grad2d", "0.0008"],
    ["--antialiased"],
    ["--camera_model", "fisheye"],
    ["--camera_model", "ortho", "--packed"],
    ["--depth_loss"],
    ["--visible_adam"],
    ["--sparse_grad", "--packed"],
    ["--use_bilateral_grid"],
    ["--patch_size", "48"],
    ["--pose_noise", "0.01", "--pose_opt"],
    ["--tb_save_image", "--tb_every", "20", "--render_traj_path", "ellipse", "--num_traj_frames", "4"],
]


@pytest.mark.parametrize("flags", FLAGS, ids=lambda f: f[0].lstrip("-"))
def test_training_runs_with_each_option_on_gpu(tmp_path, flags):
    from splat_train.trainer.cli import main

    assert (
        main(
            [
                "default",
                "--max_steps",
                "60",
                "--refine_start_iter",
                "20",
                "--refine_every",
                "20",
                "--num_traj_frames",
                "0",
                "--synthetic_num_cameras",
                "10",
                "--result_dir",
                str(tmp_path),
                *flags,
            ]
        )
        == 0
    )
    assert (tmp_path / "stats" / "val_step60.json").is_file()


def test_masked_capture_trains_on_gpu(tmp_path):
    from splat_train.trainer.cli import main
    from splat_train.trainer.data.synthetic import make_synthetic_scene

    from scenes import write_colmap_scene

    scene = make_synthetic_scene(300, 12, 64, tracks=True)
    keep = np.ones((64, 64), bool)
    keep[10:30, 20:50] = False
    write_colmap_scene(tmp_path / "capture", scene, {i: keep for i in range(12)})
    assert (
        main(
            [
                "default",
                "--data_dir",
                str(tmp_path / "capture"),
                "--data_factor",
                "1",
                "--max_steps",
                "40",
                "--num_traj_frames",
                "0",
                "--depth_loss",
                "--result_dir",
                str(tmp_path / "run"),
            ]
        )
        == 0
    )
