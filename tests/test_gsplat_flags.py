"""gsplat simple_trainer's training options, one process: each changes what it should (masks,
--absgrad, --antialiased, --camera_model, --depth_loss, --visible_adam, --use_bilateral_grid,
--pose_noise, --patch_size, --render_traj_path, --disable_video, --save_ply, --tb_save_image).
Two ranks: test_gsplat_flags_distributed.py."""

import json

import numpy as np
import pytest
import torch

from splat_train.kernels import reference
from splat_train.trainer.cli import build_scene, parse_args
from splat_train.trainer.launch import DistContext
from splat_train.trainer.loop import Trainer

from scenes import make_cameras, make_scene

TINY = [
    "--synthetic_image_size",
    "32",
    "--synthetic_num_cameras",
    "8",
    "--synthetic_num_gaussians",
    "100",
    "--max_steps",
    "4",
    "--num_traj_frames",
    "0",
    "--sh_degree",
    "0",
]


def trainer(*flags, scene=None):
    cfg = parse_args(["default", *TINY, *flags])
    return Trainer(cfg, DistContext(), scene if scene is not None else build_scene(cfg))


def _raster_inputs(width=10, height=8, n=40, seed=3):
    """One camera's projected records of a random scene, means2d a leaf."""
    params = make_scene(seed, num_gaussians=n, sh_degree=0)
    viewmat, K, _, _, _ = make_cameras([(width, height)])[0]
    radii, means2d, depths, conics, _ = reference.fully_fused_projection(
        params["means"],
        None,
        params["quats"],
        params["scales"],
        viewmat[None],
        K[None],
        width,
        height,
        opacities=params["opacities"],
    )
    _, isect_ids, flatten_ids = reference.isect_tiles(means2d, radii, depths, 16, 1, 1)
    offsets = reference.isect_offset_encode(isect_ids, 1, 1, 1)
    colors = torch.sigmoid(params["colors"][:, 0])[None]
    return means2d.detach(), conics.detach(), colors, params["opacities"][None], offsets, flatten_ids


# ------------------------------------------------------------------------------------------ absgrad


def test_reference_absgrad_sums_every_pixels_absolute_gradient():
    """means2d.absgrad = sum over pixels of |dL_pixel / dmean2d| per axis (gsplat's v_xy_abs),
    against one backward pass per pixel."""
    means2d, conics, colors, opacities, offsets, flatten_ids = _raster_inputs()
    height, width = 8, 10
    weights = torch.rand(height, width, 3, generator=torch.Generator().manual_seed(0)) - 0.5

    def pixel_loss(leaf, y=None, x=None, absgrad=False):
        image, _ = reference.rasterize_to_pixels(
            leaf, conics, colors, opacities, width, height, 16, offsets, flatten_ids, absgrad=absgrad
        )
        return (image[0] * weights).sum() if y is None else (image[0, y, x] * weights[y, x]).sum()

    leaf = means2d.clone().requires_grad_()
    pixel_loss(leaf, absgrad=True).backward()
    expected = torch.zeros_like(means2d)
    for y in range(height):
        for x in range(width):
            one = means2d.clone().requires_grad_()
            pixel_loss(one, y, x).backward()
            expected += one.grad.abs()
    assert expected.sum() > 0
    torch.testing.assert_close(leaf.absgrad, expected, rtol=1e-4, atol=1e-7)
    assert float((leaf.absgrad - leaf.grad.abs()).min()) >= -1e-6  # |sum| <= sum |.|
    assert float((leaf.absgrad - leaf.grad.abs()).max()) > 1e-4  # and the two differ


