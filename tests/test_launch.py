"""Launch environments: torchrun, OpenMPI, SLURM detection, errors, and failure propagation."""

import os
import shutil
import subprocess
import sys
import time

import pytest

from splat_train.trainer.launch import TIMED_OUT, DistContext, LaunchError, detect_external, launch, num_local_processes


def test_no_launcher_means_spawn():
    assert detect_external({}) is None
    assert detect_external({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}) is None  # a lone srun task


def test_torchrun_environment():
    env = dict(RANK="3", WORLD_SIZE="4", LOCAL_RANK="1", MASTER_ADDR="h0", MASTER_PORT="1234")
    assert detect_external(env) == dict(
        rank=3, world_size=4, local_rank=1, launcher="torchrun", master_addr="h0", master_port=1234
    )


def test_openmpi_environment():
    env = dict(
        OMPI_COMM_WORLD_SIZE="16",
        OMPI_COMM_WORLD_RANK="9",
        OMPI_COMM_WORLD_LOCAL_RANK="1",
        MASTER_ADDR="node0",
        MASTER_PORT="29500",
    )
    layout = detect_external(env)
    assert (layout["rank"], layout["world_size"], layout["local_rank"], layout["launcher"]) == (9, 16, 1, "mpirun")


def test_slurm_environment():
    env = dict(
        SLURM_PROCID="5", SLURM_NTASKS="8", SLURM_LOCALID="1", SLURM_STEP_ID="0", MASTER_ADDR="n", MASTER_PORT="1"
    )
    assert detect_external(env)["rank"] == 5 and detect_external(env)["launcher"] == "srun"


def test_srun_derives_the_rendezvous_from_the_job():
    """Under srun MASTER_ADDR is the step's first node and MASTER_PORT comes from the job id;
    SLURM_STEP_NUM_TASKS (the step's tasks) wins over the job's SLURM_NTASKS."""
    env = dict(
        SLURM_PROCID="3",
        SLURM_NTASKS="16",
        SLURM_STEP_NUM_TASKS="8",
        SLURM_LOCALID="3",
        SLURM_STEP_ID="0",
        SLURM_STEP_NODELIST="gpu[07-08],gpu11",
        SLURM_JOB_ID="123456",
    )
    layout = detect_external(env)
    assert (layout["rank"], layout["world_size"], layout["local_rank"]) == (3, 8, 3)
    assert layout["master_addr"] == "gpu07" and layout["master_port"] == 20000 + 123456 % 20000
    env.update(MASTER_ADDR="head", MASTER_PORT="29500")  # exported values win
    assert (detect_external(env)["master_addr"], detect_external(env)["master_port"]) == ("head", 29500)


def test_an_sbatch_script_without_srun_is_not_a_launch():
    """sbatch's own process sees SLURM_PROCID=0 and the job's SLURM_NTASKS but no step id: it is
    one process, which spawns the node's ranks itself (it used to wait for 3 ranks never started)."""
    from splat_train.trainer.launch import slurm_batch_without_srun

    env = dict(SLURM_PROCID="0", SLURM_NTASKS="4", SLURM_JOB_ID="9", SLURM_JOB_NODELIST="n[1-2]")
    assert slurm_batch_without_srun(env) and detect_external(env) is None
    assert not slurm_batch_without_srun(dict(env, SLURM_STEP_ID="0"))


def test_mpich_and_intel_mpi_environment():
    env = dict(PMI_RANK="6", PMI_SIZE="8", MPI_LOCALRANKID="2", MPI_LOCALNRANKS="4", MASTER_ADDR="h", MASTER_PORT="5")
    layout = detect_external(env)
    assert (layout["rank"], layout["world_size"], layout["local_rank"]) == (6, 8, 2)
    assert layout["launcher"].startswith("mpiexec")
    from splat_train.trainer.launch import local_processes_of_launcher

    assert local_processes_of_launcher(env) == 4
    with pytest.raises(LaunchError, match="MASTER_ADDR"):
        detect_external(dict(PMI_RANK="0", PMI_SIZE="2"))


@pytest.mark.parametrize(
    "nodes, first",
    [
        ("gpu[03-05,09],login1", "gpu03"),
        ("node7", "node7"),
        ("a[1-2]-b[3-4]", "a1-b3"),
        ("x[007]", "x007"),
        ("h1,h2", "h1"),
    ],
)
def test_first_slurm_host(nodes, first):
    from splat_train.trainer.launch import first_slurm_host

    assert first_slurm_host(nodes) == first


@pytest.mark.parametrize("nodes", ["", "gpu[01", "gpu[]"])
def test_first_slurm_host_refuses_a_malformed_list(nodes):
    from splat_train.trainer.launch import first_slurm_host

    with pytest.raises(LaunchError):
        first_slurm_host(nodes)


def test_mpirun_without_rendezvous_names_what_is_missing():
    env = dict(OMPI_COMM_WORLD_SIZE="2", OMPI_COMM_WORLD_RANK="0", MASTER_ADDR="node0")
    with pytest.raises(LaunchError, match="MASTER_PORT") as e:
        detect_external(env)
    assert "MASTER_ADDR" not in str(e.value).split("but")[1].split("not set")[0]


def test_cpu_process_count():
    assert num_local_processes(3, "cpu") == 3
    assert num_local_processes(0, "cpu") == 1


def _fail_on_rank_one(ctx: DistContext):
    import torch
    import torch.distributed as dist

    if ctx.rank == 1:
        raise RuntimeError("boom on rank one")
    dist.all_reduce(torch.ones(1))  # rank 0 would wait here forever without the launcher's cleanup


