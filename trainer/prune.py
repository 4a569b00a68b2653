"""ByteSplat's hardware-aware training stages (ByteSplat §5.2, Fig. 8).

1. Train and densify as usual (``Trainer.train_step``; nothing here).
2. Initial pruning, after ``--prune_stage2_step``: render every training view, find each pixel's
   largest-contribution Gaussian (largest alpha * T, the blending weight of gsplat's compositing)
   and keep only the union of these winners; densification stays off from that step on
   (:func:`limit_densification`). Hardware-independent.
3. Hardware-aware pruning, after ``--prune_stage3_step``: each tile of each training view should
   hold at most ``B`` Gaussians (:func:`tile_budget`: the GPU's shared memory over a record plus its
   column of per-pixel state, what ByteSplat's design keeps on chip). This project's fused kernel
   (kernels/csrc, native) has no such cliff: it runs every tile, whatever its length, at a cost
   that grows with the tile's Gaussians (a 32-Gaussian bucket per warp task in the backward), so
   ``B`` is a work target, not a limit: stage 3 removes the Gaussians that crowd the heaviest
   tiles, which shortens the longest per-tile lists (the blocks that finish last) and the total
   work; whether that buys speed on a given scene is measured with ``splat-train bench-raster
   --ckpt`` before and after the stage (docs/bytesplat.md). In rounds,
   re-measuring after each, the Gaussians of over-budget tiles are ranked by

       score = (overload / B) / (importance + EPS)

   with ``overload`` = sum over the (view, tile) pairs the Gaussian intersects of ``max(0, n_t - B)``
   (``n_t``: Gaussians listed in the tile; a Gaussian in a tile twice over budget weighs more than in
   one just over it) and ``importance`` = sum over views and pixels of its alpha * T (units: pixels).
   Highest score first; ties go to the lower global index (the shard-concatenated order). Each
   round removes ``k = min(ceil(prune_fraction * candidates), ceil(candidates * E / S))`` of them,
   with ``E`` = sum over over-budget (view, tile) pairs of ``n_t - B`` and ``S`` = sum of their
   ``n_t``: removing the fraction E / S of the candidates takes the over-budget tiles down by their
   average excess fraction, an estimate of what is still needed (a tile one over its budget in one
   view needs one removal; why not a cap at ``max_t (n_t - B)``: docs/design-measurements.md). Rounds stop
   when every tile fits or after ``--prune_rounds``. Fine-tuning continues after.

Distribution: every rank renders its share of the training views (view i on rank i mod W, as
evaluate.py deals test views), measures per-record statistics on the received records and sends
them to the Gaussians' owners with :func:`render.route_to_owners`; each rank removes Gaussians of
its own shard only. The candidates' scores are gathered so every rank applies the same global top-k.
The result equals one process holding every Gaussian in shard-concatenated order.

Cost: a measurement renders its views several per pass (:func:`measure`: as many as a quarter of
the free device memory holds, the same number on every rank), scores each pass's pixels in one
launch of kernels/contributions.py's Triton kernel on a GPU (its PyTorch reference, the
compositing of kernels/reference.py, elsewhere) and keeps its sums on the device: a pass costs a
few host synchronizations (gsplat's tile intersection sizes its output; the exchange's counts at
W > 1), not one per view or per depth wave. A stage-3 round re-measures every view: removing a
Gaussian raises the transmittance behind it in each of its tiles, so the importance of every
Gaussian sharing a tile with it changes, and the removed ones are spread over the heavy tiles;
keeping each (view, tile)'s sums to update only the touched tiles would cost memory in proportion
to intersections times views for a saving that shrinks as the heavy tiles cover the scene. The
last round, after which no selection follows, measures only the tiles.

The training views are rendered at their dataset poses (``--pose_opt`` corrections are not
applied) and colours play no part (SH degree 0). Stage 3 gathers the candidates' scores on every
rank (16 bytes per candidate).

The per-pass statistics and the scores are pure functions in trainer/prune_scores.py; this module
runs the collective stages around them (measurement over every view, routing to the owners, the
global top-k, the removals, the reports).

Tile statistics count the (record, tile) intersections of tile binning (``tile_offsets``): the
Gaussians a rasterizer loads for the tile, which is what must fit on chip. Each stage writes
``stats/prune_stage<k>.json`` (with ``seconds``: the whole stall of training, the two held-out
PSNR evaluations included, and ``seconds_pruning``: the stage alone) and TensorBoard scalars
``prune/stage<k>/...`` and prints one line ending in its seconds (rank 0).
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Optional

import torch

from ..kernels import budget as device_budget
from ..kernels import contributions
from . import evaluate, exchange, metrics
from .prune_scores import EPS, pixel_winners, tile_counts  # noqa: F401 (re-exported)
from .prune_scores import Measurement, add_tile_sums, record_statistics, stage3_scores, tile_sums
from .render import RenderInfo, RenderSetup, route_to_owners

if TYPE_CHECKING:  # pragma: no cover
    from .config import Config
    from .data import Dataset
    from .report import Reporter
    from .shard import GaussianShard


# ---------------------------------------------------------------- budget, surgery, densification


def tile_budget(device: torch.device, override: int = 0) -> int:
    """Stage 3's target of Gaussians per 16x16 tile: ``override`` > 0 (``--tile_budget``), else
    ``kernels.budget.tile_budget(device)`` (ByteSplat's on-chip figure: shared memory over a
    resident Gaussian's bytes; the native fused kernel runs longer tiles too, module docstring).
    Raises ValueError (naming ``--tile_budget``) when the device's figure is below 1.
    """
    if override > 0:
        return int(override)
    budget = device_budget.tile_budget(device)
    if budget < 1:
        raise ValueError(f"the fused kernel fits no Gaussian per tile on {device}; set --tile_budget")
    return budget


def limit_densification(strategy, cfg) -> None:
    """Densification stays off from stage 2 on: the strategy's ``refine_stop_iter`` becomes
    ``min(refine_stop_iter, prune_stage2_step)``. gsplat's DefaultStrategy returns at once from
    ``step_post_backward`` when ``step >= refine_stop_iter`` (no growth, pruning or opacity reset,
    including densify.DefaultStrategy's reset); MCMCStrategy stops relocating and adding but keeps
    its position noise. Derived from the config, so a resumed run obeys it too."""
    stop = cfg.schedule.prune_stage2_step
    if stop > 0:
        strategy.refine_stop_iter = min(strategy.refine_stop_iter, stop)


# ---------------------------------------------------------------- measurement

MAX_VIEWS_PER_PASS = 32
"""Most training views one scoring pass renders at once."""
PASS_MEMORY_SHARE = 0.25
"""Share of the device's free memory (the smallest over the ranks) the views of one pass may take."""
HOST_PASS_BYTES = 1 << 30
"""What counts as the free memory of a CPU rank for :data:`PASS_MEMORY_SHARE`."""
# Estimated peak bytes of a pass, per record (projection, SH colours, the exchange payload, the
# float64 statistics, keys, the kernel's table), per tile intersection (ids, the sort's buffers,
# the overload lane's gathers) and per pixel (the kernel's winners; the reference's stored pairs).
RECORD_BYTES, ISECT_BYTES = 256, 64
KERNEL_PIXEL_BYTES, REFERENCE_PIXEL_BYTES = 8, 1024


def view_batches(items: list[int], views: "Dataset", per_pass: int) -> list[list[int]]:
    """``items`` (training views) in passes of at most ``per_pass`` views that share one image size,
    in order of first appearance of each size."""
    groups: dict[tuple[int, int], list[int]] = {}
    for i in items:
        groups.setdefault(views.size(i), []).append(i)
    return [g[s : s + per_pass] for g in groups.values() for s in range(0, len(g), per_pass)]


def per_view_sizes(info: RenderInfo) -> tuple[int, int, int]:
    """(records, tile intersections, pixels) per view of one pass's ``info`` (records: the larger
    of the received ones and the owner's projected ones)."""
    records = max(info.records.opacities.numel() if info.records is not None else 0, info.means2d.shape[:-1].numel())
    isects = info.tiles.flatten_ids.numel() if info.tiles is not None else 0
    cams = max(info.num_local_cameras, 1)
    return -(-records // cams), -(-isects // cams), info.width * info.height


def free_bytes(device: torch.device) -> int:
    """Memory a pass may use on ``device``: CUDA's free memory plus what PyTorch's cache holds
    unused; :data:`HOST_PASS_BYTES` elsewhere."""
    if device.type != "cuda":
        return HOST_PASS_BYTES
    free, _ = torch.cuda.mem_get_info(device)
    return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))


def views_per_pass(ctx, per_view: tuple[int, int, int], pixel_bytes: int, free: int) -> int:
    """Views per scoring pass, the same on every rank, from each rank's ``per_view`` sizes
    (:func:`per_view_sizes`) and ``free`` bytes: :data:`PASS_MEMORY_SHARE` of the smallest
    ``free`` over the largest estimated bytes per view (RECORD_BYTES per record, ISECT_BYTES per
    intersection, ``pixel_bytes`` per pixel), in 1..MAX_VIEWS_PER_PASS, and no more than keeps a
    pass's records and intersections countable in int32 (gsplat's tile lists). Collective."""
    records, isects, pixels = per_view
    nbytes = RECORD_BYTES * records + ISECT_BYTES * isects + pixel_bytes * pixels
    clip = 2**31 - 1
    rows = exchange.gather_metadata(
        ctx, [min(max(nbytes >> 10, 1), clip), min(free >> 10, clip), min(max(records, isects, 1), clip)]
    )
    by_memory = PASS_MEMORY_SHARE * int(rows[:, 1].min()) // int(rows[:, 0].max())
    by_count = clip // int(rows[:, 2].max())
    return int(max(min(by_memory, by_count, MAX_VIEWS_PER_PASS), 1))


class _Scores:
    """Running sums of a measurement on this rank: per local Gaussian [N, 3] float64 (routed to the
    owners), and the tile sums [6] of this rank's views (prune_scores.tile_sums), on the device."""

    def __init__(self, num: int, device: torch.device):
        self.per_gaussian = torch.zeros(num, 3, dtype=torch.float64, device=device)
        self.tiles = torch.zeros(6, dtype=torch.float64, device=device)

    def add_pass(
        self,
        gaussians: dict,
        setup: RenderSetup,
        views: "Dataset",
        batch: list[int],
        budget: int,
        composite: bool,
        real: bool,
    ) -> RenderInfo:
        """Render the views ``batch`` in one pass (collective) and add their statistics (nothing
        of a padding pass, ``real`` False, but its collectives). Returns the pass's info."""
        cam = setup.camera_batch(views.batch(batch, images=False))
        res = setup(gaussians, cam, 0, rasterize=False)  # colours play no part: SH 0
        values, counts = record_statistics(res.info, budget, composite)
        if real:
            self.tiles = add_tile_sums(self.tiles, tile_sums(counts, budget))
        else:
            values = torch.zeros_like(values)
        self.per_gaussian += route_to_owners(setup.ctx, res.info, values)
        return res.info


@torch.no_grad()
def measure(
    shard: "GaussianShard",
    setup: RenderSetup,
    views: "Dataset",
    budget: int,
    composite: bool = True,
    per_pass: int = 0,
) -> Measurement:
    """Render every training view ``views`` (collectively; view i on rank i mod W) and route the
    per-record statistics to their owners. The first pass renders one view per rank, which sizes
    the rest: ``per_pass`` views per pass (0: :func:`views_per_pass` from that pass), grouped by
    image size; a rank out of views renders a padding pass and discards it, so every rank runs
    the same passes. The tile statistics stay on the device until one read at the end."""
    ctx = setup.ctx
    mine = exchange.deal_views(len(views), ctx)[0]
    gaussians = shard.activated()
    device = shard.params["means"].device
    scores = _Scores(shard.num, device)
    info = scores.add_pass(gaussians, setup, views, mine[:1] or [0], budget, composite, bool(mine))
    if per_pass <= 0:
        pixel_bytes = (
            0 if not composite else KERNEL_PIXEL_BYTES if contributions.runs_on(device) else REFERENCE_PIXEL_BYTES
        )
        sizes = per_view_sizes(info)
        del info
        per_pass = views_per_pass(ctx, sizes, pixel_bytes, free_bytes(device))
    else:
        del info
    plans = [
        view_batches(list(range(r, len(views), ctx.world_size))[1:], views, per_pass) for r in range(ctx.world_size)
    ]
    own = plans[ctx.rank]
    for r in range(max(len(p) for p in plans)):
        real = r < len(own)
        scores.add_pass(gaussians, setup, views, own[r] if real else mine[:1] or [0], budget, composite, real)
    tiles = exchange.all_gather_rows(ctx, scores.tiles[None]).cpu()
    num_tiles, num_within, total = (int(v) for v in tiles[:, :3].sum(0))
    excess, over_isects = (int(v) for v in tiles[:, 4:].sum(0))
    acc = scores.per_gaussian
    return Measurement(
        acc[:, 0],
        acc[:, 1],
        acc[:, 2],
        num_tiles,
        num_within,
        total / max(num_tiles, 1),
        int(tiles[:, 3].max()),
        excess,
        over_isects,
    )


# ---------------------------------------------------------------- selection


def global_offset(ctx, num: int) -> tuple[int, int]:
    """(index of this shard's first Gaussian in the shard-concatenated order, total Gaussians),
    from this shard's ``num`` Gaussians. Collective."""
    sizes = exchange.gather_metadata(ctx, [num])[:, 0].tolist()
    return sum(sizes[: ctx.rank]), sum(sizes)


def select_top(ctx, scores: torch.Tensor, candidates: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` highest-scoring candidates over all ranks (ties: lower global index first), as a
    local [N] bool mask. Every rank gathers the candidates' (score, global index) and applies the
    same order, on the device: the gathered rows come in rank order, each rank's in local order,
    so ascending global index, and a stable sort by descending score breaks ties towards it."""
    offset, _ = global_offset(ctx, scores.shape[0])
    local = candidates.nonzero().squeeze(1)
    rows = torch.stack([scores[local], (local + offset).double()], dim=1)  # indices exact < 2^53
    everyone = exchange.all_gather_rows(ctx, rows)
    order = torch.argsort(-everyone[:, 0], stable=True)
    chosen = everyone[order[:k], 1].long() - offset
    n = scores.shape[0]
    chosen = chosen[(chosen >= 0) & (chosen < n)]
    mask = torch.zeros(n, dtype=torch.bool, device=scores.device)
    mask[chosen] = True
    return mask


# ---------------------------------------------------------------- the stages


def _count_all(shard: "GaussianShard", setup: RenderSetup) -> int:
    return global_offset(setup.ctx, shard.num)[1]


def initial_pruning(shard: "GaussianShard", setup: RenderSetup, views: "Dataset", cfg: "Config", step: int) -> dict:
    """Stage 2: remove every Gaussian that wins no pixel of any training view ``views``. Collective."""
    budget = tile_budget(setup.ctx.device, cfg.prune.tile_budget)
    num_before = _count_all(shard, setup)
    m = measure(shard, setup, views, budget, composite=True)
    num_pruned = shard.remove(m.wins == 0)
    limit_densification(shard.strategy, cfg)
    after = measure(shard, setup, views, budget, composite=False)
    return dict(
        stage=2,
        step=step,
        tile_budget=budget,
        num_before=num_before,
        num_after=_count_all(shard, setup),
        num_pruned_local=num_pruned,
        tiles_before=m.tile_summary(),
        tiles_after=after.tile_summary(),
    )


def hardware_aware_pruning(
    shard: "GaussianShard", setup: RenderSetup, views: "Dataset", cfg: "Config", step: int
) -> dict:
    """Stage 3: prune in rounds until every tile of every training view holds at most the budget
    (or ``--prune_rounds`` rounds ran); see the module docstring for the score. Collective."""
    p = cfg.prune
    budget = tile_budget(setup.ctx.device, p.tile_budget)
    num_before = _count_all(shard, setup)
    m = first = measure(shard, setup, views, budget, composite=True)
    rounds, per_round = 0, []
    while rounds < p.prune_rounds and m.max_per_tile > budget:
        candidates = m.overload > 0
        num_candidates = _count_all_true(setup.ctx, candidates)
        k = min(math.ceil(p.prune_fraction * num_candidates), m.removals_needed(num_candidates))
        mask = select_top(setup.ctx, stage3_scores(m, budget), candidates, k)
        shard.remove(mask)
        rounds += 1
        per_round.append(dict(candidates=num_candidates, removed=k))
        m = measure(shard, setup, views, budget, composite=rounds < p.prune_rounds)  # the last: tiles only
    return dict(
        stage=3,
        step=step,
        tile_budget=budget,
        num_before=num_before,
        num_after=_count_all(shard, setup),
        rounds=rounds,
        per_round=per_round,
        all_tiles_fit=m.max_per_tile <= budget,
        tiles_before=first.tile_summary(),
        tiles_after=m.tile_summary(),
    )


def _count_all_true(ctx, mask: torch.Tensor) -> int:
    return int(exchange.gather_metadata(ctx, [int(mask.sum())])[:, 0].sum())


@torch.no_grad()
def heldout_psnr(shard: "GaussianShard", setup: RenderSetup, testset: "Dataset") -> Optional[float]:
    """Mean PSNR (dB) over the test views, on every rank; None without test views. Collective."""
    ctx = setup.ctx
    if len(testset) == 0:
        return None
    mine, rounds = exchange.deal_views(len(testset), ctx)
    picks = exchange.padded_rounds(mine, rounds)
    by_view = {i: setup.camera_batch(testset.batch([i])) for i in dict.fromkeys(picks)}  # each decoded once
    cams = [by_view[i] for i in picks]
    renders = evaluate.render_views(shard, setup, cams)[: len(mine)]
    total = sum(
        float(metrics.psnr(torch.from_numpy(r)[None], testset[i]["image"][None]).mean()) for i, r in zip(mine, renders)
    )
    sums = exchange.sum_over_ranks(ctx, torch.tensor([total, len(mine)], dtype=torch.float64))
    return float(sums[0] / sums[1])


def run_stages(
    shard: "GaussianShard",
    setup: RenderSetup,
    trainset: "Dataset",
    testset: "Dataset",
    cfg: "Config",
    reporter: "Reporter",
    done: int,
) -> Optional[dict]:
    """Run the stage scheduled after step ``done`` (if any) on ``shard``, measured on the training
    views ``trainset`` and scored on ``testset``, then report it. Collective."""
    s = cfg.schedule
    if done == s.prune_stage2_step:
        stage = initial_pruning
    elif done == s.prune_stage3_step:
        stage = hardware_aware_pruning
    else:
        return None
    t0 = time.perf_counter()
    psnr_before = heldout_psnr(shard, setup, testset)
    t1 = time.perf_counter()
    stats = stage(shard, setup, trainset, cfg, done)  # ends on host reads: its work is done
    t2 = time.perf_counter()
    stats.pop("num_pruned_local", None)
    stats.update(
        num_pruned=stats["num_before"] - stats["num_after"],
        test_psnr_before=psnr_before,
        test_psnr_after=heldout_psnr(shard, setup, testset),
    )
    stats.update(seconds=time.perf_counter() - t0, seconds_pruning=t2 - t1)
    report(reporter, stats)
    return stats


def report(reporter: "Reporter", stats: dict) -> None:
    """stats/prune_stage<k>.json, TensorBoard scalars and one line (rank 0's reporter; a no-op
    elsewhere)."""
    k, step = stats["stage"], stats["step"]
    reporter.write_json(f"stats/prune_stage{k}.json", stats)
    before, after = stats["tiles_before"], stats["tiles_after"]
    tag = f"prune/stage{k}"
    reporter.scalar(f"{tag}/num_pruned", stats["num_pruned"], step)
    reporter.scalar(f"{tag}/num_gaussians", stats["num_after"], step)
    for name in ("fraction_within_budget", "mean_per_tile", "max_per_tile"):
        reporter.scalar(f"{tag}/{name}_before", before[name], step)
        reporter.scalar(f"{tag}/{name}_after", after[name], step)
    reporter.scalars({f"{tag}/test_psnr": stats["test_psnr_after"]}, step)
    psnr = stats["test_psnr_after"]
    reporter.line(
        f"prune stage {k} after step {step}: {stats['num_pruned']:,} of {stats['num_before']:,} Gaussians "
        f"removed; tiles within budget {stats['tile_budget']}: {100 * before['fraction_within_budget']:.1f}% "
        f"-> {100 * after['fraction_within_budget']:.1f}% (mean {after['mean_per_tile']:.1f}, max "
        f"{after['max_per_tile']} per tile)"
        + (f"; test PSNR {psnr:.3f}" if psnr is not None else "")
        + f" ({stats['seconds']:.1f} s)"
    )
