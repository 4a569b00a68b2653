"""Multi-rank runs through the CLI on CPU ranks (gloo): merged export, offline merge, evaluation
equal to one process's, resume with another world size, and mpirun equal to the spawned run."""

import json
import math
import os
import shutil
import subprocess
import sys

import pytest
import torch

from splat_train.scripts.export import main as export_main
from splat_train.scripts.merge_shards import main as merge_main
from splat_train.trainer.cli import main
from splat_train.trainer.export import load_ply

TINY = [
    "default",
    "--synthetic_image_size",
    "32",
    "--synthetic_num_cameras",
    "9",
    "--synthetic_num_gaussians",
    "101",
    "--num_traj_frames",
    "0",
    "--sh_degree",
    "1",
    "--refine_start_iter",
    "3",
    "--refine_every",
    "3",
    "--grow_grad2d",
    "0.00005",
    "--device",
    "cpu",
]


@pytest.fixture(scope="module")
def w2_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("w2") / "run"
    assert (
        main([*TINY, "--max_steps", "8", "--save_steps", "4", "8", "--nproc_per_node", "2", "--result_dir", str(out)])
        == 0
    )
    return out


def test_two_ranks_write_shards_stats_and_merged_ply(w2_run):
    for r in range(2):
        assert (w2_run / f"ckpts/ckpt_8_rank{r}.pt").is_file()
        stats = json.loads((w2_run / f"stats/train_step8_rank{r}.json").read_text())
        assert stats["world_size"] == 2 and stats["num_gaussians"] > 0
        calls = stats["comm_per_step"]["calls"]
        assert calls["forward/all_to_all"] == 1.0 and calls["backward/all_to_all"] == 1.0  # one each way per step
        assert "forward/all_reduce" not in calls and "backward/all_reduce" not in calls
        assert stats["comm_per_step"]["bytes_sent"]["backward/all_to_all"] > 0
    ply = load_ply(w2_run / "ply/point_cloud_8_distributed_merged.ply")
    shards = [torch.load(w2_run / f"ckpts/ckpt_8_rank{r}.pt", weights_only=False)["params"] for r in range(2)]
    assert torch.equal(ply["means"], torch.cat([s["means"] for s in shards]))  # rank order, deterministic


def test_offline_merge_equals_trainer_export(w2_run, tmp_path):
    out = tmp_path / "m.ply"
    assert merge_main([str(w2_run), "--step", "8", "--out", str(out)]) == 0
    a, b = load_ply(out), load_ply(w2_run / "ply/point_cloud_8_distributed_merged.ply")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert merge_main([str(tmp_path / "nothing")]) == 2


def test_offline_export_of_two_shards_writes_every_format_in_the_recorded_frame(w2_run, tmp_path, capsys):
    out = tmp_path / "x"
    assert export_main([str(w2_run), "--format", "ply", "inria", "splat", "ply_compressed", "--out", str(out)]) == 0
    ply = out / "ply/point_cloud_8_distributed_merged.ply"
    a, b = load_ply(ply), load_ply(w2_run / "ply/point_cloud_8_distributed_merged.ply")
    assert all(torch.equal(a[k], b[k]) for k in a)  # the trainer's own export, from the shards
    assert (out / "point_cloud/iteration_8/point_cloud.ply").read_bytes() == ply.read_bytes()
    assert (out / "ply/point_cloud_8_distributed_merged.splat").stat().st_size == 32 * a["means"].shape[0]
    assert (out / "ply/point_cloud_8_distributed_merged.compressed.ply").is_file()
    assert len(json.loads((out / "cameras.json").read_text())) == 7  # 9 views, 0 and 8 test
    # a checkpoint that records another world transform is exported in that frame
    moved = tmp_path / "moved"
    shutil.copytree(w2_run / "ckpts", moved / "ckpts")
    for r in range(2):
        state = torch.load(moved / f"ckpts/ckpt_8_rank{r}.pt", weights_only=False)
        state["world_transform"] = torch.diag(torch.tensor([2.0, 2.0, 2.0, 1.0], dtype=torch.float64))
        torch.save(state, moved / f"ckpts/ckpt_8_rank{r}.pt")
    assert export_main([str(moved)]) == 0
    c = load_ply(moved / "ply/point_cloud_8_distributed_merged.ply")
    assert torch.allclose(c["means"], b["means"] / 2) and torch.allclose(c["scales"], b["scales"] - math.log(2))
    assert export_main([str(moved), "--frame", "normalized"]) == 0
    assert torch.equal(load_ply(moved / "ply/point_cloud_8_distributed_merged.ply")["means"], b["means"])
    for r in range(2):  # a checkpoint from before the transform was recorded: the scene is loaded again
        state = torch.load(moved / f"ckpts/ckpt_8_rank{r}.pt", weights_only=False)
        del state["world_transform"]
        torch.save(state, moved / f"ckpts/ckpt_8_rank{r}.pt")
    assert export_main([str(moved), "--frame", "original"]) == 0
    assert torch.equal(load_ply(moved / "ply/point_cloud_8_distributed_merged.ply")["means"], b["means"])
    capsys.readouterr()
    assert export_main([str(tmp_path / "nothing")]) == 2
    assert capsys.readouterr().err.startswith("error: no complete set of checkpoints")


def test_distributed_eval_equals_one_process_eval_of_merged_model(w2_run, tmp_path):
    files = [str(w2_run / f"ckpts/ckpt_8_rank{r}.pt") for r in range(2)]
    assert main([*TINY, "--ckpt", *files, "--result_dir", str(tmp_path / "ev")]) == 0
    a = json.loads((w2_run / "stats/val_step8.json").read_text())
    b = json.loads((tmp_path / "ev/stats/val_step8.json").read_text())
    assert a["num_gaussians"] == b["num_gaussians"]
    assert a["num_views"] == b["num_views"] == 2  # views 0 and 8: one per rank
    assert abs(a["psnr"] - b["psnr"]) <= 1e-4 and abs(a["ssim"] - b["ssim"]) <= 1e-5


