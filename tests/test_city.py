"""The city-like synthetic scene (trainer/data/city.py) on the CPU at a tiny size: it builds, each
camera sees under a tenth of the Gaussians, it is deterministic in its seed, its ground truth is
what the trainer renders from the known model, and the trainer and the bench run on it."""

import json
import math

import numpy as np
import pytest
import torch

from splat_train.trainer.data import city

N, W, H, C = 20_000, 64, 36, 6
BOUND = 0.10  # the largest share of the Gaussians a camera may see


@pytest.fixture(scope="module")
def scene():
    return city.make_city_scene(N, C, W, H, seed=0)


def test_city_builds_on_the_cpu_and_each_camera_sees_under_a_tenth(scene):
    assert len(scene.cameras) == C and len(scene.images) == C
    assert {c.name.split("_")[-1] for c in scene.cameras} == {"street.png", "aerial.png"}
    assert all(im.shape == (H, W, 3) and im.dtype == np.uint8 for im in scene.images)
    assert all(im.mean() > 10 for im in scene.images)  # each camera looks at the city, not past it
    assert scene.visible_fraction.shape == (C,)
    assert 0.0 < scene.visible_fraction.min() and scene.visible_fraction.max() <= BOUND
    assert scene.points.shape == (N, 3) and scene.points_rgb.shape == (N, 3)
    half = city.city_layout(0).half_extent
    assert np.abs(scene.points[:, :2]).max() < half + 20  # the jitter is local (half the spacing)


def test_fewer_points_than_gaussians_and_bad_sizes_are_refused():
    s = city.make_city_scene(2_000, 2, 32, 18, num_points=500)
    assert s.points.shape == (500, 3)
    for kwargs in (dict(num_points=0), dict(num_points=2_001), dict(num_gaussians=0), dict(width=8)):
        with pytest.raises(ValueError):
            city.make_city_scene(**{**dict(num_gaussians=2_000, num_cameras=2, width=32, height=18), **kwargs})


def test_layout_cameras_and_gaussians_are_deterministic_in_the_seed():
    a, b, other = city.city_layout(0), city.city_layout(0), city.city_layout(1)
    assert all(np.array_equal(getattr(a, k), getattr(b, k)) for k in ("kind", "origin", "edge_u", "colour"))
    assert len(a.kind) != len(other.kind) or not np.array_equal(a.origin, other.origin)
    ga, gb = city.city_gaussians(a, 5_000, seed=0), city.city_gaussians(a, 5_000, seed=0)
    assert all(torch.equal(ga[k], gb[k]) for k in ga)
    assert not torch.equal(ga["colors"], city.city_gaussians(a, 5_000, seed=1)["colors"])
    cams = city.city_cameras(9, W, H, seed=0)
    assert all(np.array_equal(x[1], y[1]) for x, y in zip(cams, city.city_cameras(9, W, H, seed=0)))
    assert not np.array_equal(cams[0][1], city.city_cameras(9, W, H, seed=1)[0][1])


def test_gaussians_cover_the_surfaces_in_proportion_to_their_area():
    area = np.array([1.0, 3.0, 0.5, 0.0])
    counts = city.allocate(area, 1_001)
    assert counts.sum() == 1_001 and counts[3] == 0 and np.abs(counts - area / area.sum() * 1_001).max() < 1


def test_the_thin_axis_of_a_gaussian_is_its_surface_normal():
    from splat_train.kernels.reference import quat_to_rotmat

    g = torch.Generator().manual_seed(0)
    n = torch.randn(500, 3, generator=g)
    n[:3] = torch.tensor([[1.0, 0, 0], [0, 0, -1.0], [0, 1.0, 0]])  # a facade, a downward normal, a facade
    n = n / n.norm(dim=1, keepdim=True)
    q = city._quat_from_normal(n, torch.rand(500, generator=g) * 6.3)
    assert torch.allclose(q.norm(dim=1), torch.ones(500), atol=1e-5)
    z = quat_to_rotmat(q)[:, :, 2]  # where the local z axis (the third scale) points
    assert torch.allclose((z * n).sum(1).abs(), torch.ones(500), atol=1e-5)


def test_the_ground_truth_is_the_trainers_render_of_the_known_gaussians(scene):
    """A perfect model exists: the true Gaussians as trainer parameters, rendered by the trainer's
    render path with the config the city resolves to (its far plane), give back the images; the
    far plane is what bounds a street camera's view (without it one sees far more)."""
    from splat_train.kernels import reference
    from splat_train.trainer.config import from_argv
    from splat_train.trainer.launch import DistContext
    from splat_train.trainer.model import rgb_to_sh
    from splat_train.trainer.render import CameraBatch, render

    cfg = from_argv(["default", "--synthetic_layout", "city"])
    assert cfg.step.far_plane == city.VIEW_DISTANCE
    g = city.city_gaussians(city.city_layout(0), N, seed=0)
    model = dict(
        means=g["means"],
        quats=g["quats"],
        scales=g["scales"],
        opacities=g["opacities"],
        colors=rgb_to_sh(g["colors"])[:, None, :],
    )
    viewmats = torch.stack([torch.linalg.inv(torch.from_numpy(c.camtoworld)) for c in scene.cameras]).float()
    Ks = torch.stack([torch.from_numpy(c.K) for c in scene.cameras])
    cams = CameraBatch(viewmats, Ks, W, H)
    with torch.no_grad():
        out = render(model, cams, DistContext(), reference, 0, near=cfg.step.near_plane, far=cfg.step.far_plane)
        kept = [
            (reference.fully_fused_projection(*args, far_plane=far, opacities=g["opacities"])[0] > 0).all(-1).sum(-1)
            for args in [(g["means"], None, g["quats"], g["scales"], viewmats, Ks, W, H)]
            for far in (cfg.step.far_plane, 1e10)
        ]
    truth = torch.from_numpy(np.stack(scene.images)).float() / 255.0
    assert (out.colors.clamp(0, 1) - truth).abs().max() <= 0.5 / 255 + 1e-4
    assert np.allclose(kept[0].numpy() / N, scene.visible_fraction)
    assert kept[1].max() > BOUND * N


