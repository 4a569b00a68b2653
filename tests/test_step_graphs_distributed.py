"""trainer/step/graphed_exchange.py: the whole-step replay on the distributed path (the record
exchanges captured between the head and the tail) trains as the eager distributed step, over a
group of one rank (--loopback) and over two ranks with unequal shards, through densification
(which changes the counts and captures the exchange again). On the CPU the captures are eager
stand-ins with the same static buffers, over gloo; the CUDA replay over NCCL runs in
tests/test_loopback.py (-m gpu)."""

import pytest
import torch

from splat_train.trainer.launch import DistContext, launch, loopback_group
from splat_train.trainer.step import capture as graphs
from splat_train.trainer.step.capture import GraphedHead
from splat_train.trainer.step.graphed import GraphedStep
from splat_train.trainer.step.graphed_exchange import GraphedExchange, HeadBinding

from test_step_graphs import EagerCall, EagerGraphs

FLAGS = [
    "--synthetic_image_size",
    "32",
    "--synthetic_num_cameras",
    "8",
    "--synthetic_num_gaussians",
    "101",  # two ranks: shards of 51 and 50
    "--num_traj_frames",
    "0",
    "--sh_degree",
    "1",
    "--refine_start_iter",
    "2",
    "--refine_every",
    "3",
    "--grow_grad2d",
    "0.00002",
    "--max_steps",
    "9",
]
STEPS = 8


class _Refusing:
    """A capture stand-in that refuses calls of the kind ``which`` from its ``nth`` (1-based) on:
    "tail" (a capture with inputs, as the tail's; every later one too, so that the step's retry
    with a warm-up fails as well) or "head" (the head's capture: the ``nth`` only), and stands in
    eagerly for the others."""

    def __init__(self, stand_in, which: str, nth: int):
        self.stand_in, self.which, self.nth, self.calls = stand_in, which, nth, 0

    def __call__(self, fn, inputs):
        if self.which == "head" or len(inputs) > 0:
            self.calls += 1
            if self.calls == self.nth or (self.which == "tail" and self.calls > self.nth):
                raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        return self.stand_in(fn, inputs)


def _run(ctx: DistContext, flags, graphed: bool, steps: int = STEPS, refuse=None) -> dict:
    """A trainer of ``flags`` on rank ``ctx``: ``steps`` steps, eager or with the whole-step
    replay on stand-in captures; returns the parameters after each step, the losses, the
    collectives and the replay's counters. ``refuse``: (rank, "tail" | "head", n): that rank's
    n-th capture of that kind is refused (the other ranks' are not)."""
    from splat_train.trainer.cli import parse_args
    from splat_train.trainer.cli import build_scene
    from splat_train.trainer.loop import Trainer

    torch.set_num_threads(1)
    cfg = parse_args(["default", *flags, *(["--loopback"] if ctx.loopback else [])])
    t = Trainer(cfg, ctx, build_scene(cfg))
    fb = t.forward_backward
    assert fb.graphed_step is None  # a CPU run
    if graphed:
        head_capture, step_capture = EagerGraphs, EagerCall
        if refuse is not None and refuse[0] == ctx.rank:
            if refuse[1] == "head":
                head_capture = _Refusing(EagerGraphs, "head", refuse[2])
            else:
                step_capture = _Refusing(EagerCall, "tail", refuse[2])
        fb.graphed_head = GraphedHead(t.ops, 0.01, 1e10, capture=head_capture, warn=lambda line: None)
        fb.graphed_step = GraphedStep(
            fb.graphed_head, t.ops, t.loss, capture=step_capture, ctx=ctx, warn=lambda line: None
        )
    ctx.stats.reset()
    out = dict(params=[], losses=[])
    for step in range(steps):
        out["losses"].append(float(t.train_step(step)["loss"]))
        out["params"].append({k: t.params[k].detach().clone() for k in graphs.PARAM_KEYS})
    out["comm"] = ctx.stats.reset()
    if graphed:
        whole = fb.graphed_step
        out["exchange_stopped"] = whole.exchange_stopped
        out.update(
            captures=whole.captures,
            exchanges=whole.exchange_captures,
            failures=whole.failures,
            head_failures=fb.graphed_head.failures,
        )
        assert whole._exchange is not None
        fb.release()
        assert whole._exchange is None
    return out


