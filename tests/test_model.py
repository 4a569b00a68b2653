"""Shard initialization, the optimizer batch rule, and densification."""

import math

import numpy as np
import pytest
import torch

from splat_train.trainer.config import Config, ModelConfig, Schedule, StepConfig, StrategyConfig
from splat_train.trainer.data import DataError, Scene
from splat_train.trainer.render import RenderInfo
from splat_train.trainer.densify import DefaultStrategy, initialize_state, make_strategy, ndc_scales, strategy_info
from splat_train.trainer.model import (
    InitPoints,
    batch_rule,
    bytes_per_gaussian,
    create_optimizers,
    create_shard,
    initial_points,
    knn_mean_distance,
)


def _points(n=50, seed=0):
    rng = np.random.default_rng(seed)
    return InitPoints(rng.random((n, 3)).astype(np.float32), rng.random((n, 3)).astype(np.float32))


def test_shards_partition_the_points_round_robin():
    pts, cfg = _points(53), Config(model=ModelConfig(sh_degree=2, morton_order=False))
    shards = [create_shard(pts, cfg, r, 3, torch.device("cpu")) for r in range(3)]
    assert [s["means"].shape[0] for s in shards] == [18, 18, 17]
    merged = torch.cat([s["means"] for s in shards])
    expected = np.concatenate([pts.means[r::3] for r in range(3)])
    assert torch.equal(merged, torch.from_numpy(expected))
    s = shards[0]
    assert s["shN"].shape == (18, 8, 3) and s["sh0"].shape == (18, 1, 3)
    assert torch.allclose(torch.sigmoid(s["opacities"]), torch.full((18,), cfg.model.init_opa))
    assert torch.equal(s["quats"][:, 0], torch.ones(18))
    # scales come from the neighbours in the whole set, not the shard
    d = knn_mean_distance(pts.means, pts.means[0::3])
    assert torch.allclose(torch.exp(s["scales"][:, 0]), torch.from_numpy(d))


def test_knn_mean_distance_matches_brute_force():
    pts = np.random.default_rng(1).random((40, 3)).astype(np.float32)
    d = np.linalg.norm(pts[:, None] - pts[None], axis=-1)
    np.fill_diagonal(d, np.inf)
    nearest = np.sort(d, axis=1)[:, :3]
    assert np.allclose(knn_mean_distance(pts, pts), np.sqrt((nearest**2).mean(1)), rtol=1e-5)


@pytest.mark.parametrize("bs", [1, 2, 4, 10, 64, 1000])
def test_batch_rule_betas_stay_in_open_interval(bs):
    lr_mult, eps, (b1, b2) = batch_rule(bs, 1)
    assert lr_mult == pytest.approx(math.sqrt(bs))
    assert eps == pytest.approx(1e-15 / math.sqrt(bs))
    assert 0 < b1 < 1 and 0 < b2 < 1
    assert batch_rule(1, bs) == batch_rule(bs, 1)  # only BS = batch_size x world_size matters


def test_optimizers_one_per_parameter_with_scaled_lr():
    cfg = Config(step=StepConfig(batch_size=2))
    params = create_shard(_points(), cfg, 0, 2, torch.device("cpu"))
    opts = create_optimizers(params, cfg, world_size=2, scene_scale=3.0)
    assert set(opts) == set(params)
    means_lr = opts["means"].param_groups[0]["lr"]
    assert means_lr == pytest.approx(cfg.optim.means_lr * 3.0 * 2.0)  # sqrt(2 x 2) = 2
    assert opts["means"].param_groups[0]["betas"] == pytest.approx((0.9**4, 0.999**4))


def test_bytes_per_gaussian_matches_write_up():
    assert bytes_per_gaussian(3) == 708  # the reference write-up's figure at SH degree 3


def test_sfm_init_without_points_suggests_random():
    scene = Scene(
        cameras=[],
        points=np.zeros((0, 3), np.float32),
        points_rgb=np.zeros((0, 3), np.uint8),
        scene_scale=1.0,
        transform=np.eye(4),
        source="colmap",
    )
    with pytest.raises(DataError, match="--init_type random"):
        initial_points(scene, Config(model=ModelConfig(init_type="sfm")), 1.0)