def test_absgrad_feeds_the_densification_statistics():
    """A step with --absgrad accumulates the absolute gradients: never below the plain gradient's
    norms, above them somewhere; the step itself (parameters) is the same."""
    plain, absgrad = trainer(), trainer("--absgrad")
    plain.train_step(0)
    absgrad.train_step(0)
    a, p = absgrad.strategy_state["grad2d"], plain.strategy_state["grad2d"]
    assert p.sum() > 0 and float((a - p).min()) >= -1e-7 and float((a - p).max()) > 1e-6
    assert torch.equal(absgrad.strategy_state["count"], plain.strategy_state["count"])
    for k in plain.params:
        assert torch.equal(plain.params[k], absgrad.params[k]), k


# -------------------------------------------------------------------------------------- antialiased


def test_antialiased_scales_opacities_by_the_compensation():
    params = make_scene(5, num_gaussians=60, sh_degree=0)
    params["scales"] = params["scales"] * 0.2  # small Gaussians: the 0.3 px blur matters
    viewmat, K, w, h, _ = make_cameras([(24, 20)])[0]
    from splat_train.trainer.render import CameraBatch, render

    cams = CameraBatch(viewmat[None], K[None], w, h)
    classic = render(params, cams, DistContext(), reference, 0)
    aa = render(params, cams, DistContext(), reference, 0, antialiased=True)
    _, _, _, _, comp = reference.fully_fused_projection(
        params["means"],
        None,
        params["quats"],
        params["scales"],
        viewmat[None],
        K[None],
        w,
        h,
        calc_compensations=True,
        opacities=params["opacities"],
    )
    seen = aa.info.radii[0].all(-1) > 0
    torch.testing.assert_close(aa.info.records.opacities[0][seen], (params["opacities"] * comp[0])[seen])
    assert float(comp[0][seen].max()) <= 1.0 and float(comp[0][seen].min()) < 0.9
    assert float((aa.alphas - classic.alphas).max()) <= 1e-6  # fainter, never brighter
    assert float((classic.alphas - aa.alphas).max()) > 1e-3


# ------------------------------------------------------------------------------------ camera models


@pytest.mark.parametrize("model", ["pinhole", "ortho", "fisheye"])
def test_projection_jacobian_is_the_derivative_of_the_projection(model):
    """The EWA covariance uses J = d means2d / d (camera-space mean), for every camera model."""
    g = torch.Generator().manual_seed(1)
    pts = torch.cat([torch.rand(20, 2, generator=g) - 0.5, 1.5 + torch.rand(20, 1, generator=g)], 1).double()
    K = torch.tensor([[30.0, 0, 16], [0, 28.0, 12], [0, 0, 1]], dtype=torch.float64)[None]
    J, _ = reference._camera_jacobian(model, *pts.T[:, None], K, 32, 24)

    def project(p):
        return reference._camera_jacobian(model, *p.T[:, None], K, 32, 24)[1][0]

    full = torch.autograd.functional.jacobian(project, pts)  # [20, 2, 20, 3]
    numeric = torch.stack([full[i, :, i] for i in range(len(pts))])
    torch.testing.assert_close(J[0], numeric, rtol=1e-5, atol=1e-5)
    uv = project(pts)
    x, y, z = pts.T
    if model == "ortho":
        torch.testing.assert_close(uv, torch.stack([30 * x + 16, 28 * y + 12], 1))
    if model == "fisheye":  # equidistant: the radius from the principal point is f theta
        theta = torch.atan2(torch.hypot(x, y), z)
        torch.testing.assert_close(torch.hypot((uv[:, 0] - 16) / 30, (uv[:, 1] - 12) / 28), theta, rtol=1e-5, atol=1e-6)


