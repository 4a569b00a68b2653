"""The Gaussians kept in Morton order (--morton_order): the order itself, the in-place row
permutation of the shard (parameters, Adam moments, strategy state), the shard created in that
order, and training runs that reorder after densification."""

import numpy as np
import pytest
import torch

from splat_train.trainer import shard as shard_mod
from splat_train.trainer.config import Config, ModelConfig, StepConfig
from splat_train.trainer.model import MORTON_BITS, _morton_codes, create_shard, morton_order

from test_model import _points
from test_prune import make_trainer


def _codes(means: torch.Tensor) -> torch.Tensor:
    """The Morton codes morton_order sorts by (the same box and cell size, computed here again)."""
    lo, hi = means.min(0).values, means.max(0).values
    scale = (2**MORTON_BITS - 1) / (hi - lo).max()
    return _morton_codes(((means - lo) * scale).long().clamp(0, 2**MORTON_BITS - 1))


def test_the_corners_of_a_cube_follow_the_z_curve():
    corners = torch.tensor([[x, y, z] for z in (0.0, 1.0) for y in (0.0, 1.0) for x in (0.0, 1.0)])
    shuffle = torch.tensor([5, 2, 7, 0, 3, 6, 1, 4])
    order = morton_order(corners[shuffle])
    # x is the lowest bit, then y, then z: the corners come back in the loop's order above
    assert torch.equal(shuffle[order], torch.arange(8))


def test_the_order_is_a_permutation_sorted_by_code_and_stable():
    g = torch.Generator().manual_seed(0)
    means = torch.rand(5000, 3, generator=g) * torch.tensor([10.0, 2.0, 0.5]) - 3.0
    means[100:110] = means[7]  # equal codes keep their row order
    order = morton_order(means)
    assert torch.equal(torch.sort(order).values, torch.arange(5000))
    codes = _codes(means)[order]
    assert bool((codes[1:] >= codes[:-1]).all())
    ties = order[torch.isin(order, torch.tensor([7, *range(100, 110)]))]
    assert torch.equal(ties, torch.tensor([7, *range(100, 110)]))


def test_consecutive_rows_are_close_in_space():
    """What the order is for: neighbours in memory are neighbours in space."""
    g = torch.Generator().manual_seed(1)
    means = torch.rand(20000, 3, generator=g)
    step = lambda m: (m[1:] - m[:-1]).norm(dim=1).mean()  # noqa: E731
    assert step(means[morton_order(means)]) < 0.1 * step(means)


def test_empty_and_single_inputs():
    assert morton_order(torch.empty(0, 3)).shape == (0,)
    assert torch.equal(morton_order(torch.ones(1, 3)), torch.zeros(1, dtype=torch.long))
    for shape in ((0, 3), (0, 15, 3), (5, 0, 3)):  # an empty shard; shN at SH degree 0
        t = torch.empty(shape)
        shard_mod.permute_rows_(t, torch.randperm(shape[0]))
        assert t.shape == shape


@pytest.mark.parametrize("shape", [(37,), (37, 3), (37, 15, 3), (37, 1, 3)])
def test_permute_rows_in_place_equals_indexing(shape):
    g = torch.Generator().manual_seed(2)
    t = torch.randn(*shape, generator=g)
    order = torch.randperm(shape[0], generator=g)
    expected = t[order].clone()
    ptr = t.data_ptr()
    shard_mod.permute_rows_(t, order)
    assert torch.equal(t, expected) and t.data_ptr() == ptr


def test_the_shard_is_created_in_morton_order_except_for_gsplats_pass():
    pts = _points(200)
    plain = create_shard(pts, Config(model=ModelConfig(sh_degree=1, morton_order=False)), 1, 3, torch.device("cpu"))
    cfg = Config(model=ModelConfig(sh_degree=1, morton_order=True))
    ordered = create_shard(pts, cfg, 1, 3, torch.device("cpu"))
    order = morton_order(plain["means"])
    assert not torch.equal(order, torch.arange(order.numel()))  # the test means something
    for k in plain:
        assert torch.equal(ordered[k], plain[k][order]), k
    gsplat_cfg = Config(model=ModelConfig(sh_degree=1, morton_order=True), step=StepConfig(pipeline="gsplat-dist"))
    gsplat_shard = create_shard(pts, gsplat_cfg, 1, 3, torch.device("cpu"))
    assert torch.equal(gsplat_shard["means"], plain["means"])


