"""--loopback: one process over a process group of one rank takes the distributed path (every
collective, the records and their gradients through the all_to_alls, --sparse_grad_comm's zero
elision, route_to_owners) and trains exactly what one process off that path trains."""

import json

import pytest
import torch
import torch.distributed as dist

from splat_train.kernels import reference
from splat_train.trainer.launch import DistContext, loopback_group
from splat_train.trainer.render import CameraBatch, render, route_to_owners

from scenes import make_cameras, make_scene

FLAGS = [
    "--synthetic_image_size",
    "32",
    "--synthetic_num_cameras",
    "10",
    "--synthetic_num_gaussians",
    "120",
    "--sh_degree",
    "1",
    "--sh_degree_interval",
    "2",
    "--refine_start_iter",
    "1000",
    "--max_steps",
    "6",
    "--batch_size",
    "2",
    "--num_traj_frames",
    "0",
]

VARIANTS = {
    "dense": [],
    "packed": ["--packed"],
    "dense_sparse": ["--sparse_grad_comm"],
    "packed_sparse": ["--packed", "--sparse_grad_comm"],
    "fused": ["--raster", "fused"],  # the fused kernel's PyTorch reference on the CPU
    "regularized": ["--opacity_reg", "0.01", "--scale_reg", "0.01", "--visible_adam"],
}


def _train(flags, loopback, steps=3, device=None):
    """(per-step losses, the parameters after ``steps`` steps, the collectives of the steps, the
    plan's console line, the learning rates) of a run of ``flags``, on the distributed path over a
    group of one rank (``loopback``) or off it."""
    from splat_train.trainer.cli import build_scene, parse_args
    from splat_train.trainer.loop import Trainer

    extra = ["--loopback"] if loopback else []
    cfg = parse_args(["default", *flags, *extra, *(["--device", "cuda"] if device else [])])
    base = DistContext(device=torch.device(device)) if device else DistContext()
    with loopback_group(base, loopback) as ctx:
        trainer = Trainer(cfg, ctx, build_scene(cfg))
        losses = [trainer.train_step(s)["loss"].detach().clone() for s in range(steps)]
        params = {k: v.detach().clone() for k, v in trainer.params.items()}
        lrs = {k: o.param_groups[0]["lr"] for k, o in trainer.optimizers.items()}
        return losses, params, ctx.stats.reset(), trainer.plan.describe(), lrs


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_loopback_training_equals_one_process(variant):
    torch.set_num_threads(1)
    flags = FLAGS + VARIANTS[variant]
    losses, params, comm, line, _ = _train(flags, loopback=False)
    lb_losses, lb_params, lb_comm, lb_line, _ = _train(flags, loopback=True)
    assert not dist.is_initialized()  # the group of one rank is gone with the run
    assert line.startswith("step: one process's path") and lb_line.startswith("step: the distributed path (--loopback")
    # the loopback run took the exchange; the one-process run issued nothing
    assert comm["calls"] == {}
    assert lb_comm["calls"]["forward/all_to_all"] >= 3
    back = "backward/all_to_all_sparse" if "--sparse_grad_comm" in flags else "backward/all_to_all"
    assert lb_comm["calls"][back] >= 3
    assert all(v == 0 for v in lb_comm["bytes_sent"].values())  # no other rank: nothing leaves the process
    # ... and trained the same: the exchange only moves bits
    for a, b in zip(losses, lb_losses):
        assert torch.equal(a, b), (variant, float(a), float(b))
    for k in params:
        assert torch.equal(params[k], lb_params[k]), (variant, k, float((params[k] - lb_params[k]).abs().max()))


def _route_values(records):
    visible = (records.radii > 0).all(dim=-1).float()
    return torch.stack([visible, records.opacities.detach() * visible], dim=-1)  # [..., 2]


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_loopback_routes_pruning_statistics_as_one_process(packed):
    """route_to_owners at loopback travels through the reverse all_to_all and sums as one process."""
    params = make_scene(seed=7)
    cams = make_cameras([(40, 32)] * 3)
    batch = CameraBatch(torch.stack([c[0] for c in cams]), torch.stack([c[1] for c in cams]), 40, 32)
    res = render(params, batch, DistContext(), reference, 1, packed=packed, rasterize=False)
    expected = route_to_owners(DistContext(), res.info, _route_values(res.info.records))
    with loopback_group(DistContext()) as ctx:
        res = render(params, batch, ctx, reference, 1, packed=packed, rasterize=False)
        got = route_to_owners(ctx, res.info, _route_values(res.info.records))
        calls = ctx.stats.reset()["calls"]
    assert expected[:, 0].sum() > 0
    assert torch.equal(got, expected)
    assert calls["forward/all_to_all"] == (3 if packed else 2)  # (packed: counts,) records, statistics
    assert calls["forward/all_gather"] == 2  # without a layout the pass gathers its sizes and its cameras


