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
        trainer.forward_backward.release()
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
    mode, why = graphs_mode(on, "cuda", 1, "fused", (), loopback=True)
    assert mode == "whole" and "--loopback: the dense record exchange captured" in why
    sparse = from_argv(["default", "--cuda_graphs", "on", "--sparse_grad_comm"])
    assert graphs_mode(sparse, "cuda", 1, "fused", (), loopback=True)[0] == "head"
    absgrad = from_argv(["default", "--cuda_graphs", "on", "--absgrad"])
    assert graphs_mode(absgrad, "cuda", 2, "fused", ())[0] == "head"
    packed = from_argv(["default", "--cuda_graphs", "on", "--packed"])
    assert graphs_mode(packed, "cuda", 1, "fused", (), loopback=True) == ("off", "--packed")


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


def _adam_differences(params, ref, lrs):
    """Per parameter: (elements differing by more than a tenth of the learning rate, the mean
    difference of the others over the learning rate, the element count)."""
    out = {}
    for k in params:
        err = (params[k] - ref[k]).abs()
        inside = err <= 0.1 * lrs[k]
        out[k] = (int((~inside).sum()), float(err[inside].mean()) / lrs[k] if inside.any() else 0.0, err.numel())
    return out


def _close_after_adam(params, ref, control, lrs):
    """``params`` trained as ``ref`` up to the noise that ``control`` (``ref``'s run repeated)
    shows. Adam divides by sqrt(v): where a gradient is at fp32 rounding level its sign can differ
    between two runs of one step (gsplat's backward sums with atomics, in no fixed order; a
    CUDA-graph replay may round differently from the eager step), and that element's update by up
    to twice the learning rate. So the bound counts such elements, not their size: at most 1% of
    a parameter's elements (plus the control's count) may differ by more than lr / 10, and the mean
    difference of the others may be at most lr / 1000 plus three times the control's. A wrong route or gradient
    moves most elements and fails both.

    The quaternions are compared through the covariances they make with the scales
    (kernels.reference.quat_scale_to_covar), each within 2e-3 of its largest entry (three steps
    of rotation noise, at most 6 lr_quats, on scales at most 3 lr_scales from isotropic move an
    entry by about 4e-4 of it): the scenes start from
    isotropic Gaussians, whose rotation changes nothing, so the quaternions' gradient is rounding
    noise and Adam's steps of it are +-lr in either direction (measured on the H200: 40% of them
    beyond lr / 10 between two runs of the same eager step)."""
    keys = [k for k in ref if k != "quats"]
    got = _adam_differences({k: params[k] for k in keys}, ref, lrs)
    noise = _adam_differences({k: control[k] for k in keys}, ref, lrs)
    for k, (over, mean, n) in got.items():
        c_over, c_mean, _ = noise[k]
        print(f"{k}: {over} of {n} beyond lr/10 (control {c_over}), mean {mean:.2e} lr (control {c_mean:.2e})")
        assert over <= -(-n // 100) + c_over, (k, over, c_over, n)
        assert mean <= 1e-3 + 3 * c_mean, (k, mean, c_mean)
    if "quats" in ref:
        covars = [reference.quat_scale_to_covar(p["quats"], torch.exp(p["scales"])).flatten(1) for p in (params, ref)]
        rel = float(((covars[0] - covars[1]).abs().amax(1) / covars[1].abs().amax(1)).max())
        print(f"covariances: largest difference {rel:.2e} of the Gaussian's largest entry")
        assert rel <= 2e-3, rel


def test_the_gpu_bound_passes_rotation_noise_and_fails_a_wrong_step():
    """_close_after_adam (the NCCL tests' bound): quaternion noise of isotropic Gaussians and a few
    sign-flipped Adam steps pass; a parameter stepped the wrong way fails."""
    g = torch.Generator().manual_seed(0)
    n, lrs = 200, {"means": 1e-4, "quats": 1e-3, "scales": 5e-3}
    ref = {
        "means": torch.randn(n, 3, generator=g),
        "quats": torch.nn.functional.normalize(torch.randn(n, 4, generator=g), dim=-1),
        "scales": torch.full((n, 3), -2.0) + 3 * lrs["scales"] * torch.rand(n, 3, generator=g),
    }

    def run(means_flips=0, scales_sign=1.0):
        p = {k: v.clone() for k, v in ref.items()}
        p["quats"] += 6 * lrs["quats"] * (2 * torch.rand(n, 4, generator=g) - 1)  # every quaternion off
        p["means"][:means_flips, 0] += 2 * lrs["means"]
        p["scales"] += (scales_sign - 1) * lrs["scales"]
        return p

    control = run()
    _close_after_adam(run(), ref, control, lrs)
    _close_after_adam(run(means_flips=2), ref, control, lrs)  # 2 of 600 elements: rounding-level signs
    with pytest.raises(AssertionError, match="means"):
        _close_after_adam(run(means_flips=n), ref, control, lrs)
    with pytest.raises(AssertionError, match="scales"):
        _close_after_adam(run(scales_sign=-1.0), ref, control, lrs)
    aniso = dict(ref, scales=ref["scales"] + torch.tensor([0.5, 0.0, 0.0]))  # the rotation now matters
    rotated = dict(run(), scales=aniso["scales"])
    with pytest.raises(AssertionError):  # the covariances
        _close_after_adam(rotated, aniso, control, lrs)


@pytest.mark.parametrize("variant", sorted(GPU_VARIANTS))
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_nccl_loopback_training_equals_one_process(variant):
    flags = FLAGS + GPU_VARIANTS[variant]
    losses, params, _, _, lrs = _train(flags, loopback=False, device="cuda")
    _, control, _, _, _ = _train(flags, loopback=False, device="cuda")
    lb_losses, lb_params, lb_comm, line, _ = _train(flags, loopback=True, device="cuda")
    assert "the distributed path (--loopback" in line and not dist.is_initialized()
    assert lb_comm["calls"]["forward/all_to_all"] >= 3
    assert float((losses[0] - lb_losses[0]).abs()) <= 1e-6 * float(losses[0].abs())  # one model, one forward
    for a, b in zip(losses, lb_losses):
        assert float((a - b).abs()) <= 1e-4 * float(a.abs())
    _close_after_adam(lb_params, params, control, lrs)


@pytest.mark.parametrize("raster", ["unfused", "fused"])
@pytest.mark.parametrize("kind", ["whole", "head"])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_nccl_loopback_graphs_equal_the_eager_loopback_step(raster, kind):
    """--cuda_graphs on at loopback trains as the eager loopback step: the whole step replayed,
    the record all_to_alls captured over NCCL between the head and the tail (``whole``), or
    (with --absgrad) the projection head replayed around the eager exchange (``head``)."""
    from splat_train.trainer.cli import build_scene, parse_args
    from splat_train.trainer.loop import Trainer

    runs = {}
    for graphs in ("on", "off", "control"):
        flags = FLAGS + ["--raster", raster, "--cuda_graphs", "on" if graphs == "on" else "off"]
        flags += ["--absgrad"] if kind == "head" else []
        cfg = parse_args(["default", *flags, "--loopback", "--device", "cuda"])
        with loopback_group(DistContext(device=torch.device("cuda"))) as ctx:
            trainer = Trainer(cfg, ctx, build_scene(cfg))
            assert trainer.plan.graphs == (kind if graphs == "on" else "off")
            losses = [trainer.train_step(s)["loss"].detach().clone() for s in range(3)]
            fb = trainer.forward_backward
            if graphs == "on":
                assert fb.graphed_head.captures >= 1
                if kind == "whole":
                    whole = fb.graphed_step
                    assert whole.captures >= 1 and whole.failures == 0 and whole.exchange_captures >= 1
                    assert whole._exchange.captured == {"forward": True, "backward": True}
            lrs = {k: o.param_groups[0]["lr"] for k, o in trainer.optimizers.items()}
            runs[graphs] = losses, {k: v.detach().clone() for k, v in trainer.params.items()}
            calls = ctx.stats.reset()["calls"]
            assert calls["forward/all_to_all"] == calls["backward/all_to_all"] == 3, calls
            fb.release()  # the captured collectives go before the group
    (g_losses, g_params), (e_losses, e_params) = runs["on"], runs["off"]
    for a, b in zip(g_losses, e_losses):
        assert float((a - b).abs()) <= 1e-4 * float(b.abs())
    _close_after_adam(g_params, e_params, runs["control"][1], lrs)


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
        # NCCL frees a captured collective's plan when its graph is destroyed, and the group's
        # shutdown waits for that: a graph left alive past the group hangs the shutdown
        graph.reset()
        torch.cuda.synchronize()
