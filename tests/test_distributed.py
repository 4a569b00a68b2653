"""Equality is the test: W CPU ranks over gloo render, score and differentiate exactly what one
process holding every Gaussian and every camera does (dense and packed exchange, uneven shards,
unequal camera counts and sizes across ranks)."""

import pytest
import torch

from splat_train.kernels import reference
from splat_train.trainer.launch import DistContext, launch
from splat_train.trainer.losses import photometric_loss
from splat_train.trainer.render import CameraBatch, render

from scenes import make_cameras, make_scene

PARAMS = ("means", "quats", "scales", "opacities", "colors")


def shard_order(n, world_size):
    return torch.cat([torch.arange(n)[r::world_size] for r in range(world_size)])


def step(params, cams, ctx, packed, sh_degree, c_total):
    """Render cams (one size group at a time), return images, this rank's loss share, grads."""
    leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    viewmats = torch.stack([c[0] for c in cams]).requires_grad_(True) if cams else None
    groups = {}
    for i, c in enumerate(cams):
        groups.setdefault((c[2], c[3]), []).append(i)
    images, loss = {}, torch.zeros(())
    # every rank must run the same number of passes: pad with empty-size-free repeats
    for (w, h), idx in sorted(groups.items()):
        batch = CameraBatch(viewmats[idx], torch.stack([cams[i][1] for i in idx]), w, h)
        res = render(leaves, batch, ctx, reference, sh_degree, packed=packed)
        gts = torch.stack([cams[i][4] for i in idx])
        part, _ = photometric_loss(res.colors, gts, 0.2, ssim_padding="valid")
        loss = loss + part * len(idx) / c_total
        for j, i in enumerate(idx):
            images[i] = res.colors[j].detach()
    loss.backward()
    grads = {k: v.grad.detach().clone() for k, v in leaves.items()}
    return images, loss.detach(), grads, viewmats.grad.detach().clone()


def _rank_main(ctx: DistContext, params, cams_per_rank, packed, sh_degree, out_dir):
    torch.set_num_threads(1)
    shard = {k: v[ctx.rank :: ctx.world_size] for k, v in params.items()}
    c_total = sum(len(c) for c in cams_per_rank)
    images, loss, grads, vgrads = step(shard, cams_per_rank[ctx.rank], ctx, packed, sh_degree, c_total)
    torch.save(dict(images=images, loss=loss, grads=grads, vgrads=vgrads), f"{out_dir}/rank{ctx.rank}.pt")


def rel_err(a, b):
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


CASES = [
    # (world size, cameras per rank as (w, h) lists)
    (2, [[(40, 32), (40, 32)], [(40, 32), (40, 32)]]),
    (3, [[(40, 32), (40, 32)], [(40, 32)], [(32, 40)]]),  # unequal counts, mixed sizes
]


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
@pytest.mark.parametrize("world_size, layout", CASES, ids=["W2", "W3"])
def test_distributed_step_equals_single_process(tmp_path, world_size, layout, packed):
    sh_degree = 1
    params = make_scene(seed=world_size)
    cams_per_rank, flat = [], []
    all_cams = make_cameras([s for rank in layout for s in rank])
    for rank in layout:
        cams_per_rank.append(all_cams[len(flat) : len(flat) + len(rank)])
        flat.extend(rank)
    # single process: every Gaussian (in shard-concatenated order) and every camera
    order = shard_order(params["means"].shape[0], world_size)
    single = {k: v[order] for k, v in params.items()}
    ctx1 = DistContext()
    # the single process must also render in size groups; cameras keep their global order
    s_images, s_loss, s_grads, s_vgrads = step(single, all_cams, ctx1, packed, sh_degree, len(all_cams))

    rc = launch(
        _rank_main, (params, cams_per_rank, packed, sh_degree, str(tmp_path)), nproc_per_node=world_size, device="cpu"
    )
    assert rc == 0
    outs = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world_size)]

    loss = sum(o["loss"] for o in outs)
    assert torch.isfinite(loss)
    assert abs(float(loss) - float(s_loss)) <= 1e-5 * abs(float(s_loss))
    offset = 0
    for r, o in enumerate(outs):
        for j, img in o["images"].items():
            ref = s_images[offset + j]
            assert img.shape == ref.shape
            assert float((img - ref).abs().max()) <= 1e-5
        offset += len(cams_per_rank[r])
    # gradients of every Gaussian: rank r's shard is rows [start, start + n_r) of the single order
    start = 0
    for r, o in enumerate(outs):
        n_r = o["grads"]["means"].shape[0]
        for k in PARAMS:
            ref = s_grads[k][start : start + n_r]
            assert torch.isfinite(o["grads"][k]).all()
            assert ref.abs().sum() > 0, k  # the comparison means something
            assert rel_err(o["grads"][k], ref) <= 1e-5, (r, k, rel_err(o["grads"][k], ref))
        start += n_r
    # view-matrix gradients come back through the reduce-scatter
    vgrads = torch.cat([o["vgrads"] for o in outs])
    assert rel_err(vgrads, s_vgrads) <= 1e-5


