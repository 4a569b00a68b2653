"""End to end through the ``splat-train`` entry point on the embedded synthetic scene (CPU)."""

import json

import numpy as np
import pytest
import torch

from scenes import add_posed_image
from splat_train.trainer.cli import main
from splat_train.trainer.export import load_ply

TINY = [
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
    "--sh_degree_interval",
    "10",
]
DENSIFY = [
    "--refine_start_iter",
    "4",
    "--refine_every",
    "5",
    "--reset_every",
    "12",
    "--refine_stop_iter",
    "100",
    "--grow_grad2d",
    "0.00005",
]


def run(*args) -> int:
    return main(["default", *TINY, *args])


def test_main_job_writes_every_output(tmp_path):
    out = tmp_path / "run"
    assert run("--max_steps", "20", "--eval_steps", "10", "--result_dir", str(out)) == 0
    for rel in [
        "cfg.yml",
        "ckpts/ckpt_20_rank0.pt",
        "ply/point_cloud_20.ply",
        "stats/val_step10.json",
        "stats/val_step20.json",
        "stats/train_step20_rank0.json",
        "videos/traj_20.mp4",
    ]:
        assert (out / rel).is_file(), rel
    assert list((out / "renders").glob("val_step20_*.png"))
    val = json.loads((out / "stats/val_step20.json").read_text())
    assert np.isfinite(val["psnr"]) and 0 < val["ssim"] <= 1 and val["num_views"] == 1
    assert val["lpips"] is None and val["lpips_unavailable_reason"]
    # the PLY round-trips to the model's tensors exactly
    ply = load_ply(out / "ply/point_cloud_20.ply")
    params = torch.load(out / "ckpts/ckpt_20_rank0.pt", weights_only=False)["params"]
    for k in ("means", "scales", "quats", "opacities", "sh0", "shN"):
        assert torch.equal(ply[k], params[k]), k


def _final_params(result_dir, step):
    return torch.load(result_dir / "ckpts" / f"ckpt_{step}_rank0.pt", weights_only=False)


