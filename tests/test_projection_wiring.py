"""The training step's --projection triton path (kernels/projection.py's kernels inside the graphed
head, the eager head and the trainer's step) gives what the activations + project_and_shade path
gives. The kernels run under TRITON_INTERPRET=1 in a child process (``python
tests/test_projection_wiring.py check``); the plan's choice itself is tested in-process."""

import dataclasses
import sys

import pytest
import torch

from interpreted import run_interpreted

from splat_train.trainer.cli import parse_args
from splat_train.trainer.step import plan


def _close(a, b, what, rtol=1e-4, atol=1e-5):
    torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=what)


def check() -> None:
    """The child's checks (TRITON_INTERPRET=1)."""
    from splat_train.kernels import reference
    from splat_train.trainer.launch import DistContext
    from splat_train.trainer.model import activated
    from splat_train.trainer.render import camera_centres, render
    from splat_train.trainer.step import ForwardBackward
    from splat_train.trainer.step.capture import GraphedHead, eager_head

    from test_graphs import FakeCapture, _cams, _raw_params
    from test_gsplat_flags import trainer

    params = _raw_params(n=150)
    cams = _cams()
    campos = camera_centres(cams.viewmats)
    sizes = [(cams.width, cams.height)] * cams.viewmats.shape[0]
    heads = {p: GraphedHead(reference, 0.01, 1e10, capture=FakeCapture(), projection=p) for p in ("gsplat", "triton")}
    outs = {p: h(params, cams.viewmats, cams.Ks, campos, sizes, 1) for p, h in heads.items()}
    assert outs["triton"]["radii"].dtype == torch.int32
    assert (outs["triton"]["radii"] != outs["gsplat"]["radii"]).sum() <= 1  # a ceil at the edge, at most
    for k in ("means2d", "depths", "conics", "colors"):
        visible = (outs["gsplat"]["radii"] > 0).all(-1)
        _close(outs["triton"][k][visible], outs["gsplat"][k][visible], k)

    # the eager head inside render(): same image, same gradients of the raw parameters
    results = {}
    for name in ("gsplat", "triton"):
        leaves = {k: v.detach().clone().requires_grad_() for k, v in params.items()}
        if name == "triton":
            res = render(
                leaves, cams, DistContext(), reference, 1, head=eager_head(leaves, 0.01, 1e10, "pinhole", False)
            )
        else:
            res = render(activated(leaves), cams, DistContext(), reference, 1)
        res.colors.square().mean().backward()
        results[name] = (res.colors.detach(), {k: v.grad for k, v in leaves.items()})
    _close(results["triton"][0], results["gsplat"][0], "image")
    for k in params:
        _close(results["triton"][1][k], results["gsplat"][1][k], f"grad {k}", rtol=1e-3, atol=1e-6)

    # the trainer's step with the plan's projection switched: the same gradients at the first
    # step (the initial Gaussians are isotropic, so the quaternions' gradients are rounding noise
    # on both paths: held to the scale of the others) and the same losses over three steps
    from splat_train.trainer import loop

    grads, losses = [], []
    real_step = loop.optimizer_step

    def spy(optimizers, visible=None, lazy_rows=None):
        grads.append({k: o.param_groups[0]["params"][0].grad.clone() for k, o in optimizers.items()})
        return real_step(optimizers, visible, lazy_rows)

    loop.optimizer_step = spy
    for name in ("gsplat", "triton"):
        t = trainer("--max_steps", "3")
        t.plan = dataclasses.replace(t.plan, projection=name)
        t.forward_backward = ForwardBackward(t.plan, t.cfg, t.forward_backward.eager.setup, t.loss, t.aux)
        losses.append([float(t.train_step(step)["loss"]) for step in range(3)])
    first = {k: (grads[0][k], grads[3][k]) for k in grads[0]}
    for k, (ref, got) in first.items():
        scale = max(float(v.abs().max()) for v in (first["means"][0], first["opacities"][0], ref) if v.numel())
        _close(got, ref, f"first step's grad of {k}", rtol=1e-3, atol=1e-5 * scale)
    _close(torch.tensor(losses[1]), torch.tensor(losses[0]), "losses", rtol=1e-5, atol=0)
    loop.optimizer_step = real_step
    check_lazy_sh_adam()
    print("ok")


# a city small enough for the interpreter: each camera sees a part of it
CITY = ("--synthetic_layout", "city", "--synthetic_num_gaussians", "3000", "--synthetic_num_cameras", "12",
        "--synthetic_image_size", "64", "--synthetic_image_height", "36")  # fmt: skip