# ---------------------------------------------------------------- whole training steps

# Gaussians in input order: the comparison maps the one process's rows onto the ranks' rows
TRAIN_FLAGS = [
    "--no_morton_order",
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
    "--opacity_reg",
    "0.01",
    "--scale_reg",
    "0.01",
    "--num_traj_frames",
    "0",
    "--pose_opt",
    "--app_opt",
]


def _train_ranks(ctx: DistContext, flags, steps, out_dir):
    from splat_train.trainer.cli import build_scene, parse_args
    from splat_train.trainer.loop import Trainer

    torch.set_num_threads(1)
    cfg = parse_args(["default", *flags])
    trainer = Trainer(cfg, ctx, build_scene(cfg))
    for step in range(steps):
        trainer.train_step(step)
    torch.save(
        dict(
            params={k: v.detach() for k, v in trainer.params.items()},
            aux={k: (m.module if hasattr(m, "module") else m).state_dict() for k, m in trainer.aux.items()},
        ),
        f"{out_dir}/train_rank{ctx.rank}.pt",
    )


class _UnionSampler:
    """Draws, at each step, what every rank of a W-rank run draws (in rank order)."""

    def __init__(self, samplers):
        self.samplers = samplers

    def batch_at(self, step):
        return [i for s in self.samplers for i in s.batch_at(step)]