def test_the_trainer_trains_on_the_city(tmp_path):
    from splat_train.trainer.cli import main

    run = tmp_path / "run"
    flags = ["--synthetic_layout", "city", "--synthetic_num_gaussians", "4000", "--synthetic_num_cameras", "3"]
    flags += ["--synthetic_image_size", "32", "--synthetic_image_height", "18", "--test_every", "3"]
    flags += ["--max_steps", "3", "--device", "cpu", "--num_traj_frames", "0", "--no_save_eval_images"]
    assert main(["default", *flags, "--result_dir", str(run)]) == 0
    stats = json.loads((run / "stats" / "val_step3.json").read_text())
    assert math.isfinite(stats["psnr"]) and stats["psnr"] > 5
    assert "far_plane: 350.0" in (run / "cfg.yml").read_text()


def test_the_city_refuses_what_it_cannot_give():
    from splat_train.trainer.config import from_argv
    from splat_train.trainer.data import DataError, scene_from_config

    tiny = ["default", "--synthetic_layout", "city", "--synthetic_num_gaussians", "100", "--device", "cpu"]
    for extra, says in ((["--camera_model", "fisheye"], "pinholes"), (["--depth_loss"], "--depth_loss")):
        with pytest.raises(DataError, match=says):
            scene_from_config(from_argv([*tiny, *extra]))
    assert from_argv([*tiny, "--far_plane", "100"]).step.far_plane == 100.0  # a far plane given is kept
    assert from_argv(["default"]).step.far_plane == 1e10  # the orbit's is unbounded
    with pytest.raises(ValueError, match="--synthetic_image_height"):
        from_argv([*tiny, "--synthetic_image_height", "8"])


def test_bench_runs_on_the_city_and_records_what_each_camera_sees(tmp_path):
    from splat_train.scripts import bench

    out = tmp_path / "b"
    flags = ["--device", "cpu", "--synthetic_layout", "city", "--synthetic_gaussians", "4000"]
    flags += ["--synthetic_points", "3000", "--resolution", "32x18", "--num_cameras", "3", "--steps", "3"]
    flags += ["--warmup", "1", "--phase_steps", "1", "--variants", "ours-dense", "--out", str(out)]
    assert bench.main(flags) == 0
    rep = json.loads((out / "bench.json").read_text())
    assert rep["scene"]["layout"] == "city" and rep["scene"]["num_points"] == 3000
    shares = rep["scene"]["visible_fraction"]
    assert 0 < shares["min"] <= shares["mean"] <= shares["max"] <= BOUND
    (entry,) = rep["variants"]
    assert entry["ranks"][0]["num_gaussians_local"] == 3000 and entry["ranks"][0]["test_psnr"] > 0
    assert "% of the true Gaussians" in (out / "bench.md").read_text()
    assert bench.main([*flags[:-2], "--synthetic_layout", "orbit", "--out", str(out)]) == 2  # points: city only


def test_bench_raster_takes_a_city_batch(tmp_path):
    from splat_train.scripts import bench_raster

    out = tmp_path / "br"
    flags = ["--device", "cpu", "--synthetic_layout", "city", "--synthetic_gaussians", "3000", "--resolution", "32x18"]
    flags += ["--num_cameras", "3", "--repeats", "1", "--warmup", "0", "--unfused_ssim", "pytorch", "--out", str(out)]
    assert bench_raster.main(flags) == 0
    s = json.loads((out / "bench_raster.json").read_text())["scene"]
    assert s["synthetic_layout"] == "city" and len(s["visible_fraction"]) == 1 and 0 < s["visible_fraction"][0] <= BOUND


@pytest.mark.gpu
def test_a_2m_city_builds_on_the_gpu_and_each_camera_sees_under_a_tenth():
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    torch.cuda.reset_peak_memory_stats()
    s = city.make_city_scene(2_000_000, 16, 1920, 1080, device="cuda")
    print(
        f"2M city: visible {s.visible_fraction.min():.4f}-{s.visible_fraction.max():.4f} "
        f"(mean {s.visible_fraction.mean():.4f}), peak {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB"
    )
    assert 0.0 < s.visible_fraction.min() and s.visible_fraction.max() <= BOUND
    assert all(im.mean() > 10 for im in s.images) and s.points.shape == (2_000_000, 3)
