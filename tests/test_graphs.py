"""trainer/step/capture.py: the CUDA-graph head (activation + projection + SH) replays the eager pass, is
captured again exactly when its shapes or parameters change, and is what the trainer's step runs
under --cuda_graphs. On the CPU the capture is a stand-in that calls the function (the real
replay runs in tests/test_gpu.py)."""

import pytest
import torch

from splat_train.kernels import reference
from splat_train.trainer.step import capture as graphs
from splat_train.trainer.step import plan
from splat_train.trainer.step.capture import GraphedHead
from splat_train.trainer.launch import DistContext
from splat_train.trainer.model import activated
from splat_train.trainer.render import CameraBatch, render

from scenes import make_cameras, make_scene
from test_gsplat_flags import trainer


class FakeCapture:
    """Stands in for graphs.capture_graphs: records each capture's input shapes and
    checks that every replay passes tensors of those shapes (what a captured graph requires)."""

    def __init__(self):
        self.captured, self.samples, self.replays = [], [], 0

    def __call__(self, fn, sample):
        assert not any(t._base is not None or t.grad_fn is not None for t in sample)  # fresh leaves
        shapes = [tuple(t.shape) for t in sample]
        self.captured.append(shapes)
        self.samples.append(sample)

        def replay(*args):
            assert [tuple(t.shape) for t in args] == shapes
            self.replays += 1
            return fn(*args)

        return replay


def _raw_params(n=80, seed=4, sh_degree=1):
    scene = make_scene(seed, num_gaussians=n, sh_degree=sh_degree)
    raw = dict(
        means=scene["means"],
        quats=scene["quats"],
        scales=torch.log(scene["scales"]),
        opacities=torch.logit(scene["opacities"]),
        sh0=scene["colors"][:, :1],
        shN=scene["colors"][:, 1:],
    )
    return {k: v.clone().requires_grad_() for k, v in raw.items()}


def _cams(num=2, size=(24, 20)):
    cams = make_cameras([size] * num)
    return CameraBatch(torch.stack([c[0] for c in cams]), torch.stack([c[1] for c in cams]), *size)


def test_head_renders_and_differentiates_as_the_eager_pass():
    params, cams = _raw_params(), _cams()
    head = GraphedHead(reference, 0.01, 1e10, capture=FakeCapture())
    grads, colors = [], []
    for use_head in (False, True):
        gaussians = params if use_head else activated(params)
        out = render(gaussians, cams, DistContext(), reference, 1, head=head.head(params) if use_head else None)
        (out.colors.square().sum() + out.alphas.sum()).backward()
        grads.append({k: p.grad.clone() for k, p in params.items()})
        colors.append(out.colors.detach())
        for p in params.values():
            p.grad = None
    assert head.captures == 1
    torch.testing.assert_close(colors[1], colors[0], rtol=0, atol=0)
    for k in params:
        assert grads[0][k].abs().sum() > 0 or k == "shN", k
        torch.testing.assert_close(grads[1][k], grads[0][k], rtol=0, atol=0, msg=k)


def test_head_is_captured_again_only_when_its_key_changes():
    params, cams = _raw_params(), _cams()
    capture = FakeCapture()
    head = GraphedHead(reference, 0.01, 1e10, capture=capture)
    campos = torch.linalg.inv(cams.viewmats)[:, :3, 3]
    sizes = [(cams.width, cams.height)] * 2

    def call(sh_degree=1, sizes=sizes, viewmats=cams.viewmats):
        return head(params, viewmats, cams.Ks, campos, sizes, sh_degree)

    call()
    call(viewmats=cams.viewmats.flip(0).contiguous())  # other cameras, same shapes: a replay
    assert head.captures == 1 and capture.replays == 2
    call(sh_degree=0)
    assert head.captures == 2
    with torch.no_grad():
        params["means"].add_(0.01)  # the optimizer's in-place update: same buffers, a replay
    call(sh_degree=0)
    assert head.captures == 2
    params["opacities"] = params["opacities"].detach().clone().requires_grad_()  # an opacity reset
    call(sh_degree=0)
    assert head.captures == 3
    call(sh_degree=0, sizes=[(20, 24)] * 2)
    assert head.captures == 4 and capture.replays == 6
    # the cameras' static buffers are copies (a replay writes each step's cameras into them, never
    # into the step's own tensors); the parameters' are their storage under new leaves
    static = capture.samples[-1]
    assert static[6].data_ptr() != cams.viewmats.data_ptr() and torch.equal(static[6], cams.viewmats)
    assert static[0].data_ptr() == params["means"].data_ptr() and static[0] is not params["means"]