def _assert_trains_as(graphed: dict, eager: dict, where: str, failures: int = 0) -> None:
    torch.testing.assert_close(torch.tensor(graphed["losses"]), torch.tensor(eager["losses"]), rtol=1e-5, atol=0)
    for i, (a, b) in enumerate(zip(eager["params"], graphed["params"])):
        for k in graphs.PARAM_KEYS:
            assert a[k].shape == b[k].shape, (where, k, i)
            torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-6, msg=f"{where}: {k} at step {i}")
    counts = [p["means"].shape[0] for p in graphed["params"]]
    assert len(set(counts)) > 1, where  # densification ran: new counts, a new exchange
    refused = graphed["failures"] + graphed["head_failures"]
    assert refused >= failures and (refused > 0) == (failures > 0), where
    assert graphed["exchanges"] >= 2 and graphed["captures"] >= 1, where


def test_whole_steps_at_loopback_train_as_the_eager_loopback_steps():
    """Over a group of one rank: the same training, and the replayed exchanges counted as the
    eager ones (one forward and one reverse all_to_all a step; the warm-up and the capture not).
    Unfused: the fused tail is the one-process replay's (tests/test_step_graphs.py), the exchange
    the same for both."""
    flags = FLAGS
    runs = {}
    for graphed in (False, True):  # one after the other: densification draws from the global RNG
        with loopback_group(DistContext()) as ctx:
            runs[graphed] = _run(ctx, flags, graphed)
    _assert_trains_as(runs[True], runs[False], "loopback")
    calls = runs[True]["comm"]["calls"]
    assert calls["forward/all_to_all"] == calls["backward/all_to_all"] == STEPS
    assert calls == runs[False]["comm"]["calls"]


def _two_ranks(ctx: DistContext, flags, out_dir, refuse=None):
    runs = {graphed: _run(ctx, flags, graphed, refuse=refuse) for graphed in (False, True)}
    torch.save(runs, f"{out_dir}/runs_rank{ctx.rank}.pt")


def test_whole_steps_over_two_ranks_train_as_the_eager_distributed_steps(tmp_path):
    """W = 2 over gloo, shards of unequal size, two images a step from 7 training views (so the
    ranks' camera counts differ at some steps): every rank trains its shard as the eager step
    does (the split sizes, the owners' order along the received records, the renderers' camera
    offsets and the loss's share of the global batch are the replay's own code), and the reverse
    exchange sends 9 of the eager one's 10 gradient lanes (the depth lane, zero in a photometric
    step, stays home)."""
    flags = FLAGS + ["--batch_size", "2"]
    assert launch(_two_ranks, (flags, str(tmp_path)), nproc_per_node=2, device="cpu") == 0
    for rank in range(2):
        runs = torch.load(tmp_path / f"runs_rank{rank}.pt")
        _assert_trains_as(runs[True], runs[False], f"rank {rank}")
        sent = {graphed: runs[graphed]["comm"]["bytes_sent"] for graphed in (False, True)}
        assert sent[True]["forward/all_to_all"] == sent[False]["forward/all_to_all"] > 0
        assert sent[True]["backward/all_to_all"] * 10 == sent[False]["backward/all_to_all"] * 9


@pytest.mark.parametrize("which, nth", [("tail", 2), ("head", 2)])
def test_a_capture_refused_on_one_rank_leaves_every_rank_in_step(tmp_path, which, nth):
    """One rank's tail capture refused (it runs uncaptured between the replays), or one rank's head
    capture refused after densification (its head runs through autograd, its records through the
    same exchange): the other rank's collectives still meet this rank's, and both train as the
    eager step."""
    args = (FLAGS, str(tmp_path), (1, which, nth))
    assert launch(_two_ranks, args, nproc_per_node=2, device="cpu") == 0
    for rank in range(2):
        runs = torch.load(tmp_path / f"runs_rank{rank}.pt")
        _assert_trains_as(runs[True], runs[False], f"rank {rank}", failures=int(rank == 1))


