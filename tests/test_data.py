"""Tests of the data layer (splat_train.trainer.data): COLMAP and NeRF loading, downscaling,
undistortion, normalization, split, Dataset and CameraSampler; real captures when present."""

from __future__ import annotations

import json
import math
from pathlib import Path

import cv2
import imageio.v3 as iio
import numpy as np
import pycolmap
import pytest
import torch

from scenes import add_posed_image
from splat_train.trainer.data import (
    CameraSampler,
    DataError,
    Dataset,
    describe_views,
    load_image,
    load_scene,
    split_indices,
)
from splat_train.trainer.data.images import make_undistortion, read_rgb
from splat_train.trainer.data.normalize import transform_points

REAL_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"

# (model, width, height, params): one camera per image, portrait and landscape, pinhole and distorted.
CAMERA_SPECS = [
    ("SIMPLE_PINHOLE", 40, 30, [36.0, 20.0, 15.0]),
    ("PINHOLE", 30, 40, [35.0, 37.0, 15.5, 19.0]),
    ("SIMPLE_RADIAL", 40, 30, [38.0, 20.0, 15.0, 0.05]),
    ("RADIAL", 30, 40, [34.0, 15.0, 20.0, -0.04, 0.01]),
    ("OPENCV", 41, 31, [37.0, 36.0, 20.0, 15.0, 0.03, -0.01, 0.002, -0.001]),
    ("PINHOLE", 41, 31, [40.0, 40.0, 20.5, 15.5]),
]


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("SPLAT_TRAIN_CACHE", str(tmp_path / "cache"))


def look_at(centre, target=(0.0, 0.0, 0.0), up=(0.0, 0.0, 1.0)) -> np.ndarray:
    """[4, 4] OpenCV camtoworld at centre looking at target, image 'up' towards +up."""
    forward = np.asarray(target, float) - centre
    forward /= np.linalg.norm(forward)
    right = np.cross(forward, up)
    right /= np.linalg.norm(right)
    c2w = np.eye(4)
    c2w[:3, :3] = np.stack([right, np.cross(forward, right), forward], axis=1)
    c2w[:3, 3] = centre
    return c2w


def ring_poses(num: int, radius=4.0, height=1.5) -> np.ndarray:
    """[num, 4, 4] cameras on a circle above the z=0 plane looking at the origin."""
    angles = np.linspace(0, 2 * np.pi, num, endpoint=False) + 0.3
    return np.stack([look_at(np.array([radius * np.cos(a), radius * np.sin(a), height])) for a in angles])