def check_lazy_sh_adam() -> None:
    """--lazy_sh_adam through the trainer's step (kernels/adam.py's launch taken under the
    interpreter), started by auto after step 1 as where densification brings the shard to
    plan.LAZY_MIN_GAUSSIANS: the SH rows of the Gaussians the step's camera does not see wait, the
    step line says so; step 3 goes through the gsplat projection (every row caught up first, the SH
    Adam dense, no row waiting after it, whatever the last forward listed); after six steps the
    caught-up parameters and moments (state_dict) equal those of the dense SH Adam to float32
    rounding (relative norms), the losses too. The SH gradient rows the backward leaves unwritten
    are NaN here (on a GPU they hold anything): nothing may read them."""
    import dataclasses as dc

    from splat_train.kernels import projection
    from splat_train.trainer import model
    from splat_train.trainer.step import ForwardBackward

    from test_gsplat_flags import trainer

    model._uses_adam_kernel = lambda device: True  # the Triton Adam on CPU tensors, interpreted
    real_backward, poisoned = projection.backward_into, []

    def backward_into(
        params, viewmats, Ks, campos, bits, setup, grads, out, adam=None, seen_sh=False, listed=None, unseen_zeros=True
    ):
        if seen_sh:
            for k in projection.PARAM_KEYS:  # the geometric rows too: no loss term here, the Adam reads them by bits
                out[k].fill_(float("nan"))
            poisoned.append(k)
            assert listed is not None, "the deferred run's backward took the blockwise path"
            assert not unseen_zeros, "no loss term outside the projection, yet the unseen rows' zeros were asked"
        return real_backward(params, viewmats, Ks, campos, bits, setup, grads, out, adam, seen_sh, listed, unseen_zeros)

    projection.backward_into = backward_into
    from splat_train.trainer import loop

    runs = []
    for lazy in (False, True):
        t = trainer(*CITY, "--max_steps", "6", "--sh_degree_interval", "1")
        t.plan = dc.replace(t.plan, projection="triton", lazy_sh_adam=False, lazy_sh_adam_later=lazy)
        t.forward_backward = ForwardBackward(t.plan, t.cfg, t.forward_backward.eager.setup, t.loss, t.aux)
        losses, waited = [], 0
        triton_plan = t.forward_backward.plan
        for step in range(6):
            other = step == 3  # a step the Triton projection's forward does not take
            t.forward_backward.plan = dc.replace(triton_plan, projection="gsplat") if other else triton_plan
            losses.append(float(t.train_step(step)["loss"]))
            if step == 1:
                assert not t.defer_sh_adam_if_large(2)  # the shard is under the threshold
                threshold, loop.LAZY_MIN_GAUSSIANS = loop.LAZY_MIN_GAUSSIANS, t.shard.num
                assert t.defer_sh_adam_if_large(2) == lazy
                loop.LAZY_MIN_GAUSSIANS = threshold
                assert t.plan.lazy_sh_adam == lazy and (t.shard.lazy is not None) == lazy
            if lazy and step > 1:
                behind = int((t.shard.lazy.applied < t.shard.lazy.count).sum())
                assert t.forward_backward.lazy_listed == (not other)
                if other:
                    assert behind == 0, f"{behind} rows behind after a dense SH step"
                waited = max(waited, behind)
        state = t.shard.state_dict()
        moments = {k: o.state_dict()["state"][0] for k, o in t.optimizers.items()}
        runs.append((losses, state["params"], moments, waited))
    projection.backward_into = real_backward
    assert poisoned, "the deferred run's backward wrote every SH row: the NaN rows test nothing"
    (dense_losses, dense, dense_m, _), (lazy_losses, got, got_m, waited) = runs
    assert "deferred" in dc.replace(t.plan).describe()
    assert waited > 0, "no SH row waited: the test exercises nothing"
    _close(torch.tensor(lazy_losses), torch.tensor(dense_losses), "lazy losses", rtol=1e-5, atol=0)
    for k in dense:
        for n, a, b in (("", got[k], dense[k]), *((n, got_m[k][n], dense_m[k][n]) for n in ("exp_avg", "exp_avg_sq"))):
            err = float((a - b).norm() / b.norm().clamp_min(1e-30))
            # the quaternions of isotropic initial Gaussians get rounding noise for a gradient,
            # which Adam's normalization enlarges (measured 5e-4); the rest agree to 1e-6
            assert err <= (2e-3 if k == "quats" else 1e-5), (k, n, err)


def test_the_triton_projection_path_trains_as_the_gsplat_path():
    assert run_interpreted(__file__, "check").stdout.strip().endswith("ok")


@pytest.mark.parametrize(
    "flags, device, aux, expected",
    [
        ([], "cuda", (), ("triton", "--projection auto")),
        ([], "cpu", (), ("gsplat", "--projection auto: a CPU run")),
        (["--packed"], "cuda", (), ("gsplat", "--projection auto: --packed")),
        (["--camera_model", "fisheye"], "cuda", (), ("gsplat", "--projection auto: --camera_model fisheye")),
        (["--pipeline", "gsplat-dist"], "cuda", (), ("gsplat", "--projection auto: --pipeline gsplat-dist")),
        ([], "cuda", ("pose",), ("gsplat", "--projection auto: --pose_opt")),
        (["--batch_size", "40"], "cuda", (), ("gsplat", "--projection auto: 40 cameras a step (at most 32)")),
        (["--projection", "gsplat"], "cuda", (), ("gsplat", "--projection gsplat")),
        (["--projection", "triton"], "cuda", (), ("triton", "--projection triton")),
    ],
)
def test_the_plan_projects_with_triton_where_it_applies(monkeypatch, flags, device, aux, expected):
    from splat_train.kernels import projection

    monkeypatch.setattr(projection, "available", lambda: True)
    assert plan.projection_mode(parse_args(["default", *flags]), device, 1, aux) == expected


def test_projection_triton_where_it_cannot_run_is_one_clear_error(monkeypatch):
    from splat_train.kernels import projection

    monkeypatch.setattr(projection, "available", lambda: False)
    with pytest.raises(ValueError, match=r"--projection triton cannot run this pass \(Triton is not installed\)"):
        plan.projection_mode(parse_args(["default", "--projection", "triton"]), "cuda", 1, ())
    with pytest.raises(ValueError, match=r"\(a CPU run\)"):
        plan.projection_mode(parse_args(["default", "--projection", "triton"]), "cpu", 1, ())


if __name__ == "__main__" and sys.argv[1:] == ["check"]:
    check()
