"""trainer/step/backward_adam.py (the Gaussians' Adam inside the projection's backward) and the
step plan's choice of it (step/plan.py ``adam_mode``), on the CPU. The kernel itself:
tests/test_projection_kernel.py (interpreter and GPU); a training run with it: tests/test_gpu.py."""

import math

import pytest
import torch

from splat_train.kernels.projection import PARAM_KEYS
from splat_train.trainer.config import Config, from_argv
from splat_train.trainer.step.backward_adam import FROZEN, BackwardAdam
from splat_train.trainer.step.plan import adam_mode, memory_tight


def _optimizers(n=5):
    params = {
        "means": torch.zeros(n, 3),
        "quats": torch.zeros(n, 4),
        "scales": torch.zeros(n, 3),
        "opacities": torch.zeros(n),
        "sh0": torch.zeros(n, 1, 3),
        "shN": torch.zeros(n, 15, 3),
    }
    return {
        k: torch.optim.Adam([torch.nn.Parameter(v)], lr=1e-3 * (i + 1), eps=1e-15, betas=(0.9, 0.999))
        for i, (k, v) in enumerate(params.items())
    }


def test_prepare_writes_each_parameters_constants_and_the_moments_torch_makes():
    opts = _optimizers()
    adam = BackwardAdam("cpu")
    step = adam.prepare(opts)
    for i, k in enumerate(PARAM_KEYS):
        lr = 1e-3 * (i + 1)
        want = (lr / (1 - 0.9), 1 / math.sqrt(1 - 0.999), 0.9, 0.999, 1e-15)  # t = 1
        assert torch.allclose(adam.hyper[i], torch.tensor(want, dtype=torch.float32)), k
        p = opts[k].param_groups[0]["params"][0]
        state = opts[k].state[p]
        assert step.moments[k][0] is state["exp_avg"] and step.moments[k][1] is state["exp_avg_sq"]
        assert (state["exp_avg"] == 0).all() and state["exp_avg"].shape == p.shape
        assert float(state["step"]) == 0  # advanced by commit, not before the step ran


def test_commit_counts_a_step_the_kernel_took_and_leaves_one_it_did_not_to_the_optimizer():
    opts = _optimizers()
    adam = BackwardAdam("cpu")
    adam.prepare(opts)
    assert adam.commit(opts)  # no gradients: the kernel stepped
    counts = [float(next(iter(o.state.values()))["step"]) for o in opts.values()]
    assert counts == [1.0] * 6 and all(o._opt_called for o in opts.values())
    adam.prepare(opts)
    assert adam.hyper[0, 0] == pytest.approx(1e-3 / (1 - 0.9**2))  # t = 2
    opts["means"].param_groups[0]["params"][0].grad = torch.ones(5, 3)  # another projection ran
    assert not adam.commit(opts)
    assert [float(next(iter(o.state.values()))["step"]) for o in opts.values()] == [1.0] * 6


def test_selective_constants_have_no_bias_correction_and_no_count():
    opts = _optimizers()
    adam = BackwardAdam("cpu", selective=True)
    step = adam.prepare(opts)
    assert step.selective
    assert torch.allclose(adam.hyper[:, 0], torch.tensor([1e-3 * (i + 1) for i in range(6)]))
    assert (adam.hyper[:, 1] == 1).all()
    assert adam.commit(opts)
    assert all(float(next(iter(o.state.values()))["step"]) == 0 for o in opts.values())


def test_frozen_writes_an_update_that_changes_nothing_then_the_steps_constants():
    opts = _optimizers()
    adam = BackwardAdam("cpu")
    adam.prepare(opts)
    before = adam.hyper.clone()
    with adam.frozen():
        assert torch.equal(adam.hyper, torch.tensor([FROZEN] * 6, dtype=torch.float32))
        step_size, _, beta1, beta2, eps = FROZEN
        m, v, p, g = torch.randn(100), torch.rand(100), torch.randn(100), torch.randn(100)
        m2 = beta1 * m + (1 - beta1) * g  # kernels/adam.py's update with those constants
        v2 = beta2 * v + (1 - beta2) * g * g
        assert torch.equal(m2, m) and torch.equal(v2, v)
        assert torch.equal(p - step_size * m2 / (torch.sqrt(v2) + eps), p)
    assert torch.equal(adam.hyper, before)


def _cfg(*flags):
    return from_argv(["default", *flags]) if flags else Config()