def test_reorder_permutes_parameters_moments_and_strategy_state_in_place():
    trainer = make_trainer(["--max_steps", "3"])
    for step in range(3):
        trainer.train_step(step)
    sh = trainer.shard
    n = sh.num
    before = {k: p.detach().clone() for k, p in sh.params.items()}
    moments = {
        k: {s: v.clone() for s, v in sh.optimizers[k].state[p].items() if v.dim() > 0} for k, p in sh.params.items()
    }
    assert all(len(m) == 2 for m in moments.values())  # exp_avg, exp_avg_sq
    for k in shard_mod.PER_GAUSSIAN_STATE:  # as after some steps of statistics
        sh.strategy_state[k] = torch.rand(n)
    strategy = {k: sh.strategy_state[k].clone() for k in shard_mod.PER_GAUSSIAN_STATE}
    ptrs = {k: p.data_ptr() for k, p in sh.params.items()}
    order = torch.randperm(n, generator=torch.Generator().manual_seed(3))
    sh.reorder(order)
    for k, p in sh.params.items():
        assert torch.equal(p.detach(), before[k][order]) and p.data_ptr() == ptrs[k], k
        for s, v in moments[k].items():
            assert torch.equal(sh.optimizers[k].state[p][s], v[order]), (k, s)
    for k, v in strategy.items():
        assert torch.equal(sh.strategy_state[k], v[order]), k
    with pytest.raises(ValueError, match="reorder: an order of"):
        sh.reorder(order[:-1])


def test_an_ordered_run_trains_as_the_plain_one_until_densification():
    """The order changes no step: the rasterizer composites by depth, every per-Gaussian stage is
    row by row, so the losses agree to float rounding (the sums run in another order)."""
    flags = ["--max_steps", "6", "--refine_every", "1000"]
    losses = {}
    for name, extra in (("plain", ["--no_morton_order"]), ("ordered", ["--morton_order"])):
        torch.manual_seed(0)
        trainer = make_trainer(flags + extra)
        losses[name] = [float(trainer.train_step(s)["loss"]) for s in range(6)]
    assert np.allclose(losses["plain"], losses["ordered"], rtol=1e-4, atol=0), losses


def test_densification_leaves_the_shard_in_morton_order():
    flags = ["--max_steps", "4", "--refine_every", "2", "--refine_start_iter", "0", "--grow_grad2d", "1e-12"]
    trainer = make_trainer(flags + ["--morton_order"])
    n0 = trainer.shard.num
    for step in range(4):
        trainer.train_step(step)
    means = trainer.params["means"].detach()
    assert means.shape[0] > n0  # it grew: the appended rows were put in place
    codes = _codes(means)
    assert bool((codes[1:] >= codes[:-1]).all())


def test_no_reorder_outside_the_strategys_refine_window(monkeypatch):
    """The shard is reordered after the steps where the strategy may refine, by the strategy's own
    window: none before its start, none once it stopped (the bytesplat preset lowers the
    strategy's stop step below --refine_stop_iter)."""
    flags = ["--max_steps", "8", "--refine_every", "2", "--refine_start_iter", "1", "--refine_stop_iter", "8"]
    trainer = make_trainer(flags + ["--morton_order", "--grow_grad2d", "1e9"])
    trainer.shard.strategy.refine_stop_iter = 5  # as prune.py's stage 2 sets it
    calls, current = [], [0]
    monkeypatch.setattr(shard_mod.GaussianShard, "reorder", lambda self, order: calls.append(current[0]))
    for step in range(8):
        current[0] = step
        trainer.train_step(step)
    assert calls == [2, 4], calls
