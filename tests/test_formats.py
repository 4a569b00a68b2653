"""The outputs other tools open: the Inria layout read back with the schema of the original 3DGS code,
the web formats of gsplat's exporter, and exports in the input data's frame."""

import json
import math
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest
import torch
from plyfile import PlyData
from scipy.spatial.transform import Rotation

from splat_train.trainer import formats
from splat_train.trainer.cli import main
from splat_train.trainer.data.images import Camera
from splat_train.trainer.data.normalize import transform_cameras, transform_points
from splat_train.trainer.export import load_ply, to_export_frame

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
TINY = [
    "--synthetic_image_size",
    "32",
    "--synthetic_num_cameras",
    "8",
    "--synthetic_num_gaussians",
    "150",
    "--num_traj_frames",
    "0",
    "--sh_degree",
    "1",
    "--sh_degree_interval",
    "5",
]


def _normalization(seed=4, scale=0.3) -> np.ndarray:
    """A similarity like Scene.transform: x_normalized = T @ x_input."""
    T = np.eye(4)
    T[:3, :3] = scale * Rotation.random(random_state=seed).as_matrix()
    T[:3, 3] = [0.4, -1.2, 2.0]
    return T


def _camera(i: int, camtoworld: np.ndarray) -> Camera:
    K = np.array([[50.0 + i, 0, 31.0], [0, 52.0 + i, 23.0], [0, 0, 1]], dtype=np.float32)
    return Camera(
        name=f"sub/img_{i:02d}.jpg",
        image_path=Path("unused"),
        camtoworld=camtoworld.astype(np.float32),
        K=K,
        width=64,
        height=48,
    )


def _inria_world_to_camera(entry: dict) -> np.ndarray:
    """What the Inria code rebuilds from a cameras.json entry (camera_to_JSON inverted): the
    rotation is camera-to-world, position the camera centre."""
    w2c = np.eye(4)
    R = np.asarray(entry["rotation"])
    w2c[:3, :3] = R.T
    w2c[:3, 3] = -R.T @ np.asarray(entry["position"])
    return w2c


def test_cameras_json_in_the_inria_schema_projects_the_exported_points_where_training_saw_them():
    T = _normalization()
    rng = np.random.default_rng(0)
    points_in = rng.normal(size=(40, 3))  # the input frame (COLMAP's)
    points_norm = transform_points(T, points_in)
    eyes = [np.array([3.0, 0.5, 1.0]), np.array([-2.0, 2.5, 0.5])]
    c2ws = []
    for eye in eyes:  # normalized-world cameras looking at the origin (OpenCV axes)
        fwd = -eye / np.linalg.norm(eye)
        right = np.cross(fwd, [0, 0, 1.0])
        right /= np.linalg.norm(right)
        c2w = np.eye(4)
        c2w[:3, :3] = np.stack([right, np.cross(fwd, right), fwd], axis=1)
        c2w[:3, 3] = eye
        c2ws.append(c2w)
    cameras = [_camera(i, c2w) for i, c2w in enumerate(c2ws)]
    entries = json.loads(json.dumps(formats.inria_cameras(cameras, np.linalg.inv(T))))
    for entry, cam, c2w in zip(entries, cameras, c2ws):
        assert set(entry) == {"id", "img_name", "width", "height", "position", "rotation", "fx", "fy"}
        assert entry["img_name"] == Path(cam.name).stem and (entry["width"], entry["height"]) == (64, 48)
        assert np.asarray(entry["rotation"]).shape == (3, 3) and len(entry["position"]) == 3
        assert (entry["fx"], entry["fy"]) == (float(cam.K[0, 0]), float(cam.K[1, 1]))

        def pixels(w2c, points):
            x = points @ w2c[:3, :3].T + w2c[:3, 3]
            return np.stack([entry["fx"] * x[:, 0] / x[:, 2], entry["fy"] * x[:, 1] / x[:, 2]], -1)

        trained = pixels(np.linalg.inv(c2w), points_norm)
        exported = pixels(_inria_world_to_camera(entry), points_in)
        np.testing.assert_allclose(exported, trained, atol=1e-4)
    assert [e["id"] for e in entries] == [0, 1]