def test_resume_continues_exactly(tmp_path, capsys):
    """N steps straight == N/2 steps + --resume + N/2 steps (densification and random
    backgrounds in between, so parameters, Adam, strategy state and RNG must all round-trip)."""
    common = [*DENSIFY, "--random_bkgd", "--max_steps", "24", "--eval_steps", "24", "--ply_steps", "24"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert run(*common, "--save_steps", "24", "--result_dir", str(straight)) == 0
    # the interrupted run: the same schedule, with a checkpoint at 12; deleting the later one
    # leaves what an interruption after step 12 leaves
    assert run(*common, "--save_steps", "12", "24", "--result_dir", str(resumed)) == 0
    (resumed / "ckpts" / "ckpt_24_rank0.pt").unlink()  # keep only the half-way checkpoint
    capsys.readouterr()
    assert run(*common, "--save_steps", "12", "24", "--result_dir", str(resumed), "--resume") == 0
    printed = capsys.readouterr().out
    assert f"resumed from step 12 (world size 1) from {resumed / 'ckpts'}" in printed
    a, b = _final_params(straight, 24), _final_params(resumed, 24)
    assert a["params"]["means"].shape[0] != 150  # densification really happened
    for k in a["params"]:
        assert torch.allclose(a["params"][k], b["params"][k], rtol=1e-6, atol=1e-7), k
    for k in ("grad2d", "count"):
        assert torch.allclose(a["strategy_state"][k], b["strategy_state"][k], rtol=1e-6, atol=1e-7)


def test_resume_says_when_the_step_changes(tmp_path, capsys):
    """A checkpoint records the step its run took (--raster auto resolved); a resume that takes the
    other one (another loss) says so in one line, and the new checkpoints record the new step."""
    out = tmp_path / "run"
    common = ["--max_steps", "4", "--save_steps", "2", "4", "--test_every", "0", "--result_dir", str(out)]
    assert run(*common, "--raster", "fused") == 0
    assert _final_params(out, 4)["raster"] == "fused"
    (out / "ckpts" / "ckpt_4_rank0.pt").unlink()
    capsys.readouterr()
    assert run(*common, "--resume") == 0  # --raster auto: the unfused step on the CPU
    err = capsys.readouterr().err
    said = [ln for ln in err.splitlines() if ln.startswith("warning: --resume: steps 1-2 took the fused step")]
    assert len(said) == 1 and "the rest take the unfused step" in said[0], err
    assert _final_params(out, 4)["raster"] == "unfused"
    capsys.readouterr()
    (out / "ckpts" / "ckpt_4_rank0.pt").unlink()
    assert run(*common, "--resume", "--raster", "fused") == 0  # step 2's checkpoint took this step: no line
    assert "--resume: steps" not in capsys.readouterr().err


def test_random_tile_shift_says_when_nothing_is_shifted(tmp_path, capsys):
    """--random_tile_shift with --raster auto on the CPU (the unfused step): one warning line, and
    the run trains unshifted."""
    assert run("--max_steps", "2", "--random_tile_shift", "--result_dir", str(tmp_path / "r")) == 0
    printed = capsys.readouterr()
    warned = [ln for ln in printed.err.splitlines() if ln.startswith("warning: --random_tile_shift")]
    assert len(warned) == 1 and "the images are not shifted" in warned[0]
    assert "unfused rasterization" in printed.out
    assert json.loads((tmp_path / "r/stats/train_step2_rank0.json").read_text())["raster"] == "unfused"


def test_ckpt_evaluates_without_training(tmp_path):
    out = tmp_path / "run"
    assert run("--max_steps", "6", "--result_dir", str(out)) == 0
    ev = tmp_path / "eval"
    assert run("--ckpt", str(out / "ckpts/ckpt_6_rank0.pt"), "--result_dir", str(ev)) == 0
    assert (ev / "stats/val_step6.json").is_file() and (ev / "ply/point_cloud_6.ply").is_file()
    assert not (ev / "ckpts").exists()
    a = json.loads((out / "stats/val_step6.json").read_text())
    b = json.loads((ev / "stats/val_step6.json").read_text())
    assert a["psnr"] == pytest.approx(b["psnr"], rel=1e-6)


def test_config_file_reruns_exactly(tmp_path):
    out = tmp_path / "a"
    assert run("--max_steps", "5", "--steps_scaler", "2", "--result_dir", str(out)) == 0
    assert (out / "ckpts/ckpt_10_rank0.pt").is_file()  # 5 x 2 steps
    again = tmp_path / "b"
    assert main(["--config", str(out / "cfg.yml"), "--result_dir", str(again)]) == 0
    a, b = _final_params(out, 10), _final_params(again, 10)
    for k in a["params"]:
        assert torch.equal(a["params"][k], b["params"][k]), k


def test_config_of_a_resumed_run_reruns_into_a_new_folder(tmp_path, capsys):
    """cfg.yml records --resume / --overwrite; rerunning it starts a new run (docs/outputs.md),
    and the run's own folder is refused, naming --resume and --overwrite."""
    out = tmp_path / "a"
    assert run("--max_steps", "2", "--num_traj_frames", "0", "--result_dir", str(out)) == 0
    assert run("--max_steps", "4", "--num_traj_frames", "0", "--result_dir", str(out), "--resume") == 0
    again = tmp_path / "b"
    assert main(["--config", str(out / "cfg.yml"), "--result_dir", str(again)]) == 0
    assert (again / "ckpts/ckpt_4_rank0.pt").is_file() and not (again / "ckpts/ckpt_2_rank0.pt").exists()
    capsys.readouterr()
    assert main(["--config", str(out / "cfg.yml")]) == 2
    line = _one_error_line(capsys)
    assert str(out) in line and "--resume" in line and "--overwrite" in line
    assert main(["--config", str(again / "cfg.yml"), "--resume", "--max_steps", "6"]) == 0
    assert (again / "ckpts/ckpt_6_rank0.pt").is_file()


def test_occupied_result_dir_is_refused_and_untouched(tmp_path, capsys):
    out = tmp_path / "run"
    assert run("--max_steps", "3", "--result_dir", str(out)) == 0
    ckpt = out / "ckpts/ckpt_3_rank0.pt"
    before = ckpt.read_bytes()
    assert run("--max_steps", "3", "--result_dir", str(out)) == 2
    assert "already holds another run's checkpoints" in capsys.readouterr().err
    assert ckpt.read_bytes() == before
    # --overwrite starts afresh, moving the old run aside (nothing deleted)
    assert run("--max_steps", "3", "--result_dir", str(out), "--overwrite") == 0
    aside = list(out.glob("superseded_*/ckpts/ckpt_3_rank0.pt"))
    assert len(aside) == 1 and aside[0].read_bytes() == before


def test_missing_data_dir_is_one_clear_error(tmp_path, capsys):
    missing = tmp_path / "nope"
    assert main(["default", "--data_dir", str(missing), "--result_dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(missing) in err[0] and err[0].startswith("error:")
    assert not (tmp_path / "r").exists()


def test_fused_raster_needs_no_triton(tmp_path, no_triton):
    """The fused rasterizer is native code (its CPU path the PyTorch reference): Triton missing is no
    reason to refuse --raster fused."""
    out = tmp_path / "fused"
    assert run("--max_steps", "2", "--raster", "fused", "--test_every", "0", "--result_dir", str(out)) == 0


def test_colmap_without_points_suggests_random_init(tmp_path, capsys):
    pycolmap = pytest.importorskip("pycolmap")
    import imageio.v3 as iio

    data = tmp_path / "scene"
    (data / "images").mkdir(parents=True)
    (data / "sparse" / "0").mkdir(parents=True)
    rec = pycolmap.Reconstruction()
    for i in range(3):
        camera = pycolmap.Camera(model="PINHOLE", width=32, height=24, params=[30.0, 30.0, 16.0, 12.0], camera_id=i + 1)
        name = f"im{i}.png"
        iio.imwrite(data / "images" / name, np.full((24, 32, 3), 100, np.uint8))
        w2c = np.eye(4)[:3, :4]
        w2c[:, 3] = [0.1 * i, 0.0, 2.0]
        add_posed_image(rec, camera, pycolmap.Image(name=name, camera_id=i + 1, image_id=i + 1), pycolmap.Rigid3d(w2c))
    rec.write(str(data / "sparse" / "0"))
    rc = main(
        [
            "default",
            "--data_dir",
            str(data),
            "--data_factor",
            "1",
            "--max_steps",
            "2",
            "--result_dir",
            str(tmp_path / "r"),
        ]
    )
    assert rc == 2
    err = capsys.readouterr().err
    assert "--init_type random" in err and str(data) in err
    rc = main(
        [
            "default",
            "--data_dir",
            str(data),
            "--data_factor",
            "1",
            "--max_steps",
            "2",
            "--init_type",
            "random",
            "--init_num_pts",
            "50",
            "--test_every",
            "0",
            "--num_traj_frames",
            "0",
            "--result_dir",
            str(tmp_path / "r2"),
        ]
    )
    assert rc == 0


def test_mcmc_on_cpu_is_one_clear_error(tmp_path, capsys):
    assert main(["mcmc", *TINY, "--max_steps", "2", "--device", "cpu", "--result_dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "mcmc" in err and "GPU" in err


def test_gsplat_dist_on_cpu_is_one_clear_error(tmp_path, capsys):
    """gsplat's distributed rasterization is CUDA only: a clear error, not a crash in step 1."""
    assert (
        main(
            [
                "default",
                *TINY,
                "--pipeline",
                "gsplat-dist",
                "--device",
                "cpu",
                "--max_steps",
                "2",
                "--result_dir",
                str(tmp_path / "r"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "gsplat-dist" in err[0] and "GPU" in err[0]


def test_gsplat_dist_with_uneven_batches_on_two_ranks_is_one_clear_error(tmp_path, capfd):
    """7 training views in batches of 3: the ranks would hand gsplat's exchange different camera
    counts at some steps; the trainer refuses before training (checked before the GPU check)."""
    assert (
        main(
            [
                "default",
                *TINY,
                "--pipeline",
                "gsplat-dist",
                "--nproc_per_node",
                "2",
                "--device",
                "cpu",
                "--batch_size",
                "3",
                "--max_steps",
                "2",
                "--result_dir",
                str(tmp_path / "r"),
            ]
        )
        == 2
    )
    err = capfd.readouterr().err  # the spawned ranks write to the process's stderr
    assert "--pipeline gsplat-dist with 2 ranks" in err and "--batch_size 3" in err


@pytest.mark.parametrize("extra", [[], ["--absgrad", "--grow_grad2d", "0.0002", *DENSIFY]])
def test_fused_raster_trains_end_to_end(tmp_path, extra):
    out = tmp_path / "fused"
    assert run("--max_steps", "6", "--raster", "fused", "--packed", *extra, "--result_dir", str(out)) == 0
    assert (out / "ply/point_cloud_6.ply").is_file()
    val = json.loads((out / "stats/val_step6.json").read_text())
    assert np.isfinite(val["psnr"])


def test_bare_command_prints_usage_and_fails_but_help_succeeds(capsys):
    """`splat-train` alone trains nothing: the usage goes to stderr with exit 2; --help exits 0."""
    with pytest.raises(SystemExit) as bare:
        main([])
    out, err = capsys.readouterr()
    assert bare.value.code == 2 and out == "" and err.startswith("usage: splat-train PRESET")
    with pytest.raises(SystemExit) as helped:
        main(["--help"])
    out, err = capsys.readouterr()
    assert helped.value.code == 0 and out.startswith("usage: splat-train PRESET") and err == ""


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:"), err
    return err[0]


def test_unreadable_checkpoints_are_one_error_line_naming_the_file(tmp_path, capsys):
    out = tmp_path / "run"
    assert run("--max_steps", "2", "--num_traj_frames", "0", "--result_dir", str(out)) == 0
    ckpt = out / "ckpts/ckpt_2_rank0.pt"
    whole = ckpt.read_bytes()
    ckpt.write_bytes(whole[: len(whole) // 2])  # truncated, as by a full disk or a killed copy
    capsys.readouterr()
    assert run("--max_steps", "4", "--result_dir", str(out), "--resume") == 2
    line = _one_error_line(capsys)
    assert str(ckpt) in line and "truncated" in line
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint\n" * 100)
    assert run("--ckpt", str(garbage), "--result_dir", str(tmp_path / "ev")) == 2
    assert str(garbage) in _one_error_line(capsys) and not (tmp_path / "ev").exists()


def test_a_checkpoint_archive_torch_cannot_load_is_named(tmp_path):
    """The cheap archive check passes (a complete zip file); torch.load then fails: still one line."""
    import zipfile

    from splat_train.trainer.checkpoint import load_shard

    path = tmp_path / "ckpt_3_rank0.pt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("notes.txt", "a zip, but no data.pkl")
    with pytest.raises(ValueError) as e:
        load_shard([path], rank=0, world_size=1)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_folder_of_a_run_stopped_before_its_first_checkpoint_is_not_mixed_into(tmp_path, capsys):
    out = tmp_path / "run"  # what a run killed before its first checkpoint leaves
    (out / "tb").mkdir(parents=True)
    (out / "tb" / "events.out.tfevents.old").write_text("old events")
    (out / "stats").mkdir()
    (out / "cfg.yml").write_text("max_steps: 30000\n")
    assert run("--max_steps", "2", "--num_traj_frames", "0", "--result_dir", str(out)) == 2
    line = _one_error_line(capsys)
    assert str(out) in line and "no checkpoint" in line and "--overwrite" in line and "tb/" in line
    assert (out / "cfg.yml").read_text() == "max_steps: 30000\n" and not (out / "ckpts").exists()
    # --overwrite moves the old outputs aside (nothing deleted); the new TensorBoard folder is the new run's
    assert run("--max_steps", "2", "--num_traj_frames", "0", "--result_dir", str(out), "--overwrite") == 0
    aside = list(out.glob("superseded_*"))
    assert len(aside) == 1 and (aside[0] / "tb/events.out.tfevents.old").read_text() == "old events"
    assert (aside[0] / "cfg.yml").read_text() == "max_steps: 30000\n"
    assert [p.name for p in (out / "tb").iterdir() if "old" in p.name] == []
    # a folder that exists but holds no run's outputs is used as it is
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("mine")
    assert run("--max_steps", "2", "--num_traj_frames", "0", "--result_dir", str(empty)) == 0
    assert (empty / "notes.txt").read_text() == "mine" and (empty / "ckpts/ckpt_2_rank0.pt").is_file()


def test_a_run_says_what_it_loads_and_writes_and_the_lpips_note_once(tmp_path, capsys):
    out = tmp_path / "run"
    assert run("--max_steps", "4", "--eval_steps", "0", "2", "--result_dir", str(out)) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("memory: the first step needs about ")
    assert "GiB runtime and scene, measured, + 0.0 GiB for the step) of the " in printed[0]  # a tiny step
    assert printed[1] == "images: 8 views (7 train, 1 test), 32x32, rendered (synthetic scene), 0.0 MB in memory"
    evaluations = [line for line in printed if line.startswith("step ")]
    assert [line.split(":")[0] for line in evaluations] == ["step 0", "step 2", "step 4"]
    assert sum("LPIPS unavailable" in line for line in printed) == 1  # once per run, not per evaluation
    assert not any("LPIPS" in line for line in evaluations)
    outputs = printed[-1]
    assert outputs.startswith("outputs: ") and f"{out}/ckpts/ckpt_4_rank0.pt" in outputs
    for rel in (
        "ply/point_cloud_4.ply",
        "stats/val_step4.json",
        "renders/val_step4_*.png (1 files)",
        "videos/traj_4.mp4",
        "tb/",
    ):
        assert f"{out}/{rel}" in outputs, rel


def test_help_into_a_reader_that_goes_away_ends_without_a_traceback():
    """`splat-train default --help | head -1`: the pipe closes under the help; no traceback."""
    import subprocess
    import sys

    code = "import sys; from splat_train.trainer.cli import main; sys.exit(main(['default', '--help']))"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b"usage: splat-train default")
    proc.stdout.close()  # the reader is gone before the rest of the help is written
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) in (0, 1)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


@pytest.mark.parametrize("flags", [["--compression", "png"], ["--app_embed_dim", "32"], ["--with_ut"]])
def test_gsplat_flags_this_trainer_lacks_are_unknown_flags(tmp_path, capsys, flags):
    """gsplat options with no counterpart here (docs/gsplat-flags.md) fail as any unknown flag:
    exit 2, the flag named, nothing written."""
    with pytest.raises(SystemExit) as stop:
        main(["default", *flags, "--result_dir", str(tmp_path / "r")])
    assert stop.value.code == 2
    assert flags[0] in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_the_train_loop_line_leaves_out_the_writes_between_steps(tmp_path, capsys, monkeypatch):
    """An evaluation and checkpoint between steps (here made 1.5 s slow) counts in the
    `excluded` seconds of the `train loop:` line, not in its training time or ms/step."""
    import re
    import time

    from splat_train.trainer import loop

    real = loop.Trainer.write_outputs

    def slow(self, step, **kw):
        if step == 2:
            time.sleep(1.5)
        return real(self, step, **kw)

    monkeypatch.setattr(loop.Trainer, "write_outputs", slow)
    start = time.perf_counter()
    assert (
        run("--max_steps", "4", "--eval_steps", "2", "--num_traj_frames", "0", "--result_dir", str(tmp_path / "r")) == 0
    )
    wall = time.perf_counter() - start
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("train loop: "))
    found = re.search(r"4 steps in ([0-9.]+) s \(([0-9.]+) ms/step, .*excluded: ([0-9.]+) s between steps\)", line)
    assert found, line
    training, ms, excluded = (float(g) for g in found.groups())
    assert excluded >= 1.5 and training + excluded <= wall + 0.1
    assert ms == pytest.approx(1000 * training / 4, abs=50)