def test_fisheye_remap_matches_opencv_fisheye_projection():
    """Each output pixel of data/fisheye.py's remap samples the source where OpenCV's fisheye
    model (COLMAP OPENCV_FISHEYE) projects the direction that pixel sees in the equidistant
    output."""
    import cv2

    from splat_train.trainer.data.fisheye import remap_tables

    K = np.array([[60.0, 0, 40.5], [0, 58.0, 30.5], [0, 0, 1]])
    coeffs = np.array([0.05, -0.02, 0.004, -0.001])
    mapx, mapy = remap_tables(K, coeffs, K, 80, 60)
    v, u = np.mgrid[0:60:7, 0:80:9]
    x, y = (u + 0.5 - K[0, 2]) / K[0, 0], (v + 0.5 - K[1, 2]) / K[1, 1]
    theta = np.hypot(x, y)
    rays = np.stack(
        [x / np.maximum(theta, 1e-12) * np.tan(theta), y / np.maximum(theta, 1e-12) * np.tan(theta), np.ones_like(x)],
        -1,
    ).reshape(-1, 1, 3)
    K_cv = K.copy()
    K_cv[:2, 2] -= 0.5
    source, _ = cv2.fisheye.projectPoints(rays, np.zeros(3), np.zeros(3), K_cv, coeffs)
    np.testing.assert_allclose(np.stack([mapx[v, u], mapy[v, u]], -1).reshape(-1, 2), source.reshape(-1, 2), atol=2e-3)


def test_colmap_fisheye_capture_is_read_and_needs_the_fisheye_model(tmp_path, capsys):
    from test_data import make_colmap

    from splat_train.trainer.cli import main
    from splat_train.trainer.data import Dataset, load_scene

    make_colmap(tmp_path, specs=[("OPENCV_FISHEYE", 48, 40, [30.0, 30.0, 24.0, 20.0, 0.2, 0.05, 0.0, 0.0])] * 3)
    scene = load_scene(tmp_path, 1)
    cam = scene.cameras[0]
    assert cam.model == "fisheye" and cam.dist.fisheye and (cam.width, cam.height) < (48, 40)
    keep = Dataset(scene, [0]).mask(0)
    assert keep.shape == (cam.height, cam.width) and keep.any() and not keep.all()  # the corners see nothing
    argv = [
        "default",
        "--data_dir",
        str(tmp_path),
        "--data_factor",
        "1",
        "--max_steps",
        "1",
        "--test_every",
        "0",
        "--num_traj_frames",
        "0",
        "--init_type",
        "random",
        "--init_num_pts",
        "50",
        "--result_dir",
    ]
    assert main(argv + [str(tmp_path / "pinhole")]) == 2
    assert "--camera_model fisheye" in capsys.readouterr().err
    assert main(argv + [str(tmp_path / "fisheye"), "--camera_model", "fisheye"]) == 0
    assert "fisheye: COLMAP OPENCV_FISHEYE remapped" in capsys.readouterr().out


def test_synthetic_scene_in_each_camera_model_trains():
    for model in ("ortho", "fisheye"):
        t = trainer("--camera_model", model)
        assert {c.model for c in t.scene.cameras} == {model}
        first = float(t.train_step(0)["loss"])
        assert np.isfinite(first)


# ------------------------------------------------------------------------------------------- masks


def _masked_and_painted(t_scene, keep):
    """The scene with every image's pixels outside ``keep`` painted red."""
    import copy

    painted = copy.copy(t_scene)
    painted.images = [np.where(keep[..., None], im, np.array([255, 0, 0], np.uint8)) for im in t_scene.images]
    return painted


def test_masked_pixels_do_not_reach_the_model():
    """With a mask, painting the masked pixels changes nothing in a step; without it, it does."""
    cfg = parse_args(["default", *TINY])
    scene = build_scene(cfg)
    keep = np.ones((32, 32), bool)
    keep[6:20, 10:26] = False
    scene.masks = [keep] * len(scene.cameras)
    painted = _masked_and_painted(scene, keep)
    steps = []
    for s in (scene, painted):
        t = Trainer(cfg, DistContext(), s)
        assert t.views.channels == 4
        t.train_step(0)
        steps.append(t.params)
    for k in steps[0]:
        assert torch.equal(steps[0][k], steps[1][k]), k
    unmasked = [_masked_and_painted(scene, keep), scene]
    for s in unmasked:
        s.masks = None
    a, b = (Trainer(cfg, DistContext(), s) for s in unmasked)
    a.train_step(0)
    b.train_step(0)
    assert not torch.equal(a.params["sh0"], b.params["sh0"])