def test_cfg_args_reads_back_as_the_inria_scripts_and_the_sibr_viewer_read_it(tmp_path):
    from splat_train.trainer.config import Config, DataConfig, ModelConfig

    cfg = Config(data=DataConfig(data_dir=tmp_path / "scene", data_factor=4), model=ModelConfig(sh_degree=2))
    text = formats.cfg_args_text(cfg, tmp_path / "out", width=480)
    args = eval(text, {"Namespace": Namespace})  # arguments/__init__.py get_combined_args
    for key in (
        "sh_degree",
        "source_path",
        "model_path",
        "images",
        "resolution",
        "white_background",
        "eval",
        "data_device",
    ):  # ModelParams' keys, which render.py's extract() reads
        assert hasattr(args, key), key
    assert args.sh_degree == 2 and args.resolution == 4 and args.eval is True
    assert args.source_path == str((tmp_path / "scene").resolve()) and Path(args.model_path).is_absolute()
    # the SIBR viewer reads the first line and takes the text after "name=" up to "," or ")"
    line = text.splitlines()[0]

    def sibr_value(name):
        start = line.index(name + "=") + len(name) + 1
        return line[start : min(i for i in (line.find(",", start), line.find(")", start)) if i >= 0)]

    assert sibr_value("source_path")[1:-1] == args.source_path
    assert int(sibr_value("sh_degree")) == 2 and "False" in sibr_value("white_background")
    assert (
        formats.cfg_args_text(Config(data=DataConfig(data_factor=3)), tmp_path, width=320).count("resolution=320") == 1
    )


def _splats(num, seed=0):
    g = torch.Generator().manual_seed(seed)
    return dict(
        means=torch.randn(num, 3, generator=g) * 3,
        scales=torch.randn(num, 3, generator=g) - 3,
        quats=torch.randn(num, 4, generator=g),
        opacities=torch.randn(num, generator=g) * 3,
        sh0=torch.randn(num, 1, 3, generator=g),
        shN=torch.randn(num, 3, 3, generator=g) * 0.2,
    )


def test_web_formats_hold_every_gaussian_where_it_is(tmp_path):
    params = _splats(700)
    splat = formats.write_web_format(tmp_path / "a.splat", params, "splat")
    assert splat.stat().st_size == 32 * 700  # antimatter15: 3 f32 position, 3 f32 scale, 4 u8 colour, 4 u8 rotation
    records = np.frombuffer(
        splat.read_bytes(), dtype=[("xyz", "<f4", 3), ("scale", "<f4", 3), ("rgba", "u1", 4), ("rot", "u1", 4)]
    )
    order = np.lexsort(records["xyz"].T)  # gsplat sorts the records (Morton order): compare as sets
    expected = params["means"].numpy()
    np.testing.assert_array_equal(records["xyz"][order], expected[np.lexsort(expected.T)])

    compressed = formats.write_web_format(tmp_path / "a.compressed.ply", params, "ply_compressed")
    ply = PlyData.read(str(compressed))
    kept = int((torch.sigmoid(params["opacities"]) > 1 / 255).sum())  # gsplat drops the invisible ones
    assert 0 < kept < 700
    assert ply["vertex"].count == kept and ply["sh"].count == kept and ply["chunk"].count == math.ceil(kept / 256)
    assert len(ply["sh"].properties) == 9  # f_rest_0..8 of SH degree 1
    # chunk bounds hold the kept means
    lo = np.stack([ply["chunk"][f"min_{a}"] for a in "xyz"], -1).min(0)
    hi = np.stack([ply["chunk"][f"max_{a}"] for a in "xyz"], -1).max(0)
    kept_means = params["means"][torch.sigmoid(params["opacities"]) > 1 / 255].numpy()
    np.testing.assert_allclose(lo, kept_means.min(0)) and np.testing.assert_allclose(hi, kept_means.max(0))
    with pytest.raises(ValueError, match="web format"):
        formats.write_web_format(tmp_path / "x", params, "spz")


