"""trainer/step/graphed.py: the whole one-process step replayed around the tile intersection gives the
eager step's loss and gradients, also when the tile lists are padded with stale entries, and is
captured again exactly when the head or the capacity changes. On the CPU the captures are eager
stand-ins with the same static buffers (the CUDA replay runs in tests/test_gpu.py)."""

import math

import torch

from splat_train.kernels import reference
from splat_train.kernels.constants import TILE_SIZE
from splat_train.kernels.fused_ssim import uint8_to_unit
from splat_train.trainer.step import capture as graphs
from splat_train.trainer.step.capture import GraphedHead, _Replay
from splat_train.trainer.launch import DistContext
from splat_train.trainer.losses import photometric_loss
from splat_train.trainer.model import activated
from splat_train.trainer.render import CameraBatch, render
from splat_train.trainer.cli import parse_args
from splat_train.trainer.step.graphed import GraphedStep, _extra_row_starts, capacity_for
from splat_train.trainer.step.plan import graphs_mode

from scenes import make_cameras, make_scene
from test_gsplat_flags import trainer


class EagerGraphs:
    """CPU stand-in of graphs.CapturedGraphs: the same static inputs, outputs and gradient
    buffers and the same replay methods, each replay running the function eagerly."""

    def __init__(self, fn, inputs):
        self.fn, self.inputs, self.replays = fn, inputs, 0
        out = fn(*inputs)
        self.outputs = tuple(o.detach().clone().requires_grad_(o.requires_grad) for o in out)
        self.grad_outputs = tuple(torch.zeros_like(o) for o in out if o.requires_grad)
        self.grad_inputs = tuple(torch.zeros_like(i) if i.requires_grad else None for i in inputs)
        self._live = out

    def __call__(self, *inputs):
        return _Replay.apply(self, *inputs)

    def replay_forward(self, *inputs):
        with torch.no_grad():
            for static, x in zip(self.inputs, inputs):
                if static.data_ptr() != x.data_ptr():
                    static.copy_(x)
        self._live = self.fn(*self.inputs)
        self.replays += 1
        with torch.no_grad():
            for static, o in zip(self.outputs, self._live):
                static.copy_(o)
        return self.outputs

    def replay_backward(self, grads=None):
        if grads is not None:
            for static, g in zip(self.grad_outputs, grads):
                static.copy_(g) if g is not None else static.zero_()
        outs = [o for o in self._live if o.requires_grad]
        wanted = [i for i in self.inputs if i.requires_grad]
        got = iter(torch.autograd.grad(outs, wanted, self.grad_outputs, allow_unused=True))
        for static in self.grad_inputs:
            if static is not None:
                g = next(got)
                static.copy_(g) if g is not None else static.zero_()
        return self.grad_inputs


class EagerCall:
    """CPU stand-in of graphs.CapturedCall: ``replay()`` runs the function on the static inputs
    and writes the static outputs."""

    instances: list = []

    def __init__(self, fn, inputs):
        self.fn, self.inputs, self.replays = fn, inputs, 0
        self.outputs = tuple(o.clone() for o in fn(*inputs))
        EagerCall.instances.append(self)

    def replay(self):
        self.replays += 1
        for static, o in zip(self.outputs, self.fn(*self.inputs)):
            static.copy_(o)
        return self.outputs


def _params(n=120, seed=5, sh_degree=1):
    scene = make_scene(seed, num_gaussians=n, sh_degree=sh_degree)
    raw = dict(
        means=scene["means"],
        quats=scene["quats"],
        scales=torch.log(scene["scales"]) + 0.7,  # footprints over several tiles
        opacities=torch.logit(scene["opacities"]),
        sh0=scene["colors"][:, :1],
        shN=scene["colors"][:, 1:],
    )
    return {k: v.clone().requires_grad_() for k, v in raw.items()}


def _cams(indices, size=(40, 36), of=6):
    cams = [make_cameras([size] * of)[i] for i in indices]
    gts = torch.stack([(c[4] * 255).round().to(torch.uint8) for c in cams])
    return CameraBatch(torch.stack([c[0] for c in cams]), torch.stack([c[1] for c in cams]), *size), gts


def _loss(colors, gts):
    return photometric_loss(colors, uint8_to_unit(gts), 0.2, ssim_padding="valid", ssim_backend_name="pytorch")