def _toy_strategy_run(steps, reset_every):
    cfg = Config(
        schedule=Schedule(refine_start_iter=10_000, refine_stop_iter=100, reset_every=reset_every, refine_every=1000),
        densify=StrategyConfig(),
    )
    strategy = make_strategy(cfg)
    params = create_shard(_points(20), Config(model=ModelConfig(init_opa=0.9)), 0, 1, torch.device("cpu"))
    opts = create_optimizers(params, Config(), 1, 1.0)
    state = initialize_state(strategy, 1.0)
    history = []
    for step in range(steps):
        means2d = torch.zeros(1, 20, 2)
        info = RenderInfo(
            means2d=means2d,
            radii=torch.ones(1, 20, 2, dtype=torch.int32),
            packed=False,
            n_cameras=1,
            widths=[32],
            heights=[32],
        )
        means2d.grad = torch.full_like(means2d, 1e-3)
        strategy.step_post_backward(params, opts, state, step, strategy_info(info), packed=False)
        history.append(float(torch.sigmoid(params["opacities"].detach()).max()))
    return history


@pytest.mark.parametrize("kind", ["default", "mcmc"])
def test_strategy_state_initializes_for_both_strategies(kind):
    """The trainer's initialize_state works for both of gsplat's strategies: DefaultStrategy keeps
    the scene scale; gsplat 1.5.3's MCMCStrategy.initialize_state() takes no argument (the trainer
    passed scene_scale to it and every mcmc run died with TypeError before its first step)."""
    from gsplat.strategy import MCMCStrategy

    strategy = make_strategy(Config(densify=StrategyConfig(strategy=kind)))
    state = initialize_state(strategy, 2.5)
    if kind == "mcmc":
        assert isinstance(strategy, MCMCStrategy) and state["binoms"].shape == (51, 51)
    else:
        assert isinstance(strategy, DefaultStrategy) and state["scene_scale"] == 2.5


def test_opacity_reset_happens_at_reset_every():
    """gsplat 1.5.3's condition never fires; ours resets at every reset_every steps."""
    assert isinstance(make_strategy(Config()), DefaultStrategy)
    history = _toy_strategy_run(steps=12, reset_every=5)
    assert history[4] == pytest.approx(0.9, abs=1e-6)  # before the reset
    assert history[5] == pytest.approx(0.01, abs=1e-5)  # reset to 2 x prune_opa at step 5


def test_ndc_scales_per_camera_size():
    info = dict(n_cameras=2, widths=[40, 20], heights=[30, 60])
    assert torch.equal(ndc_scales(info), torch.tensor([[40.0, 30.0], [20.0, 60.0]]))  # w/2, h/2 x n_cameras


@pytest.mark.parametrize("packed", [False, True])
def test_update_state_equals_gsplats(packed):
    """The synchronization-free statistics equal gsplat 1.5.3's own _update_state (torch.where over
    the visibility mask) on the same gradients: random visibility, two cameras of one size."""
    from gsplat.strategy import DefaultStrategy as GsplatDefault

    gen = torch.Generator().manual_seed(3)
    C, N, width, height = 2, 50, 64, 48  # one size: gsplat's single width / height applies
    radii = torch.randint(0, 3, (C, N, 2), generator=gen, dtype=torch.int32)  # 0: not seen
    grad = torch.randn(C, N, 2, generator=gen)
    params = {"means": torch.zeros(N, 3)}
    ours, theirs = make_strategy(Config()), GsplatDefault()
    state_ours, state_theirs = ours.initialize_state(1.0), theirs.initialize_state(1.0)
    for _ in range(2):  # accumulates over steps
        if packed:
            seen = (radii > 0).all(-1)
            cam_ids, gs_ids = torch.nonzero(seen, as_tuple=True)
            g, r = grad[cam_ids, gs_ids], radii[cam_ids, gs_ids]
        else:
            cam_ids = gs_ids = None
            g, r = grad, radii
        means2d = torch.zeros_like(g)
        means2d.grad = g.clone()
        info = RenderInfo(
            means2d=means2d,
            radii=r,
            packed=packed,
            n_cameras=C,
            gaussian_ids=gs_ids,
            camera_ids=cam_ids,
            widths=[width] * C,
            heights=[height] * C,
        )
        ours._update_state(params, state_ours, strategy_info(info), packed=packed)
        theirs._update_state(
            params,
            state_theirs,
            dict(means2d=means2d, radii=r, gaussian_ids=gs_ids, width=width, height=height, n_cameras=C),
            packed=packed,
        )
    assert torch.allclose(state_ours["count"], state_theirs["count"]) and state_ours["count"].sum() > 0
    assert torch.allclose(state_ours["grad2d"], state_theirs["grad2d"], rtol=1e-5)