def test_failure_on_one_rank_ends_all_ranks(capfd):
    start = time.monotonic()
    rc = launch(_fail_on_rank_one, (), nproc_per_node=2, device="cpu")
    assert rc != 0
    assert time.monotonic() - start < 120
    assert "boom on rank one" in capfd.readouterr().err


def _rank_one_is_killed(ctx: DistContext):
    import os
    import signal

    import torch
    import torch.distributed as dist

    with ctx.stop.deferred():  # as in training: the launcher's SIGTERM to rank 0 is only recorded
        for i in range(10_000):
            if ctx.rank == 1 and i == 3:
                os.kill(os.getpid(), signal.SIGKILL)  # the out-of-memory killer, say
            dist.all_reduce(torch.ones(1))
            time.sleep(0.05)


def test_a_killed_rank_is_named_with_its_signal(capfd):
    """Rank 1 killed (SIGKILL) at W = 2: one line names it and the signal; rank 0, whose
    collective failed, says so in one line (no gloo traceback, no torch "Terminating process")."""
    rc = launch(_rank_one_is_killed, (), nproc_per_node=2, device="cpu")
    err = capfd.readouterr().err
    assert rc == 128 + 9, err
    assert "error: rank 1 died (signal 9, SIGKILL, sent from outside the run" in err, err
    assert "Traceback" not in err and "Terminating process" not in err, err


def _rank_one_never_joins(ctx: DistContext):
    import torch
    import torch.distributed as dist

    if ctx.rank == 1:
        time.sleep(3600)  # a rank stuck outside the collective its peer waits in
    dist.all_reduce(torch.ones(1))


def test_timeout_prints_every_rank_stack_and_stops_them(capfd):
    # 15 s: both ranks must be inside _worker (handler registered) before the stacks are asked for
    rc = launch(_rank_one_never_joins, (), nproc_per_node=2, device="cpu", timeout_s=15)
    assert rc == TIMED_OUT
    err = capfd.readouterr().err
    assert "still running after 15 s" in err
    # faulthandler's dump of each rank: rank 1 in time.sleep, rank 0 in the all_reduce
    assert err.count("_rank_one_never_joins") >= 2, err


MPI_SCRIPT = """
import json, os, sys, torch
from splat_train.trainer.launch import launch
def main(ctx):
    import torch.distributed as dist
    t = torch.tensor([float(ctx.rank + 1)])
    dist.all_reduce(t)
    with open(os.path.join(sys.argv[1], f"rank{ctx.rank}.json"), "w") as f:
        json.dump(dict(rank=ctx.rank, world=ctx.world_size, total=float(t)), f)
sys.exit(launch(main, (), device="cpu"))
"""


@pytest.mark.skipif(
    shutil.which("mpirun") is None, reason="OpenMPI's mpirun is not installed (.ci/run installs openmpi-bin)"
)
def test_mpirun_launch(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(MPI_SCRIPT)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
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
        "PYTHONPATH",
        sys.executable,
        str(script),
        str(tmp_path),
    ]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    import json

    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["world"] == 2 and r["total"] == 3.0 for r in results)


def _free_port():
    from splat_train.trainer.launch import free_port

    return free_port()


def test_local_process_count_of_each_launcher():
    from splat_train.trainer.launch import local_processes_of_launcher

    assert local_processes_of_launcher({"LOCAL_WORLD_SIZE": "4"}) == 4
    assert local_processes_of_launcher({"OMPI_COMM_WORLD_LOCAL_SIZE": "8"}) == 8
    assert local_processes_of_launcher({"SLURM_NTASKS_PER_NODE": "2(x3)"}) == 2
    assert local_processes_of_launcher({}) == 1


def test_share_cpu_threads_divides_the_cores(monkeypatch):
    import torch

    from splat_train.trainer import launch

    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(launch, "cpu_cores", lambda: 16)
    try:
        assert launch.share_cpu_threads(4) == 4 and torch.get_num_threads() == 4
        assert launch.share_cpu_threads(32) == 1
        monkeypatch.setenv("OMP_NUM_THREADS", "3")
        assert launch.share_cpu_threads(4) == 3
    finally:
        torch.set_num_threads(before)


THREADS_SCRIPT = """
import os, sys, torch
from splat_train.trainer.launch import launch
def main(ctx):
    with open(os.path.join(sys.argv[1], f"rank{ctx.rank}.txt"), "w") as f:
        f.write(str(torch.get_num_threads()))
sys.exit(launch(main, (), device="cpu"))
"""


def test_two_torchrun_nodes_on_one_host_share_its_cores(tmp_path):
    """Two ranks an external launcher started as separate one-process "nodes" of this host (two
    torchrun calls: LOCAL_WORLD_SIZE 1 each, no OMP_NUM_THREADS) take half the cores each, as the
    spawned ranks do, rather than every core each."""
    from splat_train.trainer.launch import cpu_cores

    cores = cpu_cores()
    if cores < 2:
        pytest.skip("one core: nothing to share")
    script = tmp_path / "job.py"
    script.write_text(THREADS_SCRIPT)
    port = str(_free_port())
    base = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(tmp_path)],
            env=dict(
                base,
                RANK=str(r),
                WORLD_SIZE="2",
                LOCAL_RANK="0",
                LOCAL_WORLD_SIZE="1",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
            ),
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    for p in procs:
        _, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
    assert [int((tmp_path / f"rank{r}.txt").read_text()) for r in range(2)] == [cores // 2] * 2