VARIANTS = {
    "dense": [],
    "packed": ["--packed"],
    # the fused loss (reference on the CPU) on images shifted against the tile grid
    "fused_shift": ["--packed", "--raster", "fused", "--random_tile_shift"],
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_training_steps_equal_single_process(tmp_path, variant):
    """After a few Adam steps (with regularizers, pose and appearance modules under DDP) the
    merged shards equal one process that holds every Gaussian and draws every rank's cameras."""
    from splat_train.trainer.cli import build_scene, parse_args
    from splat_train.trainer.data import CameraSampler
    from splat_train.trainer.loop import Trainer
    from splat_train.trainer.model import create_optimizers, means_lr_scheduler

    world_size, steps = 2, 4
    flags = TRAIN_FLAGS + VARIANTS[variant]
    if "fused" in variant:  # the fused kernel never materializes the image --app_opt corrects
        flags.remove("--app_opt")
    assert launch(_train_ranks, (flags, steps, str(tmp_path)), nproc_per_node=world_size, device="cpu") == 0
    outs = [torch.load(tmp_path / f"train_rank{r}.pt") for r in range(world_size)]

    cfg = parse_args(["default", *flags, "--batch_size", str(world_size)])  # same BS = 2 x 1
    single = Trainer(cfg, DistContext(), build_scene(cfg))
    single.sampler = single.samplers[0] = _UnionSampler(
        [CameraSampler(single.trainset, 1, cfg.seed, r) for r in range(world_size)]
    )
    order = shard_order(single.params["means"].shape[0], world_size)
    single.params = torch.nn.ParameterDict(
        {k: torch.nn.Parameter(v.detach()[order].clone()) for k, v in single.params.items()}
    )
    single.optimizers = create_optimizers(single.params, cfg, 1, single.scene_scale)
    single.scheduler = means_lr_scheduler(single.optimizers["means"], cfg.schedule.max_steps)
    initial = {k: v.detach().clone() for k, v in single.params.items()}
    for step in range(steps):
        single.train_step(step)

    # Adam divides by sqrt(v): where a Gaussian's gradient is at fp32 summation-noise level the
    # normalized update can differ by up to the learning rate, so the bound is a fraction of it.
    lrs = {k: o.param_groups[0]["lr"] for k, o in single.optimizers.items()}
    for k in single.params:
        merged = torch.cat([o["params"][k] for o in outs])
        ref = single.params[k].detach()
        assert not torch.equal(merged, initial[k]), k  # training moved it
        err = float((merged - ref).abs().max())
        assert err <= 0.1 * lrs[k], (k, err, lrs[k])
        assert float((merged - ref).abs().mean()) <= 1e-3 * lrs[k], k  # and nearly all agree far closer
    assert set(outs[0]["aux"]) == ({"pose"} if "fused" in variant else {"pose", "app"})
    for name in outs[0]["aux"]:
        a, b = outs[0]["aux"], outs[1]["aux"]
        for key in a[name]:
            assert torch.equal(a[name][key], b[name][key])  # replicas stay identical under DDP
            assert torch.allclose(a[name][key], single.aux[name].state_dict()[key], rtol=1e-4, atol=1e-6)


def _route_values(records):
    visible = (records.radii > 0).all(dim=-1).float()
    return torch.stack([visible, records.opacities.detach() * visible], dim=-1)  # [..., 2]


def _route_rank(ctx: DistContext, params, cams_per_rank, packed, out_dir):
    from splat_train.trainer.render import route_to_owners

    torch.set_num_threads(1)
    shard = {k: v[ctx.rank :: ctx.world_size] for k, v in params.items()}
    cams = cams_per_rank[ctx.rank]
    batch = CameraBatch(torch.stack([c[0] for c in cams]), torch.stack([c[1] for c in cams]), cams[0][2], cams[0][3])
    res = render(shard, batch, ctx, reference, 1, packed=packed, rasterize=False)
    assert res.colors is None
    routed = route_to_owners(ctx, res.info, _route_values(res.info.records))
    torch.save(routed, f"{out_dir}/route{ctx.rank}.pt")


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
@pytest.mark.parametrize("world_size", [2, 3])
def test_route_to_owners_equals_single_process(tmp_path, world_size, packed):
    """Per-record statistics measured on the rendering ranks reach the owners summed per Gaussian
    exactly as one process holding everything sums them (the pruning stages rely on this)."""
    from splat_train.trainer.render import route_to_owners

    params = make_scene(seed=7)
    cams = make_cameras([(40, 32)] * (world_size + 1))
    cams_per_rank = [cams[:2]] + [[c] for c in cams[2:]]
    assert (
        launch(_route_rank, (params, cams_per_rank, packed, str(tmp_path)), nproc_per_node=world_size, device="cpu")
        == 0
    )
    order = shard_order(params["means"].shape[0], world_size)
    single = {k: v[order] for k, v in params.items()}
    batch = CameraBatch(torch.stack([c[0] for c in cams]), torch.stack([c[1] for c in cams]), 40, 32)
    res = render(single, batch, DistContext(), reference, 1, packed=packed, rasterize=False)
    expected = route_to_owners(DistContext(), res.info, _route_values(res.info.records))
    got = torch.cat([torch.load(tmp_path / f"route{r}.pt") for r in range(world_size)])
    assert expected[:, 0].sum() > 0
    assert torch.allclose(got, expected, rtol=1e-6, atol=1e-6)


def _fused_step(params, cams, ctx, packed, c_total):
    from splat_train.kernels.fused_raster import fused_raster_loss

    leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    w, h = cams[0][2], cams[0][3]
    batch = CameraBatch(torch.stack([c[0] for c in cams]), torch.stack([c[1] for c in cams]), w, h)
    res = render(leaves, batch, ctx, reference, 1, packed=packed, rasterize=False)
    rec, tiles = res.info.records, res.info.tiles
    loss, _ = fused_raster_loss(
        rec.means2d,
        rec.conics,
        rec.colors,
        rec.opacities,
        tiles.offsets,
        tiles.flatten_ids,
        torch.stack([c[4] for c in cams]),
        w,
        h,
        0.2,
        packed=packed,
    )
    loss = loss * len(cams) / c_total
    loss.backward()
    return loss.detach(), {k: v.grad.detach().clone() for k, v in leaves.items()}


def _fused_rank(ctx: DistContext, params, cams_per_rank, packed, out_dir):
    torch.set_num_threads(1)
    shard = {k: v[ctx.rank :: ctx.world_size] for k, v in params.items()}
    loss, grads = _fused_step(shard, cams_per_rank[ctx.rank], ctx, packed, sum(len(c) for c in cams_per_rank))
    torch.save(dict(loss=loss, grads=grads), f"{out_dir}/fused{ctx.rank}.pt")


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_fused_loss_through_the_exchange_equals_single_process(tmp_path, packed):
    """--raster fused at W=2: the fused loss node feeds the exchange's backward unchanged."""
    params = make_scene(seed=11)
    cams = make_cameras([(40, 32)] * 3)
    cams_per_rank = [cams[:2], cams[2:]]
    assert launch(_fused_rank, (params, cams_per_rank, packed, str(tmp_path)), nproc_per_node=2, device="cpu") == 0
    outs = [torch.load(tmp_path / f"fused{r}.pt") for r in range(2)]
    single = {k: v[shard_order(params["means"].shape[0], 2)] for k, v in params.items()}
    s_loss, s_grads = _fused_step(single, cams, DistContext(), packed, len(cams))
    assert abs(float(sum(o["loss"] for o in outs)) - float(s_loss)) <= 1e-5 * float(s_loss)
    start = 0
    for o in outs:
        n = o["grads"]["means"].shape[0]
        for k in PARAMS:
            assert rel_err(o["grads"][k], s_grads[k][start : start + n]) <= 1e-5, k
        start += n


def _control_rank(ctx: DistContext, out_dir):
    from splat_train.trainer import exchange

    got = dict(
        from_main=exchange.from_main(ctx, {"resume": ctx.rank == 0, "rank": ctx.rank}),
        any=exchange.any_rank(ctx, [ctx.rank == 1, False]),
        views=exchange.deal_views(5, ctx),
    )
    torch.save(got, f"{out_dir}/control_{ctx.rank}.pt")


def test_control_values_agree_across_ranks(tmp_path):
    """Rank 0's decisions reach every rank (from_main: resuming and which checkpoint set, decided
    by rank 0 alone); any_rank ORs flags; deal_views deals 5 views to 3 ranks round-robin."""
    assert launch(_control_rank, (str(tmp_path),), nproc_per_node=3, device="cpu") == 0
    got = [torch.load(tmp_path / f"control_{r}.pt") for r in range(3)]
    assert all(g["from_main"] == {"resume": True, "rank": 0} for g in got)
    assert all(g["any"] == [True, False] for g in got)
    assert [g["views"] for g in got] == [([0, 3], 2), ([1, 4], 2), ([2], 2)]


def _raster_rank(ctx: DistContext, out_dir, missing_on):
    from splat_train.kernels import native
    from splat_train.trainer.cli import parse_args
    from splat_train.trainer.step.plan import native_kernel_everywhere, plan_step

    native.load = lambda quiet=False: None if ctx.rank in missing_on else object()  # this rank's build
    said: list = []
    ready = lambda: native_kernel_everywhere(ctx, "auto", said.append)  # noqa: E731
    mode = plan_step(parse_args(["default"]), "cuda", ctx.world_size, masked=False, kernel_ready=ready).raster
    torch.save(dict(mode=mode, said=said), f"{out_dir}/raster_{ctx.rank}.pt")


@pytest.mark.parametrize("missing_on", [(), (1,), (0, 1)])
def test_every_rank_takes_the_same_step(tmp_path, missing_on):
    """--raster auto on GPUs: the step is fused only when every rank built the native kernel (one
    all_reduce at start); a rank that lacks it says why, the others that another rank lacks it.
    (The plan of a "cuda" device on CPU ranks: only the decision is exercised, over gloo.)"""
    assert launch(_raster_rank, (str(tmp_path), missing_on), nproc_per_node=2, device="cpu") == 0
    got = [torch.load(tmp_path / f"raster_{r}.pt") for r in range(2)]
    assert {g["mode"] for g in got} == {"unfused" if missing_on else "fused"}
    for r, g in enumerate(got):
        if not missing_on:
            assert g["said"] == []
        else:
            assert len(g["said"]) == 1
            assert ("on another rank" in g["said"][0]) == (r not in missing_on), g["said"]