def test_a_failed_capture_runs_that_shape_eagerly_and_says_so_once():
    params, cams = _raw_params(), _cams()
    works = FakeCapture()

    def capture(fn, sample):
        if fail:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nmore")
        return works(fn, sample)

    said = []
    head = GraphedHead(reference, 0.01, 1e10, capture=capture, warn=said.append)
    eager = render(activated(params), cams, DistContext(), reference, 1)
    for fail, sh_degree in ((True, 1), (True, 1), (True, 0), (False, 1)):
        out = render(params, cams, DistContext(), reference, sh_degree, head=head.head(params))
        if sh_degree == 1:
            torch.testing.assert_close(out.colors, eager.colors, rtol=0, atol=0)
    assert head.failures == 2 and head.captures == 1 and works.replays == 1  # (True, 1) twice: one attempt
    assert said == [
        "--cuda_graphs: a capture failed, its shapes run without graphs "
        "(CUDA error: operation not permitted when stream is capturing)"
    ]


def test_shapes_that_keep_changing_stop_the_captures_for_the_run():
    """Two image sizes in turn (a batch-1 dataset of portrait and landscape images): the eighth
    capture within 100 steps is not made; the run goes on without graphs, said once, and does not
    capture again when the shapes settle (a guard that resumed would capture 7 times per window)."""
    params, cams = _raw_params(), _cams()
    campos = torch.linalg.inv(cams.viewmats)[:, :3, 3]
    capture, said = FakeCapture(), []
    head = GraphedHead(reference, 0.01, 1e10, capture=capture, warn=said.append)
    for i in range(300):
        size = (24, 20) if i % 2 == 0 or i >= 200 else (20, 24)
        out = head(params, cams.viewmats, cams.Ks, campos, [size] * 2, 1)
        assert out["colors"].shape == (2, 80, 3)
    assert head.stopped and head.captures == GraphedHead.most_captures - 1 == capture.replays
    assert said == [
        "--cuda_graphs: the shapes changed 8 times within 100 steps; the rest of the run goes without graphs"
    ]


def test_the_plan_graphs_only_dense_one_process_cuda_steps(monkeypatch):
    """step/plan.graphs_mode: whole steps for a CUDA step training the photometric loss (several
    processes with --cuda_graphs on); the head alone where more trains or the reverse exchange
    cannot be captured; none on the CPU,
    --packed, gsplat's pass or a moving tile grid. Each with its reason."""
    from splat_train.trainer.cli import parse_args

    monkeypatch.setattr(torch.version, "hip", None)

    def mode(*flags, device="cuda", world_size=1, raster="unfused", aux=()):
        return plan.graphs_mode(parse_args(["default", *flags]), device, world_size, raster, aux)

    assert mode() == ("whole", "--cuda_graphs auto")
    assert mode(device="cpu") == ("off", "a CPU run")
    assert mode("--packed") == ("off", "--packed")
    assert mode("--pipeline", "gsplat-dist") == ("off", "--pipeline gsplat-dist")
    assert mode("--random_tile_shift", raster="fused") == ("off", "--random_tile_shift")
    assert mode("--random_tile_shift", raster="unfused")[0] == "whole"  # the tiles do not move unfused
    assert mode(world_size=2) == ("off", "--cuda_graphs auto: 2 processes")
    assert mode("--cuda_graphs", "on", world_size=2) == (
        "whole",
        "--cuda_graphs on, 2 processes: the dense record exchange captured",
    )
    assert mode("--cuda_graphs", "on", "--absgrad", world_size=2) == ("head", "2 processes with --absgrad")
    assert mode(aux=("app",)) == ("head", "--app_opt trains besides the photometric loss")
    assert mode("--cuda_graphs", "off") == ("off", "--cuda_graphs off")