def _eager(params, cams, gts, sh_degree, backgrounds=None, absgrad=False):
    out = render(
        activated(params),
        cams,
        DistContext(),
        reference,
        sh_degree,
        backgrounds=backgrounds,
        keep_means2d_grad=True,
        absgrad=absgrad,
    )
    loss, parts = _loss(out.colors, gts)
    loss.backward()
    grads = {k: p.grad.clone() for k, p in params.items()}
    for p in params.values():
        p.grad = None
    info = out.info
    return loss.detach(), parts, grads, info


def _graphed(step, params, cams, gts, sh_degree, backgrounds=None):
    campos = torch.linalg.inv(cams.viewmats)[:, :3, 3]
    out = step(params, cams.viewmats, cams.Ks, campos, cams.width, cams.height, sh_degree, gts, backgrounds)
    assert out is not None
    grads = {k: p.grad.clone() for k, p in params.items()}
    for p in params.values():
        p.grad = None
    return out, grads


def _close(a, b, what):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7, msg=what)


def test_graphed_step_gives_the_eager_steps_loss_and_gradients_with_padded_tile_lists():
    params = _params()
    head = GraphedHead(reference, 0.01, 1e10, capture=EagerGraphs)
    step = GraphedStep(head, reference, _loss, absgrad=True, capture=EagerCall)
    ns = []
    for indices, bg in (([0, 3], None), ([1, 4], torch.rand(2, 3)), ([2, 5], None), ([0, 3], None)):
        cams, gts = _cams(indices)
        loss, parts, grads, info = _eager(params, cams, gts, 1, bg, absgrad=True)
        out, got = _graphed(step, params, cams, gts, 1, bg)
        ns.append(out.info.num_isects)
        assert out.info.num_isects == info.num_isects > 0
        _close(out.loss, loss, "loss")
        for k in ("l1", "ssim"):
            _close(out.parts[k], parts[k], k)
        for k in params:
            assert grads[k].abs().sum() > 0 or k == "shN", k
            _close(got[k], grads[k], k)
        _close(out.info.means2d.grad, info.means2d.grad, "means2d.grad")
        _close(out.info.absgrad.grad, info.absgrad.grad, "absgrad")
        assert torch.equal(out.info.radii, info.radii)
    # the first step's count set the capacity; later steps with fewer intersections read stale
    # entries past their count (padding that must not be rendered), larger ones captured again
    assert step.capacity >= max(ns) and len(set(ns)) > 1 and min(ns) < capacity_for(ns[0])
    capacity, key, expected = 0, None, 0  # a capture per new (capacity, background or not)
    for n, with_bg in zip(ns, (False, True, False, False)):
        capacity = capacity_for(n) if n > capacity else capacity
        expected += (capacity, with_bg) != key
        key = (capacity, with_bg)
    assert step.captures == expected == 3
    assert head.captures == 1


def test_graphed_fused_step_gives_the_eager_fused_steps_loss_and_gradients():
    """--raster fused: the tail runs the fused kernel (its source under the CPU emulation) over the
    padded tile lists (stale entries past the count, the extra row below each image) and gives the
    eager fused step's loss, loss terms and gradients, with and without backgrounds."""
    import functools
    import shutil

    import pytest

    from splat_train.kernels import fused_raster as fr

    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler to build the CPU emulation of the native kernel")
    fused = functools.partial(fr.emulated_fused_raster_loss, ssim_lambda=0.2)
    params = _params()
    head = GraphedHead(reference, 0.01, 1e10, capture=EagerGraphs)
    step = GraphedStep(head, reference, _loss, absgrad=True, capture=EagerCall, fused=fused)
    ns, captures = [], []
    # the second step replays the first one's capture with fewer intersections (stale entries of
    # the first past its count); the third, with a background, captures again
    for indices, bg in (([0, 3], None), ([1, 4], None), ([2, 5], torch.rand(2, 3))):
        cams, gts = _cams(indices)
        out = render(activated(params), cams, DistContext(), reference, 1, backgrounds=bg, rasterize=False)
        rec, tiles = out.info.records, out.info.tiles
        loss, stats = fused(
            rec.means2d, rec.conics, rec.colors, rec.opacities, tiles.offsets, tiles.flatten_ids,
            uint8_to_unit(gts), cams.width, cams.height, backgrounds=bg, absgrad=True,
        )  # fmt: skip
        loss.backward()
        grads = {k: p.grad.clone() for k, p in params.items()}
        for p in params.values():
            p.grad = None
        got_out, got = _graphed(step, params, cams, gts, 1, bg)
        ns.append(got_out.info.num_isects)
        captures.append(step.captures)
        assert got_out.info.num_isects == tiles.flatten_ids.numel() > 0
        _close(got_out.loss, loss.detach(), "loss")
        for k in ("l1", "ssim"):  # the kernel's terms, as the eager fused call gives them
            _close(got_out.parts[k], stats[k], k)
        for k in params:
            assert grads[k].abs().sum() > 0 or k == "shN", k
            torch.testing.assert_close(got[k], grads[k], rtol=1e-4, atol=1e-6, msg=k)
        torch.testing.assert_close(got_out.info.absgrad.grad.reshape(-1, 2), stats["absgrad"], rtol=1e-4, atol=1e-7)
    assert captures == [1, 1, 2] and head.captures == 1
    assert ns[1] < ns[0]  # the replayed step's buffer held the first step's longer list past its count