def test_masks_folder_and_alpha_channels_are_read(tmp_path, capsys):
    import imageio.v3 as iio
    from test_data import CAMERA_SPECS, make_colmap

    from splat_train.trainer.data import Dataset, describe_views, load_scene

    make_colmap(tmp_path, specs=[s for s in CAMERA_SPECS if s[0] == "PINHOLE"])  # view_01.png, view_00.png
    names = sorted(p.name for p in (tmp_path / "images").iterdir())
    rgb = iio.imread(tmp_path / "images" / names[0])
    alpha = np.full(rgb.shape[:2], 255, np.uint8)
    alpha[:, : rgb.shape[1] // 2] = 40
    iio.imwrite(tmp_path / "images" / names[0], np.dstack([rgb, alpha]))
    mask = np.full(iio.imread(tmp_path / "images" / names[1]).shape[:2], 255, np.uint8)
    mask[:5] = 0
    (tmp_path / "masks").mkdir()
    iio.imwrite(tmp_path / "masks" / names[1], mask)
    scene = load_scene(tmp_path, 1)
    data = Dataset(scene, [0, 1])
    np.testing.assert_array_equal(data.mask(0), alpha >= 128)
    np.testing.assert_array_equal(data.mask(1), mask >= 128)
    assert Dataset(scene, [0, 1], alpha_as_mask=False).mask(0) is None
    lines = "\n".join(describe_views(scene, [0, 1], []))
    assert "alpha channel of 1 of 2 images" in lines and "1 of 2 views have a mask file" in lines
    half = load_scene(tmp_path, 2)  # downscaled into the cache with the images
    assert Dataset(half, [0, 1]).mask(1)[:2].sum() == 0 and Dataset(half, [0, 1]).mask(1)[3:].all()
    assert Dataset(half, [0, 1]).mask(0)[:, -1].all() and not Dataset(half, [0, 1]).mask(0)[:, 0].any()


def test_nerfstudio_mask_path_is_read(tmp_path):
    import imageio.v3 as iio
    from test_data import make_nerf

    from splat_train.trainer.data import Dataset, load_scene

    make_nerf(tmp_path, [("a.png", "a.png", {"mask_path": "masks/a.png"}), ("b.png", "b.png", {})], camera_angle_x=1.0)
    mask = np.zeros((30, 40), np.uint8)
    mask[:, 20:] = 255
    (tmp_path / "masks").mkdir()
    iio.imwrite(tmp_path / "masks" / "a.png", mask)
    data = Dataset(load_scene(tmp_path, 1), [0, 1])
    np.testing.assert_array_equal(data.mask(0), mask >= 128)
    assert data.mask(1) is None


def test_masks_and_the_fused_rasterizer_are_one_clear_error():
    cfg = parse_args(["default", *TINY, "--raster", "fused", "--packed"])
    scene = build_scene(cfg)
    scene.masks = [np.ones((32, 32), bool)] * len(scene.cameras)
    with pytest.raises(ValueError, match="--raster fused"):
        Trainer(cfg, DistContext(), scene)


# -------------------------------------------------------------------------------------- depth loss


def test_depth_loss_is_the_mean_disparity_error_per_image():
    from splat_train.trainer.depth import depth_loss, sample_bilinear

    rendered = torch.full((2, 4, 5, 1), 2.0)
    rendered[1] = 4.0
    pixels = torch.tensor([[0.5, 0.5], [2.5, 1.5], [4.5, 3.5]])
    image = torch.tensor([0, 0, 1])
    depths = torch.tensor([4.0, 1.0, 4.0])
    # image 0: |1/2 - 1/4| and |1/2 - 1| -> 0.375; image 1: 0 -> mean 0.1875, times the scene scale 2
    assert float(depth_loss(rendered, pixels, depths, image, 2.0)) == pytest.approx(0.375)
    ramp = torch.arange(20.0).reshape(1, 4, 5, 1)
    centres = torch.tensor([[0.5, 0.5], [3.0, 1.5], [1.5, 2.0]])
    torch.testing.assert_close(
        sample_bilinear(ramp, centres, torch.zeros(3, dtype=torch.long)), torch.tensor([0.0, 7.5, 8.5])
    )


def test_depth_loss_moves_the_model_and_needs_tracks(tmp_path):
    plain, depth = trainer(), trainer("--depth_loss", "--depth_lambda", "10")
    assert depth.depth_targets.num_points > 50
    out = depth.train_step(0)
    plain.train_step(0)
    assert float(out["depth"]) > 0
    assert not torch.equal(plain.params["means"], depth.params["means"])
    from test_data import make_nerf

    make_nerf(tmp_path, [("a", "a.png", {}), ("b", "b.png", {})], camera_angle_x=1.0)
    with pytest.raises(ValueError, match="--depth_loss"):
        trainer(
            "--depth_loss",
            "--data_dir",
            str(tmp_path),
            "--data_factor",
            "1",
            "--test_every",
            "0",
            "--init_type",
            "random",
            "--init_num_pts",
            "50",
        )


# ------------------------------------------------------------------------------ visible_adam, sparse


def test_visible_adam_moves_only_the_visible_gaussians():
    t = trainer("--visible_adam", "--init_type", "random", "--init_num_pts", "300")
    before = {k: v.detach().clone() for k, v in t.params.items()}
    t.train_step(0)
    moved = (t.params["means"] != before["means"]).any(-1)
    assert 0 < int(moved.sum()) < len(moved)  # some Gaussians no camera of the step saw stayed put
    for k in t.params:
        still = ~((t.params[k] != before[k]).reshape(len(moved), -1).any(-1))
        assert still[~moved].all(), k
    assert parse_args(["default", "--sparse_grad"]).step.sparse_grad and trainer("--sparse_grad").plan.selective_adam


# ---------------------------------------------------------------------------------- bilateral grid


def test_bilateral_grid_starts_at_identity_and_learns():
    from splat_train.trainer.bilagrid import BilateralGrid

    grid = BilateralGrid(3, 4, 4, 2)
    images = torch.rand(2, 6, 7, 3)
    ids = torch.tensor([2, 0])
    torch.testing.assert_close(grid(images, ids), images)
    assert float(grid.tv_loss().detach()) == 0.0
    with torch.no_grad():
        grid.grids[2, [0, 5, 10]] = 2.0  # image 2's grid doubles every channel
    torch.testing.assert_close(grid(images, ids)[0], 2 * images[0])
    torch.testing.assert_close(grid(images, ids)[1], images[1])
    t = trainer("--use_bilateral_grid", "--bilateral_grid_shape", "4", "4", "2", "--bilateral_grid_warmup", "1")
    start = t.aux["bilagrid"].grids.detach().clone()
    for step in range(2):
        t.train_step(step)
    assert not torch.equal(t.aux["bilagrid"].grids, start)
    assert "bilagrid" in t.state_dict()["aux_schedulers"]


# --------------------------------------------------------------------------- pose noise, patch size


def test_pose_noise_perturbs_the_training_cameras_alike_on_every_rank():
    a, b = trainer("--pose_noise", "0.05"), trainer("--pose_noise", "0.05")
    clean = torch.from_numpy(np.stack([a.scene.cameras[i].camtoworld for i in a.trainset.indices]))
    shift = (a.views.camtoworlds[:, :3, 3] - clean[:, :3, 3]).norm(dim=-1)
    assert torch.equal(a.views.camtoworlds, b.views.camtoworlds)  # a function of --seed
    assert 0.01 < float(shift.mean()) < 0.2
    assert torch.equal(
        a.testset.camera(0)["camtoworld"], torch.from_numpy(a.scene.cameras[a.testset.indices[0]].camtoworld)
    )  # test views are not perturbed


def test_patch_size_trains_on_crops_drawn_from_the_seed_step_and_rank():
    from splat_train.trainer.data.sampler import patch_window

    wins = {patch_window(42, step, 0, 0, 40, 30, 16) for step in range(50)}
    assert len(wins) > 10 and all(0 <= x <= 24 and 0 <= y <= 14 and (w, h) == (16, 16) for x, y, w, h in wins)
    assert patch_window(42, 3, 1, 0, 40, 30, 16) == patch_window(42, 3, 1, 0, 40, 30, 16)
    assert patch_window(1, 0, 0, 0, 12, 30, 16)[2:] == (12, 16)  # no larger than the image
    t = trainer("--patch_size", "16")
    t.train_step(0)
    x0, y0, w, h = t.batches.windows(0, 0, t.sampler.batch_at(0))[0]
    assert (w, h) == (16, 16)


# ----------------------------------------------------------------------------- video path, outputs


def _forward_facing(num=9):
    """Cameras on a 0.6 x 0.4 patch of the y = -3 plane, all looking at the origin (an LLFF capture)."""
    from test_data import look_at

    return np.stack(
        [look_at(np.array([x, -3.0, z])) for x in np.linspace(-0.3, 0.3, 3) for z in np.linspace(-0.2, 0.2, num // 3)]
    )


@pytest.mark.parametrize("path", ["ellipse", "spiral"])
def test_trajectory_paths_look_at_the_scene(path):
    from splat_train.trainer.trajectory import focus_point, trajectory

    if path == "ellipse":  # an orbit around the object (the synthetic scene)
        t = trainer()
        c2ws = np.stack([t.scene.cameras[i].camtoworld for i in t.trainset.indices]).astype(np.float64)
    else:  # forward-facing, what the spiral is for
        c2ws = _forward_facing()
    poses = trajectory(path, c2ws, 12, (1.0, 4.0))
    assert poses.shape == (12, 4, 4)
    rot = poses[:, :3, :3].astype(np.float64)
    np.testing.assert_allclose(rot @ rot.transpose(0, 2, 1), np.broadcast_to(np.eye(3), rot.shape), atol=1e-5)
    to_centre = focus_point(c2ws) - poses[:, :3, 3]
    cos = (to_centre * poses[:, :3, 2]).sum(-1) / np.linalg.norm(to_centre, axis=-1)
    assert cos.min() > 0.8  # every frame faces the scene the training cameras look at
    turns = 1 if path == "ellipse" else 2  # the spiral's second turn repeats a planar capture's first
    assert len(np.unique(poses[:, :3, 3].round(4), axis=0)) == 12 // turns
    if path == "ellipse":
        np.testing.assert_allclose(poses[:, 2, 3], c2ws[:, 2, 3].mean(), atol=1e-5)


def test_disable_video_no_save_ply_and_tb_save_image(tmp_path):
    from splat_train.trainer.cli import main

    out = tmp_path / "run"
    assert (
        main(
            [
                "default",
                *TINY,
                "--num_traj_frames",
                "4",
                "--disable_video",
                "--no-save_ply",
                "--tb_every",
                "2",
                "--tb_save_image",
                "--result_dir",
                str(out),
            ]
        )
        == 0
    )
    assert not (out / "videos").exists() and not (out / "ply").exists()
    assert (out / "ckpts" / "ckpt_4_rank0.pt").is_file()
    events = b"".join(p.read_bytes() for p in (out / "tb").glob("events*"))
    assert events.count(b"train/render") == 2  # steps 2 and 4


def test_masked_capture_script_paints_training_views_and_scores_the_region(tmp_path):
    """scripts/masked_capture.py: the issue's masked experiment on a small capture."""
    import cv2
    from test_data import make_colmap

    from splat_train.scripts.masked_capture import main as script
    from splat_train.trainer.data import Dataset, load_scene

    make_colmap(tmp_path / "src", specs=[("PINHOLE", 64, 48, [50.0, 50.0, 32.0, 24.0])] * 4)
    assert script(["make", str(tmp_path / "src"), str(tmp_path / "dst"), "--test_every", "2", "--margin", "2"]) == 0
    scene = load_scene(tmp_path / "dst", 1)
    data = Dataset(scene, [0, 1, 2, 3])
    names = [c.name for c in scene.cameras]
    for i, name in enumerate(names):
        image = cv2.imread(str(tmp_path / "dst" / "images" / name))[:, :, ::-1]
        original = cv2.imread(str(tmp_path / "src" / "images" / name))[:, :, ::-1]
        if i % 2 == 0:  # a test view: unchanged, no mask
            assert np.array_equal(image, original) and data.mask(i) is None
            continue
        assert np.abs(image[20:28, 28:36].astype(int) - [255, 0, 0]).max() <= 40  # painted red (JPEG)
        assert not data.mask(i)[20:28, 28:36].any() and data.mask(i)[:10].all()
        assert not (tmp_path / "dst-unmasked" / "masks").exists()
    run = tmp_path / "run"
    (run / "renders").mkdir(parents=True)
    gt = np.full((48, 64, 3), 128, np.uint8)
    render = gt.copy()
    render[20:28, 28:36] = 0  # wrong only inside the region
    cv2.imwrite(str(run / "renders" / "val_step5_a.png"), np.concatenate([gt, render], 1))
    assert script(["score", str(run), "--step", "5"]) == 0
    out = json.loads((run / "stats" / "region_psnr_step5.json").read_text())
    assert out["psnr_in_region"] < out["psnr"] < 100
    assert script(["score", str(run), "--step", "6"]) == 2


def test_masked_capture_moving_rectangle_visits_the_quadrants(tmp_path):
    """--moving: the k-th training view is painted in quadrant k mod 4 (its mask follows), and
    the score's region is the union of the four positions."""
    import cv2
    from test_data import make_colmap

    from splat_train.scripts.masked_capture import main as script
    from splat_train.trainer.data import Dataset, load_scene

    make_colmap(tmp_path / "src", specs=[("PINHOLE", 64, 48, [50.0, 50.0, 32.0, 24.0])] * 9)
    assert (
        script(["make", str(tmp_path / "src"), str(tmp_path / "dst"), "--test_every", "8", "--margin", "2", "--moving"])
        == 0
    )
    scene = load_scene(tmp_path / "dst", 1)
    data = Dataset(scene, list(range(9)))
    centres = [(16, 12), (48, 12), (16, 36), (48, 36)]  # (x, y) of the quadrants, row-major
    train = [i for i in range(9) if i % 8]
    for k, i in enumerate(train):
        image = cv2.imread(str(tmp_path / "dst" / "images" / scene.cameras[i].name))[:, :, ::-1].astype(int)
        for q, (x, y) in enumerate(centres):
            red = np.abs(image[y - 2 : y + 2, x - 2 : x + 2] - [255, 0, 0]).max() <= 40
            assert red == (q == k % 4), (k, q)
            assert (not data.mask(i)[y, x]) == (q == k % 4)
    run = tmp_path / "run"
    (run / "renders").mkdir(parents=True)
    gt = np.full((48, 64, 3), 128, np.uint8)
    render = gt.copy()
    render[34:38, 46:50] = 0  # wrong only in the bottom-right position: inside the moving union,
    cv2.imwrite(str(run / "renders" / "val_step5_a.png"), np.concatenate([gt, render], 1))
    assert script(["score", str(run), "--step", "5", "--moving"]) == 0
    moving = json.loads((run / "stats" / "region_psnr_step5.json").read_text())
    assert script(["score", str(run), "--step", "5"]) == 0  # outside the fixed middle rectangle
    fixed = json.loads((run / "stats" / "region_psnr_step5.json").read_text())
    assert moving["psnr_in_region"] < moving["psnr"] and fixed["psnr_in_region"] == float("inf")