def test_training_step_runs_the_head_and_trains_as_without_it(monkeypatch):
    """The trainer's step under --cuda_graphs goes through the head (here on the CPU, with the
    stand-in capture) and trains exactly as the eager step; densification's new tensors make it
    capture again."""
    flags = ["--refine_start_iter", "2", "--refine_every", "3", "--grow_grad2d", "0.00002", "--max_steps", "9"]
    runs = []
    for use_head in (False, True):  # one after the other: densification draws from the global RNG
        t = trainer(*flags)  # seeds it
        if use_head:
            capture = FakeCapture()
            t.forward_backward.graphed_head = GraphedHead(t.ops, 0.01, 1e10, capture=capture)
        steps = []
        for step in range(9):
            t.train_step(step)
            steps.append({k: t.params[k].detach().clone() for k in graphs.PARAM_KEYS})
        runs.append(steps)
    counts = [s["means"].shape[0] for s in runs[1]]
    for step, (a, b) in enumerate(zip(*runs)):
        for k in graphs.PARAM_KEYS:
            torch.testing.assert_close(b[k], a[k], rtol=0, atol=0, msg=f"{k} at step {step}")
    assert capture.replays == 9
    assert len(set(counts)) > 1  # densification ran
    head = t.forward_backward.graphed_head
    assert head is not None and head.captures >= 2


def test_cuda_graphs_setting_auto_is_on_for_one_cuda_process_only(monkeypatch):
    monkeypatch.setattr(torch.version, "hip", None)
    assert plan.use_cuda_graphs("auto", 1) and not plan.use_cuda_graphs("auto", 2)
    assert plan.use_cuda_graphs("on", 1) and plan.use_cuda_graphs("on", 4)
    assert not plan.use_cuda_graphs("off", 1)
    monkeypatch.setattr(torch.version, "hip", "6.2")  # ROCm: only when asked for
    assert not plan.use_cuda_graphs("auto", 1) and plan.use_cuda_graphs("on", 1)
    with pytest.raises(ValueError, match="--cuda_graphs must be auto, on or off"):
        plan.use_cuda_graphs("yes", 1)


def test_cuda_graphs_flag_is_inert_on_the_cpu(capsys):
    assert trainer().cfg.step.cuda_graphs == "auto"  # the default
    assert "--cuda_graphs on" not in capsys.readouterr().err  # auto says nothing
    t = trainer("--cuda_graphs", "on")
    assert t.cfg.step.cuda_graphs == "on" and t.forward_backward.graphed_head is None
    assert "--cuda_graphs on: graphs do not apply to this run (a CPU run)" in capsys.readouterr().err
    t.train_step(0)


def test_a_capture_warms_up_only_for_sizes_degree_and_cameras_not_seen_before():
    """The eager warm-up before a capture (lazy loading, first-call work) runs for a new image
    size, SH degree or camera count, not when only the Gaussians changed (a densification)."""
    import types

    calls = []

    def counting(*args, **kwargs):
        calls.append(1)
        return reference.fully_fused_projection(*args, **kwargs)

    ops = types.SimpleNamespace(fully_fused_projection=counting, spherical_harmonics=reference.spherical_harmonics)
    capture = FakeCapture()
    head = GraphedHead(ops, 0.01, 1e10, capture=capture)
    cams = _cams()
    campos = torch.linalg.inv(cams.viewmats)[:, :3, 3]
    sizes = [(cams.width, cams.height)] * 2
    warm_ups = []
    for n, sh_degree in ((80, 1), (90, 1), (70, 1), (70, 0), (60, 0), (60, 1)):
        before = len(calls) + 0
        replays = capture.replays
        head(_raw_params(n=n), cams.viewmats, cams.Ks, campos, sizes, sh_degree)  # new parameters: a capture
        warm_ups.append(len(calls) - before - (capture.replays - replays))
    assert head.captures == 6
    assert warm_ups == [1, 0, 0, 1, 0, 0]