def scene_points(rng, num=200) -> np.ndarray:
    """A floor (z ~ 0, wide) and an object above it (a small blob): [num, 3]."""
    floor = np.c_[rng.uniform(-2, 2, (num * 3 // 4, 2)), rng.normal(0, 0.01, num * 3 // 4)]
    blob = rng.normal([0, 0, 0.6], 0.2, (num - len(floor), 3))
    return np.vstack([floor, blob])


def make_colmap(root: Path, specs=CAMERA_SPECS, fmt="bin", poses=None, points=None, seed=0) -> pycolmap.Reconstruction:
    """Write root/images/* (random PNGs) and a COLMAP model in root/sparse/0; return the model.

    Image names run opposite to image ids, so sorting by name is observable.
    """
    rng = np.random.default_rng(seed)
    poses = ring_poses(len(specs)) if poses is None else poses
    points = scene_points(rng) if points is None else points
    rec = pycolmap.Reconstruction()
    (root / "images").mkdir(parents=True, exist_ok=True)
    for i, ((model, w, h, params), c2w) in enumerate(zip(specs, poses), start=1):
        camera = pycolmap.Camera(model=model, width=w, height=h, params=params, camera_id=i)
        name = f"view_{len(specs) - i:02d}.png"
        w2c = np.linalg.inv(c2w)
        add_posed_image(rec, camera, pycolmap.Image(name=name, camera_id=i, image_id=i), pycolmap.Rigid3d(w2c[:3, :4]))
        iio.imwrite(root / "images" / name, rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
    for xyz in points:
        rec.add_point3D(xyz, pycolmap.Track(), rng.integers(0, 256, 3).astype(np.uint8))
    model_dir = root / "sparse" / "0"
    model_dir.mkdir(parents=True, exist_ok=True)
    rec.write_binary(str(model_dir)) if fmt == "bin" else rec.write_text(str(model_dir))
    return rec


def project(camera, points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pixels [P, 2] (corner convention) and depths [P] of world points through a scene Camera."""
    w2c = np.linalg.inv(camera.camtoworld.astype(np.float64))
    cam = points @ w2c[:3, :3].T + w2c[:3, 3]
    uv = cam[:, :2] / cam[:, 2:] * np.diag(camera.K)[:2] + camera.K[:2, 2]
    return uv, cam[:, 2]


def tree_state(root: Path) -> dict:
    return {p: p.stat().st_mtime_ns for p in sorted(root.rglob("*"))}


# ---------------------------------------------------------------------------------------------
# COLMAP


def test_colmap_binary_and_text_agree_and_sort_by_name(tmp_path):
    make_colmap(tmp_path / "bin", fmt="bin")
    make_colmap(tmp_path / "txt", fmt="txt")
    a, b = load_scene(tmp_path / "bin"), load_scene(tmp_path / "txt")
    names = [c.name for c in a.cameras]
    assert names == sorted(names) and len(names) == len(CAMERA_SPECS)
    assert names == [c.name for c in b.cameras] and a.source == b.source == "colmap"
    for ca, cb in zip(a.cameras, b.cameras):
        np.testing.assert_allclose(ca.camtoworld, cb.camtoworld, atol=1e-5)
        np.testing.assert_allclose(ca.K, cb.K, atol=1e-4)
    np.testing.assert_allclose(a.points, b.points, atol=1e-5)


def test_colmap_poses_intrinsics_points_round_trip(tmp_path):
    rec = make_colmap(tmp_path)
    scene = load_scene(tmp_path, normalize=False)
    np.testing.assert_array_equal(scene.transform, np.eye(4, dtype=np.float32))
    by_name = {im.name: im for im in rec.images.values()}
    for camera in scene.cameras:
        image = by_name[camera.name]
        w2c = np.eye(4)
        w2c[:3] = image.cam_from_world().matrix()
        np.testing.assert_allclose(camera.camtoworld, np.linalg.inv(w2c), atol=1e-5)
        model, w, h, params = CAMERA_SPECS[image.camera_id - 1]
        assert camera.camtoworld.dtype == np.float32 and camera.K.dtype == np.float32
        if model in ("SIMPLE_PINHOLE", "PINHOLE"):
            fx, fy, cx, cy = (params[0], params[0], *params[1:]) if model == "SIMPLE_PINHOLE" else params
            np.testing.assert_allclose(camera.K, [[fx, 0, cx], [0, fy, cy], [0, 0, 1]], atol=1e-5)
            assert (camera.width, camera.height) == (w, h) and camera.dist is None
        else:  # undistorted: a pinhole of the cropped size, image size equal to it
            assert camera.dist is not None
            assert (camera.width, camera.height) == (camera.dist.width, camera.dist.height)
            assert camera.width <= w and camera.height <= h
            np.testing.assert_allclose(camera.K, camera.dist.K, atol=1e-5)
            assert load_image(scene, scene.cameras.index(camera)).shape == (camera.height, camera.width, 3)
    xyz = np.array([p.xyz for p in rec.points3D.values()])
    np.testing.assert_allclose(np.sort(scene.points, axis=0), np.sort(xyz, axis=0), atol=1e-5)
    assert scene.points_rgb.shape == scene.points.shape and scene.points_rgb.dtype == np.uint8


def test_colmap_sparse_without_0_and_zero_points(tmp_path):
    make_colmap(tmp_path, points=np.zeros((0, 3)))
    (tmp_path / "sparse" / "0").rename(tmp_path / "model")
    (tmp_path / "sparse").rmdir()
    (tmp_path / "model").rename(tmp_path / "sparse")
    scene = load_scene(tmp_path)
    assert scene.points.shape == (0, 3) and len(scene.cameras) == len(CAMERA_SPECS)
    assert np.isfinite(scene.scene_scale) and scene.scene_scale > 0


@pytest.mark.parametrize(
    "model, params, fx, fy, cx, cy, coeffs",
    [
        (
            "OPENCV",
            [120.0, 118.0, 81.0, 59.0, -0.25, 0.08, 0.003, -0.002],
            120,
            118,
            81,
            59,
            [-0.25, 0.08, 0.003, -0.002],
        ),
        ("SIMPLE_RADIAL", [119.0, 80.0, 60.5, 0.2], 119, 119, 80, 60.5, [0.2, 0, 0, 0]),
        ("RADIAL", [121.0, 79.0, 61.0, -0.2, 0.05], 121, 121, 79, 61, [-0.2, 0.05, 0, 0]),
    ],
)
def test_undistortion_recovers_pinhole_image(tmp_path, model, params, fx, fy, cx, cy, coeffs):
    """A smooth pattern seen through a distorted camera, undistorted by the loader, must match the
    same pattern rendered through the reported pinhole K (and the raw image must not)."""
    w, h = 160, 120
    pattern = lambda x, y: 127.5 + 120 * np.sin(7 * x) * np.cos(5 * y)  # noqa: E731, normalized coords
    u, v = np.meshgrid(np.arange(w) + 0.5, np.arange(h) + 0.5)  # pixel centres, corner convention
    K_cv = np.array([[fx, 0, cx - 0.5], [0, fy, cy - 0.5], [0, 0, 1]])  # OpenCV: centres at integers
    centres_cv = np.c_[u.ravel() - 0.5, v.ravel() - 0.5][:, None]
    xy = cv2.undistortPoints(centres_cv, K_cv, np.array(coeffs, float))[:, 0]  # [H * W, 2] normalized
    distorted = pattern(xy[:, 0], xy[:, 1]).reshape(h, w).round().astype(np.uint8)
    make_colmap(tmp_path, specs=[(model, w, h, params)] * 2, poses=ring_poses(2))
    for name in ("view_00.png", "view_01.png"):
        iio.imwrite(tmp_path / "images" / name, np.repeat(distorted[:, :, None], 3, axis=2))
    scene = load_scene(tmp_path, normalize=False)
    camera = scene.cameras[0]
    assert camera.dist is not None and camera.dist.cache_maps is False
    image = load_image(scene, 0)[:, :, 0].astype(np.float64)
    uo, vo = np.meshgrid(np.arange(camera.width) + 0.5, np.arange(camera.height) + 0.5)
    K = camera.K.astype(np.float64)
    expected = pattern((uo - K[0, 2]) / K[0, 0], (vo - K[1, 2]) / K[1, 1])
    interior = (slice(2, -2), slice(2, -2))
    error = np.abs(image - expected)[interior].mean()
    control = np.abs(distorted[: camera.height, : camera.width] - expected)[interior].mean()
    assert error < 1.0, error
    assert control > 4 * error, (control, error)


def test_zero_distortion_is_identity(tmp_path):
    K = np.array([[30.0, 0, 20.0], [0, 31.0, 15.0], [0, 0, 1]])
    plan = make_undistortion(K, np.zeros(4), 40, 30, what="test")
    np.testing.assert_allclose(plan.K, K, atol=1e-6)
    assert (plan.width, plan.height) == (40, 30)
    image = np.random.default_rng(0).integers(0, 256, (30, 40, 3), dtype=np.uint8)
    np.testing.assert_array_equal(plan.apply(image), image)
    # And an OPENCV camera with all-zero coefficients is loaded as a plain pinhole.
    make_colmap(tmp_path, specs=[("OPENCV", 40, 30, [30, 31, 20, 15, 0, 0, 0, 0])] * 2, poses=ring_poses(2))
    assert all(c.dist is None for c in load_scene(tmp_path).cameras)


def test_data_factor_reads_images_f_and_scales_K(tmp_path):
    make_colmap(tmp_path)
    (tmp_path / "images_2").mkdir()
    for path in (tmp_path / "images").iterdir():
        image = iio.imread(path)
        half = image[::2, ::2][: image.shape[0] // 2, : image.shape[1] // 2]  # floor-sized: 41 -> 20
        iio.imwrite(tmp_path / "images_2" / path.name, half)
    full, half = load_scene(tmp_path), load_scene(tmp_path, data_factor=2)
    for a, b in zip(full.cameras, half.cameras):
        assert b.image_path.parent == tmp_path / "images_2"
        src_w, src_h = (b.dist.src_width, b.dist.src_height) if b.dist else (b.width, b.height)
        full_w, full_h = (a.dist.src_width, a.dist.src_height) if a.dist else (a.width, a.height)
        assert (src_w, src_h) == (full_w // 2, full_h // 2)  # floor-sized files are accepted
        if b.dist is None:  # K scaled by the actual per-axis ratio, not by 1/2
            np.testing.assert_allclose(b.K, np.diag([src_w / full_w, src_h / full_h, 1]) @ a.K, rtol=1e-5)
        else:
            expected = a.dist.K_distorted[0, 0] * src_w / full_w
            np.testing.assert_allclose(b.dist.K_distorted[0, 0], expected, rtol=1e-6)
        assert load_image(half, half.cameras.index(b)).shape == (b.height, b.width, 3)


def test_data_factor_cache_made_once_outside_data_dir(tmp_path):
    data = tmp_path / "data"
    make_colmap(data)
    before = tree_state(data)
    scene = load_scene(data, data_factor=2)
    assert tree_state(data) == before, "the data dir must never be written"
    cache = tmp_path / "cache"
    cached = sorted(cache.rglob("*.png"))
    assert len(cached) == len(CAMERA_SPECS) and all(p.parent.name == "images_2" for p in cached)
    assert not list(cache.rglob("*.tmp"))
    for camera in scene.cameras:
        assert cache in camera.image_path.parents
        original = read_rgb(data / "images" / camera.name)
        h, w = original.shape[:2]
        size = (int(w / 2 + 0.5), int(h / 2 + 0.5))  # 41 -> 21, 31 -> 16: halves round up
        expected = cv2.resize(original, size, interpolation=cv2.INTER_AREA)
        np.testing.assert_array_equal(read_rgb(camera.image_path), expected)  # lossless PNG
    stamps = {p: p.stat().st_mtime_ns for p in cached}
    said = []
    again = load_scene(data, data_factor=2, log=said.append)
    assert {p: p.stat().st_mtime_ns for p in cached} == stamps, "cache must be reused, not rewritten"
    assert [c.image_path for c in again.cameras] == [c.image_path for c in scene.cameras]
    assert said == []  # nothing slow to announce


def test_loading_says_what_it_decodes_downscales_and_undistorts(tmp_path):
    data = tmp_path / "data"
    make_colmap(data)  # 6 views of 4 sizes; SIMPLE_RADIAL, RADIAL and OPENCV cameras are distorted
    said = []
    scene = load_scene(data, data_factor=2, log=said.append)
    assert len(said) == 1 and said[0].startswith(f"downscaling 6 images of {data / 'images'} by 2 into the cache")
    lines = describe_views(scene, *split_indices(len(scene.cameras), 3))
    assert len(lines) == 2
    assert lines[0].startswith("images: 6 views (4 train, 2 test), ") and "read from the downscale cache" in lines[0]
    assert "MB into memory" in lines[0]
    assert lines[1].startswith(
        "distortion: COLMAP OPENCV, COLMAP RADIAL, COLMAP SIMPLE_RADIAL undone with OpenCV for 3 of 6 views"
    )
    pinhole = [spec for spec in CAMERA_SPECS if "PINHOLE" in spec[0]]
    make_colmap(tmp_path / "pinhole", specs=pinhole)
    lines = describe_views(load_scene(tmp_path / "pinhole"), list(range(len(pinhole))), [])
    assert lines == [
        f"images: 3 views (3 train, 0 test), 41x31 (1), 30x40 (1), 40x30 (1), read from "
        f"{tmp_path / 'pinhole' / 'images'}: decoding 0.0 MB into memory"
    ]


# ---------------------------------------------------------------------------------------------
# Normalization


def _similarity(rng) -> np.ndarray:
    q = rng.normal(size=4)
    R = pycolmap.Rotation3d(q / np.linalg.norm(q)).matrix()
    T = np.eye(4)
    T[:3, :3] = 3.7 * R
    T[:3, 3] = rng.normal(0, 5, 3)
    return T


@pytest.mark.parametrize("upside_down", [False, True])
def test_normalization_centres_scales_and_puts_z_up(tmp_path, upside_down):
    rng = np.random.default_rng(1)
    poses, points = ring_poses(len(CAMERA_SPECS)), scene_points(rng)
    if upside_down:  # the capture's world upside down: normalization must still put z up
        flip = np.diag([1.0, -1.0, -1.0, 1.0])
        poses, points = flip @ poses, points @ flip[:3, :3].T
    T = _similarity(rng)  # scramble the world: the result must not depend on it
    poses = T[None] @ poses
    poses[:, :3, :3] /= 3.7
    make_colmap(tmp_path, poses=poses, points=points @ T[:3, :3].T + T[:3, 3])
    raw, scene = load_scene(tmp_path, normalize=False), load_scene(tmp_path)
    centres = np.stack([c.camtoworld[:3, 3] for c in scene.cameras])
    assert np.all(centres[:, 2] > 0.1), "cameras must sit above the floor (z up)"
    floor = np.abs(transform_points(np.linalg.inv(T), raw.points.astype(np.float64))[:, 2]) < 0.05
    assert floor.mean() > 0.7 and np.std(scene.points[floor, 2]) < 0.02, "the floor must lie in a z plane"
    assert np.linalg.norm(np.median(scene.points, axis=0)) < 0.1  # scene at the origin
    assert 0.5 < np.median(np.linalg.norm(centres, axis=1)) < 2.0  # unit-ish scale
    expected_scale = np.linalg.norm(centres - centres.mean(0), axis=1).max()
    assert scene.scene_scale == pytest.approx(expected_scale, rel=1e-5)
    moved = transform_points(scene.transform.astype(np.float64), raw.points.astype(np.float64))
    np.testing.assert_allclose(moved, scene.points, atol=1e-4)
    for before, after in zip(raw.cameras, scene.cameras):
        R = after.camtoworld[:3, :3]
        np.testing.assert_allclose(R.T @ R, np.eye(3), atol=1e-5)
        uv_before, _ = project(before, raw.points)  # a similarity of the world moves no pixel
        uv_after, _ = project(after, scene.points)
        np.testing.assert_allclose(uv_after, uv_before, atol=2e-2)
    again = load_scene(tmp_path)
    np.testing.assert_array_equal(again.transform, scene.transform)


# ---------------------------------------------------------------------------------------------
# NeRF transforms.json


def make_nerf(root: Path, frames_spec, **top) -> None:
    """frames_spec: (file_path in json, file written or None, extra keys); 4 ring poses (OpenGL)."""
    rng = np.random.default_rng(0)
    frames = []
    for (file_path, written, extra), c2w in zip(frames_spec, ring_poses(len(frames_spec))):
        if written:
            (root / written).parent.mkdir(parents=True, exist_ok=True)
            iio.imwrite(root / written, rng.integers(0, 256, (30, 40, 3), dtype=np.uint8))
        gl = c2w @ np.diag([1.0, -1.0, -1.0, 1.0])
        frames.append({"file_path": file_path, "transform_matrix": gl.tolist(), **extra})
    (root / "transforms.json").write_text(json.dumps({**top, "frames": frames}))


def test_nerf_blender_style_skips_missing_frames(tmp_path):
    spec = [
        ("./train/r_2", "train/r_2.png", {}),
        ("./train/r_0", "train/r_0.png", {}),
        ("./train/r_1", None, {}),
        ("train/r_3.jpg", "train/r_3.jpg", {}),
    ]
    make_nerf(tmp_path, spec, camera_angle_x=0.8)
    lines: list = []
    scene = load_scene(tmp_path, normalize=False, warn=lines.append)
    assert lines == [
        f"warning: {tmp_path / 'transforms.json'}: skipping 1 of 4 frames whose image is missing: ./train/r_1"
    ]
    assert [c.name for c in scene.cameras] == ["train/r_0.png", "train/r_2.png", "train/r_3.jpg"]
    assert scene.source == "nerf" and scene.points is None and scene.points_rgb is None
    poses = ring_poses(4)
    for camera, pose in zip(scene.cameras, poses[[1, 0, 3]]):
        np.testing.assert_allclose(camera.camtoworld, pose, atol=1e-5)  # OpenGL -> OpenCV
        f = 0.5 * 40 / math.tan(0.4)
        np.testing.assert_allclose(camera.K, [[f, 0, 20], [0, f, 15], [0, 0, 1]], rtol=1e-5)
        assert (camera.width, camera.height) == (40, 30) and camera.dist is None


def test_nerf_intrinsics_distortion_factor_and_normalization(tmp_path):
    spec = [(f"images/{i}.png", f"images/{i}.png", {"fl_y": 33.0} if i == 0 else {}) for i in range(4)]
    make_nerf(tmp_path, spec, fl_x=35.0, cx=19.0, cy=16.0, w=40, h=30, k1=0.05, p2=0.001)
    scene = load_scene(tmp_path, data_factor=2)
    first, second = scene.cameras[0], scene.cameras[1]
    assert describe_views(scene, [0, 1, 2, 3], [])[1].startswith(
        "distortion: transforms.json k1/k2/p1/p2/k3 undone with OpenCV for 4 of 4 views"
    )
    np.testing.assert_allclose(first.dist.K_distorted, [[17.5, 0, 9.5], [0, 16.5, 8], [0, 0, 1]])
    np.testing.assert_allclose(second.dist.K_distorted[1, 1], 17.5)  # fl_y defaults to fl_x
    assert second.dist is scene.cameras[2].dist and second.dist.cache_maps  # shared intrinsics
    assert load_image(scene, 0).shape == (first.height, first.width, 3)
    assert (tmp_path / "cache") in first.image_path.parents and first.image_path.parent.name == "images_2"
    centres = np.stack([c.camtoworld[:3, 3] for c in scene.cameras])
    # The ring looks at one point: it goes to the origin, the cameras to unit distance above it.
    np.testing.assert_allclose(centres.mean(0)[:2], 0, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(centres, axis=1), 1, rtol=1e-5)
    assert np.all(centres[:, 2] > 0.3)  # z up (the ring is above its look-at point)
    assert scene.scene_scale == pytest.approx(np.linalg.norm(centres[0, :2]), rel=1e-5)


def test_nerf_all_frames_missing(tmp_path, capfd):
    """Without a ``warn``, the skipped frames are one plain line on stderr (no UserWarning and
    its source line), then the error."""
    make_nerf(tmp_path, [("a.png", None, {}), ("b.png", None, {})], camera_angle_x=0.8)
    with pytest.raises(DataError, match="transforms.json"):
        load_scene(tmp_path)
    err = capfd.readouterr().err.splitlines()
    assert err == [
        f"warning: {tmp_path / 'transforms.json'}: skipping 2 of 2 frames whose image is missing: a.png, b.png"
    ]


def test_a_scene_without_3d_points_is_refused_before_any_image_is_downscaled(tmp_path):
    """--init_type sfm (need_points) on a COLMAP model with no points, and on a transforms.json
    (which holds none): a DataError naming the folder and --init_type random, and the downscale
    cache never written."""
    make_colmap(tmp_path / "colmap", points=np.zeros((0, 3)))
    make_nerf(tmp_path / "nerf", [("a.png", "a.png", {}), ("b.png", "b.png", {})], camera_angle_x=0.8)
    for root in (tmp_path / "colmap", tmp_path / "nerf"):
        with pytest.raises(DataError, match="no 3D points .*--init_type random") as e:
            load_scene(root, data_factor=2, need_points=True)
        assert str(root) in str(e.value)
    assert not (tmp_path / "cache").exists()
    assert len(load_scene(tmp_path / "colmap", data_factor=2).points) == 0  # allowed without need_points
    assert (tmp_path / "cache").is_dir()


# ---------------------------------------------------------------------------------------------
# Bad input, one failure each


def test_missing_data_dir(tmp_path):
    with pytest.raises(DataError, match="nope"):
        load_scene(tmp_path / "nope")


def test_dir_without_any_format(tmp_path):
    (tmp_path / "images").mkdir()
    with pytest.raises(DataError, match="transforms.json"):
        load_scene(tmp_path)


def test_model_lists_images_not_on_disk(tmp_path):
    make_colmap(tmp_path)
    (tmp_path / "images" / "view_03.png").unlink()
    with pytest.raises(DataError, match=r"1 of the 6 .*sparse/0.*view_03\.png"):
        load_scene(tmp_path)


def test_unsupported_camera_model(tmp_path):
    specs = CAMERA_SPECS[:2] + [("FULL_OPENCV", 40, 30, [30, 30, 20, 15] + [0.01] * 8)]
    make_colmap(tmp_path, specs=specs)
    with pytest.raises(DataError, match=r"cameras\.bin: camera 3 has model FULL_OPENCV"):
        load_scene(tmp_path)


def test_unreadable_image(tmp_path):
    specs = [("PINHOLE", 40, 30, [30, 30, 20, 15])] * 3
    make_colmap(tmp_path, specs=specs)
    rec = pycolmap.Reconstruction(str(tmp_path / "sparse" / "0"))
    rec.images[2].name = "broken.jpg"
    rec.write_binary(str(tmp_path / "sparse" / "0"))
    (tmp_path / "images" / "broken.jpg").write_bytes(b"\xff\xd8 this is not a jpeg at all")
    with pytest.raises(DataError, match="broken.jpg"):  # the header check at load time
        load_scene(tmp_path)


def test_unreadable_image_found_at_preload(tmp_path):
    make_colmap(tmp_path, specs=[("PINHOLE", 40, 30, [30, 30, 20, 15])] * 3)
    scene = load_scene(tmp_path)
    scene.cameras[1].image_path.write_bytes(b"garbage")  # corrupted after the scene was read
    Dataset(scene, [0, 2])  # fine without it
    with pytest.raises(DataError, match=scene.cameras[1].name):
        Dataset(scene, [0, 1, 2])


def test_dataset_preloads_only_the_named_items(tmp_path):
    """A rank's share of the test views (preload=[...]): those are decoded at construction (a bad
    file among them raises there), the others when asked for, with the same pixels."""
    make_colmap(tmp_path, specs=[("PINHOLE", 40, 30, [30, 30, 20, 15])] * 4)
    scene = load_scene(tmp_path)
    share = Dataset(scene, [0, 1, 2, 3], preload=[1, 3])
    everything = Dataset(scene, [0, 1, 2, 3])
    for i in range(4):
        np.testing.assert_array_equal(share.image(i), everything.image(i))
    scene.cameras[2].image_path.write_bytes(b"garbage")  # not in the share: read only when asked for
    np.testing.assert_array_equal(share.view(3)[0], everything.image(3))
    with pytest.raises(DataError, match=scene.cameras[2].name):
        share.image(2)
    with pytest.raises(DataError, match=scene.cameras[2].name):
        Dataset(scene, [0, 1, 2, 3], preload=[2])


def test_image_of_wrong_size(tmp_path):
    make_colmap(tmp_path, specs=[("PINHOLE", 40, 30, [30, 30, 20, 15])] * 3)
    iio.imwrite(tmp_path / "images" / "view_01.png", np.zeros((30, 41, 3), np.uint8))
    with pytest.raises(DataError, match=r"view_01\.png is 41x30"):
        load_scene(tmp_path)


def test_read_rgb_composites_alpha_onto_black(tmp_path):
    rgba = np.array([[[200, 100, 50, 255], [200, 100, 50, 0]]], np.uint8)
    iio.imwrite(tmp_path / "a.png", rgba)
    np.testing.assert_array_equal(read_rgb(tmp_path / "a.png"), [[[200, 100, 50], [0, 0, 0]]])


# ---------------------------------------------------------------------------------------------
# Split, Dataset, CameraSampler


def test_split_indices():
    train, test = split_indices(20, 8)
    assert test == [0, 8, 16] and train == [i for i in range(20) if i not in test]
    assert split_indices(5, 0) == ([0, 1, 2, 3, 4], [])
    for bad in (1, -3):
        with pytest.raises(DataError, match="test_every"):
            split_indices(5, bad)
    with pytest.raises(DataError, match="test_every"):
        split_indices(1, 8)  # the single camera would be a test view


def test_dataset_items_and_batches(tmp_path):
    make_colmap(tmp_path)
    scene = load_scene(tmp_path)
    dataset = Dataset(scene, [1, 2, 4], preload=False)
    item = dataset[1]
    camera = scene.cameras[2]
    assert item["image_id"] == 2 and (item["width"], item["height"]) == (camera.width, camera.height)
    assert item["image"].dtype == torch.float32 and item["image"].shape == (camera.height, camera.width, 3)
    torch.testing.assert_close(item["image"], torch.from_numpy(load_image(scene, 2)).float() / 255)
    torch.testing.assert_close(item["K"], torch.from_numpy(camera.K))
    torch.testing.assert_close(item["camtoworld"], torch.from_numpy(camera.camtoworld))
    same = [i for i, c in enumerate(scene.cameras) if (c.width, c.height) == (40, 30)]
    batch = Dataset(scene, same).batch([1, 0])
    assert batch["image"].shape == (2, 30, 40, 3) and batch["K"].shape == (2, 3, 3)
    assert batch["camtoworld"].shape == (2, 4, 4) and batch["image_id"].tolist() == [same[1], same[0]]
    assert batch["image_id"].dtype == torch.int64 and (batch["width"], batch["height"]) == (40, 30)
    mixed = [same[0], next(i for i, c in enumerate(scene.cameras) if c.width == 30)]
    with pytest.raises(AssertionError, match="mixed"):
        Dataset(scene, mixed, preload=False).batch([0, 1])


class _Sized:
    """A stand-in dataset with given (width, height) per item."""

    def __init__(self, sizes):
        self.sizes = sizes

    def __len__(self):
        return len(self.sizes)

    def size(self, i):
        return self.sizes[i]


SIZES = [(40, 30)] * 7 + [(30, 40)] * 4 + [(41, 31)]


def test_sampler_is_a_pure_function_of_step():
    steps = [0, 5, 17, 3, 40, 17, 2, 39]
    a = CameraSampler(_Sized(SIZES), batch_size=3, seed=7)
    forward = {s: a.batch_at(s) for s in sorted(set(steps))}
    b = CameraSampler(_Sized(SIZES), batch_size=3, seed=7)
    assert all(b.batch_at(s) == forward[s] for s in steps)  # any call order, fresh instance
    reseeded = CameraSampler(_Sized(SIZES), batch_size=3, seed=8)
    assert [a.batch_at(s) for s in range(30)] != [reseeded.batch_at(s) for s in range(30)]


def test_sampler_ranks_differ_and_epochs_cover_all_without_mixing():
    sampler = CameraSampler(_Sized(SIZES), batch_size=3, seed=0)
    other = CameraSampler(_Sized(SIZES), batch_size=3, seed=0, rank=1)
    per_epoch = sampler.num_batches_per_epoch
    assert per_epoch == 3 + 2 + 1  # ceil(7/3) + ceil(4/3) + ceil(1/3)
    orders = []
    for epoch in range(3):
        batches = [sampler.batch_at(epoch * per_epoch + k) for k in range(per_epoch)]
        assert sorted(i for b in batches for i in b) == list(range(len(SIZES)))  # each once
        assert all(len({SIZES[i] for i in b}) == 1 and 1 <= len(b) <= 3 for b in batches)
        orders.append(batches)
    assert orders[0] != orders[1] or orders[1] != orders[2]  # reshuffled each epoch
    assert [sampler.batch_at(s) for s in range(18)] != [other.batch_at(s) for s in range(18)]
    whole = CameraSampler(_Sized(SIZES), batch_size=100, seed=0)
    assert sorted(len(whole.batch_at(k)) for k in range(whole.num_batches_per_epoch)) == [1, 4, 7]


@pytest.mark.parametrize(
    "sizes, batch_size, uniform",
    [
        ([(40, 30)] * 6, 3, True),
        ([(40, 30)] * 6, 1, True),
        ([(40, 30)] * 7, 3, False),  # a short last batch
        ([(40, 30)] * 6 + [(30, 40)] * 6, 3, False),  # two sizes: ranks would draw different sizes at a step
    ],
)
def test_sampler_says_whether_every_batch_is_full_and_one_size(sizes, batch_size, uniform):
    """uniform_batches (what --pipeline gsplat-dist with several ranks needs) agrees with the
    batches every rank actually draws over two epochs."""
    samplers = [CameraSampler(_Sized(sizes), batch_size=batch_size, seed=3, rank=r) for r in range(2)]
    steps = range(2 * samplers[0].num_batches_per_epoch)
    shapes = {(len(b), sizes[b[0]]) for s in samplers for b in (s.batch_at(k) for k in steps)}
    assert samplers[0].uniform_batches is uniform and (len(shapes) == 1) is uniform


# ---------------------------------------------------------------------------------------------
# Real captures


REAL = {  # name: (images, {loaded sizes}, images_4 prebuilt?)
    "cup": (77, {(200, 150)}, True),
    "mouse": (56, {(480, 360), (360, 480)}, True),
    "juicebox": (64, {(480, 270)}, True),
    "beer": (71, {(180, 320)}, False),  # size before undistortion; no images_4 -> cache
}


@pytest.mark.skipif(not REAL_DATA.is_dir(), reason=f"real datasets not found at {REAL_DATA}")
@pytest.mark.parametrize("name", sorted(REAL))
def test_real_dataset(name, tmp_path):
    count, sizes, prebuilt = REAL[name]
    data_dir = REAL_DATA / name
    scene = load_scene(data_dir, data_factor=4)
    rec = pycolmap.Reconstruction(str(data_dir / "sparse" / "0"))
    assert len(scene.cameras) == count and len(scene.points) == rec.num_points3D()
    file_sizes = {(c.dist.src_width, c.dist.src_height) if c.dist else (c.width, c.height) for c in scene.cameras}
    assert file_sizes == sizes
    assert all((c.image_path.parent == data_dir / "images_4") == prebuilt for c in scene.cameras)
    assert np.isfinite(scene.scene_scale) and 0.5 < scene.scene_scale < 5
    centres = np.stack([c.camtoworld[:3, 3] for c in scene.cameras])
    assert np.linalg.norm(centres.mean(0)) < scene.scene_scale  # cameras around the scene centre
    assert np.mean(centres[:, 2] > np.median(scene.points[:, 2])) > 0.9  # z up: cameras above

    by_name = {im.name: im for im in rec.images.values()}
    for index in (0, count // 2, count - 1):
        camera = scene.cameras[index]
        image, colmap_camera = by_name[camera.name], rec.cameras[by_name[camera.name].camera_id]
        src_w = camera.dist.src_width if camera.dist else camera.width
        ratio = src_w / colmap_camera.width
        if not camera.dist:
            expected = colmap_camera.calibration_matrix()[:2] * ratio
            np.testing.assert_allclose(camera.K[:2], expected, rtol=1e-5)
        # SfM observations of this image, at the loaded resolution, undistorted like the image.
        observed = [(p.xy, rec.points3D[p.point3D_id].xyz) for p in image.points2D if p.has_point3D()]
        xy = np.array([o[0] for o in observed]) * ratio  # [M, 2]
        if camera.dist:
            K_cv, K_new_cv = camera.dist.K_distorted.copy(), camera.dist.K.copy()
            K_cv[:2, 2] -= 0.5
            K_new_cv[:2, 2] -= 0.5
            xy = cv2.undistortPoints(xy[:, None] - 0.5, K_cv, camera.dist.coeffs, P=K_new_cv)[:, 0] + 0.5
        world = transform_points(scene.transform.astype(np.float64), np.array([o[1] for o in observed]))
        uv, depth = project(camera, world)
        assert np.all(depth > 0)
        assert np.median(np.linalg.norm(uv - xy, axis=1)) < 0.5, "pose / K / transform disagree with SfM"
        uv_all, depth_all = project(camera, scene.points.astype(np.float64))
        inside = (depth_all > 0) & (uv_all >= 0).all(1) & (uv_all < [camera.width, camera.height]).all(1)
        assert inside.mean() > 0.5, "most SfM points should land inside the image"
        assert load_image(scene, index).shape == (camera.height, camera.width, 3)