def test_the_fused_tail_leaves_its_weighted_gradients_in_the_head_buffers():
    """The fused tail (the kernel's source under the CPU emulation) with a rank's weight of 1/3:
    the kernel writes into the gradient buffers themselves (the same memory, stale contents
    replaced), scaled by the weight, bit for bit what autograd gives for weight x the eager fused
    call's loss; "depths" is zeroed. A buffer the kernel cannot take (strided) gets the same
    values through autograd and a copy."""
    import shutil

    import pytest

    from splat_train.kernels import fused_raster as fr
    from splat_train.trainer.step.graphed import RASTER_KEYS, _Tail, tail_function

    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler to build the CPU emulation of the native kernel")
    given = []  # the grads_out of each kernel call

    def fused(*args, grads_out=None, **kw):
        given.append(grads_out)
        return fr.emulated_fused_raster_loss(*args, ssim_lambda=0.2, grads_out=grads_out, **kw)

    weight = 1.0 / 3.0
    cams, gts = _cams([0, 3])
    out = render(activated(_params()), cams, DistContext(), reference, 1, rasterize=False)
    rec, tiles = out.info.records, out.info.tiles
    records = {k: getattr(rec, k).detach() for k in RASTER_KEYS}
    C, N = records["opacities"].shape
    w, h = cams.width, cams.height
    tail = _Tail(None, C, math.ceil(h / TILE_SIZE), math.ceil(w / TILE_SIZE), 4096, gts, None)
    tail.fill(tiles.offsets, tiles.flatten_ids, gts, None)
    leaves = [records[k].clone().requires_grad_() for k in RASTER_KEYS]
    want_loss, _ = fused(*leaves, tiles.offsets, tiles.flatten_ids, uint8_to_unit(gts), w, h)
    want = dict(zip(RASTER_KEYS, torch.autograd.grad(want_loss * weight, leaves)))
    for layout in ("contiguous", "strided"):
        targets = {k: torch.full_like(records[k], math.nan) for k in RASTER_KEYS}
        if layout == "strided":
            targets["colors"] = torch.full((C, N, 6), math.nan)[..., ::2]
        targets["depths"] = torch.full((C, N), math.nan)
        ptrs = {k: t.data_ptr() for k, t in targets.items()}
        fn = tail_function(reference, _loss, w, h, False, targets, fused=fused, weight=weight)
        leaves = [records[k].clone().requires_grad_() for k in RASTER_KEYS]
        loss, l1, ssim, _ = fn(*leaves, tail.offsets, tail.flatten_ids, tail.masks, tail.gts, None)
        if layout == "contiguous":  # the kernel wrote the buffers themselves
            assert all(given[-1][k] is targets[k] for k in RASTER_KEYS)
        else:
            assert given[-1] is None
        assert torch.equal(loss, want_loss.detach()) and l1 > 0, layout
        for k in RASTER_KEYS:
            assert targets[k].data_ptr() == ptrs[k] and want[k].abs().sum() > 0, (layout, k)
            assert torch.equal(targets[k], want[k]), (layout, k)
        assert torch.all(targets["depths"] == 0), layout