def test_resume_with_another_world_size_reshards(w2_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(w2_run, run)
    for r in range(2):
        (run / f"ckpts/ckpt_8_rank{r}.pt").unlink()  # continue from step 4
    assert main([*TINY, "--max_steps", "8", "--save_steps", "4", "8", "--result_dir", str(run), "--resume"]) == 0
    assert "resumed from step 4 (world size 2 -> 1, Gaussians re-sharded)" in capsys.readouterr().out
    one = torch.load(run / "ckpts/ckpt_8_rank0.pt", weights_only=False)
    assert one["world_size"] == 1
    four = [torch.load(w2_run / f"ckpts/ckpt_4_rank{r}.pt", weights_only=False) for r in range(2)]
    n4 = sum(s["params"]["means"].shape[0] for s in four)
    assert one["params"]["means"].shape[0] >= n4 * 0.5  # the whole scene continued on one rank


def test_resume_of_pose_and_appearance_modules_across_world_sizes(tmp_path):
    """--pose_opt / --app_opt modules are DDP-wrapped with two ranks: their checkpoint keys must
    not depend on that, so a two-rank run resumes on one rank (and the state is carried over)."""
    run = tmp_path / "run"
    flags = [*TINY, "--pose_opt", "--app_opt", "--save_steps", "2", "4", "--result_dir", str(run)]
    assert main([*flags, "--max_steps", "4", "--nproc_per_node", "2"]) == 0
    saved = torch.load(run / "ckpts/ckpt_2_rank0.pt", weights_only=False)["aux"]
    assert saved and not any(k.startswith("module.") for m in saved.values() for k in m)
    for r in range(2):
        (run / f"ckpts/ckpt_4_rank{r}.pt").unlink()  # continue from step 2
    assert main([*flags, "--max_steps", "4", "--resume"]) == 0
    resumed = torch.load(run / "ckpts/ckpt_4_rank0.pt", weights_only=False)
    assert resumed["world_size"] == 1 and set(resumed["aux"]) == set(saved)


MPI_RUN = [sys.executable, "-m", "splat_train.trainer.cli", *TINY, "--max_steps", "5"]


@pytest.mark.skipif(
    shutil.which("mpirun") is None, reason="OpenMPI's mpirun is not installed (.ci/run installs openmpi-bin)"
)
def test_mpirun_equals_spawned_run(tmp_path):
    spawned = tmp_path / "spawned"
    assert main([*TINY, "--max_steps", "5", "--nproc_per_node", "2", "--result_dir", str(spawned)]) == 0
    mpi = tmp_path / "mpi"
    from splat_train.trainer.launch import free_port

    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    cmd = [
        "mpirun",
        "--allow-run-as-root",
        "--oversubscribe",
        "-np",
        "2",
        "-x",
        "MASTER_ADDR",
        "-x",
        "MASTER_PORT",
        "-x",
        "PATH",
        *MPI_RUN,
        "--result_dir",
        str(mpi),
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    a = load_ply(spawned / "ply/point_cloud_5_distributed_merged.ply")
    b = load_ply(mpi / "ply/point_cloud_5_distributed_merged.ply")
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_load_shard_reshards_params_adam_and_strategy_state(w2_run):
    from splat_train.trainer.checkpoint import load_shard

    files = [w2_run / f"ckpts/ckpt_4_rank{r}.pt" for r in range(2)]
    saved = [torch.load(f, weights_only=False) for f in files]
    one = load_shard(files, rank=0, world_size=1)
    assert torch.equal(one["params"]["means"], torch.cat([s["params"]["means"] for s in saved]))
    moments = [s["optimizers"]["means"]["state"][0]["exp_avg"] for s in saved]
    assert torch.equal(one["optimizers"]["means"]["state"][0]["exp_avg"], torch.cat(moments))
    assert torch.equal(one["strategy_state"]["count"], torch.cat([s["strategy_state"]["count"] for s in saved]))
    three = [load_shard(files, rank=r, world_size=3) for r in range(3)]
    merged = torch.cat([s["params"]["sh0"] for s in saved])
    for r, state in enumerate(three):
        assert torch.equal(state["params"]["sh0"], merged[r::3])
        assert torch.equal(
            state["optimizers"]["sh0"]["state"][0]["exp_avg_sq"],
            torch.cat([s["optimizers"]["sh0"]["state"][0]["exp_avg_sq"] for s in saved])[r::3],
        )
    same = load_shard(files, rank=1, world_size=2)
    assert torch.equal(same["params"]["quats"], saved[1]["params"]["quats"])


def test_load_shard_refuses_an_incomplete_or_mixed_set(w2_run):
    """One shard of a two-rank run, or shards of two steps, would silently drop Gaussians."""
    from splat_train.trainer.checkpoint import load_shard

    with pytest.raises(ValueError, match="one file per rank"):
        load_shard([w2_run / "ckpts/ckpt_4_rank0.pt"], rank=0, world_size=1)
    with pytest.raises(ValueError, match="one file per rank"):
        load_shard([w2_run / "ckpts/ckpt_4_rank0.pt", w2_run / "ckpts/ckpt_8_rank1.pt"], rank=0, world_size=1)
    # rank order comes from the files' contents, not the order they are passed in
    files = [w2_run / f"ckpts/ckpt_4_rank{r}.pt" for r in (1, 0)]
    assert torch.equal(
        load_shard(files, rank=0, world_size=2)["params"]["means"],
        torch.load(files[1], weights_only=False)["params"]["means"],
    )
