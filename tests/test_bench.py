"""The benchmark harness on CPU over gloo: every variant and world size is reported, with the
quantities the table is built from, and a failing variant does not lose the others' results."""

import json

import pytest

from splat_train.scripts import bench

TINY = [
    "--device",
    "cpu",
    "--synthetic_gaussians",
    "300",
    "--resolution",
    "32x24",
    "--num_cameras",
    "6",
    "--steps",
    "6",
    "--warmup",
    "2",
    "--phase_steps",
    "2",
]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    rc = bench.main(
        [
            *TINY,
            "--world_sizes",
            "1",
            "2",
            "--variants",
            "ours-dense",
            "ours-packed",
            "--variant",
            "ours-packed-sparse=--packed --sparse_grad_comm",
            "--variant",
            "fused=--packed --raster fused",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    return out, json.loads((out / "bench.json").read_text())


def test_every_variant_and_world_size_is_reported(report):
    out, rep = report
    got = {(e["variant"], e["world_size"]) for e in rep["variants"]}
    assert got == {(v, w) for v in ("ours-dense", "ours-packed", "ours-packed-sparse", "fused") for w in (1, 2)}
    assert rep["baseline"] == "ours-dense"  # gsplat-dist needs CUDA and is dropped on CPU
    for e in rep["variants"]:
        assert len(e["ranks"]) == e["world_size"]
        for r in e["ranks"]:
            assert r["ms_median"] > 0 and r["ms_p90"] >= r["ms_median"]
            assert r["ms_per_iter"] > 0 and r["startup_s"] > 0
            assert r["steps"] == 6 and r["warmup"] == 2 and r["phase_steps"] == 2
            assert r["isects_mean"] > 0
            assert set(r["phases_median_ms"]) >= {"projection", "rasterization", "optimizer"}
        assert e["ranks"][0]["test_psnr"] > 0  # rank 0 evaluates (every rank renders)
    table = (out / "bench.md").read_text()
    assert table.count("\n| ours-") == 6 and table.count("\n| fused |") == 2
    assert "| ours-dense | 1 |" in table and "1.00x" in table
    assert all(r["cuda_graph_captures"] is None for e in rep["variants"] for r in e["ranks"])  # a CPU run
    assert all(r["whole_step_captures"] is None for e in rep["variants"] for r in e["ranks"])
    assert table.rstrip().endswith("CUDA graphs (--cuda_graphs; rank 0, whole run): none")
    assert (out / "phases.png").stat().st_size > 0


def test_the_table_names_the_variants_that_replayed_cuda_graphs(report):
    import copy

    _, rep = report
    rep = copy.deepcopy(rep)
    for e in rep["variants"]:
        if e["variant"] == "ours-dense" and e["world_size"] == 1:
            e["ranks"][0]["cuda_graph_captures"] = 3  # as a GPU run of one process reports it
    assert "CUDA graphs (--cuda_graphs; rank 0, whole run): ours-dense (W=1): 3 captures\n" in bench.markdown(rep)
    for e in rep["variants"]:
        if e["variant"] == "ours-dense" and e["world_size"] == 1:
            e["ranks"][0]["whole_step_captures"] = 4
    line = (
        "CUDA graphs (--cuda_graphs; rank 0, whole run): ours-dense (W=1): 3 captures, whole steps (4 tail captures)\n"
    )
    assert line in bench.markdown(rep)


def test_each_variant_reports_the_step_it_took(report):
    out, rep = report
    for e in rep["variants"]:
        for r in e["ranks"]:
            raster = "fused" if e["variant"] == "fused" else "unfused"
            assert r["step"] == dict(raster=raster, projection="gsplat", graphs="off")  # a CPU run
    table = (out / "bench.md").read_text()
    assert "| fused, gsplat, off |" in table and "| unfused, gsplat, off |" in table


def test_one_rank_sends_nothing_and_two_ranks_exchange_both_ways(report):
    _, rep = report
    for e in rep["variants"]:
        for r in e["ranks"]:
            sent = r["bytes_sent_per_iter"]
            fwd = sum(v for k, v in sent.items() if k.startswith("forward"))
            bwd = sum(v for k, v in sent.items() if k.startswith("backward"))
            if e["world_size"] == 1:
                assert fwd == 0 and bwd == 0
            else:
                assert fwd > 0 and bwd > 0
                assert "all_reduce" not in " ".join(r["calls_per_iter"])


def test_same_initial_model_gives_the_same_result_dense_and_packed(report):
    """Dense and packed are the same computation: with one rank they train to the same PSNR."""
    _, rep = report
    psnr = {e["variant"]: e["ranks"][0]["test_psnr"] for e in rep["variants"] if e["world_size"] == 1}
    assert psnr["ours-packed"] == pytest.approx(psnr["ours-dense"], abs=1e-3)
    assert psnr["ours-packed-sparse"] == pytest.approx(psnr["ours-packed"], abs=1e-3)


def test_a_variant_that_fails_keeps_the_others_and_exits_nonzero(tmp_path):
    # mcmc relocates with gsplat's CUDA op: on CPU it fails when the trainer is built (in process)
    rc = bench.main(
        [
            *TINY,
            "--variants",
            "ours-dense",
            "--variant",
            "mcmc=--strategy mcmc",
            "--world_sizes",
            "1",
            "2",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 1
    rep = json.loads((tmp_path / "bench.json").read_text())
    by_key = {(e["variant"], e["world_size"]): e for e in rep["variants"]}
    assert "ranks" in by_key["ours-dense", 1] and "ranks" in by_key["ours-dense", 2]
    assert "GPU" in by_key["mcmc", 1]["error"]
    # in spawned ranks: the exit code and the rank's own error
    assert by_key["mcmc", 2]["error"].startswith("exit code 2: ValueError") and "GPU" in by_key["mcmc", 2]["error"]
    table = (tmp_path / "bench.md").read_text()
    assert "| mcmc | 1 | ValueError" in table and "| mcmc | 2 | exit code 2: ValueError" in table


def test_a_variant_past_its_timeout_is_stopped_and_recorded(tmp_path, capsys):
    # two spawned ranks cannot even start within 1 s: the variant is stopped and recorded
    rc = bench.main(
        [*TINY, "--variants", "ours-dense", "--world_sizes", "1", "2", "--variant_timeout", "1", "--out", str(tmp_path)]
    )
    assert rc == 1
    by_key = {(e["variant"], e["world_size"]): e for e in json.loads((tmp_path / "bench.json").read_text())["variants"]}
    assert "ranks" in by_key["ours-dense", 1]  # one rank runs in process, unbounded
    assert by_key["ours-dense", 2]["error"].startswith("timed out after 1 s")
    assert "still running after 1 s" in capsys.readouterr().err
    assert bench.main([*TINY, "--variant_timeout", "-1", "--out", str(tmp_path / "neg")]) == 2
    assert "--variant_timeout" in capsys.readouterr().err


def test_bad_variant_flags_are_refused_before_anything_runs(tmp_path, capsys):
    out = tmp_path / "out"
    rc = bench.main(
        [*TINY, "--variants", "ours-dense", "--variant", "broken=--raster no-such-kernel", "--out", str(out)]
    )
    assert rc == 2
    err = capsys.readouterr().err
    assert "--variant broken=" in err and "--raster" in err and err.lower().count("invalid choice") == 1
    assert not out.exists()  # a refused run leaves nothing behind
    # flags that parse but that the trainer's validation refuses together
    rc = bench.main(
        [*TINY, "--variants", "ours-dense", "--variant", "clash=--raster fused --app_opt", "--out", str(tmp_path)]
    )
    assert rc == 2 and "--variant clash=" in capsys.readouterr().err


def test_bench_refuses_to_run_under_an_external_launcher(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert bench.main([*TINY, "--out", str(tmp_path)]) == 2
    assert "run it directly" in capsys.readouterr().err


def test_bench_starts_from_checkpoint_shards_of_another_world_size(tmp_path):
    """--ckpt: a 2-rank run's shards, benchmarked at W=1 and 2, continue from the saved step with
    every saved Gaussian (re-sharded), densification off in the window."""
    import torch

    from splat_train.trainer.cli import main

    run = tmp_path / "run"
    assert (
        main(
            [
                "default",
                "--synthetic_image_size",
                "32",
                "--synthetic_num_cameras",
                "6",
                "--synthetic_num_gaussians",
                "300",
                "--num_traj_frames",
                "0",
                "--device",
                "cpu",
                "--refine_start_iter",
                "2",
                "--refine_every",
                "2",
                "--grow_grad2d",
                "0.00005",
                "--max_steps",
                "4",
                "--save_steps",
                "4",
                "--nproc_per_node",
                "2",
                "--result_dir",
                str(run),
            ]
        )
        == 0
    )
    shards = [run / "ckpts" / f"ckpt_4_rank{r}.pt" for r in (0, 1)]
    saved = sum(torch.load(f, map_location="cpu", weights_only=False)["params"]["means"].shape[0] for f in shards)
    out = tmp_path / "bench"
    rc = bench.main(
        [
            "--device",
            "cpu",
            "--resolution",
            "32x32",
            "--num_cameras",
            "6",
            "--steps",
            "3",
            "--warmup",
            "1",
            "--world_sizes",
            "1",
            "2",
            "--variants",
            "ours-packed",
            "--ckpt",
            *map(str, shards),
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    rep = json.loads((out / "bench.json").read_text())
    assert rep["scene"]["ckpt"] == [str(f) for f in shards]
    for e in rep["variants"]:
        assert all(r["start_step"] == 4 for r in e["ranks"])
        assert sum(r["num_gaussians_local"] for r in e["ranks"]) == saved  # nothing densified or lost
    assert "from 2 checkpoint shard(s)" in (out / "bench.md").read_text()


def test_bench_refuses_missing_or_mixed_checkpoints(tmp_path, capsys):
    missing = tmp_path / "ckpt_4_rank0.pt"
    assert bench.main([*TINY, "--ckpt", str(missing), "--out", str(tmp_path / "b")]) == 2
    assert "no such file" in capsys.readouterr().err
    a, b = tmp_path / "ckpt_4_rank0.pt", tmp_path / "ckpt_8_rank1.pt"
    a.write_bytes(b"x")
    b.write_bytes(b"x")
    assert bench.main([*TINY, "--ckpt", str(a), str(b), "--out", str(tmp_path / "b")]) == 2
    assert "mix steps" in capsys.readouterr().err


# ---------------------------------------------------------------- bench-raster

RASTER_TINY = [
    "--device",
    "cpu",
    "--synthetic_gaussians",
    "300",
    "--resolution",
    "40x28",
    "--num_cameras",
    "4",
    "--repeats",
    "2",
    "--warmup",
    "1",
]


def test_bench_raster_times_unfused_and_fused_on_the_same_inputs(tmp_path):
    """On the CPU the fused rows run the PyTorch reference, so repeated fused rows compute identical
    results; the report has every row and writes both files."""
    from splat_train.scripts import bench_raster

    out = tmp_path / "br"
    rc = bench_raster.main(
        [*RASTER_TINY, "--batch_size", "2", "--packed", "--fused", "default", "default", "--out", str(out)]
    )
    assert rc == 0
    rep = json.loads((out / "bench_raster.json").read_text())
    names = [r["name"] for r in rep["rows"]]
    assert names[0].startswith("unfused (reference raster + pytorch SSIM") and len(names) == 3
    assert names[1] == names[2] == "fused (default)"
    assert rep["scene"]["batch_size"] == 2 and rep["scene"]["packed"] and rep["scene"]["num_isects"] > 0
    for r in rep["rows"]:
        assert r["ms_median"] > 0 and r["ms_p90"] >= r["ms_median"] and r["loss"] > 0
    assert rep["rows"][0]["speedup_vs_unfused"] == 1.0
    assert rep["rows"][2]["max_rel_diff_vs_first"] == 0.0
    assert "PyTorch reference" in rep["fused_by"]
    assert (out / "bench_raster.md").read_text().count("\n| fused") == 2
    assert "profile" not in rep["rows"][0]  # --profile off by default


def test_bench_raster_profile_reports_where_the_time_goes(tmp_path):
    """--profile adds, per row, the operators (CPU) of the profiled calls: a positive total, the
    largest first, and a second table in the markdown."""
    from splat_train.scripts import bench_raster

    out = tmp_path / "br"
    assert bench_raster.main([*RASTER_TINY, "--fused", "default", "--profile", "2", "--out", str(out)]) == 0
    rep = json.loads((out / "bench_raster.json").read_text())
    for r in rep["rows"]:
        p = r["profile"]
        assert p["unit"] == "CPU operators" and p["calls"] == 2 and p["total_ms"] > 0 and p["count"] >= 1
        ms = [t["ms"] for t in p["top"]]
        assert 0 < len(ms) <= 6 and ms == sorted(ms, reverse=True) and sum(ms) <= p["total_ms"] * (1 + 1e-9)
    md = (out / "bench_raster.md").read_text()
    assert "Where the time goes" in md and md.count("| CPU operators |") == 1


@pytest.mark.parametrize(
    "bad",
    [
        ["--fused", "8"],
        ["--fused", "8:8"],
        ["--fused", "8:8:64"],
        ["--repeats", "0"],
        ["--views", "0", "99"],
        ["--unfused_ssim", "triton"],
        ["--ssim_lambda", "2"],
        ["--profile", "-1"],
    ],
)
def test_bench_raster_rejects_bad_arguments(tmp_path, bad, capsys):
    from splat_train.scripts import bench_raster

    assert bench_raster.main([*RASTER_TINY, *bad, "--out", str(tmp_path / "x")]) == 2
    assert "error:" in capsys.readouterr().err and not (tmp_path / "x").exists()


def test_bench_raster_names_the_flag_of_a_bad_resolution(tmp_path, capsys):
    from splat_train.scripts import bench_raster

    with pytest.raises(SystemExit) as e:  # argparse's usage error: exit 2
        bench_raster.main([*RASTER_TINY, "--resolution", "40by28", "--out", str(tmp_path / "x")])
    assert e.value.code == 2 and "--resolution: expected WxH" in capsys.readouterr().err


def test_bench_raster_needs_no_triton(tmp_path, no_triton):
    """A CPU-only torch wheel has no Triton: the fused rows (native kernel / reference) still run,
    and --fused with no value times the unfused step alone."""
    from splat_train.scripts import bench_raster

    assert bench_raster.main([*RASTER_TINY, "--out", str(tmp_path / "x")]) == 0
    assert bench_raster.main([*RASTER_TINY, "--fused", "--out", str(tmp_path / "y")]) == 0
    rows = json.loads((tmp_path / "y" / "bench_raster.json").read_text())["rows"]
    assert len(rows) == 1 and rows[0]["unfused"]


def test_profile_steps_record_each_variants_trace_summary(tmp_path):
    """--profile_steps N: every rank's entry carries summarize_trace of N profiled steps, which
    come after the timed ones (the run trains steps + phase_steps + N steps)."""
    out = tmp_path / "b"
    rc = bench.main([*TINY, "--variants", "ours-dense", "--profile_steps", "2", "--out", str(out)])
    assert rc == 0
    (entry,) = json.loads((out / "bench.json").read_text())["variants"]
    profile = entry["ranks"][0]["profile"]
    assert profile["steps"] == 2
    assert profile["wall_ms_per_step"] is None  # a CPU run has no device events
    assert profile["runtime_calls_per_step"] == {} and profile["syncs_per_step"] == 0


def test_profile_steps_must_not_be_negative(tmp_path, capsys):
    assert bench.main([*TINY, "--profile_steps", "-1", "--out", str(tmp_path / "b")]) == 2
    assert "--profile_steps must be >= 0" in capsys.readouterr().err