def test_a_fused_step_too_large_for_one_launch_runs_its_tail_uncaptured(monkeypatch):
    """A fused step whose checkpoint scratch exceeds SPLAT_TRAIN_FUSED_SCRATCH_MB runs the kernel
    in chunks of tiles, reading the tile offsets on the host, which no capture allows: that step's
    tail runs uncaptured between the head's replays (no second forward) and gives what the
    captured tail gives; a later step that fits is captured and replayed."""
    import functools
    import shutil

    import pytest

    from splat_train.kernels import fused_raster as fr

    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler to build the CPU emulation of the native kernel")
    params = _params()
    head = GraphedHead(reference, 0.01, 1e10, capture=EagerGraphs)
    fused = functools.partial(fr.emulated_fused_raster_loss, ssim_lambda=0.2)
    step = GraphedStep(head, reference, _loss, capture=EagerCall, fused=fused, absgrad=True)
    cams, gts = _cams([0, 3])
    campos = torch.linalg.inv(cams.viewmats)[:, :3, 3]
    args = (params, cams.viewmats, cams.Ks, campos, cams.width, cams.height, 1, gts)
    runs = []
    for scratch_mb in ("0.001", "2048"):  # 262 floats: less than one bucket; then one launch
        monkeypatch.setenv("SPLAT_TRAIN_FUSED_SCRATCH_MB", scratch_mb)
        calls = head.calls
        out = step(*args)
        assert out is not None and head.calls == calls + 1  # the head ran once, replayed
        runs.append((float(out.loss), out.info.absgrad.grad.clone(), {k: p.grad.clone() for k, p in params.items()}))
        for p in params.values():
            p.grad = None
        if scratch_mb == "0.001":
            assert step.declined == 1 and step.captures == 0 and not step.failed
    assert step.captures == 1 and step.declined == 1
    (loss_a, abs_a, grads_a), (loss_b, abs_b, grads_b) = runs
    assert math.isclose(loss_a, loss_b, rel_tol=1e-6) and torch.isfinite(torch.tensor(loss_a))
    torch.testing.assert_close(abs_a, abs_b, rtol=1e-5, atol=1e-8)
    for k in grads_a:
        torch.testing.assert_close(grads_a[k], grads_b[k], rtol=1e-5, atol=1e-8, msg=k)


