"""gsplat simple_trainer's options at W = 2 over gloo: whole training steps with them equal one
process that holds every Gaussian and draws every rank's cameras (the pattern of
test_distributed.test_training_steps_equal_single_process), on a COLMAP capture written from the
synthetic scene with loss masks and SfM tracks. Covered together: masks, --absgrad (the
densification statistics it feeds), --antialiased, --depth_loss, --visible_adam, --patch_size,
--use_bilateral_grid, --pose_noise, --sparse_grad, --camera_model fisheye (the capture's pinhole
intrinsics read as an equidistant fisheye's)."""

import numpy as np
import pytest
import torch

from splat_train.trainer.launch import DistContext, launch

from scenes import write_colmap_scene
from test_distributed import _UnionSampler, shard_order

# Gaussians in input order: the comparison maps the one process's rows onto the ranks' rows
BASE = [
    "--no_morton_order",
    "--sh_degree",
    "1",
    "--sh_degree_interval",
    "2",
    "--refine_start_iter",
    "1000",
    "--max_steps",
    "6",
    "--num_traj_frames",
    "0",
    "--test_every",
    "0",
    "--data_factor",
    "1",
]
VARIANTS = {
    # everything that changes a step, on the masked capture; dense and packed exchange
    "dense": [
        "--absgrad",
        "--antialiased",
        "--depth_loss",
        "--visible_adam",
        "--patch_size",
        "24",
        "--use_bilateral_grid",
        "--bilateral_grid_shape",
        "4",
        "4",
        "2",
        "--bilateral_grid_warmup",
        "2",
        "--pose_noise",
        "0.01",
    ],
    "packed": [
        "--packed",
        "--sparse_grad_comm",
        "--absgrad",
        "--antialiased",
        "--depth_loss",
        "--sparse_grad",
        "--patch_size",
        "24",
        "--camera_model",
        "fisheye",
    ],
}


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    """The synthetic scene as a COLMAP capture with tracks, masks on 4 of its 10 views."""
    from splat_train.trainer.data.synthetic import make_synthetic_scene

    scene = make_synthetic_scene(120, 10, 32, tracks=True)
    keep = np.ones((32, 32), bool)
    keep[4:14, 6:22] = False
    return write_colmap_scene(tmp_path_factory.mktemp("capture"), scene, {i: keep for i in (1, 2, 5, 8)})


def _flags(variant, capture):
    return BASE + ["--data_dir", str(capture)] + VARIANTS[variant]


def _run(trainer, steps):
    for step in range(steps):
        trainer.train_step(step)
    state = {k: v for k, v in trainer.strategy_state.items() if isinstance(v, torch.Tensor)}
    aux = {k: (m.module if hasattr(m, "module") else m).state_dict() for k, m in trainer.aux.items()}
    return dict(params={k: v.detach() for k, v in trainer.params.items()}, state=state, aux=aux)


def _ranks(ctx: DistContext, flags, steps, out_dir):
    from splat_train.trainer.cli import build_scene, parse_args
    from splat_train.trainer.loop import Trainer

    torch.set_num_threads(1)
    cfg = parse_args(["default", *flags])
    torch.save(_run(Trainer(cfg, ctx, build_scene(cfg)), steps), f"{out_dir}/rank{ctx.rank}.pt")


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_gsplat_options_at_two_ranks_equal_one_process(tmp_path, capture, variant):
    from splat_train.trainer.cli import build_scene, parse_args
    from splat_train.trainer.data import CameraSampler
    from splat_train.trainer.loop import Trainer
    from splat_train.trainer.model import create_optimizers, means_lr_scheduler

    world_size, steps = 2, 4
    flags = _flags(variant, capture)
    assert launch(_ranks, (flags, steps, str(tmp_path)), nproc_per_node=world_size, device="cpu") == 0
    outs = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world_size)]

    cfg = parse_args(["default", *flags, "--batch_size", str(world_size)])
    single = Trainer(cfg, DistContext(), build_scene(cfg))
    samplers = [CameraSampler(single.trainset, 1, cfg.seed, r) for r in range(world_size)]
    single.sampler = single.samplers[0] = _UnionSampler(samplers)
    ranks_windows = single.batches.windows  # each image keeps the crop its rank draws (position 0 of a batch of one)
    single.batches.windows = lambda step, rank, items: [  # type: ignore[method-assign]
        w for r, s in enumerate(samplers) for w in ranks_windows(step, r, s.batch_at(step))
    ]
    order = shard_order(single.params["means"].shape[0], world_size)
    single.params = torch.nn.ParameterDict(
        {k: torch.nn.Parameter(v.detach()[order].clone()) for k, v in single.params.items()}
    )
    single.optimizers = create_optimizers(single.params, cfg, 1, single.scene_scale)
    single.scheduler = means_lr_scheduler(single.optimizers["means"], cfg.schedule.max_steps)
    single.strategy_state = {k: v for k, v in single.strategy_state.items()}
    initial = {k: v.detach().clone() for k, v in single.params.items()}
    ref = _run(single, steps)

    assert single.views.channels == 4  # the masks are in play
    lrs = {k: o.param_groups[0]["lr"] for k, o in single.optimizers.items()}
    for k in ref["params"]:
        merged = torch.cat([o["params"][k] for o in outs])
        assert not torch.equal(merged, initial[k]), k
        assert float((merged - ref["params"][k]).abs().max()) <= 0.1 * lrs[k], k
        assert float((merged - ref["params"][k]).abs().mean()) <= 1e-3 * lrs[k], k
    # the densification statistics (absolute gradients with --absgrad) reached the owners
    for key in ("grad2d", "count"):
        merged = torch.cat([o["state"][key] for o in outs])
        assert ref["state"][key].sum() > 0, key
        torch.testing.assert_close(merged, ref["state"][key], rtol=1e-4, atol=1e-7)
    for name in outs[0]["aux"]:  # the bilateral grids: replicas identical and equal to one process's
        for key, value in outs[0]["aux"][name].items():
            assert torch.equal(value, outs[1]["aux"][name][key])
            torch.testing.assert_close(value, single.aux[name].state_dict()[key], rtol=1e-4, atol=1e-6)