def test_the_exchange_refuses_a_layout_its_records_disagree_with_and_says_when_a_capture_is_refused():
    """Head outputs of another shape than the counts say: ValueError. A capture the backend
    refuses: one line, and that direction runs eagerly on the same buffers (a replay still moves
    the records)."""
    with loopback_group(DistContext()) as ctx:
        N, C = 7, 2
        sources = {
            "radii": torch.randint(0, 5, (C, N, 2), dtype=torch.int32),
            "means2d": torch.randn(C, N, 2),
            "depths": torch.rand(C, N),
            "conics": torch.randn(C, N, 3),
            "opacities": torch.rand(C, N),
            "colors": torch.rand(C, N, 3),
        }
        targets = {k: torch.zeros_like(sources[k]) for k in ("means2d", "depths", "conics", "opacities", "colors")}
        lines = []

        def refuse(fn, inputs):
            raise RuntimeError("operation not permitted when stream is capturing")

        cpu = torch.device("cpu")
        with pytest.raises(ValueError, match="pass layout says"):
            HeadBinding(GraphedExchange(ctx, [N + 1], [C], cpu, EagerCall), sources, targets, EagerCall)
        ex = GraphedExchange(ctx, [N], [C], cpu, refuse, warn=lines.append)
        binding = HeadBinding(ex, sources, targets, refuse, warn=lines.append)
        assert ex.captured == {"forward": False, "backward": False} and len(lines) == 4
        assert "forward record exchange could not be captured" in lines[0]
        calls = ctx.stats.reset()["calls"]
        sources["means2d"].add_(1.0)
        binding.pack()
        got = ex.forward()
        assert torch.equal(got["means2d"], sources["means2d"]) and torch.equal(got["radii"], sources["radii"])
        assert torch.equal(got["opacities"], sources["opacities"]) and torch.equal(got["colors"], sources["colors"])
        ex.record_grads["conics"].normal_()
        targets["depths"].fill_(3.0)
        ex.backward()
        binding.unpack()
        assert torch.equal(targets["conics"], ex.record_grads["conics"]) and not targets["depths"].any()
        # the warm-ups were not counted; each eager replay once
        assert calls == {} and ctx.stats.reset()["calls"] == {"forward/all_to_all": 1, "backward/all_to_all": 1}
        binding.release()
        ex.release()


def test_a_superseded_exchange_is_gone_before_the_next_is_built_without_the_cycle_collector(monkeypatch):
    """Densification changes the counts: the old exchange (its collectives' graphs and buffers) and
    the tail that read it are freed before the new exchange is built, also where that tail ran
    uncaptured (its call and its inputs' closure refer to each other) and the cycle collector is
    off, as it is during a capture."""
    import gc
    import weakref

    from splat_train.trainer.step import graphed as graphed_module

    made, alive_at_build = [], []

    class Tracked(GraphedExchange):
        def __init__(self, *args, **kwargs):
            alive_at_build.append(sum(r() is not None for r in made))
            super().__init__(*args, **kwargs)
            made.append(weakref.ref(self))

    class Kept(list):  # test_step_graphs.EagerCall keeps its instances (and their functions) here
        def append(self, item):
            pass

    monkeypatch.setattr(graphed_module, "GraphedExchange", Tracked)
    monkeypatch.setattr(EagerCall, "instances", Kept())
    gc.disable()
    try:
        with loopback_group(DistContext()) as ctx:
            _run(ctx, FLAGS, True, refuse=(0, "tail", 1))  # every tail uncaptured
    finally:
        gc.enable()
    assert len(made) >= 2 and alive_at_build == [0] * len(made)


def test_a_pass_layout_that_changes_too_often_runs_the_exchange_without_graphs():
    """Two images a step from 7 training views: the rank's camera count changes at epoch ends, and
    each change builds the exchange anew. After GraphedHead.most_captures builds within its window
    (counted from the layouts alone, which every rank sees alike) the collectives and the tails
    run eagerly, and the run still trains as the eager step."""
    flags = [f for f in FLAGS]
    flags[flags.index("--refine_start_iter") + 1] = "1000"  # no densification: only the camera counts change
    flags += ["--batch_size", "2", "--max_steps", "40"]
    runs = {}
    for graphed in (False, True):
        with loopback_group(DistContext()) as ctx:
            runs[graphed] = _run(ctx, flags, graphed, steps=36)
    # the builds before the one that stops were captured, none after
    assert runs[True]["exchange_stopped"] and runs[True]["exchanges"] == GraphedHead.most_captures - 1
    torch.testing.assert_close(
        torch.tensor(runs[True]["losses"]), torch.tensor(runs[False]["losses"]), rtol=1e-5, atol=0
    )
    for k in graphs.PARAM_KEYS:
        torch.testing.assert_close(runs[True]["params"][-1][k], runs[False]["params"][-1][k], rtol=1e-4, atol=1e-6)