def test_optimizers_are_fused_adams_that_match_the_foreach_update():
    """create_optimizers uses torch's fused Adam (one kernel per parameter and step) where the
    device has it; its updates equal the multi-tensor (foreach) Adam's to float32 rounding."""
    params = create_shard(_points(30), Config(), 0, 1, torch.device("cpu"))
    opts = create_optimizers(params, Config(), 1, 1.0)
    assert all(o.defaults["fused"] for o in opts.values())
    twin = {k: torch.nn.Parameter(v.detach().clone()) for k, v in params.items()}
    ref = {
        k: torch.optim.Adam([twin[k]], **{n: opts[k].param_groups[0][n] for n in ("lr", "eps", "betas")}, foreach=True)
        for k in twin
    }
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        for k in params:
            params[k].grad = torch.randn(params[k].shape, generator=gen)
            twin[k].grad = params[k].grad.clone()
            opts[k].step()
            ref[k].step()
    for k in params:
        assert not torch.equal(params[k].detach(), create_shard(_points(30), Config(), 0, 1, torch.device("cpu"))[k])
        torch.testing.assert_close(params[k].detach(), twin[k].detach(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("cloud", ["uniform", "clustered", "surface", "duplicates"])
def test_morton_knn_finds_the_nearest_neighbours(cloud):
    """The GPU start-up's approximate k-NN (Morton orders) against the exact KD-tree, on the
    query subset a rank asks for: nearly every point exact, and never closer than the truth."""
    from splat_train.trainer.model import knn_mean_distance_morton

    rng = np.random.default_rng(1)
    n = 30_000
    if cloud == "uniform":
        pts = rng.random((n, 3))
    elif cloud == "clustered":
        pts = rng.normal(size=(300, 3))[rng.integers(0, 300, n)] * 3 + rng.normal(size=(n, 3)) * 0.01
    elif cloud == "surface":
        pts = np.c_[rng.random((n, 2)), 0.001 * rng.random(n)]
    else:  # SfM exports repeat points
        pts = np.repeat(rng.random((n // 2, 3)), 2, axis=0)
    pts = pts.astype(np.float32)
    query = np.arange(2, n, 3)  # rank 2 of 3
    exact = knn_mean_distance(pts, pts[query])
    approx = knn_mean_distance_morton(torch.from_numpy(pts), torch.from_numpy(query)).numpy()
    assert approx.shape == exact.shape and np.isfinite(approx).all()
    rel = approx / exact - 1
    assert rel.min() >= -1e-5  # a found neighbour is a real one: never an under-estimate
    assert np.mean(np.abs(rel) < 1e-5) >= 0.99, np.mean(np.abs(rel) < 1e-5)


def test_create_shard_takes_precomputed_neighbour_distances():
    """The benchmark computes the points' neighbour distances once for all its variants."""
    pts = _points(40)
    pts.knn_rms = np.full(40, 0.25, dtype=np.float32)
    params = create_shard(pts, Config(model=ModelConfig(init_scale=2.0)), 1, 4, torch.device("cpu"))
    assert params["scales"].shape == (10, 3)
    assert torch.allclose(params["scales"], torch.full((10, 3), math.log(0.5)))


def test_the_trainer_starts_without_importing_scipy():
    """scipy's KD-tree serves the CPU's initial scales only (a GPU run takes the Morton form), so
    importing the trainer leaves scipy out: its import took about a second of every start-up."""
    import subprocess
    import sys

    code = (
        "import sys, splat_train.trainer.cli, splat_train.trainer.loop; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'scipy'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