def test_adam_mode_auto_follows_the_memory_the_projection_and_the_loss_terms():
    on, why = adam_mode(_cfg(), "triton")
    assert not on and "the separate launch is faster" in why
    on, why = adam_mode(_cfg(), "triton", tight=True)
    assert on and "memory" in why
    assert memory_tight(100_000_000, 100 * 2**30) and not memory_tight(20_000_000, 100 * 2**30)
    assert not memory_tight(10**9, None)  # unknown (a CPU run): not tight
    on, why = adam_mode(_cfg(), "gsplat")
    assert not on and "gsplat projection" in why
    on, why = adam_mode(_cfg("--opacity_reg", "0.01"), "triton", tight=True)
    assert not on and "--opacity_reg" in why
    on, why = adam_mode(_cfg("--scale_reg", "0.01"), "triton", tight=True)
    assert not on and "--scale_reg" in why
    assert adam_mode(_cfg("--fused_adam", "off"), "triton") == (False, "--fused_adam off")
    assert adam_mode(_cfg("--fused_adam", "on"), "triton") == (True, "--fused_adam on")


def test_fused_adam_on_where_it_cannot_run_is_refused_naming_why():
    with pytest.raises(ValueError, match="--fused_adam on cannot run this step.*--opacity_reg"):
        adam_mode(_cfg("--fused_adam", "on", "--opacity_reg", "0.01"), "triton")
    with pytest.raises(ValueError, match="gsplat projection"):
        adam_mode(_cfg("--fused_adam", "on"), "gsplat")


def test_the_fused_kernels_scratch_size(monkeypatch):
    """plan.scratch_mode: an eighth of the device's memory, at most half of what a step leaves
    free, never under the default (the default off a GPU and with the Adam in the backward);
    SPLAT_TRAIN_FUSED_SCRATCH_MB overrides the
    plan's size in kernels/fused_raster.py."""
    from splat_train.kernels import fused_raster as fr
    from splat_train.trainer.step.plan import TIGHT_BYTES_PER_GAUSSIAN, scratch_mode

    gib = 2**30
    default = float(fr.DEFAULT_SCRATCH_MB)
    assert scratch_mode("cuda", 80 * gib) == 10 * 1024  # free memory unknown: the share
    assert scratch_mode("cuda", 80 * gib, 70 * gib, 20_000_000) == 10 * 1024
    left = 30 * gib - 20_000_000 * TIGHT_BYTES_PER_GAUSSIAN  # what the step leaves of 30 GiB free
    assert scratch_mode("cuda", 80 * gib, 30 * gib, 20_000_000) == left / 2 / 2**20
    assert scratch_mode("cuda", 80 * gib, 20 * gib, 20_000_000) == default  # tight: the default
    assert scratch_mode("cuda", 8 * gib) == default and scratch_mode("cpu", 80 * gib) == default
    assert scratch_mode("cuda", 80 * gib, 70 * gib, 20_000_000, lean=True) == default  # --fused_adam's step
    monkeypatch.delenv("SPLAT_TRAIN_FUSED_SCRATCH_MB", raising=False)
    buckets_20m = fr._one_launch_buckets(45_000_000, 8_160)  # 1920x1080, 45 M intersections
    assert not fr.fits_one_launch(45_000_000, 8_160) and fr.fits_one_launch(45_000_000, 8_160, 10 * 1024)
    assert fr._scratch_cap_floats(10 * 1024) >= buckets_20m * fr.CP_BUCKET_FLOATS
    from splat_train.trainer.step.plan import StepPlan

    plan = StepPlan(raster="fused", raster_why="x", graphs="off", graphs_why="y", fused_scratch_mb=10 * 1024)
    assert "checkpoints up to 10.0 GiB a launch" in plan.describe()
    monkeypatch.setenv("SPLAT_TRAIN_FUSED_SCRATCH_MB", "1024")
    assert not fr.fits_one_launch(45_000_000, 8_160, 10 * 1024)  # the environment wins
    assert "checkpoints up to 1.0 GiB a launch" in plan.describe()  # and the console says so
    monkeypatch.setenv("SPLAT_TRAIN_FUSED_SCRATCH_MB", "0")
    with pytest.raises(ValueError, match="SPLAT_TRAIN_FUSED_SCRATCH_MB"):
        fr.fits_one_launch(1, 1, 10 * 1024)