def test_the_extra_tile_row_ends_each_real_tile_where_the_eager_lists_do():
    """Rasterizing the padded lists (garbage past the count, the extra row masked) equals
    rasterizing gsplat's own, with the reference's last-tile rule (the list length)."""
    params = _params(seed=9)
    cams, _ = _cams([0, 2, 4])
    out = render(activated(params), cams, DistContext(), reference, 1, keep_means2d_grad=True)
    recs, tiles = out.info.records, out.info.tiles
    C, th, tw = tiles.offsets.shape
    n = tiles.flatten_ids.numel()
    cap = capacity_for(n)
    padded = torch.cat([tiles.offsets, _extra_row_starts(tiles.offsets, n)[:, None, None].expand(C, 1, tw)], dim=1)
    last = tiles.flatten_ids[int(tiles.offsets[-1, -1, -1]) :]  # the last tile's list
    assert last.numel() > 0
    ids = torch.cat([tiles.flatten_ids, last.repeat(cap // last.numel() + 1)[: cap - n]])  # its entries again
    masks = torch.ones(C, th + 1, tw, dtype=torch.bool)
    masks[:, th] = False
    args = (recs.means2d, recs.conics, recs.colors, recs.opacities, cams.width, cams.height, TILE_SIZE)
    colors, alphas = reference.rasterize_to_pixels(*args, padded, ids, masks=masks)
    torch.testing.assert_close(colors, out.colors, rtol=0, atol=0)
    # without the extra row the padding lands in the last real tile and changes the image
    wrong, _ = reference.rasterize_to_pixels(*args, tiles.offsets, ids)
    assert not torch.equal(wrong, out.colors)
    assert th == math.ceil(cams.height / TILE_SIZE)


def test_graphed_step_declines_without_a_head_capture_and_says_once_when_its_capture_fails():
    params = _params()
    cams, gts = _cams([0, 3])
    campos = torch.linalg.inv(cams.viewmats)[:, :3, 3]
    args = (params, cams.viewmats, cams.Ks, campos, cams.width, cams.height, 1, gts)
    plain = GraphedHead(reference, 0.01, 1e10, capture=lambda fn, sample: fn)  # a replay without buffers
    assert GraphedStep(plain, reference, _loss, capture=EagerCall)(*args) is None

    def refuse(fn, inputs):
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nmore")

    said = []
    step = GraphedStep(
        GraphedHead(reference, 0.01, 1e10, capture=EagerGraphs), reference, _loss, capture=refuse, warn=said.append
    )
    assert step(*args) is None and step(*args) is None
    assert step.failed and step.failures == 1
    assert said == [
        "--cuda_graphs: the step's tail could not be captured, steps run eagerly "
        "(CUDA error: operation not permitted when stream is capturing)"
    ]


def test_a_superseded_head_capture_is_gone_before_the_next_is_made():
    """The tail holds the head's capture it reads; when the head's key changes (a densification),
    both go before the head captures again, and a step the head runs eagerly drops the tail too."""
    import gc
    import weakref

    made = []

    def capture(fn, inputs):
        if made:
            assert made[-1]() is None, "the previous head capture is still alive"
        graphs_ = EagerGraphs(fn, inputs)
        made.append(weakref.ref(graphs_))
        return graphs_

    head = GraphedHead(reference, 0.01, 1e10, capture=capture)
    step = GraphedStep(head, reference, _loss, capture=EagerCall)
    cams, gts = _cams([0, 3])
    gc.disable()
    try:
        for seed in (5, 6, 7):  # new parameter tensors each time: a new head key
            params = _params(seed=seed)
            _graphed(step, params, cams, gts, 1)
            del params
    finally:
        gc.enable()
    assert head.captures == 3 and step.captures == 3
    head.stopped = True  # from now on the head runs eagerly: the graphed step declines
    calls = head.calls
    campos = torch.linalg.inv(cams.viewmats)[:, :3, 3]
    params = _params(seed=8)
    assert step(params, cams.viewmats, cams.Ks, campos, cams.width, cams.height, 1, gts) is None
    assert step._tail is None and made[-1]() is None and head.calls == calls  # counted by the eager step


def test_training_steps_graphed_whole_train_as_the_eager_steps(monkeypatch):
    """The trainer's step with the whole-step replay (stand-in captures on the CPU) trains as the
    eager step to rounding, through densification (which captures head and tail again)."""
    flags = ["--refine_start_iter", "2", "--refine_every", "3", "--grow_grad2d", "0.00002", "--max_steps", "9"]
    _train_both_ways(monkeypatch, flags)


def test_training_steps_graphed_whole_train_as_the_eager_steps_with_other_flags(monkeypatch):
    """As above with absgrad, random backgrounds, SelectiveAdam and two images per step."""
    flags = ["--refine_start_iter", "2", "--refine_every", "3", "--grow_grad2d", "0.0002", "--max_steps", "9"]
    flags += ["--absgrad", "--random_bkgd", "--visible_adam", "--batch_size", "2"]
    _train_both_ways(monkeypatch, flags)


def _train_both_ways(monkeypatch, flags):
    runs, losses = [], []
    for graphed in (False, True):  # one after the other: densification draws from the global RNG
        t = trainer(*flags)  # seeds it
        fb = t.forward_backward
        assert fb.graphed_step is None  # a CPU run
        if graphed:
            fb.graphed_head = GraphedHead(t.ops, 0.01, 1e10, capture=EagerGraphs)
            fb.graphed_step = GraphedStep(fb.graphed_head, t.ops, t.loss, t.cfg.densify.absgrad, capture=EagerCall)
        steps, run_losses = [], []
        for i in range(9):
            out = t.train_step(i)
            run_losses.append(float(out["loss"]))
            steps.append({k: t.params[k].detach().clone() for k in graphs.PARAM_KEYS})
        runs.append(steps)
        losses.append(run_losses)
    torch.testing.assert_close(torch.tensor(losses[1]), torch.tensor(losses[0]), rtol=1e-5, atol=0)
    for i, (a, b) in enumerate(zip(*runs)):
        for k in graphs.PARAM_KEYS:
            assert a[k].shape == b[k].shape, (k, i)
            torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-6, msg=f"{k} at step {i}")
    counts = [s["means"].shape[0] for s in runs[1]]
    assert len(set(counts)) > 1  # densification ran
    fb = t.forward_backward
    assert fb.graphed_step.captures >= 2 and fb.graphed_head.captures >= 2 and fb.graphed_step.failures == 0


def test_whole_steps_are_graphed_only_where_nothing_but_the_photometric_loss_trains(monkeypatch):
    monkeypatch.setattr(torch.version, "hip", None)

    def mode(*flags, world_size=1, raster="unfused", aux=()):
        return graphs_mode(parse_args(["default", *flags]), "cuda", world_size, raster, aux)[0]

    assert mode() == "whole"
    assert mode("--absgrad", "--random_bkgd", "--batch_size", "2") == "whole"
    assert mode("--cuda_graphs", "on", world_size=2) == "whole"  # the record exchange captured
    assert mode("--cuda_graphs", "on", "--sparse_grad_comm", world_size=2) == "head"
    assert mode("--cuda_graphs", "on", "--opacity_reg", "0.01", world_size=2) == "head"
    assert mode(world_size=2) == "off"  # auto: one process only
    assert mode(raster="fused") == "whole"
    assert mode("--raster", "fused", "--random_tile_shift", raster="fused") == "off"  # renders change size
    assert mode(aux=("app",)) == "head"
    for flags in (["--opacity_reg", "0.01"], ["--scale_reg", "0.01"], ["--depth_loss"], ["--tb_save_image"]):
        assert mode(*flags) == "head", flags


def test_a_capture_that_fails_without_its_warm_up_is_tried_once_more_with_it():
    refusals = []

    def capture(fn, inputs):
        if step.captures == 1 and not refusals:  # the second capture, its warm-up skipped
            refusals.append(1)
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        return EagerCall(fn, inputs)

    head = GraphedHead(reference, 0.01, 1e10, capture=EagerGraphs)
    step = GraphedStep(head, reference, _loss, capture=capture)
    cams, gts = _cams([0, 3])
    for seed in (5, 6):
        _graphed(step, _params(seed=seed), cams, gts, 1)
    assert refusals == [1] and step.captures == 2 and step.failures == 0 and not step.failed


def test_a_step_that_sees_nothing_matches_the_eager_step_and_later_steps_still_do():
    """No intersections (the cameras turned away from the scene): the tail is captured with only
    padding in its lists, gives the eager step's loss and zero gradients, and the next step that
    sees the scene is right too."""
    params = _params()
    head = GraphedHead(reference, 0.01, 1e10, capture=EagerGraphs)
    step = GraphedStep(head, reference, _loss, capture=EagerCall)
    cams, gts = _cams([0, 3])
    away = cams.viewmats.clone()
    away[:, :3, :] = -away[:, :3, :]  # x, y and z of every camera flipped: the scene is behind it
    away[:, :, 3] = cams.viewmats[:, :, 3] * torch.tensor([1.0, 1.0, -1.0, 1.0])
    blind = CameraBatch(away, cams.Ks, cams.width, cams.height)
    counts = []
    for batch in (blind, cams):
        loss, _, grads, info = _eager(params, batch, gts, 1)
        out, got = _graphed(step, params, batch, gts, 1)
        assert out.info.num_isects == info.num_isects
        counts.append(info.num_isects)
        _close(out.loss, loss, "loss")
        for k in params:
            _close(got[k], grads[k], k)
    assert counts[0] == 0 and counts[1] > 0 and step.capacity >= counts[1]


def test_the_plans_scratch_size_decides_whether_a_fused_tail_is_captured(monkeypatch):
    """Without SPLAT_TRAIN_FUSED_SCRATCH_MB the step plan's scratch size (StepPlan.fused_scratch_mb,
    passed to the fused callable and to GraphedStep alike) decides: below one bucket the tail runs
    uncaptured, in chunks; at the plan's default it is captured; both give the same loss."""
    import functools
    import shutil

    import pytest

    from splat_train.kernels import fused_raster as fr

    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler to build the CPU emulation of the native kernel")
    monkeypatch.delenv("SPLAT_TRAIN_FUSED_SCRATCH_MB", raising=False)
    cams, gts = _cams([0, 3])
    campos = torch.linalg.inv(cams.viewmats)[:, :3, 3]
    losses = []
    for scratch_mb in (0.001, fr.DEFAULT_SCRATCH_MB):
        params = _params()
        head = GraphedHead(reference, 0.01, 1e10, capture=EagerGraphs)
        fused = functools.partial(fr.emulated_fused_raster_loss, ssim_lambda=0.2, scratch_mb=scratch_mb)
        step = GraphedStep(head, reference, _loss, capture=EagerCall, fused=fused, scratch_mb=scratch_mb)
        out = step(params, cams.viewmats, cams.Ks, campos, cams.width, cams.height, 1, gts)
        assert out is not None and not step.failed
        assert (step.declined, step.captures) == ((1, 0) if scratch_mb < 1 else (0, 1))
        losses.append(float(out.loss))
    assert math.isclose(losses[0], losses[1], rel_tol=1e-6)
