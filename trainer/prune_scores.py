"""ByteSplat's pruning scores (ByteSplat §5.2), computed from one pass or from measured sums: no
collective, no parameter surgery. trainer/prune.py runs the stages that use them (rendering every
view, routing the statistics to the owners, the global top-k, the removals); its docstring gives
the stages and the stage-3 score's derivation.

- :func:`record_statistics`: per received record of a ``render(..., rasterize=False)`` pass,
  the pixels it wins (largest alpha * T, gsplat's compositing weight), its importance (sum of
  alpha * T, pixels) and its overload (sum over its tiles of max(0, n_t - B)); and the tile counts,
  summed per pass on the device by :func:`tile_sums`.
- :class:`Measurement`: those sums per local Gaussian over every training view, with the tile
  statistics; :func:`stage3_scores`: score = (overload / B) / (importance + EPS).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from ..kernels import contributions
from .render import RenderInfo

EPS = 1e-6
"""Added to the importance (pixels) in the stage-3 score so unseen Gaussians score finitely."""


def pixel_winners(
    pixel_ids: torch.Tensor, record_ids: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor
) -> torch.Tensor:
    """Each pixel's largest-contribution record.

    pixel_ids, record_ids, weights: [M] (kernels.reference.compositing_weights: the contributing
    (pixel, record) pairs and their alpha * T). keys: [R] int64 tie-break per record (the global
    Gaussian index; the lower wins an exact tie). Returns the winning record ids, [P] int64, one per
    pixel that has any pair (kernels.contributions.winners_per_pixel without the empty pixels)."""
    if pixel_ids.numel() == 0:
        return record_ids[:0]
    winners = contributions.winners_per_pixel(pixel_ids, record_ids, weights, keys, int(pixel_ids.max()) + 1)
    return winners[winners >= 0]


def tile_counts(tile_offsets: torch.Tensor, num_isects: int) -> torch.Tensor:
    """Gaussians listed in each tile: [C, th, tw] int32 offsets -> [C * th * tw] int64 counts."""
    starts = tile_offsets.reshape(-1).long()
    ends = torch.cat([starts[1:], starts.new_full((1,), num_isects)])
    return ends - starts


@torch.no_grad()
def record_statistics(
    info: RenderInfo, budget: int, composite: bool, kernel: Optional[bool] = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-record statistics of one pass (any number of cameras) and its tile counts.

    info: a ``render(..., rasterize=False)`` info. Returns values [*records, 3] float64 with lanes
    (pixels won, importance = sum of alpha * T over pixels, overload = sum over the record's tiles
    of max(0, n_t - budget)), aligned with ``info.records`` for route_to_owners (the first two
    lanes stay 0 without ``composite``); and the tile counts [C * th * tw] int64. The compositing
    lanes come from kernels.contributions: its Triton kernel (``kernel`` True; None: where it runs,
    a GPU with Triton) or its PyTorch reference (False). No host synchronization but the
    reference's own.
    Raises ValueError for a pass without records (gsplat's own, ``--pipeline gsplat-dist``).
    """
    rec, tiles = info.records, info.tiles
    if rec is None or tiles is None:
        raise ValueError("pruning statistics need a pass of this trainer's exchange (--pipeline ours)")
    lead = rec.opacities.shape  # [C, N_all] dense or [R] packed
    num_records = rec.opacities.numel()
    device = rec.opacities.device
    flatten_ids = tiles.flatten_ids
    counts = tile_counts(tiles.offsets, flatten_ids.numel())
    excess = (counts - budget).clamp_min(0).double()
    tile_of_isect = torch.repeat_interleave(
        torch.arange(counts.numel(), device=device), counts, output_size=flatten_ids.numel()
    )
    values = torch.zeros(num_records, 3, dtype=torch.float64, device=device)
    values[:, 2].index_add_(0, flatten_ids.long(), excess[tile_of_isect])
    if composite and num_records:
        if info.packed:
            assert rec.gaussian_ids is not None
            keys = rec.gaussian_ids.long()
        else:
            keys = torch.arange(num_records, device=device) % lead[-1]  # global Gaussian index
        use_kernel = contributions.runs_on(device) if kernel is None else kernel
        args = (rec.means2d, rec.conics, rec.opacities, keys, info.width, info.height, tiles.offsets, flatten_ids)
        if use_kernel:
            winners, importance = contributions.contributions(*args)
        else:
            winners, importance = contributions.reference_contributions(*args, packed=info.packed)
        values[:, 0].index_add_(0, winners.clamp_min(0), (winners >= 0).double())
        values[:, 1] = importance
    return values.reshape(*lead, 3), counts


def tile_sums(counts: torch.Tensor, budget: int) -> torch.Tensor:
    """The tile statistics of one pass's counts [T] int64, on their device (no synchronization):
    [6] float64 (tiles, tiles within ``budget``, sum of counts, max count, sum over the over-budget
    tiles of n_t - budget, sum of their n_t). Sum several passes' rows with :func:`add_tile_sums`."""
    over = counts > budget
    return torch.stack(
        [
            torch.full((), float(counts.numel()), dtype=torch.float64, device=counts.device),
            (~over).sum().double(),
            counts.sum().double(),
            counts.max().double() if counts.numel() else counts.new_zeros((), dtype=torch.float64),
            torch.where(over, counts - budget, 0).sum().double(),
            torch.where(over, counts, 0).sum().double(),
        ]
    )


def add_tile_sums(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Two :func:`tile_sums` rows [..., 6] combined: sums, and the max of the max lane."""
    out = a + b
    out[..., 3] = torch.maximum(a[..., 3], b[..., 3])
    return out


@dataclass
class Measurement:
    """Stage statistics over every training view. Per local Gaussian [N] float64: ``wins``
    (pixels won), ``importance`` (sum alpha * T, pixels), ``overload`` (sum of max(0, n_t - B)).
    Tile statistics are global (every rank holds the same numbers)."""

    wins: torch.Tensor
    importance: torch.Tensor
    overload: torch.Tensor
    num_tiles: int
    num_within: int
    mean_per_tile: float
    max_per_tile: int
    excess: int = 0  # sum over over-budget (view, tile) pairs of n_t - B
    over_isects: int = 0  # sum over over-budget (view, tile) pairs of n_t

    def removals_needed(self, num_candidates: int) -> int:
        """Estimated removals still needed: removing the fraction excess / over_isects of the
        num_candidates Gaussians of over-budget tiles takes those tiles down by their average
        excess fraction, which clears the total excess in expectation; tiles with an above-average
        excess stay over and are re-measured for the next round. 0 when every tile fits."""
        if self.over_isects == 0:
            return 0
        return math.ceil(num_candidates * self.excess / self.over_isects)

    def tile_summary(self) -> dict:
        return dict(
            fraction_within_budget=self.num_within / max(self.num_tiles, 1),
            mean_per_tile=self.mean_per_tile,
            max_per_tile=self.max_per_tile,
            num_tiles=self.num_tiles,
        )


def stage3_scores(m: Measurement, budget: int) -> torch.Tensor:
    """score = (overload / budget) / (importance + EPS), [N] float64; 0 where overload is 0."""
    return (m.overload / budget) / (m.importance + EPS)