def test_loopback_needs_one_process_and_its_group():
    from splat_train.trainer.cli import build_scene, parse_args
    from splat_train.trainer.config import from_argv
    from splat_train.trainer.loop import Trainer

    with pytest.raises(ValueError, match="--loopback runs one process"):
        with loopback_group(DistContext(world_size=2)):
            pass
    with pytest.raises(ValueError, match="--loopback.*--nproc_per_node"):
        from_argv(["default", "--loopback", "--nproc_per_node", "2"])
    cfg = parse_args(["default", *FLAGS, "--loopback"])
    with pytest.raises(ValueError, match="--loopback needs the process group"):
        Trainer(cfg, DistContext(), build_scene(cfg))
    with loopback_group(DistContext()) as ctx:
        assert ctx.distributed and ctx.loopback and ctx.backend == "gloo" and ctx.world_size == 1
        with pytest.raises(ValueError, match="already has a process group"):
            with loopback_group(DistContext()):
                pass
    assert not dist.is_initialized()
    assert not DistContext().distributed and DistContext(world_size=2).distributed


def test_the_plan_says_the_path_and_keeps_graphs_off_at_loopback_unless_asked():
    from splat_train.trainer.config import from_argv
    from splat_train.trainer.step.plan import graphs_mode, plan_step

    cfg = from_argv(["default"])
    plan = plan_step(cfg, "cpu", 1, masked=False, loopback=True)
    assert plan.distributed and "--loopback" in plan.distributed_why
    assert not plan_step(cfg, "cpu", 1, masked=False).distributed and plan_step(cfg, "cpu", 2, masked=False).distributed
    assert graphs_mode(cfg, "cuda", 1, "fused", (), loopback=False)[0] == "whole"
    assert graphs_mode(cfg, "cuda", 1, "fused", (), loopback=True) == ("off", "--cuda_graphs auto: --loopback")
    on = from_argv(["default", "--cuda_graphs", "on"])
    assert graphs_mode(on, "cuda", 1, "fused", (), loopback=True) == ("head", "--loopback")