def test_a_run_writes_the_formats_it_is_asked_for(tmp_path):
    out = tmp_path / "run"
    assert (
        main(
            [
                "default",
                *TINY,
                "--max_steps",
                "6",
                "--result_dir",
                str(out),
                "--export_formats",
                "ply",
                "inria",
                "splat",
                "ply_compressed",
            ]
        )
        == 0
    )
    ply = out / "ply" / "point_cloud_6.ply"
    inria = out / "point_cloud" / "iteration_6" / "point_cloud.ply"
    assert inria.read_bytes() == ply.read_bytes()
    num = load_ply(ply)["means"].shape[0]
    assert (out / "ply" / "point_cloud_6.splat").stat().st_size == 32 * num
    assert PlyData.read(str(out / "ply" / "point_cloud_6.compressed.ply"))["chunk"].count >= 1
    cameras = json.loads((out / "cameras.json").read_text())
    assert len(cameras) == 7 and cameras[0]["img_name"] == "synthetic_001"  # the training views (view 0 tests)
    assert eval((out / "cfg_args").read_text(), {"Namespace": Namespace}).sh_degree == 1

    plain = tmp_path / "plain"  # the default: the PLY and the Inria folder, no web formats
    assert main(["default", *TINY, "--max_steps", "2", "--result_dir", str(plain)]) == 0
    assert (plain / "point_cloud" / "iteration_2" / "point_cloud.ply").is_file()
    assert not list((plain / "ply").glob("*.splat")) and not list((plain / "ply").glob("*.compressed.ply"))


def test_a_failing_format_is_one_warning_and_the_run_succeeds(tmp_path, monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(formats, "write_web_format", broken)
    out = tmp_path / "run"
    assert (
        main(["default", *TINY, "--max_steps", "2", "--result_dir", str(out), "--export_formats", "ply", "splat"]) == 0
    )
    assert (out / "ply" / "point_cloud_2.ply").is_file()
    assert "warning: splat export" in capsys.readouterr().out


@pytest.mark.skipif(not (DATA / "juicebox" / "sparse").is_dir(), reason="needs ../shared/data/juicebox")
def test_juicebox_exports_line_up_with_the_colmap_points():
    """The SfM points as Gaussians, exported to the original frame, are COLMAP's own points."""
    import pycolmap

    from splat_train.trainer.data import load_scene

    scene = load_scene(DATA / "juicebox", data_factor=4)
    assert not np.allclose(scene.transform, np.eye(4))  # normalization did something
    n = len(scene.points)
    params = dict(
        means=torch.from_numpy(scene.points),
        scales=torch.zeros(n, 3),
        quats=torch.tensor([[1.0, 0, 0, 0]]).repeat(n, 1),
        opacities=torch.zeros(n),
        sh0=torch.zeros(n, 1, 3),
        shN=torch.zeros(n, 15, 3),
    )
    exported, to_frame = to_export_frame(params, scene.transform, "original")
    reconstruction = pycolmap.Reconstruction(str(DATA / "juicebox" / "sparse" / "0"))
    colmap_points = np.array([p.xyz for p in reconstruction.points3D.values()])
    np.testing.assert_allclose(exported["means"].numpy(), colmap_points, atol=1e-3 * np.abs(colmap_points).max())
    centre = transform_cameras(to_frame, scene.cameras[0].camtoworld[None].astype(np.float64))[0, :3, 3]
    image = next(im for im in reconstruction.images.values() if im.name == scene.cameras[0].name)
    pose = image.cam_from_world() if callable(image.cam_from_world) else image.cam_from_world
    np.testing.assert_allclose(centre, pose.inverse().translation, atol=1e-3)
    same, identity = to_export_frame(params, scene.transform, "normalized")
    assert same is params and np.array_equal(identity, np.eye(4))
