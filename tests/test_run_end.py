"""The end of a run: the model (checkpoint, PLY) and metrics first, then the optional outputs
(test renders, trajectory video), whose failure is one warning line; a video of any image size."""

import json
import shutil
from pathlib import Path

import cv2
import imageio.v2 as imageio
import numpy as np
import pytest

from splat_train.trainer import evaluate
from splat_train.trainer.cli import main
from splat_train.trainer.evaluate import even_size, write_video

REAL_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
TINY = [
    "default",
    "--synthetic_image_size",
    "32",
    "--synthetic_num_cameras",
    "8",
    "--synthetic_num_gaussians",
    "150",
    "--num_traj_frames",
    "3",
    "--sh_degree",
    "1",
    "--device",
    "cpu",
]


@pytest.mark.parametrize("height, width", [(268, 477), (149, 199), (31, 41)])
def test_video_of_any_size_is_written_whole(tmp_path, height, width):
    y, x = np.mgrid[:height, :width]
    frames = [np.stack([x / width, y / height, np.full(x.shape, k / 4)], -1).astype(np.float32) for k in range(4)]
    path = write_video(tmp_path / "videos" / "traj.mp4", frames)
    assert [p.name for p in path.parent.iterdir()] == ["traj.mp4"]  # no temporary file left
    reader = imageio.get_reader(path)
    first = reader.get_data(0)
    assert reader.count_frames() == 4 and first.shape == (height + height % 2, width + width % 2, 3)
    # the padding repeats the last column / row: every pixel of the frame is in the video
    np.testing.assert_array_equal(even_size(frames[0])[:height, :width], frames[0])
    # lossy, but the same picture: not stretched (imageio's default macro_block_size resizes to 16s)
    assert np.abs(first[:height, :width] / 255.0 - frames[0]).mean() < 0.02


def test_a_failed_encode_leaves_no_file(tmp_path, monkeypatch):
    import imageio_ffmpeg

    def broken(*args, **kwargs):
        raise OSError("[Errno 32] Broken pipe")

    monkeypatch.setattr(imageio_ffmpeg, "write_frames", broken)
    with pytest.raises(OSError):
        write_video(tmp_path / "v.mp4", [np.zeros((4, 4, 3), np.float32)])
    assert list(tmp_path.iterdir()) == []


def test_failing_optional_outputs_warn_once_and_the_run_keeps_its_model(tmp_path, monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise OSError("[Errno 28] No space left on device\nmore detail")

    monkeypatch.setattr(evaluate, "write_video", broken)
    monkeypatch.setattr(evaluate, "_write_png", broken)
    out = tmp_path / "run"
    assert main([*TINY, "--max_steps", "3", "--result_dir", str(out)]) == 0
    for rel in ("ckpts/ckpt_3_rank0.pt", "ply/point_cloud_3.ply", "stats/val_step3.json"):
        assert (out / rel).is_file(), rel
    assert not (out / "videos").exists() or not list((out / "videos").iterdir())
    printed = capsys.readouterr().out.splitlines()
    warnings = [line for line in printed if line.startswith("warning:")]
    assert len(warnings) == 2, printed  # the renders and the video, one line each
    assert "video" in warnings[1] and "No space left on device" in warnings[1] and "more detail" not in warnings[1]
    outputs = [line for line in printed if line.startswith("outputs: ")]
    assert len(outputs) == 1 and "ply/point_cloud_3.ply" in outputs[0] and "traj_3.mp4" not in outputs[0]


def test_ckpt_run_writes_ply_and_metrics_before_a_failing_video(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    assert main([*TINY, "--max_steps", "2", "--num_traj_frames", "0", "--result_dir", str(out)]) == 0

    def broken(*args, **kwargs):
        raise RuntimeError("encoder refused the frames")

    monkeypatch.setattr(evaluate, "write_video", broken)
    ev = tmp_path / "eval"
    capsys.readouterr()
    assert main([*TINY, "--ckpt", str(out / "ckpts/ckpt_2_rank0.pt"), "--result_dir", str(ev)]) == 0
    assert (ev / "ply/point_cloud_2.ply").is_file() and (ev / "stats/val_step2.json").is_file()
    printed = capsys.readouterr().out
    assert "loaded step 2 (world size 1) from" in printed and "encoder refused the frames" in printed


@pytest.mark.skipif(not (REAL_DATA / "cup").is_dir(), reason=f"real dataset cup not found under {REAL_DATA}")
def test_odd_size_real_capture_trains_and_writes_ply_and_video(tmp_path):
    """cup's images_4/ cropped by one pixel column (200x150 -> 199x150, which --data_factor 4 reads
    as is): libx264 refuses odd sizes, so the video used to fail and take the PLY with it."""
    data = tmp_path / "cup"
    shutil.copytree(REAL_DATA / "cup" / "sparse", data / "sparse")
    (data / "images_4").mkdir()
    for src in sorted((REAL_DATA / "cup" / "images_4").iterdir()):
        image = cv2.imread(str(src), cv2.IMREAD_UNCHANGED)
        cv2.imwrite(str(data / "images_4" / src.name), image[:, :-1])
    out = tmp_path / "run"
    assert (
        main(
            [
                "default",
                "--data_dir",
                str(data),
                "--data_factor",
                "4",
                "--device",
                "cpu",
                "--max_steps",
                "2",
                "--test_every",
                "40",
                "--num_traj_frames",
                "2",
                "--result_dir",
                str(out),
            ]
        )
        == 0
    )
    assert (out / "ckpts/ckpt_2_rank0.pt").is_file() and (out / "ply/point_cloud_2.ply").stat().st_size > 0
    assert json.loads((out / "stats/val_step2.json").read_text())["num_views"] == 2
    assert [p.name for p in (out / "videos").iterdir()] == ["traj_2.mp4"]
    assert imageio.get_reader(out / "videos/traj_2.mp4").get_data(0).shape == (150, 200, 3)


def test_test_renders_are_lossless_rgb_pngs(tmp_path):
    """The side-by-side test renders read back as the float image rounded to 8 bits, channels in
    RGB order (OpenCV encodes BGR), and no temporary file is left beside them."""
    rng = np.random.default_rng(0)
    image = rng.random((5, 7, 3)).astype(np.float32)
    image[0, 0] = (1.0, 0.0, 0.0)  # pure red: a swapped channel order would read back blue
    evaluate._write_pngs(tmp_path / "renders", 12, [("cams/IMG_1.jpg", image)])
    path = tmp_path / "renders" / "val_step12_IMG_1.png"
    back = cv2.cvtColor(cv2.imread(str(path), cv2.IMREAD_UNCHANGED), cv2.COLOR_BGR2RGB)
    assert back.dtype == np.uint8 and back[0, 0].tolist() == [255, 0, 0]
    assert np.array_equal(back, (image * 255.0 + 0.5).astype(np.uint8))
    assert sorted(p.name for p in (tmp_path / "renders").iterdir()) == ["val_step12_IMG_1.png"]