def test_bench_runs_the_loopback_variant_at_one_rank_only(tmp_path, capsys):
    from splat_train.scripts import bench

    out = tmp_path / "b"
    rc = bench.main(
        [
            "--device",
            "cpu",
            "--synthetic_gaussians",
            "300",
            "--resolution",
            "32x24",
            "--num_cameras",
            "6",
            "--steps",
            "5",
            "--warmup",
            "2",
            "--phase_steps",
            "1",
            "--world_sizes",
            "1",
            "2",
            "--variants",
            "ours-dense",
            "ours-dense-loopback",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    assert "ours-dense-loopback skipped at W=2" in capsys.readouterr().err
    rows = {(e["variant"], e["world_size"]): e for e in json.loads((out / "bench.json").read_text())["variants"]}
    assert set(rows) == {("ours-dense", 1), ("ours-dense", 2), ("ours-dense-loopback", 1)}
    lb, one = rows[("ours-dense-loopback", 1)]["ranks"][0], rows[("ours-dense", 1)]["ranks"][0]
    assert lb["loopback"] and not one["loopback"]
    assert lb["calls_per_iter"]["forward/all_to_all"] == 1 and lb["calls_per_iter"]["backward/all_to_all"] == 1
    assert one["calls_per_iter"] == {}
    assert sum(lb["bytes_sent_per_iter"].values()) == 0  # the exchange's only peer is itself
    assert lb["test_psnr"] == one["test_psnr"]  # the same training
    two = rows[("ours-dense", 2)]["ranks"]
    assert all(r["bytes_sent_per_iter"]["forward/all_to_all"] > 0 for r in two)


# ---------------------------------------------------------------- on a GPU, over NCCL (the lead runs these)

GPU_VARIANTS = {
    "dense": ["--raster", "unfused"],
    "packed": ["--packed", "--raster", "unfused"],
    "packed_sparse": ["--packed", "--sparse_grad_comm", "--raster", "unfused"],
    "fused": ["--raster", "fused"],
}


def _close_after_adam(params, ref, lrs):
    """Adam divides by sqrt(v): where a gradient is at fp32 summation-noise level (gsplat's
    backward sums with atomics, in no fixed order) the normalized update can differ by up to the
    learning rate, so the bound is a fraction of it (as tests/test_distributed.py's)."""
    for k in ref:
        err = (params[k] - ref[k]).abs()
        assert float(err.max()) <= 0.1 * lrs[k], (k, float(err.max()), lrs[k])
        assert float(err.mean()) <= 1e-3 * lrs[k], k


@pytest.mark.parametrize("variant", sorted(GPU_VARIANTS))
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_nccl_loopback_training_equals_one_process(variant):
    flags = FLAGS + GPU_VARIANTS[variant]
    losses, params, _, _, lrs = _train(flags, loopback=False, device="cuda")
    lb_losses, lb_params, lb_comm, line, _ = _train(flags, loopback=True, device="cuda")
    assert "the distributed path (--loopback" in line and not dist.is_initialized()
    assert lb_comm["calls"]["forward/all_to_all"] >= 3
    assert float((losses[0] - lb_losses[0]).abs()) <= 1e-6 * float(losses[0].abs())  # one model, one forward
    for a, b in zip(losses, lb_losses):
        assert float((a - b).abs()) <= 1e-4 * float(a.abs())
    _close_after_adam(lb_params, params, lrs)


@pytest.mark.parametrize("raster", ["unfused", "fused"])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_nccl_loopback_graphed_head_equals_the_eager_loopback_step(raster):
    """--cuda_graphs on at loopback: the projection head replayed as CUDA graphs around the eager
    exchange (no collective is captured) trains as the eager loopback step."""
    from splat_train.trainer.cli import build_scene, parse_args
    from splat_train.trainer.loop import Trainer

    runs = {}
    for graphs in ("on", "off"):
        flags = FLAGS + ["--raster", raster, "--cuda_graphs", graphs]
        cfg = parse_args(["default", *flags, "--loopback", "--device", "cuda"])
        with loopback_group(DistContext(device=torch.device("cuda"))) as ctx:
            trainer = Trainer(cfg, ctx, build_scene(cfg))
            assert trainer.plan.graphs == ("head" if graphs == "on" else "off")
            losses = [trainer.train_step(s)["loss"].detach().clone() for s in range(3)]
            if graphs == "on":
                assert trainer.forward_backward.graphed_head.captures >= 1
            lrs = {k: o.param_groups[0]["lr"] for k, o in trainer.optimizers.items()}
            runs[graphs] = losses, {k: v.detach().clone() for k, v in trainer.params.items()}
    (g_losses, g_params), (e_losses, e_params) = runs["on"], runs["off"]
    for a, b in zip(g_losses, e_losses):
        assert float((a - b).abs()) <= 1e-4 * float(b.abs())
    _close_after_adam(g_params, e_params, lrs)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_nccl_dense_record_exchange_replays_from_a_cuda_graph():
    """The dense step's record all_to_all and its reverse (split sizes fixed between
    densifications, Python lists: no host read of device data) captured in one CUDA graph over a
    group of one rank replay what the eager calls return, for new payloads copied into the
    captured input. The rank's CommStats count the capture, not the replays (host code)."""
    from splat_train.trainer.exchange import _all_to_all_rows

    with loopback_group(DistContext(device=torch.device("cuda"))) as ctx:
        rows, lanes = 3 * 5000, 12
        send, recv = [rows], [rows]
        static = torch.randn(rows, lanes, device="cuda")
        _all_to_all_rows(ctx, static, send, recv)  # the communicator exists before the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            forward = _all_to_all_rows(ctx, static, send, recv)
            back = _all_to_all_rows(ctx, forward[:, 2:].contiguous() * 2.0, recv, send)
        calls = ctx.stats.reset()["calls"]["forward/all_to_all"]
        for seed in range(3):
            payload = torch.randn(rows, lanes, device="cuda", generator=torch.Generator("cuda").manual_seed(seed))
            static.copy_(payload)
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(forward, payload)
            assert torch.equal(back, payload[:, 2:] * 2.0)
        assert calls == 3 and ctx.stats.reset()["calls"] == {}  # the warm-up and the capture; replays run no host code
